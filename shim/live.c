/* The live page (shim/live.h): this process's attributed usage, published for `oomguard top`,
 * and snapshots on request (`oomguard snapshot`).
 *
 * One helper thread does everything, off the allocation path: it is started by the first
 * tracked call of the process (og_exit_arm, once per thread anyway), creates the page,
 * and every OG_LIVE_PERIOD_MS (or at once when a failure or a warning kicks it) reads the
 * ledger's counters, the libraries' shares (every OG_LIVE_LIB_EVERY-th round, and when
 * kicked) and the framework's last report, and copies them into the page under its seqlock.
 * The allocation and free paths gain nothing: no store, no syscall, no lock.  The thread
 * blocks every signal (the program's handlers never run on it), never calls the driver
 * (the ledger's counters without their pool refresh; a snapshot dump is the one
 * exception, as a warning dump is), and is not restarted in a fork child until that
 * child's first tracked call.  At exit the page is removed; a page left by a killed
 * process is removed by the next reader (pid + start time). */
#include "og.h"
#include "live.h"
#include "record.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OG_LIVE_PERIOD_MS 250
#define OG_LIVE_LIB_EVERY 4  /* libraries: about once a second */
#define OG_LIVE_TREND     16 /* rounds the rate is measured over (~4 s) */

static atomic_int started; /* 1 once this process started its thread */
static atomic_int stopping;
static atomic_int kicked;
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cond;
static og_live_page_t *page; /* the helper thread's; NULL until made */
static int page_pid;
static char page_path[4200];
static atomic_int page_named; /* page_path is set (exit removes it) */
static _Atomic uint64_t warnings[OG_MAX_DEVICES];

/* ------------------------------------------------------------------ kicks (failure, warning) */

void og_live_kick(void)
{
    /* acquire: wake_cond was made before `started` was set (og_live_ensure) */
    if (!atomic_load_explicit(&started, memory_order_acquire))
        return;
    atomic_store(&kicked, 1);
    pthread_mutex_lock(&wake_lock);
    pthread_cond_signal(&wake_cond);
    pthread_mutex_unlock(&wake_lock);
}

void og_live_note_warning(int device)
{
    if (device >= 0 && device < OG_MAX_DEVICES)
        atomic_fetch_add(&warnings[device], 1);
    og_live_kick();
}

/* ------------------------------------------------------------------ the page's file */

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Ours: a directory (not a link), owned by uid, mode 0700. */
static bool dir_ok(int fd, uid_t uid)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 0777) == 0700;
}

