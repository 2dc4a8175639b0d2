/* tools/util.h — small helpers shared by the oomguard command: a growable output
 * buffer, safe rendering of untrusted strings, and human-readable sizes. */
#ifndef OG_UTIL_H
#define OG_UTIL_H

#include <stdarg.h>

#include "strbuf.h"
#include <stddef.h>
#include <stdint.h>

/* Exit codes (documented in docs/cli.md and `oomguard --help`). */
enum {
    OG_EXIT_OK = 0,
    OG_EXIT_USAGE = 1,
    OG_EXIT_INPUT = 2,
    OG_EXIT_OUTPUT = 3,
};

/* Renderers write into the project's one string builder (common/strbuf.h), so that the same code
 * can feed stdout, a file, or the fuzzer; allocation failure is sticky (`failed`), callers check
 * once at the end. */

/* Untrusted strings (everything read from a dump).  Both functions emit at most
 * `max_chars` characters (then "…"), replace invalid UTF-8 with U+FFFD, and never
 * pass control characters or bidi overrides through. */
#define OG_TEXT_KEEP_NL 1u /* keep '\n' (for <pre> blocks); otherwise it becomes a space */
void sb_text(og_sb_t *b, const char *s, size_t max_chars, unsigned flags);
void sb_html(og_sb_t *b, const char *s, size_t max_chars, unsigned flags);
/* Display width (in characters) of what sb_text would emit. */
size_t text_width(const char *s, size_t max_chars);
/* Valid UTF-8 copy of s (invalid sequences → U+FFFD), for the pickle writer. */
void sb_utf8(og_sb_t *b, const char *s);
int utf8_valid(const char *s);

/* "1.30 GiB" (binary units, two decimals; plain "512 B" below 1 KiB). */
const char *human_bytes(int64_t bytes, char out[32]);
const char *human_bytes_u64(uint64_t bytes, char out[32]); /* all of uint64 (requests up to SIZE_MAX) */
/* "1,395,864,371" */
const char *group_digits(int64_t v, char out[32]);
const char *group_digits_u64(uint64_t v, char out[32]); /* "18,446,744,073,709,551,615" fits 32 */

/* Returns a malloc'd copy or exits with a message; for the few allocations the
 * command cannot sensibly go on without. */
void *xmalloc(size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Writes all of B to FD (retrying interrupted writes): OG_EXIT_OK, or OG_EXIT_OUTPUT after a message naming
 * WHAT (the file, or "standard output"). */
int write_all(int fd, const og_sb_t *b, const char *what);

/* getopt_long for a subcommand: argv holds the arguments after the command name (argv[-1]
 * is the name).  Returns the option's value as getopt_long does, -1 at the end (then *optind_out
 * is the first operand), or '?' after printing "oomguard CMD: unknown option X" /
 * "X needs a value" on stderr.  `shortopts` without getopt's leading ':'; a leading '+' stops
 * at the first operand (for `run`, whose command follows). */
#include <getopt.h>

/* The options every output-writing subcommand (report, merge, stats) takes alike: their long
 * names (-f/--format, -o/--output, --top, --color, --no-color, -h/--help; shortopts "f:o:h"),
 * and the parser of the three whose meaning is shared.  og_output_option returns 1 when OPT was
 * --top/--color/--no-color and is stored, 0 when it is not one of them, -1 after printing
 * "oomguard CMD: ..." for a bad value. */
enum { OG_OPT_TOP = 256, OG_OPT_COLOR, OG_OPT_NO_COLOR };
extern const struct option og_output_options[];
int og_output_option(const char *cmd, int opt, const char *val, int *top, int *color_when);
int og_getopt(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo, const char **arg,
              int *optind_out);

#endif
