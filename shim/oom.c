/* Failure episodes: what happens between an out-of-memory result and the framework's
 * next successful allocation on that device.
 *
 * PyTorch's caching allocator reacts to an OOM by freeing every cached segment it does not
 * use and retrying the same size; XLA backs off in smaller steps.  The bytes freed while an
 * episode is open are a direct, driver-level measure of memory the framework held but did
 * not use.  A later success on the device closes the episode as recovered. */
#include "og.h"
#include "advice_text.h"

#include <string.h>

atomic_int og_episode_open[OG_MAX_DEVICES];

typedef struct {
    pthread_mutex_t lock;
    og_episode_t ep;
} episode_slot_t;

static episode_slot_t slots[OG_MAX_DEVICES];

void og_oom_init(void)
{
    for (int i = 0; i < OG_MAX_DEVICES; i++)
        pthread_mutex_init(&slots[i].lock, NULL);
}

static void refresh_overhead(void *device) { og_limit_refresh_overhead(*(int *)device); }

void og_on_oom(og_call_t *c, uint64_t size, int kind, CUresult r, bool by_limit)
{
    int d = c->device;
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    uint32_t site = og_site_capture(c->caller); /* may unwind: before taking the lock */
    episode_slot_t *s = &slots[d];
    pthread_mutex_lock(&s->lock);
    og_episode_t *ep = &s->ep;
    /* A failure of another size after the program allocated on the device again is a new one:
     * a framework's retry asks for the same size (PyTorch) or backs off without succeeding in
     * between (XLA); a program that caught the error and tried something else starts over.  The
     * episode before it ended unrecovered, which the dump layer reads from the new key. */
    if (atomic_load(&og_episode_open[d]) && ep->allocated_since_attempt && size != ep->requested)
        atomic_store(&og_episode_open[d], 0);
    if (!atomic_load(&og_episode_open[d])) {
        memset(ep, 0, sizeof *ep);
        ep->device = d;
        ep->first_t_ns = og_now_ns();
        ep->first_requested = size;
        ep->hook = c->hook;
        ep->kind = kind;
        ep->caller = c->caller;
        ep->site = site;
        atomic_store(&og_episode_open[d], 1);
    }
    ep->attempts++;
    ep->allocated_since_attempt = false;
    ep->last_t_ns = og_now_ns();
    ep->requested = size;
    ep->requested_known = true; /* the API's argument */
    ep->result = (int)r;
    ep->by_limit = by_limit;
    ep->released_before_attempt = ep->released;
    og_episode_t snapshot = *ep;
    pthread_mutex_unlock(&s->lock);
    if (og_limit_active())
        og_on_alt_stack(refresh_overhead, &d); /* NVML's process list: not on the caller's stack */
    og_live_kick();
    if (c->active)
        og_query_at_failure(d); /* the framework's answer, when asking cannot deadlock */
    /* Written before the failing call returns to the program: a crash right after loses nothing. */
    og_report_failure(&snapshot, c);
}

/* Library of a site if it is already known (never resolved here: a free may hold the ledger's
 * locks, and resolving calls dladdr); the blocks live at the failure were resolved by its dump. */
static int site_lib_known(uint32_t site)
{
    const og_site_t *st = og_site_get(site);
    if (!st)
        return -1;
    uint16_t lib = __atomic_load_n(&st->lib, __ATOMIC_ACQUIRE);
    return lib == OG_LIB_UNRESOLVED ? -1 : lib;
}

/* Did the failing caller's framework free this?  Same library as the failing call, or another
 * library of the same framework (libc10_cuda frees what libtorch_cuda asked for). */
static bool freed_by_failing_framework(const og_episode_t *ep, uint32_t site)
{
    if (site == OG_SITE_POOL)
        return ep->kind == OG_KIND_POOL; /* a pool trimmed after a stream-ordered failure */
    int a = site_lib_known(ep->site), b = site_lib_known(site);
    if (a < 0 || b < 0)
        return false;
    if (a == b)
        return true;
    if (og_lib_class((uint16_t)a) != OG_LIBCLASS_FRAMEWORK || og_lib_class((uint16_t)b) != OG_LIBCLASS_FRAMEWORK)
        return false;
    int fa = og_framework_of(og_lib_name((uint16_t)a), og_lib_name((uint16_t)a));
    return fa == og_framework_of(og_lib_name((uint16_t)b), og_lib_name((uint16_t)b));
}

void og_on_free(int device, uint64_t bytes, uint32_t site)
{
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    /* only the failing framework's own releases, and only inside the retry window: unrelated
     * frees (another thread, another library, much later) are no release "between attempts" */
    if (atomic_load(&og_episode_open[device]) &&
        og_now_ns() - s->ep.last_t_ns <= (uint64_t)og_opt.retry_window_ms * 1000000ull &&
        freed_by_failing_framework(&s->ep, site))
        s->ep.released += bytes;
    pthread_mutex_unlock(&s->lock);
}

void og_on_recovered(og_call_t *c, int device, uint64_t size)
{
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    if (!atomic_load(&og_episode_open[device])) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    uint64_t now = og_now_ns();
    bool in_window = now - s->ep.last_t_ns <= (uint64_t)og_opt.retry_window_ms * 1000000ull;
    if (in_window && size < s->ep.requested / 2) {
        /* a small allocation meanwhile (another thread, a workspace): not the retry */
        s->ep.allocated_since_attempt = true;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    atomic_store(&og_episode_open[device], 0);
    if (!in_window) {
        /* the program went on long after the failure: that failure was final */
        pthread_mutex_unlock(&s->lock);
        og_dump_flush_pending(device);
        return;
    }
    og_episode_t snapshot = s->ep;
    snapshot.recovered = true;
    snapshot.recovered_requested = size;
    snapshot.recovered_t_ns = og_now_ns();
    pthread_mutex_unlock(&s->lock);
    og_report_recovered(&snapshot, c);
}

/* The framework's adapter reported the error it raises to the program (PyTorch calls its
 * out-of-memory observers after its last retry): its release-and-retry is over, so nothing the
 * program allocates later is that failure's recovery.  A program that catches the error and goes
 * on (a smaller batch, a skipped step) was still refused: the failure is final now. */
void og_oom_final(int device)
{
    if (device < 0 || device >= OG_MAX_DEVICES)
        return;
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    bool was = atomic_exchange(&og_episode_open[device], 0);
    pthread_mutex_unlock(&s->lock);
    if (was)
        og_dump_flush_pending(device);
}

void og_oom_atfork_child(void)
{
    for (int i = 0; i < OG_MAX_DEVICES; i++) {
        pthread_mutex_init(&slots[i].lock, NULL);
        atomic_store(&og_episode_open[i], 0);
    }
}

void og_oom_refresh(int device)
{
    if (device < 0 || device >= OG_MAX_DEVICES)
        return;
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    bool open = atomic_load(&og_episode_open[device]);
    og_episode_t snapshot = s->ep;
    pthread_mutex_unlock(&s->lock);
    if (open) {
        og_call_t c = { .hook = snapshot.hook, .device = device, .caller = snapshot.caller, .active = false };
        og_report_failure(&snapshot, &c);
    }
}

/* An adapter reporting a framework failure: was it this driver failure (still open, recent)? */
bool og_oom_open_recent(int device, uint64_t window_ns)
{
    if (device < 0 || device >= OG_MAX_DEVICES)
        return false;
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    bool r = atomic_load(&og_episode_open[device]) && og_now_ns() - s->ep.last_t_ns <= window_ns;
    pthread_mutex_unlock(&s->lock);
    return r;
}
