/* Facts: every quantity the diagnosis and the remedies decide on, computed once from the record
 * (facts.h says what each is).  Pure: no I/O, no globals, no allocation; large scratch (the growth
 * rule's steps) lives in the record.  The meanings, in the notation of docs/diagnosis.md:
 *
 *   req        event.requested_bytes; unknown when an adapter reported the failure without its size: then
 *              the shortfall is unknown and nothing is said to cover or fit it
 *   total      device.total_bytes
 *   usage_lim  what OOMGUARD_LIMIT counts: device.limit_usage_bytes (tracked + CUDA context),
 *              process_tracked_bytes when that was not recorded
 *   free       device.free_bytes; with a limit: min(limit - usage_lim, free); when the physical
 *              free is not known and there is no limit it is estimated (total - footprint - others)
 *   shortfall  max(0, req - free)                        -> diagnosis.shortfall_bytes (unknown: null
 *              when free is neither measured nor estimated; 0 in the sums, never "covered")
 *   footprint  process_used_bytes (NVML) when known, else process_tracked_bytes
 *   ffw        the framework of the failing call: its library's framework, else the record's
 *   resv[fw]   bytes held by each framework's libraries (by_library, fw_kind), pool caches included
 *   cached     the failing framework's held-but-unused memory, measured: the adapter's
 *              reserved - allocated; or what that framework freed between its failed attempts
 *              ("retry_release"); or the slack of the framework's own stream-ordered pool.
 *              Not known otherwise -- never 0, never "live".
 *   reclaim    what could still be handed back: cached, except a cache the framework already
 *              released before a retry that failed (it is in `free` now); in a recovered dump the
 *              numbers are those of the first attempt, before the release, so reclaim = cached
 *   app_slack  pool_reserved - pool_used when the pools belong to the application (not the framework)
 *   peers      other processes on the device of the same job (same command and launcher/rank
 *              variables, children, the parent and its other workers: see capture.c); `others`
 *              excludes them
 *
 * The history patterns (growth's steps, a load the request belongs to) and the cross-device
 * imbalance are facts too: the causes report them, does_not_fit and the remedies read them. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "record.h"
#include "advice_text.h"
#include "facts.h"
#include "model_dtypes.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

#define NONFW_FLOOR (1ULL << 30) /* non_framework: at least 1 GiB */

/* Defaults (the same as OOMGUARD_FRAG_SHARE etc. in options.def), used for a missing or invalid value. */
static const og_thresholds_t th_default = {
    .frag_share = 0.25,
    .nonfw_share = 0.20,
    .growth_min_share = 0.05,
    .growth_rising_steps = 0.70,
};

const char *og_cache_src_name(enum og_cache_src s)
{
    switch (s) {
    case OG_CACHE_ADAPTER:
        return "adapter";
    case OG_CACHE_RETRY_RELEASE:
        return "retry_release";
    case OG_CACHE_POOL:
        return "pool";
    case OG_CACHE_MEASURED:
        return "measured";
    default:
        return "none";
    }
}

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static bool same_lib(const char *a, const char *b)
{
    return a[0] && b[0] && (strcmp(a, b) == 0 || strcmp(og_base_name(a), og_base_name(b)) == 0);
}

/* 1: the failing call's library is a framework's, 0: it is not, -1: cannot tell. */
static int failing_is_framework(const og_record_t *rec)
{
    char lib[sizeof rec->event.library];
    og_cpy(lib, sizeof lib, rec->event.library, sizeof rec->event.library);
    if (!lib[0])
        return -1;
    if (og_framework_of(og_base_name(lib), lib) != OG_FW_UNKNOWN)
        return 1;
    int nlibs = rec->memory.nlibs < 0 ? 0 : rec->memory.nlibs > 32 ? 32 : rec->memory.nlibs;
    for (int i = 0; i < nlibs; i++) {
        char l[sizeof rec->memory.by_library[0].library];
        og_cpy(l, sizeof l, rec->memory.by_library[i].library, sizeof l);
        if (same_lib(lib, l))
            return rec->memory.by_library[i].framework ? 1 : 0;
    }
    char list[sizeof rec->framework_libs];
    og_cpy(list, sizeof list, rec->framework_libs, sizeof list);
    for (char *p = list; *p;) {
        char *e = strchr(p, ',');
        if (e)
            *e = 0;
        while (*p == ' ')
            p++;
        size_t l = strlen(p);
        while (l && p[l - 1] == ' ')
            p[--l] = 0;
        if (same_lib(lib, p))
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    if (rec->framework_libs[0] || rec->framework != OG_FW_UNKNOWN)
        return 0;
    return -1;
}

static double th_or(double v, double def)
{
    if (v != v || v <= 0 || v > 1)
        return def;
    return v;
}

/* the largest framework reservation other than EXCEPT and its kind (-1 none) */
/* The other frameworks of the process as their own adapters read them (memory.framework.other_frameworks):
 * when both frameworks reach the driver through one library (ctypes, a shared runtime), by_library puts
 * the other's reservation under the failing framework's name.  What the failing framework holds beyond
 * its own adapter's reservation is the others' first; the others' bytes count at least as read. */
static void other_framework_holdings(og_facts_t *d, const og_record_t *rec)
{
    const og_framework_view_t *fw = &rec->memory.fw;
    if (!fw->has || d->ffw == OG_FW_UNKNOWN)
        return;
    int n = fw->nother_fw < 0 ? 0 : fw->nother_fw > 4 ? 4 : fw->nother_fw;
    for (int i = 0; i < n; i++) {
        char name[sizeof fw->other_fw[i].framework];
        og_cpy(name, sizeof name, fw->other_fw[i].framework, sizeof name);
        int k = og_framework_from_name(name);
        uint64_t held = fw->other_fw[i].reserved_bytes.v;
        if (k == OG_FW_UNKNOWN || k == d->ffw || !og_known(fw->other_fw[i].reserved_bytes) || held <= d->resv[k])
            continue;
        uint64_t more = held - d->resv[k];
        uint64_t beyond = sub0(d->resv[d->ffw], fw->reserved_bytes);
        uint64_t take = more < beyond ? more : beyond;
        d->resv[d->ffw] -= take;
        d->resv[k] = held;
        d->fw_resv_all = add_sat(d->fw_resv_all, more - take);
        d->other_fw_unlisted = add_sat(d->other_fw_unlisted, more - take);
    }
}

static int biggest_fw(const og_facts_t *f, int except, uint64_t *bytes)
{
    int best = -1;
    for (int k = 0; k < OG_NFW; k++)
        if (k != except && f->resv[k] && (best < 0 || f->resv[k] > f->resv[best]))
            best = k;
    *bytes = best >= 0 ? f->resv[best] : 0;
    return best;
}

/* ------------------------------------------------------------------ measured quantities */

/* What CUDA-graph private pools (the adapter's private_pool_bytes: their segments) reserve and no block of theirs
 * holds stays reserved for the graphs' replays as long as the graphs live: it serves no request outside the pool
 * and no empty_cache releases it.  At least this much of the framework's reserved-but-unallocated bytes is idle in
 * them: the pools' reservation less every allocated byte that could lie in a pool, all but the parameters and
 * buffers (made before any capture; an unmeasured role counts as 0, so the bound only shrinks); never more than
 * the whole cache.  0 without private pools. */
static uint64_t pool_idle(const og_framework_view_t *fw)
{
    if (!fw->has || !fw->private_pool_bytes)
        return 0;
    uint64_t outside =
        add_sat(og_or(fw->roles.bytes[OG_ROLE_parameters], 0), og_or(fw->roles.bytes[OG_ROLE_buffers], 0));
    uint64_t idle = sub0(fw->private_pool_bytes, sub0(fw->allocated_bytes, outside));
    uint64_t cached = sub0(fw->reserved_bytes, fw->allocated_bytes);
    return idle < cached ? idle : cached;
}

static int nested_launch_tasks(const og_record_t *r);

/* The failing framework's cache as the record gives it, before any retry says more: with its adapter, what it
 * reserves beyond what it allocated, less POOL_IDLE (idle memory of CUDA-graph pools, which no other request can
 * use); else the shim's measured number, unless that is an application's own pool (not the framework's cache).
 * *SRC is where it came from (OG_CACHE_NONE: the shim's, source unsaid).  False: not known. */
static bool framework_cache(const og_record_t *rec, uint64_t pool_idle, uint64_t *cached, enum og_cache_src *src)
{
    const og_framework_view_t *fw = &rec->memory.fw;
    if (fw->has && !fw->reserved_unknown) {
        *cached = sub0(sub0(fw->reserved_bytes, fw->allocated_bytes), pool_idle);
        *src = OG_CACHE_ADAPTER;
        return true;
    }
    if (og_known(rec->memory.framework_cached_bytes) &&
        !(rec->memory.pool_owner_fw == 2 && rec->memory.framework_cached_source == OG_CACHE_POOL)) {
        *cached = rec->memory.framework_cached_bytes.v;
        *src = rec->memory.framework_cached_source;
        return true;
    }
    return false;
}

/* the name the code that started a child of this process gave it, as the adapter listed this process's
 * multiprocessing children (roles.child_processes); "" where it kept the default name (a DataLoader's worker, any
 * unnamed process); NULL when not listed or not read */
const char *og_child_name(const struct og_record *rec, int pid)
{
    const og_roles_t *ro = &rec->memory.fw.roles;
    int n = OG_FILLED(ro->nchildren, ro->children);
    for (int i = 0; ro->children_read && pid > 0 && i < n; i++)
        if (ro->children[i].pid == pid)
            return ro->children[i].name;
    return NULL;
}

static void measure(og_facts_t *d, const og_record_t *rec, const og_thresholds_t *th)
{
    og_thresholds_t t = th ? *th : th_default;
    d->frag_share = th_or(t.frag_share, th_default.frag_share);
    d->nonfw_share = th_or(t.nonfw_share, th_default.nonfw_share);
    d->growth_min_share = th_or(t.growth_min_share, th_default.growth_min_share);
    d->growth_rising_steps = th_or(t.growth_rising_steps, th_default.growth_rising_steps);

    d->req_known = og_known(rec->event.requested_bytes);
    d->req = og_or(rec->event.requested_bytes, 0);
    d->total = og_or(rec->device.total_bytes, 0);
    d->tracked = og_or(rec->memory.process_tracked_bytes, 0);
    d->tracked_known = og_known(rec->memory.process_tracked_bytes);
    d->other_all = og_or(rec->memory.other_processes_bytes, 0);
    d->used_known = og_known(rec->memory.process_used_bytes);
    d->used = og_or(rec->memory.process_used_bytes, 0);
    d->footprint = d->used_known ? d->used : d->tracked;
    d->recovered = rec->event.recovered;
    d->phys_free.known = og_known(rec->device.free_bytes);
    d->phys_free.v = og_or(rec->device.free_bytes, 0);

    /* peers of the same job are not "other users" of the GPU */
    int no = rec->memory.nother < 0 ? 0 : rec->memory.nother > 32 ? 32 : rec->memory.nother, unreadable = 0;
    d->peers_small = true;
    d->same_program_big = d->own_child = -1;
    /* srun around torchrun (nested_launch_tasks): when every other process on this GPU is unreadable here (another pid
     * namespace) and there is exactly one per other task, they are the other worlds' ranks with this local rank, the
     * job's own (an exact count, never a guess from sizes); any other count leaves them others */
    d->nested_launchers = nested_launch_tasks(rec);
    for (int i = 0; i < no; i++)
        unreadable += !rec->memory.other[i].visible;
    bool worlds = d->nested_launchers > 1 && no == d->nested_launchers - 1 && unreadable == no;
    for (int i = 0; i < no; i++) {
        if (rec->memory.other[i].same_job || worlds) {
            d->npeers++;
            d->nworld_peers += worlds;
            /* a child with a rank of its own is a rank this process launched (Lightning's launcher), not a worker */
            d->nchildren += rec->memory.other[i].child && rec->memory.other[i].rank < 0;
            d->nchild_programs +=
                rec->memory.other[i].child && rec->memory.other[i].rank < 0 && rec->memory.other[i].other_program;
            const char *named = rec->memory.other[i].child ? og_child_name(rec, rec->memory.other[i].pid) : NULL;
            if (named && named[0]) {
                d->nchild_own++;
                if (d->own_child < 0 || rec->memory.other[i].bytes > rec->memory.other[d->own_child].bytes)
                    d->own_child = i;
            }
            d->nsiblings += rec->memory.other[i].sibling;
            d->nparents += rec->memory.other[i].parent;
            d->peers_bytes = add_sat(d->peers_bytes, rec->memory.other[i].bytes);
            if (rec->memory.other[i].bytes > 3 * (GIB / 2))
                d->peers_small = false;
        } else {
            d->nothers++;
            if (rec->memory.other[i].same_program) {
                d->other_same_program = add_sat(d->other_same_program, rec->memory.other[i].bytes);
                if (d->same_program_big < 0 ||
                    rec->memory.other[i].bytes > rec->memory.other[d->same_program_big].bytes)
                    d->same_program_big = i;
            }
        }
    }
    d->child_programs = d->npeers && d->nchildren == d->npeers && d->nchild_programs == d->npeers;
    d->own_children = d->npeers && d->nchild_own == d->npeers;
    d->parent_only = d->npeers && d->nparents == d->npeers && rec->world_size <= 1 && rec->rank < 0;
    const og_roles_t *ro = &rec->memory.fw.roles;
    d->model_gpu_elsewhere =
        ro->has && ro->has_stmt_model_device && ro->stmt_model_device != rec->event.device ? ro->stmt_model_device : -1;
    d->other = sub0(d->other_all, d->peers_bytes);
    d->wrong_device = rec->local_rank >= 0 && rec->visible_devices > 1 && rec->local_rank != rec->event.device &&
                      rec->local_rank < rec->visible_devices;

    /* the failing call's framework; whose reservation is whose */
    d->failing_fw = failing_is_framework(rec);
    char flib[sizeof rec->event.library];
    og_cpy(flib, sizeof flib, rec->event.library, sizeof flib);
    d->ffw = og_framework_of(og_base_name(flib), flib);
    int nlibs = rec->memory.nlibs < 0 ? 0 : rec->memory.nlibs > 32 ? 32 : rec->memory.nlibs;
    for (int i = 0; i < nlibs; i++) {
        const og_lib_usage_t *u = &rec->memory.by_library[i];
        if (!u->framework)
            continue;
        int k = u->fw_kind >= 0 && u->fw_kind < OG_NFW ? u->fw_kind : OG_FW_UNKNOWN;
        if (k == OG_FW_UNKNOWN)
            k = rec->framework >= 0 && rec->framework < OG_NFW ? (int)rec->framework : OG_FW_UNKNOWN;
        d->resv[k] = add_sat(d->resv[k], u->bytes);
        d->fw_resv_all = add_sat(d->fw_resv_all, u->bytes);
        if (d->failing_fw == 1 && d->ffw == OG_FW_UNKNOWN) {
            char l[sizeof u->library];
            og_cpy(l, sizeof l, u->library, sizeof l);
            if (same_lib(l, flib))
                d->ffw = k;
        }
    }
    if (d->ffw == OG_FW_UNKNOWN)
        d->ffw = rec->framework;
    d->fwname = og_framework_display(d->ffw, "the framework");
    other_framework_holdings(d, rec);
    d->other_fw = d->ffw == OG_FW_UNKNOWN ? -1 : biggest_fw(d, d->ffw, &d->other_fw_bytes);

    const og_framework_view_t *fw = &rec->memory.fw;
    bool app_pool = rec->memory.pool_owner_fw == 2;
    if (fw->has && !fw->reserved_unknown) {
        d->pool_idle = pool_idle(fw);
        d->reservation = fw->reserved_bytes;
    }
    d->cached_known = framework_cache(rec, d->pool_idle, &d->cached, &d->cached_src);
    if (d->cached_known && d->cached_src == OG_CACHE_NONE)
        d->cached_src = OG_CACHE_MEASURED;
    int kinds = 0;
    for (int k = 0; k < OG_NFW; k++)
        kinds += d->resv[k] > 0;
    /* several frameworks: the failing one's own reservation; one: everything the framework holds */
    if (!d->reservation)
        d->reservation =
            kinds > 1 && d->ffw != OG_FW_UNKNOWN && d->resv[d->ffw] ? d->resv[d->ffw] : rec->memory.framework_bytes;
    d->released = og_or(rec->event.released_between_attempts_bytes, 0);
    /* the framework released its cache and retried (PyTorch does before raising) and it still failed */
    d->retried = !d->recovered && rec->event.attempts >= 2 && d->failing_fw != 0 &&
                 (d->cached_src == OG_CACHE_NONE || d->cached_src == OG_CACHE_RETRY_RELEASE);
    if (d->retried && !d->cached_known) {
        /* released nothing: the framework had no wholly free segment left: a measured 0 */
        d->cached_known = true;
        d->cached = 0;
        d->cached_src = OG_CACHE_RETRY_RELEASE;
    }
    /* a cache already handed back between retries is in `free` now: nothing left to reclaim
     * (a recovered dump keeps the first attempt's numbers, from before the release) */
    d->reclaim = d->cached_known && (d->recovered || d->cached_src != OG_CACHE_RETRY_RELEASE) ? d->cached : 0;
    if (fw->has && !fw->reserved_unknown && !(fw->largest_free_block_bytes == 0 && d->cached > 0)) {
        d->largest_known = true;
        d->largest = fw->largest_free_block_bytes;
    }
    if (app_pool)
        d->app_slack = sub0(rec->memory.pool_reserved, rec->memory.pool_used);

    d->limited = og_known(rec->device.limit_bytes);
    d->limit = og_or(rec->device.limit_bytes, 0);
    d->usage_lim =
        d->limited && og_known(rec->device.limit_usage_bytes) && rec->device.limit_usage_bytes.v >= d->tracked
            ? rec->device.limit_usage_bytes.v
            : d->tracked;
    if (d->limited) {
        d->free_known = true;
        d->free_eff = sub0(d->limit, d->usage_lim);
        if (og_known(rec->device.free_bytes))
            d->free_eff = min64(d->free_eff, rec->device.free_bytes.v);
    } else if (og_known(rec->device.free_bytes)) {
        d->free_known = true;
        d->free_eff = rec->device.free_bytes.v;
    } else if (d->total) {
        d->free_known = d->free_estimated = true;
        d->free_eff = sub0(d->total, add_sat(d->footprint, d->other_all));
    }
    if (!og_known(rec->memory.other_processes_bytes)) {
        og_opt_u64_t inf = og_other_inferred_bytes(rec);
        if (og_known(inf) && inf.v > 0) {
            d->other = inf.v;
            d->other_inferred = true;
        }
    }
    /* unknown is not zero: nothing free measured, or no size requested that is known: nothing short measured */
    d->shortfall_known = d->free_known && d->req_known;
    d->shortfall = d->shortfall_known ? sub0(d->req, d->free_eff) : 0;
    d->capacity = d->limited && (!d->total || d->limit < d->total) ? d->limit : d->total;
    d->larger_than_device = d->req_known && d->capacity && d->req > d->capacity;
    d->app_pool_covers = d->shortfall > 0 && d->app_slack >= d->shortfall;
    d->distinct_sizes = og_distinct_alloc_sizes(rec);
}

/* A framework-imposed cap binds when what it counts plus the request exceeds it, counted the way that
 * framework checks it: PyTorch's set_per_process_memory_fraction refuses a segment that would take its
 * caching allocator's RESERVED bytes past fraction x total (cached blocks count), CuPy's pool limit
 * bounds the pool's total bytes; JAX's XLA_PYTHON_CLIENT_MEM_FRACTION and TensorFlow's memory_limit
 * size a BFC arena whose bytes in use (allocated) plus the request must fit.  An internal failure
 * under the cap is something else (fragmentation inside the framework's arena), and so is one that the whole
 * card could not hold either (the request does not fit). */
static void framework_cap(og_facts_t *d, const og_record_t *r)
{
    const og_framework_view_t *fw = &r->memory.fw;
    struct og_cap_facts *k = &d->cap;
    if (!fw->has || !og_known(fw->cap_bytes))
        return;
    char name[sizeof fw->framework];
    og_cpy(name, sizeof name, fw->framework, sizeof fw->framework);
    int kind = !name[0]                          ? d->ffw
               : strcmp(name, "pytorch") == 0    ? OG_FW_PYTORCH
               : strcmp(name, "cupy") == 0       ? OG_FW_CUPY
               : strcmp(name, "jax") == 0        ? OG_FW_JAX
               : strcmp(name, "tensorflow") == 0 ? OG_FW_TENSORFLOW
                                                 : d->ffw;
    k->cap = fw->cap_bytes.v;
    og_opt_u64_t req = d->req_known ? (og_opt_u64_t){ d->req, true } : fw->requested_bytes;
    k->req_known = og_known(req);
    k->req = og_or(req, 0);
    k->alloc = fw->allocated_bytes;
    k->reserved = (kind == OG_FW_PYTORCH || kind == OG_FW_CUPY) && fw->reserved_bytes >= k->alloc;
    k->counted = k->reserved ? fw->reserved_bytes : k->alloc;
    if (k->req_known) {
        k->over = sub0(add_sat(k->counted, k->req), k->cap);
        k->room = d->phys_free.known && d->phys_free.v >= k->req;
        /* ... and not when what is in use and the request are beyond the whole card: no setting of the cap lets
         * it through (a 114 GiB scan on an 80 GB card refused by a 75% arena does not fit) */
        k->beyond_card = d->capacity && add_sat(k->alloc, k->req) > d->capacity;
        k->binds = add_sat(k->counted, k->req) > k->cap && (fw->internal_oom || k->room) && !k->beyond_card;
    } else {
        /* a request of unknown size: the cap binds only if what it counts is already at it and the framework
         * itself refused; how far over, and whether the device had room, are not known */
        k->binds = fw->internal_oom && k->counted >= k->cap;
    }
}

/* ------------------------------------------------------------------ growth: steps in the history */

#define GROWTH_MIN_STEPS 6
/* back-to-back markers (nothing between) are one burst (a load of shards, a pass keeping its
 * activations) unless the program pauses them (run_is_steps): a pause is a gap this long at least
 * (a loop of 1 ms an iteration pauses; Python making tensors back to back, even 3x slower, does not) */
#define GROWTH_PAUSE_NS 800000ULL
/* ... one pause alone is a step only when it is longer than the host's time slices, even on a busy
 * machine; pauses that recur after the same number of markers are steps only when the markers between
 * them came within this share of a pause (a loop's few allocations, then its work; the host lets a
 * program run a whole time slice, and gives the core to fewer than this many others in turn) */
#define GROWTH_LONE_PAUSE_NS   50000000ULL
#define GROWTH_PIECE_PER_PAUSE 20
/* ... and a pause is this many times the run's typical (median) gap at least: a host that lengthens or
 * shortens any gap by a factor of two cannot make a pause of a gap in a run whose gaps rise smoothly
 * (a typical gap moves little), nor hide a loop's pauses (32x and more its typical gap) */
#define GROWTH_PAUSE_PER_GAP 8.0
/* the framework freed under this share of the rise over its whole life: the rising steps are one
 * pass building up, not iterations (the leaks of the corpus free >= 23% of it: py_evaluate_no_grad) */
#define GROWTH_MIN_FREED_SHARE 0.1
#define LOAD_GAP_S             0.1 /* a pause this long between equal allocations may end a load ... */
#define LOAD_PAUSE_RATIO       20  /* ... when it is this many times the load's typical spacing */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static bool is_op(const struct og_hist_ev *e, enum og_hist_op op) { return e->op == op; }

/* Whether the event at I is a marker of size SIZE (MARKER says how; TOL: the rounding). */
static bool is_marker(const struct og_hist_ev *e, uint64_t size, uint64_t tol, enum og_step_marker marker)
{
    return is_op(e, OG_OP_ALLOC) &&
           (marker == OG_MARK_EVERY_ALLOCATION || (e->bytes > size ? e->bytes - size : size - e->bytes) <= tol);
}

/* whether a piece of C markers is one of a loop's pieces of M (give or take one, or a quarter) */
static bool piece_near(uint64_t c, uint64_t m)
{
    uint64_t t = m / 4 > 1 ? m / 4 : 1;
    return (c > m ? c - m : m - c) <= t;
}

/* The run of back-to-back markers that starts at I0 (failed attempts do not interrupt it): whether
 * its pauses are the program's steps (a loop keeping the same few blocks every iteration, the
 * temporaries from a warm cache) or the run is one burst (weights arriving in shards, one pass keeping
 * its activations).  The run is decided as a whole, from its gaps taken together, never gap by gap:
 * the host's timing moves each gap, by a factor of two either way on a busy machine, and a decision
 * that one gap could tip would give the same program different steps from run to run.
 *  - Its typical gap (the median) of GROWTH_PAUSE_NS or more: a loop of one kept block an iteration,
 *    every marker a step, whatever gap the host shortened.
 *  - Else its pauses are the gaps of GROWTH_PAUSE_NS or more that are also GROWTH_PAUSE_PER_GAP times
 *    its typical gap or more: a loop's work between its few allocations.  A run whose gaps rise
 *    smoothly (a generation slowing token by token as its context grows, a pass whose layers take
 *    longer) has none: gaps that cross GROWTH_PAUSE_NS there are no pauses.
 *  - A pause of the host only lengthens gaps: a page fault or a wake-up anywhere, and at the end of
 *    every time slice, which, when the markers come at a steady rate, is after the same number of
 *    them each time.  So the pauses are the program's only when the pieces between them hold the same
 *    number of markers (give or take one, or a quarter; the last piece, cut by the failure, is not
 *    compared) AND those markers came within 1/GROWTH_PIECE_PER_PAUSE of a pause (the medians): a
 *    loop's few allocations, not a time slice's worth.
 *  - One pause alone (one gap of GROWTH_PAUSE_NS or more, or one pause) splits the run only when it
 *    is GROWTH_LONE_PAUSE_NS or more.
 * Returns 0 (one burst), the loop's count of markers a piece (a step ends at a pause after such a
 * piece, not at a pause of the host inside it; 1 with *PAUSE_S 0 for every marker a step), or
 * UINT64_MAX (the one pause is a step); *PAUSE_S: the shortest gap that is a pause of this run.
 * COUNTS, SPANS: scratch of OG_GROWTH_MAX_STEPS. */
static uint64_t run_steps(const struct og_hist_ev *e, int ne, int i0, uint64_t size, uint64_t tol,
                          enum og_step_marker marker, uint64_t *counts, uint64_t *spans, double *pause_s)
{
    /* the run's gaps, sorted (in SPANS until the pieces are counted) */
    uint64_t *gaps = spans;
    int ng = 0, over = 0, last = i0;
    for (int i = i0 + 1; i < ne && ng < OG_GROWTH_MAX_STEPS; i++) {
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL))
            continue;
        if (!is_marker(&e[i], size, tol, marker))
            break;
        double gap = e[i].t_rel - e[last].t_rel;
        gaps[ng] = gap > 0 ? (uint64_t)(gap * 1e9) : 0;
        over += gaps[ng++] >= GROWTH_PAUSE_NS;
        last = i;
    }
    *pause_s = GROWTH_PAUSE_NS / 1e9;
    if (over == 0)
        return 0;
    qsort(gaps, (size_t)ng, sizeof *gaps, cmp_u64);
    if (over == 1)
        return gaps[ng - 1] >= GROWTH_LONE_PAUSE_NS ? UINT64_MAX : 0;
    uint64_t typical = gaps[(ng - 1) / 2];
    if (typical >= GROWTH_PAUSE_NS) {
        *pause_s = 0; /* a loop of one block an iteration: every marker a step */
        return 1;
    }
    double least = (double)typical * GROWTH_PAUSE_PER_GAP; /* a pause, ns */
    if (least < (double)GROWTH_PAUSE_NS)
        least = (double)GROWTH_PAUSE_NS;
    int np = ng; /* the pauses: gaps[np..] */
    while (np > 0 && (double)gaps[np - 1] >= least)
        np--;
    if (np == ng)
        return 0; /* no gap stands out of a run this steady: one burst */
    if (np == ng - 1)
        return gaps[np] >= GROWTH_LONE_PAUSE_NS ? UINT64_MAX : 0;
    *pause_s = least / 1e9;
    uint64_t pause[OG_GROWTH_MAX_STEPS / 2]; /* the first pauses (a median of those) */
    int n = 0, first = i0;
    uint64_t c = 1;
    last = i0;
    for (int i = i0 + 1; i < ne && n < OG_GROWTH_MAX_STEPS; i++) {
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL))
            continue;
        if (!is_marker(&e[i], size, tol, marker))
            break;
        double gap = e[i].t_rel - e[last].t_rel, span = e[last].t_rel - e[first].t_rel;
        if (gap >= *pause_s) {
            if (n < OG_GROWTH_MAX_STEPS / 2)
                pause[n] = (uint64_t)(gap * 1e9);
            spans[n] = span > 0 ? (uint64_t)(span * 1e9) : 0;
            counts[n++] = c;
            c = 0;
            first = i;
        }
        c++;
        last = i;
    }
    if (n < 2)
        return 0; /* (two pauses or more were counted above: not reached) */
    np = n < OG_GROWTH_MAX_STEPS / 2 ? n : OG_GROWTH_MAX_STEPS / 2;
    qsort(pause, (size_t)np, sizeof *pause, cmp_u64);
    qsort(spans, (size_t)n, sizeof *spans, cmp_u64);
    if (spans[(n - 1) / 2] * GROWTH_PIECE_PER_PAUSE > pause[(np - 1) / 2])
        return 0; /* time slices of a steady run, cut by the host */
    qsort(counts, (size_t)n, sizeof *counts, cmp_u64);
    int best = 0; /* the most pieces within tolerance of one count */
    uint64_t count = 0;
    for (int k = 0; k < n; k++) {
        int near = 0;
        for (int j = 0; j < n; j++)
            near += piece_near(counts[j], counts[k]);
        if (near > best) {
            best = near;
            count = counts[k];
        }
    }
    return best * 10 >= n * 7 ? count : 0;
}

