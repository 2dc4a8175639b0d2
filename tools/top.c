/* tools/top.c — `oomguard top` (a live view of every GPU: per process, who inside it holds
 * memory, from the live pages the shim publishes; other processes from NVML) and
 * `oomguard snapshot` (ask a running process for a dump now).
 *
 * The pages: shim/live.h says where they are, how they are checked and read (seqlock).
 * NVML is opened at run time (dlopen), so the command runs where there is none: then only
 * the pages are shown. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "live.h"
#include "util.h"

#define MAX_PROCS 512
#define MAX_GPUS  64

/* ------------------------------------------------------------------ pages */

struct page {
    og_live_body_t b;
    char path[4200];
    int fd; /* kept open (O_RDWR) by snapshot only */
    og_live_page_t *map;
};

struct pages {
    struct page *p;
    int n, cap;
    int stale_removed;
};

/* A copy of the body that no write tore (the seqlock); false when none could be had. */
static bool page_read(const og_live_page_t *m, og_live_body_t *out)
{
    for (int tries = 0; tries < 200; tries++) {
        uint64_t s1 = atomic_load_explicit(&m->seq, memory_order_acquire);
        if (s1 == 0)
            return false; /* never published yet */
        if (s1 & 1) {
            usleep(100);
            continue;
        }
        memcpy(out, (const void *)&m->body, sizeof *out);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&m->seq, memory_order_relaxed) == s1)
            return true;
    }
    return false;
}

static void base_dirs(const char *dir, const char *bases[3], int *nb)
{
    *nb = 0;
    const char *env = getenv("OOMGUARD_LIVE_DIR");
    if (dir && *dir)
        bases[(*nb)++] = dir;
    else if (env && *env)
        bases[(*nb)++] = env;
    else {
        bases[(*nb)++] = "/dev/shm";
        const char *t = getenv("TMPDIR");
        if (t && *t && strcmp(t, "/tmp") != 0 && strcmp(t, "/dev/shm") != 0)
            bases[(*nb)++] = t;
        bases[(*nb)++] = "/tmp";
    }
}

/* Every page this user may read (root: every user's), checked as shim/live.h says. */
static void pages_load(struct pages *ps, const char *dir, bool writable, int only_pid)
{
    const char *bases[3];
    int nb;
    base_dirs(dir, bases, &nb);
    uid_t me = geteuid();
    for (int i = 0; i < nb; i++) {
        DIR *bd = opendir(bases[i]);
        if (!bd)
            continue;
        for (struct dirent *e; (e = readdir(bd));) {
            size_t pl = strlen(OG_LIVE_DIR_PREFIX);
            if (strncmp(e->d_name, OG_LIVE_DIR_PREFIX, pl) != 0 || !isdigit((unsigned char)e->d_name[pl]))
                continue;
            char *end;
            unsigned long uid = strtoul(e->d_name + pl, &end, 10);
            if ((*end && *end != '.') || (me != 0 && uid != me))
                continue;
            int dfd = openat(dirfd(bd), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            struct stat st;
            if (dfd < 0)
                continue;
            if (fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 0777) != 0700) {
                close(dfd); /* not the user's own private directory */
                continue;
            }
            DIR *pd = fdopendir(dfd);
            if (!pd) {
                close(dfd);
                continue;
            }
            for (struct dirent *f; (f = readdir(pd));) {
                size_t l = strlen(f->d_name);
                if (l < 6 || strcmp(f->d_name + l - 5, ".page") != 0)
                    continue;
                int pid = atoi(f->d_name);
                if (pid <= 0 || (only_pid > 0 && pid != only_pid))
                    continue;
                int fd = openat(dfd, f->d_name, (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_CLOEXEC);
                if (fd < 0)
                    continue;
                struct stat fs;
                if (fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) || fs.st_uid != uid || (fs.st_mode & 077) ||
                    fs.st_size < (off_t)sizeof(og_live_page_t)) {
                    close(fd);
                    continue;
                }
                og_live_page_t *m = mmap(NULL, sizeof *m, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
                if (m == MAP_FAILED) {
                    close(fd);
                    continue;
                }
                og_live_body_t b;
                bool ok = m->magic == OG_LIVE_MAGIC && m->version == OG_LIVE_VERSION && m->size >= sizeof *m &&
                          page_read(m, &b) && b.pid == pid && b.uid == uid;
                uint64_t st_now = og_live_start_ticks(pid);
                bool stale = m->magic == OG_LIVE_MAGIC && ok && (st_now == 0 || st_now != b.start_ticks);
                if (!stale && m->magic == OG_LIVE_MAGIC && !ok) {
                    /* a page not yet published, or never will be: only its process's death says */
                    stale = og_live_start_ticks(pid) == 0;
                }
                if (stale) {
                    if (unlinkat(dfd, f->d_name, 0) == 0)
                        ps->stale_removed++;
                    ok = false;
                }
                if (!ok) {
                    munmap(m, sizeof *m);
                    close(fd);
                    continue;
                }
                if (ps->n == ps->cap) {
                    ps->cap = ps->cap ? ps->cap * 2 : 16;
                    ps->p = xrealloc(ps->p, (size_t)ps->cap * sizeof *ps->p);
                }
                struct page *pg = &ps->p[ps->n++];
                pg->b = b;
                snprintf(pg->path, sizeof pg->path, "%s/%s/%s", bases[i], e->d_name, f->d_name);
                if (writable) {
                    pg->fd = fd;
                    pg->map = m;
                } else {
                    pg->fd = -1;
                    pg->map = NULL;
                    munmap(m, sizeof *m);
                    close(fd);
                }
            }
            closedir(pd);
        }
        closedir(bd);
    }
}

static void pages_free(struct pages *ps)
{
    for (int i = 0; i < ps->n; i++) {
        if (ps->p[i].map)
            munmap(ps->p[i].map, sizeof(og_live_page_t));
        if (ps->p[i].fd >= 0)
            close(ps->p[i].fd);
    }
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

/* ------------------------------------------------------------------ NVML (optional) */

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
} nv_proc_t;
typedef struct {
    unsigned long long total, free, used;
} nv_mem_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nv_pci_t;

static struct {
    bool tried, ok;
    int (*init)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, void **);
    int (*name)(void *, char *, unsigned int);
    int (*mem)(void *, nv_mem_t *);
    int (*pci)(void *, nv_pci_t *);
    int (*procs)(void *, unsigned int *, nv_proc_t *);
} nv;

