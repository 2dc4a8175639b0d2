/* Cost of the shim on the allocation fast path, and of writing a dump.
 *
 *   bench pairs THREADS N     ns per cudaMalloc+cudaFree pair (each thread does N pairs)
 *   bench blocks N            RSS bytes per live block with N blocks alive
 *   bench dump N              seconds for a failing cudaMalloc (dump included) with N live blocks
 *
 * Run with and without LD_PRELOAD=liboomguard.so by tests/bench/run_bench.sh, which
 * prints the table with ratios. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * 4096;
}

static long pairs_n;
static pthread_barrier_t barrier;

static atomic_int next_cpu;

static void *pairs_worker(void *arg)
{
    /* one thread per CPU: on a small machine, scheduling noise otherwise swamps the result */
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(atomic_fetch_add(&next_cpu, 1) % sysconf(_SC_NPROCESSORS_ONLN), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    static atomic_int next_dev;
    int ndev = 1;
    cudaGetDeviceCount(&ndev);
    cudaSetDevice(getenv("BENCH_SPREAD") ? atomic_fetch_add(&next_dev, 1) % ndev : 0);
    void *p;
    for (int i = 0; i < 1000; i++) { /* warm up: contexts, sites, slabs */
        cudaMalloc(&p, 4096);
        cudaFree(p);
    }
    pthread_barrier_wait(&barrier);
    struct timespec cpu0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);
    ((double *)arg)[1] = cpu0.tv_sec + cpu0.tv_nsec / 1e9;
    double t0 = now();
    for (long i = 0; i < pairs_n; i++) {
        if (cudaMalloc(&p, 4096 + (size_t)(i & 7) * 512) != cudaSuccess)
            abort();
        cudaFree(p);
    }
    struct timespec cpu;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    double *out = arg;
    out[0] = now() - t0;
    out[1] = cpu.tv_sec + cpu.tv_nsec / 1e9 - out[1];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench pairs THREADS N | blocks N | dump N\n");
        return 2;
    }
    cudaSetDevice(0);
    cudaFree(0);
    if (strcmp(argv[1], "pairs") == 0 && argc == 4) {
        int threads = atoi(argv[2]);
        pairs_n = atol(argv[3]);
        pthread_t t[64];
        double secs[64][2];
        pthread_barrier_init(&barrier, NULL, (unsigned)threads);
        for (int i = 0; i < threads; i++)
            pthread_create(&t[i], NULL, pairs_worker, &secs[i]);
        double worst = 0, cpu = 0;
        for (int i = 0; i < threads; i++) {
            pthread_join(t[i], NULL);
            if (secs[i][0] > worst)
                worst = secs[i][0];
            cpu += secs[i][1];
        }
        /* per pair as one thread sees it: wall time of the slowest thread / its pairs;
         * `cpu` mode: CPU time of the threads / all pairs (waiting for a lock not counted) */
        if (getenv("BENCH_CPU"))
            printf("%.1f\n", cpu * 1e9 / ((double)pairs_n * threads));
        else
            printf("%.1f\n", worst * 1e9 / (double)pairs_n);
        return 0;
    }
    long n = atol(argv[2]);
    void **p = malloc((size_t)n * sizeof *p);
    if (strcmp(argv[1], "blocks") == 0) {
        long before = rss_bytes();
        for (long i = 0; i < n; i++)
            if (cudaMalloc(&p[i], 256) != cudaSuccess)
                abort();
        long after = rss_bytes();
        printf("%.1f\n", (double)(after - before) / (double)n);
        return 0;
    }
    if (strcmp(argv[1], "dump") == 0) {
        for (long i = 0; i < n; i++)
            if (cudaMalloc(&p[i], 256) != cudaSuccess)
                abort();
        void *big;
        size_t free0 = 0, free1 = 0, total = 0;
        cudaMemGetInfo(&free0, &total);
        double t0 = now();
        cudaError_t e = cudaMalloc(&big, (size_t)1 << 60);
        double t1 = now();
        cudaMemGetInfo(&free1, &total);
        /* seconds, and device bytes the failure (and its dump) took: must be 0 */
        printf("%.4f %lld\n", t1 - t0, (long long)free0 - (long long)free1);
        return e == cudaSuccess;
    }
    fprintf(stderr, "bad arguments\n");
    return 2;
}
