/* OOMGUARD_LIMIT: the per-device memory limit.  Parsed once; none by default. */
#include "og.h"

uint64_t og_limit_bytes(int device)
{
    (void)device;
    return UINT64_MAX;
}