static bool module_pass_local(const char *where, const og_record_t *r);
static bool pass_own_local(const char *where, const og_record_t *r);

/* One reading of the steps: marked by allocations of SIZE (MARKER says how), into g.  True when the
 * growth pattern holds; the load and one-pass findings are recorded in g either way. */
static bool growth_for(const og_facts_t *d, const og_record_t *r, og_growth_scratch_t *s, og_growth_facts_t *g,
                       uint64_t size, enum og_step_marker marker)
{
    int ne = r->history.events ? (r->history.nevents < 0 ? 0 : r->history.nevents) : 0;
    if (ne < GROWTH_MIN_STEPS || d->total == 0 || (marker != OG_MARK_EVERY_ALLOCATION && size == 0))
        return false;
    const struct og_hist_ev *e = r->history.events;
    /* markers: successful allocations of the failing request's size (within 1/32 or 2 MiB: the
     * framework's rounding); a step runs from one marker to the next */
    uint64_t tol = size / 32 > (2ULL << 20) ? size / 32 : (2ULL << 20);
    if (marker == OG_MARK_MODAL_SIZE)
        tol = size / 32; /* the most frequent size: that size exactly (to rounding) */
    /* the latest OG_GROWTH_MAX_STEPS steps (the ones nearest the failure), in a ring */
    uint64_t *ring = s->ring, *lows = s->lows, *rises = s->rises;
    long seen = 0;
    uint64_t low = UINT64_MAX;
    bool in_step = false, between = true;
    /* the run's count a piece (run_steps); markers since the run's last pause, since the step began */
    uint64_t run_count = 0, piece = 0, in_this_step = 0;
    double last_marker_t = 0, step_t = 0, run_pause = GROWTH_PAUSE_NS / 1e9;
    for (int i = 0; i < ne; i++) {
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL))
            continue;
        bool alloc = is_op(&e[i], OG_OP_ALLOC);
        uint64_t floor_now = alloc ? sub0(e[i].live, e[i].bytes) : e[i].live;
        if (is_marker(&e[i], size, tol, marker)) {
            /* back-to-back markers with nothing between (a burst: loading weights, a stack of
             * buffers) are one step, unless the program spaces them as a loop does (decided once,
             * at the run's first marker; lows[] and rises[] are free scratch until the steps are
             * read) */
            if (between) {
                run_count = run_steps(e, ne, i, size, tol, marker, lows, rises, &run_pause);
                piece = 0;
            }
            /* a step ends at a pause after a piece of the loop's count, counted from the last pause
             * or from the step's start (a pause of the host inside a piece ends nothing) */
            bool paused = !between && e[i].t_rel - last_marker_t >= run_pause;
            bool burst =
                in_step && !between &&
                !(paused && run_count &&
                  (run_count == UINT64_MAX || piece_near(piece, run_count) || piece_near(in_this_step, run_count)));
            piece = paused ? 1 : piece + 1;
            in_this_step = burst ? in_this_step + 1 : 1;
            last_marker_t = e[i].t_rel;
            between = false;
            if (burst)
                continue;
            if (in_step) { /* close the previous step */
                s->tring[seen % OG_GROWTH_MAX_STEPS] = step_t;
                ring[seen++ % OG_GROWTH_MAX_STEPS] = low;
            }
            in_step = true;
            step_t = e[i].t_rel;
            low = floor_now; /* the floor under this step: live before its marker */
            continue;
        }
        between = true;
        if (in_step && floor_now < low)
            low = floor_now;
    }
    if (in_step) {
        s->tring[seen % OG_GROWTH_MAX_STEPS] = step_t;
        ring[seen++ % OG_GROWTH_MAX_STEPS] = low;
    }
    int steps = seen < OG_GROWTH_MAX_STEPS ? (int)seen : OG_GROWTH_MAX_STEPS;
    for (int k = 0; k < steps; k++)
        lows[k] = ring[(seen - steps + k) % OG_GROWTH_MAX_STEPS];
    if (steps < GROWTH_MIN_STEPS)
        return false;
    int transitions = steps - 1, rising = 0;
    for (int i = 1; i < steps; i++) {
        rises[i - 1] = sub0(lows[i], lows[i - 1]);
        if (rises[i - 1] > (1ULL << 19))
            rising++;
    }
    /* the typical step: the median rise (a load or an optimizer's first step inside one step
     * must not pass for the leak's rate) */
    qsort(rises, (size_t)transitions, sizeof *rises, cmp_u64);
    uint64_t per_step = rises[transitions / 2];
    uint64_t rise = sub0(lows[steps - 1], lows[0]);
    double rs = d->growth_rising_steps, gm = d->growth_min_share;
    double rising_share = (double)rising / transitions;
    double rise_share = (double)rise / (double)d->total;
    /* significant: gm of the device, or (over many steps) at least what is missing now */
    bool big_enough = rise_share + 1e-12 >= gm || (d->shortfall > 0 && rise >= d->shortfall && steps >= 16);
    if (rising_share + 1e-9 < rs || !big_enough || per_step == 0)
        return false;
    /* a load, not a leak: steps that each add at least 1/40 of the device, starting from (almost)
     * nothing held, are weights arriving (however slowly); a leak keeps tensors on top of an
     * established working set (the weights came first).  When the adapter read another phase from
     * the stack (a forward or backward pass: a step keeping a large hidden state), block sizes do not
     * overrule it: the steps are iterations */
    bool other_phase = d->phase != OG_JP_unknown && d->phase != OG_JP_loading;
    if (!other_phase && (double)per_step * 40 >= (double)d->total && lows[0] < 2 * per_step) {
        g->load_steps = steps;
        g->load_step_bytes = per_step;
        return false;
    }
    /* a rise the framework's measured cache accounts for is the cache (a pool that keeps what it
     * handed out, a caching allocator), not tensors kept alive */
    if (d->cached_known && d->cached_src != OG_CACHE_RETRY_RELEASE && 2 * d->cached >= rise)
        return false;
    if (d->app_slack && 2 * d->app_slack >= rise)
        return false; /* the application's pool keeping what it handed out */
    /* a loop that leaks frees its temporaries every iteration; one pass that builds up (the first
     * forward of a too-big batch: a step per layer, each activation kept for backward) has freed
     * (almost) nothing.  Unknown (no adapter, or one that cannot tell) is not zero. */
    const og_framework_view_t *fw = &r->memory.fw;
    if (fw->has && fw->freed_known && (double)fw->freed_bytes_total < GROWTH_MIN_FREED_SHARE * (double)rise) {
        g->pass_built = true;
        return false;
    }
    /* the same, timed: the adapter says when the latest optimizer step ended; when the second half of
     * the rise came after it, the rise is the iteration still running (a forward pass keeping each
     * layer's activations, split into steps by its own pauses), not memory kept across iterations.
     * The age is the adapter's at its report, so it counts back from when the report arrived, not
     * from the failure: a report a busy host delayed (the roles scan, the interpreter's turn) moves
     * nothing.  No optimizer (inference), no adapter: unknown, the rule stays as it was */
    const og_roles_t *ro = &fw->roles;
    double reported = ro->reported_t_rel > 0 ? ro->reported_t_rel : r->event.t_rel;
    if (fw->has && ro->has && og_known(ro->last_step_age_us) && reported > 0) {
        double last_step = reported - (double)ro->last_step_age_us.v / 1e6;
        uint64_t half = lows[0] + rise / 2;
        int k = 0;
        while (k < steps - 1 && lows[k] < half)
            k++;
        if (last_step < s->tring[(seen - steps + k) % OG_GROWTH_MAX_STEPS]) {
            g->since_step = g->pass_built = true;
            return false;
        }
    }
    /* one generation building up, not memory kept across requests: the job is decoding (facts.decoding: the
     * adapter read a generation from the stack, generate() or a beam search, or the running code keeps a KV cache
     * in a local), the job is not known to train, autograd is not on, and what the
     * running code holds (its locals: the call's own KV cache, and the activations) is at least half the
     * rise.  A cache kept across calls (a global, an attribute) is not the running code's: a growth there
     * stays one */
    const og_role_facts_t *rf = &d->roles;
    if (d->decoding && rf->known && rf->act_known && fw->has && fw->grad_enabled != 1 && fw->training != 1 &&
        !rf->grads && !rf->opt && 2 * rf->working >= rise) {
        g->gen_built = true;
        g->gen_per_step = per_step;
        g->gen_first = lows[0];
        g->gen_last = lows[steps - 1];
        return false;
    }
    /* one inference call building up (a forward or evaluation pass keeping each layer's output: hidden states
     * asked for, a U-Net's skips; a retry inside the handler of the earlier OOM, beside the failed attempt's
     * tensors its traceback keeps), not memory kept across batches: autograd off, the job not known to train,
     * and the activations of the running call (not what Python objects hold: outputs a loop keeps in a list are
     * a holder, and a leak) are at least half the rise */
    /* ... also with autograd on, where the model is not training and no holder keeps a graph (an attribution's or
     * an explainer's forward keeping each layer's output for the gradient it asks of its input: a pass building
     * up, not graphs kept across batches, which roles.graph_holder would name) */
    /* ... with the activations count what locals of a module's own pass hold (module_pass_local: a list the model's
     * forward fills with each layer's attention map and stacks): made anew by every call, they outlive none.  Not the
     * frame that decided the phase: an evaluation loop's list of every batch's logits lives there */
    bool no_kept_graph = fw->grad_enabled == 1 && rf->graph_holder < 0;
    uint64_t pass_held = 0;
    for (int i = 0; i < OG_FILLED(ro->nholders, ro->holders); i++)
        if (module_pass_local(ro->holders[i].where, r))
            pass_held = add_sat(pass_held, ro->holders[i].bytes);
    if ((d->phase == OG_JP_forward || d->phase == OG_JP_evaluation || d->phase == OG_JP_oom_handler) && rf->known &&
        rf->act_known && fw->has && (fw->grad_enabled == -1 || no_kept_graph) && fw->training != 1 && !rf->grads &&
        !rf->opt && 2 * add_sat(rf->act, pass_held) >= rise) {
        g->pass_built = true;
        return false;
    }
    /* the job's own state arriving, not tensors kept: when the roles measured what a training job
     * holds for good (parameters, buffers, gradients, optimizer state, graph pools), the low points
     * rising up to that state are the model arriving and the first step's gradients and optimizer
     * state (and the cache rebuilt after an empty_cache()).  What the steps keep is the rise beyond
     * it, and that must be significant on its own: more than the cache's measured slack and at least two
     * steps' worth (the optimizer's state made one tensor at a time ends a few MiB above its measure) */
    uint64_t state = d->roles.state_known ? d->roles.state : 0;
    /* ... and in the first backward of the run (no optimizer step ever: steps watched, none made), with no holder
     * keeping a graph, the activations it is consuming are that one pass's: no iteration has ended to leave them */
    if (state && d->phase == OG_JP_backward && d->roles.steps_known && d->roles.steps_made == 0 && rf->act_known &&
        rf->graph_holder < 0)
        state = add_sat(state, rf->act);
    if (state) {
        uint64_t kept = sub0(lows[steps - 1], lows[0] > state ? lows[0] : state);
        bool kept_big =
            (double)kept / (double)d->total + 1e-12 >= gm ||
            (d->shortfall > 0 && kept >= d->shortfall && steps >= 16 && kept > d->cached && kept >= 2 * per_step);
        if (!kept_big) {
            g->state_built = true;
            g->state = state;
            return false;
        }
    }
    g->marker = marker;
    g->size = size;
    g->seen = seen;
    g->steps = steps;
    g->rising = rising;
    g->transitions = transitions;
    g->per_step = per_step;
    g->max_step = rises[transitions - 1];
    g->rise = rise;
    g->first_low = lows[0];
    g->last_low = lows[steps - 1];
    g->rising_share = rising_share;
    return true;
}

/* the allocation size seen most often in the history (>= 16 times), 0 if none; one pass over
 * the events with a table of 64 sizes (sizes beyond the first 64 distinct ones are not counted) */
static uint64_t modal_alloc_size(const og_record_t *r)
{
    int ne = r->history.events ? r->history.nevents : 0;
    uint64_t size[64];
    int count[64], n = 0;
    for (int i = 0; i < ne; i++) {
        const struct og_hist_ev *e = &r->history.events[i];
        if (!is_op(e, OG_OP_ALLOC))
            continue;
        int k = 0;
        while (k < n && size[k] != e->bytes)
            k++;
        if (k == n) {
            if (n == 64)
                continue;
            size[n] = e->bytes;
            count[n++] = 0;
        }
        count[k]++;
    }
    int best = -1;
    for (int k = 0; k < n; k++)
        if (best < 0 || count[k] > count[best])
            best = k;
    return best >= 0 && count[best] >= 16 ? size[best] : 0;
}

#define STEPS_MIN      4 /* samples after optimizer steps for a rise read from them */
#define STEPS_FLAT_MIN 8 /* ... and for a flat run */

/* The steps of the optimizer (the adapter's allocated bytes right after each of its latest steps, facts
 * in g): a rise kept across iterations shows there step after step, however small, and however few
 * steps the driver saw (a warm cache serves the iterations; the driver sees a new segment now and then).
 * True when it rose in >= growth_rising_steps of them by a significant amount: >= growth_min of the
 * device over the steps read, or estimated over every step the optimizer made (the median rise times
 * them), or at least what is missing now (and 0.5% of the device).  Flat (no rise in most, within 1% of the device over >= 8,
 * or without a trend: the later half's low point above the earlier half's by less than growth_min of the device and
 * less than what is missing): g->steps_flat.  No series (no adapter, no optimizer, another framework): neither. */
