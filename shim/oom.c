/* Failure episodes: what happens between an out-of-memory result and the framework's
 * next successful allocation on that device.
 *
 * PyTorch's caching allocator reacts to an OOM by freeing every cached segment it does not
 * use and retrying the same size; XLA backs off in smaller steps.  The bytes freed while an
 * episode is open are a direct, driver-level measure of memory the framework held but did
 * not use.  A later success on the device closes the episode as recovered. */
#include "og.h"

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

void og_on_oom(og_call_t *c, uint64_t size, int kind, CUresult r, bool by_limit)
{
    int d = c->device;
    if (d < 0 || d >= OG_MAX_DEVICES)
        return;
    uint32_t site = og_site_capture(c->caller);   /* may unwind: before taking the lock */
    episode_slot_t *s = &slots[d];
    pthread_mutex_lock(&s->lock);
    og_episode_t *ep = &s->ep;
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
    ep->last_t_ns = og_now_ns();
    ep->requested = size;
    ep->result = (int)r;
    ep->by_limit = by_limit;
    ep->released_before_attempt = ep->released;
    og_episode_t snapshot = *ep;
    pthread_mutex_unlock(&s->lock);
    og_limit_refresh_overhead(d);
    /* Written before the failing call returns to the program: a crash right after loses nothing. */
    og_report_failure(&snapshot, c);
}

void og_on_free(int device, uint64_t bytes)
{
    episode_slot_t *s = &slots[device];
    pthread_mutex_lock(&s->lock);
    if (atomic_load(&og_episode_open[device]))
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
        pthread_mutex_unlock(&s->lock);
        return;
    }
    atomic_store(&og_episode_open[device], 0);
    if (!in_window) {
        /* the program went on long after the failure: that failure was final */
        pthread_mutex_unlock(&s->lock);
        og_dump_atexit();
        return;
    }
    og_episode_t snapshot = s->ep;
    snapshot.recovered = true;
    snapshot.recovered_requested = size;
    snapshot.recovered_t_ns = og_now_ns();
    pthread_mutex_unlock(&s->lock);
    og_report_recovered(&snapshot, c);
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
        og_call_t c = {.hook = snapshot.hook, .device = device, .caller = snapshot.caller, .active = false};
        og_report_failure(&snapshot, &c);
    }
}
