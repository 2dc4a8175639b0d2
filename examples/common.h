/* Shared by the examples: sizes and a tiny "model" vocabulary. */
#ifndef OG_EXAMPLES_COMMON_H
#define OG_EXAMPLES_COMMON_H
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

static inline void fail_exit(const char *what)
{
    fprintf(stderr, "%s: CUDA out of memory\n", what);
    exit(3);
}

/* The helper libraries, each taking device memory on its own with cudaMalloc */
void *workspace_reserve(size_t bytes); /* libworkspace.so (examples/workspace.c) */
void *comm_init_buffers(size_t bytes); /* libcomm.so (examples/comm.c) */
#endif
