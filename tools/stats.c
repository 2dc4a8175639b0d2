/* tools/stats.c — `oomguard stats DIR...`: every dump under some directories,
 * counted by status, cause, job, host, GPU model, framework and first remedy,
 * with a trend over time; text, JSON, one HTML page, or Prometheus text.
 *
 * A fleet can hold hundreds of thousands of dumps, so nothing of a dump is kept
 * once it is counted: each file is read, validated by the dump reader, reduced
 * to one small record of interned ids, and freed. */
#include <stdio.h>

#include "cli.h"
#include "dump.h"
#include "report.h"
#include "util.h"
#include "version.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <uthash.h>

#define MAX_DEPTH         64 /* directory levels below an argument */
#define MAX_PATH          4096
#define MAX_VALUE_BYTES   200                /* interned strings are cut here (at a UTF-8 boundary) */
#define READ_WHOLE_MAX    ((size_t)64 << 20) /* bigger files are streamed by the reader */
#define KEEP_SKIPPED      1000               /* skipped files listed by name (all are counted) */
#define MAX_TREND_BUCKETS 400

/* Status classes: real crashes (oom) are kept apart from the rest. */
enum { C_OOM, C_RECOVERED, C_WARNING, C_EXIT, C_OTHER, NCLS };
static const char *const CLS_KEY[NCLS] = { "oom", "recovered", "warning", "exit", "other" };

/* Grouping dimensions. */
enum { D_STATUS, D_CAUSE, D_HOST, D_JOB, D_GPU, D_FW, D_REMEDY, NDIM };

struct ent {
    UT_hash_handle hh;
    char *s;     /* valid UTF-8, at most MAX_VALUE_BYTES */
    char *title; /* remedies: the first title seen */
    int id;
    int64_t n[NCLS], total;
    double first_fail, last_fail; /* status oom; NAN when none */
    char *last_fail_pod;          /* hosts: the pod (dump's host name) of the latest failure on the node */
    int64_t distinct;             /* jobs: hosts; hosts: jobs (filled in by finish()) */
};

struct dim {
    struct ent *hash;
    struct ent **v;
    int n, cap;
};

struct rec {
    double t; /* NAN when not a plausible time */
    int cls, status, cause, host, job, gpu;
};

struct stats {
    struct dim dim[NDIM];
    struct rec *recs;
    size_t nrecs, caprecs;
    int64_t skipped;
    char **skipped_msg;
    int nskipped_msg;
    const char **dirs;
    int ndirs;
    char *readbuf;
    size_t readcap;
    /* trend */
    double t0, t1;
    int64_t undated;
    double bucket;
    const char *bucket_name;
    int nbuckets;
    int64_t (*buckets)[NCLS];
};

/* ------------------------------------------------------------ interning */

/* Valid UTF-8, cut at MAX_VALUE_BYTES without splitting a character.  Interning the
 * normalised form keeps JSON keys and Prometheus series unique after escaping. */
static char *normalise(const char *s)
{
    og_sb_t b;
    og_sb_init(&b);
    sb_utf8(&b, s);
    if (b.failed || !b.buf)
        return xstrdup("");
    if (b.len > MAX_VALUE_BYTES) {
        size_t cut = MAX_VALUE_BYTES;
        while (cut > 0 && ((unsigned char)b.buf[cut] & 0xC0) == 0x80)
            cut--;
        b.buf[cut] = '\0';
    }
    return b.buf;
}

static struct ent *intern(struct dim *d, const char *raw, const char *missing)
{
    char *s = normalise(raw && *raw ? raw : missing);
    struct ent *e;
    HASH_FIND_STR(d->hash, s, e);
    if (e) {
        free(s);
        return e;
    }
    e = xmalloc(sizeof *e);
    memset(e, 0, sizeof *e);
    e->s = s;
    e->first_fail = e->last_fail = NAN;
    e->id = d->n;
    if (d->n == d->cap)
        d->v = xrealloc(d->v, (size_t)(d->cap = d->cap ? d->cap * 2 : 16) * sizeof *d->v);
    d->v[d->n++] = e;
    HASH_ADD_KEYPTR(hh, d->hash, e->s, strlen(e->s), e);
    return e;
}

