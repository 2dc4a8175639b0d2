/*
 * runtime.c — the simulated CUDA runtime (libcudart.so.13 and
 * libcudart_static.a are both built from this file).
 *
 * What matters for oomguard is HOW the runtime reaches the driver, because an
 * interposer sees exactly that.  Like NVIDIA's libcudart 13 this runtime:
 *   1. dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) — by soname, no path;
 *   2. dlsym(handle, "cuGetProcAddress_v2") — the only symbol it ever dlsyms;
 *   3. asks that for cuInit, then for "cuGetProcAddress" at 11030 and 12000,
 *      and from then on uses the 12000 result;
 *   4. looks up every entry of the real runtime's list (runtime_tables.h),
 *      by base name, version and flags, in the real order — including the
 *      per-thread (flags 2) variants it uses for the *_ptsz API;
 *   5. calls cuInit(0).
 * It never links against libcuda and never calls a driver function by its
 * exported name.
 *
 * Everything except the cuda* API is static so the object can live in a
 * static archive linked into any program.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "runtime_tables.h"

#define RT_API         __attribute__((visibility("default")))
#define RT_MAX_DEVICES 64
#define RT_N_LOOKUPS   (sizeof k_cudart13_lookups / sizeof k_cudart13_lookups[0])

/*
 * The driver functions this runtime calls: field, base name, version, flags,
 * and the cudaTypedefs.h pointer type of that ABI variant.  Every row must be
 * one of the real runtime's lookups (checked at initialisation).
 */
