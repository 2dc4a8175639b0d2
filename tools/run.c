/* tools/run.c — `oomguard run [options] [--] CMD [ARGS...]`.
 *
 * Runs CMD with liboomguard.so prepended to LD_PRELOAD and the options turned
 * into OOMGUARD_* variables.  It fork+execs rather than exec'ing in place so
 * that, when the command ends, it can point at the dumps it wrote; children of
 * CMD (torchrun workers, srun tasks) inherit the environment.  Signals sent to
 * oomguard are passed on, and the command's exit status or fatal signal becomes
 * oomguard's own. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "../common/options.def"

/* the library's own ranges (common/options.def): --stack-depth accepts exactly what it does */
#define X(id, env, type, def, lo, hi, help) RUN_LO_##id = (lo), RUN_HI_##id = (hi),
enum { OG_OPTIONS(X) };
#undef X

#include "cli.h"
#include "util.h"

static const int FORWARDED[] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 };
#define NFORWARDED ((int)(sizeof FORWARDED / sizeof FORWARDED[0]))

static volatile sig_atomic_t g_child;

void og_usage_run(FILE *f)
{
    fputs("usage: oomguard run [options] [--] CMD [ARGS...]\n"
          "\n"
          "Run CMD with liboomguard.so preloaded.  When a CUDA allocation fails, the\n"
          "library writes oomguard-<host>-<pid>[-rank<R>].json (and .txt); at the end\n"
          "oomguard lists the dumps written during the run.\n"
          "\n"
          "options:\n"
          "  --dir DIR          write dumps to DIR (created if missing)     OOMGUARD_DIR\n"
          "  --limit SPEC       fail allocations beyond SPEC, e.g. 20GiB    OOMGUARD_LIMIT\n"
          "  --warn-at SPEC     warn when usage crosses SPEC, e.g. 90%      OOMGUARD_WARN_AT\n"
          "  --stack-depth N    frames recorded per allocation site         OOMGUARD_STACK_DEPTH\n"
          "  --summary          write an exit summary dump too              OOMGUARD_SUMMARY=1\n"
          "  --verbose          more messages from the library and here     OOMGUARD_VERBOSE=1\n"
          "  --quiet            no messages from the library or here        OOMGUARD_QUIET=1\n"
          "  -h, --help         show this help\n"
          "\n"
          "The first argument that is not an option starts CMD; use -- if CMD itself\n"
          "starts with '-'.  The library is found next to the oomguard binary, then in\n"
          "../lib/oomguard/; OOMGUARD_LIB=/path/to/liboomguard.so overrides both.\n"
          "\n"
          "Works as the program under a launcher and as its wrapper:\n"
          "  torchrun --no-python --nproc-per-node=4 oomguard run python train.py\n"
          "  oomguard run --dir oom torchrun --nproc-per-node=4 train.py\n"
          "  srun oomguard run python train.py\n"
          "\n"
          "exit status: CMD's own; if CMD is killed by a signal, oomguard kills itself\n"
          "with the same signal.  125: oomguard could not start CMD (e.g. no library),\n"
          "126: CMD is not executable, 127: CMD not found, 1: usage error.\n",
          f);
}

static void forward(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    /* A signal from the terminal (Ctrl-C) reaches the whole foreground process
     * group, the command included: sending it again would deliver it twice. */
    if (si && si->si_code == SI_KERNEL)
        return;
    if (g_child > 0)
        kill((pid_t)g_child, sig);
}

