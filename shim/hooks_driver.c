/* Wrapper bodies for the driver entry points listed in hooks.def.
 *
 * Each wrapper calls the real function with the caller's arguments, returns its result
 * unchanged, and records what happened.  Recording never changes what the caller sees. */
#include "og.h"

#define OG_BEGIN(hook_name)                                                  \
    og_call_t c;                                                             \
    og_enter(&c, OG_H_##hook_name, __builtin_return_address(0));             \
    og_fn_##hook_name real = OG_REAL(hook_name);                             \
    if (OG_UNLIKELY(!real)) {                                                \
        og_leave(&c);                                                        \
        return CUDA_ERROR_NOT_INITIALIZED;                                   \
    }

#define OG_END(r) \
    og_leave(&c); \
    return (r)

/* ------------------------------------------------------------------ plain allocations */

static CUresult after_alloc(og_call_t *c, CUresult r, CUdeviceptr *dptr, uint64_t bytes, int kind)
{
    if (!c->active)
        return r;
    if (r == CUDA_SUCCESS && dptr)
        og_track_alloc(c, (uintptr_t)*dptr, bytes, kind);
    else if (r != CUDA_SUCCESS)
        og_track_failure(c, bytes, kind, r);
    return r;
}

/* Frees: the block leaves the ledger before the real call (the address may be reused the
 * moment the driver has it back) and returns if the call failed.  A pointer the ledger does
 * not know is counted as an unknown free and passed through. */
#define OG_FREE_CALL(addr, call)                     \
    og_taken_t tk = {0};                             \
    if (c.active && (addr))                          \
        og_free_begin(&c, (uintptr_t)(addr), &tk);   \
    CUresult r = (call);                             \
    if (c.active && (addr))                          \
        og_free_end(&c, &tk, r);

/* OOMGUARD_LIMIT: refuse before the driver sees it, with the API's own OOM error. */
static bool refused(og_call_t *c, int device, uint64_t bytes, int kind)
{
    if (!og_limit_active() || !c->active)
        return false;
    if (device < 0)
        device = c->device = og_current_device();   /* kept: the tracking after the call needs it */
    if (device < 0 || !og_limit_refuses(c, device, bytes, kind == OG_KIND_POOL))
        return false;
    og_track_limit_refusal(c, bytes, kind);
    return true;
}
#define OG_LIMIT(dev, bytes, kind)                               \
    if (OG_UNLIKELY(refused(&c, (dev), (bytes), (kind)))) {      \
        og_leave(&c);                                            \
        return CUDA_ERROR_OUT_OF_MEMORY;                         \
    }

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    OG_BEGIN(cuMemAlloc_v2);
    OG_LIMIT(-1, bytesize, OG_KIND_PLAIN);
    CUresult r = after_alloc(&c, real(dptr, bytesize), dptr, bytesize, OG_KIND_PLAIN);
    OG_END(r);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    OG_BEGIN(cuMemAllocPitch_v2);
    OG_LIMIT(-1, (uint64_t)WidthInBytes * Height, OG_KIND_PLAIN);
    CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* The driver pads each row; the block is pitch x height. */
    uint64_t bytes = r == CUDA_SUCCESS && pPitch ? (uint64_t)*pPitch * Height : (uint64_t)WidthInBytes * Height;
    r = after_alloc(&c, r, dptr, bytes, OG_KIND_PLAIN);
    OG_END(r);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    OG_BEGIN(cuMemAllocManaged);
    OG_LIMIT(-1, bytesize, OG_KIND_MANAGED);
    CUresult r = after_alloc(&c, real(dptr, bytesize, flags), dptr, bytesize, OG_KIND_MANAGED);
    OG_END(r);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    OG_BEGIN(cuMemFree_v2);
    OG_FREE_CALL(dptr, real(dptr));
    OG_END(r);
}

/* ------------------------------------------------------------------ memory info */

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    OG_BEGIN(cuMemGetInfo_v2);
    CUresult r = real(free, total);
    if (r == CUDA_SUCCESS && og_limit_active() && c.active) {
        uint64_t f = free ? *free : 0, t = total ? *total : 0;
        og_limit_view(og_current_device(), &f, &t);
        if (free)
            *free = f;
        if (total)
            *total = t;
    }
    OG_END(r);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    OG_BEGIN(cuDeviceTotalMem_v2);
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && og_limit_active() && c.active) {
        uint64_t t = *bytes;
        og_limit_view((int)dev, NULL, &t);
        *bytes = t;
    }
    OG_END(r);
}

