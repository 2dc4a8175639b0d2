/* tools/memviz.c — `report --format memory-viz`: a pickle laid out like
 * torch.cuda.memory._snapshot() ({"segments", "device_traces"}), for PyTorch's memory_viz
 * page and the functions of torch.cuda._memory_viz.
 *
 * When the PyTorch adapter captured a real snapshot (memory.framework.snapshot or the file
 * it saved) that is emitted as is.  Otherwise one is built from what the ledger knows, for the
 * failing device:
 *   - one segment per library of memory.by_library (its bytes: the device memory that library
 *     holds), its blocks the library's top allocation sites (each site's blocks of equal size,
 *     a block "active_allocated" with the site's frames), the rest of its bytes one block of
 *     sites outside the top list; the framework's cached-but-unused bytes (and a stream-ordered
 *     pool's unused reservation) are "inactive" blocks: the largest free block the adapter
 *     reported, and pieces no larger between the active blocks, so fragmentation shows;
 *   - a device trace from the history's events: "alloc"/"free_completed" with addresses that
 *     agree with the segments (an allocation still live at the end of the trace IS one of the
 *     segments' active blocks, carved out of its library's blocks; one freed within the trace
 *     gets an address outside every segment), and "oom" entries with `device_free`, as
 *     PyTorch's own.  The page replays the trace over the segments' blocks: with these
 *     addresses nothing is counted twice (tests/cli/check_memviz.py replays it).
 * oomguard records sizes, not addresses: the addresses are made up, consistently. */
#include <errno.h>
#include <stdio.h>
#include "pickle.h"
#include "report.h"
#include "symbolize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SEG_BASE            0x7f0000000000LL /* synthetic segment addresses */
#define TRACE_BASE          0x7e0000000000LL /* addresses of allocations freed within the trace */
#define ALIGN_2M            (2LL << 20)
#define MAX_BLOCKS_PER_SITE 256
#define MAX_BLOCKS_TOTAL    20000
#define MAX_HOLES           64 /* inactive pieces per segment */
#define MAX_FRAMES          16
#define MAX_DEVICES         64

static void frames(og_sb_t *b, const struct og_frame *f, int n)
{
    struct pk_seq l, fr;
    pk_list_open(b, &l);
    for (int i = 0; i < n && i < MAX_FRAMES; i++) {
        pk_item(b, &l);
        pk_dict_open(b, &fr);
        struct og_sym y; /* names and lines where this machine can find them (symbolize.c) */
        og_symbolize(&f[i], &y);
        pk_key(b, &fr, "filename");
        pk_str(b, y.file ? y.file : f[i].library ? f[i].library : "??");
        pk_key(b, &fr, "line");
        pk_int(b, y.file ? y.line : 0);
        pk_key(b, &fr, "name");
        pk_str(b, y.function ? y.function : y.where);
        pk_close(b, &fr);
    }
    pk_close(b, &l);
}

static void kv_int(og_sb_t *b, struct pk_seq *s, const char *k, int64_t v)
{
    pk_key(b, s, k);
    pk_int(b, v);
}

static void kv_str(og_sb_t *b, struct pk_seq *s, const char *k, const char *v)
{
    pk_key(b, s, k);
    pk_str(b, v);
}

/* ---- the layout: segments of blocks, in address order */

struct vblock {
    int64_t size;
    int seg;                    /* its segment */
    int active;                 /* active_allocated, else inactive */
    long ev;                    /* the trace's allocation (event index) still live at its end that
                                   * this block is; -1 none */
    const struct og_site *site; /* frames; NULL: none known */
};

struct vseg {
    const char *library;
    int64_t addr, total;
};

struct layout {
    struct vblock *b;
    size_t n, cap;
    struct vseg *s;
    int ns;
};

static int lay_push(struct layout *L, struct vblock v)
{
    if (v.size <= 0)
        return 0;
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        struct vblock *nb = realloc(L->b, cap * sizeof *nb);
        if (!nb)
            return -1;
        L->b = nb;
        L->cap = cap;
    }
    L->b[L->n++] = v;
    return 0;
}

