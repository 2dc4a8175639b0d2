/* OOMGUARD_LIMIT, OOMGUARD_WARN_AT and OOMGUARD_SUMMARY: headroom on the GPU you have.
 *
 * A limit makes the device look smaller to this process: allocations that would take its
 * tracked usage past the limit fail with the API's own out-of-memory error before reaching
 * the driver, and every memory query (cuMemGetInfo, cuDeviceTotalMem, NVML) reports
 * total = limit and free = limit - used, clamped to what is physically free, never negative. */
#include "og.h"
#include "human.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    bool set;
    bool percent;
    double value; /* bytes, or percent of the device's total */
} spec_t;

static spec_t limit_all, limit_dev[OG_MAX_DEVICES];
static spec_t warn_spec;
bool og_limit_on; /* set once at start-up, before any hook runs */
static bool warn_on;
static _Atomic uint64_t limit_cache[OG_MAX_DEVICES]; /* resolved bytes + 1; 0 = not yet */
static _Atomic uint64_t warn_cache[OG_MAX_DEVICES];
/* Memory of this process on the device that no hook sees (the CUDA context above all):
 * measured with NVML as process usage minus tracked, once per device and at each failure.
 * A limited device then behaves like a smaller card, whose context also lives inside it. */
static _Atomic uint64_t overhead_cache[OG_MAX_DEVICES]; /* bytes + 1; 0 = not measured */
static atomic_int warn_armed_dev[OG_MAX_DEVICES];

/* Refused, with the reason in *why: a number without a unit (bytes? MB?), a size under
 * 1 MiB (surely a typo), a device named twice, an index past OG_MAX_DEVICES. */
static bool parse_value(const char *s, size_t n, spec_t *out, bool allow_over_100, const char **why)
{
    char buf[64];
    *why = "24GiB, 24000MB or 80% expected";
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (buf[n - 1] == '%') {
        buf[n - 1] = 0;
        char *end;
        double v = strtod(buf, &end);
        *why = "a percentage above 0 and at most 100 expected";
        if (end == buf || *end || !(v > 0) || (!allow_over_100 && v > 100))
            return false;
        *out = (spec_t){ true, true, v };
        return true;
    }
    bool ok;
    long long b = og_parse_size(buf, &ok);
    if (!ok || b <= 0)
        return false;
    if (!isalpha((unsigned char)buf[n - 1])) {
        *why = "a size needs a unit: 24GiB, 24000MB";
        return false;
    }
    if (b < 1048576) {
        *why = "under 1 MiB";
        return false;
    }
    *out = (spec_t){ true, false, (double)b };
    return true;
}

/* "24GiB" | "80%" | "0:24GiB,1:40GiB" (an entry without index applies to every device) */
static bool parse_limit(const char *s, const char **why)
{
    static char msg[96];
    spec_t all = { 0 }, dev[OG_MAX_DEVICES];
    memset(dev, 0, sizeof dev);
    for (const char *p = s; *p;) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        spec_t v;
        if (colon) {
            char *end;
            long idx = strtol(p, &end, 10);
            if (end != colon || idx < 0 || idx >= OG_MAX_DEVICES) {
                snprintf(msg, sizeof msg, "a device index from 0 to %d expected before ':'", OG_MAX_DEVICES - 1);
                *why = msg;
                return false;
            }
            if (!parse_value(colon + 1, len - (size_t)(colon + 1 - p), &v, false, why))
                return false;
            if (dev[idx].set) {
                snprintf(msg, sizeof msg, "device %ld is named twice", idx);
                *why = msg;
                return false;
            }
            dev[idx] = v;
        } else {
            if (!parse_value(p, len, &v, false, why))
                return false;
            if (all.set) {
                *why = "two limits for every device";
                return false;
            }
            all = v;
        }
        p += len + (p[len] == ',');
    }
    limit_all = all;
    memcpy(limit_dev, dev, sizeof dev);
    return true;
}

/* A device the limit names but the process cannot see (another machine's setting, a typo):
 * said once, when the driver can first tell how many devices there are. */
static void check_named_devices(void)
{
    static atomic_int done;
    og_cfn_cuDeviceGetCount count = OG_CALL(cuDeviceGetCount);
    int n = 0;
    if (atomic_load_explicit(&done, memory_order_relaxed) || !count || count(&n) != CUDA_SUCCESS || n <= 0 ||
        atomic_exchange(&done, 1))
        return;
    for (int d = n; d < OG_MAX_DEVICES; d++)
        if (limit_dev[d].set) {
            og_warn("OOMGUARD_LIMIT=%s names device %d, but %d device%s visible; that entry is ignored", og_opt.limit_s,
                    d, n, n == 1 ? " is" : "s are");
            break;
        }
}

