/* The ledger's hot path: every live device block, per-device totals and peaks, and a ring of
 * recent events per shard.  VMM (ledger_vmm.c), blocks a context takes with it
 * (ledger_ctx.c) and stream-ordered pools (ledger_pool.c) live apart; ledger_int.h is what
 * they share.
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
#include "ledger_int.h"
#include "unmeasured.h"

#include <stdio.h>
#include <string.h>
#include <sched.h>
#include <time.h>

shard_t og_shards[SHARDS];
og_ledger_dev_t og_devs[OG_MAX_DEVICES];

void og_spin_lock_slow(og_spin_t *l)
{
    for (unsigned spins = 0;; spins++) {
        while (atomic_load_explicit(&l->v, memory_order_relaxed)) {
            if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            } else {
                sched_yield(); /* the holder may have been preempted */
            }
        }
        if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire))
            return;
    }
}

/* ------------------------------------------------------------------ time */

static uint64_t start_ns, start_ticks;
uint64_t og_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
uint64_t og_start_ns(void) { return start_ns; }


/* Nanoseconds per tick, measured now over the process's life.  The tick counter and the clock
 * are read as a pair, tick-clock-tick, and the pair with the least time between its two ticks of
 * three is kept: a preemption between the reads would skew the rate, and with it every gap the
 * history shows (the growth and load rules read those gaps).  One rate converts a whole copy, so
 * events of different rings keep their order and their spacing. */
double og_tick_rate(void)
{
    if (OG_TICKS_ARE_NS)
        return 1.0;
    uint64_t best = UINT64_MAX, now_t = 0, now_ns = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t a = og_ticks(), ns = og_now_ns(), b = og_ticks();
        if (b >= a && b - a < best)
            best = b - a, now_t = a + (b - a) / 2, now_ns = ns;
    }
    return now_t > start_ticks + 1000000 && now_ns > start_ns
               ? (double)(now_ns - start_ns) / (double)(now_t - start_ticks)
               : 1.0 / 3.0; /* too early to tell: assume 3 GHz */
}

uint64_t og_ticks_to_ns_at(uint64_t ticks, double rate)
{
    if (OG_TICKS_ARE_NS || !ticks)
        return ticks;
    double rel = ((double)ticks - (double)start_ticks) * rate;
    return start_ns + (uint64_t)(rel > 0 ? rel : 0);
}

uint64_t og_ticks_to_ns(uint64_t ticks) { return og_ticks_to_ns_at(ticks, og_tick_rate()); }

/* A lock taken by a reader that must not wait for good (the holder may have died holding it):
 * false after `ns` nanoseconds without it. */
static bool lock_within(og_spin_t *l, uint64_t ns)
{
    if (OG_LIKELY(!atomic_exchange_explicit(&l->v, 1, memory_order_acquire)))
        return true;
    uint64_t give_up = og_now_ns() + ns;
    while (atomic_load_explicit(&l->v, memory_order_relaxed) ||
           atomic_exchange_explicit(&l->v, 1, memory_order_acquire)) {
        if (og_now_ns() > give_up)
            return false;
        sched_yield();
    }
    return true;
}

/* ------------------------------------------------------------------ history rings */

/* Each shard keeps its own ring (written under the shard lock); VMM, pools and failures go
 * to one more ring with its own lock.  A dump merges them by time.
 *
 * OOMGUARD_HISTORY bounds the events of the whole process, not of each ring: the rings take
 * their buffers, when their first thread arrives, from a budget of twice OOMGUARD_HISTORY
 * events, each min(OOMGUARD_HISTORY, half of what is left) and at least 16.  The first
 * allocating thread keeps OOMGUARD_HISTORY events (a single-threaded program sees all it
 * did before), the next ones half as many each; in all at most 2 x OOMGUARD_HISTORY + 16 x 65
 * events of 32 bytes.  The buffer is allocated with no lock held; without memory the ring
 * keeps only its newest event (counted in og_ledger_lost). */
static ring_t slow_ring;
static pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int64_t history_left;

static void ring_init(ring_t *r)
{
    r->own.size = 1;
    r->pos = 0;
    atomic_store(&r->claimed, 0);
    atomic_store(&r->head, 0);
    atomic_store_explicit(&r->buf, (ring_buf_t *)&r->own, memory_order_release);
}

/* A buffer for `r`, installed under `lock` (a shard's) or `mutex` (the slow ring's). */
static __attribute__((noinline)) void ring_provide(ring_t *r, og_spin_t *lock, pthread_mutex_t *mutex)
{
    if (atomic_load_explicit(&r->claimed, memory_order_relaxed) || atomic_exchange(&r->claimed, 1))
        return;
    int64_t h = og_opt.history, left = atomic_load(&history_left), want;
    do {
        want = left / 2 < h ? left / 2 : h;
        if (want < 16)
            want = 16;
    } while (!atomic_compare_exchange_weak(&history_left, &left, left - want));
    ring_buf_t *rb = calloc(1, sizeof *rb + (size_t)want * sizeof(og_event_t));
    if (!rb) {
        atomic_fetch_add(&history_left, want);
        og_lost(OG_LOST_HISTORY);
        return;
    }
    rb->size = (uint32_t)want;
    if (lock)
        og_spin_lock(lock);
    else
        pthread_mutex_lock(mutex);
    r->pos = (uint32_t)(atomic_load_explicit(&r->head, memory_order_relaxed) % rb->size);
    atomic_store_explicit(&r->buf, rb, memory_order_release);
    if (lock)
        og_spin_unlock(lock);
    else
        pthread_mutex_unlock(mutex);
}

/* Inlined into the allocation and free paths (a call and its saved registers cost as much
 * as the stores themselves). */