static void count(struct ent *e, int cls, double t)
{
    e->n[cls]++;
    e->total++;
    if (cls == C_OOM && !isnan(t)) {
        if (isnan(e->first_fail) || t < e->first_fail)
            e->first_fail = t;
        if (isnan(e->last_fail) || t > e->last_fail)
            e->last_fail = t;
    }
}

/* ------------------------------------------------------------ loading */

static int plausible_time(double t) { return isfinite(t) && t >= 946684800.0 && t <= 32503680000.0; }

static int cls_of(const struct og_dump *d)
{
    switch (d->status) {
    case OG_ST_OOM:
        return C_OOM;
    case OG_ST_RECOVERED:
        return C_RECOVERED;
    case OG_ST_WARNING:
        return C_WARNING;
    case OG_ST_EXIT:
        return C_EXIT;
    default:
        return C_OTHER;
    }
}

/* The remedy ranked first (rank 1, else the lowest rank, else the first listed). */
static const struct og_remedy *first_remedy(const struct og_dump *d)
{
    const struct og_remedy *best = NULL;
    for (int i = 0; i < d->nremedies; i++) {
        const struct og_remedy *r = &d->remedies[i];
        if (!r->id)
            continue;
        if (!best || (r->rank >= 0 && (best->rank < 0 || r->rank < best->rank)))
            best = r;
    }
    return best;
}

/* A remedy's id.  Dumps written before "non_framework_memory" had an id of its own named it
 * "foreign_processes" (with its own title): they count as what they were. */
static const char *remedy_id(const struct og_remedy *r)
{
    static const char old_title[] = "Find the memory held outside the framework";
    if (r->id && strcmp(r->id, "foreign_processes") == 0 && r->title &&
        strncmp(r->title, old_title, sizeof old_title - 1) == 0)
        return "non_framework_memory";
    return r->id;
}

static void add_dump(struct stats *st, const struct og_dump *d)
{
    int cls = cls_of(d);
    double t = (cls == C_OOM || cls == C_RECOVERED) && d->event.present && isfinite(d->event.t) ? d->event.t : d->time;
    if (!plausible_time(t))
        t = NAN;
    struct ent *e[NDIM] = { 0 };
    e[D_STATUS] = intern(&st->dim[D_STATUS], d->status_str, "unknown");
    e[D_CAUSE] = intern(&st->dim[D_CAUSE], d->diag.present ? d->diag.primary : NULL, "none");
    /* a node, not a pod: pods come and go (one Prometheus series each), nodes stay */
    const char *node = d->node && *d->node ? d->node : NULL;
    e[D_HOST] = intern(&st->dim[D_HOST], node ? node : d->host, "unknown");
    double host_last = e[D_HOST]->last_fail;
    e[D_JOB] = intern(&st->dim[D_JOB], d->job_id, "none");
    e[D_GPU] = intern(&st->dim[D_GPU], d->device.present ? d->device.name : NULL, "unknown");
    e[D_FW] = intern(&st->dim[D_FW], d->framework_name, "unknown");
    const struct og_remedy *r = first_remedy(d);
    if (r) {
        e[D_REMEDY] = intern(&st->dim[D_REMEDY], remedy_id(r), "unknown");
        if (!e[D_REMEDY]->title && r->title)
            e[D_REMEDY]->title = normalise(r->title);
    }
    for (int i = 0; i < NDIM; i++)
        if (e[i])
            count(e[i], cls, t);
    struct ent *h = e[D_HOST];
    if (node && d->host && *d->host && strcmp(node, d->host) != 0 && cls == C_OOM && !isnan(t) && h->last_fail == t) {
        char *pod = normalise(d->host);
        /* the newest failure's pod; at equal times the greatest name, whatever the reading order */
        if (!h->last_fail_pod || t > host_last || strcmp(pod, h->last_fail_pod) > 0) {
            free(h->last_fail_pod);
            h->last_fail_pod = pod;
        } else {
            free(pod);
        }
    }
    if (st->nrecs == st->caprecs)
        st->recs = xrealloc(st->recs, (st->caprecs = st->caprecs ? st->caprecs * 2 : 1024) * sizeof *st->recs);
    st->recs[st->nrecs++] =
        (struct rec){ t, cls, e[D_STATUS]->id, e[D_CAUSE]->id, e[D_HOST]->id, e[D_JOB]->id, e[D_GPU]->id };
}

