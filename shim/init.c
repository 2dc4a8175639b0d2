/* Start-up, fork handling, the exit summary's handlers and oomguard_device_stats/oomguard_version
 * (include/oomguard.h; the framework adapters' entry points are framework.c's). */
#include "og.h"
#include "symfill.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define OG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OG_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define OG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OG_TSAN 1
#endif
#endif
#ifdef OG_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

OG_TLS int og_in_shim;
atomic_int og_ready;
atomic_int og_exiting;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
    og_ledger_atfork_prepare();
    og_stacks_atfork_prepare();
}
static void atfork_parent(void)
{
    og_stacks_atfork_parent();
    og_ledger_atfork_parent();
}
static void alt_atfork_child(void);
static void atfork_child(void)
{
    alt_atfork_child();
    og_stacks_atfork_child();
    og_ledger_atfork_child();
    og_oom_atfork_child();
    og_framework_atfork_child();
    og_dump_atfork_child();
    og_live_atfork_child();
    og_symfill_atfork_child();
}

static void print_hooks(void)
{
    og_log("hooks (%d):", OG_H_COUNT);
    for (int i = 0; i < OG_H_COUNT; i++) {
        const og_hook_t *h = &og_hooks[i];
        og_log("  %-30s %s since %d%s", h->name, h->lib == OG_LIB_NVML ? "nvml" : "driver", h->since,
               h->ptsz ? " per-thread stream" : "");
    }
}

static void alt_prepare(void);
static void init_once_fn(void)
{
    og_in_shim++; /* nothing we do here is to be recorded */
    alt_prepare();
    og_options_init();
    og_stacks_init();
    og_ledger_init();
    og_oom_init();
    og_limit_init();
    og_calls_resolve(NULL); /* a program linked with -lcuda has its driver already */
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    if (og_opt.verbose) {
        og_log("liboomguard %s loaded", OOMGUARD_VERSION);
        og_options_print();
        print_hooks();
    }
    og_in_shim--;
    atomic_store_explicit(&og_ready, 1, memory_order_release);
}

/* ------------------------------------------------------------------ the failure path's stack */

/* The failure path (capture, diagnosis, remedies, rendering, writing) needs tens of KiB of stack
 * (the diagnosis alone has a 20 KB frame), more than a thread made with a small stack has left
 * inside a cudaMalloc.  It runs on a stack of its own instead, mapped at start-up with a guard
 * page below it, so the caller's stack only holds the switch.  One stack for the process, taken
 * under a lock: failures are rare and write one file anyway, so two threads failing at once
 * simply take turns.  A failure inside the failure path (a signal handler, a nested call) is
 * already on it and runs there directly.  Where there is no such stack (the mapping failed, an
 * architecture without the switch below, ThreadSanitizer, which cannot follow it) the path runs
 * where it is called, as before. */
#if OG_ASAN
#define OG_ALT_STACK_SIZE (8u << 20) /* redzones and unmerged frames: several times the plain need */
#else
#define OG_ALT_STACK_SIZE (1u << 20) /* ~50 KiB used: the rest is margin (untouched pages cost nothing) */
#endif
#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(OG_TSAN)
#define OG_ALT_SWITCH 1
#endif

static char *alt_base; /* lowest usable byte, above the guard page; NULL: none */
static pthread_mutex_t alt_lock = PTHREAD_MUTEX_INITIALIZER;
static OG_TLS bool on_alt;

