/* libworkspace.so: a library that takes device memory on its own, the way cuBLAS/cuDNN
 * workspaces or a custom kernel library do. */
#include "common.h"

void *workspace_reserve(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
