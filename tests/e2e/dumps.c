/* Dumps are never lost (tests/e2e/run_dumps.sh): a failure, then what the program does
 * next — exits, aborts, is killed, calls _exit, crashes, fails on a second device, keeps
 * failing past the dump budget, recovers many times before failing for good, or keeps rewriting
 * its dump while being killed.
 * Run on the simulated GPU with SIMGPU_DEVICES=2 SIMGPU_MEM=24GiB. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

#define GiB (1024ull * 1024 * 1024)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* A failure nothing recovers from. */
static void fail(int dev)
{
    void *p;
    cudaSetDevice(dev);
    if (cudaMalloc(&p, 64 * GiB) == cudaSuccess)
        exit(90);
}

/* A failure, 10 GiB freed, and the retry that succeeds: a recovery.  `hold` keeps the
 * device's 10 GiB block for a later recovery (held by the caller). */
static void *fail_only(int dev)
{
    void *a, *b;
    cudaSetDevice(dev);
    if (cudaMalloc(&a, 10 * GiB) != cudaSuccess)
        exit(91);
    if (cudaMalloc(&b, 20 * GiB) == cudaSuccess)
        exit(92);
    return a;
}
static void recover(int dev, void *a)
{
    void *b;
    cudaSetDevice(dev);
    cudaFree(a);
    if (cudaMalloc(&b, 20 * GiB) != cudaSuccess)
        exit(93);
    cudaFree(b);
}

static void on_term(int sig) { _exit(7); }

/* a crash reporter's one-shot handler: says so, then re-raises to die by the signal */
static void on_segv_once(int sig, siginfo_t *si, void *uc)
{
    if (write(STDERR_FILENO, "program handler\n", 16) < 0)
        _exit(98);
    raise(sig);
}

/* A runtime that faults on purpose (a JVM's implicit null checks, Julia's safepoints, wasm bounds
 * checks): its SIGSEGV handler either fixes the page and returns, or leaves by siglongjmp. */
static char *guard_page;
static sigjmp_buf fault_jmp;
static volatile int fault_by_jump;
static volatile int fault_reset;             /* set: once fixed, the handler leaves the signal to fault_reset_to */
static void (*volatile fault_reset_to)(int); /* SIG_DFL or SIG_IGN */
static void on_planned_fault(int sig, siginfo_t *si, void *uc)
{
    if ((char *)si->si_addr != guard_page)
        _exit(97);
    if (fault_by_jump)
        siglongjmp(fault_jmp, 1);
    mprotect(guard_page, 4096, PROT_READ | PROT_WRITE); /* fixed: the write runs again, now fine */
    if (fault_reset)
        signal(sig, fault_reset_to); /* a handler for one fault: SIG_DFL or SIG_IGN from now on */
}
static void planned_faults_setup(void) /* at start-up, as a runtime does: before any failure */
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_planned_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    guard_page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}
static void planned_faults(int n)
{
    for (volatile int i = 0; i < n; i++) {
        fault_by_jump = i & 1;
        mprotect(guard_page, 4096, PROT_NONE);
        if (sigsetjmp(fault_jmp, 1) == 0)
            *(volatile char *)guard_page = 1;
    }
}

/* Allocates and frees blocks of 1-64 MiB on device 0 until told to stop. */
static int churn_stop; /* atomic: read by the churners while main sets it */
static void *churner(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *held[16] = { 0 };
    cudaSetDevice(0);
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE)) {
        int k = (int)(rand_r(&seed) % 16);
        if (held[k]) {
            cudaFree(held[k]);
            held[k] = NULL;
        } else if (cudaMalloc(&held[k], ((size_t)(rand_r(&seed) % 64) + 1) << 20) != cudaSuccess) {
            held[k] = NULL;
        }
    }
    for (int k = 0; k < 16; k++)
        if (held[k])
            cudaFree(held[k]);
    return NULL;
}

/* Copies this process's dump to DIR/copy-N.json (the dump is replaced atomically: a whole file). */
static void copy_dump(int n)
{
    char host[256] = "", src[4096], dst[4096];
    gethostname(host, sizeof host - 1);
    snprintf(src, sizeof src, "%s/oomguard-%s-%d.json", getenv("OOMGUARD_DIR"), host, (int)getpid());
    snprintf(dst, sizeof dst, "%s/copy-%d.json", getenv("OOMGUARD_DIR"), n);
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    char buf[65536];
    size_t k;
    while (out && (k = fread(buf, 1, sizeof buf, in)) > 0)
        fwrite(buf, 1, k, out);
    if (out)
        fclose(out);
    if (in)
        fclose(in);
}

