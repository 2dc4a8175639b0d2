/*
 * driver_mem.c — device memory of the simulated driver: plain allocations,
 * managed and pinned host memory, the virtual memory management (VMM) API and
 * stream-ordered memory pools.
 *
 * Bookkeeping rules (the numbers simgpu_truth reports):
 *  - plain (cuMemAlloc/Pitch/Managed): charged round_up(size, granularity);
 *  - VMM: cuMemCreate charges its size (a multiple of the granularity) until
 *    the handle is released AND its last mapping is gone;
 *  - pools: reserve whole chunks (>= 32 MiB) and carve 512-byte-rounded
 *    blocks out of them; "used" counts the requested bytes of live blocks;
 *    freed blocks stay reserved until a synchronize or TrimTo gives chunks
 *    back above the release threshold;
 *  - context overheads (driver.c).
 * Device addresses are fake (never dereferenced) except for managed memory,
 * which programs touch from the host and is therefore a real anonymous mmap,
 * and pinned host memory, which is real heap memory.
 */
#include "driver_internal.h"

#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

/* ================================================================ helpers */

int sim_range_cmp(const void *a, const void *b)
{
    const sim_range_t *x = a, *y = b;
    if (x->base + x->size <= y->base)
        return -1;
    if (y->base + y->size <= x->base)
        return 1;
    return 0; /* overlapping ranges compare equal: point and overlap lookups */
}

static int phys_cmp(const void *a, const void *b)
{
    const sim_phys_t *x = a, *y = b;
    return x->handle < y->handle ? -1 : x->handle > y->handle;
}

static void *tree_find(void *const *root, uint64_t addr, uint64_t len)
{
    sim_range_t key = { addr, len ? len : 1 };
    void **hit = tfind(&key, root, sim_range_cmp);
    return hit ? *hit : NULL;
}

/* Memory handed back to a fork child's program must stay valid, and must stay
 * reachable so leak checkers do not flag the simulator: parked here. */
/* the devices this thread made a plain allocation on (bit per device: sim_dev_t.alloc_threads) */
static __thread uint64_t t_alloc_devs;

static void **g_orphans;
static size_t g_n_orphans, g_cap_orphans;

static void orphan(void *p)
{
    if (g_n_orphans == g_cap_orphans) {
        size_t cap = g_cap_orphans ? g_cap_orphans * 2 : 16;
        void **n = realloc(g_orphans, cap * sizeof *n);
        if (!n)
            return;
        g_orphans = n;
        g_cap_orphans = cap;
    }
    g_orphans[g_n_orphans++] = p;
}

/*
 * Next-fit allocator over a window of fake VA.  The cursor only moves
 * forward, so a freed address is not reused until the window wraps — like a
 * real driver, addresses do get reused eventually, but not instantly, which
 * keeps stale-pointer bugs in a tracker visible without exhausting the window.
 * Every candidate is checked against all known ranges.
 */
static uint64_t va_alloc_locked(uint64_t *cursor, uint64_t lo, uint64_t hi, uint64_t size, uint64_t align)
{
    uint64_t start = sim_align_up(*cursor < lo ? lo : *cursor, align);
    bool wrapped = false;
    if (size == 0 || size > hi - lo)
        return 0;
    for (;;) {
        if (start < lo || start > hi - size) {
            if (wrapped)
                return 0;
            wrapped = true;
            start = sim_align_up(lo, align);
            continue;
        }
        sim_va_t *o = tree_find(&g_sim.va_tree, start, size);
        if (!o) {
            *cursor = start + size;
            return start;
        }
        start = sim_align_up(o->r.base + o->r.size, align);
        if (wrapped && start >= *cursor && *cursor > lo)
            return 0; /* came all the way around */
    }
}

static uint64_t dev_va_alloc_locked(int dev, uint64_t size, uint64_t align)
{
    uint64_t lo = SIM_VA_DEV_BASE + (uint64_t)dev * SIM_VA_DEV_SPAN;
    return va_alloc_locked(&g_sim.dev[dev].va_cursor, lo, lo + SIM_VA_DEV_SPAN, size, align);
}

static bool va_insert_locked(sim_va_t *v)
{
    void **slot = tsearch(v, &g_sim.va_tree, sim_range_cmp);
    return slot && *slot == v;
}

/* What a pointer refers to. */
typedef enum { PTR_NONE, PTR_PLAIN, PTR_MANAGED, PTR_BLOCK, PTR_MAPPING, PTR_HOST } ptr_kind_t;

typedef struct {
    ptr_kind_t kind;
    uint64_t base, size; /* the allocation containing the pointer */
    int dev;
    CUcontext ctx;
    bool host_accessible; /* real memory the simulator may read/write */
    uint64_t buffer_id;
    sim_alloc_t *alloc;
    sim_block_t *block;
    sim_mapping_t *map;
    sim_host_t *host;
} ptr_info_t;

static bool classify_locked(uint64_t p, ptr_info_t *pi)
{
    memset(pi, 0, sizeof *pi);
    sim_host_t *h = tree_find(&g_sim.host_tree, p, 1);
    if (h) {
        *pi = (ptr_info_t){ .kind = PTR_HOST,
                            .base = h->r.base,
                            .size = h->r.size,
                            .dev = h->dev,
                            .ctx = h->ctx,
                            .host_accessible = true,
                            .buffer_id = h->buffer_id,
                            .host = h };
        return true;
    }
    sim_block_t *b = tree_find(&g_sim.block_tree, p, 1);
    if (b) {
        *pi = (ptr_info_t){ .kind = PTR_BLOCK,
                            .base = b->r.base,
                            .size = b->requested,
                            .dev = b->chunk->pool->dev,
                            .buffer_id = b->buffer_id,
                            .block = b };
        return true;
    }
    sim_mapping_t *m = tree_find(&g_sim.map_tree, p, 1);
    if (m) {
        *pi = (ptr_info_t){ .kind = PTR_MAPPING,
                            .base = m->r.base,
                            .size = m->r.size,
                            .dev = m->phys->dev,
                            .buffer_id = m->phys->buffer_id,
                            .map = m };
        return true;
    }
    sim_va_t *v = tree_find(&g_sim.va_tree, p, 1);
    if (v && (v->kind == VA_PLAIN || v->kind == VA_MANAGED || v->kind == VA_IPC)) {
        sim_alloc_t *a = (sim_alloc_t *)v;
        *pi = (ptr_info_t){ .kind = v->kind == VA_MANAGED ? PTR_MANAGED : PTR_PLAIN,
                            .base = a->va.r.base,
                            .size = a->requested,
                            .dev = a->dev,
                            .ctx = a->ctx,
                            .host_accessible = v->kind == VA_MANAGED,
                            .buffer_id = a->buffer_id,
                            .alloc = a };
        /* Pointers in the alignment slack past the requested size are not part
         * of the allocation. */
        return p < a->va.r.base + a->requested;
    }
    return false;
}