static inline __attribute__((always_inline)) void ring_add(ring_t *r, int op, int hook, int device, uint64_t bytes,
                                                           uint64_t live, uint64_t t)
{
    ring_buf_t *rb = atomic_load_explicit(&r->buf, memory_order_relaxed);
    uint64_t i = atomic_load_explicit(&r->head, memory_order_relaxed);
    og_event_t *e = &rb->ev[r->pos];
    r->pos = r->pos + 1 == rb->size ? 0 : r->pos + 1;
    atomic_thread_fence(memory_order_release); /* head = i (the last event's) before this one's fields */
    atomic_store_explicit(&e->t_ns, t, memory_order_relaxed);
    atomic_store_explicit(&e->bytes, bytes, memory_order_relaxed);
    atomic_store_explicit(&e->live, live, memory_order_relaxed);
    atomic_store_explicit(&e->device, (int16_t)device, memory_order_relaxed);
    atomic_store_explicit(&e->op, (uint8_t)op, memory_order_relaxed);
    atomic_store_explicit(&e->hook, (uint8_t)hook, memory_order_relaxed);
    atomic_store_explicit(&r->head, i + 1, memory_order_release);
}

void og_history_add(int op, int hook, int device, uint64_t bytes, uint64_t live, uint64_t t)
{
    if (OG_UNLIKELY(!atomic_load_explicit(&slow_ring.claimed, memory_order_relaxed)))
        ring_provide(&slow_ring, NULL, &slow_lock);
    pthread_mutex_lock(&slow_lock);
    ring_add(&slow_ring, op, hook, device, bytes, live, t);
    pthread_mutex_unlock(&slow_lock);
}

/* Copies the ring's events after `n` in out.  locked: no writer can be at work on it (its lock
 * is held), every event is kept; otherwise the ones a write begun meanwhile may have reached
 * are dropped: those with index + size <= head after the copy (the oldest). */
static size_t ring_copy(ring_t *r, bool locked, og_history_event_t *out, size_t n, size_t max)
{
    ring_buf_t *rb = atomic_load_explicit(&r->buf, memory_order_acquire);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    uint64_t first = head > rb->size ? head - rb->size : 0;
    size_t start = n;
    for (uint64_t i = first; i < head && n < max; i++) {
        og_event_t *e = &rb->ev[i % rb->size];
        out[n++] = (og_history_event_t){ atomic_load_explicit(&e->t_ns, memory_order_relaxed),
                                         atomic_load_explicit(&e->bytes, memory_order_relaxed),
                                         atomic_load_explicit(&e->live, memory_order_relaxed),
                                         atomic_load_explicit(&e->device, memory_order_relaxed),
                                         atomic_load_explicit(&e->op, memory_order_relaxed),
                                         atomic_load_explicit(&e->hook, memory_order_relaxed) };
    }
    atomic_thread_fence(memory_order_acquire);
    uint64_t now = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint64_t valid_from = now >= rb->size ? now - rb->size + 1 : 0;
    if (!locked && valid_from > first) {
        size_t drop = valid_from - first < n - start ? (size_t)(valid_from - first) : n - start;
        memmove(out + start, out + start + drop, (n - start - drop) * sizeof *out);
        n -= drop;
    }
    return n; /* stamps still in ticks: og_history_copy converts them all with one rate */
}

static int cmp_event_t(const void *a, const void *b)
{
    const og_history_event_t *x = a, *y = b;
    return (x->t_ns > y->t_ns) - (x->t_ns < y->t_ns);
}

/* The newest OOMGUARD_HISTORY events of the process, oldest first, and never more than
 * OG_DUMP_EVENTS: a dump's history is bounded by size (about 100 bytes of JSON an event),
 * whatever OOMGUARD_HISTORY is; memory.unmeasured says when events were left out. */
#define OG_DUMP_EVENTS 65536
size_t og_history_copy(og_history_event_t *out, size_t max)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        bool locked = lock_within(&s->lock, 1000000000);
        n = ring_copy(&s->ring, locked, out, n, max);
        if (locked)
            og_spin_unlock(&s->lock);
    }
    bool locked = false;
    for (uint64_t give_up = og_now_ns() + 1000000000; !locked && og_now_ns() < give_up; sched_yield())
        locked = pthread_mutex_trylock(&slow_lock) == 0;
    n = ring_copy(&slow_ring, locked, out, n, max);
    if (locked)
        pthread_mutex_unlock(&slow_lock);
    qsort(out, n, sizeof *out, cmp_event_t); /* by tick: the order they happened in */
    double rate = og_tick_rate();            /* to nanoseconds with no lock held, all at one rate */
    for (size_t i = 0; i < n; i++)
        out[i].t_ns = og_ticks_to_ns_at(out[i].t_ns, rate);
    size_t keep = (size_t)og_opt.history < OG_DUMP_EVENTS ? (size_t)og_opt.history : OG_DUMP_EVENTS;
    if (n > keep) {
        memmove(out, out + (n - keep), keep * sizeof *out);
        n = keep;
    }
    return n;
}

/* Events the rings hold now (what og_history_copy chooses from). */
static uint64_t history_held(void)
{
    uint64_t n = 0;
    for (int i = 0; i <= SHARDS; i++) {
        ring_t *r = i < SHARDS ? &og_shards[i].ring : &slow_ring;
        uint64_t head = atomic_load(&r->head), size = atomic_load(&r->buf)->size;
        n += head < size ? head : size;
    }
    return n;
}

