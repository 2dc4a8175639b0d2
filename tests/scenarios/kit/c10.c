/* libc10_cuda.so stand-in: PyTorch's CUDA caching allocator, on the points an out-of-memory
 * diagnosis depends on (c10/cuda/CUDACachingAllocator.cpp):
 *   - sizes round up to 512 B; requests <= 1 MiB come from 2 MiB "small" segments, requests
 *     below 10 MiB from 20 MiB segments, larger ones from segments rounded up to 2 MiB;
 *   - best fit among cached blocks of the same pool; a block is split when the rest is
 *     >= 512 B (small) or > 1 MiB (large); freed blocks merge with free neighbours and stay cached;
 *   - when cudaMalloc fails: free every entirely free segment (release_cached_blocks) and try
 *     once more; then count an OOM, call the OOM observers (the oomguard adapter) and raise.
 *   - PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: one cudaMallocAsync per tensor from the
 *     device's default pool, whose release threshold is set to "keep everything" as PyTorch does.
 *   - PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the large pool is one segment per device
 *     in a reserved virtual range that grows at its end (cuMemCreate + cuMemMap, 2 MiB granules)
 *     instead of new cudaMalloc segments; releasing the cache unmaps the free chunks at its end.
 * One cache per device; a mutex around each call (PyTorch's allocator is thread-safe too). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "oomguard.h"
#include "truth.h"

#define LIB             "libc10_cuda.so"
#define MAXDEV          16
#define SMALL_SIZE      (1 * MiB)
#define SMALL_BUFFER    (2 * MiB)
#define LARGE_BUFFER    (20 * MiB)
#define MIN_LARGE_ALLOC (10 * MiB)

typedef struct block {
    uintptr_t addr;
    size_t size, requested;
    int allocated;
    struct block *prev, *next;
    struct segment *seg;
} block_t;

typedef struct segment {
    uintptr_t base;
    size_t size;
    int small;
    int expandable; /* the device's expandable segment (VMM), see below */
    block_t *head;
    struct segment *next;
} segment_t;

typedef struct dev_alloc {
    segment_t *segs;
    uint64_t retries, ooms;
    uint64_t async_live, async_requested;
    int pool_configured;
} dev_alloc_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dev_alloc_t devs[MAXDEV];
static __thread int cur_dev = -1;
static int adapter_on;
static int grad_mode, train_mode; /* what the adapter would see: 1 yes, -1 no, 0 unknown */
/* per-device totals readable without the lock: the shim's query must never take it (the
 * failing thread may be inside this allocator, holding it) */
static _Atomic uint64_t live_allocated[MAXDEV], live_reserved[MAXDEV];

static size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

static int async_backend(void)
{
    const char *c = getenv("PYTORCH_CUDA_ALLOC_CONF");
    return c && strstr(c, "backend:cudaMallocAsync");
}

int c10_current_device(void) { return cur_dev < 0 ? 0 : cur_dev; }

void c10_init(void)
{
    int d = c10_current_device();
    cudaSetDevice(d);
    cudaFree(NULL); /* torch._C._cuda_init(): the primary context of the current device */
}

void c10_set_device(int device)
{
    cur_dev = device;
    cudaSetDevice(device);
}

static void stats_locked(int dev, c10_stats_t *o)
{
    memset(o, 0, sizeof *o);
    dev_alloc_t *a = &devs[dev];
    o->retries = a->retries;
    o->ooms = a->ooms;
    if (async_backend()) {
        cudaMemPool_t pool;
        uint64_t v = 0;
        if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v);
            o->reserved = v;
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &v);
            o->allocated = v;
        }
        o->requested = a->async_requested;
        return;
    }
    for (segment_t *s = a->segs; s; s = s->next) {
        o->segments++;
        o->reserved += s->size;
        int split = s->head && s->head->next != NULL;
        for (block_t *b = s->head; b; b = b->next) {
            if (b->allocated) {
                o->allocated += b->size;
                o->requested += b->requested;
            } else {
                if (split)
                    o->inactive_split += b->size;
                if (b->size > o->largest_free)
                    o->largest_free = b->size;
            }
        }
    }
}

static void publish_locked(int dev)
{
    c10_stats_t s;
    stats_locked(dev, &s);
    atomic_store(&live_allocated[dev], s.allocated);
    atomic_store(&live_reserved[dev], s.reserved);
}

void c10_memory_stats(int device, c10_stats_t *out)
{
    pthread_mutex_lock(&lock);
    stats_locked(device, out);
    pthread_mutex_unlock(&lock);
}

/* the adapter's query, called by the shim at a failing driver call (any library's): only
 * lock-free reads, as the contract in oomguard.h demands */