/* ======================================================= plain allocations */

static CUresult plain_alloc_locked(CUdeviceptr *dptr, uint64_t bytes, const char *fn, bool managed)
{
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    int dev = ctx->dev;
    if (sim_inject_locked(fn, dev))
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t gran = g_sim.cfg.granularity;
    uint64_t charged = sim_align_up(bytes, gran);
    if (charged < bytes || !sim_charge_locked(dev, charged)) {
        sim_count_oom_locked(dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_alloc_t *a = calloc(1, sizeof *a);
    if (!a)
        goto fail_uncharge;
    if (managed) {
        /* Programs touch managed memory from the host, so it is real memory;
         * MAP_NORESERVE keeps a huge, untouched allocation free. */
        a->map_len = sim_align_up(bytes, SIM_PAGE);
        void *m = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            goto fail_free;
        a->va = (sim_va_t){ { (uint64_t)(uintptr_t)m, a->map_len }, VA_MANAGED };
        if (!va_insert_locked(&a->va)) {
            fprintf(stderr, "simgpu: warning: host mapping %p collides with a simulated device range\n", m);
            munmap(m, a->map_len);
            goto fail_free;
        }
    } else {
        uint64_t span = sim_align_up(bytes, SIM_ALLOC_ALIGN);
        uint64_t base = dev_va_alloc_locked(dev, span, SIM_ALLOC_ALIGN);
        if (!base)
            goto fail_free;
        a->va = (sim_va_t){ { base, span }, VA_PLAIN };
        va_insert_locked(&a->va);
    }
    a->dev = dev;
    a->requested = bytes;
    a->charged = charged;
    a->ctx = ctx;
    a->buffer_id = g_sim.next_buffer_id++;
    a->next = g_sim.allocs;
    if (g_sim.allocs)
        g_sim.allocs->prev = a;
    g_sim.allocs = a;

    sim_dev_t *d = &g_sim.dev[dev];
    d->alloc_requested += bytes;
    d->alloc_charged += charged;
    d->alloc_blocks++;
    if (dev < 64 && !(t_alloc_devs & (1ull << dev))) { /* this thread's first plain allocation here */
        t_alloc_devs |= 1ull << dev;
        d->alloc_threads++;
    }
    if (d->used == d->peak_used) /* this block made the peak: its rounding is part of it */
        d->peak_rounding = d->alloc_charged - d->alloc_requested;
    if (managed)
        d->managed_requested += bytes;
    *dptr = a->va.r.base;
    return CUDA_SUCCESS;

fail_free:
    free(a);
fail_uncharge:
    sim_uncharge_locked(dev, charged);
    sim_count_oom_locked(dev);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void plain_free_locked(sim_alloc_t *a)
{
    sim_dev_t *d = &g_sim.dev[a->dev];
    tdelete(&a->va, &g_sim.va_tree, sim_range_cmp);
    if (a->prev)
        a->prev->next = a->next;
    else
        g_sim.allocs = a->next;
    if (a->next)
        a->next->prev = a->prev;
    d->alloc_requested -= a->requested;
    d->alloc_charged -= a->charged;
    d->alloc_blocks--;
    if (a->va.kind == VA_MANAGED) {
        d->managed_requested -= a->requested;
        munmap((void *)(uintptr_t)a->va.r.base, a->map_len);
    }
    sim_uncharge_locked(a->dev, a->charged);
    free(a);
}

void sim_mem_free_ctx_allocs_locked(CUcontext ctx)
{
    sim_alloc_t *a = g_sim.allocs;
    while (a) {
        sim_alloc_t *n = a->next;
        if (a->ctx == ctx)
            plain_free_locked(a);
        a = n;
    }
}

SIM_API CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    ENTER_INIT();
    if (!dptr || bytesize == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(plain_alloc_locked(dptr, bytesize, "cuMemAlloc_v2", false));
}

SIM_API CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                            unsigned int ElementSizeBytes)
{
    ENTER_INIT();
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    /* Rows are padded to 512 bytes, the texture pitch alignment of the
     * simulated device; the allocation is pitch * height. */
    uint64_t pitch = sim_align_up(WidthInBytes, 512);
    if (pitch < WidthInBytes || Height > UINT64_MAX / pitch)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    CUresult r = plain_alloc_locked(dptr, pitch * Height, "cuMemAllocPitch_v2", false);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    ENTER_INIT();
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(plain_alloc_locked(dptr, bytesize, "cuMemAllocManaged", true));
}

/* Pool blocks are freed by cuMemFree too (the driver documents it). */
static void pool_free_block_locked(sim_block_t *b);

static CUresult free_device_ptr_locked(CUdeviceptr dptr)
{
    sim_va_t *v = tree_find(&g_sim.va_tree, dptr, 1);
    if (v && (v->kind == VA_PLAIN || v->kind == VA_MANAGED) && v->r.base == dptr) {
        plain_free_locked((sim_alloc_t *)v);
        return CUDA_SUCCESS;
    }
    sim_block_t *b = tree_find(&g_sim.block_tree, dptr, 1);
    if (b && b->r.base == dptr) {
        pool_free_block_locked(b);
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ===================================================================== IPC */

/* A handle names (pid, device, base, size) of a plain allocation.  Opening one maps the
 * exporter's memory into this process's address space: device memory, but not this
 * process's allocation, so nothing is charged here (the truth's ipc_mapped_bytes).  A
 * process cannot open its own handles (CUDA_ERROR_INVALID_CONTEXT, as the driver says). */
typedef struct {
    char magic[8];
    uint32_t pid;
    int32_t dev;
    uint64_t base, size;
} sim_ipc_handle_t;

SIM_API CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    ENTER_INIT();
    sim_va_t *v = tree_find(&g_sim.va_tree, dptr, 1);
    if (!pHandle || !v || v->kind != VA_PLAIN || v->r.base != dptr)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_alloc_t *a = (sim_alloc_t *)v;
    sim_ipc_handle_t h = { "SIMGPUIP", (uint32_t)getpid(), a->dev, a->va.r.base, a->requested };
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    ENTER_INIT();
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    sim_ipc_handle_t h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!pdptr || memcmp(h.magic, "SIMGPUIP", 8) != 0 || h.size == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    if (h.pid == (uint32_t)getpid())
        RETURN_UNLOCK(CUDA_ERROR_INVALID_CONTEXT);
    if (h.dev != ctx->dev)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_DEVICE);
    sim_alloc_t *a = calloc(1, sizeof *a);
    uint64_t span = sim_align_up(h.size, SIM_ALLOC_ALIGN);
    uint64_t base = a ? dev_va_alloc_locked(ctx->dev, span, SIM_ALLOC_ALIGN) : 0;
    if (!base) {
        free(a);
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    }
    a->va = (sim_va_t){ { base, span }, VA_IPC };
    va_insert_locked(&a->va);
    a->dev = ctx->dev;
    a->requested = h.size;
    a->ctx = ctx;
    a->buffer_id = g_sim.next_buffer_id++;
    g_sim.dev[ctx->dev].ipc_mapped += h.size;
    g_sim.dev[ctx->dev].ipc_mappings++;
    *pdptr = base;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

SIM_API CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    ENTER_INIT();
    sim_va_t *v = tree_find(&g_sim.va_tree, dptr, 1);
    if (!v || v->kind != VA_IPC || v->r.base != dptr)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_alloc_t *a = (sim_alloc_t *)v;
    tdelete(&a->va, &g_sim.va_tree, sim_range_cmp);
    g_sim.dev[a->dev].ipc_mapped -= a->requested;
    g_sim.dev[a->dev].ipc_mappings--;
    free(a);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* ============================================================= CUDA arrays */

/* An array is device memory behind an opaque handle: charged like a plain allocation
 * of its texel bytes (width x height x depth x channels x format size, summed over the
 * mipmap levels), in the current context, freed with it.  Counted in the truth's
 * alloc_requested_bytes/alloc_blocks; for fault injection it is a cuMemAlloc call. */
#define SIM_ARRAY_MAGIC 0x41525259u
typedef struct sim_array {
    uint32_t magic;
    bool mipmapped;
    CUdeviceptr base; /* of the plain allocation holding it */
    CUDA_ARRAY3D_DESCRIPTOR desc;
    unsigned int levels;
    struct sim_array *next; /* live arrays: a handle is checked here before it is read */
} sim_array_t;
static sim_array_t *g_arrays; /* under the simulator's lock */

static uint64_t array_texel_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    uint64_t elem;
    switch (d->Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        elem = 1;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        elem = 2;
        break;
    default:
        elem = 4;
        break;
    }
    uint64_t total = 0;
    for (unsigned int l = 0; l < (levels ? levels : 1); l++) {
        uint64_t w = d->Width >> l ? d->Width >> l : 1, h = d->Height >> l ? d->Height >> l : 1;
        uint64_t z = d->Depth >> l ? d->Depth >> l : 1;
        total += w * h * z * (d->NumChannels ? d->NumChannels : 1) * elem;
    }
    return total;
}

static CUresult array_create_locked(void **out, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels,
                                    bool mipmapped)
{
    if (!out || !desc || desc->Width == 0 ||
        (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4) || (mipmapped && levels == 0))
        return CUDA_ERROR_INVALID_VALUE;
    sim_array_t *arr = calloc(1, sizeof *arr);
    if (!arr)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = plain_alloc_locked(&arr->base, array_texel_bytes(desc, levels), "cuMemAlloc_v2", false);
    if (r != CUDA_SUCCESS) {
        free(arr);
        return r;
    }
    arr->magic = SIM_ARRAY_MAGIC;
    arr->mipmapped = mipmapped;
    arr->desc = *desc;
    arr->levels = levels;
    arr->next = g_arrays;
    g_arrays = arr;
    *out = arr;
    return CUDA_SUCCESS;
}

static CUresult array_destroy_locked(void *h, bool mipmapped)
{
    /* a destroyed or foreign handle is never dereferenced, as the real driver validates handles */
    sim_array_t **link = &g_arrays;
    while (*link && *link != (sim_array_t *)h)
        link = &(*link)->next;
    sim_array_t *arr = *link;
    if (!arr || arr->magic != SIM_ARRAY_MAGIC || arr->mipmapped != mipmapped)
        return CUDA_ERROR_INVALID_HANDLE;
    *link = arr->next;
    sim_alloc_t *a = NULL;
    for (sim_alloc_t *x = g_sim.allocs; x; x = x->next)
        if (x->va.r.base == arr->base)
            a = x;
    if (a) /* else its context is gone, and the memory with it */
        plain_free_locked(a);
    arr->magic = 0;
    free(arr);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    ENTER_INIT();
    if (!d)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUDA_ARRAY3D_DESCRIPTOR d3 = { d->Width, d->Height, 0, d->Format, d->NumChannels, 0 };
    RETURN_UNLOCK(array_create_locked((void **)pHandle, &d3, 1, false));
}

SIM_API CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    ENTER_INIT();
    RETURN_UNLOCK(array_create_locked((void **)pHandle, d, 1, false));
}

SIM_API CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                                unsigned int numMipmapLevels)
{
    ENTER_INIT();
    RETURN_UNLOCK(array_create_locked((void **)pHandle, d, numMipmapLevels, true));
}

