/*
 * driver_proc.c — cuGetProcAddress: the versioned entry-point table.
 *
 * Since CUDA 12 the runtime finds every driver function through
 * cuGetProcAddress(base name, cudaVersion, flags) instead of dlsym, so this
 * table is what NVIDIA's libcudart (and the simulated one) actually call.
 * Each row says: from CUDA version V on, base name N means ABI symbol S.  The
 * newest row not newer than the requested version wins; rows marked PT are
 * the per-thread-default-stream variants (_ptds/_ptsz), chosen only when the
 * caller passes CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
 *
 * The addresses are those of this library's own exported functions.  The
 * library is linked with -Bsymbolic-functions, so &cuMemAlloc_v2 here is
 * libcuda's definition even when an LD_PRELOAD shim exports the same name —
 * exactly what the real driver hands out.
 */
#include "driver_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct proc_entry {
    const char *name; /* base name as passed to cuGetProcAddress */
    int version;      /* first CUDA version of this ABI variant */
    bool per_thread;  /* _ptds / _ptsz variant */
    void *fn;
} proc_entry_t;

#define E(base, ver, sym)               \
    {                                   \
#base, ver, false, (void *)&sym \
    }
#define PT(base, ver, sym)             \
    {                                  \
#base, ver, true, (void *)&sym \
    }

static const proc_entry_t k_procs[] = {
    E(cuInit, 2000, cuInit),
    E(cuDriverGetVersion, 2020, cuDriverGetVersion),
    E(cuGetProcAddress, 11030, cuGetProcAddress),
    E(cuGetProcAddress, 12000, cuGetProcAddress_v2),
    E(cuGetExportTable, 3000, cuGetExportTable),
    E(cuGetErrorString, 6000, cuGetErrorString),
    E(cuGetErrorName, 6000, cuGetErrorName),

    E(cuDeviceGet, 2000, cuDeviceGet),
    E(cuDeviceGetCount, 2000, cuDeviceGetCount),
    E(cuDeviceGetName, 2000, cuDeviceGetName),
    E(cuDeviceTotalMem, 2000, cuDeviceTotalMem),
    E(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2),
    E(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute),
    E(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId),
    E(cuDeviceGetByPCIBusId, 4010, cuDeviceGetByPCIBusId),
    E(cuDeviceGetUuid, 9020, cuDeviceGetUuid),
    E(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2),
    E(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool),
    E(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool),
    E(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool),

    E(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain),
    E(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease),
    E(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2),
    E(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset),
    E(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2),
    E(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags),
    E(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2),
    E(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState),

    E(cuCtxCreate, 2000, cuCtxCreate),
    E(cuCtxCreate, 3020, cuCtxCreate_v2),
    E(cuCtxCreate, 11040, cuCtxCreate_v3),
    E(cuCtxCreate, 12050, cuCtxCreate_v4),
    E(cuCtxDestroy, 2000, cuCtxDestroy),
    E(cuCtxDestroy, 4000, cuCtxDestroy_v2),
    E(cuCtxPushCurrent, 2000, cuCtxPushCurrent),
    E(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2),
    E(cuCtxPopCurrent, 2000, cuCtxPopCurrent),
    E(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2),
    E(cuCtxSetCurrent, 4000, cuCtxSetCurrent),
    E(cuCtxGetCurrent, 4000, cuCtxGetCurrent),
    E(cuCtxGetDevice, 2000, cuCtxGetDevice),
    E(cuCtxGetDevice, 13000, cuCtxGetDevice_v2),
    E(cuCtxGetFlags, 7000, cuCtxGetFlags),
    E(cuCtxGetApiVersion, 3020, cuCtxGetApiVersion),
    E(cuDeviceGetGraphMemAttribute, 11040, cuDeviceGetGraphMemAttribute),
    E(cuDeviceGraphMemTrim, 11040, cuDeviceGraphMemTrim),
    E(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle),
    E(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle),
    E(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2),
    E(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle),
    E(cuArrayCreate, 3020, cuArrayCreate_v2),
    E(cuArray3DCreate, 3020, cuArray3DCreate_v2),
    E(cuArrayDestroy, 2000, cuArrayDestroy),
    E(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate),
    E(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy),
    E(cuCtxSynchronize, 2000, cuCtxSynchronize),
    E(cuCtxSynchronize, 13000, cuCtxSynchronize_v2),

    E(cuMemGetInfo, 2000, cuMemGetInfo),
    E(cuMemGetInfo, 3020, cuMemGetInfo_v2),
    E(cuMemAlloc, 2000, cuMemAlloc),
    E(cuMemAlloc, 3020, cuMemAlloc_v2),
    E(cuMemAllocPitch, 2000, cuMemAllocPitch),
    E(cuMemAllocPitch, 3020, cuMemAllocPitch_v2),
    E(cuMemFree, 2000, cuMemFree),
    E(cuMemFree, 3020, cuMemFree_v2),
    E(cuMemGetAddressRange, 2000, cuMemGetAddressRange),
    E(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2),
    E(cuMemAllocHost, 2000, cuMemAllocHost),
    E(cuMemAllocHost, 3020, cuMemAllocHost_v2),
    E(cuMemHostAlloc, 2020, cuMemHostAlloc),
    E(cuMemFreeHost, 2000, cuMemFreeHost),
    E(cuMemAllocManaged, 6000, cuMemAllocManaged),
    E(cuPointerGetAttribute, 4000, cuPointerGetAttribute),
    E(cuPointerGetAttributes, 7000, cuPointerGetAttributes),

    E(cuMemcpy, 4000, cuMemcpy),
    PT(cuMemcpy, 7000, cuMemcpy_ptds),
    E(cuMemcpyAsync, 4000, cuMemcpyAsync),
    PT(cuMemcpyAsync, 7000, cuMemcpyAsync_ptsz),
    E(cuMemcpyHtoD, 2000, cuMemcpyHtoD),
    E(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2),
    PT(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds),
    E(cuMemcpyDtoH, 2000, cuMemcpyDtoH),
    E(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2),
    PT(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds),
    E(cuMemcpyDtoD, 2000, cuMemcpyDtoD),
    E(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2),
    PT(cuMemcpyDtoD, 7000, cuMemcpyDtoD_v2_ptds),
    E(cuMemsetD8, 2000, cuMemsetD8),
    E(cuMemsetD8, 3020, cuMemsetD8_v2),
    PT(cuMemsetD8, 7000, cuMemsetD8_v2_ptds),
    E(cuMemsetD8Async, 3020, cuMemsetD8Async),
    PT(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz),

    E(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity),
    E(cuMemCreate, 10020, cuMemCreate),
    E(cuMemRelease, 10020, cuMemRelease),
    E(cuMemAddressReserve, 10020, cuMemAddressReserve),
    E(cuMemAddressFree, 10020, cuMemAddressFree),
    E(cuMemMap, 10020, cuMemMap),
    E(cuMemUnmap, 10020, cuMemUnmap),
    E(cuMemSetAccess, 10020, cuMemSetAccess),
    E(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle),
    E(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle),

    E(cuMemAllocAsync, 11020, cuMemAllocAsync),
    PT(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz),
    E(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync),
    PT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz),
    E(cuMemFreeAsync, 11020, cuMemFreeAsync),
    PT(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz),
    E(cuMemPoolCreate, 11020, cuMemPoolCreate),
    E(cuMemPoolDestroy, 11020, cuMemPoolDestroy),
    E(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo),
    E(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute),
    E(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute),
    E(cuMemGetDefaultMemPool, 13000, cuMemGetDefaultMemPool),
    E(cuMemGetMemPool, 13000, cuMemGetMemPool),
    E(cuMemSetMemPool, 13000, cuMemSetMemPool),

    E(cuStreamCreate, 2000, cuStreamCreate),
    E(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority),
    E(cuStreamDestroy, 2000, cuStreamDestroy),
    E(cuStreamDestroy, 4000, cuStreamDestroy_v2),
    E(cuStreamSynchronize, 2000, cuStreamSynchronize),
    PT(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz),
    E(cuStreamQuery, 2000, cuStreamQuery),
    PT(cuStreamQuery, 7000, cuStreamQuery_ptsz),
    E(cuEventCreate, 2000, cuEventCreate),
    E(cuEventRecord, 2000, cuEventRecord),
    PT(cuEventRecord, 7000, cuEventRecord_ptsz),
    E(cuEventQuery, 2000, cuEventQuery),
    E(cuEventSynchronize, 2000, cuEventSynchronize),
    E(cuEventDestroy, 2000, cuEventDestroy),
    E(cuEventDestroy, 4000, cuEventDestroy_v2),
};