static bool nvml_open(void)
{
    if (nv.tried)
        return nv.ok;
    nv.tried = true;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return false;
    *(void **)&nv.init = dlsym(h, "nvmlInit_v2");
    *(void **)&nv.count = dlsym(h, "nvmlDeviceGetCount_v2");
    *(void **)&nv.handle = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nv.name = dlsym(h, "nvmlDeviceGetName");
    *(void **)&nv.mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
    *(void **)&nv.pci = dlsym(h, "nvmlDeviceGetPciInfo_v3");
    *(void **)&nv.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    nv.ok = nv.init && nv.count && nv.handle && nv.mem && nv.init() == 0;
    return nv.ok;
}

/* ------------------------------------------------------------------ the model */

struct proc {
    int gpu; /* index into gpus[] */
    int pid;
    const og_live_body_t *b; /* NULL: a process without the library (NVML only) */
    const og_live_dev_t *d;
    uint64_t nvml_used; /* OG_LIVE_NONE when NVML does not list it */
};

struct gpu {
    int index; /* NVML index (or the CUDA ordinal without NVML) */
    char name[96], pci[32];
    bool nvml;
    uint64_t total, free, used;
};

struct model {
    struct pages pages;
    struct gpu gpus[MAX_GPUS];
    int ngpus;
    struct proc procs[MAX_PROCS];
    int nprocs;
    uint64_t now_ms;
};

static bool pci_same(const char *a, const char *b)
{
    /* "0000:65:00.0" vs "00000000:65:00.0": compare bus:device.function and the domain's value */
    const char *ca = strchr(a, ':'), *cb = strchr(b, ':');
    if (!ca || !cb || strcasecmp(ca, cb) != 0)
        return false;
    return strtoul(a, NULL, 16) == strtoul(b, NULL, 16);
}

static uint64_t now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int gpu_for(struct model *m, const og_live_dev_t *d)
{
    for (int g = 0; g < m->ngpus; g++)
        if (m->gpus[g].nvml && d->pci[0] && m->gpus[g].pci[0] && pci_same(d->pci, m->gpus[g].pci))
            return g;
    for (int g = 0; g < m->ngpus; g++)
        if (m->gpus[g].index == d->index && (!d->pci[0] || !m->gpus[g].pci[0]))
            return g;
    if (m->ngpus == MAX_GPUS)
        return -1;
    struct gpu *n = &m->gpus[m->ngpus];
    memset(n, 0, sizeof *n);
    n->index = d->index;
    snprintf(n->pci, sizeof n->pci, "%s", d->pci);
    n->total = n->free = n->used = OG_LIVE_NONE;
    return m->ngpus++;
}

static void model_load(struct model *m, const char *dir)
{
    pages_free(&m->pages);
    m->ngpus = m->nprocs = 0;
    m->now_ms = now_unix_ms();
    pages_load(&m->pages, dir, false, 0);
    nv_proc_t *np = NULL;
    unsigned int nnp[MAX_GPUS] = { 0 };
    nv_proc_t *plist[MAX_GPUS] = { 0 };
    if (nvml_open()) {
        unsigned int n = 0;
        nv.count(&n);
        for (unsigned int i = 0; i < n && m->ngpus < MAX_GPUS; i++) {
            void *h;
            if (nv.handle(i, &h) != 0)
                continue;
            struct gpu *g = &m->gpus[m->ngpus];
            memset(g, 0, sizeof *g);
            g->index = (int)i;
            g->nvml = true;
            if (!nv.name || nv.name(h, g->name, sizeof g->name) != 0)
                g->name[0] = 0;
            nv_mem_t mem;
            if (nv.mem(h, &mem) == 0) {
                g->total = mem.total;
                g->free = mem.free;
                g->used = mem.used;
            } else {
                g->total = g->free = g->used = OG_LIVE_NONE;
            }
            nv_pci_t pci;
            if (nv.pci && nv.pci(h, &pci) == 0)
                snprintf(g->pci, sizeof g->pci, "%.15s", pci.busIdLegacy);
            if (nv.procs) {
                unsigned int cnt = 256;
                /* room for the widest entries a driver may write (32 bytes): we read 24-byte ones */
                np = calloc(cnt * 2, sizeof *np);
                if (np && nv.procs(h, &cnt, np) == 0) {
                    plist[m->ngpus] = np;
                    nnp[m->ngpus] = cnt;
                } else {
                    free(np);
                }
                np = NULL;
            }
            m->ngpus++;
        }
    }
    for (int i = 0; i < m->pages.n; i++) {
        const og_live_body_t *b = &m->pages.p[i].b;
        for (int s = 0; s < b->ndevs && s < OG_LIVE_DEVS; s++) {
            const og_live_dev_t *d = &b->dev[s];
            if (d->index < 0 || m->nprocs == MAX_PROCS)
                continue;
            int g = gpu_for(m, d);
            if (g < 0)
                continue;
            struct proc *p = &m->procs[m->nprocs++];
            p->gpu = g;
            p->pid = b->pid;
            p->b = b;
            p->d = d;
            p->nvml_used = OG_LIVE_NONE;
        }
    }
    for (int g = 0; g < m->ngpus; g++) {
        for (unsigned int k = 0; k < nnp[g]; k++) {
            int pid = (int)plist[g][k].pid;
            bool found = false;
            for (int i = 0; i < m->nprocs; i++)
                if (m->procs[i].gpu == g && m->procs[i].pid == pid) {
                    m->procs[i].nvml_used = plist[g][k].used;
                    found = true;
                }
            if (!found && m->nprocs < MAX_PROCS)
                m->procs[m->nprocs++] = (struct proc){ g, pid, NULL, NULL, plist[g][k].used };
        }
        free(plist[g]);
    }
}

static uint64_t proc_bytes(const struct proc *p) { return p->d ? p->d->tracked : p->nvml_used; }

/* what the process may still take: to its limit, else what the GPU has free */
static uint64_t headroom(const struct model *m, const struct proc *p)
{
    const struct gpu *g = &m->gpus[p->gpu];
    uint64_t free_b = g->free;
    if (p->d && p->d->limit != OG_LIVE_NONE) {
        uint64_t left = p->d->limit > p->d->tracked ? p->d->limit - p->d->tracked : 0;
        return free_b != OG_LIVE_NONE && free_b < left ? free_b : left;
    }
    return free_b;
}

static void proc_cmd(const struct proc *p, char *out, size_t n)
{
    if (p->b) {
        snprintf(out, n, "%s", p->b->cmd);
        return;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", p->pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t r = fd >= 0 ? read(fd, out, n - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (r <= 0) {
        snprintf(out, n, "?");
        return;
    }
    out[r] = 0;
    for (ssize_t i = 0; i < r; i++)
        if (!out[i])
            out[i] = ' ';
    while (r > 0 && out[r - 1] == ' ')
        out[--r] = 0;
}

