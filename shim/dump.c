/* Dumps: one record rendered as JSON (docs/dump-format.md) and as text, written
 * atomically next to each other, plus the short stderr summary.
 *
 * Where: OOMGUARD_DIR, else the working directory, else the temp dir, else stderr.
 * How: an unnamed file (O_TMPFILE; where the file system lacks it, a hidden name created
 * O_EXCL, never through a symlink) with mode 0600 in the target directory, written, fsync'ed,
 * then linked to a name no file has, or renamed over this process's own earlier dump, so a
 * reader sees the old dump or the new one, never half of one. */
#include "og.h"
#include "record.h"
#include "strbuf.h"
#include "dump_render.h"
#include "symfill.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The JSON renderer lives in dump_json.c. */

/* ------------------------------------------------------------------ text */

/* Several sizes in one printf: each gets its own buffer, taken in turn (calls are sequenced). */
static const char *human_rot(char (*hb)[32], unsigned *i, og_opt_u64_t v)
{
    char *b = hb[(*i)++ % 8];
    return og_known(v) ? og_bytes_fmt(b, sizeof hb[0], (double)v.v, OG_BYTES_FIXED) : "unknown";
}
/* a count (every value a size: a request can be SIZE_MAX) */
#define H(v) human_rot(hb, &hbi, (og_opt_u64_t){ (v), true })
/* a count that may not have been measured: "unknown" when not */
#define HO(v) human_rot(hb, &hbi, (v))

/* Strings from outside (argv, host and library names, Python frames, what remedies quote) may hold
 * newlines that would forge report lines: such a string is rendered escaped, in a copy kept until
 * the text is done.  Everything else unsafe is escaped over the whole text afterwards. */
typedef struct {
    char *copy[64];
    int n;
} esc_pool_t;

static const char *field(esc_pool_t *pool, const char *s)
{
    if (!s || !og_text_needs_escape(s, false))
        return s ? s : "";
    if (pool->n >= (int)(sizeof pool->copy / sizeof pool->copy[0]))
        return "?";
    og_sb_t e = { 0 };
    og_sb_text_escaped(&e, s, strlen(s), false);
    if (e.failed || !e.buf) {
        og_sb_free(&e);
        return "?";
    }
    return pool->copy[pool->n++] = e.buf;
}
#define T(s) field(&pool, (s))

/* "#N function  file:line  in lib+0xoff": names resolved in this process when known by now
 * (symfill.c), else the dynamic symbol, else "?" */
static void text_frame(og_sb_t *sb, esc_pool_t *pool, int n, const og_frame_t *f)
{
    const og_symfill_ent_t *e = og_symfill_get(f->ip);
    const char *fn = e && e->function[0] ? e->function : f->symbol[0] ? f->symbol : "?";
    og_sb_printf(sb, "      #%d %s", n, field(pool, fn));
    if (e && e->inlined && e->inlined_into[0])
        og_sb_printf(sb, " (inlined into %s)", field(pool, e->inlined_into));
    if (e && e->file[0] && e->line > 0) {
        const char *base = strrchr(e->file, '/');
        og_sb_printf(sb, "  %s:%d", field(pool, base ? base + 1 : e->file), e->line);
    }
    og_sb_printf(sb, " in %s+0x%llx\n", field(pool, f->library), (unsigned long long)f->offset);
}

