/* tools/main.c — `oomguard`: command dispatch, `report` and `merge` option
 * handling, and writing the output. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dump.h"
#include "merge.h"
#include "report.h"
#include "util.h"
#include "version.h"

static void usage(FILE *f)
{
    fputs("usage: oomguard <command> [options]\n"
          "\n"
          "Find out why a CUDA program ran out of GPU memory.\n"
          "\n"
          "commands:\n"
          "  run [options] [--] CMD [ARGS...]   run CMD with liboomguard.so preloaded\n"
          "  report [DUMP.json|DIR] [options]   explain one dump (default: the newest here)\n"
          "  merge DIR [options]                compare the dumps of a multi-rank job\n"
          "  stats DIR... [options]             count the dumps of many jobs (text, json, html, prometheus)\n"
          "  top [options]                      live view of every GPU: who holds memory, inside each process\n"
          "  snapshot PID|--all                 ask a running process for a dump now (it keeps running)\n"
          "  help [COMMAND]                     help for a command\n"
          "\n"
          "options:\n"
          "  -h, --help       show this help\n"
          "  -V, --version    print the version\n"
          "\n"
          "exit status:\n"
          "  0  success\n"
          "  1  usage error: unknown command or option, missing argument\n"
          "  2  input error: missing file, not JSON, truncated, unsupported schema, wrong types\n"
          "  3  output error: the output could not be written\n"
          "  run: the command's own status (or its fatal signal); 125 oomguard could not\n"
          "       start it, 126 not executable, 127 not found\n"
          "\n"
          "See docs/cli.md for details.\n",
          f);
}

void og_usage_report(FILE *f)
{
    fputs("usage: oomguard report [DUMP.json|DIR] [--format text|json|html|memory-viz] [-o FILE]\n"
          "\n"
          "Explain one dump: what failed, where the memory was, why, and what to do.\n"
          "DUMP.json may be - for standard input.  Without it, or with a directory, the\n"
          "newest oomguard-*.json of that directory, else of OOMGUARD_DIR, else of the\n"
          "working directory.\n"
          "\n"
          "options:\n"
          "  -f, --format FMT   text (default): terminal report\n"
          "                     json: the validated dump, pretty-printed\n"
          "                     html: one self-contained page with charts\n"
          "                     memory-viz: a pickle for PyTorch's memory_viz page\n"
          "  -o, --output FILE  write to FILE instead of standard output\n"
          "  --top N            allocation sites to show (text 10, html 20)\n"
          "  --color WHEN       auto (default: on a terminal unless NO_COLOR is set),\n"
          "                     always, never\n"
          "  -h, --help         show this help\n"
          "\n"
          "exit status: 0 ok, 1 usage error, 2 input error, 3 output error\n",
          f);
}

void og_usage_merge(FILE *f)
{
    fputs("usage: oomguard merge DIR [--format text|json|html] [-o FILE]\n"
          "\n"
          "Read every oomguard-*.json in DIR (any number of ranks and hosts), group\n"
          "them by job, and show which rank failed first, what each rank held, GPUs\n"
          "that hold other ranks' contexts, and the spread between ranks.  Files that\n"
          "cannot be read are listed as skipped.\n"
          "\n"
          "options:\n"
          "  -f, --format FMT   text (default), json or html\n"
          "  -o, --output FILE  write to FILE instead of standard output\n"
          "  --color WHEN       auto (default), always, never\n"
          "  -h, --help         show this help\n"
          "\n"
          "exit status: 0 ok, 1 usage error, 2 no valid dump in DIR, 3 output error\n",
          f);
}

/* Writes the whole buffer to path (or stdout when NULL).  Exit status 3 on failure. */
static int write_output(const og_sb_t *b, const char *path)
{
    int fd = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : STDOUT_FILENO;
    if (fd < 0) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        return OG_EXIT_OUTPUT;
    }
    if (write_all(fd, b, path ? path : "standard output") != OG_EXIT_OK) {
        if (path)
            close(fd);
        return OG_EXIT_OUTPUT;
    }
    if (path && close(fd) < 0) {
        fprintf(stderr, "oomguard: %s: %s\n", path, strerror(errno));
        return OG_EXIT_OUTPUT;
    }
    return OG_EXIT_OK;
}

struct common {
    const char *input, *output;
    int format, color_when, top; /* color_when: -1 never, 0 auto, 1 always */
};

static int parse_format(const char *s, int allow_memviz)
{
    if (!strcmp(s, "text"))
        return OG_FMT_TEXT;
    if (!strcmp(s, "json"))
        return OG_FMT_JSON;
    if (!strcmp(s, "html"))
        return OG_FMT_HTML;
    if (allow_memviz && (!strcmp(s, "memory-viz") || !strcmp(s, "memviz")))
        return OG_FMT_MEMVIZ;
    return -1;
}