size_t og_history_capacity(void)
{
    size_t n = atomic_load(&slow_ring.buf)->size;
    for (int i = 0; i < SHARDS; i++)
        n += atomic_load(&og_shards[i].ring.buf)->size;
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

static void sample(og_ledger_dev_t *d, uint64_t live, uint64_t t)
{
    atomic_store_explicit(&d->seen, 1, memory_order_relaxed); /* its graph memory is re-read */
    if (pthread_mutex_trylock(&d->sample_lock) != 0)
        return; /* someone is sampling this device right now: enough */
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
    double rate = og_tick_rate();
    pthread_mutex_lock(&d->sample_lock);
    size_t n = (size_t)d->nsamples < max ? (size_t)d->nsamples : max;
    for (size_t i = 0; i < n; i++) {
        out[i].t_ns = og_ticks_to_ns_at(d->samples[i].t_ns, rate);
        out[i].live = d->samples[i].live;
    }
    pthread_mutex_unlock(&d->sample_lock);
    return n;
}

__attribute__((noinline)) void og_peak_raise(og_ledger_dev_t *d, uint64_t now, uint64_t t)
{
    uint64_t peak = atomic_load_explicit(&d->peak, memory_order_relaxed);
    while (now > peak) {
        if (atomic_compare_exchange_weak_explicit(&d->peak, &peak, now, memory_order_relaxed, memory_order_relaxed)) {
            atomic_store_explicit(&d->peak_t_ns, t, memory_order_relaxed);
            break;
        }
    }
}

uint64_t og_tracked_add(og_ledger_dev_t *d, int64_t delta, uint64_t t)
{
    uint64_t now = atomic_fetch_add_explicit(&d->tracked, (uint64_t)delta, memory_order_relaxed) + (uint64_t)delta;
    if (delta > 0 && now > atomic_load_explicit(&d->peak, memory_order_relaxed))
        og_peak_raise(d, now, t);
    if (OG_UNLIKELY(t >= atomic_load_explicit(&d->next_sample, memory_order_relaxed)))
        sample(d, now, t);
    return now; /* callers that grew usage call og_warn_check once their locks are dropped */
}


/* ------------------------------------------------------------------ blocks */

_Atomic uint64_t og_ledger_lost[OG_LOST_COUNT];

static atomic_uint next_shard;
/* The thread's shard and its index (the owner hints name shards by index): NULL until the
 * thread's first allocation; `owner`: the thread counts in its shard's `owners` (its exit
 * flushes the shard). */
static OG_TLS struct {
    shard_t *s;
    int idx;
    bool owner;
} mine;

/* A thread's exit adds what its shard holds batched to the devices' totals (ledger_int.h):
 * without it every thread that ends (a worker pool, a backward pass on a thread of its own)
 * leaves up to OG_BATCH_BYTES per device out of `tracked` and the peak, for good.  The key's
 * value is set once, at the thread's first allocation: a thread that never allocates costs
 * nothing, and the allocation path gains nothing.  The whole of `pending` is added, whoever of
 * the threads sharing the shard made it: it is the shard's, and the totals only ever need
 * every shard's sum.  A flush when a new thread is given the shard instead would need no key,
 * but would leave the batches of the last SHARDS threads out until then, and those of a shard
 * never handed out again for good.  (A thread whose first allocation comes from another
 * library's destructor at its very end, past glibc's rounds of destructors, keeps its batch:
 * one thread's, as before.) */
static pthread_key_t exit_key;
static bool exit_key_ok;

/* Clears a shard's batches into the devices' totals; its lock held.  Not the warnings: the
 * next change that moves a total looks at them. */
static void shard_flush(shard_t *s, uint64_t t)
{
    for (int dv = 0; dv < OG_MAX_DEVICES; dv++)
        if (s->pending[dv]) {
            og_tracked_add(&og_devs[dv], s->pending[dv], t);
            s->pending[dv] = 0;
        }
}

/* The exit key's destructor: the thread is ending (never the main thread's exit()). */
static void shard_release(void *arg)
{
    shard_t *s = arg;
    og_in_shim++; /* a signal handler's CUDA call passes through meanwhile: its shard is locked */
    og_spin_lock(&s->lock);
    shard_flush(s, og_ticks());
    if (s->owners && --s->owners == 0)
        shard_batch_set(s, false); /* the frees left to come from other threads go straight through */
    og_spin_unlock(&s->lock);
    og_in_shim--;
    if (mine.s == s) {
        /* an allocation from a later destructor registers the thread again (and glibc then
         * calls this once more) */
        mine.s = NULL;
        mine.owner = false;
    }
}

static __attribute__((noinline)) void my_shard_first(void)
{
    int k = (int)(atomic_fetch_add(&next_shard, 1) % SHARDS);
    shard_t *s = &og_shards[k];
    ring_provide(&s->ring, &s->lock, NULL); /* no lock of ours held here */
    /* without the key (or memory for its value) the thread batches nothing in a shard of its own */
    bool owner = exit_key_ok && pthread_setspecific(exit_key, s) == 0;
    if (owner) {
        og_spin_lock(&s->lock);
        s->owners++;
        shard_batch_set(s, true);
        og_spin_unlock(&s->lock);
    }
    mine.idx = k;
    mine.owner = owner;
    mine.s = s;
    og_exit_arm(); /* once per thread: the program is running, not starting */
}

static inline shard_t *my_shard(void)
{
    if (OG_UNLIKELY(!mine.s))
        my_shard_first();
    return mine.s;
}

/* Which shard holds a block, as a hint a free reads before it takes any lock: one byte per
 * address hash, written by the allocating thread (only when it changes: a thread reusing its
 * addresses writes nothing), never locked.  A stale or colliding hint costs only the walk of
 * the other shards that a free without hints always did; the shard's table stays the truth. */
#define OWNER_HINTS (1u << 16)
static _Atomic uint8_t owner_hint[OWNER_HINTS];
static inline _Atomic uint8_t *hint_of(uint64_t h) { return &owner_hint[h >> 48]; } /* h: og_addr_mix */
static inline void hint_set(uint64_t h, int shard)
{
    uint8_t k = (uint8_t)shard;
    if (OG_UNLIKELY(atomic_load_explicit(hint_of(h), memory_order_relaxed) != k))
        atomic_store_explicit(hint_of(h), k, memory_order_relaxed);
}

/* The shards the hint did not name, for a block whose hint was overwritten (another block
 * with the same hint slot) or that was allocated before the hint was kept. */
static __attribute__((noinline)) shard_t *find_locked_others(shard_t *tried, uint64_t addr, uint64_t h,
                                                             og_block_t **out)
{
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        if (s == tried || !atomic_load_explicit(&s->nblocks, memory_order_relaxed))
            continue;
        og_spin_lock(&s->lock);
        og_block_t *b = og_table_slot(s, addr, h);
        if (b->addr) {
            *out = b;
            return s;
        }
        og_spin_unlock(&s->lock);
    }
    return NULL;
}

/* Finds addr's block in the shard its hint names (inlined: that is the common case), else in
 * the others.  Returns with that shard locked and *out set, or NULL (nothing locked). */
