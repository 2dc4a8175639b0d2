/* Names and source lines for a dump's frames, found in the process that wrote it, after the
 * dump is on disk.
 *
 * A failing call never waits for this: the dump is written as always (library, path,
 * build-id, offset, dynamic symbol), then a helper thread opens the process's own binaries
 * with elfutils (libdwfl over /proc/self/maps), resolves each frame to its demangled
 * function, file and line, and rewrites the same dump atomically (dump.c, og_dump_rewrite)
 * unless a newer one replaced it meanwhile.  The answers stay in a cache that later dumps of
 * the process read while they render, so a recovery or a newer failure carries the names.
 *
 * Bounds: OOMGUARD_SYMBOLIZE_MS (0 = off) limits the helper's work; frames left when it runs
 * out stay library+offset for `oomguard report`.
 *
 * Safe at exit by construction.  The helper works only on what it owns (the record handed
 * over, its own Dwfl session, the cache, which is never freed) and on libdw, which is
 * dlopen'ed on the first failure and never closed (libdw and libelf have no destructors).
 * It never reaches debuginfod: libdwfl's standard lookup would start the debuginfod client
 * (libcurl, and with it a TLS library's initialisation) inside the host process, and such an
 * initialisation racing exit() crashed a Python job at exit; here separate debug files are
 * found by build-id on the local disk only, and the executable files straight from the maps.
 * The C++ demangler is the process's own (never a C++ runtime loaded for it).  exit() (the
 * atexit handler, else the destructor) closes the door under one lock: no helper starts
 * afterwards; a running one gets until its bound to finish, then is told to stop; a
 * rewrite already under way is waited for (it is a few file writes, bounded too), and one
 * not begun never begins.  So whatever exit tears down after that, the helper touches none
 * of it, and the files on disk are the dump as written or its named version, both complete.
 * _exit, quick_exit and fatal signals end the helper wherever it is: it holds nothing the
 * dump's own fatal path (og_dump_fatal) does not already clean up.  A fork child has no
 * helper: it starts its own if it fails. */
#include "og.h"
#include "record.h"
#include "symfill.h"

#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <dwarf.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ libdw, opened on demand */

/* The elfutils functions the helper calls: one list, resolved with dlsym from libdw.so.1. */
#define OG_DW_FUNCS(X)              \
    X(dwfl_begin)                   \
    X(dwfl_end)                     \
    X(dwfl_report_begin)            \
    X(dwfl_report_end)              \
    X(dwfl_linux_proc_report)       \
    X(dwfl_linux_proc_find_elf)     \
    X(dwfl_build_id_find_debuginfo) \
    X(dwfl_addrmodule)              \
    X(dwfl_module_addrinfo)         \
    X(dwfl_module_addrdie)          \
    X(dwfl_module_getsrc)           \
    X(dwfl_lineinfo)                \
    X(dwarf_getscopes)              \
    X(dwarf_getscopes_die)          \
    X(dwarf_tag)                    \
    X(dwarf_attr_integrate)         \
    X(dwarf_formstring)

static struct {
#define X(f) __typeof__(f) *f;
    OG_DW_FUNCS(X)
#undef X
} dw;

/* Exit stopped waiting for the helper: it resolves no more, loads nothing, writes nothing. */
static atomic_bool stop;

static char *(*cxa_demangle)(const char *, char *, size_t *, int *);

