/* The ledger's own header, shared by its files and by nothing else: ledger.c (the hot path:
 * blocks, shards, rings, totals), ledger_vmm.c (VMM handles and mappings), ledger_ctx.c (blocks
 * a context takes with it, CUDA arrays) and ledger_pool.c (stream-ordered pools, graph memory).
 * The types of the live blocks and the shards, and the few inline helpers every path that
 * moves a block's bytes uses, so that each is written once. */
#ifndef OG_LEDGER_INT_H
#define OG_LEDGER_INT_H

#include "og.h"

#include <stdlib.h>

/* MurmurHash3's 64-bit finaliser: addresses differ only in a few middle bits (allocations
 * are 256-byte aligned and close together), and uthash indexes buckets by the low bits; with
 * a weaker mix the chains grow long and uthash stops expanding the table for good. */
static inline unsigned og_hash_ptr(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (unsigned)k;
}
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = og_hash_ptr(*(const uint64_t *)(keyptr)))
/* uthash's table headers and bucket arrays on cache lines of their own: two shards' tables
 * allocated side by side would otherwise share a line that both threads write on every
 * allocation (false sharing measured at ~1 us per pair with two threads). */
static void *og_line_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
#define uthash_malloc(sz) og_line_alloc(sz)
#define uthash_free(ptr, sz) free(ptr)
#include <uthash.h>


#define SHARDS     64
#define SLAB_COUNT 512

typedef struct og_block {
    uint64_t addr;
    uint64_t size;
    uint64_t t_ns;
    uint32_t site;
    int8_t device;                  /* < OG_MAX_DEVICES; int8 keeps the block at 32 bytes + hh */
    uint8_t kind;
    uint8_t hook;
    uint8_t flags;                  /* OG_KIND_F_COUNTED */
    UT_hash_handle hh;
} og_block_t;

/* One event of a ring.  A ring has one writer at a time (its shard's lock) and readers that
 * take no lock (a dump), so the slot is a seqlock made only of atomics: seq is cleared, the
 * fields are written, seq is set to index+1; a reader keeps a slot whose seq reads index+1
 * before and after it copied the fields (the fences order the relaxed accesses in C11). */
typedef struct {
    _Atomic uint64_t seq;            /* index+1 once written; 0 while being written */
    _Atomic uint64_t t_ns, bytes, live;
    _Atomic uint32_t what;           /* device (16 bits) | op (8) | hook (8) */
} og_event_t;

typedef struct {
    _Atomic(og_event_t *) ev;        /* allocated at the ring's first event */
    uint32_t size;
    uint32_t pos;                    /* head % size, kept by the writer: no division per event */
    _Atomic uint64_t head;
} ring_t;

/* Counters live in the shard, under its lock: two threads working on different addresses
 * touch different cache lines.  Only `tracked` (needed for peaks and limits) is shared. */
typedef struct {
    uint64_t bytes[OG_KIND_COUNT], blocks[OG_KIND_COUNT], allocs, frees;
} shard_dev_t;

typedef struct {
    og_spin_t lock;
    og_block_t *table;
    og_block_t *free_list;          /* linked through hh.next */
    ring_t ring;                    /* this shard's recent events */
    uint64_t host_bytes, host_blocks;
    _Atomic uint64_t nblocks;       /* lets a cross-thread free skip empty shards unlocked */
    int64_t pending[OG_MAX_DEVICES];/* small changes not yet added to og_devs[].tracked (see below) */
    og_block_t sentinel;            /* address 0, always in the table: uthash frees a table
                                       that becomes empty and re-creates it on the next add,
                                       which would cost a malloc and two frees per pair */
    shard_dev_t dev[OG_MAX_DEVICES];
} __attribute__((aligned(64))) shard_t;

typedef struct {
    _Atomic uint64_t tracked, peak, peak_t_ns;
    _Atomic uint64_t pool_used;                 /* also in the shards; here for limit checks */
    _Atomic uint64_t pool_counted;              /* blocks of unreadable pools (OG_KIND_F_COUNTED) */
    _Atomic uint64_t ipc_mapped;                /* OG_KIND_F_IPC blocks: mapped, not ours */
    _Atomic uint64_t graph_reserved;            /* the device's graph memory pool, as last read */
    atomic_int seen;                            /* a tracked call named this device */
    atomic_int pools_unreadable;
    _Atomic uint64_t pool_reserved, vmm_physical, vmm_handles, vmm_mapped;
    _Atomic uint64_t slow_allocs, slow_frees, failures, unknown_frees;   /* VMM and rare paths */
    /* usage over the whole run, downsampled: when full, every other sample is dropped and
     * the interval doubles, so 512 points always span the run */
    pthread_mutex_t sample_lock;
    _Atomic uint64_t next_sample;
    uint64_t sample_interval;
    int nsamples;
    struct { uint64_t t_ns, live; } samples[OG_SAMPLES];
} __attribute__((aligned(64))) og_ledger_dev_t;