static int64_t fw_number(const struct og_dump *d, const char *key)
{
    const cJSON *v = d->mem.framework ? cJSON_GetObjectItemCaseSensitive(d->mem.framework, key) : NULL;
    return cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 9e18 ? (int64_t)v->valuedouble : -1;
}

/* One library's segment: active blocks from its sites, inactive ones between them. */
static int lay_library(struct layout *L, const struct og_dump *d, const char *lib, int64_t bytes, int64_t cached,
                       int64_t largest_free, long *blocks_left)
{
    if (cached > bytes)
        cached = bytes;
    int64_t active = bytes - cached, placed = 0;
    int seg = L->ns;
    size_t first = L->n;
    /* the sites' blocks; scaled down when the sites claim more than the active bytes
     * (their bytes count the framework's cache too) */
    int64_t sites_bytes = 0;
    for (int i = 0; i < d->nsites; i++)
        if (d->sites[i].library && !strcmp(d->sites[i].library, lib) && d->sites[i].bytes > 0)
            sites_bytes += d->sites[i].bytes;
    double scale = sites_bytes > active && sites_bytes > 0 ? (double)active / (double)sites_bytes : 1.0;
    for (int i = 0; i<d->nsites && * blocks_left> 0 && placed < active; i++) {
        const struct og_site *site = &d->sites[i];
        if (!site->library || strcmp(site->library, lib) || site->bytes <= 0)
            continue;
        int64_t want = (int64_t)((double)site->bytes * scale);
        if (want > active - placed)
            want = active - placed;
        int64_t nb = site->blocks > 0 ? site->blocks : 1;
        if (nb > MAX_BLOCKS_PER_SITE)
            nb = MAX_BLOCKS_PER_SITE;
        if (nb > *blocks_left)
            nb = *blocks_left;
        if (nb > want)
            nb = want > 0 ? want : 1;
        int64_t per = want / nb;
        for (int64_t k = 0; k < nb; k++)
            if (lay_push(L, (struct vblock){ k == nb - 1 ? want - per * (nb - 1) : per, seg, 1, -1, site }) < 0)
                return -1;
        *blocks_left -= nb;
        placed += want;
    }
    /* sites outside the top list (or none known) */
    if (lay_push(L, (struct vblock){ active - placed, seg, 1, -1, NULL }) < 0)
        return -1;
    /* the cache: the largest free block, then pieces no larger, between the active blocks */
    if (cached > 0) {
        size_t nact = L->n - first;
        int64_t piece = largest_free > 0 && largest_free <= cached ? largest_free : cached;
        int64_t rest = cached - piece;
        int64_t nholes = piece > 0 ? (rest + piece - 1) / piece : 0;
        if (nholes > MAX_HOLES)
            nholes = MAX_HOLES;
        if (nholes > (int64_t)nact)
            nholes = (int64_t)nact;
        /* interleave: after active block k*nact/nholes; the largest piece last */
        struct vblock *act = malloc((nact ? nact : 1) * sizeof *act);
        if (!act)
            return -1;
        if (nact)
            memcpy(act, L->b + first, nact * sizeof *act);
        L->n = first;
        int64_t per = nholes ? rest / nholes : 0, done = 0;
        for (size_t k = 0, h = 0; k < nact; k++) {
            if (lay_push(L, act[k]) < 0) {
                free(act);
                return -1;
            }
            if ((int64_t)h < nholes && (k + 1) * (size_t)nholes / nact > h) {
                int64_t sz = h + 1 == (size_t)nholes ? rest - done : per;
                if (lay_push(L, (struct vblock){ sz, seg, 0, -1, NULL }) < 0) {
                    free(act);
                    return -1;
                }
                done += sz;
                h++;
            }
        }
        free(act);
        if (lay_push(L, (struct vblock){ piece + (rest - done), seg, 0, -1, NULL }) < 0)
            return -1;
    }
    if (L->n == first)
        return 0;
    struct vseg *ns = realloc(L->s, (size_t)(L->ns + 1) * sizeof *ns);
    if (!ns)
        return -1;
    L->s = ns;
    L->s[L->ns++] = (struct vseg){ lib, 0, bytes };
    return 0;
}