static bool dw_open(void)
{
    static int state; /* 0 not tried, 1 ok, -1 unavailable; one helper at a time.  Never closed. */
    if (state)
        return state > 0;
    state = -1;
    void *h = dlopen("libdw.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return false;
#define X(f)                                             \
    if (!(dw.f = (__typeof__(f) *)og_dlsym_real(h, #f))) \
        return false;
    OG_DW_FUNCS(X)
#undef X
    state = 1;
    return true;
}

/* C++ names: the demangler of the C++ runtime the process already has (in its global scope,
 * or loaded locally by a module such as a Python extension), else libstdc++ opened for it (a
 * C++ program whose linker dropped the runtime as unneeded): a system library whose start-up
 * is local (its locale and streams) and whose demangler only allocates.  Not once exit has
 * stopped the helper: then the mangled name is written and `oomguard report` demangles it. */
static void demangler_open(void)
{
    static bool tried;
    if (tried)
        return;
    tried = true;
    cxa_demangle = (char *(*)(const char *, char *, size_t *, int *))og_dlsym_real(RTLD_DEFAULT, "__cxa_demangle");
    void *h = NULL;
    if (!cxa_demangle && !(h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD)) && !atomic_load(&stop))
        h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (h && !cxa_demangle)
        cxa_demangle = (char *(*)(const char *, char *, size_t *, int *))og_dlsym_real(h, "__cxa_demangle");
}

/* ------------------------------------------------------------------ the cache */

#define SLOTS 4096u /* distinct frame addresses kept; later ones stay unsymbolized */

typedef struct {
    _Atomic uintptr_t ip; /* 0: empty; set after `ent` is published */
    _Atomic(og_symfill_ent_t *) ent;
} slot_t;
static slot_t slots[SLOTS]; /* bss: 64 KiB, untouched until a dump */

static inline unsigned slot_of(uintptr_t ip) { return (unsigned)((ip * 0x9E3779B97F4A7C15ull) >> 52) & (SLOTS - 1); }

const og_symfill_ent_t *og_symfill_get(uintptr_t ip)
{
    if (!ip)
        return NULL;
    for (unsigned i = slot_of(ip), n = 0; n < 64; i = (i + 1) & (SLOTS - 1), n++) {
        uintptr_t v = atomic_load_explicit(&slots[i].ip, memory_order_acquire);
        if (!v)
            return NULL;
        if (v == ip)
            return atomic_load_explicit(&slots[i].ent, memory_order_acquire);
    }
    return NULL;
}

/* One writer at a time: the helper. */
static bool cache_put(uintptr_t ip, og_symfill_ent_t *e)
{
    for (unsigned i = slot_of(ip), n = 0; n < 64; i = (i + 1) & (SLOTS - 1), n++) {
        uintptr_t v = atomic_load_explicit(&slots[i].ip, memory_order_relaxed);
        if (v == ip)
            break;
        if (!v) {
            atomic_store_explicit(&slots[i].ent, e, memory_order_release);
            atomic_store_explicit(&slots[i].ip, ip, memory_order_release);
            return true;
        }
    }
    free(e); /* known already, or the neighbourhood is full: this frame stays unsymbolized */
    return false;
}

/* ------------------------------------------------------------------ resolving one address */

static void copy_name(char *dst, size_t n, const char *name)
{
    if (!name) {
        dst[0] = 0;
        return;
    }
    size_t plain = strcspn(name, "@"); /* "memcpy@@GLIBC_2.14": the version is noise */
    char *d = NULL;
    if (name[0] == '_' && name[1] == 'Z')
        demangler_open();
    if (cxa_demangle && name[0] == '_' && name[1] == 'Z') {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%.*s", (int)plain, name);
        int status = -1;
        d = cxa_demangle(tmp, NULL, NULL, &status);
        if (status != 0) {
            free(d);
            d = NULL;
        }
    }
    if (d)
        snprintf(dst, n, "%s", d);
    else
        snprintf(dst, n, "%.*s", (int)plain, name);
    free(d);
}

static const char *die_name(Dwarf_Die *die)
{
    Dwarf_Attribute attr;
    const char *s = NULL;
    /* the linkage name demangles to the qualified name with its parameters */
    if (dw.dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) ||
        dw.dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr))
        s = dw.dwarf_formstring(&attr);
    if (!s && dw.dwarf_attr_integrate(die, DW_AT_name, &attr))
        s = dw.dwarf_formstring(&attr);
    return s;
}

/* The same answer `oomguard report` gives (tools/symbolize.c): the symbol, the innermost
 * inlined function and the one it was inlined into, file:line of the call. */
static og_symfill_ent_t *resolve(Dwfl *dwfl, uintptr_t ip)
{
    og_symfill_ent_t *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    Dwarf_Addr addr = ip - 1; /* a return address: the call is the byte before it */
    Dwfl_Module *m = dw.dwfl_addrmodule(dwfl, addr);
    if (m) {
        GElf_Off off;
        GElf_Sym sym;
        copy_name(e->function, sizeof e->function, dw.dwfl_module_addrinfo(m, addr, &off, &sym, NULL, NULL, NULL));
        Dwarf_Addr bias = 0;
        Dwarf_Die *cu = dw.dwfl_module_addrdie(m, addr, &bias);
        if (cu) {
            Dwarf_Die *scopes = NULL;
            int ns = dw.dwarf_getscopes(cu, addr - bias, &scopes);
            int inner = -1;
            for (int i = 0; i < ns && inner < 0; i++) {
                int tag = dw.dwarf_tag(&scopes[i]);
                if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine)
                    inner = i;
            }
            if (inner >= 0 && dw.dwarf_tag(&scopes[inner]) == DW_TAG_inlined_subroutine) {
                const char *fn = die_name(&scopes[inner]);
                if (fn) {
                    copy_name(e->function, sizeof e->function, fn);
                    e->inlined = true;
                }
                Dwarf_Die *up = NULL;
                int nup = dw.dwarf_getscopes_die(&scopes[inner], &up);
                for (int i = 1; i < nup; i++) {
                    int tag = dw.dwarf_tag(&up[i]);
                    if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine) {
                        copy_name(e->inlined_into, sizeof e->inlined_into, die_name(&up[i]));
                        break;
                    }
                }
                free(up);
            } else if (inner >= 0 && !e->function[0]) {
                copy_name(e->function, sizeof e->function, die_name(&scopes[inner]));
            }
            free(scopes);
        }
        Dwfl_Line *ln = dw.dwfl_module_getsrc(m, addr);
        int line = 0;
        const char *file = ln ? dw.dwfl_lineinfo(ln, NULL, &line, NULL, NULL, NULL) : NULL;
        if (file && line > 0) {
            snprintf(e->file, sizeof e->file, "%s", file);
            e->line = line;
        }
    }
    return e; /* nothing found is an answer too: not asked again */
}

