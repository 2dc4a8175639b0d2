/*
 * driver.c — the simulated CUDA driver (libcuda.so.1): initialisation,
 * devices, contexts, streams/events, error strings, ground truth and fork.
 * Memory management lives in driver_mem.c, cuGetProcAddress in driver_proc.c.
 *
 * The goal is to be indistinguishable from NVIDIA's driver for everything an
 * allocation tracker can observe: exported ABI names, return codes, context
 * rules, versioned entry points — while keeping exact books (simgpu_truth) so
 * tests can check what oomguard reports against what really happened.
 */
#include "driver_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

sim_state_t g_sim;

/* The simulator's one lock is a spin lock: its critical sections are a few hundred
 * instructions, and a real driver does not put a thread to sleep on every allocation.
 * (With a sleeping mutex, two threads allocating at once spend their time in futex
 * hand-offs, and any work done outside the lock looks many times more expensive.) */
static void raw_lock(void)
{
    for (unsigned spins = 0; __atomic_exchange_n(&g_sim.lock, 1, __ATOMIC_ACQUIRE);) {
        while (__atomic_load_n(&g_sim.lock, __ATOMIC_RELAXED)) {
            if (++spins < 128) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield();
            }
        }
    }
}
static void raw_unlock(void) { __atomic_store_n(&g_sim.lock, 0, __ATOMIC_RELEASE); }

/* The context stack is per thread, like the real driver's.  A fixed depth is
 * plenty: real programs push one or two levels. */
static __thread CUcontext t_stack[SIM_CTX_STACK_MAX];
static __thread int t_depth;

/* ============================================================ state basics */

static void load_locked(void)
{
    sim_config_t *c = &g_sim.cfg;
    sim_config_load(c, false);
    g_sim.ndev = c->devices;
    const char *pa = getenv("SIMGPU_POOL_ATTRS");
    g_sim.pool_attrs_unreadable = pa && strcmp(pa, "unreadable") == 0;
    /* SIMGPU_GRAPH_MEM=DEV:SIZE: graph memory nodes of graphs already run hold SIZE in the
     * device's graph pool (the simulator runs no graphs; this stands for them) */
    memset(g_sim.graph_mem, 0, sizeof g_sim.graph_mem);
    const char *gm = getenv("SIMGPU_GRAPH_MEM");
    if (gm && *gm) {
        char *colon = strchr(gm, ':');
        long gd = colon ? strtol(gm, NULL, 10) : 0;
        uint64_t gb = 0;
        if (gd >= 0 && gd < SIM_MAX_DEVICES && sim_parse_size(colon ? colon + 1 : gm, &gb))
            g_sim.graph_mem[gd] = gb;
        else
            fprintf(stderr, "simgpu: warning: ignoring SIMGPU_GRAPH_MEM='%s' (DEV:SIZE expected); using default 0\n",
                    gm);
    }
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        sim_dev_t *dv = &g_sim.dev[d];
        memset(dv, 0, sizeof *dv);
        dv->total = c->total[d];
        dv->other_cfg = sim_config_other_bytes(c, d);
        dv->primary.magic = SIM_CTX_MAGIC;
        dv->primary.dev = d;
        dv->primary.primary = true;
        __atomic_store_n(&dv->primary.active, false, __ATOMIC_RELEASE);
        dv->va_cursor = SIM_VA_DEV_BASE + (uint64_t)d * SIM_VA_DEV_SPAN;
    }
    g_sim.vmm_cursor = SIM_VA_VMM_BASE;
    g_sim.prng = c->seed;
    g_sim.next_handle = 0x51a0000000001000ULL;
    g_sim.next_buffer_id = 1;
    g_sim.next_ctx_id = 1;
    sim_shared_open(c);
    g_sim.loaded = true;
}

void sim_lock(void)
{
    raw_lock();
    if (!g_sim.loaded)
        load_locked();
    if (OG_SIM_UNLIKELY(g_sim.torn_down) && !g_sim.torn_down_reported) {
        /* a real driver answers CUDA_ERROR_DEINITIALIZED by now: whoever calls is a bug to find */
        g_sim.torn_down_reported = true;
        fprintf(stderr, "simgpu: error: driver called after libcuda's exit teardown\n");
    }
}

void sim_unlock(void) { raw_unlock(); }