SIM_API CUresult CUDAAPI cuArrayDestroy(CUarray hArray)
{
    ENTER_INIT();
    RETURN_UNLOCK(array_destroy_locked(hArray, false));
}

SIM_API CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    ENTER_INIT();
    RETURN_UNLOCK(array_destroy_locked(h, true));
}

SIM_API CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER_INIT();
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    RETURN_UNLOCK(free_device_ptr_locked(dptr));
}

SIM_API CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
    ENTER_INIT();
    if (!free || !total)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    *free = sim_free_bytes_locked(ctx->dev);
    *total = g_sim.dev[ctx->dev].total;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    ENTER_INIT();
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    ptr_info_t pi;
    if (!classify_locked(dptr, &pi))
        RETURN_UNLOCK(CUDA_ERROR_NOT_FOUND);
    if (pbase)
        *pbase = pi.base;
    if (psize)
        *psize = pi.size;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* 32-bit-era v1 entry points: a 64-bit device address does not fit their
 * `unsigned int` pointers and sizes. */
SIM_API CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) { return CUDA_ERROR_NOT_SUPPORTED; }
SIM_API CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                         unsigned int Height, unsigned int ElementSizeBytes)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
SIM_API CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr) { return CUDA_ERROR_NOT_SUPPORTED; }
SIM_API CUresult CUDAAPI cuMemGetInfo(unsigned int *free, unsigned int *total) { return CUDA_ERROR_NOT_SUPPORTED; }
SIM_API CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ===================================================== pinned host memory */

