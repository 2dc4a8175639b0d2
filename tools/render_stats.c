/* tools/render_stats.c — `oomguard stats` printed: the aggregate of tools/stats.c (struct stats) as
 * text, JSON, Prometheus text exposition or one HTML page.  Reads the structure only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "report.h"
#include "stats.h"
#include "util.h"
#include "version.h"

/* Series in the order of their label values (equal ids are equal strings). */
static int rec_cmp_series(const void *pa, const void *pb, void *ctx)
{
    const struct rec *a = pa, *b = pb;
    const struct dim *d = ctx;
    int c;
    if (a->status != b->status && (c = strcmp(d[D_STATUS].v[a->status]->s, d[D_STATUS].v[b->status]->s)))
        return c;
    if (a->cause != b->cause && (c = strcmp(d[D_CAUSE].v[a->cause]->s, d[D_CAUSE].v[b->cause]->s)))
        return c;
    if (a->host != b->host && (c = strcmp(d[D_HOST].v[a->host]->s, d[D_HOST].v[b->host]->s)))
        return c;
    if (a->gpu != b->gpu)
        return strcmp(d[D_GPU].v[a->gpu]->s, d[D_GPU].v[b->gpu]->s);
    return 0;
}

static const char *bucket_label(const struct stats *st, int k, char out[40])
{
    time_t s = (time_t)(st->t0 + k * st->bucket);
    struct tm tm;
    out[0] = '\0';
    if (gmtime_r(&s, &tm))
        strftime(out, 40, st->bucket == 3600 ? "%Y-%m-%d %H:00" : "%Y-%m-%d", &tm);
    return out;
}

static int64_t cls_total(const struct stats *st, int cls)
{
    int64_t n = 0;
    for (int i = 0; i < st->dim[D_STATUS].n; i++)
        n += st->dim[D_STATUS].v[i]->n[cls];
    return n;
}

static double last_failure(const struct stats *st)
{
    double t = NAN;
    for (int i = 0; i < st->dim[D_HOST].n; i++) {
        double x = st->dim[D_HOST].v[i]->last_fail;
        if (!isnan(x) && (isnan(t) || x > t))
            t = x;
    }
    return t;
}

/* ------------------------------------------------------------ text */

struct tx {
    og_sb_t *b;
    int color, top;
    const char *bold, *red, *green, *yellow, *dim, *rst;
};

static void pad_text(og_sb_t *b, const char *s, int width)
{
    sb_text(b, s, (size_t)width, 0);
    for (int w = (int)text_width(s, (size_t)width); w < width; w++)
        og_sb_putc(b, ' ');
}

static void text_bar(og_sb_t *b, int64_t v, int64_t max, int width)
{
    int n = max > 0 ? (int)((double)v / (double)max * width + 0.5) : 0;
    if (v > 0 && n == 0)
        n = 1;
    og_sb_repeat(b, "\u2588", n);
    for (int i = n; i < width; i++)
        og_sb_putc(b, ' ');
}

static void text_group(struct tx *x, const struct stats *st, int dim, const char *title, const char *extra)
{
    const struct dim *d = &st->dim[dim];
    if (!d->n)
        return;
    struct ent **v = og_stats_sorted(d);
    og_sb_printf(x->b, "\n%s%s%s\n", x->bold, title, x->rst);
    og_sb_printf(x->b, "  %s%-40s %7s %9s %7s %7s %7s%s%s\n", x->dim, "", "oom", "recovered", "warning", "exit",
                 "dumps", extra ? extra : "", x->rst);
    int shown = 0;
    for (int i = 0; i < d->n && shown < x->top; i++, shown++) {
        const struct ent *e = v[i];
        og_sb_puts(x->b, "  ");
        pad_text(x->b, e->s, 40);
        og_sb_printf(x->b, " %s%7lld%s %9lld %7lld %7lld %7lld", e->n[C_OOM] ? x->red : "", (long long)e->n[C_OOM],
                     e->n[C_OOM] ? x->rst : "", (long long)e->n[C_RECOVERED], (long long)e->n[C_WARNING],
                     (long long)e->n[C_EXIT], (long long)e->total);
        if (extra)
            og_sb_printf(x->b, " %7lld", (long long)e->distinct);
        og_sb_putc(x->b, '\n');
    }
    if (d->n > shown)
        og_sb_printf(x->b, "  %s… and %d more%s\n", x->dim, d->n - shown, x->rst);
    free(v);
}

