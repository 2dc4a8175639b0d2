/* libdali.so stand-in: a GPU data-loading pipeline (NVIDIA DALI) that keeps its output buffers
 * in device memory it allocates itself with cudaMalloc. */
#include <cuda_runtime_api.h>

#include "kit.h"

static void *bufs[16];
static int nbufs;

int dali_pipeline_build(int buffers, size_t bytes_each)
{
    for (nbufs = 0; nbufs < buffers && nbufs < 16; nbufs++)
        if (cudaMalloc(&bufs[nbufs], bytes_each) != cudaSuccess) {
            (void)cudaGetLastError();
            return 1;
        }
    return 0;
}

void dali_pipeline_release_outputs(void)
{
    for (int i = 0; i < nbufs; i++)
        cudaFree(bufs[i]);
    nbufs = 0;
}