/* ------------------------------------------------------------------ sorting and filtering */

enum sort_key { SORT_USAGE, SORT_PEAK, SORT_RATE, SORT_PID, SORT_COUNT };
static const char *const sort_names[SORT_COUNT] = { "usage", "peak", "rate", "pid" };

struct view {
    enum sort_key sort;
    char filter[64]; /* substring of the command, job or pid; "" none */
    int gpu;         /* -1 every GPU */
    bool libs;       /* library lines under each process */
    int width;
    int top_libs; /* prometheus: libraries per process, then "other" */
};

static bool proc_matches(const struct view *v, const struct proc *p)
{
    if (!v->filter[0])
        return true;
    char cmd[512], pid[16];
    proc_cmd(p, cmd, sizeof cmd);
    snprintf(pid, sizeof pid, "%d", p->pid);
    return strstr(cmd, v->filter) || (p->b && strstr(p->b->job, v->filter)) || strcmp(pid, v->filter) == 0;
}

static const struct view *sort_view;
static int cmp_proc(const void *a, const void *b)
{
    const struct proc *x = a, *y = b;
    if (x->gpu != y->gpu)
        return x->gpu - y->gpu;
    int64_t kx = 0, ky = 0;
    switch (sort_view->sort) {
    case SORT_USAGE:
        kx = (int64_t)(proc_bytes(x) == OG_LIVE_NONE ? 0 : proc_bytes(x));
        ky = (int64_t)(proc_bytes(y) == OG_LIVE_NONE ? 0 : proc_bytes(y));
        break;
    case SORT_PEAK:
        kx = x->d ? (int64_t)x->d->peak : 0;
        ky = y->d ? (int64_t)y->d->peak : 0;
        break;
    case SORT_RATE:
        kx = x->d ? x->d->rate : 0;
        ky = y->d ? y->d->rate : 0;
        break;
    default:
        return x->pid - y->pid;
    }
    return kx < ky ? 1 : kx > ky ? -1 : x->pid - y->pid;
}

/* ------------------------------------------------------------------ text */

/* short sizes for narrow columns: "1.5G", "512M", "12K" */
static const char *sz(uint64_t v, char out[16])
{
    if (v == OG_LIVE_NONE) {
        snprintf(out, 16, "-");
        return out;
    }
    const char *u = "KMGTP";
    double x = (double)v;
    if (x < 1024) {
        snprintf(out, 16, "%uB", (unsigned)v);
        return out;
    }
    int i = -1;
    while (x >= 1024 && i < 4) {
        x /= 1024;
        i++;
    }
    snprintf(out, 16, x < 10 ? "%.2f%c" : x < 100 ? "%.1f%c" : "%.0f%c", x, u[i]);
    return out;
}

static const char *rate_str(int64_t r, char out[24])
{
    char b[16];
    if (r > -1024 * 1024 && r < 1024 * 1024) {
        snprintf(out, 24, "steady");
        return out;
    }
    snprintf(out, 24, "%s%s/s", r > 0 ? "+" : "-", sz((uint64_t)(r > 0 ? r : -r), b));
    return out;
}

static void ago(uint64_t now, uint64_t t, char out[24])
{
    if (!t || t > now + 1000) {
        snprintf(out, 24, "-");
        return;
    }
    uint64_t s = (now - t) / 1000;
    if (s < 120)
        snprintf(out, 24, "%llus ago", (unsigned long long)s);
    else if (s < 7200)
        snprintf(out, 24, "%llum ago", (unsigned long long)(s / 60));
    else
        snprintf(out, 24, "%lluh ago", (unsigned long long)(s / 3600));
}

