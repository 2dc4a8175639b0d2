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
#include "stats.h"
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

const char *const og_stats_cls_key[NCLS] = { "oom", "recovered", "warning", "exit", "other" };

/* ------------------------------------------------------------ interning */

/* Valid UTF-8, cut at MAX_VALUE_BYTES without splitting a character.  Interning the
 * normalised form keeps JSON keys and Prometheus series unique after escaping. */
char *og_stats_normalise(const char *s)
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
    char *s = og_stats_normalise(raw && *raw ? raw : missing);
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
 * "foreign_processes" (with its own title), and before "cuda_out_of_workers" had one they named it "set_device"
 * (with its own title): they count as what they were. */
static const char *remedy_id(const struct og_remedy *r)
{
    static const char old_title[] = "Find the memory held outside the framework";
    static const char old_workers[] = "Keep CUDA out of the DataLoader workers";
    if (r->id && strcmp(r->id, "foreign_processes") == 0 && r->title &&
        strncmp(r->title, old_title, sizeof old_title - 1) == 0)
        return "non_framework_memory";
    if (r->id && strcmp(r->id, "set_device") == 0 && r->title &&
        strncmp(r->title, old_workers, sizeof old_workers - 1) == 0)
        return "cuda_out_of_workers";
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
            e[D_REMEDY]->title = og_stats_normalise(r->title);
    }
    for (int i = 0; i < NDIM; i++)
        if (e[i])
            count(e[i], cls, t);
    struct ent *h = e[D_HOST];
    if (node && d->host && *d->host && strcmp(node, d->host) != 0 && cls == C_OOM && !isnan(t) && h->last_fail == t) {
        char *pod = og_stats_normalise(d->host);
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

static int ent_cmp(const void *pa, const void *pb)
{
    const struct ent *a = *(struct ent *const *)pa, *b = *(struct ent *const *)pb;
    if (a->n[C_OOM] != b->n[C_OOM])
        return a->n[C_OOM] > b->n[C_OOM] ? -1 : 1;
    if (a->total != b->total)
        return a->total > b->total ? -1 : 1;
    return strcmp(a->s, b->s);
}

struct ent **og_stats_sorted(const struct dim *d)
{
    struct ent **v = xmalloc((size_t)(d->n ? d->n : 1) * sizeof *v);
    if (d->n) {
        memcpy(v, d->v, (size_t)d->n * sizeof *v);
        qsort(v, (size_t)d->n, sizeof *v, ent_cmp);
    }
    return v;
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
    const char *val;
    while ((opt = og_getopt("stats", argc, argv, "f:o:h", og_output_options, &val, &first)) != -1) {
        int shared = og_output_option("stats", opt, val, &top, &color_when), bad = 0;
        if (shared < 0) {
            free(st.dirs);
            return OG_EXIT_USAGE;
        }
        if (shared)
            continue;
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
        int r = format == FMT_JSON   ? og_stats_render_json(&out, &st)
                : format == FMT_HTML ? og_stats_render_html(&out, &st, top)
                : format == FMT_PROM ? og_stats_render_prom(&out, &st)
                                     : og_stats_render_text(&out, &st, color, top);
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