#define RT_DRIVER_FUNCS(X)                                                                                    \
    X(Init, "cuInit", 2000, 0, PFN_cuInit_v2000)                                                              \
    X(GetProcAddress, "cuGetProcAddress", 12000, 0, PFN_cuGetProcAddress_v12000)                              \
    X(DriverGetVersion, "cuDriverGetVersion", 2020, 0, PFN_cuDriverGetVersion_v2020)                          \
    X(DeviceGet, "cuDeviceGet", 2000, 0, PFN_cuDeviceGet_v2000)                                               \
    X(DeviceGetCount, "cuDeviceGetCount", 2000, 0, PFN_cuDeviceGetCount_v2000)                                \
    X(DeviceGetName, "cuDeviceGetName", 2000, 0, PFN_cuDeviceGetName_v2000)                                   \
    X(DeviceTotalMem, "cuDeviceTotalMem", 3020, 0, PFN_cuDeviceTotalMem_v3020)                                \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", 2000, 0, PFN_cuDeviceGetAttribute_v2000)                    \
    X(DeviceGetUuid, "cuDeviceGetUuid", 9020, 0, PFN_cuDeviceGetUuid_v9020)                                   \
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0, PFN_cuDevicePrimaryCtxRetain_v7000)        \
    X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0, PFN_cuDevicePrimaryCtxRelease_v7000)     \
    X(DevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0, PFN_cuDevicePrimaryCtxReset_v7000)           \
    X(CtxSetCurrent, "cuCtxSetCurrent", 4000, 0, PFN_cuCtxSetCurrent_v4000)                                   \
    X(CtxGetCurrent, "cuCtxGetCurrent", 4000, 0, PFN_cuCtxGetCurrent_v4000)                                   \
    X(CtxGetDevice, "cuCtxGetDevice", 2000, 0, PFN_cuCtxGetDevice_v2000)                                      \
    X(CtxSynchronize, "cuCtxSynchronize", 2000, 0, PFN_cuCtxSynchronize_v2000)                                \
    X(MemGetInfo, "cuMemGetInfo", 3020, 0, PFN_cuMemGetInfo_v3020)                                            \
    X(MemAlloc, "cuMemAlloc", 3020, 0, PFN_cuMemAlloc_v3020)                                                  \
    X(MemAllocPitch, "cuMemAllocPitch", 3020, 0, PFN_cuMemAllocPitch_v3020)                                   \
    X(MemAllocManaged, "cuMemAllocManaged", 6000, 0, PFN_cuMemAllocManaged_v6000)                             \
    X(MemFree, "cuMemFree", 3020, 0, PFN_cuMemFree_v3020)                                                     \
    X(MemHostAlloc, "cuMemHostAlloc", 2020, 0, PFN_cuMemHostAlloc_v2020)                                      \
    X(MemFreeHost, "cuMemFreeHost", 2000, 0, PFN_cuMemFreeHost_v2000)                                         \
    X(MemAllocAsync, "cuMemAllocAsync", 11020, 0, PFN_cuMemAllocAsync_v11020)                                 \
    X(MemAllocAsync_pt, "cuMemAllocAsync", 11020, 2, PFN_cuMemAllocAsync_v11020_ptsz)                         \
    X(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0, PFN_cuMemAllocFromPoolAsync_v11020)         \
    X(MemAllocFromPoolAsync_pt, "cuMemAllocFromPoolAsync", 11020, 2, PFN_cuMemAllocFromPoolAsync_v11020_ptsz) \
    X(MemFreeAsync, "cuMemFreeAsync", 11020, 0, PFN_cuMemFreeAsync_v11020)                                    \
    X(MemFreeAsync_pt, "cuMemFreeAsync", 11020, 2, PFN_cuMemFreeAsync_v11020_ptsz)                            \
    X(MemPoolCreate, "cuMemPoolCreate", 11020, 0, PFN_cuMemPoolCreate_v11020)                                 \
    X(MemPoolDestroy, "cuMemPoolDestroy", 11020, 0, PFN_cuMemPoolDestroy_v11020)                              \
    X(MemPoolTrimTo, "cuMemPoolTrimTo", 11020, 0, PFN_cuMemPoolTrimTo_v11020)                                 \
    X(MemPoolSetAttribute, "cuMemPoolSetAttribute", 11020, 0, PFN_cuMemPoolSetAttribute_v11020)               \
    X(MemPoolGetAttribute, "cuMemPoolGetAttribute", 11020, 0, PFN_cuMemPoolGetAttribute_v11020)               \
    X(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0, PFN_cuDeviceGetDefaultMemPool_v11020)   \
    X(DeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0, PFN_cuDeviceGetMemPool_v11020)                        \
    X(DeviceSetMemPool, "cuDeviceSetMemPool", 11020, 0, PFN_cuDeviceSetMemPool_v11020)                        \
    X(StreamCreate, "cuStreamCreate", 2000, 0, PFN_cuStreamCreate_v2000)                                      \
    X(StreamDestroy, "cuStreamDestroy", 4000, 0, PFN_cuStreamDestroy_v4000)                                   \
    X(StreamSynchronize, "cuStreamSynchronize", 2000, 0, PFN_cuStreamSynchronize_v2000)                       \
    X(StreamSynchronize_pt, "cuStreamSynchronize", 7000, 2, PFN_cuStreamSynchronize_v7000_ptsz)               \
    X(EventCreate, "cuEventCreate", 2000, 0, PFN_cuEventCreate_v2000)                                         \
    X(EventRecord, "cuEventRecord", 2000, 0, PFN_cuEventRecord_v2000)                                         \
    X(EventRecord_pt, "cuEventRecord", 7000, 2, PFN_cuEventRecord_v7000_ptsz)                                 \
    X(EventSynchronize, "cuEventSynchronize", 2000, 0, PFN_cuEventSynchronize_v2000)                          \
    X(EventDestroy, "cuEventDestroy", 4000, 0, PFN_cuEventDestroy_v4000)                                      \
    X(Memcpy, "cuMemcpy", 4000, 0, PFN_cuMemcpy_v4000)                                                        \
    X(Memcpy_pt, "cuMemcpy", 7000, 2, PFN_cuMemcpy_v7000_ptds)                                                \
    X(MemcpyAsync, "cuMemcpyAsync", 4000, 0, PFN_cuMemcpyAsync_v4000)                                         \
    X(MemcpyAsync_pt, "cuMemcpyAsync", 7000, 2, PFN_cuMemcpyAsync_v7000_ptsz)                                 \
    X(MemsetD8, "cuMemsetD8", 3020, 0, PFN_cuMemsetD8_v3020)                                                  \
    X(MemsetD8_pt, "cuMemsetD8", 7000, 2, PFN_cuMemsetD8_v7000_ptds)                                          \
    X(MemsetD8Async, "cuMemsetD8Async", 3020, 0, PFN_cuMemsetD8Async_v3020)                                   \
    X(MemsetD8Async_pt, "cuMemsetD8Async", 7000, 2, PFN_cuMemsetD8Async_v7000_ptsz)                           \
    X(ArrayCreate, "cuArrayCreate", 3020, 0, PFN_cuArrayCreate_v3020)                                         \
    X(Array3DCreate, "cuArray3DCreate", 3020, 0, PFN_cuArray3DCreate_v3020)                                   \
    X(ArrayDestroy, "cuArrayDestroy", 2000, 0, PFN_cuArrayDestroy_v2000)                                      \
    X(MipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0, PFN_cuMipmappedArrayCreate_v5000)              \
    X(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0, PFN_cuMipmappedArrayDestroy_v5000)

typedef struct rt_driver {
#define RT_FIELD(field, name, ver, flags, type) type field;
    RT_DRIVER_FUNCS(RT_FIELD)
#undef RT_FIELD
} rt_driver_t;

static struct {
    pthread_mutex_t lock;
    bool inited;
    cudaError_t init_err; /* sticky: a failed initialisation fails every call */
    void *lib;
    void *ptrs[RT_N_LOOKUPS]; /* results of the replayed lookups */
    rt_driver_t d;
    int ndev;
    CUcontext primary[RT_MAX_DEVICES];
    bool retained[RT_MAX_DEVICES];
} g_rt = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Per-thread runtime state: current device and the last error. */
static __thread int t_device;
static __thread cudaError_t t_last_error;

#define D (g_rt.d)

/* ============================================================== errors */

