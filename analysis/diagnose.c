/* Diagnosis: why did the allocation fail?  Fills rec->diagnosis from the measured fields of
 * the record.  Pure: no I/O, no globals, no allocation (scratch lives in the record); the same record always gives the same
 * diagnosis.  (<stdio.h> is included for vsnprintf only, to format the summaries.)
 * docs/diagnosis.md states every rule for users; this comment is the precise version.
 *
 * The quantities the rules read (req, free, shortfall, footprint, cached, reclaim, app_slack, peers,
 * the growth's steps, ...) are the facts of facts.c, computed once before any rule runs; every rule
 * is a function of those const facts (and of the const record, for names in its texts), so the
 * order of the table below decides ties only.
 *
 * Causes (each that holds is kept; clamp(x) = min(1, max(0, x))):
 * limit          event.caused_by_limit: 1.0 (oomguard refused the request itself).  The text
 *                counts what the check counts (context included); "refused by the context alone"
 *                when the context plus the request is over the limit whatever the job holds.
 * framework_cap  the adapter reports a framework-imposed cap (set_per_process_memory_fraction,
 *                XLA_PYTHON_CLIENT_MEM_FRACTION, TF memory_limit, CuPy set_limit) and what the cap counts
 *                plus the request exceeds it, counted as that framework checks it: PyTorch's fraction and
 *                CuPy's limit count the RESERVED bytes, JAX's and TF's arenas the bytes in use.  The
 *                framework refused the request itself while the device had room (0.99: the cap said no,
 *                whatever else is true), refused it without room (0.95), or the device had room (0.8).
 *                Its summary starts with the cap and its setting.  Under the cap an internal failure is
 *                not the cap's (e.g. fragmentation inside an XLA arena).
 * cache_held     failing library known and not a framework (cuDNN, NCCL, an extension), shortfall > 0:
 *                (a) measured: max(reclaim, app_slack) >= shortfall: 0.6 + 0.3*clamp((avail/short-1)/3);
 *                (b) the cache is unknown but frameworks reserve R >= shortfall: 0.5 + 0.1*clamp((R/short-1)/3)
 *                    (the failure came from outside the framework's allocator, which therefore
 *                    never released its cache); or the application's own pool: app_slack >= shortfall
 *                    whatever library failed: 0.75 + 0.2*clamp((slack/short-1)/3).
 * fragmentation  cached known > 0, failing library the framework (or unknown), and one of
 *                (a) cached >= req: adapter's largest free block L < req: 0.85 + 0.15*(1 - L/cached);
 *                    L >= req: 0.30; L unknown: 0.6 + 0.25*clamp((cached/req - 1)/3)
 *                (b) 0 < shortfall <= cached < req: 0.45 + 0.2*cached/req (+0.1 large idle share,
 *                    +0.1 L < req)
 *                (c) cached >= frag_share of the reservation and >= 256 MiB: 0.3 + 0.2*clamp(...)
 *                (d) no adapter, the framework released its free segments and the retry still
 *                    failed, and the run allocated many different sizes (>= 5 distinct among its
 *                    allocations: variable-length batches): 0.5.  What is left is split segments.
 *                At most 0.5 when a pass still building (or a copy, a growth, what Python keeps) outgrows
 *                the cache; at most 0.7 when another framework in the process holds half the device or
 *                more, more than the shortfall and than this framework's whole reservation (its grab
 *                left the sliver the splinters are in: other_framework, 0.75 or more, leads).
 *                recovered: what the framework released between attempts explains the recovery:
 *                fragmentation (failing library the framework) 0.9 when it covers the shortfall, else
 *                0.7; cache_held for another failing library.  does_not_fit never holds for a
 *                recovered failure (the retry fit), unless the request exceeds the device.
 * other_framework  a framework other than ffw reserves R2 >= shortfall on this device (JAX/XLA's
 *                75% preallocation, TensorFlow's grab-all): 0.75 + 0.2*clamp(R2/total / 0.5).
 * peer_ranks     same-job peers hold P on this device, P >= shortfall (or this rank's LOCAL_RANK
 *                names another GPU): 0.7, +0.2 when each holds about one context (<= 1.5 GiB).
 *                Peers: ranks, children, the parent and its other workers (a pre-fork server).
 * imbalance      one process (world_size <= 1) using >= 2 GPUs; the failing GPU holds >= 1.5x the
 *                most of any other, and evening it out would cover the shortfall:
 *                0.6 + 0.3*clamp((ratio - 1.5)/2).
 * foreign_memory shortfall > 0 and others (not of this job) >= shortfall:
 *                0.45 + 0.25*clamp((others/short - 1)/3) + 0.3*clamp(others/total / 0.25).
 *                Not when the framework refused under its own cap without asking the driver.
 * non_framework  as before: NVML known, a framework present, nonfw >= nonfw_share of the process,
 *                >= shortfall and >= 1 GiB: 0.35 + 0.3*clamp(..) + 0.2*clamp(..).  A framework's own
 *                stream-ordered pool counts as the framework (capture.c), so it never fires on it.
 * growth         a pattern of steps, not a ramp in time.  Steps are marked by the allocations of the
 *                failing request's size (within max(req/32, 2 MiB)) in the event history: a leak fails
 *                doing what every step did, at a higher floor; failing that, by the size allocated
 *                most often (>= 16 times: small leaked tensors while something else failed); failing
 *                that, by every allocation (a leak of varying sizes), then with >= 16 steps and >= 90%
 *                of them rising.  The low point of a step is the least
 *                live memory from its marker to the next.  Needs >= 6 steps, low points rising in >=
 *                growth_rising_steps of them, total rise >= growth_min_share of the device (or, over
 *                >= 16 steps, >= the bytes missing now), and not
 *                accounted for by a measured cache (>= half the rise: a pool keeping what it handed
 *                out is a cache, not a leak); the rate
 *                reported is the median rise per step.  Loading (weights, optimizer state: other
 *                sizes, never freed) marks no steps and a one-off jump inside a step does not set the
 *                rate.  A load is not a leak: when each step adds >= 1/40 of the device and the
 *                process held less than two steps' worth before them, they are weights arriving
 *                (does_not_fit then says "loading").  Markers back to back (nothing between) are one
 *                burst, one step (a load of many equal shards is not many steps), unless the run
 *                pauses as a loop does; the run is decided as a whole from its gaps, never gap by
 *                gap: a run whose typical (median) gap is >= 0.8 ms is a loop of one block an
 *                iteration (every marker a step); else its pauses are gaps >= 0.8 ms and >= 8x the
 *                typical gap, after the same number of markers each time, the markers between two
 *                pauses coming within a twentieth of a pause.  Gaps rising smoothly (a generation
 *                slowing token by token) make no pause;
 *                a pause of the host falls anywhere, or after a time slice's worth of markers, or
 *                inside a loop's piece, and splits nothing; a host that halves or doubles any gap
 *                moves no decision, so the answer does not depend on how busy the machine was.
 *                Otherwise wall time is not used, so a 1 ms leak is a leak and a slow load of other
 *                sizes is a load.
 *                One pass is not a leak: when the framework reports what it freed over its life
 *                (PyTorch allocated_bytes.all.freed) and that is < 10% of the rise, the steps are
 *                one pass keeping what it makes (a forward pass keeping each layer's activations),
 *                not iterations, which free their temporaries; no growth, and does_not_fit does
 *                not call it a load.  An unknown freed total (no adapter) is not zero.
 *                conf = 0.5 + 0.25*clamp((steps - 6)/26) + 0.2*clamp((rising_share - rs)/(1 - rs)).
 *                Measured by the adapter instead (no steps read): outputs kept with their graphs alive
 *                (kept_graphs), or a caller's local keeping one like record per call of the running code
 *                while the call under way holds the next (kept_records; facts.c, growth_by_records), or
 *                a deep copy rebinding an iteration's name while earlier copies of the same model that
 *                no name reaches are kept (kept_copies; facts.c, growth_by_copies).
 * does_not_fit   req > free + reclaim.  A request larger than the device (or the limit) is named as
 *                such: 1.0.  Otherwise 0.95 when every input is measured; 0.65 when the framework
 *                released its cache and still failed but its split segments were not measured; 0.45
 *                when a framework holds a reservation whose cache was not measured (an unknown
 *                cache never makes it certain); -0.15 when free memory was estimated; at most 0.45
 *                when others hold the missing bytes and the job alone would fit; at most 0.6 when growth
 *                an imbalance or memory outside the framework (non_framework) accounts for the missing
 *                bytes (they explain it better).
 *
 * Meaning of confidence (calibrated on tests/scenarios): >= 0.9 the measured numbers leave no
 * other reading; 0.6-0.9 measured, with margin; 0.4-0.6 an input was not measured and the
 * cause is the best reading of what was; < 0.4 possible but not supported.
 * Order: by confidence plus each cause's tie-break bonus (common/causes.def: the list of causes, whose
 * order also breaks equal scores), stable; the bonus never changes the reported confidence.
 * primary = first id; when nothing holds, one cause "unknown" (confidence 0) says what was measured.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"
#include "advice_text.h"
#include "facts.h"

#define FRAG_C_FLOOR       (256ULL << 20) /* fragmentation (c): at least 256 MiB idle */
#define PASS_FRAG_CONF     0.5            /* fragmentation when the pass still building outgrows the cache */
#define PASS_DNF_CONF      0.8            /* does_not_fit then: measured, the rest of the pass not requested */
#define SQUEEZED_FRAG_CONF 0.7 /* fragmentation in a reservation another framework squeezed (below its 0.75) */


/* ------------------------------------------------------------------ small helpers */

static double clamp01(double x) { return x != x ? 0 : x < 0 ? 0 : x > 1 ? 1 : x; }


static void ev_num(og_cause_t *c, const char *name, double v)
{
    if (c->nevidence >= 12)
        return;
    c->evidence[c->nevidence].name = name;
    c->evidence[c->nevidence].is_text = false;
    c->evidence[c->nevidence].num = v;
    c->evidence[c->nevidence].text[0] = 0;
    c->evidence[c->nevidence].is_bytes = false;
    c->nevidence++;
}