static int build_layout(struct layout *L, const struct og_dump *d)
{
    long blocks_left = MAX_BLOCKS_TOTAL;
    int64_t cached = d->mem.framework_cached_bytes > 0 ? d->mem.framework_cached_bytes : 0;
    int64_t largest_free = fw_number(d, "largest_free_block_bytes");
    /* the framework's cache belongs to its largest library */
    int fw_lib = -1;
    for (int i = 0; i < d->mem.nlibs; i++)
        if (d->mem.libs[i].framework && d->mem.libs[i].bytes > 0 &&
            (fw_lib < 0 || d->mem.libs[i].bytes > d->mem.libs[fw_lib].bytes))
            fw_lib = i;
    for (int i = 0; i < d->mem.nlibs; i++) {
        const struct og_lib *l = &d->mem.libs[i];
        if (!l->library || l->bytes <= 0)
            continue;
        /* a stream-ordered pool's unused reservation: all of it cached */
        int pool_cache = !strncmp(l->library, "(stream-ordered pool cache", 26);
        if (lay_library(L, d, l->library, l->bytes,
                        pool_cache    ? l->bytes
                        : i == fw_lib ? cached
                                      : 0,
                        i == fw_lib ? largest_free : -1, &blocks_left) < 0)
            return -1;
    }
    if (!L->ns) {
        /* no by_library (an old dump): one segment per library of the top sites */
        for (int i = 0; i < d->nsites; i++) {
            const char *lib = d->sites[i].library ? d->sites[i].library : "?";
            int seen = 0;
            for (int k = 0; k < L->ns && !seen; k++)
                seen = !strcmp(L->s[k].library, lib);
            if (seen)
                continue;
            int64_t bytes = 0;
            for (int k = i; k < d->nsites; k++)
                if (!strcmp(d->sites[k].library ? d->sites[k].library : "?", lib) && d->sites[k].bytes > 0)
                    bytes += d->sites[k].bytes;
            if (bytes > 0 && lay_library(L, d, lib, bytes, 0, -1, &blocks_left) < 0)
                return -1;
        }
    }
    /* addresses: segments 2 MiB aligned, one after the other */
    int64_t addr = SEG_BASE;
    for (int k = 0; k < L->ns; k++) {
        L->s[k].addr = addr;
        addr += (L->s[k].total + ALIGN_2M - 1) / ALIGN_2M * ALIGN_2M;
    }
    return 0;
}

/* Address of block i (segments' blocks are contiguous from the segment's address). */
static void block_addrs(const struct layout *L, int64_t *addr)
{
    int seg = -1;
    int64_t a = 0;
    for (size_t i = 0; i < L->n; i++) {
        if (L->b[i].seg != seg) {
            seg = L->b[i].seg;
            a = L->s[seg].addr;
        }
        addr[i] = a;
        a += L->b[i].size;
    }
}

/* An allocation still live at the end of the trace (event `ev`) becomes one of the active
 * blocks: one of its size, else carved from the front of the largest unclaimed active block.
 * Returns -1 when none is large enough (then the allocation is left out of the trace). */
static int claim(struct layout *L, int64_t size, long ev)
{
    long best = -1;
    for (size_t i = 0; i < L->n; i++) {
        struct vblock *v = &L->b[i];
        if (!v->active || v->ev >= 0)
            continue;
        if (v->size == size) {
            v->ev = ev;
            return 0;
        }
        if (v->size > size && (best < 0 || v->size > L->b[best].size))
            best = (long)i;
    }
    if (best < 0 || lay_push(L, L->b[best]) < 0) /* room for one more */
        return -1;
    memmove(L->b + best + 1, L->b + best, (L->n - 1 - (size_t)best) * sizeof *L->b);
    L->b[best].size = size;
    L->b[best].ev = ev;
    L->b[best + 1].size -= size;
    return 0;
}