static inline __attribute__((always_inline)) shard_t *find_locked(uint64_t addr, uint64_t h, og_block_t **out)
{
    shard_t *s = &og_shards[atomic_load_explicit(hint_of(h), memory_order_relaxed) % SHARDS];
    og_spin_lock(&s->lock);
    og_block_t *b = og_table_slot(s, addr, h);
    if (OG_LIKELY(b->addr)) {
        *out = b;
        return s;
    }
    og_spin_unlock(&s->lock);
    return find_locked_others(s, addr, h, out);
}

shard_t *og_block_find_locked(uint64_t addr, og_block_t **out) { return find_locked(addr, og_addr_mix(addr), out); }

/* Backward-shift deletion: the blocks after the emptied slot that would be found sooner from
 * their home slot move into it, so no tombstones and no probe grows longer. */
void og_table_remove_shift(shard_t *s, og_block_t *b)
{
    uint32_t hole = (uint32_t)(b - s->slots), mask = s->mask;
    for (uint32_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        og_block_t *x = &s->slots[j];
        if (!x->addr)
            break;
        uint32_t home = (uint32_t)(og_addr_mix(x->addr) >> s->shift);
        if (((j - home) & mask) >= ((j - hole) & mask)) { /* the hole is on x's probe path */
            s->slots[hole] = *x;
            hole = j;
        }
    }
    s->slots[hole].addr = 0;
}

/* The table doubles at half full.  The allocation is made with the shard's lock dropped (no
 * lock of ours is held across a call that can fail); the table may have changed meanwhile,
 * so the caller looks up again after.  Without memory the table fills up to 7/8, then a
 * block is left untracked (counted in og_ledger_lost). */
bool og_table_ensure_slow(shard_t *s)
{
    uint32_t size = s->mask + 1;
    og_spin_unlock(&s->lock);
    og_block_t *grown = og_line_alloc(2 * (size_t)size * sizeof *grown), *old = NULL;
    if (grown)
        memset(grown, 0, 2 * (size_t)size * sizeof *grown);
    og_spin_lock(&s->lock);
    if (grown && s->mask + 1 == size) {
        old = s->slots;
        s->slots = grown;
        s->mask = 2 * size - 1;
        s->shift--;
        for (uint32_t i = 0; i < size; i++)
            if (old[i].addr)
                *og_table_slot(s, old[i].addr, og_addr_mix(old[i].addr)) = old[i];
        grown = NULL;
    }
    uint64_t n = atomic_load_explicit(&s->nblocks, memory_order_relaxed);
    bool room = n < (s->mask + 1) - (s->mask + 1) / 8;
    if (grown || (old && old != s->first)) {
        og_spin_unlock(&s->lock);
        free(grown); /* another thread grew it first */
        if (old != s->first)
            free(old);
        og_spin_lock(&s->lock);
    }
    return room;
}

/* How a block counts on its device: plain and managed blocks and counted pool blocks are
 * device memory themselves; other pool blocks are inside their pool's reservation. */
static inline bool counts_on_device(const og_block_t *b) { return counts_itself(b->kind, b->flags); }

/* og_block_account for everything but a plain or managed block of a known device: pinned
 * host memory, pool blocks, IPC mappings, blocks of no known device. */
uint64_t og_block_account_rare(shard_t *s, const og_block_t *b, int op, uint64_t t, bool *flushed)
{
    int sign = op == OG_BLOCK_OUT ? -1 : 1;
    if (b->kind == OG_KIND_HOST) {
        s->host_bytes += (uint64_t)sign * b->size;
        s->host_blocks += (uint64_t)sign;
        return 0;
    }
    og_ledger_dev_t *d = dev_of(b->device);
    if (!d)
        return 0;
    if (!(b->flags & OG_KIND_F_IPC)) { /* IPC: mapped here, not allocated */
        shard_dev_t *sd = &s->dev[b->device];
        sd->bytes[b->kind] += (uint64_t)sign * b->size;
        sd->blocks[b->kind] += (uint64_t)sign;
        sd->allocs += op == OG_BLOCK_IN;
    }
    if (b->kind == OG_KIND_POOL)
        atomic_fetch_add_explicit(&d->pool_used, (uint64_t)sign * b->size, memory_order_relaxed);
    if (b->flags & OG_KIND_F_COUNTED)
        atomic_fetch_add_explicit(&d->pool_counted, (uint64_t)sign * b->size, memory_order_relaxed);
    ipc_account(d, b->flags, b->size, sign);
    if (counts_on_device(b))
        return shard_tracked_add(s, b->device, (int64_t)sign * (int64_t)b->size, t, flushed);
    return atomic_load_explicit(&d->tracked, memory_order_relaxed);
}

uint64_t og_ledger_ipc_mapped(int device)
{
    return device >= 0 && device < OG_MAX_DEVICES ? atomic_load(&og_devs[device].ipc_mapped) : 0;
}

/* A block into the caller's shard (an allocation, or one put back), its event (by `ev_hook`,
 * at `t`) in the ring.  The block comes as its fields (from registers, straight into its slot).
 * Returns false when there was no room for it (counted); *flushed: the device's total moved. */
static inline __attribute__((always_inline)) bool block_insert(uint64_t addr, uint64_t size, uint64_t t_ns,
                                                               uint32_t site, int device, int kind, int hook, int flags,
                                                               int op, int ev_hook, uint64_t t, uint64_t *live,
                                                               bool *flushed)
{
    shard_t *s = my_shard();
    uint64_t h = og_addr_mix(addr);
    og_spin_lock(&s->lock);
    if (OG_UNLIKELY(!og_table_ensure(s))) {
        og_spin_unlock(&s->lock);
        og_lost(OG_LOST_BLOCKS);
        return false;
    }
    og_block_t *b = og_table_slot_new(s, addr, h);
    if (OG_UNLIKELY(b->addr))
        /* The driver handed out an address we still hold: its free went by a path we do not
         * see.  The old block is gone; count it out. */
        og_block_account(s, b, OG_BLOCK_OUT, t, flushed);
    *b = (og_block_t){ addr, size, t_ns, site, (int8_t)device, (uint8_t)kind, (uint8_t)hook, (uint8_t)flags };
    *live = og_block_account_fields(s, b, size, device, kind, flags, op, t, flushed);
    if (OG_LIKELY(!(flags & OG_BLOCK_F_RARE)) || /* a mapping is no event */
        ((unsigned)device < OG_MAX_DEVICES && kind != OG_KIND_HOST && !(flags & OG_KIND_F_IPC)))
        ring_add(&s->ring, OG_EV_ALLOC, ev_hook, device, size, *live, t);
    og_spin_unlock(&s->lock);
    hint_set(h, mine.idx);
    return true;
}