static int mkdir_p(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Finds liboomguard.so: OOMGUARD_LIB, else next to the real binary, else in
 * ../lib/oomguard/ relative to it (the installed layout), else in ../ (the bundle and the
 * wheel: bin/oomguard next to liboomguard.so, pkg/bundle.sh). */
static int find_library(char *out, size_t outlen)
{
    const char *env = getenv("OOMGUARD_LIB");
    if (env && *env) {
        if (access(env, R_OK) != 0 || !realpath(env, out)) {
            fprintf(stderr, "oomguard: OOMGUARD_LIB=%s: %s\n", env, strerror(errno));
            return -1;
        }
        return 0;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "oomguard: cannot find my own binary (/proc/self/exe: %s); set OOMGUARD_LIB\n",
                strerror(errno));
        return -1;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    static const char *const rel[] = { "liboomguard.so", "../lib/oomguard/liboomguard.so", "../liboomguard.so" };
    enum { NREL = sizeof rel / sizeof rel[0] };
    char cand[NREL][PATH_MAX + 64];
    for (int i = 0; i < NREL; i++) {
        snprintf(cand[i], sizeof cand[i], "%s/%s", exe, rel[i]);
        if (access(cand[i], R_OK) == 0 && realpath(cand[i], out))
            return 0;
    }
    fprintf(stderr, "oomguard: cannot find liboomguard.so\n");
    for (int i = 0; i < NREL; i++)
        fprintf(stderr, "  %s %s\n", i ? "       and" : "looked for", cand[i]);
    fprintf(stderr, "  build it (make) or set OOMGUARD_LIB=/path/to/liboomguard.so\n");
    (void)outlen;
    return -1;
}

/* LD_PRELOAD with the library first, keeping whatever was there (once). */
static int set_preload(const char *lib)
{
    if (strpbrk(lib, ": \t")) {
        fprintf(stderr, "oomguard: %s: LD_PRELOAD cannot hold a path with ':' or spaces\n", lib);
        return -1;
    }
    const char *old = getenv("LD_PRELOAD");
    if (old && *old) {
        /* Already there (e.g. oomguard run inside oomguard run)? */
        size_t l = strlen(lib);
        for (const char *p = old; (p = strstr(p, lib)); p += l)
            if ((p == old || strchr(": \t", p[-1])) && (!p[l] || strchr(": \t", p[l])))
                return 0;
        size_t n = l + strlen(old) + 2;
        char *v = xmalloc(n);
        snprintf(v, n, "%s:%s", lib, old);
        int r = setenv("LD_PRELOAD", v, 1);
        free(v);
        return r;
    }
    return setenv("LD_PRELOAD", lib, 1);
}

/* The Python adapter (adapters/python: sitecustomize + oomguard_torch) goes first on
 * PYTHONPATH so that PyTorch jobs hand the shim their allocator's view without editing the
 * script.  Installed next to the library as python/, in the source tree two levels up.
 * OOMGUARD_PYTHON_ADAPTER=0 turns it off. */
static void set_python_adapter(const char *lib)
{
    const char *off = getenv("OOMGUARD_PYTHON_ADAPTER");
    if (off && strcmp(off, "0") == 0)
        return;
    char dir[PATH_MAX], cand[2][PATH_MAX + 32], real[PATH_MAX];
    char probe[sizeof cand[0] + 32];
    snprintf(dir, sizeof dir, "%s", lib);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return;
    *slash = '\0';
    snprintf(cand[0], sizeof cand[0], "%.4000s/python", dir);
    snprintf(cand[1], sizeof cand[1], "%.4000s/../adapters/python", dir);
    for (int i = 0; i < 2; i++) {

        snprintf(probe, sizeof probe, "%.4000s/oomguard_torch.py", cand[i]);
        if (access(probe, R_OK) != 0 || !realpath(cand[i], real))
            continue;
        const char *old = getenv("PYTHONPATH");
        if (old && *old) {
            size_t l = strlen(real);
            for (const char *p = old; (p = strstr(p, real)); p += l)
                if ((p == old || p[-1] == ':') && (!p[l] || p[l] == ':'))
                    return; /* nested oomguard run: already there */
            size_t n = strlen(real) + strlen(old) + 2;
            char *v = xmalloc(n);
            snprintf(v, n, "%s:%s", real, old);
            setenv("PYTHONPATH", v, 1);
            free(v);
        } else {
            setenv("PYTHONPATH", real, 1);
        }
        return;
    }
}

/* One dump file as the directory showed it: a dump is "written during the run" when its name is
 * new, or its inode, size or modification time changed (the library replaces a dump by rename,
 * so a rewrite is a new inode).  Comparing pictures, not timestamps with a clock, holds on any
 * file system: one whose clock is another machine's (a network or virtual file system) or whose
 * timestamps are coarser than the process's clock once hid a dump written in the run's first
 * milliseconds. */
struct found {
    char *name;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

static int found_cmp(const void *a, const void *b)
{
    return strcmp(((const struct found *)a)->name, ((const struct found *)b)->name);
}

struct dump_picture {
    struct found *v;
    size_t n;
};

static void picture_free(struct dump_picture *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i].name);
    free(p->v);
    p->v = NULL;
    p->n = 0;
}