static int adapter_query(void *ctx, int device, oomguard_framework_stats_t *out)
{
    (void)ctx;
    if (device < 0 || device >= MAXDEV)
        return 0;
    out->allocated_bytes = atomic_load(&live_allocated[device]);
    out->reserved_bytes = atomic_load(&live_reserved[device]);
    out->active_bytes = out->allocated_bytes;
    out->framework = "pytorch";
    out->source = "torch 2.5.1";
    out->grad_enabled = grad_mode;
    out->training = train_mode;
    out->flags &= ~(uint64_t)OOMGUARD_FW_NO_NUMBERS; /* the byte counts are filled */
    return 0;
}

void c10_enable_adapter(void)
{
    adapter_on = 1;
    int (*set_query)(oomguard_query_fn, void *, unsigned) =
        (int (*)(oomguard_query_fn, void *, unsigned))dlsym(RTLD_DEFAULT, "oomguard_framework_set_query");
    if (set_query)
        set_query(adapter_query, NULL, 0);
}

int c10_adapter_enabled(void) { return adapter_on; }

void c10_set_mode(int grad_enabled, int training)
{
    grad_mode = grad_enabled;
    train_mode = training;
}

/* what oomguard_torch's out-of-memory observer hands to the shim */
static void adapter_report(int dev, const c10_stats_t *s, size_t requested)
{
    if (!adapter_on)
        return;
    int (*report)(const oomguard_framework_stats_t *) =
        (int (*)(const oomguard_framework_stats_t *))dlsym(RTLD_DEFAULT, "oomguard_framework_report");
    if (!report)
        return;
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    oomguard_framework_stats_t f = {
        .struct_size = sizeof f,
        .device = dev,
        .allocated_bytes = s->allocated,
        .reserved_bytes = s->reserved,
        .active_bytes = s->allocated,
        .inactive_split_bytes = s->inactive_split,
        .largest_free_block_bytes = s->largest_free,
        .num_alloc_retries = s->retries,
        .num_ooms = s->ooms,
        .allocator_settings = conf ? conf : "",
        .source = "torch 2.5.1",
        .framework = "pytorch",
        .api = async_backend() ? "torch.cuda.cudaMallocAsync" : "torch.cuda.caching_allocator",
        .requested_bytes = requested,
        .grad_enabled = grad_mode,
        .training = train_mode,
    };
    report(&f);
}

static void mark_stats(const char *kind, int dev, size_t req, const c10_stats_t *s, uint64_t released)
{
    scen_mark(kind, LIB, dev, req,
              "\"allocated\":%llu,\"reserved\":%llu,\"inactive_split\":%llu,\"largest_free\":%llu,"
              "\"retries\":%llu,\"ooms\":%llu,\"released\":%llu,\"adapter\":%d",
              (unsigned long long)s->allocated, (unsigned long long)s->reserved, (unsigned long long)s->inactive_split,
              (unsigned long long)s->largest_free, (unsigned long long)s->retries, (unsigned long long)s->ooms,
              (unsigned long long)released, adapter_on);
}

/* frees every entirely free segment; returns the bytes given back to the driver */
static uint64_t release_cached_locked(int dev)
{
    uint64_t n = 0;
    segment_t **pp = &devs[dev].segs;
    cudaSetDevice(dev);
    while (*pp) {
        segment_t *s = *pp;
        if (!s->expandable && s->head && !s->head->allocated && !s->head->next) {
            cudaFree((void *)s->base);
            n += s->size;
            *pp = s->next;
            free(s->head);
            free(s);
        } else {
            pp = &s->next;
        }
    }
    return n;
}

/* ---- expandable segments ---- */
static block_t *best_fit(dev_alloc_t *a, size_t size, int small);

static int expandable_conf(void)
{
    const char *c = getenv("PYTORCH_CUDA_ALLOC_CONF");
    return c && strcasestr(c, "expandable_segments:true") && !async_backend();
}

typedef struct exp_seg {
    CUdeviceptr va;
    size_t mapped;
    size_t chunks[4096]; /* the mappings, in address order (unmapped from the end) */
    int nchunks;
    segment_t *seg;
} exp_seg_t;
static exp_seg_t xs[MAXDEV];

static block_t *tail_block(segment_t *s)
{
    block_t *b = s ? s->head : NULL;
    while (b && b->next)
        b = b->next;
    return b;
}