/* SIMGPU_LOG_LOOKUPS: one line per lookup in the format of
 * shared/reference/cudart13-driver-lookups.txt ("name version flags"), so a
 * run can be diffed against what NVIDIA's runtime asks for. */
static void log_lookup(const char *symbol, int cudaVersion, cuuint64_t flags)
{
    sim_lock();
    if (g_sim.cfg.lookup_log[0]) {
        FILE *f = fopen(g_sim.cfg.lookup_log, "a");
        if (f) {
            fprintf(f, "%s %d %llu\n", symbol ? symbol : "(null)", cudaVersion, (unsigned long long)flags);
            fclose(f);
        }
    }
    sim_unlock();
}

CUresult sim_proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status)
{
    log_lookup(symbol, cudaVersion, flags);
    const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (!symbol || !pfn || (flags & ~known) || cudaVersion > SIM_DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    bool want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const proc_entry_t *legacy = NULL, *pt = NULL;
    bool name_known = false;
    for (size_t i = 0; i < sizeof k_procs / sizeof k_procs[0]; i++) {
        const proc_entry_t *e = &k_procs[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        name_known = true;
        if (e->version > cudaVersion)
            continue;
        const proc_entry_t **best = e->per_thread ? &pt : &legacy;
        if (!*best || e->version > (*best)->version)
            *best = e;
    }
    /* Per-thread lookups fall back to the legacy variant when a function has
     * no per-thread form (or none old enough). */
    const proc_entry_t *hit = (want_pt && pt) ? pt : legacy;
    if (hit) {
        *pfn = hit->fn;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }
    *pfn = NULL;
    if (status)
        *status = name_known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

SIM_API CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return sim_proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* CUDA 11.3 form, without the status out-parameter. */
SIM_API CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return sim_proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}