static cudaError_t map_driver_error(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED:
        return cudaErrorCudartUnloading;
    case CUDA_ERROR_STUB_LIBRARY:
        return cudaErrorStubLibrary;
    case CUDA_ERROR_NO_DEVICE:
        return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE:
        return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT:
        return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
        return cudaErrorContextIsDestroyed;
    case CUDA_ERROR_ALREADY_MAPPED:
        return cudaErrorAlreadyMapped;
    case CUDA_ERROR_NOT_MAPPED:
        return cudaErrorNotMapped;
    case CUDA_ERROR_INVALID_HANDLE:
        return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_ILLEGAL_STATE:
        return cudaErrorIllegalState;
    case CUDA_ERROR_NOT_FOUND:
        return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY:
        return cudaErrorNotReady;
    case CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE:
        return cudaErrorSetOnActiveProcess;
    case CUDA_ERROR_NOT_PERMITTED:
        return cudaErrorNotPermitted;
    case CUDA_ERROR_NOT_SUPPORTED:
        return cudaErrorNotSupported;
    default:
        return cudaErrorUnknown;
    }
}

/* Every runtime call that fails records its error for cudaGetLastError /
 * cudaPeekAtLastError; successful calls leave the last error alone. */
static cudaError_t rt_ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last_error = e;
    return e;
}

static cudaError_t rt_ret_drv(CUresult r) { return rt_ret(map_driver_error(r)); }

/* A driver allocation's result: the pointer it wrote to *p on success, the error recorded
 * otherwise.  p by address: the allocation is an argument of this call, and C leaves the
 * order in which arguments are evaluated open. */
static cudaError_t rt_ret_ptr(CUresult r, const CUdeviceptr *p, void **out)
{
    if (r == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)*p;
    return rt_ret_drv(r);
}

/* Preamble of an API call: `ready` is rt_init(), rt_init_device() or rt_ctx(); when it
 * fails the call records and returns its error (the runtime's ENTER_INIT). */
#define RT_READY(ready)               \
    do {                              \
        cudaError_t ready_ = (ready); \
        if (ready_ != cudaSuccess)    \
            return rt_ret(ready_);    \
    } while (0)

RT_API cudaError_t CUDARTAPI cudaGetLastError(void)
{
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

RT_API cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return t_last_error; }

/* The enumerator's name of a cudaError_t this runtime knows, else NULL. */
static const char *error_name(cudaError_t error)
{
    for (size_t i = 0; i < sizeof k_cuda_error_names / sizeof k_cuda_error_names[0]; i++)
        if (k_cuda_error_names[i].code == (int)error)
            return k_cuda_error_names[i].name;
    return NULL;
}

RT_API const char *CUDARTAPI cudaGetErrorName(cudaError_t error)
{
    const char *name = error_name(error);
    return name ? name : "unrecognized error code";
}