int og_stats_render_text(og_sb_t *b, const struct stats *st, int color, int top)
{
    struct tx x = { b, color, top ? top : 10, "", "", "", "", "", "" };
    if (color) {
        x.bold = "\033[1m";
        x.red = "\033[31m";
        x.green = "\033[32m";
        x.yellow = "\033[33m";
        x.dim = "\033[2m";
        x.rst = "\033[0m";
    }
    int64_t oom = cls_total(st, C_OOM);
    og_sb_printf(b, "%soomguard stats%s: %lld dump%s in ", x.bold, x.rst, (long long)st->nrecs,
                 st->nrecs == 1 ? "" : "s");
    for (int i = 0; i < st->ndirs; i++) {
        og_sb_puts(b, i ? ", " : "");
        sb_text(b, st->dirs[i], 200, 0);
    }
    og_sb_printf(b, "; %lld file%s skipped\n", (long long)st->skipped, st->skipped == 1 ? "" : "s");
    og_sb_printf(
        b,
        "  %s%lld out of memory%s (crashed), %s%lld recovered%s (the framework's retry succeeded), %s%lld warning%s%s, "
        "%lld exit summar%s",
        x.red, (long long)oom, x.rst, x.green, (long long)cls_total(st, C_RECOVERED), x.rst, x.yellow,
        (long long)cls_total(st, C_WARNING), cls_total(st, C_WARNING) == 1 ? "" : "s", x.rst,
        (long long)cls_total(st, C_EXIT), cls_total(st, C_EXIT) == 1 ? "y" : "ies");
    if (cls_total(st, C_OTHER))
        og_sb_printf(b, ", %lld other", (long long)cls_total(st, C_OTHER));
    og_sb_printf(b, "\n  %d job%s, %d host%s, %d GPU model%s\n", st->dim[D_JOB].n, st->dim[D_JOB].n == 1 ? "" : "s",
                 st->dim[D_HOST].n, st->dim[D_HOST].n == 1 ? "" : "s", st->dim[D_GPU].n,
                 st->dim[D_GPU].n == 1 ? "" : "s");
    char tm[40];
    double lf = last_failure(st);
    if (!isnan(lf))
        og_sb_printf(b, "  last failure: %s\n", og_format_time(lf, tm));

    /* Causes of real crashes. */
    struct ent **v = og_stats_sorted(&st->dim[D_CAUSE]);
    if (oom) {
        og_sb_printf(b, "\n%sOut-of-memory failures by cause%s\n", x.bold, x.rst);
        int64_t max = v[0]->n[C_OOM];
        for (int i = 0; i < st->dim[D_CAUSE].n && v[i]->n[C_OOM]; i++) {
            og_sb_puts(b, "  ");
            pad_text(b, v[i]->s, 16);
            og_sb_printf(b, " %7lld %5.1f%%  ", (long long)v[i]->n[C_OOM],
                         100.0 * (double)v[i]->n[C_OOM] / (double)oom);
            text_bar(b, v[i]->n[C_OOM], max, 24);
            const char *t = og_cause_title(v[i]->s);
            if (t)
                og_sb_printf(b, "  %s%s%s", x.dim, t, x.rst);
            og_sb_putc(b, '\n');
        }
    }
    int64_t rec = cls_total(st, C_RECOVERED);
    if (rec) {
        og_sb_printf(b, "\n%sRecovered failures by cause%s\n", x.bold, x.rst);
        for (int i = 0; i < st->dim[D_CAUSE].n; i++) {
            if (!v[i]->n[C_RECOVERED])
                continue;
            og_sb_puts(b, "  ");
            pad_text(b, v[i]->s, 16);
            og_sb_printf(b, " %7lld\n", (long long)v[i]->n[C_RECOVERED]);
        }
    }
    free(v);

    v = og_stats_sorted(&st->dim[D_REMEDY]);
    if (st->dim[D_REMEDY].n && v[0]->n[C_OOM]) {
        og_sb_printf(b, "\n%sMost frequent first remedies%s (the top-ranked remedy of each failure)\n", x.bold, x.rst);
        for (int i = 0; i < st->dim[D_REMEDY].n && i < x.top && v[i]->n[C_OOM]; i++) {
            og_sb_puts(b, "  ");
            pad_text(b, v[i]->s, 26);
            og_sb_printf(b, " %7lld  ", (long long)v[i]->n[C_OOM]);
            sb_text(b, v[i]->title ? v[i]->title : "", 90, 0);
            og_sb_putc(b, '\n');
        }
    }
    free(v);

    text_group(&x, st, D_JOB, "By job", "   hosts");
    text_group(&x, st, D_HOST, "By host", "    jobs");
    text_group(&x, st, D_GPU, "By GPU model", NULL);
    text_group(&x, st, D_FW, "By framework", NULL);

    if (st->nbuckets) {
        int64_t max = 0;
        for (int k = 0; k < st->nbuckets; k++) {
            int64_t s = st->buckets[k][C_OOM] + st->buckets[k][C_RECOVERED] + st->buckets[k][C_WARNING];
            if (s > max)
                max = s;
        }
        og_sb_printf(b, "\n%sTrend%s (per %s, UTC; oom / recovered / warning)\n", x.bold, x.rst, st->bucket_name);
        /* Only the last 60 buckets fit a terminal; JSON and HTML have them all. */
        int from = st->nbuckets > 60 ? st->nbuckets - 60 : 0;
        if (from)
            og_sb_printf(b, "  %s(%d earlier %ss not shown)%s\n", x.dim, from, st->bucket_name, x.rst);
        for (int k = from; k < st->nbuckets; k++) {
            char lb[40];
            const int64_t *c = st->buckets[k];
            og_sb_printf(b, "  %-16s %6lld %6lld %6lld  %s", bucket_label(st, k, lb), (long long)c[C_OOM],
                         (long long)c[C_RECOVERED], (long long)c[C_WARNING], x.red);
            int w = 30;
            int a = max ? (int)((double)c[C_OOM] / (double)max * w + 0.5) : 0,
                r = max ? (int)((double)c[C_RECOVERED] / (double)max * w + 0.5) : 0,
                g = max ? (int)((double)c[C_WARNING] / (double)max * w + 0.5) : 0;
            og_sb_repeat(b, "\u2588", a);
            og_sb_printf(b, "%s%s", x.rst, x.green);
            og_sb_repeat(b, "\u2588", r);
            og_sb_printf(b, "%s%s", x.rst, x.yellow);
            og_sb_repeat(b, "\u2588", g);
            og_sb_printf(b, "%s\n", x.rst);
        }
    }
    if (st->undated)
        og_sb_printf(b, "  %s%lld dump%s without a plausible time%s\n", x.dim, (long long)st->undated,
                     st->undated == 1 ? "" : "s", x.rst);

    if (st->skipped) {
        og_sb_printf(b, "\n%sSkipped %lld file%s%s\n", x.bold, (long long)st->skipped, st->skipped == 1 ? "" : "s",
                     x.rst);
        for (int i = 0; i < st->nskipped_msg && i < 20; i++) {
            og_sb_puts(b, "  ");
            sb_text(b, st->skipped_msg[i], 300, 0);
            og_sb_putc(b, '\n');
        }
        if (st->skipped > 20)
            og_sb_printf(b, "  %s… and %lld more (all are listed by --format json, up to %d)%s\n", x.dim,
                         (long long)st->skipped - 20, KEEP_SKIPPED, x.rst);
    }
    return b->failed ? -1 : 0;
}