static void render_text(const og_record_t *r, og_sb_t *sb)
{
    char hb[8][32];
    unsigned hbi = 0;
    esc_pool_t pool = { .n = 0 };
    og_sb_printf(sb, "oomguard %s — %s report\n", OOMGUARD_VERSION, r->status);
    og_sb_printf(sb, "process %d on %s", r->pid, T(r->host));
    if (r->node[0] && strcmp(r->node, r->host) != 0)
        og_sb_printf(sb, " (node %s)", T(r->node));
    if (r->rank >= 0)
        og_sb_printf(sb, ", rank %ld", r->rank);
    if (r->job_id[0])
        og_sb_printf(sb, ", job %s", T(r->job_id));
    og_sb_printf(sb, "\ncommand: %s\nframework: %s\n\n", T(r->cmdline), og_framework_name(r->framework));

    if (r->event.api) {
        if (og_known(r->event.requested_bytes))
            og_sb_printf(sb, "%s of %s (%llu bytes) on device %d failed", r->event.api, HO(r->event.requested_bytes),
                         (unsigned long long)r->event.requested_bytes.v, r->event.device);
        else /* an adapter reported the failure without its size: said so, never "0 B" */
            og_sb_printf(sb, "%s of a size not given on device %d failed", r->event.api, r->event.device);
        if (r->event.caused_by_limit)
            og_sb_puts(sb, " (refused by OOMGUARD_LIMIT)");
        og_sb_printf(sb, ", called from %s", T(r->event.library));
        if (r->event.attempts > 1)
            og_sb_printf(sb, "; %d attempts, %s released in between", r->event.attempts,
                         HO(r->event.released_between_attempts_bytes));
        og_sb_puts(sb, ".\n");
        if (r->event.recovered)
            og_sb_printf(sb, "RECOVERED: a later request of %s succeeded; the program went on.\n",
                         H(r->event.recovered_requested_bytes));
        if (r->event.framework_internal)
            og_sb_printf(sb, "The framework's own allocator refused it (no driver call failed)%s%s%s%s.\n",
                         og_known(r->memory.fw.cap_bytes) ? ": cap " : "",
                         og_known(r->memory.fw.cap_bytes) ? HO(r->memory.fw.cap_bytes) : "",
                         r->memory.fw.cap_source[0] ? " set by " : "", r->memory.fw.cap_source);
        /* the Python lines first: what a Python user looks for (native frames are in the JSON) */
        for (int i = 0; i < r->memory.fw.npy_frames && i < 12; i++)
            og_sb_printf(sb, "%s  %s:%d in %s\n", i ? "" : "Python stack (innermost first):\n",
                         T(r->memory.fw.py_frames[i].file), r->memory.fw.py_frames[i].line,
                         T(r->memory.fw.py_frames[i].function));
        for (int i = 0; i < r->event.nframes && i < 12; i++) {
            if (!i)
                og_sb_puts(sb, "native stack (innermost first):\n");
            text_frame(sb, &pool, i, &r->event.frames[i]);
        }
    }
    og_sb_printf(sb, "device %d: %s (compute capability %d.%d), total %s, free %s", r->device.index, T(r->device.name),
                 r->device.cc_major, r->device.cc_minor, HO(r->device.total_bytes), HO(r->device.free_bytes));
    if (og_known(r->device.limit_bytes))
        og_sb_printf(sb, ", limit %s", HO(r->device.limit_bytes));
    og_sb_puts(sb, "\n\nwhere the memory is\n");
    og_sb_printf(sb, "  this process, tracked          %12s\n", HO(r->memory.process_tracked_bytes));
    og_sb_printf(sb, "    plain allocations            %12s\n", H(r->memory.plain));
    if (r->memory.managed)
        og_sb_printf(sb, "    managed                      %12s\n", H(r->memory.managed));
    if (r->memory.pool_reserved)
        og_sb_printf(sb, "    pools (reserved / in use)    %12s / %s\n", H(r->memory.pool_reserved),
                     H(r->memory.pool_used));
    if (r->memory.vmm_physical)
        og_sb_printf(sb, "    virtual memory (physical)    %12s\n", H(r->memory.vmm_physical));
    og_sb_printf(sb, "  framework (%s)%*s%12s", og_framework_name(r->framework),
                 (int)(19 - strlen(og_framework_name(r->framework))), "", H(r->memory.framework_bytes));
    if (og_known(r->memory.framework_cached_bytes))
        og_sb_printf(sb, ", cached but unused %s (%s)", HO(r->memory.framework_cached_bytes),
                     og_cache_src_name(r->memory.framework_cached_source));
    og_sb_printf(sb, "\n  non-framework (context, libs)  %12s\n", HO(r->memory.non_framework_bytes));
    og_sb_printf(sb, "  process total (NVML)           %12s\n", HO(r->memory.process_used_bytes));
    og_sb_printf(sb, "  other processes                %12s\n", HO(r->memory.other_processes_bytes));
    for (int i = 0; i < r->memory.nother; i++)
        og_sb_printf(sb, "    %spid %-8d %-18s %12s%s\n", r->memory.other[i].visible ? "" : "host ",
                     r->memory.other[i].pid, T(r->memory.other[i].name), H(r->memory.other[i].bytes),
                     r->memory.other[i].child      ? "  (child of this process)"
                     : r->memory.other[i].parent   ? "  (parent of this process: this job)"
                     : r->memory.other[i].sibling  ? "  (worker of the same parent: this job)"
                     : r->memory.other[i].same_job ? "  (this job)"
                                                   : "");
    for (int i = 0; i < r->memory.nunmeasured; i++)
        og_sb_printf(sb, "  not measured: %s\n", T(r->memory.unmeasured[i]));
    if (r->memory.nlibs) {
        og_sb_puts(sb, "\nby library\n");
        for (int i = 0; i < r->memory.nlibs; i++)
            og_sb_printf(sb, "  %-40s %12s in %llu %s%s\n", T(r->memory.by_library[i].library),
                         H(r->memory.by_library[i].bytes), (unsigned long long)r->memory.by_library[i].blocks,
                         r->memory.by_library[i].blocks == 1 ? "block" : "blocks",
                         !r->memory.by_library[i].framework                    ? ""
                         : r->memory.by_library[i].fw_kind == OG_FW_JAX        ? " (framework: jax)"
                         : r->memory.by_library[i].fw_kind == OG_FW_TENSORFLOW ? " (framework: tensorflow)"
                         : r->memory.by_library[i].fw_kind == OG_FW_CUPY       ? " (framework: cupy)"
                         : r->memory.by_library[i].fw_kind == OG_FW_PYTORCH    ? " (framework: pytorch)"
                                                                               : " (framework)");
    }
    og_sb_printf(sb, "\npeak %s at %.3f s; %llu allocation%s, %llu free%s, %llu failure%s\n", H(r->history.peak_bytes),
                 r->history.peak_t_rel, (unsigned long long)r->history.allocs, r->history.allocs == 1 ? "" : "s",
                 (unsigned long long)r->history.frees, r->history.frees == 1 ? "" : "s",
                 (unsigned long long)r->history.failures, r->history.failures == 1 ? "" : "s");
    if (r->history.recovered_episodes) /* the framework's flush-and-retry, counted even when not written */
        og_sb_printf(sb, "%llu failure episode%s recovered up to this record, %llu without a record of its own\n",
                     (unsigned long long)r->history.recovered_episodes, r->history.recovered_episodes == 1 ? "" : "s",
                     (unsigned long long)r->history.recovered_not_written);

    og_sb_printf(sb, "\ndiagnosis: %s", r->diagnosis.primary ? r->diagnosis.primary : "unknown");
    if (og_or(r->diagnosis.shortfall_bytes, 0))
        og_sb_printf(sb, " (short by %s)", HO(r->diagnosis.shortfall_bytes));
    og_sb_puts(sb, "\n");
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        og_sb_printf(sb, "  %-15s %3.0f%%  %s\n", r->diagnosis.causes[i].id, r->diagnosis.causes[i].confidence * 100,
                     T(r->diagnosis.causes[i].summary));

    if (r->nremedies) {
        og_sb_puts(sb, "\nwhat to do, best first\n");
        for (int i = 0; i < r->nremedies; i++) {
            const og_remedy_t *m = &r->remedies[i];
            if (!m->shown)
                continue;
            og_sb_printf(sb, "  %d. %s [%s]\n     %s\n", m->rank, T(m->title ? m->title : m->id), m->id, T(m->why));
            for (int h = 0; h < m->nhow; h++)
                og_sb_printf(sb, "       %s\n", T(m->how[h]));
            if (m->saving && *m->saving)
                og_sb_printf(sb, "     saves: %s; costs: %s\n", m->saving, m->cost ? m->cost : "-");
        }
        int folded = 0;
        for (int i = 0; i < r->nremedies; i++) { /* the rest: one line each */
            const og_remedy_t *m = &r->remedies[i];
            if (m->shown)
                continue;
            if (!folded++)
                og_sb_puts(sb, "also possible\n");
            og_sb_printf(sb, "  %d. %s [%s]%s\n", m->rank, T(m->title ? m->title : m->id), m->id,
                         m->ranking.tier == 3 ? OG_NOT_ENOUGH_ALONE : "");
        }
    }
    if (r->memory.fw.npy_sites) {
        og_sb_puts(sb, "\nPython lines holding the most live memory\n");
        for (int i = 0; i < r->memory.fw.npy_sites && i < 10; i++) {
            const og_py_frame_t *p = &r->memory.fw.py_sites[i];
            og_sb_printf(sb, "  %12s in %llu block%s  %s:%d in %s\n", H(p->bytes), (unsigned long long)p->blocks,
                         p->blocks == 1 ? "" : "s", T(p->file), p->line, T(p->function));
        }
    }
    if (r->nsites) {
        og_sb_puts(sb, "\ntop allocation sites\n");
        for (int i = 0; i < r->nsites && i < 10; i++) {
            const og_top_site_t *t = &r->sites[i];
            og_sb_printf(sb, "  %s in %llu block%s via %s from %s\n", H(t->bytes), (unsigned long long)t->blocks,
                         t->blocks == 1 ? "" : "s", t->api, T(t->library));
            for (int f = 0; f < t->nframes && f < 8; f++)
                text_frame(sb, &pool, f, &t->frames[f]);
        }
    }
    for (int i = 0; i < pool.n; i++)
        free(pool.copy[i]);
}

/* The text twin: what render_text wrote, with every control character but its own newlines
 * escaped and bytes that are not UTF-8 shown as \xNN (docs/dump-format.md). */
void og_dump_text(const og_record_t *r, og_sb_t *sb)
{
    og_sb_t raw = { 0 };
    render_text(r, &raw);
    if (raw.failed)
        sb->failed = true;
    else if (raw.buf)
        og_sb_text_escaped(sb, raw.buf, raw.len, true);
    og_sb_free(&raw);
}

/* ------------------------------------------------------------------ files */

static bool write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Names that exist only while a dump is committed: a named temporary file where the file
 * system has no O_TMPFILE, and the link renamed over this process's own dump.  A fatal
 * signal or _exit meanwhile removes them (og_dump_fatal), so no hidden file is left. */
typedef struct {
    atomic_int dfd; /* -1: free */
    pid_t pid;
    char name[96];
} og_scratch_t;
static og_scratch_t scratch[4] = { { -1, 0, "" }, { -1, 0, "" }, { -1, 0, "" }, { -1, 0, "" } };

static void scratch_set(int slot, int dfd, const char *name)
{
    snprintf(scratch[slot].name, sizeof scratch[slot].name, "%s", name);
    scratch[slot].pid = getpid();
    atomic_store(&scratch[slot].dfd, dfd);
}
static void scratch_clear(int slot) { atomic_store(&scratch[slot].dfd, -1); }

/* Set by og_dump_fatal before it removes the scratch names: another thread still writing a dump
 * must not create a new hidden file in the moment before the process dies.  A writer brackets each
 * creation of a published name with creation_begin/creation_end and checks `dying` on both sides;
 * the handler, after setting `dying`, waits (bounded) for a writer in another thread to leave that
 * bracket before it removes the names.  So a name is either removed by the writer that saw `dying`
 * or exists when the handler removes it: the process cannot die between the creation and the check
 * (a CI run once caught exactly that: the writer's linkat landed after the handler's unlinkat). */
