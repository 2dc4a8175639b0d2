/* The ledger: every live device block, per-device totals and peaks, VMM handles and
 * mappings, stream-ordered pools, and a ring of recent events.
 *
 * Counting rule: each byte is counted once, at the layer that takes device memory.
 *  - cuMemAlloc/Pitch/Managed: the block.
 *  - VMM: physical memory at cuMemCreate, freed when the handle is released *and* unmapped
 *    (the driver's rule); mappings are kept so an address resolves to its handle.
 *  - pools: what the pool reserves from the device (queried from the driver), with the
 *    blocks it hands out kept apart as pool_used.
 *  - pinned host memory is ledgered but never added to a device.
 *
 * Live blocks sit in 64 shards (uthash + spin lock + counters + event ring each).  A thread
 * records its allocations in its own shard (threads are given shards in turn), so two
 * threads allocating at once never share a cache line; a free looks in the caller's shard
 * first and then in the others (a block freed by another thread, e.g. PyTorch's autograd
 * thread freeing activations).  Blocks come from per-shard slabs: a live block costs its
 * struct and a share of the bucket array, nothing from malloc. */
#include "og.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

/* MurmurHash3's 64-bit finaliser: addresses differ only in a few middle bits (allocations
 * are 256-byte aligned and close together), and uthash indexes buckets by the low bits; with
 * a weaker mix the chains grow long and uthash stops expanding the table for good. */
static inline unsigned og_hash_ptr(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (unsigned)k;
}
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = og_hash_ptr(*(const uint64_t *)(keyptr)))
/* uthash's table headers and bucket arrays on cache lines of their own: two shards' tables
 * allocated side by side would otherwise share a line that both threads write on every
 * allocation (false sharing measured at ~1 us per pair with two threads). */
static void *og_line_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
#define uthash_malloc(sz) og_line_alloc(sz)
#define uthash_free(ptr, sz) free(ptr)
#include <uthash.h>


#define SHARDS     64
#define SLAB_COUNT 512

typedef struct og_block {
    uint64_t addr;
    uint64_t size;
    uint64_t t_ns;
    uint32_t site;
    int8_t device;                  /* < OG_MAX_DEVICES; int8 keeps the block at 32 bytes + hh */
    uint8_t kind;
    uint8_t hook;
    uint8_t flags;                  /* OG_KIND_F_COUNTED */
    UT_hash_handle hh;
} og_block_t;

/* One event of a ring.  A ring has one writer at a time (its shard's lock) and readers that
 * take no lock (a dump), so the slot is a seqlock made only of atomics: seq is cleared, the
 * fields are written, seq is set to index+1; a reader keeps a slot whose seq reads index+1
 * before and after it copied the fields (the fences order the relaxed accesses in C11). */
typedef struct {
    _Atomic uint64_t seq;            /* index+1 once written; 0 while being written */
    _Atomic uint64_t t_ns, bytes, live;
    _Atomic uint32_t what;           /* device (16 bits) | op (8) | hook (8) */
} og_event_t;

typedef struct {
    _Atomic(og_event_t *) ev;        /* allocated at the ring's first event */
    uint32_t size;
    uint32_t pos;                    /* head % size, kept by the writer: no division per event */
    _Atomic uint64_t head;
} ring_t;

/* Counters live in the shard, under its lock: two threads working on different addresses
 * touch different cache lines.  Only `tracked` (needed for peaks and limits) is shared. */
typedef struct {
    uint64_t bytes[OG_KIND_COUNT], blocks[OG_KIND_COUNT], allocs, frees;
} shard_dev_t;

typedef struct {
    og_spin_t lock;
    og_block_t *table;
    og_block_t *free_list;          /* linked through hh.next */
    ring_t ring;                    /* this shard's recent events */
    uint64_t host_bytes, host_blocks;
    _Atomic uint64_t nblocks;       /* lets a cross-thread free skip empty shards unlocked */
    int64_t pending[OG_MAX_DEVICES];/* small changes not yet added to devs[].tracked (see below) */
    og_block_t sentinel;            /* address 0, always in the table: uthash frees a table
                                       that becomes empty and re-creates it on the next add,
                                       which would cost a malloc and two frees per pair */
    shard_dev_t dev[OG_MAX_DEVICES];
} __attribute__((aligned(64))) shard_t;

typedef struct {
    _Atomic uint64_t tracked, peak, peak_t_ns;
    _Atomic uint64_t pool_used;                 /* also in the shards; here for limit checks */
    _Atomic uint64_t pool_counted;              /* blocks of unreadable pools (OG_KIND_F_COUNTED) */
    _Atomic uint64_t ipc_mapped;                /* OG_KIND_F_IPC blocks: mapped, not ours */
    _Atomic uint64_t graph_reserved;            /* the device's graph memory pool, as last read */
    atomic_int seen;                            /* a tracked call named this device */
    atomic_int pools_unreadable;
    _Atomic uint64_t pool_reserved, vmm_physical, vmm_handles, vmm_mapped;
    _Atomic uint64_t slow_allocs, slow_frees, failures, unknown_frees;   /* VMM and rare paths */
    /* usage over the whole run, downsampled: when full, every other sample is dropped and
     * the interval doubles, so 512 points always span the run */
    pthread_mutex_t sample_lock;
    _Atomic uint64_t next_sample;
    uint64_t sample_interval;
    int nsamples;
    struct { uint64_t t_ns, live; } samples[OG_SAMPLES];
} __attribute__((aligned(64))) og_ledger_dev_t;

static shard_t shards[SHARDS];
static og_ledger_dev_t devs[OG_MAX_DEVICES];

void og_spin_lock_slow(og_spin_t *l)
{
    for (unsigned spins = 0;; spins++) {
        while (atomic_load_explicit(&l->v, memory_order_relaxed)) {
            if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield();           /* the holder may have been preempted */
            }
        }
        if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
            return;
    }
}

/* ------------------------------------------------------------------ time */

static uint64_t start_ns;
uint64_t og_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
uint64_t og_start_ns(void) { return start_ns; }

/* The hot path stamps events with the CPU's time-stamp counter (a third of the cost of
 * clock_gettime here); stamps are turned into CLOCK_MONOTONIC nanoseconds when read, with
 * a rate measured between start-up and the moment of reading. */
static uint64_t start_ticks;
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t og_ticks(void) { return __rdtsc(); }
#define OG_TICKS_ARE_NS 0
#else
static inline uint64_t og_ticks(void) { return og_now_ns(); }
#define OG_TICKS_ARE_NS 1
#endif

static uint64_t ticks_to_ns(uint64_t ticks)
{
    if (OG_TICKS_ARE_NS || !ticks)
        return ticks;
    uint64_t now_t = og_ticks(), now_ns = og_now_ns();
    double rate = now_t > start_ticks + 1000000 && now_ns > start_ns
                      ? (double)(now_ns - start_ns) / (double)(now_t - start_ticks)
                      : 1.0 / 3.0;                 /* too early to tell: assume 3 GHz */
    double rel = ((double)ticks - (double)start_ticks) * rate;
    return start_ns + (uint64_t)(rel > 0 ? rel : 0);
}

/* ------------------------------------------------------------------ history rings */

/* Each shard keeps its own ring (written under the shard lock); VMM, pools and failures go
 * to one more ring with its own lock.  A dump merges them by time. */
static ring_t slow_ring;
static pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;