static void emit_segments(og_sb_t *b, const struct layout *L, const int64_t *addr, int64_t dev)
{
    struct pk_seq list;
    pk_list_open(b, &list);
    size_t i = 0;
    for (int k = 0; k < L->ns; k++) {
        size_t j = i;
        int64_t act = 0;
        while (j < L->n && L->b[j].seg == k)
            act += L->b[j].active ? L->b[j].size : 0, j++;
        const struct og_site *site = NULL;
        for (size_t q = i; q < j && !site; q++)
            site = L->b[q].site;
        struct pk_seq s, bl;
        pk_item(b, &list);
        pk_dict_open(b, &s);
        kv_int(b, &s, "device", dev);
        kv_int(b, &s, "address", L->s[k].addr);
        kv_int(b, &s, "total_size", L->s[k].total);
        kv_int(b, &s, "allocated_size", act);
        kv_int(b, &s, "active_size", act);
        kv_int(b, &s, "requested_size", act);
        kv_int(b, &s, "stream", 0);
        kv_str(b, &s, "segment_type", "large");
        pk_key(b, &s, "segment_pool_id");
        pk_int(b, 0);
        pk_int(b, 0);
        pk_tuple2(b);
        pk_key(b, &s, "is_expandable");
        pk_bool(b, 0);
        kv_str(b, &s, "library", L->s[k].library); /* ours: which library holds it */
        pk_key(b, &s, "frames");
        frames(b, site ? site->frames : NULL, site ? site->nframes : 0);
        pk_key(b, &s, "blocks");
        pk_list_open(b, &bl);
        for (; i < j; i++) {
            const struct vblock *v = &L->b[i];
            struct pk_seq bk;
            pk_item(b, &bl);
            pk_dict_open(b, &bk);
            kv_int(b, &bk, "address", addr[i]);
            kv_int(b, &bk, "size", v->size);
            kv_int(b, &bk, "requested_size", v->active ? v->size : 0);
            kv_str(b, &bk, "state", v->active ? "active_allocated" : "inactive");
            pk_key(b, &bk, "frames");
            frames(b, v->site ? v->site->frames : NULL, v->site ? v->site->nframes : 0);
            pk_close(b, &bk);
        }
        pk_close(b, &bl);
        pk_close(b, &s);
    }
    pk_close(b, &list);
}

/* ---- the trace */

/* Live allocations of the trace by size, newest first, to pair frees with allocs. */
struct live {
    uint64_t *size_key; /* open-addressing table: size -> head record */
    long *head;
    size_t cap;
    long *ev; /* records: the event index of the allocation */
    long *prev;
    size_t n;
};

static size_t slot(const struct live *L, uint64_t size)
{
    size_t h = (size_t)(size * 0x9e3779b97f4a7c15ull) & (L->cap - 1);
    while (L->head[h] != -2 && L->size_key[h] != size)
        h = (h + 1) & (L->cap - 1);
    return h;
}

static int on_device(const struct og_event *e, int64_t dev, int64_t primary)
{
    return (e->device >= 0 ? e->device : primary) == dev && e->bytes.known;
}

/* For each event: the event index of the allocation a free releases (-1: allocated before
 * the trace), and for each allocation whether it is still live at the end (pair[i] = -2). */