static int open_dir_checked(int parent, const char *name, uid_t uid)
{
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && !dir_ok(fd, uid)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The user's directory under `base` (see live.h); -1 when none can be had. */
static int user_dir(const char *base, char *out, size_t n)
{
    uid_t uid = geteuid();
    int bfd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (bfd < 0)
        return -1;
    char name[64];
    snprintf(name, sizeof name, OG_LIVE_DIR_PREFIX "%u", (unsigned)uid);
    int fd = -1;
    if (mkdirat(bfd, name, 0700) == 0) {
        fd = openat(bfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == uid && (st.st_mode & 0777) != 0700)
            (void)fchmod(fd, 0700); /* a umask took bits away */
        if (fd >= 0 && !dir_ok(fd, uid)) {
            close(fd);
            fd = -1;
        }
    } else if (errno == EEXIST) {
        fd = open_dir_checked(bfd, name, uid);
    }
    if (fd < 0) {
        /* the name is another user's (or not a 0700 directory of ours): an unpredictable one */
        size_t len = strlen(name);
        DIR *d = fdopendir(dup(bfd));
        for (struct dirent *e; d && fd < 0 && (e = readdir(d));)
            if (strncmp(e->d_name, name, len) == 0 && e->d_name[len] == '.') {
                fd = open_dir_checked(bfd, e->d_name, uid);
                if (fd >= 0)
                    snprintf(name, sizeof name, "%.63s", e->d_name);
            }
        if (d)
            closedir(d);
        if (fd < 0) {
            char tmpl[4200];
            snprintf(tmpl, sizeof tmpl, "%s/%s.XXXXXX", base, name);
            if (mkdtemp(tmpl)) {
                fd = open(tmpl, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (fd >= 0 && !dir_ok(fd, uid)) {
                    close(fd);
                    fd = -1;
                }
                snprintf(name, sizeof name, "%.63s", strrchr(tmpl, '/') + 1);
            }
        }
    }
    close(bfd);
    if (fd >= 0)
        snprintf(out, n, "%s/%s", base, name);
    return fd;
}

static og_live_page_t *page_create(void)
{
    const char *bases[4];
    int nb = 0;
    if (og_opt.live_dir_s[0]) {
        bases[nb++] = og_opt.live_dir_s;
    } else {
        bases[nb++] = "/dev/shm";
        const char *t = getenv("TMPDIR");
        if (t && *t)
            bases[nb++] = t;
        bases[nb++] = "/tmp";
    }
    char dir[4096];
    int dfd = -1;
    for (int i = 0; i < nb && dfd < 0; i++)
        dfd = user_dir(bases[i], dir, sizeof dir);
    if (dfd < 0) {
        if (og_opt.verbose)
            og_log("live page: no private directory could be had (OOMGUARD_LIVE_DIR): not published");
        return NULL;
    }
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
        rnd = og_now_ns() ^ ((uint64_t)(uintptr_t)&rnd << 16) ^ (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
    char name[64];
    snprintf(name, sizeof name, "%d-%016llx.page", (int)getpid(), (unsigned long long)rnd);
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    close(dfd);
    if (fd < 0)
        return NULL;
    snprintf(page_path, sizeof page_path, "%s/%s", dir, name);
    atomic_store(&page_named, 1);
    void *m = MAP_FAILED;
    if (ftruncate(fd, sizeof(og_live_page_t)) == 0)
        m = mmap(NULL, sizeof(og_live_page_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(page_path);
        atomic_store(&page_named, 0);
        return NULL;
    }
    og_live_page_t *p = m;
    p->version = OG_LIVE_VERSION;
    p->size = sizeof *p;
    atomic_store(&p->seq, 0);
    atomic_thread_fence(memory_order_release);
    p->magic = OG_LIVE_MAGIC;
    if (og_opt.verbose)
        og_log("live page: %s", page_path);
    return p;
}

/* ------------------------------------------------------------------ what is published */

typedef struct {
    int device;
    uint64_t t_ms[OG_LIVE_TREND], tracked[OG_LIVE_TREND];
    int n, pos;
} trend_t;

static og_live_body_t body; /* the helper thread's staging copy */
static trend_t trends[OG_LIVE_DEVS];

static void identity(og_live_body_t *b)
{
    og_record_t *r = calloc(1, sizeof *r);
    b->pid = (int)getpid();
    b->uid = (uint32_t)geteuid();
    b->start_ticks = og_live_start_ticks(b->pid);
    b->started_unix_ms = unix_ms() - (og_now_ns() - og_start_ns()) / 1000000;
    b->rank = b->local_rank = b->world_size = -1;
    if (!r)
        return;
    og_record_identity(r);
    b->rank = r->rank;
    b->local_rank = r->local_rank;
    b->world_size = r->world_size;
    snprintf(b->job, sizeof b->job, "%.63s", r->job_id);
    snprintf(b->host, sizeof b->host, "%.63s", r->host);
    snprintf(b->cmd, sizeof b->cmd, "%.255s", r->cmdline);
    free(r);
}

/* per device slot and site: bytes and blocks of the live blocks (og_ledger_foreach) */
typedef struct {
    int slot_of[OG_MAX_DEVICES];
    uint32_t nsites;
    uint64_t *bytes; /* [slot * nsites + site] */
    uint32_t *blocks;
} lib_acc_t;

static void acc_block(const og_block_view_t *v, void *arg)
{
    lib_acc_t *a = arg;
    if (v->kind == OG_KIND_HOST || v->device < 0 || v->device >= OG_MAX_DEVICES || a->slot_of[v->device] < 0 ||
        v->site >= a->nsites)
        return;
    size_t i = (size_t)a->slot_of[v->device] * a->nsites + v->site;
    a->bytes[i] += v->size;
    a->blocks[i]++;
}

static void lib_put(og_live_dev_t *d, const char *name, uint64_t bytes, uint32_t blocks, bool fw)
{
    if (!bytes)
        return;
    /* insertion into the top OG_LIVE_LIBS, largest first; what falls off is "other" */
    int at = (int)d->nlibs;
    while (at > 0 && d->libs[at - 1].bytes < bytes)
        at--;
    if (at >= OG_LIVE_LIBS) {
        d->other_lib_bytes += bytes;
        return;
    }
    if (d->nlibs == OG_LIVE_LIBS)
        d->other_lib_bytes += d->libs[OG_LIVE_LIBS - 1].bytes;
    else
        d->nlibs++;
    memmove(&d->libs[at + 1], &d->libs[at], (d->nlibs - 1 - (uint32_t)at) * sizeof d->libs[0]);
    og_live_lib_t *l = &d->libs[at];
    memset(l, 0, sizeof *l);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->bytes = bytes;
    l->blocks = blocks;
    l->framework = fw;
}

static void libraries(og_live_body_t *b)
{
    lib_acc_t a;
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        a.slot_of[i] = -1;
    for (int s = 0; s < b->ndevs; s++)
        a.slot_of[b->dev[s].index] = s;
    a.nsites = og_site_count();
    size_t cells = (size_t)a.nsites * (size_t)(b->ndevs ? b->ndevs : 1);
    a.bytes = calloc(cells ? cells : 1, sizeof *a.bytes);
    a.blocks = calloc(cells ? cells : 1, sizeof *a.blocks);
    if (a.bytes && a.blocks && b->ndevs) {
        og_ledger_foreach(acc_block, &a);       /* takes each shard's lock in turn */
        for (uint32_t s = 0; s < a.nsites; s++) /* resolve outside every lock (dladdr) */
            (void)og_site_lib(og_site_get(s));
        uint16_t nlibs = og_lib_count();
        uint64_t *lb = calloc((size_t)nlibs + 1, sizeof *lb);
        uint32_t *lk = calloc((size_t)nlibs + 1, sizeof *lk);
        for (int slot = 0; lb && lk && slot < b->ndevs; slot++) {
            og_live_dev_t *d = &b->dev[slot];
            memset(lb, 0, ((size_t)nlibs + 1) * sizeof *lb);
            memset(lk, 0, ((size_t)nlibs + 1) * sizeof *lk);
            for (uint32_t s = 0; s < a.nsites; s++) {
                size_t i = (size_t)slot * a.nsites + s;
                if (!a.bytes[i])
                    continue;
                uint16_t lib = og_site_lib(og_site_get(s));
                uint16_t k = lib < nlibs ? lib : nlibs;
                lb[k] += a.bytes[i];
                lk[k] += a.blocks[i];
            }
            d->nlibs = 0;
            d->other_lib_bytes = 0;
            uint64_t listed = 0;
            for (uint16_t l = 0; l <= nlibs; l++) {
                if (!lb[l])
                    continue;
                lib_put(d, l < nlibs ? og_lib_name(l) : "unknown", lb[l], lk[l],
                        l < nlibs && og_lib_class(l) == OG_LIBCLASS_FRAMEWORK);
                listed += lb[l];
            }
            uint64_t slack = d->by_kind[OG_LIVE_K_pool] > d->pool_used ? d->by_kind[OG_LIVE_K_pool] - d->pool_used : 0;
            lib_put(d, "(pool cache)", slack, 0, false);
            lib_put(d, "(graph pool)", d->by_kind[OG_LIVE_K_graph], 0, false);
            listed += slack + d->by_kind[OG_LIVE_K_graph];
            /* blocks the ledger saw before a site existed, rounding of pool shares: "other" */
            if (d->tracked > listed)
                d->other_lib_bytes += d->tracked - listed;
        }
        free(lb);
        free(lk);
    }
    free(a.bytes);
    free(a.blocks);
}

static int ndevices = OG_MAX_DEVICES; /* the driver's count, read once: fewer shard passes */

static void counters(og_live_body_t *b, uint64_t now_ms)
{
    int n = 0;
    uint64_t mono = og_now_ns();
    for (int dev = 0; dev < ndevices && n < OG_LIVE_DEVS; dev++) {
        oomguard_device_stats_t st;
        og_ledger_counts(dev, &st);
        uint64_t w = atomic_load(&warnings[dev]);
        if (!st.allocs && !st.peak_tracked_bytes && !st.failures && !w)
            continue;
        og_live_dev_t *d = &b->dev[n];
        if (d->index != dev) { /* a new device in this slot: its own libraries */
            memset(d, 0, sizeof *d);
            memset(&trends[n], 0, sizeof trends[n]);
            trends[n].device = dev;
            og_cfn_cuDeviceGetPCIBusId bus = OG_CALL(cuDeviceGetPCIBusId); /* once per device */
            if (!bus || bus(d->pci, sizeof d->pci, dev) != CUDA_SUCCESS)
                d->pci[0] = 0;
        }
        d->index = dev;
        d->tracked = st.tracked_bytes;
        d->by_kind[OG_LIVE_K_plain] = st.plain_bytes;
        d->by_kind[OG_LIVE_K_managed] = st.managed_bytes;
        d->by_kind[OG_LIVE_K_pool] = st.pool_reserved_bytes;
        d->by_kind[OG_LIVE_K_vmm] = st.vmm_physical_bytes;
        uint64_t known = st.plain_bytes + st.managed_bytes + st.pool_reserved_bytes + st.vmm_physical_bytes;
        d->by_kind[OG_LIVE_K_graph] = st.tracked_bytes > known ? st.tracked_bytes - known : 0;
        d->pool_used = st.pool_used_bytes;
        d->peak = st.peak_tracked_bytes;
        uint64_t pt = og_ledger_peak_t_ns(dev);
        d->peak_unix_ms = pt && pt <= mono ? now_ms - (mono - pt) / 1000000 : 0;
        d->allocs = st.allocs;
        d->frees = st.frees;
        d->failures = st.failures;
        d->warnings = w;
        uint64_t lim = og_limit_cached(dev), wa = og_warn_cached(dev);
        d->limit = lim == UINT64_MAX ? OG_LIVE_NONE : lim;
        d->warn_at = wa == UINT64_MAX ? OG_LIVE_NONE : wa;
        trend_t *t = &trends[n];
        t->t_ms[t->pos] = now_ms;
        t->tracked[t->pos] = st.tracked_bytes;
        t->pos = (t->pos + 1) % OG_LIVE_TREND;
        if (t->n < OG_LIVE_TREND)
            t->n++;
        int oldest = t->n < OG_LIVE_TREND ? 0 : t->pos;
        uint64_t dt = now_ms - t->t_ms[oldest];
        d->rate = dt ? (int64_t)(((double)st.tracked_bytes - (double)t->tracked[oldest]) * 1000.0 / (double)dt) : 0;
        n++;
    }
    for (int s = n; s < OG_LIVE_DEVS; s++)
        b->dev[s].index = -1;
    b->ndevs = n;
    og_framework_view_t *fw = calloc(1, sizeof *fw);
    if (fw) {
        og_framework_view_get(fw);
        for (int s = 0; fw->has && s < n; s++) {
            og_live_dev_t *d = &b->dev[s];
            if (d->index != fw->device)
                continue;
            d->fw_unix_ms = now_ms - (mono - fw->reported_t_ns) / 1000000;
            d->fw_allocated = fw->allocated_bytes;
            d->fw_reserved = fw->reserved_bytes;
            d->fw_peak = og_or(fw->peak_bytes, OG_LIVE_NONE); /* not reported: the page's "not known" */
            snprintf(d->fw_name, sizeof d->fw_name, "%.23s", fw->framework[0] ? fw->framework : fw->source);
        }
        free(fw);
    }
}

static void publish(bool with_libs)
{
    uint64_t now = unix_ms();
    counters(&body, now);
    if (with_libs)
        libraries(&body);
    body.updated_unix_ms = now;
    body.updates++;
    /* the seqlock: odd while the body is being copied */
    uint64_t s = atomic_load_explicit(&page->seq, memory_order_relaxed);
    atomic_store_explicit(&page->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy(&page->body, &body, sizeof body);
    atomic_store_explicit(&page->seq, s + 2, memory_order_release);
}

/* ------------------------------------------------------------------ snapshots */

static uint64_t snap_served;
#define OG_SNAPSHOT_FRESH_MS 1000u /* how long a snapshot waits for the framework's fresh numbers */

static void snapshot_serve(void)
{
    uint64_t req = atomic_load_explicit(&page->snap_req, memory_order_acquire);
    if (req == snap_served)
        return;
    snap_served = req;
    int dev = -1;
    uint64_t most = 0;
    for (int s = 0; s < body.ndevs; s++)
        if (dev < 0 || body.dev[s].tracked > most) {
            dev = body.dev[s].index;
            most = body.dev[s].tracked;
        }
    char path[sizeof page->snap_path];
    path[0] = 0;
    /* a Python job's framework numbers asked afresh on its interpreter (bounded; never a
     * signal), else the last reported ones, with their age and why */
    char why[160] = "";
    if (dev >= 0 && !atomic_load(&og_exiting))
        og_framework_refresh(dev, OG_SNAPSHOT_FRESH_MS, why, sizeof why);
    bool ok = dev >= 0 && !atomic_load(&og_exiting) && og_dump_snapshot(dev, why, path, sizeof path);
    memcpy(page->snap_path, path, sizeof path);
    atomic_store(&page->snap_ok, ok ? 1 : 0);
    atomic_store_explicit(&page->snap_done, req, memory_order_release);
    if (og_opt.verbose)
        og_log("snapshot dump written: %s", ok ? path : "(none)");
}

/* ------------------------------------------------------------------ the thread */

static void *live_main(void *arg)
{
    og_in_shim = 1; /* nothing this thread does is the program's */
    memset(&body, 0, sizeof body);
    memset(trends, 0, sizeof trends);
    page = page_create();
    if (!page)
        return NULL;
    identity(&body);
    og_cfn_cuDeviceGetCount count = OG_CALL(cuDeviceGetCount);
    int nd = 0;
    if (count && count(&nd) == CUDA_SUCCESS && nd > 0 && nd < OG_MAX_DEVICES)
        ndevices = nd;
    for (int s = 0; s < OG_LIVE_DEVS; s++)
        body.dev[s].index = -1;
    snap_served = atomic_load(&page->snap_req);
    for (unsigned round = 0; !atomic_load(&stopping) && !atomic_load(&og_exiting); round++) {
        bool kick = atomic_exchange(&kicked, 0);
        publish(kick || round % OG_LIVE_LIB_EVERY == 0);
        snapshot_serve();
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += OG_LIVE_PERIOD_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&wake_lock);
        while (!atomic_load(&kicked) && !atomic_load(&stopping) &&
               pthread_cond_timedwait(&wake_cond, &wake_lock, &until) == 0) {
        }
        pthread_mutex_unlock(&wake_lock);
    }
    return NULL;
}

static void cond_init(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wake_cond, &ca);
    pthread_condattr_destroy(&ca);
}

void og_live_ensure(void)
{
    if (atomic_load_explicit(&started, memory_order_relaxed) || !og_opt.live)
        return;
    /* the condition first, `started` after: a failure in another thread kicks (signals it) as
     * soon as it sees `started` */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cond_init);
    if (atomic_exchange(&started, 1))
        return;
    page_pid = (int)getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits "everything blocked" */
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    if (pthread_create(&t, &at, live_main, NULL) != 0 && og_opt.verbose)
        og_log("live page: no thread could be started: not published");
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* At exit (atexit handler or destructor): the page goes away with the process. */
void og_live_exit(void)
{
    atomic_store(&stopping, 1);
    if (atomic_load(&page_named) && page_pid == (int)getpid() && atomic_exchange(&page_named, 0))
        unlink(page_path);
}

/* The child has no helper thread; the parent's page is the parent's.  The child publishes its
 * own from its first tracked call. */
void og_live_atfork_child(void)
{
    if (page)
        munmap(page, sizeof *page);
    page = NULL;
    atomic_store(&page_named, 0);
    atomic_store(&started, 0);
    atomic_store(&stopping, 0);
    atomic_store(&kicked, 0);
    pthread_mutex_init(&wake_lock, NULL);
    cond_init();
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        atomic_store(&warnings[i], 0);
}
