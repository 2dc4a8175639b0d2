/* tools/memviz.c — `report --format memory-viz`: a pickle laid out like
 * torch.cuda.memory._snapshot(), for PyTorch's memory_viz page.
 *
 * When the PyTorch adapter captured a real snapshot (memory.framework.snapshot)
 * that is emitted as is.  Otherwise one is synthesised: each top allocation
 * site becomes a segment of active blocks, and the history's events become the
 * device trace.  oomguard does not record addresses, so the addresses are made
 * up, consistently: a free is matched to the latest live allocation of the
 * same size. */
#include <errno.h>
#include <stdio.h>
#include "pickle.h"
#include "report.h"
#include "symbolize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SEG_BASE 0x7f0000000000LL   /* synthetic segment addresses */
#define TRACE_BASE 0x7e0000000000LL /* synthetic trace addresses */
#define ALIGN_2M (2LL << 20)
#define MAX_BLOCKS_PER_SEGMENT 256
#define MAX_BLOCKS_TOTAL 20000
#define MAX_FRAMES 16
#define MAX_DEVICES 64

static void frames(struct sbuf *b, const struct og_frame *f, int n)
{
    struct pk_seq l, fr;
    pk_list_open(b, &l);
    for (int i = 0; i < n && i < MAX_FRAMES; i++) {
        pk_item(b, &l);
        pk_dict_open(b, &fr);
        struct og_sym y;   /* names and lines where this machine can find them (symbolize.c) */
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

static void kv_int(struct sbuf *b, struct pk_seq *s, const char *k, int64_t v)
{
    pk_key(b, s, k);
    pk_int(b, v);
}

static void kv_str(struct sbuf *b, struct pk_seq *s, const char *k, const char *v)
{
    pk_key(b, s, k);
    pk_str(b, v);
}

static void block(struct sbuf *b, int64_t addr, int64_t size, const struct og_site *site)
{
    struct pk_seq s;
    pk_dict_open(b, &s);
    kv_int(b, &s, "address", addr);
    kv_int(b, &s, "size", size);
    kv_int(b, &s, "requested_size", size);
    kv_str(b, &s, "state", "active_allocated");
    pk_key(b, &s, "frames");
    frames(b, site->frames, site->nframes);
    pk_close(b, &s);
}

static void segments(struct sbuf *b, const struct og_dump *d, int64_t dev)
{
    struct pk_seq list;
    int64_t addr = SEG_BASE;
    long blocks_left = MAX_BLOCKS_TOTAL;
    pk_list_open(b, &list);
    for (int i = 0; i < d->nsites && blocks_left > 0; i++) {
        const struct og_site *site = &d->sites[i];
        int64_t bytes = site->bytes > 0 ? site->bytes : 0;
        if (!bytes)
            continue;
        int64_t nb = site->blocks > 0 ? site->blocks : 1;
        if (nb > MAX_BLOCKS_PER_SEGMENT)
            nb = MAX_BLOCKS_PER_SEGMENT;
        if (nb > blocks_left)
            nb = blocks_left;
        if (nb > bytes)
            nb = bytes;
        blocks_left -= nb;
        int64_t per = bytes / nb;
        struct pk_seq s, bl;
        pk_item(b, &list);
        pk_dict_open(b, &s);
        kv_int(b, &s, "device", dev);
        kv_int(b, &s, "address", addr);
        kv_int(b, &s, "total_size", bytes);
        kv_int(b, &s, "allocated_size", bytes);
        kv_int(b, &s, "active_size", bytes);
        kv_int(b, &s, "requested_size", bytes);
        kv_int(b, &s, "stream", 0);
        /* PyTorch's small pool holds blocks of at most 1 MiB. */
        kv_str(b, &s, "segment_type", per <= (1 << 20) ? "small" : "large");
        pk_key(b, &s, "segment_pool_id");
        pk_int(b, 0);
        pk_int(b, 0);
        pk_tuple2(b);
        pk_key(b, &s, "is_expandable");
        pk_bool(b, 0);
        pk_key(b, &s, "frames");
        frames(b, site->frames, site->nframes);
        pk_key(b, &s, "blocks");
        pk_list_open(b, &bl);
        for (int64_t k = 0; k < nb; k++) {
            pk_item(b, &bl);
            block(b, addr + k * per, k == nb - 1 ? bytes - per * (nb - 1) : per, site);
        }
        pk_close(b, &bl);
        pk_close(b, &s);
        addr += (bytes + ALIGN_2M - 1) / ALIGN_2M * ALIGN_2M;
    }
    pk_close(b, &list);
}

/* Live synthetic allocations by size, newest first, to pair frees with allocs. */
struct live {
    uint64_t *size_key; /* open-addressing table: size -> head record */
    long *head;
    size_t cap;
    uint64_t *addr; /* records */
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

/* Sizes (and the made-up addresses after them) can pass 2^63: a failed request of SIZE_MAX. */
static void trace_entry(struct sbuf *b, struct pk_seq *list, const char *action, uint64_t addr, uint64_t size,
                        int64_t time_us)
{
    struct pk_seq s, fr;
    pk_item(b, list);
    pk_dict_open(b, &s);
    kv_str(b, &s, "action", action);
    pk_key(b, &s, "addr");
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

static int device_trace(struct sbuf *b, const struct og_dump *d, int64_t dev, int64_t primary)
{
    struct pk_seq list;
    struct live L = {0};
    size_t n = d->hist.nevents;
    L.cap = 16;
    while (L.cap < 2 * n + 2)
        L.cap *= 2;
    L.size_key = malloc(L.cap * sizeof *L.size_key);
    L.head = malloc(L.cap * sizeof *L.head);
    L.addr = malloc((n + 1) * sizeof *L.addr);
    L.prev = malloc((n + 1) * sizeof *L.prev);
    if (!L.size_key || !L.head || !L.addr || !L.prev) {
        free(L.size_key), free(L.head), free(L.addr), free(L.prev);
        return -1;
    }
    for (size_t i = 0; i < L.cap; i++)
        L.head[i] = -2; /* empty slot */
    uint64_t next = TRACE_BASE;
    pk_list_open(b, &list);
    for (size_t i = 0; i < n; i++) {
        const struct og_event *e = &d->hist.events[i];
        if ((e->device >= 0 ? e->device : primary) != dev || !e->bytes.known)
            continue;
        uint64_t size = e->bytes.v;
        int64_t t = isfinite(e->t_rel) && fabs(e->t_rel) < 9e12 ? (int64_t)(e->t_rel * 1e6) : 0;
        if (e->op == OG_OP_ALLOC) {
            size_t h = slot(&L, size);
            if (L.head[h] == -2) {
                L.size_key[h] = size;
                L.head[h] = -1;
            }
            L.addr[L.n] = next;
            L.prev[L.n] = L.head[h];
            L.head[h] = (long)L.n++;
            trace_entry(b, &list, "segment_alloc", next, size, t);
            trace_entry(b, &list, "alloc", next, size, t);
            uint64_t step = size > UINT64_MAX - 511 ? UINT64_MAX : (size + 511) / 512 * 512;
            next += step > 0 ? step : 512; /* wraps only past 2^64: made-up addresses */
        } else if (e->op == OG_OP_FREE) {
            size_t h = slot(&L, size);
            if (L.head[h] < 0)
                continue; /* freed memory allocated before the history window */
            long r = L.head[h];
            L.head[h] = L.prev[r];
            trace_entry(b, &list, "free_completed", L.addr[r], size, t);
            trace_entry(b, &list, "segment_free", L.addr[r], size, t);
        } else if (e->op == OG_OP_FAIL) {
            /* PyTorch records the device's free memory in `addr` for an oom. */
            trace_entry(b, &list, "oom", d->device.free_bytes >= 0 ? (uint64_t)d->device.free_bytes : 0, size, t);
        }
    }
    pk_close(b, &list);
    free(L.size_key), free(L.head), free(L.addr), free(L.prev);
    return 0;
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

int og_render_memviz(struct sbuf *out, const struct og_dump *d)
{
    pk_begin(out);
    if (d->mem.fw_snapshot) {
        pk_json(out, d->mem.fw_snapshot);
        pk_end(out);
        return out->oom ? -1 : 0;
    }
    if (d->mem.fw_snapshot_file && *d->mem.fw_snapshot_file) {
        cJSON *snap = load_snapshot_file(d->mem.fw_snapshot_file);
        if (snap) {
            pk_json(out, snap);
            cJSON_Delete(snap);
            pk_end(out);
            return out->oom ? -1 : 0;
        }
    }
    int64_t primary = d->event.device >= 0 ? d->event.device : d->device.index >= 0 ? d->device.index : 0;
    int64_t ndev = primary + 1;
    if (d->visible_devices > ndev)
        ndev = d->visible_devices;
    for (size_t i = 0; i < d->hist.nevents; i++)
        if (d->hist.events[i].device >= ndev)
            ndev = d->hist.events[i].device + 1;
    if (ndev > MAX_DEVICES)
        ndev = MAX_DEVICES;

    struct pk_seq top, traces;
    pk_dict_open(out, &top);
    pk_key(out, &top, "segments");
    segments(out, d, primary);
    pk_key(out, &top, "device_traces");
    pk_list_open(out, &traces);
    for (int64_t dev = 0; dev < ndev; dev++) {
        pk_item(out, &traces);
        if (device_trace(out, d, dev, primary) < 0)
            return -1;
    }
    pk_close(out, &traces);
    pk_close(out, &top);
    pk_end(out);
    return out->oom ? -1 : 0;
}