/* one line, cut to the width (sb_text keeps untrusted strings printable) */
static void line_end(og_sb_t *b, size_t start, int width)
{
    size_t w = text_width(b->buf + start, SIZE_MAX);
    (void)w;
    /* the line was built from ASCII formats plus sb_text'ed strings: cut by characters */
    size_t chars = 0, i = start;
    while (i < b->len && chars < (size_t)width) {
        unsigned char c = (unsigned char)b->buf[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        i += k;
        chars++;
    }
    if (i < b->len)
        b->len = i;
    og_sb_putc(b, '\n');
}

static void render_text(const struct model *m, const struct view *v, og_sb_t *b, bool screen)
{
    char t1[16], t2[16], t3[16], r[24], a[24];
    time_t now = (time_t)(m->now_ms / 1000);
    struct tm tm;
    localtime_r(&now, &tm);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    size_t s0 = b->len;
    og_sb_printf(b, "oomguard top  %.24s  %02d:%02d:%02d  sort %s", host, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 sort_names[v->sort]);
    if (v->filter[0]) {
        og_sb_puts(b, "  filter ");
        sb_text(b, v->filter, 20, 0);
    }
    if (v->gpu >= 0)
        og_sb_printf(b, "  gpu %d", v->gpu);
    line_end(b, s0, v->width);
    if (screen) {
        s0 = b->len;
        og_sb_puts(b, "q quit  s sort  / filter  g gpu  l libraries  * framework  ~ no oomguard");
        line_end(b, s0, v->width);
    }
    if (!m->ngpus) {
        og_sb_puts(b, "no GPU: no NVML and no process publishing under oomguard\n");
        return;
    }
    for (int g = 0; g < m->ngpus; g++) {
        const struct gpu *gp = &m->gpus[g];
        if (v->gpu >= 0 && gp->index != v->gpu)
            continue;
        s0 = b->len;
        og_sb_printf(b, "GPU %d ", gp->index);
        sb_text(b, gp->name[0] ? gp->name : "?", 28, 0);
        if (gp->nvml)
            og_sb_printf(b, "  used %s of %s  free %s", sz(gp->used, t1), sz(gp->total, t2), sz(gp->free, t3));
        else
            og_sb_puts(b, "  (no NVML: totals unknown)");
        line_end(b, s0, v->width);
        s0 = b->len;
        og_sb_printf(b, "  %7s %4s %-6s %7s %7s %9s %8s %3s %s", "PID", "RANK", "JOB", "USAGE", "PEAK", "TREND",
                     "HEADROOM", "F/W", "COMMAND");
        line_end(b, s0, v->width);
        for (int i = 0; i < m->nprocs; i++) {
            const struct proc *p = &m->procs[i];
            if (p->gpu != g || !proc_matches(v, p))
                continue;
            char cmd[512];
            proc_cmd(p, cmd, sizeof cmd);
            s0 = b->len;
            if (p->d) {
                char rank[24], fw[48];
                snprintf(rank, sizeof rank, "%lld", (long long)p->b->rank);
                snprintf(fw, sizeof fw, "%llu/%llu", (unsigned long long)(p->d->failures > 99 ? 99 : p->d->failures),
                         (unsigned long long)(p->d->warnings > 99 ? 99 : p->d->warnings));
                og_sb_printf(b, "  %7d %4s ", p->pid, p->b->rank >= 0 ? rank : "-");
                size_t j0 = b->len;
                sb_text(b, p->b->job[0] ? p->b->job : "-", 6, 0);
                for (size_t w = b->len - j0; w < 6; w++)
                    og_sb_putc(b, ' ');
                og_sb_printf(b, " %7s %7s %9s %8s %3s ", sz(p->d->tracked, t1), sz(p->d->peak, t2),
                             rate_str(p->d->rate, r), sz(headroom(m, p), t3), fw);
            } else {
                og_sb_printf(b, "~ %7d %4s %-6s %7s %7s %9s %8s %3s ", p->pid, "-", "-", sz(p->nvml_used, t1), "-", "-",
                             sz(m->gpus[g].free, t3), "-");
            }
            /* the program's name without its directory: the arguments say more in 80 columns */
            const char *shown = cmd;
            if (cmd[0] == '/') {
                const char *sp = strchr(cmd, ' '), *sl = cmd;
                for (const char *q = cmd; *q && (!sp || q < sp); q++)
                    if (*q == '/')
                        sl = q + 1;
                shown = sl;
            }
            sb_text(b, shown, 200, 0);
            line_end(b, s0, v->width);
            if (!p->d || !v->libs)
                continue;
            s0 = b->len;
            og_sb_puts(b, "           ");
            for (uint32_t l = 0; l < p->d->nlibs && l < OG_LIVE_LIBS; l++) {
                sb_text(b, p->d->libs[l].name, 28, 0);
                og_sb_printf(b, "%s %s  ", p->d->libs[l].framework ? "*" : "", sz(p->d->libs[l].bytes, t1));
            }
            if (p->d->other_lib_bytes)
                og_sb_printf(b, "other %s", sz(p->d->other_lib_bytes, t1));
            if (!p->d->nlibs && !p->d->other_lib_bytes)
                og_sb_puts(b, "(nothing held)");
            line_end(b, s0, v->width);
            s0 = b->len;
            ago(m->now_ms, p->d->peak_unix_ms, a);
            og_sb_printf(b, "           peak %s %s  allocs %llu frees %llu", sz(p->d->peak, t1), a,
                         (unsigned long long)p->d->allocs, (unsigned long long)p->d->frees);
            if (p->d->limit != OG_LIVE_NONE)
                og_sb_printf(b, "  limit %s", sz(p->d->limit, t1));
            if (p->d->warn_at != OG_LIVE_NONE)
                og_sb_printf(b, "  warn %s", sz(p->d->warn_at, t1));
            if (p->nvml_used != OG_LIVE_NONE)
                og_sb_printf(b, "  nvml %s", sz(p->nvml_used, t1));
            line_end(b, s0, v->width);
            if (p->d->fw_unix_ms) {
                s0 = b->len;
                ago(m->now_ms, p->d->fw_unix_ms, a);
                og_sb_puts(b, "           ");
                sb_text(b, p->d->fw_name[0] ? p->d->fw_name : "framework", 16, 0);
                og_sb_printf(b, ": allocated %s reserved %s (%s)", sz(p->d->fw_allocated, t1),
                             sz(p->d->fw_reserved, t2), a);
                line_end(b, s0, v->width);
            }
        }
    }
}

/* ------------------------------------------------------------------ json */

static void num_or_null(cJSON *o, const char *k, uint64_t v)
{
    if (v == OG_LIVE_NONE)
        cJSON_AddNullToObject(o, k);
    else
        cJSON_AddNumberToObject(o, k, (double)v);
}

static char *render_json(const struct model *m, const struct view *v)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", "oomguard.top/1");
    cJSON_AddNumberToObject(root, "time", (double)m->now_ms / 1000.0);
    cJSON *gpus = cJSON_AddArrayToObject(root, "gpus");
    for (int g = 0; g < m->ngpus; g++) {
        const struct gpu *gp = &m->gpus[g];
        if (v->gpu >= 0 && gp->index != v->gpu)
            continue;
        cJSON *jg = cJSON_CreateObject();
        cJSON_AddItemToArray(gpus, jg);
        cJSON_AddNumberToObject(jg, "index", gp->index);
        cJSON_AddStringToObject(jg, "name", gp->name);
        cJSON_AddStringToObject(jg, "pci_bus_id", gp->pci);
        cJSON_AddBoolToObject(jg, "nvml", gp->nvml);
        num_or_null(jg, "total_bytes", gp->total);
        num_or_null(jg, "used_bytes", gp->used);
        num_or_null(jg, "free_bytes", gp->free);
        cJSON *jp = cJSON_AddArrayToObject(jg, "processes");
        for (int i = 0; i < m->nprocs; i++) {
            const struct proc *p = &m->procs[i];
            if (p->gpu != g || !proc_matches(v, p))
                continue;
            cJSON *o = cJSON_CreateObject();
            cJSON_AddItemToArray(jp, o);
            char cmd[512];
            proc_cmd(p, cmd, sizeof cmd);
            cJSON_AddNumberToObject(o, "pid", p->pid);
            cJSON_AddStringToObject(o, "source", p->d ? "oomguard" : "nvml");
            cJSON_AddStringToObject(o, "command", cmd);
            num_or_null(o, "nvml_used_bytes", p->nvml_used);
            num_or_null(o, "headroom_bytes", headroom(m, p));
            if (!p->d)
                continue;
            const og_live_dev_t *d = p->d;
            cJSON_AddNumberToObject(o, "device", d->index);
            if (p->b->rank >= 0)
                cJSON_AddNumberToObject(o, "rank", (double)p->b->rank);
            else
                cJSON_AddNullToObject(o, "rank");
            cJSON_AddStringToObject(o, "job", p->b->job);
            cJSON_AddStringToObject(o, "host", p->b->host);
            cJSON_AddNumberToObject(o, "updated", (double)p->b->updated_unix_ms / 1000.0);
            cJSON_AddNumberToObject(o, "tracked_bytes", (double)d->tracked);
            cJSON_AddNumberToObject(o, "peak_bytes", (double)d->peak);
            if (d->peak_unix_ms)
                cJSON_AddNumberToObject(o, "peak_time", (double)d->peak_unix_ms / 1000.0);
            else
                cJSON_AddNullToObject(o, "peak_time");
            cJSON_AddNumberToObject(o, "rate_bytes_per_s", (double)d->rate);
            cJSON *k = cJSON_AddObjectToObject(o, "by_kind");
#define KIND_JSON(kn) cJSON_AddNumberToObject(k, #kn, (double)d->by_kind[OG_LIVE_K_##kn]);
            OG_LIVE_KINDS(KIND_JSON)
#undef KIND_JSON
            cJSON_AddNumberToObject(o, "pool_used_bytes", (double)d->pool_used);
            cJSON *libs = cJSON_AddArrayToObject(o, "libraries");
            for (uint32_t l = 0; l < d->nlibs && l < OG_LIVE_LIBS; l++) {
                cJSON *jl = cJSON_CreateObject();
                cJSON_AddItemToArray(libs, jl);
                cJSON_AddStringToObject(jl, "library", d->libs[l].name);
                cJSON_AddNumberToObject(jl, "bytes", (double)d->libs[l].bytes);
                cJSON_AddNumberToObject(jl, "blocks", d->libs[l].blocks);
                cJSON_AddBoolToObject(jl, "framework", d->libs[l].framework);
            }
            cJSON_AddNumberToObject(o, "other_library_bytes", (double)d->other_lib_bytes);
            cJSON_AddNumberToObject(o, "allocs", (double)d->allocs);
            cJSON_AddNumberToObject(o, "frees", (double)d->frees);
            cJSON_AddNumberToObject(o, "failures", (double)d->failures);
            cJSON_AddNumberToObject(o, "warnings", (double)d->warnings);
            num_or_null(o, "limit_bytes", d->limit);
            num_or_null(o, "warn_at_bytes", d->warn_at);
            if (d->fw_unix_ms) {
                cJSON *f = cJSON_AddObjectToObject(o, "framework");
                cJSON_AddStringToObject(f, "name", d->fw_name);
                cJSON_AddNumberToObject(f, "allocated_bytes", (double)d->fw_allocated);
                cJSON_AddNumberToObject(f, "reserved_bytes", (double)d->fw_reserved);
                cJSON_AddNumberToObject(f, "reported", (double)d->fw_unix_ms / 1000.0);
            } else {
                cJSON_AddNullToObject(o, "framework");
            }
        }
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

/* ------------------------------------------------------------------ prometheus */

static void prom_label(og_sb_t *b, const char *k, const char *v, bool first)
{
    og_sb_printf(b, "%s%s=\"", first ? "" : ",", k);
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        if (*p == '\\' || *p == '"')
            og_sb_printf(b, "\\%c", *p);
        else if (*p == '\n')
            og_sb_puts(b, "\\n");
        else if (*p >= 0x20 && *p != 0x7f)
            og_sb_putc(b, *p);
    }
    og_sb_putc(b, '"');
}

static void prom_proc_labels(og_sb_t *b, const struct model *m, const struct proc *p)
{
    char n[32];
    snprintf(n, sizeof n, "%d", m->gpus[p->gpu].index);
    prom_label(b, "gpu", n, true);
    snprintf(n, sizeof n, "%d", p->pid);
    prom_label(b, "pid", n, false);
    prom_label(b, "job", p->b && p->b->job[0] ? p->b->job : "", false);
    if (p->b && p->b->rank >= 0)
        snprintf(n, sizeof n, "%lld", (long long)p->b->rank);
    else
        n[0] = 0;
    prom_label(b, "rank", n, false);
}

typedef uint64_t (*prom_val_fn)(const struct model *m, const struct proc *p);
static uint64_t pv_tracked(const struct model *m, const struct proc *p) { return p->d->tracked; }
static uint64_t pv_peak(const struct model *m, const struct proc *p) { return p->d->peak; }
static uint64_t pv_head(const struct model *m, const struct proc *p) { return headroom(m, p); }
static uint64_t pv_limit(const struct model *m, const struct proc *p) { return p->d->limit; }
static uint64_t pv_fail(const struct model *m, const struct proc *p) { return p->d->failures; }
static uint64_t pv_warn(const struct model *m, const struct proc *p) { return p->d->warnings; }
static uint64_t pv_nvml(const struct model *m, const struct proc *p) { return p->d ? OG_LIVE_NONE : p->nvml_used; }

static void render_prom(const struct model *m, const struct view *v, og_sb_t *b)
{
    static const struct {
        const char *name, *type, *help;
        prom_val_fn fn;
    } fam[] = {
        { "oomguard_device_tracked_bytes", "gauge", "Device memory a process holds, as oomguard's ledger counts it",
          pv_tracked },
        { "oomguard_device_peak_bytes", "gauge", "Highest tracked device memory of the process so far", pv_peak },
        { "oomguard_device_headroom_bytes", "gauge",
          "What the process may still take: to its OOMGUARD_LIMIT, else the GPU's free memory", pv_head },
        { "oomguard_device_limit_bytes", "gauge", "OOMGUARD_LIMIT of the process on the device", pv_limit },
        { "oomguard_allocation_failures_total", "counter", "Out-of-memory results of the process's device allocations",
          pv_fail },
        { "oomguard_warnings_total", "counter", "OOMGUARD_WARN_AT crossings of the process", pv_warn },
    };
    /* per library: the top N of each process, the rest summed as "other" */
    og_sb_puts(b,
               "# HELP oomguard_device_bytes Device memory a process holds, by the library that allocated it (top N, "
               "the rest \"other\")\n"
               "# TYPE oomguard_device_bytes gauge\n");
    for (int i = 0; i < m->nprocs; i++) {
        const struct proc *p = &m->procs[i];
        if (!p->d || !proc_matches(v, p) || (v->gpu >= 0 && m->gpus[p->gpu].index != v->gpu))
            continue;
        uint64_t other = p->d->other_lib_bytes;
        for (uint32_t l = 0; l < p->d->nlibs && l < OG_LIVE_LIBS; l++) {
            if ((int)l >= v->top_libs || !strcmp(p->d->libs[l].name, "other")) {
                other += p->d->libs[l].bytes;
                continue;
            }
            og_sb_puts(b, "oomguard_device_bytes{");
            prom_proc_labels(b, m, p);
            prom_label(b, "library", p->d->libs[l].name, false);
            prom_label(b, "framework", p->d->libs[l].framework ? "1" : "0", false);
            og_sb_printf(b, "} %llu\n", (unsigned long long)p->d->libs[l].bytes);
        }
        og_sb_puts(b, "oomguard_device_bytes{");
        prom_proc_labels(b, m, p);
        prom_label(b, "library", "other", false);
        prom_label(b, "framework", "0", false);
        og_sb_printf(b, "} %llu\n", (unsigned long long)other);
    }
    for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) {
        bool head = false;
        for (int i = 0; i < m->nprocs; i++) {
            const struct proc *p = &m->procs[i];
            if (!p->d || !proc_matches(v, p) || (v->gpu >= 0 && m->gpus[p->gpu].index != v->gpu))
                continue;
            uint64_t val = fam[f].fn(m, p);
            if (val == OG_LIVE_NONE)
                continue;
            if (!head) {
                og_sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", fam[f].name, fam[f].help, fam[f].name, fam[f].type);
                head = true;
            }
            og_sb_printf(b, "%s{", fam[f].name);
            prom_proc_labels(b, m, p);
            og_sb_printf(b, "} %llu\n", (unsigned long long)val);
        }
    }
    bool head = false;
    for (int i = 0; i < m->nprocs; i++) {
        const struct proc *p = &m->procs[i];
        if (p->d || pv_nvml(m, p) == OG_LIVE_NONE || (v->gpu >= 0 && m->gpus[p->gpu].index != v->gpu))
            continue;
        if (!head) {
            og_sb_puts(
                b,
                "# HELP oomguard_process_nvml_bytes Device memory of a process without oomguard, as NVML reports it\n"
                "# TYPE oomguard_process_nvml_bytes gauge\n");
            head = true;
        }
        og_sb_puts(b, "oomguard_process_nvml_bytes{");
        prom_proc_labels(b, m, p);
        og_sb_printf(b, "} %llu\n", (unsigned long long)p->nvml_used);
    }
    static const char *const gfam[3][2] = { { "oomguard_gpu_total_bytes", "GPU memory, as NVML reports it" },
                                            { "oomguard_gpu_used_bytes",
                                              "GPU memory in use by every process and context, as NVML reports it" },
                                            { "oomguard_gpu_free_bytes", "Free GPU memory, as NVML reports it" } };
    for (int f = 0; f < 3; f++) {
        head = false;
        for (int g = 0; g < m->ngpus; g++) {
            const struct gpu *gp = &m->gpus[g];
            uint64_t val = f == 0 ? gp->total : f == 1 ? gp->used : gp->free;
            if (!gp->nvml || val == OG_LIVE_NONE || (v->gpu >= 0 && gp->index != v->gpu))
                continue;
            if (!head) {
                og_sb_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", gfam[f][0], gfam[f][1], gfam[f][0]);
                head = true;
            }
            og_sb_printf(b, "%s{gpu=\"%d\"} %llu\n", gfam[f][0], gp->index, (unsigned long long)val);
        }
    }
}