static atomic_int dying_pid;
static atomic_int creating_tid; /* the thread inside the bracket; 0: none */
static bool dying(void) { return atomic_load(&dying_pid) == (int)getpid(); }
static int this_tid(void) { return (int)syscall(SYS_gettid); }

static bool creation_begin(void)
{
    atomic_store(&creating_tid, this_tid());
    if (!dying())
        return true;
    atomic_store(&creating_tid, 0);
    return false;
}
static void creation_end(void) { atomic_store(&creating_tid, 0); }

/* Async-signal-safe: at most ~200 ms, since a SIGKILL may follow a SIGTERM closely. */
static void wait_for_creation(void)
{
    int me = this_tid();
    for (int i = 0; i < 2000; i++) {
        int t = atomic_load(&creating_tid);
        if (t == 0 || t == me) /* the handler interrupted the writer itself: nothing to wait for */
            return;
        struct timespec ts = { 0, 100 * 1000 };
        nanosleep(&ts, NULL);
    }
}

static void hidden_name(char *buf, size_t n)
{
    static atomic_uint seq;
    snprintf(buf, n, ".oomguard-%d-%x-%llx.tmp", (int)getpid(), atomic_fetch_add(&seq, 1),
             (unsigned long long)og_now_ns());
}

/* A writer holds its temporary file's lock (flock: per open file, dropped by the kernel however
 * the writer dies) for as long as it lives: that is how a sweep tells a write in progress from
 * what a SIGKILL left (sweep_orphans).  False: a sweep in another process took the new hidden
 * file for an orphan in the moment before the lock (its link count is 0 now); the caller makes
 * another.  No lock on this file system: the sweep falls back to the file's age. */
static bool claim(int fd, bool named)
{
    for (int i = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; i++) {
        if ((errno != EWOULDBLOCK && errno != EINTR) || !named)
            return true;
        if (i == 200)
            return false; /* a sweep holds it: it is about to go */
        struct timespec ts = { 0, 50 * 1000 };
        nanosleep(&ts, NULL);
    }
    struct stat st;
    return !named || fstat(fd, &st) != 0 || st.st_nlink > 0;
}

/* One file of a dump before it has its name: an unnamed O_TMPFILE, else a hidden file. */
typedef struct {
    int fd;
    int slot;
    char tmpname[96]; /* "" for an O_TMPFILE */
} og_tmp_t;

