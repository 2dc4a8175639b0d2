/*
 * driver_internal.h — state shared by the files of the simulated driver
 * (driver.c, driver_mem.c, driver_proc.c).  Never installed, never included by
 * tests; every non-API symbol is hidden.
 *
 * Concurrency model: one process-wide mutex (g_sim.lock) guards everything
 * below.  Each exported entry point takes it once on entry; helpers named
 * *_locked expect it held.  The simulator never calls user code, so nothing
 * is ever invoked with the lock held except libc.
 */
#ifndef SIM_DRIVER_INTERNAL_H
#define SIM_DRIVER_INTERNAL_H

/* Ask cuda.h for every ABI variant (cuMemAlloc, cuMemAlloc_v2, *_ptsz, ...)
 * under its exported name, with the base-name -> _v2 macros disabled.  This
 * lets the compiler check each definition against NVIDIA's declaration. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "sim_config.h"
#include "simgpu.h"

#define SIM_API            __attribute__((visibility("default")))
#define OG_SIM_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define SIM_DRIVER_VERSION 13000
#define SIM_CTX_STACK_MAX  64
#define SIM_SM_COUNT       132
#define SIM_ALLOC_ALIGN    512ULL            /* plain and pool block address alignment */
#define SIM_POOL_CHUNK_MIN (32ULL * SIM_MIB) /* smallest chunk a pool reserves */
#define SIM_PAGE           4096ULL

/* Fake device virtual address layout (never dereferenced, never mmap'd):
 *   device d : [SIM_VA_DEV_BASE + d * SIM_VA_DEV_SPAN, +SIM_VA_DEV_SPAN)
 *   VMM      : [SIM_VA_VMM_BASE, SIM_VA_VMM_END)  (cuMemAddressReserve)
 * Chosen below the region where Linux places mmap()s and above ASan's heap,
 * so fake ranges do not collide with real host pointers in practice; the
 * allocator still checks every candidate against all known ranges. */
#define SIM_VA_DEV_BASE 0x700000000000ULL
#define SIM_VA_DEV_SPAN (1ULL << 39) /* 512 GiB per device */
#define SIM_VA_VMM_BASE 0x680000000000ULL
#define SIM_VA_VMM_END  0x700000000000ULL

static inline uint64_t sim_align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* ---------------------------------------------------------------- handles */

#define SIM_CTX_MAGIC 0x43545821u

struct CUctx_st {
    uint32_t magic;
    int dev;
    bool primary;
    bool active; /* primary: retained and not reset; created: until destroyed */
    unsigned int flags;
    uint64_t id;
    struct CUctx_st *next; /* registry of created contexts (destroyed ones stay, inactive) */
};

/* All the simulator knows of a stream or an event: where it was created.
 * Each kind lives in its own list of these (g_sim.streams, g_sim.events);
 * the handle points at its first member. */
typedef struct sim_obj {
    int dev;
    CUcontext ctx;
    unsigned int flags;
    struct sim_obj *next;
} sim_obj_t;

struct CUstream_st {
    sim_obj_t obj;
};

struct CUevent_st {
    sim_obj_t obj;
};

typedef struct sim_free_range {
    uint64_t off, len;
    struct sim_free_range *next; /* sorted by offset, coalesced */
} sim_free_range_t;

/* Every range that occupies fake device VA (or, for managed memory, a real
 * mmap) starts with this header so one range-compare works for all trees. */
typedef enum { VA_PLAIN = 1, VA_MANAGED, VA_CHUNK, VA_RESERVE, VA_IPC } sim_va_kind_t;

typedef struct sim_range {
    uint64_t base, size;
} sim_range_t;

typedef struct sim_va {
    sim_range_t r;
    sim_va_kind_t kind;
} sim_va_t;

typedef struct sim_chunk {
    sim_va_t va; /* kind VA_CHUNK */
    struct CUmemPoolHandle_st *pool;
    sim_free_range_t *free;
    uint64_t used; /* rounded bytes of live blocks in this chunk */
    struct sim_chunk *next;
} sim_chunk_t;