CUresult sim_check_device(CUdevice dev)
{
    return (dev >= 0 && dev < g_sim.ndev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

bool sim_ctx_valid_locked(CUcontext ctx)
{
    if (!ctx)
        return false;
    for (int d = 0; d < g_sim.ndev; d++)
        if (ctx == &g_sim.dev[d].primary)
            return ctx->active;
    for (struct CUctx_st *c = g_sim.ctxs; c; c = c->next)
        if (c == ctx)
            return c->active;
    return false;
}

/* Known handle (live or not)?  Pointers we never handed out are never
 * dereferenced. */
static bool ctx_known_locked(CUcontext ctx)
{
    if (!ctx)
        return false;
    for (int d = 0; d < g_sim.ndev; d++)
        if (ctx == &g_sim.dev[d].primary)
            return true;
    for (struct CUctx_st *c = g_sim.ctxs; c; c = c->next)
        if (c == ctx)
            return true;
    return false;
}

CUresult sim_current_ctx_locked(CUcontext *out)
{
    if (t_depth == 0 || t_stack[t_depth - 1] == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[t_depth - 1];
    if (!sim_ctx_valid_locked(c))
        return ctx_known_locked(c) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* ======================================================= memory accounting */

uint64_t sim_other_bytes_locked(int dev) { return g_sim.dev[dev].other_cfg + sim_shared_others_used(dev); }

uint64_t sim_free_bytes_locked(int dev)
{
    sim_dev_t *d = &g_sim.dev[dev];
    uint64_t taken = d->used + sim_other_bytes_locked(dev);
    return taken >= d->total ? 0 : d->total - taken;
}

void sim_publish_locked(int dev) { sim_shared_publish(dev, g_sim.dev[dev].used, g_sim.dev[dev].contexts); }

/* Admission control for every byte of device memory this process takes
 * (context overheads, plain allocations, VMM physical memory, pool chunks).
 * With SIMGPU_STATE_DIR the check and the charge happen under the device's
 * cross-process lock so two ranks cannot both take the last free bytes. */
bool sim_charge_locked(int dev, uint64_t bytes)
{
    sim_dev_t *d = &g_sim.dev[dev];
    sim_shared_lock(dev);
    bool ok = bytes <= sim_free_bytes_locked(dev);
    if (ok) {
        d->used += bytes;
        if (d->used > d->peak_used) {
            d->peak_used = d->used;
            d->peak_rounding = d->alloc_charged - d->alloc_requested; /* a plain block books its own next */
        }
        sim_publish_locked(dev);
    }
    sim_shared_unlock(dev);
    return ok;
}

void sim_uncharge_locked(int dev, uint64_t bytes)
{
    g_sim.dev[dev].used -= bytes;
    sim_publish_locked(dev);
}

/* ========================================================= fault injection */

static const char *const k_alloc_fns[SIM_N_ALLOC_FNS] = {
    "cuMemAlloc_v2",   "cuMemAllocPitch_v2",      "cuMemAllocManaged", "cuMemCreate",
    "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemHostAlloc",    "cuMemAllocHost_v2",
};

/* splitmix64: tiny, well distributed, and fully determined by SIMGPU_SEED.
 * Called under the lock, so it is thread-safe and the sequence of decisions
 * depends only on the order of allocating calls. */
static double prng_next_locked(void)
{
    uint64_t z = (g_sim.prng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

void sim_count_oom_locked(int dev) { g_sim.dev[dev].failed_allocs++; }

bool sim_inject_locked(const char *canon, int dev)
{
    int idx = -1;
    for (int i = 0; i < SIM_N_ALLOC_FNS; i++)
        if (strcmp(canon, k_alloc_fns[i]) == 0)
            idx = i;
    uint64_t mine = idx >= 0 ? ++g_sim.fn_calls[idx] : 0;
    uint64_t any = ++g_sim.any_calls;
    bool fail = false;
    for (int i = 0; i < g_sim.cfg.n_fail; i++) {
        const sim_fail_rule_t *r = &g_sim.cfg.fail[i];
        if (strcmp(r->name, "*") == 0 ? any == r->nth : (strcmp(r->name, canon) == 0 && mine == r->nth))
            fail = true;
    }
    if (g_sim.cfg.fail_prob > 0.0 && prng_next_locked() < g_sim.cfg.fail_prob)
        fail = true;
    if (fail) {
        g_sim.dev[dev].failed_allocs++;
        g_sim.dev[dev].injected++;
    }
    return fail;
}

/* ============================================================ ground truth */

static void truth_locked(int dev, simgpu_truth_t *t)
{
    sim_dev_t *d = &g_sim.dev[dev];
    memset(t, 0, sizeof *t);
    t->total_bytes = d->total;
    t->free_bytes = sim_free_bytes_locked(dev);
    t->context_bytes = d->context_bytes;
    t->alloc_requested_bytes = d->alloc_requested;
    t->alloc_charged_bytes = d->alloc_charged;
    t->alloc_blocks = d->alloc_blocks;
    t->managed_requested_bytes = d->managed_requested;
    t->vmm_physical_bytes = d->vmm_physical;
    t->vmm_handles = d->vmm_handles;
    t->pool_reserved_bytes = d->pool_reserved;
    t->pool_used_bytes = d->pool_used;
    t->pool_blocks = d->pool_blocks;
    t->other_process_bytes = sim_other_bytes_locked(dev);
    t->used_bytes = d->used;
    t->peak_used_bytes = d->peak_used;
    t->peak_rounding_bytes = d->peak_rounding;
    t->alloc_threads = d->alloc_threads;
    if (dev == 0) {
        t->host_pinned_bytes = g_sim.host_pinned_bytes;
        t->host_pinned_blocks = g_sim.host_pinned_blocks;
    }
    t->failed_allocs = d->failed_allocs;
    t->injected_failures = d->injected;
    t->contexts = d->contexts;
    t->graph_reserved_bytes = d->graph_reserved;
    t->ipc_mapped_bytes = d->ipc_mapped;
    t->ipc_mappings = d->ipc_mappings;
}

SIM_API int simgpu_truth(int device, simgpu_truth_t *out)
{
    if (!out)
        return -1;
    sim_lock();
    int rc = -1;
    if (device >= 0 && device < g_sim.ndev) {
        truth_locked(device, out);
        rc = 0;
    }
    sim_unlock();
    return rc;
}

SIM_API int simgpu_device_count(void)
{
    sim_lock();
    int n = g_sim.ndev;
    sim_unlock();
    return n;
}

/* SIMGPU_TRUTH_FILE: "%p" in the path becomes the pid.  Without %p only the
 * process that read the configuration first writes (a fork child that exits
 * would otherwise overwrite its parent's file). */
static void write_truth_file_locked(void)
{
    const char *pat = g_sim.cfg.truth_file;
    if (!g_sim.loaded || !pat[0])
        return;
    bool has_pid = strstr(pat, "%p") != NULL;
    if (g_sim.forked_child && !has_pid)
        return;
    char path[600];
    size_t o = 0;
    for (const char *p = pat; *p && o + 24 < sizeof path; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "simgpu: warning: cannot write SIMGPU_TRUTH_FILE '%s': %s\n", path, strerror(errno));
        return;
    }
    for (int dev = 0; dev < g_sim.ndev; dev++) {
        simgpu_truth_t t;
        truth_locked(dev, &t);
        fprintf(f,
                "{\"device\":%d,\"pid\":%d,\"total_bytes\":%llu,\"free_bytes\":%llu,\"context_bytes\":%llu,"
                "\"alloc_requested_bytes\":%llu,\"alloc_charged_bytes\":%llu,\"alloc_blocks\":%llu,"
                "\"managed_requested_bytes\":%llu,\"vmm_physical_bytes\":%llu,\"vmm_handles\":%llu,"
                "\"pool_reserved_bytes\":%llu,\"pool_used_bytes\":%llu,\"pool_blocks\":%llu,"
                "\"other_process_bytes\":%llu,\"used_bytes\":%llu,\"peak_used_bytes\":%llu,"
                "\"host_pinned_bytes\":%llu,\"host_pinned_blocks\":%llu,\"failed_allocs\":%llu,"
                "\"injected_failures\":%llu,\"contexts\":%llu,\"peak_rounding_bytes\":%llu,\"alloc_threads\":%llu}\n",
                dev, (int)getpid(), t.total_bytes, t.free_bytes, t.context_bytes, t.alloc_requested_bytes,
                t.alloc_charged_bytes, t.alloc_blocks, t.managed_requested_bytes, t.vmm_physical_bytes, t.vmm_handles,
                t.pool_reserved_bytes, t.pool_used_bytes, t.pool_blocks, t.other_process_bytes, t.used_bytes,
                t.peak_used_bytes, t.host_pinned_bytes, t.host_pinned_blocks, t.failed_allocs, t.injected_failures,
                t.contexts, t.peak_rounding_bytes, t.alloc_threads);
    }
    fclose(f);
}

/* ================================================ stream and event lists */

/* Free the objects of `ctx` (NULL: every object) from the list. */
static void obj_drop_locked(sim_obj_t **list, CUcontext ctx)
{
    for (sim_obj_t **pp = list; *pp;) {
        if (!ctx || (*pp)->ctx == ctx) {
            sim_obj_t *dead = *pp;
            *pp = dead->next;
            free(dead);
        } else {
            pp = &(*pp)->next;
        }
    }
}

/* The object behind handle `h`, NULL for anything not in the list. */
static sim_obj_t *obj_find_locked(sim_obj_t *list, const void *h)
{
    for (sim_obj_t *o = list; o; o = o->next)
        if ((const void *)o == h)
            return o;
    return NULL;
}

/* A new object of `size` bytes (its handle type) in the calling thread's current context. */
static CUresult obj_create_locked(sim_obj_t **list, size_t size, unsigned int flags, sim_obj_t **out)
{
    CUcontext c;
    CUresult r = sim_current_ctx_locked(&c);
    if (r != CUDA_SUCCESS)
        return r;
    sim_obj_t *o = calloc(1, size);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->dev = c->dev;
    o->ctx = c;
    o->flags = flags;
    o->next = *list;
    *list = o;
    *out = o;
    return CUDA_SUCCESS;
}

static CUresult obj_destroy_locked(sim_obj_t **list, const void *h)
{
    for (sim_obj_t **pp = list; *pp; pp = &(*pp)->next)
        if ((const void *)*pp == h) {
            sim_obj_t *dead = *pp;
            *pp = dead->next;
            free(dead);
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_HANDLE;
}

/* ===================================================== fork / load / exit */

static void drop_handles_locked(void)
{
    struct CUctx_st *c = g_sim.ctxs;
    while (c) {
        struct CUctx_st *n = c->next;
        free(c);
        c = n;
    }
    g_sim.ctxs = NULL;
    obj_drop_locked(&g_sim.streams, NULL);
    obj_drop_locked(&g_sim.events, NULL);
}

static void atfork_prepare(void) { raw_lock(); }

static void atfork_parent(void) { raw_unlock(); }

/* A fork child starts like a fresh process: no contexts, no device memory,
 * not initialised (cuInit must be called again), configuration re-read.
 * Only the forking thread exists in the child, so its context stack is the
 * only one to clear. */
static void atfork_child(void)
{
    if (g_sim.loaded) {
        sim_mem_reset_all_locked();
        drop_handles_locked();
        sim_shared_after_fork_child();
    }
    memset(g_sim.fn_calls, 0, sizeof g_sim.fn_calls);
    g_sim.any_calls = 0;
    g_sim.host_pinned_bytes = g_sim.host_pinned_blocks = 0;
    g_sim.loaded = false;
    __atomic_store_n(&g_sim.initialized, false, __ATOMIC_RELEASE);
    g_sim.forked_child = true;
    g_sim.torn_down = g_sim.torn_down_reported = false; /* the inherited atexit entry stays */
    t_depth = 0;
    raw_unlock();
}

static void sim_exit_teardown(void)
{
    raw_lock();
    g_sim.torn_down = true;
    raw_unlock();
}

__attribute__((constructor)) static void sim_driver_ctor(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

__attribute__((destructor)) static void sim_driver_dtor(void)
{
    raw_lock();
    if (g_sim.loaded) {
        write_truth_file_locked();
        sim_shared_close();
    }
    g_sim.torn_down = true;
    raw_unlock();
}

/* ================================================================== init */

SIM_API CUresult CUDAAPI cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = CUDA_SUCCESS;
    if (g_sim.ndev == 0) {
        r = CUDA_ERROR_NO_DEVICE;
    } else if (!g_sim.initialized) {
        for (int d = 0; d < g_sim.ndev; d++) {
            sim_mem_init_device_locked(d);
            if (g_sim.graph_mem[d] && sim_charge_locked(d, g_sim.graph_mem[d]))
                g_sim.dev[d].graph_reserved = g_sim.dev[d].graph_reserved_high = g_sim.graph_mem[d];
        }
        __atomic_store_n(&g_sim.initialized, true, __ATOMIC_RELEASE);
        /* Like NVIDIA's driver, tear down at exit(): calls made after that (from static
         * destructors, from a library's destructor) get CUDA_ERROR_DEINITIALIZED. */
        if (!g_sim.exit_registered) {
            g_sim.exit_registered = true;
            atexit(sim_exit_teardown);
        }
    }
    sim_unlock();
    return r;
}

SIM_API CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* =============================================================== devices */

SIM_API CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    ENTER_DEVICE(ordinal, !device);
    *device = ordinal;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    ENTER_INIT();
    if (!count)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    *count = g_sim.ndev;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    ENTER_DEVICE(dev, !name || len <= 0);
    snprintf(name, (size_t)len, "%s", g_sim.cfg.name[dev]);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ENTER_DEVICE(dev, !bytes);
    *bytes = g_sim.dev[dev].total;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* The 32-bit-era v1 entry points took `unsigned int` sizes/pointers; a 64-bit
 * device cannot honour them, so the simulator declines like a modern driver
 * would for out-of-range values. */
SIM_API CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) { return CUDA_ERROR_NOT_SUPPORTED; }

/* Attribute values of a plausible Hopper-class device.  Anything not listed
 * reads as 0 with CUDA_SUCCESS, like an unsupported feature. */
static int attribute_value(CUdevice_attribute a, int dev)
{
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
        return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
        return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
        return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
        return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
        return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
        return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
        return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY:
        return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
        return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
        return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
        return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
        return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        return SIM_SM_COUNT;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
        return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
        return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        return 0x10 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
        return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE:
        return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH:
        return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE:
        return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
        return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
        return 1;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
        return 32;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        return g_sim.cfg.cc_major[dev];
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        return g_sim.cfg.cc_minor[dev];
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
        return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR:
        return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
        return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
        return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
        return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR:
        return 32;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    default:
        return 0;
    }
}

SIM_API CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    ENTER_DEVICE(dev, !pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX);
    *pi = attribute_value(attrib, dev);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    ENTER_DEVICE(dev, !pciBusId || len <= 0);
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* Accepts "[domain:]bus:device.function" in hex, with a 4- or 8-digit domain. */
static bool parse_pci(const char *s, unsigned *domain, unsigned *bus, unsigned *devn, unsigned *fn)
{
    int n = 0;
    if (sscanf(s, "%x:%x:%x.%x%n", domain, bus, devn, fn, &n) == 4 && s[n] == '\0')
        return true;
    n = 0;
    *domain = 0;
    return sscanf(s, "%x:%x.%x%n", bus, devn, fn, &n) == 3 && s[n] == '\0';
}

SIM_API CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    ENTER_INIT();
    unsigned dom, bus, dv, fn;
    if (!dev || !pciBusId || !parse_pci(pciBusId, &dom, &bus, &dv, &fn))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    for (int d = 0; d < g_sim.ndev; d++)
        if (dom == 0 && bus == (unsigned)(0x10 + d) && dv == 0 && fn == 0) {
            *dev = d;
            RETURN_UNLOCK(CUDA_SUCCESS);
        }
    RETURN_UNLOCK(CUDA_ERROR_INVALID_DEVICE);
}

/* Deterministic UUID: "SIMGPU" + device ordinal, so NVML and the driver agree. */
static void device_uuid(int dev, CUuuid *u)
{
    static const char tag[8] = { 'S', 'I', 'M', 'G', 'P', 'U', 0, 0 };
    memset(u, 0, sizeof *u);
    memcpy(u->bytes, tag, sizeof tag);
    u->bytes[15] = (char)dev;
}

SIM_API CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    ENTER_DEVICE(dev, !uuid);
    device_uuid(dev, uuid);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }

/* ====================================================== context plumbing */

static CUresult ctx_charge_locked(int dev)
{
    if (!sim_charge_locked(dev, g_sim.cfg.ctx_overhead))
        return CUDA_ERROR_OUT_OF_MEMORY;
    g_sim.dev[dev].context_bytes += g_sim.cfg.ctx_overhead;
    g_sim.dev[dev].contexts++;
    sim_publish_locked(dev);
    return CUDA_SUCCESS;
}

static void drop_ctx_streams_locked(CUcontext ctx)
{
    obj_drop_locked(&g_sim.streams, ctx);
    obj_drop_locked(&g_sim.events, ctx);
}

/* Destroying a context frees everything allocated in it (cuMemAlloc,
 * cuMemAllocPitch, cuMemAllocManaged) and its streams/events, as the real
 * driver does.  Pools and VMM allocations are not context-owned and survive. */
static void ctx_teardown_locked(CUcontext ctx)
{
    int dev = ctx->dev;
    sim_mem_free_ctx_allocs_locked(ctx);
    drop_ctx_streams_locked(ctx);
    __atomic_store_n(&ctx->active, false, __ATOMIC_RELEASE);
    g_sim.dev[dev].context_bytes -= g_sim.cfg.ctx_overhead;
    g_sim.dev[dev].contexts--;
    sim_uncharge_locked(dev, g_sim.cfg.ctx_overhead);
}

/* ====================================================== primary contexts */

/* The primary_*_locked helpers take an ordinal their caller checked (ENTER_DEVICE). */

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    ENTER_DEVICE(dev, !pctx);
    sim_dev_t *d = &g_sim.dev[dev];
    if (d->primary_refs == 0) {
        CUresult r = ctx_charge_locked(dev);
        if (r != CUDA_SUCCESS)
            RETURN_UNLOCK(r);
        __atomic_store_n(&d->primary.active, true, __ATOMIC_RELEASE);
        d->primary.flags = d->primary_flags;
        d->primary.id = g_sim.next_ctx_id++;
    }
    d->primary_refs++;
    *pctx = &d->primary;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

static CUresult primary_release_locked(CUdevice dev)
{
    sim_dev_t *d = &g_sim.dev[dev];
    /* "It is safe for other modules to call cuDevicePrimaryCtxRelease() even
     * after resetting the device": each reference a reset wiped out may still
     * be released once.  Those releases are matched first, so a module that
     * retained before the reset cannot tear down a context re-created since. */
    if (d->primary_reset_debt > 0) {
        d->primary_reset_debt--;
        return CUDA_SUCCESS;
    }
    if (d->primary_refs == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--d->primary_refs == 0)
        ctx_teardown_locked(&d->primary);
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER_DEVICE(dev, false);
    RETURN_UNLOCK(primary_release_locked(dev));
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

static CUresult primary_reset_locked(CUdevice dev)
{
    sim_dev_t *d = &g_sim.dev[dev];
    if (d->primary_refs > 0) {
        ctx_teardown_locked(&d->primary);
        d->primary_reset_debt += d->primary_refs;
        d->primary_refs = 0;
    }
    d->primary_flags = 0;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ENTER_DEVICE(dev, false);
    RETURN_UNLOCK(primary_reset_locked(dev));
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ENTER_DEVICE(dev, !flags || !active);
    *flags = g_sim.dev[dev].primary_flags;
    *active = g_sim.dev[dev].primary_refs > 0;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

static CUresult primary_set_flags_locked(CUdevice dev, unsigned int flags, bool v1)
{
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    sim_dev_t *d = &g_sim.dev[dev];
    /* The v1 entry point refused to change an active primary context;
     * _v2 (CUDA 11.0) allows it. */
    if (v1 && d->primary_refs > 0)
        return CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE;
    d->primary_flags = flags;
    if (d->primary_refs > 0)
        d->primary.flags = flags;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    ENTER_DEVICE(dev, false);
    RETURN_UNLOCK(primary_set_flags_locked(dev, flags, false));
}

SIM_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    ENTER_DEVICE(dev, false);
    RETURN_UNLOCK(primary_set_flags_locked(dev, flags, true));
}

/* ====================================================== created contexts */

static CUresult ctx_create_locked(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_check_device(dev) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    if (t_depth >= SIM_CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = ctx_charge_locked(dev);
    if (r != CUDA_SUCCESS) {
        free(c);
        return r;
    }
    c->magic = SIM_CTX_MAGIC;
    c->dev = dev;
    __atomic_store_n(&c->active, true, __ATOMIC_RELEASE);
    c->flags = flags;
    c->id = g_sim.next_ctx_id++;
    c->next = g_sim.ctxs;
    g_sim.ctxs = c;
    /* A new context becomes current on the calling thread (pushed). */
    t_stack[t_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    ENTER_INIT();
    RETURN_UNLOCK(ctx_create_locked(pctx, flags, dev));
}

SIM_API CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* Execution affinity (SM partitioning) is accepted and ignored. */
SIM_API CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                        unsigned int flags, CUdevice dev)
{
    if (numParams < 0 || (numParams > 0 && !paramsArray))
        return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SIM_API CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                        CUdevice dev)
{
    if (ctxCreateParams && ctxCreateParams->numExecAffinityParams < 0)
        return CUDA_ERROR_INVALID_VALUE;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SIM_API CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    ENTER_INIT();
    if (!ctx)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    bool created = false;
    for (struct CUctx_st *c = g_sim.ctxs; c; c = c->next)
        if (c == ctx && c->active)
            created = true;
    /* Primary contexts are released, never destroyed. */
    if (!created)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_CONTEXT);
    ctx_teardown_locked(ctx);
    if (t_depth > 0 && t_stack[t_depth - 1] == ctx)
        t_depth--;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

SIM_API CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    ENTER_INIT();
    if (ctx == NULL) {
        if (t_depth > 0)
            t_depth--;
        RETURN_UNLOCK(CUDA_SUCCESS);
    }
    if (!sim_ctx_valid_locked(ctx))
        RETURN_UNLOCK(ctx_known_locked(ctx) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT);
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    /* thread-local: no lock needed once initialised */
    if (pctx && __atomic_load_n(&g_sim.initialized, __ATOMIC_ACQUIRE)) {
        *pctx = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
        return CUDA_SUCCESS;
    }
    ENTER_INIT();
    if (!pctx)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    *pctx = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    ENTER_INIT();
    if (!ctx)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    if (!sim_ctx_valid_locked(ctx))
        RETURN_UNLOCK(ctx_known_locked(ctx) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT);
    if (t_depth >= SIM_CTX_STACK_MAX)
        RETURN_UNLOCK(CUDA_ERROR_OUT_OF_MEMORY);
    t_stack[t_depth++] = ctx;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

SIM_API CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    ENTER_INIT();
    if (t_depth == 0)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return cuCtxPopCurrent_v2(pctx); }

/* ctx == NULL means "the calling thread's current context". */
static CUresult resolve_ctx_locked(CUcontext ctx, CUcontext *out)
{
    if (!ctx)
        return sim_current_ctx_locked(out);
    if (!sim_ctx_valid_locked(ctx))
        return ctx_known_locked(ctx) ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
    *out = ctx;
    return CUDA_SUCCESS;
}

SIM_API CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    /* A real driver answers this from thread-local state without a global lock; so does
     * the simulator for the common case (the current context is a live primary context,
     * which is never freed), so that benchmarks do not measure a lock no GPU has. */
    if (!ctx && device && t_depth > 0 && __atomic_load_n(&g_sim.initialized, __ATOMIC_ACQUIRE)) {
        CUcontext c = t_stack[t_depth - 1];
        for (int d = 0; d < g_sim.ndev; d++)
            if (c == &g_sim.dev[d].primary && __atomic_load_n(&c->active, __ATOMIC_ACQUIRE)) {
                *device = c->dev;
                return CUDA_SUCCESS;
            }
    }
    ENTER_INIT();
    if (!device)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUcontext c;
    CUresult r = resolve_ctx_locked(ctx, &c);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) { return cuCtxGetDevice_v2(device, NULL); }

SIM_API CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags)
{
    ENTER_INIT();
    if (!flags)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUcontext c;
    CUresult r = sim_current_ctx_locked(&c);
    if (r == CUDA_SUCCESS)
        *flags = c->flags;
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    ENTER_INIT();
    if (!version)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    CUcontext c;
    CUresult r = resolve_ctx_locked(ctx, &c);
    if (r == CUDA_SUCCESS)
        *version = SIM_DRIVER_VERSION;
    RETURN_UNLOCK(r);
}

/* Synchronisation points are where pools give memory above their release
 * threshold back to the device. */
SIM_API CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    ENTER_INIT();
    CUcontext c;
    CUresult r = resolve_ctx_locked(ctx, &c);
    if (r == CUDA_SUCCESS)
        sim_pools_sync_locked(c->dev);
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuCtxSynchronize(void) { return cuCtxSynchronize_v2(NULL); }

/* ======================================================= streams, events */

CUresult sim_stream_device_locked(CUstream s, int *dev)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        CUcontext c;
        CUresult r = sim_current_ctx_locked(&c);
        if (r != CUDA_SUCCESS)
            return r;
        *dev = c->dev;
        return CUDA_SUCCESS;
    }
    sim_obj_t *o = obj_find_locked(g_sim.streams, s);
    if (!o)
        return CUDA_ERROR_INVALID_HANDLE;
    *dev = o->dev;
    return CUDA_SUCCESS;
}