static bool growth_by_steps(const og_facts_t *d, const og_record_t *r, og_growth_scratch_t *s, og_growth_facts_t *g)
{
    const og_framework_view_t *fw = &r->memory.fw;
    const og_roles_t *ro = &fw->roles;
    int n = fw->has && ro->has ? ro->nsteps : 0;
    if (n > OG_STEP_SERIES)
        n = OG_STEP_SERIES;
    if (n < STEPS_MIN || d->total == 0)
        return false;
    const uint64_t *a = ro->step_alloc;
    int transitions = n - 1, rising = 0;
    uint64_t lo = a[0], hi = a[0];
    for (int i = 1; i < n; i++) {
        s->rises[i - 1] = sub0(a[i], a[i - 1]);
        rising += a[i] > a[i - 1];
        lo = a[i] < lo ? a[i] : lo;
        hi = a[i] > hi ? a[i] : hi;
    }
    double rising_share = (double)rising / transitions;
    if (rising_share + 1e-9 < d->growth_rising_steps) {
        /* ... or without a trend (batches of varying lengths: each step keeps a different amount until the next
         * frees it): the later half's lowest point above the earlier half's by less than the growth's minimum share
         * of the device and less than what is missing, so what the iterations keep explains nothing */
        uint64_t lo1 = a[0], lo2 = a[n / 2];
        for (int i = 1; i < n; i++) {
            if (i < n / 2)
                lo1 = a[i] < lo1 ? a[i] : lo1;
            else
                lo2 = a[i] < lo2 ? a[i] : lo2;
        }
        double trough_rise = (double)sub0(lo2, lo1);
        bool trendless =
            trough_rise < d->growth_min_share * (double)d->total && d->shortfall && trough_rise < (double)d->shortfall;
        /* a series of every step the device's run made (the first one's included: no other optimizer stepped there,
         * measured) spans that whole run, however short: what it kept across its steps shows there, so STEPS_MIN of
         * them within 1% is flat too.  Another optimizer's earlier steps (a new one per round or client) leave the
         * run before this optimizer unseen */
        bool whole_run = ro->steps_known && ro->steps_made <= (uint64_t)n && ro->device_steps_known &&
                         ro->device_steps <= (uint64_t)n;
        g->steps_flat = (n >= STEPS_FLAT_MIN || whole_run) &&
                        ((double)(hi - lo) <= 0.01 * (double)d->total || (trendless && n >= STEPS_FLAT_MIN));
        return false;
    }
    qsort(s->rises, (size_t)transitions, sizeof *s->rises, cmp_u64);
    uint64_t per_step = s->rises[transitions / 2];
    uint64_t rise = sub0(a[n - 1], a[0]);
    uint64_t made = ro->steps_made > (uint64_t)n ? ro->steps_made : (uint64_t)n;
    double gm = d->growth_min_share * (double)d->total;
    /* the latest steps' rise carried over the whole run is an inference; the run's own series
     * (roles.allocated_over_run), spanning more steps than the latest ones, measures it: ended within 1% of the
     * device of where it began, the run kept nothing, whatever the latest steps did */
    int nr = ro->nstep_run > OG_STEP_SERIES ? OG_STEP_SERIES : ro->nstep_run;
    bool run_flat = nr >= STEPS_MIN && ro->step_run_every && (uint64_t)nr * ro->step_run_every > (uint64_t)n &&
                    (double)sub0(ro->step_run[nr - 1], ro->step_run[0]) <= 0.01 * (double)d->total;
    bool big_enough = (double)rise + 1e-6 >= gm || (!run_flat && (double)per_step * (double)(made - 1) >= gm) ||
                      (d->shortfall > 0 && rise >= d->shortfall && (double)rise >= 0.005 * (double)d->total);
    if (per_step == 0 || !big_enough)
        return false;
    g->marker = OG_MARK_OPTIMIZER_STEP;
    g->size = 0;
    g->seen = (long)made;
    g->steps = n;
    g->rising = rising;
    g->transitions = transitions;
    g->per_step = per_step;
    g->rise = rise;
    g->first_low = a[0];
    g->last_low = a[n - 1];
    g->rising_share = rising_share;
    return true;
}

/* The run's series (roles.allocated_over_run: the allocated bytes after every N-th optimizer step of the whole run):
 * an iteration of many optimizer steps (a PPO epoch over its mini-batches) that keeps memory makes a staircase, flat
 * within the iteration and up between them, which the latest steps' series sees as one rise at most.  Held: the
 * series spans more steps than the latest one, never falls by more than 1% of the device between points, rises by at
 * least 0.5% of the device at >= 3 separate points (a buffer made once is one rise), over >= 4 points, and the whole
 * rise reaches the growth's minimum share of the device or the missing bytes (and 0.5% of the device). */
static bool growth_over_run(const og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    int n = r->memory.fw.has && ro->has ? ro->nstep_run : 0;
    n = n > OG_STEP_SERIES ? OG_STEP_SERIES : n;
    if (n < STEPS_MIN || !d->total || !ro->step_run_every ||
        (uint64_t)n * ro->step_run_every <= (uint64_t)(ro->nsteps > 0 ? ro->nsteps : 0))
        return false;
    const uint64_t *a = ro->step_run;
    double tol = 0.01 * (double)d->total, jump = 0.005 * (double)d->total;
    int rises = 0;
    for (int i = 1; i < n; i++) {
        if ((double)a[i] + tol < (double)a[i - 1])
            return false;
        rises += (double)a[i] >= (double)a[i - 1] + jump;
    }
    uint64_t rise = sub0(a[n - 1], a[0]);
    double gm = d->growth_min_share * (double)d->total;
    if (rises < 3 || !((double)rise >= gm || (d->shortfall && rise >= d->shortfall && (double)rise >= jump)))
        return false;
    uint64_t spanned = (uint64_t)(n - 1) * ro->step_run_every;
    g->marker = OG_MARK_OPTIMIZER_STEP;
    g->size = 0;
    g->over_run = true;
    g->every = ro->step_run_every;
    g->seen = (long)(ro->steps_made > spanned ? ro->steps_made : spanned);
    g->steps = n;
    g->rising = rises;
    g->transitions = n - 1;
    g->per_step = spanned ? rise / spanned : 0;
    g->rise = rise;
    g->first_low = a[0];
    g->last_low = a[n - 1];
    g->rising_share = (double)rises / (double)(n - 1);
    return true;
}

/* Growth read from the optimizer's steps first, where the adapter measured them: the framework's own
 * allocated bytes after each step rise (kept across iterations) or stay flat (nothing kept: what the
 * driver saw rise was the cache or one pass, and the rule does not hold); else marked by the failing size
 * (a leak fails doing what every step did), else by the size allocated most often (a leak of small
 * tensors while something else failed), else by every allocation (a leak of varying sizes), held to a
 * stricter pattern: >= 16 steps, >= 90% rising. */
/* Measured, not read from the driver: a holder keeps outputs whose autograd graphs are alive (roles.graphs_measured:
 * a rollout's log-probabilities collected with autograd on, a hidden state carried without detach), one per
 * iteration of the loop that fills it: each iteration left its pass's activations behind, and nothing was ever freed
 * for the driver's low points to show it.  Held when the holder has >= GRAPH_STEPS_MIN tensors and what their graphs
 * keep (roles.kept_graphs) reaches the growth's minimum share of the device or the missing bytes; steps count its
 * tensors, each a rise of kept_graphs / n. */
#define GRAPH_STEPS_MIN 8
static bool growth_by_graphs(const og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    const og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!k->graphs_measured || k->graph_holder < 0 || k->graph_holder >= ro->nholders || !k->kept_graphs || !d->total)
        return false;
    uint64_t n = ro->holders[k->graph_holder].tensors;
    double gm = d->growth_min_share * (double)d->total;
    if (n < GRAPH_STEPS_MIN || !((double)k->kept_graphs >= gm || (d->shortfall && k->kept_graphs >= d->shortfall)))
        return false;
    g->marker = OG_MARK_KEPT_GRAPHS;
    g->size = 0;
    g->seen = n > (uint64_t)LONG_MAX ? LONG_MAX : (long)n;
    g->steps = n > OG_GROWTH_MAX_STEPS ? OG_GROWTH_MAX_STEPS : (int)n;
    g->rising = g->transitions = g->steps - 1;
    g->rising_share = 1.0;
    g->rise = k->kept_graphs;
    g->per_step = k->kept_graphs / n;
    g->last_low = og_known(ro->allocated_bytes) && ro->allocated_bytes.v >= k->kept_graphs ? ro->allocated_bytes.v
                                                                                           : k->kept_graphs;
    g->first_low = g->last_low - k->kept_graphs;
    return true;
}

/* a local of a caller of the running code ("local in main (train.py:40)"), not of the pass itself (pass_own_local):
 * what a loop around the running call keeps */
static bool caller_local(const char *where, const og_record_t *r)
{
    return og_where_local(where) && !pass_own_local(where, r);
}

/* the bytes of one record of a holder that is a collection of like records (roles.holders[].records, 2 or more); 0
 * for anything else */
static double record_bytes(const og_role_holder_t *h)
{
    return h->records >= 2 ? (double)h->bytes / (double)h->records : 0;
}

/* Measured as well: a local of a caller of the running code (not the pass's own, pass_own_local: main()'s `results`)
 * is a collection of RECORD_STEPS_MIN or more like records (roles.holders[].records), and what Python holds beside it
 * is one more record, within an eighth (the call under way builds the next: results[ckpt] = evaluate(model, ckpt)
 * keeping each checkpoint's metric states on the GPU).  The caller's loop keeps what each call made, one record an
 * iteration, however few iterations the driver's history shows.  Held when the holder reaches the growth's minimum
 * share of the device or the missing bytes; the steps are its records and the call under way, each a rise of one
 * record. */
#define RECORD_STEPS_MIN 2
/* ... or each record keeps a copy of the model that is running (a trainer per scene kept in a results dict): one
 * group of models (roles.models, parameters on the device) has exactly one copy running and as many more copies as
 * the holder has records, and the holder's bytes are at least those copies' parameters.  The loop kept one record
 * with its model per iteration; the running copy is the next one's, however its state is spread over names */
static bool records_keep_copies(const og_record_t *r, const og_role_holder_t *h)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    for (int i = 0; i < OG_FILLED(ro->nmodels, ro->models); i++) {
        const int n = ro->models[i].count, running = ro->models[i].running;
        if (running == 1 && n >= 2 && (int64_t)(n - 1) == h->records &&
            (double)h->bytes >= (double)(n - 1) * (double)ro->models[i].bytes)
            return true;
    }
    return false;
}

static bool growth_by_records(const og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!d->roles.known || !d->total || !og_known(ro->bytes[OG_ROLE_held_by_python]))
        return false;
    double gm = d->growth_min_share * (double)d->total;
    int nh = OG_FILLED(ro->nholders, ro->holders), best = -1;
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        char where[sizeof h->where];
        og_cpy(where, sizeof where, h->where, sizeof where);
        if (!caller_local(where, r) || h->copy_of[0] || h->records < RECORD_STEPS_MIN ||
            !((double)h->bytes >= gm || (d->shortfall && h->bytes >= d->shortfall)))
            continue;
        double per = record_bytes(h), beside = (double)sub0(ro->bytes[OG_ROLE_held_by_python].v, h->bytes);
        if (((per > 0 && beside >= 0.875 * per && beside <= 1.125 * per) || records_keep_copies(r, h)) &&
            (best < 0 || h->bytes > ro->holders[best].bytes))
            best = i;
    }
    if (best < 0)
        return false;
    const og_role_holder_t *h = &ro->holders[best];
    g->marker = OG_MARK_KEPT_RECORDS;
    g->holder = best;
    g->size = 0;
    g->seen = h->records >= LONG_MAX ? LONG_MAX : (long)h->records + 1;
    g->steps = h->records >= OG_GROWTH_MAX_STEPS ? OG_GROWTH_MAX_STEPS : (int)h->records + 1;
    g->rising = g->transitions = g->steps - 1;
    g->rising_share = 1.0;
    g->rise = h->bytes;
    g->per_step = h->bytes / (uint64_t)h->records;
    g->last_low = og_known(ro->allocated_bytes) && ro->allocated_bytes.v >= h->bytes ? ro->allocated_bytes.v : h->bytes;
    g->first_low = g->last_low - h->bytes;
    return true;
}

/* Measured too: the failing operation is a deep copy of a model a name holds (roles.copy_source) that rebinds a name
 * holding an earlier copy (roles.copy_replaces: qmodel = copy.deepcopy(base), an iteration's variable), and models
 * of the source's class and size (within an eighth) that no name of the running code holds (roles.models[].named;
 * the one the statement rebinds is not counted there) are two or more: the name's and at least one more.  The loop
 * made one copy an iteration and something it keeps (a list of results, a dict of candidates) holds the earlier
 * ones.  The steps are those copies and the one under way, each a rise of one copy; a copy a name holds on purpose
 * (a second model compared) is none of them. */
static bool growth_by_copies(const og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    const og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!k->known || k->operation != OG_OP_copy || k->copy_source_group < 0 || !k->copy_replaces)
        return false;
    const int s = k->copy_source_group;
    uint64_t each = ro->models[s].bytes;
    long unnamed = 0;
    for (int i = 0; i < OG_FILLED(ro->nmodels, ro->models); i++) {
        uint64_t b = ro->models[i].bytes;
        if (strncmp(ro->models[i].cls, ro->models[s].cls, sizeof ro->models[s].cls) == 0 && ro->models[i].named >= 0 &&
            ro->models[i].count > ro->models[i].named && (b > each ? b - each : each - b) <= each / 8)
            unnamed += ro->models[i].count - ro->models[i].named;
    }
    if (unnamed < 2)
        return false;
    g->marker = OG_MARK_KEPT_COPIES;
    g->size = 0;
    g->seen = unnamed + 1;
    g->steps = (int)(g->seen < OG_GROWTH_MAX_STEPS ? g->seen : OG_GROWTH_MAX_STEPS);
    g->rising = g->transitions = g->steps - 1;
    g->rising_share = 1.0;
    g->rise = each * (uint64_t)unnamed;
    g->per_step = each;
    g->last_low = og_known(ro->allocated_bytes) && ro->allocated_bytes.v >= g->rise ? ro->allocated_bytes.v : g->rise;
    g->first_low = g->last_low - g->rise;
    return true;
}

/* what the adapter measured kept, one piece per iteration: outputs with their graphs, a caller's records, or copies
 * of a model */
static bool growth_measured(const og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    return growth_by_graphs(d, r, g) || growth_by_records(d, r, g) || growth_by_copies(d, r, g);
}

/* a collective-communication library (NCCL, RCCL), by the base name of its file */
static bool comm_library(const char *base)
{
    return strncmp(base, "libnccl", 7) == 0 || strncmp(base, "librccl", 7) == 0;
}

/* What rose is not the framework's (growth.library_setup): its adapter measured its objects (roles known), the
 * framework's libraries hold less than the rise in all, so they cannot be keeping it, and one library outside the
 * framework (not a collective-communication one: communication() reads those) holds at least 9/10 of the rise and
 * took 7/8 or more of its bytes within one quarter of the run: state a library sets up once (a context's engines,
 * a workspace per thread), not objects kept iteration after iteration; non_framework names it */
#define SETUP_RISE_SHARE  0.9
#define SETUP_ONE_QUARTER 0.875
static bool library_setup(const og_facts_t *d, const og_record_t *r, const og_growth_facts_t *g)
{
    if (!d->roles.known || !g->rise || r->memory.framework_bytes >= g->rise)
        return false;
    int n = r->memory.nlibs < 0 ? 0 : r->memory.nlibs > 32 ? 32 : r->memory.nlibs;
    for (int i = 0; i < n; i++) {
        const og_lib_usage_t *u = &r->memory.by_library[i];
        char l[sizeof u->library];
        og_cpy(l, sizeof l, u->library, sizeof l);
        const char *b = og_base_name(l);
        if (u->framework || !u->by_quarter_known || (double)u->bytes < SETUP_RISE_SHARE * (double)g->rise ||
            comm_library(b))
            continue;
        for (int q = 0; q < OG_QUARTERS; q++)
            if ((double)u->by_quarter[q] >= SETUP_ONE_QUARTER * (double)u->bytes)
                return true;
    }
    return false;
}

/* a staircase the driver saw (one of its readings below held) that is what torch.load restored onto the GPU and
 * Python objects hold (roles.restored_held, at least 9/10 of the rise): shards, a dataset or a checkpoint arriving,
 * a load and not a leak; the optimizer's own series, read before, is not overruled (growth.restored_load) */
static bool driver_growth_holds(og_facts_t *d, const og_record_t *r, og_growth_facts_t *g)
{
    if (d->roles.known && d->roles.restored_held && (double)d->roles.restored_held >= 0.9 * (double)g->rise) {
        g->restored_load = true;
        return false;
    }
    /* ... or several copies of one model run at once (growth.concurrent_loops): the driver sees their loops
     * interleaved, and what rises is loops starting beside each other, not what one loop keeps */
    if (d->roles.known && d->roles.concurrent_copies) {
        g->concurrent_loops = true;
        return false;
    }
    /* ... or what rose is one library's outside the framework, taken at one time (growth.library_setup) */
    if (library_setup(d, r, g)) {
        g->library_setup = true;
        return false;
    }
    /* ... or the models arriving in a job that does not train (growth.weights_load): their parameters are at least
     * 9/10 of the rise, nothing says the job trains, and Python keeps nothing across calls, no second copy of a model
     * and no map of models by key (a registry of loaded models, a model reloaded per request and kept, experts an
     * LRU moved here and never back: those are leaks), no pile of LoRA adapters (roles.lora_piled: one loaded per
     * request and kept), and no model has parameters still elsewhere (weights coming and going, an offloading
     * loop, not a load done) */
    const og_role_facts_t *k = &d->roles;
    /* ... or, in a training job on a PyTorch whose optimizer steps no adapter can read (before 2.0: no step hook),
     * the job's own state and the pass now running (growth.working_set): measured where the bytes are, not read
     * from when the driver saw them; no second copy of a model and no map of models */
    bool in_pass = d->phase == OG_JP_forward || d->phase == OG_JP_backward || d->phase == OG_JP_optimizer_step;
    if (k->known && k->act_known && d->trains == 1 && in_pass && d->torch_version > 0 && d->torch_version < 200 &&
        !k->graphs_measured && !k->model_copies && !k->keyed_models && (double)k->held * 10 < (double)g->rise &&
        (double)k->params + (double)k->grads + (double)k->opt + (double)k->act >= 0.9 * (double)g->rise) {
        g->working_set = true;
        return false;
    }
    if (!k->known || d->trains == 1 || k->model_copies || k->keyed_models || k->model_away || k->lora_piled)
        return true;
    /* ... with what holders keep in a pool made in one piece (an engine's KV cache): four tensors or more, each
     * larger than two typical steps' rise, together no more than the largest step's: made within one step, while
     * a leak keeps about a step's rise per step and a cache grown token by token (a DynamicCache) rises a little
     * in every step.  Such a pool kept across calls (the engine held by the program) is not what Python keeps
     * across calls in the leak's sense: anything kept beyond it is */
    uint64_t at_once = 0;
    int nh = OG_FILLED(r->memory.fw.roles.nholders, r->memory.fw.roles.holders);
    for (int i = 0; i < nh && g->per_step; i++) {
        const uint64_t b = r->memory.fw.roles.holders[i].bytes, n = r->memory.fw.roles.holders[i].tensors;
        if (n >= 4 && (double)b / (double)n >= 2.0 * (double)g->per_step && b <= g->max_step)
            at_once = add_sat(at_once, b);
    }
    if (k->kept_across > at_once)
        return true;
    if ((double)k->params + (double)at_once >= 0.9 * (double)g->rise) {
        g->weights_load = true;
        g->reserved_at_once = at_once;
        return false;
    }
    return true;
}

static void growth(og_facts_t *d, const og_record_t *r, og_growth_scratch_t *s)
{
    og_growth_facts_t *g = &d->growth;
    g->holder = -1;
    if (growth_by_steps(d, r, s, g)) {
        g->holds = true;
        return;
    }
    if (g->steps_flat) {
        /* flat lately, yet the run's series rose and what Python objects keep across calls is that rise: a cache
         * that grows with each new key (rarer as the run goes on: a bias per padded length), not a working set */
        uint64_t kept = d->roles.kept_across;
        og_growth_facts_t flat = *g;
        if (d->roles.known && kept && growth_over_run(d, r, g) && (double)kept >= 0.9 * (double)g->rise) {
            g->kept_paused = g->holds = true;
            return;
        }
        *g = flat; /* the flat reading stands */
        /* ... save where a holder keeps outputs whose graphs the adapter read alive: measured, not inferred from when
         * the steps were; a loop that serves (or evaluates) between steps keeps them whatever the steps did, and a
         * stall of its steps (labels that come late) leaves the series flat while they pile up */
        g->holds = growth_measured(d, r, g);
        return;
    }
    if (growth_over_run(d, r, g)) {
        g->holds = true;
        return;
    }
    if (growth_measured(d, r, g)) {
        g->holds = true;
        return;
    }
    const og_roles_t *ro = &r->memory.fw.roles;
    /* before the first step ends, so no iteration has: an optimizer holds the device's parameters and the adapter
     * saw it make no step (a measured zero), or an Adam-like one has no state yet (it makes its moments at its
     * first step); not when a loop's iterations ended, each leaving its graph */
    bool before_first = d->roles.known && d->roles.opt_params && !d->roles.graphs_measured &&
                        ((ro->steps_known && ro->steps_made == 0) ||
                         (d->roles.opt_adam && og_known(ro->bytes[OG_ROLE_optimizer_state]) && d->roles.opt == 0));
    if (r->memory.fw.has && ro->has &&
        ((ro->nsteps > 0 && ro->steps_made >= 1 && ro->steps_made < STEPS_MIN) || before_first) &&
        (d->phase == OG_JP_forward || d->phase == OG_JP_backward || d->phase == OG_JP_optimizer_step ||
         d->phase == OG_JP_ema_update)) {
        g->first_steps = true;
        return;
    }
    if (d->req_known && growth_for(d, r, s, g, d->req, OG_MARK_FAILING_SIZE)) {
        g->holds = driver_growth_holds(d, r, g);
        return;
    }
    if (g->gen_built)
        return; /* the failing size's steps were one generation building: no coarser reading overrides it */
    uint64_t m = modal_alloc_size(r);
    if (m && (!d->req_known || (m > d->req ? m - d->req : d->req - m) > d->req / 32) &&
        growth_for(d, r, s, g, m, OG_MARK_MODAL_SIZE)) {
        g->holds = driver_growth_holds(d, r, g);
        return;
    }
    if (g->gen_built)
        return;
    if (growth_for(d, r, s, g, 0, OG_MARK_EVERY_ALLOCATION) && g->steps >= 16 && g->transitions &&
        g->rising * 10 >= g->transitions * 9)
        g->holds = driver_growth_holds(d, r, g);
}

/* ------------------------------------------------------------------ a load the request belongs to */

/* Failing inside a burst of equal allocations that are all kept: a load (weights), not a step; an
 * earlier burst of the same size still held: a second copy loaded beside the first. */
/* The typical spacing (median, seconds) of the run of equal blocks at the end of the history, the
 * failure's own events left out; -1 when it has no gap.  Its latest 256 gaps. */
static double load_spacing(const struct og_hist_ev *e, int ne, int fail0, uint64_t req, uint64_t tol)
{
    uint64_t gaps[256];
    int n = 0, prev = -1;
    for (int i = ne - 1; i >= 0 && n < 256; i--) {
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL) ||
            (is_op(&e[i], OG_OP_FREE) && fail0 >= 0 && i >= fail0))
            continue;
        if (!is_op(&e[i], OG_OP_ALLOC) || (e[i].bytes > req ? e[i].bytes - req : req - e[i].bytes) > tol)
            break;
        if (prev >= 0) {
            double g = e[prev].t_rel - e[i].t_rel;
            gaps[n++] = g > 0 ? (uint64_t)(g * 1e9) : 0;
        }
        prev = i;
    }
    if (!n)
        return -1;
    qsort(gaps, (size_t)n, sizeof *gaps, cmp_u64);
    return (double)gaps[n / 2] / 1e9;
}

