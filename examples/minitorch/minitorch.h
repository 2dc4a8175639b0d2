/* minitorch: a small caching device allocator that behaves like PyTorch's on the points that
 * matter for out-of-memory failures: it grabs segments from cudaMalloc, splits them into
 * blocks, keeps freed blocks cached instead of returning them, and on a failed cudaMalloc
 * releases every fully free segment and retries once before giving up.  It is what the
 * examples use as "the framework"; run them with OOMGUARD_FRAMEWORK_LIBS=libminitorch.so. */
#ifndef MINITORCH_H
#define MINITORCH_H
#include <stddef.h>
#include <stdint.h>

typedef struct mt_stats {
    uint64_t allocated, reserved, largest_free_block, segments, alloc_retries, ooms;
} mt_stats_t;

void *mt_alloc(size_t bytes); /* NULL on out of memory (after flush + retry) */
void mt_free(void *p);
void mt_empty_cache(void); /* return fully free segments to the driver */
void mt_stats(mt_stats_t *out);
/* Hands the allocator's view to oomguard, as the PyTorch adapter does on an OOM. */
void mt_report_to_oomguard(void);
#endif
