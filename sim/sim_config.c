/*
 * sim_config.c — reads the SIMGPU_* environment once and validates it.
 *
 * Policy: a malformed variable never aborts the program under test (that would
 * make a typo in a test look like an oomguard bug).  It prints one warning on
 * stderr naming the variable and falls back to the documented default.
 */
#include "sim_config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void warn_bad(bool quiet, const char *var, const char *val, const char *why, const char *dflt)
{
    if (quiet)
        return;
    fprintf(stderr, "simgpu: warning: ignoring %s='%s' (%s); using default %s\n", var, val, why, dflt);
}

static const char *skip_ws(const char *s)
{
    while (*s && isspace((unsigned char)*s))
        s++;
    return s;
}

bool sim_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {
        { "", 1 },
        { "b", 1 },
        { "kib", SIM_KIB },
        { "mib", SIM_MIB },
        { "gib", SIM_GIB },
        { "tib", SIM_GIB * 1024ULL },
        { "k", SIM_KIB },
        { "m", SIM_MIB },
        { "g", SIM_GIB },
        { "t", SIM_GIB * 1024ULL },
        { "kb", 1000ULL },
        { "mb", 1000000ULL },
        { "gb", 1000000000ULL },
        { "tb", 1000000000000ULL },
    };
    if (!s)
        return false;
    s = skip_ws(s);
    if (!isdigit((unsigned char)*s) && *s != '.')
        return false;
    char *end;
    errno = 0;
    long double v = strtold(s, &end);
    if (errno || end == s || v < 0)
        return false;
    const char *u = skip_ws(end);
    size_t ulen = strlen(u);
    while (ulen && isspace((unsigned char)u[ulen - 1]))
        ulen--;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].unit) == ulen && strncasecmp(u, units[i].unit, ulen) == 0) {
            long double bytes = v * (long double)units[i].mult;
            if (bytes > 18446744073709551615.0L)
                return false;
            /* Round to the nearest byte: "1.5GiB" is exact, "0.1GB" is 100000000. */
            *out = (uint64_t)llroundl(bytes);
            return true;
        }
    }
    return false;
}

static bool parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    s = skip_ws(s);
    long v = strtol(s, &end, 10);
    if (errno || end == s || *skip_ws(end) != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* A parser's failure: why the value is refused. */
static bool reject(const char **why, const char *reason)
{
    *why = reason;
    return false;
}

/* `spec` into buf (for strtok_r), unless it does not fit. */
static bool spec_copy(char *buf, size_t size, const char *spec, const char **why)
{
    size_t len = strlen(spec);
    if (len >= size)
        return reject(why, "value too long");
    memcpy(buf, spec, len + 1);
    return true;
}

/*
 * Per-device values: "VALUE" for every device, "D:VALUE,D:VALUE" per device,
 * or a mix ("80GiB,1:40GiB").  A leading "D:" is only taken as a device prefix
 * when D is all digits, so names like "A100:80GB" stay intact.
 * `apply(dev, value, ctx)` returns false on a malformed value; dev == -1 means
 * "all devices".
 */
typedef bool (*per_dev_fn)(int dev, const char *value, void *ctx);

static bool parse_per_device(const char *spec, int ndev, per_dev_fn apply, void *ctx, const char **why)
{
    char buf[2048];
    if (!spec_copy(buf, sizeof buf, spec, why))
        return false;
    char *save = NULL;
    int items = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = (char *)skip_ws(tok);
        char *colon = strchr(tok, ':');
        int dev = -1;
        const char *val = tok;
        if (colon) {
            bool digits = colon > tok;
            for (char *p = tok; p < colon; p++)
                if (!isdigit((unsigned char)*p))
                    digits = false;
            if (digits) {
                dev = atoi(tok);
                if (dev >= ndev)
                    return reject(why, "device index out of range");
                val = colon + 1;
            }
        }
        if (!apply(dev, val, ctx))
            return reject(why, "malformed value");
        items++;
    }
    if (items == 0)
        return reject(why, "empty");
    return true;
}

static bool apply_mem(int dev, const char *v, void *ctx)
{
    sim_config_t *c = ctx;
    uint64_t b;
    if (!sim_parse_size(v, &b) || b == 0)
        return false;
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        if (dev < 0 || d == dev)
            c->total[d] = b;
    return true;
}

static bool apply_name(int dev, const char *v, void *ctx)
{
    sim_config_t *c = ctx;
    v = skip_ws(v);
    if (!*v || strlen(v) >= SIM_NAME_MAX)
        return false;
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        if (dev < 0 || d == dev)
            snprintf(c->name[d], SIM_NAME_MAX, "%s", v);
    return true;
}

static bool apply_cc(int dev, const char *v, void *ctx)
{
    sim_config_t *c = ctx;
    int maj, min, n = 0;
    if (sscanf(v, " %d.%d %n", &maj, &min, &n) != 2 || v[n] != '\0' || maj < 1 || maj > 99 || min < 0 || min > 9)
        return false;
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        if (dev < 0 || d == dev) {
            c->cc_major[d] = maj;
            c->cc_minor[d] = min;
        }
    return true;
}