static void skip(struct stats *st, const char *msg)
{
    st->skipped++;
    if (st->nskipped_msg < KEEP_SKIPPED) {
        if (!st->nskipped_msg)
            st->skipped_msg = xmalloc(KEEP_SKIPPED * sizeof *st->skipped_msg);
        st->skipped_msg[st->nskipped_msg++] = xstrdup(msg);
    }
}

static void skipf(struct stats *st, const char *path, const char *why)
{
    char m[OG_ERR_MAX];
    snprintf(m, sizeof m, "%s: %s", path, why);
    skip(st, m);
}

static const struct og_load_opts LOAD_OPTS = { .keep_all = 0, .keep_sites = 1, .no_history = 1 };

/* Opens without blocking (a FIFO or device named like a dump must not hang the
 * walk) and loads only regular files.  Files up to READ_WHOLE_MAX are read in one
 * go; bigger ones are streamed by the reader through this same descriptor. */
static void load_one(struct stats *st, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0) {
        skipf(st, path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    if (!S_ISREG(sb.st_mode)) {
        skipf(st, path, "not a regular file");
        close(fd);
        return;
    }
    struct og_err err;
    struct og_dump *d = NULL;
    if ((uint64_t)sb.st_size <= READ_WHOLE_MAX) {
        size_t want = (size_t)sb.st_size, len = 0;
        int rerr = 0;
        if (st->readcap < want + 1) {
            free(st->readbuf);
            st->readcap = want + 1 > 65536 ? want + 1 : 65536;
            st->readbuf = xmalloc(st->readcap);
        }
        /* The file may grow while it is read: what fits is read, and a dump cut short
         * is reported as truncated by the reader. */
        while (len < want) {
            ssize_t k = read(fd, st->readbuf + len, want - len);
            if (k < 0 && (errno == EINTR || errno == EAGAIN))
                continue;
            if (k < 0)
                rerr = errno;
            if (k <= 0)
                break;
            len += (size_t)k;
        }
        close(fd);
        if (rerr) {
            skipf(st, path, strerror(rerr));
            return;
        }
        d = og_dump_load_mem(st->readbuf, len, path, &LOAD_OPTS, &err);
    } else {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        d = og_dump_load_file(proc, &LOAD_OPTS, &err);
        close(fd);
        if (!d) {
            /* The reader named the /proc path: name the file instead. */
            size_t pl = strlen(proc);
            const char *why =
                !strncmp(err.msg, proc, pl) && !strncmp(err.msg + pl, ": ", 2) ? err.msg + pl + 2 : err.msg;
            skipf(st, path, why);
            return;
        }
    }
    if (!d) {
        skip(st, err.msg);
        return;
    }
    add_dump(st, d);
    og_dump_free(d);
}

static int is_dump_name(const char *n)
{
    size_t l = strlen(n);
    return l > 14 && !strncmp(n, "oomguard-", 9) && !strcmp(n + l - 5, ".json");
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Recursive, in name order (the output does not depend on readdir's order).
 * Symbolic links to directories are not followed (no loops); links to files are. */
static void walk(struct stats *st, char *path, size_t plen, int depth)
{
    DIR *dp = opendir(path);
    if (!dp) {
        skipf(st, path, strerror(errno));
        return;
    }
    char **names = NULL;
    unsigned char *types = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        const char *nm = de->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, ".."))
            continue;
        if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN && !is_dump_name(nm))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            names = xrealloc(names, cap * sizeof *names);
            types = xrealloc(types, cap);
        }
        names[n] = xstrdup(nm);
        types[n++] = de->d_type;
    }
    closedir(dp);
    /* Sort names and their types together: sort indices by name. */
    char **sorted = xmalloc((n ? n : 1) * sizeof *sorted);
    for (size_t i = 0; i < n; i++) {
        /* A type byte rides after the name's terminating NUL. */
        size_t l = strlen(names[i]);
        sorted[i] = xrealloc(names[i], l + 2);
        sorted[i][l + 1] = (char)types[i];
    }
    free(names);
    free(types);
    if (n)
        qsort(sorted, n, sizeof *sorted, name_cmp);
    for (size_t i = 0; i < n; i++) {
        char *nm = sorted[i];
        size_t l = strlen(nm);
        unsigned char type = (unsigned char)nm[l + 1];
        if (plen + 1 + l >= MAX_PATH) {
            path[plen] = '\0';
            skipf(st, path, "path too long below this directory");
            free(nm);
            continue;
        }
        path[plen] = '/';
        memcpy(path + plen + 1, nm, l + 1);
        if (type == DT_UNKNOWN) {
            struct stat sb;
            type = lstat(path, &sb) < 0 ? DT_REG : S_ISDIR(sb.st_mode) ? DT_DIR : S_ISLNK(sb.st_mode) ? DT_LNK : DT_REG;
        }
        if (type == DT_DIR) {
            if (depth >= MAX_DEPTH)
                skipf(st, path, "directory nested too deep (not read)");
            else
                walk(st, path, plen + 1 + l, depth + 1);
        } else if (is_dump_name(nm)) {
            if (type == DT_LNK) {
                struct stat sb;
                if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                    free(nm);
                    continue; /* a link to a directory */
                }
            }
            load_one(st, path);
        }
        free(nm);
    }
    path[plen] = '\0';
    free(sorted);
}