static CUresult stream_create_locked(CUstream *ph, unsigned int flags)
{
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    sim_obj_t *o;
    CUresult r = obj_create_locked(&g_sim.streams, sizeof(struct CUstream_st), flags, &o);
    if (r == CUDA_SUCCESS)
        *ph = (CUstream)(void *)o;
    return r;
}

SIM_API CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    ENTER_INIT();
    RETURN_UNLOCK(stream_create_locked(phStream, Flags));
}

SIM_API CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    ENTER_INIT();
    RETURN_UNLOCK(stream_create_locked(phStream, flags));
}

SIM_API CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    ENTER_INIT();
    RETURN_UNLOCK(obj_destroy_locked(&g_sim.streams, hStream));
}

SIM_API CUresult CUDAAPI cuStreamDestroy(CUstream hStream) { return cuStreamDestroy_v2(hStream); }

SIM_API CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    ENTER_INIT();
    int dev;
    CUresult r = sim_stream_device_locked(hStream, &dev);
    if (r == CUDA_SUCCESS)
        sim_pools_sync_locked(dev);
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream) { return cuStreamSynchronize(hStream); }

SIM_API CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    ENTER_INIT();
    int dev;
    RETURN_UNLOCK(sim_stream_device_locked(hStream, &dev));
}

