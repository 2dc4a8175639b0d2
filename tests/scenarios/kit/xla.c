/* xla_extension.so stand-in: the JAX GPU client.  At creation it preallocates
 * XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of the device's total memory with the driver API
 * (cuMemAlloc_v2, in the primary context) unless XLA_PYTHON_CLIENT_PREALLOCATE=false; its BFC
 * allocator then carves arrays out of that arena without asking the driver again. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "driver.h"
#include "kit.h"
#include "truth.h"

static CUdeviceptr arena;
static size_t arena_size, arena_used;

int xla_client_init(int device)
{
    size_t free_b = 0, total = 0;
    if (kit_bind_primary_ctx(device))
        return 1;
    const char *pre = getenv("XLA_PYTHON_CLIENT_PREALLOCATE");
    if (pre && (!strcasecmp(pre, "false") || !strcmp(pre, "0")))
        return 0;
    const char *fr = getenv("XLA_PYTHON_CLIENT_MEM_FRACTION");
    double fraction = fr ? atof(fr) : 0.75;
    cuMemGetInfo(&free_b, &total);
    size_t want = (size_t)(fraction * (double)total) / (2 * MiB) * (2 * MiB);
    if (cuMemAlloc(&arena, want) != CUDA_SUCCESS) {
        scen_mark("fail", "xla_extension.so", device, want, NULL);
        return 2; /* RESOURCE_EXHAUSTED at client creation */
    }
    arena_size = want;
    return 0;
}

void *xla_buffer(size_t nbytes)
{
    if (arena_size && arena_used + nbytes <= arena_size) {
        void *p = (void *)(uintptr_t)(arena + arena_used);
        arena_used += (nbytes + 255) / 256 * 256;
        return p;
    }
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, nbytes) != CUDA_SUCCESS)
        return NULL;
    return (void *)(uintptr_t)p;
}
