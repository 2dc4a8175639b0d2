/* The record both analysis unit tests start from (test_diagnose.c, test_remedies.c): one builder, so a new
 * record field gets its neutral value in one place. */
#ifndef OG_ANALYSIS_FIXTURE_H
#define OG_ANALYSIS_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static const og_thresholds_t TH = {
    .frag_share = 0.25, .nonfw_share = 0.20, .growth_min_share = 0.05, .growth_rising_steps = 0.70,
};

/* A PyTorch process on a 24 GiB cc 8.6 card that holds 20 GiB and asks for 2 GiB with 1 GiB free; NVML and the
 * cache not measured.  FW_LIBS is the framework_libs text the test expects. */
static og_record_t *fixture_pytorch_24g(const char *fw_libs)
{
    og_record_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->status = "oom";
    r->framework = OG_FW_PYTORCH;
    snprintf(r->framework_libs, sizeof r->framework_libs, "%s", fw_libs);
    r->visible_devices = 1;
    r->rank = r->local_rank = r->world_size = -1;
    r->event.requested_bytes = 2 * GiB;
    strcpy(r->event.library, "libtorch_cuda.so");
    r->device.total_bytes = 24 * GiB;
    r->device.free_bytes = 1 * GiB;
    r->device.limit_bytes = OG_UNKNOWN;
    r->device.cc_major = 8;
    r->device.cc_minor = 6;
    r->memory.process_tracked_bytes = 20 * GiB;
    r->memory.process_used_bytes = OG_UNKNOWN;
    r->memory.framework_bytes = 20 * GiB;
    r->memory.framework_cached_bytes = OG_UNKNOWN;
    r->memory.non_framework_bytes = OG_UNKNOWN;
    r->memory.context_bytes_estimate = OG_UNKNOWN;
    return r;
}

#endif