/* The dumps (oomguard-*.json, regular files) in dir, sorted by name; empty when dir is absent. */
static struct dump_picture picture_of(const char *dir)
{
    struct dump_picture p = { 0 };
    DIR *dp = opendir(dir);
    if (!dp)
        return p;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t l = strlen(de->d_name);
        if (l < 15 || strncmp(de->d_name, "oomguard-", 9) || strcmp(de->d_name + l - 5, ".json"))
            continue;
        struct stat st;
        if (fstatat(dirfd(dp), de->d_name, &st, 0) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (p.n == cap)
            p.v = xrealloc(p.v, (cap = cap ? cap * 2 : 8) * sizeof *p.v);
        p.v[p.n++] = (struct found){ xstrdup(de->d_name), st.st_ino, st.st_size, st.st_mtim };
    }
    closedir(dp);
    if (p.n)
        qsort(p.v, p.n, sizeof *p.v, found_cmp);
    return p;
}

static int unchanged_since(const struct dump_picture *before, const struct found *f)
{
    const struct found *o = before->n ? bsearch(f, before->v, before->n, sizeof *before->v, found_cmp) : NULL;
    return o && o->ino == f->ino && o->size == f->size && o->mtime.tv_sec == f->mtime.tv_sec &&
           o->mtime.tv_nsec == f->mtime.tv_nsec;
}

/* Whether a dump was written by the command or one of its direct children (torchrun's workers,
 * a shell script's python), on this host: when many ranks share one dump directory, each
 * `oomguard run` names its own dumps, not every rank's.  An unreadable dump is kept (listing
 * too much beats hiding one). */
static int dump_is_ours(const char *dir, const char *name, pid_t child)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return 1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 1;
    og_sb_t b;
    og_sb_init(&b);
    char chunk[65536];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof chunk)) > 0 || (r < 0 && errno == EINTR))
        if (r > 0)
            og_sb_put(&b, chunk, (size_t)r);
    close(fd);
    int ours = 1;
    cJSON *root = b.failed ? NULL : cJSON_ParseWithLength(b.buf ? b.buf : "", b.len);
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(root, "pid");
    const cJSON *ppid = cJSON_GetObjectItemCaseSensitive(root, "ppid");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(root, "host");
    char me[256] = "";
    if (cJSON_IsNumber(pid) && cJSON_IsNumber(ppid)) {
        ours = (pid_t)pid->valuedouble == child || (pid_t)ppid->valuedouble == child;
        if (ours && cJSON_IsString(host) && gethostname(me, sizeof me - 1) == 0)
            ours = strcmp(host->valuestring, me) == 0;
    }
    cJSON_Delete(root);
    og_sb_free(&b);
    return ours;
}

/* Dumps in dir that are not in the picture taken before the command started and that the command
 * wrote (see dump_is_ours), listed for the user. */