static bool tmp_open(int dfd, og_tmp_t *t, bool named)
{
    t->tmpname[0] = 0;
    if (!named) {
        t->fd = openat(dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
        return t->fd >= 0 && claim(t->fd, false); /* its hidden link (tmp_replace) is this locked file */
    }
    for (int k = 0; k < 16; k++) {
        hidden_name(t->tmpname, sizeof t->tmpname);
        scratch_set(t->slot, dfd, t->tmpname);
        if (!creation_begin()) {
            scratch_clear(t->slot);
            break;
        }
        t->fd = openat(dfd, t->tmpname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (t->fd >= 0 && dying()) {
            unlinkat(dfd, t->tmpname, 0);
            close(t->fd);
            t->fd = -1;
            scratch_clear(t->slot);
            creation_end();
            break;
        }
        creation_end();
        if (t->fd >= 0 && claim(t->fd, true))
            return true;
        if (t->fd >= 0) { /* swept before it was locked: another name */
            close(t->fd);
            t->fd = -1;
            scratch_clear(t->slot);
            continue;
        }
        scratch_clear(t->slot);
        if (errno != EEXIST)
            break;
    }
    t->tmpname[0] = 0;
    return false;
}

/* Gives the file `name`, failing with EEXIST when the name is taken: the exclusive claim. */
static int tmp_link(int dfd, const og_tmp_t *t, const char *name)
{
    if (t->tmpname[0])
        return linkat(dfd, t->tmpname, dfd, name, 0);
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", t->fd);
    return linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW);
}

/* Replaces `name` (this process's own file) atomically. */
static int tmp_replace(int dfd, og_tmp_t *t, const char *name)
{
    if (t->tmpname[0]) {
        if (renameat(dfd, t->tmpname, dfd, name) != 0)
            return -1;
        scratch_clear(t->slot);
        t->tmpname[0] = 0;
        return 0;
    }
    char hidden[96];
    for (int k = 0; k < 16; k++) {
        hidden_name(hidden, sizeof hidden);
        scratch_set(t->slot, dfd, hidden);
        if (!creation_begin()) {
            scratch_clear(t->slot);
            return -1;
        }
        if (tmp_link(dfd, t, hidden) == 0) {
            if (dying()) {
                unlinkat(dfd, hidden, 0);
                scratch_clear(t->slot);
                creation_end();
                return -1;
            }
            creation_end();
            int r = renameat(dfd, hidden, dfd, name), e = errno;
            if (r != 0)
                unlinkat(dfd, hidden, 0);
            scratch_clear(t->slot);
            errno = e;
            return r;
        }
        creation_end();
        scratch_clear(t->slot);
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

static void tmp_close(int dfd, og_tmp_t *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    if (t->tmpname[0]) {
        unlinkat(dfd, t->tmpname, 0);
        scratch_clear(t->slot);
        t->tmpname[0] = 0;
    }
}

/* A SIGKILL (or a power cut) between creating a hidden name and renaming it cannot be caught, so
 * a hidden temporary file may outlive its writer (on a file system without O_TMPFILE, or the
 * moment a dump is renamed over an older one).  A live writer holds its file's lock (claim), so a
 * file of ours whose lock can be taken is an orphan, whoever made it (its pid may be another
 * namespace's).  Where the file system has no locks, a file older than OG_ORPHAN_AGE_S is (a
 * write lasts milliseconds).  Swept when the process starts, in its dump directory
 * (og_dump_sweep_start), and by the first dump it writes in any directory.  Only this uid's
 * regular files named like ours; others' are not ours to judge (and the sticky bit of a shared
 * directory forbids it anyway). */
#define OG_ORPHAN_AGE_S 600
#define OG_SWEEP_MAX_ENTRIES \
    1024 /* a start-up reads no more (~1.5 us each): a bigger directory is swept by the first dump */

static bool scratch_like(const char *n)
{
    size_t len = strlen(n);
    return strncmp(n, ".oomguard-", 10) == 0 && len > 14 && strcmp(n + len - 4, ".tmp") == 0;
}

/* Is this hidden file an orphan?  Its lock tells (taken: removed here, under the lock). */
static void sweep_one(int dfd, const char *name, const struct stat *st, time_t now)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat fs;
    if (fd < 0 || fstat(fd, &fs) != 0 || fs.st_dev != st->st_dev || fs.st_ino != st->st_ino) {
        if (fd >= 0)
            close(fd);
        return;
    }
    bool orphan;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        orphan = true; /* no writer holds it */
    else
        orphan = errno != EWOULDBLOCK && now - st->st_mtime > OG_ORPHAN_AGE_S; /* no locks here */
    struct stat again;
    if (orphan && fstatat(dfd, name, &again, AT_SYMLINK_NOFOLLOW) == 0 && again.st_ino == fs.st_ino &&
        again.st_dev == fs.st_dev)
        unlinkat(dfd, name, 0);
    close(fd);
}

static void sweep_orphans(int dfd, long max_entries)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    time_t now = time(NULL);
    uid_t me = geteuid();
    struct dirent *e;
    for (long n = 0; (e = readdir(d)) && n < max_entries; n++) {
        struct stat st;
        if (scratch_like(e->d_name) && fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == me)
            sweep_one(dfd, e->d_name, &st, now);
    }
    closedir(d);
}

/* At start-up, in the dump directory (OOMGUARD_DIR, else the working directory): what earlier
 * processes killed there left is removed now, not only when this one writes a dump. */
void og_dump_sweep_start(void)
{
    int dfd = open(og_opt.dir_s[0] ? og_opt.dir_s : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return;
    sweep_orphans(dfd, OG_SWEEP_MAX_ENTRIES);
    close(dfd);
}

/* The names this process holds: its dump there is replaced in place, and no other file is
 * ever replaced.  Processes in different pid namespaces share a host name and a pid (1, in
 * containers), so the name alone does not say whose a file is: the inode does.  A snapshot's
 * file and a failure's are held apart: neither ever replaces the other. */
typedef struct {
    dev_t dir_dev, file_dev;
    ino_t dir_ino, file_ino;
    bool snap;
    char base[540];
} og_owned_t;
static og_owned_t owned[8]; /* guarded by write_lock */
static int nowned;
#define OG_NOWNED ((int)(sizeof owned / sizeof owned[0]))

static og_owned_t *owned_in(const struct stat *dir, bool snap)
{
    for (int i = 0; i < nowned; i++)
        if (owned[i].dir_dev == dir->st_dev && owned[i].dir_ino == dir->st_ino && owned[i].snap == snap)
            return &owned[i];
    return NULL;
}

/* Writes base.json and base.txt in dir, both or neither; `path` gets the JSON's path.
 * `named`: hidden temporary files instead of O_TMPFILE (file systems without it). */
static bool write_pair(const char *dir, const char *base, bool snap, const og_sb_t *json, const og_sb_t *text,
                       char *path, size_t pathlen, bool named, bool *retry_named)
{
    *retry_named = false;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return false;
    og_tmp_t tj = { .fd = -1, .slot = 0 }, tt = { .fd = -1, .slot = 1 };
    bool ok = false;
    struct stat ds, fs;
    char jname[600], tname[600];
    if (fstat(dfd, &ds) != 0 || !tmp_open(dfd, &tj, named) || !tmp_open(dfd, &tt, named)) {
        *retry_named = !named && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL);
        goto out;
    }
    if (!write_all(tj.fd, json->buf, json->len) || fsync(tj.fd) != 0 || !write_all(tt.fd, text->buf, text->len) ||
        fsync(tt.fd) != 0)
        goto out;
    og_owned_t *o = owned_in(&ds, snap);
    if (o) {
        snprintf(jname, sizeof jname, "%s.json", o->base);
        snprintf(tname, sizeof tname, "%s.txt", o->base);
    }
    if (o && fstatat(dfd, jname, &fs, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fs.st_mode) && fs.st_dev == o->file_dev &&
        fs.st_ino == o->file_ino) {
        /* our own dump (a recovery, a newer failure): text first, so the JSON's text is there */
        if (tmp_replace(dfd, &tt, tname) != 0 || tmp_replace(dfd, &tj, jname) != 0)
            goto out;
        if (fstat(tj.fd, &fs) == 0) { /* the new inode is ours now */
            o->file_dev = fs.st_dev;
            o->file_ino = fs.st_ino;
        }
    } else {
        /* claim a name no file has: the documented one when it is free, else base-2, -3 ... */
        for (int n = 1;; n++) {
            char b[540];
            if (n == 1)
                snprintf(b, sizeof b, "%s", base);
            else
                snprintf(b, sizeof b, "%s-%d", base, n);
            snprintf(jname, sizeof jname, "%s.json", b);
            snprintf(tname, sizeof tname, "%s.txt", b);
            if (tmp_link(dfd, &tj, jname) == 0) {
                if (tmp_link(dfd, &tt, tname) == 0) {
                    if (!o) { /* the first dump of this process in this directory */
                        o = nowned < OG_NOWNED ? &owned[nowned++] : &owned[OG_NOWNED - 1];
                        sweep_orphans(dfd, LONG_MAX);
                    }
                    o->snap = snap;
                    o->dir_dev = ds.st_dev;
                    o->dir_ino = ds.st_ino;
                    snprintf(o->base, sizeof o->base, "%s", b);
                    if (fstat(tj.fd, &fs) == 0) {
                        o->file_dev = fs.st_dev;
                        o->file_ino = fs.st_ino;
                    }
                    break;
                }
                int e = errno;
                unlinkat(dfd, jname, 0); /* just made: the pair lands together or not at all */
                errno = e;
            }
            if (errno != EEXIST || n >= 1000) {
                /* no /proc to link an O_TMPFILE through: hidden named files instead */
                *retry_named = !named && errno != EEXIST && errno != ENOSPC && errno != EDQUOT && errno != EROFS &&
                               errno != EACCES;
                goto out;
            }
        }
    }
    fsync(dfd);
    snprintf(path, pathlen, "%s/%s", dir, jname);
    ok = true;
out:;
    int saved = errno;
    tmp_close(dfd, &tj);
    tmp_close(dfd, &tt);
    close(dfd);
    errno = saved;
    return ok;
}

static atomic_int warned_dir;
static atomic_llong dumps_written;
static atomic_int warned_budget;
static atomic_llong briefs_written;

/* Per device, the failure episode whose record was last admitted (its first attempt's time; 0
 * none), how many of its failed attempts were counted (its later rewrites are free) and how many
 * budget units they took (given back if it recovers). */
static struct {
    _Atomic uint64_t key;
    atomic_int attempts;
    atomic_llong units;
} on_disk[OG_MAX_DEVICES];

/* Episodes that recover (PyTorch's flush-and-retry: a failed cudaMalloc, the cache released, the
 * retry succeeds) are not what OOMGUARD_MAX_DUMPS is for: a generation loop can make hundreds of
 * them before its one real failure, and that failure must still be measured.  So:
 *  - a recovered episode gives its budget units back: the budget counts unrecovered failures
 *    (and warnings, exit summaries);
 *  - recovered episodes have their own allowance, OG_RECOVERED_FULL records (at most
 *    OOMGUARD_MAX_DUMPS): each costs a capture and two writes (the failure, then its recovery);
 *  - past it, on a device where recovered episodes needed up to `depth` failed attempts, a failed
 *    attempt within that depth is captured but not written: the record is held in memory and
 *    written only if its episode proves final (a newer failure on the device, the framework's own
 *    report of the failure, a success long after, exit); a recovery drops it.  A later attempt
 *    than any recovered episode needed is captured and written at once, as before.
 * Counted per device for the dump (history.counters): episodes recovered, and how many of them
 * have no record of their own in the file. */
#define OG_RECOVERED_FULL 4
static atomic_llong recovered_written; /* recovered records written in full */
static struct {
    atomic_llong recovered, not_written;
    atomic_int depth; /* the most failed attempts a recovered episode needed */
} episodes[OG_MAX_DEVICES];

/* The failed attempt captured but not written yet, per device (swapped with atomics). */
typedef struct {
    og_record_t *rec;
    og_episode_t ep;
} og_held_t;
static _Atomic(og_held_t *) held[OG_MAX_DEVICES];

/* A copy of the recovered record last written: at exit the file's recovered record is given the
 * counts of then (the recoveries after it were counted, not written). */
static _Atomic(og_record_t *) last_recovered;

void og_dump_episode_counts(int device, uint64_t *recovered, uint64_t *not_written)
{
    *recovered = *not_written = 0;
    if (device < 0 || device >= OG_MAX_DEVICES)
        return;
    *recovered = (uint64_t)atomic_load(&episodes[device].recovered);
    *not_written = (uint64_t)atomic_load(&episodes[device].not_written);
}

/* The latest failure the budget refused, per device, while its episode is open: if it ends
 * unrecovered and the file holds no unrecovered failure (only a recovery, a warning, an exit
 * summary), a record made from the episode alone is written when that is known (exit, or a
 * success long after), so the file never says "recovered" for a process whose last failure was
 * not.  Guarded by pending_lock. */
static struct {
    bool set;
    og_episode_t ep;
} owed[OG_MAX_DEVICES];

/* One file per process: a less serious record never replaces a more serious one (an exit
 * summary or a warning must not overwrite the evidence of a failure).  A failure's own
 * "recovered" rewrite is allowed (same device), and a new failure replaces an old one.
 * The check and the write happen under write_lock, so two threads cannot interleave them;
 * other processes never replace this one's file (the claim above). */
static int severity(const char *status)
{
    return strcmp(status, "oom") == 0         ? 3
           : strcmp(status, "recovered") == 0 ? 2
           : strcmp(status, "warning") == 0   ? 1
                                              : 0;
}
static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int written_severity = -1; /* written under write_lock; read anywhere */
static atomic_uint written_gen;          /* +1 per dump written (under write_lock): symfill.c's rewrite check */
static atomic_int written_device = -1;

static bool severity_allows(int sev, int device)
{
    int cur = atomic_load(&written_severity);
    return sev >= cur || (sev == 2 && cur == 3 && atomic_load(&written_device) == device);
}

/* The budget (OOMGUARD_MAX_DUMPS) counts what happened, not how often a file was rewritten: each
 * failed call dumped, each warning, each exit summary is one unit.  A failure's own record is
 * rewritten in place within the unit it already has: when its episode recovers (PyTorch's
 * flush-and-retry makes one by itself; the unit is then given back, see `episodes`), and when the
 * framework's numbers arrive for it. */
static bool budget_take(void)
{
    if (atomic_load_explicit(&dumps_written, memory_order_relaxed) >= og_opt.max_dumps ||
        atomic_fetch_add(&dumps_written, 1) >= og_opt.max_dumps) {
        if (!atomic_exchange(&warned_budget, 1))
            og_warn("%lld dumps written (OOMGUARD_MAX_DUMPS); later failures are counted but not measured",
                    og_opt.max_dumps);
        return false;
    }
    return true;
}

/* Before any capture: is a dump of this status wanted, and is one left in the budget?
 * Past OOMGUARD_MAX_DUMPS a failure costs this check, not a capture.  `free_rewrite`: the
 * record of a failure already counted (no unit taken). */
static bool dump_admit(const char *status, int device, bool free_rewrite)
{
    if (!severity_allows(severity(status), device)) {
        if (og_opt.verbose)
            og_log("%s record not written: the dump file holds a more serious record", status);
        return false;
    }
    return free_rewrite || budget_take();
}

static const char *dump_dir_fallback(void)
{
    const char *tmpdir = getenv("TMPDIR");
    return tmpdir && *tmpdir ? tmpdir : "/tmp";
}

/* The host name as part of a file name: it is untrusted (any bytes a container was given), so
 * only letters, digits, '.', '_' and '-' are kept, anything else becomes '_'; at most 64 bytes. */
static void name_part(char *out, size_t n, const char *host)
{
    size_t i = 0;
    for (; host[i] && i + 1 < n; i++) {
        unsigned char c = (unsigned char)host[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                  c == '-';
        out[i] = ok ? (char)c : '_';
    }
    out[i] = 0;
    if (!i || !strcmp(out, ".") || !strcmp(out, ".."))
        snprintf(out, n, "unknown");
}

/* The file name of a record's dump, without directory and extension. */
static void dump_base(const og_record_t *r, char *base, size_t n)
{
    char host[65];
    name_part(host, sizeof host, r->host);
    if (r->rank >= 0)
        snprintf(base, n, "oomguard-%s-%d-rank%ld", host, r->pid, r->rank);
    else
        snprintf(base, n, "oomguard-%s-%d", host, r->pid);
}

/* Writes both files (budget already taken); `path` gets the JSON path, "" when all failed;
 * *gen the generation written. */
static void write_dump(const og_record_t *r, char *path, size_t pathlen, unsigned *gen)
{
    path[0] = 0;
    og_fatal_arm();
    og_sb_t json = { 0 }, text = { 0 };
    og_dump_json(r, &json);
    og_dump_text(r, &text);
    if (json.failed || text.failed) {
        og_warn("could not render the dump (out of host memory)");
        goto out;
    }
    char base[512];
    dump_base(r, base, sizeof base);
    /* a snapshot on request has a file of its own: it never replaces a failure's evidence,
     * and the next snapshot replaces it */
    bool snap = strcmp(r->status, "snapshot") == 0;
    if (snap)
        snprintf(base + strlen(base), sizeof base - strlen(base), "-snapshot");
    /* the working directory may be gone (getcwd fails): the temp dirs still work */
    char cwd[4096];
    const char *dirs[4] = { 0 };
    int nd = 0;
    if (og_opt.dir_s[0])
        dirs[nd++] = og_opt.dir_s;
    else if (getcwd(cwd, sizeof cwd))
        dirs[nd++] = cwd;
    const char *tmp = dump_dir_fallback();
    if (!nd || strcmp(dirs[0], tmp) != 0)
        dirs[nd++] = tmp;
    if (strcmp(tmp, "/tmp") != 0 && strcmp(dirs[0], "/tmp") != 0)
        dirs[nd++] = "/tmp";
    pthread_mutex_lock(&write_lock);
    if (!snap && !severity_allows(severity(r->status), r->event.device)) {
        pthread_mutex_unlock(&write_lock); /* a more serious record landed meanwhile */
        goto out;
    }
    for (int i = 0; i < nd; i++) {
        bool named;
        bool ok = write_pair(dirs[i], base, snap, &json, &text, path, pathlen, false, &named) ||
                  (named && write_pair(dirs[i], base, snap, &json, &text, path, pathlen, true, &named));
        if (ok) {
            if (!snap) {
                atomic_store(&written_severity, severity(r->status));
                atomic_store(&written_device, r->event.device);
            }
            /* a snapshot is a file of its own: the failure's dump is still the newest one */
            *gen = snap ? atomic_load(&written_gen) : atomic_fetch_add(&written_gen, 1) + 1;
            pthread_mutex_unlock(&write_lock);
            if (i > 0 && !atomic_exchange(&warned_dir, 1))
                og_warn("could not write the dump in %s; wrote it in %s instead",
                        og_opt.dir_s[0] ? og_opt.dir_s : "the working directory", dirs[i]);
            goto out;
        }
        if (!atomic_exchange(&warned_dir, 1) || og_opt.verbose)
            og_warn("cannot write a dump in %s: %s", dirs[i], strerror(errno));
    }
    pthread_mutex_unlock(&write_lock);
    /* nowhere to write: the text goes to stderr so the evidence is not lost */
    og_warn("no writable directory for the dump; here it is:");
    if (write(STDERR_FILENO, text.buf, text.len) < 0) {
        /* nothing more we can do */
    }
out:
    og_sb_free(&json);
    og_sb_free(&text);
}

/* ------------------------------------------------------------------ stderr summary */

/* One summary per device, printed once per failure the framework did not recover from.
 * Whether it recovers is known only later, so it is held here and printed when the
 * episode is over unrecovered: a newer failure on the same device, a success long after,
 * exit, _exit or a fatal signal.  The fatal paths cannot take locks: each slot has an
 * atomic state, and only a READY slot is printed (then emptied) by whoever takes it. */
enum { P_EMPTY, P_BUSY, P_READY };
typedef struct {
    atomic_int state;
    char text[2048];
} og_pending_t;
static og_pending_t pending[OG_MAX_DEVICES];
static atomic_int pending_pid; /* a vfork child shares these: it prints nothing */
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;

/* Async-signal-safe: prints a READY slot once. */
static void print_pending(int d)
{
    int want = P_READY;
    if (!atomic_compare_exchange_strong(&pending[d].state, &want, P_BUSY))
        return;
    if (!og_opt.quiet && write(STDERR_FILENO, pending[d].text, strlen(pending[d].text)) < 0) {
        /* stderr closed: the dump is on disk anyway */
    }
    atomic_store(&pending[d].state, P_EMPTY);
}

static void flush_pending(int device)
{
    pthread_mutex_lock(&pending_lock);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        if (device < 0 || d == device)
            print_pending(d);
    pthread_mutex_unlock(&pending_lock);
}

static void store_pending(int d, const char *text)
{
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    pthread_mutex_lock(&pending_lock);
    atomic_store(&pending[d].state, P_BUSY);
    snprintf(pending[d].text, sizeof pending[d].text, "%s", text);
    atomic_store(&pending_pid, (int)getpid());
    atomic_store(&pending[d].state, P_READY);
    pthread_mutex_unlock(&pending_lock);
    og_fatal_arm();
}

static void clear_pending(int d)
{
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    pthread_mutex_lock(&pending_lock);
    atomic_store(&pending[d].state, P_EMPTY);
    pthread_mutex_unlock(&pending_lock);
}

/* The summary's lines on what the job was doing and what its memory is for (event.phase,
 * memory.framework.roles): the roles that hold bytes, the largest holder named. */
static void summary_roles(og_sb_t *sb, const og_record_t *r)
{
    static const char *const labels[OG_NROLES] = {
#define OG_ROLE(key, label, quiet) label,
#include "roles.def"
#undef OG_ROLE
    };
    const og_framework_view_t *f = &r->memory.fw;
    char b[32];
    if (f->phase[0]) {
        og_sb_printf(sb, "oomguard: phase: %s", f->phase);
        if (f->has_phase_site || f->has_phase_frame) { /* the program's own line, else the frame that decided */
            const og_py_frame_t *w = f->has_phase_site ? &f->phase_site : &f->phase_frame;
            const char *slash = strrchr(w->file, '/');
            og_sb_printf(sb, " (%s:%d in %s)", slash ? slash + 1 : w->file, w->line, w->function);
        }
        og_sb_puts(sb, "\n");
    }
    if (!f->roles.has)
        return;
    og_sb_puts(sb, "oomguard: memory by role:");
    int n = 0;
    for (int i = 0; i < OG_NROLES; i++) {
        og_opt_u64_t v = f->roles.bytes[i];
        if (og_known(v) ? v.v == 0 : i != OG_ROLE_activations)
            continue;
        og_sb_printf(sb, "%s %s %s", n++ ? "," : "", labels[i],
                     og_known(v) ? og_bytes_fmt(b, sizeof b, (double)v.v, OG_BYTES_FIXED) : "unknown");
        if (i == OG_ROLE_held_by_python && f->roles.nholders)
            og_sb_printf(sb, " (%s %s)", f->roles.holders[0].label,
                         og_bytes_fmt(b, sizeof b, (double)f->roles.holders[0].bytes, OG_BYTES_FIXED));
    }
    og_sb_puts(sb, n ? "\n" : " none measured\n");
}

static void set_pending(const og_record_t *r, const char *path)
{
    char hb[8][32];
    unsigned hbi = 0;
    og_sb_t sb = { 0 };
    og_sb_printf(&sb, "oomguard: %s of %s on device %d (%s) failed: %s free of %s", r->event.api,
                 og_known(r->event.requested_bytes) ? HO(r->event.requested_bytes) : "a size not given",
                 r->device.index, r->device.name, HO(r->device.free_bytes), HO(r->device.total_bytes));
    if (og_known(r->device.limit_bytes))
        og_sb_printf(&sb, " (limit %s)", HO(r->device.limit_bytes));
    og_sb_puts(&sb, "\n");
    summary_roles(&sb, r);
    /* the program's line, after what the memory is for: the innermost Python frame outside the frameworks' own
     * code and the standard library */
    const og_py_frame_t *line = NULL;
    for (int i = 0; i < r->memory.fw.npy_frames && !line; i++)
        if (!og_python_file_not_program(r->memory.fw.py_frames[i].file))
            line = &r->memory.fw.py_frames[i];
    if (!line && r->memory.fw.has_phase_site) /* the failing thread ran only the framework's code: its caller's */
        line = &r->memory.fw.phase_site;
    if (!line && r->memory.fw.npy_frames > 0)
        line = &r->memory.fw.py_frames[r->memory.fw.npy_frames - 1];
    if (line)
        og_sb_printf(&sb, "oomguard: failing Python line: %s:%d in %s\n", line->file, line->line, line->function);
    og_sb_printf(&sb, "oomguard: diagnosis: %s", r->diagnosis.primary ? r->diagnosis.primary : "unknown");
    if (r->diagnosis.ncauses)
        og_sb_printf(&sb, " — %s", r->diagnosis.causes[0].summary);
    og_sb_puts(&sb, "\n");
    int folded = 0;
    for (int i = 0; i < r->nremedies; i++)
        if (r->remedies[i].shown)
            og_sb_printf(&sb, "oomguard:   %d. %s%s%s\n", r->remedies[i].rank,
                         r->remedies[i].title ? r->remedies[i].title : r->remedies[i].id,
                         r->remedies[i].nhow ? ": " : "", r->remedies[i].nhow ? r->remedies[i].how[0] : "");
    for (int i = 0; i < r->nremedies; i++) /* the rest, by id on one line */
        if (!r->remedies[i].shown)
            og_sb_printf(&sb, "%s%s", folded++ ? ", " : "oomguard:   also possible: ", r->remedies[i].id);
    if (folded)
        og_sb_puts(&sb, "\n");
    if (path[0])
        og_sb_printf(&sb, "oomguard: full report: oomguard report %s\n", path);
    og_sb_t safe = { 0 }; /* a terminal reads it: nothing from the record may act on it */
    if (sb.buf)
        og_sb_text_escaped(&safe, sb.buf, sb.len, true);
    store_pending(r->event.device, safe.buf ? safe.buf : "");
    og_sb_free(&safe);
    og_sb_free(&sb);
}

/* Past the dump budget there is no record: say what failed, from the episode alone. */
static void set_pending_brief(const og_episode_t *ep)
{
    char msg[512], hb[32];
    snprintf(
        msg, sizeof msg, "oomguard: %s of %s on device %d failed (not measured: OOMGUARD_MAX_DUMPS=%lld reached)\n",
        ep->hook >= 0 && ep->hook < OG_H_COUNT ? og_hooks[ep->hook].name : "allocation",
        ep->requested_known ? og_bytes_fmt(hb, sizeof hb, (double)ep->requested, OG_BYTES_FIXED) : "a size not given",
        ep->device, og_opt.max_dumps);
    store_pending(ep->device, msg);
}

/* A fork child writes its own file (its own pid) and may have been forked while another
 * thread held one of these locks. */
void og_dump_atfork_child(void)
{
    pthread_mutex_init(&pending_lock, NULL);
    pthread_mutex_init(&write_lock, NULL);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        atomic_store(&pending[d].state, P_EMPTY);
    for (int i = 0; i < 4; i++)
        scratch_clear(i);
    atomic_store(&creating_tid, 0);
    nowned = 0;
    atomic_store(&written_severity, -1);
    atomic_store(&written_device, -1);
    atomic_store(&dumps_written, 0);
    atomic_store(&briefs_written, 0);
    atomic_store(&recovered_written, 0);
    atomic_store(&last_recovered, NULL); /* the parent's */
    for (int d = 0; d < OG_MAX_DEVICES; d++) {
        atomic_store(&on_disk[d].key, 0);
        atomic_store(&on_disk[d].units, 0);
        owed[d].set = false;
        /* the parent's held record is the parent's to write (left to it, not freed here) */
        atomic_store(&held[d], NULL);
        atomic_store(&episodes[d].recovered, 0);
        atomic_store(&episodes[d].not_written, 0);
        atomic_store(&episodes[d].depth, 0);
    }
}

static void write_owed(int device);
static void write_held(int device);
static void refresh_recovered(void);
static void dump_flush_pending(int device)
{
    write_held(device);
    if (device < 0) /* exit */
        refresh_recovered();
    flush_pending(device);
    write_owed(device);
}

/* The process is dying (fatal signal, _exit): async-signal-safe only. */
void og_dump_fatal(void)
{
    int pid = (int)getpid();
    atomic_store(&dying_pid, pid);
    wait_for_creation();
    for (int i = 0; i < 4; i++) {
        if (scratch[i].pid != pid)
            continue;
        int dfd = atomic_exchange(&scratch[i].dfd, -1);
        if (dfd >= 0)
            unlinkat(dfd, scratch[i].name, 0);
    }
    if (atomic_load(&pending_pid) != pid)
        return;
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        print_pending(d);
}

/* ------------------------------------------------------------------ symbolized rewrite */

/* symfill.c, once names and lines are known: the same record rendered again (now with
 * them) over the same files, only while they are still the newest dump of this process
 * (generation `gen`) and still ours at `path`.  Never a new name. */
void og_dump_rewrite(const og_record_t *r, const char *path, unsigned gen)
{
    og_sb_t json = { 0 }, text = { 0 };
    og_dump_json(r, &json);
    og_dump_text(r, &text);
    const char *slash = strrchr(path, '/');
    size_t plen = strlen(path);
    if (json.failed || text.failed || !slash || plen < 6 || strcmp(path + plen - 5, ".json") != 0)
        goto out;
    char dir[4800], base[600];
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    snprintf(base, sizeof base, "%.*s", (int)(plen - 5 - (size_t)(slash + 1 - path)), slash + 1);
    pthread_mutex_lock(&write_lock);
    struct stat ds, fs;
    og_owned_t *o = stat(dir, &ds) == 0 ? owned_in(&ds, false) : NULL;
    if (atomic_load(&written_gen) == gen && !dying() && o && strcmp(o->base, base) == 0 && lstat(path, &fs) == 0 &&
        S_ISREG(fs.st_mode) && fs.st_dev == o->file_dev && fs.st_ino == o->file_ino) {
        char written[4800];
        bool named;
        if (write_pair(dir, base, false, &json, &text, written, sizeof written, false, &named) ||
            (named && write_pair(dir, base, false, &json, &text, written, sizeof written, true, &named)))
            atomic_fetch_add(&written_gen, 1);
    }
    pthread_mutex_unlock(&write_lock);
out:
    og_sb_free(&json);
    og_sb_free(&text);
}

/* ------------------------------------------------------------------ entry points */

/* The one sequence every dump takes once admitted: capture, write, hand the record and the path written ("" when
 * none) to `after` (stderr summary, log line) while it is alive, free.  Admission stays with the callers: a
 * refused failure still leaves its brief stderr summary. */
typedef void og_dump_after_fn(const og_record_t *rec, const og_episode_t *ep, const char *path);
static void capture_write_free(const char *status, const og_episode_t *ep, int device, og_dump_after_fn *after)
{
    og_record_t *rec = og_record_capture(status, ep, device);
    if (!rec)
        return;
    char path[4800];
    unsigned gen = 0;
    write_dump(rec, path, sizeof path, &gen);
    after(rec, ep, path);
    og_symfill_schedule(rec, path, gen); /* names and lines, later; frees rec */
}

static void after_status(const og_record_t *rec, const og_episode_t *ep, const char *path)
{
    if (og_opt.verbose)
        og_log("%s dump written: %s", rec->status, path[0] ? path : "(none)");
}

static void dump_capture_write(const char *status, int device)
{
    if (dump_admit(status, device, false))
        capture_write_free(status, NULL, device, after_status);
    else if (og_opt.verbose)
        og_log("%s dump written: (none)", status);
}

/* `oomguard snapshot`: the process is asked for its picture now (shim/live.c).  Neither the
 * severity order nor OOMGUARD_MAX_DUMPS applies: the user asked, and the file is its own. */
bool og_dump_snapshot(int device, const char *note, char *path, size_t n)
{
    og_record_t *rec = og_record_capture("snapshot", NULL, device);
    if (!rec)
        return false;
    if (note && note[0])
        og_unmeasured(rec, OG_UM_FRAMEWORK_STALE, "%s", note);
    char p[4800];
    unsigned gen; /* names are for failures' dumps: a snapshot is not named later */
    write_dump(rec, p, sizeof p, &gen);
    og_record_free(rec);
    snprintf(path, n, "%s", p);
    return p[0] != 0;
}

static void after_failure(const og_record_t *rec, const og_episode_t *ep, const char *path)
{
    set_pending(rec, path);
    if (og_opt.verbose)
        og_log("dump written: %s", path[0] ? path : "(stderr)");
}

static void owe(int d, const og_episode_t *ep)
{
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    pthread_mutex_lock(&pending_lock);
    owed[d].set = ep != NULL;
    if (ep)
        owed[d].ep = *ep;
    pthread_mutex_unlock(&pending_lock);
}

/* The held attempt of this episode, taken out; NULL if the device holds none of it. */
static og_held_t *held_take(int d, uint64_t key)
{
    og_held_t *h = atomic_load(&held[d]);
    if (!h || h->ep.first_t_ns != key || !atomic_compare_exchange_strong(&held[d], &h, NULL))
        return NULL;
    return h;
}

static void held_free(og_held_t *h)
{
    if (h) {
        og_record_free(h->rec);
        free(h);
    }
}

/* Past the recovered allowance, an attempt no deeper than recovered episodes needed on this device
 * is likely to be followed by a successful retry: captured now, written only if it proves final. */
static bool defer_write(int d, const og_episode_t *ep, const og_call_t *c)
{
    long long allowance = og_opt.max_dumps < OG_RECOVERED_FULL ? og_opt.max_dumps : OG_RECOVERED_FULL;
    return c->active && atomic_load(&recovered_written) >= allowance && ep->attempts <= atomic_load(&episodes[d].depth);
}

static void report_failure(const og_episode_t *ep, og_call_t *c)
{
    int d = ep->device;
    bool fresh = ep->attempts == 1 && c->active;
    bool dev = d >= 0 && d < OG_MAX_DEVICES;
    if (fresh) { /* a new failure on this device: its older unrecovered one is final */
        write_held(d);
        flush_pending(d);
    }
    /* this episode's held attempt: superseded by a newer attempt, or, when the framework reports on
     * the failure (its numbers, its own out-of-memory error), final enough to be written now: both
     * capture afresh below */
    if (dev)
        held_free(held_take(d, ep->first_t_ns));
    bool same = dev && atomic_load(&on_disk[d].key) == ep->first_t_ns;
    /* the framework's numbers for an attempt already counted: a rewrite within its unit */
    bool refresh = same && ep->attempts <= atomic_load(&on_disk[d].attempts);
    if (dev && !refresh && defer_write(d, ep, c)) {
        og_held_t *h = malloc(sizeof *h);
        og_record_t *rec = h ? og_record_capture("oom", ep, d) : NULL;
        if (rec) {
            h->rec = rec;
            h->ep = *ep;
            set_pending(rec, "");                    /* a fatal signal still prints what failed */
            held_free(atomic_exchange(&held[d], h)); /* none: an older one was written when this began */
            return;
        }
        free(h); /* no host memory: written the ordinary way */
    }
    if (!dump_admit("oom", d, refresh)) {
        if (!same) /* the file holds an older episode: this one is owed */
            owe(d, ep);
        if (fresh)
            set_pending_brief(ep);
        return;
    }
    if (dev) {
        if (!same)
            atomic_store(&on_disk[d].units, 0);
        if (!refresh)
            atomic_fetch_add(&on_disk[d].units, 1);
        atomic_store(&on_disk[d].key, ep->first_t_ns);
        atomic_store(&on_disk[d].attempts, ep->attempts);
        owe(d, NULL);
    }
    capture_write_free("oom", ep, d, after_failure);
}

/* Held attempts whose episodes ended unrecovered: written now, each with a unit of the budget
 * (normal context only, like write_owed); refused, the failure is owed as if never captured. */
static void write_held(int device)
{
    for (int d = 0; d < OG_MAX_DEVICES; d++) {
        if (device >= 0 && d != device)
            continue;
        og_held_t *h = atomic_exchange(&held[d], NULL);
        if (!h)
            continue;
        if (!dump_admit("oom", d, false)) {
            owe(d, &h->ep);
            held_free(h);
            continue;
        }
        atomic_store(&on_disk[d].units, 1);
        atomic_store(&on_disk[d].key, h->ep.first_t_ns);
        atomic_store(&on_disk[d].attempts, h->ep.attempts);
        owe(d, NULL);
        char path[4800];
        unsigned gen = 0;
        write_dump(h->rec, path, sizeof path, &gen);
        set_pending(h->rec, path);
        if (og_opt.verbose)
            og_log("device %d: a failure held past the recovered allowance ended unrecovered; dump written: %s", d,
                   path[0] ? path : "(stderr)");
        og_symfill_schedule(h->rec, path, gen); /* frees the record */
        free(h);
    }
}

static void after_recovered(const og_record_t *rec, const og_episode_t *ep, const char *path)
{
    if (og_opt.verbose)
        og_log("device %d: recovered after %d failed attempt(s); dump updated: %s", ep->device, ep->attempts, path);
}

static void report_recovered(const og_episode_t *ep, og_call_t *c)
{
    int d = ep->device;
    clear_pending(d); /* recovered: no alarm on stderr */
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    owe(d, NULL);
    atomic_fetch_add(&episodes[d].recovered, 1);
    for (int depth = atomic_load(&episodes[d].depth);
         depth < ep->attempts && !atomic_compare_exchange_weak(&episodes[d].depth, &depth, ep->attempts);)
        ;
    og_held_t *h = held_take(d, ep->first_t_ns);
    if (h) { /* captured, never written: dropped */
        held_free(h);
        atomic_fetch_add(&episodes[d].not_written, 1);
        return;
    }
    /* only the episode whose record is on disk is rewritten, in place and within its unit (then
     * given back); one the budget refused was never written and owes nothing now */
    if (atomic_load(&on_disk[d].key) != ep->first_t_ns) {
        atomic_fetch_add(&episodes[d].not_written, 1);
        return;
    }
    atomic_fetch_sub(&dumps_written, atomic_exchange(&on_disk[d].units, 0));
    if (!dump_admit("recovered", d, true)) {
        atomic_fetch_add(&episodes[d].not_written, 1);
        return;
    }
    atomic_fetch_add(&recovered_written, 1);
    og_record_t *rec = og_record_capture("recovered", ep, d);
    if (!rec)
        return;
    char path[4800];
    unsigned gen = 0;
    write_dump(rec, path, sizeof path, &gen);
    after_recovered(rec, ep, path);
    og_record_free(atomic_exchange(&last_recovered, path[0] ? og_record_copy(rec) : NULL));
    og_symfill_schedule(rec, path, gen); /* names and lines, later; frees rec */
}

/* At exit: the file still holds a recovered record, and recoveries came after it: its counts of now. */
static void refresh_recovered(void)
{
    og_record_t *r = atomic_exchange(&last_recovered, NULL);
    if (!r)
        return;
    int d = r->event.device;
    uint64_t n, nw;
    og_dump_episode_counts(d, &n, &nw);
    if (atomic_load(&written_severity) == severity("recovered") && atomic_load(&written_device) == d &&
        (n != r->history.recovered_episodes || nw != r->history.recovered_not_written)) {
        r->history.recovered_episodes = n;
        r->history.recovered_not_written = nw;
        char path[4800];
        unsigned gen;
        write_dump(r, path, sizeof path, &gen);
        if (og_opt.verbose)
            og_log("device %d: %llu recovered episodes by exit; dump updated: %s", d, (unsigned long long)n,
                   path[0] ? path : "(none)");
    }
    og_record_free(r);
}

/* Owed failures that ended unrecovered, written from their episodes alone (normal context only:
 * exit, the destructor, a success long after; a fatal signal prints the stderr line instead).
 * At most OOMGUARD_MAX_DUMPS of them, like the dumps themselves. */
static void write_owed(int device)
{
    for (int d = 0; d < OG_MAX_DEVICES; d++) {
        if (device >= 0 && d != device)
            continue;
        pthread_mutex_lock(&pending_lock);
        bool set = owed[d].set;
        og_episode_t ep = owed[d].ep;
        owed[d].set = false;
        pthread_mutex_unlock(&pending_lock);
        /* a measured unrecovered failure on disk is worth more than a record of the failure alone */
        if (!set || atomic_load(&written_severity) >= severity("oom") ||
            atomic_fetch_add(&briefs_written, 1) >= og_opt.max_dumps)
            continue;
        og_record_t *rec = og_record_unmeasured("oom", &ep);
        if (!rec)
            continue;
        char path[4800];
        unsigned gen; /* a record of the failure alone: no frames to name later */
        write_dump(rec, path, sizeof path, &gen);
        if (og_opt.verbose)
            og_log("device %d: a failure past the budget ended unrecovered; recorded from the failure alone: %s", d,
                   path[0] ? path : "(none)");
        atomic_store(&on_disk[d].key, ep.first_t_ns);
        atomic_store(&on_disk[d].attempts, ep.attempts);
        atomic_store(&on_disk[d].units, 0); /* drawn from its own count (briefs_written) */
        og_record_free(rec);
    }
}

/* ------------------------------------------------------------------ on the failure path's stack */

/* The entry points run on the failure path's own stack (og_on_alt_stack): a thread with a small
 * stack that fails an allocation gets its error code and its dump. */
typedef struct {
    int what;
    const og_episode_t *ep;
    og_call_t *c;
    const char *status;
    int device;
} dump_call_t;
enum { DC_FAILURE, DC_RECOVERED, DC_CAPTURE, DC_FLUSH };

static void dump_call(void *arg)
{
    const dump_call_t *d = arg;
    switch (d->what) {
    case DC_FAILURE:
        report_failure(d->ep, d->c);
        break;
    case DC_RECOVERED:
        report_recovered(d->ep, d->c);
        break;
    case DC_CAPTURE:
        dump_capture_write(d->status, d->device);
        break;
    default:
        dump_flush_pending(d->device);
        break;
    }
}

void og_report_failure(const og_episode_t *ep, og_call_t *c)
{
    dump_call_t d = { .what = DC_FAILURE, .ep = ep, .c = c };
    og_on_alt_stack(dump_call, &d);
}

void og_report_recovered(const og_episode_t *ep, og_call_t *c)
{
    dump_call_t d = { .what = DC_RECOVERED, .ep = ep, .c = c };
    og_on_alt_stack(dump_call, &d);
}

void og_dump_capture_write(const char *status, int device)
{
    dump_call_t d = { .what = DC_CAPTURE, .status = status, .device = device };
    og_on_alt_stack(dump_call, &d);
}

void og_dump_flush_pending(int device)
{
    dump_call_t d = { .what = DC_FLUSH, .device = device };
    og_on_alt_stack(dump_call, &d);
}