/* ------------------------------------------------------------ json */

static void json_counts(cJSON *o, const struct ent *e)
{
    cJSON_AddNumberToObject(o, "dumps", (double)e->total);
    for (int c = 0; c < NCLS; c++)
        if (c != C_OTHER || e->n[c])
            cJSON_AddNumberToObject(o, og_stats_cls_key[c], (double)e->n[c]);
}

static void json_time(cJSON *o, const char *k, double t)
{
    if (isnan(t))
        cJSON_AddNullToObject(o, k);
    else
        cJSON_AddNumberToObject(o, k, t);
}

static cJSON *json_group(const struct stats *st, int dim, const char *distinct)
{
    cJSON *o = cJSON_CreateObject();
    struct ent **v = og_stats_sorted(&st->dim[dim]);
    for (int i = 0; i < st->dim[dim].n; i++) {
        cJSON *g = cJSON_CreateObject();
        json_counts(g, v[i]);
        if (distinct)
            cJSON_AddNumberToObject(g, distinct, (double)v[i]->distinct);
        json_time(g, "first_failure", v[i]->first_fail);
        json_time(g, "last_failure", v[i]->last_fail);
        if (v[i]->last_fail_pod)
            cJSON_AddStringToObject(g, "last_failure_pod", v[i]->last_fail_pod);
        cJSON_AddItemToObject(o, v[i]->s, g);
    }
    free(v);
    return o;
}

