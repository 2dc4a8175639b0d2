/* libc10_cuda.so of the stand-in torch (tests/adapter/fake_torch): PyTorch's caching allocator
 * calls the CUDA runtime from libc10_cuda.so, so the ledger names that library as the caller of
 * every segment (memory.by_library, event.library, top_sites).  The stand-in's allocator is
 * Python (torch/_alloc.py); it reaches the runtime through these forwarders, loaded with ctypes,
 * so that its blocks are attributed as a real PyTorch process's are, not to libffi.
 *
 * The other stand-ins' allocators are Python too and reach the runtime through the same
 * forwarders, built under the names of the libraries their real counterparts allocate from
 * (tests/adapter/adapter.mk): jaxlib/xla_extension.so (JAX's XLA client), cupy/cuda/memory.so
 * (CuPy's compiled memory pool module) and libtensorflow_framework.so.2 (TensorFlow's BFC
 * allocator).  FWD_PREFIX names the forwarders: c10_ here, xla_, cupy_ and tf_ there.
 *
 * Real XLA (jaxlib) and TensorFlow allocate device memory with the driver API, through
 * StreamExecutor: cuMemAlloc_v2 in the device's primary context, made current (cuMemFree_v2,
 * cuMemGetInfo_v2), not cudaMalloc.  Built with FWD_DRIVER (xla_extension.so and
 * libtensorflow_framework.so.2), these forwarders carry those driver functions too, so that the
 * stand-ins' blocks reach the driver from the library and by the entry point the real ones use.
 *
 * Each forwarder calls the runtime (or driver) function of the same name with the caller's
 * arguments and returns its result.  Built with -fno-optimize-sibling-calls: a tail call would leave libffi's
 * frame, not this library's, as the caller the shim sees.  Test code only. */
#ifdef FWD_DRIVER
#include <cuda.h>
#endif
#include <cuda_runtime_api.h>
#include <stddef.h>

#ifndef FWD_PREFIX
#define FWD_PREFIX c10_
#endif
#define FWD_CAT2(a, b) a##b
#define FWD_CAT(a, b)  FWD_CAT2(a, b)

#define FWD(ret, name, params, args)                                                               \
    __attribute__((visibility("default"), noinline)) ret FWD_CAT(FWD_PREFIX, name) params;         \
    ret FWD_CAT(FWD_PREFIX, name) params                                                           \
    {                                                                                              \
        ret r = name args;                                                                         \
        __asm__ volatile("" ::: "memory"); /* the call stays a call: this library is its caller */ \
        return r;                                                                                  \
    }

FWD(cudaError_t, cudaMalloc, (void **p, size_t n), (p, n))
FWD(cudaError_t, cudaFree, (void *p), (p))
FWD(cudaError_t, cudaMallocAsync, (void **p, size_t n, cudaStream_t s), (p, n, s))
FWD(cudaError_t, cudaFreeAsync, (void *p, cudaStream_t s), (p, s))
FWD(cudaError_t, cudaSetDevice, (int d), (d))
FWD(cudaError_t, cudaGetDevice, (int *d), (d))
FWD(cudaError_t, cudaGetDeviceCount, (int *n), (n))
FWD(cudaError_t, cudaGetLastError, (void), ())
FWD(cudaError_t, cudaMemGetInfo, (size_t * f, size_t *t), (f, t))
FWD(cudaError_t, cudaDeviceGetDefaultMemPool, (cudaMemPool_t * p, int d), (p, d))
FWD(cudaError_t, cudaMemPoolGetAttribute, (cudaMemPool_t p, enum cudaMemPoolAttr a, void *v), (p, a, v))
FWD(cudaError_t, cudaMemPoolTrimTo, (cudaMemPool_t p, size_t n), (p, n))

#ifdef FWD_DRIVER
/* cuda.h maps cuMemAlloc & co. to their _v2 ABI names: the forwarders are named as the ABI */
FWD(CUresult, cuInit, (unsigned int flags), (flags))
FWD(CUresult, cuDeviceGet, (CUdevice * d, int ordinal), (d, ordinal))
FWD(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * c, CUdevice d), (c, d))
FWD(CUresult, cuCtxSetCurrent, (CUcontext c), (c))
FWD(CUresult, cuMemAlloc_v2, (CUdeviceptr * p, size_t n), (p, n))
FWD(CUresult, cuMemFree_v2, (CUdeviceptr p), (p))
FWD(CUresult, cuMemGetInfo_v2, (size_t * f, size_t *t), (f, t))
#endif