/* ------------------------------------------------------------------ pinned host memory */

static CUresult after_host_alloc(og_call_t *c, CUresult r, void **pp, uint64_t bytes)
{
    if (c->active && r == CUDA_SUCCESS && pp && *pp)
        og_track_alloc(c, (uintptr_t)*pp, bytes, OG_KIND_HOST);
    return r;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    OG_BEGIN(cuMemHostAlloc);
    CUresult r = after_host_alloc(&c, real(pp, bytesize, Flags), pp, bytesize);
    OG_END(r);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    OG_BEGIN(cuMemAllocHost_v2);
    CUresult r = after_host_alloc(&c, real(pp, bytesize), pp, bytesize);
    OG_END(r);
}

CUresult cuMemFreeHost(void *p)
{
    OG_BEGIN(cuMemFreeHost);
    OG_FREE_CALL(p, real(p));
    OG_END(r);
}

/* ------------------------------------------------------------------ virtual memory */

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    OG_BEGIN(cuMemCreate);
    if (prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        OG_LIMIT(prop->location.id, size, OG_KIND_VMM);
    CUresult r = real(handle, size, prop, flags);
    if (c.active && prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        c.device = prop->location.id;
        if (r == CUDA_SUCCESS && handle)
            og_track_vmm_create(&c, *handle, size, prop->location.id);
        else if (r != CUDA_SUCCESS)
            og_track_failure(&c, size, OG_KIND_VMM, r);
    }
    OG_END(r);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    OG_BEGIN(cuMemRelease);
    /* Ledger first: once the driver has freed the handle it may hand the same value to another
     * thread's cuMemCreate.  A release the driver refuses is a program error on a handle the
     * ledger then no longer holds; the result still reaches the caller unchanged. */
    if (c.active)
        og_track_vmm_release(&c, handle);
    CUresult r = real(handle);
    OG_END(r);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    OG_BEGIN(cuMemRetainAllocationHandle);
    CUresult r = real(handle, addr);
    if (c.active && r == CUDA_SUCCESS && handle)
        og_track_vmm_retain(&c, *handle);
    OG_END(r);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    OG_BEGIN(cuMemMap);
    CUresult r = real(ptr, size, offset, handle, flags);
    if (c.active && r == CUDA_SUCCESS)
        og_track_vmm_map(&c, (uintptr_t)ptr, size, handle);
    OG_END(r);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    OG_BEGIN(cuMemUnmap);
    if (c.active)                        /* before the driver frees anything: see cuMemRelease */
        og_track_vmm_unmap(&c, (uintptr_t)ptr, size);
    CUresult r = real(ptr, size);
    OG_END(r);
}

/* ------------------------------------------------------------------ stream-ordered pools */

/* A pool block is memory handed out; what the device lost is the pool's reservation,
 * re-read from the driver after each allocation. */
static CUresult after_pool_alloc(og_call_t *c, CUresult r, CUdeviceptr *dptr, uint64_t bytes,
                                 CUmemoryPool pool)
{
    if (!c->active)
        return r;
    /* an explicit pool may belong to another GPU than the current one: ask the block */
    c->device = pool && r == CUDA_SUCCESS && dptr ? og_pointer_device((uintptr_t)*dptr) : -1;
    if (c->device < 0)
        c->device = og_current_device();
    if (!pool && c->device >= 0)
        pool = og_device_current_pool(c->device);
    bool counted = og_track_pool_use(c, pool, c->device);
    return after_alloc(c, r, dptr, bytes, OG_KIND_POOL | (counted ? OG_KIND_F_COUNTED : 0));
}

/* The legacy-stream and per-thread-stream (_ptsz) entry points differ only in which stream
 * "0" means; one body serves both. */
#define OG_ALLOC_ASYNC(name)                                                                   \
    CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)                        \
    {                                                                                          \
        OG_BEGIN(name);                                                                        \
        OG_LIMIT(-1, bytesize, OG_KIND_POOL);                                                  \
        CUresult r = after_pool_alloc(&c, real(dptr, bytesize, hStream), dptr, bytesize, NULL); \
        OG_END(r);                                                                             \
    }