RT_API const char *CUDARTAPI cudaGetErrorString(cudaError_t error)
{
    static const struct {
        cudaError_t code;
        const char *text;
    } k_text[] = {
        { cudaSuccess, "no error" },
        { cudaErrorInvalidValue, "invalid argument" },
        { cudaErrorMemoryAllocation, "out of memory" },
        { cudaErrorInitializationError, "initialization error" },
        { cudaErrorCudartUnloading, "driver shutting down" },
        { cudaErrorInvalidPitchValue, "invalid pitch argument" },
        { cudaErrorInvalidSymbol, "invalid device symbol" },
        { cudaErrorInvalidHostPointer, "invalid host pointer" },
        { cudaErrorInvalidDevicePointer, "invalid device pointer" },
        { cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy" },
        { cudaErrorStubLibrary, "CUDA driver is a stub library" },
        { cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version" },
        { cudaErrorCallRequiresNewerDriver, "API call is not supported in the installed CUDA driver" },
        { cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable" },
        { cudaErrorNoDevice, "no CUDA-capable device is detected" },
        { cudaErrorInvalidDevice, "invalid device ordinal" },
        { cudaErrorDeviceUninitialized, "invalid device context" },
        { cudaErrorAlreadyMapped, "resource already mapped" },
        { cudaErrorNotMapped, "resource not mapped" },
        { cudaErrorInvalidResourceHandle, "invalid resource handle" },
        { cudaErrorIllegalState, "the operation cannot be performed in the present state" },
        { cudaErrorSymbolNotFound, "named symbol not found" },
        { cudaErrorNotReady, "device not ready" },
        { cudaErrorIllegalAddress, "an illegal memory access was encountered" },
        { cudaErrorLaunchOutOfResources, "too many resources requested for launch" },
        { cudaErrorLaunchFailure, "unspecified launch failure" },
        { cudaErrorSetOnActiveProcess, "cannot set while device is active in this process" },
        { cudaErrorContextIsDestroyed, "context is destroyed" },
        { cudaErrorNotPermitted, "operation not permitted" },
        { cudaErrorNotSupported, "operation not supported" },
        { cudaErrorTimeout, "wait operation timed out" },
        { cudaErrorUnknown, "unknown error" },
    };
    for (size_t i = 0; i < sizeof k_text / sizeof k_text[0]; i++)
        if (k_text[i].code == error)
            return k_text[i].text;
    return error_name(error) ? "unknown error" : "unrecognized error code";
}

/* ====================================================== initialisation */

static void *lookup_result(const char *name, int version, unsigned flags)
{
    for (size_t i = 0; i < RT_N_LOOKUPS; i++)
        if (k_cudart13_lookups[i].version == version && k_cudart13_lookups[i].flags == flags &&
            strcmp(k_cudart13_lookups[i].name, name) == 0)
            return g_rt.ptrs[i];
    return NULL;
}

static cudaError_t init_locked(void)
{
    g_rt.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!g_rt.lib)
        return cudaErrorInsufficientDriver;
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(g_rt.lib, "cuGetProcAddress_v2");
    if (!gpa)
        return cudaErrorInsufficientDriver;

    /* Replay the real runtime's lookups.  The dlsym'd entry point serves
     * until the 12000 cuGetProcAddress has been obtained through it. */
    for (size_t i = 0; i < RT_N_LOOKUPS; i++) {
        const rt_lookup_t *l = &k_cudart13_lookups[i];
        CUdriverProcAddressQueryResult status;
        g_rt.ptrs[i] = NULL;
        if (gpa(l->name, &g_rt.ptrs[i], l->version, l->flags, &status) != CUDA_SUCCESS)
            g_rt.ptrs[i] = NULL;
        if (l->version == 12000 && strcmp(l->name, "cuGetProcAddress") == 0 && g_rt.ptrs[i])
            gpa = (PFN_cuGetProcAddress_v12000)g_rt.ptrs[i];
    }

    bool complete = true;
#define RT_ASSIGN(field, name, ver, flags, type)                                          \
    D.field = (type)lookup_result(name, ver, flags);                                      \
    if (!D.field) {                                                                       \
        fprintf(stderr, "simcudart: driver lacks %s (%d, flags %d)\n", name, ver, flags); \
        complete = false;                                                                 \
    }
    RT_DRIVER_FUNCS(RT_ASSIGN)
#undef RT_ASSIGN
    if (!complete)
        return cudaErrorInsufficientDriver;

    CUresult r = D.Init(0);
    if (r != CUDA_SUCCESS)
        return map_driver_error(r);
    int n = 0;
    r = D.DeviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        return map_driver_error(r);
    g_rt.ndev = n < RT_MAX_DEVICES ? n : RT_MAX_DEVICES;
    return cudaSuccess;
}

/* Like NVIDIA's runtime, the per-call path (init done, primary context retained, device
 * of the current context) reads published state without taking a process-wide lock;
 * the lock is for the first call and for changes. */
static cudaError_t rt_init(void)
{
    if (__atomic_load_n(&g_rt.inited, __ATOMIC_ACQUIRE))
        return g_rt.init_err;
    pthread_mutex_lock(&g_rt.lock);
    if (!g_rt.inited) {
        g_rt.init_err = init_locked();
        __atomic_store_n(&g_rt.inited, true, __ATOMIC_RELEASE);
    }
    cudaError_t e = g_rt.init_err;
    pthread_mutex_unlock(&g_rt.lock);
    return e;
}

/* A fork child is a fresh process for the simulated driver, so the runtime
 * starts over as well (it replays its initialisation on first use).  No
 * prepare handler: the child discards all runtime state, so it does not need
 * it consistent, and not locking at fork time keeps the runtime out of any
 * lock ordering with the driver's fork handlers.  The child is single-
 * threaded, so re-initialising the mutex is safe. */
static void rt_atfork_child(void)
{
    pthread_mutex_init(&g_rt.lock, NULL);
    __atomic_store_n(&g_rt.inited, false, __ATOMIC_RELEASE);
    g_rt.init_err = cudaSuccess;
    memset(g_rt.primary, 0, sizeof g_rt.primary);
    memset(g_rt.retained, 0, sizeof g_rt.retained);
    t_device = 0;
    t_last_error = cudaSuccess;
}

__attribute__((constructor)) static void rt_ctor(void) { pthread_atfork(NULL, NULL, rt_atfork_child); }

/*
 * Retain the primary context of `dev` once per process and return it.  The
 * driver is called without holding the runtime's lock: the runtime lock is
 * never held while taking the driver's, so there is no lock-order inversion
 * (e.g. with the fork handlers, which take both).  A thread that loses the
 * race gives its extra reference back.
 */
static cudaError_t retain_primary(int dev, CUcontext *out)
{
    if (__atomic_load_n(&g_rt.retained[dev], __ATOMIC_ACQUIRE)) {
        if (out)
            *out = __atomic_load_n(&g_rt.primary[dev], __ATOMIC_ACQUIRE);
        return cudaSuccess;
    }
    pthread_mutex_lock(&g_rt.lock);
    bool have = g_rt.retained[dev];
    CUcontext c = g_rt.primary[dev];
    pthread_mutex_unlock(&g_rt.lock);
    if (!have) {
        CUresult r = D.DevicePrimaryCtxRetain(&c, dev);
        if (r != CUDA_SUCCESS)
            return map_driver_error(r);
        pthread_mutex_lock(&g_rt.lock);
        bool lost = g_rt.retained[dev];
        __atomic_store_n(&g_rt.primary[dev], c, __ATOMIC_RELEASE);
        __atomic_store_n(&g_rt.retained[dev], true, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_rt.lock);
        if (lost)
            D.DevicePrimaryCtxRelease(dev);
    }
    if (out)
        *out = c;
    return cudaSuccess;
}

static int primary_device_of(CUcontext c)
{
    int dev = -1;
    for (int d = 0; d < g_rt.ndev && c; d++)
        if (__atomic_load_n(&g_rt.primary[d], __ATOMIC_ACQUIRE) == c)
            dev = d;
    return dev;
}

/* The device of `cur`, a context current on this thread (not NULL): a primary context's
 * own, else the driver's answer for a context the program made current itself. */
static CUresult device_of_current(CUcontext cur, int *dev, bool *primary)
{
    int pd = primary_device_of(cur);
    *primary = pd >= 0;
    if (*primary) {
        *dev = pd;
        return CUDA_SUCCESS;
    }
    CUdevice dv;
    CUresult r = D.CtxGetDevice(&dv);
    if (r == CUDA_SUCCESS)
        *dev = dv;
    return r;
}

/* Retain the primary context of `dev` and make it current unless `cur` already is it. */
static cudaError_t make_primary_current(int dev, CUcontext cur)
{
    CUcontext prim = NULL;
    cudaError_t e = retain_primary(dev, &prim);
    if (e != cudaSuccess)
        return e;
    CUresult r = cur != prim ? D.CtxSetCurrent(prim) : CUDA_SUCCESS;
    return map_driver_error(r);
}

/*
 * Make sure the calling thread has a usable context, the way cudart does:
 * a context the program made current through the driver API is used as is;
 * otherwise the primary context of the thread's device is retained (once per
 * process) and made current.  Also re-creates a primary context destroyed by
 * cudaDeviceReset.
 */
static cudaError_t rt_ctx(int *dev_out)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    CUcontext cur = NULL;
    CUresult r = D.CtxGetCurrent(&cur);
    if (r != CUDA_SUCCESS)
        return map_driver_error(r);
    int dev = t_device;
    bool primary = true;
    if (cur && (r = device_of_current(cur, &dev, &primary)) != CUDA_SUCCESS)
        return map_driver_error(r);
    if (primary && (e = make_primary_current(dev, cur)) != cudaSuccess)
        return e;
    if (dev_out)
        *dev_out = dev;
    return cudaSuccess;
}

/* rt_init(), then CUDA's check of a device ordinal argument. */
static cudaError_t rt_init_device(int device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    return device < 0 || device >= g_rt.ndev ? cudaErrorInvalidDevice : cudaSuccess;
}

/* ============================================================= devices */

RT_API cudaError_t CUDARTAPI cudaGetDeviceCount(int *count)
{
    if (!count)
        return rt_ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess) {
        *count = 0;
        return rt_ret(e);
    }
    *count = g_rt.ndev;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaSetDevice(int device)
{
    RT_READY(rt_init_device(device));
    /* Since CUDA 12, cudaSetDevice initialises the device's primary context
     * and makes it current immediately. */
    RT_READY(make_primary_current(device, NULL));
    t_device = device;
    return cudaSuccess;
}

/* The device of the thread's current context, else the device chosen with
 * cudaSetDevice (0 by default). */
static cudaError_t current_device(int *device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    CUcontext cur = NULL;
    int dev;
    bool primary;
    if (D.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur && device_of_current(cur, &dev, &primary) == CUDA_SUCCESS)
        *device = dev;
    else
        *device = t_device;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaGetDevice(int *device)
{
    if (!device)
        return rt_ret(cudaErrorInvalidValue);
    return rt_ret(current_device(device));
}

static int attr(int dev, CUdevice_attribute a)
{
    int v = 0;
    D.DeviceGetAttribute(&v, a, dev);
    return v;
}

RT_API cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_init_device(device));
    memset(prop, 0, sizeof *prop);
    CUresult r = D.DeviceGetName(prop->name, sizeof prop->name, device);
    size_t total = 0;
    if (r == CUDA_SUCCESS)
        r = D.DeviceTotalMem(&total, device);
    CUuuid uuid;
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetUuid(&uuid, device);
    if (r != CUDA_SUCCESS)
        return rt_ret_drv(r);
    memcpy(prop->uuid.bytes, uuid.bytes, sizeof uuid.bytes);
    prop->totalGlobalMem = total;
    prop->sharedMemPerBlock = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    prop->regsPerBlock = attr(device, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    prop->warpSize = attr(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    prop->memPitch = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_MAX_PITCH);
    prop->maxThreadsPerBlock = attr(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    prop->maxThreadsDim[0] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    prop->maxThreadsDim[1] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    prop->maxThreadsDim[2] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    prop->maxGridSize[0] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    prop->maxGridSize[1] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    prop->maxGridSize[2] = attr(device, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    prop->totalConstMem = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    prop->major = attr(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    prop->minor = attr(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    prop->textureAlignment = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
    prop->texturePitchAlignment = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
    prop->multiProcessorCount = attr(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    prop->integrated = attr(device, CU_DEVICE_ATTRIBUTE_INTEGRATED);
    prop->canMapHostMemory = attr(device, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
    prop->concurrentKernels = attr(device, CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
    prop->ECCEnabled = attr(device, CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
    prop->pciBusID = attr(device, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
    prop->pciDeviceID = attr(device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
    prop->pciDomainID = attr(device, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
    prop->asyncEngineCount = attr(device, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
    prop->unifiedAddressing = attr(device, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    prop->memoryBusWidth = attr(device, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
    prop->l2CacheSize = attr(device, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    prop->maxThreadsPerMultiProcessor = attr(device, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    prop->streamPrioritiesSupported = attr(device, CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
    prop->globalL1CacheSupported = attr(device, CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
    prop->localL1CacheSupported = attr(device, CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
    prop->sharedMemPerMultiprocessor = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    prop->regsPerMultiprocessor = attr(device, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
    prop->managedMemory = attr(device, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
    prop->concurrentManagedAccess = attr(device, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
    prop->computePreemptionSupported = attr(device, CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
    prop->cooperativeLaunch = attr(device, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
    prop->sharedMemPerBlockOptin = (size_t)attr(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    prop->maxBlocksPerMultiProcessor = attr(device, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
    prop->hostRegisterSupported = attr(device, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
    prop->memoryPoolsSupported = attr(device, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
    prop->memoryPoolSupportedHandleTypes = (unsigned)attr(device, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES);
    return cudaSuccess;
}

/* cudaDeviceAttr values are numerically the driver's CUdevice_attribute. */
RT_API cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr_, int device)
{
    if (!value)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_init_device(device));
    return rt_ret_drv(D.DeviceGetAttribute(value, (CUdevice_attribute)attr_, device));
}

RT_API cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return rt_ret(cudaErrorInvalidValue);
    /* Answers even when initialisation failed (no device): 0 only when there
     * is no usable driver library at all, like the real runtime. */
    rt_init();
    if (!D.DriverGetVersion) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    return rt_ret_drv(D.DriverGetVersion(driverVersion));
}

RT_API cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return rt_ret(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

RT_API cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.CtxSynchronize());
}

/* Destroys the primary context of the current device: every cudaMalloc
 * allocation of this process on it is gone (pools and VMM memory survive,
 * as documented).  The next runtime call creates a fresh context. */
RT_API cudaError_t CUDARTAPI cudaDeviceReset(void)
{
    int dev;
    RT_READY(current_device(&dev));
    CUresult r = D.DevicePrimaryCtxReset(dev);
    if (r == CUDA_SUCCESS) {
        /* The reset dropped our reference; the handle stays the same, so the
         * next call re-retains it. */
        pthread_mutex_lock(&g_rt.lock);
        __atomic_store_n(&g_rt.retained[dev], false, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&g_rt.lock);
    }
    return rt_ret_drv(r);
}

/* ============================================================== memory */

RT_API cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    if (size == 0) {
        /* The runtime answers a zero-byte request itself with NULL. */
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p;
    return rt_ret_ptr(D.MemAlloc(&p, size), &p, devPtr);
}

RT_API cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    CUdeviceptr p;
    return rt_ret_ptr(D.MemAllocManaged(&p, size, flags), &p, devPtr);
}

RT_API cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    CUdeviceptr p;
    size_t pt;
    CUresult r = D.MemAllocPitch(&p, &pt, width, height, 4);
    if (r == CUDA_SUCCESS) {
        *devPtr = (void *)(uintptr_t)p;
        *pitch = pt;
    }
    return rt_ret_drv(r);
}

/* ============================================================== arrays */

/* The channel description as a driver array format: equal channels of 8, 16 or 32 bits. */
static bool rt_array_format(const struct cudaChannelFormatDesc *d, CUarray_format *f, unsigned int *ch)
{
    int bits = d->x;
    *ch = (d->x > 0) + (d->y > 0) + (d->z > 0) + (d->w > 0);
    if (*ch == 0 || *ch == 3 || (d->y && d->y != bits) || (d->z && d->z != bits) || (d->w && d->w != bits))
        return false;
    switch (d->f) {
    case cudaChannelFormatKindFloat:
        *f = bits == 16 ? CU_AD_FORMAT_HALF : CU_AD_FORMAT_FLOAT;
        return bits == 16 || bits == 32;
    case cudaChannelFormatKindSigned:
        *f = bits == 8 ? CU_AD_FORMAT_SIGNED_INT8 : bits == 16 ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_SIGNED_INT32;
        return bits == 8 || bits == 16 || bits == 32;
    case cudaChannelFormatKindUnsigned:
        *f = bits == 8    ? CU_AD_FORMAT_UNSIGNED_INT8
             : bits == 16 ? CU_AD_FORMAT_UNSIGNED_INT16
                          : CU_AD_FORMAT_UNSIGNED_INT32;
        return bits == 8 || bits == 16 || bits == 32;
    default:
        return false;
    }
}

RT_API cudaError_t CUDARTAPI cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc, size_t width,
                                             size_t height, unsigned int flags)
{
    CUDA_ARRAY_DESCRIPTOR d = { width, height, 0, 0 };
    if (!array || !desc || !rt_array_format(desc, &d.Format, &d.NumChannels))
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.ArrayCreate((CUarray *)array, &d));
}

RT_API cudaError_t CUDARTAPI cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                               struct cudaExtent extent, unsigned int flags)
{
    CUDA_ARRAY3D_DESCRIPTOR d = { extent.width, extent.height, extent.depth, 0, 0, flags };
    if (!array || !desc || !rt_array_format(desc, &d.Format, &d.NumChannels))
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.Array3DCreate((CUarray *)array, &d));
}

RT_API cudaError_t CUDARTAPI cudaMallocMipmappedArray(cudaMipmappedArray_t *mm,
                                                      const struct cudaChannelFormatDesc *desc,
                                                      struct cudaExtent extent, unsigned int numLevels,
                                                      unsigned int flags)
{
    CUDA_ARRAY3D_DESCRIPTOR d = { extent.width, extent.height, extent.depth, 0, 0, flags };
    if (!mm || !desc || !rt_array_format(desc, &d.Format, &d.NumChannels))
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.MipmappedArrayCreate((CUmipmappedArray *)mm, &d, numLevels));
}

RT_API cudaError_t CUDARTAPI cudaFreeArray(cudaArray_t array)
{
    if (!array)
        return cudaSuccess;
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.ArrayDestroy((CUarray)array));
}

RT_API cudaError_t CUDARTAPI cudaFreeMipmappedArray(cudaMipmappedArray_t mm)
{
    if (!mm)
        return cudaSuccess;
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.MipmappedArrayDestroy((CUmipmappedArray)mm));
}

RT_API struct cudaChannelFormatDesc CUDARTAPI cudaCreateChannelDesc(int x, int y, int z, int w,
                                                                    enum cudaChannelFormatKind f)
{
    struct cudaChannelFormatDesc d = { x, y, z, w, f };
    return d;
}

RT_API cudaError_t CUDARTAPI cudaFree(void *devPtr)
{
    /* cudaFree(NULL) is the classic way to force context creation. */
    RT_READY(rt_ctx(NULL));
    if (!devPtr)
        return cudaSuccess;
    return rt_ret_drv(D.MemFree((CUdeviceptr)(uintptr_t)devPtr));
}

RT_API cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free, size_t *total)
{
    if (!free || !total)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.MemGetInfo(free, total));
}

static cudaError_t host_alloc(void **ptr, size_t size, unsigned int flags)
{
    if (!ptr || (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)))
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    /* cudaHostAlloc flag bits equal CU_MEMHOSTALLOC_*; the real runtime
     * implements both entry points with cuMemHostAlloc. */
    return rt_ret_drv(D.MemHostAlloc(ptr, size, flags));
}

RT_API cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size)
{
    return host_alloc(ptr, size, cudaHostAllocDefault);
}

RT_API cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    return host_alloc(pHost, size, flags);
}

RT_API cudaError_t CUDARTAPI cudaFreeHost(void *ptr)
{
    RT_READY(rt_ctx(NULL));
    if (!ptr)
        return cudaSuccess;
    return rt_ret_drv(D.MemFreeHost(ptr));
}

/* ------------------------------------------------ stream-ordered allocator */

/* cudaMallocAsync and cudaMallocFromPoolAsync (`from_pool`), legacy or per-thread (`pt`)
 * default stream. */
static cudaError_t malloc_async(void **ptr, size_t size, bool from_pool, cudaMemPool_t pool, cudaStream_t stream,
                                bool pt)
{
    if (!ptr)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p;
    CUresult r = from_pool ? (pt ? D.MemAllocFromPoolAsync_pt : D.MemAllocFromPoolAsync)(&p, size, (CUmemoryPool)pool,
                                                                                         (CUstream)stream)
                           : (pt ? D.MemAllocAsync_pt : D.MemAllocAsync)(&p, size, (CUstream)stream);
    return rt_ret_ptr(r, &p, ptr);
}

RT_API cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, false, NULL, hStream, false);
}

RT_API cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, false, NULL, hStream, true);
}

RT_API cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                                     cudaStream_t stream)
{
    return malloc_async(ptr, size, true, memPool, stream, false);
}

RT_API cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                          cudaStream_t stream)
{
    return malloc_async(ptr, size, true, memPool, stream, true);
}

static cudaError_t free_async(void *devPtr, cudaStream_t stream, bool pt)
{
    RT_READY(rt_ctx(NULL));
    if (!devPtr)
        return cudaSuccess;
    return rt_ret_drv((pt ? D.MemFreeAsync_pt : D.MemFreeAsync)((CUdeviceptr)(uintptr_t)devPtr, (CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    return free_async(devPtr, hStream, false);
}

RT_API cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    return free_async(devPtr, hStream, true);
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.DeviceGetDefaultMemPool((CUmemoryPool *)memPool, device));
}

RT_API cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.DeviceGetMemPool((CUmemoryPool *)memPool, device));
}

RT_API cudaError_t CUDARTAPI cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.DeviceSetMemPool(device, (CUmemoryPool)memPool));
}

RT_API cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps)
{
    if (!memPool || !poolProps)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_init());
    /* Field by field: the two structs are meant to match, but nothing
     * promises it. */
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = (CUmemAllocationType)poolProps->allocType;
    p.handleTypes = (CUmemAllocationHandleType)poolProps->handleTypes;
    p.location.type = (CUmemLocationType)poolProps->location.type;
    p.location.id = poolProps->location.id;
    p.win32SecurityAttributes = poolProps->win32SecurityAttributes;
    p.maxSize = poolProps->maxSize;
    p.usage = poolProps->usage;
    return rt_ret_drv(D.MemPoolCreate((CUmemoryPool *)memPool, &p));
}

