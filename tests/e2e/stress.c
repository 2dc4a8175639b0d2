/* 2 devices x 8 threads x 100k random allocations and frees, with the simulated driver
 * failing a seeded share of them (SIMGPU_FAIL_PROB).  The ledger must still match the
 * driver to the byte, and every failure the driver reported must be counted.
 * STRESS_THREADS and STRESS_OPS (per thread) size it: `make soak` runs 16 x 1M.
 * Meanwhile short-lived threads come and go (one per 1,000 operations of a worker): each
 * allocates a few small blocks, frees half and leaves the rest to the thread that made it,
 * which frees them once it has ended; their shards are the workers' too, so a thread's end
 * (which adds its shard's batched bytes to the device's total) meets the workers' own
 * allocations and frees on the same shard. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "check.h"

#define MAX_THREADS 64
#define OPS         100000
#define SLOTS       64

static int ops = OPS, threads = 8;
/* what the program itself did, per device: the shim's counters must say the same */
static _Atomic unsigned long long did_alloc[2], did_free[2];

static void *worker(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    int dev = (int)(uintptr_t)arg % 2;
    if (cudaSetDevice(dev) != cudaSuccess)
        return (void *)1;
    void *slot[SLOTS] = { 0 };
    int kind[SLOTS] = { 0 };
    for (int i = 0; i < ops; i++) {
        int s = (int)(rand_r(&seed) % SLOTS);
        if (slot[s]) {
            cudaError_t e = kind[s] ? cudaFreeAsync(slot[s], 0) : cudaFree(slot[s]);
            if (e != cudaSuccess)
                return (void *)2;
            did_free[dev]++;
            slot[s] = NULL;
        } else {
            size_t size = 1 + rand_r(&seed) % (4u << 20);
            kind[s] = (int)(rand_r(&seed) % 4 == 0);
            cudaError_t e = kind[s] ? cudaMallocAsync(&slot[s], size, 0) : cudaMalloc(&slot[s], size);
            if (e != cudaSuccess) {
                slot[s] = NULL;
                (void)cudaGetLastError();
            } else {
                did_alloc[dev]++;
            }
        }
    }
    for (int s = 0; s < SLOTS; s++)
        if (slot[s] && cudaFree(slot[s]) == cudaSuccess)
            did_free[dev]++;
    return NULL;
}

/* One short-lived thread: 4 small blocks, the last 2 left to its maker. */
typedef struct {
    int dev;
    unsigned seed;
    void *left[2];
} churn_t;

static void *churn_one(void *arg)
{
    churn_t *c = arg;
    if (cudaSetDevice(c->dev) != cudaSuccess)
        return (void *)1;
    void *p[4] = { 0 };
    for (int i = 0; i < 4; i++) {
        if (cudaMalloc(&p[i], 1 + rand_r(&c->seed) % (1u << 20)) == cudaSuccess)
            did_alloc[c->dev]++;
        else
            p[i] = NULL, (void)cudaGetLastError();
    }
    for (int i = 0; i < 2; i++)
        if (p[i]) {
            if (cudaFree(p[i]) != cudaSuccess)
                return (void *)2;
            did_free[c->dev]++;
        }
    c->left[0] = p[2];
    c->left[1] = p[3];
    return NULL;
}

static void *churn(void *arg)
{
    int rounds = ops / 1000 > 0 ? ops / 1000 : 1;
    for (int k = 0; k < rounds; k++) {
        churn_t c = { k % 2, (unsigned)k * 2246822519u + 7, { 0 } };
        pthread_t t;
        void *rv;
        if (pthread_create(&t, NULL, churn_one, &c) != 0 || pthread_join(t, &rv) != 0 || rv)
            return (void *)3;
        if (cudaSetDevice(c.dev) != cudaSuccess)
            return (void *)4;
        for (int i = 0; i < 2; i++)
            if (c.left[i]) { /* a block of a thread that has ended */
                if (cudaFree(c.left[i]) != cudaSuccess)
                    return (void *)5;
                did_free[c.dev]++;
            }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (getenv("STRESS_OPS"))
        ops = atoi(getenv("STRESS_OPS"));
    if (getenv("STRESS_THREADS"))
        threads = atoi(getenv("STRESS_THREADS"));
    if (threads < 2 || threads > MAX_THREADS)
        threads = 8;
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    pthread_t t[MAX_THREADS], ct;
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    pthread_create(&ct, NULL, churn, NULL);
    for (int i = 0; i < threads; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        CHECK(rv == NULL, "worker %d failed (%p)", i, rv);
    }
    void *crv;
    pthread_join(ct, &crv);
    CHECK(crv == NULL, "the short-lived threads failed (%p)", crv);
    cudaSetDevice(0);
    cudaDeviceSynchronize();
    /* an OG_DEBUG build of the shim (make soak) checks its books against each other */
    int (*ledger_check)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "oomguard_debug_ledger_check");
    if (ledger_check) {
        int bad = ledger_check();
        CHECK(bad == 0, "the ledger's books disagree in %d place(s)", bad);
        printf("ledger consistency (OG_DEBUG): %d mismatch(es)\n", bad);
    }
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
            CHECK(s.allocs == did_alloc[dev] && s.frees == did_free[dev],
                  "dev %d: shim counted %llu allocs / %llu frees, the program made %llu / %llu", dev,
                  (unsigned long long)s.allocs, (unsigned long long)s.frees, did_alloc[dev], did_free[dev]);
            /* the peak counts requested bytes; the driver's adds granularity and the context */
            CHECK(s.peak_tracked_bytes > 0 && s.peak_tracked_bytes <= tr.peak_used_bytes - tr.context_bytes,
                  "dev %d: peak %llu, driver peak %llu - context %llu", dev, (unsigned long long)s.peak_tracked_bytes,
                  tr.peak_used_bytes, tr.context_bytes);
            printf("dev %d: %llu allocs, %llu frees, %llu failures (%llu injected), peak %llu bytes\n", dev,
                   (unsigned long long)s.allocs, (unsigned long long)s.frees, (unsigned long long)s.failures,
                   (unsigned long long)tr.injected_failures, (unsigned long long)s.peak_tracked_bytes);
        }
    }
    return check_finish(argv[0]);
}
