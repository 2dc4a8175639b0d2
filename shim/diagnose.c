/* Diagnosis: why did the allocation fail?  Fills rec->diagnosis from the measured fields of
 * the record.  Pure: no I/O, no globals, no allocation; the same record always gives the same
 * diagnosis.  (<stdio.h> is included for vsnprintf only, to format the summaries.)
 *
 * Quantities (all bytes; "known" = not OG_UNKNOWN):
 *   req        event.requested_bytes
 *   free       device.free_bytes; with a limit: min(limit - process_tracked, free); when the
 *              physical free is not known and there is no limit it is estimated as
 *              total - footprint - other_processes
 *   shortfall  max(0, req - free)                        -> diagnosis.shortfall_bytes
 *   footprint  process_used_bytes (NVML) when known, else process_tracked_bytes
 *   cached     the framework's held-but-unused memory: adapter reserved - allocated when the
 *              adapter is present, else framework_cached_bytes; unknown otherwise
 *   reclaim    what could still be handed back now: cached, but 0 when the cache was measured
 *              as "retry_release" (the framework already released it and the retry failed),
 *              and 0 when cached is unknown
 *   reservation  adapter reserved_bytes, else framework_bytes
 *   pool_slack pool_reserved - pool_used (stream-ordered pools keep freed memory until trimmed)
 *
 * Causes (every one is evaluated; those that hold are kept).  Confidences are built from
 * margins, clamp(x) = min(1, max(0, x)):
 *
 * limit          event.caused_by_limit.  Confidence 1 (oomguard itself refused the request).
 * cache_held     the failing library is known and is not the framework, shortfall > 0 and
 *                avail = max(reclaim, pool_slack) >= shortfall.
 *                conf = 0.6 + 0.3 * clamp((avail / shortfall - 1) / 3).
 * fragmentation  cached known and > 0, the failing library is the framework or unknown, and one of
 *                (a) cached >= req (the cache alone could hold the request)
 *                    with the adapter's largest free block L known:
 *                      L < req : conf = 0.85 + 0.15 * (1 - L / cached)   (textbook case)
 *                      L >= req: conf = 0.30 (a block was there: fragmentation is unlikely)
 *                    without L: conf = 0.6 + 0.25 * clamp((cached / req - 1) / 3)
 *                (b) 0 < shortfall <= cached (free + cache cover the request, not in one piece)
 *                    conf = 0.45 + 0.2 * (cached / req) + 0.1 if cached >= frag_share * reservation
 *                           + 0.1 if the adapter's largest free block < req
 *                (c) cached >= frag_share * reservation and cached >= 256 MiB (a large share of
 *                    the reservation is idle; 256 MiB keeps tiny reservations out)
 *                    conf = 0.3 + 0.2 * clamp((share - frag_share) / (1 - frag_share))
 *                the highest confidence of the branches that hold is used.
 * foreign_memory shortfall > 0 and other_processes_bytes >= shortfall.
 *                conf = 0.45 + 0.25 * clamp((other / shortfall - 1) / 3)
 *                            + 0.3 * clamp((other / total) / 0.25).
 * non_framework  process_used known, a framework detected (framework != unknown or
 *                framework_bytes > 0), shortfall > 0, non_framework_bytes known and
 *                nonfw >= nonfw_share * process_used, nonfw >= shortfall and nonfw >= 1 GiB
 *                (a bare CUDA context, 0.3-0.6 GiB, never triggers it on its own).
 *                conf = 0.35 + 0.3 * clamp((share - nonfw_share) / (1 - nonfw_share))
 *                            + 0.2 * clamp((nonfw / shortfall - 1) / 3).
 * growth         >= 16 samples.  The samples are split into 8 windows of equal time (by index
 *                when fewer than 5 windows have samples); each window's trough is its minimum.
 *                A step between consecutive windows rises when the trough grows by more than
 *                max(1 MiB, total / 1000).  growth when rising / steps >= growth_rising_steps and
 *                last trough - first trough >= growth_min_share * total.
 *                conf = 0.4 + 0.3 * clamp((rising/steps - rs) / (1 - rs))
 *                           + 0.3 * clamp((rise/total - gm) / (3 * gm)).
 * does_not_fit   req > free + reclaim.  conf = 1 - 0.5 * (free + reclaim) / req, in (0.5, 1];
 *                capped at 0.45 when other processes hold at least the missing bytes and the job
 *                alone would fit in the device's capacity (limit, or total):
 *                footprint - reclaim + req <= capacity, i.e. the others take the room.
 *
 * Order: by confidence plus a tie-break bonus (limit 0.06, cache_held 0.05, fragmentation 0.04,
 * foreign_memory 0.03, non_framework 0.02, growth 0.01, does_not_fit 0), stable; confidences
 * closer than the bonus gap are ordered by that priority.  The bonus never changes the reported
 * confidence.  primary = first id; when nothing holds, one cause "unknown" (confidence 0) says
 * what was measured.  A cause whose inputs were not measured is skipped, never guessed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "og.h"
#include "record.h"
#include "advice_text.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

#define NONFW_FLOOR   (1ULL << 30)     /* non_framework: at least 1 GiB */
#define FRAG_C_FLOOR  (256ULL << 20)   /* fragmentation (c): at least 256 MiB idle */
#define GROWTH_MIN_SAMPLES 16
#define GROWTH_WINDOWS 8