RT_API cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.MemPoolDestroy((CUmemoryPool)memPool));
}

RT_API cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.MemPoolTrimTo((CUmemoryPool)memPool, minBytesToKeep));
}

/* cudaMemPoolAttr values equal CUmemPool_attribute values. */
RT_API cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr_, void *value)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.MemPoolSetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr_, value));
}

RT_API cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr_, void *value)
{
    RT_READY(rt_init());
    return rt_ret_drv(D.MemPoolGetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr_, value));
}

/* ------------------------------------------------------- copies and sets */

static cudaError_t memcpy_common(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, bool async,
                                 cudaStream_t stream, bool pt)
{
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault)
        return rt_ret(cudaErrorInvalidMemcpyDirection);
    RT_READY(rt_ctx(NULL));
    if (count == 0)
        return cudaSuccess;
    /* Unified addressing: the driver tells the two sides apart itself. */
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
    CUresult r;
    if (async)
        r = (pt ? D.MemcpyAsync_pt : D.MemcpyAsync)(d, s, count, (CUstream)stream);
    else
        r = (pt ? D.Memcpy_pt : D.Memcpy)(d, s, count);
    return rt_ret_drv(r);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return memcpy_common(dst, src, count, kind, false, NULL, false);
}

RT_API cudaError_t CUDARTAPI cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return memcpy_common(dst, src, count, kind, false, NULL, true);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                             cudaStream_t stream)
{
    return memcpy_common(dst, src, count, kind, true, stream, false);
}

