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
 * One cache per device; a mutex around each call (PyTorch's allocator is thread-safe too). */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kit.h"
#include "oomguard.h"
#include "truth.h"

#define LIB "libc10_cuda.so"
#define MAXDEV 16
#define SMALL_SIZE (1 * MiB)
#define SMALL_BUFFER (2 * MiB)
#define LARGE_BUFFER (20 * MiB)
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
    cudaFree(NULL);   /* torch._C._cuda_init(): the primary context of the current device */
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
        int split = s->head->next != NULL;
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

void c10_memory_stats(int device, c10_stats_t *out)
{
    pthread_mutex_lock(&lock);
    stats_locked(device, out);
    pthread_mutex_unlock(&lock);
}

void c10_enable_adapter(void) { adapter_on = 1; }

/* what oomguard_torch's out-of-memory observer hands to the shim */
static void adapter_report(int dev, const c10_stats_t *s)
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
    };
    report(&f);
}

static void mark_stats(const char *kind, int dev, size_t req, const c10_stats_t *s, uint64_t released)
{
    scen_mark(kind, LIB, dev, req,
              "\"allocated\":%llu,\"reserved\":%llu,\"inactive_split\":%llu,\"largest_free\":%llu,"
              "\"retries\":%llu,\"ooms\":%llu,\"released\":%llu,\"adapter\":%d",
              (unsigned long long)s->allocated, (unsigned long long)s->reserved,
              (unsigned long long)s->inactive_split, (unsigned long long)s->largest_free,
              (unsigned long long)s->retries, (unsigned long long)s->ooms, (unsigned long long)released, adapter_on);
}

/* frees every entirely free segment; returns the bytes given back to the driver */
static uint64_t release_cached_locked(int dev)
{
    uint64_t n = 0;
    segment_t **pp = &devs[dev].segs;
    cudaSetDevice(dev);
    while (*pp) {
        segment_t *s = *pp;
        if (!s->head->allocated && !s->head->next) {
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

void c10_empty_cache(void)
{
    pthread_mutex_lock(&lock);
    if (async_backend()) {
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, c10_current_device()) == cudaSuccess)
            cudaMemPoolTrimTo(pool, 0);
    } else {
        for (int d = 0; d < MAXDEV; d++)
            if (devs[d].segs)
                release_cached_locked(d);
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
        uint64_t keep = UINT64_MAX;   /* PyTorch: the pool keeps what it reserved */
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
    adapter_report(dev, &s);
    return NULL;
}

void *c10_empty(size_t nbytes)
{
    int dev = c10_current_device();
    pthread_mutex_lock(&lock);
    if (async_backend()) {
        void *p = async_alloc_locked(dev, nbytes ? nbytes : 1);
        pthread_mutex_unlock(&lock);
        return p;
    }
    dev_alloc_t *a = &devs[dev];
    size_t size = nbytes < 512 ? 512 : round_up(nbytes, 512);
    int small = size <= SMALL_SIZE;
    block_t *b = best_fit(a, size, small);
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
            stats_locked(dev, &s);
            mark_stats("released", dev, seg_size, &s, released);
            e = cudaMalloc(&p, seg_size);
            if (e != cudaSuccess) {
                (void)cudaGetLastError();
                a->ooms++;
                stats_locked(dev, &s);
                mark_stats("fail", dev, seg_size, &s, released);
                adapter_report(dev, &s);
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
                pthread_mutex_unlock(&lock);
                return;
            }
        }
    pthread_mutex_unlock(&lock);
}
