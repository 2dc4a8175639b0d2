/* THREADS threads (default 2000), each making ALLOCS (default 1) allocations and frees, all
 * alive at once; prints the process's resident memory per thread: what each one added between
 * before the threads started and while all of them wait at the end.  Run with and without the
 * shim, the difference is what the shim costs a thread that allocates once; with many
 * allocations, what its event history costs (OOMGUARD_HISTORY).  OOM_AT_END=1: then one request
 * too big for the device (a dump). */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_barrier_t all_done, may_exit;
static long allocs = 1;

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

static void *worker(void *arg)
{
    void *p;
    int ok = 1;
    for (long i = 0; i < allocs && ok; i++)
        ok = cudaMalloc(&p, 4096) == cudaSuccess && cudaFree(p) == cudaSuccess;
    pthread_barrier_wait(&all_done);
    pthread_barrier_wait(&may_exit);
    return ok ? NULL : arg;
}

int main(void)
{
    int n = getenv("THREADS") ? atoi(getenv("THREADS")) : 2000;
    if (getenv("ALLOCS"))
        allocs = atol(getenv("ALLOCS"));
    void *p;
    if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess)
        return 2;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10); /* small, untouched stacks: the shim's share shows */
    pthread_barrier_init(&all_done, NULL, (unsigned)n + 1);
    pthread_barrier_init(&may_exit, NULL, (unsigned)n + 1);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    long before = rss_kib();
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], &attr, worker, (void *)1) != 0)
            return 3;
    pthread_barrier_wait(&all_done);
    long during = rss_kib();
    pthread_barrier_wait(&may_exit);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad |= r != NULL;
    }
    if (getenv("OOM_AT_END")) { /* a failure, for a dump of all that history */
        void *huge;
        if (cudaMalloc(&huge, (size_t)1 << 50) == cudaSuccess)
            return 5;
    }
    printf("threads %d rss_before_kib %ld rss_during_kib %ld per_thread_kib %.1f total_kib %ld\n", n, before, during,
           (double)(during - before) / n, during - before);
    return bad ? 4 : 0;
}
