/* See advice_text.h. */
#include "advice_text.h"

#include <stdio.h>
#include <string.h>

const char *const og_cause_ids[OG_CAUSE_COUNT] = {
#define X(name, id, rule, bonus, own1, own2, title) id,
#include "causes.def"
#undef X
};

const char *og_hist_op_name(enum og_hist_op op)
{
    static const char *const names[] = { "?", "alloc", "free", "fail", "pool_grow", "pool_shrink", "?" };
    return (unsigned)op < sizeof names / sizeof *names ? names[op] : "?";
}

bool og_name_next(const char **cursor, const char **name, size_t *len)
{
    const char *p = *cursor;
    if (!p || !*p)
        return false;
    const char *e = strchr(p, ',');
    *name = p;
    *len = e ? (size_t)(e - p) : strlen(p);
    *cursor = e ? e + 1 : p + *len;
    return true;
}

bool og_name_listed(const char *list, const char *name)
{
    size_t len = strlen(name), l;
    const char *cur = list, *p;
    while (len && og_name_next(&cur, &p, &l))
        if (l == len && strncmp(p, name, len) == 0)
            return true;
    return false;
}

void og_cpy(char *dst, size_t n, const char *src, size_t srcn)
{
    size_t l = strnlen(src, srcn);
    if (l >= n)
        l = n - 1;
    memcpy(dst, src, l);
    dst[l] = 0;
}

const char *og_base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

void og_vfmt(char *dst, size_t n, const char *fmt, va_list ap)
{
    if (n)
        vsnprintf(dst, n, fmt, ap);
}

void og_fmt(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    og_vfmt(dst, n, fmt, ap);
    va_end(ap);
}

og_hb_t og_hb(double b)
{
    og_hb_t h;
    og_bytes_fmt(h.s, sizeof h.s, b, OG_BYTES_SHORT);
    return h;
}

og_quarters_t og_quarters(const uint64_t *q)
{
    _Static_assert(OG_QUARTERS == 4, "four quarters");
    og_quarters_t t;
    og_fmt(t.s, sizeof t.s, "%s, %s, %s, %s", og_hb((double)q[0]).s, og_hb((double)q[1]).s, og_hb((double)q[2]).s,
           og_hb((double)q[3]).s);
    return t;
}

og_pc_t og_pct(double part, double whole)
{
    og_pc_t p;
    double v = whole > 0 ? 100.0 * part / whole : -1;
    if (v < 0)
        og_fmt(p.s, sizeof p.s, "n/a");
    else if (v > 0 && v < 1)
        og_fmt(p.s, sizeof p.s, "<1%%");
    else if (v > 9999)
        og_fmt(p.s, sizeof p.s, ">9999%%");
    else
        og_fmt(p.s, sizeof p.s, "%.0f%%", v);
    return p;
}

const char *og_plural(long long n, const char *one, const char *many) { return n == 1 ? one : many; }

og_opt_u64_t og_other_inferred_bytes(const og_record_t *rec)
{
    const og_record_t *r = rec;
    og_opt_u64_t inferred = { 0, false };
    if (og_known(r->memory.other_processes_bytes) || og_known(r->memory.process_used_bytes) ||
        !og_known(r->device.total_bytes) || !og_known(r->device.free_bytes) ||
        !og_known(r->memory.process_tracked_bytes))
        return inferred;
    uint64_t held = sub0(r->device.total_bytes.v, r->device.free_bytes.v);
    uint64_t mine = r->memory.process_tracked_bytes.v + OG_CONTEXT_ALLOWANCE;
    og_set(&inferred, sub0(held, mine));
    return inferred;
}

int og_distinct_alloc_sizes(const og_record_t *rec)
{
    uint64_t seen[64];
    int n = 0, ne = rec->history.events ? rec->history.nevents : 0;
    for (int i = 0; i < ne && n < 64; i++) {
        const struct og_hist_ev *e = &rec->history.events[i];
        if (e->op != OG_OP_ALLOC)
            continue;
        uint64_t k = e->bytes >> 20;
        bool dup = false;
        for (int j = 0; j < n && !dup; j++)
            dup = seen[j] == k;
        if (!dup)
            seen[n++] = k;
    }
    return n;
}
