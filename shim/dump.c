/* Failure records.  (The full dump — JSON + text — is built here; see docs/dump-format.md.) */
#include "og.h"

void og_report_failure(const og_episode_t *ep, og_call_t *c)
{
    if (!og_opt.quiet)
        og_log("out of memory: %s of %llu bytes on device %d failed (attempt %d)", og_hooks[ep->hook].name,
               (unsigned long long)ep->requested, ep->device, ep->attempts);
}

void og_report_recovered(const og_episode_t *ep, og_call_t *c)
{
    if (og_opt.verbose)
        og_log("device %d: recovered after %d failed attempt(s); %llu bytes released in between", ep->device,
               ep->attempts, (unsigned long long)ep->released);
}