static void ev_bytes(og_cause_t *c, const char *name, uint64_t v)
{
    int n = c->nevidence;
    ev_num(c, name, (double)v);
    if (c->nevidence > n) { /* the double is for comparisons; the dump writes this */
        c->evidence[n].is_bytes = true;
        c->evidence[n].bytes = v;
    }
}

static void ev_text(og_cause_t *c, const char *name, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void ev_text(og_cause_t *c, const char *name, const char *f, ...)
{
    if (c->nevidence >= 12)
        return;
    c->evidence[c->nevidence].name = name;
    c->evidence[c->nevidence].is_text = true;
    c->evidence[c->nevidence].num = 0;
    va_list ap;
    va_start(ap, f);
    og_vfmt(c->evidence[c->nevidence].text, sizeof c->evidence[0].text, f, ap);
    va_end(ap);
    c->nevidence++;
}

/* the shortfall as evidence: its bytes, or "not measured" (the device's free memory was not read) */
static void ev_shortfall(og_cause_t *c, const og_facts_t *d)
{
    if (d->shortfall_known)
        ev_bytes(c, "shortfall_bytes", d->shortfall);
    else
        ev_text(c, "shortfall_bytes", "not measured");
}

/* the request as evidence: its bytes, or "not measured" (an adapter reported the failure without its size) */
static void ev_req(og_cause_t *c, bool known, uint64_t req)
{
    if (known)
        ev_bytes(c, "requested_bytes", req);
    else
        ev_text(c, "requested_bytes", "not measured");
}

/* the request in a sentence: its size, or that none was given (never "0 B") */
static og_hb_t req_hb(bool known, uint64_t req)
{
    og_hb_t t;
    if (known)
        return og_hb((double)req);
    og_fmt(t.s, sizeof t.s, "(size not given)");
    return t;
}

static void summary(og_cause_t *c, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void summary(og_cause_t *c, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    og_vfmt(c->summary, sizeof c->summary, f, ap);
    va_end(ap);
}


/* continues the summary: its last character (the full stop) becomes what f formats, when room bytes are left */
static void summary_more(og_cause_t *c, size_t room, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void summary_more(og_cause_t *c, size_t room, const char *f, ...)
{
    size_t n = strlen(c->summary);
    if (!n || n + room >= sizeof c->summary)
        return;
    va_list ap;
    va_start(ap, f);
    og_vfmt(c->summary + n - 1, sizeof c->summary - n + 1, f, ap);
    va_end(ap);
}

static const char *fw_display(int fw) { return og_framework_display(fw, "the framework"); }

/* ------------------------------------------------------------------ causes */

static bool c_limit(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (!r->event.caused_by_limit)
        return false;
    c->id = og_cause_ids[OG_CAUSE_LIMIT];
    c->confidence = 1.0;
    uint64_t ctx = sub0(d->usage_lim, d->tracked);
    uint64_t need = add_sat(d->usage_lim, d->req);
    if (d->limited) {
        bool phys = og_known(r->device.free_bytes) && r->device.free_bytes.v >= d->req;
        uint64_t over = sub0(need, d->limit);
        char ctxs[80] = "";
        if (ctx)
            og_fmt(ctxs, sizeof ctxs, " + %s CUDA context and untracked", og_hb((double)ctx).s);
        if (d->req > d->limit)
            summary(c, "OOMGUARD_LIMIT (%s) refused %s: the request alone is larger than the limit%s.",
                    og_hb((double)d->limit).s, req_hb(d->req_known, d->req).s,
                    phys ? "; the device itself had room for it" : "");
        else if (ctx && add_sat(ctx, d->req) > d->limit)
            summary(c,
                    "OOMGUARD_LIMIT (%s) refused %s because of the CUDA context alone: the limit also counts %s of "
                    "context and untracked memory, and that plus the request is over it whatever the job holds (%s "
                    "allocated)%s.",
                    og_hb((double)d->limit).s, req_hb(d->req_known, d->req).s, og_hb((double)ctx).s,
                    og_hb((double)d->tracked).s, phys ? "; the device itself had room for it" : "");
        else if (over)
            summary(c,
                    "OOMGUARD_LIMIT (%s) refused %s: the job would hold %s (%s allocated%s + %s requested), %s over "
                    "the limit%s.",
                    og_hb((double)d->limit).s, req_hb(d->req_known, d->req).s, og_hb((double)need).s,
                    og_hb((double)d->tracked).s, ctxs, req_hb(d->req_known, d->req).s, og_hb((double)over).s,
                    phys ? "; the device itself had room for it" : "");
        else
            summary(c,
                    "OOMGUARD_LIMIT (%s) refused %s: with %s already counted (%s allocated%s) the limit was "
                    "reached.",
                    og_hb((double)d->limit).s, req_hb(d->req_known, d->req).s, og_hb((double)d->usage_lim).s,
                    og_hb((double)d->tracked).s, ctxs);
        ev_bytes(c, "limit_bytes", d->limit);
        ev_bytes(c, "over_limit_bytes", over);
        ev_bytes(c, "context_bytes", ctx);
    } else {
        summary(c, "OOMGUARD_LIMIT refused %s; the job would hold at least %s (%s allocated + %s).",
                req_hb(d->req_known, d->req).s, og_hb((double)need).s, og_hb((double)d->tracked).s,
                req_hb(d->req_known, d->req).s);
        ev_text(c, "limit_bytes", "unknown");
    }
    ev_bytes(c, "tracked_bytes", d->tracked);
    ev_req(c, d->req_known, d->req);
    ev_bytes(c, "job_need_bytes", need);
    if (og_known(r->device.free_bytes))
        ev_bytes(c, "physical_free_bytes", r->device.free_bytes.v);
    return true;
}

/* the largest framework reservation and its kind */
static bool c_framework_cap(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    const og_framework_view_t *fw = &r->memory.fw;
    if (!d->cap.binds)
        return false;
    uint64_t req = d->cap.req, alloc = d->cap.alloc;
    bool room = d->cap.room;
    c->id = og_cause_ids[OG_CAUSE_FWCAP];
    /* refused inside the framework while the device had room: the cap is what said no */
    c->confidence = fw->internal_oom ? (room ? 0.99 : 0.95) : 0.8;
    char src[sizeof fw->cap_source];
    og_cpy(src, sizeof src, fw->cap_source, sizeof fw->cap_source);
    const char *who = fw_display(d->ffw);
    /* the cap and its setting first: the line a user reads (the stderr summary quotes it) */
    const char *roomtxt = !d->cap.req_known ? "whether the device had room for it is not known"
                          : room            ? "the device itself had room for the request"
                                            : "the device had no room either";
    char counted[96];
    if (d->cap.reserved)
        og_fmt(counted, sizeof counted, "%s reserved (%s of it in tensors)", og_hb((double)d->cap.counted).s,
               og_hb((double)alloc).s);
    else
        og_fmt(counted, sizeof counted, "%s in use", og_hb((double)alloc).s);
    if (src[0])
        summary(c, "%s's cap %s (%s) refused %s: %s%s; %s.", who, src, og_hb((double)d->cap.cap).s,
                req_hb(d->cap.req_known, req).s, counted,
                d->cap.reserved ? ", and the cap counts what is reserved" : "", roomtxt);
    else
        summary(c, "%s's own cap of %s refused %s: %s%s; %s.", who, og_hb((double)d->cap.cap).s,
                req_hb(d->cap.req_known, req).s, counted,
                d->cap.reserved ? ", and the cap counts what is reserved" : "", roomtxt);
    ev_bytes(c, "cap_bytes", d->cap.cap);
    ev_text(c, "cap_source", "%s", src[0] ? src : "unknown");
    ev_text(c, "cap_counts", "%s", d->cap.reserved ? "reserved" : "allocated");
    ev_bytes(c, "counted_bytes", d->cap.counted);
    ev_bytes(c, "allocated_bytes", alloc);
    ev_req(c, d->cap.req_known, req);
    if (d->cap.req_known)
        ev_bytes(c, "over_cap_bytes", d->cap.over);
    else
        ev_text(c, "over_cap_bytes", "not measured");
    ev_num(c, "internal_oom", fw->internal_oom ? 1 : 0);
    if (og_known(r->device.free_bytes))
        ev_bytes(c, "physical_free_bytes", r->device.free_bytes.v);
    return true;
}

static bool c_cache_held(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (d->shortfall == 0)
        return false;
    char full[sizeof r->event.library], lib[64];
    og_cpy(full, sizeof full, r->event.library, sizeof r->event.library);
    og_cpy(lib, sizeof lib, full[0] ? og_base_name(full) : "the failing library", sizeof full);
    /* the application's own stream-ordered pool keeps freed memory until trimmed */
    if (d->app_slack >= d->shortfall) {
        c->id = og_cause_ids[OG_CAUSE_CACHE];
        c->confidence = 0.75 + 0.2 * clamp01(((double)d->app_slack / (double)d->shortfall - 1) / 3);
        char owner[64];
        og_cpy(owner, sizeof owner, r->memory.pool_owner[0] ? r->memory.pool_owner : "the application",
               sizeof r->memory.pool_owner);
        summary(c,
                "The application's own stream-ordered memory pool (used by %s) keeps %s reserved but unused, more "
                "than the %s missing: the pool holds freed memory until it is trimmed.",
                owner, og_hb((double)d->app_slack).s, og_hb((double)d->shortfall).s);
        ev_text(c, "holder", "application_pool");
        ev_text(c, "pool_owner", "%s", owner);
        ev_bytes(c, "pool_unused_bytes", d->app_slack);
        ev_shortfall(c, d);
        ev_req(c, d->req_known, d->req);
        return true;
    }
    /* CUDA-graph private pools keep idle at least the missing bytes: reserved for their graphs' replays as long as
     * the graphs live (one pool per captured shape), not splinters any other request could use */
    if (d->pool_idle >= d->shortfall) {
        c->id = og_cause_ids[OG_CAUSE_CACHE];
        c->confidence = 0.75 + 0.2 * clamp01(((double)d->pool_idle / (double)d->shortfall - 1) / 3);
        summary(c,
                "%s's CUDA-graph private pools keep %s reserved that no block of theirs uses, more than the %s "
                "missing: each captured graph keeps its pool for its replays as long as it lives, and no "
                "empty_cache releases it.",
                d->fwname, og_hb((double)d->pool_idle).s, og_hb((double)d->shortfall).s);
        ev_text(c, "holder", "graph_pools");
        ev_bytes(c, "pool_unused_bytes", d->pool_idle);
        ev_bytes(c, "private_pool_bytes", r->memory.fw.private_pool_bytes);
        ev_shortfall(c, d);
        ev_req(c, d->req_known, d->req);
        return true;
    }
    if (d->failing_fw != 0)
        return false;
    if (d->cached_known && d->reclaim >= d->shortfall) {
        c->id = og_cause_ids[OG_CAUSE_CACHE];
        c->confidence = 0.6 + 0.3 * clamp01(((double)d->reclaim / (double)d->shortfall - 1) / 3);
        if (d->recovered && d->cached_src == OG_CACHE_RETRY_RELEASE) {
            c->confidence = 0.9;
            summary(c,
                    "%s failed to get %s while %s held %s cached but unused; %s released it between attempts "
                    "and the retry succeeded.",
                    lib, req_hb(d->req_known, d->req).s, fw_display(r->framework), og_hb((double)d->cached).s,
                    fw_display(r->framework));
        } else
            summary(c, "%s failed to get %s while %s holds %s cached but unused, more than the %s missing.", lib,
                    req_hb(d->req_known, d->req).s, fw_display(r->framework), og_hb((double)d->reclaim).s,
                    og_hb((double)d->shortfall).s);
        ev_text(c, "failing_library", "%s", lib);
        ev_req(c, d->req_known, d->req);
        ev_shortfall(c, d);
        ev_bytes(c, "cached_bytes", d->cached);
        ev_text(c, "cached_source", "%s", og_cache_src_name(d->cached_src));
        return true;
    }
    uint64_t held;
    int k = -1;
    for (int j = 0; j < OG_NFW; j++) /* the largest framework reservation */
        if (d->resv[j] && (k < 0 || d->resv[j] > d->resv[k]))
            k = j;
    held = k >= 0 ? d->resv[k] : 0;
    if (d->cached_known || k < 0 || held < d->shortfall)
        return false;
    /* unknown is not zero: the framework holds a reservation of which an unmeasured part is cache */
    c->id = og_cause_ids[OG_CAUSE_CACHE];
    c->confidence = 0.5 + 0.1 * clamp01(((double)held / (double)d->shortfall - 1) / 3);
    const char *who = fw_display(k);
    summary(c,
            "%s failed to get %s while %s holds %s; how much of it is cached but unused was not measured (the "
            "failure came from outside %s's allocator, which therefore kept its cache). If at least the %s missing "
            "is cache, releasing it before that call makes room.",
            lib, req_hb(d->req_known, d->req).s, who, og_hb((double)held).s, who, og_hb((double)d->shortfall).s);
    ev_text(c, "failing_library", "%s", lib);
    ev_req(c, d->req_known, d->req);
    ev_shortfall(c, d);
    ev_bytes(c, "framework_reserved_bytes", held);
    ev_text(c, "cached_bytes", "not measured");
    ev_text(c, "framework", "%s", og_framework_name(k));
    return true;
}

static bool c_fragmentation(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (d->failing_fw == 0 || r->memory.pool_owner_fw == 2)
        return false;
    double fs = d->frag_share;
    double cached = (double)d->cached, req = (double)d->req;
    double share = d->reservation ? cached / (double)d->reservation : 0;
    bool share_hit = d->reservation && share >= fs;
    double conf = -1;
    const char *why = NULL;
    bool retry_rel = d->cached_known && d->cached_src == OG_CACHE_RETRY_RELEASE;

    if (d->retried && !r->memory.fw.has) { /* (d) */
        int ds = d->distinct_sizes;
        if (ds >= 5 && d->shortfall > 0 && d->reservation >= d->shortfall) {
            c->id = og_cause_ids[OG_CAUSE_FRAG];
            c->confidence = 0.5;
            summary(c,
                    "%s released %s of free segments and retried, and %s still did not fit; it keeps %s reserved "
                    "in segments partly in use, and the run allocated %d different sizes (variable-length batches "
                    "split segments). How much of the reservation is unused was not measured.",
                    d->fwname, og_hb((double)d->released).s, req_hb(d->req_known, d->req).s,
                    og_hb((double)d->reservation).s, ds);
            ev_bytes(c, "released_bytes", d->released);
            ev_bytes(c, "reservation_bytes", d->reservation);
            ev_req(c, d->req_known, d->req);
            ev_num(c, "distinct_sizes", ds);
            ev_text(c, "cached_bytes", "not measured");
            ev_text(c, "rule", "retry_split");
            return true;
        }
        return false;
    }
    if (!d->cached_known || d->cached == 0)
        return false;
    /* a cache already handed back and retried is no longer held: nothing is fragmented in it */
    if (retry_rel && !d->recovered)
        return false;
    if (d->recovered && retry_rel) {
        c->id = og_cause_ids[OG_CAUSE_FRAG];
        /* 0.9 when the cache covers the shortfall; an unknown one it cannot be said to cover */
        bool covers = d->shortfall_known && d->cached >= d->shortfall;
        c->confidence = covers ? 0.9 : 0.7;
        if (covers || !d->shortfall_known)
            summary(c,
                    "%s held %s cached but unused when %s failed; it released that cache between attempts and "
                    "the retry succeeded.",
                    d->fwname, og_hb(cached).s, req_hb(d->req_known, d->req).s);
        else
            summary(c,
                    "%s held %s cached but unused when %s failed (%s was missing); it released that cache "
                    "between attempts, the rest was freed otherwise, and the retry succeeded.",
                    d->fwname, og_hb(cached).s, req_hb(d->req_known, d->req).s, og_hb((double)d->shortfall).s);
        ev_bytes(c, "released_bytes", d->cached);
        ev_req(c, d->req_known, d->req);
        ev_shortfall(c, d);
        ev_text(c, "rule", "recovered_by_release");
        return true;
    }

    if (d->req_known && d->req && d->cached >= d->req) { /* (a): never "covers" a request of unknown size */
        double a;
        if (d->largest_known && d->largest < d->req) {
            a = 0.85 + 0.15 * clamp01(1 - (double)d->largest / cached);
            why = "textbook";
        } else if (d->largest_known) {
            a = 0.30;
            why = "block_available";
        } else {
            a = 0.6 + 0.25 * clamp01((cached / req - 1) / 3);
            why = "cache_covers_request";
        }
        conf = a;
    }
    if (d->shortfall > 0 && d->cached >= d->shortfall && d->cached < d->req) { /* (b) */
        double b = 0.45 + 0.2 * clamp01(cached / req) + (share_hit ? 0.1 : 0) +
                   (d->largest_known && d->largest < d->req ? 0.1 : 0);
        if (b > conf) {
            conf = b;
            why = "free_plus_cache_covers";
        }
    }
    if (share_hit && d->cached >= FRAG_C_FLOOR) { /* (c) */
        double cc = 0.3 + 0.2 * clamp01(fs < 1 ? (share - fs) / (1 - fs) : 1);
        if (cc > conf) {
            conf = cc;
            why = "idle_share";
        }
    }
    if (conf < 0)
        return false;

    /* a pass still building (or a copy under way) that holds many times the cache: the splinters would carry it a
     * few allocations further, the pass itself does not fit (does_not_fit says so); memory rising step after step
     * by many times the cache: they would carry the rise a step or two further (growth says what rises) */
    if ((d->pass_outgrows_cache || d->copy_outgrows_cache || d->growth_outgrows_cache || d->kept_outgrows_cache) &&
        conf > PASS_FRAG_CONF)
        conf = PASS_FRAG_CONF;
    /* another framework in this process holds half the device or more, more than the shortfall and more than this
     * framework's whole reservation (TensorFlow's grab-all, XLA's preallocation): the splinters are in the sliver it
     * left, and that grab is what leaves no room to grow (other_framework leads) */
    if (d->other_fw > OG_FW_UNKNOWN && d->other_fw_bytes >= d->shortfall && d->other_fw_bytes > d->reservation &&
        d->total && 2 * d->other_fw_bytes >= d->total && conf > SQUEEZED_FRAG_CONF)
        conf = SQUEEZED_FRAG_CONF;
    c->id = og_cause_ids[OG_CAUSE_FRAG];
    c->confidence = clamp01(conf);
    if (d->largest_known && d->req_known) /* "smaller than the request": only of a request of known size */
        summary(c,
                "%s holds %s cached but unused (%s of its %s reserved), yet its largest free block is %s, "
                "smaller than the %s requested.",
                d->fwname, og_hb(cached).s, og_pct(cached, (double)d->reservation).s, og_hb((double)d->reservation).s,
                og_hb((double)d->largest).s, req_hb(d->req_known, d->req).s);
    else if (strcmp(why, "idle_share") == 0)
        summary(c,
                "%s holds %s cached but unused, %s of its %s reserved; that idle memory is not where the %s "
                "request needs it.",
                d->fwname, og_hb(cached).s, og_pct(cached, (double)d->reservation).s, og_hb((double)d->reservation).s,
                req_hb(d->req_known, d->req).s);
    else if (d->free_known)
        summary(c, "%s holds %s cached but unused and %s is free, yet %s could not be found in one piece.", d->fwname,
                og_hb(cached).s, og_hb((double)d->free_eff).s, req_hb(d->req_known, d->req).s);
    else
        summary(c,
                "%s holds %s cached but unused (the device's free memory was not measured), yet %s could not be "
                "found in one piece.",
                d->fwname, og_hb(cached).s, req_hb(d->req_known, d->req).s);
    ev_bytes(c, "cached_bytes", d->cached);
    ev_req(c, d->req_known, d->req);
    ev_bytes(c, "reservation_bytes", d->reservation);
    if (d->reservation)
        ev_num(c, "cached_share", share);
    if (d->largest_known) {
        ev_bytes(c, "largest_free_block_bytes", d->largest);
        ev_num(c, "fragmentation", clamp01(1 - (double)d->largest / cached));
    }
    /* a pass building that the run held as much as at once before (facts: held_before): the total was there */
    if (d->held_before) {
        size_t l = strnlen(c->summary, sizeof c->summary);
        og_fmt(c->summary + l, sizeof c->summary - l,
               " The run held %s allocated at once before, more than now with this request: the memory is there, in "
               "pieces.",
               og_hb((double)r->memory.fw.peak_bytes.v).s);
        ev_bytes(c, "peak_allocated_bytes", r->memory.fw.peak_bytes.v);
    }
    /* a pass past its middle whose rest the splinters, whole, would hold (facts: pass_rest) */
    if (d->pass_rest && !d->pass_outgrows_cache) {
        size_t l = strnlen(c->summary, sizeof c->summary);
        og_fmt(c->summary + l, sizeof c->summary - l,
               " The %s pass failed in layer %d of %d: about %s is left to make, within the %s cached and %s free.",
               og_job_phase_name(d->phase), r->memory.fw.roles.layer_index + 1, r->memory.fw.roles.layer_count,
               og_hb((double)d->pass_rest).s, og_hb(cached).s, og_hb((double)d->free_eff).s);
        ev_bytes(c, "pass_rest_bytes", d->pass_rest);
        ev_num(c, "pass_rest_layers", d->pass_rest_layers);
    }
    ev_shortfall(c, d);
    ev_text(c, "rule", "%s", why);
    return true;
}

static bool c_other_framework(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (d->shortfall == 0 || d->ffw == OG_FW_UNKNOWN)
        return false;
    uint64_t r2 = d->other_fw_bytes;
    int k = d->other_fw;
    if (k <= OG_FW_UNKNOWN || r2 < d->shortfall)
        return false;
    c->id = og_cause_ids[OG_CAUSE_OTHERFW];
    double share = d->total ? (double)r2 / (double)d->total : 0;
    c->confidence = 0.75 + 0.2 * clamp01(share / 0.5);
    /* Name the mechanism only when its switch is not already off: with preallocation (or TF memory
     * growth) disabled the bytes are what that framework really allocated and cached as it grew. */
    bool tf_growth = false;
    for (int i = 0; i < r->nenv; i++)
        if (!strcmp(r->env[i], "TF_FORCE_GPU_ALLOW_GROWTH=true"))
            tf_growth = true;
    const char *why =
        k == OG_FW_JAX
            ? (r->xla_preallocate_off ? ": XLA_PYTHON_CLIENT_PREALLOCATE=false is already set, so these are arrays and "
                                        "cache JAX allocated on demand (its allocator keeps freed memory)"
                                      : ": XLA preallocates 75% of the GPU when the client starts")
        : k == OG_FW_TENSORFLOW ? (tf_growth ? ": memory growth is already on, so TensorFlow allocated this as it ran"
                                             : ": TensorFlow maps nearly all free GPU memory at start unless memory "
                                               "growth is on")
                                : "";
    char of[40] = "";
    if (d->total)
        og_fmt(of, sizeof of, " (%s of it)", og_pct((double)r2, (double)d->total).s);
    summary(c, "%s holds %s on this GPU%s in the same process, more than the %s %s is missing%s.", fw_display(k),
            og_hb((double)r2).s, of, og_hb((double)d->shortfall).s, d->fwname, why);
    ev_text(c, "framework", "%s", og_framework_name(k));
    ev_bytes(c, "framework_reserved_bytes", r2);
    ev_num(c, "device_share", share);
    ev_text(c, "failing_framework", "%s", og_framework_name(d->ffw));
    ev_shortfall(c, d);
    return true;
}

static bool c_peer_ranks(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    bool wrong_device = d->wrong_device;
    if (d->shortfall == 0 || (d->npeers == 0 && !wrong_device))
        return false;
    if (d->npeers && d->peers_bytes < d->shortfall && !wrong_device)
        return false;
    c->id = og_cause_ids[OG_CAUSE_PEERS];
    c->confidence = 0.7 + (d->npeers && d->peers_small ? 0.2 : 0) + (wrong_device ? 0.05 : 0);
    if (d->npeers && d->nworld_peers == d->npeers)
        summary(c,
                "%d other %s %s %s on GPU %d. Their identity cannot be read here, but this rank's environment says "
                "srun started %d tasks on this node and torchrun a world in each: one rank of every other world uses "
                "this GPU, as this one does. They are this job's, not other users'.",
                d->npeers, og_plural(d->npeers, "process", "processes"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device, d->nested_launchers);
    else if (d->child_programs)
        summary(c,
                "%d %s this process started, running another program, %s %s on GPU %d: each has a CUDA context "
                "of its own and whatever it loaded; started without waiting for the previous one, they add up. They "
                "are this job's, not other users'.",
                d->npeers, og_plural(d->npeers, "process", "processes"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device);
    else if (d->own_children) {
        char named[sizeof r->memory.fw.roles.children[0].name] = "";
        const char *t = og_child_name(r, r->memory.other[d->own_child].pid);
        og_cpy(named, sizeof named, t ? t : "", sizeof named);
        summary(c,
                "%d %s this process started through multiprocessing %s %s on GPU %d, and %s no DataLoader "
                "worker: the largest, pid %d, is named \"%s\" by the code that started it. Work of this job's own "
                "that is still alive beside this one (a cluster's or a pool's worker, not closed), not another "
                "user's.",
                d->npeers, og_plural(d->npeers, "process", "processes"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device, og_plural(d->npeers, "it is", "none is"),
                r->memory.other[d->own_child].pid, named);
    } else if (d->parent_only)
        summary(c,
                "The process that started this one (its parent) holds %s on GPU %d: this process was started on its "
                "parent's GPU, beside what the parent keeps there (its tensors and its cache). It is this job, not "
                "another user.",
                og_hb((double)d->peers_bytes).s, r->event.device);
    else if (d->npeers && d->nchildren == d->npeers)
        summary(c,
                "%d child %s of this process (DataLoader workers or subprocesses) %s %s on GPU %d%s: a worker "
                "that touches CUDA creates its own context; the data pipeline should stay on the CPU.",
                d->npeers, og_plural(d->npeers, "process", "processes"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device,
                d->peers_small ? ", about one CUDA context each" : "");
    else if (d->npeers && d->nsiblings + d->nparents + d->nchildren == d->npeers)
        summary(c,
                "%d other %s of this job (%s) %s %s on GPU %d: each worker of a pre-fork server loads "
                "its own copy of the model, so the GPU holds one per worker; they are this job, not other users.",
                d->npeers, og_plural(d->npeers, "process", "processes"),
                d->nparents ? "workers of the same parent process and its master"
                            : "workers of the same parent process, same command",
                og_plural(d->npeers, "holds", "hold"), og_hb((double)d->peers_bytes).s, r->event.device);
    else if (d->npeers && d->ranks_outnumber_gpus)
        summary(c,
                "%d other %s of this job (same command, launcher variables) %s %s on GPU %d: the job runs %d ranks on "
                "this machine, which has %d visible %s, so ranks share a GPU whatever each selects.",
                d->npeers, og_plural(d->npeers, "rank", "ranks"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device, d->node_ranks, r->visible_devices,
                og_plural(r->visible_devices, "GPU", "GPUs"));
    else if (d->npeers)
        summary(c,
                "%d other %s of this job (same command, launcher variables) %s %s on GPU %d%s: %s never "
                "select%s %s own GPU before touching CUDA, so %s on this one.",
                d->npeers, og_plural(d->npeers, "rank", "ranks"), og_plural(d->npeers, "holds", "hold"),
                og_hb((double)d->peers_bytes).s, r->event.device, d->peers_small ? ", about one CUDA context each" : "",
                og_plural(d->npeers, "it", "they"), og_plural(d->npeers, "s", ""), og_plural(d->npeers, "its", "their"),
                og_plural(d->npeers, "its context lands", "their contexts land"));
    else
        summary(c,
                "This rank has LOCAL_RANK=%ld but failed on GPU %d: it did not select its own GPU before touching "
                "CUDA.",
                r->local_rank, r->event.device);
    ev_num(c, "peers", d->npeers);
    ev_num(c, "children", d->nchildren);
    if (d->nchild_programs)
        ev_num(c, "child_programs", d->nchild_programs);
    if (d->nchild_own)
        ev_num(c, "own_children", d->nchild_own);
    if (d->nworld_peers)
        ev_num(c, "other_worlds", d->nworld_peers);
    ev_num(c, "siblings", d->nsiblings);
    ev_num(c, "parent", d->nparents);
    ev_bytes(c, "peers_bytes", d->peers_bytes);
    if (d->ranks_outnumber_gpus)
        ev_num(c, "node_ranks", d->node_ranks);
    ev_shortfall(c, d);
    if (r->local_rank >= 0)
        ev_num(c, "local_rank", (double)r->local_rank);
    ev_num(c, "device", r->event.device);
    return true;
}

static bool c_imbalance(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    const og_imbalance_facts_t *b = &d->imbalance;
    if (!b->holds)
        return false;
    c->id = og_cause_ids[OG_CAUSE_IMBALANCE];
    c->confidence = 0.6 + 0.3 * clamp01((b->ratio - 1.5) / 2);
    /* the adapter read the failing statement making a tensor for a model on another GPU: that is what one GPU holds
     * beyond the others, not DataParallel's gathering (roles.statement_model_device) */
    const og_roles_t *ro = &r->memory.fw.roles;
    bool misplaced = d->model_gpu_elsewhere >= 0;
    char model[sizeof ro->stmt_model_name];
    og_cpy(model, sizeof model, ro->stmt_model_name, sizeof model);
    if (misplaced)
        summary(c,
                "GPU %d holds %s while the %d other %s this process uses hold %s on average (%.1fx less): the "
                "failing statement makes its tensor here for %s, whose parameters are on GPU %d.",
                r->event.device, og_hb((double)b->mine).s, b->nother, og_plural(b->nother, "GPU", "GPUs"),
                og_hb((double)b->avg).s, (double)b->mine / (double)(b->avg ? b->avg : 1), model[0] ? model : "a model",
                d->model_gpu_elsewhere);
    else
        summary(c,
                "GPU %d holds %s while the %d other %s this process uses hold %s on average (%.1fx less): one "
                "process drives several GPUs and the first carries the gathered outputs and the optimizer state "
                "(nn.DataParallel).",
                r->event.device, og_hb((double)b->mine).s, b->nother, og_plural(b->nother, "GPU", "GPUs"),
                og_hb((double)b->avg).s, (double)b->mine / (double)(b->avg ? b->avg : 1));
    if (misplaced)
        ev_num(c, "statement_model_device", d->model_gpu_elsewhere);
    ev_bytes(c, "device_bytes", b->mine);
    ev_bytes(c, "other_devices_avg_bytes", b->avg);
    ev_num(c, "other_devices", b->nother);
    ev_num(c, "ratio", b->ratio);
    ev_shortfall(c, d);
    return true;
}

static bool c_foreign(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (d->shortfall == 0 || d->other < d->shortfall)
        return false;
    /* the framework refused the request under its own cap without asking the driver: no other
     * process had a say in that refusal */
    if (d->cap.binds && r->memory.fw.internal_oom)
        return false;
    c->id = og_cause_ids[OG_CAUSE_FOREIGN];
    double share = d->total ? (double)d->other / (double)d->total : 0;
    c->confidence =
        0.45 + 0.25 * clamp01(((double)d->other / (double)d->shortfall - 1) / 3) + 0.3 * clamp01(share / 0.25);
    if (d->other_inferred) {
        /* no process list: the bytes are an inference (another context, a leaked IPC mapping or
         * memory of this process that oomguard did not see could hide in them too) */
        c->confidence = 0.35 + 0.4 * clamp01(share / 0.25);
        summary(c,
                "The process list could not be read (no NVML), but %s of this device is held outside this "
                "process's allocations and its CUDA context (total - free - tracked), more than the %s missing: "
                "most likely other processes.",
                og_hb((double)d->other).s, og_hb((double)d->shortfall).s);
        ev_bytes(c, "other_inferred_bytes", d->other);
        ev_shortfall(c, d);
        ev_text(c, "basis", "%s", "total - free - tracked - context allowance; NVML unavailable");
        return true;
    }
    int n = r->memory.nother < 0 ? 0 : r->memory.nother > 32 ? 32 : r->memory.nother;
    int big = -1;
    for (int i = 0; i < n; i++)
        if (!r->memory.other[i].same_job && (big < 0 || r->memory.other[i].bytes > r->memory.other[big].bytes))
            big = i;
    char who[120] = "";
    if (big >= 0) {
        char name[sizeof r->memory.other[0].name];
        og_cpy(name, sizeof name, r->memory.other[big].name, sizeof name);
        og_fmt(who, sizeof who, " (largest: %spid %d %s, %s)", r->memory.other[big].visible ? "" : "host ",
               r->memory.other[big].pid, name[0] ? name : "?", og_hb((double)r->memory.other[big].bytes).s);
    }
    if (d->nothers)
        summary(c, "%d other %s %s %s on this device%s, more than the %s missing.", d->nothers,
                og_plural(d->nothers, "process", "processes"), og_plural(d->nothers, "holds", "hold"),
                og_hb((double)d->other).s, who, og_hb((double)d->shortfall).s);
    else
        summary(c, "Other processes hold %s on this device, more than the %s missing.", og_hb((double)d->other).s,
                og_hb((double)d->shortfall).s);
    /* an attention's scores failed: the pass's next requests are as large, beyond what the others hold */
    if (d->others_short_of_scores) {
        c->confidence = c->confidence > 0.4 ? 0.4 : c->confidence;
        summary_more(c, 200,
                     "; but the request is an attention's scores (%s), and its softmax and each later layer's scores "
                     "ask as much again: their bytes would carry the pass no further.",
                     og_hb((double)d->req).s);
        ev_bytes(c, "scores_bytes", d->req);
    }
    ev_bytes(c, "other_processes_bytes", d->other);
    ev_shortfall(c, d);
    if (d->total)
        ev_num(c, "other_share", share);
    ev_num(c, "processes", d->nothers);
    if (big >= 0) {
        char name[sizeof r->memory.other[0].name];
        og_cpy(name, sizeof name, r->memory.other[big].name, sizeof name);
        ev_text(c, "largest_process", "pid %d %s", r->memory.other[big].pid, name);
        ev_bytes(c, "largest_process_bytes", r->memory.other[big].bytes);
    }
    return true;
}

static bool c_non_framework(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (!d->nonfw_holds)
        return false;
    uint64_t fwb = r->memory.framework_bytes;
    uint64_t nf = d->nonfw;
    double share = (double)nf / (double)d->used;
    double ns = d->nonfw_share;
    c->id = og_cause_ids[OG_CAUSE_NONFW];
    c->confidence = 0.35 + 0.3 * clamp01(ns < 1 ? (share - ns) / (1 - ns) : 1) +
                    0.2 * clamp01(((double)nf / (double)d->shortfall - 1) / 3);
    int big = d->nonfw_big_lib;
    char lib[64] = "";
    if (big >= 0) {
        char full[sizeof r->memory.by_library[0].library];
        og_cpy(full, sizeof full, r->memory.by_library[big].library, sizeof full);
        og_cpy(lib, sizeof lib, og_base_name(full), sizeof full);
    }
    uint64_t ctx = og_or(r->memory.context_bytes_estimate, 0);
    char extra[112] = "";
    if (lib[0])
        og_fmt(extra, sizeof extra, "; largest: %s %s, CUDA context ~%s", lib,
               og_hb((double)r->memory.by_library[big].bytes).s, og_hb((double)ctx).s);
    else
        og_fmt(extra, sizeof extra, "; CUDA context and untracked memory ~%s", og_hb((double)ctx).s);
    summary(c, "%s of this process's %s (%s) is outside %s%s; that is more than the %s missing.", og_hb((double)nf).s,
            og_hb((double)d->used).s, og_pct((double)nf, (double)d->used).s, d->fwname, extra,
            og_hb((double)d->shortfall).s);
    /* the process made contexts of its own beside its primary one: each holds memory of its own */
    if (d->contexts >= 2) {
        summary_more(c, 120, "; this process holds %d CUDA contexts on this GPU, about %s each.", d->contexts,
                     og_hb((double)og_or(r->memory.context_bytes_estimate, 0) / d->contexts).s);
        ev_num(c, "contexts", d->contexts);
        ev_bytes(c, "contexts_beyond_one_bytes", d->contexts_extra);
    }
    ev_bytes(c, "non_framework_bytes", nf);
    ev_bytes(c, "process_used_bytes", d->used);
    ev_bytes(c, "framework_bytes", fwb);
    ev_num(c, "non_framework_share", share);
    if (og_known(r->memory.context_bytes_estimate))
        ev_bytes(c, "context_bytes_estimate", r->memory.context_bytes_estimate.v);
    ev_shortfall(c, d);
    if (lib[0]) {
        ev_text(c, "largest_library", "%s", lib);
        ev_bytes(c, "largest_library_bytes", r->memory.by_library[big].bytes);
    }
    /* when it took them: across the run (objects of that library made and kept one after another, or a leak in it) */
    if (d->nonfw_built_up) {
        ev_text(c, "largest_library_by_quarter", "%s", og_quarters(r->memory.by_library[big].by_quarter).s);
        ev_bytes(c, "largest_library_older_bytes", d->nonfw_before_last);
        summary_more(c, 120, "; %s took its bytes across the run (%s before the run's last quarter).", lib,
                     og_hb((double)d->nonfw_before_last).s);
    }
    /* that library is NCCL and the environment sizes its buffers beyond NCCL's defaults: the setting in force
     * and the part of its bytes a larger buffer adds */
    if (big >= 0 && big == d->comm_lib && (d->comm_setting_excess || d->comm_min_channels)) {
        char set[96] = "";
        if (d->comm_buffsize)
            og_fmt(set, sizeof set, "NCCL_BUFFSIZE=%llu", (unsigned long long)d->comm_buffsize);
        if (d->comm_min_channels) {
            size_t l = strlen(set);
            og_fmt(set + l, sizeof set - l, "%sNCCL_MIN_NCHANNELS=%d", l ? " " : "", d->comm_min_channels);
        }
        ev_text(c, "library_settings", "%s", set);
        ev_bytes(c, "settings_excess_bytes", d->comm_setting_excess);
    }
    return true;
}
#define GROWTH_MIN_STEPS   6
#define KEPT_CONFIDENCE    0.9  /* a growth that what Python keeps across calls holds (growth.kept_measured) */
#define BOUNDED_CONFIDENCE 0.45 /* a growth that a cache at the bound the program set holds (growth.bounded) */

/* Growth: the facts' reading of the steps (facts.c) when it holds. */
static bool c_growth(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    const og_growth_facts_t *g = &d->growth;
    if (!g->holds)
        return false;
    const og_framework_view_t *fw = &r->memory.fw;
    double rs = d->growth_rising_steps;
    c->id = og_cause_ids[OG_CAUSE_GROWTH];
    c->confidence = 0.5 + 0.25 * clamp01((double)(g->steps - GROWTH_MIN_STEPS) / 26) +
                    0.2 * clamp01(rs < 1 ? (g->rising_share - rs) / (1 - rs) : 1);
    if (g->marker == OG_MARK_OPTIMIZER_STEP) /* measured by the framework itself: a few steps suffice */
        c->confidence = 0.6 + 0.15 * clamp01((double)(g->steps - 4) / 12) +
                        0.2 * clamp01(rs < 1 ? (g->rising_share - rs) / (1 - rs) : 1);
    if (g->over_run) /* a staircase that never fell: its separate rises, not their share of the points, count */
        c->confidence = 0.6 + 0.15 * clamp01((double)(g->rising - 2) / 4) + 0.2;
    if (g->marker == OG_MARK_KEPT_GRAPHS) /* measured by the adapter: the outputs' graphs are alive */
        c->confidence = 0.75 + 0.15 * clamp01((double)(g->steps - 8) / 56);
    /* measured by the adapter: a caller's local keeps one record a call, or a loop one copy of a model */
    if (g->marker == OG_MARK_KEPT_RECORDS || g->marker == OG_MARK_KEPT_COPIES)
        c->confidence = 0.75 + 0.15 * clamp01((double)(g->steps - 3) / 13);
    /* what Python objects keep across calls holds the rise (growth.kept_measured): the adapter measured where it
     * went, so the reading is no longer a matter of how many steps the history shows; a leak fills any card,
     * whatever others hold beside it */
    if (g->kept_measured && c->confidence < KEPT_CONFIDENCE)
        c->confidence = KEPT_CONFIDENCE;
    /* ... unless what keeps it is a cache that reached the bound the program set (an LRU at its budget): memory rose
     * as it filled and stops there; a side finding, below the splinters beside it (fragmentation, 0.5) */
    if (g->bounded && c->confidence > BOUNDED_CONFIDENCE)
        c->confidence = BOUNDED_CONFIDENCE;
    if (g->marker == OG_MARK_KEPT_GRAPHS) {
        const og_role_holder_t *h = &r->memory.fw.roles.holders[d->roles.graph_holder];
        char label[sizeof h->label];
        og_cpy(label, sizeof label, h->label, sizeof label);
        summary(c,
                "A loop keeps its outputs with their autograd graphs: %s holds %ld tensors whose graphs are alive, "
                "each keeping its iteration's activations: about %s in all, %s per iteration.",
                label, g->seen, og_hb((double)g->rise).s, og_hb((double)g->per_step).s);
        ev_text(c, "graph_holder", "%s", label);
    } else if (g->marker == OG_MARK_KEPT_RECORDS) {
        const og_role_holder_t *h = &r->memory.fw.roles.holders[g->holder];
        char label[sizeof h->label];
        og_cpy(label, sizeof label, h->label, sizeof label);
        summary(c,
                "A loop keeps what each call made: %s holds %ld like records, about %s each and %s in all, and the "
                "call under way is building one more of the same size.",
                label, g->seen - 1, og_hb((double)g->per_step).s, og_hb((double)g->rise).s);
        ev_text(c, "records_holder", "%s", label);
    } else if (g->marker == OG_MARK_KEPT_COPIES)
        summary(
            c,
            "A loop keeps a copy of a model for every iteration: the copy under way is number %ld, %s each, and the "
            "earlier ones, %s that no name of the running code holds, are still on the GPU.",
            g->seen, og_hb((double)g->per_step).s, og_hb((double)g->rise).s);
    else if (g->over_run)
        summary(c,
                "Memory kept across iterations rises in steps: over the run's %ld optimizer steps (read every %llu) "
                "the framework's allocated memory right after a step never fell and rose %d times, from %s to %s, "
                "about %s per step: each iteration keeps something.",
                g->seen, (unsigned long long)g->every, g->rising, og_hb((double)g->first_low).s,
                og_hb((double)g->last_low).s, og_hb((double)g->per_step).s);
    else if (g->marker == OG_MARK_OPTIMIZER_STEP)
        summary(c,
                "Memory kept across iterations rises from step to step: right after %s%d optimizer steps the "
                "framework's allocated memory rose in %d of %d, by about %s per step, from %s to %s.",
                g->seen > g->steps ? "each of the last " : "", g->steps, g->rising, g->transitions,
                og_hb((double)g->per_step).s, og_hb((double)g->first_low).s, og_hb((double)g->last_low).s);
    else if (g->marker == OG_MARK_EVERY_ALLOCATION)
        summary(c,
                "Memory left behind rises from step to step: over %s%d steps of varying sizes the low point rose "
                "in %d of %d, by about %s per step, from %s to %s.",
                g->seen > g->steps ? "the last " : "", g->steps, g->rising, g->transitions,
                og_hb((double)g->per_step).s, og_hb((double)g->first_low).s, og_hb((double)g->last_low).s);
    else
        summary(c,
                "Memory left behind rises from step to step: in %s%d steps that each allocate %s (%s), the low "
                "point rose in %d of %d, by about %s per step, from %s to %s.",
                g->seen > g->steps ? "the last " : "", g->steps, og_hb((double)g->size).s,
                g->marker == OG_MARK_FAILING_SIZE ? "the size that failed" : "the size allocated most often", g->rising,
                g->transitions, og_hb((double)g->per_step).s, og_hb((double)g->first_low).s,
                og_hb((double)g->last_low).s);
    /* the rise is LoRA adapters kept (roles.lora_piled): say so, it is what to delete */
    const og_role_facts_t *k = &d->roles;
    bool adapters = k->known && k->lora_piled && (double)k->lora_params >= 0.5 * (double)g->rise;
    if (adapters)
        summary_more(c, 100, ". The models hold %s of LoRA adapters (%.1fx their other weights), kept after use.",
                     og_hb((double)k->lora_params).s, og_lora_ratio(k));
    ev_bytes(c, "first_trough_bytes", g->first_low);
    ev_bytes(c, "last_trough_bytes", g->last_low);
    ev_bytes(c, "rise_bytes", g->rise);
    ev_bytes(c, "rise_per_step_bytes", g->per_step);
    ev_text(c, "rising_steps", "%d of %d", g->rising, g->transitions);
    ev_num(c, "steps", g->steps);
    if (fw->has && fw->freed_known)
        ev_bytes(c, "framework_freed_bytes", fw->freed_bytes_total);
    /* which allocations mark the steps: the failing call's size says the failure is one more step */
    ev_text(c, "step_marker", "%s",
            g->marker == OG_MARK_EVERY_ALLOCATION ? "every_allocation"
            : g->marker == OG_MARK_FAILING_SIZE   ? "failing_size"
            : g->marker == OG_MARK_OPTIMIZER_STEP ? "optimizer_step"
            : g->marker == OG_MARK_KEPT_GRAPHS    ? "kept_graphs"
            : g->marker == OG_MARK_KEPT_RECORDS   ? "kept_records"
            : g->marker == OG_MARK_KEPT_COPIES    ? "kept_copies"
                                                  : "modal_size");
    if (g->marker == OG_MARK_OPTIMIZER_STEP)
        ev_num(c, "optimizer_steps", (double)g->seen);
    if (adapters)
        ev_bytes(c, "lora_parameters_bytes", k->lora_params);
    if (g->over_run) /* read from the run's series, one point every this many optimizer steps */
        ev_num(c, "run_series_every", (double)g->every);
    if (g->bounded) { /* a cache that reached the bound the program set: name it and its bound */
        const og_role_holder_t *h = &r->memory.fw.roles.holders[k->bounded];
        char label[sizeof h->label];
        og_cpy(label, sizeof label, h->label, sizeof label);
        summary_more(c, 160,
                     ". %s is at the bound the program set for it (%s): it stops there, a cache full, not a leak.",
                     label, og_known(h->bound_bytes) ? og_hb((double)h->bound_bytes.v).s : "its capacity in entries");
        ev_text(c, "bounded_holder", "%s", label);
        if (og_known(h->bound_bytes))
            ev_bytes(c, "bound_bytes", h->bound_bytes.v);
        if (og_known(h->bound_records))
            ev_num(c, "bound_records", (double)h->bound_records.v);
    }
    /* the rise (all of it, or its steady part, step by step) is one collective-communication library's
     * own memory: say whose it is */
    if (d->comm_holds_growth) {
        char lib[sizeof r->memory.by_library[0].library];
        og_cpy(lib, sizeof lib, r->memory.by_library[d->comm_lib].library, sizeof lib);
        size_t l = strnlen(c->summary, sizeof c->summary);
        og_fmt(c->summary + l, sizeof c->summary - l,
               d->comm_bytes >= g->rise ? " All of it fits in what %s holds (%s): communication buffers, not tensors."
                                        : " Each step is %s's own allocations, and it holds their sum (%s): "
                                          "communication buffers, not tensors.",
               og_base_name(lib), og_hb((double)d->comm_bytes).s);
        ev_text(c, "library", "%s", og_base_name(lib));
        ev_bytes(c, "library_bytes", d->comm_bytes);
    }
    return true;
}

static bool c_does_not_fit(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    if (!d->free_known || !d->req_known || d->req == 0) /* a request of unknown size: nothing said not to fit */
        return false;
    if (d->recovered && !d->larger_than_device)
        return false; /* the retry succeeded: it did fit */
    uint64_t avail = add_sat(add_sat(add_sat(d->free_eff, d->reclaim), d->app_slack), d->pool_idle);
    bool outgrows = d->pass_outgrows_cache || d->copy_outgrows_cache || d->kept_outgrows_cache;
    if (d->req <= avail && !d->larger_than_device && !(outgrows && d->shortfall > 0))
        return false;
    c->id = og_cause_ids[OG_CAUSE_DNF];
    uint64_t job = add_sat(sub0(d->footprint, d->reclaim), d->req);
    uint64_t missing = sub0(d->req, avail);
    if (d->req <= avail)
        missing = d->shortfall; /* the pass (or copy) outgrows the cache: what is missing now, the cache aside */
    if (d->larger_than_device) {
        c->confidence = 1.0;
        summary(c,
                "The request alone, %s, is larger than the whole %s (%s): no rearranging of this process can fit "
                "it.",
                req_hb(d->req_known, d->req).s, d->limited && d->capacity == d->limit ? "limit" : "device",
                og_hb((double)d->capacity).s);
        ev_req(c, d->req_known, d->req);
        ev_bytes(c, d->limited && d->capacity == d->limit ? "limit_bytes" : "capacity_bytes", d->capacity);
        ev_num(c, "larger_than_device", 1);
        ev_bytes(c, "missing_bytes", missing);
        return true;
    }
    double conf = 0.95;
    const char *basis = "measured";
    uint64_t fw_held = d->fw_resv_all;
    if (r->memory.framework_bytes > fw_held)
        fw_held = r->memory.framework_bytes;
    if (!d->cached_known && fw_held > 0) {
        conf = 0.45; /* part of the reservation may be cache: not certain */
        basis = "cache_not_measured";
    } else if (d->retried && !r->memory.fw.has) {
        conf = 0.65; /* what stayed split in its segments was not measured */
        basis = "retry_released";
    }
    if (d->free_estimated)
        conf -= 0.15;
    if (d->req <= avail) {
        conf = PASS_DNF_CONF; /* the cache would serve this request, not the rest of the pass */
        basis = d->load_fills_card       ? "load_fills_card"
                : d->pass_outgrows_cache ? "pass_outgrows_cache"
                : d->copy_outgrows_cache ? "copy_outgrows_cache"
                                         : "kept_outgrows_cache";
    }
    /* a leak that grew by more than what is missing explains the shortfall better; so does an
     * imbalance whose evening-out would free it */
    if (d->growth.holds && d->growth.rise >= missing && conf > 0.6) {
        conf = 0.6;
        basis = "growth_explains";
    }
    if (d->imbalance.holds && sub0(d->imbalance.mine, d->imbalance.avg) >= missing && conf > 0.6) {
        conf = 0.6;
        basis = "imbalance_explains";
    }
    if (d->nonfw_holds && d->nonfw >= missing && conf > 0.6) {
        conf = 0.6;
        basis = "non_framework_explains";
    }
    /* "alone the job would fit" reads the job as what it holds plus this request; in a pass still building (a load,
     * a forward, a backward, an evaluation, a generation, an optimizer step) more requests follow, so the claim is
     * not known when the others are a sliver of the device (a desktop session, a monitoring agent): their bytes
     * cover this one request, not the rest of the pass */
    bool alone_fits = d->capacity && job <= d->capacity && d->other_all >= missing && !d->others_sliver && !d->scores;
    if (alone_fits && conf > 0.45)
        conf = 0.45;
    c->confidence = clamp01(conf);
    char note[120] = "";
    if (!d->cached_known && fw_held > 0)
        og_fmt(note, sizeof note, " (%s's cache was not measured: part of its %s may be reclaimable)", d->fwname,
               og_hb((double)fw_held).s);
    else if (d->cached_known && d->cached_src == OG_CACHE_RETRY_RELEASE)
        og_fmt(note, sizeof note, " (%s already released %s and retried)", d->fwname, og_hb((double)d->cached).s);
    else if (d->free_estimated)
        og_fmt(note, sizeof note, " (free memory estimated)");
    summary(c, "%s more is needed than is free%s%s; the request is %s and this process holds %s%s.",
            og_hb((double)missing).s, d->reclaim && d->req > avail ? " even after releasing the cache" : "", note,
            req_hb(d->req_known, d->req).s, og_hb((double)d->footprint).s,
            alone_fits ? "; alone on the device the job would fit" : "");
    ev_req(c, d->req_known, d->req);
    ev_bytes(c, d->limited ? "free_under_limit_bytes" : "free_bytes", d->free_eff);
    if (d->cached_known)
        ev_bytes(c, "reclaimable_bytes", d->reclaim);
    else
        ev_text(c, "reclaimable_bytes", "not measured");
    ev_bytes(c, "missing_bytes", missing);
    ev_bytes(c, "footprint_bytes", d->footprint);
    ev_bytes(c, "job_need_bytes", job);
    ev_bytes(c, d->limited ? "limit_bytes" : "capacity_bytes", d->capacity);
    ev_text(c, "basis", "%s", basis);
    if (d->load_fills_card) {
        ev_bytes(c, "parameters_bytes", d->roles.params);
        summary_more(c, 160,
                     "; the load in progress has put %s of weights on the %s %s (%.0f%%): whatever is left to load, "
                     "the job has no room on them.",
                     og_hb((double)d->roles.params).s, og_hb((double)d->capacity).s,
                     d->limited && d->capacity == d->limit ? "limit" : "device",
                     100.0 * (double)d->roles.params / (double)d->capacity);
    } else if (d->pass_outgrows_cache && d->phase == OG_JP_loading) {
        uint64_t set = d->roles.working + d->roles.arriving;
        ev_bytes(c, "pass_working_set_bytes", set);
        summary_more(c, 160,
                     "; the load in progress holds %s so far, and the %s cached would carry it only a few tensors "
                     "further.",
                     og_hb((double)set).s, og_hb((double)d->cached).s);
    } else if (d->pass_outgrows_cache && d->state_to_come && d->phase != OG_JP_optimizer_step) {
        ev_bytes(c, "state_to_come_bytes", d->state_to_come);
        summary_more(c, 200,
                     "; the optimizer has yet to make %s of its state, more than the free memory, the %s cached and "
                     "the running code's tensors together: the training state does not fit.",
                     og_hb((double)d->state_to_come).s, og_hb((double)d->cached).s);
    } else if (d->pass_outgrows_cache && d->state_to_come) {
        ev_bytes(c, "state_to_come_bytes", d->state_to_come);
        summary_more(c, 160,
                     "; the optimizer step still has %s of its state to make, and the %s cached would carry it only a "
                     "few allocations further.",
                     og_hb((double)d->state_to_come).s, og_hb((double)d->cached).s);
    } else if (d->pass_outgrows_cache && d->first_step_state) {
        ev_bytes(c, "state_made_bytes", d->first_step_state);
        summary_more(c, 200,
                     "; the optimizer's first step (no step had ended) made %s of its state so far and is still making "
                     "it, and the %s cached would carry it only a few allocations further.",
                     og_hb((double)d->first_step_state).s, og_hb((double)d->cached).s);
    } else if (d->roles.layers_to_come) {
        /* a first forward pass that failed part way through a run of like layers: the layers it has still to run
         * make their activations too (facts.h: layers_to_come), so the pass needs more than this allocation's
         * shortfall */
        const og_roles_t *ro = &r->memory.fw.roles;
        char run[sizeof ro->layer_run];
        og_cpy(run, sizeof run, ro->layer_run, sizeof run);
        uint64_t pass = add_sat(missing, d->roles.layers_to_come);
        ev_bytes(c, "layers_to_come_bytes", d->roles.layers_to_come);
        ev_bytes(c, "pass_missing_bytes", pass);
        summary_more(c, 190,
                     "; it failed in layer %d of %d in %s, and the %d still to come would add about %s of activations: "
                     "about %s is missing for this pass to end.",
                     ro->layer_index + 1, ro->layer_count, run, d->roles.layers_left,
                     og_hb((double)d->roles.layers_to_come).s, og_hb((double)pass).s);
    } else if (d->roles.layer_holder >= 0 && d->roles.layer_holder_to_come) {
        /* a holder keeping one record per layer of the running pass (facts.h: layer_holder): the layers still to come
         * add theirs */
        const og_roles_t *ro = &r->memory.fw.roles;
        const og_role_holder_t *h = &ro->holders[d->roles.layer_holder];
        char name[sizeof h->name], run[sizeof ro->layer_run];
        og_cpy(name, sizeof name, h->name, sizeof name);
        og_cpy(run, sizeof run, ro->layer_run, sizeof run);
        uint64_t pass = add_sat(missing, d->roles.layer_holder_to_come);
        ev_bytes(c, "layer_holder_to_come_bytes", d->roles.layer_holder_to_come);
        ev_bytes(c, "pass_missing_bytes", pass);
        summary_more(c, 230,
                     "; it failed in layer %d of %d in %s, and %s keeps one record per layer run (%lld, %s): the %lld "
                     "layers still to come would add about %s to it, about %s missing for this pass to end.",
                     ro->layer_index + 1, ro->layer_count, run, name[0] ? name : "a holder", (long long)h->records,
                     og_hb((double)h->bytes).s, (long long)(ro->layer_count - h->records),
                     og_hb((double)d->roles.layer_holder_to_come).s, og_hb((double)pass).s);
    } else if (d->pass_outgrows_cache && d->roles.dominant >= 0) {
        /* the running code's working set is mostly one holder of a caller (a loop's list in main), not the pass's own
         * tensors: say whose it is */
        const og_role_holder_t *h = &r->memory.fw.roles.holders[d->roles.dominant];
        char name[sizeof h->name], kind[sizeof h->kind], where[sizeof h->where];
        og_cpy(name, sizeof name, h->name, sizeof name);
        og_cpy(kind, sizeof kind, h->kind, sizeof kind);
        og_cpy(where, sizeof where, h->where, sizeof where);
        char *paren = strstr(where, " (");
        if (paren)
            *paren = '\0'; /* "local in main", its file and line aside */
        ev_bytes(c, "pass_working_set_bytes", d->roles.working);
        ev_text(c, "working_set_holder", "%s", name);
        summary_more(c, 200,
                     "; the %s pass and the code running it hold %s (%s of it in %s, a %s %s), and the %s cached "
                     "would carry them only a few allocations further.",
                     og_job_phase_name(d->phase), og_hb((double)d->roles.working).s, og_hb((double)h->bytes).s, name,
                     kind, where, og_hb((double)d->cached).s);
    } else if (d->pass_outgrows_cache && d->pass_rest) {
        ev_bytes(c, "pass_working_set_bytes", d->roles.working);
        ev_bytes(c, "pass_rest_bytes", d->pass_rest);
        ev_num(c, "pass_rest_layers", d->pass_rest_layers);
        summary_more(c, 200,
                     "; the %s pass failed in layer %d of %d and has about %s left to make, more than the %s cached "
                     "and the %s free together, even defragmented.",
                     og_job_phase_name(d->phase), r->memory.fw.roles.layer_index + 1, r->memory.fw.roles.layer_count,
                     og_hb((double)d->pass_rest).s, og_hb((double)d->cached).s, og_hb((double)d->free_eff).s);
    } else if (d->pass_outgrows_cache) {
        ev_bytes(c, "pass_working_set_bytes", d->roles.working);
        summary_more(c, 160,
                     "; the %s pass still building holds %s, and the %s cached would carry it only a few allocations "
                     "further.",
                     og_job_phase_name(d->phase), og_hb((double)d->roles.working).s, og_hb((double)d->cached).s);
    } else if (d->copy_outgrows_cache && d->phase == OG_JP_ema_update) {
        /* an out-of-place EMA update: a new copy of the weights, what this phase holds so far (facts.c) */
        ev_bytes(c, "copy_made_bytes", d->roles.act);
        ev_bytes(c, "copy_source_bytes", d->update_copy);
        summary_more(c, 160,
                     "; the EMA update is making a new copy of the %s of weights (%s so far), and the %s cached would "
                     "carry it only a few tensors further.",
                     og_hb((double)d->update_copy).s, og_hb((double)d->roles.act).s, og_hb((double)d->cached).s);
    } else if (d->role_copy_outgrows) {
        /* a copy of a role being made outside a deep copy: what it made, of what (facts.c) */
        ev_bytes(c, "copy_made_bytes", d->roles.act_copy);
        ev_bytes(c, "copy_source_bytes", d->roles.act_copy_source);
        summary_more(c, 200,
                     "; a copy of the %s %s is being made (%s so far, no named object holds it yet), and its rest is "
                     "more than the %s cached and the %s free together.",
                     og_hb((double)d->roles.act_copy_source).s,
                     strncmp(r->memory.fw.roles.act_copy_of, "optimizer_state", sizeof r->memory.fw.roles.act_copy_of)
                         ? "of parameters"
                         : "of optimizer state",
                     og_hb((double)d->roles.act_copy).s, og_hb((double)d->cached).s, og_hb((double)d->free_eff).s);
    } else if (d->copy_outgrows_cache) {
        ev_bytes(c, "copy_made_bytes", d->roles.copy_made);
        summary_more(c, 160,
                     "; the deep copy under way made %s so far, and the %s cached would carry it only a few tensors "
                     "further.",
                     og_hb((double)d->roles.copy_made).s, og_hb((double)d->cached).s);
    } else if (d->kept_outgrows_cache) {
        uint64_t kept = d->roles.kept_across;
        ev_bytes(c, "kept_by_python_bytes", kept);
        summary_more(c, 160,
                     "; Python objects keep %s on the device across calls, and the %s cached would give the job only "
                     "a few allocations more beside them.",
                     og_hb((double)kept).s, og_hb((double)d->cached).s);
    }
    /* failing inside a burst of equal allocations that are all kept: a load (weights), not a step */
    const og_load_facts_t *ld = &d->load;
    if (ld->phase != OG_PHASE_NONE) {
        bool second = ld->phase == OG_PHASE_SECOND_LOAD;
        ev_text(c, "phase", "%s", second ? "second_load" : "loading");
        ev_num(c, "load_allocations", ld->run);
        if (second)
            ev_num(c, "earlier_load_allocations", ld->earlier);
        if (second)
            summary_more(
                c, 120,
                ": it failed loading %d more blocks of %s while %d of the same size, loaded earlier, are still held.",
                ld->run, req_hb(d->req_known, d->req).s, ld->earlier);
    }
    return true;
}

static void c_unknown(const og_facts_t *d, const og_record_t *r, og_cause_t *c)
{
    c->id = og_cause_ids[OG_CAUSE_UNKNOWN];
    c->confidence = 0;
    /* what was measured is said with its figure; what was not is named, never said as 0 B */
    const char *m[6];
    int nm = 0;
    if (!d->cached_known)
        m[nm++] = "framework cache";
    if (!d->used_known)
        m[nm++] = "NVML usage";
    if (!d->free_known)
        m[nm++] = "free memory";
    if (!d->total)
        m[nm++] = "total memory";
    if (!og_known(r->memory.process_tracked_bytes))
        m[nm++] = "tracked memory";
    if (!og_known(r->memory.other_processes_bytes))
        m[nm++] = "other processes";
    char miss[128] = "", dev[64] = "", mine[48] = "", others[40] = "";
    for (int i = 0; i < nm; i++) {
        size_t l = strlen(miss);
        og_fmt(miss + l, sizeof miss - l, "%s%s", i ? ", " : "; not measured: ", m[i]);
    }
    if (d->free_known && d->total)
        og_fmt(dev, sizeof dev, ", %s free of %s", og_hb((double)d->free_eff).s, og_hb((double)d->total).s);
    else if (d->free_known)
        og_fmt(dev, sizeof dev, ", %s free", og_hb((double)d->free_eff).s);
    else if (d->total)
        og_fmt(dev, sizeof dev, " on a device of %s", og_hb((double)d->total).s);
    if (og_known(r->memory.process_tracked_bytes))
        og_fmt(mine, sizeof mine, ", this process tracks %s", og_hb((double)d->tracked).s);
    if (og_known(r->memory.other_processes_bytes))
        og_fmt(others, sizeof others, ", others hold %s", og_hb((double)d->other_all).s);
    if (d->req_known)
        summary(c, "No rule matched: %s requested%s%s%s%s.", og_hb((double)d->req).s, dev, mine, others, miss);
    else
        summary(c, "No rule matched: a request of a size not given%s%s%s%s.", dev, mine, others, miss);
    ev_req(c, d->req_known, d->req);
    if (d->free_known)
        ev_bytes(c, "free_bytes", d->free_eff);
    else
        ev_text(c, "free_bytes", "not measured");
    ev_bytes(c, "total_bytes", d->total);
    ev_bytes(c, "tracked_bytes", d->tracked);
    ev_bytes(c, "other_processes_bytes", d->other_all);
    if (d->cached_known)
        ev_bytes(c, "cached_bytes", d->cached);
}

/* A snapshot on request (`oomguard snapshot`): no failure to explain; what holds memory now leads,
 * and the rules that still hold without a request (growth, the cache, others) follow it. */
static void c_snapshot(const og_facts_t *d, const og_record_t *rec, og_cause_t *c)
{
    c->id = og_cause_ids[OG_CAUSE_SNAPSHOT];
    c->confidence = 1.0;
    const og_lib_usage_t *top = rec->memory.nlibs ? &rec->memory.by_library[0] : NULL;
    summary(c,
            "What holds memory now (a snapshot, no failure): this process tracks %s on device %d%s%s%s%s; "
            "others hold %s.",
            og_hb((double)d->tracked).s, rec->device.index, top ? ", most from " : "", top ? top->library : "",
            top ? " " : "", top ? og_hb((double)top->bytes).s : "", og_hb((double)d->other_all).s);
    ev_bytes(c, "tracked_bytes", d->tracked);
    ev_bytes(c, "total_bytes", d->total);
    ev_bytes(c, "other_processes_bytes", d->other_all);
    if (top) {
        ev_text(c, "top_library", "%s", top->library);
        ev_bytes(c, "top_library_bytes", top->bytes);
    }
}

/* ------------------------------------------------------------------ entry */

typedef bool (*cause_fn)(const og_facts_t *, const og_record_t *, og_cause_t *);

/* the rules and their tie-break bonuses, from the list of causes (causes.def); its order breaks
 * equal scores (first wins) */
static const struct {
    cause_fn fn;
    double bonus;
} cause_table[] = {
#define X(name, id, rule, bonus, own1, own2, title) [OG_CAUSE_##name] = { rule, bonus },
#include "causes.def"
#undef X
};
#define NRULES (sizeof cause_table / sizeof *cause_table)

/* A cause's score: its confidence plus its bonus, in thousandths, the precision the bonuses are written
 * in, so that two readings the formulas put a rounding apart tie, and a tie is the list's to break. */
static int score_of(const og_cause_t *c, double bonus) { return (int)((c->confidence + bonus) * 1000 + 0.5); }

/* Runs the rules in ORDER (indexes of cause_table) and ranks what holds into rec->diagnosis: by score,
 * highest first; equal scores in the list's order (causes.def).  The ranking depends on the table, not
 * on ORDER: the rules only read the facts. */
static void diagnose_in(og_record_t *rec, const og_facts_t *d, const int *order)
{
    og_cause_t *found = rec->analysis.found;
    int score[NRULES];
    int idx[NRULES], n = 0;
    for (size_t k = 0; k < NRULES; k++) {
        size_t i = (size_t)order[k];
        og_cause_t *c = &found[i];
        memset(c, 0, sizeof *c);
        if (cause_table[i].fn && cause_table[i].fn(d, rec, c))
            score[i] = score_of(c, cause_table[i].bonus);
    }
    for (size_t i = 0; i < NRULES; i++) /* in the list's order: the tie-break */
        if (found[i].id)
            idx[n++] = (int)i;
    /* insertion sort by score, highest first, stable: a tie keeps the list's order */
    for (int i = 1; i < n; i++) {
        int v = idx[i], j = i - 1;
        while (j >= 0 && score[idx[j]] < score[v]) {
            idx[j + 1] = idx[j];
            j--;
        }
        idx[j + 1] = v;
    }
    /* a confident leak that, beyond what the cache holds, grew by more than is missing is the root
     * cause even when the cache or its splinters decide which request fails first: releasing them
     * buys a few steps, fixing the leak ends the failures */
    for (int g = 1; g < n; g++) {
        if (found[idx[g]].id != og_cause_ids[OG_CAUSE_GROWTH])
            continue;
        const char *first = found[idx[0]].id;
        bool cache_first = first == og_cause_ids[OG_CAUSE_FRAG] || first == og_cause_ids[OG_CAUSE_CACHE];
        uint64_t kept = d->cached_known ? sub0(d->growth.rise, d->cached) : 0;
        if (cache_first && found[idx[g]].confidence >= 0.8 && d->shortfall > 0 && kept >= d->shortfall) {
            int leak = idx[g];
            memmove(&idx[1], &idx[0], (size_t)g * sizeof *idx);
            idx[0] = leak;
        }
        break;
    }
    bool snap = rec->status && strcmp(rec->status, "snapshot") == 0;
    if (n > 8 - snap)
        n = 8 - snap;
    for (int i = 0; i < n; i++)
        rec->diagnosis.causes[i + snap] = found[idx[i]];
    if (snap) {
        c_snapshot(d, rec, &rec->diagnosis.causes[0]);
        n++;
    } else if (n == 0) {
        c_unknown(d, rec, &rec->diagnosis.causes[0]);
        n = 1;
    }
    rec->diagnosis.ncauses = n;
    rec->diagnosis.primary = rec->diagnosis.causes[0].id;
}

static void diagnose_order(og_record_t *rec, const og_thresholds_t *th, bool reverse)
{
    if (!rec)
        return;
    memset(&rec->diagnosis, 0, sizeof rec->diagnosis);
    og_facts_t *d = &rec->analysis.facts;
    og_facts_compute(d, rec, th, &rec->analysis.growth);
    rec->analysis.facts_valid = true;
    /* unknown is not zero: without the device's free memory (measured or estimated) nothing says what is short */
    if (d->shortfall_known)
        og_set(&rec->diagnosis.shortfall_bytes, d->shortfall);
    else
        og_unset(&rec->diagnosis.shortfall_bytes);
    int order[NRULES];
    for (size_t i = 0; i < NRULES; i++)
        order[i] = reverse ? (int)(NRULES - 1 - i) : (int)i;
    diagnose_in(rec, d, order);
}

void og_diagnose(og_record_t *rec, const og_thresholds_t *th) { diagnose_order(rec, th, false); }

/* The same diagnosis with the rules run last to first: a test that no rule depends on another's run. */
void og_diagnose_reversed(og_record_t *rec, const og_thresholds_t *th) { diagnose_order(rec, th, true); }
