/* tools/merge.h — `oomguard merge DIR`: many dumps of one job, side by side. */
#ifndef OG_MERGE_H
#define OG_MERGE_H

#include "dump.h"
#include "util.h"

enum og_format { OG_FMT_TEXT, OG_FMT_JSON, OG_FMT_HTML, OG_FMT_MEMVIZ };

struct og_merge_input {
    struct og_dump **dumps; /* slim copies: only the fields merge shows */
    int ndumps;
    char **skipped; /* "file: reason" */
    int nskipped;
    const char *dir;
};

/* Loads every oomguard-*.json in dir.  Returns 0, or -1 with *err set when the
 * directory cannot be read. */
int og_merge_load(const char *dir, struct og_merge_input *in, char *err, size_t errlen);
void og_merge_free(struct og_merge_input *in);
/* A job: the dumps of one job_id, by rank; who failed first and the spread of usage. */
struct og_merge_job {
    struct og_dump **r; /* ranks, sorted */
    int n;
    int first; /* index of the first failure or -1 */
    int hosts;
    int64_t max_used, min_used;
    int max_i, min_i;
};

#define SKEW_FLAG 0.10 /* spread above this fraction of the largest is called uneven */

/* The dumps grouped into jobs (runs of equal job_id after sorting by job, rank, host, pid). */
struct og_merge {
    struct og_dump **sorted;
    struct og_merge_job *jobs;
    int njobs;
};
int og_merge_jobs(const struct og_merge_input *in, struct og_merge *m);
void og_merge_jobs_free(struct og_merge *m);
/* The dump in the job (same host) whose pid is `pid`, or -1. */
int og_merge_rank_of_pid(const struct og_merge_job *j, const struct og_dump *on, int64_t pid);
int64_t og_merge_device_of(const struct og_dump *d);
int og_merge_streq(const char *a, const char *b); /* equal strings, or both NULL */
/* When a rank failed (NAN for a dump that is not an out-of-memory failure). */
double og_merge_fail_time(const struct og_dump *d);
/* A rank's cause: the primary diagnosis of its dump ("-" for an exit summary or a warning). */
const char *og_merge_rank_cause(const struct og_dump *d);

/* Renders the merged view (format: text, json or html): tools/render_merge.c. */
int og_merge_render(og_sb_t *out, const struct og_merge_input *in, int format, int color);

#endif