static void list_dumps(const char *dir, const char *shown_dir, const struct dump_picture *before, pid_t child)
{
    struct dump_picture now = picture_of(dir);
    struct found *v = now.v;
    size_t n = 0;
    for (size_t i = 0; i < now.n; i++) {
        if (unchanged_since(before, &v[i]) || !dump_is_ours(dir, v[i].name, child)) {
            free(v[i].name);
            continue;
        }
        v[n++] = v[i];
    }
    now.n = n;
    if (!n) {
        picture_free(&now);
        return;
    }
    const char *sep = shown_dir[strlen(shown_dir) - 1] == '/' ? "" : "/";
    if (n == 1) {
        fprintf(stderr, "oomguard: 1 dump written: %s%s%s \u2014 read it with: oomguard report %s%s%s\n", shown_dir,
                sep, v[0].name, shown_dir, sep, v[0].name);
    } else {
        fprintf(stderr, "oomguard: %zu dumps written in %s:\n", n, shown_dir);
        for (size_t i = 0; i < n && i < 50; i++)
            fprintf(stderr, "  %s%s%s\n", shown_dir, sep, v[i].name);
        if (n > 50)
            fprintf(stderr, "  ... and %zu more\n", n - 50);
        fprintf(stderr, "read one with: oomguard report FILE; all ranks together: oomguard merge %s\n", shown_dir);
    }
    picture_free(&now);
}

/* Dies of `sig` as the command did, so the caller's shell sees the same. */
static int die_like(int sig)
{
    fflush(NULL);
    if (sig == SIGQUIT || sig == SIGILL || sig == SIGABRT || sig == SIGFPE || sig == SIGSEGV || sig == SIGBUS ||
        sig == SIGSYS || sig == SIGTRAP || sig == SIGXCPU || sig == SIGXFSZ) {
        struct rlimit rl = { 0, 0 }; /* the command's core is the interesting one, not ours */
        setrlimit(RLIMIT_CORE, &rl);
    }
    signal(sig, SIG_DFL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, sig);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    raise(sig);
    return 128 + sig; /* the signal's default action does not terminate */
}