static cJSON *json_by_cls(const struct stats *st, int dim, int cls)
{
    cJSON *o = cJSON_CreateObject();
    struct ent **v = og_stats_sorted(&st->dim[dim]);
    for (int i = 0; i < st->dim[dim].n; i++)
        if (v[i]->n[cls])
            cJSON_AddNumberToObject(o, v[i]->s, (double)v[i]->n[cls]);
    free(v);
    return o;
}

int og_stats_render_json(og_sb_t *b, const struct stats *st)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "schema", "oomguard.stats/1");
    cJSON_AddStringToObject(o, "generator", "oomguard " OOMGUARD_VERSION);
    cJSON *dirs = cJSON_AddArrayToObject(o, "dirs");
    for (int i = 0; i < st->ndirs; i++) {
        char *s = og_stats_normalise(st->dirs[i]);
        cJSON_AddItemToArray(dirs, cJSON_CreateString(s));
        free(s);
    }
    cJSON_AddNumberToObject(o, "dumps", (double)st->nrecs);
    cJSON_AddNumberToObject(o, "skipped", (double)st->skipped);
    cJSON *bs = cJSON_AddObjectToObject(o, "by_status");
    for (int c = 0; c < C_OTHER; c++)
        cJSON_AddNumberToObject(bs, og_stats_cls_key[c], (double)cls_total(st, c));
    for (int i = 0; i < st->dim[D_STATUS].n; i++) {
        const struct ent *e = st->dim[D_STATUS].v[i];
        if (e->n[C_OTHER])
            cJSON_AddNumberToObject(bs, e->s, (double)e->n[C_OTHER]);
    }
    cJSON_AddItemToObject(o, "by_cause", json_by_cls(st, D_CAUSE, C_OOM));
    cJSON_AddItemToObject(o, "recovered_by_cause", json_by_cls(st, D_CAUSE, C_RECOVERED));
    cJSON_AddItemToObject(o, "by_job", json_group(st, D_JOB, "hosts"));
    cJSON_AddItemToObject(o, "by_host", json_group(st, D_HOST, "jobs"));
    cJSON_AddItemToObject(o, "by_gpu_model", json_group(st, D_GPU, NULL));
    cJSON_AddItemToObject(o, "by_framework", json_group(st, D_FW, NULL));
    cJSON *fr = cJSON_AddArrayToObject(o, "first_remedies");
    struct ent **v = og_stats_sorted(&st->dim[D_REMEDY]);
    for (int i = 0; i < st->dim[D_REMEDY].n; i++) {
        if (!v[i]->n[C_OOM])
            continue;
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "id", v[i]->s);
        if (v[i]->title)
            cJSON_AddStringToObject(r, "title", v[i]->title);
        else
            cJSON_AddNullToObject(r, "title");
        cJSON_AddNumberToObject(r, "failures", (double)v[i]->n[C_OOM]);
        cJSON_AddItemToArray(fr, r);
    }
    free(v);
    json_time(o, "last_failure", last_failure(st));
    cJSON *tr = cJSON_AddObjectToObject(o, "trend");
    if (st->nbuckets) {
        cJSON_AddStringToObject(tr, "bucket", st->bucket_name);
        cJSON_AddNumberToObject(tr, "bucket_seconds", st->bucket);
    } else {
        cJSON_AddNullToObject(tr, "bucket");
        cJSON_AddNullToObject(tr, "bucket_seconds");
    }
    cJSON_AddNumberToObject(tr, "undated", (double)st->undated);
    cJSON *pts = cJSON_AddArrayToObject(tr, "points");
    for (int k = 0; k < st->nbuckets; k++) {
        char lb[40];
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "start", st->t0 + k * st->bucket);
        cJSON_AddStringToObject(p, "label", bucket_label(st, k, lb));
        for (int c = 0; c < NCLS; c++)
            if (c != C_OTHER || st->buckets[k][c])
                cJSON_AddNumberToObject(p, og_stats_cls_key[c], (double)st->buckets[k][c]);
        cJSON_AddItemToArray(pts, p);
    }
    cJSON *sk = cJSON_AddArrayToObject(o, "skipped_files");
    for (int i = 0; i < st->nskipped_msg; i++) {
        char *s = og_stats_normalise(st->skipped_msg[i]);
        cJSON_AddItemToArray(sk, cJSON_CreateString(s));
        free(s);
    }
    cJSON_AddBoolToObject(o, "skipped_files_truncated", st->skipped > st->nskipped_msg);
    char *s = cJSON_Print(o);
    if (s) {
        og_sb_puts(b, s);
        og_sb_putc(b, '\n');
    } else {
        b->failed = 1;
    }
    cJSON_free(s);
    cJSON_Delete(o);
    return b->failed ? -1 : 0;
}