/* Each ring holds OOMGUARD_HISTORY events, so the newest OOMGUARD_HISTORY of the process
 * are always kept, however the threads share them; only rings that are used cost memory
 * (one per allocating thread, up to 64). */
static __attribute__((noinline)) og_event_t *ring_alloc(ring_t *r)
{
    og_event_t *ev;
    if (!r->size || !(ev = calloc(r->size, sizeof *ev)))
        return NULL;
    atomic_store_explicit(&r->ev, ev, memory_order_release);
    return ev;
}

/* Inlined into the allocation and free paths (a call and its saved registers cost as much
 * as the stores themselves). */
static inline __attribute__((always_inline)) void ring_add(ring_t *r, int op, int hook, int device, uint64_t bytes,
                                                           uint64_t live, uint64_t t)
{
    og_event_t *ev = atomic_load_explicit(&r->ev, memory_order_relaxed);
    if (OG_UNLIKELY(!ev) && !(ev = ring_alloc(r)))
        return;
    uint64_t i = atomic_load_explicit(&r->head, memory_order_relaxed);
    og_event_t *e = &ev[r->pos];
    r->pos = r->pos + 1 == r->size ? 0 : r->pos + 1;
    atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&e->t_ns, t, memory_order_relaxed);
    atomic_store_explicit(&e->bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&e->live, live, memory_order_relaxed);
    atomic_store_explicit(&e->what, (uint32_t)(uint16_t)device << 16 | (uint32_t)(uint8_t)op << 8 | (uint8_t)hook,
                          memory_order_relaxed);
    atomic_store_explicit(&e->seq, i + 1, memory_order_release);
    atomic_store_explicit(&r->head, i + 1, memory_order_release);
}

static void history_add(int op, int hook, int device, uint64_t bytes, uint64_t live, uint64_t t)
{
    pthread_mutex_lock(&slow_lock);
    ring_add(&slow_ring, op, hook, device, bytes, live, t);
    pthread_mutex_unlock(&slow_lock);
}

static size_t ring_copy(ring_t *r, og_history_event_t *out, size_t n, size_t max)
{
    og_event_t *ev = atomic_load_explicit(&r->ev, memory_order_acquire);
    if (!ev)
        return n;
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t first = head > r->size ? head - r->size : 0;
    for (uint64_t i = first; i < head && n < max; i++) {
        og_event_t *e = &ev[i % r->size];
        if (atomic_load_explicit(&e->seq, memory_order_acquire) != i + 1)
            continue;
        uint64_t t = atomic_load_explicit(&e->t_ns, memory_order_relaxed);
        uint64_t bytes = atomic_load_explicit(&e->bytes, memory_order_relaxed);
        uint64_t live = atomic_load_explicit(&e->live, memory_order_relaxed);
        uint32_t what = atomic_load_explicit(&e->what, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&e->seq, memory_order_relaxed) != i + 1)
            continue;                    /* rewritten while we read it */
        out[n++] = (og_history_event_t){ticks_to_ns(t), bytes, live, (int16_t)(what >> 16), (uint8_t)(what >> 8),
                                        (uint8_t)what};
    }
    return n;
}

static int cmp_event_t(const void *a, const void *b)
{
    const og_history_event_t *x = a, *y = b;
    return (x->t_ns > y->t_ns) - (x->t_ns < y->t_ns);
}

/* The newest OOMGUARD_HISTORY events of the process, oldest first. */
size_t og_history_copy(og_history_event_t *out, size_t max)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++)
        n = ring_copy(&shards[i].ring, out, n, max);
    n = ring_copy(&slow_ring, out, n, max);
    qsort(out, n, sizeof *out, cmp_event_t);
    size_t keep = (size_t)og_opt.history;
    if (keep && n > keep) {
        memmove(out, out + (n - keep), keep * sizeof *out);
        n = keep;
    }
    return n;
}

size_t og_history_capacity(void)
{
    size_t n = atomic_load(&slow_ring.ev) ? slow_ring.size : 0;
    for (int i = 0; i < SHARDS; i++)
        if (atomic_load(&shards[i].ring.ev))
            n += shards[i].ring.size;
    return n;
}

/* ------------------------------------------------------------------ devices */

int og_current_device(void)
{
    og_cfn_cuCtxGetDevice f = OG_CALL(cuCtxGetDevice);
    CUdevice d;
    return f && f(&d) == CUDA_SUCCESS ? (int)d : -1;
}

int og_pointer_device(uintptr_t addr)
{
    og_cfn_cuPointerGetAttribute f = OG_CALL(cuPointerGetAttribute);
    int ordinal = -1;
    return f && f(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)addr) == CUDA_SUCCESS ? ordinal : -1;
}

static inline og_ledger_dev_t *dev_of(int device)
{
    return device >= 0 && device < OG_MAX_DEVICES ? &devs[device] : NULL;
}

static void sample(og_ledger_dev_t *d, uint64_t live, uint64_t t)
{
    atomic_store_explicit(&d->seen, 1, memory_order_relaxed);   /* its graph memory is re-read */
    if (pthread_mutex_trylock(&d->sample_lock) != 0)
        return;                       /* someone is sampling this device right now: enough */
    if (d->nsamples == OG_SAMPLES) {
        for (int i = 0; i < OG_SAMPLES / 2; i++)
            d->samples[i] = d->samples[2 * i + 1];
        d->nsamples = OG_SAMPLES / 2;
        d->sample_interval *= 2;
    }
    d->samples[d->nsamples].t_ns = t;
    d->samples[d->nsamples].live = live;
    d->nsamples++;
    atomic_store_explicit(&d->next_sample, t + d->sample_interval, memory_order_relaxed);
    pthread_mutex_unlock(&d->sample_lock);
}

size_t og_samples_copy(int device, og_sample_raw_t *out, size_t max)
{
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return 0;
    pthread_mutex_lock(&d->sample_lock);
    size_t n = (size_t)d->nsamples < max ? (size_t)d->nsamples : max;
    for (size_t i = 0; i < n; i++) {
        out[i].t_ns = ticks_to_ns(d->samples[i].t_ns);
        out[i].live = d->samples[i].live;
    }
    pthread_mutex_unlock(&d->sample_lock);
    return n;
}

