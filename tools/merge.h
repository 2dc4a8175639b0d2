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
/* Renders the merged view (format: text, json or html). */
int og_merge_render(og_sb_t *out, const struct og_merge_input *in, int format, int color);

#endif
