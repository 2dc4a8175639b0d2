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

#define OOMGUARD_VERSION     "0.1.0"
#define OOMGUARD_DUMP_SCHEMA "oomguard.dump/1"

/* What the ledger holds for one device, in bytes, as the shim counted it. */
typedef struct oomguard_device_stats {
    uint64_t plain_bytes, plain_blocks;       /* cuMemAlloc/cuMemAllocPitch (cudaMalloc...) */
    uint64_t managed_bytes, managed_blocks;   /* cuMemAllocManaged */
    uint64_t pool_used_bytes, pool_blocks;    /* handed out by stream-ordered pools */
    uint64_t pool_reserved_bytes;             /* device memory the pools hold */
    uint64_t vmm_physical_bytes, vmm_handles; /* cuMemCreate'd physical memory alive */
    uint64_t vmm_mapped_bytes;                /* of it, mapped into address ranges */
    uint64_t tracked_bytes;                   /* plain + managed + pool_reserved + vmm_physical */
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
    int64_t device;           /* CUDA ordinal the numbers are for */
    uint64_t allocated_bytes; /* in live tensors */
    uint64_t reserved_bytes;  /* held from the driver */
    uint64_t active_bytes;
    uint64_t inactive_split_bytes;     /* free pieces of split blocks */
    uint64_t largest_free_block_bytes; /* largest free block inside the cache */
    uint64_t private_pool_bytes;       /* e.g. CUDA graph pools */
    uint64_t num_alloc_retries, num_ooms;
    const char *allocator_settings; /* e.g. PYTORCH_CUDA_ALLOC_CONF as seen by the framework */
    const char *source;             /* e.g. "torch 2.11" */
    /* added later (read only when struct_size covers it): a JSON file holding the framework's
     * own allocator snapshot (PyTorch: torch.cuda.memory._snapshot()), recorded in the dump as
     * memory.framework.snapshot_file and used by `oomguard report --format memory-viz` */
    const char *snapshot_path;
    /* added with the JAX/CuPy adapters (read only when struct_size covers them; NULL/0 = unknown) */
    const char *framework;    /* "pytorch" | "jax" | "tensorflow" | "cupy" */
    const char *api;          /* the framework's allocator: "torch.cuda.caching_allocator", ... */
    uint64_t requested_bytes; /* the request the framework failed (0 without OOMGUARD_FW_REQUEST_KNOWN: not given) */
    uint64_t cap_bytes;       /* a cap the framework imposes on itself (memory fraction, set_limit) */
    const char *cap_source;   /* the setting behind it: "torch.cuda.set_per_process_memory_fraction(0.5)" */
    uint64_t peak_bytes;      /* the framework's peak, jax peak_bytes_in_use (0 without OOMGUARD_FW_PEAK_KNOWN: none) */
    int32_t grad_enabled;     /* 1 autograd on at the failure, -1 off, 0 unknown */
    int32_t training;         /* 1 training seen (PyTorch: an optimizer step ran), -1 inference/eval only, 0 unknown */
    const char *python_stack; /* "file\tline\tfunction\n" per frame, innermost first */
    const char *python_sites; /* "file\tline\tfunction\tbytes\tblocks\n", most live bytes first */
    const char *unmeasured_why; /* why something the adapter should know is missing */
    uint64_t flags;             /* OOMGUARD_FW_* */
    /* added later (read only when struct_size covers it) */
    int32_t autocast; /* 1 on at the failure, -1 off, 0 unknown */
    /* added later (read only when struct_size covers it and flags has OOMGUARD_FW_FREED_KNOWN:
     * 0 is a real answer here, so a zeroed field must not pass for it) */
    uint64_t freed_bytes_total; /* bytes the framework's allocator freed over the process's life */
    /* added later (read only when struct_size covers them; NULL = not measured): what the memory is
     * for and what the job was doing (memory.framework.roles, event.phase; docs/dump-format.md) */
    const char *roles;        /* "role\tNAME\tBYTES|-\tTENSORS\n", "optimizer\t...", "holder\t...", "meta\t..." */
    const char *phase;        /* "loading" | "forward" | "backward" | "optimizer_step" | ... */
    const char *phase_frame;  /* "file\tline\tfunction\n": the frame that decided the phase; a second such
                               * line (read by later shims): the program's own line at or outside it */
    const char *phase_source; /* how the phase was told ("stack", ...), or why it is unknown */
    /* added later (read only when struct_size covers it; NULL = not read): the other frameworks of this
     * process and what each holds on the same device, as their own adapters read it (JAX's arena next to
     * PyTorch): "framework\treserved_bytes\tin_use_bytes|-\tlimit_bytes|-\n" per framework */
    const char *other_frameworks;
} oomguard_framework_stats_t;