static int pair_events(const struct og_dump *d, int64_t dev, int64_t primary, long *pair)
{
    struct live L = { 0 };
    size_t n = d->hist.nevents;
    L.cap = 16;
    while (L.cap < 2 * n + 2)
        L.cap *= 2;
    L.size_key = malloc(L.cap * sizeof *L.size_key);
    L.head = malloc(L.cap * sizeof *L.head);
    L.ev = malloc((n + 1) * sizeof *L.ev);
    L.prev = malloc((n + 1) * sizeof *L.prev);
    if (!L.size_key || !L.head || !L.ev || !L.prev) {
        free(L.size_key), free(L.head), free(L.ev), free(L.prev);
        return -1;
    }
    for (size_t i = 0; i < L.cap; i++)
        L.head[i] = -2; /* empty slot */
    for (size_t i = 0; i < n; i++) {
        const struct og_event *e = &d->hist.events[i];
        pair[i] = -1;
        if (!on_device(e, dev, primary))
            continue;
        size_t h = slot(&L, e->bytes.v);
        if (e->op == OG_OP_ALLOC) {
            if (L.head[h] == -2) {
                L.size_key[h] = e->bytes.v;
                L.head[h] = -1;
            }
            L.ev[L.n] = (long)i;
            L.prev[L.n] = L.head[h];
            L.head[h] = (long)L.n++;
            pair[i] = -2; /* live until a free says otherwise */
        } else if (e->op == OG_OP_FREE && L.head[h] >= 0) {
            long r = L.head[h];
            L.head[h] = L.prev[r];
            pair[i] = L.ev[r];
            pair[L.ev[r]] = -3; /* freed within the trace */
        }
    }
    free(L.size_key), free(L.head), free(L.ev), free(L.prev);
    return 0;
}

static void trace_entry(og_sb_t *b, struct pk_seq *list, const char *action, const char *addr_key, uint64_t addr,
                        uint64_t size, int64_t time_us)
{
    struct pk_seq s, fr;
    pk_item(b, list);
    pk_dict_open(b, &s);
    kv_str(b, &s, "action", action);
    pk_key(b, &s, addr_key);
    pk_uint(b, addr);
    pk_key(b, &s, "size");
    pk_uint(b, size);
    kv_int(b, &s, "stream", 0);
    kv_int(b, &s, "time_us", time_us);
    pk_key(b, &s, "frames");
    pk_list_open(b, &fr);
    pk_close(b, &fr);
    pk_close(b, &s);
}

/* `addr_of[i]`: the address of allocation event i (0: left out). */
static void device_trace(og_sb_t *b, const struct og_dump *d, int64_t dev, int64_t primary, const long *pair,
                         const uint64_t *addr_of)
{
    struct pk_seq list;
    pk_list_open(b, &list);
    for (size_t i = 0; i < d->hist.nevents; i++) {
        const struct og_event *e = &d->hist.events[i];
        if (!on_device(e, dev, primary))
            continue;
        uint64_t size = e->bytes.v;
        int64_t t = isfinite(e->t_rel) && fabs(e->t_rel) < 9e12 ? (int64_t)(e->t_rel * 1e6) : 0;
        if (e->op == OG_OP_ALLOC && addr_of[i])
            trace_entry(b, &list, "alloc", "addr", addr_of[i], size, t);
        else if (e->op == OG_OP_FREE && pair[i] >= 0 && addr_of[pair[i]])
            trace_entry(b, &list, "free_completed", "addr", addr_of[pair[i]], size, t);
        else if (e->op == OG_OP_FAIL)
            /* as PyTorch's snapshot: the device's free memory under device_free, no address */
            trace_entry(b, &list, "oom", "device_free", d->device.free_bytes >= 0 ? (uint64_t)d->device.free_bytes : 0,
                        size, t);
    }
    pk_close(b, &list);
}

/* Allocations freed within the trace: addresses outside every segment, each its own. */
static void trace_addrs(const struct og_dump *d, const long *pair, uint64_t *addr_of)
{
    uint64_t next = TRACE_BASE;
    for (size_t i = 0; i < d->hist.nevents; i++)
        if (d->hist.events[i].op == OG_OP_ALLOC && pair[i] == -3) {
            uint64_t size = d->hist.events[i].bytes.v;
            addr_of[i] = next;
            uint64_t step = size > UINT64_MAX - 511 ? UINT64_MAX : (size + 511) / 512 * 512;
            next += step > 0 ? step : 512; /* wraps only past 2^64: made-up addresses */
        }
}