/* An allocation's block with its site and device found: every kind (og_track_alloc), and the
 * plain and managed blocks of a device out of the table's range (og_track_plain). */
static __attribute__((noinline)) void track_block(og_call_t *c, uintptr_t addr, uint64_t size, int kind, int flags,
                                                  uint32_t site, int device)
{
    bool rare =
        kind > OG_KIND_MANAGED || (flags & (OG_KIND_F_IPC | OG_KIND_F_COUNTED)) || (unsigned)device >= OG_MAX_DEVICES;
    uint64_t t = og_ticks(), live;
    bool flushed = false;
    int hook = c->hook;
    if (OG_UNLIKELY(!block_insert(addr, size, t, site, device, kind, hook, flags | (rare ? OG_BLOCK_F_RARE : 0),
                                  OG_BLOCK_IN, hook, t, &live, &flushed)))
        return;
    if (OG_LIKELY(!rare) || ((unsigned)device < OG_MAX_DEVICES && kind != OG_KIND_HOST && counts_itself(kind, flags))) {
        /* The warning is looked at when the device's total moves (small allocations are
         * batched: it trails by less than OG_BATCH_BYTES per live thread, as the peak does). */
        if (OG_UNLIKELY(flushed))
            og_warn_check(device, live);
        if (OG_UNLIKELY(atomic_load_explicit(&og_episode_open[device], memory_order_relaxed)))
            og_on_recovered(c, device, size);
    }
    if (OG_UNLIKELY(flags & OG_KIND_F_ARRAY))
        og_array_note(addr, t);
}

void og_track_alloc(og_call_t *c, uintptr_t addr, uint64_t size, int kind)
{
    int flags = kind & OG_KIND_F_MASK;
    kind &= ~OG_KIND_F_MASK;
    if (OG_UNLIKELY(!addr))
        return;                                 /* nothing allocated (and the empty slot's key) */
    uint32_t site = og_site_capture(c->caller); /* before any lock: it may unwind */
    int device = kind == OG_KIND_HOST ? -1 : (c->device >= 0 ? c->device : og_current_device());
    track_block(c, addr, size, kind, flags, site, device);
}

/* og_track_alloc for a plain or managed block (no flags): the allocation's fast path, the
 * block's fields kept in registers from the call to its slot. */
void og_track_plain(og_call_t *c, uintptr_t addr, uint64_t size, int kind)
{
    if (OG_UNLIKELY(!addr))
        return;
    uint32_t site = og_site_capture(c->caller); /* before any lock: it may unwind */
    int device = c->device >= 0 ? c->device : og_current_device();
    if (OG_UNLIKELY((unsigned)device >= OG_MAX_DEVICES)) {
        track_block(c, addr, size, kind, 0, site, device);
        return;
    }
    uint64_t t = og_ticks(), live;
    bool flushed = false;
    int hook = c->hook;
    if (OG_UNLIKELY(!block_insert(addr, size, t, site, device, kind, hook, 0, OG_BLOCK_IN, hook, t, &live, &flushed)))
        return;
    if (OG_UNLIKELY(flushed))
        og_warn_check(device, live);
    if (OG_UNLIKELY(atomic_load_explicit(&og_episode_open[device], memory_order_relaxed)))
        og_on_recovered(c, device, size);
}

/* A free takes the block out of the ledger *before* the real free: once the driver has
 * the address back it may hand it to another thread, whose allocation must not meet our
 * stale entry.  Everything is settled here under one lock, as if the free succeeds (it
 * almost always does); og_free_end undoes it if the real free failed. */
_Static_assert(offsetof(og_taken_t, flags) - offsetof(og_taken_t, addr) == offsetof(og_block_t, flags) &&
                   sizeof(og_block_t) == 32,
               "og_taken_t holds a copy of og_block_t from its addr field on");

void og_free_begin(og_call_t *c, uintptr_t addr, og_taken_t *tk)
{
    og_block_t *b;
    uint64_t h = og_addr_mix(addr);
    shard_t *s = find_locked(addr, h, &b);
    if (!s) {
        tk->found = false;
        tk->settle = true; /* an unknown free, counted after the call */
        tk->addr = addr;
        return;
    }
    uint64_t t = og_ticks();
    /* the block's fields in registers before anything is stored (tk could be anywhere, as
     * far as the compiler knows) */
    uint64_t size = b->size;
    int device = b->device, kind = b->kind, flags = b->flags, hook = c->hook;
    bool flushed;
    uint64_t live = og_block_account_fields(s, b, size, device, kind, flags, OG_BLOCK_OUT, t, &flushed);
    tk->found = true;
    memcpy(&tk->addr, b, sizeof *b);
    og_table_remove(s, b);
    bool device_block = OG_LIKELY(!(flags & OG_BLOCK_F_RARE)) ||
                        ((unsigned)device < OG_MAX_DEVICES && kind != OG_KIND_HOST && !(flags & OG_KIND_F_IPC));
    if (device_block)
        ring_add(&s->ring, OG_EV_FREE, hook, device, size, live, t);
    og_spin_unlock(&s->lock);
    /* a failure open on the device: what this free gives back is counted once it succeeded */
    tk->settle = device_block && OG_UNLIKELY(atomic_load_explicit(&og_episode_open[device], memory_order_relaxed));
}