static void set_defaults_mem(sim_config_t *c)
{
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        c->total[d] = SIM_DEFAULT_MEM;
}

static void set_defaults_name(sim_config_t *c)
{
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        snprintf(c->name[d], SIM_NAME_MAX, "%s", SIM_DEFAULT_NAME);
}

static void set_defaults_cc(sim_config_t *c)
{
    for (int d = 0; d < SIM_MAX_DEVICES; d++) {
        c->cc_major[d] = SIM_DEFAULT_CC_MAJOR;
        c->cc_minor[d] = SIM_DEFAULT_CC_MINOR;
    }
}

/* The allocating entry points that fault injection and failed_allocs count.
 * Aliases let tests name a function by its base name or per-thread variant. */
const char *sim_canonical_alloc_fn(const char *name)
{
    static const char *const canon[] = {
        "cuMemAlloc_v2",   "cuMemAllocPitch_v2",      "cuMemAllocManaged", "cuMemCreate",
        "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemHostAlloc",    "cuMemAllocHost_v2",
    };
    static const struct {
        const char *alias, *canon;
    } alias[] = {
        { "cuMemAlloc", "cuMemAlloc_v2" },
        { "cuMemAllocPitch", "cuMemAllocPitch_v2" },
        { "cuMemAllocHost", "cuMemAllocHost_v2" },
        { "cuMemAllocAsync_ptsz", "cuMemAllocAsync" },
        { "cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync" },
    };
    for (size_t i = 0; i < sizeof canon / sizeof canon[0]; i++)
        if (strcmp(name, canon[i]) == 0)
            return canon[i];
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcmp(name, alias[i].alias) == 0)
            return alias[i].canon;
    return NULL;
}

static bool parse_other_procs(const char *spec, sim_config_t *c, const char **why)
{
    char buf[4096];
    if (!spec_copy(buf, sizeof buf, spec, why))
        return false;
    char *save = NULL;
    c->n_other = 0;
    for (char *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
        tok = (char *)skip_ws(tok);
        if (!*tok)
            continue;
        char *f[4];
        int nf = 0;
        char *p = tok;
        /* DEV:PID:NAME:BYTES — split on the first three colons. */
        f[nf++] = p;
        while (nf < 4 && (p = strchr(p, ':')) != NULL) {
            *p++ = '\0';
            f[nf++] = p;
        }
        long dev, pid;
        uint64_t bytes;
        if (nf != 4)
            return reject(why, "expected DEV:PID:NAME:BYTES");
        if (!parse_int(f[0], 0, c->devices - 1, &dev))
            return reject(why, "bad or out-of-range device");
        if (!parse_int(f[1], 1, 0x7fffffffL, &pid))
            return reject(why, "bad pid");
        if (!sim_parse_size(f[3], &bytes))
            return reject(why, "bad size");
        if (c->n_other >= SIM_MAX_OTHER_PROCS)
            return reject(why, "too many entries");
        sim_other_proc_t *o = &c->other[c->n_other++];
        o->dev = (int)dev;
        o->pid = (unsigned int)pid;
        snprintf(o->name, sizeof o->name, "%s", f[2]);
        o->bytes = bytes;
    }
    return true;
}

static bool parse_fail_nth(const char *spec, sim_config_t *c, const char **why)
{
    char buf[2048];
    if (!spec_copy(buf, sizeof buf, spec, why))
        return false;
    char *save = NULL;
    c->n_fail = 0;
    for (char *tok = strtok_r(buf, ",;", &save); tok; tok = strtok_r(NULL, ",;", &save)) {
        tok = (char *)skip_ws(tok);
        char *colon = strrchr(tok, ':');
        if (!colon)
            return reject(why, "expected NAME:N");
        *colon = '\0';
        char *name = tok;
        size_t nl = strlen(name);
        while (nl && isspace((unsigned char)name[nl - 1]))
            name[--nl] = '\0';
        long n;
        if (!parse_int(colon + 1, 1, 0x7fffffffL, &n))
            return reject(why, "N must be a positive integer");
        const char *canon = strcmp(name, "*") == 0 ? "*" : sim_canonical_alloc_fn(name);
        if (!canon)
            return reject(why, "not an allocating function (see docs/simulator.md)");
        if (c->n_fail >= SIM_MAX_FAIL_RULES)
            return reject(why, "too many rules");
        snprintf(c->fail[c->n_fail].name, sizeof c->fail[0].name, "%s", canon);
        c->fail[c->n_fail].nth = (uint64_t)n;
        c->n_fail++;
    }
    return true;
}

