/* cuMemAlloc+cuMemFree pairs straight into the null driver (linked with -lcuda, so the
 * preloaded shim's exported entry points are what it calls).  Prints ns per pair as one
 * thread sees it (CPU time of the slowest thread / its pairs).
 *   null_bench THREADS PAIRS [FRAMES]
 * FRAMES: call that many nested functions first, so the allocation has a realistic stack
 * below it (a Python program reaches the CUDA runtime through 40+ frames). */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long pairs;
static int nest;
static pthread_barrier_t barrier;
static int next_cpu;

/* The thread's CPU time: on a shared machine, time spent descheduled is not the shim's. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void loop(double *secs)
{
    CUdeviceptr p;
    pthread_barrier_wait(&barrier);
    double t0 = now();
    for (long i = 0; i < pairs; i++) {
        cuMemAlloc(&p, 4096 + (size_t)(i & 7) * 512);
        cuMemFree(p);
    }
    *secs = now() - t0;
}

/* Two functions calling each other: neither inlined nor a tail call (work after the call). */
static volatile int sink;
__attribute__((noinline)) static void down_b(double *secs, int n);
__attribute__((noinline)) static void down_a(double *secs, int n)
{
    if (n <= 0)
        loop(secs);
    else
        down_b(secs, n - 1);
    sink++;
}
__attribute__((noinline)) static void down_b(double *secs, int n)
{
    char pad[48]; /* frames of different sizes, as real code has */
    pad[n % sizeof pad] = (char)n;
    __asm__ volatile("" : : "r"(pad) : "memory");
    if (n <= 0)
        loop(secs);
    else
        down_a(secs, n - 1);
    sink += pad[0];
}

static void *worker(void *arg)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(__atomic_fetch_add(&next_cpu, 1, __ATOMIC_RELAXED) % sysconf(_SC_NPROCESSORS_ONLN), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    CUdeviceptr p;
    for (int i = 0; i < 1000; i++) {
        cuMemAlloc(&p, 4096);
        cuMemFree(p);
    }
    /* worker, down_a/down_b x (nest - 2), loop: `nest` frames below cuMemAlloc */
    down_a(arg, nest > 2 ? nest - 2 : 0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        return 2;
    nest = argc == 4 ? atoi(argv[3]) : 0;
    int threads = atoi(argv[1]);
    pairs = atol(argv[2]);
    if (threads < 1 || threads > 64 || pairs < 1)
        return 2;
    cuInit(0);
    pthread_t t[64];
    double secs[64], worst = 0;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, &secs[i]);
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        if (secs[i] > worst)
            worst = secs[i];
    }
    printf("%.1f\n", worst * 1e9 / (double)pairs);
    return 0;
}