/* ------------------------------------------------------------ prometheus */

static int ent_name_cmp(const void *pa, const void *pb)
{
    return strcmp((*(struct ent *const *)pa)->s, (*(struct ent *const *)pb)->s);
}

static struct ent **by_name(const struct dim *d)
{
    struct ent **v = xmalloc((size_t)(d->n ? d->n : 1) * sizeof *v);
    if (d->n) {
        memcpy(v, d->v, (size_t)d->n * sizeof *v);
        qsort(v, (size_t)d->n, sizeof *v, ent_name_cmp);
    }
    return v;
}

/* Label values: backslash, double quote and line feed are escaped; everything else
 * (valid UTF-8, as interned) passes as is. */
static void prom_label(og_sb_t *b, const char *name, const char *v, int first)
{
    og_sb_printf(b, "%s%s=\"", first ? "" : ",", name);
    for (const char *p = v; *p; p++) {
        if (*p == '\\')
            og_sb_puts(b, "\\\\");
        else if (*p == '"')
            og_sb_puts(b, "\\\"");
        else if (*p == '\n')
            og_sb_puts(b, "\\n");
        else
            og_sb_putc(b, *p);
    }
    og_sb_putc(b, '"');
}

static void prom_family(og_sb_t *b, const char *name, const char *type, const char *help)
{
    og_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

int og_stats_render_prom(og_sb_t *b, struct stats *st)
{
    prom_family(b, "oomguard_dumps_total", "counter",
                "Dumps written by oomguard, by status (oom = the program got the error), diagnosis.primary, host "
                "and GPU model.");
    if (st->nrecs)
        qsort_r(st->recs, st->nrecs, sizeof *st->recs, rec_cmp_series, st->dim);
    for (size_t i = 0; i < st->nrecs;) {
        size_t k = i + 1;
        while (k < st->nrecs && !rec_cmp_series(&st->recs[i], &st->recs[k], st->dim))
            k++;
        const struct rec *r = &st->recs[i];
        og_sb_puts(b, "oomguard_dumps_total{");
        prom_label(b, "status", st->dim[D_STATUS].v[r->status]->s, 1);
        prom_label(b, "cause", st->dim[D_CAUSE].v[r->cause]->s, 0);
        prom_label(b, "host", st->dim[D_HOST].v[r->host]->s, 0);
        prom_label(b, "gpu_model", st->dim[D_GPU].v[r->gpu]->s, 0);
        og_sb_printf(b, "} %zu\n", k - i);
        i = k;
    }
    prom_family(b, "oomguard_last_failure_timestamp_seconds", "gauge",
                "Time of the latest out-of-memory failure (status oom) on the host, in seconds since the Unix epoch.");
    struct ent **hv = by_name(&st->dim[D_HOST]);
    for (int i = 0; i < st->dim[D_HOST].n; i++) {
        const struct ent *e = hv[i];
        if (isnan(e->last_fail))
            continue;
        og_sb_puts(b, "oomguard_last_failure_timestamp_seconds{");
        prom_label(b, "host", e->s, 1);
        og_sb_printf(b, "} %.3f\n", e->last_fail);
    }
    /* one series per node at a time: the pod label does not multiply the counters above */
    prom_family(b, "oomguard_last_failure_pod_info", "gauge",
                "The pod (the dump's host name, where the dump names a node) of the latest out-of-memory failure on "
                "the node; always 1.");
    for (int i = 0; i < st->dim[D_HOST].n; i++) {
        const struct ent *e = hv[i];
        if (isnan(e->last_fail) || !e->last_fail_pod)
            continue;
        og_sb_puts(b, "oomguard_last_failure_pod_info{");
        prom_label(b, "host", e->s, 1);
        prom_label(b, "pod", e->last_fail_pod, 0);
        og_sb_puts(b, "} 1\n");
    }
    free(hv);
    prom_family(b, "oomguard_first_remedy_total", "counter",
                "Out-of-memory failures by the remedy oomguard ranked first.");
    for (int i = 0; i < st->dim[D_REMEDY].n; i++) {
        const struct ent *e = st->dim[D_REMEDY].v[i];
        if (!e->n[C_OOM])
            continue;
        og_sb_puts(b, "oomguard_first_remedy_total{");
        prom_label(b, "remedy", e->s, 1);
        og_sb_printf(b, "} %lld\n", (long long)e->n[C_OOM]);
    }
    prom_family(b, "oomguard_stats_dumps", "gauge", "Dump files read by the last oomguard stats run.");
    og_sb_printf(b, "oomguard_stats_dumps %zu\n", st->nrecs);
    prom_family(b, "oomguard_stats_skipped_files", "gauge",
                "Files named like dumps that the last oomguard stats run could not read.");
    og_sb_printf(b, "oomguard_stats_skipped_files %lld\n", (long long)st->skipped);
    return b->failed ? -1 : 0;
}

/* ------------------------------------------------------------ html */

static const char *const CLS_COLOR[NCLS] = { "#d93636", "#1f9d55", "#c98a00", "#3366cc", "#b9c0ca" };

static void html_kpi(og_sb_t *b, const char *cls, const char *k, int64_t v, const char *x)
{
    char g[32];
    og_sb_printf(b, "<div class=\"kpi %s\"><div class=\"k\">%s</div><div class=\"v\">%s</div>", cls, k,
                 group_digits(v, g));
    if (x)
        og_sb_printf(b, "<div class=\"x\">%s</div>", x);
    og_sb_puts(b, "</div>");
}

/* Horizontal stacked bars (oom, recovered, warning, exit) for the top entries of a dimension. */
static void html_bars(og_sb_t *b, const struct stats *st, int dim, const char *title, const char *id, int top,
                      int oom_only)
{
    const struct dim *d = &st->dim[dim];
    struct ent **v = og_stats_sorted(d);
    int n = 0;
    int64_t max = 0;
    for (int i = 0; i < d->n && n < top; i++) {
        if (oom_only && !v[i]->n[C_OOM])
            break;
        int64_t s = oom_only ? v[i]->n[C_OOM] : v[i]->total;
        if (s > max)
            max = s;
        n++;
    }
    if (!n) {
        free(v);
        return;
    }
    /* Causes carry their title after the bar: a shorter bar leaves it room. */
    const int row = 26, lw = oom_only ? 170 : 300, bw = oom_only ? 330 : 560, W = 1000;
    og_sb_printf(b,
                 "<section class=\"card\"><h2>%s</h2><svg viewBox=\"0 0 %d %d\" role=\"img\" id=\"%s\" aria-label=\"",
                 title, W, n * row + 8, id);
    sb_html(b, title, 100, 0);
    og_sb_puts(b, "\">");
    for (int i = 0; i < n; i++) {
        const struct ent *e = v[i];
        int y = 4 + i * row;
        og_sb_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"13\" fill=\"#1d2330\">", lw - 10,
                     y + 17);
        sb_html(b, e->s, 40, 0);
        og_sb_puts(b, "<title>");
        sb_html(b, e->s, 300, 0);
        og_sb_puts(b, "</title></text>");
        double x = lw;
        for (int c = 0; c < NCLS; c++) {
            if (oom_only && c != C_OOM)
                continue;
            if (!e->n[c])
                continue;
            double w = max ? (double)e->n[c] / (double)max * bw : 0;
            og_sb_printf(b,
                         "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"18\" rx=\"3\" fill=\"%s\"><title>%lld "
                         "%s</title></rect>",
                         x, y + 3, w < 1 ? 1 : w, CLS_COLOR[c], (long long)e->n[c], og_stats_cls_key[c]);
            x += w;
        }
        char g[32];
        og_sb_printf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" fill=\"#5f6b7a\">%s", x + 8, y + 17,
                     group_digits(oom_only ? e->n[C_OOM] : e->total, g));
        if (!oom_only)
            og_sb_printf(b, " (%lld oom)", (long long)e->n[C_OOM]);
        else if (dim == D_CAUSE && og_cause_title(e->s))
            og_sb_printf(b, " \u2014 %s", og_cause_title(e->s));
        og_sb_puts(b, "</text>");
    }
    og_sb_puts(b, "</svg>");
    if (!oom_only) {
        og_sb_puts(b, "<div class=\"legend\">");
        for (int c = 0; c < C_OTHER; c++)
            og_sb_printf(b, "<div><span class=\"sw\" style=\"background:%s\"></span>%s</div>", CLS_COLOR[c],
                         c == C_OOM    ? "out of memory"
                         : c == C_EXIT ? "exit summary"
                                       : og_stats_cls_key[c]);
        og_sb_puts(b, "</div>");
    }
    if (d->n > n && !oom_only)
        og_sb_printf(b, "<p class=\"muted\">%d more not drawn (all are in --format json)</p>", d->n - n);
    og_sb_puts(b, "</section>\n");
    free(v);
}

