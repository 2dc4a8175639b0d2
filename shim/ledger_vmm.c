/* The ledger's VMM part: cuMemCreate handles and their mappings, apart from the hot path
 * (ledger.c).  Physical memory counts from cuMemCreate until the handle is released *and*
 * unmapped (the driver's rule); mappings are kept so an address resolves to its handle.
 * One mutex guards both tables: VMM calls are few and slow (the driver's own cost dwarfs it).
 * Totals go straight to the device (og_tracked_add), events to the slow ring. */
#include "ledger_int.h"

typedef struct {
    uint64_t handle;
    uint64_t size;
    int device;
    int refs; /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
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
        uint64_t live = og_tracked_add(d, -(int64_t)h->size, t);
        og_history_add(OG_EV_FREE, OG_H_cuMemRelease, h->device, h->size, live, t);
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
    if (!h) {
        og_lost(OG_LOST_VMM);
        return;
    }
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
    bool lost = OG_HASH_ADD_FAILED(h);
    pthread_mutex_unlock(&vmm_lock);
    if (lost) {
        free(h);
        og_lost(OG_LOST_VMM);
        return;
    }
    og_ledger_dev_t *d = dev_of(device);
    if (!d)
        return;
    atomic_fetch_add(&d->vmm_physical, size);
    atomic_fetch_add(&d->vmm_handles, 1);
    atomic_fetch_add(&d->slow_allocs, 1);
    uint64_t live = og_tracked_add(d, (int64_t)size, t);
    og_history_add(OG_EV_ALLOC, c->hook, device, size, live, t);
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
    if (!m) {
        og_lost(OG_LOST_VMM);
        return;
    }
    m->va = va;
    m->size = size;
    m->handle = handle;
    pthread_mutex_lock(&vmm_lock);
    vmm_map_t *old;
    HASH_FIND(hh, vmm_maps, &m->va, sizeof(uint64_t), old);
    if (old) { /* cannot happen with a correct driver; keep the newest */
        HASH_DEL(vmm_maps, old);
        free(old);
    }
    HASH_ADD(hh, vmm_maps, va, sizeof(uint64_t), m);
    if (OG_HASH_ADD_FAILED(m)) {
        pthread_mutex_unlock(&vmm_lock);
        free(m);
        og_lost(OG_LOST_VMM);
        return;
    }
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
    if (a < end) { /* anything else inside the range */
        vmm_map_t *m, *tmp;
        HASH_ITER(hh, vmm_maps, m, tmp)
        {
            if (m->va >= va && m->va < end)
                unmap_one(m, t);
        }
    }
    pthread_mutex_unlock(&vmm_lock);
}

size_t og_vmm_foreach(og_block_fn fn, void *arg)
{
    size_t n = 0;
    double rate = og_tick_rate();
    pthread_mutex_lock(&vmm_lock);
    for (vmm_handle_t *h = vmm_handles; h; h = h->hh.next) {
        og_block_view_t v = { h->handle,   h->size,         og_ticks_to_ns_at(h->t_ns, rate), h->site, h->device,
                              OG_KIND_VMM, OG_H_cuMemCreate };
        fn(&v, arg);
        n++;
    }
    pthread_mutex_unlock(&vmm_lock);
    return n;
}

void og_vmm_atfork(int phase)
{
    if (phase == OG_FORK_PREPARE) {
        pthread_mutex_lock(&vmm_lock);
        return;
    }
    if (phase == OG_FORK_CHILD) { /* the child holds no device memory; the lock stays held */
        vmm_handle_t *h, *ht;
        HASH_ITER(hh, vmm_handles, h, ht)
        {
            HASH_DEL(vmm_handles, h);
            free(h);
        }
        vmm_map_t *m, *mt;
        HASH_ITER(hh, vmm_maps, m, mt)
        {
            HASH_DEL(vmm_maps, m);
            free(m);
        }
        return;
    }
    pthread_mutex_unlock(&vmm_lock);
}