/* ------------------------------------------------------------------ the helper */

typedef struct job {
    og_record_t *rec; /* owned by the job */
    char path[4800];
    unsigned gen;
} job_t;

/* One helper at a time, working on the newest dump: a failure storm (a framework retrying, a
 * loop) must not become a storm of threads; an older dump still waiting is dropped (the newer
 * one replaced it on disk anyway).  All of the state below is under `lock`, except `stop`,
 * which the helper also reads without it between two frames. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static job_t *pending;        /* the next dump to name */
static bool running;          /* a helper thread exists */
static bool writing;          /* it is rewriting a dump's files */
static bool closed;           /* exit began: no helper starts any more */
static uint64_t deadline_ns;  /* the current job's bound */
static atomic_int helper_pid; /* the process whose helper this state describes */
static atomic_ullong last_ms; /* duration of the last job, for OOMGUARD_VERBOSE */

static uint64_t job_bound_ns(void) { return (uint64_t)og_opt.symbolize_ms * 1000000ull; }
/* After its bound a job still writes its files: exit grants that much more, no more. */
#define WRITE_GRACE_NS (1000ull * 1000000ull)

/* The tests' way to hold the helper in a phase ("resolve:MS" or "write:MS") so that exit meets
 * it there; read once per job, never an option of the library's. */
