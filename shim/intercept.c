/* How calls reach the shim.
 *
 * Three doors, all driven by hooks.def:
 *  1. Exported symbols: a program linked with -lcuda binds cuMemAlloc_v2 & co. to us
 *     because LD_PRELOAD puts us first in the global scope; so does a library linked with
 *     -lcuda that the program dlopen()s, locally or RTLD_GLOBAL (ctypes, a plugin).
 *  2. dlsym(): NVIDIA's runtime, XLA and others dlopen("libcuda.so.1") and dlsym() on the
 *     handle, which ignores LD_PRELOAD.  We override dlsym and answer hooked names with
 *     our wrappers.
 *  3. cuGetProcAddress(_v2): from CUDA 11.3 on, the runtime asks the driver for every
 *     entry point by base name and version.  We wrap the answer when it is an ABI we hook.
 *
 * dlsym must stay safe to call from anywhere (malloc interposers call it during their own
 * initialisation): the path below takes no lock and allocates nothing.
 */
#include "og.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

const og_hook_t og_hooks[OG_H_COUNT] = {
#define OG_HOOK(ret, name, base, since, ptsz, lib, rt, params, args) \
    [OG_H_##name] = { #name, #base, since, ptsz, lib, (void *)name, #rt },
#include "hooks.def"
#undef OG_HOOK
};

_Atomic(void *) og_real_ptrs[OG_H_COUNT];

/* ------------------------------------------------------------------ glibc's dlsym */

typedef void *(*og_dlsym_fn)(void *, const char *);
/* Read by the assembly trampoline below, hence not static. */
__attribute__((visibility("hidden"))) _Atomic(og_dlsym_fn) og_real_dlsym_ptr;
/* Called by the trampoline by name, hence not static either. */
og_dlsym_fn og_resolve_real_dlsym(void);
void *og_dlsym_handle(void *handle, const char *name);
void *og_dlsym_default_hook(const char *name);

/* dlvsym is not interposed, so asking it for the versioned dlsym cannot recurse.
 * GLIBC_2.34 is where dlsym moved into libc; GLIBC_2.2.5 is the x86-64 original. */
OG_NO_SANITIZE __attribute__((visibility("hidden"))) og_dlsym_fn og_resolve_real_dlsym(void)
{
    og_dlsym_fn f = atomic_load_explicit(&og_real_dlsym_ptr, memory_order_acquire);
    if (f)
        return f;
    static const char *const versions[] = { "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0" };
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !f; i++)
        f = (og_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    atomic_store_explicit(&og_real_dlsym_ptr, f, memory_order_release);
    return f;
}

OG_NO_SANITIZE void *og_dlsym_real(void *handle, const char *name)
{
    og_dlsym_fn f = og_resolve_real_dlsym();
    return f ? f(handle, name) : NULL;
}

/* ------------------------------------------------------------------ hook table lookups */

OG_NO_SANITIZE int og_hook_find(const char *name)
{
    if (!name || !((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v')))
        return -1; /* cheap reject: every hook is cu* or nvml* */
    for (int i = 0; i < OG_H_COUNT; i++)
        if (strcmp(og_hooks[i].name, name) == 0)
            return i;
    return -1;
}

OG_NO_SANITIZE static const char *lib_soname(int lib)
{
    return lib == OG_LIB_NVML ? "libnvidia-ml.so.1" : "libcuda.so.1";
}

/* One real pointer per ABI name: the first one found wins, later finds are the same
 * function reached another way. */
OG_NO_SANITIZE static void remember_real(int id, void *real)
{
    void *expected = NULL;
    if (real)
        atomic_compare_exchange_strong(&og_real_ptrs[id], &expected, real);
}

/* ------------------------------------------------------------------ the calls table */

_Atomic(void *) og_call_ptrs[OG_C_COUNT];

static const struct {
    const char *name;
    int lib;
} call_names[OG_C_COUNT] = {
#define OG_CALLFN(ret, name, lib, params) [OG_C_##name] = { #name, lib },
#include "calls.def"
#undef OG_CALLFN
};

static atomic_int cuda_resolved, nvml_resolved;
static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;

/* A handle the program got from dlmopen() into another link-map namespace is another copy
 * of the driver with its own state: it is neither wrapped nor used by the shim. */
OG_NO_SANITIZE static bool foreign_namespace(void *handle)
{
    Lmid_t lmid = LM_ID_BASE;
    if (!handle || handle == RTLD_DEFAULT || handle == RTLD_NEXT)
        return false;
    return dlinfo(handle, RTLD_DI_LMID, &lmid) == 0 && lmid != LM_ID_BASE;
}

static void fill_from(void *h, int lib)
{
    for (int i = 0; i < OG_C_COUNT; i++) {
        void *expected = NULL, *p;
        if (call_names[i].lib != lib || atomic_load(&og_call_ptrs[i]))
            continue;
        if ((p = og_dlsym_real(h, call_names[i].name)))
            atomic_compare_exchange_strong(&og_call_ptrs[i], &expected, p);
    }
    for (int i = 0; i < OG_H_COUNT; i++)
        if (og_hooks[i].lib == lib && !atomic_load(&og_real_ptrs[i]))
            remember_real(i, og_dlsym_real(h, og_hooks[i].name));
}

/* Called at the doors (constructor, dlsym on the driver's handle, cuGetProcAddress) and, as a
 * last resort, once from og_resolve_real: the driver's functions are looked up there, all at
 * once, and NVML is opened — an allocation never pays for a lookup or a dlopen. */
void og_calls_resolve(void *cuda_handle)
{
    if (atomic_load_explicit(&cuda_resolved, memory_order_acquire) &&
        (atomic_load_explicit(&nvml_resolved, memory_order_acquire) || !og_opt.nvml))
        return;
    if (foreign_namespace(cuda_handle))
        return;
    pthread_mutex_lock(&resolve_lock);
    if (!atomic_load(&cuda_resolved)) {
        void *own = cuda_handle ? NULL : dlopen(lib_soname(OG_LIB_CUDA), RTLD_LAZY | RTLD_NOLOAD);
        void *h = cuda_handle ? cuda_handle : own;
        if (h) {
            /* once: a function this driver lacks stays NULL, and the shim does without it */
            fill_from(h, OG_LIB_CUDA);
            atomic_store_explicit(&cuda_resolved, 1, memory_order_release);
        }
        if (own)
            dlclose(own); /* libcuda stays loaded: the program holds it */
    }
    /* NVML only once the driver is in the process: a preloaded shell or launcher never
     * loads it.  The handle is kept for the life of the process. */
    if (atomic_load(&cuda_resolved) && og_opt.nvml && !atomic_load(&nvml_resolved)) {
        void *h = dlopen(lib_soname(OG_LIB_NVML), RTLD_NOW | RTLD_LOCAL);
        if (h)
            fill_from(h, OG_LIB_NVML);
        atomic_store_explicit(&nvml_resolved, 1, memory_order_release);
    }
    pthread_mutex_unlock(&resolve_lock);
}

OG_NO_SANITIZE void *og_resolve_real(int id)
{
    void *p = atomic_load_explicit(&og_real_ptrs[id], memory_order_acquire);
    if (p)
        return p;
    /* Next definition after us in the global scope (a program linked with -lcuda, or a library
     * linked with it that the program dlopen'ed RTLD_GLOBAL) ... */
    p = og_dlsym_real(RTLD_NEXT, og_hooks[id].name);
    remember_real(id, p);
    /* ... or the library itself when it was dlopen'ed locally: the whole table at once, so
     * that this happens once per process and not once per function.  Found or not, the calls
     * the shim makes itself (which device is current) come from the same table: a driver that
     * arrived in the global scope with a library after the constructor passed no other door */
    if (atomic_load_explicit(&og_ready, memory_order_acquire))
        og_calls_resolve(NULL);
    return atomic_load_explicit(&og_real_ptrs[id], memory_order_acquire);
}

/* ------------------------------------------------------------------ cuGetProcAddress answers */

/* Which of our ABIs answers (base, version, flags)?  The newest entry with since <= version;
 * the per-thread variant when the caller asked for it and one exists. */
static int proc_entry(const char *base, int version, uint64_t flags)
{
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0; /* per-thread falls back to legacy */
        for (int i = 0; i < OG_H_COUNT; i++) {
            const og_hook_t *h = &og_hooks[i];
            if (h->lib != OG_LIB_CUDA || h->ptsz != ptsz || h->since > version || strcmp(h->base, base) != 0)
                continue;
            if (best < 0 || h->since > og_hooks[best].since)
                best = i;
        }
        if (!want_ptsz)
            break;
    }
    return best;
}

void *og_proc_wrapper(const char *base, int version, uint64_t flags, void *real)
{
    if (!base || !real)
        return real;
    int id = proc_entry(base, version, flags);
    if (id < 0)
        return real;
    remember_real(id, real);
    return og_hooks[id].wrapper;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    og_fn_cuGetProcAddress_v2 real = OG_REAL(cuGetProcAddress_v2);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    og_calls_resolve(NULL);
    CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = og_proc_wrapper(symbol, cudaVersion, flags, *pfn);
    return r;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    og_fn_cuGetProcAddress real = OG_REAL(cuGetProcAddress);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    og_calls_resolve(NULL);
    CUresult r = real(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = og_proc_wrapper(symbol, cudaVersion, flags, *pfn);
    return r;
}

/* ------------------------------------------------------------------ dlsym override */

/* When we answer NULL for a driver function the driver does not have, dlerror() must say so
 * as glibc would (callers such as ctypes read it): a lookup that cannot succeed sets it. */
OG_NO_SANITIZE static void set_dlerror(void *handle, const char *name)
{
    (void)dlvsym(handle, name, "OOMGUARD_NOT_PROVIDED_BY_THE_DRIVER");
}

/* dlsym(explicit handle, name): the handle, not the caller, decides the answer, so calling
 * glibc from here is exact.  A hooked name found there is answered with our wrapper. */
OG_NO_SANITIZE __attribute__((visibility("hidden"))) void *og_dlsym_handle(void *handle, const char *name)
{
    void *real = og_dlsym_real(handle, name);
    if (!real)
        return NULL;
    int id = og_hook_find(name);
    if (id < 0 || foreign_namespace(handle))
        return real;
    /* a door: the driver (or NVML) is in the process, resolve what the shim calls */
    if (atomic_load_explicit(&og_ready, memory_order_acquire) && og_hooks[id].lib == OG_LIB_CUDA &&
        real != og_hooks[id].wrapper)
        og_calls_resolve(handle);
    if (real == og_hooks[id].wrapper) { /* found our own export (e.g. on dlopen(NULL)) */
        if (og_resolve_real(id))
            return real;
        set_dlerror(handle, name);
        return NULL;
    }
    remember_real(id, real);
    return og_hooks[id].wrapper;
}

/* dlsym(RTLD_DEFAULT, name) for a hooked name: our wrapper if the real function exists, else
 * OG_DLSYM_NONE (the caller answers NULL: glibc would find our own export and make a missing
 * driver function look present).  NULL: not ours, ask glibc. */
#define OG_DLSYM_NONE ((void *)1)
OG_NO_SANITIZE __attribute__((visibility("hidden"))) void *og_dlsym_default_hook(const char *name)
{
    int id = og_hook_find(name);
    if (id < 0)
        return NULL;
    if (og_resolve_real(id))
        return og_hooks[id].wrapper;
    set_dlerror(RTLD_DEFAULT, name);
    return OG_DLSYM_NONE;
}

/* RTLD_DEFAULT and RTLD_NEXT lookups depend on who calls: glibc reads its return address
 * to pick the caller's scope.  A C wrapper that called glibc would make every such lookup
 * look like it came from liboomguard (wrong answers for RTLD_NEXT; for RTLD_DEFAULT, a
 * library loaded RTLD_LOCAL would lose its own dependencies).  So the exported dlsym is a
 * small trampoline that *jumps* to glibc for those, leaving the caller's return address
 * in place.  Explicit handles go to og_dlsym_handle. */
#if defined(__x86_64__)
__asm__(
    /* A C call from inside the trampoline, keeping dlsym's own arguments (%rdi, %rsi) for
     * the jump that follows it; the callee gets the name as its first argument (a callee
     * without arguments ignores it) and the stack aligned as the ABI wants. */
    ".macro og_call_keeping_args fn\n"
    "    pushq %rdi\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    pushq %rsi\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    subq $8, %rsp\n"
    "    .cfi_adjust_cfa_offset 8\n"
    "    movq %rsi, %rdi\n"
    "    call \\fn\n"
    "    addq $8, %rsp\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    popq %rsi\n"
    "    .cfi_adjust_cfa_offset -8\n"
    "    popq %rdi\n"
    "    .cfi_adjust_cfa_offset -8\n"
    ".endm\n"
    ".text\n"
    ".globl dlsym\n"
    ".type dlsym,@function\n"
    ".p2align 4\n"
    "dlsym:\n"
    "    .cfi_startproc\n"
    "    cmpq $-1, %rdi\n" /* RTLD_NEXT: straight to glibc */
    "    je 2f\n"
    "    testq %rdi, %rdi\n" /* explicit handle: C */
    "    jnz og_dlsym_handle\n"
    "    og_call_keeping_args og_dlsym_default_hook\n" /* RTLD_DEFAULT: hooked name? */
    "    testq %rax, %rax\n"
    "    jz 2f\n"
    "    cmpq $1, %rax\n" /* OG_DLSYM_NONE: a hooked name the driver lacks */
    "    jne 5f\n"
    "    xorl %eax, %eax\n"
    "5:  ret\n"
    "2:  movq og_real_dlsym_ptr(%rip), %rax\n"
    "    testq %rax, %rax\n"
    "    jz 3f\n"
    "    jmp *%rax\n"
    "3:  og_call_keeping_args og_resolve_real_dlsym\n" /* first use: resolve glibc's dlsym, then jump */
    "    testq %rax, %rax\n"
    "    jz 4f\n"
    "    jmp *%rax\n"
    "4:  ret\n" /* no dlsym at all: NULL */
    "    .cfi_endproc\n"
    ".size dlsym, .-dlsym\n"
    ".purgem og_call_keeping_args\n");
#else
/* Other architectures: a C override that relies on a sibling call for the caller-relative
 * forms.  clang's musttail makes that a guarantee; elsewhere it is best effort. */
#if defined(__clang__)
#define OG_MUSTTAIL __attribute__((musttail))
#else
#define OG_MUSTTAIL
#endif
OG_EXPORT void *dlsym(void *handle, const char *name)
{
    if (handle != RTLD_NEXT && handle != RTLD_DEFAULT)
        return og_dlsym_handle(handle, name);
    if (handle == RTLD_DEFAULT) {
        void *w = og_dlsym_default_hook(name);
        if (w)
            return w == OG_DLSYM_NONE ? NULL : w;
    }
    og_dlsym_fn f = og_resolve_real_dlsym();
    OG_MUSTTAIL return f(handle, name);
}
#endif
