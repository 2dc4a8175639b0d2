/* The ledger's stream-ordered pools and graph memory, apart from the hot path (ledger.c).
 * A pool counts by what it reserves from the device (read from the driver, never with a lock
 * of ours held), with the blocks it hands out kept apart as pool_used; graph memory by what
 * the device's graph pool holds.  Both are re-read where the program synchronises. */
#include "ledger_int.h"

#include <stdio.h>

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
        uint64_t live = og_tracked_add(d, delta, t);
        og_history_add(delta > 0 ? OG_EV_POOL_GROW : OG_EV_POOL_SHRINK, OG_H_COUNT, device,
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
    bool fresh = !p;
    if (!p && (p = calloc(1, sizeof *p))) {
        p->pool = pool;
        p->device = device;
        HASH_ADD(hh, pools, pool, sizeof(uint64_t), p);
        if (OG_HASH_ADD_FAILED(p)) {
            free(p);
            p = NULL;
        } else {
            atomic_fetch_add(&npools, 1);
        }
    }
    bool unreadable = p && p->unreadable;
    pthread_mutex_unlock(&pool_lock);
    if (!p) {
        if (fresh)
            og_lost(OG_LOST_POOLS); /* its reservation is not counted */
        return false;
    }
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
    uint64_t live = og_tracked_add(d, delta, t);
    og_history_add(delta > 0 ? OG_EV_POOL_GROW : OG_EV_POOL_SHRINK, OG_H_COUNT, device,
                   (uint64_t)(delta > 0 ? delta : -delta), live, t);
}

static void graphs_refresh(int device)
{
    if (device >= 0) {
        graph_refresh(device);
        return;
    }
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        if (atomic_load_explicit(&og_devs[i].seen, memory_order_relaxed))
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
            uint64_t live = og_tracked_add(d, -(int64_t)p->reserved, t);
            og_history_add(OG_EV_POOL_SHRINK, OG_H_cuMemPoolDestroy, p->device, p->reserved, live, t);
        }
        if (d && p->unreadable)
            atomic_fetch_sub(&d->pools_unreadable, 1);
        HASH_DEL(pools, p);
        free(p);
        atomic_fetch_sub(&npools, 1);
    }
    pthread_mutex_unlock(&pool_lock);
}

/* The pools' entry of memory.unmeasured on `device` ("" when there is none). */
void og_pool_unmeasured(int device, char *why, size_t n)
{
    og_ledger_dev_t *d = dev_of(device);
    why[0] = 0;
    if (d && atomic_load(&d->pools_unreadable))
        snprintf(why, n,
                 "pools: the reservation of %d stream-ordered pool(s) could not be read; counted the %llu "
                 "bytes they handed out instead",
                 atomic_load(&d->pools_unreadable), (unsigned long long)atomic_load(&d->pool_counted));
}

void og_pool_atfork(int phase)
{
    if (phase == OG_FORK_PREPARE) {
        pthread_mutex_lock(&pool_lock);
        return;
    }
    if (phase == OG_FORK_CHILD) {
        pool_t *pp, *pt;
        HASH_ITER(hh, pools, pp, pt)
        {
            HASH_DEL(pools, pp);
            free(pp);
        }
        atomic_store(&npools, 0);
        return;
    }
    pthread_mutex_unlock(&pool_lock);
}