/* maps `bytes` more at the end of the device's expandable segment; -1 when the device is full */
static int xs_grow(int dev, size_t bytes)
{
    exp_seg_t *x = &xs[dev];
    dev_alloc_t *a = &devs[dev];
    if (!x->va && cuMemAddressReserve(&x->va, 1ull << 40, 0, 0, 0) != CUDA_SUCCESS)
        return -1;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    if (x->nchunks == 4096 || cuMemCreate(&h, bytes, &prop, 0) != CUDA_SUCCESS)
        return -1;
    CUdeviceptr at = x->va + x->mapped;
    if (cuMemMap(at, bytes, 0, h, 0) != CUDA_SUCCESS) {
        cuMemRelease(h);
        return -1;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuMemSetAccess(at, bytes, &acc, 1);
    cuMemRelease(h); /* the mapping keeps the physical memory */
    x->chunks[x->nchunks++] = bytes;
    x->mapped += bytes;
    if (!x->seg) {
        segment_t *s = calloc(1, sizeof *s);
        s->base = (uintptr_t)x->va;
        s->expandable = 1;
        s->next = a->segs;
        a->segs = s;
        x->seg = s;
    }
    segment_t *s = x->seg;
    block_t *t = tail_block(s);
    if (t && !t->allocated) {
        t->size += bytes;
    } else {
        block_t *n = calloc(1, sizeof *n);
        n->addr = (uintptr_t)at;
        n->size = bytes;
        n->seg = s;
        n->prev = t;
        if (t)
            t->next = n;
        else
            s->head = n;
    }
    s->size += bytes;
    return 0;
}

/* unmaps whole free chunks at the end of the expandable segment; returns the bytes released */
static uint64_t xs_trim(int dev)
{
    exp_seg_t *x = &xs[dev];
    uint64_t n = 0;
    while (x->seg && x->nchunks > 0) {
        block_t *t = tail_block(x->seg);
        size_t c = x->chunks[x->nchunks - 1];
        if (!t || t->allocated || t->size < c)
            break;
        cuMemUnmap(x->va + x->mapped - c, c);
        x->nchunks--;
        x->mapped -= c;
        x->seg->size -= c;
        t->size -= c;
        n += c;
        if (t->size == 0) {
            if (t->prev)
                t->prev->next = NULL;
            else
                x->seg->head = NULL;
            free(t);
        }
    }
    return n;
}

/* the large-pool path with expandable segments: grow the segment instead of a new cudaMalloc */
static block_t *xs_alloc_locked(int dev, size_t size)
{
    dev_alloc_t *a = &devs[dev];
    block_t *t = tail_block(xs[dev].seg);
    size_t have = t && !t->allocated ? t->size : 0;
    size_t need = round_up(size - have, 2 * MiB);
    cudaSetDevice(dev);
    if (xs_grow(dev, need) != 0) {
        c10_stats_t s;
        stats_locked(dev, &s);
        mark_stats("attempt", dev, need, &s, 0);
        a->retries++;
        uint64_t released = xs_trim(dev) + release_cached_locked(dev);
        publish_locked(dev);
        stats_locked(dev, &s);
        mark_stats("released", dev, need, &s, released);
        t = tail_block(xs[dev].seg);
        have = t && !t->allocated ? t->size : 0;
        need = round_up(size - have, 2 * MiB);
        if (xs_grow(dev, need) != 0) {
            a->ooms++;
            stats_locked(dev, &s);
            mark_stats("fail", dev, need, &s, released);
            adapter_report(dev, &s, size);
            return NULL;
        }
        stats_locked(dev, &s);
        mark_stats("recovered", dev, need, &s, released);
    }
    return best_fit(a, size, 0);
}

void c10_empty_cache(void)
{
    pthread_mutex_lock(&lock);
    if (async_backend()) {
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, c10_current_device()) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
    } else {
        for (int d = 0; d < MAXDEV; d++)
            if (devs[d].segs) {
                xs_trim(d);
                release_cached_locked(d);
                publish_locked(d);
            }
        cudaSetDevice(c10_current_device());
    }
    pthread_mutex_unlock(&lock);
}

static block_t *best_fit(dev_alloc_t *a, size_t size, int small)
{
    block_t *best = NULL;
    for (segment_t *s = a->segs; s; s = s->next) {
        if (s->small != small)
            continue;
        for (block_t *b = s->head; b; b = b->next)
            if (!b->allocated && b->size >= size && (!best || b->size < best->size))
                best = b;
    }
    return best;
}

