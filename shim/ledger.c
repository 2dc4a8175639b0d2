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
                sched_yield();           /* the holder may have been preempted */
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


uint64_t og_ticks_to_ns(uint64_t ticks)
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

void og_history_add(int op, int hook, int device, uint64_t bytes, uint64_t live, uint64_t t)
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
        out[n++] = (og_history_event_t){og_ticks_to_ns(t), bytes, live, (int16_t)(what >> 16), (uint8_t)(what >> 8),
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
        n = ring_copy(&og_shards[i].ring, out, n, max);
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
        if (atomic_load(&og_shards[i].ring.ev))
            n += og_shards[i].ring.size;
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
        out[i].t_ns = og_ticks_to_ns(d->samples[i].t_ns);
        out[i].live = d->samples[i].live;
    }
    pthread_mutex_unlock(&d->sample_lock);
    return n;
}

uint64_t og_tracked_add(og_ledger_dev_t *d, int64_t delta, uint64_t t)
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


/* ------------------------------------------------------------------ blocks */

static atomic_uint next_shard;
static OG_TLS int my_shard_idx = -1;

static inline shard_t *my_shard(void)
{
    if (OG_UNLIKELY(my_shard_idx < 0)) {
        my_shard_idx = (int)(atomic_fetch_add(&next_shard, 1) % SHARDS);
        og_exit_arm();          /* once per thread: the program is running, not starting */
    }
    return &og_shards[my_shard_idx];
}

/* The other shards, for a block freed by another thread than the one that allocated it. */
static __attribute__((noinline)) shard_t *find_locked_others(shard_t *mine, uint64_t addr, og_block_t **out)
{
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
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

shard_t *og_block_find_locked(uint64_t addr, og_block_t **out) { return find_locked(addr, out); }

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

uint64_t og_ledger_ipc_mapped(int device)
{
    return device >= 0 && device < OG_MAX_DEVICES ? atomic_load(&og_devs[device].ipc_mapped) : 0;
}

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
                atomic_fetch_sub(&og_devs[old->device].pool_used, old->size);
            if (old->flags & OG_KIND_F_COUNTED)
                atomic_fetch_sub(&og_devs[old->device].pool_counted, old->size);
            ipc_account(&og_devs[old->device], old->flags, old->size, -1);
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
        og_array_note(addr, t);
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
            og_ledger_dev_t *d = &og_devs[b->device];
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

size_t og_ledger_foreach(og_block_fn fn, void *arg)
{
    size_t n = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        og_spin_lock(&s->lock);
        for (og_block_t *b = s->table; b; b = b->hh.next) {
            if (b == &s->sentinel || (b->flags & OG_KIND_F_IPC))
                continue;                         /* another process's allocation */
            og_block_view_t v = {b->addr, b->size, og_ticks_to_ns(b->t_ns), b->site, b->device, b->kind, b->hook};
            fn(&v, arg);
            n++;
        }
        og_spin_unlock(&s->lock);
    }
    return n + og_vmm_foreach(fn, arg);
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
    out->frees += sd->frees;
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
    if (out->tracked_bytes > out->peak_tracked_bytes)   /* a rise still pending in a shard */
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
        og_spin_lock(&sh->lock);
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
    for (int i = 0; i < SHARDS; i++)
        og_spin_lock(&og_shards[i].lock);
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        shard_sum(s, device, true, out);
        for (og_block_t *b = s->table; fn && b; b = b->hh.next) {
            if (b == &s->sentinel || (b->flags & OG_KIND_F_IPC))
                continue;
            og_block_view_t v = {b->addr, b->size, og_ticks_to_ns(b->t_ns), b->site, b->device, b->kind, b->hook};
            fn(&v, arg);
        }
    }
    for (int i = SHARDS - 1; i >= 0; i--)
        og_spin_unlock(&og_shards[i].lock);
    vmm_walk_t w = {fn, arg, device, 0};
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

/* ------------------------------------------------------------------ init & fork */

void og_ledger_init(void)
{
    start_ns = og_now_ns();
    start_ticks = og_ticks();
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        atomic_store(&s->lock.v, 0);
        s->sentinel.addr = 0;       /* no allocation has address 0; the hooks never look it up */
        s->sentinel.device = -1;
        HASH_ADD(hh, s->table, addr, sizeof(uint64_t), &s->sentinel);
    }
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&og_devs[i].sample_lock, NULL);
        og_devs[i].sample_interval = 3000000;   /* ticks: about 1 ms to start with */
    }
    /* every ring can hold the whole history (allocated when first used: see ring_add) */
    uint32_t per = (uint32_t)og_opt.history;
    for (int i = 0; i < SHARDS; i++)
        og_shards[i].ring.size = per;
    slow_ring.size = per;
}

void og_ledger_atfork_prepare(void)
{
    og_pool_atfork(OG_FORK_PREPARE);
    og_vmm_atfork(OG_FORK_PREPARE);
    og_ctx_atfork(OG_FORK_PREPARE);    /* before the shards: array_note takes them under it */
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
        og_block_t *b, *tmp;
        HASH_ITER(hh, s->table, b, tmp) {
            if (b == &s->sentinel)
                continue;
            HASH_DEL(s->table, b);
            block_put(s, b);
        }
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