static void test_stall(const char *phase)
{
    const char *v = getenv("OG_TEST_SYMFILL_STALL");
    size_t n = strlen(phase);
    if (!v || strncmp(v, phase, n) != 0 || v[n] != ':')
        return;
    uint64_t until = og_now_ns() + strtoull(v + n + 1, NULL, 10) * 1000000ull;
    while (og_now_ns() < until && !atomic_load(&stop)) {
        struct timespec ts = { 0, 5 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
}

static void job_free(job_t *j)
{
    if (j) {
        og_record_free(j->rec);
        free(j);
    }
}

static int frame_ips(const og_record_t *r, uintptr_t *out, int max)
{
    int n = 0;
    for (int i = 0; i < r->event.nframes && n < max; i++)
        out[n++] = r->event.frames[i].ip;
    for (int s = 0; s < r->nsites; s++)
        for (int i = 0; i < r->sites[s].nframes && n < max; i++)
            out[n++] = r->sites[s].frames[i].ip;
    return n;
}

static bool has_missing(const uintptr_t *ips, int n)
{
    for (int i = 0; i < n; i++)
        if (ips[i] && !og_symfill_get(ips[i]))
            return true;
    return false;
}

/* Resolves the frames of one dump not resolved yet; how many were added. */
static int resolve_job(const job_t *j, uint64_t bound, int *nips)
{
    uintptr_t ips[32 + 16 * 16 * 4];
    int n = frame_ips(j->rec, ips, (int)(sizeof ips / sizeof ips[0]));
    *nips = n;
    int added = 0;
    if (!has_missing(ips, n) || !dw_open())
        return 0;
    /* executables from the maps' paths; separate debug files by build-id on this disk only */
    Dwfl_Callbacks c = { .find_elf = dw.dwfl_linux_proc_find_elf, .find_debuginfo = dw.dwfl_build_id_find_debuginfo };
    Dwfl *dwfl = dw.dwfl_begin(&c);
    if (!dwfl)
        return 0;
    dw.dwfl_report_begin(dwfl);
    if (dw.dwfl_linux_proc_report(dwfl, getpid()) == 0 && dw.dwfl_report_end(dwfl, NULL, NULL) == 0) {
        test_stall("resolve");
        for (int i = 0; i < n && og_now_ns() < bound && !atomic_load(&stop); i++) {
            if (!ips[i] || og_symfill_get(ips[i]))
                continue;
            og_symfill_ent_t *e = resolve(dwfl, ips[i]);
            if (e && cache_put(ips[i], e))
                added++;
        }
    }
    dw.dwfl_end(dwfl);
    return added;
}

static void *helper(void *arg)
{
    og_in_shim++;
    for (;;) {
        pthread_mutex_lock(&lock);
        job_t *j = pending;
        pending = NULL;
        if (!j || atomic_load(&stop)) {
            running = false;
            pthread_cond_broadcast(&cond);
            pthread_mutex_unlock(&lock);
            job_free(j);
            break;
        }
        uint64_t t0 = og_now_ns();
        deadline_ns = t0 + job_bound_ns();
        pthread_mutex_unlock(&lock);

        int n = 0, added = resolve_job(j, t0 + job_bound_ns(), &n);

        /* the dump as written, now with names: unless exit stopped waiting meanwhile, or a
         * newer dump replaced it (that one rendered from the cache) */
        pthread_mutex_lock(&lock);
        writing = added > 0 && !atomic_load(&stop);
        bool write = writing;
        pthread_mutex_unlock(&lock);
        if (write) {
            test_stall("write");
            og_dump_rewrite(j->rec, j->path, j->gen);
            pthread_mutex_lock(&lock);
            writing = false;
            pthread_cond_broadcast(&cond);
            pthread_mutex_unlock(&lock);
        }
        uint64_t ms = (og_now_ns() - t0) / 1000000;
        atomic_store(&last_ms, ms);
        if (og_opt.verbose && added && !atomic_load(&stop))
            og_log("symbolized %d of %d frame addresses in %llu ms", added, n, (unsigned long long)ms);
        job_free(j);
    }
    og_in_shim--;
    return NULL;
}

void og_symfill_schedule(og_record_t *rec, const char *path, unsigned gen)
{
    if (!rec)
        return;
    uintptr_t ips[32 + 16 * 16 * 4];
    int n = frame_ips(rec, ips, (int)(sizeof ips / sizeof ips[0]));
    job_t *j = NULL;
    if (!og_opt.symbolize_ms || !path || !path[0] || !has_missing(ips, n) || !(j = malloc(sizeof *j))) {
        og_record_free(rec);
        return;
    }
    j->rec = rec;
    j->gen = gen;
    snprintf(j->path, sizeof j->path, "%s", path);
    pthread_mutex_lock(&lock);
    if (closed) { /* exit began: nobody would wait for this helper */
        pthread_mutex_unlock(&lock);
        job_free(j);
        return;
    }
    job_t *old = pending;
    pending = j;
    bool start = !running;
    if (start) {
        running = true;
        deadline_ns = og_now_ns() + job_bound_ns();
        atomic_store(&helper_pid, (int)getpid());
    }
    pthread_mutex_unlock(&lock);
    job_free(old);
    if (!start)
        return;
    /* the helper takes no signal meant for the program */
    sigset_t all, prev;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &prev);
    pthread_attr_t a;
    pthread_t t;
    int rc = pthread_attr_init(&a);
    if (rc == 0) {
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&t, &a, helper, NULL);
        pthread_attr_destroy(&a);
    }
    pthread_sigmask(SIG_SETMASK, &prev, NULL);
    if (rc != 0) { /* no thread to be had: the names wait for `oomguard report` */
        pthread_mutex_lock(&lock);
        job_t *left = pending;
        pending = NULL;
        running = false;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
        job_free(left);
    }
}

/* Waits on `cond` until `done` or CLOCK_MONOTONIC reaches `until` (called with `lock` held). */
static void wait_until(const bool *done_when_false, uint64_t until)
{
    while (*done_when_false) {
        uint64_t now = og_now_ns();
        if (now >= until)
            return;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t left = until - now;
        ts.tv_sec += (time_t)(left / 1000000000ull);
        ts.tv_nsec += (long)(left % 1000000000ull);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&cond, &lock, &ts);
    }
}

void og_symfill_close(void)
{
    if (atomic_load(&helper_pid) != (int)getpid()) { /* never started here (or a fork child) */
        pthread_mutex_lock(&lock);
        closed = true;
        pthread_mutex_unlock(&lock);
        return;
    }
    pthread_mutex_lock(&lock);
    closed = true;
    /* the job's own bound, and a little for its write */
    wait_until(&running, deadline_ns + WRITE_GRACE_NS);
    if (running) {
        /* from here on the helper begins no write and resolves no further frame; a write it
         * already began is finished first (the files stay whole) */
        atomic_store(&stop, true);
        wait_until(&writing, og_now_ns() + 2 * WRITE_GRACE_NS);
    }
    pthread_mutex_unlock(&lock);
}

void og_symfill_atfork_child(void)
{
    /* the helper is not in the child; its job belongs to the parent (its record is leaked
     * rather than freed under a lock the fork may have caught held) */
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&cond, NULL);
    pending = NULL;
    running = false;
    writing = false;
    closed = false;
    atomic_store(&stop, false);
    atomic_store(&helper_pid, 0);
}

unsigned long long og_symfill_last_ms(void) { return atomic_load(&last_ms); }
