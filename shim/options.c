/* OOMGUARD_* options: one table (OG_OPTIONS in og.h), read once, printable.
 * A bad value never stops the host program: one warning, then the default. */
#include "og.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

og_options_t og_opt;

typedef struct {
    const char *env;
    og_opt_type type;
    const char *def;
    long long lo, hi;
    const char *help;
} og_opt_desc_t;

static const og_opt_desc_t opt_desc[OG_OPT_COUNT] = {
#define X(id, env, type, def, lo, hi, help) [OG_OPT_##id] = {"OOMGUARD_" env, type, def, lo, hi, help},
    OG_OPTIONS(X)
#undef X
};

static long long *opt_slot(int i)
{
    switch (i) {
#define X(id, env, type, def, lo, hi, help) case OG_OPT_##id: return &og_opt.id;
        OG_OPTIONS(X)
#undef X
    }
    return NULL;
}

/* Sizes: plain bytes or a number with B, K/KB (10^3), KiB (2^10) ... TB/TiB.  Fractions allowed. */
long long og_parse_size(const char *s, bool *ok)
{
    *ok = false;
    if (!s)
        return 0;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '-' || *s == '+' || !*s)
        return 0;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return 0;
    while (isspace((unsigned char)*end))
        end++;
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1e3}, {"kb", 1e3}, {"kib", 1024.0},
        {"m", 1e6}, {"mb", 1e6}, {"mib", 1048576.0},
        {"g", 1e9}, {"gb", 1e9}, {"gib", 1073741824.0},
        {"t", 1e12}, {"tb", 1e12}, {"tib", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
        if (strcasecmp(end, units[i].suf) == 0) {
            double bytes = v * units[i].mul;
            if (bytes >= 9.2e18)
                return 0;
            *ok = true;
            return (long long)bytes;
        }
    }
    return 0;
}

static bool parse_bool(const char *s, long long *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off", ""};
    for (size_t i = 0; i < 4; i++)
        if (strcasecmp(s, yes[i]) == 0) { *out = 1; return true; }
    for (size_t i = 0; i < 5; i++)
        if (strcasecmp(s, no[i]) == 0) { *out = 0; return true; }
    return false;
}

static bool parse_int(const char *s, long long *out)
{
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_one(const og_opt_desc_t *d, const char *s, long long *out)
{
    bool ok = false;
    switch (d->type) {
    case OG_OPT_BOOL: ok = parse_bool(s, out); break;
    case OG_OPT_INT: ok = parse_int(s, out); break;
    case OG_OPT_SIZE: *out = og_parse_size(s, &ok); break;
    case OG_OPT_PERCENT: {
        char *end;
        errno = 0;
        double v = strtod(s, &end);
        if (!errno && end != s && (*end == '%' || *end == 0) && (*end == 0 || end[1] == 0)) {
            *out = (long long)(v * 100.0 + 0.5);   /* hundredths of a percent */
            ok = v >= 0;
        }
        break;
    }
    case OG_OPT_STRING: ok = true; break;
    }
    if (ok && d->type != OG_OPT_STRING && d->type != OG_OPT_SIZE && d->type != OG_OPT_BOOL &&
        d->lo < d->hi && (*out < d->lo || *out > d->hi))
        ok = false;
    return ok;
}

static char *string_slot(int i)
{
    return i == OG_OPT_dir ? og_opt.dir_s : i == OG_OPT_framework ? og_opt.framework_s
         : i == OG_OPT_framework_libs ? og_opt.framework_libs_s : i == OG_OPT_limit ? og_opt.limit_s
         : i == OG_OPT_warn_at ? og_opt.warn_at_s : NULL;
}
static size_t string_size(int i)
{
    return i == OG_OPT_dir ? sizeof og_opt.dir_s : i == OG_OPT_framework ? sizeof og_opt.framework_s
         : i == OG_OPT_limit ? sizeof og_opt.limit_s : i == OG_OPT_warn_at ? sizeof og_opt.warn_at_s
         : sizeof og_opt.framework_libs_s;
}
static bool framework_valid(const char *s)
{
    static const char *const ok[] = {"auto", "pytorch", "jax", "tensorflow", "cupy"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (strcmp(s, ok[i]) == 0)
            return true;
    return false;
}

void og_options_init(void)
{
    snprintf(og_opt.framework_s, sizeof og_opt.framework_s, "auto");
    og_opt.dir_s[0] = og_opt.framework_libs_s[0] = og_opt.limit_s[0] = og_opt.warn_at_s[0] = 0;
    for (int i = 0; i < OG_OPT_COUNT; i++) {
        const og_opt_desc_t *d = &opt_desc[i];
        long long *slot = opt_slot(i), v = 0;
        parse_one(d, d->def, &v);
        *slot = v;
        const char *s = getenv(d->env);
        if (!s)
            continue;
        if (d->type == OG_OPT_STRING) {
            if (i == OG_OPT_framework && !framework_valid(s)) {
                og_warn("%s=%s is not valid (auto, pytorch, jax, tensorflow or cupy); using auto", d->env, s);
                continue;
            }
            char *dst = string_slot(i);
            if (dst) {
                snprintf(dst, string_size(i), "%s", s);
                *slot = 1;
            }
            continue;
        }
        if (parse_one(d, s, &v)) {
            *slot = v;
        } else if (d->lo < d->hi && d->type == OG_OPT_INT) {
            og_warn("%s=%s is not valid (an integer from %lld to %lld expected); using the default %s",
                    d->env, s, d->lo, d->hi, d->def);
        } else {
            og_warn("%s=%s is not valid; using the default %s", d->env, s, d->def);
        }
    }
}

void og_options_print(void)
{
    og_log("options:");
    for (int i = 0; i < OG_OPT_COUNT; i++) {
        const og_opt_desc_t *d = &opt_desc[i];
        const char *env = getenv(d->env);
        if (d->type == OG_OPT_STRING)
            og_log("  %-24s = %-10s %s%s", d->env, string_slot(i), d->help, env ? "" : " (default)");
        else if (d->type == OG_OPT_PERCENT) {
            char v[32];
            snprintf(v, sizeof v, "%.2f%%", *opt_slot(i) / 100.0);
            og_log("  %-24s = %-10s %s%s", d->env, v, d->help, env ? "" : " (default)");
        }
        else
            og_log("  %-24s = %-10lld %s%s", d->env, *opt_slot(i), d->help, env ? "" : " (default)");
    }
}

/* ------------------------------------------------------------------ logging */

/* One write(2) per line so that ranks sharing a terminal do not interleave mid-line. */
static void vlog(const char *prefix, const char *fmt, va_list ap)
{
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "oomguard[%d]: %s", (int)getpid(), prefix);
    if (n < 0)
        return;
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void og_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog("", fmt, ap);
    va_end(ap);
}

void og_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog("warning: ", fmt, ap);
    va_end(ap);
}
