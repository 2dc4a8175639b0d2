/* symfill.c: names and lines for a dump's frames, resolved in the writing process after the
 * dump is on disk (a helper thread, bounded by OOMGUARD_SYMBOLIZE_MS), then kept for later
 * dumps of the process. */
#ifndef OG_SYMFILL_H
#define OG_SYMFILL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct og_symfill_ent {
    char function[192]; /* demangled; "" unknown */
    char file[256];     /* source file as DWARF names it; "" unknown */
    int line;           /* 0 unknown */
    bool inlined;
    char inlined_into[192];
} og_symfill_ent_t;

struct og_record;
/* The answer for a frame address (a return address), NULL when not resolved (yet).
 * Lock-free; entries never change once published. */
const og_symfill_ent_t *og_symfill_get(uintptr_t ip);
/* After a dump was written at `path` (generation `gen`): takes `rec` (frees it) and, when some
 * of its frames are not resolved yet, resolves them in a helper thread and rewrites the dump. */
void og_symfill_schedule(struct og_record *rec, const char *path, unsigned gen);
/* At exit (atexit handler or destructor): no helper starts any more; a running one gets until
 * its bound (and a little for its write), then is stopped before it writes; a write under way
 * is finished first.  Afterwards the helper touches nothing exit tears down. */
void og_symfill_close(void);
void og_symfill_atfork_child(void);
unsigned long long og_symfill_last_ms(void);
/* dump.c: renders `r` again over its dump at `path` if that is still this process's newest
 * dump (generation `gen`). */
void og_dump_rewrite(const struct og_record *r, const char *path, unsigned gen);

#endif