/* The synthetic snapshot (no adapter snapshot): layout, then the traces over it. */
static int synthetic(og_sb_t *out, const struct og_dump *d)
{
    int64_t primary = d->event.device >= 0 ? d->event.device : d->device.index >= 0 ? d->device.index : 0;
    int64_t ndev = primary + 1;
    if (d->visible_devices > ndev)
        ndev = d->visible_devices;
    for (size_t i = 0; i < d->hist.nevents; i++)
        if (d->hist.events[i].device >= ndev)
            ndev = d->hist.events[i].device + 1;
    if (ndev > MAX_DEVICES)
        ndev = MAX_DEVICES;
    size_t n = d->hist.nevents;
    struct layout L = { 0 };
    long *pair = malloc((n + 1) * sizeof *pair);
    uint64_t *addr_of = calloc(n + 1, sizeof *addr_of);
    int64_t *baddr = NULL;
    int rc = -1;
    if (!pair || !addr_of || build_layout(&L, d) < 0)
        goto out;
    /* the failing device's trace: live allocations claim blocks of the layout */
    if (pair_events(d, primary, primary, pair) < 0)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (d->hist.events[i].op == OG_OP_ALLOC && pair[i] == -2 && on_device(&d->hist.events[i], primary, primary) &&
            d->hist.events[i].bytes.v <= (uint64_t)INT64_MAX)
            claim(&L, (int64_t)d->hist.events[i].bytes.v, (long)i);
    if (!(baddr = malloc((L.n ? L.n : 1) * sizeof *baddr)))
        goto out;
    block_addrs(&L, baddr);
    for (size_t i = 0; i < L.n; i++)
        if (L.b[i].ev >= 0)
            addr_of[L.b[i].ev] = (uint64_t)baddr[i];
    trace_addrs(d, pair, addr_of);

    struct pk_seq top, traces;
    pk_dict_open(out, &top);
    pk_key(out, &top, "segments");
    emit_segments(out, &L, baddr, primary);
    pk_key(out, &top, "device_traces");
    pk_list_open(out, &traces);
    for (int64_t dev = 0; dev < ndev; dev++) {
        pk_item(out, &traces);
        if (dev != primary) {
            /* other devices: no layout known there; allocations freed within the trace only */
            long *p2 = malloc((n + 1) * sizeof *p2);
            uint64_t *a2 = calloc(n + 1, sizeof *a2);
            if (!p2 || !a2 || pair_events(d, dev, primary, p2) < 0) {
                free(p2), free(a2);
                goto out;
            }
            trace_addrs(d, p2, a2);
            device_trace(out, d, dev, primary, p2, a2);
            free(p2), free(a2);
        } else {
            device_trace(out, d, dev, primary, pair, addr_of);
        }
    }
    pk_close(out, &traces);
    pk_close(out, &top);
    rc = 0;
out:
    free(pair), free(addr_of), free(baddr), free(L.b), free(L.s);
    return rc;
}

/* The snapshot the PyTorch adapter saved next to the dump (JSON), parsed; NULL when it is
 * missing, too big or not JSON (the driver-level view is exported instead, with a note). */
static cJSON *load_snapshot_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "oomguard report: %s: %s; exporting the driver-level view instead\n", path, strerror(errno));
        return NULL;
    }
    cJSON *j = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && n < (512L << 20) && fseek(f, 0, SEEK_SET) == 0) {
            char *buf = malloc((size_t)n + 1);
            if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = 0;
                j = cJSON_Parse(buf);
            }
            free(buf);
        }
    }
    fclose(f);
    if (!j || !cJSON_IsObject(j)) {
        fprintf(stderr, "oomguard report: %s: not a snapshot; exporting the driver-level view instead\n", path);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

int og_render_memviz(og_sb_t *out, const struct og_dump *d)
{
    pk_begin(out);
    if (d->mem.fw_snapshot) {
        pk_json(out, d->mem.fw_snapshot);
        pk_end(out);
        return out->failed ? -1 : 0;
    }
    if (d->mem.fw_snapshot_file && *d->mem.fw_snapshot_file) {
        cJSON *snap = load_snapshot_file(d->mem.fw_snapshot_file);
        if (snap) {
            pk_json(out, snap);
            cJSON_Delete(snap);
            pk_end(out);
            return out->failed ? -1 : 0;
        }
    }
    if (synthetic(out, d) < 0)
        return -1;
    pk_end(out);
    return out->failed ? -1 : 0;
}