static CUresult host_alloc_locked(void **pp, uint64_t bytes, unsigned int flags, const char *fn)
{
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    /* Host allocations are process-wide; their failures count on device 0. */
    if (sim_inject_locked(fn, 0))
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_host_t *h = calloc(1, sizeof *h);
    void *mem = NULL;
    if (!h || posix_memalign(&mem, SIM_PAGE, bytes) != 0) {
        free(h);
        sim_count_oom_locked(0);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->r = (sim_range_t){ (uint64_t)(uintptr_t)mem, bytes };
    h->mem = mem;
    h->flags = flags;
    h->ctx = ctx;
    h->dev = ctx->dev;
    h->buffer_id = g_sim.next_buffer_id++;
    tsearch(h, &g_sim.host_tree, sim_range_cmp);
    g_sim.host_pinned_bytes += bytes;
    g_sim.host_pinned_blocks++;
    *pp = mem;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    ENTER_INIT();
    if (!pp || bytesize == 0 ||
        (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(host_alloc_locked(pp, bytesize, Flags, "cuMemHostAlloc"));
}

SIM_API CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    ENTER_INIT();
    if (!pp || bytesize == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(host_alloc_locked(pp, bytesize, 0, "cuMemAllocHost_v2"));
}

/* v1 only narrowed the size; host pointers were always full width. */
SIM_API CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize) { return cuMemAllocHost_v2(pp, bytesize); }

SIM_API CUresult CUDAAPI cuMemFreeHost(void *p)
{
    ENTER_INIT();
    sim_host_t *h = tree_find(&g_sim.host_tree, (uint64_t)(uintptr_t)p, 1);
    if (!p || !h || h->mem != p)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    tdelete(h, &g_sim.host_tree, sim_range_cmp);
    g_sim.host_pinned_bytes -= h->r.size;
    g_sim.host_pinned_blocks--;
    free(h->mem);
    free(h);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* ==================================================== pointer attributes */

static CUresult pointer_attr_locked(void *data, CUpointer_attribute attr, const ptr_info_t *pi, uint64_t ptr)
{
    bool dev_mem = pi->kind != PTR_HOST;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = pi->ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = dev_mem ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr; /* unified addressing: same value */
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!pi->host_accessible)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(bool *)data = false;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = pi->buffer_id;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(bool *)data = pi->kind == PTR_MANAGED;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = pi->dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(bool *)data = pi->kind == PTR_PLAIN;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(void **)data = (void *)(uintptr_t)pi->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = pi->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(bool *)data = true;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(bool *)data = false;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = pi->kind == PTR_BLOCK ? pi->block->chunk->pool : NULL;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = pi->kind == PTR_MAPPING ? pi->map->r.size : pi->size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(void **)data = (void *)(uintptr_t)pi->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = pi->buffer_id;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

SIM_API CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    ENTER_INIT();
    if (!data)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    ptr_info_t pi;
    if (!classify_locked(ptr, &pi))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(pointer_attr_locked(data, attribute, &pi, ptr));
}

/* Unknown pointers are not an error here: attributes read as "nothing". */
SIM_API CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                                void **data, CUdeviceptr ptr)
{
    ENTER_INIT();
    if (numAttributes == 0 || !attributes || !data)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    ptr_info_t pi;
    bool known = classify_locked(ptr, &pi);
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
        if (known) {
            CUresult r = pointer_attr_locked(data[i], attributes[i], &pi, ptr);
            if (r == CUDA_ERROR_INVALID_VALUE && attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER)
                *(void **)data[i] = NULL;
            else if (r != CUDA_SUCCESS)
                RETURN_UNLOCK(r);
            continue;
        }
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)data[i] = NULL;
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            *(CUdeviceptr *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            *(void **)data[i] = NULL;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = -2;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(void **)data[i] = NULL;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
            *(unsigned long long *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
            *(CUmemoryPool *)data[i] = NULL;
            break;
        default:
            *(bool *)data[i] = false;
            break;
        }
    }
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* ========================================================== copies, sets */

/* Inside one of the simulator's fake address windows? */
static bool in_fake_window(uint64_t p)
{
    return p >= SIM_VA_VMM_BASE && p < SIM_VA_DEV_BASE + SIM_MAX_DEVICES * SIM_VA_DEV_SPAN;
}

/* A range on the device side must lie inside one known allocation (device,
 * managed or pinned host).  Elsewhere an unknown pointer is pageable host
 * memory, as under unified addressing — unless it points into the fake
 * device windows (a freed or made-up device pointer), which real hardware
 * would reject too and which must never be dereferenced here. */
static CUresult check_range_locked(uint64_t p, uint64_t n, bool must_be_known, ptr_info_t *pi)
{
    if (!classify_locked(p, pi)) {
        if (must_be_known || !p || in_fake_window(p))
            return CUDA_ERROR_INVALID_VALUE;
        pi->kind = PTR_NONE;
        pi->host_accessible = true;
        return CUDA_SUCCESS;
    }
    if (n > pi->size || p - pi->base > pi->size - n)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Copies move real bytes when both sides are real memory; reading fake
 * device memory yields zeros; writing it is a no-op (it has no storage). */
static CUresult copy_locked(uint64_t dst, uint64_t src, uint64_t n, bool dst_dev, bool src_dev)
{
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    ptr_info_t d, s;
    if ((r = check_range_locked(dst, n, dst_dev, &d)) != CUDA_SUCCESS ||
        (r = check_range_locked(src, n, src_dev, &s)) != CUDA_SUCCESS)
        return r;
    if (d.host_accessible && s.host_accessible)
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    else if (d.host_accessible)
        memset((void *)(uintptr_t)dst, 0, n);
    return CUDA_SUCCESS;
}

static CUresult memset_locked(uint64_t dst, unsigned char v, uint64_t n)
{
    CUcontext ctx;
    CUresult r = sim_current_ctx_locked(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    ptr_info_t d;
    if ((r = check_range_locked(dst, n, true, &d)) != CUDA_SUCCESS)
        return r;
    if (d.host_accessible)
        memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

static CUresult stream_ok_locked(CUstream s)
{
    int dev;
    return sim_stream_device_locked(s, &dev);
}

SIM_API CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    ENTER_INIT();
    if (!srcHost && ByteCount)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(copy_locked(dstDevice, (uint64_t)(uintptr_t)srcHost, ByteCount, true, false));
}

SIM_API CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    ENTER_INIT();
    if (!dstHost && ByteCount)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(copy_locked((uint64_t)(uintptr_t)dstHost, srcDevice, ByteCount, false, true));
}

SIM_API CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    ENTER_INIT();
    RETURN_UNLOCK(copy_locked(dstDevice, srcDevice, ByteCount, true, true));
}

SIM_API CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

SIM_API CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

SIM_API CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

SIM_API CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_API CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_API CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_API CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    ENTER_INIT();
    RETURN_UNLOCK(copy_locked(dst, src, ByteCount, false, false));
}

