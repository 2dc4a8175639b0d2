/* Every runtime allocation path on two devices; after each phase the shim's ledger must
 * equal the simulated driver's ground truth.  Built twice: against the shared runtime
 * (e2e_runtime) and the static one (e2e_static), whose driver lookups the shim can only
 * see through dlsym + cuGetProcAddress. */
#include <cuda_runtime_api.h>

#include "check.h"

#define MiB (1024ull * 1024)

static void must(cudaError_t e, const char *what) { CHECK(e == cudaSuccess, "%s: %s", what, cudaGetErrorString(e)); }

static void one_device(int dev)
{
    char label[64];
    must(cudaSetDevice(dev), "cudaSetDevice");
    void *plain[6] = { 0 };
    size_t sizes[6] = { 1, 1000, 3 * MiB, 100 * MiB, 4097, 64 * MiB + 3 };
    for (int i = 0; i < 6; i++)
        must(cudaMalloc(&plain[i], sizes[i]), "cudaMalloc");
    void *pitched, *managed, *host1, *host2;
    size_t pitch;
    must(cudaMallocPitch(&pitched, &pitch, 1000, 333), "cudaMallocPitch");
    must(cudaMallocManaged(&managed, 5 * MiB, cudaMemAttachGlobal), "cudaMallocManaged");
    must(cudaMallocHost(&host1, 10 * MiB), "cudaMallocHost");
    must(cudaHostAlloc(&host2, 3 * MiB, cudaHostAllocDefault), "cudaHostAlloc");
    snprintf(label, sizeof label, "dev%d plain", dev);
    check_device(dev, label);

    /* stream-ordered: default pool caches what is freed until a synchronisation */
    void *async[8];
    for (int i = 0; i < 8; i++)
        must(cudaMallocAsync(&async[i], (size_t)(i + 1) * 7 * MiB, 0), "cudaMallocAsync");
    snprintf(label, sizeof label, "dev%d async", dev);
    check_device(dev, label);
    for (int i = 0; i < 8; i += 2)
        must(cudaFreeAsync(async[i], 0), "cudaFreeAsync");
    must(cudaStreamSynchronize(0), "cudaStreamSynchronize");
    snprintf(label, sizeof label, "dev%d async freed+sync", dev);
    check_device(dev, label);

    /* an explicit pool that keeps its memory (release threshold = max) */
    cudaMemPool_t pool;
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    must(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    uint64_t keep = UINT64_MAX;
    must(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "set threshold");
    void *p1, *p2;
    must(cudaMallocFromPoolAsync(&p1, 40 * MiB, pool, 0), "cudaMallocFromPoolAsync");
    must(cudaMallocFromPoolAsync(&p2, 9 * MiB + 1, pool, 0), "cudaMallocFromPoolAsync");
    must(cudaFreeAsync(p1, 0), "cudaFreeAsync pool");
    must(cudaStreamSynchronize(0), "sync");
    snprintf(label, sizeof label, "dev%d pool cached", dev);
    check_device(dev, label);
    must(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
    snprintf(label, sizeof label, "dev%d pool trimmed", dev);
    check_device(dev, label);
    must(cudaFreeAsync(p2, 0), "cudaFreeAsync pool");
    must(cudaStreamSynchronize(0), "sync");
    must(cudaMemPoolDestroy(pool), "cudaMemPoolDestroy");
    snprintf(label, sizeof label, "dev%d pool destroyed", dev);
    check_device(dev, label);

    for (int i = 1; i < 8; i += 2)
        must(cudaFree(async[i]), "cudaFree of async block");
    for (int i = 0; i < 6; i++)
        must(cudaFree(plain[i]), "cudaFree");
    must(cudaFree(pitched), "cudaFree pitched");
    must(cudaFree(managed), "cudaFree managed");
    must(cudaFreeHost(host1), "cudaFreeHost");
    must(cudaFreeHost(host2), "cudaFreeHost");
    must(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    snprintf(label, sizeof label, "dev%d all freed", dev);
    check_device(dev, label);
}

int main(int argc, char **argv)
{
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    int n = 0;
    must(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    CHECK(n == 2, "expected 2 simulated devices (SIMGPU_DEVICES=2), got %d", n);
    for (int dev = 0; dev < n && dev < 2; dev++)
        one_device(dev);

    /* a failure: the error reaches the program unchanged, sticky semantics intact */
    must(cudaSetDevice(0), "cudaSetDevice");
    void *huge = NULL;
    cudaError_t e = cudaMalloc(&huge, (size_t)1 << 50);
    CHECK(e == cudaErrorMemoryAllocation, "1 PiB cudaMalloc: got %d", (int)e);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "sticky error lost");
    CHECK(cudaGetLastError() == cudaSuccess, "error not cleared");
    /* a free of a pointer nobody allocated: passed through, counted */
    e = cudaFree((void *)0x1234500);
    CHECK(e != cudaSuccess, "bogus free succeeded");
    (void)cudaGetLastError();
    if (have_shim) {
        oomguard_device_stats_t s;
        simgpu_truth_t t;
        p_stats(0, &s);
        p_truth(0, &t);
        LEDGER_CHECK(s.failures == t.failed_allocs, "failures: shim %llu driver %llu", (unsigned long long)s.failures,
                     (unsigned long long)t.failed_allocs);
        LEDGER_CHECK(s.unknown_frees == 1, "unknown frees: %llu", (unsigned long long)s.unknown_frees);
        LEDGER_CHECK(s.peak_tracked_bytes > 0, "no peak");
    }
    check_device(0, "end");
    check_device(1, "end");

    /* cudaDeviceReset frees the device's cudaMalloc blocks without a cudaFree each */
    must(cudaSetDevice(1), "cudaSetDevice");
    void *r1, *r2;
    must(cudaMalloc(&r1, 5 * MiB), "cudaMalloc before reset");
    must(cudaMalloc(&r2, 123457), "cudaMalloc before reset");
    check_device(1, "before cudaDeviceReset");
    must(cudaDeviceReset(), "cudaDeviceReset");
    check_device(1, "after cudaDeviceReset");
    must(cudaMalloc(&r1, 1 * MiB), "cudaMalloc after reset");
    check_device(1, "allocating after cudaDeviceReset");
    return check_finish(argv[0]);
}
