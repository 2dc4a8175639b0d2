/* Wrapper bodies for the driver entry points listed in hooks.def.
 *
 * Each wrapper calls the real function with the caller's arguments, returns its result
 * unchanged, and records what happened.  Recording never changes what the caller sees. */
#include "og.h"

/* Every wrapper starts with og_begin: the call guard is entered and the real function found.
 * NULL: the driver has none; the guard is already left and the wrapper answers
 * CUDA_ERROR_NOT_INITIALIZED.  The caller's address is taken by the wrapper itself
 * (__builtin_return_address must run in the exported function's own frame).
 *
 * A hook's entry in og_begun is its real function once the library is initialised and that
 * function found: from then on one load says both (the check of og_ready and the lookup of
 * the real function cost a load and a branch each).  Until then og_begin_slow initialises,
 * enters the guard first (resolving the real function may reach dlsym, which passes through
 * our own hooks) and then resolves. */
static _Atomic(void *) og_begun[OG_H_COUNT];

static __attribute__((noinline)) void *og_begin_slow(og_call_t *c, int hook)
{
    og_enter(c, hook, c->caller);
    void *real = atomic_load_explicit(&og_real_ptrs[hook], memory_order_acquire);
    if (!real && !(real = og_resolve_real(hook))) {
        og_leave(c);
        return NULL;
    }
    if (atomic_load_explicit(&og_ready, memory_order_acquire))
        atomic_store_explicit(&og_begun[hook], real, memory_order_release);
    return real;
}

static inline __attribute__((always_inline)) void *og_begin(og_call_t *c, int hook, void *caller)
{
    c->hook = hook;
    c->device = -1;
    c->caller = caller;
    void *real = atomic_load_explicit(&og_begun[hook], memory_order_acquire);
    if (OG_UNLIKELY(!real))
        return og_begin_slow(c, hook);
    og_guard_enter(c);
    return real;
}

/* Every wrapper ends with `return og_end(&c, r)`: leaves the guard, passes r through. */
static inline __attribute__((always_inline)) CUresult og_end(og_call_t *c, CUresult r)
{
    og_leave(c);
    return r;
}

/* ------------------------------------------------------------------ plain allocations */

static inline __attribute__((always_inline)) CUresult after_alloc(og_call_t *c, CUresult r, CUdeviceptr *dptr,
                                                                  uint64_t bytes, int kind)
{
    if (!c->active)
        return r;
    if (r == CUDA_SUCCESS && dptr && (kind == OG_KIND_PLAIN || kind == OG_KIND_MANAGED))
        og_track_plain(c, (uintptr_t)*dptr, bytes, kind);
    else if (r == CUDA_SUCCESS && dptr)
        og_track_alloc(c, (uintptr_t)*dptr, bytes, kind);
    else if (r != CUDA_SUCCESS)
        og_track_failure(c, bytes, kind, r);
    return r;
}

/* Frees: the block leaves the ledger before the real call (the address may be reused the
 * moment the driver has it back) and returns if the call failed.  A pointer the ledger does
 * not know is counted as an unknown free and passed through. */
static inline __attribute__((always_inline)) void free_begin(og_call_t *c, uintptr_t addr, og_taken_t *tk)
{
    if (c->active && addr)
        og_free_begin(c, addr, tk);
}

/* After the real free: settles what free_begin took; returns the driver's result unchanged. */
static inline __attribute__((always_inline)) CUresult free_end(og_call_t *c, uintptr_t addr, og_taken_t *tk, CUresult r)
{
    if (c->active && addr)
        og_free_end(c, tk, r);
    return r;
}

/* The frees whose only argument is what they free (an address or a handle). */
#define OG_FREE_ONE(name, type)                                                                   \
    CUresult name(type handle)                                                                    \
    {                                                                                             \
        og_call_t c;                                                                              \
        og_fn_##name real = (og_fn_##name)og_begin(&c, OG_H_##name, __builtin_return_address(0)); \
        if (OG_UNLIKELY(!real))                                                                   \
            return CUDA_ERROR_NOT_INITIALIZED;                                                    \
        og_taken_t tk;                                                                            \
        free_begin(&c, (uintptr_t)handle, &tk);                                                   \
        return og_end(&c, free_end(&c, (uintptr_t)handle, &tk, real(handle)));                    \
    }

