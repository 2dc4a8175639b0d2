/* Start-up, fork handling and the public functions of include/oomguard.h. */
#include "og.h"

#include <stdlib.h>
#include <string.h>

OG_TLS int og_in_shim;
atomic_int og_ready;
atomic_int og_exiting;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
    og_ledger_atfork_prepare();
    og_stacks_atfork_prepare();
}
static void atfork_parent(void)
{
    og_stacks_atfork_parent();
    og_ledger_atfork_parent();
}
static void atfork_child(void)
{
    og_stacks_atfork_child();
    og_ledger_atfork_child();
    og_oom_atfork_child();
    og_framework_atfork_child();
    og_dump_atfork_child();
}

static void print_hooks(void)
{
    og_log("hooks (%d):", OG_H_COUNT);
    for (int i = 0; i < OG_H_COUNT; i++) {
        const og_hook_t *h = &og_hooks[i];
        og_log("  %-30s %s since %d%s", h->name, h->lib == OG_LIB_NVML ? "nvml" : "driver", h->since,
               h->ptsz ? " per-thread stream" : "");
    }
}

static void init_once_fn(void)
{
    og_in_shim++;               /* nothing we do here is to be recorded */
    og_options_init();
    og_stacks_init();
    og_ledger_init();
    og_oom_init();
    og_limit_init();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    if (og_opt.verbose) {
        og_log("liboomguard %s loaded", OOMGUARD_VERSION);
        og_options_print();
        print_hooks();
    }
    og_in_shim--;
    atomic_store_explicit(&og_ready, 1, memory_order_release);
}

/* Hooks can run before our constructor (another library's constructor may allocate). */
void og_init_slow(void) { pthread_once(&init_once, init_once_fn); }

__attribute__((constructor)) static void og_constructor(void) { og_init_slow(); }

/* A failure still unrecovered when the process ends gets its stderr summary now. */
__attribute__((destructor)) static void og_destructor(void)
{
    if (atomic_load(&og_ready)) {
        atomic_store(&og_exiting, 1);
        og_in_shim++;
        og_dump_atexit();
        og_summary_atexit();
        og_in_shim--;
    }
}

/* ------------------------------------------------------------------ public API */

OG_EXPORT int oomguard_device_stats(int device, oomguard_device_stats_t *out)
{
    if (!out || device < 0 || device >= OG_MAX_DEVICES)
        return -1;
    og_init_slow();
    og_in_shim++;
    og_ledger_stats(device, out);
    og_in_shim--;
    return 0;
}

OG_EXPORT const char *oomguard_version(void) { return OOMGUARD_VERSION; }
