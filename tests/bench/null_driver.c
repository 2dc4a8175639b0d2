/* A driver that does nothing but hand out addresses, without a lock: `make bench` uses it to
 * measure the shim on its own.  (Through the simulated driver, whose single lock makes two
 * threads queue, the cost of anything done outside that lock is amplified several times.)
 * Each thread gets its own address range; nothing is shared between threads. */
#include <cuda.h>
#include <stdint.h>

static __thread uint64_t next_addr;
static int next_range;

CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!next_addr)
        next_addr = 0x100000000000ull + ((uint64_t)__atomic_fetch_add(&next_range, 1, __ATOMIC_RELAXED) << 40);
    *dptr = next_addr;
    next_addr += (bytesize + 255) & ~(uint64_t)255;
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    (void)dptr;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice *device)
{
    *device = 0;
    return CUDA_SUCCESS;
}
/* one device, as a real driver answers (the shim's publishing thread reads the count once) */
CUresult cuDeviceGetCount(int *count)
{
    *count = 1;
    return CUDA_SUCCESS;
}