extern shard_t og_shards[SHARDS];
extern og_ledger_dev_t og_devs[OG_MAX_DEVICES];

/* The hot path stamps events with the CPU's time-stamp counter (a third of the cost of
 * clock_gettime here); stamps are turned into CLOCK_MONOTONIC nanoseconds when read, with
 * a rate measured between start-up and the moment of reading. */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t og_ticks(void) { return __rdtsc(); }
#define OG_TICKS_ARE_NS 0
#else
static inline uint64_t og_ticks(void) { return og_now_ns(); }
#define OG_TICKS_ARE_NS 1
#endif

uint64_t og_ticks_to_ns(uint64_t ticks);
/* tracked += delta; raise the peak when it is passed (ledger.c). */
uint64_t og_tracked_add(og_ledger_dev_t *d, int64_t delta, uint64_t t);
/* An event in the ring of the slow paths (VMM, pools, failures, teardown). */
void og_history_add(int op, int hook, int device, uint64_t bytes, uint64_t live, uint64_t t);
/* addr's block with its shard locked, or NULL (nothing locked). */
shard_t *og_block_find_locked(uint64_t addr, og_block_t **out);

static inline og_ledger_dev_t *dev_of(int device)
{
    return device >= 0 && device < OG_MAX_DEVICES ? &og_devs[device] : NULL;
}

/* The device-wide `tracked` counter is the one line every allocating thread writes; with two
 * threads that write costs more than everything else on the path together.  Small changes
 * are therefore summed per shard (per thread) and added in one step once they reach
 * OG_BATCH_BYTES; an allocation that size or larger goes straight through.  The exact
 * totals are the shards' sums (og_ledger_stats); peaks and warnings may trail by less than
 * OG_BATCH_BYTES per allocating thread.  With OOMGUARD_LIMIT set nothing is batched: the
 * limit is exact. */
#define OG_BATCH_BYTES (4ll << 20)

static inline uint64_t shard_tracked_add(shard_t *s, int device, int64_t delta, uint64_t t)
{
    og_ledger_dev_t *d = &og_devs[device];
    int64_t p = s->pending[device] + delta;
    if (og_limit_active() || p >= OG_BATCH_BYTES || p <= -OG_BATCH_BYTES) {
        s->pending[device] = 0;
        return og_tracked_add(d, p, t);
    }
    s->pending[device] = p;
    return atomic_load_explicit(&d->tracked, memory_order_relaxed) + (uint64_t)p;
}

static inline void block_put(shard_t *s, og_block_t *b)
{
    b->hh.next = s->free_list;
    s->free_list = b;
}

/* Counters of one block entering (sign +1) or leaving (-1) a shard; shard lock held. */
static inline void shard_count(shard_t *s, const og_block_t *b, int sign)
{
    atomic_store_explicit(&s->nblocks, atomic_load_explicit(&s->nblocks, memory_order_relaxed) + (uint64_t)sign,
                          memory_order_relaxed);
    if (b->kind == OG_KIND_HOST) {
        s->host_bytes += (uint64_t)sign * b->size;
        s->host_blocks += (uint64_t)sign;
        return;
    }
    if (b->device < 0 || b->device >= OG_MAX_DEVICES || (b->flags & OG_KIND_F_IPC))
        return;                                   /* IPC: see ipc_account */
    shard_dev_t *sd = &s->dev[b->device];
    sd->bytes[b->kind] += (uint64_t)sign * b->size;
    sd->blocks[b->kind] += (uint64_t)sign;
    if (sign > 0)
        sd->allocs++;
    else
        sd->frees++;
}

/* How a block counts on its device: plain and managed blocks and counted pool blocks are
 * device memory themselves; other pool blocks are inside their pool's reservation. */
static inline bool counts_itself(int kind, int flags)
{
    return !(flags & OG_KIND_F_IPC) && (kind != OG_KIND_POOL || (flags & OG_KIND_F_COUNTED) != 0);
}

/* An IPC mapping entering (+1) or leaving (-1) the ledger: another process's allocation,
 * kept (so that its close is recognised and a dump can say what is mapped) but never
 * counted as this process's memory. */
static inline void ipc_account(og_ledger_dev_t *d, int flags, uint64_t size, int sign)
{
    if (OG_UNLIKELY(flags & OG_KIND_F_IPC) && d)
        atomic_fetch_add_explicit(&d->ipc_mapped, (uint64_t)sign * size, memory_order_relaxed);
}

/* The other ledger files' parts of the shared entry points (ledger.c calls them). */
void og_array_note(uint64_t handle, uint64_t t);          /* ledger_ctx.c */
size_t og_vmm_foreach(og_block_fn fn, void *arg);         /* ledger_vmm.c */
enum og_fork_phase { OG_FORK_PREPARE, OG_FORK_PARENT, OG_FORK_CHILD };
void og_vmm_atfork(int phase);
void og_ctx_atfork(int phase);
void og_pool_atfork(int phase);

#endif