static void html_table(og_sb_t *b, const struct stats *st, int dim, const char *title, const char *distinct, int top)
{
    const struct dim *d = &st->dim[dim];
    if (!d->n)
        return;
    struct ent **v = og_stats_sorted(d);
    char tm[40];
    og_sb_printf(b,
                 "<section class=\"card\"><h2>%s</h2><table><thead><tr><th>name</th><th class=\"num\">oom</th>"
                 "<th class=\"num\">recovered</th><th class=\"num\">warning</th><th class=\"num\">exit</th>"
                 "<th class=\"num\">dumps</th>%s%s%s<th>last failure</th></tr></thead><tbody>",
                 title, distinct ? "<th class=\"num\">" : "", distinct ? distinct : "", distinct ? "</th>" : "");
    for (int i = 0; i < d->n && i < top; i++) {
        const struct ent *e = v[i];
        og_sb_puts(b, "<tr><td class=\"mono\">");
        sb_html(b, e->s, 120, 0);
        og_sb_printf(b,
                     "</td><td class=\"num\">%lld</td><td class=\"num\">%lld</td><td class=\"num\">%lld</td>"
                     "<td class=\"num\">%lld</td><td class=\"num\">%lld</td>",
                     (long long)e->n[C_OOM], (long long)e->n[C_RECOVERED], (long long)e->n[C_WARNING],
                     (long long)e->n[C_EXIT], (long long)e->total);
        if (distinct)
            og_sb_printf(b, "<td class=\"num\">%lld</td>", (long long)e->distinct);
        og_sb_printf(b, "<td>%s</td></tr>", isnan(e->last_fail) ? "" : og_format_time(e->last_fail, tm));
    }
    og_sb_puts(b, "</tbody></table>");
    if (d->n > top)
        og_sb_printf(b, "<p class=\"muted\">%d more (all are in --format json)</p>", d->n - top);
    og_sb_puts(b, "</section>\n");
    free(v);
}

