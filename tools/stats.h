/* tools/stats.h — what `oomguard stats` aggregates: every dump under some directories reduced to
 * interned ids and counts (tools/stats.c), and the renderers that print that one structure in each
 * format (tools/render_stats.c). */
#ifndef OG_STATS_H
#define OG_STATS_H

#include <stdint.h>
#include <stddef.h>

#include <uthash.h>

#include "util.h"

#define MAX_DEPTH         64 /* directory levels below an argument */
#define MAX_PATH          4096
#define MAX_VALUE_BYTES   200                /* interned strings are cut here (at a UTF-8 boundary) */
#define READ_WHOLE_MAX    ((size_t)64 << 20) /* bigger files are streamed by the reader */
#define KEEP_SKIPPED      1000               /* skipped files listed by name (all are counted) */
#define MAX_TREND_BUCKETS 400

/* Status classes: real crashes (oom) are kept apart from the rest. */
enum { C_OOM, C_RECOVERED, C_WARNING, C_EXIT, C_OTHER, NCLS };
extern const char *const og_stats_cls_key[NCLS];

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

/* A dump's string as stats keeps it: valid UTF-8, cut at MAX_VALUE_BYTES; malloc'd. */
char *og_stats_normalise(const char *s);
/* Entries of a dimension in display order (a sorted copy: ids stay valid); free() it. */
struct ent **og_stats_sorted(const struct dim *d);

int og_stats_render_text(og_sb_t *b, const struct stats *st, int color, int top);
int og_stats_render_json(og_sb_t *b, const struct stats *st);
int og_stats_render_prom(og_sb_t *b, struct stats *st);
int og_stats_render_html(og_sb_t *b, const struct stats *st, int top);

#endif