/* OOMGUARD_LIMIT: refuse before the driver sees it, with the API's own OOM error. */
static __attribute__((noinline)) bool refused_by_limit(og_call_t *c, int device, uint64_t bytes, int kind)
{
    if (!c->active)
        return false;
    if (device < 0)
        device = c->device = og_current_device(); /* kept: the tracking after the call needs it */
    if (device < 0 || !og_limit_refuses(c, device, bytes, kind == OG_KIND_POOL))
        return false;
    og_track_limit_refusal(c, bytes, kind);
    return true;
}
static inline bool refused(og_call_t *c, int device, uint64_t bytes, int kind)
{
    return og_limit_active() && refused_by_limit(c, device, bytes, kind); /* no call without a limit */
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    og_call_t c;
    og_fn_cuMemAlloc_v2 real = (og_fn_cuMemAlloc_v2)og_begin(&c, OG_H_cuMemAlloc_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (OG_UNLIKELY(refused(&c, -1, bytesize, OG_KIND_PLAIN)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = after_alloc(&c, real(dptr, bytesize), dptr, bytesize, OG_KIND_PLAIN);
    return og_end(&c, r);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    og_call_t c;
    og_fn_cuMemAllocPitch_v2 real =
        (og_fn_cuMemAllocPitch_v2)og_begin(&c, OG_H_cuMemAllocPitch_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (OG_UNLIKELY(refused(&c, -1, (uint64_t)WidthInBytes * Height, OG_KIND_PLAIN)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* The driver pads each row; the block is pitch x height. */
    uint64_t bytes = r == CUDA_SUCCESS && pPitch ? (uint64_t)*pPitch * Height : (uint64_t)WidthInBytes * Height;
    r = after_alloc(&c, r, dptr, bytes, OG_KIND_PLAIN);
    return og_end(&c, r);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    og_call_t c;
    og_fn_cuMemAllocManaged real =
        (og_fn_cuMemAllocManaged)og_begin(&c, OG_H_cuMemAllocManaged, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (OG_UNLIKELY(refused(&c, -1, bytesize, OG_KIND_MANAGED)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = after_alloc(&c, real(dptr, bytesize, flags), dptr, bytesize, OG_KIND_MANAGED);
    return og_end(&c, r);
}

OG_FREE_ONE(cuMemFree_v2, CUdeviceptr)

/* ------------------------------------------------------------------ memory info */

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    og_call_t c;
    og_fn_cuMemGetInfo_v2 real = (og_fn_cuMemGetInfo_v2)og_begin(&c, OG_H_cuMemGetInfo_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(free, total);
    if (r == CUDA_SUCCESS && og_limit_active() && c.active) {
        uint64_t f = free ? *free : 0, t = total ? *total : 0;
        og_limit_view(og_current_device(), &f, &t);
        if (free)
            *free = f;
        if (total)
            *total = t;
    }
    return og_end(&c, r);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    og_call_t c;
    og_fn_cuDeviceTotalMem_v2 real =
        (og_fn_cuDeviceTotalMem_v2)og_begin(&c, OG_H_cuDeviceTotalMem_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && og_limit_active() && c.active) {
        uint64_t t = *bytes;
        og_limit_view((int)dev, NULL, &t);
        *bytes = t;
    }
    return og_end(&c, r);
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
    og_call_t c;
    og_fn_cuMemHostAlloc real = (og_fn_cuMemHostAlloc)og_begin(&c, OG_H_cuMemHostAlloc, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = after_host_alloc(&c, real(pp, bytesize, Flags), pp, bytesize);
    return og_end(&c, r);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    og_call_t c;
    og_fn_cuMemAllocHost_v2 real =
        (og_fn_cuMemAllocHost_v2)og_begin(&c, OG_H_cuMemAllocHost_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = after_host_alloc(&c, real(pp, bytesize), pp, bytesize);
    return og_end(&c, r);
}

OG_FREE_ONE(cuMemFreeHost, void *)

/* ------------------------------------------------------------------ virtual memory */

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    og_call_t c;
    og_fn_cuMemCreate real = (og_fn_cuMemCreate)og_begin(&c, OG_H_cuMemCreate, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        OG_UNLIKELY(refused(&c, prop->location.id, size, OG_KIND_VMM)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = real(handle, size, prop, flags);
    if (c.active && prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        c.device = prop->location.id;
        if (r == CUDA_SUCCESS && handle)
            og_track_vmm_create(&c, *handle, size, prop->location.id);
        else if (r != CUDA_SUCCESS)
            og_track_failure(&c, size, OG_KIND_VMM, r);
    }
    return og_end(&c, r);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    og_call_t c;
    og_fn_cuMemRelease real = (og_fn_cuMemRelease)og_begin(&c, OG_H_cuMemRelease, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Ledger first: once the driver has freed the handle it may hand the same value to another
     * thread's cuMemCreate.  A release the driver refuses is a program error on a handle the
     * ledger then no longer holds; the result still reaches the caller unchanged. */
    if (c.active)
        og_track_vmm_release(&c, handle);
    CUresult r = real(handle);
    return og_end(&c, r);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    og_call_t c;
    og_fn_cuMemRetainAllocationHandle real =
        (og_fn_cuMemRetainAllocationHandle)og_begin(&c, OG_H_cuMemRetainAllocationHandle, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(handle, addr);
    if (c.active && r == CUDA_SUCCESS && handle)
        og_track_vmm_retain(&c, *handle);
    return og_end(&c, r);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    og_call_t c;
    og_fn_cuMemMap real = (og_fn_cuMemMap)og_begin(&c, OG_H_cuMemMap, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(ptr, size, offset, handle, flags);
    if (c.active && r == CUDA_SUCCESS)
        og_track_vmm_map(&c, (uintptr_t)ptr, size, handle);
    return og_end(&c, r);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    og_call_t c;
    og_fn_cuMemUnmap real = (og_fn_cuMemUnmap)og_begin(&c, OG_H_cuMemUnmap, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (c.active) /* before the driver frees anything: see cuMemRelease */
        og_track_vmm_unmap(&c, (uintptr_t)ptr, size);
    CUresult r = real(ptr, size);
    return og_end(&c, r);
}

/* ------------------------------------------------------------------ stream-ordered pools */

/* A pool block is memory handed out; what the device lost is the pool's reservation,
 * re-read from the driver after each allocation. */
static CUresult after_pool_alloc(og_call_t *c, CUresult r, CUdeviceptr *dptr, uint64_t bytes, CUmemoryPool pool)
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
static inline __attribute__((always_inline)) CUresult alloc_async(int hook, void *caller, CUdeviceptr *dptr,
                                                                  size_t bytesize, CUstream hStream)
{
    og_call_t c;
    og_fn_cuMemAllocAsync real = (og_fn_cuMemAllocAsync)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (OG_UNLIKELY(refused(&c, -1, bytesize, OG_KIND_POOL)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    return og_end(&c, after_pool_alloc(&c, real(dptr, bytesize, hStream), dptr, bytesize, NULL));
}
#define OG_ALLOC_ASYNC(name)                                                                   \
    CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)                        \
    {                                                                                          \
        return alloc_async(OG_H_##name, __builtin_return_address(0), dptr, bytesize, hStream); \
    }

static inline __attribute__((always_inline)) CUresult
alloc_from_pool(int hook, void *caller, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    og_call_t c;
    og_fn_cuMemAllocFromPoolAsync real = (og_fn_cuMemAllocFromPoolAsync)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (OG_UNLIKELY(refused(&c, -1, bytesize, OG_KIND_POOL)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    return og_end(&c, after_pool_alloc(&c, real(dptr, bytesize, pool, hStream), dptr, bytesize, pool));
}
#define OG_ALLOC_FROM_POOL(name)                                                                         \
    CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)               \
    {                                                                                                    \
        return alloc_from_pool(OG_H_##name, __builtin_return_address(0), dptr, bytesize, pool, hStream); \
    }

static inline __attribute__((always_inline)) CUresult free_async(int hook, void *caller, CUdeviceptr dptr,
                                                                 CUstream hStream)
{
    og_call_t c;
    og_fn_cuMemFreeAsync real = (og_fn_cuMemFreeAsync)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    og_taken_t tk = { 0 };
    free_begin(&c, (uintptr_t)dptr, &tk);
    CUresult r = real(dptr, hStream);
    return og_end(&c, free_end(&c, (uintptr_t)dptr, &tk, r));
}
#define OG_FREE_ASYNC(name)                                                         \
    CUresult name(CUdeviceptr dptr, CUstream hStream)                               \
    {                                                                               \
        return free_async(OG_H_##name, __builtin_return_address(0), dptr, hStream); \
    }

OG_ALLOC_ASYNC(cuMemAllocAsync)
OG_ALLOC_ASYNC(cuMemAllocAsync_ptsz)
OG_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
OG_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)
OG_FREE_ASYNC(cuMemFreeAsync)
OG_FREE_ASYNC(cuMemFreeAsync_ptsz)

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    og_call_t c;
    og_fn_cuMemPoolTrimTo real = (og_fn_cuMemPoolTrimTo)og_begin(&c, OG_H_cuMemPoolTrimTo, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(pool, minBytesToKeep);
    if (c.active && r == CUDA_SUCCESS)
        og_track_pool_refresh(pool);
    return og_end(&c, r);
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    og_call_t c;
    og_fn_cuMemPoolDestroy real =
        (og_fn_cuMemPoolDestroy)og_begin(&c, OG_H_cuMemPoolDestroy, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(pool);
    if (c.active && r == CUDA_SUCCESS)
        og_track_pool_destroy(pool);
    return og_end(&c, r);
}

/* ------------------------------------------------------------------ context reset */

/* The driver frees every cuMemAlloc/cuMemAllocManaged block of the primary context without
 * a cuMemFree each: drop them from the ledger too (pools and VMM memory are device objects
 * and survive). */
static inline __attribute__((always_inline)) CUresult ctx_reset(int hook, void *caller, CUdevice dev)
{
    og_call_t c;
    og_fn_cuDevicePrimaryCtxReset real = (og_fn_cuDevicePrimaryCtxReset)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(dev);
    if (c.active && r == CUDA_SUCCESS)
        og_track_blocks_gone(&c, (int)dev);
    return og_end(&c, r);
}
#define OG_CTX_RESET(name) \
    CUresult name(CUdevice dev) { return ctx_reset(OG_H_##name, __builtin_return_address(0), dev); }
OG_CTX_RESET(cuDevicePrimaryCtxReset)    /* ABI of CUDA 7.0 (what libcudart asks for) */
OG_CTX_RESET(cuDevicePrimaryCtxReset_v2) /* ABI of CUDA 11.0 */

/* A context made here holds device memory of its own (the driver's state for it, the modules loaded into it) that
 * no allocation API reports: the ledger counts the live ones by device (og_ctx_made). */
#define OG_CTX_CREATE(name, params, args)                                                         \
    CUresult name params                                                                          \
    {                                                                                             \
        og_call_t c;                                                                              \
        og_fn_##name real = (og_fn_##name)og_begin(&c, OG_H_##name, __builtin_return_address(0)); \
        if (OG_UNLIKELY(!real))                                                                   \
            return CUDA_ERROR_NOT_INITIALIZED;                                                    \
        CUresult r = real args;                                                                   \
        if (c.active && r == CUDA_SUCCESS && pctx)                                                \
            og_ctx_made(*pctx, (int)dev);                                                         \
        return og_end(&c, r);                                                                     \
    }
OG_CTX_CREATE(cuCtxCreate, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
OG_CTX_CREATE(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))
OG_CTX_CREATE(cuCtxCreate_v3,
              (CUcontext * pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev),
              (pctx, paramsArray, numParams, flags, dev))
OG_CTX_CREATE(cuCtxCreate_v4, (CUcontext * pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev),
              (pctx, ctxCreateParams, flags, dev))

/* A created context's blocks die with it; the driver is asked which ones those were. */
static inline __attribute__((always_inline)) CUresult ctx_destroy(int hook, void *caller, CUcontext ctx)
{
    og_call_t c;
    og_fn_cuCtxDestroy real = (og_fn_cuCtxDestroy)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(ctx);
    if (c.active && r == CUDA_SUCCESS) {
        og_ctx_destroyed(ctx);
        og_track_blocks_gone(&c, -1);
    }
    return og_end(&c, r);
}
#define OG_CTX_DESTROY(name) \
    CUresult name(CUcontext ctx) { return ctx_destroy(OG_H_##name, __builtin_return_address(0), ctx); }
OG_CTX_DESTROY(cuCtxDestroy)
OG_CTX_DESTROY(cuCtxDestroy_v2)

/* The primary context is destroyed when its last reference is released. */
static inline __attribute__((always_inline)) CUresult ctx_release(int hook, void *caller, CUdevice dev)
{
    og_call_t c;
    og_fn_cuDevicePrimaryCtxRelease real = (og_fn_cuDevicePrimaryCtxRelease)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(dev);
    og_cfn_cuDevicePrimaryCtxGetState state = OG_CALL(cuDevicePrimaryCtxGetState);
    unsigned int flags;
    int active = 1;
    if (c.active && r == CUDA_SUCCESS && state && state(dev, &flags, &active) == CUDA_SUCCESS && !active)
        og_track_blocks_gone(&c, (int)dev);
    return og_end(&c, r);
}
#define OG_CTX_RELEASE(name) \
    CUresult name(CUdevice dev) { return ctx_release(OG_H_##name, __builtin_return_address(0), dev); }
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

/* The five synchronising entry points (legacy and per-thread streams, both context ABIs,
 * events) differ only in what they wait for. */
#define OG_SYNC(name, params, args)                                                               \
    CUresult name params                                                                          \
    {                                                                                             \
        og_call_t c;                                                                              \
        og_fn_##name real = (og_fn_##name)og_begin(&c, OG_H_##name, __builtin_return_address(0)); \
        if (OG_UNLIKELY(!real))                                                                   \
            return CUDA_ERROR_NOT_INITIALIZED;                                                    \
        return og_end(&c, after_sync(&c, real args));                                             \
    }
OG_SYNC(cuStreamSynchronize, (CUstream hStream), (hStream))
OG_SYNC(cuStreamSynchronize_ptsz, (CUstream hStream), (hStream))
OG_SYNC(cuCtxSynchronize, (void), ())
OG_SYNC(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))
OG_SYNC(cuEventSynchronize, (CUevent hEvent), (hEvent))

/* ------------------------------------------------------------------ CUDA arrays */

/* Bytes of the texels: the driver may pad and tile (not visible through the API for a
 * plain array); this is the size the program asked for. */
static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;
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
    og_call_t c;
    og_fn_cuArrayCreate_v2 real =
        (og_fn_cuArrayCreate_v2)og_begin(&c, OG_H_cuArrayCreate_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels, 1) : 0;
    if (OG_UNLIKELY(refused(&c, -1, bytes, OG_KIND_PLAIN)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = real(pHandle, desc);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    return og_end(&c, r);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    og_call_t c;
    og_fn_cuArray3DCreate_v2 real =
        (og_fn_cuArray3DCreate_v2)og_begin(&c, OG_H_cuArray3DCreate_v2, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes = desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, 1) : 0;
    if (OG_UNLIKELY(refused(&c, -1, bytes, OG_KIND_PLAIN)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = real(pHandle, desc);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    return og_end(&c, r);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                unsigned int numMipmapLevels)
{
    og_call_t c;
    og_fn_cuMipmappedArrayCreate real =
        (og_fn_cuMipmappedArrayCreate)og_begin(&c, OG_H_cuMipmappedArrayCreate, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes =
        desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, numMipmapLevels)
             : 0;
    if (OG_UNLIKELY(refused(&c, -1, bytes, OG_KIND_PLAIN)))
        return og_end(&c, CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = real(pHandle, desc, numMipmapLevels);
    r = after_array(&c, r, r == CUDA_SUCCESS && pHandle ? (void *)*pHandle : NULL, bytes);
    return og_end(&c, r);
}

OG_FREE_ONE(cuArrayDestroy, CUarray)

OG_FREE_ONE(cuMipmappedArrayDestroy, CUmipmappedArray)

/* ------------------------------------------------------------------ IPC */

/* Memory another process allocated, opened here: in the ledger as a mapping (its close is
 * then no unknown free, and a dump says how much is mapped) but never as ours. */
static inline __attribute__((always_inline)) CUresult ipc_open(int hook, void *caller, CUdeviceptr *pdptr,
                                                               CUipcMemHandle handle, unsigned int Flags)
{
    og_call_t c;
    og_fn_cuIpcOpenMemHandle real = (og_fn_cuIpcOpenMemHandle)og_begin(&c, hook, caller);
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(pdptr, handle, Flags);
    og_cfn_cuMemGetAddressRange_v2 range = OG_CALL(cuMemGetAddressRange_v2);
    CUdeviceptr base;
    size_t size = 0;
    if (c.active && r == CUDA_SUCCESS && pdptr && range && range(&base, &size, *pdptr) == CUDA_SUCCESS)
        og_track_alloc(&c, (uintptr_t)*pdptr, size, OG_KIND_PLAIN | OG_KIND_F_IPC);
    return og_end(&c, r);
}
#define OG_IPC_OPEN(name)                                                                \
    CUresult name(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)         \
    {                                                                                    \
        return ipc_open(OG_H_##name, __builtin_return_address(0), pdptr, handle, Flags); \
    }
OG_IPC_OPEN(cuIpcOpenMemHandle)
OG_IPC_OPEN(cuIpcOpenMemHandle_v2)

OG_FREE_ONE(cuIpcCloseMemHandle, CUdeviceptr)

/* ------------------------------------------------------------------ graph memory */

CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    og_call_t c;
    og_fn_cuDeviceGraphMemTrim real =
        (og_fn_cuDeviceGraphMemTrim)og_begin(&c, OG_H_cuDeviceGraphMemTrim, __builtin_return_address(0));
    if (OG_UNLIKELY(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(device);
    if (c.active && r == CUDA_SUCCESS)
        og_track_graph_trim((int)device);
    return og_end(&c, r);
}
