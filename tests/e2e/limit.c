/* OOMGUARD_LIMIT on one of two devices (run with OOMGUARD_LIMIT=1:4GiB, SIMGPU_DEVICES=2):
 * every API family fails at the limit without reaching the driver, frees give the room
 * back, and every memory query shows the limited device consistently.
 *   limit          the main scenario
 *   over           the limit is below what the process already uses (its context)
 *   plain          no limit expected: totals are physical (bad OOMGUARD_LIMIT values) */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "check.h"

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;
static int (*nvml_init)(void);
static int (*nvml_by_index)(unsigned, void **);
static int (*nvml_meminfo)(void *, nvml_memory_t *);

static void nvml_setup(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h)
        return;
    nvml_init = dlsym(h, "nvmlInit_v2");
    nvml_by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvml_meminfo = dlsym(h, "nvmlDeviceGetMemoryInfo");
    if (nvml_init)
        nvml_init();
}

/* cudaMemGetInfo, cuDeviceTotalMem and NVML all agree with the expected view */
static void views(int dev, uint64_t want_total, uint64_t want_free, const char *label)
{
    size_t f = 0, t = 0;
    cudaSetDevice(dev);
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess, "[%s] cudaMemGetInfo failed", label);
    CHECK(t == want_total, "[%s] cudaMemGetInfo total %zu != %llu", label, t, (unsigned long long)want_total);
    CHECK(f == want_free, "[%s] cudaMemGetInfo free %zu != %llu", label, f, (unsigned long long)want_free);
    CHECK(f <= t, "[%s] free above total", label);
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev) == cudaSuccess, "[%s] properties", label);
    CHECK(prop.totalGlobalMem == want_total, "[%s] totalGlobalMem %zu", label, prop.totalGlobalMem);
    if (nvml_by_index && nvml_meminfo) {
        void *h;
        nvml_memory_t m;
        CHECK(nvml_by_index((unsigned)dev, &h) == 0 && nvml_meminfo(h, &m) == 0, "[%s] nvml", label);
        CHECK(m.total == want_total && m.free == want_free && m.used == m.total - m.free,
              "[%s] NVML total %llu free %llu used %llu", label, m.total, m.free, m.used);
    }
}

static uint64_t driver_failures(int dev)
{
    simgpu_truth_t t;
    p_truth(dev, &t);
    return t.failed_allocs;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "limit";
    if (check_setup() <= 0) {
        fprintf(stderr, "needs liboomguard.so\n");
        return 1;
    }
    nvml_setup();
    CHECK(cudaSetDevice(1) == cudaSuccess && cudaFree(0) == cudaSuccess, "context on device 1");
    simgpu_truth_t t1;
    p_truth(1, &t1);
    uint64_t ctx = t1.context_bytes;

    if (strcmp(mode, "plain") == 0) {
        views(1, t1.total_bytes, t1.free_bytes, "no limit");
        return check_finish(argv[0]);
    }
    if (strcmp(mode, "over") == 0) {
        /* limit 256 MiB, the context alone is larger: free is 0, never negative or an error */
        views(1, 256 * MiB, 0, "over the limit");
        void *p;
        CHECK(cudaMalloc(&p, 1) == cudaErrorMemoryAllocation, "1 byte over the limit must fail");
        (void)cudaGetLastError();
        return check_finish(argv[0]);
    }

    const uint64_t L = 4 * GiB;
    views(1, L, L - ctx, "start");
    void *big;
    CHECK(cudaMalloc(&big, 3 * GiB) == cudaSuccess, "3 GiB under the limit");
    views(1, L, L - ctx - 3 * GiB, "3 GiB held");
    check_device(1, "3 GiB held");

    /* runtime: refused with the runtime's own sticky error, the driver never sees it */
    uint64_t before = driver_failures(1);
    void *p;
    CHECK(cudaMalloc(&p, 1 * GiB) == cudaErrorMemoryAllocation, "runtime over the limit");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "sticky error");
    CHECK(cudaGetLastError() == cudaSuccess, "error cleared");
    CHECK(driver_failures(1) == before, "the driver must not see a refused allocation");

    /* driver, through the runtime's entry point */
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    CUresult (*dfree)(CUdeviceptr) = NULL;
    enum cudaDriverEntryPointQueryResult st;
    cudaGetDriverEntryPointByVersion("cuMemAlloc", (void **)&alloc, 12000, cudaEnableDefault, &st);
    cudaGetDriverEntryPointByVersion("cuMemFree", (void **)&dfree, 12000, cudaEnableDefault, &st);
    CUdeviceptr d;
    CHECK(alloc && alloc(&d, 1 * GiB) == CUDA_ERROR_OUT_OF_MEMORY, "driver over the limit");
    CHECK(alloc && alloc(&d, 256 * MiB) == CUDA_SUCCESS, "driver under the limit");
    views(1, L, L - ctx - 3 * GiB - 256 * MiB, "driver block");
    CHECK(dfree(d) == CUDA_SUCCESS, "driver free");

    /* VMM */
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    cudaGetDriverEntryPointByVersion("cuMemCreate", (void **)&create, 12000, cudaEnableDefault, &st);
    cudaGetDriverEntryPointByVersion("cuMemRelease", (void **)&release, 12000, cudaEnableDefault, &st);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    CUmemGenericAllocationHandle h;
    CHECK(create(&h, 1 * GiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "VMM over the limit");
    CHECK(create(&h, 256 * MiB, &prop, 0) == CUDA_SUCCESS, "VMM under the limit");
    views(1, L, L - ctx - 3 * GiB - 256 * MiB, "VMM handle");
    CHECK(release(h) == CUDA_SUCCESS, "VMM release");

    /* stream-ordered pool */
    CHECK(cudaMallocAsync(&p, 1 * GiB, 0) == cudaErrorMemoryAllocation, "pool over the limit");
    (void)cudaGetLastError();
    CHECK(cudaMallocAsync(&p, 128 * MiB, 0) == cudaSuccess, "pool under the limit");
    CHECK(cudaFreeAsync(p, 0) == cudaSuccess && cudaStreamSynchronize(0) == cudaSuccess, "pool free");
    cudaMemPool_t pool;
    cudaDeviceGetDefaultMemPool(&pool, 1);
    cudaMemPoolTrimTo(pool, 0);
    views(1, L, L - ctx - 3 * GiB, "after pool");
    check_device(1, "after pool");

    CHECK(cudaFree(big) == cudaSuccess, "free 3 GiB");
    views(1, L, L - ctx, "all freed");
    check_device(1, "all freed");

    /* the other device has no limit */
    simgpu_truth_t t0;
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    CHECK(cudaMalloc(&p, 10 * GiB) == cudaSuccess, "10 GiB on the unlimited device");
    p_truth(0, &t0);
    views(0, t0.total_bytes, t0.free_bytes, "device 0 unlimited");
    cudaFree(p);
    return check_finish(argv[0]);
}
