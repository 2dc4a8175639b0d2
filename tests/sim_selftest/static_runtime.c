/*
 * static_runtime.c — the simulated libcudart_static.a linked into a program
 * that does not link libcuda: the runtime must find the driver itself
 * (dlopen of libcuda.so.1) and behave exactly like the shared runtime.
 * Run by sim_selftest; exits 0 when every check passed.
 */
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "simgpu.h"

#define MiB (1024ULL * 1024ULL)

static int pass, fail;

#define CHECK(c)                                                         \
    do {                                                                 \
        if (c) {                                                         \
            pass++;                                                      \
        } else {                                                         \
            fail++;                                                      \
            printf("FAIL [static-runtime] line %d: %s\n", __LINE__, #c); \
        }                                                                \
    } while (0)

int main(void)
{
    setenv("SIMGPU_DEVICES", "1", 1);
    setenv("SIMGPU_MEM", "16GiB", 1);
    unsetenv("SIMGPU_OTHER_PROCS");
    unsetenv("SIMGPU_FAIL_NTH");
    unsetenv("SIMGPU_FAIL_PROB");
    unsetenv("SIMGPU_STATE_DIR");
    CHECK(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == NULL); /* not linked in */

    void *p = NULL;
    CHECK(cudaMalloc(&p, 5 * MiB) == cudaSuccess);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    int (*truth)(int, simgpu_truth_t *) = lib ? (int (*)(int, simgpu_truth_t *))dlsym(lib, "simgpu_truth") : NULL;
    CHECK(truth != NULL);
    simgpu_truth_t t = { 0 };
    if (truth)
        CHECK(truth(0, &t) == 0);
    CHECK(t.alloc_requested_bytes == 5 * MiB);
    CHECK(t.alloc_charged_bytes == 6 * MiB);
    CHECK(t.contexts == 1);
    CHECK(cudaMalloc(&p, 64ULL << 30) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaFree(p) == cudaSuccess);
    if (truth)
        truth(0, &t);
    CHECK(t.alloc_blocks == 0);
    if (lib)
        dlclose(lib);
    printf("static runtime: %d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