static void *async_alloc_locked(int dev, size_t nbytes)
{
    dev_alloc_t *a = &devs[dev];
    cudaMemPool_t pool;
    cudaSetDevice(dev);
    if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess)
        return NULL;
    if (!a->pool_configured) {
        uint64_t keep = UINT64_MAX; /* PyTorch: the pool keeps what it reserved */
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        a->pool_configured = 1;
    }
    void *p = NULL;
    if (cudaMallocAsync(&p, nbytes, 0) == cudaSuccess) {
        a->async_requested += nbytes;
        return p;
    }
    (void)cudaGetLastError();
    c10_stats_t s;
    stats_locked(dev, &s);
    mark_stats("attempt", dev, nbytes, &s, 0);
    cudaDeviceSynchronize();
    cudaMemPoolTrimTo(pool, 0);
    a->retries++;
    if (cudaMallocAsync(&p, nbytes, 0) == cudaSuccess) {
        a->async_requested += nbytes;
        stats_locked(dev, &s);
        mark_stats("recovered", dev, nbytes, &s, 0);
        return p;
    }
    (void)cudaGetLastError();
    a->ooms++;
    stats_locked(dev, &s);
    mark_stats("fail", dev, nbytes, &s, 0);
    adapter_report(dev, &s, nbytes);
    return NULL;
}

void *c10_empty(size_t nbytes)
{
    int dev = c10_current_device();
    pthread_mutex_lock(&lock);
    if (async_backend()) {
        void *p = async_alloc_locked(dev, nbytes ? nbytes : 1);
        publish_locked(dev);
        pthread_mutex_unlock(&lock);
        return p;
    }
    dev_alloc_t *a = &devs[dev];
    size_t size = nbytes < 512 ? 512 : round_up(nbytes, 512);
    int small = size <= SMALL_SIZE;
    block_t *b = best_fit(a, size, small);
    if (!b && !small && expandable_conf()) {
        b = xs_alloc_locked(dev, size);
        if (!b) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
    }
    if (!b) {
        size_t seg_size = small ? SMALL_BUFFER : size < MIN_LARGE_ALLOC ? LARGE_BUFFER : round_up(size, 2 * MiB);
        void *p = NULL;
        cudaSetDevice(dev);
        cudaError_t e = cudaMalloc(&p, seg_size);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            c10_stats_t s;
            stats_locked(dev, &s);
            mark_stats("attempt", dev, seg_size, &s, 0);
            a->retries++;
            uint64_t released = release_cached_locked(dev);
            publish_locked(dev);
            stats_locked(dev, &s);
            mark_stats("released", dev, seg_size, &s, released);
            e = cudaMalloc(&p, seg_size);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                a->ooms++;
                stats_locked(dev, &s);
                mark_stats("fail", dev, seg_size, &s, released);
                adapter_report(dev, &s, size);
                pthread_mutex_unlock(&lock);
                return NULL;
            }
            stats_locked(dev, &s);
            mark_stats("recovered", dev, seg_size, &s, released);
        }
        segment_t *s = calloc(1, sizeof *s);
        block_t *h = calloc(1, sizeof *h);
        s->base = (uintptr_t)p;
        s->size = seg_size;
        s->small = small;
        h->addr = s->base;
        h->size = seg_size;
        h->seg = s;
        s->head = h;
        s->next = a->segs;
        a->segs = s;
        b = h;
    }
    size_t rest = b->size - size;
    if ((small && rest >= 512) || (!small && rest > SMALL_SIZE)) {
        block_t *r = calloc(1, sizeof *r);
        r->addr = b->addr + size;
        r->size = rest;
        r->seg = b->seg;
        r->prev = b;
        r->next = b->next;
        if (b->next)
            b->next->prev = r;
        b->next = r;
        b->size = size;
    }
    b->allocated = 1;
    b->requested = nbytes;
    publish_locked(dev);
    pthread_mutex_unlock(&lock);
    return (void *)b->addr;
}

void c10_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&lock);
    if (async_backend()) {
        cudaFreeAsync(p, 0);
        publish_locked(c10_current_device());
        pthread_mutex_unlock(&lock);
        return;
    }
    for (int d = 0; d < MAXDEV; d++)
        for (segment_t *s = devs[d].segs; s; s = s->next) {
            if ((uintptr_t)p < s->base || (uintptr_t)p >= s->base + s->size)
                continue;
            for (block_t *b = s->head; b; b = b->next) {
                if (b->addr != (uintptr_t)p || !b->allocated)
                    continue;
                b->allocated = 0;
                b->requested = 0;
                block_t *n = b->next;
                if (n && !n->allocated) {
                    b->size += n->size;
                    b->next = n->next;
                    if (n->next)
                        n->next->prev = b;
                    free(n);
                }
                block_t *pr = b->prev;
                if (pr && !pr->allocated) {
                    pr->size += b->size;
                    pr->next = b->next;
                    if (b->next)
                        b->next->prev = pr;
                    free(b);
                }
                publish_locked(d);
                pthread_mutex_unlock(&lock);
                return;
            }
        }
    pthread_mutex_unlock(&lock);
}
