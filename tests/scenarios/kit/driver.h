/* For the stand-ins that talk to the driver API themselves (xla.c, tensorflow's tf.c), as the real clients do. */
#ifndef SCEN_DRIVER_H
#define SCEN_DRIVER_H
#include <cuda.h>

/* the client's start: the device's primary context, made current; 0, or 1 when the driver refuses */
static inline int kit_bind_primary_ctx(int device)
{
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 1;
    return 0;
}
#endif
