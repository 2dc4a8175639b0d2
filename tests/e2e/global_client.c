/* A library linked against the driver (-lcuda), as a Python extension or a framework's plugin is, that the
 * program loads with dlopen(RTLD_GLOBAL) (ctypes.CDLL(path, mode=RTLD_GLOBAL), sys.setdlopenflags): its
 * allocations reach the shim's exported symbols directly, and the driver arrives in the process with it. */
#include <cuda.h>

int og_client_alloc(int device, size_t bytes, CUdeviceptr *out);
int og_client_free(CUdeviceptr p);

int og_client_alloc(int device, size_t bytes, CUdeviceptr *out)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 1;
    return cuMemAlloc(out, bytes) == CUDA_SUCCESS ? 0 : 2;
}

int og_client_free(CUdeviceptr p) { return cuMemFree(p) == CUDA_SUCCESS ? 0 : 1; }
