/* The ledger's part for blocks that leave without a free: a context reset, destroyed or
 * released takes its cuMemAlloc/cuMemAllocManaged blocks and its CUDA arrays with it.  Off the
 * hot path (ledger.c): the driver is asked which blocks it still knows, with no lock of ours
 * held while it answers. */
#include "ledger_int.h"

void og_track_context_reset(og_call_t *c, int device)
{
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    uint64_t t = og_ticks(), gone = 0;
    for (int i = 0; i < SHARDS; i++) {
        shard_t *s = &og_shards[i];
        og_spin_lock(&s->lock);
        for (uint32_t k = 0; k <= s->mask;) {
            og_block_t *b = &s->slots[k];
            if (!b->addr || b->device != device || (b->flags & (OG_KIND_F_ARRAY | OG_KIND_F_IPC)) ||
                (b->kind != OG_KIND_PLAIN && b->kind != OG_KIND_MANAGED)) {
                k++;
                continue;
            }
            bool flushed;
            og_block_account(s, b, OG_BLOCK_OUT, t, &flushed);
            gone += b->size;
            og_table_remove(s, b); /* another block may have moved into slot k: look again */
        }
        int64_t pending = s->pending[device]; /* settle this shard's batched share */
        s->pending[device] = 0;
        og_spin_unlock(&s->lock);
        if (pending)
            og_tracked_add(d, pending, t);
    }
    og_history_add(OG_EV_FREE, c->hook, device, gone, atomic_load(&d->tracked), t);
}

/* A CUDA array dies with the context it was made in, and no driver call tells that context
 * from the handle: it is noted when the array is made (a side table: arrays are few and off
 * the fast path).  Once a context has gone away the driver is asked which noted contexts are
 * gone (CUDA_ERROR_CONTEXT_IS_DESTROYED or _INVALID_CONTEXT), and those arrays leave the
 * ledger.  Notes of arrays destroyed one by one are swept when the table doubles. */
typedef struct {
    uint64_t handle, t; /* the block's key and t_ns: the same array, not a newer one */
    CUcontext ctx;
    UT_hash_handle hh;
} array_ctx_t;
static array_ctx_t *array_ctxs;
static unsigned array_sweep_at = 64;
static pthread_mutex_t array_lock = PTHREAD_MUTEX_INITIALIZER;

static bool block_is(uint64_t addr, uint64_t t)
{
    og_block_t *b = NULL;
    shard_t *s = og_block_find_locked(addr, &b);
    if (!s)
        return false;
    bool same = b->t_ns == t;
    og_spin_unlock(&s->lock);
    return same;
}