/* Options shared by report and merge (getopt_long: -fhtml, --format=html, -o x, options
 * before or after the operand).  Returns -1 to exit with *rc. */
static int parse_common(int argc, char **argv, const char *cmd, int allow_memviz, struct common *c, int *rc,
                        void (*help)(FILE *))
{
    memset(c, 0, sizeof *c);
    const char *val;
    int opt, first;
    while ((opt = og_getopt(cmd, argc, argv, "f:o:h", og_output_options, &val, &first)) != -1) {
        int shared = og_output_option(cmd, opt, val, &c->top, &c->color_when);
        if (shared) {
            if (shared < 0) {
                *rc = OG_EXIT_USAGE;
                return -1;
            }
            continue;
        }
        switch (opt) {
        case 'h':
            help(stdout);
            *rc = OG_EXIT_OK;
            return -1;
        case 'f':
            c->format = parse_format(val, allow_memviz);
            if (c->format < 0) {
                fprintf(stderr, "oomguard %s: unknown format '%s' (use text, json, html%s)\n", cmd, val,
                        allow_memviz ? " or memory-viz" : "");
                *rc = OG_EXIT_USAGE;
                return -1;
            }
            break;
        case 'o':
            c->output = val;
            break;
        default:
            *rc = OG_EXIT_USAGE;
            return -1;
        }
    }
    if (argc - first > 1) {
        fprintf(stderr, "oomguard %s: one %s at a time (got '%s' and '%s')\n", cmd, allow_memviz ? "dump" : "directory",
                argv[first], argv[first + 1]);
        *rc = OG_EXIT_USAGE;
        return -1;
    }
    c->input = first < argc ? argv[first] : NULL;
    if (!c->input && !allow_memviz) {
        fprintf(stderr, "oomguard %s: missing DIR\n", cmd);
        help(stderr);
        *rc = OG_EXIT_USAGE;
        return -1;
    }
    return 0;
}

/* `report` without a dump, or with a directory: the newest oomguard-*.json there (by
 * modification time, then name).  dir NULL: OOMGUARD_DIR, else the working directory.
 * Returns a malloc'd path, or NULL after saying why on stderr. */
static char *newest_dump(const char *dir)
{
    if (!dir) {
        const char *e = getenv("OOMGUARD_DIR");
        dir = e && *e ? e : ".";
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "oomguard: %s: %s\n", dir, strerror(errno));
        return NULL;
    }
    char *best = NULL;
    struct timespec best_t = { 0, 0 };
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "oomguard-", 9) != 0 || l < 14 || strcmp(e->d_name + l - 5, ".json") != 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, 0) != 0 || !S_ISREG(st.st_mode))
            continue;
        n++;
        int newer = !best || st.st_mtim.tv_sec > best_t.tv_sec ||
                    (st.st_mtim.tv_sec == best_t.tv_sec && st.st_mtim.tv_nsec > best_t.tv_nsec) ||
                    (st.st_mtim.tv_sec == best_t.tv_sec && st.st_mtim.tv_nsec == best_t.tv_nsec &&
                     strcmp(e->d_name, strrchr(best, '/') + 1) > 0);
        if (newer) {
            size_t need = strlen(dir) + l + 2;
            char *p = malloc(need);
            if (!p)
                break;
            snprintf(p, need, "%s/%s", dir, e->d_name);
            free(best);
            best = p;
            best_t = st.st_mtim;
        }
    }
    closedir(d);
    if (!best)
        fprintf(stderr, "oomguard report: no oomguard-*.json dump in %s%s\n", dir,
                strcmp(dir, ".") ? "" : " (the working directory; OOMGUARD_DIR is not set)");
    else if (n > 1)
        fprintf(stderr, "oomguard report: %s (the newest of %d dumps in %s)\n", best, n, dir);
    return best;
}

static int want_color(const struct common *c)
{
    if (c->color_when)
        return c->color_when > 0;
    const char *nc = getenv("NO_COLOR");
    return !c->output && isatty(STDOUT_FILENO) && !(nc && *nc);
}