/* ------------------------------------------------------------ analysis */

static int ent_cmp(const void *pa, const void *pb)
{
    const struct ent *a = *(struct ent *const *)pa, *b = *(struct ent *const *)pb;
    if (a->n[C_OOM] != b->n[C_OOM])
        return a->n[C_OOM] > b->n[C_OOM] ? -1 : 1;
    if (a->total != b->total)
        return a->total > b->total ? -1 : 1;
    return strcmp(a->s, b->s);
}

/* Entries of a dimension in display order (a sorted copy: ids stay valid). */
static struct ent **sorted(const struct dim *d)
{
    struct ent **v = xmalloc((size_t)(d->n ? d->n : 1) * sizeof *v);
    if (d->n) {
        memcpy(v, d->v, (size_t)d->n * sizeof *v);
        qsort(v, (size_t)d->n, sizeof *v, ent_cmp);
    }
    return v;
}

static int rec_cmp_job_host(const void *pa, const void *pb)
{
    const struct rec *a = pa, *b = pb;
    if (a->job != b->job)
        return a->job < b->job ? -1 : 1;
    return a->host < b->host ? -1 : a->host > b->host;
}

static int rec_cmp_host_job(const void *pa, const void *pb)
{
    const struct rec *a = pa, *b = pb;
    if (a->host != b->host)
        return a->host < b->host ? -1 : 1;
    return a->job < b->job ? -1 : a->job > b->job;
}

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