struct CUmemPoolHandle_st {
    int dev;
    bool is_default;
    bool destroyed; /* destroyed with blocks outstanding */
    uint64_t release_threshold;
    int reuse[3];                     /* REUSE_* attributes (stored, no effect) */
    uint64_t max_size;                /* 0 = unlimited */
    uint64_t reserved, reserved_high; /* whole chunks */
    uint64_t used, used_high, blocks; /* requested bytes / count of live blocks */
    sim_chunk_t *chunks;              /* newest first */
    CUmemPoolProps props;
    struct CUmemPoolHandle_st *next;
};

/* --------------------------------------------------------------- memory */

typedef struct sim_alloc { /* cuMemAlloc / cuMemAllocPitch / cuMemAllocManaged */
    sim_va_t va;           /* kind VA_PLAIN or VA_MANAGED */
    int dev;
    uint64_t requested, charged;
    uint64_t map_len; /* managed: length of the real mmap backing it */
    CUcontext ctx;
    uint64_t buffer_id;
    struct sim_alloc *prev, *next;
} sim_alloc_t;

typedef struct sim_block { /* a pool sub-allocation */
    sim_range_t r;         /* size rounded to SIM_ALLOC_ALIGN */
    uint64_t requested;
    sim_chunk_t *chunk;
    uint64_t buffer_id;
} sim_block_t;

typedef struct sim_phys { /* cuMemCreate physical allocation */
    uint64_t handle;
    int dev;
    uint64_t size;
    CUmemAllocationProp prop;
    int refs; /* create + retain - release */
    int mappings;
    uint64_t buffer_id;
} sim_phys_t;

typedef struct sim_reserve { /* cuMemAddressReserve */
    sim_va_t va;             /* kind VA_RESERVE */
    uint64_t mappings;
} sim_reserve_t;

typedef struct sim_mapping { /* cuMemMap */
    sim_range_t r;
    sim_phys_t *phys;
    sim_reserve_t *res;
} sim_mapping_t;

typedef struct sim_host { /* cuMemHostAlloc / cuMemAllocHost: real memory */
    sim_range_t r;
    void *mem;
    unsigned int flags;
    CUcontext ctx;
    int dev;
    uint64_t buffer_id;
} sim_host_t;

/* ---------------------------------------------------------------- state */

typedef struct sim_dev {
    uint64_t total;
    uint64_t other_cfg; /* SIMGPU_OTHER_PROCS on this device */
    uint64_t context_bytes, contexts;
    uint64_t alloc_requested, alloc_charged, alloc_blocks, managed_requested;
    uint64_t vmm_physical, vmm_handles;
    uint64_t pool_reserved, pool_used, pool_blocks;
    uint64_t used, peak_used;
    uint64_t peak_rounding; /* alloc_charged - alloc_requested when used reached peak_used */
    uint64_t alloc_threads; /* threads that made a plain allocation here, over the run */
    uint64_t failed_allocs, injected;
    uint64_t ipc_mapped, ipc_mappings;            /* another process's memory opened here (not charged) */
    uint64_t graph_reserved, graph_reserved_high; /* the device's graph memory pool */

    struct CUctx_st primary; /* stable handle for the primary context */
    int primary_refs;
    int primary_reset_debt; /* releases still tolerated after a reset */
    unsigned int primary_flags;

    struct CUmemPoolHandle_st *default_pool, *current_pool;
    uint64_t va_cursor;
} sim_dev_t;

#define SIM_N_ALLOC_FNS 8

typedef struct sim_state {
    int lock;         /* spin lock: see sim_lock() */
    bool loaded;      /* configuration read */
    bool initialized; /* cuInit succeeded */
    bool forked_child;
    sim_config_t cfg;
    int ndev;
    sim_dev_t dev[SIM_MAX_DEVICES];

    void *va_tree;       /* sim_va_t*: plain, managed, chunks, reservations */
    void *block_tree;    /* sim_block_t* */
    void *map_tree;      /* sim_mapping_t* */
    void *phys_tree;     /* sim_phys_t* keyed by handle */
    void *host_tree;     /* sim_host_t* */
    sim_alloc_t *allocs; /* list of plain/managed for context sweeps */

    struct CUctx_st *ctxs; /* created contexts (live and destroyed) */
    sim_obj_t *streams;    /* struct CUstream_st */
    sim_obj_t *events;     /* struct CUevent_st */
    struct CUmemPoolHandle_st *pools;

    uint64_t vmm_cursor;
    uint64_t host_pinned_bytes, host_pinned_blocks;
    uint64_t next_handle, next_buffer_id, next_ctx_id;

    bool pool_attrs_unreadable;          /* SIMGPU_POOL_ATTRS=unreadable */
    uint64_t graph_mem[SIM_MAX_DEVICES]; /* SIMGPU_GRAPH_MEM: graph memory held from cuInit */
    bool torn_down;                      /* the library's destructor ran: later calls are a bug */
    bool torn_down_reported;
    bool exit_registered; /* the exit teardown is registered once per process */

    uint64_t fn_calls[SIM_N_ALLOC_FNS];
    uint64_t any_calls;
    uint64_t prng;
} sim_state_t;

