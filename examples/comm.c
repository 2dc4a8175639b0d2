/* libcomm.so: a communication library that allocates its own buffers, as NCCL does. */
#include <cuda_runtime_api.h>
#include <stddef.h>

void *comm_init_buffers(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