/* Defaults (the same as OOMGUARD_FRAG_SHARE etc. in og.h), used for a missing or invalid value. */
static const og_thresholds_t th_default = {
    .frag_share = 0.25, .nonfw_share = 0.20, .growth_min_share = 0.05, .growth_rising_steps = 0.70,
};

/* ------------------------------------------------------------------ small helpers */

static uint64_t min64(uint64_t a, uint64_t b) { return a < b ? a : b; }
/* saturating add that never produces OG_UNKNOWN */
static double clamp01(double x) { return x != x ? 0 : x < 0 ? 0 : x > 1 ? 1 : x; }




static void ev_num(og_cause_t *c, const char *name, double v)
{
    if (c->nevidence >= 8)
        return;
    c->evidence[c->nevidence].name = name;
    c->evidence[c->nevidence].is_text = false;
    c->evidence[c->nevidence].num = v;
    c->evidence[c->nevidence].text[0] = 0;
    c->nevidence++;
}

static void ev_bytes(og_cause_t *c, const char *name, uint64_t v)
{
    ev_num(c, name, (double)v);
}

static void ev_text(og_cause_t *c, const char *name, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void ev_text(og_cause_t *c, const char *name, const char *f, ...)
{
    if (c->nevidence >= 8)
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

static void summary(og_cause_t *c, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void summary(og_cause_t *c, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    og_vfmt(c->summary, sizeof c->summary, f, ap);
    va_end(ap);
}

/* bounded copy of a fixed-size field (the field may lack its terminator) */
static void cpy(char *dst, size_t n, const char *src, size_t srcn)
{
    size_t l = strnlen(src, srcn);
    if (l >= n)
        l = n - 1;
    memcpy(dst, src, l);
    dst[l] = 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static bool same_lib(const char *a, const char *b)
{
    return a[0] && b[0] && (strcmp(a, b) == 0 || strcmp(base_name(a), base_name(b)) == 0);
}

static const char *fw_display(enum og_framework fw)
{
    switch (fw) {
    case OG_FW_PYTORCH: return "PyTorch";
    case OG_FW_JAX: return "JAX";
    case OG_FW_TENSORFLOW: return "TensorFlow";
    case OG_FW_CUPY: return "CuPy";
    default: return "the framework";
    }
}

/* 1: the failing call's library is the framework's, 0: it is not, -1: cannot tell. */
static int failing_is_framework(const og_record_t *rec)
{
    char lib[sizeof rec->event.library];
    cpy(lib, sizeof lib, rec->event.library, sizeof rec->event.library);
    if (!lib[0])
        return -1;
    int nlibs = rec->memory.nlibs < 0 ? 0 : rec->memory.nlibs > 32 ? 32 : rec->memory.nlibs;
    for (int i = 0; i < nlibs; i++) {
        char l[sizeof rec->memory.by_library[0].library];
        cpy(l, sizeof l, rec->memory.by_library[i].library, sizeof l);
        if (same_lib(lib, l))
            return rec->memory.by_library[i].framework ? 1 : 0;
    }
    char list[sizeof rec->framework_libs];
    cpy(list, sizeof list, rec->framework_libs, sizeof list);
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

/* ------------------------------------------------------------------ measured context */

typedef struct dctx {
    og_record_t *rec;
    og_thresholds_t th;
    const char *fwname;
    uint64_t req, total, tracked, other;
    bool limited;
    uint64_t limit;
    bool free_known, free_estimated;
    uint64_t free_eff, shortfall;
    bool used_known;
    uint64_t used, footprint;
    bool cached_known;
    uint64_t cached, reclaim, reservation;
    const char *cached_src;
    bool largest_known;
    uint64_t largest, pool_slack;
    int failing_fw;
} dctx_t;

static double th_or(double v, double def, bool allow_one)
{
    if (v != v || v <= 0 || v > 1 || (!allow_one && v >= 1))
        return def;
    return v;
}

static void measure(dctx_t *d, og_record_t *rec, const og_thresholds_t *th)
{
    memset(d, 0, sizeof *d);
    d->rec = rec;
    d->th = th ? *th : th_default;
    d->th.frag_share = th_or(d->th.frag_share, th_default.frag_share, true);
    d->th.nonfw_share = th_or(d->th.nonfw_share, th_default.nonfw_share, true);
    d->th.growth_min_share = th_or(d->th.growth_min_share, th_default.growth_min_share, true);
    d->th.growth_rising_steps = th_or(d->th.growth_rising_steps, th_default.growth_rising_steps, true);
    d->fwname = fw_display(rec->framework);

    d->req = known(rec->event.requested_bytes) ? rec->event.requested_bytes : 0;
    d->total = known(rec->device.total_bytes) ? rec->device.total_bytes : 0;
    d->tracked = known(rec->memory.process_tracked_bytes) ? rec->memory.process_tracked_bytes : 0;
    d->other = known(rec->memory.other_processes_bytes) ? rec->memory.other_processes_bytes : 0;
    d->used_known = known(rec->memory.process_used_bytes);
    d->used = d->used_known ? rec->memory.process_used_bytes : 0;
    d->footprint = d->used_known ? d->used : d->tracked;

    const og_framework_view_t *fw = &rec->memory.fw;
    if (fw->has && known(fw->reserved_bytes) && known(fw->allocated_bytes)) {
        d->cached_known = true;
        d->cached = sub0(fw->reserved_bytes, fw->allocated_bytes);
        d->cached_src = "adapter";
        d->reservation = fw->reserved_bytes;
    } else if (known(rec->memory.framework_cached_bytes)) {
        d->cached_known = true;
        d->cached = rec->memory.framework_cached_bytes;
        d->cached_src = rec->memory.framework_cached_source ? rec->memory.framework_cached_source : "measured";
    }
    if (!d->reservation)
        d->reservation = known(rec->memory.framework_bytes) ? rec->memory.framework_bytes : 0;
    /* a cache already handed back between retries is in `free` now: nothing left to reclaim */
    d->reclaim = d->cached_known && strcmp(d->cached_src, "retry_release") != 0 ? d->cached : 0;
    if (fw->has && known(fw->largest_free_block_bytes) && !(fw->largest_free_block_bytes == 0 && d->cached > 0)) {
        d->largest_known = true;
        d->largest = fw->largest_free_block_bytes;
    }
    if (known(rec->memory.pool_reserved) && known(rec->memory.pool_used))
        d->pool_slack = sub0(rec->memory.pool_reserved, rec->memory.pool_used);

    d->limited = known(rec->device.limit_bytes);
    d->limit = d->limited ? rec->device.limit_bytes : 0;
    if (d->limited) {
        d->free_known = true;
        d->free_eff = sub0(d->limit, d->tracked);
        if (known(rec->device.free_bytes))
            d->free_eff = min64(d->free_eff, rec->device.free_bytes);
    } else if (known(rec->device.free_bytes)) {
        d->free_known = true;
        d->free_eff = rec->device.free_bytes;
    } else if (d->total) {
        d->free_known = d->free_estimated = true;
        d->free_eff = sub0(d->total, add_sat(d->footprint, d->other));
    }
    d->shortfall = d->free_known ? sub0(d->req, d->free_eff) : 0;
    d->failing_fw = failing_is_framework(rec);
}

/* ------------------------------------------------------------------ causes */

static bool c_limit(dctx_t *d, og_cause_t *c)
{
    og_record_t *r = d->rec;
    if (!r->event.caused_by_limit)
        return false;
    c->id = "limit";
    c->confidence = 1.0;
    uint64_t need = add_sat(d->tracked, d->req);
    if (d->limited) {
        bool phys = known(r->device.free_bytes) && r->device.free_bytes >= d->req;
        summary(c, "OOMGUARD_LIMIT (%s) refused %s: the job would hold %s (%s held + %s), %s over the limit%s.",
                og_hb((double)d->limit).s, og_hb((double)d->req).s, og_hb((double)need).s, og_hb((double)d->tracked).s,
                og_hb((double)d->req).s, og_hb((double)sub0(need, d->limit)).s,
                phys ? "; the device itself had room for it" : "");
        ev_bytes(c, "limit_bytes", d->limit);
        ev_bytes(c, "over_limit_bytes", sub0(need, d->limit));
    } else {
        summary(c, "OOMGUARD_LIMIT refused %s; the job would hold %s (%s held + %s).", og_hb((double)d->req).s,
                og_hb((double)need).s, og_hb((double)d->tracked).s, og_hb((double)d->req).s);
        ev_text(c, "limit_bytes", "unknown");
    }
    ev_bytes(c, "tracked_bytes", d->tracked);
    ev_bytes(c, "requested_bytes", d->req);
    ev_bytes(c, "job_need_bytes", need);
    if (known(r->device.free_bytes))
        ev_bytes(c, "physical_free_bytes", r->device.free_bytes);
    return true;
}

static bool c_cache_held(dctx_t *d, og_cause_t *c)
{
    og_record_t *r = d->rec;
    if (d->failing_fw != 0 || d->shortfall == 0)
        return false;
    uint64_t avail = d->reclaim > d->pool_slack ? d->reclaim : d->pool_slack;
    if (avail < d->shortfall)
        return false;
    c->id = "cache_held";
    c->confidence = 0.6 + 0.3 * clamp01(((double)avail / (double)d->shortfall - 1) / 3);
    char full[sizeof r->event.library], lib[64];
    cpy(full, sizeof full, r->event.library, sizeof r->event.library);
    cpy(lib, sizeof lib, base_name(full), sizeof full);
    bool from_cache = d->reclaim >= d->pool_slack;
    summary(c, "%s failed to get %s while %s holds %s %s, more than the %s missing.", lib, og_hb((double)d->req).s,
            from_cache ? d->fwname : "a memory pool", og_hb((double)avail).s,
            from_cache ? "cached but unused" : "reserved but unused", og_hb((double)d->shortfall).s);
    ev_text(c, "failing_library", "%s", lib);
    ev_bytes(c, "requested_bytes", d->req);
    ev_bytes(c, "shortfall_bytes", d->shortfall);
    if (d->cached_known)
        ev_bytes(c, "cached_bytes", d->cached);
    else
        ev_text(c, "cached_bytes", "not measured");
    ev_bytes(c, "pool_unused_bytes", d->pool_slack);
    if (d->cached_src)
        ev_text(c, "cached_source", "%s", d->cached_src);
    return true;
}

static bool c_fragmentation(dctx_t *d, og_cause_t *c)
{
    if (!d->cached_known || d->cached == 0 || d->failing_fw == 0)
        return false;
    /* a cache already handed back and retried is no longer held: nothing is fragmented in it */
    if (strcmp(d->cached_src, "retry_release") == 0)
        return false;
    double fs = d->th.frag_share;
    double cached = (double)d->cached, req = (double)d->req;
    double share = d->reservation ? cached / (double)d->reservation : 0;
    bool share_hit = d->reservation && share >= fs;
    double conf = -1;
    const char *why = NULL;

    if (d->req && d->cached >= d->req) {                                  /* (a) */
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
    if (d->shortfall > 0 && d->cached >= d->shortfall && d->cached < d->req) {   /* (b) */
        double b = 0.45 + 0.2 * clamp01(cached / req) + (share_hit ? 0.1 : 0) +
                   (d->largest_known && d->largest < d->req ? 0.1 : 0);
        if (b > conf) {
            conf = b;
            why = "free_plus_cache_covers";
        }
    }
    if (share_hit && d->cached >= FRAG_C_FLOOR) {                            /* (c) */
        double cc = 0.3 + 0.2 * clamp01(fs < 1 ? (share - fs) / (1 - fs) : 1);
        if (cc > conf) {
            conf = cc;
            why = "idle_share";
        }
    }
    if (conf < 0)
        return false;

    c->id = "fragmentation";
    c->confidence = clamp01(conf);
    if (d->largest_known)
        summary(c, "%s holds %s cached but unused (%s of its %s reserved), yet its largest free block is %s, "
                "smaller than the %s requested.", d->fwname, og_hb(cached).s, og_pct(cached, (double)d->reservation).s,
                og_hb((double)d->reservation).s, og_hb((double)d->largest).s, og_hb(req).s);
    else if (strcmp(why, "idle_share") == 0)
        summary(c, "%s holds %s cached but unused, %s of its %s reserved; that idle memory is not where the %s "
                "request needs it.", d->fwname, og_hb(cached).s, og_pct(cached, (double)d->reservation).s,
                og_hb((double)d->reservation).s, og_hb(req).s);
    else
        summary(c, "%s holds %s cached but unused (%s of its reservation) and %s is free, yet %s could not be "
                "found in one piece.", d->fwname, og_hb(cached).s, og_pct(cached, (double)d->reservation).s,
                og_hb((double)d->free_eff).s, og_hb(req).s);
    ev_bytes(c, "cached_bytes", d->cached);
    ev_bytes(c, "requested_bytes", d->req);
    ev_bytes(c, "reservation_bytes", d->reservation);
    if (d->reservation)
        ev_num(c, "cached_share", share);
    if (d->largest_known) {
        ev_bytes(c, "largest_free_block_bytes", d->largest);
        ev_num(c, "fragmentation", clamp01(1 - (double)d->largest / cached));
    }
    ev_bytes(c, "shortfall_bytes", d->shortfall);
    ev_text(c, "rule", "%s", why);
    return true;
}

static bool c_foreign(dctx_t *d, og_cause_t *c)
{
    og_record_t *r = d->rec;
    if (d->shortfall == 0 || d->other < d->shortfall)
        return false;
    c->id = "foreign_memory";
    double share = d->total ? (double)d->other / (double)d->total : 0;
    c->confidence = 0.45 + 0.25 * clamp01(((double)d->other / (double)d->shortfall - 1) / 3) +
                    0.3 * clamp01(share / 0.25);
    /* the largest other process, named */
    int n = r->memory.nother < 0 ? 0 : r->memory.nother > 32 ? 32 : r->memory.nother;
    int big = -1;
    for (int i = 0; i < n; i++)
        if (big < 0 || r->memory.other[i].bytes > r->memory.other[big].bytes)
            big = i;
    char who[96] = "";
    if (big >= 0) {
        char name[sizeof r->memory.other[0].name];
        cpy(name, sizeof name, r->memory.other[big].name, sizeof name);
        og_fmt(who, sizeof who, " (largest: pid %d %s, %s)", r->memory.other[big].pid, name[0] ? name : "?",
            og_hb((double)r->memory.other[big].bytes).s);
    }
    if (n)
        summary(c, "%d other process%s hold%s %s on this device%s, more than the %s missing.", n, n == 1 ? "" : "es",
                n == 1 ? "s" : "", og_hb((double)d->other).s, who, og_hb((double)d->shortfall).s);
    else
        summary(c, "Other processes hold %s on this device, more than the %s missing.", og_hb((double)d->other).s,
                og_hb((double)d->shortfall).s);
    ev_bytes(c, "other_processes_bytes", d->other);
    ev_bytes(c, "shortfall_bytes", d->shortfall);
    if (d->total)
        ev_num(c, "other_share", share);
    ev_num(c, "processes", n);
    if (big >= 0) {
        char name[sizeof r->memory.other[0].name];
        cpy(name, sizeof name, r->memory.other[big].name, sizeof name);
        ev_text(c, "largest_process", "pid %d %s", r->memory.other[big].pid, name);
        ev_bytes(c, "largest_process_bytes", r->memory.other[big].bytes);
    }
    return true;
}

static bool c_non_framework(dctx_t *d, og_cause_t *c)
{
    og_record_t *r = d->rec;
    uint64_t fwb = known(r->memory.framework_bytes) ? r->memory.framework_bytes : 0;
    if (!d->used_known || d->used == 0 || !known(r->memory.non_framework_bytes) || d->shortfall == 0)
        return false;
    if (r->framework == OG_FW_UNKNOWN && fwb == 0)
        return false;               /* no framework: "outside the framework" would be everything */
    uint64_t nf = r->memory.non_framework_bytes;
    double share = (double)nf / (double)d->used;
    double ns = d->th.nonfw_share;
    if (share < ns || nf < d->shortfall || nf < NONFW_FLOOR)
        return false;
    c->id = "non_framework";
    c->confidence = 0.35 + 0.3 * clamp01(ns < 1 ? (share - ns) / (1 - ns) : 1) +
                    0.2 * clamp01(((double)nf / (double)d->shortfall - 1) / 3);
    /* the largest holder outside the framework */
    int n = r->memory.nlibs < 0 ? 0 : r->memory.nlibs > 32 ? 32 : r->memory.nlibs;
    int big = -1;
    for (int i = 0; i < n; i++)
        if (!r->memory.by_library[i].framework &&
            (big < 0 || r->memory.by_library[i].bytes > r->memory.by_library[big].bytes))
            big = i;
    char lib[64] = "";
    if (big >= 0 && r->memory.by_library[big].bytes) {
        char full[sizeof r->memory.by_library[0].library];
        cpy(full, sizeof full, r->memory.by_library[big].library, sizeof full);
        cpy(lib, sizeof lib, base_name(full), sizeof full);
    }
    uint64_t ctx = known(r->memory.context_bytes_estimate) ? r->memory.context_bytes_estimate : 0;
    char extra[112] = "";
    if (lib[0])
        og_fmt(extra, sizeof extra, "; largest: %s %s, CUDA context ~%s", lib,
            og_hb((double)r->memory.by_library[big].bytes).s, og_hb((double)ctx).s);
    else
        og_fmt(extra, sizeof extra, "; CUDA context and untracked memory ~%s", og_hb((double)ctx).s);
    summary(c, "%s of this process's %s (%s) is outside %s%s; that is more than the %s missing.", og_hb((double)nf).s,
            og_hb((double)d->used).s, og_pct((double)nf, (double)d->used).s, d->fwname, extra, og_hb((double)d->shortfall).s);
    ev_bytes(c, "non_framework_bytes", nf);
    ev_bytes(c, "process_used_bytes", d->used);
    ev_bytes(c, "framework_bytes", fwb);
    ev_num(c, "non_framework_share", share);
    if (known(r->memory.context_bytes_estimate))
        ev_bytes(c, "context_bytes_estimate", r->memory.context_bytes_estimate);
    ev_bytes(c, "shortfall_bytes", d->shortfall);
    if (lib[0]) {
        ev_text(c, "largest_library", "%s", lib);
        ev_bytes(c, "largest_library_bytes", r->memory.by_library[big].bytes);
    }
    return true;
}

static bool c_growth(dctx_t *d, og_cause_t *c)
{
    og_record_t *r = d->rec;
    int n = r->history.nsamples < 0 ? 0 : r->history.nsamples > 512 ? 512 : r->history.nsamples;
    if (n < GROWTH_MIN_SAMPLES || d->total == 0)
        return false;
    const og_sample_t *s = r->history.samples;
    double tmin = s[0].t_rel, tmax = s[0].t_rel;
    for (int i = 1; i < n; i++) {
        if (s[i].t_rel < tmin)
            tmin = s[i].t_rel;
        if (s[i].t_rel > tmax)
            tmax = s[i].t_rel;
    }
    uint64_t trough[GROWTH_WINDOWS];
    bool has[GROWTH_WINDOWS];
    int filled = 0;
    for (int pass = 0; pass < 2 && filled < 5; pass++) {
        bool by_time = pass == 0 && tmax > tmin;
        if (pass == 0 && !by_time)
            continue;
        filled = 0;
        for (int w = 0; w < GROWTH_WINDOWS; w++)
            has[w] = false, trough[w] = 0;
        for (int i = 0; i < n; i++) {
            if (!known(s[i].live))
                continue;
            int w = by_time ? (int)((s[i].t_rel - tmin) / (tmax - tmin) * GROWTH_WINDOWS)
                            : (int)((long long)i * GROWTH_WINDOWS / n);
            if (w < 0)
                w = 0;
            if (w >= GROWTH_WINDOWS)
                w = GROWTH_WINDOWS - 1;
            if (!has[w] || s[i].live < trough[w])
                trough[w] = s[i].live;
            if (!has[w])
                filled++;
            has[w] = true;
        }
    }
    if (filled < 5)
        return false;
    if (d->th.growth_min_seconds > 0 && tmax - tmin < d->th.growth_min_seconds)
        return false;
    uint64_t eps = d->total / 1000 > (1ULL << 20) ? d->total / 1000 : (1ULL << 20);
    int steps = 0, rising = 0, first = -1, last = -1, prev = -1;
    for (int w = 0; w < GROWTH_WINDOWS; w++) {
        if (!has[w])
            continue;
        if (first < 0)
            first = w;
        last = w;
        if (prev >= 0) {
            steps++;
            if (trough[w] > trough[prev] && trough[w] - trough[prev] > eps)
                rising++;
        }
        prev = w;
    }
    uint64_t rise = sub0(trough[last], trough[first]);
    double rs = d->th.growth_rising_steps, gm = d->th.growth_min_share;
    double rising_share = (double)rising / steps;
    double rise_share = (double)rise / (double)d->total;
    if (rising_share + 1e-9 < rs || rise_share + 1e-12 < gm || rise == 0)
        return false;
    c->id = "growth";
    c->confidence = 0.4 + 0.3 * clamp01(rs < 1 ? (rising_share - rs) / (1 - rs) : 1) +
                    0.3 * clamp01((rise_share - gm) / (3 * gm));
    double per_step = (double)rise / steps;
    double window_s = tmax > tmin ? (tmax - tmin) / GROWTH_WINDOWS : 0;
    summary(c, "Memory held by this process kept rising: its low point grew in %d of %d intervals of the run, "
            "from %s to %s (about %s per interval, %s of the device).", rising, steps, og_hb((double)trough[first]).s, og_hb((double)trough[last]).s,
            og_hb(per_step).s, og_pct((double)rise, (double)d->total).s);
    ev_bytes(c, "first_trough_bytes", trough[first]);
    ev_bytes(c, "last_trough_bytes", trough[last]);
    ev_bytes(c, "rise_bytes", rise);
    ev_num(c, "rise_per_step_bytes", (double)(uint64_t)per_step);
    ev_text(c, "rising_steps", "%d of %d", rising, steps);
    ev_num(c, "samples", n);
    ev_num(c, "window_s", window_s);
    return true;
}

static bool c_does_not_fit(dctx_t *d, og_cause_t *c)
{
    if (!d->free_known || d->req == 0)
        return false;
    uint64_t avail = add_sat(d->free_eff, d->reclaim);
    if (d->req <= avail)
        return false;
    c->id = "does_not_fit";
    double conf = 1 - 0.5 * (double)avail / (double)d->req;
    uint64_t capacity = d->limited ? d->limit : d->total;
    uint64_t job = add_sat(sub0(d->footprint, d->reclaim), d->req);
    uint64_t missing = d->req - avail;
    bool alone_fits = capacity && job <= capacity && d->other >= missing;
    if (alone_fits && conf > 0.45)
        conf = 0.45;
    c->confidence = clamp01(conf);
    char note[96] = "";
    if (!d->cached_known)
        og_fmt(note, sizeof note, " (the framework's cache was not measured)");
    else if (strcmp(d->cached_src, "retry_release") == 0)
        og_fmt(note, sizeof note, " (%s already released %s and retried)", d->fwname, og_hb((double)d->cached).s);
    else if (d->free_estimated)
        og_fmt(note, sizeof note, " (free memory estimated)");
    summary(c, "%s more is needed than is free%s%s; this is %s of the %s this process holds%s.",
            og_hb((double)missing).s, d->reclaim ? " even after releasing the cache" : "", note,
            og_pct((double)missing, (double)d->footprint).s, og_hb((double)d->footprint).s,
            alone_fits ? "; alone on the device the job would fit" : "");
    ev_bytes(c, "requested_bytes", d->req);
    ev_bytes(c, d->limited ? "free_under_limit_bytes" : "free_bytes", d->free_eff);
    if (d->cached_known)
        ev_bytes(c, "reclaimable_bytes", d->reclaim);
    else
        ev_text(c, "reclaimable_bytes", "not measured");
    ev_bytes(c, "missing_bytes", missing);
    ev_bytes(c, "footprint_bytes", d->footprint);
    ev_bytes(c, "job_need_bytes", job);
    ev_bytes(c, d->limited ? "limit_bytes" : "capacity_bytes", capacity);
    return true;
}

static void c_unknown(dctx_t *d, og_cause_t *c)
{
    c->id = "unknown";
    c->confidence = 0;
    char miss[96] = "";
    int nm = 0;
    const char *m[4] = {"", "", "", ""};
    if (!d->cached_known)
        m[nm++] = "framework cache";
    if (!d->used_known)
        m[nm++] = "NVML usage";
    if (!d->free_known)
        m[nm++] = "free memory";
    if (nm)
        og_fmt(miss, sizeof miss, "; not measured: %s%s%s%s%s", m[0], nm > 1 ? ", " : "", nm > 1 ? m[1] : "",
            nm > 2 ? ", " : "", nm > 2 ? m[2] : "");
    summary(c, "No rule matched: %s requested, %s free of %s, this process tracks %s, others hold %s%s.",
            og_hb((double)d->req).s, d->free_known ? og_hb((double)d->free_eff).s : "?", og_hb((double)d->total).s,
            og_hb((double)d->tracked).s, og_hb((double)d->other).s, miss);
    ev_bytes(c, "requested_bytes", d->req);
    if (d->free_known)
        ev_bytes(c, "free_bytes", d->free_eff);
    else
        ev_text(c, "free_bytes", "not measured");
    ev_bytes(c, "total_bytes", d->total);
    ev_bytes(c, "tracked_bytes", d->tracked);
    ev_bytes(c, "other_processes_bytes", d->other);
    if (d->cached_known)
        ev_bytes(c, "cached_bytes", d->cached);
}

/* ------------------------------------------------------------------ entry */

typedef bool (*cause_fn)(dctx_t *, og_cause_t *);

/* evaluation order = tie-break priority (first wins) */
static const struct { cause_fn fn; double bonus; } cause_table[] = {
    {c_limit, 0.06},     {c_cache_held, 0.05}, {c_fragmentation, 0.04}, {c_foreign, 0.03},
    {c_non_framework, 0.02}, {c_growth, 0.01}, {c_does_not_fit, 0.0},
};

void og_diagnose(og_record_t *rec, const og_thresholds_t *th)
{
    if (!rec)
        return;
    memset(&rec->diagnosis, 0, sizeof rec->diagnosis);
    dctx_t d;
    measure(&d, rec, th);
    rec->diagnosis.shortfall_bytes = d.shortfall;

    double score[8];
    int n = 0;
    for (size_t i = 0; i < sizeof cause_table / sizeof *cause_table && n < 8; i++) {
        og_cause_t *c = &rec->diagnosis.causes[n];
        memset(c, 0, sizeof *c);
        if (cause_table[i].fn(&d, c)) {
            score[n] = c->confidence + cause_table[i].bonus;
            n++;
        } else {
            memset(c, 0, sizeof *c);
        }
    }
    /* stable insertion sort by score, highest first */
    for (int i = 1; i < n; i++) {
        og_cause_t tmp = rec->diagnosis.causes[i];
        double ts = score[i];
        int j = i - 1;
        while (j >= 0 && score[j] < ts) {
            rec->diagnosis.causes[j + 1] = rec->diagnosis.causes[j];
            score[j + 1] = score[j];
            j--;
        }
        rec->diagnosis.causes[j + 1] = tmp;
        score[j + 1] = ts;
    }
    if (n == 0) {
        c_unknown(&d, &rec->diagnosis.causes[0]);
        n = 1;
    }
    rec->diagnosis.ncauses = n;
    rec->diagnosis.primary = rec->diagnosis.causes[0].id;
}
