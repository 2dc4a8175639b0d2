/* Internal header of liboomguard.so.  Internal names use the og_ prefix and are hidden;
 * the public surface is include/oomguard.h plus the interposed CUDA/dlsym symbols.
 * Declarations are grouped by the file that defines them, from the call guard every hook
 * passes through to the dump written at the end. */
#ifndef OG_H
#define OG_H

#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "oomguard.h"

/* What is declared below is the library's own, hidden unless marked OG_EXPORT: the compiler
 * then reaches the shared variables directly instead of through the GOT (the hot path reads
 * several). */
#pragma GCC visibility push(hidden)

/* cuda.h maps base names onto their newest ABI; the shim names exact ABIs itself. */
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxRelease
#undef cuCtxDestroy
#undef cuCtxCreate
#undef cuIpcOpenMemHandle

#define OG_EXPORT __attribute__((visibility("default")))
#define OG_TLS    __thread __attribute__((tls_model("initial-exec")))
/* Code reachable from dlsym may run inside a sanitizer's own start-up (which looks up the
 * functions it intercepts with dlsym) before the sanitizer can check anything. */
#define OG_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
#define OG_LIKELY(x)   __builtin_expect(!!(x), 1)
#define OG_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define OG_MAX_DEVICES 64
#define OG_MAX_FRAMES  64
#define OG_SAMPLES     512

/* ---------------------------------------------------------------- call guard (init.c) */

typedef struct og_call {
    int hook;
    int device; /* -1 until known */
    void *caller;
    bool active; /* false when re-entered from inside the shim */
} og_call_t;

extern OG_TLS int og_in_shim;
extern atomic_int og_ready;
extern atomic_int og_exiting; /* set at exit: no driver or NVML call from now on */
void og_exit_arm(void);       /* registers the exit summary (once; from a hook, not a constructor) */
/* Runs fn(arg) on the failure path's own stack (mapped at start-up), so that a thread with a
 * small stack can fail an allocation: the caller's stack holds only the switch. */
void og_on_alt_stack(void (*fn)(void *), void *arg);
void og_init_slow(void);

/* A hook reached from inside the shim (e.g. while writing a dump) passes through. */
static inline void og_guard_enter(og_call_t *c)
{
    c->active = (og_in_shim == 0);
    og_in_shim++;
}
static inline void og_enter(og_call_t *c, int hook, void *caller)
{
    c->hook = hook;
    c->device = -1;
    c->caller = caller;
    if (OG_UNLIKELY(!atomic_load_explicit(&og_ready, memory_order_acquire)))
        og_init_slow();
    og_guard_enter(c);
}
static inline void og_leave(og_call_t *c) { og_in_shim--; }

/* ---------------------------------------------------------------- hooks (hooks.def; intercept.c) */

enum og_lib { OG_LIB_CUDA, OG_LIB_NVML };

enum og_hook_id {
#define OG_HOOK(ret, name, base, since, ptsz, lib, rt, params, args) OG_H_##name,
#include "hooks.def"
#undef OG_HOOK
    OG_H_COUNT
};