void sim_config_load(sim_config_t *c, bool quiet)
{
    const char *v, *why = NULL;
    long n;
    char dflt[64];

    memset(c, 0, sizeof *c);
    c->devices = SIM_DEFAULT_DEVICES;
    set_defaults_mem(c);
    set_defaults_name(c);
    set_defaults_cc(c);
    c->ctx_overhead = SIM_DEFAULT_CTX_OVERHEAD;
    c->granularity = SIM_DEFAULT_GRANULARITY;

    if ((v = getenv("SIMGPU_DEVICES")) && *v) {
        snprintf(dflt, sizeof dflt, "%d", SIM_DEFAULT_DEVICES);
        if (parse_int(v, 0, SIM_MAX_DEVICES, &n))
            c->devices = (int)n;
        else
            warn_bad(quiet, "SIMGPU_DEVICES", v, "must be an integer 0..16", dflt);
    }
    /* Per-device parsers validate the device index against c->devices, so the
     * device count is read first. */
    if ((v = getenv("SIMGPU_MEM")) && *v) {
        if (!parse_per_device(v, c->devices, apply_mem, c, &why)) {
            set_defaults_mem(c);
            warn_bad(quiet, "SIMGPU_MEM", v, why, "24GiB");
        }
    }
    if ((v = getenv("SIMGPU_NAME")) && *v) {
        if (!parse_per_device(v, c->devices, apply_name, c, &why)) {
            set_defaults_name(c);
            warn_bad(quiet, "SIMGPU_NAME", v, why, "'" SIM_DEFAULT_NAME "'");
        }
    }
    if ((v = getenv("SIMGPU_CC")) && *v) {
        if (!parse_per_device(v, c->devices, apply_cc, c, &why)) {
            set_defaults_cc(c);
            warn_bad(quiet, "SIMGPU_CC", v, why, "9.0");
        }
    }
    if ((v = getenv("SIMGPU_CTX_OVERHEAD")) && *v) {
        uint64_t b;
        if (sim_parse_size(v, &b))
            c->ctx_overhead = b;
        else
            warn_bad(quiet, "SIMGPU_CTX_OVERHEAD", v, "not a size", "512MiB");
    }
    if ((v = getenv("SIMGPU_GRANULARITY")) && *v) {
        uint64_t b;
        if (sim_parse_size(v, &b) && b >= 512 && (b & (b - 1)) == 0)
            c->granularity = b;
        else
            warn_bad(quiet, "SIMGPU_GRANULARITY", v, "must be a power of two >= 512 bytes", "2MiB");
    }
    if ((v = getenv("SIMGPU_OTHER_PROCS")) && *v) {
        if (!parse_other_procs(v, c, &why)) {
            c->n_other = 0;
            warn_bad(quiet, "SIMGPU_OTHER_PROCS", v, why, "(none)");
        }
    }
    if ((v = getenv("SIMGPU_FAIL_NTH")) && *v) {
        if (!parse_fail_nth(v, c, &why)) {
            c->n_fail = 0;
            warn_bad(quiet, "SIMGPU_FAIL_NTH", v, why, "(none)");
        }
    }
    if ((v = getenv("SIMGPU_FAIL_PROB")) && *v) {
        char *end;
        errno = 0;
        double p = strtod(v, &end);
        if (errno || end == v || *skip_ws(end) || !(p >= 0.0 && p <= 1.0))
            warn_bad(quiet, "SIMGPU_FAIL_PROB", v, "must be a number in [0,1]", "0");
        else
            c->fail_prob = p;
    }
    if ((v = getenv("SIMGPU_SEED")) && *v) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 0);
        if (errno || end == v || *skip_ws(end) || *skip_ws(v) == '-')
            warn_bad(quiet, "SIMGPU_SEED", v, "must be an unsigned integer", "0");
        else
            c->seed = s;
    }
    if ((v = getenv("SIMGPU_TRUTH_FILE")) && *v) {
        if (strlen(v) >= sizeof c->truth_file)
            warn_bad(quiet, "SIMGPU_TRUTH_FILE", v, "path too long", "(off)");
        else
            snprintf(c->truth_file, sizeof c->truth_file, "%s", v);
    }
    if ((v = getenv("SIMGPU_LOG_LOOKUPS")) && *v) {
        if (strlen(v) >= sizeof c->lookup_log)
            warn_bad(quiet, "SIMGPU_LOG_LOOKUPS", v, "path too long", "(off)");
        else
            snprintf(c->lookup_log, sizeof c->lookup_log, "%s", v);
    }
    if ((v = getenv("SIMGPU_STATE_DIR")) && *v) {
        if (strlen(v) >= sizeof c->state_dir - 32)
            warn_bad(quiet, "SIMGPU_STATE_DIR", v, "path too long", "(off)");
        else
            snprintf(c->state_dir, sizeof c->state_dir, "%s", v);
    }
}

uint64_t sim_config_other_bytes(const sim_config_t *c, int dev)
{
    uint64_t sum = 0;
    for (int i = 0; i < c->n_other; i++)
        if (c->other[i].dev == dev)
            sum += c->other[i].bytes;
    return sum;
}
