/* OOMGUARD_* options: one table (OG_OPTIONS in options.def), read once, printable.
 * A bad value never stops the host program: one warning, then the default. */
#include "og.h"
#include "human.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
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
    size_t off; /* where the value lives in og_opt */
} og_opt_desc_t;

#define OG_OPT_OFF_BOOL(id)    offsetof(og_options_t, id)
#define OG_OPT_OFF_INT(id)     offsetof(og_options_t, id)
#define OG_OPT_OFF_PERCENT(id) offsetof(og_options_t, id)
#define OG_OPT_OFF_STRING(id)  offsetof(og_options_t, id##_s)

static const og_opt_desc_t opt_desc[OG_OPT_COUNT] = {
#define X(id, env, type, def, lo, hi, help) \
    [OG_OPT_##id] = { "OOMGUARD_" env, OG_OPT_##type, def, lo, hi, help, OG_OPT_OFF_##type(id) },
    OG_OPTIONS(X)
#undef X
};

/* stacks.c sizes its unwind buffer by OG_MAX_FRAMES: the option may not ask for more */
#define X(id, env, type, def, lo, hi, help) RANGE_HI_##id = (hi),
enum { OG_OPTIONS(X) };
#undef X
_Static_assert(RANGE_HI_stack_depth == OG_MAX_FRAMES, "OOMGUARD_STACK_DEPTH's maximum is OG_MAX_FRAMES");

static long long *num_slot(int i) { return (long long *)((char *)&og_opt + opt_desc[i].off); }
static char *str_slot(int i) { return (char *)&og_opt + opt_desc[i].off; }

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
    static const struct {
        const char *suf;
        double mul;
    } units[] = {
        { "", 1 },
        { "b", 1 },
        { "k", 1e3 },
        { "kb", 1e3 },
        { "kib", 1024.0 },
        { "m", 1e6 },
        { "mb", 1e6 },
        { "mib", 1048576.0 },
        { "g", 1e9 },
        { "gb", 1e9 },
        { "gib", 1073741824.0 },
        { "t", 1e12 },
        { "tb", 1e12 },
        { "tib", 1099511627776.0 },
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
    static const char *const yes[] = { "1", "true", "yes", "on" }, *const no[] = { "0", "false", "no", "off", "" };
    for (size_t i = 0; i < 4; i++)
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return true;
        }
    for (size_t i = 0; i < 5; i++)
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return true;
        }
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

static bool parse_percent(const char *s, long long *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0 || v > 1e12 || !(*end == 0 || (end[0] == '%' && end[1] == 0)))
        return false;
    *out = (long long)(v * 100.0 + 0.5); /* hundredths of a percent */
    return true;
}

static bool framework_valid(const char *s)
{
    return strcmp(s, "auto") == 0 || og_framework_from_name(s) != OG_FW_UNKNOWN;
}

/* Strings whose values are a closed set; the others are checked where they are used. */
static bool (*const str_check[OG_OPT_COUNT])(const char *) = {
    [OG_OPT_framework] = framework_valid,
};

/* A number or a string of option i; false leaves *num untouched. */
static bool parse_one(int i, const char *s, long long *num)
{
    const og_opt_desc_t *d = &opt_desc[i];
    long long v = 0;
    switch (d->type) {
    case OG_OPT_STRING:
        return strlen(s) < (size_t)d->hi && (!*s || !str_check[i] || str_check[i](s));
    case OG_OPT_BOOL:
        if (!parse_bool(s, &v))
            return false;
        break;
    case OG_OPT_INT:
        if (!parse_int(s, &v))
            return false;
        break;
    case OG_OPT_PERCENT:
        if (!parse_percent(s, &v))
            return false;
        break;
    }
    if (v < d->lo || v > d->hi)
        return false;
    if (num)
        *num = v;
    return true;
}

const char *og_option_env(int id) { return id >= 0 && id < OG_OPT_COUNT ? opt_desc[id].env : NULL; }
const char *og_option_default(int id) { return id >= 0 && id < OG_OPT_COUNT ? opt_desc[id].def : NULL; }
bool og_option_valid(int id, const char *value)
{
    return id >= 0 && id < OG_OPT_COUNT && value && parse_one(id, value, NULL);
}

static void bad_value(int i, const char *s)
{
    const og_opt_desc_t *d = &opt_desc[i];
    const char *def = *d->def ? d->def : "(unset)";
    if (d->type == OG_OPT_STRING && strlen(s) >= (size_t)d->hi)
        og_warn("%s is %zu characters long (at most %lld); using the default %s", d->env, strlen(s), d->hi - 1, def);
    else if (i == OG_OPT_framework)
        og_warn("%s=%s is not valid (auto, pytorch, jax, tensorflow or cupy); using the default %s", d->env, s, def);
    else if (d->type == OG_OPT_INT)
        og_warn("%s=%s is not valid (an integer from %lld to %lld expected); using the default %s", d->env, s, d->lo,
                d->hi, def);
    else if (d->type == OG_OPT_PERCENT)
        og_warn("%s=%s is not valid (a percentage from %g%% to %g%% expected); using the default %s", d->env, s,
                d->lo / 100.0, d->hi / 100.0, def);
    else
        og_warn("%s=%s is not valid (1/0, true/false, yes/no or on/off expected); using the default %s", d->env, s,
                def);
}

static void set_value(int i, const char *s)
{
    if (opt_desc[i].type == OG_OPT_STRING)
        snprintf(str_slot(i), (size_t)opt_desc[i].hi, "%s", s);
    else
        parse_one(i, s, num_slot(i));
}

void og_options_init(void)
{
    for (int i = 0; i < OG_OPT_COUNT; i++) {
        const og_opt_desc_t *d = &opt_desc[i];
        set_value(i, d->def);
        const char *s = getenv(d->env);
        /* OOMGUARD_DIR= (empty) is how a wrapper script says "not set" */
        if (!s || (d->type == OG_OPT_STRING && !*s))
            continue;
        if (parse_one(i, s, NULL))
            set_value(i, s);
        else
            bad_value(i, s);
    }
}

void og_options_print(void)
{
    og_log("options:");
    for (int i = 0; i < OG_OPT_COUNT; i++) {
        const og_opt_desc_t *d = &opt_desc[i];
        const char *env = getenv(d->env);
        char v[32];
        const char *shown = v;
        if (d->type == OG_OPT_STRING)
            shown = str_slot(i);
        else if (d->type == OG_OPT_PERCENT)
            snprintf(v, sizeof v, "%.2f%%", *num_slot(i) / 100.0);
        else
            snprintf(v, sizeof v, "%lld", *num_slot(i));
        og_log("  %-24s = %-10s %s%s", d->env, shown, d->help, env ? "" : " (default)");
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
