/* libcomm.so: a communication library that allocates its own buffers, as NCCL does. */
#include "common.h"

void *comm_init_buffers(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
