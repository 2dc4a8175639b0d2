/* libtensorflow_framework.so.2 stand-in: TensorFlow's GPU device, created at the first op, maps
 * nearly all free memory into its BFC allocator (free minus a small reserve) unless
 * TF_FORCE_GPU_ALLOW_GROWTH=true. */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "driver.h"
#include "kit.h"
#include "truth.h"

int tf_gpu_init(int device)
{
    size_t free_b = 0, total = 0;
    if (kit_bind_primary_ctx(device))
        return 1;
    const char *g = getenv("TF_FORCE_GPU_ALLOW_GROWTH");
    if (g && !strcasecmp(g, "true"))
        return 0;
    cuMemGetInfo(&free_b, &total);
    size_t reserve = 300 * MiB;
    size_t want = (free_b > reserve ? free_b - reserve : 0) / (2 * MiB) * (2 * MiB);
    CUdeviceptr p;
    if (want && cuMemAlloc(&p, want) != CUDA_SUCCESS) {
        scen_mark("fail", "libtensorflow_framework.so.2", device, want, NULL);
        return 2;
    }
    return 0;
}

/* with allow_growth the BFC allocator grows region by region (cuMemAlloc) as tensors need it */
void *tf_alloc(size_t nbytes)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, nbytes) != CUDA_SUCCESS) {
        int dev = 0;
        scen_mark("fail", "libtensorflow_framework.so.2", dev, nbytes, NULL);
        return NULL;
    }
    return (void *)(uintptr_t)p;
}
