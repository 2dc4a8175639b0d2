/* cuMemAlloc+cuMemFree pairs straight into the null driver (linked with -lcuda, so the
 * preloaded shim's exported entry points are what it calls).  Prints ns per pair as one
 * thread sees it (wall time of the slowest thread / its pairs).
 *   null_bench THREADS PAIRS */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static long pairs;
static pthread_barrier_t barrier;
static int next_cpu;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
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
    pthread_barrier_wait(&barrier);
    double t0 = now();
    for (long i = 0; i < pairs; i++) {
        cuMemAlloc(&p, 4096 + (size_t)(i & 7) * 512);
        cuMemFree(p);
    }
    *(double *)arg = now() - t0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
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