/* A free the ledger did not know, or one the driver refused (og_free_end: og.h). */
void og_free_end_slow(og_call_t *c, og_taken_t *tk, CUresult r)
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
    /* the real free failed: the block is still allocated; put it back, unchanged (neither an
     * allocation nor a free happened; its event says it is back) */
    uint64_t live;
    bool flushed;
    block_insert(tk->addr, tk->size, tk->t_ns, tk->site, tk->device, tk->kind, tk->hook, tk->flags, OG_BLOCK_BACK,
                 c->hook, og_ticks(), &live, &flushed);
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
    og_history_add(OG_EV_FAIL, c->hook, device, size, atomic_load(&d->tracked), og_ticks());
    c->device = device;
    og_on_oom(c, size, kind, r, false);
}

void og_track_limit_refusal(og_call_t *c, uint64_t size, int kind)
{
    og_ledger_dev_t *d = dev_of(c->device);
    if (!d)
        return;
    atomic_fetch_add_explicit(&d->failures, 1, memory_order_relaxed);
    og_history_add(OG_EV_FAIL, c->hook, c->device, size, atomic_load(&d->tracked), og_ticks());
    og_on_oom(c, size, kind, CUDA_ERROR_OUT_OF_MEMORY, true);
}

/* A reader's lock on a shard (dumps, totals, the exit summary).  A thread that died inside
 * the ledger (killed in the middle, or a signal handler that never returned) may hold one
 * for good: a reader waits at most a second, then leaves the shard out, counted (the dump's
 * memory.unmeasured says so).  Writers hold a shard for a few dozen instructions. */
static bool reader_lock(shard_t *s)
{
    if (OG_LIKELY(lock_within(&s->lock, 1000000000)))
        return true;
    og_lost(OG_LOST_SHARDS);
    return false;
}

size_t og_ledger_foreach(og_block_fn fn, void *arg)
{
    size_t n = 0;
    double rate = og_tick_rate();
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        if (!reader_lock(s))
            continue;
        for (og_block_t *b = s->slots; b <= s->slots + s->mask; b++) {
            if (!b->addr || (b->flags & OG_KIND_F_IPC))
                continue; /* empty, or another process's allocation */
            og_block_view_t v = { b->addr, b->size, og_ticks_to_ns_at(b->t_ns, rate), b->site, b->device,
                                  b->kind, b->hook };
            fn(&v, arg);
            n++;
        }
        og_spin_unlock(&s->lock);
    }
    return n + og_vmm_foreach(fn, arg);
}

/* What the ledger could not keep for lack of host memory, one entry of memory.unmeasured
 * each (the process's counts: the loss is not tied to a device). */
static const struct {
    _Atomic uint64_t *count;
    int what; /* enum og_unmeasured */
    const char *text;
} lost_texts[] = {
    { &og_ledger_lost[OG_LOST_BLOCKS], OG_UM_LEDGER_BLOCKS,
      "ledger: %llu block(s) not tracked (no host memory for the table): their bytes are missing "
      "from the totals and their frees count as unknown" },
    { &og_ledger_lost[OG_LOST_VMM], OG_UM_VMM, "vmm: %llu handle(s) or mapping(s) not tracked (no host memory)" },
    { &og_ledger_lost[OG_LOST_POOLS], OG_UM_POOL_USES,
      "pools: %llu pool use(s) not registered (no host memory): their reservation is not counted" },
    { &og_ledger_lost[OG_LOST_ARRAYS], OG_UM_ARRAYS,
      "arrays: %llu CUDA array(s) not noted with their context (no host memory): they stay in the "
      "ledger after it is gone" },
    { &og_ledger_lost[OG_LOST_HISTORY], OG_UM_HISTORY,
      "history: %llu event ring(s) got no memory; those threads' history holds only their newest "
      "event" },
    { &og_ledger_lost[OG_LOST_SHARDS], OG_UM_LEDGER_BLOCKS,
      "ledger: a shard stayed locked for a second (a thread that died inside "
      "the ledger), %llu time(s): its blocks are missing from those totals" },
    { &og_sites_lost, OG_UM_SITES,
      "sites: %llu allocation(s) left without a site (no host memory for it, or 2^20 sites): shown as unknown" },
};

bool og_ledger_unmeasured(int device, int k, int *what, char *why, size_t n)
{
    size_t nlost = sizeof lost_texts / sizeof *lost_texts;
    *what = k == 0 ? OG_UM_POOLS : k == 1 ? OG_UM_HISTORY : OG_UM_COUNT;
    if (k == 0) {
        og_pool_unmeasured(device, why, n);
        return true;
    }
    if (k == 1) {
        uint64_t held = history_held(), keep = (uint64_t)og_opt.history;
        why[0] = 0;
        if (keep > OG_DUMP_EVENTS && held > OG_DUMP_EVENTS)
            snprintf(why, n, "history: the dump shows the newest %d of the %llu events kept (OOMGUARD_HISTORY=%llu)",
                     OG_DUMP_EVENTS, (unsigned long long)(held < keep ? held : keep), (unsigned long long)keep);
        return true;
    }
    k--;
    if (k < 1 || (size_t)k > nlost)
        return false;
    uint64_t count = atomic_load(lost_texts[k - 1].count);
    *what = lost_texts[k - 1].what;
    why[0] = 0;
    if (count)
        snprintf(why, n, lost_texts[k - 1].text, (unsigned long long)count);
    return true;
}

/* ------------------------------------------------------------------ queries */

/* One shard's counters for `device` (and its pinned host memory when `host`); its lock held. */
static void shard_sum(const shard_t *sh, int device, bool host, oomguard_device_stats_t *out)
{
    const shard_dev_t *sd = &sh->dev[device];
    out->plain_bytes += sd->bytes[OG_KIND_PLAIN];
    out->plain_blocks += sd->blocks[OG_KIND_PLAIN];
    out->managed_bytes += sd->bytes[OG_KIND_MANAGED];
    out->managed_blocks += sd->blocks[OG_KIND_MANAGED];
    out->pool_used_bytes += sd->bytes[OG_KIND_POOL];
    out->pool_blocks += sd->blocks[OG_KIND_POOL];
    out->allocs += sd->allocs;
    out->frees += sd->allocs - sd->blocks[OG_KIND_PLAIN] - sd->blocks[OG_KIND_MANAGED] - sd->blocks[OG_KIND_POOL];
    if (host) {
        out->host_pinned_bytes += sh->host_bytes;
        out->host_pinned_blocks += sh->host_blocks;
    }
}

