/* A program linked with -lcuda: it binds the driver's exported symbols directly, which
 * LD_PRELOAD hands to the shim.  Plain, managed, pinned, VMM (every release order) and
 * pools, plus the cuGetProcAddress self-lookup the runtime relies on. */
#include <cuda.h>

#include "check.h"

#define MiB      (1024ull * 1024)
#define OK(call) CHECK((call) == CUDA_SUCCESS, "%s", #call)

int main(int argc, char **argv)
{
    OK(cuInit(0));
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    CUdevice dev;
    CUcontext ctx;
    OK(cuDeviceGet(&dev, 1));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));

    CUdeviceptr a, b, m;
    size_t pitch;
    OK(cuMemAlloc(&a, 123456));
    OK(cuMemAllocPitch(&b, &pitch, 1001, 77, 4));
    OK(cuMemAllocManaged(&m, 3 * MiB, CU_MEM_ATTACH_GLOBAL));
    void *h;
    OK(cuMemAllocHost(&h, 1 * MiB));
    check_device(1, "driver plain");
    check_device(0, "driver pinned");

    /* VMM: physical memory lives from cuMemCreate until released AND unmapped */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    size_t gran = 0;
    OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(gran == 2 * MiB, "granularity %zu", gran);
    CUmemGenericAllocationHandle h1, h2, h3;
    OK(cuMemCreate(&h1, 10 * gran, &prop, 0));
    OK(cuMemCreate(&h2, 4 * gran, &prop, 0));
    OK(cuMemCreate(&h3, 1 * gran, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 16 * gran, 0, 0, 0));
    OK(cuMemMap(va, 10 * gran, 0, h1, 0));
    OK(cuMemMap(va + 10 * gran, 4 * gran, 0, h2, 0));
    CUmemAccessDesc acc = { .location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    OK(cuMemSetAccess(va, 14 * gran, &acc, 1));
    check_device(1, "vmm mapped");
    OK(cuMemRelease(h1)); /* still mapped: memory stays */
    check_device(1, "vmm h1 released, mapped");
    OK(cuMemRelease(h3)); /* never mapped: gone now */
    check_device(1, "vmm h3 released");
    OK(cuMemUnmap(va, 14 * gran)); /* one unmap over two mappings frees h1 */
    check_device(1, "vmm unmapped");
    OK(cuMemRelease(h2));
    OK(cuMemAddressFree(va, 16 * gran));
    check_device(1, "vmm all gone");

    /* pools through the driver */
    CUmemoryPool pool;
    OK(cuDeviceGetDefaultMemPool(&pool, dev));
    CUdeviceptr pa, pb;
    OK(cuMemAllocAsync(&pa, 33 * MiB, 0));
    OK(cuMemAllocFromPoolAsync(&pb, 1 * MiB, pool, 0));
    check_device(1, "driver pool");
    OK(cuMemFreeAsync(pa, 0));
    OK(cuMemFreeAsync(pb, 0));
    OK(cuCtxSynchronize());
    check_device(1, "driver pool freed");

    /* the self-lookup, with and without symbolStatus */
    void *gpa = NULL, *gpa1 = NULL;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
    OK(cuGetProcAddress_v2("cuGetProcAddress", &gpa, 12000, 0, &st));
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "status %d", (int)st);
    OK(cuGetProcAddress_v2("cuGetProcAddress", &gpa1, 11030, 0, NULL));
    CHECK(gpa && gpa1 && gpa != gpa1, "v1 and v2 cuGetProcAddress must differ");
    void *bogus = (void *)1;
    CUresult r = cuGetProcAddress_v2("cuNoSuchFunction", &bogus, 12000, 0, &st);
    CHECK(r != CUDA_SUCCESS && bogus == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
          "unknown symbol: r=%d st=%d", (int)r, (int)st);
    CUdeviceptr c2;
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    OK(cuGetProcAddress_v2("cuMemAlloc", (void **)&alloc, 12000, 0, NULL));
    OK(alloc(&c2, 5555));
    check_device(1, "alloc via self-lookup");
    OK(cuMemFree(c2));

    /* an out-of-memory result passes through unchanged */
    CUdeviceptr big;
    CHECK(cuMemAlloc(&big, (size_t)1 << 50) == CUDA_ERROR_OUT_OF_MEMORY, "1 PiB must fail with OOM");

    OK(cuMemFree(a));
    OK(cuMemFree(b));
    OK(cuMemFree(m));
    OK(cuMemFreeHost(h));
    check_device(1, "driver end");
    check_device(0, "driver end");
    return check_finish(argv[0]);
}
