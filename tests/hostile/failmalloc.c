/* A host malloc that fails, for the shim's own calls only: preloaded ahead of liboomguard.so,
 * it answers NULL to every FAILMALLOC_EVERY-th (default: every) malloc, calloc, realloc,
 * aligned_alloc and posix_memalign whose caller lies inside liboomguard.so, while the program
 * has switched failing on (failmalloc_set(1), looked up with dlsym).  The program, the C
 * library and the simulated driver keep a working malloc, so the program behaves the same
 * with and without the shim and only the shim's degradation is under test. */
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void failmalloc_set(int enable);
unsigned long failmalloc_failed(void);

static atomic_int on;
static atomic_ulong calls, failed;
static uintptr_t shim_lo, shim_hi;
static unsigned long every = 1;

static int find_shim(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size, (void)arg;
    if (!info->dlpi_name || !strstr(info->dlpi_name, "liboomguard"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *p = &info->dlpi_phdr[i];
        if (p->p_type != PT_LOAD)
            continue;
        uintptr_t lo = info->dlpi_addr + p->p_vaddr, hi = lo + p->p_memsz;
        if (!shim_lo || lo < shim_lo)
            shim_lo = lo;
        if (hi > shim_hi)
            shim_hi = hi;
    }
    return 1;
}

/* Called by the program (never from inside malloc: dl_iterate_phdr takes the loader's lock). */
__attribute__((visibility("default"))) void failmalloc_set(int enable)
{
    if (enable && !shim_lo) {
        dl_iterate_phdr(find_shim, NULL);
        const char *e = getenv("FAILMALLOC_EVERY");
        if (e && atol(e) > 0)
            every = (unsigned long)atol(e);
    }
    atomic_store(&on, enable && shim_lo);
}

__attribute__((visibility("default"))) unsigned long failmalloc_failed(void) { return atomic_load(&failed); }

static int fail(void *caller)
{
    uintptr_t c = (uintptr_t)caller;
    if (!atomic_load_explicit(&on, memory_order_relaxed) || c < shim_lo || c >= shim_hi)
        return 0;
    if (atomic_fetch_add(&calls, 1) % every)
        return 0;
    atomic_fetch_add(&failed, 1);
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t n) { return fail(__builtin_return_address(0)) ? NULL : __libc_malloc(n); }
void *calloc(size_t k, size_t n) { return fail(__builtin_return_address(0)) ? NULL : __libc_calloc(k, n); }
void *realloc(void *p, size_t n) { return fail(__builtin_return_address(0)) ? NULL : __libc_realloc(p, n); }
void *aligned_alloc(size_t a, size_t n) { return fail(__builtin_return_address(0)) ? NULL : __libc_memalign(a, n); }
int posix_memalign(void **out, size_t a, size_t n)
{
    if (fail(__builtin_return_address(0)))
        return ENOMEM;
    void *p = __libc_memalign(a, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
