/* See minitorch.h.  Single-threaded on purpose (a lock around each call would do). */
#include "minitorch.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oomguard.h"

#define MiB         (1024ull * 1024)
#define MIN_SEGMENT (20 * MiB) /* like PyTorch's large-pool segments */
#define ROUND       512

typedef struct block {
    uintptr_t addr;
    size_t size;
    int free;
    struct block *next; /* address order within the segment */
} block_t;

typedef struct segment {
    uintptr_t base;
    size_t size;
    block_t *blocks;
    struct segment *next;
} segment_t;

static segment_t *segments;
static mt_stats_t st;

static size_t round_up(size_t v, size_t m) { return (v + m - 1) / m * m; }

static block_t *best_fit(size_t size, segment_t **seg_out)
{
    block_t *best = NULL;
    for (segment_t *s = segments; s; s = s->next)
        for (block_t *b = s->blocks; b; b = b->next)
            if (b->free && b->size >= size && (!best || b->size < best->size)) {
                best = b;
                *seg_out = s;
            }
    return best;
}

static segment_t *new_segment(size_t size)
{
    void *p = NULL;
    if (cudaMalloc(&p, size) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    segment_t *s = calloc(1, sizeof *s);
    block_t *b = calloc(1, sizeof *b);
    s->base = (uintptr_t)p;
    s->size = size;
    b->addr = s->base;
    b->size = size;
    b->free = 1;
    s->blocks = b;
    s->next = segments;
    segments = s;
    st.reserved += size;
    st.segments++;
    return s;
}

void mt_empty_cache(void)
{
    segment_t **pp = &segments;
    while (*pp) {
        segment_t *s = *pp;
        if (s->blocks->free && !s->blocks->next) {
            cudaFree((void *)s->base);
            st.reserved -= s->size;
            st.segments--;
            *pp = s->next;
            free(s->blocks);
            free(s);
        } else {
            pp = &s->next;
        }
    }
}

void *mt_alloc(size_t bytes)
{
    size_t size = round_up(bytes ? bytes : 1, ROUND);
    segment_t *seg = NULL;
    block_t *b = best_fit(size, &seg);
    if (!b) {
        size_t seg_size = size > MIN_SEGMENT ? round_up(size, 2 * MiB) : MIN_SEGMENT;
        seg = new_segment(seg_size);
        if (!seg) {
            /* like PyTorch: give cached segments back to the driver and try once more */
            st.alloc_retries++;
            mt_empty_cache();
            seg = new_segment(seg_size);
        }
        if (!seg) {
            st.ooms++;
            mt_report_to_oomguard();
            return NULL;
        }
        b = seg->blocks;
    }
    if (b->size - size >= ROUND) { /* split: the rest stays cached */
        block_t *rest = calloc(1, sizeof *rest);
        rest->addr = b->addr + size;
        rest->size = b->size - size;
        rest->free = 1;
        rest->next = b->next;
        b->next = rest;
        b->size = size;
    }
    b->free = 0;
    st.allocated += b->size;
    return (void *)b->addr;
}

void mt_free(void *p)
{
    for (segment_t *s = segments; s; s = s->next) {
        if ((uintptr_t)p < s->base || (uintptr_t)p >= s->base + s->size)
            continue;
        block_t *prev = NULL;
        for (block_t *b = s->blocks; b; prev = b, b = b->next) {
            if (b->addr != (uintptr_t)p)
                continue;
            b->free = 1;
            st.allocated -= b->size;
            if (b->next && b->next->free) { /* merge with the following free block */
                block_t *n = b->next;
                b->size += n->size;
                b->next = n->next;
                free(n);
            }
            if (prev && prev->free) { /* and with the preceding one */
                prev->size += b->size;
                prev->next = b->next;
                free(b);
            }
            return;
        }
    }
}

void mt_stats(mt_stats_t *out)
{
    st.largest_free_block = 0;
    for (segment_t *s = segments; s; s = s->next)
        for (block_t *b = s->blocks; b; b = b->next)
            if (b->free && b->size > st.largest_free_block)
                st.largest_free_block = b->size;
    *out = st;
}

void mt_report_to_oomguard(void)
{
    /* looked up at run time: without the shim this is a no-op */
    int (*report)(const oomguard_framework_stats_t *) =
        (int (*)(const oomguard_framework_stats_t *))dlsym(RTLD_DEFAULT, "oomguard_framework_report");
    if (!report)
        return;
    mt_stats_t s;
    mt_stats(&s);
    int dev = 0;
    cudaGetDevice(&dev);
    oomguard_framework_stats_t f = {
        .struct_size = sizeof f,
        .device = dev,
        .allocated_bytes = s.allocated,
        .reserved_bytes = s.reserved,
        .active_bytes = s.allocated,
        .inactive_split_bytes = s.reserved - s.allocated,
        .largest_free_block_bytes = s.largest_free_block,
        .num_alloc_retries = s.alloc_retries,
        .num_ooms = s.ooms,
        .allocator_settings = getenv("PYTORCH_CUDA_ALLOC_CONF"),
        .source = "minitorch",
    };
    report(&f);
}