/* tracked += delta; raise the peak when it is passed. */
static uint64_t tracked_add(og_ledger_dev_t *d, int64_t delta, uint64_t t)
{
    uint64_t now = atomic_fetch_add_explicit(&d->tracked, (uint64_t)delta, memory_order_relaxed) + (uint64_t)delta;
    if (delta > 0) {
        uint64_t peak = atomic_load_explicit(&d->peak, memory_order_relaxed);
        while (now > peak) {
            if (atomic_compare_exchange_weak_explicit(&d->peak, &peak, now, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                atomic_store_explicit(&d->peak_t_ns, t, memory_order_relaxed);
                break;
            }
        }
    }
    if (OG_UNLIKELY(t >= atomic_load_explicit(&d->next_sample, memory_order_relaxed)))
        sample(d, now, t);
    return now;   /* callers that grew usage call og_warn_check once their locks are dropped */
}

/* The device-wide `tracked` counter is the one line every allocating thread writes; with two
 * threads that write costs more than everything else on the path together.  Small changes
 * are therefore summed per shard (per thread) and added in one step once they reach
 * OG_BATCH_BYTES; an allocation that size or larger goes straight through.  The exact
 * totals are the shards' sums (og_ledger_stats); peaks and warnings may trail by less than
 * OG_BATCH_BYTES per allocating thread.  With OOMGUARD_LIMIT set nothing is batched: the
 * limit is exact. */
#define OG_BATCH_BYTES (4ll << 20)

static inline uint64_t shard_tracked_add(shard_t *s, int device, int64_t delta, uint64_t t)
{
    og_ledger_dev_t *d = &devs[device];
    int64_t p = s->pending[device] + delta;
    if (og_limit_active() || p >= OG_BATCH_BYTES || p <= -OG_BATCH_BYTES) {
        s->pending[device] = 0;
        return tracked_add(d, p, t);
    }
    s->pending[device] = p;
    return atomic_load_explicit(&d->tracked, memory_order_relaxed) + (uint64_t)p;
}

/* ------------------------------------------------------------------ blocks */

static atomic_uint next_shard;
static OG_TLS int my_shard_idx = -1;

static inline shard_t *my_shard(void)
{
    if (OG_UNLIKELY(my_shard_idx < 0)) {
        my_shard_idx = (int)(atomic_fetch_add(&next_shard, 1) % SHARDS);
        og_exit_arm();          /* once per thread: the program is running, not starting */
    }
    return &shards[my_shard_idx];
}

/* The other shards, for a block freed by another thread than the one that allocated it. */
static __attribute__((noinline)) shard_t *find_locked_others(shard_t *mine, uint64_t addr, og_block_t **out)
{
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        if (s == mine || !atomic_load_explicit(&s->nblocks, memory_order_relaxed))
            continue;
        og_spin_lock(&s->lock);
        HASH_FIND(hh, s->table, &addr, sizeof(uint64_t), *out);
        if (*out)
            return s;
        og_spin_unlock(&s->lock);
    }
    return NULL;
}

/* Finds addr's block, looking in the caller's shard first (inlined: that is the common
 * case).  Returns with that shard locked and *out set, or NULL (nothing locked) when no
 * shard has it. */
static inline __attribute__((always_inline)) shard_t *find_locked(uint64_t addr, og_block_t **out)
{
    shard_t *mine = my_shard();
    og_spin_lock(&mine->lock);
    HASH_FIND(hh, mine->table, &addr, sizeof(uint64_t), *out);
    if (OG_LIKELY(*out))
        return mine;
    og_spin_unlock(&mine->lock);
    return find_locked_others(mine, addr, out);
}

static og_block_t *block_get(shard_t *s)
{
    og_block_t *b = s->free_list;
    if (OG_LIKELY(b)) {
        s->free_list = b->hh.next;
        return b;
    }
    og_block_t *slab = malloc(SLAB_COUNT * sizeof *slab);
    if (!slab)
        return NULL;
    for (int i = 1; i < SLAB_COUNT - 1; i++)
        slab[i].hh.next = &slab[i + 1];
    slab[SLAB_COUNT - 1].hh.next = NULL;
    s->free_list = &slab[1];
    return &slab[0];
}

static inline void block_put(shard_t *s, og_block_t *b)
{
    b->hh.next = s->free_list;
    s->free_list = b;
}

/* Counters of one block entering (sign +1) or leaving (-1) a shard; shard lock held. */
static inline void shard_count(shard_t *s, const og_block_t *b, int sign)
{
    atomic_store_explicit(&s->nblocks, atomic_load_explicit(&s->nblocks, memory_order_relaxed) + (uint64_t)sign,
                          memory_order_relaxed);
    if (b->kind == OG_KIND_HOST) {
        s->host_bytes += (uint64_t)sign * b->size;
        s->host_blocks += (uint64_t)sign;
        return;
    }
    if (b->device < 0 || b->device >= OG_MAX_DEVICES || (b->flags & OG_KIND_F_IPC))
        return;                                   /* IPC: see ipc_account */
    shard_dev_t *sd = &s->dev[b->device];
    sd->bytes[b->kind] += (uint64_t)sign * b->size;
    sd->blocks[b->kind] += (uint64_t)sign;
    if (sign > 0)
        sd->allocs++;
    else
        sd->frees++;
}

/* How a block counts on its device: plain and managed blocks and counted pool blocks are
 * device memory themselves; other pool blocks are inside their pool's reservation. */
static inline bool counts_itself(int kind, int flags)
{
    return !(flags & OG_KIND_F_IPC) && (kind != OG_KIND_POOL || (flags & OG_KIND_F_COUNTED) != 0);
}

/* An IPC mapping entering (+1) or leaving (-1) the ledger: another process's allocation,
 * kept (so that its close is recognised and a dump can say what is mapped) but never
 * counted as this process's memory. */
static inline void ipc_account(og_ledger_dev_t *d, int flags, uint64_t size, int sign)
{
    if (OG_UNLIKELY(flags & OG_KIND_F_IPC) && d)
        atomic_fetch_add_explicit(&d->ipc_mapped, (uint64_t)sign * size, memory_order_relaxed);
}

uint64_t og_ledger_ipc_mapped(int device)
{
    return device >= 0 && device < OG_MAX_DEVICES ? atomic_load(&devs[device].ipc_mapped) : 0;
}

static void array_note(uint64_t handle, uint64_t t);

void og_track_alloc(og_call_t *c, uintptr_t addr, uint64_t size, int kind)
{
    int flags = kind & OG_KIND_F_MASK;
    kind &= ~OG_KIND_F_MASK;
    if (OG_UNLIKELY(!addr))
        return;                                   /* nothing allocated (and the sentinel's key) */
    uint32_t site = og_site_capture(c->caller);   /* before any lock: it may unwind */
    uint64_t t = og_ticks();
    int device = kind == OG_KIND_HOST ? -1 : (c->device >= 0 ? c->device : og_current_device());
    og_ledger_dev_t *d = dev_of(device);
    shard_t *s = my_shard();
    og_spin_lock(&s->lock);
    og_block_t *old;
    uint64_t key = addr;
    unsigned hv;                                  /* hashed once for the lookup and the insert */
    HASH_VALUE(&key, sizeof key, hv);
    HASH_FIND_BYHASHVALUE(hh, s->table, &key, sizeof key, hv, old);
    if (OG_UNLIKELY(old)) {
        /* The driver handed out an address we still hold: its free went by a path we do
         * not see.  The old block is gone; count it out. */
        HASH_DEL(s->table, old);
        shard_count(s, old, -1);
        if (old->kind != OG_KIND_HOST && dev_of(old->device)) {
            if (old->kind == OG_KIND_POOL)
                atomic_fetch_sub(&devs[old->device].pool_used, old->size);
            if (old->flags & OG_KIND_F_COUNTED)
                atomic_fetch_sub(&devs[old->device].pool_counted, old->size);
            ipc_account(&devs[old->device], old->flags, old->size, -1);
            if (counts_itself(old->kind, old->flags))
                shard_tracked_add(s, old->device, -(int64_t)old->size, t);
        }
        block_put(s, old);
    }
    og_block_t *b = block_get(s);
    uint64_t live = 0;
    if (b) {
        b->addr = addr;
        b->size = size;
        b->t_ns = t;
        b->site = site;
        b->device = (int8_t)device;
        b->kind = (uint8_t)kind;
        b->hook = (uint8_t)c->hook;
        b->flags = (uint8_t)flags;
        HASH_ADD_BYHASHVALUE(hh, s->table, addr, sizeof(uint64_t), hv, b);
        shard_count(s, b, +1);
        if (d) {
            if (kind == OG_KIND_POOL)
                atomic_fetch_add_explicit(&d->pool_used, size, memory_order_relaxed);
            if (OG_UNLIKELY(flags & OG_KIND_F_COUNTED))
                atomic_fetch_add_explicit(&d->pool_counted, size, memory_order_relaxed);
            ipc_account(d, flags, size, +1);
            if (counts_itself(kind, flags))
                live = shard_tracked_add(s, device, (int64_t)size, t);
            else
                live = atomic_load_explicit(&d->tracked, memory_order_relaxed);
            if (!(flags & OG_KIND_F_IPC))         /* a mapping is no allocation event */
                ring_add(&s->ring, OG_EV_ALLOC, c->hook, device, size, live, t);
        }
    }
    og_spin_unlock(&s->lock);
    if (d && b && counts_itself(kind, flags))
        og_warn_check(device, live);
    if (d && b && counts_itself(kind, flags) &&
        OG_UNLIKELY(atomic_load_explicit(&og_episode_open[device], memory_order_relaxed)))
        og_on_recovered(c, device, size);
    if (OG_UNLIKELY(flags & OG_KIND_F_ARRAY) && b)
        array_note(addr, t);
}