static void finish(struct stats *st)
{
    /* Distinct hosts per job and jobs per host. */
    if (st->nrecs) {
        qsort(st->recs, st->nrecs, sizeof *st->recs, rec_cmp_job_host);
        for (size_t i = 0; i < st->nrecs; i++)
            if (!i || st->recs[i].job != st->recs[i - 1].job || st->recs[i].host != st->recs[i - 1].host)
                st->dim[D_JOB].v[st->recs[i].job]->distinct++;
        qsort(st->recs, st->nrecs, sizeof *st->recs, rec_cmp_host_job);
        for (size_t i = 0; i < st->nrecs; i++)
            if (!i || st->recs[i].host != st->recs[i - 1].host || st->recs[i].job != st->recs[i - 1].job)
                st->dim[D_HOST].v[st->recs[i].host]->distinct++;
    }

    /* Trend: hours for up to two days, days up to 120 days, then weeks (or longer,
     * so that there are at most MAX_TREND_BUCKETS bars). */
    st->t0 = INFINITY;
    st->t1 = -INFINITY;
    for (size_t i = 0; i < st->nrecs; i++) {
        double t = st->recs[i].t;
        if (isnan(t)) {
            st->undated++;
            continue;
        }
        if (t < st->t0)
            st->t0 = t;
        if (t > st->t1)
            st->t1 = t;
    }
    if (st->t0 > st->t1)
        return;
    double span = st->t1 - st->t0, origin = 0;
    if (span <= 2 * 86400.0) {
        st->bucket = 3600;
        st->bucket_name = "hour";
    } else if (span <= 120 * 86400.0) {
        st->bucket = 86400;
        st->bucket_name = "day";
    } else {
        st->bucket = 7 * 86400.0;
        st->bucket_name = "week";
        origin = 4 * 86400.0; /* 1970-01-05 was a Monday */
        double weeks = span / st->bucket;
        if (weeks > MAX_TREND_BUCKETS - 2) {
            st->bucket *= ceil(weeks / (MAX_TREND_BUCKETS - 2));
            st->bucket_name = "period";
        }
    }
    double first = origin + floor((st->t0 - origin) / st->bucket) * st->bucket;
    st->t0 = first;
    st->nbuckets = (int)floor((st->t1 - first) / st->bucket) + 1;
    st->buckets = xmalloc((size_t)st->nbuckets * sizeof *st->buckets);
    memset(st->buckets, 0, (size_t)st->nbuckets * sizeof *st->buckets);
    for (size_t i = 0; i < st->nrecs; i++) {
        if (isnan(st->recs[i].t))
            continue;
        int k = (int)floor((st->recs[i].t - first) / st->bucket);
        if (k < 0)
            k = 0;
        if (k >= st->nbuckets)
            k = st->nbuckets - 1;
        st->buckets[k][st->recs[i].cls]++;
    }
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
    struct ent **v = sorted(d);
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

static void render_text(og_sb_t *b, const struct stats *st, int color, int top)
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
    struct ent **v = sorted(&st->dim[D_CAUSE]);
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

    v = sorted(&st->dim[D_REMEDY]);
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
}

/* ------------------------------------------------------------ json */

static void json_counts(cJSON *o, const struct ent *e)
{
    cJSON_AddNumberToObject(o, "dumps", (double)e->total);
    for (int c = 0; c < NCLS; c++)
        if (c != C_OTHER || e->n[c])
            cJSON_AddNumberToObject(o, CLS_KEY[c], (double)e->n[c]);
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
    struct ent **v = sorted(&st->dim[dim]);
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
    struct ent **v = sorted(&st->dim[dim]);
    for (int i = 0; i < st->dim[dim].n; i++)
        if (v[i]->n[cls])
            cJSON_AddNumberToObject(o, v[i]->s, (double)v[i]->n[cls]);
    free(v);
    return o;
}

static int render_json(og_sb_t *b, const struct stats *st)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "schema", "oomguard.stats/1");
    cJSON_AddStringToObject(o, "generator", "oomguard " OOMGUARD_VERSION);
    cJSON *dirs = cJSON_AddArrayToObject(o, "dirs");
    for (int i = 0; i < st->ndirs; i++) {
        char *s = normalise(st->dirs[i]);
        cJSON_AddItemToArray(dirs, cJSON_CreateString(s));
        free(s);
    }
    cJSON_AddNumberToObject(o, "dumps", (double)st->nrecs);
    cJSON_AddNumberToObject(o, "skipped", (double)st->skipped);
    cJSON *bs = cJSON_AddObjectToObject(o, "by_status");
    for (int c = 0; c < C_OTHER; c++)
        cJSON_AddNumberToObject(bs, CLS_KEY[c], (double)cls_total(st, c));
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
    struct ent **v = sorted(&st->dim[D_REMEDY]);
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
                cJSON_AddNumberToObject(p, CLS_KEY[c], (double)st->buckets[k][c]);
        cJSON_AddItemToArray(pts, p);
    }
    cJSON *sk = cJSON_AddArrayToObject(o, "skipped_files");
    for (int i = 0; i < st->nskipped_msg; i++) {
        char *s = normalise(st->skipped_msg[i]);
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

static int render_prom(og_sb_t *b, struct stats *st)
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
    struct ent **v = sorted(d);
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
                         x, y + 3, w < 1 ? 1 : w, CLS_COLOR[c], (long long)e->n[c], CLS_KEY[c]);
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
                                       : CLS_KEY[c]);
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
    struct ent **v = sorted(d);
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
                         bucket_label(st, k, lb), (long long)c, CLS_KEY[order[j]]);
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