/* ------------------------------------------------------------------ the terminal */

static struct termios saved_tio;
static bool tio_saved;
static volatile sig_atomic_t got_signal, got_winch;

static void term_restore(void)
{
    if (!tio_saved)
        return;
    const char *s = "\033[?25h\033[?1049l";
    if (write(STDOUT_FILENO, s, strlen(s)) < 0) {
        /* nothing to do */
    }
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_tio);
    tio_saved = false;
}

static void on_signal(int sig)
{
    if (sig == SIGWINCH)
        got_winch = 1;
    else
        got_signal = sig;
}

static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20)
        return ws.ws_col;
    return 80;
}

static int term_rows(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 2)
        return ws.ws_row;
    return 24;
}

static void sort_procs(struct model *m, const struct view *v)
{
    sort_view = v;
    qsort(m->procs, (size_t)m->nprocs, sizeof m->procs[0], cmp_proc);
}

static int interactive(const char *dir, struct view *v, int interval_ms)
{
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
        fprintf(stderr, "oomguard top: not a terminal; use --once (--format text|json|prometheus)\n");
        return OG_EXIT_USAGE;
    }
    tcgetattr(STDIN_FILENO, &saved_tio);
    tio_saved = true;
    atexit(term_restore);
    struct termios raw = saved_tio;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);
    const char *enter = "\033[?1049h\033[?25l";
    if (write(STDOUT_FILENO, enter, strlen(enter)) < 0)
        return OG_EXIT_OUTPUT;
    struct model *m = calloc(1, sizeof *m);
    bool editing = false;
    char edit[64] = "";
    int rc = OG_EXIT_OK;
    while (!got_signal) {
        v->width = term_width();
        model_load(m, dir);
        sort_procs(m, v);
        og_sb_t b;
        og_sb_init(&b);
        render_text(m, v, &b, true);
        if (editing) {
            og_sb_puts(&b, "filter: ");
            sb_text(&b, edit, 60, 0);
            og_sb_puts(&b, "_  (Enter apply, Esc cancel)\n");
        }
        /* draw: home, each line cleared to its end, the rest of the screen cleared; at most
         * the terminal's rows */
        og_sb_t out;
        og_sb_init(&out);
        og_sb_puts(&out, "\033[H");
        int rows = term_rows(), row = 0;
        for (size_t i = 0; i < b.len && row < rows; row++) {
            char *nl = memchr(b.buf + i, '\n', b.len - i);
            size_t l = nl ? (size_t)(nl - (b.buf + i)) : b.len - i;
            og_sb_put(&out, b.buf + i, l);
            og_sb_puts(&out, "\033[K");
            if (row + 1 < rows)
                og_sb_puts(&out, "\r\n");
            i += l + 1;
        }
        og_sb_puts(&out, "\033[J");
        if (write_all(STDOUT_FILENO, &out, "standard output") != OG_EXIT_OK) {
            rc = OG_EXIT_OUTPUT;
            og_sb_free(&b);
            og_sb_free(&out);
            break;
        }
        og_sb_free(&b);
        og_sb_free(&out);
        struct pollfd pfd = { STDIN_FILENO, POLLIN, 0 };
        uint64_t until = now_unix_ms() + (uint64_t)interval_ms;
        bool redraw = false;
        while (!got_signal && !redraw) {
            uint64_t now = now_unix_ms();
            if (now >= until)
                break;
            int pr = poll(&pfd, 1, (int)(until - now));
            if (got_winch) {
                got_winch = 0;
                break;
            }
            if (pr <= 0)
                continue;
            char keys[32];
            ssize_t n = read(STDIN_FILENO, keys, sizeof keys);
            if (n <= 0) {
                got_signal = SIGHUP; /* the terminal went away */
                break;
            }
            for (ssize_t k = 0; k < n; k++) {
                char c = keys[k];
                redraw = true;
                if (editing) {
                    size_t l = strlen(edit);
                    if (c == '\n' || c == '\r') {
                        snprintf(v->filter, sizeof v->filter, "%s", edit);
                        editing = false;
                    } else if (c == 27) {
                        editing = false;
                    } else if ((c == 127 || c == 8) && l) {
                        edit[l - 1] = 0;
                    } else if (isprint((unsigned char)c) && l + 1 < sizeof edit) {
                        edit[l] = c;
                        edit[l + 1] = 0;
                    }
                    continue;
                }
                switch (c) {
                case 'q':
                case 'Q':
                    got_signal = -1;
                    break;
                case 's':
                    v->sort = (enum sort_key)((v->sort + 1) % SORT_COUNT);
                    break;
                case 'u':
                    v->sort = SORT_USAGE;
                    break;
                case 'p':
                    v->sort = SORT_PEAK;
                    break;
                case 'r':
                    v->sort = SORT_RATE;
                    break;
                case 'i':
                    v->sort = SORT_PID;
                    break;
                case 'l':
                    v->libs = !v->libs;
                    break;
                case 'g': {
                    /* next GPU, then all */
                    int next = -1;
                    for (int g = 0; g < m->ngpus; g++)
                        if (m->gpus[g].index > v->gpu && (next < 0 || m->gpus[g].index < next))
                            next = m->gpus[g].index;
                    v->gpu = next;
                    break;
                }
                case '/':
                    editing = true;
                    snprintf(edit, sizeof edit, "%s", v->filter);
                    break;
                case 'c':
                    v->filter[0] = 0;
                    break;
                default:
                    redraw = false;
                }
            }
        }
    }
    pages_free(&m->pages);
    free(m);
    term_restore();
    return rc;
}

