/* tools/merge.c — the dumps of a multi-rank job side by side: loads them, groups them into jobs
 * and finds who failed first, what each rank held and how unevenly the ranks use memory (struct
 * og_merge).  tools/render_merge.c prints that structure in each format. */
#include "merge.h"
#include "report.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_FILES 100000

static int is_dump_name(const char *n)
{
    size_t l = strlen(n);
    return l > 14 && !strncmp(n, "oomguard-", 9) && !strcmp(n + l - 5, ".json");
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *copy_str(const char *s) { return s ? strndup(s, 4096) : NULL; }

/* Merge shows a few fields per rank; everything else in a dump (its JSON tree,
 * causes, remedies, ...) is freed as soon as the file is read, so that the
 * dumps of thousands of ranks fit in memory.  The copy owns its strings. */
static struct og_dump *slim_copy(const struct og_dump *d, char *file)
{
    struct og_dump *s = xmalloc(sizeof *s);
    memset(s, 0, sizeof *s);
    s->file = file;
    s->host = copy_str(d->host);
    s->job_id = copy_str(d->job_id);
    s->status_str = copy_str(d->status_str);
    s->status = d->status;
    s->diag.present = d->diag.present;
    s->diag.primary = copy_str(d->diag.primary); /* the cause column */
    s->time = d->time;
    s->pid = d->pid;
    s->rank = d->rank;
    s->world_size = d->world_size;
    s->event.present = d->event.present;
    s->event.t = d->event.t;
    s->event.requested_bytes = d->event.requested_bytes;
    s->event.device = d->event.device;
    s->event.api = copy_str(d->event.api);
    s->device.index = d->device.index;
    s->device.name = copy_str(d->device.name);
    s->mem.process_used_bytes = d->mem.process_used_bytes;
    s->mem.process_tracked_bytes = d->mem.process_tracked_bytes;
    s->mem.framework_bytes = d->mem.framework_bytes;
    s->mem.non_framework_bytes = d->mem.non_framework_bytes;
    s->mem.other_processes_bytes = d->mem.other_processes_bytes;
    s->mem.nprocs = d->mem.nprocs;
    struct og_proc *procs = xmalloc((size_t)(d->mem.nprocs ? d->mem.nprocs : 1) * sizeof *procs);
    for (int i = 0; i < d->mem.nprocs; i++)
        procs[i] = (struct og_proc){ d->mem.procs[i].pid, d->mem.procs[i].bytes, NULL };
    s->mem.procs = procs;
    return s;
}

/* A rank's cause: the primary diagnosis of its dump ("-" for an exit summary or a warning). */
const char *og_merge_rank_cause(const struct og_dump *d)
{
    return d->diag.primary && *d->diag.primary ? d->diag.primary : "-";
}

static void slim_free(struct og_dump *s)
{
    free((char *)s->file);
    free((char *)s->host);
    free((char *)s->job_id);
    free((char *)s->status_str);
    free((char *)s->diag.primary);
    free((char *)s->event.api);
    free((char *)s->device.name);
    free(s->mem.procs);
    free(s);
}

int og_merge_load(const char *dir, struct og_merge_input *in, char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    in->dir = dir;
    DIR *dp = opendir(dir);
    if (!dp) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && n < MAX_FILES) {
        if (!is_dump_name(de->d_name))
            continue;
        if (n == cap)
            names = xrealloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
        names[n++] = xstrdup(de->d_name);
    }
    closedir(dp);
    if (n)
        qsort(names, n, sizeof *names, name_cmp);
    in->dumps = xmalloc((n ? n : 1) * sizeof *in->dumps);
    in->skipped = xmalloc((n ? n : 1) * sizeof *in->skipped);
    const struct og_load_opts opts = { .keep_all = 0, .keep_sites = 1, .no_history = 1 };
    for (size_t i = 0; i < n; i++) {
        size_t pl = strlen(dir) + strlen(names[i]) + 2;
        char *path = xmalloc(pl);
        snprintf(path, pl, "%s/%s", dir, names[i]);
        struct stat st;
        struct og_err e;
        if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
            snprintf(e.msg, sizeof e.msg, "%s: not a regular file", path);
            in->skipped[in->nskipped++] = xstrdup(e.msg);
            free(path);
            continue;
        }
        struct og_dump *d = og_dump_load_file(path, &opts, &e);
        if (d) {
            in->dumps[in->ndumps++] = slim_copy(d, path);
            og_dump_free(d);
        } else {
            in->skipped[in->nskipped++] = xstrdup(e.msg);
            free(path);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return 0;
}

void og_merge_free(struct og_merge_input *in)
{
    for (int i = 0; i < in->ndumps; i++)
        slim_free(in->dumps[i]);
    for (int i = 0; i < in->nskipped; i++)
        free(in->skipped[i]);
    free(in->dumps);
    free(in->skipped);
}

/* ---- analysis ---- */

int og_merge_streq(const char *a, const char *b) { return a && b ? !strcmp(a, b) : a == b; }

static int dump_cmp(const void *pa, const void *pb)
{
    const struct og_dump *a = *(struct og_dump *const *)pa, *b = *(struct og_dump *const *)pb;
    if (!og_merge_streq(a->job_id, b->job_id)) {
        if (!a->job_id || !b->job_id)
            return a->job_id ? -1 : 1; /* dumps without a job id last */
        return strcmp(a->job_id, b->job_id);
    }
    if (a->rank != b->rank) {
        if (a->rank < 0 || b->rank < 0)
            return a->rank < 0 ? 1 : -1;
        return a->rank < b->rank ? -1 : 1;
    }
    int h = strcmp(a->host ? a->host : "", b->host ? b->host : "");
    if (h)
        return h;
    return a->pid < b->pid ? -1 : a->pid > b->pid;
}

double og_merge_fail_time(const struct og_dump *d)
{
    if (d->status != OG_ST_OOM)
        return NAN;
    return d->event.present && isfinite(d->event.t) ? d->event.t : d->time;
}


static void analyse(struct og_merge_job *j)
{
    j->first = -1;
    double best = INFINITY;
    j->max_used = -1;
    j->min_used = -1;
    j->max_i = j->min_i = -1;
    j->hosts = 0;
    for (int i = 0; i < j->n; i++) {
        double t = og_merge_fail_time(j->r[i]);
        if (isfinite(t) && t < best) {
            best = t;
            j->first = i;
        }
        int64_t u = og_process_bytes(j->r[i]);
        if (u >= 0 && (j->max_i < 0 || u > j->max_used)) {
            j->max_used = u;
            j->max_i = i;
        }
        if (u >= 0 && (j->min_i < 0 || u < j->min_used)) {
            j->min_used = u;
            j->min_i = i;
        }
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = og_merge_streq(j->r[k]->host, j->r[i]->host);
        j->hosts += !seen;
    }
}

/* The dump in the job (same host) whose pid is `pid`, or -1. */
int og_merge_rank_of_pid(const struct og_merge_job *j, const struct og_dump *on, int64_t pid)
{
    for (int i = 0; i < j->n; i++)
        if (j->r[i] != on && j->r[i]->pid == pid && og_merge_streq(j->r[i]->host, on->host))
            return i;
    return -1;
}

int64_t og_merge_device_of(const struct og_dump *d) { return d->event.device >= 0 ? d->event.device : d->device.index; }


int og_merge_jobs(const struct og_merge_input *in, struct og_merge *m)
{
    struct og_dump **v = xmalloc((size_t)(in->ndumps ? in->ndumps : 1) * sizeof *v);
    memcpy(v, in->dumps, (size_t)in->ndumps * sizeof *v);
    if (in->ndumps)
        qsort(v, (size_t)in->ndumps, sizeof *v, dump_cmp);
    /* Jobs are runs of equal job_id in the sorted list. */
    struct og_merge_job *jobs = xmalloc((size_t)(in->ndumps ? in->ndumps : 1) * sizeof *jobs);
    int njobs = 0;
    for (int i = 0; i < in->ndumps;) {
        int k = i + 1;
        while (k < in->ndumps && og_merge_streq(v[k]->job_id, v[i]->job_id))
            k++;
        jobs[njobs] = (struct og_merge_job){ .r = v + i, .n = k - i };
        analyse(&jobs[njobs++]);
        i = k;
    }

    m->sorted = v;
    m->jobs = jobs;
    m->njobs = njobs;
    return 0;
}

void og_merge_jobs_free(struct og_merge *m)
{
    free(m->jobs);
    free(m->sorted);
    *m = (struct og_merge){ 0 };
}
