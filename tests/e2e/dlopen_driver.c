/* The way XLA and many others reach the driver: dlopen("libcuda.so.1") and dlsym() on the
 * handle, which LD_PRELOAD alone does not intercept. */
#include <cuda.h>

#include "check.h"

int main(int argc, char **argv)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen libcuda.so.1: %s", dlerror());
    if (!h)
        return 1;
    CUresult (*init)(unsigned) = dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = dlsym(h, "cuMemAlloc_v2");
    CUresult (*release)(CUdeviceptr) = dlsym(h, "cuMemFree_v2");
    CHECK(init && retain && set && alloc && release, "dlsym on the handle");
    if (!(init && retain && set && alloc && release))
        return check_finish(argv[0]);
    int have_shim = check_setup();
    if (have_shim < 0)
        return 1;
    CUcontext ctx;
    CHECK(init(0) == CUDA_SUCCESS, "cuInit");
    CHECK(retain(&ctx, 0) == CUDA_SUCCESS, "retain");
    CHECK(set(ctx) == CUDA_SUCCESS, "set");
    CUdeviceptr p[50];
    for (int i = 0; i < 50; i++)
        CHECK(alloc(&p[i], (size_t)(i + 1) * 99991) == CUDA_SUCCESS, "alloc %d", i);
    check_device(0, "xla-style allocs");
    for (int i = 0; i < 50; i += 3)
        CHECK(release(p[i]) == CUDA_SUCCESS, "free %d", i);
    check_device(0, "xla-style frees");
    return check_finish(argv[0]);
}