SIM_API CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return cuMemcpy(dst, src, ByteCount);
}

SIM_API CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    ENTER_INIT();
    CUresult r = stream_ok_locked(hStream);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    RETURN_UNLOCK(copy_locked(dst, src, ByteCount, false, false));
}

SIM_API CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyAsync(dst, src, ByteCount, hStream);
}

SIM_API CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    ENTER_INIT();
    RETURN_UNLOCK(memset_locked(dstDevice, uc, N));
}

SIM_API CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return cuMemsetD8_v2(dstDevice, uc, N);
}

SIM_API CUresult CUDAAPI cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

SIM_API CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    ENTER_INIT();
    CUresult r = stream_ok_locked(hStream);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    RETURN_UNLOCK(memset_locked(dstDevice, uc, N));
}

SIM_API CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    return cuMemsetD8Async(dstDevice, uc, N, hStream);
}

/* ============================================================ VMM (cuMem*) */

static sim_phys_t *phys_find_locked(CUmemGenericAllocationHandle h)
{
    sim_phys_t key = { .handle = h };
    void **hit = tfind(&key, &g_sim.phys_tree, phys_cmp);
    return hit ? *hit : NULL;
}

/* Physical memory is freed when the handle is released AND unmapped. */
static void phys_maybe_free_locked(sim_phys_t *p)
{
    if (p->refs > 0 || p->mappings > 0)
        return;
    tdelete(p, &g_sim.phys_tree, phys_cmp);
    g_sim.dev[p->dev].vmm_physical -= p->size;
    g_sim.dev[p->dev].vmm_handles--;
    sim_uncharge_locked(p->dev, p->size);
    free(p);
}

/* The device of a pinned allocation's location: host locations are valid
 * but not simulated (CUDA_ERROR_NOT_SUPPORTED); anything else is invalid. */
static CUresult device_location(const CUmemLocation *loc, int *dev)
{
    switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (sim_check_device(loc->id) != CUDA_SUCCESS)
            return CUDA_ERROR_INVALID_DEVICE;
        *dev = loc->id;
        return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Only device-resident pinned allocations are simulated. */
static CUresult check_alloc_prop(const CUmemAllocationProp *prop, int *dev)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    return device_location(&prop->location, dev);
}