/* A thread that allocates on device 0: 64 GiB (fails) or 64 MiB (succeeds, freed); returns the error. */
static void *alloc_in_thread(void *arg)
{
    void *p;
    cudaSetDevice(0);
    cudaError_t r = cudaMalloc(&p, arg ? 64 * GiB : 64ull << 20);
    if (r == cudaSuccess)
        cudaFree(p);
    return (void *)(intptr_t)r;
}

/* alloc_in_thread on a thread that first notes the stack it was given (a sanitizer may enlarge it) */
static size_t small_stack_got;
static void *alloc_in_small_thread(void *arg)
{
    pthread_attr_t at;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        pthread_attr_getstacksize(&at, &small_stack_got);
        pthread_attr_destroy(&at);
    }
    return alloc_in_thread(arg);
}

/* The most stack a thread running fn used: it runs on a stack of ours, filled with a pattern first. */
static size_t stack_used(void *(*fn)(void *), void *arg)
{
    size_t size = 1u << 20, i = 0;
    unsigned char *stk = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(stk, 0xA5, size);
    pthread_attr_t at;
    pthread_t t;
    pthread_attr_init(&at);
    pthread_attr_setstack(&at, stk, size);
    pthread_create(&t, &at, fn, arg);
    pthread_join(t, NULL);
    while (i < size && stk[i] == 0xA5)
        i++;
    munmap(stk, size);
    return size - i;
}

static void *rewriter(void *arg)
{
    for (;;)
        fail(0);
    return NULL;
}