/* flags: the byte counts above were not filled (only the Python lines, e.g. from a query):
 * the shim keeps the numbers it had. */
#define OOMGUARD_FW_NO_NUMBERS 1u
/* freed_bytes_total was measured (PyTorch: memory_stats()["allocated_bytes.all.freed"]) */
#define OOMGUARD_FW_FREED_KNOWN 2u
/* requested_bytes / peak_bytes were given, 0 included (a zero-size request is a size).  Without the
 * flag a 0 there means "not given", as it did before these flags: older adapters keep working. */
#define OOMGUARD_FW_REQUEST_KNOWN 4u
#define OOMGUARD_FW_PEAK_KNOWN    8u
/* reserved_bytes is only what the framework could tell (at least allocated_bytes): it does not publish
 * what it holds from the driver (TensorFlow's BFC arena).  The shim counts the blocks its ledger holds
 * for this framework's libraries on the device instead; when it holds none, the framework's cache is
 * unknown (memory.unmeasured), never reserved - allocated. */
#define OOMGUARD_FW_RESERVED_BY_LEDGER 16u

/* Returns 0, or -1 for a NULL struct or one older than the first release of this struct. Safe from any thread, at any time.
 * Called while a failure on that device is still open (an adapter's out-of-memory hook),
 * the failure's dump is rewritten with the framework's numbers. */
int oomguard_framework_report(const oomguard_framework_stats_t *stats);

/* The framework failed a request: an adapter's out-of-memory observer or exception hook calls
 * this with requested_bytes (and cap_bytes/cap_source when the framework capped itself).
 * If a driver call on that device failed just before (within OOMGUARD_RETRY_WINDOW_MS and
 * still unrecovered), that failure's dump is rewritten with these numbers, as by
 * oomguard_framework_report().  Otherwise the failure happened inside the framework's own
 * allocator (PyTorch's memory fraction, the XLA arena, CuPy's pool limit): the shim writes a
 * full dump for it, status "oom", event.api = `api`.  Returns 0, or -1 as above. */
int oomguard_framework_oom(const oomguard_framework_stats_t *stats);

/* Being asked at the failure.  An adapter may register one query; the shim calls it from a
 * failing driver allocation, on the failing thread, before it writes the dump, and copies
 * what the query put into *out (strings must stay valid until the query returns).
 *
 * The failing thread may hold the framework's allocator lock (PyTorch's caching allocator
 * calls cudaMalloc under it), so a query that took a lock, or the Python GIL, could deadlock
 * against a thread that holds that lock and waits for the allocator.  Hence the rules:
 *   - a query never takes a lock and never calls the framework's allocator or CUDA;
 *   - with OOMGUARD_QUERY_NEEDS_GIL (every Python query) it is called only when the failing
 *     thread already holds the GIL (its attached thread state is the interpreter's current
 *     one), never to acquire it; Python's cyclic GC is paused around it, so no finalizer
 *     runs inside the failing call;
 *   - it is not called again from inside itself, nor while the shim writes a dump.
 * When it is skipped the dump says why in memory.unmeasured.  Returns 0; fn NULL removes it. */
typedef int (*oomguard_query_fn)(void *ctx, int device, oomguard_framework_stats_t *out);
#define OOMGUARD_QUERY_NEEDS_GIL 1u
/* Set in out->flags when the shim asks for the framework's numbers rather than the failing
 * line (`oomguard snapshot`): such a call is made by the interpreter itself, as a pending call
 * (Py_AddPendingCall) on its main thread between two bytecodes, GIL held, never inside an
 * allocation, so the query may call the framework; it hands the numbers over with
 * oomguard_framework_report() and returns 0 (-1: nothing reported).  Numbers reported there
 * serve the snapshot: an open failure's dump is not rewritten with them. */
#define OOMGUARD_QUERY_REFRESH 4u
int oomguard_framework_set_query(oomguard_query_fn fn, void *ctx, unsigned flags);

/* Library version string, e.g. "0.1.0". */
const char *oomguard_version(void);

#ifdef __cplusplus
}
#endif
#endif