/* The wrappers: hooks_driver.c, nvml.c (NVML) and intercept.c (cuGetProcAddress). */
#define OG_HOOK(ret, name, base, since, ptsz, lib, rt, params, args) \
    typedef ret(*og_fn_##name) params;                               \
    OG_EXPORT ret name params;
#include "hooks.def"
#undef OG_HOOK

typedef struct og_hook {
    const char *name; /* exact ABI symbol */
    const char *base; /* name cuGetProcAddress answers (driver hooks only) */
    int since;        /* first cudaVersion answering base with this ABI */
    int ptsz;         /* per-thread default stream variant */
    int lib;          /* enum og_lib */
    void *wrapper;    /* our function */
    const char *rt;   /* runtime API reaching it, "0" when none */
} og_hook_t;

extern const og_hook_t og_hooks[OG_H_COUNT];
extern _Atomic(void *) og_real_ptrs[OG_H_COUNT];

void *og_resolve_real(int id);
/* Real function behind hook `name`; resolved once, then a plain load. */
#define OG_REAL(name)                                                                      \
    ((og_fn_##name)(atomic_load_explicit(&og_real_ptrs[OG_H_##name], memory_order_acquire) \
                        ?: og_resolve_real(OG_H_##name)))

int og_hook_find(const char *name); /* -1 when not hooked */
void *og_proc_wrapper(const char *base, int version, uint64_t flags, void *real);
void *og_dlsym_real(void *handle, const char *name); /* glibc's dlsym */

/* ---------------------------------------------------------------- calls (calls.def; intercept.c) */

/* Driver and NVML functions the shim calls itself (calls.def): resolved once at a door,
 * then read with OG_CALL(name) — NULL when absent.  Never looked up inside an allocation. */
enum og_call_id {
#define OG_CALLFN(ret, name, lib, params) OG_C_##name,
#include "calls.def"
#undef OG_CALLFN
    OG_C_COUNT
};
#define OG_CALLFN(ret, name, lib, params) typedef ret(*og_cfn_##name) params;
#include "calls.def"
#undef OG_CALLFN
extern _Atomic(void *) og_call_ptrs[OG_C_COUNT];
#define OG_CALL(name) ((og_cfn_##name)atomic_load_explicit(&og_call_ptrs[OG_C_##name], memory_order_acquire))
/* Fill the table (and the hooks' real pointers) from the driver's handle, or from the
 * global scope when handle is NULL; then open NVML.  Idempotent and cheap once done. */
void og_calls_resolve(void *cuda_handle);

/* ---------------------------------------------------------------- options and logging (options.c) */

typedef enum { OG_OPT_BOOL, OG_OPT_INT, OG_OPT_PERCENT, OG_OPT_STRING } og_opt_type;

#include "options.def"

enum og_opt_id {
#define X(id, env, type, def, lo, hi, help) OG_OPT_##id,
    OG_OPTIONS(X)
#undef X
        OG_OPT_COUNT
};

/* Numbers are long long; a string option `id` is the buffer og_opt.id_s (max = its size). */
#define OG_OPT_FIELD_BOOL(id, hi)    long long id;
#define OG_OPT_FIELD_INT(id, hi)     long long id;
#define OG_OPT_FIELD_PERCENT(id, hi) long long id;
#define OG_OPT_FIELD_STRING(id, hi)  char id##_s[hi];
typedef struct og_options {
#define X(id, env, type, def, lo, hi, help) OG_OPT_FIELD_##type(id, hi)
    OG_OPTIONS(X)
#undef X
} og_options_t;

extern og_options_t og_opt;
void og_options_init(void);
void og_options_print(void);
const char *og_option_env(int id); /* "OOMGUARD_..." */
const char *og_option_default(int id);
bool og_option_valid(int id, const char *value);  /* would this value be taken? */
long long og_parse_size(const char *s, bool *ok); /* "24GiB", "24000MB", "123" */

void og_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void og_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- ledger (ledger.c) */

/* For the ledger's shards: each is mostly used by one thread, critical sections are a few
 * dozen instructions, and an uncontended pthread mutex costs several times that. */
typedef struct {
    atomic_int v;
} og_spin_t;
void og_spin_lock_slow(og_spin_t *l);
static inline void og_spin_lock(og_spin_t *l)
{
    if (__builtin_expect(!atomic_exchange_explicit(&l->v, 1, memory_order_acquire), 1))
        return;
    og_spin_lock_slow(l);
}
static inline void og_spin_unlock(og_spin_t *l) { atomic_store_explicit(&l->v, 0, memory_order_release); }

uint64_t og_now_ns(void); /* CLOCK_MONOTONIC */
uint64_t og_start_ns(void);

enum og_kind { OG_KIND_PLAIN, OG_KIND_MANAGED, OG_KIND_POOL, OG_KIND_HOST, OG_KIND_VMM, OG_KIND_COUNT };
/* og_track_alloc kind flag: a pool block counted as device memory itself (its pool's
 * reservation cannot be read) */
#define OG_KIND_F_COUNTED 0x80
#define OG_KIND_F_ARRAY   0x40 /* a CUDA array: the key is its handle, not a device address */
#define OG_KIND_F_IPC     0x20 /* another process's memory opened here: mapped, not allocated */
#define OG_KIND_F_MASK    0xE0

void og_ledger_init(void);
int og_current_device(void);
int og_pointer_device(uintptr_t addr); /* device ordinal of a device pointer, -1 */
CUmemoryPool og_device_current_pool(int device);
void og_track_alloc(og_call_t *c, uintptr_t addr, uint64_t size, int kind);
void og_track_plain(og_call_t *c, uintptr_t addr, uint64_t size, int kind); /* OG_KIND_PLAIN or _MANAGED, no flag */
typedef struct og_taken {
    bool found;
    bool settle;               /* a successful free still has something to do after the real call (og_free_end) */
    uint64_t addr, size, t_ns; /* from addr on: the ledger's block, as it was (one copy) */
    uint32_t site;
    int8_t device;
    uint8_t kind, hook, flags;
} og_taken_t;
/* Frees: take the block out before the real free, settle after it (see ledger.c). */
void og_free_begin(og_call_t *c, uintptr_t addr, og_taken_t *tk);
void og_free_end_slow(og_call_t *c, og_taken_t *tk, CUresult r); /* og_free_end (oom section) */
void og_track_limit_refusal(og_call_t *c, uint64_t size, int kind);
void og_track_context_reset(og_call_t *c, int device);
void og_track_failure(og_call_t *c, uint64_t size, int kind, CUresult r);
void og_track_vmm_create(og_call_t *c, CUmemGenericAllocationHandle h, uint64_t size, int device);
void og_track_vmm_release(og_call_t *c, CUmemGenericAllocationHandle h);
void og_track_vmm_retain(og_call_t *c, CUmemGenericAllocationHandle h);
void og_track_vmm_map(og_call_t *c, uintptr_t va, uint64_t size, CUmemGenericAllocationHandle h);
void og_track_vmm_unmap(og_call_t *c, uintptr_t va, uint64_t size);
bool og_track_pool_use(og_call_t *c, CUmemoryPool pool, int device); /* true: count the block itself */
void og_track_pool_refresh(CUmemoryPool pool);
void og_track_pool_destroy(CUmemoryPool pool);
void og_ledger_pools_refresh(int device); /* re-read the device's pools and graph memory */
void og_track_graph_trim(int device);     /* after cuDeviceGraphMemTrim */
/* After a context went away (destroyed, primary released to zero or reset): drop the
 * device's (-1: any device's) blocks the driver no longer knows. */
void og_track_blocks_gone(og_call_t *c, int device);

/* What the ledger knows, for the limit, the warning and the dumps */
uint64_t og_ledger_tracked(int device);
uint64_t og_ledger_pool_spare(int device);
uint64_t og_ledger_ipc_mapped(int device);   /* bytes of IPC mappings open on the device */
void og_ctx_made(CUcontext ctx, int device); /* a context this process made (cuCtxCreate) */
void og_ctx_destroyed(CUcontext ctx);        /* ... and destroyed */
int64_t og_ledger_contexts_made(int device); /* this process's live contexts made on the device; -1 unknown */
uint64_t og_ledger_peak_t_ns(int device);
/* The ledger's entries of memory.unmeasured, one by one (k = 0, 1, ...): false after the last. */
bool og_ledger_unmeasured(int device, int k, int *what, char *why, size_t n);
/* Adds an entry to memory.unmeasured (its sentence) and memory.unmeasured_ids (its id); a full list
 * keeps what it has.  capture.c. */
struct og_record;
void og_unmeasured(struct og_record *rec, int what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Takes the entry with id `what` out again (it was measured after all); capture.c. */
void og_unmeasured_drop(struct og_record *rec, int what);
void og_ledger_stats(int device, oomguard_device_stats_t *out);
struct og_block_view;
/* The device's totals (as og_ledger_stats, plus pinned host memory) and every live block (fn,
 * as og_ledger_foreach; NULL: none) read at one moment, all shards locked: a dump's sums agree. */
void og_ledger_snapshot(int device, oomguard_device_stats_t *out, void (*fn)(const struct og_block_view *b, void *arg),
                        void *arg);
/* the same without asking the driver for the pools' reservations (the last ones read): for a
 * thread of the shim's own (shim/live.c) */
void og_ledger_counts(int device, oomguard_device_stats_t *out);

enum og_event_op { OG_EV_ALLOC, OG_EV_FREE, OG_EV_FAIL, OG_EV_POOL_GROW, OG_EV_POOL_SHRINK };
typedef struct og_history_event {
    uint64_t t_ns, bytes, live; /* live: tracked bytes on the device after the event */
    int16_t device;
    uint8_t op, hook; /* hook == OG_H_COUNT: no API (pool resize seen later) */
} og_history_event_t;
size_t og_history_copy(og_history_event_t *out, size_t max); /* oldest first */
size_t og_history_capacity(void);
typedef struct {
    uint64_t t_ns, live;
} og_sample_raw_t;
size_t og_samples_copy(int device, og_sample_raw_t *out, size_t max);

/* Iterate live blocks (for dumps): returns number visited. */
typedef struct og_block_view {
    uintptr_t addr;
    uint64_t size;
    uint64_t t_ns;
    uint32_t site;
    int device;
    int kind;
    int hook;
} og_block_view_t;
typedef void (*og_block_fn)(const og_block_view_t *b, void *arg);
size_t og_ledger_foreach(og_block_fn fn, void *arg);

void og_ledger_atfork_prepare(void);
void og_ledger_atfork_parent(void);
void og_ledger_atfork_child(void);

/* ---------------------------------------------------------------- stacks and sites (stacks.c) */

enum og_libclass { OG_LIBCLASS_OTHER, OG_LIBCLASS_CUDA, OG_LIBCLASS_FRAMEWORK };

typedef struct og_site {
    uint64_t hash;
    uint32_t id;
    uint16_t lib; /* index into the library table */
    uint16_t depth;
    uintptr_t frames[]; /* depth entries, innermost first */
} og_site_t;

#define OG_LIB_UNRESOLVED 0xFFFF
uint32_t og_site_capture_slow(void *caller); /* unwinds (or uses caller), dedups */
/* OOMGUARD_STACK_DEPTH=0: the caller's address is the site; the thread's last one is kept. */
extern OG_TLS struct og_site_last {
    void *caller;
    uint32_t id;
} og_site_last;
uint32_t og_stack_capture(void *caller); /* OOMGUARD_STACK_DEPTH > 0: the thread's cached chains, else unwinds */
static inline uint32_t og_site_capture(void *caller)
{
    if (og_opt.stack_depth != 0)
        return og_stack_capture(caller);
    if (caller == og_site_last.caller && og_site_last.id)
        return og_site_last.id;
    return og_site_capture_slow(caller);
}
uint16_t og_site_lib(const og_site_t *site); /* calling library (resolved on first use) */
const og_site_t *og_site_get(uint32_t id);
uint32_t og_site_count(void);
const char *og_lib_name(uint16_t lib);
int og_lib_class(uint16_t lib);
uint16_t og_lib_count(void);
uint16_t og_lib_of(uintptr_t pc); /* dladdr: never with a lock held */
struct og_frame;
/* A frame for a dump: library, its path and build-id, offset, dynamic symbol (dladdr:
 * dump time only).  `oomguard report` turns path+build-id+offset into names and lines. */
void og_frame_describe(uintptr_t ip, bool return_address, struct og_frame *f);
extern _Atomic uint64_t og_sites_lost; /* captures left "unknown": no memory for the site, or 2^20 sites */
void og_stacks_init(void);
void og_stacks_atfork_prepare(void);
void og_stacks_atfork_parent(void);
void og_stacks_atfork_child(void);

/* ---------------------------------------------------------------- failures (oom.c) */

/* A failure opens an "episode" on its device; frees that follow are what the framework
 * released to retry; the next success on the device closes it as recovered. */
typedef struct og_episode {
    int device, hook, kind, attempts;
    void *caller;
    uint32_t site;
    uint64_t first_t_ns, last_t_ns, first_requested, requested;
    bool requested_known; /* a driver call's size always is; a failure an adapter reported, if it gave one */
    uint64_t released;    /* bytes freed on the device since the first failure */
    uint64_t released_before_attempt; /* ... up to the latest failed attempt */
    int result;                       /* CUresult the caller got */
    bool by_limit;                    /* refused by OOMGUARD_LIMIT, the driver never saw it */
    bool recovered;
    bool allocated_since_attempt; /* a smaller allocation succeeded on the device after the latest attempt */
    uint64_t recovered_requested, recovered_t_ns;
} og_episode_t;

void og_oom_init(void);
void og_oom_atfork_child(void);
void og_on_oom(og_call_t *c, uint64_t size, int kind, CUresult r, bool by_limit);
void og_on_recovered(og_call_t *c, int device, uint64_t size);
void og_oom_refresh(int device);                         /* new framework numbers: rewrite an open failure's dump */
bool og_oom_open_recent(int device, uint64_t window_ns); /* unrecovered failure this recent? */
void og_oom_final(int device); /* the framework raised its error: the open failure will not recover */
/* site: the freed block's allocation site (OG_SITE_POOL: a pool giving memory back), for
 * counting only what the failing caller's framework released */
#define OG_SITE_POOL UINT32_MAX
void og_on_free(int device, uint64_t bytes, uint32_t site);
extern atomic_int og_episode_open[OG_MAX_DEVICES];
static inline void og_note_free(int device, uint64_t bytes, uint32_t site)
{
    if (device >= 0 && device < OG_MAX_DEVICES &&
        OG_UNLIKELY(atomic_load_explicit(&og_episode_open[device], memory_order_relaxed)))
        og_on_free(device, bytes, site);
}
/* After the real free (ledger.c): inline for the common case, a block found and freed with
 * nothing left to do (og_free_begin decided it: no failure open on its device). */
static inline void og_free_end(og_call_t *c, og_taken_t *tk, CUresult r)
{
    if (OG_LIKELY(!tk->settle && r == CUDA_SUCCESS))
        return;
    og_free_end_slow(c, tk, r);
}

/* ---------------------------------------------------------------- limit, warning, exit summary (limit.c) */

void og_limit_init(void);
extern bool og_limit_on;                                         /* OOMGUARD_LIMIT is set: fixed before any hook runs */
static inline bool og_limit_active(void) { return og_limit_on; } /* inline: on every allocation */
uint64_t og_limit_bytes(int device);                             /* UINT64_MAX: no limit */
/* true: the request would take the device past the limit; the caller fails it. */
bool og_limit_refuses(og_call_t *c, int device, uint64_t bytes, bool from_pool);
uint64_t og_limit_usage(int device); /* what counts against OOMGUARD_LIMIT */
void og_limit_refresh_overhead(int device);
void og_limit_view(int device, uint64_t *free_b, uint64_t *total_b);
/* the limit and the warning level in bytes as already resolved (UINT64_MAX: none or not yet) */
uint64_t og_limit_cached(int device);
uint64_t og_warn_cached(int device);
/* OOMGUARD_WARN_AT, inline on every allocation: usage at or above og_warn_above[device], or
 * below og_warn_below[device] (re-arming), is a crossing, handled out of line.  Both start at
 * 0: the first check computes them. */
extern _Atomic uint64_t og_warn_above[OG_MAX_DEVICES], og_warn_below[OG_MAX_DEVICES];
void og_warn_crossed(int device, uint64_t live);
static inline void og_warn_check(int device, uint64_t live)
{
    if ((unsigned)device < OG_MAX_DEVICES &&
        OG_UNLIKELY(live >= atomic_load_explicit(&og_warn_above[device], memory_order_relaxed) ||
                    live < atomic_load_explicit(&og_warn_below[device], memory_order_relaxed)))
        og_warn_crossed(device, live);
}
void og_exit_summary(void); /* OOMGUARD_SUMMARY: peak lines and the exit dump */

/* ---------------------------------------------------------------- NVML (nvml.c) */

struct og_record;
uint64_t og_nvml_process_used(int device); /* UINT64_MAX when unknown */
/* Fills process_used_bytes and other processes; notes what could not be measured. */
void og_nvml_measure(struct og_record *rec);

/* ---------------------------------------------------------------- framework adapters (framework.c) */

struct og_framework_view;
void og_framework_view_get(struct og_framework_view *out);
void og_query_at_failure(int device); /* the adapter's query, where it is safe */
/* Fresh framework numbers for a snapshot: a Python adapter's query, run by the interpreter as a
 * pending call, waited for at most wait_ms.  False when none came; then `why` says how old the
 * numbers are and why ("" when there is no Python adapter to ask). */
bool og_framework_refresh(int device, unsigned wait_ms, char *why, size_t n);
void og_framework_atfork_child(void);
/* Did the Python adapter load?  The constructor says what it did for the interpreter; the adapter
 * (oomguard_core.py) turns OG_PY_MARKER from "0" to "1" when it is imported. */
#define OG_PY_MARKER "_OOMGUARD_PY_ADAPTER"
enum { OG_PY_NONE, OG_PY_PATH_SET, OG_PY_NO_DIR, OG_PY_OFF };
void og_python_started(int state, const char *detail);
bool og_python_adapter_missing(char *why, size_t n, bool *loud); /* at a dump; loud: say it on stderr */

/* ---------------------------------------------------------------- records (capture.c, redact.c) */

struct og_record *og_record_capture(const char *status, const og_episode_t *ep, int device);
/* A failure the dump budget refused, recorded later from its episode alone (nothing measured) */
struct og_record *og_record_unmeasured(const char *status, const og_episode_t *ep);
struct og_record *og_record_copy(const struct og_record *src); /* a copy of its own (history events too) */
void og_record_identity(struct og_record *rec);                /* time, pid, host, rank, job, command line */
/* the program a NUL-separated argv runs: the executable's base name, and a Python interpreter's script or -m module */
void og_program_of(const char *raw, size_t n, char *out, size_t outsz);
/* Two NUL-separated argvs of N bytes with the same arguments after argv[0]: the same command run by another path to
 * its executable (capture.c: a child that runs [sys.executable] + sys.argv again is this program). */
bool og_same_arguments(const char *a, size_t an, const char *b, size_t bn);
void og_record_free(struct og_record *rec);
/* redact.c: what a dump may show of the command line and the environment */
void og_cmdline_join(const char *raw, size_t n, char *out, size_t outsz); /* NUL-separated argv */
bool og_secret_option(const char *name, size_t n);
bool og_secret_env_name(const char *name);
void og_redact_text(const char *in, char *out, size_t outsz); /* an environment value: by shape */
bool og_env_entry(const char *kv, char *out, size_t outsz);   /* capture.c: "NAME=value" as a dump shows it */

/* ---------------------------------------------------------------- dumps (dump.c) */

/* The record of a failure, written before the failing call returns */
void og_report_failure(const og_episode_t *ep, og_call_t *c);
void og_report_recovered(const og_episode_t *ep, og_call_t *c);
void og_dump_capture_write(const char *status, int device); /* a "warning"/"exit" dump, if admitted */
void og_dump_episode_counts(int device, uint64_t *recovered, uint64_t *not_written); /* history.counters */
void og_dump_flush_pending(int device); /* the device's unrecovered failure is final; -1: all */
void og_dump_fatal(void);               /* dying: summaries out, temp names gone (signal-safe) */
void og_dump_atfork_child(void);
void og_dump_sweep_start(void); /* at start-up: orphaned temporaries in the dump directory */
/* status "snapshot", on request; `note` ("" none) goes into memory.unmeasured */
bool og_dump_snapshot(int device, const char *note, char *path, size_t n);

/* ---------------------------------------------------------------- the live page (live.c, live.h) */

void og_live_ensure(void);             /* start publishing (once per process; from a hook) */
void og_live_kick(void);               /* publish now: a failure */
void og_live_note_warning(int device); /* OOMGUARD_WARN_AT crossed */
void og_live_exit(void);
void og_live_atfork_child(void);

/* ---------------------------------------------------------------- fatal signals and _exit (fatal.c) */

void og_fatal_arm(void); /* chain the fatal signals (once, lazily) */

#pragma GCC visibility pop

#endif
