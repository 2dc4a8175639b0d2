/*
 * simgpu.h — ground-truth interface of the simulated GPU (test-only).
 *
 * The simulated driver (build/sim/libcuda.so.1) keeps exact books on every
 * byte it hands out.  Tests compare what oomguard reports against these
 * numbers.  Nothing in the product (the shim, the tool) may use this header:
 * on a real machine libcuda.so.1 has no such symbol.
 *
 * Usage from a test linked against libcuda.so.1 (or after dlopen of it):
 *
 *     simgpu_truth_t t;
 *     if (simgpu_truth(0, &t) == 0)
 *         printf("device 0 free %llu\n", t.free_bytes);
 *
 * All counters are per device.  "Live" means allocated and not yet freed.
 */
#ifndef SIMGPU_H
#define SIMGPU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct simgpu_truth {
    unsigned long long total_bytes, free_bytes; /* what cuMemGetInfo would say for that device */
    unsigned long long context_bytes;           /* context overheads charged now */
    unsigned long long alloc_requested_bytes, alloc_charged_bytes, alloc_blocks; /* cuMemAlloc/Pitch/Managed live */
    unsigned long long managed_requested_bytes;         /* subset of the above from cuMemAllocManaged */
    unsigned long long vmm_physical_bytes, vmm_handles; /* live physical (created, not yet freed) */
    unsigned long long pool_reserved_bytes, pool_used_bytes, pool_blocks; /* all pools of that device;
                                                            used = requested bytes of live blocks */
    unsigned long long other_process_bytes;                   /* SIMGPU_OTHER_PROCS + live peers in SIMGPU_STATE_DIR */
    unsigned long long used_bytes, peak_used_bytes;           /* this process: context+charged+vmm+pool reserved */
    unsigned long long host_pinned_bytes, host_pinned_blocks; /* process-wide, reported with dev 0 */
    unsigned long long failed_allocs,
        injected_failures; /* allocation calls that returned OUT_OF_MEMORY / of which injected */
    /* Appended after the original layout (keep it last): */
    unsigned long long contexts;                       /* live contexts on the device (primary counts once) */
    unsigned long long ipc_mapped_bytes, ipc_mappings; /* other processes' memory opened with cuIpcOpenMemHandle */
    unsigned long long graph_reserved_bytes;           /* the device's graph memory (SIMGPU_GRAPH_MEM), charged */
    unsigned long long peak_rounding_bytes; /* at peak_used_bytes: what plain allocations were charged beyond their
                                               requests (rounding to the granule); the peak in requested bytes is
                                               peak_used_bytes - context_bytes at that time - this */
    unsigned long long alloc_threads;       /* threads that made a plain allocation on the device, over the run (an
                                         interposer batching small ones per thread sees the peak within its batch
                                         per other thread) */
} simgpu_truth_t;

/* Fill *out with the current truth of `device`.  Returns 0, or -1 when the
 * device ordinal is out of range or out is NULL.  Works before cuInit (the
 * configuration is read on first use) and never changes any state. */
int simgpu_truth(int device, simgpu_truth_t *out);

/* Number of simulated devices (SIMGPU_DEVICES), available before cuInit. */
int simgpu_device_count(void);

#ifdef __cplusplus
}
#endif

#endif /* SIMGPU_H */