#define OG_ALLOC_FROM_POOL(name)                                                               \
    CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)     \
    {                                                                                          \
        OG_BEGIN(name);                                                                        \
        OG_LIMIT(-1, bytesize, OG_KIND_POOL);                                                  \
        CUresult r = after_pool_alloc(&c, real(dptr, bytesize, pool, hStream), dptr, bytesize, pool); \
        OG_END(r);                                                                             \
    }
#define OG_FREE_ASYNC(name)                                                                    \
    CUresult name(CUdeviceptr dptr, CUstream hStream)                                          \
    {                                                                                          \
        OG_BEGIN(name);                                                                        \
        OG_FREE_CALL(dptr, real(dptr, hStream));                                               \
        OG_END(r);                                                                             \
    }

OG_ALLOC_ASYNC(cuMemAllocAsync)
OG_ALLOC_ASYNC(cuMemAllocAsync_ptsz)
OG_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
OG_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)
OG_FREE_ASYNC(cuMemFreeAsync)
OG_FREE_ASYNC(cuMemFreeAsync_ptsz)

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    OG_BEGIN(cuMemPoolTrimTo);
    CUresult r = real(pool, minBytesToKeep);
    if (c.active && r == CUDA_SUCCESS)
        og_track_pool_refresh(pool);
    OG_END(r);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    OG_BEGIN(cuMemPoolDestroy);
    CUresult r = real(pool);
    if (c.active && r == CUDA_SUCCESS)
        og_track_pool_destroy(pool);
    OG_END(r);
}

/* ------------------------------------------------------------------ context reset */

/* The driver frees every cuMemAlloc/cuMemAllocManaged block of the primary context without
 * a cuMemFree each: drop them from the ledger too (pools and VMM memory are device objects
 * and survive). */
#define OG_CTX_RESET(name)                                  \
    CUresult name(CUdevice dev)                             \
    {                                                       \
        OG_BEGIN(name);                                     \
        CUresult r = real(dev);                             \
        if (c.active && r == CUDA_SUCCESS)                  \
            og_track_blocks_gone(&c, (int)dev);             \
        OG_END(r);                                          \
    }
OG_CTX_RESET(cuDevicePrimaryCtxReset)       /* ABI of CUDA 7.0 (what libcudart asks for) */
OG_CTX_RESET(cuDevicePrimaryCtxReset_v2)    /* ABI of CUDA 11.0 */

/* A created context's blocks die with it; the driver is asked which ones those were. */
#define OG_CTX_DESTROY(name)                                \
    CUresult name(CUcontext ctx)                            \
    {                                                       \
        OG_BEGIN(name);                                     \
        CUresult r = real(ctx);                             \
        if (c.active && r == CUDA_SUCCESS)                  \
            og_track_blocks_gone(&c, -1);                   \
        OG_END(r);                                          \
    }
OG_CTX_DESTROY(cuCtxDestroy)
OG_CTX_DESTROY(cuCtxDestroy_v2)

/* The primary context is destroyed when its last reference is released. */
#define OG_CTX_RELEASE(name)                                                         \
    CUresult name(CUdevice dev)                                                      \
    {                                                                                \
        OG_BEGIN(name);                                                              \
        CUresult r = real(dev);                                                      \
        og_cfn_cuDevicePrimaryCtxGetState state = OG_CALL(cuDevicePrimaryCtxGetState); \
        unsigned int flags;                                                          \
        int active = 1;                                                              \
        if (c.active && r == CUDA_SUCCESS && state && state(dev, &flags, &active) == CUDA_SUCCESS && !active) \
            og_track_blocks_gone(&c, (int)dev);                                      \
        OG_END(r);                                                                   \
    }
OG_CTX_RELEASE(cuDevicePrimaryCtxRelease)
OG_CTX_RELEASE(cuDevicePrimaryCtxRelease_v2)

/* ------------------------------------------------------------------ synchronisation */

/* Pools return memory above their release threshold when the work that freed it is done:
 * re-read their reservations (nothing to do, and no driver call, without pools). */