/* ------------------------------------------------------------------ top */

void og_usage_top(FILE *f)
{
    fputs("usage: oomguard top [--once] [--format text|json|prometheus] [options]\n"
          "\n"
          "Every GPU of this machine, live: for each process under oomguard, what it holds by\n"
          "library (* a framework's allocator) and kind, its peak and when, the trend, failures\n"
          "and warnings, its limit; processes without oomguard from NVML (marked ~), as totals.\n"
          "\n"
          "options:\n"
          "  --once              print one view and exit (default: a live view until q)\n"
          "  -f, --format FMT    with --once: text (default), json, prometheus\n"
          "  -o, --output FILE   with --once: write to FILE (replaced atomically: a textfile\n"
          "                      collector never reads half of it)\n"
          "  -d, --delay SEC     refresh interval of the live view (default 1, 0.2 to 10)\n"
          "  --sort KEY          usage (default), peak, rate, pid\n"
          "  --filter TEXT       only processes whose command or job holds TEXT, or with pid TEXT\n"
          "  --gpu N             only GPU N\n"
          "  --width N           text width with --once (default 80)\n"
          "  --top-libs N        prometheus: libraries per process (default 5), the rest \"other\"\n"
          "  --dir DIR           where the live pages are (default: OOMGUARD_LIVE_DIR, /dev/shm, /tmp)\n"
          "\n"
          "keys: q quit, s next sort (u usage, p peak, r rate, i pid), / filter, c clear the\n"
          "filter, g next GPU, l library lines on/off.\n",
          f);
}