static void html_trend(og_sb_t *b, const struct stats *st)
{
    if (!st->nbuckets)
        return;
    int64_t max = 0;
    for (int k = 0; k < st->nbuckets; k++) {
        int64_t s = st->buckets[k][C_OOM] + st->buckets[k][C_RECOVERED] + st->buckets[k][C_WARNING];
        if (s > max)
            max = s;
    }
    const double L = 60, R = 985, T = 12, H = 230;
    double bw = (R - L) / st->nbuckets;
    og_sb_printf(b,
                 "<section class=\"card\"><h2>Trend <span class=\"muted\" style=\"font-weight:400\">per %s (UTC): "
                 "out of memory, recovered, warnings</span></h2>"
                 "<svg viewBox=\"0 0 1000 290\" role=\"img\" aria-label=\"failures over time\" id=\"trend\">",
                 st->bucket_name);
    for (int g = 0; g <= 4; g++) {
        double y = T + H - H * g / 4.0;
        og_sb_printf(b,
                     "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e7ee\"/>"
                     "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\" fill=\"#5f6b7a\">%.0f</text>",
                     L, R, y, y, L - 6, y + 4, max * g / 4.0);
    }
    static const int order[] = { C_OOM, C_RECOVERED, C_WARNING };
    for (int k = 0; k < st->nbuckets; k++) {
        double y = T + H;
        char lb[40];
        for (int j = 0; j < 3; j++) {
            int64_t c = st->buckets[k][order[j]];
            if (!c)
                continue;
            double h = max ? (double)c / (double)max * H : 0;
            y -= h;
            og_sb_printf(b,
                         "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"><title>%s: %lld "
                         "%s</title></rect>",
                         L + k * bw + bw * 0.1, y, bw * 0.8 > 0.5 ? bw * 0.8 : 0.5, h, CLS_COLOR[order[j]],
                         bucket_label(st, k, lb), (long long)c, og_stats_cls_key[order[j]]);
        }
    }
    /* About eight date labels along the axis. */
    int step = st->nbuckets / 8 + 1;
    for (int k = 0; k < st->nbuckets; k += step) {
        char lb[40];
        og_sb_printf(b,
                     "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#5f6b7a\">%s</text>",
                     L + (k + 0.5) * bw, T + H + 18, bucket_label(st, k, lb));
    }
    og_sb_puts(b, "</svg><div class=\"legend\">");
    for (int j = 0; j < 3; j++)
        og_sb_printf(b, "<div><span class=\"sw\" style=\"background:%s\"></span>%s<span class=\"n\">%lld</span></div>",
                     CLS_COLOR[order[j]],
                     order[j] == C_OOM         ? "out of memory"
                     : order[j] == C_RECOVERED ? "recovered"
                                               : "warning",
                     (long long)cls_total(st, order[j]));
    og_sb_puts(b, "</div>");
    if (st->undated)
        og_sb_printf(b, "<p class=\"muted\">%lld dump%s without a plausible time are not drawn.</p>",
                     (long long)st->undated, st->undated == 1 ? "" : "s");
    og_sb_puts(b, "</section>\n");
}

