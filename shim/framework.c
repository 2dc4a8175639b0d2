/* The framework's own view of its memory, handed in by an adapter (the Python adapter for
 * PyTorch calls oomguard_framework_report() from its out-of-memory observer).  Stored as
 * the latest report; dumps written afterwards use it. */
#include "og.h"
#include "record.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t fw_lock = PTHREAD_MUTEX_INITIALIZER;
static og_framework_view_t fw_view;

OG_EXPORT int oomguard_framework_report(const oomguard_framework_stats_t *s)
{
    /* Adapters built against an older header pass a smaller struct: read what it has. */
    if (!s || s->struct_size < offsetof(oomguard_framework_stats_t, snapshot_path))
        return -1;
    og_framework_view_t v;
    memset(&v, 0, sizeof v);
    v.has = true;
    v.allocated_bytes = s->allocated_bytes;
    v.reserved_bytes = s->reserved_bytes;
    v.active_bytes = s->active_bytes;
    v.inactive_split_bytes = s->inactive_split_bytes;
    v.largest_free_block_bytes = s->largest_free_block_bytes;
    v.private_pool_bytes = s->private_pool_bytes;
    v.num_alloc_retries = s->num_alloc_retries;
    v.num_ooms = s->num_ooms;
    snprintf(v.allocator_settings, sizeof v.allocator_settings, "%s", s->allocator_settings ? s->allocator_settings : "");
    snprintf(v.source, sizeof v.source, "%s", s->source ? s->source : "adapter");
    if (s->struct_size >= offsetof(oomguard_framework_stats_t, snapshot_path) + sizeof s->snapshot_path &&
        s->snapshot_path)
        snprintf(v.snapshot_file, sizeof v.snapshot_file, "%s", s->snapshot_path);
    v.device = (int)s->device;
    pthread_mutex_lock(&fw_lock);
    fw_view = v;
    pthread_mutex_unlock(&fw_lock);
    og_init_slow();
    og_in_shim++;                 /* nothing done while rewriting the dump is recorded */
    og_oom_refresh(v.device);
    og_in_shim--;
    return 0;
}

void og_framework_view_get(og_framework_view_t *out)
{
    pthread_mutex_lock(&fw_lock);
    *out = fw_view;
    pthread_mutex_unlock(&fw_lock);
}

void og_framework_atfork_child(void)
{
    pthread_mutex_init(&fw_lock, NULL);
    memset(&fw_view, 0, sizeof fw_view);
}
