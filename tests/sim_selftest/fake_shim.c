/*
 * fake_shim.c — a stand-in for an LD_PRELOAD interposer (like oomguard's
 * shim), used by sim_selftest to prove the simulated driver is immune to
 * symbol interposition where the real one is: cuGetProcAddress must hand out
 * libcuda's own functions and libcuda's internal calls must stay inside it.
 */
#include <cuda.h>
#include <dlfcn.h>

/* Read by the self-test through dlsym(RTLD_DEFAULT, ...). */
int sim_fake_shim_calls;

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    sim_fake_shim_calls++;
    CUresult (*real)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_NEXT, "cuMemAlloc_v2");
    return real ? real(dptr, bytesize) : CUDA_ERROR_UNKNOWN;
}

/* libcuda's v1 cuDeviceGetUuid forwards to cuDeviceGetUuid_v2; that call
 * must never land here. */
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    sim_fake_shim_calls += 1000;
    return CUDA_ERROR_UNKNOWN;
}