int og_cmd_report(int argc, char **argv)
{
    struct common c;
    int rc;
    if (parse_common(argc, argv, "report", 1, &c, &rc, og_usage_report) < 0)
        return rc;
    if (c.format == OG_FMT_MEMVIZ && !c.output && isatty(STDOUT_FILENO)) {
        fputs("oomguard report: memory-viz output is a binary pickle; use -o FILE.pickle\n", stderr);
        return OG_EXIT_USAGE;
    }
    char *found = NULL;
    struct stat ist;
    if (!c.input || (strcmp(c.input, "-") != 0 && stat(c.input, &ist) == 0 && S_ISDIR(ist.st_mode))) {
        if (!(found = newest_dump(c.input)))
            return OG_EXIT_INPUT;
        c.input = found;
    }
    og_reader_init(0);
    struct og_load_opts lo = {
        .keep_all = c.format == OG_FMT_JSON,
        .keep_sites = c.format == OG_FMT_MEMVIZ ? 4096 : (c.top > 1000 ? c.top : 1000),
    };
    struct og_err err;
    struct og_dump *d = og_dump_load_file(c.input, &lo, &err);
    if (!d) {
        fprintf(stderr, "oomguard: %s\n", err.msg);
        free(found);
        return OG_EXIT_INPUT;
    }
    og_sb_t out;
    og_sb_init(&out);
    struct og_render_opts ro = { .color = c.format == OG_FMT_TEXT && want_color(&c), .top = c.top };
    int r = c.format == OG_FMT_JSON     ? og_render_json(&out, d)
            : c.format == OG_FMT_HTML   ? og_render_html(&out, d, &ro)
            : c.format == OG_FMT_MEMVIZ ? og_render_memviz(&out, d)
                                        : og_render_text(&out, d, &ro);
    if (r < 0 || out.failed) {
        fprintf(stderr, "oomguard: %s: out of memory while rendering the report\n", c.input);
        rc = OG_EXIT_OUTPUT;
    } else {
        rc = write_output(&out, c.output);
    }
    og_sb_free(&out);
    og_dump_free(d);
    free(found);
    return rc;
}

int og_cmd_merge(int argc, char **argv)
{
    struct common c;
    int rc;
    if (parse_common(argc, argv, "merge", 0, &c, &rc, og_usage_merge) < 0)
        return rc;
    og_reader_init(0);
    struct og_merge_input in;
    char err[512];
    if (og_merge_load(c.input, &in, err, sizeof err) < 0) {
        fprintf(stderr, "oomguard: %s\n", err);
        return OG_EXIT_INPUT;
    }
    og_sb_t out;
    og_sb_init(&out);
    if (og_merge_render(&out, &in, c.format, c.format == OG_FMT_TEXT && want_color(&c)) < 0) {
        fprintf(stderr, "oomguard: out of memory while rendering\n");
        rc = OG_EXIT_OUTPUT;
    } else {
        rc = write_output(&out, c.output);
    }
    if (rc == OG_EXIT_OK && !in.ndumps) {
        fprintf(stderr, "oomguard: %s: no valid oomguard-*.json dump%s\n", c.input,
                in.nskipped ? " (all were skipped)" : "");
        rc = OG_EXIT_INPUT;
    }
    og_sb_free(&out);
    og_merge_free(&in);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return OG_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        usage(stdout);
        return OG_EXIT_OK;
    }
    if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("oomguard %s\n", OOMGUARD_VERSION);
        return fflush(stdout) == 0 && !ferror(stdout) ? OG_EXIT_OK : OG_EXIT_OUTPUT;
    }
    if (!strcmp(cmd, "run"))
        return og_cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "report"))
        return og_cmd_report(argc - 2, argv + 2);
    if (!strcmp(cmd, "merge"))
        return og_cmd_merge(argc - 2, argv + 2);
    if (!strcmp(cmd, "stats"))
        return og_cmd_stats(argc - 2, argv + 2);
    if (!strcmp(cmd, "top"))
        return og_cmd_top(argc - 2, argv + 2);
    if (!strcmp(cmd, "snapshot"))
        return og_cmd_snapshot(argc - 2, argv + 2);
    if (!strcmp(cmd, "help")) {
        const char *sub = argc > 2 ? argv[2] : NULL;
        if (!sub)
            usage(stdout);
        else if (!strcmp(sub, "run"))
            og_usage_run(stdout);
        else if (!strcmp(sub, "report"))
            og_usage_report(stdout);
        else if (!strcmp(sub, "merge"))
            og_usage_merge(stdout);
        else if (!strcmp(sub, "stats"))
            og_usage_stats(stdout);
        else if (!strcmp(sub, "top"))
            og_usage_top(stdout);
        else if (!strcmp(sub, "snapshot"))
            og_usage_snapshot(stdout);
        else {
            fprintf(stderr, "oomguard: no such command '%s'\n", sub);
            return OG_EXIT_USAGE;
        }
        return OG_EXIT_OK;
    }
    fprintf(stderr, "oomguard: unknown command '%s'\n", cmd);
    usage(stderr);
    return OG_EXIT_USAGE;
}