/* A free takes the block out of the ledger *before* the real free: once the driver has
 * the address back it may hand it to another thread, whose allocation must not meet our
 * stale entry.  Everything is settled here under one lock, as if the free succeeds (it
 * almost always does); og_free_end undoes it if the real free failed. */
void og_free_begin(og_call_t *c, uintptr_t addr, og_taken_t *tk)
{
    tk->found = false;
    tk->addr = addr;
    uint64_t t = og_ticks();
    og_block_t *b = NULL;
    shard_t *s = find_locked(addr, &b);
    if (!s)
        return;
    if (b) {
        tk->found = true;
        tk->size = b->size;
        tk->t_ns = b->t_ns;
        tk->site = b->site;
        tk->device = b->device;
        tk->kind = b->kind;
        tk->hook = b->hook;
        tk->flags = b->flags;
        HASH_DEL(s->table, b);
        shard_count(s, b, -1);
        block_put(s, b);
        og_ledger_dev_t *d = b->kind == OG_KIND_HOST ? NULL : dev_of(b->device);
        if (d) {
            uint64_t live;
            if (tk->kind == OG_KIND_POOL)
                atomic_fetch_sub_explicit(&d->pool_used, tk->size, memory_order_relaxed);
            if (OG_UNLIKELY(tk->flags & OG_KIND_F_COUNTED))
                atomic_fetch_sub_explicit(&d->pool_counted, tk->size, memory_order_relaxed);
            ipc_account(d, tk->flags, tk->size, -1);
            if (counts_itself(tk->kind, tk->flags))
                live = shard_tracked_add(s, tk->device, -(int64_t)tk->size, t);
            else
                live = atomic_load_explicit(&d->tracked, memory_order_relaxed);
            if (!(tk->flags & OG_KIND_F_IPC))
                ring_add(&s->ring, OG_EV_FREE, c->hook, tk->device, tk->size, live, t);
        }
    }
    og_spin_unlock(&s->lock);
}

void og_free_end(og_call_t *c, og_taken_t *tk, CUresult r)
{
    if (!tk->found) {
        /* allocated before we were loaded, by a path we do not see, or a program bug */
        og_ledger_dev_t *d = dev_of(og_current_device());
        if (d)
            atomic_fetch_add_explicit(&d->unknown_frees, 1, memory_order_relaxed);
        return;
    }
    bool device_block = tk->kind != OG_KIND_HOST && dev_of(tk->device);
    if (OG_LIKELY(r == CUDA_SUCCESS)) {
        if (device_block && !(tk->flags & OG_KIND_F_IPC))
            og_note_free(tk->device, tk->size, tk->site);
        return;
    }
    /* the real free failed: the block is still allocated; put it back, unchanged */
    shard_t *s = my_shard();
    uint64_t t = og_ticks();
    og_spin_lock(&s->lock);
    og_block_t *b = block_get(s);
    if (b) {
        b->addr = tk->addr;
        b->size = tk->size;
        b->t_ns = tk->t_ns;
        b->site = tk->site;
        b->device = tk->device;
        b->kind = tk->kind;
        b->hook = tk->hook;
        b->flags = tk->flags;
        HASH_ADD(hh, s->table, addr, sizeof(uint64_t), b);
        shard_count(s, b, +1);
        if (device_block) {            /* neither an allocation nor a free happened */
            s->dev[b->device].allocs--;
            s->dev[b->device].frees--;
            og_ledger_dev_t *d = &devs[b->device];
            uint64_t live;
            if (b->kind == OG_KIND_POOL)
                atomic_fetch_add_explicit(&d->pool_used, b->size, memory_order_relaxed);
            if (b->flags & OG_KIND_F_COUNTED)
                atomic_fetch_add_explicit(&d->pool_counted, b->size, memory_order_relaxed);
            ipc_account(d, b->flags, b->size, +1);
            if (counts_itself(b->kind, b->flags))
                live = shard_tracked_add(s, b->device, (int64_t)b->size, t);
            else
                live = atomic_load_explicit(&d->tracked, memory_order_relaxed);
            ring_add(&s->ring, OG_EV_ALLOC, c->hook, b->device, b->size, live, t);   /* restored */
        }
    }
    og_spin_unlock(&s->lock);
}

/* Only an out-of-memory result is a failure: CUDA_ERROR_INVALID_VALUE (size 0, a NULL
 * pointer) and the like are the program's errors, passed back unchanged and not recorded. */
void og_track_failure(og_call_t *c, uint64_t size, int kind, CUresult r)
{
    if (r != CUDA_ERROR_OUT_OF_MEMORY)
        return;
    og_exit_arm();
    int device = c->device >= 0 ? c->device : og_current_device();
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    atomic_fetch_add_explicit(&d->failures, 1, memory_order_relaxed);
    history_add(OG_EV_FAIL, c->hook, device, size, atomic_load(&d->tracked), og_ticks());
    c->device = device;
    og_on_oom(c, size, kind, r, false);
}

/* ------------------------------------------------------------------ VMM */

typedef struct {
    uint64_t handle;
    uint64_t size;
    int device;
    int refs;              /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
    int mappings;
    uint64_t t_ns;
    uint32_t site;
    UT_hash_handle hh;
} vmm_handle_t;

typedef struct {
    uint64_t va;
    uint64_t size;
    uint64_t handle;
    UT_hash_handle hh;
} vmm_map_t;

static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static vmm_handle_t *vmm_handles;
static vmm_map_t *vmm_maps;

/* Physical memory goes back to the device when nothing references it any more. */
static void vmm_maybe_free(vmm_handle_t *h, uint64_t t)
{
    if (h->refs > 0 || h->mappings > 0)
        return;
    og_ledger_dev_t *d = dev_of(h->device);
    if (d) {
        atomic_fetch_sub(&d->vmm_physical, h->size);
        atomic_fetch_sub(&d->vmm_handles, 1);
        atomic_fetch_add(&d->slow_frees, 1);
        uint64_t live = tracked_add(d, -(int64_t)h->size, t);
        history_add(OG_EV_FREE, OG_H_cuMemRelease, h->device, h->size, live, t);
        og_note_free(h->device, h->size, h->site);
    }
    HASH_DEL(vmm_handles, h);
    free(h);
}