int og_cmd_run(int argc, char **argv)
{
    enum { O_SUMMARY = 256, O_VERBOSE, O_QUIET, O_DIR, O_LIMIT, O_WARN_AT, O_STACK_DEPTH };
    static const struct option lo[] = {
        { "summary", no_argument, NULL, O_SUMMARY },
        { "verbose", no_argument, NULL, O_VERBOSE },
        { "quiet", no_argument, NULL, O_QUIET },
        { "dir", required_argument, NULL, O_DIR },
        { "limit", required_argument, NULL, O_LIMIT },
        { "warn-at", required_argument, NULL, O_WARN_AT },
        { "stack-depth", required_argument, NULL, O_STACK_DEPTH },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *dir = NULL, *limit = NULL, *warn = NULL, *depth = NULL, *val;
    int summary = 0, verbose = 0, quiet = 0, i = 0, opt;
    /* '+': options end at the command, whose own options are its own */
    while ((opt = og_getopt("run", argc, argv, "+h", lo, &val, &i)) != -1) {
        switch (opt) {
        case 'h':
            og_usage_run(stdout);
            return OG_EXIT_OK;
        case O_SUMMARY:
            summary = 1;
            break;
        case O_VERBOSE:
            verbose = 1;
            break;
        case O_QUIET:
            quiet = 1;
            break;
        case O_DIR:
            dir = val;
            break;
        case O_LIMIT:
            limit = val;
            break;
        case O_WARN_AT:
            warn = val;
            break;
        case O_STACK_DEPTH:
            depth = val;
            break;
        default:
            return OG_EXIT_USAGE;
        }
    }
    if (i >= argc) {
        fputs("oomguard run: no command given\nusage: oomguard run [options] [--] CMD [ARGS...]\n", stderr);
        return OG_EXIT_USAGE;
    }
    char **cmd = argv + i;
    if (depth) {
        char *end;
        long v = strtol(depth, &end, 10);
        if (!*depth || *end || v < RUN_LO_stack_depth || v > RUN_HI_stack_depth) {
            fprintf(stderr, "oomguard run: --stack-depth %s: expected a number from %d to %d\n", depth,
                    RUN_LO_stack_depth, RUN_HI_stack_depth);
            return OG_EXIT_USAGE;
        }
    }
    if ((limit && !*limit) || (warn && !*warn) || (dir && !*dir)) {
        fputs("oomguard run: option values must not be empty\n", stderr);
        return OG_EXIT_USAGE;
    }

    char lib[PATH_MAX];
    if (find_library(lib, sizeof lib) < 0 || set_preload(lib) < 0)
        return OG_RUN_CANNOT_START;
    set_python_adapter(lib);

    /* The dump directory, absolute so that a command changing directory still
     * writes there; shown to the user as they gave it. */
    const char *shown_dir = dir ? dir : getenv("OOMGUARD_DIR");
    char absdir[PATH_MAX];
    if (dir) {
        if (mkdir_p(dir) < 0 || !realpath(dir, absdir)) {
            fprintf(stderr, "oomguard run: --dir %s: %s\n", dir, strerror(errno));
            return OG_RUN_CANNOT_START;
        }
        setenv("OOMGUARD_DIR", absdir, 1);
    } else if (shown_dir && *shown_dir) {
        snprintf(absdir, sizeof absdir, "%s", shown_dir);
    } else {
        shown_dir = ".";
        snprintf(absdir, sizeof absdir, ".");
    }
    if (limit)
        setenv("OOMGUARD_LIMIT", limit, 1);
    if (warn)
        setenv("OOMGUARD_WARN_AT", warn, 1);
    if (depth)
        setenv("OOMGUARD_STACK_DEPTH", depth, 1);
    if (summary)
        setenv("OOMGUARD_SUMMARY", "1", 1);
    if (verbose)
        setenv("OOMGUARD_VERBOSE", "1", 1);
    if (quiet)
        setenv("OOMGUARD_QUIET", "1", 1);
    if (verbose)
        fprintf(stderr, "oomguard: preloading %s; dumps go to %s\n", lib, absdir);

    struct dump_picture before = quiet ? (struct dump_picture){ 0 } : picture_of(absdir);

    /* Block the forwarded signals until the child's pid is known. */
    sigset_t block, old;
    sigemptyset(&block);
    for (int k = 0; k < NFORWARDED; k++)
        sigaddset(&block, FORWARDED[k]);
    sigprocmask(SIG_BLOCK, &block, &old);

    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        fprintf(stderr, "oomguard run: pipe: %s\n", strerror(errno));
        picture_free(&before);
        return OG_RUN_CANNOT_START;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "oomguard run: fork: %s\n", strerror(errno));
        picture_free(&before);
        return OG_RUN_CANNOT_START;
    }
    if (pid == 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(pfd[0]);
        execvp(cmd[0], cmd);
        int e = errno;
        ssize_t w = write(pfd[1], &e, sizeof e);
        (void)w;
        _exit(e == ENOENT ? OG_RUN_NOT_FOUND : OG_RUN_NOT_EXECUTABLE);
    }
    close(pfd[1]);
    g_child = pid;
    for (int k = 0; k < NFORWARDED; k++) {
        struct sigaction cur, sa;
        /* A signal the caller ignores (e.g. SIGINT for a background job) stays ignored. */
        if (sigaction(FORWARDED[k], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = forward;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(FORWARDED[k], &sa, NULL);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);

    int exec_errno = 0;
    ssize_t r;
    do
        r = read(pfd[0], &exec_errno, sizeof exec_errno);
    while (r < 0 && errno == EINTR);
    close(pfd[0]);

    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "oomguard run: waitpid: %s\n", strerror(errno));
            picture_free(&before);
            return OG_RUN_CANNOT_START;
        }
    }
    g_child = 0;
    if (r == (ssize_t)sizeof exec_errno) {
        fprintf(stderr, "oomguard run: %s: %s\n", cmd[0], strerror(exec_errno));
        picture_free(&before);
        return exec_errno == ENOENT ? OG_RUN_NOT_FOUND : OG_RUN_NOT_EXECUTABLE;
    }
    if (!quiet)
        list_dumps(absdir, shown_dir, &before, pid);
    picture_free(&before);
    if (WIFSIGNALED(status))
        return die_like(WTERMSIG(status));
    return WIFEXITED(status) ? WEXITSTATUS(status) : OG_RUN_CANNOT_START;
}
