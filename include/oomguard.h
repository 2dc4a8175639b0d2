/* oomguard — the public interface of liboomguard.so.
 *
 * Most users never include this: they preload the library (LD_PRELOAD=liboomguard.so or
 * `oomguard run`) and read its dumps.  These functions are for programs and framework
 * adapters that want to ask the recorder directly; look them up with
 * dlsym(RTLD_DEFAULT, "oomguard_...") so that a program still runs without the shim.
 */
#ifndef OOMGUARD_H
#define OOMGUARD_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OOMGUARD_VERSION "0.1.0"
#define OOMGUARD_DUMP_SCHEMA "oomguard.dump/1"

/* What the ledger holds for one device, in bytes, as the shim counted it. */
typedef struct oomguard_device_stats {
    uint64_t plain_bytes, plain_blocks;          /* cuMemAlloc/cuMemAllocPitch (cudaMalloc...) */
    uint64_t managed_bytes, managed_blocks;      /* cuMemAllocManaged */
    uint64_t pool_used_bytes, pool_blocks;       /* handed out by stream-ordered pools */
    uint64_t pool_reserved_bytes;                /* device memory the pools hold */
    uint64_t vmm_physical_bytes, vmm_handles;    /* cuMemCreate'd physical memory alive */
    uint64_t vmm_mapped_bytes;                   /* of it, mapped into address ranges */
    uint64_t tracked_bytes;                      /* plain + managed + pool_reserved + vmm_physical */
    uint64_t peak_tracked_bytes;
    uint64_t host_pinned_bytes, host_pinned_blocks; /* process-wide; reported for device 0 only */
    uint64_t allocs, frees, failures, unknown_frees;
} oomguard_device_stats_t;

/* Fills *out for `device`; returns 0, or -1 for a device index out of range. */
int oomguard_device_stats(int device, oomguard_device_stats_t *out);

/* A framework's own view of its allocator, handed in by an adapter (see adapters/).
 * Set struct_size = sizeof(oomguard_framework_stats_t); strings are copied. */
typedef struct oomguard_framework_stats {
    uint64_t struct_size;
    int64_t device;                      /* CUDA ordinal the numbers are for */
    uint64_t allocated_bytes;            /* in live tensors */
    uint64_t reserved_bytes;             /* held from the driver */
    uint64_t active_bytes;
    uint64_t inactive_split_bytes;       /* free pieces of split blocks */
    uint64_t largest_free_block_bytes;   /* largest free block inside the cache */
    uint64_t private_pool_bytes;         /* e.g. CUDA graph pools */
    uint64_t num_alloc_retries, num_ooms;
    const char *allocator_settings;      /* e.g. PYTORCH_CUDA_ALLOC_CONF as seen by the framework */
    const char *source;                  /* e.g. "torch 2.11" */
    /* added later (read only when struct_size covers it): a JSON file holding the framework's
     * own allocator snapshot (PyTorch: torch.cuda.memory._snapshot()), recorded in the dump as
     * memory.framework.snapshot_file and used by `oomguard report --format memory-viz` */
    const char *snapshot_path;
} oomguard_framework_stats_t;

/* Returns 0, or -1 for a NULL struct or one older than the first release of this struct. Safe from any thread, at any time.
 * Called while a failure on that device is still open (an adapter's out-of-memory hook),
 * the failure's dump is rewritten with the framework's numbers. */
int oomguard_framework_report(const oomguard_framework_stats_t *stats);

/* Library version string, e.g. "0.1.0". */
const char *oomguard_version(void);

#ifdef __cplusplus
}
#endif
#endif