void og_track_vmm_create(og_call_t *c, CUmemGenericAllocationHandle handle, uint64_t size, int device)
{
    og_exit_arm();
    uint32_t site = og_site_capture(c->caller);
    uint64_t t = og_ticks();
    vmm_handle_t *h = calloc(1, sizeof *h);
    if (!h)
        return;
    h->handle = handle;
    h->size = size;
    h->device = device;
    h->refs = 1;
    h->t_ns = t;
    h->site = site;
    pthread_mutex_lock(&vmm_lock);
    vmm_handle_t *stale;
    uint64_t key = handle;
    HASH_FIND(hh, vmm_handles, &key, sizeof key, stale);
    if (stale) {
        /* The driver reused the value: the old handle was freed by a release or unmap whose
         * ledger update has not run yet (or that we never saw).  Its memory is gone. */
        stale->refs = 0;
        stale->mappings = 0;
        vmm_maybe_free(stale, t);
    }
    HASH_ADD(hh, vmm_handles, handle, sizeof(uint64_t), h);
    pthread_mutex_unlock(&vmm_lock);
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    atomic_fetch_add(&d->vmm_physical, size);
    atomic_fetch_add(&d->vmm_handles, 1);
    atomic_fetch_add(&d->slow_allocs, 1);
    uint64_t live = tracked_add(d, (int64_t)size, t);
    history_add(OG_EV_ALLOC, c->hook, device, size, live, t);
    og_warn_check(device, live);
}

void og_track_vmm_retain(og_call_t *c, CUmemGenericAllocationHandle handle)
{
    pthread_mutex_lock(&vmm_lock);
    vmm_handle_t *h;
    uint64_t k = handle;
    HASH_FIND(hh, vmm_handles, &k, sizeof k, h);
    if (h)
        h->refs++;
    pthread_mutex_unlock(&vmm_lock);
}

void og_track_vmm_release(og_call_t *c, CUmemGenericAllocationHandle handle)
{
    uint64_t t = og_ticks();
    pthread_mutex_lock(&vmm_lock);
    vmm_handle_t *h;
    uint64_t k = handle;
    HASH_FIND(hh, vmm_handles, &k, sizeof k, h);
    if (h) {
        h->refs--;
        vmm_maybe_free(h, t);
    }
    pthread_mutex_unlock(&vmm_lock);
}

void og_track_vmm_map(og_call_t *c, uintptr_t va, uint64_t size, CUmemGenericAllocationHandle handle)
{
    vmm_map_t *m = calloc(1, sizeof *m);
    if (!m)
        return;
    m->va = va;
    m->size = size;
    m->handle = handle;
    pthread_mutex_lock(&vmm_lock);
    vmm_map_t *old;
    HASH_FIND(hh, vmm_maps, &m->va, sizeof(uint64_t), old);
    if (old) {                      /* cannot happen with a correct driver; keep the newest */
        HASH_DEL(vmm_maps, old);
        free(old);
    }
    HASH_ADD(hh, vmm_maps, va, sizeof(uint64_t), m);
    vmm_handle_t *h;
    uint64_t k = handle;
    HASH_FIND(hh, vmm_handles, &k, sizeof k, h);
    if (h) {
        h->mappings++;
        og_ledger_dev_t *d = dev_of(h->device);
        if (d)
            atomic_fetch_add(&d->vmm_mapped, size);
    }
    pthread_mutex_unlock(&vmm_lock);
}

static void unmap_one(vmm_map_t *m, uint64_t t)
{
    vmm_handle_t *h;
    uint64_t k = m->handle;
    HASH_FIND(hh, vmm_handles, &k, sizeof k, h);
    if (h) {
        h->mappings--;
        og_ledger_dev_t *d = dev_of(h->device);
        if (d)
            atomic_fetch_sub(&d->vmm_mapped, m->size);
        vmm_maybe_free(h, t);
    }
    HASH_DEL(vmm_maps, m);
    free(m);
}

void og_track_vmm_unmap(og_call_t *c, uintptr_t va, uint64_t size)
{
    uint64_t t = og_ticks(), end = va + size;
    pthread_mutex_lock(&vmm_lock);
    /* Usual case: the range is a run of whole mappings; walk it mapping by mapping. */
    uint64_t a = va;
    while (a < end) {
        vmm_map_t *m;
        HASH_FIND(hh, vmm_maps, &a, sizeof a, m);
        if (!m)
            break;
        a += m->size ? m->size : 1;
        unmap_one(m, t);
    }
    if (a < end) {                   /* anything else inside the range */
        vmm_map_t *m, *tmp;
        HASH_ITER(hh, vmm_maps, m, tmp) {
            if (m->va >= va && m->va < end)
                unmap_one(m, t);
        }
    }
    pthread_mutex_unlock(&vmm_lock);
}

void og_track_context_reset(og_call_t *c, int device)
{
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    uint64_t t = og_ticks(), gone = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        og_spin_lock(&s->lock);
        og_block_t *b, *tmp;
        HASH_ITER(hh, s->table, b, tmp) {
            if (b == &s->sentinel || b->device != device || (b->flags & (OG_KIND_F_ARRAY | OG_KIND_F_IPC)) ||
                (b->kind != OG_KIND_PLAIN && b->kind != OG_KIND_MANAGED))
                continue;
            HASH_DEL(s->table, b);
            shard_count(s, b, -1);
            gone += b->size;
            block_put(s, b);
        }
        int64_t pending = s->pending[device];   /* settle this shard's batched share */
        s->pending[device] = 0;
        og_spin_unlock(&s->lock);
        if (pending)
            tracked_add(d, pending, t);
    }
    uint64_t live = tracked_add(d, -(int64_t)gone, t);
    history_add(OG_EV_FREE, c->hook, device, gone, live, t);
}

/* A CUDA array dies with the context it was made in, and no driver call tells that context
 * from the handle: it is noted when the array is made (a side table: arrays are few and off
 * the fast path).  Once a context has gone away the driver is asked which noted contexts are
 * gone (CUDA_ERROR_CONTEXT_IS_DESTROYED or _INVALID_CONTEXT), and those arrays leave the
 * ledger.  Notes of arrays destroyed one by one are swept when the table doubles. */
typedef struct {
    uint64_t handle, t;        /* the block's key and t_ns: the same array, not a newer one */
    CUcontext ctx;
    UT_hash_handle hh;
} array_ctx_t;
static array_ctx_t *array_ctxs;
static unsigned array_sweep_at = 64;
static pthread_mutex_t array_lock = PTHREAD_MUTEX_INITIALIZER;

static bool block_is(uint64_t addr, uint64_t t)
{
    og_block_t *b = NULL;
    shard_t *s = find_locked(addr, &b);
    if (!s)
        return false;
    bool same = b->t_ns == t;
    og_spin_unlock(&s->lock);
    return same;
}