static int render_html(og_sb_t *b, const struct stats *st, int top)
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

    struct ent **v = sorted(&st->dim[D_REMEDY]);
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

/* ------------------------------------------------------------ command */

void og_usage_stats(FILE *f)
{
    fputs("usage: oomguard stats DIR... [--format text|json|html|prometheus] [-o FILE]\n"
          "\n"
          "Read every oomguard-*.json under the directories (recursively; a DIR may also\n"
          "be a single dump) and count the dumps by status, cause, job, host, GPU model,\n"
          "framework and first remedy, with a trend over time.  Out-of-memory failures\n"
          "(status oom) are counted apart from recovered failures, warnings and exit\n"
          "summaries.  Files that cannot be read are counted as skipped.\n"
          "\n"
          "options:\n"
          "  -f, --format FMT   text (default), json, html (one self-contained page),\n"
          "                     prometheus (text exposition format, for node_exporter's\n"
          "                     textfile collector)\n"
          "  -o, --output FILE  write FILE atomically (temporary file + rename)\n"
          "  --top N            rows per table (text 10, html 20)\n"
          "  --color WHEN       auto (default), always, never\n"
          "  -h, --help         show this help\n"
          "\n"
          "exit status: 0 ok (also when no dump was found), 1 usage error, 2 a DIR cannot\n"
          "be read, 3 output error\n",
          f);
}

/* Temporary file in the same directory, then rename: a collector never reads half a file. */
static int write_atomic(const og_sb_t *b, const char *path)
{
    if (!path)
        return write_all(STDOUT_FILENO, b, "standard output");
    size_t pl = strlen(path);
    char *tmp = xmalloc(pl + 16);
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    /* A dot name: node_exporter reads only *.prom, and ls hides it. */
    snprintf(tmp, pl + 16, "%.*s.%s.XXXXXX", (int)dl, path, path + dl);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        free(tmp);
        return OG_EXIT_OUTPUT;
    }
    int rc = write_all(fd, b, path);
    if (rc == OG_EXIT_OK && (fchmod(fd, 0644) < 0 || fsync(fd) < 0)) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        rc = OG_EXIT_OUTPUT;
    }
    if (close(fd) < 0 && rc == OG_EXIT_OK) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        rc = OG_EXIT_OUTPUT;
    }
    if (rc == OG_EXIT_OK && rename(tmp, path) < 0) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        rc = OG_EXIT_OUTPUT;
    }
    if (rc != OG_EXIT_OK)
        unlink(tmp);
    free(tmp);
    return rc;
}

static void stats_free(struct stats *st)
{
    for (int d = 0; d < NDIM; d++) {
        HASH_CLEAR(hh, st->dim[d].hash);
        for (int i = 0; i < st->dim[d].n; i++) {
            free(st->dim[d].v[i]->s);
            free(st->dim[d].v[i]->title);
            free(st->dim[d].v[i]->last_fail_pod);
            free(st->dim[d].v[i]);
        }
        free(st->dim[d].v);
    }
    for (int i = 0; i < st->nskipped_msg; i++)
        free(st->skipped_msg[i]);
    free(st->skipped_msg);
    free(st->recs);
    free(st->buckets);
    free(st->readbuf);
    free(st->dirs);
}

enum { FMT_TEXT, FMT_JSON, FMT_HTML, FMT_PROM };

