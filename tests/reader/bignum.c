/* Programs for tests/reader/run_tests.sh, one mode per case; run under liboomguard.so on the
 * simulated GPU (SIMGPU_DEVICES=2).  Ends with "NAME: N checks, N failed".
 *   huge       requests no device holds: 2^53+1 bytes (cudaMalloc) and SIZE_MAX (cuMemAlloc),
 *              so the dump carries integers that a double cannot hold
 *   ctxarrays  CUDA arrays (cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate) in a created
 *              context that is destroyed, and in a primary context released to zero: their
 *              blocks leave the ledger with the context, and the runtime's with cudaDeviceReset
 *              (arrays leave the ledger with their context) */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "check.h"

#define MiB (1024ull * 1024)

static int mode_huge(void)
{
    void *p;
    CUdeviceptr d;
    CHECK(cudaSetDevice(0) == cudaSuccess, "device 0");
    CHECK(cudaFree(0) == cudaSuccess, "context");
    CHECK(cudaMalloc(&p, ((size_t)1 << 53) + 1) == cudaErrorMemoryAllocation, "2^53+1 must fail");
    CHECK(cuMemAlloc(&d, SIZE_MAX) == CUDA_ERROR_OUT_OF_MEMORY, "SIZE_MAX must fail");
    check_device(0, "huge");
    return 0;
}

/* Three arrays in the current context: 16 + 8 + (4+1+...) MiB. */
static void make_arrays(CUarray *a2, CUarray *a3, CUmipmappedArray *mm)
{
    CUDA_ARRAY_DESCRIPTOR d2 = { 2048, 2048, CU_AD_FORMAT_FLOAT, 1 };                /* 16 MiB */
    CUDA_ARRAY3D_DESCRIPTOR d3 = { 256, 256, 32, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0 }; /* 8 MiB */
    CUDA_ARRAY3D_DESCRIPTOR dm = { 1024, 1024, 0, CU_AD_FORMAT_HALF, 2, 0 };         /* 4 MiB + levels */
    CHECK(cuArrayCreate(a2, &d2) == CUDA_SUCCESS, "cuArrayCreate");
    CHECK(cuArray3DCreate(a3, &d3) == CUDA_SUCCESS, "cuArray3DCreate");
    CHECK(cuMipmappedArrayCreate(mm, &dm, 3) == CUDA_SUCCESS, "cuMipmappedArrayCreate");
}

static int mode_ctxarrays(void)
{
    CUdevice dev;
    CUcontext created, prim;
    CUarray a2, a3, b2, b3;
    CUmipmappedArray mm, nm;
    CUdeviceptr keep;
    CHECK(cuInit(0) == CUDA_SUCCESS, "init");
    CHECK(cuDeviceGet(&dev, 1) == CUDA_SUCCESS, "device 1");
    CHECK(cuDevicePrimaryCtxRetain(&prim, dev) == CUDA_SUCCESS, "retain");
    CHECK(cuCtxSetCurrent(prim) == CUDA_SUCCESS, "primary current");
    make_arrays(&a2, &a3, &mm); /* the primary's */
    CHECK(cuMemAlloc(&keep, 2 * MiB) == CUDA_SUCCESS, "primary block");
    CHECK(cuCtxCreate(&created, NULL, 0, dev) == CUDA_SUCCESS, "create");
    make_arrays(&b2, &b3, &nm); /* the created context's */
    check_device(1, "arrays in two contexts");
    CHECK(cuCtxDestroy(created) == CUDA_SUCCESS, "destroy");
    check_device(1, "created context destroyed: its arrays gone, the primary's kept");
    CHECK(cuCtxSetCurrent(prim) == CUDA_SUCCESS, "primary current again");
    CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS, "release to zero");
    check_device(1, "primary context released to zero: its arrays gone");
    /* a new primary context: new arrays are counted, and destroyed normally */
    CHECK(cuDevicePrimaryCtxRetain(&prim, dev) == CUDA_SUCCESS, "retain again");
    CHECK(cuCtxSetCurrent(prim) == CUDA_SUCCESS, "new primary current");
    make_arrays(&a2, &a3, &mm);
    check_device(1, "arrays in the new primary context");
    CHECK(cuArrayDestroy(a2) == CUDA_SUCCESS && cuArrayDestroy(a3) == CUDA_SUCCESS &&
              cuMipmappedArrayDestroy(mm) == CUDA_SUCCESS,
          "destroy arrays");
    check_device(1, "arrays destroyed one by one");
    CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS, "release again");

    /* the runtime's arrays, in its primary context, gone with cudaDeviceReset */
    cudaArray_t ra, r3;
    cudaMipmappedArray_t rm;
    struct cudaChannelFormatDesc ch = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    CHECK(cudaSetDevice(0) == cudaSuccess, "runtime device 0");
    CHECK(cudaMallocArray(&ra, &ch, 1024, 1024, 0) == cudaSuccess, "cudaMallocArray");
    CHECK(cudaMalloc3DArray(&r3, &ch, (struct cudaExtent){ 256, 256, 16 }, 0) == cudaSuccess, "cudaMalloc3DArray");
    CHECK(cudaMallocMipmappedArray(&rm, &ch, (struct cudaExtent){ 512, 512, 0 }, 4, 0) == cudaSuccess,
          "cudaMallocMipmappedArray");
    check_device(0, "runtime arrays");
    CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
    check_device(0, "runtime arrays gone with cudaDeviceReset");
    return 0;
}

int main(int argc, char **argv)
{
    const char *m = argc > 1 ? argv[1] : "";
    if (check_setup() < 0)
        return 2;
    int r = !strcmp(m, "huge")        ? mode_huge()
            : !strcmp(m, "ctxarrays") ? mode_ctxarrays()
                                      : (fprintf(stderr, "unknown mode %s\n", m), 2);
    if (r)
        return r;
    return check_finish(m);
}