static void load(og_facts_t *d, const og_record_t *r)
{
    const struct og_hist_ev *e = r->history.events;
    int ne = e ? r->history.nevents : 0, run = 0, earlier = 0, i = ne - 1;
    uint64_t held_before = 0;
    uint64_t tol = 2ULL << 20; /* shards of one checkpoint are the same size */
    int fail0 = -1, prev = -1;
    if (!d->req_known) /* a burst of the request's size: no size known, no burst to find */
        return;
    for (int k = ne - 1; k >= 0 && k >= ne - 32; k--) /* where the failures at the end began */
        if (is_op(&e[k], OG_OP_FAIL))
            fail0 = k;
    /* (the failure's own events are found by their order, not their time).  A pause ends the run
     * (a second copy loaded later) only when it is LOAD_GAP_S or more AND LOAD_PAUSE_RATIO times the
     * run's typical spacing: a slow load (a network file system, ~0.1 s a piece) whose pieces come a
     * little later when the host is busy stays one load */
    double spacing = load_spacing(e, ne, fail0, d->req, tol);
    for (; i >= 0; i--) {
        /* failed attempts and the releases between them are the failure's own, not the load's */
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL) ||
            (is_op(&e[i], OG_OP_FREE) && fail0 >= 0 && i >= fail0))
            continue;
        bool same =
            is_op(&e[i], OG_OP_ALLOC) && (e[i].bytes > d->req ? e[i].bytes - d->req : d->req - e[i].bytes) <= tol;
        double gap = prev >= 0 ? e[prev].t_rel - e[i].t_rel : 0;
        if (!same || (gap > LOAD_GAP_S && gap > LOAD_PAUSE_RATIO * spacing))
            break;
        prev = i;
        run++;
        held_before = sub0(e[i].live, e[i].bytes);
    }
    for (; run >= 4 && i >= 0; i--) {
        if (is_op(&e[i], OG_OP_NONE) || is_op(&e[i], OG_OP_FAIL))
            continue;
        if (!is_op(&e[i], OG_OP_ALLOC) || (e[i].bytes > d->req ? e[i].bytes - d->req : d->req - e[i].bytes) > tol)
            break;
        earlier++;
    }
    /* a load builds what the process holds: a run of equal blocks on top of a larger working set
     * (a forward pass, an optimizer's state) is the job's own, not weights arriving */
    bool built = (double)held_before < (double)run * (double)d->req;
    /* a slow load: its pieces arrive one step at a time, and the failing request is the next piece
     * (a request far larger than a piece, e.g. the logits after a forward pass whose layers looked
     * like load steps, is not part of it) ... unless the rising steps sat on a working set and
     * nothing was freed (growth): one forward pass keeping each layer's activations, whose weights,
     * merged into one burst, made the every-allocation steps look like a load from nothing */
    const og_growth_facts_t *g = &d->growth;
    if (run < 4 && g->load_steps >= 4 && !g->pass_built && (double)d->req <= 1.5 * (double)g->load_step_bytes) {
        run = g->load_steps;
        built = true;
    }
    /* after optimizer steps the weights were loaded long ago: a run of equal blocks now is a batch
     * (an evaluation's outputs, a bigger validation batch), unless a second copy sits beside them */
    if (r->memory.fw.has && r->memory.fw.training == 1 && earlier < 4)
        built = false;
    d->load.run = run;
    d->load.earlier = earlier;
    d->load.phase =
        run >= 4 && (built || earlier >= 4) ? (earlier >= 4 ? OG_PHASE_SECOND_LOAD : OG_PHASE_LOADING) : OG_PHASE_NONE;
    /* the adapter read another phase from the stack (a forward pass of equal layers): block sizes do
     * not overrule it */
    if (d->phase != OG_JP_unknown && d->phase != OG_JP_loading)
        d->load.phase = OG_PHASE_NONE;
    /* nor when the roles say a copy of the model is being made in a job whose optimizer stepped (a snapshot:
     * its equal blocks beside the weights are the copy, not a second load) */
    if (d->snapshot_stmt ||
        ((d->roles.copy_loose || d->roles.act_copy) && r->memory.fw.has && r->memory.fw.training == 1))
        d->load.phase = OG_PHASE_NONE;
}

/* ------------------------------------------------------------------ across devices, outside the framework */

static void imbalance(og_facts_t *d, const og_record_t *r)
{
    og_imbalance_facts_t *b = &d->imbalance;
    if (d->shortfall == 0 || r->world_size > 1 || r->nsummary < 2)
        return;
    uint64_t mine = 0, most = 0, sum = 0;
    int nother = 0;
    for (int i = 0; i < r->nsummary && i < 16; i++) {
        uint64_t t = r->summary[i].tracked_bytes;
        if (r->summary[i].index == r->event.device)
            mine = t;
        else if (t) {
            nother++;
            sum = add_sat(sum, t);
            if (t > most)
                most = t;
        }
    }
    if (!nother || !most || (double)mine < 1.5 * (double)most)
        return;
    uint64_t avg = sum / (uint64_t)nother;
    if (sub0(mine, avg) < d->shortfall)
        return;
    b->holds = true;
    b->mine = mine;
    b->avg = avg;
    b->nother = nother;
    b->ratio = (double)mine / (double)most;
}

/* Another GPU for this process's work (facts.h, og_spare_facts): one process (no world of ranks, no peer on
 * the failing GPU), >= 2 visible GPUs, bytes missing. */
#define CONTEXT_ALLOWANCE (512ull << 20)
#define NEARLY_IDLE_SHARE 8 /* a GPU holding at most 1/8 of the failing one's bytes is nearly idle */
static void spare_device(og_facts_t *d, const og_record_t *r)
{
    og_spare_facts_t *s = &d->spare;
    s->idle_device = s->device = -1;
    int visible = r->visible_devices > 16 ? 16 : r->visible_devices;
    /* peers of this job share the GPU on purpose (ranks, workers), save a parent alone: this process was started on
     * its parent's GPU (an evaluation the trainer launches), and another GPU is its to use */
    if (d->shortfall == 0 || r->world_size > 1 || (d->npeers && !d->parent_only) || visible < 2)
        return;
    bool used[16] = { false };
    for (int i = 0; i < r->nsummary && i < 16; i++) {
        int ix = r->summary[i].index;
        if (ix < 0 || ix >= 16 || (!r->summary[i].tracked_bytes && !r->summary[i].peak_bytes))
            continue;
        used[ix] = true;
        if (ix != r->event.device && (s->device < 0 || r->summary[i].tracked_bytes < s->held)) {
            s->device = ix;
            s->held = r->summary[i].tracked_bytes;
        }
    }
    /* the summary lists every GPU this process used, the failing one first of all: without it nothing is known */
    int fd = r->event.device;
    for (int ix = 0; ix < visible && s->idle_device < 0 && fd >= 0 && fd < 16 && used[fd]; ix++)
        if (ix != fd && !used[ix])
            s->idle_device = ix;
    s->idle_room = sub0(d->total, CONTEXT_ALLOWANCE);
    if (s->device >= 0 && d->total)
        s->room = sub0(d->total, add_sat(s->held, CONTEXT_ALLOWANCE));
    /* no GPU untouched: the one holding the least is nearly idle when it holds a small fraction of the failing
     * GPU's bytes and has room for the missing bytes and for the models that can move there: frozen models or
     * copies held beside another model that stays (one model alone, split over the cards by a device_map that
     * filled the first, moves nothing whole: its split is what to even out) */
    uint64_t mine = 0, movable = add_sat(d->roles.frozen_models, d->roles.named_copies);
    for (int i = 0; i < r->nsummary && i < 16; i++)
        if (r->summary[i].index == fd)
            mine = r->summary[i].tracked_bytes;
    bool nearly = s->device >= 0 && d->total && (double)s->held * NEARLY_IDLE_SHARE <= (double)mine &&
                  s->room >= d->shortfall && movable && movable < d->roles.model_params && s->room >= movable;
    if (s->idle_device < 0 && nearly) {
        s->idle_device = s->device;
        s->idle_held = s->held;
        s->idle_room = s->room;
    }
    s->idle = s->idle_device >= 0;
    if (s->device < 0 || !d->total)
        return;
    s->split = d->roles.known && d->roles.params && s->held < d->roles.params && s->room >= d->shortfall && !nearly;
}

static void non_framework(og_facts_t *d, const og_record_t *r)
{
    /* another framework's pool that reached the driver through a library no framework is known by
     * (a ctypes call) is that framework's, as its adapter read it: counted once, not as non-framework */
    d->nonfw = sub0(og_or(r->memory.non_framework_bytes, 0), d->other_fw_unlisted);
    d->nonfw_big_lib = -1;
    int n = r->memory.nlibs < 0 ? 0 : r->memory.nlibs > 32 ? 32 : r->memory.nlibs;
    for (int i = 0; i < n; i++)
        if (!r->memory.by_library[i].framework &&
            (d->nonfw_big_lib < 0 || r->memory.by_library[i].bytes > r->memory.by_library[d->nonfw_big_lib].bytes))
            d->nonfw_big_lib = i;
    if (d->nonfw_big_lib >= 0 && !r->memory.by_library[d->nonfw_big_lib].bytes)
        d->nonfw_big_lib = -1;
    d->contexts = -1;
    if (r->memory.contexts_made >= 0 && r->memory.primary_context >= 0) {
        int64_t held = r->memory.contexts_made + (r->memory.primary_context ? 1 : 0);
        d->contexts = held > 100000 ? 100000 : (int)held;
        if (d->contexts >= 2 && og_known(r->memory.context_bytes_estimate))
            d->contexts_extra =
                (uint64_t)((double)r->memory.context_bytes_estimate.v * (d->contexts - 1) / d->contexts);
    }
    uint64_t fwb = r->memory.framework_bytes;
    if (!d->used_known || d->used == 0 || !og_known(r->memory.non_framework_bytes) || d->shortfall == 0)
        return;
    if (r->framework == OG_FW_UNKNOWN && fwb == 0)
        return; /* no framework: "outside the framework" would be everything */
    uint64_t nf = d->nonfw;
    double share = (double)nf / (double)d->used;
    d->nonfw_holds = share >= d->nonfw_share && nf >= d->shortfall && nf >= NONFW_FLOOR;
}

/* ------------------------------------------------------------------ phase, roles, one batch's peak, NCCL */

static const char *const job_phase_names[OG_JP_COUNT] = {
#define OG_JOB_PHASE(name) #name,
#include "phases.def"
#undef OG_JOB_PHASE
};

const char *og_job_phase_name(enum og_job_phase p)
{
    return p > OG_JP_unknown && p < OG_JP_COUNT ? job_phase_names[p] : "unknown";
}

static void job_phase(og_facts_t *d, const og_record_t *r)
{
    char ph[sizeof r->memory.fw.phase];
    og_cpy(ph, sizeof ph, r->memory.fw.phase, sizeof ph);
    d->phase = OG_JP_unknown;
    for (int p = OG_JP_unknown + 1; r->memory.fw.has && ph[0] && p < OG_JP_COUNT; p++)
        if (strcmp(ph, job_phase_names[p]) == 0)
            d->phase = (enum og_job_phase)p;
    if (d->phase != OG_JP_loading)
        return;
    const og_framework_view_t *fw = &r->memory.fw;
    int n = OG_FILLED(fw->npy_frames, fw->py_frames);
    for (int i = -1; i < n && !d->load_via_torch_load; i++) {
        const og_py_frame_t *f = i < 0 ? (fw->has_phase_frame ? &fw->phase_frame : NULL) : &fw->py_frames[i];
        char file[sizeof f->file];
        if (!f)
            continue;
        og_cpy(file, sizeof file, f->file, sizeof file);
        d->load_via_torch_load = strstr(file, "torch/serialization.py") != NULL;
    }
    if (fw->has_phase_frame) { /* the load makes full-precision weights of quantized ones */
        char fn[sizeof fw->phase_frame.function];
        og_cpy(fn, sizeof fn, fw->phase_frame.function, sizeof fn);
        d->load_dequantizes = strncmp(fn, "dequantize", 10) == 0 || strncmp(fn, "_dequantize", 11) == 0;
    }
    const og_roles_t *ro = &fw->roles;
    if (!d->load_via_torch_load && ro->has && ro->has_statement) {
        char p[sizeof ro->stmt_purpose], src[sizeof fw->phase_source];
        og_cpy(p, sizeof p, ro->stmt_purpose, sizeof p);
        og_cpy(src, sizeof src, fw->phase_source, sizeof src);
        bool checkpoint = og_purpose_of(p) == OG_PURPOSE_checkpoint;
        /* a deep copy is running and has made part of its copy on the device (roles.copy_made_bytes): it copies
         * what the device holds, it reads nothing from disk */
        char op[sizeof ro->operation];
        og_cpy(op, sizeof op, ro->operation, sizeof op);
        bool copying = og_operation_of(op) == OG_OP_copy && og_known(ro->copy_made) && ro->copy_made.v > 0;
        /* the statement alone said loading, in a job whose optimizer has stepped or while a deep copy runs: a
         * snapshot being made */
        if (checkpoint && (fw->training == 1 || copying) && strncmp(src, "the failing statement", 21) == 0) {
            d->snapshot_stmt = true;
            d->phase = OG_JP_unknown;
            return;
        }
        /* ... and only where Python objects hold tensors on the device (a state dict restored there, held by a
         * local): a statement copying a state dict from the host into the model's parameters (transformers'
         * _load_state_dict_into_meta_model over shards read on the CPU) restores nothing onto the GPU, and
         * map_location has nothing to move; not measured: as the statement says */
        bool nothing_held = og_known(ro->bytes[OG_ROLE_held_by_python]) && !ro->bytes[OG_ROLE_held_by_python].v;
        d->load_via_torch_load = checkpoint && !nothing_held;
    }
}

static const char *const purpose_names[OG_NPURPOSES] = {
#define OG_PURPOSE(name) #name,
#include "purposes.def"
#undef OG_PURPOSE
};

enum og_purpose og_purpose_of(const char *name)
{
    for (int p = 0; name && name[0] && p < OG_NPURPOSES; p++)
        if (strcmp(name, purpose_names[p]) == 0)
            return (enum og_purpose)p;
    return OG_PURPOSE_NONE;
}

/* What the failing statement's int operands say the request is (og_role_facts_t.request_shape). */
#define REQ_DIM_MIN 128
static enum og_request_shape request_shape(const og_roles_t *ro)
{
    char s[sizeof ro->stmt_ints];
    og_cpy(s, sizeof s, ro->stmt_ints, sizeof s);
    uint64_t v[8];
    int n = 0;
    for (char *p = s; *p && n < 8;) {
        char *e;
        unsigned long long x = strtoull(p, &e, 10);
        if (e == p)
            break;
        if (x >= REQ_DIM_MIN)
            v[n++] = x;
        if (*e != ',')
            break;
        p = e + 1;
    }
    int most = 1; /* how many times the most repeated size was read */
    for (int i = 0; i < n; i++) {
        int same = 0;
        for (int j = 0; j < n; j++)
            same += v[i] == v[j];
        most = same > most ? same : most;
    }
    return most >= 3 ? OG_REQ_CUBE : most == 2 ? OG_REQ_SQUARE : n >= 2 ? OG_REQ_PRODUCT : OG_REQ_UNKNOWN;
}

/* The failing statement's int operands hold a dimension (>= REQ_DIM_MIN) and none of them is the batch size
 * (og_role_facts_t.batchless_sizes); false when either is unknown. */
static bool batchless_sizes(const og_roles_t *ro, int batch)
{
    char s[sizeof ro->stmt_ints];
    og_cpy(s, sizeof s, ro->stmt_ints, sizeof s);
    bool dim = false;
    for (char *p = s; batch > 1 && *p;) {
        char *e;
        unsigned long long x = strtoull(p, &e, 10);
        if (e == p)
            return false;
        if (x == (unsigned long long)batch)
            return false;
        dim = dim || x >= REQ_DIM_MIN;
        if (*e != ',')
            break;
        p = e + 1;
    }
    return dim;
}

/* The N characters at NAME name a batch or what a batch holds: b, bs, bsz, a name holding batch, sample, prompt,
 * image, row...; or a count (n_paths, num_pairs) of anything but the model's own dimensions (heads, layers...) */
static bool is_batch_name(const char *name, size_t n)
{
    static const char *const whole[] = { "b", "n", "bs", "bsz", "nb", "mb", "mbs" };
    static const char *const parts[] = { "batch", "sample", "example", "prompt", "request", "image", "item", "row" };
    char nm[64];
    og_cpy(nm, sizeof nm, name, n);
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++)
        if (strcasecmp(nm, whole[i]) == 0)
            return true;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (strcasestr(nm, parts[i]))
            return true;
    /* a count (n_paths, num_pairs) may be of what a batch holds, unless it counts a model's own dimensions */
    static const char *const dims[] = { "head", "layer", "channel", "feature", "dim", "hidden", "expert", "vocab" };
    if (strncasecmp(nm, "n_", 2) == 0 || strncasecmp(nm, "num_", 4) == 0) {
        for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
            if (strcasestr(nm, dims[i]))
                return false;
        return true;
    }
    return false;
}

/* The request is the failing statement's sizes and nothing else (og_role_facts_t.sizes_make_request): the product
 * of its int operands, two or more, one a dimension (>= REQ_DIM_MIN), times an element size (1, 2, 4 or 8 bytes) is
 * the request less the allocator's rounding (under REQ_ROUNDING), and no name it reads is a batch's (is_batch_name):
 * heads x length x length of one prompt's scores; channels x height x width of one photo.  A batch it would scale
 * with is not among its factors. */
#define REQ_ROUNDING (2u << 20)
static bool sizes_make_request(const og_roles_t *ro, uint64_t req)
{
    char s[sizeof ro->stmt_ints], names[sizeof ro->stmt_names];
    og_cpy(s, sizeof s, ro->stmt_ints, sizeof s);
    og_cpy(names, sizeof names, ro->stmt_names, sizeof names);
    if (!req || !s[0])
        return false;
    for (const char *p = names; *p;) {
        size_t n = strcspn(p, ",");
        if (n && is_batch_name(p, n))
            return false;
        p += n + (p[n] == ',');
    }
    uint64_t prod = 1;
    bool dim = false;
    int sizes = 0;
    for (char *p = s; *p;) {
        char *e;
        unsigned long long x = strtoull(p, &e, 10);
        if (e == p || x == 0 || prod > UINT64_MAX / x)
            return false;
        prod *= x;
        sizes++;
        dim = dim || x >= REQ_DIM_MIN;
        if (*e != ',')
            break;
        p = e + 1;
    }
    /* the allocator rounds a request up (PyTorch: large blocks to 2 MiB); one size alone is a count, not an input's
     * shape */
    for (uint64_t size = 1; dim && sizes >= 2 && size <= 8 && prod <= UINT64_MAX / 8; size *= 2)
        if (req >= size * prod && req - size * prod < REQ_ROUNDING)
            return true;
    return false;
}

static const char *const operation_names[OG_NOPERATIONS] = {
#define OG_OPERATION(name) #name,
#include "operations.def"
#undef OG_OPERATION
};

enum og_operation og_operation_of(const char *name)
{
    char n[24];
    og_cpy(n, sizeof n, name ? name : "", sizeof n);
    for (int p = 0; n[0] && p < OG_NOPERATIONS; p++)
        if (strcmp(n, operation_names[p]) == 0)
            return (enum og_operation)p;
    return OG_OPERATION_NONE;
}

const char *og_operation_name(enum og_operation op)
{
    return op >= 0 && op < OG_NOPERATIONS ? operation_names[op] : "unknown";
}

/* the names of generate() inputs whose size per input the model's processor fixes (an image resized to the model's
 * size, an audio window padded to 30 s): no token axis of their own */
static const char *const fixed_size_inputs[] = { "pixel_values", "pixel_values_videos", "input_features" };

/* NAME is one of the names that hold model group I (roles.models[].names), or reaches it through its object */
static bool model_named(const og_roles_t *ro, int i, const char *name)
{
    char names[sizeof ro->models[0].names];
    og_cpy(names, sizeof names, ro->models[i].names, sizeof names);
    if (og_name_listed(names, name))
        return true;
    /* ... or reached through NAME's object (base.unet: the pipeline `base` holds it; rebinding `base` drops it) */
    size_t len = strlen(name), l;
    const char *cur = names, *p;
    while (len && og_name_next(&cur, &p, &l))
        if (l > len + 1 && strncmp(p, name, len) == 0 && p[len] == '.')
            return true;
    return false;
}

/* the group's models are held only as a map's entries: named, every name NAME[key] */
static bool keyed_group(const og_roles_t *ro, int i)
{
    char names[sizeof ro->models[0].names];
    og_cpy(names, sizeof names, ro->models[i].names, sizeof names);
    if (ro->models[i].named < 1 || !names[0])
        return false;
    static const char key[] = "[key]";
    const char *cur = names, *p;
    size_t l;
    while (og_name_next(&cur, &p, &l))
        if (l <= sizeof key - 1 || strncmp(p + l - (sizeof key - 1), key, sizeof key - 1) != 0)
            return false;
    return true;
}

/* the group is a registry of models (og_role_facts_t.registry_models): >= 2 of them named, every name a map's
 * entry (NAME[key]) */
static bool registry_group(const og_roles_t *ro, int i) { return ro->models[i].named >= 2 && keyed_group(ro, i); }

static uint64_t role_or0(const og_roles_t *ro, enum og_role k) { return og_or(ro->bytes[k], 0); }

/* a holder's kind that keeps entries by key: a dict, an LRU or other cache */
static bool map_kind(const char *kind)
{
    static const char *const maps[] = { "dict", "Dict", "cache", "Cache", "Mapping", "Counter" };
    for (size_t i = 0; i < sizeof maps / sizeof *maps; i++)
        if (strstr(kind, maps[i]))
            return true;
    return false;
}

/* the largest role of the framework's bytes other than held_by_python (measured ones; activations unknown: 0) */
static uint64_t largest_role(const og_roles_t *ro)
{
    uint64_t m = 0;
    for (int i = 0; i < OG_NROLES; i++)
        if (i != OG_ROLE_held_by_python && og_or(ro->bytes[i], 0) > m)
            m = ro->bytes[i].v;
    return m;
}

/* the function a local's label names ("local in cat (gnn.py:52)" -> "cat"): its length, with *FN set to its start;
 * 0 when WHERE is not a local's label */
static size_t local_function(const char *where, const char **fn)
{
    if (!og_where_local(where))
        return 0; /* (the name is read past the prefix only once it is there) */
    *fn = where + sizeof OG_WHERE_LOCAL - 1;
    const char *sp = strchr(*fn, ' ');
    return sp ? (size_t)(sp - *fn) : strlen(*fn);
}

/* the N bytes at FN name the function NAME (a field of at most CAP bytes, not always terminated) */
static bool same_function(const char *fn, size_t n, const char *name, size_t cap)
{
    return n == strnlen(name, cap) && strncmp(fn, name, n) == 0;
}