SIM_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                       CUmemAllocationGranularity_flags option)
{
    ENTER_INIT();
    int dev;
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_alloc_prop(prop, &dev);
    if (r == CUDA_SUCCESS)
        *granularity = g_sim.cfg.granularity;
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                     unsigned long long flags)
{
    ENTER_INIT();
    int dev;
    if (!handle || size == 0 || flags != 0 || size % g_sim.cfg.granularity != 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_alloc_prop(prop, &dev);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    if (sim_inject_locked("cuMemCreate", dev))
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    sim_phys_t *p = calloc(1, sizeof *p);
    if (!p || !sim_charge_locked(dev, size)) {
        free(p);
        sim_count_oom_locked(dev);
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    }
    p->handle = g_sim.next_handle++;
    p->dev = dev;
    p->size = size;
    p->prop = *prop;
    p->refs = 1;
    p->buffer_id = g_sim.next_buffer_id++;
    tsearch(p, &g_sim.phys_tree, phys_cmp);
    g_sim.dev[dev].vmm_physical += size;
    g_sim.dev[dev].vmm_handles++;
    *handle = p->handle;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    ENTER_INIT();
    sim_phys_t *p = phys_find_locked(handle);
    if (!p || p->refs == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    p->refs--;
    phys_maybe_free_locked(p);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                             unsigned long long flags)
{
    ENTER_INIT();
    if (!ptr || size == 0 || size % SIM_PAGE || addr % SIM_PAGE || flags != 0 || (alignment & (alignment - 1)))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    uint64_t align = alignment > g_sim.cfg.granularity ? alignment : g_sim.cfg.granularity;
    uint64_t base = 0;
    /* The hint is honoured when it is free and inside the VMM window, which
     * lets allocators grow a reservation contiguously. */
    if (addr && addr % align == 0 && addr >= SIM_VA_VMM_BASE && addr < SIM_VA_VMM_END &&
        size <= SIM_VA_VMM_END - addr && !tree_find(&g_sim.va_tree, addr, size))
        base = addr;
    if (!base)
        base = va_alloc_locked(&g_sim.vmm_cursor, SIM_VA_VMM_BASE, SIM_VA_VMM_END, size, align);
    if (!base)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    sim_reserve_t *res = calloc(1, sizeof *res);
    if (!res)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    res->va = (sim_va_t){ { base, size }, VA_RESERVE };
    va_insert_locked(&res->va);
    *ptr = base;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER_INIT();
    sim_va_t *v = tree_find(&g_sim.va_tree, ptr, 1);
    if (!v || v->kind != VA_RESERVE || v->r.base != ptr || v->r.size != size)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_reserve_t *res = (sim_reserve_t *)v;
    /* The simulator insists on unmapping first, so a leaked mapping shows up
     * as an error instead of silently vanishing. */
    if (res->mappings)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    tdelete(v, &g_sim.va_tree, sim_range_cmp);
    free(res);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                  unsigned long long flags)
{
    ENTER_INIT();
    uint64_t gran = g_sim.cfg.granularity;
    if (size == 0 || offset != 0 || flags != 0 || ptr % gran || size % gran)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_phys_t *p = phys_find_locked(handle);
    if (!p || p->refs == 0 || size > p->size)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_va_t *v = tree_find(&g_sim.va_tree, ptr, 1);
    if (!v || v->kind != VA_RESERVE || ptr + size > v->r.base + v->r.size || ptr + size < ptr)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    if (tree_find(&g_sim.map_tree, ptr, size))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_mapping_t *m = calloc(1, sizeof *m);
    if (!m)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    m->r = (sim_range_t){ ptr, size };
    m->phys = p;
    m->res = (sim_reserve_t *)v;
    tsearch(m, &g_sim.map_tree, sim_range_cmp);
    p->mappings++;
    m->res->mappings++;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* [ptr, ptr+size) must be exactly covered by consecutive mappings. */
static bool covered_by_mappings_locked(uint64_t ptr, uint64_t size, bool exact_start)
{
    uint64_t at = ptr, end = ptr + size;
    if (size == 0 || end < ptr)
        return false;
    while (at < end) {
        sim_mapping_t *m = tree_find(&g_sim.map_tree, at, 1);
        if (!m || (at == ptr && exact_start && m->r.base != ptr))
            return false;
        at = m->r.base + m->r.size;
    }
    return !exact_start || at == end;
}

SIM_API CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER_INIT();
    if (!covered_by_mappings_locked(ptr, size, true))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    uint64_t at = ptr, end = ptr + size;
    while (at < end) {
        sim_mapping_t *m = tree_find(&g_sim.map_tree, at, 1);
        at = m->r.base + m->r.size;
        tdelete(m, &g_sim.map_tree, sim_range_cmp);
        m->res->mappings--;
        m->phys->mappings--;
        phys_maybe_free_locked(m->phys);
        free(m);
    }
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    ENTER_INIT();
    if (!desc || count == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
        if (sim_check_device(desc[i].location.id) != CUDA_SUCCESS)
            RETURN_UNLOCK(CUDA_ERROR_INVALID_DEVICE);
        if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    }
    if (!covered_by_mappings_locked(ptr, size, false))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    ENTER_INIT();
    if (!handle)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_mapping_t *m = tree_find(&g_sim.map_tree, (uint64_t)(uintptr_t)addr, 1);
    if (!m)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    m->phys->refs++;
    *handle = m->phys->handle;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                                CUmemGenericAllocationHandle handle)
{
    ENTER_INIT();
    sim_phys_t *p = phys_find_locked(handle);
    if (!prop || !p)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    *prop = p->prop;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* ========================================================== memory pools */

static bool pool_valid_locked(CUmemoryPool pool)
{
    for (struct CUmemPoolHandle_st *p = g_sim.pools; p; p = p->next)
        if (p == pool)
            return !p->destroyed;
    return false;
}

/* ENTER_INIT for calls on a pool: CUDA_ERROR_INVALID_VALUE for a pool that
 * does not exist (or is destroyed) and when `invalid`. */
#define ENTER_POOL(pool, invalid)                    \
    do {                                             \
        ENTER_INIT();                                \
        if (!pool_valid_locked(pool) || (invalid))   \
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE); \
    } while (0)

static CUmemoryPool pool_new_locked(int dev, bool is_default, const CUmemPoolProps *props)
{
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->reuse[0] = p->reuse[1] = p->reuse[2] = 1;
    if (props) {
        p->props = *props;
        p->max_size = props->maxSize;
    } else {
        p->props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p->props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p->props.location.id = dev;
    }
    p->next = g_sim.pools;
    g_sim.pools = p;
    return p;
}

void sim_mem_init_device_locked(int dev)
{
    sim_dev_t *d = &g_sim.dev[dev];
    if (!d->default_pool)
        d->default_pool = pool_new_locked(dev, true, NULL);
    if (!d->current_pool)
        d->current_pool = d->default_pool;
}

static void pool_release_chunk_locked(struct CUmemPoolHandle_st *p, sim_chunk_t *c)
{
    for (sim_chunk_t **pp = &p->chunks; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    tdelete(&c->va, &g_sim.va_tree, sim_range_cmp);
    while (c->free) {
        sim_free_range_t *n = c->free->next;
        free(c->free);
        c->free = n;
    }
    p->reserved -= c->va.r.size;
    g_sim.dev[p->dev].pool_reserved -= c->va.r.size;
    sim_uncharge_locked(p->dev, c->va.r.size);
    free(c);
}

/* Give unused chunks back, newest first, while the pool keeps at least
 * `keep` bytes reserved (cuMemPoolTrimTo's guarantee). */
static void pool_trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    sim_chunk_t *c = p->chunks;
    while (c) {
        sim_chunk_t *n = c->next;
        if (c->used == 0 && p->reserved - c->va.r.size >= keep)
            pool_release_chunk_locked(p, c);
        c = n;
    }
}

static void pool_unlink_free_locked(struct CUmemPoolHandle_st *p)
{
    for (struct CUmemPoolHandle_st **pp = &g_sim.pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

void sim_pools_sync_locked(int dev)
{
    for (struct CUmemPoolHandle_st *p = g_sim.pools; p; p = p->next)
        if (p->dev == dev && p->reserved > p->release_threshold)
            pool_trim_locked(p, p->release_threshold);
}

static sim_chunk_t *pool_grow_locked(struct CUmemPoolHandle_st *p, uint64_t need)
{
    uint64_t gran = g_sim.cfg.granularity;
    uint64_t exact = sim_align_up(need, gran);
    uint64_t big = exact > SIM_POOL_CHUNK_MIN ? exact : sim_align_up(SIM_POOL_CHUNK_MIN, gran);
    uint64_t sizes[2] = { big, exact };
    for (int i = 0; i < 2; i++) {
        uint64_t sz = sizes[i];
        if (i == 1 && sz == big)
            break;
        if (p->max_size && p->reserved + sz > p->max_size)
            continue;
        if (!sim_charge_locked(p->dev, sz))
            continue;
        sim_chunk_t *c = calloc(1, sizeof *c);
        sim_free_range_t *fr = calloc(1, sizeof *fr);
        uint64_t base = c && fr ? dev_va_alloc_locked(p->dev, sz, gran) : 0;
        if (!base) {
            free(c);
            free(fr);
            sim_uncharge_locked(p->dev, sz);
            return NULL;
        }
        c->va = (sim_va_t){ { base, sz }, VA_CHUNK };
        c->pool = p;
        fr->off = 0;
        fr->len = sz;
        c->free = fr;
        c->next = p->chunks;
        p->chunks = c;
        va_insert_locked(&c->va);
        p->reserved += sz;
        if (p->reserved > p->reserved_high)
            p->reserved_high = p->reserved;
        g_sim.dev[p->dev].pool_reserved += sz;
        return c;
    }
    return NULL;
}

/* First fit inside one chunk. */
static bool chunk_carve(sim_chunk_t *c, uint64_t need, uint64_t *off)
{
    for (sim_free_range_t **pp = &c->free; *pp; pp = &(*pp)->next) {
        sim_free_range_t *fr = *pp;
        if (fr->len < need)
            continue;
        *off = fr->off;
        fr->off += need;
        fr->len -= need;
        if (fr->len == 0) {
            *pp = fr->next;
            free(fr);
        }
        return true;
    }
    return false;
}

static void chunk_give_back(sim_chunk_t *c, uint64_t off, uint64_t len)
{
    sim_free_range_t *prev = NULL, *cur = c->free;
    while (cur && cur->off < off) {
        prev = cur;
        cur = cur->next;
    }
    /* Coalesce with neighbours so a fully free chunk is one range again. */
    if (prev && prev->off + prev->len == off) {
        prev->len += len;
        if (cur && prev->off + prev->len == cur->off) {
            prev->len += cur->len;
            prev->next = cur->next;
            free(cur);
        }
        return;
    }
    if (cur && off + len == cur->off) {
        cur->off = off;
        cur->len += len;
        return;
    }
    sim_free_range_t *n = malloc(sizeof *n);
    if (!n)
        return; /* the range is lost to fragmentation; accounting stays exact */
    n->off = off;
    n->len = len;
    n->next = cur;
    if (prev)
        prev->next = n;
    else
        c->free = n;
}

static CUresult pool_alloc_locked(struct CUmemPoolHandle_st *p, uint64_t bytes, CUdeviceptr *out)
{
    uint64_t need = sim_align_up(bytes, SIM_ALLOC_ALIGN);
    /* Larger than the device: no chunk could ever hold it (and rounding it
     * to the granularity could overflow). */
    if (need < bytes || need > g_sim.dev[p->dev].total) {
        sim_count_oom_locked(p->dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_chunk_t *chunk = NULL;
    uint64_t off = 0;
    for (sim_chunk_t *c = p->chunks; c && !chunk; c = c->next)
        if (chunk_carve(c, need, &off))
            chunk = c;
    if (!chunk) {
        chunk = pool_grow_locked(p, need);
        if (!chunk) {
            /* The device is full: give back this pool's idle chunks and try
             * once more before reporting out of memory. */
            pool_trim_locked(p, 0);
            chunk = pool_grow_locked(p, need);
        }
        if (!chunk || !chunk_carve(chunk, need, &off)) {
            sim_count_oom_locked(p->dev);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    sim_block_t *b = calloc(1, sizeof *b);
    if (!b) {
        chunk_give_back(chunk, off, need);
        sim_count_oom_locked(p->dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->r = (sim_range_t){ chunk->va.r.base + off, need };
    b->requested = bytes;
    b->chunk = chunk;
    b->buffer_id = g_sim.next_buffer_id++;
    tsearch(b, &g_sim.block_tree, sim_range_cmp);
    chunk->used += need;
    /* "Used" is what the program asked for — what an allocation tracker can
     * know; the 512-byte rounding only shapes the chunk's free space. */
    p->used += bytes;
    if (p->used > p->used_high)
        p->used_high = p->used;
    p->blocks++;
    g_sim.dev[p->dev].pool_used += bytes;
    g_sim.dev[p->dev].pool_blocks++;
    *out = b->r.base;
    return CUDA_SUCCESS;
}

static void pool_free_block_locked(sim_block_t *b)
{
    sim_chunk_t *c = b->chunk;
    struct CUmemPoolHandle_st *p = c->pool;
    tdelete(b, &g_sim.block_tree, sim_range_cmp);
    chunk_give_back(c, b->r.base - c->va.r.base, b->r.size);
    c->used -= b->r.size;
    p->used -= b->requested;
    p->blocks--;
    g_sim.dev[p->dev].pool_used -= b->requested;
    g_sim.dev[p->dev].pool_blocks--;
    free(b);
    /* A pool destroyed with outstanding blocks goes away with the last one. */
    if (p->destroyed && p->blocks == 0) {
        pool_trim_locked(p, 0);
        pool_unlink_free_locked(p);
    }
}

SIM_API CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ENTER_INIT();
    if (!dptr || bytesize == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    int dev;
    CUresult r = sim_stream_device_locked(hStream, &dev);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    if (sim_inject_locked("cuMemAllocAsync", dev))
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    RETURN_UNLOCK(pool_alloc_locked(g_sim.dev[dev].current_pool, bytesize, dptr));
}

SIM_API CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return cuMemAllocAsync(dptr, bytesize, hStream);
}

SIM_API CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream)
{
    ENTER_INIT();
    if (!dptr || bytesize == 0 || !pool_valid_locked(pool))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    int dev;
    CUresult r = sim_stream_device_locked(hStream, &dev);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    if (sim_inject_locked("cuMemAllocFromPoolAsync", pool->dev))
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    RETURN_UNLOCK(pool_alloc_locked(pool, bytesize, dptr));
}

SIM_API CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                      CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

/* The block goes back to its pool at once (stream order is not simulated);
 * the pool keeps the memory reserved until a synchronize or TrimTo. */
SIM_API CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    ENTER_INIT();
    int dev;
    CUresult r = sim_stream_device_locked(hStream, &dev);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    RETURN_UNLOCK(free_device_ptr_locked(dptr));
}

SIM_API CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return cuMemFreeAsync(dptr, hStream);
}

static CUresult check_pool_props(const CUmemPoolProps *props, int *dev)
{
    if (!props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE && props->handleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    return device_location(&props->location, dev);
}

SIM_API CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    ENTER_INIT();
    int dev;
    if (!pool)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUresult r = check_pool_props(poolProps, &dev);
    if (r != CUDA_SUCCESS)
        RETURN_UNLOCK(r);
    CUmemoryPool p = pool_new_locked(dev, false, poolProps);
    if (!p)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    *pool = p;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER_POOL(pool, pool->is_default);
    sim_dev_t *d = &g_sim.dev[pool->dev];
    if (d->current_pool == pool)
        d->current_pool = d->default_pool;
    pool_trim_locked(pool, 0);
    if (pool->blocks > 0)
        pool->destroyed = true; /* freed with its last outstanding block */
    else
        pool_unlink_free_locked(pool);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    ENTER_POOL(pool, false);
    pool_trim_locked(pool, minBytesToKeep);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER_POOL(pool, !value);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = *(int *)value != 0;
        RETURN_UNLOCK(CUDA_SUCCESS);
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->release_threshold = *(cuuint64_t *)value;
        RETURN_UNLOCK(CUDA_SUCCESS);
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        /* High watermarks can only be reset (to the current value). */
        if (*(cuuint64_t *)value != 0)
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
        RETURN_UNLOCK(CUDA_SUCCESS);
    default:
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    }
}

SIM_API CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER_POOL(pool, !value);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->release_threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        /* SIMGPU_POOL_ATTRS=unreadable: a driver (or a vGPU/MIG setup) that refuses it */
        if (g_sim.pool_attrs_unreadable)
            RETURN_UNLOCK(CUDA_ERROR_NOT_SUPPORTED);
        *(cuuint64_t *)value = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pool->reserved_high;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pool->used_high;
        break;
    default:
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    }
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    ENTER_DEVICE(dev, !pool_out);
    *pool_out = g_sim.dev[dev].default_pool;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    ENTER_DEVICE(dev, !pool);
    *pool = g_sim.dev[dev].current_pool;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* cuDeviceSetMemPool / cuMemSetMemPool once the device is known: only a pool of that device. */
static CUresult set_current_pool_locked(int dev, CUmemoryPool pool)
{
    if (!pool_valid_locked(pool) || pool->dev != dev)
        return CUDA_ERROR_INVALID_VALUE;
    g_sim.dev[dev].current_pool = pool;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    ENTER_DEVICE(dev, false);
    RETURN_UNLOCK(set_current_pool_locked(dev, pool));
}

/* CUDA 13 location-based variants: device-resident pinned pools only. */
static CUresult check_location(const CUmemLocation *loc, CUmemAllocationType type, int *dev)
{
    if (!loc)
        return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return loc->type <= CU_MEM_LOCATION_TYPE_HOST_NUMA ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    return device_location(loc, dev);
}

/* cuMemGetDefaultMemPool (`current` false) and cuMemGetMemPool. */
static CUresult location_pool_locked(CUmemoryPool *out, const CUmemLocation *location, CUmemAllocationType type,
                                     bool current)
{
    int dev;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_location(location, type, &dev);
    if (r == CUDA_SUCCESS)
        *out = current ? g_sim.dev[dev].current_pool : g_sim.dev[dev].default_pool;
    return r;
}

SIM_API CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                                CUmemAllocationType type)
{
    ENTER_INIT();
    RETURN_UNLOCK(location_pool_locked(pool_out, location, type, false));
}

SIM_API CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
    ENTER_INIT();
    RETURN_UNLOCK(location_pool_locked(pool, location, type, true));
}

SIM_API CUresult CUDAAPI cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
    ENTER_INIT();
    int dev;
    CUresult r = check_location(location, type, &dev);
    RETURN_UNLOCK(r == CUDA_SUCCESS ? set_current_pool_locked(dev, pool) : r);
}

/* ============================================================ fork reset */

static void free_va_node(void *n)
{
    sim_va_t *v = n;
    if (v->kind == VA_CHUNK) {
        sim_chunk_t *c = n;
        while (c->free) {
            sim_free_range_t *f = c->free->next;
            free(c->free);
            c->free = f;
        }
    } else if (v->kind == VA_MANAGED) {
        /* The child's copy of managed memory stays mapped: the program may
         * still read what it wrote before fork. */
        orphan((void *)(uintptr_t)v->r.base);
    }
    free(n);
}

static void free_host_node(void *n)
{
    sim_host_t *h = n;
    orphan(h->mem); /* the program may still use its pinned buffers */
    free(h);
}

/* Forget every object without returning memory to the (reset) devices. */
void sim_mem_reset_all_locked(void)
{
    tdestroy(g_sim.va_tree, free_va_node);
    tdestroy(g_sim.block_tree, free);
    tdestroy(g_sim.map_tree, free);
    tdestroy(g_sim.phys_tree, free);
    tdestroy(g_sim.host_tree, free_host_node);
    g_sim.va_tree = g_sim.block_tree = g_sim.map_tree = g_sim.phys_tree = g_sim.host_tree = NULL;
    g_sim.allocs = NULL;
    struct CUmemPoolHandle_st *p = g_sim.pools;
    while (p) {
        struct CUmemPoolHandle_st *n = p->next;
        free(p);
        p = n;
    }
    g_sim.pools = NULL;
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        g_sim.dev[d].default_pool = g_sim.dev[d].current_pool = NULL;
}