void og_limit_init(void)
{
    const char *why;
    if (og_opt.limit_s[0]) {
        if (parse_limit(og_opt.limit_s, &why))
            og_limit_on = true;
        else
            og_warn("OOMGUARD_LIMIT=%s is not valid (%s; 24GiB, 24000MB, 80%% or 0:24GiB,1:40GiB expected); "
                    "using the default: no limit",
                    og_opt.limit_s, why);
    }
    if (og_opt.warn_at_s[0]) {
        size_t n = strlen(og_opt.warn_at_s);
        if (parse_value(og_opt.warn_at_s, n, &warn_spec, false, &why))
            warn_on = true;
        else
            og_warn("OOMGUARD_WARN_AT=%s is not valid (%s; 90%% or 20GiB expected); using the default: no warning",
                    og_opt.warn_at_s, why);
    }
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        atomic_store(&warn_armed_dev[i], 1);
}

static uint64_t physical_total(int device)
{
    size_t total = 0;
    og_fn_cuDeviceTotalMem_v2 tm = OG_REAL(cuDeviceTotalMem_v2);
    if (!tm || tm(&total, device) != CUDA_SUCCESS)
        return 0;
    return total;
}

static uint64_t resolve(const spec_t *s, int device)
{
    if (!s->set)
        return UINT64_MAX;
    if (!s->percent)
        return (uint64_t)s->value;
    uint64_t total = physical_total(device);
    return total ? (uint64_t)((double)total * s->value / 100.0) : UINT64_MAX;
}

uint64_t og_limit_bytes(int device)
{
    if (!og_limit_on || device < 0 || device >= OG_MAX_DEVICES)
        return UINT64_MAX;
    uint64_t c = atomic_load_explicit(&limit_cache[device], memory_order_relaxed);
    if (c)
        return c - 1;
    check_named_devices();
    uint64_t v = resolve(limit_dev[device].set ? &limit_dev[device] : &limit_all, device);
    if (v != UINT64_MAX)
        atomic_store(&limit_cache[device], v + 1);
    return v;
}

void og_limit_refresh_overhead(int device)
{
    if (!og_limit_on || device < 0 || device >= OG_MAX_DEVICES)
        return;
    uint64_t tracked = og_ledger_tracked(device);
    uint64_t used = og_nvml_process_used(device);
    uint64_t over = used != UINT64_MAX && used > tracked ? used - tracked : 0;
    atomic_store(&overhead_cache[device], over + 1);
}

static uint64_t overhead(int device)
{
    uint64_t c = atomic_load_explicit(&overhead_cache[device], memory_order_relaxed);
    if (!c) {
        og_limit_refresh_overhead(device);
        c = atomic_load(&overhead_cache[device]);
    }
    return c ? c - 1 : 0;
}

/* What counts against the limit: tracked memory plus the untracked overhead. */
static uint64_t limited_usage(int device) { return og_ledger_tracked(device) + overhead(device); }

uint64_t og_limit_usage(int device) { return og_limit_on ? limited_usage(device) : og_ledger_tracked(device); }

bool og_limit_refuses(og_call_t *c, int device, uint64_t bytes, bool from_pool)
{
    uint64_t limit = og_limit_bytes(device);
    if (limit == UINT64_MAX)
        return false;
    og_ledger_pools_refresh(device); /* a pool may have given memory back since we looked */
    uint64_t used = limited_usage(device);
    /* a pool serves from its unused reservation first; only growth counts against the limit */
    uint64_t need = bytes;
    if (from_pool) {
        uint64_t spare = og_ledger_pool_spare(device);
        need = bytes > spare ? bytes - spare : 0;
    }
    if (used <= limit && need <= limit - used)
        return false;
    c->device = device;
    return true;
}

/* cuMemGetInfo/cuDeviceTotalMem/NVML: the limited view.  free never exceeds what is
 * physically free, never goes negative, never wraps. */
void og_limit_view(int device, uint64_t *free_b, uint64_t *total_b)
{
    uint64_t limit = og_limit_bytes(device);
    if (limit == UINT64_MAX)
        return;
    uint64_t used = limited_usage(device);
    uint64_t lfree = used >= limit ? 0 : limit - used;
    if (total_b && *total_b > limit)
        *total_b = limit;
    if (free_b && *free_b > lfree)
        *free_b = lfree;
}

uint64_t og_limit_cached(int device)
{
    uint64_t c = og_limit_on && device >= 0 && device < OG_MAX_DEVICES ? atomic_load(&limit_cache[device]) : 0;
    return c ? c - 1 : UINT64_MAX;
}

uint64_t og_warn_cached(int device)
{
    uint64_t c = warn_on && device >= 0 && device < OG_MAX_DEVICES ? atomic_load(&warn_cache[device]) : 0;
    return c ? c - 1 : UINT64_MAX;
}