static void array_note(uint64_t handle, uint64_t t)
{
    og_cfn_cuCtxGetCurrent cur = OG_CALL(cuCtxGetCurrent);
    CUcontext ctx = NULL;
    if (!cur || cur(&ctx) != CUDA_SUCCESS || !ctx)
        return;
    array_ctx_t *n = malloc(sizeof *n), *old, *tmp;
    if (!n)
        return;
    *n = (array_ctx_t){.handle = handle, .t = t, .ctx = ctx};
    pthread_mutex_lock(&array_lock);
    HASH_FIND(hh, array_ctxs, &handle, sizeof handle, old);
    if (old) {
        HASH_DEL(array_ctxs, old);
        free(old);
    }
    HASH_ADD(hh, array_ctxs, handle, sizeof handle, n);
    if (HASH_COUNT(array_ctxs) >= array_sweep_at) {
        HASH_ITER(hh, array_ctxs, old, tmp) {
            if (!block_is(old->handle, old->t)) {
                HASH_DEL(array_ctxs, old);
                free(old);
            }
        }
        array_sweep_at = 2 * HASH_COUNT(array_ctxs) + 64;
    }
    pthread_mutex_unlock(&array_lock);
}

/* A block the driver no longer knows leaves the ledger: addr's block, if it is still the one
 * made at `made` (not a newer one at the same address) and has the flags `need`; its bytes
 * are added to gone_bytes[its device]. */
static void drop_if_same(uint64_t addr, uint64_t made, int need, uint64_t t, uint64_t *gone_bytes)
{
    og_block_t *b = NULL;
    shard_t *s = find_locked(addr, &b);
    if (!s)
        return;
    if (b->t_ns == made && (b->flags & need) == need) {
        HASH_DEL(s->table, b);
        shard_count(s, b, -1);
        if (dev_of(b->device)) {
            shard_tracked_add(s, b->device, -(int64_t)b->size, t);
            gone_bytes[b->device] += b->size;
        }
        block_put(s, b);
    }
    og_spin_unlock(&s->lock);
}

/* Arrays whose context the driver says is gone leave the ledger; gone_bytes per device. */
static void arrays_gone(uint64_t t, uint64_t *gone_bytes)
{
    og_cfn_cuCtxGetApiVersion ver = OG_CALL(cuCtxGetApiVersion);
    if (!ver)
        return;
    pthread_mutex_lock(&array_lock);
    size_t n = HASH_COUNT(array_ctxs), k = 0;
    array_ctx_t *list = n ? malloc(n * sizeof *list) : NULL, *a, *tmp;
    if (list)
        HASH_ITER(hh, array_ctxs, a, tmp) list[k++] = *a;
    pthread_mutex_unlock(&array_lock);
    CUcontext asked = NULL;
    bool dead = false;
    for (size_t i = 0; i < k; i++) {
        if (list[i].ctx != asked) {             /* no lock of ours is held while the driver answers */
            unsigned int v;
            CUresult r = ver(list[i].ctx, &v);
            asked = list[i].ctx;
            dead = r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT;
        }
        if (!dead)
            continue;
        drop_if_same(list[i].handle, list[i].t, OG_KIND_F_ARRAY, t, gone_bytes);
        pthread_mutex_lock(&array_lock);
        HASH_FIND(hh, array_ctxs, &list[i].handle, sizeof list[i].handle, a);
        if (a && a->t == list[i].t) {
            HASH_DEL(array_ctxs, a);
            free(a);
        }
        pthread_mutex_unlock(&array_lock);
    }
    free(list);
}

/* The driver frees a context's cuMemAlloc/cuMemAllocManaged blocks (and arrays) without a
 * free each.  Which blocks were that context's is asked of the driver after the fact: the
 * candidates are copied under the shard locks, then each is looked up with no lock held (a
 * lock of ours never waits on the driver), and those it no longer knows leave the ledger.
 * Arrays are not device pointers: their contexts are asked about (arrays_gone). */
void og_track_blocks_gone(og_call_t *c, int device)
{
    uint64_t t_arr = og_ticks(), arr_bytes[OG_MAX_DEVICES] = {0};
    arrays_gone(t_arr, arr_bytes);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        if (arr_bytes[d])
            history_add(OG_EV_FREE, c->hook, d, arr_bytes[d], og_ledger_tracked(d), t_arr);
    og_cfn_cuPointerGetAttribute attr = OG_CALL(cuPointerGetAttribute);
    if (!attr) {
        if (device >= 0)
            og_track_context_reset(c, device);
        return;
    }
    size_t cap = 64, n = 0;
    for (int i = 0; i < SHARDS; i++)
        cap += atomic_load_explicit(&shards[i].nblocks, memory_order_relaxed);
    struct cand { uint64_t addr, t; } *list = malloc(cap * sizeof *list);
    if (!list)
        return;
    for (int i = 0; i < SHARDS && n < cap; i++) {
        shard_t *s = &shards[i];
        og_spin_lock(&s->lock);
        for (og_block_t *b = s->table; b && n < cap; b = b->hh.next) {
            if (b == &s->sentinel || (b->flags & (OG_KIND_F_ARRAY | OG_KIND_F_IPC)) ||
                (b->kind != OG_KIND_PLAIN && b->kind != OG_KIND_MANAGED) || (device >= 0 && b->device != device))
                continue;
            list[n++] = (struct cand){b->addr, b->t_ns};
        }
        og_spin_unlock(&s->lock);
    }
    uint64_t t = og_ticks(), gone_bytes[OG_MAX_DEVICES] = {0};
    for (size_t k = 0; k < n; k++) {
        CUdeviceptr start;
        if (attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)list[k].addr) == CUDA_SUCCESS)
            continue;                                   /* still there: another context's */
        drop_if_same(list[k].addr, list[k].t, 0, t, gone_bytes);
    }
    free(list);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        if (gone_bytes[d])
            history_add(OG_EV_FREE, c->hook, d, gone_bytes[d], og_ledger_tracked(d), t);
}

void og_track_limit_refusal(og_call_t *c, uint64_t size, int kind)
{
    og_ledger_dev_t *d = dev_of(c->device);
    if (!d)
        return;
    atomic_fetch_add_explicit(&d->failures, 1, memory_order_relaxed);
    history_add(OG_EV_FAIL, c->hook, c->device, size, atomic_load(&d->tracked), og_ticks());
    og_on_oom(c, size, kind, CUDA_ERROR_OUT_OF_MEMORY, true);
}

size_t og_ledger_foreach(og_block_fn fn, void *arg)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        og_spin_lock(&s->lock);
        for (og_block_t *b = s->table; b; b = b->hh.next) {
            if (b == &s->sentinel || (b->flags & OG_KIND_F_IPC))
                continue;                         /* another process's allocation */
            og_block_view_t v = {b->addr, b->size, ticks_to_ns(b->t_ns), b->site, b->device, b->kind, b->hook};
            fn(&v, arg);
            n++;
        }
        og_spin_unlock(&s->lock);
    }
    pthread_mutex_lock(&vmm_lock);
    for (vmm_handle_t *h = vmm_handles; h; h = h->hh.next) {
        og_block_view_t v = {h->handle, h->size, ticks_to_ns(h->t_ns), h->site, h->device, OG_KIND_VMM, OG_H_cuMemCreate};
        fn(&v, arg);
        n++;
    }
    pthread_mutex_unlock(&vmm_lock);
    return n;
}

/* ------------------------------------------------------------------ pools */

/* Every pool the process allocated from, whatever their number.  `reserved` is the last
 * reservation folded into the device's totals.  A pool whose reservation cannot be read
 * (cuMemPoolGetAttribute refused) is counted by what it handed out instead: its blocks carry
 * OG_KIND_F_COUNTED and go into tracked themselves, and the dump says so. */