/* WHERE is a local of a module's own pass: its forward, its __call__, or a function the running forward called (below);
 * made anew by every call of the model */
static bool module_pass_local(const char *where, const og_record_t *r)
{
    static const char *const own[] = { "forward", "__call__", "_call_impl" };
    const char *fn = NULL;
    size_t n = local_function(where, &fn);
    if (!n)
        return false;
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (same_function(fn, n, own[i], strlen(own[i])))
            return true;
    const og_framework_view_t *fw = &r->memory.fw;
    /* ... or of a function the running forward called (a helper of the program's that concatenates the pass's
     * tensors): a frame of its name ("local in cat (gnn.py:52)"; the line too where the label kept it) is on the
     * failing stack inside a forward */
    const char *sp = fn + n, *close = *sp ? strrchr(sp, ')') : NULL, *colon = close ? strrchr(sp, ':') : NULL;
    long line = colon && colon < close ? strtol(colon + 1, NULL, 10) : 0;
    const og_py_frame_t *st = fw->py_frames;
    int outer = -1, n_frames = OG_FILLED(fw->npy_frames, fw->py_frames);
    for (int i = 0; i < n_frames; i++)
        if (!strncmp(st[i].function, "forward", sizeof st[i].function))
            outer = i;
    for (int i = 0; i < outer; i++)
        if ((!line || st[i].line == line) && same_function(fn, n, st[i].function, sizeof st[i].function))
            return true;
    return false;
}

/* WHERE is a local of the running pass's own code (module_pass_local, or the function whose frame decided the phase:
 * generate() building its cache): that pass's working set */
static bool pass_own_local(const char *where, const og_record_t *r)
{
    const char *fn = NULL;
    size_t n = local_function(where, &fn);
    if (!n)
        return false;
    if (module_pass_local(where, r))
        return true;
    const og_framework_view_t *fw = &r->memory.fw;
    return fw->has_phase_frame && same_function(fn, n, fw->phase_frame.function, sizeof fw->phase_frame.function);
}

/* a pass of the model is running (its forward, its backward, an evaluation, a generation) */
static bool pass_phase(enum og_job_phase p)
{
    return p == OG_JP_forward || p == OG_JP_backward || p == OG_JP_evaluation || p == OG_JP_generation;
}

/* the float32 parameters of N models of group I arriving (facts.h: arriving_fp32); one group not read makes the sum
 * unknown */
static void arriving_fp32(og_role_facts_t *k, const og_roles_t *ro, int i, uint64_t n)
{
    if (og_known(ro->models[i].fp32))
        k->arriving_fp32 = add_sat(k->arriving_fp32, ro->models[i].fp32.v * n);
    else
        k->arriving_fp32_known = false;
}

/* the models at least 9/10 float32 beside one under half float32 (roles.fp32_beside_half): a model left in the
 * default float32 next to one the program loaded in half precision or quantized */
static void fp32_beside_half(og_role_facts_t *k, const og_roles_t *ro, int nm)
{
    bool half = false;
    for (int i = 0; i < nm; i++)
        half = half ||
               (og_known(ro->models[i].fp32) && ro->models[i].bytes && 2 * ro->models[i].fp32.v < ro->models[i].bytes);
    for (int i = 0; i < nm && half; i++) {
        if (!og_known(ro->models[i].fp32) || !og_model_float32(ro->models[i].fp32.v, ro->models[i].bytes))
            continue;
        uint64_t n = ro->models[i].count > 0 ? (uint64_t)ro->models[i].count : 0;
        k->fp32_beside_half = add_sat(k->fp32_beside_half, ro->models[i].bytes * n);
        if (k->fp32_group < 0 || ro->models[i].bytes > ro->models[k->fp32_group].bytes)
            k->fp32_group = i;
    }
}

/* a quantized model beside a reference of its class with nothing quantized (roles.quant_reference): the largest
 * such reference, and the quantized group beside it */
static void quant_beside_reference(og_role_facts_t *k, const og_roles_t *ro, int nm)
{
    for (int q = 0; q < nm; q++) {
        if (!og_known(ro->models[q].quant) || !og_model_quantized(ro->models[q].quant.v, ro->models[q].bytes))
            continue;
        for (int i = 0; i < nm; i++) {
            if (i == q || !og_known(ro->models[i].quant) || ro->models[i].quant.v || !ro->models[i].bytes ||
                strncmp(ro->models[i].cls, ro->models[q].cls, sizeof ro->models[i].cls))
                continue;
            if (k->quant_ref_group < 0 || ro->models[i].bytes > ro->models[k->quant_ref_group].bytes) {
                k->quant_ref_group = i;
                k->quant_group = q;
                k->quant_reference = ro->models[i].bytes;
            }
        }
    }
}

/* the failing statement's target or one of the names it reads is a model's logits (facts.h: stmt_logits): the name
 * itself, or its last part after a dot or an underscore (out.logits, lm_logits) */
static bool logits_name(const char *name, size_t n)
{
    static const char word[] = "logits";
    size_t w = sizeof word - 1;
    return n >= w && strncmp(name + n - w, word, w) == 0 &&
           (n == w || name[n - w - 1] == '.' || name[n - w - 1] == '_');
}
static bool names_logits(const og_roles_t *ro)
{
    char t[sizeof ro->stmt_target], names[sizeof ro->stmt_names];
    og_cpy(t, sizeof t, ro->stmt_target, sizeof t);
    og_cpy(names, sizeof names, ro->stmt_names, sizeof names);
    if (logits_name(t, strlen(t)))
        return true;
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        while (l && *p == ' ')
            p++, l--;
        if (logits_name(p, l))
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

/* while a model is built (phase loading), the roots of group I are parts of one being built: roots of a class a
 * running root has (its __init__ executes) while a root of another class runs too (the model whose __init__ builds
 * them), two or more alike, that no name of the running code holds and that do not run themselves (a transformer's
 * __init__ builds its blocks in a list comprehension, each a root until the ModuleList takes them): the model
 * arriving, not copies of anything.  One model of the class running alone beside them, or a single one: a previous
 * copy (a notebook cell run again builds the model's layers beside the first copy) */
static bool parts_arriving(const og_roles_t *ro, int i)
{
    int nm = OG_FILLED(ro->nmodels, ro->models);
    if (ro->models[i].running != 0 || ro->models[i].named != 0 || ro->models[i].count < 2)
        return false; /* a model's layers are many; one unnamed model of the class is a previous copy */
    bool same = false, outer = false;
    for (int j = 0; j < nm; j++) {
        if (j == i || ro->models[j].running <= 0)
            continue;
        if (strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0)
            same = true;
        else
            outer = true;
    }
    return same && outer;
}

static void roles(og_facts_t *d, const og_record_t *r)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    og_role_facts_t *k = &d->roles;
    k->keeper = k->kv = k->dataset_holder = k->registry_group = k->graph_holder = k->keyed_group = k->fp32_group = -1;
    k->graph_cache = -1;
    k->other_group = -1;
    k->stmt_copies = k->restored_holder = k->dominant = k->fp64_holder = -1;
    k->ckpt_holder = k->index_holder = k->ema_holder = k->copy_holder = k->concurrent_group = -1;
    k->copy_source_group = -1;
    k->quant_group = k->quant_ref_group = -1;
    k->building = OG_PURPOSE_NONE;
    k->operation = OG_OPERATION_NONE;
    if (!r->memory.fw.has || !ro->has)
        return;
    int nm = OG_FILLED(ro->nmodels, ro->models);
    uint64_t unnamed = 0; /* of model_copies, the copies in groups no name of the running code reaches */
    char target[sizeof ro->stmt_target];
    og_cpy(target, sizeof target, ro->has_statement ? ro->stmt_target : "", sizeof target);
    fp32_beside_half(k, ro, nm);
    quant_beside_reference(k, ro, nm);
    for (int i = 0; i < nm; i++) {
        uint64_t each = ro->models[i].bytes, n = ro->models[i].count > 0 ? (uint64_t)ro->models[i].count : 0;
        if (ro->models[i].frozen)
            k->frozen_models = add_sat(k->frozen_models, each * n);
        /* trainable, trained by no optimizer, running now: its forward records a graph nothing trains (not a
         * model a loader is building: weights arriving run no forward) */
        else if (ro->models[i].trained == 0 && ro->models[i].running > 0 && d->phase != OG_JP_loading)
            k->untrained_running = add_sat(k->untrained_running, each * (uint64_t)ro->models[i].running);
        if (!ro->models[i].frozen && ro->models[i].training == 0 &&
            (ro->models[i].trained == 0 || (ro->models[i].trained < 0 && ro->noptimizers == 0)))
            k->untrained_eval = add_sat(k->untrained_eval, each * n);
        if (!ro->models[i].frozen && ro->models[i].trained == 0) {
            char pu[sizeof ro->models[0].purpose];
            og_cpy(pu, sizeof pu, ro->models[i].purpose, sizeof pu);
            if (og_purpose_of(pu) == OG_PURPOSE_reference || og_purpose_of(pu) == OG_PURPOSE_teacher)
                k->untrained_ref = add_sat(k->untrained_ref, each * n);
        }
        k->model_params = add_sat(k->model_params, each * n);
        k->model_away = add_sat(k->model_away, ro->models[i].away * n);
        /* models of several groups held one by key each, none running: a map of different models kept resident
         * (counted in keyed_models when there are >= 2 of them) */
        if (!registry_group(ro, i) && keyed_group(ro, i) && ro->models[i].running == 0) {
            uint64_t held = (uint64_t)ro->models[i].named < n ? (uint64_t)ro->models[i].named : n;
            k->keyed_models = add_sat(k->keyed_models, each * held);
            k->keyed_count += (int)held;
            if (k->keyed_group < 0 || each > ro->models[k->keyed_group].bytes)
                k->keyed_group = i;
        }
        if (registry_group(ro, i)) { /* kept by key on purpose: neither leftovers nor models compared */
            uint64_t kept = (uint64_t)ro->models[i].named < n ? (uint64_t)ro->models[i].named : n;
            k->registry_models = add_sat(k->registry_models, each * kept);
            if (k->registry_group < 0)
                k->registry_group = i;
            continue;
        }
        if (d->phase == OG_JP_loading && parts_arriving(ro, i)) /* a model being built: its parts, no copies */
            continue;
        /* trainable copies of which two or more run at once: the job's concurrent loops (threads), not leftovers */
        if (!ro->models[i].frozen && n >= 2 && ro->models[i].running >= 2) {
            k->concurrent_copies = add_sat(k->concurrent_copies, each * (n - 1));
            if (k->concurrent_group < 0 || ro->models[i].running > k->concurrent_runs) {
                k->concurrent_group = i;
                k->concurrent_runs = ro->models[i].running;
                k->concurrent_count = (int)n;
            }
            continue;
        }
        /* the copies beyond the first: those the running code holds by a name beyond one are the program's own
         * (an evaluation copy, a second model compared), the rest leftovers (a previous run's, kept by a
         * traceback); all of them leftovers when a name of theirs is the one the failing statement rebinds */
        uint64_t kept = 0;
        if (n > 1 && ro->models[i].named >= 2 && !model_named(ro, i, target))
            kept = (uint64_t)(ro->models[i].named < (int)n ? ro->models[i].named : (int)n) - 1;
        if (n > 1)
            k->model_copies = add_sat(k->model_copies, each * (n - 1 - kept));
        if (n > 1 && ro->models[i].named == 0)
            unnamed = add_sat(unnamed, each * (n - 1));
        if (kept) {
            k->named_copies = add_sat(k->named_copies, each * kept);
            k->named_frozen = ro->models[i].frozen;
        }
    }
    /* a second copy still arriving beside the first (a notebook cell run again fails while it builds or
     * loads the model: the new copy holds part of its parameters, a group of its own): while a model is being
     * built (phase loading, or the failing statement runs in an __init__), trainable models of one class and
     * different sizes are copies of each other, all but the one arriving releasable: the one running (its
     * __init__ or .to() executes; roles.models[].running), else the smallest; a frozen one is another model (a
     * teacher) */
    char fn[sizeof ro->stmt.function];
    og_cpy(fn, sizeof fn, ro->has_statement ? ro->stmt.function : "", sizeof fn);
    bool building = d->phase == OG_JP_loading || strcmp(fn, "__init__") == 0;
    k->arriving_fp32_known = d->phase == OG_JP_loading;
    for (int i = 0; d->phase == OG_JP_loading && i < nm; i++)
        if (ro->models[i].running > 0) {
            k->arriving = add_sat(k->arriving, ro->models[i].bytes * (uint64_t)ro->models[i].running);
            arriving_fp32(k, ro, i, (uint64_t)ro->models[i].running);
        }
    /* ... with the parts it built before the one running (parts_arriving) */
    for (int i = 0; d->phase == OG_JP_loading && i < nm; i++)
        if (parts_arriving(ro, i)) {
            k->arriving = add_sat(k->arriving, ro->models[i].bytes * (uint64_t)ro->models[i].count);
            arriving_fp32(k, ro, i, (uint64_t)ro->models[i].count);
        }
    /* ... or, none running (from_pretrained builds the model as a local of the library's own frames, which the scan
     * does not read), the one model no name of the running code holds while the failing statement assigns a name
     * (rm = AutoModel.from_pretrained(...)): the model that name will hold */
    if (d->phase == OG_JP_loading && !k->arriving && target[0]) {
        int only = -1, nameless = 0;
        for (int i = 0; i < nm; i++)
            if (ro->models[i].named == 0 && ro->models[i].running == 0 && ro->models[i].count == 1) {
                only = i;
                nameless++;
            }
        if (nameless == 1) {
            k->arriving = ro->models[only].bytes;
            arriving_fp32(k, ro, only, 1);
        }
    }
    k->arriving_fp32_known = k->arriving_fp32_known && k->arriving;
    /* another model resident while one arrives (facts.h: other_resident): the largest, with its name's holders */
    int nho = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; d->phase == OG_JP_loading && k->arriving && i < nm; i++) {
        if (ro->models[i].named <= 0 || ro->models[i].running > 0 || ro->models[i].count != 1 ||
            model_named(ro, i, target) || registry_group(ro, i))
            continue;
        bool other_class = true;
        for (int j = 0; j < nm; j++)
            if (j != i && (ro->models[j].running > 0 || ro->models[j].named == 0) &&
                strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0)
                other_class = false; /* the arriving model is of its class: named_copies reads those */
        if (!other_class)
            continue;
        uint64_t b = ro->models[i].bytes;
        for (int h = 0; h < nho; h++) {
            char hn[sizeof ro->holders[0].name];
            og_cpy(hn, sizeof hn, ro->holders[h].name, sizeof hn);
            if (model_named(ro, i, hn))
                b = add_sat(b, ro->holders[h].bytes);
        }
        if (b > k->other_resident) {
            k->other_resident = b;
            k->other_group = i;
        }
    }
    /* (the parts of a model being built are neither: parts_arriving) */
#define COPY_GROUP(g)                                                              \
    (!ro->models[g].frozen && ro->models[g].count > 0 && !registry_group(ro, g) && \
     !(d->phase == OG_JP_loading && parts_arriving(ro, g)))
    for (int i = 0; building && i < nm; i++) {
        if (!COPY_GROUP(i))
            continue;
        int first = i;
        for (int j = 0; j < i; j++)
            if (COPY_GROUP(j) && strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0)
                first = j < first ? j : first;
        if (first != i)
            continue; /* the class was read at its first group */
        uint64_t sum = ro->models[i].bytes, least = ro->models[i].bytes, kept = 0, arriving = 0;
        int groups = 1;
        for (int j = i; j < nm; j++)
            if (COPY_GROUP(j) && strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0) {
                if (j > i) {
                    sum = add_sat(sum, ro->models[j].bytes);
                    least = ro->models[j].bytes < least ? ro->models[j].bytes : least;
                    groups++;
                }
                if (ro->models[j].running > 0)
                    arriving = add_sat(arriving, ro->models[j].bytes);
                /* a model the running code holds by a name, not running, whose name the statement does not
                 * rebind: a second model kept on purpose (two compared), not a previous copy */
                if (ro->models[j].named > 0 && ro->models[j].running == 0 && !model_named(ro, j, target))
                    kept = add_sat(kept, ro->models[j].bytes);
            }
        if (groups > 1) { /* within a group the copies are counted above */
            uint64_t extra = sum - (arriving && arriving < sum ? arriving : least);
            kept = kept < extra ? kept : extra;
            k->model_copies = add_sat(k->model_copies, extra - kept);
            k->named_copies = add_sat(k->named_copies, kept);
        }
    }