extern SIM_HIDDEN sim_state_t g_sim;

/* Lock the state, reading the configuration on first use. */
SIM_HIDDEN void sim_lock(void);
SIM_HIDDEN void sim_unlock(void);

/* Entry preamble of calls that need cuInit: lock, check, and (on failure)
 * unlock and return CUDA_ERROR_NOT_INITIALIZED.  RETURN_UNLOCK ends such a
 * call. */
#define ENTER_INIT()                                                                               \
    do {                                                                                           \
        sim_lock();                                                                                \
        if (!g_sim.initialized || g_sim.torn_down) {                                               \
            CUresult e_ = g_sim.torn_down ? CUDA_ERROR_DEINITIALIZED : CUDA_ERROR_NOT_INITIALIZED; \
            sim_unlock();                                                                          \
            return e_;                                                                             \
        }                                                                                          \
    } while (0)

#define RETURN_UNLOCK(rv)    \
    do {                     \
        CUresult rv_ = (rv); \
        sim_unlock();        \
        return rv_;          \
    } while (0)

/* ENTER_INIT for calls about one device, then their argument checks in the
 * driver's order: CUDA_ERROR_INVALID_VALUE when `invalid` (bad pointers or
 * values) before CUDA_ERROR_INVALID_DEVICE for a bad ordinal. */
#define ENTER_DEVICE(dev, invalid)                    \
    do {                                              \
        ENTER_INIT();                                 \
        if (invalid)                                  \
            RETURN_UNLOCK(CUDA_ERROR_INVALID_VALUE);  \
        if (sim_check_device(dev) != CUDA_SUCCESS)    \
            RETURN_UNLOCK(CUDA_ERROR_INVALID_DEVICE); \
    } while (0)

/* Current context of the calling thread, validated.  Returns CUDA_SUCCESS,
 * CUDA_ERROR_INVALID_CONTEXT (none) or CUDA_ERROR_CONTEXT_IS_DESTROYED. */
SIM_HIDDEN CUresult sim_current_ctx_locked(CUcontext *out);
SIM_HIDDEN bool sim_ctx_valid_locked(CUcontext ctx);
SIM_HIDDEN CUresult sim_check_device(CUdevice dev);

/* Device memory accounting. */
SIM_HIDDEN bool sim_charge_locked(int dev, uint64_t bytes);
SIM_HIDDEN void sim_uncharge_locked(int dev, uint64_t bytes);
SIM_HIDDEN void sim_publish_locked(int dev);
SIM_HIDDEN uint64_t sim_free_bytes_locked(int dev);
SIM_HIDDEN uint64_t sim_other_bytes_locked(int dev);

/* Fault injection: called once per allocating call that passed validation.
 * Returns true when the call must fail with CUDA_ERROR_OUT_OF_MEMORY (and
 * counts it on `dev`). */
SIM_HIDDEN bool sim_inject_locked(const char *canon_fn, int dev);
SIM_HIDDEN void sim_count_oom_locked(int dev);

/* Streams and events (driver.c) for the memory code. */
SIM_HIDDEN CUresult sim_stream_device_locked(CUstream s, int *dev);

/* Memory subsystem hooks (driver_mem.c). */
SIM_HIDDEN int sim_range_cmp(const void *a, const void *b);
SIM_HIDDEN void sim_mem_init_device_locked(int dev);
SIM_HIDDEN void sim_mem_free_ctx_allocs_locked(CUcontext ctx);
SIM_HIDDEN void sim_pools_sync_locked(int dev);
SIM_HIDDEN void sim_mem_reset_all_locked(void);

/* cuGetProcAddress table (driver_proc.c). */
SIM_HIDDEN CUresult sim_proc_lookup(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);

#endif /* SIM_DRIVER_INTERNAL_H */