typedef struct {
    CUmemoryPool pool;
    int device;
    bool unreadable;
    uint64_t reserved;
    UT_hash_handle hh;
} pool_t;
static pool_t *pools;
static atomic_int npools;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t pool_reserved_now(CUmemoryPool pool)
{
    og_cfn_cuMemPoolGetAttribute f = OG_CALL(cuMemPoolGetAttribute);
    cuuint64_t v = 0;
    if (!f || f(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) != CUDA_SUCCESS)
        return UINT64_MAX;
    return v;
}

CUmemoryPool og_device_current_pool(int device)
{
    og_cfn_cuDeviceGetMemPool f = OG_CALL(cuDeviceGetMemPool);
    CUmemoryPool p = NULL;
    if (!f || f(&p, (CUdevice)device) != CUDA_SUCCESS)
        return NULL;
    return p;
}

static pool_t *pool_find(CUmemoryPool pool)
{
    pool_t *p;
    uint64_t k = (uint64_t)(uintptr_t)pool;
    HASH_FIND(hh, pools, &k, sizeof k, p);
    return p;
}

/* Fold a reservation read from the driver into the pool's device.  The driver is asked
 * without pool_lock held (a lock of ours must never wait on the driver); two readers may
 * apply in either order, the next refresh settles it. */
static void pool_apply(CUmemoryPool pool, uint64_t now)
{
    if (now == UINT64_MAX)
        return;
    pthread_mutex_lock(&pool_lock);
    pool_t *p = pool_find(pool);
    if (!p || p->unreadable || now == p->reserved) {
        pthread_mutex_unlock(&pool_lock);
        return;
    }
    int device = p->device;
    int64_t delta = (int64_t)(now - p->reserved);
    p->reserved = now;
    og_ledger_dev_t *d = dev_of(device);
    if (d) {
        atomic_fetch_add(&d->pool_reserved, (uint64_t)delta);
        uint64_t t = og_ticks();
        uint64_t live = tracked_add(d, delta, t);
        history_add(delta > 0 ? OG_EV_POOL_GROW : OG_EV_POOL_SHRINK, OG_H_COUNT, device,
                    (uint64_t)(delta > 0 ? delta : -delta), live, t);
    }
    pthread_mutex_unlock(&pool_lock);
    if (d && delta < 0)
        og_note_free(device, (uint64_t)-delta, OG_SITE_POOL);
}

/* After an allocation from `pool`: registers it and re-reads its reservation.  Returns true
 * when the reservation is unreadable and the block is to be counted itself. */
bool og_track_pool_use(og_call_t *c, CUmemoryPool pool, int device)
{
    if (!pool)
        return false;
    og_exit_arm();
    pthread_mutex_lock(&pool_lock);
    pool_t *p = pool_find(pool);
    if (!p && (p = calloc(1, sizeof *p))) {
        p->pool = pool;
        p->device = device;
        HASH_ADD(hh, pools, pool, sizeof(uint64_t), p);
        atomic_fetch_add(&npools, 1);
    }
    bool unreadable = p && p->unreadable;
    pthread_mutex_unlock(&pool_lock);
    if (!p)
        return false;
    if (unreadable)
        return true;
    uint64_t now = pool_reserved_now(pool);
    if (now == UINT64_MAX) {
        pthread_mutex_lock(&pool_lock);
        if ((p = pool_find(pool)) && !p->unreadable) {
            p->unreadable = true;
            og_ledger_dev_t *d = dev_of(p->device);
            if (d)
                atomic_fetch_add(&d->pools_unreadable, 1);
        }
        pthread_mutex_unlock(&pool_lock);
        return true;
    }
    pool_apply(pool, now);
    og_warn_check(device, og_ledger_tracked(device));
    return false;
}

/* Re-read the reservation of `pool`, or of every pool (NULL); device >= 0: only its pools.
 * Pools give memory back at synchronisation, not only at cuMemPoolTrimTo. */
static void pools_refresh(CUmemoryPool pool, int device)
{
    if (!atomic_load_explicit(&npools, memory_order_relaxed))
        return;
    CUmemoryPool small[64], *list = small;
    int n = 0, cap = 64;
    pthread_mutex_lock(&pool_lock);
    int total = HASH_COUNT(pools);
    if (total > cap && (list = malloc((size_t)total * sizeof *list)))
        cap = total;
    else if (total > cap)
        list = small;
    for (pool_t *p = pools; p && n < cap; p = p->hh.next)
        if ((!pool || p->pool == pool) && (device < 0 || p->device == device) && !p->unreadable)
            list[n++] = p->pool;
    pthread_mutex_unlock(&pool_lock);
    for (int i = 0; i < n; i++)
        pool_apply(list[i], pool_reserved_now(list[i]));
    if (list != small)
        free(list);
}

/* Graph memory nodes take device memory into the device's graph pool, outside every
 * allocation API; the driver says how much it holds.  Read where pools are re-read. */
static void graph_refresh(int device)
{
    og_cfn_cuDeviceGetGraphMemAttribute f = OG_CALL(cuDeviceGetGraphMemAttribute);
    og_ledger_dev_t *d = dev_of(device);
    cuuint64_t now = 0;
    if (!f || !d || f((CUdevice)device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) != CUDA_SUCCESS)
        return;
    uint64_t before = atomic_exchange(&d->graph_reserved, now);
    if (before == now)
        return;
    int64_t delta = (int64_t)(now - before);
    uint64_t t = og_ticks();
    uint64_t live = tracked_add(d, delta, t);
    history_add(delta > 0 ? OG_EV_POOL_GROW : OG_EV_POOL_SHRINK, OG_H_COUNT, device,
                (uint64_t)(delta > 0 ? delta : -delta), live, t);
}

static void graphs_refresh(int device)
{
    if (device >= 0) {
        graph_refresh(device);
        return;
    }
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        if (atomic_load_explicit(&devs[i].seen, memory_order_relaxed))
            graph_refresh(i);
}

void og_track_pool_refresh(CUmemoryPool pool)
{
    pools_refresh(pool, -1);
    if (!pool)
        graphs_refresh(-1);
}
void og_ledger_pools_refresh(int device)
{
    pools_refresh(NULL, device);
    graphs_refresh(device);
}
void og_track_graph_trim(int device) { graph_refresh(device); }

/* Called after a successful cuMemPoolDestroy: the pool's reservation goes with it. */
void og_track_pool_destroy(CUmemoryPool pool)
{
    pthread_mutex_lock(&pool_lock);
    pool_t *p = pool_find(pool);
    if (p) {
        og_ledger_dev_t *d = dev_of(p->device);
        if (d && p->reserved) {
            atomic_fetch_sub(&d->pool_reserved, p->reserved);
            uint64_t t = og_ticks();
            uint64_t live = tracked_add(d, -(int64_t)p->reserved, t);
            history_add(OG_EV_POOL_SHRINK, OG_H_cuMemPoolDestroy, p->device, p->reserved, live, t);
        }
        if (d && p->unreadable)
            atomic_fetch_sub(&d->pools_unreadable, 1);
        HASH_DEL(pools, p);
        free(p);
        atomic_fetch_sub(&npools, 1);
    }
    pthread_mutex_unlock(&pool_lock);
}

