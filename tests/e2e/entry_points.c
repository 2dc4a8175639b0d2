/* Driver functions obtained through the runtime, the way PyTorch's expandable segments get
 * the VMM API (cudaGetDriverEntryPointByVersion) and the way NCCL gets cuMemAllocAsync with
 * the per-thread default stream flag. */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "check.h"

#define MiB (1024ull * 1024)

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static void *entry(const char *name, unsigned version, unsigned long long flags)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, flags, &st);
    CHECK(e == cudaSuccess && st == cudaDriverEntryPointSuccess && fn, "entry point %s", name);
    return fn;
}

int main(int argc, char **argv)
{
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
    CHECK(cudaFree(0) == cudaSuccess, "context");

    /* expandable segments: reserve a big range, back it page by page, unmap, release */
    create_fn create = entry("cuMemCreate", 12000, cudaEnableDefault);
    release_fn release = entry("cuMemRelease", 12000, cudaEnableDefault);
    reserve_fn reserve = entry("cuMemAddressReserve", 12000, cudaEnableDefault);
    map_fn map = entry("cuMemMap", 12000, cudaEnableDefault);
    unmap_fn unmap = entry("cuMemUnmap", 12000, cudaEnableDefault);
    if (!(create && release && reserve && map && unmap))
        return check_finish(argv[0]);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    const size_t page = 20 * MiB;
    CUdeviceptr base;
    CHECK(reserve(&base, 64 * page, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CUmemGenericAllocationHandle handles[12];
    for (int i = 0; i < 12; i++) {
        CHECK(create(&handles[i], page, &prop, 0) == CUDA_SUCCESS, "create %d", i);
        CHECK(map(base + i * page, page, 0, handles[i], 0) == CUDA_SUCCESS, "map %d", i);
        CHECK(release(handles[i]) == CUDA_SUCCESS, "release %d", i); /* PyTorch releases right away */
    }
    check_device(0, "expandable segment grown");
    CHECK(unmap(base + 8 * page, 4 * page) == CUDA_SUCCESS, "shrink");
    check_device(0, "expandable segment shrunk");

    /* NCCL: the per-thread-stream variant of cuMemAllocAsync */
    async_fn alloc_ptsz = entry("cuMemAllocAsync", 12000, cudaEnablePerThreadDefaultStream);
    free_async_fn free_ptsz = entry("cuMemFreeAsync", 12000, cudaEnablePerThreadDefaultStream);
    if (alloc_ptsz && free_ptsz) {
        CUdeviceptr q[4];
        for (int i = 0; i < 4; i++)
            CHECK(alloc_ptsz(&q[i], (size_t)(i + 1) * 3 * MiB, 0) == CUDA_SUCCESS, "ptsz alloc");
        check_device(0, "per-thread-stream async");
        for (int i = 0; i < 4; i++)
            CHECK(free_ptsz(q[i], 0) == CUDA_SUCCESS, "ptsz free");
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
        check_device(0, "per-thread-stream freed");
    }
    /* the same through the driver's own cuGetProcAddress_v2, reached by dlsym */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
    CHECK(gpa != NULL, "cuGetProcAddress_v2 by dlsym");
    if (gpa) {
        async_fn a2 = NULL;
        CHECK(gpa("cuMemAllocAsync", (void **)&a2, 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL) ==
                      CUDA_SUCCESS &&
                  a2,
              "lookup ptsz");
        CUdeviceptr r;
        if (a2) {
            CHECK(a2(&r, 7 * MiB, 0) == CUDA_SUCCESS, "alloc");
            check_device(0, "ptsz by cuGetProcAddress_v2");
        }
    }
    CHECK(unmap(base, 8 * page) == CUDA_SUCCESS, "unmap rest");
    check_device(0, "end");
    return check_finish(argv[0]);
}