#undef COPY_GROUP
    /* a model of the class the running code uses, in a group of its own (another size: its head, a copy part
     * way), that no name of the running code reaches and none of whose methods runs, beside a trainable one a name
     * holds or that runs: a previous run's (the last fold's, kept by a reference cycle until the collector runs;
     * an earlier trial's), all of it a leftover; a frozen one is another model (a teacher) */
    for (int i = 0; !building && i < nm; i++) {
        if (ro->models[i].frozen || ro->models[i].count <= 0 || ro->models[i].named > 0 || ro->models[i].running > 0 ||
            registry_group(ro, i))
            continue;
        bool beside = false;
        for (int j = 0; j < nm && !beside; j++)
            beside = j != i && !ro->models[j].frozen && (ro->models[j].named > 0 || ro->models[j].running > 0) &&
                     strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0;
        if (!beside)
            continue;
        /* the group's first model was not counted as a copy above (only those beyond it) */
        k->model_copies = add_sat(k->model_copies, ro->models[i].bytes);
        k->unreached_copies = add_sat(k->unreached_copies, ro->models[i].bytes);
        unnamed = add_sat(unnamed, ro->models[i].bytes);
    }
    if (k->keyed_count < 2) /* one model by key is a name, not a map of models */
        k->keyed_models = 0, k->keyed_count = 0, k->keyed_group = -1;
    k->accumulating = ro->has_accum;
    k->pads_to_max = ro->settings[OG_SETTING_padding_to_max_length].has;
    k->extra_outputs = ro->settings[OG_SETTING_extra_outputs].has;
    k->operation = og_operation_of(ro->operation);
    k->copy_made_known = og_known(ro->copy_made);
    k->copy_made = og_or(ro->copy_made, 0);
    /* copy.deepcopy makes a model's submodules before the model holds them: while it runs, models no name reaches
     * are the pieces it made so far (up to roles.copy_made_bytes), the copy under way, not a previous copy */
    if (k->operation == OG_OP_copy && k->copy_made_known) {
        k->copy_pieces = unnamed < k->copy_made ? unnamed : k->copy_made;
        k->model_copies -= k->copy_pieces < k->model_copies ? k->copy_pieces : k->model_copies;
    }
    /* a copy under way whose result replaces a model a name holds now: the statement rebinds that name */
    for (int i = 0; k->operation == OG_OP_copy && target[0] && i < nm; i++)
        if (model_named(ro, i, target) && ro->models[i].bytes > k->copy_replaces)
            k->copy_replaces = ro->models[i].bytes;
    /* and what it copies: a model named by another name the statement reads (copy.deepcopy(model)) */
    char snames[sizeof ro->stmt_names];
    og_cpy(snames, sizeof snames, k->operation == OG_OP_copy && ro->has_statement ? ro->stmt_names : "", sizeof snames);
    for (char *p = snames; *p;) {
        char *e = strchr(p, ',');
        if (e)
            *e = 0;
        for (int i = 0; strcmp(p, target) != 0 && i < nm; i++)
            if (model_named(ro, i, p) && ro->models[i].bytes > k->copy_source) {
                k->copy_source = ro->models[i].bytes;
                k->copy_source_group = i;
            }
        if (!e)
            break;
        p = e + 1;
    }
    k->ddp_buckets = ro->ddp_wrappers > 0 ? ro->ddp_bucket_bytes : 0;
    if (ro->has_statement) {
        char p[sizeof ro->stmt_purpose];
        og_cpy(p, sizeof p, ro->stmt_purpose, sizeof p);
        k->building = og_purpose_of(p);
        k->request_shape = request_shape(ro);
        k->stmt_logits = names_logits(ro);
    }
    k->known = true;
    k->num_beams = ro->num_beams > 0 ? ro->num_beams : 0;
    if (ro->gen_dims >= 2) {
        char in[sizeof ro->gen_input];
        og_cpy(in, sizeof in, ro->gen_input, sizeof in);
        k->gen_inputs = ro->gen_shape[0];
        k->gen_fixed_inputs = ro->gen_dims >= 4;
        for (size_t i = 0; i < sizeof fixed_size_inputs / sizeof *fixed_size_inputs; i++)
            k->gen_fixed_inputs |= !strcmp(in, fixed_size_inputs[i]);
    }
    k->attention = k->operation == OG_OP_attention || k->operation == OG_OP_attention_mask ? 1
                   : !ro->attention_modules.known                                          ? 0
                   : ro->attention_modules.v > 0                                           ? 1
                                                                                           : -1;
    k->checkpointing = ro->checkpointing > 0 ? 1 : ro->checkpointing < 0 ? -1 : 0;
    k->batch_size = ro->batch_size > 0 ? ro->batch_size : 0;
    k->batchless_sizes = ro->has_statement && batchless_sizes(ro, k->batch_size);
    k->sizes_make_request = ro->has_statement && d->req_known && sizes_make_request(ro, d->req);
    k->autocast_code = ro->autocast_in_code;
    k->backward_code = ro->backward_in_code;
    k->input_grad = ro->input_grad;
    k->no_backward = ro->backward_on_stack < 0 && !ro->backward_in_code && !ro->input_grad;
    k->scaler_only = ro->scaler_no_autocast;
    k->steps_known = ro->steps_known;
    k->steps_made = ro->steps_known ? ro->steps_made : 0;
    k->params = role_or0(ro, OG_ROLE_parameters);
    k->grads = role_or0(ro, OG_ROLE_gradients);
    k->per_sample = role_or0(ro, OG_ROLE_per_sample_gradients);
    k->per_sample_n = ro->per_sample_count;
    k->lora_params = og_or(ro->lora_bytes, 0);
    k->lora_base_trained = k->lora_params ? og_or(ro->lora_base, 0) : 0;
    k->embedding = og_or(ro->embedding_bytes, 0);
    k->embedding_tables = og_or(ro->embedding_tables, 0) > 1000000 ? 1000000 : (int)og_or(ro->embedding_tables, 0);
    k->opt = role_or0(ro, OG_ROLE_optimizer_state);
    k->lora_piled = og_lora_ratio(k) >= 0.5 && !k->grads && !k->opt;
    k->pools = role_or0(ro, OG_ROLE_graph_pools);
    k->held = role_or0(ro, OG_ROLE_held_by_python);
    k->act_known = og_known(ro->bytes[OG_ROLE_activations]);
    k->act = role_or0(ro, OG_ROLE_activations);
    int nopt = OG_FILLED(ro->noptimizers, ro->optimizers);
    uint64_t classed = 0;
    for (int i = 0; i < nopt; i++) {
        char cls[sizeof ro->optimizers[0].cls];
        og_cpy(cls, sizeof cls, ro->optimizers[i].cls, sizeof cls);
        classed = add_sat(classed, ro->optimizers[i].bytes);
        if (strstr(cls, "8bit") || strstr(cls, "8Bit"))
            continue; /* already 8-bit (bitsandbytes' Adam8bit, PagedAdamW8bit) */
        k->opt_full = add_sat(k->opt_full, ro->optimizers[i].bytes);
        k->opt_adam = k->opt_adam || strstr(cls, "Adam") != NULL;
    }
    k->opt_full = add_sat(k->opt_full, sub0(k->opt, classed)); /* state of no named class */
    for (int i = 0; i < nopt; i++) {
        if (og_known(ro->optimizers[i].param_bytes))
            k->opt_params = add_sat(k->opt_params, ro->optimizers[i].param_bytes.v);
        if (og_known(ro->optimizers[i].shaped_bytes))
            k->opt_shaped = add_sat(k->opt_shaped, ro->optimizers[i].shaped_bytes.v);
    }
    /* optimizers training more parameters than the models they train hold (ZeRO's flat fp32 partition, master weights
     * copied out of the model): which model those train is not measured, so a model "trained by no optimizer" is
     * not known to be untrained (unknown is not zero) */
    uint64_t trained_bytes = 0;
    for (int i = 0; i < nm; i++)
        if (ro->models[i].trained > 0)
            trained_bytes = add_sat(trained_bytes, ro->models[i].bytes * (uint64_t)ro->models[i].trained);
    if (k->opt_params > trained_bytes)
        k->untrained_running = k->untrained_ref = k->untrained_eval = 0;
    k->dtypes_known = ro->has_dtypes && og_known(ro->bytes[OG_ROLE_parameters]);
    int nd = OG_FILLED(ro->ndtypes, ro->dtypes);
    for (int i = 0; k->dtypes_known && i < nd; i++) {
        char dt[sizeof ro->dtypes[0].dtype];
        og_cpy(dt, sizeof dt, ro->dtypes[i].dtype, sizeof dt);
        if (!strcmp(dt, "float32"))
            k->params_fp32 = add_sat(k->params_fp32, ro->dtypes[i].bytes);
        if (!strcmp(dt, "bfloat16") || !strcmp(dt, "float16"))
            k->params_half = add_sat(k->params_half, ro->dtypes[i].bytes);
        if (!strcmp(dt, "float64"))
            k->params_fp64 = add_sat(k->params_fp64, ro->dtypes[i].bytes);
        if (!strcmp(dt, "int8") || !strncmp(dt, "float8", 6))
            k->params_8bit = add_sat(k->params_8bit, ro->dtypes[i].bytes);
        if (!strcmp(dt, "uint8"))
            k->params_packed = add_sat(k->params_packed, ro->dtypes[i].bytes);
    }
    if (k->dtypes_known)
        k->quant_frees = 0.875 * (double)k->params_fp32 + 0.75 * (double)k->params_half + 0.5 * (double)k->params_8bit +
                         0.9375 * (double)k->params_fp64;
    else
        k->quant_frees = 0.75 * (double)k->params;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh; i++) {
        uint64_t b = og_known(ro->holders[i].float64) ? ro->holders[i].float64.v : 0;
        k->held_fp64 = add_sat(k->held_fp64, b);
        if (b && (k->fp64_holder < 0 || b > ro->holders[k->fp64_holder].float64.v))
            k->fp64_holder = i;
    }
    bool pass_runs = pass_phase(d->phase);
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        char where[sizeof h->where], kind[sizeof h->kind], purpose[sizeof h->purpose];
        og_cpy(where, sizeof where, h->where, sizeof where);
        og_cpy(kind, sizeof kind, h->kind, sizeof kind);
        og_cpy(purpose, sizeof purpose, h->purpose, sizeof purpose);
        enum og_purpose pu = og_purpose_of(purpose);
        if (pu != OG_PURPOSE_NONE)
            k->purpose_bytes[pu] = add_sat(k->purpose_bytes[pu], h->bytes);
        if (h->copy_of[0])
            k->copies = add_sat(k->copies, h->bytes);
        if (og_or(h->restored, 0)) {
            k->restored_held = add_sat(k->restored_held, h->restored.v);
            if (k->restored_holder < 0 || h->restored.v > ro->holders[k->restored_holder].restored.v)
                k->restored_holder = i;
        }
        if (pu == OG_PURPOSE_checkpoint && h->copy_of[0]) { /* wherever it is kept: a local of main() too */
            k->ckpt_copy = add_sat(k->ckpt_copy, h->bytes);
            if (k->ckpt_holder < 0 || h->bytes > ro->holders[k->ckpt_holder].bytes)
                k->ckpt_holder = i;
        }
        /* a copy kept across calls unless an average is being updated or a model loaded (those copies are theirs),
         * or a caller's local while a pass runs (no copy is being made then) */
        bool local = og_where_local(where);
        if (pu == OG_PURPOSE_NONE && h->copy_of[0] &&
            (local ? pass_runs : d->phase != OG_JP_ema_update && d->phase != OG_JP_loading)) {
            k->copy_kept = add_sat(k->copy_kept, h->bytes);
            if (k->copy_holder < 0 || h->bytes > ro->holders[k->copy_holder].bytes)
                k->copy_holder = i;
        }
        /* of no purpose, or named a cache or a dataset: those rows read holders kept across calls, and a caller's
         * local that outlives every step (a training loop's `cache` of every batch, filled before epoch 1) is
         * what the program keeps all the same */
        bool keepsake = pu == OG_PURPOSE_NONE || pu == OG_PURPOSE_cache || pu == OG_PURPOSE_dataset;
        if (keepsake && !h->copy_of[0] && pass_runs && caller_local(where, r) &&
            og_known(ro->bytes[OG_ROLE_activations]) && h->bytes > largest_role(ro) &&
            (k->dominant < 0 || h->bytes > ro->holders[k->dominant].bytes))
            k->dominant = i;
        /* a KV cache a local keeps while a model loads (a serving engine main() holds as `llm` while the scorer
         * loads) is kept beside that work, reserved before it: not a pass's own cache, nor one being reserved now
         * (roles.building), read with the kept holders */
        if (local && pu == OG_PURPOSE_kv_cache && d->phase == OG_JP_loading && k->building != OG_PURPOSE_kv_cache)
            local = false;
        if (local) {
            k->local_held = add_sat(k->local_held, h->bytes);
            if (map_kind(kind))
                k->local_map = add_sat(k->local_map, h->bytes);
            if (pu == OG_PURPOSE_kv_cache)
                k->local_kv = add_sat(k->local_kv, h->bytes);
            continue;
        }
        k->kept_held = add_sat(k->kept_held, h->bytes);
        if (pu == OG_PURPOSE_ema) { /* an EMA kept between its updates (a local is an update under way) */
            k->ema_kept = add_sat(k->ema_kept, h->bytes);
            if (k->ema_holder < 0 || h->bytes > ro->holders[k->ema_holder].bytes)
                k->ema_holder = i;
        }
        if (pu == OG_PURPOSE_index) { /* kept across calls (the locals of running code went on above) */
            k->index_kept = add_sat(k->index_kept, h->bytes);
            if (k->index_holder < 0 || h->bytes > ro->holders[k->index_holder].bytes)
                k->index_holder = i;
        }
        if (pu == OG_PURPOSE_dataset) {
            k->dataset_kept = add_sat(k->dataset_kept, h->bytes);
            if (k->dataset_holder < 0 || h->bytes > ro->holders[k->dataset_holder].bytes)
                k->dataset_holder = i;
        }
        if (pu == OG_PURPOSE_kv_cache && (k->kv < 0 || h->bytes > k->kv_bytes)) {
            k->kv = i;
            k->kv_bytes = h->bytes;
        }
        if (k->keeper < 0 || h->bytes > k->keeper_bytes) {
            k->keeper = i;
            k->keeper_bytes = h->bytes;
            k->keeper_map = map_kind(kind);
        }
    }
    /* a working set that is a few like records (fewer than a data set's): the loop that fills it adds one more */
    if (k->dominant >= 0 && ro->holders[k->dominant].records < OG_RECORDS_MIN)
        k->dominant_record = record_bytes(&ro->holders[k->dominant]);
    k->working = add_sat(k->act, k->local_held);
    if (k->model_params && nm < 6) { /* every model was listed: what is beyond them is no model's */
        /* optimizers holding more parameters than every model has train parameters of their own (the fp32 master
         * weights of a hand-written mixed-precision recipe): that many parameters beyond the models, and their
         * gradients, are the optimizer's (k->master), not a copy under way */
        k->master = k->opt_params > k->model_params ? k->opt_params : 0;
        k->opt_outside = k->model_params && (double)k->opt_params >= 4.0 * (double)k->model_params ? k->opt_params : 0;
        k->copy_loose = add_sat(sub0(sub0(k->params, k->model_params), k->master),
                                sub0(sub0(k->grads, k->model_params), k->master));
    }
    k->copying = add_sat(k->working, k->copy_loose);
    /* nothing computed yet beside a running model's weights: each of these roles measured, and none (unknown is not
     * zero) */
    static const enum og_role computed_roles[] = { OG_ROLE_activations, OG_ROLE_held_by_python, OG_ROLE_gradients,
                                                   OG_ROLE_optimizer_state, OG_ROLE_graph_pools };
    for (int i = 0; i < nm; i++)
        k->weights_only = k->weights_only || ro->models[i].running > 0;
    for (size_t i = 0; i < sizeof computed_roles / sizeof *computed_roles; i++)
        k->weights_only = k->weights_only && og_known(ro->bytes[computed_roles[i]]) && !ro->bytes[computed_roles[i]].v;
    if (ro->act_copy_of[0]) {
        k->act_copy = ro->act_copy_bytes < k->act ? ro->act_copy_bytes : k->act;
        k->act_copy_source = !strncmp(ro->act_copy_of, "optimizer_state", sizeof ro->act_copy_of) ? k->opt : k->params;
    }
    /* what a training job holds for good: known when every one of those roles was measured */
    static const enum og_role kept_roles[] = { OG_ROLE_parameters, OG_ROLE_buffers, OG_ROLE_gradients,
                                               OG_ROLE_optimizer_state, OG_ROLE_graph_pools };
    k->state_known = true;
    for (size_t i = 0; i < sizeof kept_roles / sizeof *kept_roles; i++) {
        k->state_known = k->state_known && og_known(ro->bytes[kept_roles[i]]);
        k->state = add_sat(k->state, role_or0(ro, kept_roles[i]));
    }
    /* a copy of the parameters or the optimizer state held by Python (an EMA, a snapshot, one being
     * made) is bounded like them: at most as many blocks of each size as the role has */
    k->state = add_sat(k->state, k->copies);
    k->kept_across = add_sat(k->kept_held, k->registry_models);
}

/* holder i is IPython's output history (roles.holders[].purpose output_history: Out, _, _5): cells' results the
 * display hook keeps, never the running code's */
static bool history_holder(const og_record_t *r, int i)
{
    char p[sizeof r->memory.fw.roles.holders[0].purpose];
    og_cpy(p, sizeof p, r->memory.fw.roles.holders[i].purpose, sizeof p);
    return og_purpose_of(p) == OG_PURPOSE_output_history;
}

/* Graphs kept by outputs of earlier batches (facts.h: kept_graphs): with autograd on, every output of a forward
 * is the root of the graph that made it, and in an evaluation or a generation no backward comes to free it; a
 * holder kept across calls that keeps such outputs (self.history["val_loss"].append(loss)) keeps every activation
 * of their batches alive, though its own bytes are a few scalars.  Kept across calls: a running loop's local list
 * is read by the growth, and a holder of a purpose (a dataset, a cache, an EMA) or a copy of a role holds state,
 * not outputs. */
static void kept_graphs(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!k->known || !k->act_known || !k->act || r->memory.fw.grad_enabled != 1)
        return;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    /* measured: the holder's own tensors keep their graphs (wherever it is kept, a running loop's list too); two of
     * them at least (one may be the running pass's own output), one in IPython's output history (a cell's result
     * is stored after its cell ends: never the running pass's) */
    for (int i = 0; i < nh && !k->accumulating && d->phase != OG_JP_backward; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        if (h->graphs < (history_holder(r, i) ? 1 : 2) || og_holder_purpose(d, r, i) != OG_PURPOSE_NONE ||
            h->copy_of[0] || h->bytes >= k->act)
            continue;
        if (k->graph_holder < 0 || h->tensors > ro->holders[k->graph_holder].tensors)
            k->graph_holder = i;
    }
    k->graphs_measured = k->graph_holder >= 0;
    if (!k->graphs_measured && d->phase != OG_JP_evaluation && d->phase != OG_JP_generation)
        return;
    for (int i = 0; i < nh && !k->graphs_measured; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        char where[sizeof h->where];
        og_cpy(where, sizeof where, h->where, sizeof where);
        if (og_where_local(where) || og_holder_purpose(d, r, i) != OG_PURPOSE_NONE || h->copy_of[0] || h->tensors < 2 ||
            h->bytes >= k->act)
            continue;
        if (k->graph_holder < 0 || h->tensors > ro->holders[k->graph_holder].tensors)
            k->graph_holder = i;
    }
    if (k->graph_holder >= 0) {
        double n = (double)ro->holders[k->graph_holder].tensors;
        k->kept_graphs = (uint64_t)((double)k->act * n / (n + 1.0));
        k->graphs_history = history_holder(r, k->graph_holder);
    }
}

/* The model group's purpose (roles.models[].purpose: what its names or class say) */
static enum og_purpose model_purpose(const og_roles_t *ro, int i)
{
    char p[sizeof ro->models[0].purpose];
    og_cpy(p, sizeof p, ro->models[i].purpose, sizeof p);
    return og_purpose_of(p);
}

/* the name of L bytes at P is an attribute of an object (self.unet, pipe.unet: the way the running code reaches it),
 * not a variable's own */
static bool attribute_name(const char *p, size_t l) { return memchr(p, '.', l) != NULL; }

/* the group's every model is held by one attribute name of as many objects (names "self.unet", or "a.unet,b.unet":
 * every name an attribute, the same attribute; named = count) */
static bool one_attribute_each(const og_roles_t *ro, int i)
{
    char names[sizeof ro->models[0].names];
    og_cpy(names, sizeof names, ro->models[i].names, sizeof names);
    if (ro->models[i].count < 2 || ro->models[i].named != ro->models[i].count || !names[0] || keyed_group(ro, i))
        return false;
    const char *attr = NULL, *cur = names, *p;
    size_t alen = 0, l;
    while (og_name_next(&cur, &p, &l)) {
        if (!attribute_name(p, l))
            return false;
        const char *last = p + l;
        while (last > p && last[-1] != '.')
            last--;
        size_t ll = (size_t)(p + l - last);
        if (attr && (ll != alen || strncmp(last, attr, ll) != 0))
            return false;
        attr = last;
        alen = ll;
    }
    return true;
}

/* names (comma-separated, S bytes at most) all attributes of other objects: none a bare name, none the running
 * object's own (self.X) */
static bool held_by_others_only(const char *names_in, size_t s)
{
    char names[sizeof((og_roles_t *)0)->models[0].names];
    og_cpy(names, sizeof names, names_in, s);
    const char *cur = names, *p;
    size_t l;
    bool any = false;
    while (og_name_next(&cur, &p, &l)) {
        if (!attribute_name(p, l) || (l > 5 && strncmp(p, "self.", 5) == 0))
            return false;
        any = true;
    }
    return any;
}

/* A second copy of weights the program keeps on the device (facts.h: ema_kept, reference_copy,
 * repeated_components): what the copy is tells the fix.  An EMA kept between its updates belongs in host memory;
 * a preference-tuning reference beside a policy that trains adapters on the same base is that policy with its
 * adapters disabled; pipelines that each loaded the same components can share one set.  Read from the adapter's
 * measurement only (names, purposes, frozen flags, the optimizers' parameters), never from block sizes. */
/* group I is frozen, held by attribute names (self.X, pipe.X), and the program holds its class by another name too: the
 * bytes of its attribute-held copies (facts.h: twin_components); 0 not such a group */
static uint64_t twin_of_program(const og_roles_t *ro, int i, int nm)
{
    char names[sizeof ro->models[0].names];
    og_cpy(names, sizeof names, ro->models[i].names, sizeof names);
    int attrs = 0, others = 0;
    const char *cur = names, *p;
    size_t l;
    while (og_name_next(&cur, &p, &l))
        if (attribute_name(p, l))
            attrs++;
        else
            others++;
    uint64_t each = ro->models[i].bytes;
    int count = ro->models[i].count;
    if (!ro->models[i].frozen || count <= 0 || attrs == 0 || keyed_group(ro, i))
        return 0;
    if (others > 0) /* copies held by the program's names in the same group: those beyond them are the set's */
        return count > others ? each * (uint64_t)(count - others) : 0;
    for (int j = 0; j < nm; j++) {
        double off = (double)ro->models[j].bytes - (double)each;
        if (j != i && ro->models[j].count > 0 &&
            strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[0].cls) == 0 &&
            (off < 0 ? -off : off) <= 0.1 * (double)each && ro->models[j].names[0] &&
            !attribute_name(ro->models[j].names, strcspn(ro->models[j].names, ",")))
            return each * (uint64_t)count;
    }
    return 0;
}

static void weights_copies(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    /* holders of purpose ema kept across calls were counted with the other holders (roles: ema_kept, ema_holder);
     * models whose names say ema, none running, join them here */
    k->ema_model = k->reference_group = k->repeated_group = k->trained_group = k->twin_group = -1;
    if (!k->known)
        return;
    int nm = OG_FILLED(ro->nmodels, ro->models);
    uint64_t twin[6] = { 0 }, twins = 0;
    int ntwins = 0, largest_twin = -1;
    for (int i = 0; i < nm; i++)
        if ((twin[i] = twin_of_program(ro, i, nm)) != 0) {
            twins = add_sat(twins, twin[i]);
            ntwins++;
            if (largest_twin < 0 || ro->models[i].bytes > ro->models[largest_twin].bytes)
                largest_twin = i;
        }
    if (ntwins >= 2) { /* a set of components, not one model */
        k->twin_components = twins;
        k->twin_groups = ntwins;
        k->twin_group = largest_twin;
    } else
        memset(twin, 0, sizeof twin);
    uint64_t ema_largest = 0;
    for (int i = 0; i < nm; i++) {
        uint64_t all = ro->models[i].bytes * (uint64_t)(ro->models[i].count > 0 ? ro->models[i].count : 0);
        if (model_purpose(ro, i) == OG_PURPOSE_ema && ro->models[i].running <= 0) {
            k->ema_kept = add_sat(k->ema_kept, all);
            if (k->ema_model < 0 || all > ema_largest)
                k->ema_model = i, ema_largest = all;
        }
    }
    /* the trained model: the largest group not frozen; the parameters its optimizers train (opt_params) */
    int trained = -1;
    for (int i = 0; i < nm; i++)
        if (!ro->models[i].frozen && ro->models[i].count > 0 &&
            (trained < 0 || ro->models[i].bytes > ro->models[trained].bytes))
            trained = i;
    bool adapters = trained >= 0 && k->opt_params && (double)k->opt_params <= 0.1 * (double)ro->models[trained].bytes;
    double base = adapters ? (double)sub0(ro->models[trained].bytes, k->opt_params) : 0;
    for (int i = 0; i < nm; i++) {
        if (i == trained || ro->models[i].count <= 0)
            continue;
        enum og_purpose pu = model_purpose(ro, i);
        double off = (double)ro->models[i].bytes - base;
        bool same_base = ro->models[i].frozen && base > 0 && (off < 0 ? -off : off) <= 0.1 * base;
        if (pu != OG_PURPOSE_reference && !(same_base && pu == OG_PURPOSE_NONE && !twin[i]))
            continue;
        uint64_t all = ro->models[i].bytes * (uint64_t)ro->models[i].count;
        if (k->reference_group < 0 || all > k->reference_copy) {
            k->reference_copy = all;
            k->reference_group = i;
            k->reference_base = same_base;
        }
    }
    /* a model arriving while the trained one and its optimizer state are still referenced (state exists: a step
     * was made); or a new training's first forward beside a finished one (facts.h) */
    bool loading = d->phase == OG_JP_loading && k->opt, first_pass = d->phase == OG_JP_forward && k->opt;
    for (int j = 0; first_pass && j < nm; j++)
        if (ro->models[j].running > 0 && (ro->models[j].trained <= 0 || ro->models[j].stepped != 0))
            first_pass = false; /* a running model no optimizer trains, one it has stepped on, or not measured */
    for (int i = 0; (loading || first_pass) && i < nm; i++) {
        if (ro->models[i].frozen || ro->models[i].running != 0 || ro->models[i].named <= 0)
            continue;
        if (!loading && ro->models[i].stepped <= 0)
            continue;
        bool arriving = false, other = false;
        for (int j = 0; j < nm; j++)
            if (ro->models[j].running > 0) {
                arriving = true;
                /* loading: the arriving copy's size is partial, its class tells a copy; a running one is whole */
                other = other || (strncmp(ro->models[j].cls, ro->models[i].cls, sizeof ro->models[i].cls) == 0 &&
                                  (loading || ro->models[j].bytes == ro->models[i].bytes));
            }
        /* nothing loads or runs, or a copy of its own arrives or runs (model_copies, named_copies): unless a load
         * arrives beside one an optimizer stepped on, a training that made steps (a QLoRA model kept while its bf16
         * base loads again to merge the adapters is not a second copy of the same thing) */
        if (!arriving || (other && !(loading && ro->models[i].stepped > 0)))
            continue;
        uint64_t held = ro->models[i].bytes * (uint64_t)ro->models[i].named;
        if (k->trained_group < 0 ||
            held > ro->models[k->trained_group].bytes * (uint64_t)ro->models[k->trained_group].named) {
            k->trained_group = i;
            k->trained_kept = add_sat(add_sat(held, k->grads), k->opt);
        }
    }
    if (k->trained_group >= 0)
        k->trained_by_others = held_by_others_only(ro->models[k->trained_group].names, sizeof ro->models[0].names);
    /* pipelines built one by one from the same checkpoint: the same frozen components, each N times, each held by
     * one attribute of N objects; two such groups of one count at least (a whole set repeated, not one model) */
    for (int i = 0; i < nm; i++) {
        if (!ro->models[i].frozen || !one_attribute_each(ro, i))
            continue;
        uint64_t extra = 0;
        int groups = 0, largest = -1;
        for (int j = 0; j < nm; j++)
            if (ro->models[j].frozen && one_attribute_each(ro, j) && ro->models[j].count == ro->models[i].count) {
                extra = add_sat(extra, ro->models[j].bytes * (uint64_t)(ro->models[j].count - 1));
                groups++;
                if (largest < 0 || ro->models[j].bytes > ro->models[largest].bytes)
                    largest = j;
            }
        if (groups >= 2 && extra > k->repeated_components) {
            k->repeated_components = extra;
            k->repeated_count = ro->models[i].count;
            k->repeated_group = largest;
        }
    }
}

