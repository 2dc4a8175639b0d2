/* 2 devices x 8 threads x 100k random allocations and frees, with the simulated driver
 * failing a seeded share of them (SIMGPU_FAIL_PROB).  The ledger must still match the
 * driver to the byte, and every failure the driver reported must be counted. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "check.h"

#define THREADS 8
#define OPS     100000
#define SLOTS   64

static int ops = OPS;

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    int dev = (int)(uintptr_t)arg % 2;
    if (cudaSetDevice(dev) != cudaSuccess)
        return (void *)1;
    void *slot[SLOTS] = {0};
    int kind[SLOTS] = {0};
    for (int i = 0; i < ops; i++) {
        int s = (int)(rand_r(&seed) % SLOTS);
        if (slot[s]) {
            cudaError_t e = kind[s] ? cudaFreeAsync(slot[s], 0) : cudaFree(slot[s]);
            if (e != cudaSuccess)
                return (void *)2;
            slot[s] = NULL;
        } else {
            size_t size = 1 + rand_r(&seed) % (4u << 20);
            kind[s] = (int)(rand_r(&seed) % 4 == 0);
            cudaError_t e = kind[s] ? cudaMallocAsync(&slot[s], size, 0) : cudaMalloc(&slot[s], size);
            if (e != cudaSuccess) {
                slot[s] = NULL;
                (void)cudaGetLastError();
            }
        }
    }
    for (int s = 0; s < SLOTS; s++)
        if (slot[s])
            cudaFree(slot[s]);
    return NULL;
}

int main(int argc, char **argv)
{
    if (getenv("STRESS_OPS"))
        ops = atoi(getenv("STRESS_OPS"));
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    for (int i = 0; i < THREADS; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        CHECK(rv == NULL, "worker %d failed (%p)", i, rv);
    }
    cudaSetDevice(0);
    cudaDeviceSynchronize();
    for (int dev = 0; dev < 2; dev++) {
        check_device(dev, "after stress");
        if (have_shim) {
            oomguard_device_stats_t s;
            simgpu_truth_t tr;
            p_stats(dev, &s);
            p_truth(dev, &tr);
            CHECK(s.failures == tr.failed_allocs, "dev %d failures: shim %llu driver %llu", dev,
                  (unsigned long long)s.failures, (unsigned long long)tr.failed_allocs);
            CHECK(tr.injected_failures > 0, "dev %d: no failure was injected", dev);
            CHECK(s.plain_blocks == 0 && s.pool_blocks == 0, "dev %d: blocks left", dev);
            printf("dev %d: %llu allocs, %llu frees, %llu failures (%llu injected), peak %llu bytes\n", dev,
                   (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.failures,
                   (unsigned long long)tr.injected_failures, (unsigned long long)s.peak_tracked_bytes);
        }
    }
    return check_finish(argv[0]);
}