int og_stats_render_html(og_sb_t *b, const struct stats *st, int top)
{
    top = top ? top : 20;
    og_html_begin(b, "oomguard stats");
    int64_t oom = cls_total(st, C_OOM);
    og_sb_printf(b, "<header class=\"top %s\"><span class=\"badge\">fleet statistics</span><h1>", oom ? "oom" : "exit");
    char g[32], tm[40];
    og_sb_printf(b, "%s out-of-memory failure%s in %s dump%s</h1><p class=\"sub\">", group_digits(oom, g),
                 oom == 1 ? "" : "s", group_digits((int64_t)st->nrecs, tm), st->nrecs == 1 ? "" : "s");
    for (int i = 0; i < st->ndirs; i++) {
        og_sb_puts(b, i ? " \u00b7 " : "");
        sb_html(b, st->dirs[i], 200, 0);
    }
    double lf = last_failure(st);
    if (!isnan(lf))
        og_sb_printf(b, " \u00b7 last failure %s", og_format_time(lf, tm));
    og_sb_puts(b, "</p></header>\n<main>\n<div class=\"kpis\">");
    html_kpi(b, "bad", "Out of memory", oom, "the program got the error");
    html_kpi(b, "good", "Recovered", cls_total(st, C_RECOVERED), "the framework's retry succeeded");
    html_kpi(b, "", "Warnings", cls_total(st, C_WARNING), "OOMGUARD_WARN_AT crossed");
    html_kpi(b, "", "Exit summaries", cls_total(st, C_EXIT), NULL);
    html_kpi(b, "", "Jobs", st->dim[D_JOB].n, NULL);
    html_kpi(b, "", "Hosts", st->dim[D_HOST].n, NULL);
    html_kpi(b, st->skipped ? "bad" : "", "Skipped files", st->skipped, "unreadable or not a dump");
    og_sb_puts(b, "</div>\n");
    html_trend(b, st);
    html_bars(b, st, D_CAUSE, "Out-of-memory failures by cause", "causes", top, 1);

    struct ent **v = og_stats_sorted(&st->dim[D_REMEDY]);
    if (st->dim[D_REMEDY].n && v[0]->n[C_OOM]) {
        og_sb_puts(b, "<section class=\"card\"><h2>Most frequent first remedies</h2><table><thead><tr><th>remedy</th>"
                      "<th></th><th class=\"num\">failures</th></tr></thead><tbody>");
        for (int i = 0; i < st->dim[D_REMEDY].n && i < top && v[i]->n[C_OOM]; i++) {
            og_sb_puts(b, "<tr><td class=\"mono\">");
            sb_html(b, v[i]->s, 60, 0);
            og_sb_puts(b, "</td><td>");
            sb_html(b, v[i]->title ? v[i]->title : "", 160, 0);
            og_sb_printf(b, "</td><td class=\"num\">%lld</td></tr>", (long long)v[i]->n[C_OOM]);
        }
        og_sb_puts(b, "</tbody></table></section>\n");
    }
    free(v);
    html_bars(b, st, D_HOST, "By host", "hosts", top, 0);
    html_bars(b, st, D_GPU, "By GPU model", "gpus", top, 0);
    html_bars(b, st, D_FW, "By framework", "frameworks", top, 0);
    html_table(b, st, D_JOB, "By job", "hosts", top);
    html_table(b, st, D_HOST, "Hosts", "jobs", top);
    if (st->skipped) {
        og_sb_printf(b, "<section class=\"card\"><h2>Skipped %lld file%s</h2><ul>", (long long)st->skipped,
                     st->skipped == 1 ? "" : "s");
        for (int i = 0; i < st->nskipped_msg && i < 100; i++) {
            og_sb_puts(b, "<li class=\"mono\">");
            sb_html(b, st->skipped_msg[i], 400, 0);
            og_sb_puts(b, "</li>");
        }
        og_sb_puts(b, "</ul></section>\n");
    }
    og_sb_puts(b, "</main>\n");
    og_html_end(b);
    return b->failed ? -1 : 0;
}