int og_cmd_stats(int argc, char **argv)
{
    struct stats st;
    memset(&st, 0, sizeof st);
    st.dirs = xmalloc((size_t)(argc ? argc : 1) * sizeof *st.dirs);
    const char *output = NULL;
    int format = FMT_TEXT, color_when = 0, top = 0, rc = OG_EXIT_OK, opt, first = 0;
    enum { O_TOP = 256, O_COLOR, O_NO_COLOR };
    static const struct option lo[] = {
        { "format", required_argument, NULL, 'f' },
        { "output", required_argument, NULL, 'o' },
        { "top", required_argument, NULL, O_TOP },
        { "color", required_argument, NULL, O_COLOR },
        { "no-color", no_argument, NULL, O_NO_COLOR },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *val;
    while ((opt = og_getopt("stats", argc, argv, "f:o:h", lo, &val, &first)) != -1) {
        int bad = 0;
        switch (opt) {
        case 'h':
            og_usage_stats(stdout);
            free(st.dirs);
            return OG_EXIT_OK;
        case 'f':
            format = !strcmp(val, "text")         ? FMT_TEXT
                     : !strcmp(val, "json")       ? FMT_JSON
                     : !strcmp(val, "html")       ? FMT_HTML
                     : !strcmp(val, "prometheus") ? FMT_PROM
                                                  : -1;
            if (format < 0) {
                fprintf(stderr, "oomguard stats: unknown format '%s' (use text, json, html or prometheus)\n", val);
                bad = 1;
            }
            break;
        case 'o':
            output = val;
            break;
        case O_TOP: {
            char *end;
            long v = strtol(val, &end, 10);
            if (!*val || *end || v < 1 || v > 100000) {
                fprintf(stderr, "oomguard stats: --top %s: expected a number from 1 to 100000\n", val);
                bad = 1;
            }
            top = (int)v;
            break;
        }
        case O_COLOR:
            color_when = !strcmp(val, "auto") ? 0 : !strcmp(val, "always") ? 1 : !strcmp(val, "never") ? -1 : 2;
            if (color_when == 2) {
                fprintf(stderr, "oomguard stats: --color %s: use auto, always or never\n", val);
                bad = 1;
            }
            break;
        case O_NO_COLOR:
            color_when = -1;
            break;
        default:
            bad = 1;
        }
        if (bad) {
            free(st.dirs);
            return OG_EXIT_USAGE;
        }
    }
    for (int i = first; i < argc; i++)
        st.dirs[st.ndirs++] = argv[i];
    if (!st.ndirs) {
        fputs("oomguard stats: missing DIR\n", stderr);
        og_usage_stats(stderr);
        free(st.dirs);
        return OG_EXIT_USAGE;
    }
    og_reader_init(0);
    char *path = xmalloc(MAX_PATH);
    for (int i = 0; i < st.ndirs; i++) {
        struct stat sb;
        size_t l = strlen(st.dirs[i]);
        if (stat(st.dirs[i], &sb) < 0) {
            fprintf(stderr, "oomguard: %s: %s\n", st.dirs[i], strerror(errno));
            rc = OG_EXIT_INPUT;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            load_one(&st, st.dirs[i]); /* a single file, whatever its name */
            continue;
        }
        if (l >= MAX_PATH) {
            fprintf(stderr, "oomguard: %s: path too long\n", st.dirs[i]);
            rc = OG_EXIT_INPUT;
            continue;
        }
        memcpy(path, st.dirs[i], l + 1);
        while (l > 1 && path[l - 1] == '/')
            path[--l] = '\0';
        walk(&st, path, l, 0);
    }
    free(path);
    if (rc == OG_EXIT_OK) {
        finish(&st);
        og_sb_t out;
        og_sb_init(&out);
        int color = color_when ? color_when > 0
                               : !output && isatty(STDOUT_FILENO) && !(getenv("NO_COLOR") && *getenv("NO_COLOR"));
        int r = format == FMT_JSON   ? render_json(&out, &st)
                : format == FMT_HTML ? render_html(&out, &st, top)
                : format == FMT_PROM ? render_prom(&out, &st)
                                     : (render_text(&out, &st, color, top), out.failed ? -1 : 0);
        if (r < 0 || out.failed) {
            fprintf(stderr, "oomguard: out of memory while rendering\n");
            rc = OG_EXIT_OUTPUT;
        } else {
            rc = write_atomic(&out, output);
        }
        og_sb_free(&out);
    }
    stats_free(&st);
    return rc;
}