static int write_out(const char *path, const og_sb_t *b)
{
    if (!path || !strcmp(path, "-"))
        return write_all(STDOUT_FILENO, b, "standard output");
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "oomguard top: %s: %s\n", tmp, strerror(errno));
        return OG_EXIT_OUTPUT;
    }
    int rc = write_all(fd, b, path);
    if (close(fd) != 0 && rc == OG_EXIT_OK)
        rc = OG_EXIT_OUTPUT;
    if (rc == OG_EXIT_OK && rename(tmp, path) != 0) {
        fprintf(stderr, "oomguard top: %s: %s\n", path, strerror(errno));
        rc = OG_EXIT_OUTPUT;
    }
    if (rc != OG_EXIT_OK)
        unlink(tmp);
    return rc;
}

int og_cmd_top(int argc, char **argv)
{
    struct view v = { .sort = SORT_USAGE, .gpu = -1, .libs = true, .width = 80, .top_libs = 5 };
    bool once = false;
    const char *format = "text", *dir = NULL, *output = NULL;
    double delay = 1.0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED()                                                      \
    do {                                                            \
        if (!val) {                                                 \
            fprintf(stderr, "oomguard top: %s needs a value\n", a); \
            return OG_EXIT_USAGE;                                   \
        }                                                           \
        i++;                                                        \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            og_usage_top(stdout);
            return OG_EXIT_OK;
        } else if (!strcmp(a, "--once")) {
            once = true;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--format")) {
            NEED();
            format = val;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            NEED();
            output = val;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--delay")) {
            NEED();
            char *end;
            delay = strtod(val, &end);
            if (*end || delay < 0.2 || delay > 10) {
                fprintf(stderr, "oomguard top: --delay takes 0.2 to 10 seconds\n");
                return OG_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--sort")) {
            NEED();
            int k = -1;
            for (int s = 0; s < SORT_COUNT; s++)
                if (!strcmp(val, sort_names[s]))
                    k = s;
            if (k < 0) {
                fprintf(stderr, "oomguard top: --sort takes usage, peak, rate or pid\n");
                return OG_EXIT_USAGE;
            }
            v.sort = (enum sort_key)k;
        } else if (!strcmp(a, "--filter")) {
            NEED();
            snprintf(v.filter, sizeof v.filter, "%s", val);
        } else if (!strcmp(a, "--gpu") || !strcmp(a, "--width") || !strcmp(a, "--top-libs")) {
            NEED();
            char *end;
            long n = strtol(val, &end, 10);
            bool gpu = !strcmp(a, "--gpu"), width = !strcmp(a, "--width");
            if (*end || n < 0 || (width && (n < 40 || n > 1000)) || (!gpu && !width && (n < 1 || n > OG_LIVE_LIBS))) {
                fprintf(stderr, "oomguard top: bad value for %s: %s\n", a, val);
                return OG_EXIT_USAGE;
            }
            if (gpu)
                v.gpu = (int)n;
            else if (width)
                v.width = (int)n;
            else
                v.top_libs = (int)n;
        } else if (!strcmp(a, "--dir")) {
            NEED();
            dir = val;
        } else {
            fprintf(stderr, "oomguard top: unknown option '%s'\n", a);
            og_usage_top(stderr);
            return OG_EXIT_USAGE;
        }
#undef NEED
    }
    if (strcmp(format, "text") && strcmp(format, "json") && strcmp(format, "prometheus")) {
        fprintf(stderr, "oomguard top: --format takes text, json or prometheus\n");
        return OG_EXIT_USAGE;
    }
    if (!once) {
        if (strcmp(format, "text") || output) {
            fprintf(stderr, "oomguard top: --format and --output go with --once\n");
            return OG_EXIT_USAGE;
        }
        return interactive(dir, &v, (int)(delay * 1000));
    }
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        return OG_EXIT_OUTPUT;
    model_load(m, dir);
    sort_procs(m, &v);
    og_sb_t b;
    og_sb_init(&b);
    if (!strcmp(format, "json")) {
        char *s = render_json(m, &v);
        if (s) {
            og_sb_puts(&b, s);
            og_sb_putc(&b, '\n');
        }
        free(s);
    } else if (!strcmp(format, "prometheus")) {
        render_prom(m, &v, &b);
    } else {
        render_text(m, &v, &b, false);
    }
    int rc = b.failed ? OG_EXIT_OUTPUT : write_out(output, &b);
    og_sb_free(&b);
    pages_free(&m->pages);
    free(m);
    return rc;
}