/* ------------------------------------------------------------------ warnings */

static uint64_t warn_threshold(int device)
{
    uint64_t c = atomic_load_explicit(&warn_cache[device], memory_order_relaxed);
    if (c)
        return c - 1;
    uint64_t v;
    if (!warn_spec.percent) {
        v = (uint64_t)warn_spec.value;
    } else {
        uint64_t base = og_limit_bytes(device);
        if (base == UINT64_MAX)
            base = physical_total(device);
        if (!base)
            return UINT64_MAX;
        v = (uint64_t)((double)base * warn_spec.value / 100.0);
    }
    atomic_store(&warn_cache[device], v + 1);
    return v;
}

/* Once per crossing: re-armed only after usage falls 5% below the threshold.  The inline
 * og_warn_check calls this only at a crossing of the edges set here (armed: the threshold;
 * fired: 5% below it).  Called with no lock of ours held: it may write a dump. */
_Atomic uint64_t og_warn_above[OG_MAX_DEVICES], og_warn_below[OG_MAX_DEVICES];

static void warn_edges(int device, bool armed, uint64_t th)
{
    atomic_store_explicit(&og_warn_above[device], armed ? th : UINT64_MAX, memory_order_relaxed);
    atomic_store_explicit(&og_warn_below[device], armed ? 0 : th - th / 20, memory_order_relaxed);
}

void og_warn_crossed(int device, uint64_t live)
{
    if (device < 0 || device >= OG_MAX_DEVICES)
        return;
    if (!warn_on) {
        warn_edges(device, true, UINT64_MAX);
        return;
    }
    uint64_t th = warn_threshold(device);
    if (th == UINT64_MAX)
        return; /* not known yet: asked again at the next allocation */
    if (live >= th) {
        if (atomic_exchange(&warn_armed_dev[device], 0)) {
            warn_edges(device, false, th);
            char a[32], b[32];
            og_warn("device %d: usage %s crossed OOMGUARD_WARN_AT (%s)", device,
                    og_bytes_fmt(a, sizeof a, (double)live, OG_BYTES_FIXED),
                    og_bytes_fmt(b, sizeof b, (double)th, OG_BYTES_FIXED));
            og_live_note_warning(device);
            if (og_opt.warn_dump) {
                og_dump_capture_write("warning", device);
            }
        }
    } else if (live < th - th / 20) {
        atomic_store(&warn_armed_dev[device], 1);
    }
    warn_edges(device, atomic_load(&warn_armed_dev[device]) != 0, th);
}

/* ------------------------------------------------------------------ exit summary */

void og_exit_summary(void)
{
    if (!og_opt.summary)
        return;
    static const unsigned cards[] = { 16, 24, 40, 48, 80, 141 };
    int last = -1;
    for (int d = 0; d < OG_MAX_DEVICES; d++) {
        oomguard_device_stats_t st;
        og_ledger_stats(d, &st);
        if (!st.allocs && !st.peak_tracked_bytes)
            continue;
        last = d;
        char a[32];
        unsigned fit = 0;
        for (size_t i = 0; i < sizeof cards / sizeof *cards && !fit; i++)
            if (st.peak_tracked_bytes <= (uint64_t)cards[i] * 1000000000ull)
                fit = cards[i];
        double t = og_ledger_peak_t_ns(d) ? (double)(og_ledger_peak_t_ns(d) - og_start_ns()) / 1e9 : 0;
        if (st.failures) /* the peak leaves out what failed: the job's need was never seen */
            og_log("summary: device %d peak %s at %.2f s; %llu allocation%s failed on it, so its full need was "
                   "not seen: which cards fit is unknown",
                   d, og_bytes_fmt(a, sizeof a, (double)st.peak_tracked_bytes, OG_BYTES_FIXED), t,
                   (unsigned long long)st.failures, st.failures == 1 ? "" : "s");
        else if (fit)
            og_log("summary: device %d peak %s at %.2f s: fits on %u GB cards and above", d,
                   og_bytes_fmt(a, sizeof a, (double)st.peak_tracked_bytes, OG_BYTES_FIXED), t, fit);
        else
            og_log("summary: device %d peak %s at %.2f s: larger than a 141 GB card", d,
                   og_bytes_fmt(a, sizeof a, (double)st.peak_tracked_bytes, OG_BYTES_FIXED), t);
    }
    /* the exit dump asks the driver and NVML: only from the atexit handler, never from a
     * destructor (og_exiting), when libcuda may be gone */
    if (last >= 0 && og_opt.dir_s[0] && !atomic_load(&og_exiting)) {
        og_dump_capture_write("exit", last);
    }
}