/* Whether the job trains, measured: an optimizer step ran (the adapter's `training`, PyTorch's step hook);
 * the roles hold gradients (a backward ran) or optimizer state; an optimizer's param_groups hold parameters
 * of the failing device (an optimizer made for this model: the job trains before its first step too); the
 * failing stack is in backward or an optimizer step; a function of the program running at the failure calls
 * backward (roles.backward_in_code: a first step, or a closure an optimizer outside torch calls, scipy's L-BFGS).  Known inference only from the adapter's word
 * (training -1).  requires_grad alone says nothing: from_pretrained's weights require grad for inference
 * too. */
static void trains(og_facts_t *d, const og_record_t *r)
{
    const og_role_facts_t *k = &d->roles;
    int training = r->memory.fw.has ? r->memory.fw.training : 0;
    d->trains_why = training == 1                      ? "an optimizer step ran"
                    : k->known && k->grads             ? "gradients are held"
                    : k->known && k->opt               ? "optimizer state is held"
                    : k->known && k->opt_params        ? "an optimizer holds the parameters"
                    : d->phase == OG_JP_backward       ? "the failure is in backward"
                    : d->phase == OG_JP_optimizer_step ? "the failure is in an optimizer step"
                    : k->known && k->backward_code     ? "the running code calls backward()"
                                                       : NULL;
    d->trains = d->trains_why ? 1 : training == -1 ? -1 : 0;
}

/* A pass still building up (the adapter's phase: forward, backward, evaluation, generation) whose own
 * tensors (the working set; in generation with the KV cache it builds) are at least PASS_OVER_CACHE times the failing framework's measured cache,
 * while that cache is under frag_share of its reservation: the cache could carry the pass a few
 * allocations further, not through it (the rest of the pass was never requested).  Likewise a model being
 * built (phase loading): what the models running now hold so far (roles.arriving) and the tensors its running code
 * holds in locals (a checkpoint's shard being placed) are its working set. */
#define PASS_OVER_CACHE 3
/* the measured cache is under frag_share of its reservation: splinters beside what the framework uses, not an idle
 * share of it */
static bool cache_splinters(const og_facts_t *d) { return (double)d->cached < d->frag_share * (double)d->reservation; }

/* BYTES still to come are PASS_OVER_CACHE times the measured cache and the request, and that cache is under
 * frag_share of its reservation: the splinters carry the work a few allocations further, not through it */
static bool outgrows(const og_facts_t *d, uint64_t bytes)
{
    return bytes >= PASS_OVER_CACHE * (d->cached > d->req ? d->cached : d->req) && cache_splinters(d);
}

/* memory that rose step after step (the growth rule's pattern) by PASS_OVER_CACHE times the cache and the request,
 * that cache under frag_share of its reservation: defragmented, the splinters would carry the rise a step or two
 * further, not stop it (facts.h: growth_outgrows_cache) */
static void growth_outgrows_cache(og_facts_t *d)
{
    d->growth_outgrows_cache =
        d->growth.holds && d->cached_known && !d->recovered && d->reservation && outgrows(d, d->growth.rise);
}

/* the holders the failing statement reads by name: the one it copies whole (facts.h: roles.stmt_copies) and its
 * inputs as local holders (roles.stmt_inputs) */
static void stmt_holders(og_facts_t *d, const og_record_t *r)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    og_role_facts_t *k = &d->roles;
    if (!k->known || !ro->has_statement)
        return;
    bool copies = d->req_known && d->req >= (256ULL << 20) && d->phase != OG_JP_loading;
    char names[sizeof ro->stmt_names];
    og_cpy(names, sizeof names, ro->stmt_names, sizeof names);
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        char name[sizeof h->name], where[sizeof h->where];
        og_cpy(name, sizeof name, h->name, sizeof name);
        og_cpy(where, sizeof where, h->where, sizeof where);
        const char *last = strrchr(name, '.') ? strrchr(name, '.') + 1 : name;
        bool by_name = og_name_listed(names, name);
        if (h->copy_of[0] || !(by_name || og_name_listed(names, last)))
            continue;
        if (copies && og_holder_purpose(d, r, i) == OG_PURPOSE_NONE && (double)d->req >= 0.9 * (double)h->bytes &&
            (double)d->req <= 1.1 * (double)h->bytes &&
            (k->stmt_copies < 0 || h->bytes > ro->holders[k->stmt_copies].bytes))
            k->stmt_copies = i;
        if (!by_name || !og_where_local(where) || h->graphs > 0)
            continue;
        k->stmt_inputs = add_sat(k->stmt_inputs, h->bytes);
        size_t at = strlen(k->stmt_input_names);
        if (at + strlen(name) + 3 < sizeof k->stmt_input_names)
            og_fmt(k->stmt_input_names + at, sizeof k->stmt_input_names - at, "%s%s", at ? ", " : "", name);
    }
}

/* one big temporary of a computation outside any model (facts.h: roles.loose_operation) */
static void loose_operation(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    k->loose_operation = k->known && k->act_known && !k->params && d->phase == OG_JP_unknown &&
                         r->memory.fw.npy_frames > 0 && d->req_known && d->capacity &&
                         d->req * OG_BIG_REQ_DIV >= d->capacity &&
                         (k->request_shape == OG_REQ_PRODUCT || k->request_shape == OG_REQ_SQUARE) &&
                         (double)k->act >= 0.9 * (double)d->req;
}

/* what Python objects keep across calls outgrows the splinters (facts.h: kept_outgrows_cache) */
static void kept_outgrows_cache(og_facts_t *d)
{
    og_role_facts_t *k = &d->roles;
    /* (less what holders at their bound keep: that stops where it is, and the splinters beside it are the room) */
    d->kept_outgrows_cache = k->known && k->act_known && d->cached_known && !d->recovered && d->reservation &&
                             d->phase != OG_JP_loading && outgrows(d, sub0(k->kept_across, k->bounded_bytes));
}

/* the others a sliver of the device beside a pass still building (facts.h: others_sliver); an attention's scores
 * failing, the others short of what the pass needs next (scores, others_short_of_scores) */
static void others_sliver(og_facts_t *d)
{
    bool building = pass_phase(d->phase) || d->phase == OG_JP_loading || d->phase == OG_JP_optimizer_step;
    d->others_sliver = building && d->capacity && d->other_all && d->other_all * 16 < d->capacity;
    d->scores = pass_phase(d->phase) && d->roles.request_shape == OG_REQ_SQUARE && d->roles.attention == 1 &&
                d->req_known && d->capacity && d->req * OG_BIG_REQ_DIV >= d->capacity;
    d->others_short_of_scores = d->scores && !d->larger_than_device && d->other < add_sat(d->shortfall, d->req);
}

/* a request of at least an OG_BIG_REQ_DIV-th of the device, in a pass whose activations already hold as much (its
 * tensors are this size: a layer's output over one whole input), that a defragmented cache with the free memory
 * would serve leaving less than the request itself: the splinters carry the pass this one tensor further, and its
 * next one of that size has no room whatever the cache's layout */
static bool next_tensor_has_no_room(const og_facts_t *d, const og_role_facts_t *k)
{
    if (!pass_phase(d->phase) || !d->req_known || !d->capacity || d->req * OG_BIG_REQ_DIV < d->capacity ||
        (double)k->act < 0.9 * (double)d->req)
        return false;
    uint64_t room = add_sat(d->free_eff, d->cached);
    return room >= d->req && room - d->req < d->req;
}

/* a comprehension of the program's on the failing stack (facts.h: comprehension) */
static void comprehension_running(og_facts_t *d, const og_record_t *r)
{
    static const char *const names[] = { "<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>" };
    const og_framework_view_t *fw = &r->memory.fw;
    int n = OG_FILLED(fw->npy_frames, fw->py_frames);
    d->comprehension = -1;
    for (int i = 0; i < n && d->comprehension < 0; i++)
        for (size_t j = 0; j < sizeof names / sizeof *names; j++)
            if (!strncmp(fw->py_frames[i].function, names[j], sizeof fw->py_frames[i].function))
                d->comprehension = i;
}

/* what a forward pass or an evaluation failing in a measured layer has left to make (facts.h: pass_rest); 0 not
 * measured */
static uint64_t pass_rest(const og_facts_t *d, const og_record_t *r)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    const og_role_facts_t *k = &d->roles;
    int n = ro->layer_count, i = ro->layer_index;
    if ((d->phase != OG_JP_forward && d->phase != OG_JP_evaluation) || !k->act || n < 4 || i < 0 || i >= n ||
        ro->layer_alike != 1 || k->checkpointing == 1)
        return 0;
    /* (not beside a second copy of a model holding what is missing, a previous fold's or load's: that copy took the
     * room, and the working set's reading, with the copy's own rows, stands) */
    if (d->shortfall && k->model_copies >= d->shortfall)
        return 0;
    if (!d->req_known)
        return 0;
    double layer = (double)k->act / (double)(i + 1);
    bool backward = d->phase == OG_JP_forward && r->memory.fw.grad_enabled == 1 && !k->no_backward;
    double rest = layer * (double)(n - i - 1 + (backward ? 1 : 0));
    return add_sat(add_sat(d->req, (uint64_t)rest), k->layer_holder_to_come);
}

#define LOAD_FILLS_SHARE 0.9 /* of the card (or limit) the weights of a load still running hold: load_fills_card */
static void pass_outgrows_cache(og_facts_t *d, const og_record_t *r)
{
    const og_role_facts_t *k = &d->roles;
    /* a load computes nothing: what it holds beyond the roles (a torch.load's storages arriving) is what it restored
     * so far, like the models it builds and the shards its code holds */
    /* a retry inside the handler of an earlier OOM runs its pass again: a pass building, the failed attempt's tensors
     * (its traceback keeps them) with it */
    bool building = pass_phase(d->phase) || d->phase == OG_JP_oom_handler ||
                    (d->phase == OG_JP_loading && (k->arriving || k->local_held || k->act)) ||
                    (d->phase == OG_JP_unknown && d->comprehension >= 0);
    /* an optimizer step making an Adam-family state (two moments per parameter its optimizers hold): what it has
     * yet to make is the step's own working set */
    if (d->phase == OG_JP_optimizer_step && k->known && k->opt_adam && k->opt_params && d->cached_known &&
        !d->recovered && d->reservation) {
        uint64_t to_come = sub0(2 * k->opt_params, k->opt);
        if (outgrows(d, to_come)) {
            d->state_to_come = to_come;
            d->pass_outgrows_cache = true;
        }
        return;
    }
    /* the first step of another optimizer (the adapter saw none end: a measured zero): every byte of its state was
     * made by this step, which is still making it (how much more is to come is not known) */
    if (d->phase == OG_JP_optimizer_step && k->known && k->opt_params && k->steps_known && k->steps_made == 0 &&
        d->cached_known && !d->recovered && d->reservation) {
        if (outgrows(d, k->opt)) {
            d->first_step_state = k->opt;
            d->pass_outgrows_cache = true;
        }
        return;
    }
    /* outside the step, an Adam-family optimizer that has yet to make its state: when what it has to make is that
     * many times the cache and more than everything the job could hand back before its step (the free memory, the
     * whole cache, the running code's tensors), the training state itself does not fit, whatever the splinters */
    if (k->known && k->act_known && k->opt_adam && k->opt_params && d->cached_known && d->free_known && !d->recovered &&
        d->reservation) {
        uint64_t to_come = sub0(2 * k->opt_params, k->opt);
        uint64_t room = add_sat(add_sat(d->free_eff, d->cached), k->working);
        if (outgrows(d, to_come) && to_come > room) {
            d->state_to_come = to_come;
            d->pass_outgrows_cache = true;
            return;
        }
    }
    if (d->phase == OG_JP_loading && k->known && d->cached_known && !d->recovered && d->reservation && d->capacity &&
        (double)k->params >= LOAD_FILLS_SHARE * (double)d->capacity && d->cached >= d->req && cache_splinters(d)) {
        d->load_fills_card = d->pass_outgrows_cache = true;
        return;
    }
    if (!building || !k->known || !k->act_known || !d->cached_known || d->recovered || !d->reservation)
        return;
    const og_framework_view_t *fw = &r->memory.fw;
    /* (no earlier failure episode: a pass that failed before, caught and skipped, made its peak too; nor a generation
     * building step by step, growth.gen_built: it runs as many steps as its output takes, so an earlier generation's
     * peak does not bound this one) */
    if (fw->has && og_known(fw->peak_bytes) && d->req_known && r->history.recovered_episodes <= 1 &&
        !d->growth.gen_built && fw->peak_bytes.v > fw->allocated_bytes &&
        fw->peak_bytes.v >= add_sat(fw->allocated_bytes, d->req)) {
        d->held_before = true;
        return;
    }
    /* with what a holder keeping one record per layer will add in the layers to come */
    uint64_t set = add_sat(add_sat(k->working, k->arriving), k->layer_holder_to_come);
    /* a generation's working set is its activations and the KV cache it builds token by token */
    if (d->phase == OG_JP_generation)
        set = add_sat(set, k->purpose_bytes[OG_PURPOSE_kv_cache]);
    /* a pass past its middle in a measured layer: what it has left, not what it made so far (facts.h: pass_rest) */
    uint64_t rest = pass_rest(d, r);
    if (rest && rest < set) {
        d->pass_rest = rest;
        d->pass_rest_layers = r->memory.fw.roles.layer_count - r->memory.fw.roles.layer_index - 1;
        d->pass_outgrows_cache = rest > add_sat(d->free_eff, d->cached) && cache_splinters(d);
        return;
    }
    d->pass_outgrows_cache = outgrows(d, set) || next_tensor_has_no_room(d, k);
}

/* A deep copy under way (roles.operation copy), that cache under frag_share of its reservation, which the rest of
 * the copy outgrows: when its source is known (roles.copy_source: copy.deepcopy(model)), what is left to copy
 * (the source less what it made so far) exceeds the cache and the free memory together, so even a defragmented
 * cache could not finish it; otherwise, like a pass still building, it made at least PASS_OVER_CACHE times the
 * cache (and the request) so far (roles.copy_made_bytes) and asks for the rest of its tensors next (a model's or an
 * optimizer state's copy made on the GPU beside the original). */
static void copy_outgrows_cache(og_facts_t *d)
{
    const og_role_facts_t *k = &d->roles;
    /* an EMA (or weight-average) update after the optimizer's step: its out-of-place form (a dict comprehension, a
     * foreach without the trailing underscore) makes a whole new copy of the model's weights, and the pass's graph is
     * gone, so what this phase holds beyond the state is that copy so far; the rest of it (the trained weights,
     * update_copy, less that) exceeding the cache and the free memory together is a copy no defragmented cache
     * finishes */
    if (d->phase == OG_JP_ema_update && k->known)
        d->update_copy = k->opt_params ? k->opt_params : k->model_params;
    if (d->phase == OG_JP_ema_update && k->act_known && d->update_copy > k->act && d->cached_known && !d->recovered &&
        d->reservation && cache_splinters(d)) {
        d->copy_outgrows_cache = d->update_copy - k->act > add_sat(d->cached, d->free_eff);
        return;
    }
    /* a copy of the parameters (or the optimizer state) being made that no named object holds yet, outside a deep
     * copy (roles.act_copy: blocks among the activations copy that role; an exporter folding every weight into a new
     * tensor, a comprehension's dict of them): the rest of that role beyond the copy so far exceeding the cache and
     * the free memory together is a copy no defragmented cache finishes */
    if (k->known && k->operation != OG_OP_copy && k->act_copy && k->act_copy_source > k->act_copy && d->cached_known &&
        !d->recovered && d->reservation && cache_splinters(d) &&
        k->act_copy_source - k->act_copy > add_sat(d->cached, d->free_eff)) {
        d->copy_outgrows_cache = d->role_copy_outgrows = true;
        return;
    }
    if (!k->known || k->operation != OG_OP_copy || !k->copy_made_known || !d->cached_known || d->recovered ||
        !d->reservation || !cache_splinters(d))
        return;
    if (k->copy_source > k->copy_made)
        d->copy_outgrows_cache = k->copy_source - k->copy_made > add_sat(d->cached, d->free_eff);
    else
        d->copy_outgrows_cache = outgrows(d, k->copy_made);
}

/* A peak from one batch read through its whole pass: a training run of many optimizer steps that gave memory
 * back to the driver between them (empty_cache every step, or sizes the cache could not reuse), whose earlier steps
 * never held more than a third of what this one holds with its request (a molecule, a mesh or a document far larger
 * than the rest), both counted above what the steps keep between them. Its allocations may repeat earlier sizes,
 * so outlier()'s tests by size do not see it. The earlier steps are the history up to its last release to the
 * driver. */
enum { OUTLIER_PASS_STEPS = 8 };
#define OUTLIER_PASS_RATIO 3.0
static void outlier_pass(og_facts_t *d, const og_record_t *r)
{
    const struct og_hist_ev *e = r->history.events;
    int ne = e ? r->history.nevents : 0;
    og_outlier_facts_t *o = &d->outlier;
    int last_free = -1;
    for (int i = 0; i < ne; i++)
        if (is_op(&e[i], OG_OP_FREE))
            last_free = i;
    if (last_free < 8)
        return;
    /* what the steps keep between them (the model's state): the floor after the last release */
    uint64_t floor = e[last_free].live, held_before = 0;
    for (int i = 0; i <= last_free; i++)
        if (e[i].live > held_before)
            held_before = e[i].live;
    double now = (double)d->tracked + (double)d->req - (double)floor, before = (double)held_before - (double)floor;
    if (d->roles.steps_known && d->roles.steps_made >= OUTLIER_PASS_STEPS && before > 0 &&
        now >= OUTLIER_PASS_RATIO * before) {
        o->holds = o->pass_peak = true;
        o->held_before = held_before;
        o->floor = floor;
    }
}

/* The failing request and the allocations of its size since the first of them (the framework's
 * releases and failed attempts between them are the failure's own): a size at least 4x any earlier
 * allocation, after earlier steps freed what they made (a run that had reached its plateau). */
static void outlier(og_facts_t *d, const og_record_t *r)
{
    const struct og_hist_ev *e = r->history.events;
    int ne = e ? r->history.nevents : 0, i0 = -1, run = 0, other = 0, before = 0;
    uint64_t tol = 2ULL << 20, prev_max = 0;
    bool freed = false;
    if (!d->req_known || !d->req) /* a run of the request's size: no size known, no run */
        return;
    for (int i = 0; i < ne && i0 < 0; i++)
        if (is_op(&e[i], OG_OP_ALLOC) && (e[i].bytes > d->req ? e[i].bytes - d->req : d->req - e[i].bytes) <= tol)
            i0 = i;
    for (int i = 0; i < ne; i++) {
        if (!is_op(&e[i], OG_OP_ALLOC)) {
            freed = freed || ((i0 < 0 || i < i0) && is_op(&e[i], OG_OP_FREE));
            continue;
        }
        bool same = (e[i].bytes > d->req ? e[i].bytes - d->req : d->req - e[i].bytes) <= tol;
        if (i0 >= 0 && i >= i0)
            same ? run++ : other++;
        else {
            before++;
            if (e[i].bytes > prev_max)
                prev_max = e[i].bytes;
        }
    }
    /* a warm cache hides the steps' frees from the driver: the framework's own count of freed bytes
     * (at least what the process holds: several steps' worth) says they ran */
    const og_framework_view_t *fw = &r->memory.fw;
    freed = freed || (fw->has && fw->freed_known && fw->freed_bytes_total >= d->tracked && d->tracked);
    og_outlier_facts_t *o = &d->outlier;
    o->prev_max = prev_max;
    o->run = run + 1;
    o->run_bytes = (uint64_t)(run + 1) * d->req;
    o->holds = before >= 8 && freed && prev_max && other <= run && (double)d->req >= 4.0 * (double)prev_max;
    if (o->holds)
        return;
    if (i0 < 0) {
        outlier_pass(d, r);
        return;
    }
    /* the failing batch's own sizes: the allocations just before the failing run whose sizes the history had
     * never seen (a longer batch makes every activation of a new size), none of them larger than the request.
     * The earlier steps are what came before them: their largest allocation, their frees (what the driver saw
     * before the batch, or the framework's count) */
    int s = i0;
    for (int i = i0 - 1; i >= 0; i--) {
        if (!is_op(&e[i], OG_OP_ALLOC))
            continue;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = is_op(&e[j], OG_OP_ALLOC) &&
                   (e[j].bytes > e[i].bytes ? e[j].bytes - e[i].bytes : e[i].bytes - e[j].bytes) <= tol;
        if (seen || e[i].bytes > d->req)
            break;
        s = i;
    }
    uint64_t steps_max = 0;
    int steps = 0;
    bool steps_freed = fw->has && fw->freed_known && fw->freed_bytes_total >= d->tracked && d->tracked;
    for (int i = 0; i < s; i++) {
        steps_freed = steps_freed || is_op(&e[i], OG_OP_FREE);
        if (is_op(&e[i], OG_OP_ALLOC)) {
            steps++;
            if (e[i].bytes > steps_max)
                steps_max = e[i].bytes;
        }
    }
    if (s < i0 && steps >= 8 && steps_freed && steps_max && (double)d->req >= 4.0 * (double)steps_max) {
        o->holds = o->batch_sizes = true;
        o->prev_max = steps_max;
    } else
        outlier_pass(d, r);
}

/* the value of NAME in the record's allow-listed environment, or NULL */
static const char *env_of(const og_record_t *r, const char *name)
{
    size_t l = strlen(name);
    int n = r->nenv < 0 ? 0 : r->nenv > 48 ? 48 : r->nenv;
    for (int i = 0; i < n; i++)
        if (strnlen(r->env[i], sizeof r->env[i]) < sizeof r->env[i] && strncmp(r->env[i], name, l) == 0 &&
            r->env[i][l] == '=')
            return r->env[i] + l + 1;
    return NULL;
}

/* a positive integer setting as NCCL reads it (strtoll, base 0: decimal or 0x hex), 0 when unset or not one */
static uint64_t env_count(const og_record_t *r, const char *name)
{
    const char *v = env_of(r, name);
    if (!v || !*v)
        return 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 0);
    return *end == 0 && v[0] != '-' ? (uint64_t)x : 0;
}