/* ------------------------------------------------------------------ snapshot */

void og_usage_snapshot(FILE *f)
{
    fputs("usage: oomguard snapshot PID|--all [--timeout SEC] [--dir DIR]\n"
          "\n"
          "Ask a running process under oomguard for a dump now (status \"snapshot\": what holds\n"
          "memory, by library, site and kind, as a failure's dump shows it).  The process goes on:\n"
          "no signal is sent; its oomguard thread writes the dump beside its other dumps, named\n"
          "oomguard-HOST-PID[-rankR]-snapshot.json, and this prints the path.  Only your own\n"
          "processes (root: any).\n"
          "\n"
          "options:\n"
          "  --all            every process under oomguard that you may ask\n"
          "  --timeout SEC    how long to wait for each dump (default 10)\n"
          "  --dir DIR        where the live pages are (as for oomguard top)\n"
          "\n"
          "exit status: 0 every dump written; 2 a process is not under oomguard, not yours, or\n"
          "wrote no dump in time.\n",
          f);
}

int og_cmd_snapshot(int argc, char **argv)
{
    int pid = 0;
    bool all = false;
    double timeout = 10;
    const char *dir = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            og_usage_snapshot(stdout);
            return OG_EXIT_OK;
        } else if (!strcmp(a, "--all")) {
            all = true;
        } else if ((!strcmp(a, "--timeout") || !strcmp(a, "--dir")) && i + 1 < argc) {
            if (!strcmp(a, "--dir")) {
                dir = argv[++i];
                continue;
            }
            char *end;
            timeout = strtod(argv[++i], &end);
            if (*end || timeout <= 0 || timeout > 3600) {
                fprintf(stderr, "oomguard snapshot: --timeout takes 0 to 3600 seconds\n");
                return OG_EXIT_USAGE;
            }
        } else if (isdigit((unsigned char)a[0]) && !pid) {
            char *end;
            long n = strtol(a, &end, 10);
            if (*end || n <= 0 || n > 1 << 30) {
                fprintf(stderr, "oomguard snapshot: not a pid: %s\n", a);
                return OG_EXIT_USAGE;
            }
            pid = (int)n;
        } else {
            fprintf(stderr, "oomguard snapshot: unknown argument '%s'\n", a);
            og_usage_snapshot(stderr);
            return OG_EXIT_USAGE;
        }
    }
    if (all == (pid != 0)) {
        fprintf(stderr, "oomguard snapshot: give one PID or --all\n");
        og_usage_snapshot(stderr);
        return OG_EXIT_USAGE;
    }
    struct pages ps = { 0 };
    pages_load(&ps, dir, true, all ? 0 : pid);
    if (!all && !ps.n) {
        /* say why: gone, another user's, or not under oomguard */
        char p[64];
        snprintf(p, sizeof p, "/proc/%d", pid);
        struct stat st;
        if (stat(p, &st) != 0)
            fprintf(stderr, "oomguard snapshot: no process %d\n", pid);
        else if (geteuid() != 0 && st.st_uid != geteuid())
            fprintf(stderr, "oomguard snapshot: process %d is another user's: refused\n", pid);
        else
            fprintf(stderr,
                    "oomguard snapshot: process %d is not running under oomguard (no live page: "
                    "liboomguard.so not preloaded, OOMGUARD_LIVE=0, no CUDA allocation yet, or another "
                    "OOMGUARD_LIVE_DIR)\n",
                    pid);
        pages_free(&ps);
        return OG_EXIT_INPUT;
    }
    uint64_t *want = calloc((size_t)ps.n + 1, sizeof *want);
    for (int i = 0; i < ps.n; i++)
        want[i] = atomic_fetch_add(&ps.p[i].map->snap_req, 1) + 1;
    int rc = OG_EXIT_OK;
    uint64_t deadline = now_unix_ms() + (uint64_t)(timeout * 1000);
    for (int i = 0; i < ps.n; i++) {
        og_live_page_t *m = ps.p[i].map;
        while (atomic_load_explicit(&m->snap_done, memory_order_acquire) < want[i] && now_unix_ms() < deadline)
            usleep(20000);
        if (atomic_load_explicit(&m->snap_done, memory_order_acquire) < want[i]) {
            fprintf(stderr, "oomguard snapshot: process %d wrote no dump within %.0f s\n", ps.p[i].b.pid, timeout);
            rc = OG_EXIT_INPUT;
            continue;
        }
        char path[sizeof m->snap_path + 1];
        memcpy(path, m->snap_path, sizeof m->snap_path);
        path[sizeof m->snap_path] = 0;
        if (!atomic_load(&m->snap_ok) || !path[0]) {
            fprintf(stderr,
                    "oomguard snapshot: process %d could not write a dump (no device memory tracked yet, "
                    "or no writable directory)\n",
                    ps.p[i].b.pid);
            rc = OG_EXIT_INPUT;
            continue;
        }
        printf("%d %s\n", ps.p[i].b.pid, path);
    }
    if (all && !ps.n)
        fprintf(stderr, "oomguard snapshot: no process under oomguard found\n");
    free(want);
    pages_free(&ps);
    return fflush(stdout) == 0 ? rc : OG_EXIT_OUTPUT;
}