SIM_API CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream) { return cuStreamQuery(hStream); }

static sim_obj_t *find_event_locked(CUevent e) { return obj_find_locked(g_sim.events, e); }

SIM_API CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    ENTER_INIT();
    if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_obj_t *o;
    CUresult r = obj_create_locked(&g_sim.events, sizeof(struct CUevent_st), Flags, &o);
    if (r == CUDA_SUCCESS)
        *phEvent = (CUevent)(void *)o;
    RETURN_UNLOCK(r);
}

SIM_API CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    ENTER_INIT();
    int dev;
    if (!find_event_locked(hEvent))
        RETURN_UNLOCK(CUDA_ERROR_INVALID_HANDLE);
    RETURN_UNLOCK(sim_stream_device_locked(hStream, &dev));
}

SIM_API CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream) { return cuEventRecord(hEvent, hStream); }

SIM_API CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    ENTER_INIT();
    RETURN_UNLOCK(find_event_locked(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

SIM_API CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    ENTER_INIT();
    sim_obj_t *e = find_event_locked(hEvent);
    if (!e)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_HANDLE);
    sim_pools_sync_locked(e->dev);
    RETURN_UNLOCK(CUDA_SUCCESS);
}

SIM_API CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    ENTER_INIT();
    RETURN_UNLOCK(obj_destroy_locked(&g_sim.events, hEvent));
}