/* The device-wide figures that are not the shards' (pools, VMM, graph memory, counters);
 * `vmm_physical`: as read with the handles (og_ledger_snapshot), else UINT64_MAX. */
static void device_sum(const og_ledger_dev_t *d, uint64_t vmm_physical, oomguard_device_stats_t *out)
{
    /* an unreadable pool's reservation is what it handed out */
    out->pool_reserved_bytes = atomic_load(&d->pool_reserved) + atomic_load(&d->pool_counted);
    out->vmm_physical_bytes = vmm_physical != UINT64_MAX ? vmm_physical : atomic_load(&d->vmm_physical);
    out->vmm_handles = atomic_load(&d->vmm_handles);
    out->vmm_mapped_bytes = atomic_load(&d->vmm_mapped);
    /* exact, whatever is still pending in the shards */
    out->tracked_bytes = out->plain_bytes + out->managed_bytes + out->pool_reserved_bytes + out->vmm_physical_bytes +
                         atomic_load(&d->graph_reserved);
    out->peak_tracked_bytes = atomic_load(&d->peak);
    if (out->tracked_bytes > out->peak_tracked_bytes) /* a rise still pending in a shard */
        out->peak_tracked_bytes = out->tracked_bytes;
    out->allocs += atomic_load(&d->slow_allocs);
    out->frees += atomic_load(&d->slow_frees);
    out->failures = atomic_load(&d->failures);
    out->unknown_frees = atomic_load(&d->unknown_frees);
}

void og_ledger_stats(int device, oomguard_device_stats_t *out)
{
    /* pools shrink at synchronisation points we do not hook; not at exit, when the runtime
     * may already have destroyed them */
    if (dev_of(device) && !atomic_load(&og_exiting))
        og_ledger_pools_refresh(device);
    og_ledger_counts(device, out);
}

void og_ledger_counts(int device, oomguard_device_stats_t *out)
{
    memset(out, 0, sizeof *out);
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *sh = &og_shards[i];
        if (!reader_lock(sh))
            continue;
        shard_sum(sh, device, device == 0, out);
        og_spin_unlock(&sh->lock);
    }
    device_sum(d, UINT64_MAX, out);
}

/* og_ledger_snapshot's walk of the VMM handles: passes them on and sums the device's. */
typedef struct {
    og_block_fn fn;
    void *arg;
    int device;
    uint64_t vmm_bytes;
} vmm_walk_t;
static void vmm_walk(const og_block_view_t *b, void *arg)
{
    vmm_walk_t *w = arg;
    if (b->device == w->device)
        w->vmm_bytes += b->size;
    if (w->fn)
        w->fn(b, w->arg);
}

/* What a dump compares (totals, by kind, the blocks summed by site and library) read at one
 * moment: every shard locked at once, so the sums agree however many threads allocate meanwhile
 * (they wait for the copy).  VMM handles (rare, under their own lock, taken before the shards
 * by fork's handler) are walked right after, and the device's VMM total is the sum of that walk,
 * so by kind and by block still agree.  `fn` sees every live block (as og_ledger_foreach) and
 * must not call into the shim. */
void og_ledger_snapshot(int device, oomguard_device_stats_t *out, og_block_fn fn, void *arg)
{
    memset(out, 0, sizeof *out);
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    if (!atomic_load(&og_exiting))
        og_ledger_pools_refresh(device);
    double rate = og_tick_rate(); /* before the locks: one clock read, not one per block */
    bool held[SHARDS];
    for (int i = 0; i < SHARDS; i++)
        held[i] = reader_lock(&og_shards[i]);
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        if (!held[i])
            continue;
        shard_sum(s, device, true, out);
        for (og_block_t *b = s->slots; fn && b <= s->slots + s->mask; b++) {
            if (!b->addr || (b->flags & OG_KIND_F_IPC))
                continue; /* empty, or another process's allocation */
            og_block_view_t v = { b->addr, b->size, og_ticks_to_ns_at(b->t_ns, rate), b->site, b->device,
                                  b->kind, b->hook };
            fn(&v, arg);
        }
    }
    for (int i = SHARDS - 1; i >= 0; i--)
        if (held[i])
            og_spin_unlock(&og_shards[i].lock);
    vmm_walk_t w = { fn, arg, device, 0 };
    og_vmm_foreach(vmm_walk, &w);
    device_sum(d, w.vmm_bytes, out);
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
    return d ? og_ticks_to_ns(atomic_load(&d->peak_t_ns)) : 0;
}

/* ------------------------------------------------------------------ consistency (OG_DEBUG) */

#ifdef OG_DEBUG
/* `make OG_DEBUG=1` (the soak builds): the ledger's books checked against each other, with
 * every lock of the ledger held (the fork order), at a moment the caller makes quiet (the
 * soak's program, once its threads are joined, finds this with dlsym).  A shard no live thread
 * owns holds nothing batched.  For each device:
 * the device's total plus what the shards still batch equals the shards' plain and managed
 * bytes plus pools, VMM and graph memory; the shards' pool bytes equal pool_used; in every
 * shard, the table holds nblocks blocks, each found from its home slot.  Returns the number
 * of mismatches, each printed to stderr. */