/* torchrun's world (LOCAL_WORLD_SIZE > 1, TORCHELASTIC_RUN_ID) inside one of several tasks srun started on this node
 * (SLURM_PROCID; SLURM_NTASKS_PER_NODE, else SLURM_NTASKS / SLURM_NNODES): srun around torchrun, each task a launcher
 * of its own whose RANK is its own world's; the tasks on the node, 0 when this rank's environment does not say so */
static int nested_launch_tasks(const og_record_t *r)
{
    uint64_t local = env_count(r, "LOCAL_WORLD_SIZE");
    uint64_t tasks = env_count(r, "SLURM_NTASKS_PER_NODE"), nodes = env_count(r, "SLURM_NNODES");
    if (!tasks && nodes) /* sbatch --ntasks without --ntasks-per-node: spread evenly */
        tasks = env_count(r, "SLURM_NTASKS") / nodes;
    return local > 1 && env_of(r, "TORCHELASTIC_RUN_ID") && env_of(r, "SLURM_PROCID") && tasks > 1 && tasks < 100000
               ? (int)tasks
               : 0;
}

/* the ranks of this job on this machine and whether they outnumber its GPUs (facts: node_ranks, ranks_outnumber_gpus) */
static void node_ranks(og_facts_t *d, const og_record_t *r)
{
    if (r->rank < 0 && r->world_size <= 1)
        return;
    int no = r->memory.nother < 0 ? 0 : r->memory.nother > 32 ? 32 : r->memory.nother, here = 0, launchers = 1;
    for (int i = 0; i < no; i++) {
        const og_other_proc_t *o = &r->memory.other[i];
        here += o->same_job && o->rank >= 0 && !o->child && !o->sibling && !o->parent;
        launchers += o->same_allocation; /* one more launcher's world with a rank on this GPU */
    }
    uint64_t local = env_count(r, "LOCAL_WORLD_SIZE"); /* one launcher's ranks on this machine */
    if (d->nested_launchers)                           /* measure(): srun around torchrun, a world per task */
        launchers = launchers > d->nested_launchers ? launchers : d->nested_launchers;
    d->node_ranks = local > 0 && local < 100000 ? (int)local * launchers : 1 + here;
    d->ranks_outnumber_gpus = (here > 0 || (d->nested_launchers && d->other_all)) && r->visible_devices >= 1 &&
                              d->node_ranks > r->visible_devices;
}

#define NCCL_DEFAULT_BUFFSIZE (4ull << 20) /* NCCL_BUFFSIZE's default: 4 MiB per buffer */

/* a collective-communication library's memory (NCCL, RCCL) */
static void communication(og_facts_t *d, const og_record_t *r)
{
    d->comm_lib = -1;
    int n = r->memory.nlibs < 0 ? 0 : r->memory.nlibs > 32 ? 32 : r->memory.nlibs;
    for (int i = 0; i < n; i++) {
        char l[sizeof r->memory.by_library[0].library];
        og_cpy(l, sizeof l, r->memory.by_library[i].library, sizeof l);
        const char *b = og_base_name(l);
        if (comm_library(b) && (d->comm_lib < 0 || r->memory.by_library[i].bytes > d->comm_bytes)) {
            d->comm_lib = i;
            d->comm_bytes = r->memory.by_library[i].bytes;
        }
    }
    char fl[sizeof r->event.library];
    og_cpy(fl, sizeof fl, r->event.library, sizeof fl);
    const char *fb = og_base_name(fl);
    d->comm_failing = comm_library(fb);
    /* the settings that size its buffers: every channel of every communicator keeps NCCL_BUFFSIZE per peer and
     * protocol, so its bytes scale with the buffer size; what a larger one adds is the part of its bytes beyond
     * what the default would hold.  NCCL_MIN_NCHANNELS forces more channels than NCCL picks for the topology,
     * which it decides itself (not counted here) */
    d->comm_buffsize = env_count(r, "NCCL_BUFFSIZE");
    uint64_t ch = env_count(r, "NCCL_MIN_NCHANNELS");
    d->comm_min_channels = ch > 1024 ? 1024 : (int)ch;
    if (d->comm_lib >= 0 && d->comm_buffsize > NCCL_DEFAULT_BUFFSIZE)
        d->comm_setting_excess =
            (uint64_t)((double)d->comm_bytes * (1.0 - (double)NCCL_DEFAULT_BUFFSIZE / (double)d->comm_buffsize));
    const og_growth_facts_t *g = &d->growth;
    if (d->comm_lib < 0 || !g->holds || !g->rise)
        return;
    double steady = (double)g->per_step * (double)g->transitions;
    d->comm_holds_growth = d->comm_bytes >= g->rise || (d->comm_failing && g->marker == OG_MARK_FAILING_SIZE &&
                                                        (double)d->comm_bytes >= 0.8 * steady);
}

/* the largest library outside the framework took its memory across the run (facts.h: nonfw_built_up) */
#define NONFW_BUILT_QUARTERS 3
static void nonfw_built_up(og_facts_t *d, const og_record_t *r)
{
    if (d->nonfw_big_lib < 0 || d->nonfw_big_lib == d->comm_lib)
        return;
    const og_lib_usage_t *u = &r->memory.by_library[d->nonfw_big_lib];
    if (!u->by_quarter_known || !u->bytes)
        return;
    int spread = 0;
    uint64_t before_last = 0;
    for (int q = 0; q < OG_QUARTERS; q++)
        spread += u->by_quarter[q] * 8 >= u->bytes;
    for (int q = 0; q < OG_QUARTERS - 1; q++)
        before_last = add_sat(before_last, u->by_quarter[q]);
    d->nonfw_built_up = spread >= NONFW_BUILT_QUARTERS;
    d->nonfw_before_last = d->nonfw_built_up ? before_last : 0;
}

/* ------------------------------------------------------------------ what the advice reads */

static void advice(og_facts_t *f, const og_record_t *rec)
{
    struct og_advice_facts *x = &f->adv;
    x->fw = rec->framework;
    x->other = og_or(rec->memory.other_processes_bytes, 0);
    for (int i = 0; i < rec->memory.nother && i < 32; i++) /* ranks of this job are not "others" */
        if (rec->memory.other[i].same_job)
            x->other = sub0(x->other, rec->memory.other[i].bytes);
    og_opt_u64_t inferred = og_other_inferred_bytes(rec);
    if (!og_known(rec->memory.other_processes_bytes) && og_known(inferred)) {
        x->other = inferred.v; /* no NVML: inferred, and the texts say so */
        x->other_inferred = true;
    }
    const og_framework_view_t *fw = &rec->memory.fw;
    enum og_cache_src src = OG_CACHE_NONE;
    x->cached_known = framework_cache(rec, f->pool_idle, &x->cached, &src);
    /* a recovered dump keeps the first attempt's numbers: its cache was still there then */
    x->cache_retried = src == OG_CACHE_RETRY_RELEASE && !rec->event.recovered;
    x->reclaim = x->cached_known && !x->cache_retried ? x->cached : 0;
    char full[sizeof rec->event.library];
    og_cpy(full, sizeof full, rec->event.library, sizeof full);
    og_cpy(x->fail_lib, sizeof x->fail_lib, og_base_name(full), strlen(og_base_name(full)) + 1);
    /* live = what tensors hold; unknown when the cache was not measured (never call cache "live") */
    x->live_known = fw->has || x->cached_known;
    x->live = fw->has ? fw->allocated_bytes : sub0(f->tracked, x->reclaim);
    /* the failing library is the framework's when its name says so or when the ledger counts it as
     * a framework library (an adapter's report makes it one, whatever its name) */
    int by_name = og_framework_of(x->fail_lib, x->fail_lib), by_ledger = OG_FW_UNKNOWN;
    bool fail_is_fw = by_name != OG_FW_UNKNOWN;
    for (int i = 0; !fail_is_fw && i < rec->memory.nlibs && i < 32; i++) {
        char l[sizeof rec->memory.by_library[0].library];
        og_cpy(l, sizeof l, rec->memory.by_library[i].library, sizeof l);
        fail_is_fw = rec->memory.by_library[i].framework && strcmp(og_base_name(l), x->fail_lib) == 0;
        if (fail_is_fw) /* as the ledger classed it, by the path it was loaded from (CuPy's cupy/cuda/memory.*.so) */
            by_ledger = rec->memory.by_library[i].fw_kind;
    }
    /* the framework released what it could before failing again and got nothing back */
    x->retried_zero = rec->event.attempts >= 2 && !rec->event.recovered && fail_is_fw &&
                      og_or(rec->event.released_between_attempts_bytes, 0) == 0;
    x->async_backend = strstr(rec->pytorch_alloc_conf, "cudaMallocAsync") != NULL;
    x->grad = fw->has ? fw->grad_enabled : 0;
    x->training = fw->has ? fw->training : 0;
    x->autocast = fw->has ? fw->autocast : 0;
    /* advice follows the failing call's framework: by its name, else as the ledger classed that library */
    int ffw = by_name != OG_FW_UNKNOWN ? by_name : by_ledger;
    if (ffw != OG_FW_UNKNOWN)
        x->fw = ffw;
    x->cc_known = rec->device.cc_major > 0;
    x->cc = rec->device.cc_major * 10 + (rec->device.cc_minor > 9   ? 9
                                         : rec->device.cc_minor < 0 ? 0
                                                                    : rec->device.cc_minor);
}

/* ------------------------------------------------------------------ which cards fit */

/* A phase in which the failing request is one of a build-up whose rest was never asked for (weights
 * still arriving, a pass keeping activations, optimizer state being made, a cache growing, a retry
 * inside a handler): what the job needs is not known from the failure.  A collective's buffers are
 * set up at once; an unknown phase says nothing. */
static bool unbounded_phase(enum og_job_phase p) { return p != OG_JP_unknown && p != OG_JP_collective; }

/* What a card must hold for this job on the failing device.  A recovered failure fit (after the
 * release): its peak.  An unrecovered one needed at least what it held plus the request (less a
 * measured cache), never less than its peak plus the shortfall; that is the job's peak only when
 * nothing says more was coming: no growth, no load or single pass still building up, no build-up
 * phase, a request of known size.  A card of the failing device's size never fits a failure on it. */
static void fit(og_facts_t *d, const og_record_t *r)
{
    og_fit_facts_t *f = &d->fit;
    uint64_t peak = 0;
    for (int i = 0; i < r->nsummary && i < 16; i++)
        if (r->summary[i].index == r->event.device)
            peak = r->summary[i].peak_bytes;
    f->bounded = true;
    if (d->recovered) {
        f->need = peak; /* it did fit, after the release */
        return;
    }
    f->card_floor = d->capacity;
    uint64_t held = d->used_known && d->used > d->tracked ? d->used : d->tracked;
    uint64_t job = sub0(add_sat(held, d->req), d->reclaim);
    uint64_t ps = add_sat(peak, d->shortfall);
    f->need = peak > job ? peak : job;
    if (ps > f->need)
        f->need = ps;
    if (!d->req_known) /* a framework's failure that did not say; SIZE_MAX and 0 are real requests */
        og_fmt(f->why, sizeof f->why, "the failing request's size was not seen");
    else if (!d->tracked_known && !d->used_known)
        og_fmt(f->why, sizeof f->why, "what this process held was not measured: only the request is known");
    else if (d->growth.holds)
        og_fmt(f->why, sizeof f->why, "memory grew step by step until the failure: a leak fills any card");
    else if (unbounded_phase(d->phase))
        og_fmt(f->why, sizeof f->why, "it failed during %s: what the rest of it needs was never requested",
               og_job_phase_name(d->phase));
    else if (d->load.phase != OG_PHASE_NONE)
        og_fmt(f->why, sizeof f->why, "it failed while loading: the rest of the load was never requested");
    else if (d->growth.pass_built)
        og_fmt(f->why, sizeof f->why, "it failed in one pass still building up: the rest was never requested");
    else if (d->roles.operation == OG_OP_copy && d->roles.copy_made_known)
        og_fmt(f->why, sizeof f->why, "it failed part way through a copy: the rest of it was never requested");
    f->bounded = !f->why[0];
}

/* ------------------------------------------------------------------ entry */

/* A data set by its records: a holder kept across calls (an attribute, a global) that no name gives a purpose and
 * no role's copy is, whose like records (roles.holders[].records: a scene's photos, an epoch's batches) number
 * OG_RECORDS_MIN or more and keep no autograd graph (graphs measured 0), holds the data set as much as one named so
 * when it was there before the steps: the run's series (roles.allocated_over_run) held its bytes already at its
 * first point and rose by less than half of them since.  Records appended as the run goes (each batch's predictions,
 * a rollout's frames) are not: the series rises by them, and without a series when they came is unknown.  The same
 * facts as a named one (dataset_kept, dataset_holder, purpose_bytes), and records_dataset says which. */
static void record_datasets(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!k->known || ro->nstep_run <= 0)
        return;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    int n = ro->nstep_run > OG_STEP_SERIES ? OG_STEP_SERIES : ro->nstep_run;
    uint64_t rose = sub0(ro->step_run[n - 1], ro->step_run[0]);
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        if (h->records < OG_RECORDS_MIN || h->graphs != 0 || h->purpose[0] || h->copy_of[0] ||
            og_where_local(h->where) || h->bytes > ro->step_run[0] || rose >= h->bytes / 2)
            continue;
        k->records_dataset |= 1u << i;
        k->dataset_kept = add_sat(k->dataset_kept, h->bytes);
        k->purpose_bytes[OG_PURPOSE_dataset] = add_sat(k->purpose_bytes[OG_PURPOSE_dataset], h->bytes);
        if (k->dataset_holder < 0 || h->bytes > ro->holders[k->dataset_holder].bytes)
            k->dataset_holder = i;
    }
}

/* what holder i keeps, by its name (roles.holders[].purpose) or, for a data set, by its records; IPython's output
 * history keeps for no purpose of the program's (OG_PURPOSE_NONE: read as any holder kept across calls) */
enum og_purpose og_holder_purpose(const og_facts_t *d, const og_record_t *r, int i)
{
    if (i < 0 || i >= r->memory.fw.roles.nholders)
        return OG_PURPOSE_NONE;
    if (i < 8 && (d->roles.records_dataset >> i & 1u))
        return OG_PURPOSE_dataset;
    char p[sizeof r->memory.fw.roles.holders[0].purpose];
    og_cpy(p, sizeof p, r->memory.fw.roles.holders[i].purpose, sizeof p);
    enum og_purpose pu = og_purpose_of(p);
    return pu == OG_PURPOSE_output_history ? OG_PURPOSE_NONE : pu;
}

/* The holder of the growth: the largest holder, wherever it is kept (a global, an attribute, a list a running
 * training loop fills), that holds at least half of the steady part of the rise (the median rise per step
 * times the steps read): what to release, named as the program names it */
static void grower(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    k->grower = -1;
    const og_growth_facts_t *g = &d->growth;
    if (!k->known || !g->holds || !g->per_step || !g->transitions)
        return;
    double steady = (double)g->per_step * (double)g->transitions;
    const og_roles_t *ro = &r->memory.fw.roles;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh; i++)
        if ((double)ro->holders[i].bytes >= 0.5 * steady && (k->grower < 0 || ro->holders[i].bytes > k->grower_bytes)) {
            k->grower = i;
            k->grower_bytes = ro->holders[i].bytes;
        }
}

/* holders kept to a bound the program names that they have reached (facts.h: at_bound): what they keep stops
 * there, a cache full, not a leak */
#define AT_BOUND_SHARE 0.9
static bool holder_at_bound(const og_role_holder_t *h)
{
    if (og_known(h->bound_bytes) && h->bound_bytes.v && (double)h->bytes >= AT_BOUND_SHARE * (double)h->bound_bytes.v)
        return true;
    return og_known(h->bound_records) && h->bound_records.v >= 2 && h->records >= 2 &&
           (double)h->records >= AT_BOUND_SHARE * (double)h->bound_records.v;
}

static void at_bound(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    k->bounded = -1;
    if (!k->known)
        return;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        char where[sizeof h->where];
        og_cpy(where, sizeof where, h->where, sizeof where);
        if (og_where_local(where) || !holder_at_bound(h))
            continue;
        k->bounded_bytes = add_sat(k->bounded_bytes, h->bytes);
        if (k->bounded < 0 || h->bytes > ro->holders[k->bounded].bytes)
            k->bounded = i;
    }
    /* the growth is that cache filling: its holder, or holders at their bound keeping most of the rise */
    d->growth.bounded = d->growth.holds && k->bounded >= 0 &&
                        (k->grower == k->bounded ||
                         (d->growth.rise && (double)k->bounded_bytes >= AT_BOUND_SHARE * (double)d->growth.rise));
}

/* ------------------------------------------------------------------ the framework's version */

/* PyTorch's version in the adapter's `source` ("torch 1.13.0", "torch 2.5.1+cu121"): major * 100 + minor, 0 when
 * the source is not PyTorch's or does not parse (the settings a version has follow from it: expandable_segments from
 * 2.1, PYTORCH_CUDA_ALLOC_CONF from 1.10) */
static int torch_version(const char *source)
{
    char s[32];
    og_cpy(s, sizeof s, source, sizeof s);
    if (strncmp(s, "torch ", 6) != 0)
        return 0;
    int v[2] = { 0, 0 }, i = 6;
    for (int part = 0; part < 2; part++, i++) {
        int digits = 0;
        for (; s[i] >= '0' && s[i] <= '9' && digits < 2; i++, digits++)
            v[part] = v[part] * 10 + (s[i] - '0');
        if (!digits || (part == 0 && s[i] != '.') || (s[i] >= '0' && s[i] <= '9'))
            return 0;
    }
    return v[0] * 100 + v[1];
}

/* a cache of micro-batches' outputs kept with their graphs for the backward the running code calls later
 * (facts.h: graph_cache): what that backward needs, not a leak */
static void graph_cache(og_facts_t *d, const og_record_t *r)
{
    og_role_facts_t *k = &d->roles;
    const og_roles_t *ro = &r->memory.fw.roles;
    if (!k->known || d->phase != OG_JP_forward || ro->backward_on_stack <= 0 || r->memory.fw.grad_enabled != 1)
        return;
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh; i++) {
        const og_role_holder_t *h = &ro->holders[i];
        if (h->graphs >= 2 && h->records >= 2 && !h->copy_of[0] && og_holder_purpose(d, r, i) == OG_PURPOSE_cache &&
            (k->graph_cache < 0 || h->bytes > ro->holders[k->graph_cache].bytes))
            k->graph_cache = i;
    }
}

/* the layers a forward pass has still to run (facts.h: layers_to_come) */
static void layers_to_come(og_facts_t *d, const og_record_t *r)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    og_role_facts_t *k = &d->roles;
    int n = ro->layer_count, i = ro->layer_index;
    if (!k->known || !k->act_known || !k->act || n < 4 || i < 0 || i >= n - 1 || ro->layer_alike != 1 ||
        d->phase != OG_JP_forward || r->memory.fw.grad_enabled != 1 || k->checkpointing == 1 || !k->steps_known ||
        k->steps_made || k->accumulating || k->graph_cache >= 0)
        return;
    k->layers_to_come = (uint64_t)((double)k->act * (double)(n - i - 1) / (double)(i + 1));
    k->layers_left = n - i - 1;
}

/* a holder keeping one record per layer of the running pass (facts.h: layer_holder): the largest whose records are
 * the layers run so far; at least a 64th of the device, so that a small per-layer log is no lever */
static void layer_holder(og_facts_t *d, const og_record_t *r)
{
    const og_roles_t *ro = &r->memory.fw.roles;
    og_role_facts_t *k = &d->roles;
    int n = ro->layer_count, i = ro->layer_index, nh = OG_FILLED(ro->nholders, ro->holders);
    k->layer_holder = -1;
    if (!k->known || n < 4 || i < 1 || i >= n - 1 || ro->layer_alike != 1 || !pass_phase(d->phase))
        return;
    for (int h = 0; h < nh; h++) {
        int64_t rec = ro->holders[h].records;
        if ((rec != i && rec != i + 1) || ro->holders[h].tensors < (uint64_t)rec ||
            ro->holders[h].bytes * 64 < d->capacity)
            continue;
        if (k->layer_holder < 0 || ro->holders[h].bytes > ro->holders[k->layer_holder].bytes) {
            k->layer_holder = h;
            k->layer_holder_to_come = (uint64_t)((double)ro->holders[h].bytes * (double)(n - rec) / (double)rec);
        }
    }
}

void og_facts_compute(og_facts_t *f, const og_record_t *rec, const og_thresholds_t *th, og_growth_scratch_t *s)
{
    memset(f, 0, sizeof *f);
    f->torch_version = rec->memory.fw.has ? torch_version(rec->memory.fw.source) : 0;
    measure(f, rec, th);
    framework_cap(f, rec);
    job_phase(f, rec);
    roles(f, rec);
    graph_cache(f, rec);
    layers_to_come(f, rec);
    layer_holder(f, rec);
    /* a hand-written decoding loop is a generation too: the stack shows only a forward or an evaluation, but a
     * local of the running code keeps a KV cache (the loop's own past_key_values, extended block by block) */
    f->decoding = f->phase == OG_JP_generation ||
                  ((f->phase == OG_JP_forward || f->phase == OG_JP_evaluation) && f->roles.known && f->roles.local_kv);
    /* a KV cache is attention's keys and values: a model decoding with one attends, whatever its layers are named */
    if (f->roles.attention == -1 && (f->decoding || f->roles.kv >= 0 || f->roles.num_beams > 0))
        f->roles.attention = 1;
    record_datasets(f, rec);
    kept_graphs(f, rec);
    weights_copies(f, rec);
    trains(f, rec);
    growth(f, rec, s);
    f->growth.kept_measured = f->growth.holds && f->roles.known && f->growth.rise &&
                              (double)f->roles.kept_across >= 0.9 * (double)f->growth.rise;
    f->growth.copies_kept = f->growth.holds && f->roles.known && f->growth.rise &&
                            (double)f->roles.model_copies >= 0.8 * (double)f->growth.rise;
    grower(f, rec);
    at_bound(f, rec);
    load(f, rec);
    imbalance(f, rec);
    non_framework(f, rec);
    fit(f, rec);
    comprehension_running(f, rec);
    pass_outgrows_cache(f, rec);
    growth_outgrows_cache(f);
    kept_outgrows_cache(f);
    stmt_holders(f, rec);
    loose_operation(f, rec);
    others_sliver(f);
    copy_outgrows_cache(f);
    spare_device(f, rec);
    outlier(f, rec);
    communication(f, rec);
    nonfw_built_up(f, rec);
    node_ranks(f, rec);
    advice(f, rec);
}