static void alt_prepare(void)
{
#ifdef OG_ALT_SWITCH
    long page = sysconf(_SC_PAGESIZE);
    size_t guard = page > 0 ? (size_t)page : 4096;
    char *m = mmap(NULL, OG_ALT_STACK_SIZE + guard, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
        return;
    if (mprotect(m, guard, PROT_NONE) != 0) {
        munmap(m, OG_ALT_STACK_SIZE + guard);
        return;
    }
    alt_base = m + guard;
#endif
}

/* A fork child has only the forking thread: nobody is on the stack there. */
static void alt_atfork_child(void)
{
    pthread_mutex_init(&alt_lock, NULL);
    on_alt = false;
}

#ifdef OG_ALT_SWITCH
/* Calls fn(arg) with the stack pointer at `top` (16-byte aligned), back on the caller's stack
 * when it returns.  Every register the ABI lets fn change is declared clobbered. */
static __attribute__((noinline)) void call_on_stack(char *top, void (*fn)(void *), void *arg)
{
#if defined(__x86_64__)
    __asm__ volatile("mov %%rsp, %%rbx\n\t"
                     "mov %0, %%rsp\n\t"
                     "mov %2, %%rdi\n\t"
                     "call *%1\n\t"
                     "mov %%rbx, %%rsp\n\t"
                     :
                     : "r"(top), "r"(fn), "r"(arg)
                     : "rbx", "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory", "cc", "xmm0",
                       "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                       "xmm12", "xmm13", "xmm14", "xmm15");
#elif defined(__aarch64__)
    register char *t __asm__("x9") = top;
    register void (*f)(void *) __asm__("x10") = fn;
    register void *a __asm__("x11") = arg;
    __asm__ volatile("mov x19, sp\n\t"
                     "mov sp, %0\n\t"
                     "mov x0, %2\n\t"
                     "blr %1\n\t"
                     "mov sp, x19\n\t"
                     : "+r"(t), "+r"(f), "+r"(a)
                     :
                     : "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x12", "x13", "x14", "x15", "x16", "x17",
                       "x18", "x19", "x30", "memory", "cc", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16",
                       "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30",
                       "v31");
#endif
}

typedef struct {
    void (*fn)(void *);
    void *arg;
#ifdef OG_ASAN
    const void *caller_bottom;
    size_t caller_size;
#endif
} alt_call_t;

static void alt_entry(void *p)
{
    alt_call_t *a = p;
#ifdef OG_ASAN
    __sanitizer_finish_switch_fiber(NULL, &a->caller_bottom, &a->caller_size);
#endif
    a->fn(a->arg);
#ifdef OG_ASAN
    __sanitizer_start_switch_fiber(NULL, a->caller_bottom, a->caller_size);
#endif
}
#endif

void og_on_alt_stack(void (*fn)(void *), void *arg)
{
#ifdef OG_ALT_SWITCH
    if (alt_base && !on_alt) {
        pthread_mutex_lock(&alt_lock);
        on_alt = true;
        alt_call_t a = { .fn = fn, .arg = arg };
        char *top = (char *)(((uintptr_t)alt_base + OG_ALT_STACK_SIZE) & ~(uintptr_t)15);
#ifdef OG_ASAN
        void *fake = NULL;
        __sanitizer_start_switch_fiber(&fake, alt_base, OG_ALT_STACK_SIZE);
#endif
        call_on_stack(top, alt_entry, &a);
#ifdef OG_ASAN
        __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
        on_alt = false;
        pthread_mutex_unlock(&alt_lock);
        return;
    }
#endif
    fn(arg);
}

/* Hooks can run before our constructor (another library's constructor may allocate). */
void og_init_slow(void) { pthread_once(&init_once, init_once_fn); }

/* The plain `LD_PRELOAD=liboomguard.so python train.py` loads the Python adapter exactly as
 * `oomguard run` does (tools/run.c): the adapter directory goes first on PYTHONPATH, so the
 * interpreter imports its sitecustomize.py at start-up, which chains the user's own.  It has to
 * happen here, in the constructor: the interpreter reads PYTHONPATH once, in main(), after
 * every constructor; and only here is the process still single-threaded, so setenv() races
 * no getenv().  Each process decides for itself (children inherit LD_PRELOAD and the path; the
 * path is not added twice).  Nothing happens outside a Python interpreter, in an interpreter
 * already running (the library dlopen'ed late), or with OOMGUARD_PYTHON_ADAPTER=0. */
static void python_adapter_path(void)
{
    typedef int (*py_init_fn)(void);
    if (!og_dlsym_real(RTLD_DEFAULT, "Py_BytesMain"))
        return;
    py_init_fn is_init = (py_init_fn)og_dlsym_real(RTLD_DEFAULT, "Py_IsInitialized");
    if (!is_init || is_init())
        return;
    setenv(OG_PY_MARKER, "0", 1); /* the adapter makes it "1": a dump can tell it never loaded */
    if (!og_opt.python_adapter) {
        og_python_started(OG_PY_OFF, NULL);
        return;
    }
    Dl_info info;
    if (!dladdr((void *)python_adapter_path, &info) || !info.dli_fname) {
        og_python_started(OG_PY_NO_DIR, "?");
        return;
    }
    char dir[PATH_MAX], cand[PATH_MAX + 32], probe[PATH_MAX + 64], real[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    /* installed: <prefix>/lib/oomguard/python; build tree: <build>/../adapters/python */
    static const char *const rel[] = { "python", "../adapters/python" };
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        snprintf(cand, sizeof cand, "%.4000s/%s", dir, rel[i]);
        snprintf(probe, sizeof probe, "%.4000s/sitecustomize.py", cand);
        if (access(probe, R_OK) != 0 || !realpath(cand, real))
            continue;
        og_python_started(OG_PY_PATH_SET, real);
        const char *old = getenv("PYTHONPATH");
        if (!old || !*old) {
            setenv("PYTHONPATH", real, 1);
            return;
        }
        size_t l = strlen(real);
        for (const char *p = old; (p = strstr(p, real)); p += l)
            if ((p == old || p[-1] == ':') && (!p[l] || p[l] == ':'))
                return; /* already there (oomguard run, or the parent process) */
        size_t n = l + strlen(old) + 2;
        char *v = malloc(n);
        if (!v)
            return;
        snprintf(v, n, "%s:%s", real, old);
        setenv("PYTHONPATH", v, 1);
        free(v);
        return;
    }
    og_python_started(OG_PY_NO_DIR, dir);
}

__attribute__((constructor)) static void og_constructor(void)
{
    og_init_slow();
    og_in_shim++;
    python_adapter_path();
    og_dump_sweep_start(); /* here, not on an allocation's path */
    og_in_shim--;
}

/* A failure still unrecovered when the process ends gets its stderr summary, and
 * OOMGUARD_SUMMARY its lines and exit dump, from an atexit handler: those run before the
 * libraries' destructors, while libcuda and NVML still work.  It is registered from the
 * program's first tracked call (og_exit_arm), after the C library registered its own
 * destructor pass; registered from our constructor it would run after that pass. */
static atomic_int exit_done;
static void og_exit_handler(void)
{
    if (!atomic_load(&og_ready) || atomic_exchange(&exit_done, 1))
        return;
    og_in_shim++;
    og_live_exit();
    og_symfill_close(); /* a dump's names being filled in: bounded by OOMGUARD_SYMBOLIZE_MS */
    og_dump_flush_pending(-1);
    og_exit_summary();
    og_in_shim--;
    atomic_store(&og_exiting, 1);
}

void og_exit_arm(void)
{
    og_live_ensure(); /* publishing starts with the program's first tracked call */
    static atomic_int armed;
    if (!atomic_load_explicit(&armed, memory_order_relaxed) && !atomic_exchange(&armed, 1))
        atexit(og_exit_handler);
}

/* Destructors run in any order with libcuda's: from here on no driver or NVML call.  A
 * process that never made a tracked call (or was not ended by exit) is summed up here. */
__attribute__((destructor)) static void og_destructor(void)
{
    if (atomic_load(&og_ready)) {
        atomic_store(&og_exiting, 1);
        if (atomic_exchange(&exit_done, 1))
            return;
        og_in_shim++;
        og_live_exit();
        og_symfill_close();
        og_dump_flush_pending(-1);
        og_exit_summary();
        og_in_shim--;
    }
}

/* ------------------------------------------------------------------ public API */

OG_EXPORT int oomguard_device_stats(int device, oomguard_device_stats_t *out)
{
    if (!out || device < 0 || device >= OG_MAX_DEVICES)
        return -1;
    og_init_slow();
    og_in_shim++;
    og_ledger_stats(device, out);
    og_in_shim--;
    return 0;
}

OG_EXPORT const char *oomguard_version(void) { return OOMGUARD_VERSION; }