void og_array_note(uint64_t handle, uint64_t t)
{
    og_cfn_cuCtxGetCurrent cur = OG_CALL(cuCtxGetCurrent);
    CUcontext ctx = NULL;
    if (!cur || cur(&ctx) != CUDA_SUCCESS || !ctx)
        return;
    array_ctx_t *n = malloc(sizeof *n), *old, *tmp;
    if (!n) {
        og_lost(OG_LOST_ARRAYS); /* the array stays in the ledger past its context */
        return;
    }
    *n = (array_ctx_t){ .handle = handle, .t = t, .ctx = ctx };
    pthread_mutex_lock(&array_lock);
    HASH_FIND(hh, array_ctxs, &handle, sizeof handle, old);
    if (old) {
        HASH_DEL(array_ctxs, old);
        free(old);
    }
    HASH_ADD(hh, array_ctxs, handle, sizeof handle, n);
    if (OG_HASH_ADD_FAILED(n)) {
        free(n);
        og_lost(OG_LOST_ARRAYS);
    }
    if (HASH_COUNT(array_ctxs) >= array_sweep_at) {
        HASH_ITER(hh, array_ctxs, old, tmp)
        {
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
    shard_t *s = og_block_find_locked(addr, &b);
    if (!s)
        return;
    if (b->t_ns == made && (b->flags & need) == need) {
        bool flushed;
        og_block_account(s, b, OG_BLOCK_OUT, t, &flushed);
        if (dev_of(b->device))
            gone_bytes[b->device] += b->size;
        og_table_remove(s, b);
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
        if (list[i].ctx != asked) { /* no lock of ours is held while the driver answers */
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
    uint64_t t_arr = og_ticks(), arr_bytes[OG_MAX_DEVICES] = { 0 };
    arrays_gone(t_arr, arr_bytes);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        if (arr_bytes[d])
            og_history_add(OG_EV_FREE, c->hook, d, arr_bytes[d], og_ledger_tracked(d), t_arr);
    og_cfn_cuPointerGetAttribute attr = OG_CALL(cuPointerGetAttribute);
    if (!attr) {
        if (device >= 0)
            og_track_context_reset(c, device);
        return;
    }
    size_t cap = 64, n = 0;
    for (int i = 0; i < SHARDS; i++)
        cap += atomic_load_explicit(&og_shards[i].nblocks, memory_order_relaxed);
    struct cand {
        uint64_t addr, t;
    } *list = malloc(cap * sizeof *list);
    if (!list)
        return;
    for (int i = 0; i < SHARDS && n < cap; i++) {
        shard_t *s = &og_shards[i];
        og_spin_lock(&s->lock);
        for (og_block_t *b = s->slots; b <= s->slots + s->mask && n < cap; b++) {
            if (!b->addr || (b->flags & (OG_KIND_F_ARRAY | OG_KIND_F_IPC)) ||
                (b->kind != OG_KIND_PLAIN && b->kind != OG_KIND_MANAGED) || (device >= 0 && b->device != device))
                continue;
            list[n++] = (struct cand){ b->addr, b->t_ns };
        }
        og_spin_unlock(&s->lock);
    }
    uint64_t t = og_ticks(), gone_bytes[OG_MAX_DEVICES] = { 0 };
    for (size_t k = 0; k < n; k++) {
        CUdeviceptr start;
        if (attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)list[k].addr) == CUDA_SUCCESS)
            continue; /* still there: another context's */
        drop_if_same(list[k].addr, list[k].t, 0, t, gone_bytes);
    }
    free(list);
    for (int d = 0; d < OG_MAX_DEVICES; d++)
        if (gone_bytes[d])
            og_history_add(OG_EV_FREE, c->hook, d, gone_bytes[d], og_ledger_tracked(d), t);
}

/* Contexts this process made with cuCtxCreate (every ABI), live, by device.  Each holds device memory of its own that
 * no allocation API reports (the driver's state for it, the modules loaded into it): a thread that makes its own
 * context (pycuda's make_context, a per-thread TensorRT sample) pays it again.  A table of handles says a destroyed
 * context's device; the counts are atomics the capture reads without a lock.  Contexts are few and made rarely: off
 * the fast path.  A handle the table could not keep (no host memory) leaves the device's count unknown. */
typedef struct made_ctx {
    CUcontext ctx;
    int device;
    UT_hash_handle hh;
} made_ctx_t;
static made_ctx_t *made_ctxs;
static _Atomic int64_t made_live[OG_MAX_DEVICES];
static _Atomic bool made_unknown[OG_MAX_DEVICES];

void og_ctx_made(CUcontext ctx, int device)
{
    if (device < 0 || device >= OG_MAX_DEVICES)
        return;
    made_ctx_t *m = malloc(sizeof *m);
    if (!m) {
        atomic_store(&made_unknown[device], true);
        return;
    }
    m->ctx = ctx;
    m->device = device;
    pthread_mutex_lock(&array_lock);
    made_ctx_t *old = NULL;
    HASH_FIND_PTR(made_ctxs, &ctx, old);
    if (old) { /* a handle the driver reuses after a destroy we did not see: the same context, counted once */
        HASH_DEL(made_ctxs, old);
        atomic_fetch_sub(&made_live[old->device], 1);
        free(old);
    }
    HASH_ADD_PTR(made_ctxs, ctx, m);
    if (OG_HASH_ADD_FAILED(m)) { /* the table could not grow: this context's destroy would go unseen */
        free(m);
        atomic_store(&made_unknown[device], true);
    } else
        atomic_fetch_add(&made_live[device], 1);
    pthread_mutex_unlock(&array_lock);
}

void og_ctx_destroyed(CUcontext ctx)
{
    made_ctx_t *m = NULL;
    pthread_mutex_lock(&array_lock);
    HASH_FIND_PTR(made_ctxs, &ctx, m);
    if (m) {
        HASH_DEL(made_ctxs, m);
        atomic_fetch_sub(&made_live[m->device], 1);
    }
    pthread_mutex_unlock(&array_lock);
    free(m);
}

int64_t og_ledger_contexts_made(int device)
{
    if (device < 0 || device >= OG_MAX_DEVICES || atomic_load(&made_unknown[device]))
        return -1;
    int64_t n = atomic_load(&made_live[device]);
    return n < 0 ? 0 : n;
}

void og_ctx_atfork(int phase)
{
    if (phase == OG_FORK_PREPARE) {
        pthread_mutex_lock(&array_lock);
        return;
    }
    if (phase == OG_FORK_CHILD) {
        array_ctx_t *ac, *act;
        HASH_ITER(hh, array_ctxs, ac, act)
        {
            HASH_DEL(array_ctxs, ac);
            free(ac);
        }
        made_ctx_t *m, *mt; /* contexts do not survive fork */
        HASH_ITER(hh, made_ctxs, m, mt)
        {
            HASH_DEL(made_ctxs, m);
            free(m);
        }
        for (int d = 0; d < OG_MAX_DEVICES; d++) {
            atomic_store(&made_live[d], 0);
            atomic_store(&made_unknown[d], false);
        }
        return;
    }
    pthread_mutex_unlock(&array_lock);
}