static int race_done, race_failed, crossings;
static void *warner(void *arg)
{
    cudaSetDevice(1);
    /* each crossing of 50% of 24 GiB is a warning dump; on until well after the failure */
    for (int after = 0; after < 40; after += __atomic_load_n(&race_failed, __ATOMIC_ACQUIRE)) {
        void *p, *small;
        __atomic_add_fetch(&crossings, 1, __ATOMIC_RELEASE);
        if (cudaMalloc(&p, 13 * GiB) == cudaSuccess)
            cudaFree(p);
        if (cudaMalloc(&small, 1 << 20) == cudaSuccess) /* seen below the threshold: re-armed */
            cudaFree(small);
    }
    __atomic_store_n(&race_done, 1, __ATOMIC_RELEASE);
    return NULL;
}
static void *failer(void *arg)
{
    /* fail while a warning dump is being written, at a different point in each run */
    int start = 4 + (int)(getpid() % 5);
    while (__atomic_load_n(&crossings, __ATOMIC_ACQUIRE) < start)
        ;
    usleep((unsigned)(getpid() % 7) * 40);
    fail(0);
    __atomic_store_n(&race_failed, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "exit";
    void *keep;
    cudaFree(0);
    if (!strcmp(mode, "exit")) {
        fail(0);
        return 3;
    } else if (!strcmp(mode, "abort")) {
        fail(0);
        abort();
    } else if (!strcmp(mode, "term")) {
        fail(0);
        raise(SIGTERM);
        return 1;
    } else if (!strcmp(mode, "_exit")) {
        fail(0);
        _exit(3);
    } else if (!strcmp(mode, "segv")) {
        fail(0);
        volatile uintptr_t addr = 8;
        *(volatile int *)addr = 1;
        return 1;
    } else if (!strcmp(mode, "handler")) {
        signal(SIGTERM, on_term); /* the program's own handler, installed before the failure */
        fail(0);
        raise(SIGTERM);
        return 1;
    } else if (!strcmp(mode, "oneshot")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv_once;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
        sigaction(SIGSEGV, &sa, NULL);
        fail(0);
        volatile uintptr_t addr = 8;
        *(volatile int *)addr = 1;
        return 1;
    } else if (!strcmp(mode, "twodev")) {
        /* device 1 fails, device 0 fails and never recovers, device 1 recovers: the
         * one summary printed is device 0's */
        keep = fail_only(1);
        fail(0);
        recover(1, keep);
        return 3;
    } else if (!strcmp(mode, "bothrecover")) {
        /* device 1's failure does not make device 0's final: both recover, nothing printed */
        void *k0 = fail_only(0), *k1 = fail_only(1);
        recover(0, k0);
        recover(1, k1);
        return 0;
    } else if (!strcmp(mode, "budget")) {
        /* OOMGUARD_MAX_DUMPS=1: the first failure is dumped, the next are only counted */
        int n = argc > 2 ? atoi(argv[2]) : 2000;
        fail(0);
        fail(0);
        double t0 = now_us();
        for (int i = 0; i < n; i++)
            fail(0);
        printf("failure past the budget: %.2f us\n", (now_us() - t0) / n);
        return 0;
    } else if (!strcmp(mode, "recoveries")) {
        /* N failures the framework recovers from (PyTorch's flush-and-retry), then one it does not,
         * in argv[3] failed attempts (default 1; 2: its retry fails too, as PyTorch's final one) */
        int n = argc > 2 ? atoi(argv[2]) : 150, attempts = argc > 3 ? atoi(argv[3]) : 1;
        for (int i = 0; i < n; i++)
            recover(0, fail_only(0));
        for (int i = 0; i < attempts; i++)
            fail(0);
        return 3;
    } else if (!strcmp(mode, "caughtretry")) {
        /* a failure whose caller frees 10 GiB, allocates something smaller and fails on another size:
         * the program caught the error and tried again, a new failure, not the first one's retry */
        void *small;
        void *a = fail_only(0);
        cudaFree(a);
        if (cudaMalloc(&small, 1 * GiB) != cudaSuccess)
            return 94;
        fail(0);
        return 3;
    } else if (!strcmp(mode, "faults")) {
        /* a failure nothing recovers from yet, 1000 faults the program's own handler deals with,
         * a recovery on device 1, then the failure again, bigger: it is the last word */
        void *p;
        planned_faults_setup();
        fail(0);
        planned_faults(argc > 2 ? atoi(argv[2]) : 1000);
        fprintf(stderr, "faults handled\n");
        recover(1, fail_only(1));
        cudaSetDevice(0);
        if (cudaMalloc(&p, 48 * GiB) == cudaSuccess)
            return 90;
        return 3;
    } else if (!strcmp(mode, "fixreset")) {
        /* a failure, then one fault the program's handler fixes before it resets SIGSEGV to its
         * default action (argv[2] "dfl") or to ignored ("ign") and returns: the program goes on.
         * A failure after it is dumped where dumps go; then a real crash ends the process. */
        void *p;
        planned_faults_setup();
        fail(0);
        fault_reset_to = !strcmp(argc > 2 ? argv[2] : "dfl", "ign") ? SIG_IGN : SIG_DFL;
        fault_reset = 1;
        planned_faults(1);
        fprintf(stderr, "faults handled\n");
        recover(1, fail_only(1));
        cudaSetDevice(0);
        if (cudaMalloc(&p, 48 * GiB) == cudaSuccess)
            return 90;
        volatile uintptr_t addr = 8;
        *(volatile int *)addr = 1;
        return 3;
    } else if (!strcmp(mode, "snapshot")) {
        /* N failures on device 0 while 4 threads allocate and free there; each dump copied */
        int n = argc > 2 ? atoi(argv[2]) : 20;
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], NULL, churner, (void *)(uintptr_t)(i + 1));
        usleep(20000);
        for (int i = 0; i < n; i++) {
            fail(0);
            copy_dump(i);
            usleep(2000);
        }
        __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        return 0;
    } else if (!strcmp(mode, "smallstack")) {
        /* a thread made with a small stack (argv[2] bytes) fails an allocation: it gets the error */
        pthread_attr_t at;
        pthread_t t;
        void *r = NULL;
        pthread_attr_init(&at);
        if (pthread_attr_setstacksize(&at, (size_t)atol(argv[2])) != 0 ||
            pthread_create(&t, &at, alloc_in_small_thread, "") != 0)
            return 5;
        pthread_join(t, &r);
        printf("small stack: %d, the thread's stack %zu bytes\n", (int)(intptr_t)r, small_stack_got);
        return (intptr_t)r == cudaErrorMemoryAllocation ? 3 : 4;
    } else if (!strcmp(mode, "stackuse")) {
        /* the stack a successful allocation uses, and a failing one (its dump included) */
        size_t ok = stack_used(alloc_in_thread, NULL), failed = stack_used(alloc_in_thread, "");
        printf("stack: allocation %zu failure %zu\n", ok, failed);
        return 0;
    } else if (!strcmp(mode, "untouched")) {
        /* allocations that succeed leave every signal's disposition as it was; the first failure
         * arms the shim's handlers for those not ignored (printed: armed N of M) */
        static const int sigs[] = { SIGABRT, SIGSEGV, SIGBUS,  SIGFPE,  SIGILL, SIGTERM,
                                    SIGINT,  SIGHUP,  SIGQUIT, SIGPIPE, SIGXCPU };
        enum { NS = sizeof sigs / sizeof *sigs };
        struct sigaction was[NS], now;
        void *p;
        int changed = 0, armed = 0, armable = 0;
        for (int i = 0; i < NS; i++) {
            sigaction(sigs[i], NULL, &was[i]);
            armable += (was[i].sa_flags & SA_SIGINFO) || was[i].sa_handler != SIG_IGN;
        }
        for (int d = 0; d < 2; d++) {
            cudaSetDevice(d);
            if (cudaMalloc(&p, 256ull << 20) != cudaSuccess)
                return 4;
            cudaFree(p);
        }
        for (int i = 0; i < NS; i++) {
            sigaction(sigs[i], NULL, &now);
            changed += now.sa_handler != was[i].sa_handler || now.sa_flags != was[i].sa_flags;
        }
        fail(0);
        for (int i = 0; i < NS; i++) {
            sigaction(sigs[i], NULL, &now);
            armed += now.sa_handler != was[i].sa_handler;
        }
        printf("dispositions changed before a failure: %d, armed after it: %d of %d\n", changed, armed, armable);
        return changed == 0 && armed == armable ? 0 : 4;
    } else if (!strcmp(mode, "quarters")) {
        /* 1 MiB at the start, 2 MiB at about half the run, 4 MiB at its end, then a failure: the library's
         * bytes by the quarter of the run each was taken in (memory.by_library[].bytes_by_quarter) */
        void *p;
        struct timespec half = { 0, 600 * 1000 * 1000 };
        if (cudaMalloc(&p, 1ull << 20) != cudaSuccess)
            return 4;
        nanosleep(&half, NULL);
        if (cudaMalloc(&p, 2ull << 20) != cudaSuccess)
            return 4;
        nanosleep(&half, NULL);
        if (cudaMalloc(&p, 4ull << 20) != cudaSuccess)
            return 4;
        fail(0);
        return 0;
    } else if (!strcmp(mode, "plain")) {
        void *p;
        for (int d = 0; d < 2; d++) {
            cudaSetDevice(d);
            if (cudaMalloc(&p, 256ull << 20) != cudaSuccess)
                return 4;
            cudaFree(p);
        }
        return 0;
    } else if (!strcmp(mode, "rewrite")) {
        /* rewrites its dump until killed (OOMGUARD_MAX_DUMPS large) */
        pthread_t t;
        pthread_create(&t, NULL, rewriter, NULL);
        rewriter(NULL);
    } else if (!strcmp(mode, "race")) {
        /* warnings (OOMGUARD_WARN_AT=50% OOMGUARD_WARN_DUMP=1) on device 1 from one thread,
         * one failure on device 0 from another: once the file holds the failure, no
         * warning may replace it (checked by a watcher reading the file meanwhile) */
        char path[4096];
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        snprintf(path, sizeof path, "%s/oomguard-%s-%d.json", getenv("OOMGUARD_DIR"), host, (int)getpid());
        pthread_t w, o;
        pthread_create(&w, NULL, warner, NULL);
        pthread_create(&o, NULL, failer, NULL);
        int seen_oom = 0, bad = 0;
        while (!__atomic_load_n(&race_done, __ATOMIC_ACQUIRE) || !seen_oom) {
            char buf[256] = "";
            FILE *f = fopen(path, "r");
            if (f) {
                size_t n = fread(buf, 1, sizeof buf - 1, f);
                buf[n] = 0;
                fclose(f);
            }
            if (strstr(buf, "\"status\":\"oom\""))
                seen_oom = 1;
            else if (seen_oom && strstr(buf, "\"status\":\"warning\""))
                bad = 1;
            if (__atomic_load_n(&race_done, __ATOMIC_ACQUIRE) && !seen_oom && !f)
                break;
            usleep(200);
        }
        pthread_join(w, NULL);
        pthread_join(o, NULL);
        printf("race: oom seen %d, replaced by a warning %d\n", seen_oom, bad);
        return seen_oom && !bad ? 0 : 5;
    }
    return 2;
}