static CUresult after_sync(og_call_t *c, CUresult r)
{
    if (c->active && r == CUDA_SUCCESS)
        og_track_pool_refresh(NULL);
    return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    OG_BEGIN(cuStreamSynchronize);
    CUresult r = after_sync(&c, real(hStream));
    OG_END(r);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    OG_BEGIN(cuStreamSynchronize_ptsz);
    CUresult r = after_sync(&c, real(hStream));
    OG_END(r);
}

CUresult cuCtxSynchronize(void)
{
    OG_BEGIN(cuCtxSynchronize);
    CUresult r = after_sync(&c, real());
    OG_END(r);
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    OG_BEGIN(cuCtxSynchronize_v2);
    CUresult r = after_sync(&c, real(ctx));
    OG_END(r);
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    OG_BEGIN(cuEventSynchronize);
    CUresult r = after_sync(&c, real(hEvent));
    OG_END(r);
}

/* ------------------------------------------------------------------ CUDA arrays */

/* Bytes of the texels: the driver may pad and tile (not visible through the API for a
 * plain array); this is the size the program asked for. */
static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned levels)
{
    uint64_t total = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        total += lw * lh * ld * (ch ? ch : 1) * format_bytes(f);
    }
    return total;
}

static CUresult after_array(og_call_t *c, CUresult r, void *handle, uint64_t bytes)
{
    if (!c->active)
        return r;
    if (r == CUDA_SUCCESS && handle)
        og_track_alloc(c, (uintptr_t)handle, bytes, OG_KIND_PLAIN | OG_KIND_F_ARRAY);
    else if (r != CUDA_SUCCESS)
        og_track_failure(c, bytes, OG_KIND_PLAIN, r);
    return r;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    OG_BEGIN(cuArrayCreate_v2);
    uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels, 1) : 0;
    OG_LIMIT(-1, bytes, OG_KIND_PLAIN);
    CUresult r = real(pHandle, desc);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    OG_END(r);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    OG_BEGIN(cuArray3DCreate_v2);
    uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1)
                          : 0;
    OG_LIMIT(-1, bytes, OG_KIND_PLAIN);
    CUresult r = real(pHandle, desc);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    OG_END(r);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int numMipmapLevels)
{
    OG_BEGIN(cuMipmappedArrayCreate);
    uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels,
                                        numMipmapLevels)
                          : 0;
    OG_LIMIT(-1, bytes, OG_KIND_PLAIN);
    CUresult r = real(pHandle, desc, numMipmapLevels);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    OG_END(r);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    OG_BEGIN(cuArrayDestroy);
    OG_FREE_CALL(hArray, real(hArray));
    OG_END(r);
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    OG_BEGIN(cuMipmappedArrayDestroy);
    OG_FREE_CALL(hMipmappedArray, real(hMipmappedArray));
    OG_END(r);
}

/* ------------------------------------------------------------------ IPC */

/* Memory another process allocated, opened here: in the ledger as a mapping (its close is
 * then no unknown free, and a dump says how much is mapped) but never as ours. */
#define OG_IPC_OPEN(name)                                                                      \
    CUresult name(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)               \
    {                                                                                          \
        OG_BEGIN(name);                                                                        \
        CUresult r = real(pdptr, handle, Flags);                                               \
        og_cfn_cuMemGetAddressRange_v2 range = OG_CALL(cuMemGetAddressRange_v2);               \
        CUdeviceptr base;                                                                      \
        size_t size = 0;                                                                       \
        if (c.active && r == CUDA_SUCCESS && pdptr && range && range(&base, &size, *pdptr) == CUDA_SUCCESS) \
            og_track_alloc(&c, (uintptr_t)*pdptr, size, OG_KIND_PLAIN | OG_KIND_F_IPC);        \
        OG_END(r);                                                                             \
    }
OG_IPC_OPEN(cuIpcOpenMemHandle)
OG_IPC_OPEN(cuIpcOpenMemHandle_v2)

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    OG_BEGIN(cuIpcCloseMemHandle);
    OG_FREE_CALL(dptr, real(dptr));
    OG_END(r);
}

/* ------------------------------------------------------------------ graph memory */

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    OG_BEGIN(cuDeviceGraphMemTrim);
    CUresult r = real(device);
    if (c.active && r == CUDA_SUCCESS)
        og_track_graph_trim((int)device);
    OG_END(r);
}