/* What the ledger could not measure on `device`, for the dump's memory.unmeasured. */
bool og_ledger_unmeasured(int device, char *why, size_t n)
{
    og_ledger_dev_t *d = dev_of(device);
    if (!d || !atomic_load(&d->pools_unreadable))
        return false;
    snprintf(why, n, "pools: the reservation of %d stream-ordered pool(s) could not be read; counted the %llu "
             "bytes they handed out instead", atomic_load(&d->pools_unreadable),
             (unsigned long long)atomic_load(&d->pool_counted));
    return true;
}

/* ------------------------------------------------------------------ queries */

void og_ledger_stats(int device, oomguard_device_stats_t *out)
{
    memset(out, 0, sizeof *out);
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    /* pools shrink at synchronisation points we do not hook; not at exit, when the runtime
     * may already have destroyed them */
    if (!atomic_load(&og_exiting)) {
        pools_refresh(NULL, device);
        graph_refresh(device);
    }
    for (int i = 0; i < SHARDS; i++) {
        shard_t *sh = &shards[i];
        og_spin_lock(&sh->lock);
        const shard_dev_t *sd = &sh->dev[device];
        out->plain_bytes += sd->bytes[OG_KIND_PLAIN];
        out->plain_blocks += sd->blocks[OG_KIND_PLAIN];
        out->managed_bytes += sd->bytes[OG_KIND_MANAGED];
        out->managed_blocks += sd->blocks[OG_KIND_MANAGED];
        out->pool_used_bytes += sd->bytes[OG_KIND_POOL];
        out->pool_blocks += sd->blocks[OG_KIND_POOL];
        out->allocs += sd->allocs;
        out->frees += sd->frees;
        if (device == 0) {
            out->host_pinned_bytes += sh->host_bytes;
            out->host_pinned_blocks += sh->host_blocks;
        }
        og_spin_unlock(&sh->lock);
    }
    /* an unreadable pool's reservation is what it handed out */
    out->pool_reserved_bytes = atomic_load(&d->pool_reserved) + atomic_load(&d->pool_counted);
    out->vmm_physical_bytes = atomic_load(&d->vmm_physical);
    out->vmm_handles = atomic_load(&d->vmm_handles);
    out->vmm_mapped_bytes = atomic_load(&d->vmm_mapped);
    /* exact, whatever is still pending in the shards */
    out->tracked_bytes = out->plain_bytes + out->managed_bytes + out->pool_reserved_bytes + out->vmm_physical_bytes +
                         atomic_load(&d->graph_reserved);
    out->peak_tracked_bytes = atomic_load(&d->peak);
    if (out->tracked_bytes > out->peak_tracked_bytes)   /* a rise still pending in a shard */
        out->peak_tracked_bytes = out->tracked_bytes;
    out->allocs += atomic_load(&d->slow_allocs);
    out->frees += atomic_load(&d->slow_frees);
    out->failures = atomic_load(&d->failures);
    out->unknown_frees = atomic_load(&d->unknown_frees);
}

uint64_t og_ledger_tracked(int device)
{
    og_ledger_dev_t *d = dev_of(device);
    return d ? atomic_load_explicit(&d->tracked, memory_order_relaxed) : 0;
}

uint64_t og_ledger_pool_spare(int device)
{
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return 0;
    uint64_t r = atomic_load(&d->pool_reserved), u = atomic_load(&d->pool_used);
    return r > u ? r - u : 0;
}

uint64_t og_ledger_peak_t_ns(int device)
{
    og_ledger_dev_t *d = dev_of(device);
    return d ? ticks_to_ns(atomic_load(&d->peak_t_ns)) : 0;
}

/* ------------------------------------------------------------------ init & fork */

void og_ledger_init(void)
{
    start_ns = og_now_ns();
    start_ticks = og_ticks();
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        atomic_store(&s->lock.v, 0);
        s->sentinel.addr = 0;       /* no allocation has address 0; the hooks never look it up */
        s->sentinel.device = -1;
        HASH_ADD(hh, s->table, addr, sizeof(uint64_t), &s->sentinel);
    }
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&devs[i].sample_lock, NULL);
        devs[i].sample_interval = 3000000;   /* ticks: about 1 ms to start with */
    }
    /* every ring can hold the whole history (allocated when first used: see ring_add) */
    uint32_t per = (uint32_t)og_opt.history;
    for (int i = 0; i < SHARDS; i++)
        shards[i].ring.size = per;
    slow_ring.size = per;
}

void og_ledger_atfork_prepare(void)
{
    pthread_mutex_lock(&pool_lock);
    pthread_mutex_lock(&vmm_lock);
    pthread_mutex_lock(&array_lock);   /* before the shards: array_note takes them under it */
    for (int i = 0; i < SHARDS; i++)
        og_spin_lock(&shards[i].lock);
}

void og_ledger_atfork_parent(void)
{
    for (int i = SHARDS - 1; i >= 0; i--)
        og_spin_unlock(&shards[i].lock);
    pthread_mutex_unlock(&array_lock);
    pthread_mutex_unlock(&vmm_lock);
    pthread_mutex_unlock(&pool_lock);
}

/* A forked child holds none of its parent's device memory (CUDA contexts do not survive
 * fork), so it starts with an empty ledger. */
void og_ledger_atfork_child(void)
{
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &shards[i];
        og_block_t *b, *tmp;
        HASH_ITER(hh, s->table, b, tmp) {
            if (b == &s->sentinel)
                continue;
            HASH_DEL(s->table, b);
            block_put(s, b);
        }
        atomic_store(&s->nblocks, 0);
    }
    vmm_handle_t *h, *ht;
    HASH_ITER(hh, vmm_handles, h, ht) {
        HASH_DEL(vmm_handles, h);
        free(h);
    }
    vmm_map_t *m, *mt;
    HASH_ITER(hh, vmm_maps, m, mt) {
        HASH_DEL(vmm_maps, m);
        free(m);
    }
    pool_t *pp, *pt;
    HASH_ITER(hh, pools, pp, pt) {
        HASH_DEL(pools, pp);
        free(pp);
    }
    atomic_store(&npools, 0);
    array_ctx_t *ac, *act;
    HASH_ITER(hh, array_ctxs, ac, act) {
        HASH_DEL(array_ctxs, ac);
        free(ac);
    }
    memset(devs, 0, sizeof devs);
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&devs[i].sample_lock, NULL);
        devs[i].sample_interval = 3000000;
    }
    for (int i = 0; i < SHARDS; i++) {
        shard_t *sh = &shards[i];
        sh->host_bytes = sh->host_blocks = 0;
        memset(sh->dev, 0, sizeof sh->dev);
        memset(sh->pending, 0, sizeof sh->pending);
        atomic_store(&sh->ring.head, 0);
        sh->ring.pos = 0;
        if (atomic_load(&sh->ring.ev))
            memset(atomic_load(&sh->ring.ev), 0, sh->ring.size * sizeof(og_event_t));
    }
    pthread_mutex_init(&slow_lock, NULL);
    atomic_store(&slow_ring.head, 0);
    slow_ring.pos = 0;
    if (atomic_load(&slow_ring.ev))
        memset(atomic_load(&slow_ring.ev), 0, slow_ring.size * sizeof(og_event_t));
    start_ns = og_now_ns();
    start_ticks = og_ticks();
    og_ledger_atfork_parent();
}