OG_EXPORT int oomguard_debug_ledger_check(void);
OG_EXPORT int oomguard_debug_ledger_check(void)
{
    int bad = 0;
    og_ledger_atfork_prepare();
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        uint64_t n = 0;
        for (uint32_t k = 0; k <= s->mask; k++) {
            og_block_t *b = &s->slots[k];
            if (!b->addr)
                continue;
            n++;
            if (og_table_slot(s, b->addr, og_addr_mix(b->addr)) != b) {
                fprintf(stderr, "oomguard debug: shard %d: block %#llx not found from its home slot\n", i,
                        (unsigned long long)b->addr);
                bad++;
            }
        }
        if (n != atomic_load(&s->nblocks)) {
            fprintf(stderr, "oomguard debug: shard %d: %llu blocks in the table, nblocks %llu\n", i,
                    (unsigned long long)n, (unsigned long long)atomic_load(&s->nblocks));
            bad++;
        }
        for (int dv = 0; dv < OG_MAX_DEVICES && !s->owners; dv++)
            if (s->pending[dv]) { /* its last thread's exit flushed it, and it batches nothing since */
                fprintf(stderr,
                        "oomguard debug: shard %d: no live thread owns it, yet %lld bytes of device %d wait in it\n", i,
                        (long long)s->pending[dv], dv);
                bad++;
            }
    }
    for (int dv = 0; dv < OG_MAX_DEVICES; dv++) {
        og_ledger_dev_t *d = &og_devs[dv];
        int64_t pending = 0;
        uint64_t blocks = 0, pool = 0;
        for (int i = 0; i < SHARDS; i++) {
            pending += og_shards[i].pending[dv];
            blocks += og_shards[i].dev[dv].bytes[OG_KIND_PLAIN] + og_shards[i].dev[dv].bytes[OG_KIND_MANAGED];
            pool += og_shards[i].dev[dv].bytes[OG_KIND_POOL];
        }
        uint64_t total = atomic_load(&d->tracked) + (uint64_t)pending;
        uint64_t parts = blocks + atomic_load(&d->pool_counted) + atomic_load(&d->pool_reserved) +
                         atomic_load(&d->vmm_physical) + atomic_load(&d->graph_reserved);
        if (total != parts) {
            fprintf(
                stderr,
                "oomguard debug: device %d: tracked %llu + pending %lld != blocks %llu + pools %llu + "
                "counted %llu + vmm %llu + graph %llu\n",
                dv, (unsigned long long)atomic_load(&d->tracked), (long long)pending, (unsigned long long)blocks,
                (unsigned long long)atomic_load(&d->pool_reserved), (unsigned long long)atomic_load(&d->pool_counted),
                (unsigned long long)atomic_load(&d->vmm_physical), (unsigned long long)atomic_load(&d->graph_reserved));
            bad++;
        }
        if (pool != atomic_load(&d->pool_used)) {
            fprintf(stderr, "oomguard debug: device %d: shards' pool blocks %llu != pool_used %llu\n", dv,
                    (unsigned long long)pool, (unsigned long long)atomic_load(&d->pool_used));
            bad++;
        }
    }
    og_ledger_atfork_parent();
    return bad;
}
#endif

/* ------------------------------------------------------------------ init & fork */

void og_ledger_init(void)
{
    start_ns = og_now_ns();
    start_ticks = og_ticks();
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        atomic_store(&s->lock.v, 0);
        s->slots = s->first;
        s->mask = TABLE_FIRST - 1;
        s->shift = 64 - __builtin_ctz(TABLE_FIRST);
        shard_batch_set(s, false); /* until a thread owns it */
    }
    exit_key_ok = pthread_key_create(&exit_key, shard_release) == 0;
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&og_devs[i].sample_lock, NULL);
        og_devs[i].sample_interval = 3000000; /* ticks: about 1 ms to start with */
    }
    for (int i = 0; i < SHARDS; i++)
        ring_init(&og_shards[i].ring);
    ring_init(&slow_ring);
    atomic_store(&history_left, 2 * og_opt.history);
}

void og_ledger_atfork_prepare(void)
{
    og_pool_atfork(OG_FORK_PREPARE);
    og_vmm_atfork(OG_FORK_PREPARE);
    og_ctx_atfork(OG_FORK_PREPARE); /* before the shards: array_note takes them under it */
    for (int i = 0; i < SHARDS; i++)
        og_spin_lock(&og_shards[i].lock);
}

void og_ledger_atfork_parent(void)
{
    for (int i = SHARDS - 1; i >= 0; i--)
        og_spin_unlock(&og_shards[i].lock);
    og_ctx_atfork(OG_FORK_PARENT);
    og_vmm_atfork(OG_FORK_PARENT);
    og_pool_atfork(OG_FORK_PARENT);
}

/* A forked child holds none of its parent's device memory (CUDA contexts do not survive
 * fork), so it starts with an empty ledger. */
void og_ledger_atfork_child(void)
{
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        memset(s->slots, 0, (s->mask + 1) * sizeof *s->slots);
        atomic_store(&s->nblocks, 0);
    }
    og_vmm_atfork(OG_FORK_CHILD);
    og_pool_atfork(OG_FORK_CHILD);
    og_ctx_atfork(OG_FORK_CHILD);
    memset(og_devs, 0, sizeof og_devs);
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&og_devs[i].sample_lock, NULL);
        og_devs[i].sample_interval = 3000000;
    }
    for (int i = 0; i < SHARDS; i++) {
        shard_t *sh = &og_shards[i];
        sh->host_bytes = sh->host_blocks = 0;
        memset(sh->dev, 0, sizeof sh->dev);
        memset(sh->pending, 0, sizeof sh->pending);
        sh->owners = 0; /* the parent's other threads are not here: only this one owns its shard */
        shard_batch_set(sh, false);
        ring_buf_t *rb = atomic_load(&sh->ring.buf); /* the child keeps its parent's buffers, emptied */
        memset(rb->ev, 0, rb->size * sizeof(og_event_t));
        atomic_store(&sh->ring.head, 0);
        sh->ring.pos = 0;
    }
    if (mine.owner) {
        mine.s->owners = 1;
        shard_batch_set(mine.s, true);
    }
    pthread_mutex_init(&slow_lock, NULL);
    ring_buf_t *rb = atomic_load(&slow_ring.buf);
    memset(rb->ev, 0, rb->size * sizeof(og_event_t));
    atomic_store(&slow_ring.head, 0);
    slow_ring.pos = 0;
    start_ns = og_now_ns();
    start_ticks = og_ticks();
    og_ledger_atfork_parent();
}