SIM_API CUresult CUDAAPI cuEventDestroy(CUevent hEvent) { return cuEventDestroy_v2(hEvent); }

/* ================================================================ errors */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} k_errors[] = {
    { CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
    { CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
    { CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
    { CUDA_ERROR_PROFILER_DISABLED, "CUDA_ERROR_PROFILER_DISABLED",
      "profiler disabled while using external profiling tool" },
    { CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library" },
    { CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER",
      "API call is not supported in the installed CUDA driver" },
    { CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
      "CUDA-capable device(s) is/are busy or unavailable" },
    { CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
    { CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid" },
    { CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
    { CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT", "context already current" },
    { CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed" },
    { CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed" },
    { CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
    { CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped" },
    { CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid" },
    { CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found" },
    { CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
      "OS call failed or operation not supported on this OS" },
    { CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
    { CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state" },
    { CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    { CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
    { CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered" },
    { CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
      "too many resources requested for launch" },
    { CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated" },
    { CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
      "peer access is already enabled" },
    { CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED", "peer access has not been enabled" },
    { CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
      "cannot set while device is active in this process" },
    { CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed" },
    { CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
    { CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
    { CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
    { CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY", "system not yet initialized" },
    { CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
      "system has unsupported display driver / cuda driver combination" },
    { CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "wait operation timed out" },
    { CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

SIM_API CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == error) {
            *pStr = k_errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; i++)
        if (k_errors[i].code == error) {
            *pStr = k_errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* Export tables are NVIDIA's private, undocumented interfaces; the simulator
 * does not implement them. */
SIM_API CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    if (ppExportTable)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ========================================================== graph memory */

SIM_API CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    ENTER_DEVICE(device, false);
    if (!value)
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    sim_dev_t *d = &g_sim.dev[device];
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = d->graph_reserved;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = d->graph_reserved_high;
        break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = 0;
        break; /* no graph running */
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = d->graph_reserved_high;
        break;
    default:
        RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);
    }
    RETURN_UNLOCK(CUDA_SUCCESS);
}

/* Returns the graph pool's unused memory (all of it: no graph runs) to the device. */
SIM_API CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device)
{
    ENTER_DEVICE(device, false);
    sim_dev_t *d = &g_sim.dev[device];
    if (d->graph_reserved)
        sim_uncharge_locked(device, d->graph_reserved);
    d->graph_reserved = 0;
    RETURN_UNLOCK(CUDA_SUCCESS);
}