RT_API cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                                  cudaStream_t stream)
{
    return memcpy_common(dst, src, count, kind, true, stream, true);
}

static cudaError_t memset_common(void *devPtr, int value, size_t count, bool async, cudaStream_t stream, bool pt)
{
    RT_READY(rt_ctx(NULL));
    if (count == 0)
        return cudaSuccess;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)devPtr;
    CUresult r;
    if (async)
        r = (pt ? D.MemsetD8Async_pt : D.MemsetD8Async)(d, (unsigned char)value, count, (CUstream)stream);
    else
        r = (pt ? D.MemsetD8_pt : D.MemsetD8)(d, (unsigned char)value, count);
    return rt_ret_drv(r);
}

RT_API cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count)
{
    return memset_common(devPtr, value, count, false, NULL, false);
}

RT_API cudaError_t CUDARTAPI cudaMemset_ptds(void *devPtr, int value, size_t count)
{
    return memset_common(devPtr, value, count, false, NULL, true);
}

RT_API cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return memset_common(devPtr, value, count, true, stream, false);
}

RT_API cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return memset_common(devPtr, value, count, true, stream, true);
}

/* ===================================================== streams, events */

RT_API cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.StreamCreate((CUstream *)pStream, flags));
}

RT_API cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

RT_API cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.StreamDestroy((CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.StreamSynchronize((CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.StreamSynchronize_pt((CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (!event)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.EventCreate((CUevent *)event, flags));
}

RT_API cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

RT_API cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.EventRecord((CUevent)event, (CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.EventRecord_pt((CUevent)event, (CUstream)stream));
}

RT_API cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.EventSynchronize((CUevent)event));
}

RT_API cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event)
{
    RT_READY(rt_ctx(NULL));
    return rt_ret_drv(D.EventDestroy((CUevent)event));
}

/* ====================================================== driver entry points */

static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus, bool ptds_default)
{
    if (!symbol || !funcPtr)
        return rt_ret(cudaErrorInvalidValue);
    RT_READY(rt_init());
    /* cudaEnable* flags equal CU_GET_PROC_ADDRESS_*; "default" means the
     * stream semantics the caller was compiled with. */
    if (flags == cudaEnableDefault && ptds_default)
        flags = cudaEnablePerThreadDefaultStream;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = D.GetProcAddress(symbol, funcPtr, (int)cudaVersion, flags, &st);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_FOUND) {
        /* Not found is not an error here: NULL plus a status. */
        if (r != CUDA_SUCCESS)
            *funcPtr = NULL;
        if (driverStatus)
            *driverStatus = r == CUDA_SUCCESS                                  ? cudaDriverEntryPointSuccess
                            : st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? cudaDriverEntryPointVersionNotSufficent
                                                                               : cudaDriverEntryPointSymbolNotFound;
        return cudaSuccess;
    }
    return rt_ret_drv(r);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                              unsigned int cudaVersion, unsigned long long flags,
                                                              enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, false);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                                   unsigned int cudaVersion, unsigned long long flags,
                                                                   enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, true);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                                     enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, false);
}

RT_API cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                                          enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, true);
}
