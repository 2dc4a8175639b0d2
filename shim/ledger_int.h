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
 * are 256-byte aligned and close together), and tables index by the low bits; with a weaker
 * mix the probe sequences grow long. */
static inline uint64_t og_hash_ptr(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = (unsigned)og_hash_ptr(*(const uint64_t *)(keyptr)))
/* The side tables (VMM, pools, arrays) use uthash.  Its default answer to a failed malloc is
 * exit(): here a failed add leaves the item out of the table (hh.tbl == NULL), the caller
 * frees it and counts it in og_ledger_lost (the dump's memory.unmeasured). */
#define HASH_NONFATAL_OOM 1
static void *og_line_alloc(size_t n) { return aligned_alloc(64, (n + 63) & ~(size_t)63); }
#define uthash_malloc(sz)    og_line_alloc(sz)
#define uthash_free(ptr, sz) free(ptr)
#include <uthash.h>
/* true when HASH_ADD left `item` out for lack of memory */
#define OG_HASH_ADD_FAILED(item) ((item)->hh.tbl == NULL)

/* The blocks' own tables hash by Fibonacci hashing (one multiplication; the slot is the top
 * bits), which spreads the regular strides of device addresses evenly. */
static inline uint64_t og_addr_mix(uint64_t addr) { return addr * 0x9e3779b97f4a7c15ull; }

/* OG_DEBUG (`make OG_DEBUG=1`, the soak): invariants checked on the way; otherwise nothing. */
#ifdef OG_DEBUG
#include <stdio.h>
#define OG_ASSERT(cond)                                                                              \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "oomguard debug: %s:%d: %s does not hold\n", __FILE__, __LINE__, #cond); \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)
#else
#define OG_ASSERT(cond) ((void)0)
#endif

#define SHARDS      64
#define TABLE_FIRST 16 /* slots every shard has without allocating */

/* A live block, stored in its shard's table itself (open addressing, linear probing):
 * address 0 is an empty slot (no allocation has it; the hooks never look it up). */
typedef struct og_block {
    uint64_t addr;
    uint64_t size;
    uint64_t t_ns;
    uint32_t site;
    int8_t device; /* < OG_MAX_DEVICES, or -1 */
    uint8_t kind;
    uint8_t hook;
    uint8_t flags; /* OG_KIND_F_*, OG_BLOCK_F_RARE */
} og_block_t;
/* Set on a block that is not a plain or managed block of a known device: its accounting is
 * the out-of-line og_block_account_rare (decided once, when the block enters). */
#define OG_BLOCK_F_RARE 0x01

/* One event of a ring.  A ring has one writer at a time (its shard's lock, or the slow ring's)
 * and a reader (a dump) that takes that lock to copy it, but must not wait for good (the holder
 * may have died): without the lock after a second, it copies anyway, and the ring's head is
 * the only sequence number.  The writer fills event i's slot after a release fence (a reader
 * that sees any of it then sees head >= i) and publishes head = i + 1; such a reader re-reads
 * head after its copy (after an acquire fence) and keeps only the events no write begun since
 * can have reached (index + size > head).  32 bytes, four stores. */
typedef struct {
    _Atomic uint64_t t_ns, bytes, live;
    _Atomic int16_t device;
    _Atomic uint8_t op, hook;
} og_event_t;
_Static_assert(sizeof(og_event_t) == 32, "an event is 32 bytes");

/* A ring's events with their count: a reader that loads the buffer gets its size with it. */
typedef struct {
    uint32_t size;
    og_event_t ev[];
} ring_buf_t;

typedef struct {
    _Atomic(ring_buf_t *) buf; /* `own` until the ring has its share of OOMGUARD_HISTORY */
    uint32_t pos;              /* head % buf->size, kept by the writer: no division per event */
    atomic_int claimed;        /* a thread is getting (or got) the ring its buffer */
    _Atomic uint64_t head;
    struct {
        uint32_t size;
        og_event_t ev[1];
    } own; /* laid out as a ring_buf_t of 1: never NULL */
} ring_t;

/* Counters live in the shard, under its lock: two threads working on different addresses
 * touch different cache lines.  Only `tracked` (needed for peaks and limits) is shared.
 * Frees are not counted apart: every block in was an allocation or a put back, every block
 * out a free, so frees = allocs - live blocks (og_ledger_stats). */
typedef struct {
    uint64_t bytes[OG_KIND_COUNT], blocks[OG_KIND_COUNT], allocs;
} shard_dev_t;

typedef struct {
    og_spin_t lock;
    uint32_t mask;     /* table size - 1 (a power of two) */
    uint32_t shift;    /* 64 - log2(table size): a block's home slot is og_addr_mix >> shift */
    og_block_t *slots; /* the table: `first` until it grows */
    ring_t ring;       /* this shard's recent events */
    uint64_t host_bytes, host_blocks;
    _Atomic uint64_t nblocks;        /* blocks in the table; lets a cross-thread free skip empty shards unlocked */
    uint64_t batch_lo, batch_span;   /* pending p is held while |p| < the batch: p + lo <= span (shard_batch_set) */
    uint32_t owners;                 /* live threads whose exit flushes `pending` (see below) */
    int64_t pending[OG_MAX_DEVICES]; /* small changes not yet added to og_devs[].tracked (see below) */
    shard_dev_t dev[OG_MAX_DEVICES];
    og_block_t first[TABLE_FIRST];
} __attribute__((aligned(64))) shard_t;

typedef struct {
    _Atomic uint64_t tracked, peak, peak_t_ns;
    _Atomic uint64_t pool_used;      /* also in the shards; here for limit checks */
    _Atomic uint64_t pool_counted;   /* blocks of unreadable pools (OG_KIND_F_COUNTED) */
    _Atomic uint64_t ipc_mapped;     /* OG_KIND_F_IPC blocks: mapped, not ours */
    _Atomic uint64_t graph_reserved; /* the device's graph memory pool, as last read */
    atomic_int seen;                 /* a tracked call named this device */
    atomic_int pools_unreadable;
    _Atomic uint64_t pool_reserved, vmm_physical, vmm_handles, vmm_mapped;
    _Atomic uint64_t slow_allocs, slow_frees, failures, unknown_frees; /* VMM and rare paths */
    /* usage over the whole run, downsampled: when full, every other sample is dropped and
     * the interval doubles, so 512 points always span the run */
    pthread_mutex_t sample_lock;
    _Atomic uint64_t next_sample;
    uint64_t sample_interval;
    int nsamples;
    struct {
        uint64_t t_ns, live;
    } samples[OG_SAMPLES];
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
/* The rate once (og_tick_rate), then many stamps at it: a copy of many stamps converts them alike. */
double og_tick_rate(void);
uint64_t og_ticks_to_ns_at(uint64_t ticks, double rate);
/* tracked += delta; raise the peak when it is passed (ledger.c). */
void og_peak_raise(og_ledger_dev_t *d, uint64_t now, uint64_t t);
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
 * are therefore summed per shard and added in one step once they reach the shard's `batch`;
 * an allocation that size or larger goes straight through.  A shard batches (OG_BATCH_BYTES)
 * only while a live thread owns it: the thread's first allocation registers it (my_shard_first),
 * and its exit adds what the shard holds to the totals; a shard no live thread owns (its
 * threads exited, or none could register) batches nothing, so the frees other threads make
 * of its blocks go straight through.  The exact totals are the shards' sums (og_ledger_stats);
 * `tracked`, the warnings and the history's `live` trail by less than OG_BATCH_BYTES per live
 * allocating thread (threads sharing a shard count once: at most SHARDS), whatever number of
 * threads came and went; the peak, which adds the allocating thread's own batch, is exact for
 * one live allocating thread and within OG_BATCH_BYTES per other live allocating thread.  With
 * OOMGUARD_LIMIT set nothing is batched (every batch is 1): the limit is exact. */
#define OG_BATCH_BYTES (4ll << 20)

/* A shard's batch: OG_BATCH_BYTES while a live thread owns it (and no limit is set), else 1:
 * every change goes straight through.  Shard lock held (or no other thread running). */
static inline void shard_batch_set(shard_t *s, bool owned)
{
    uint64_t b = owned && !og_limit_active() ? (uint64_t)OG_BATCH_BYTES : 1;
    s->batch_lo = b - 1;
    s->batch_span = 2 * (b - 1);
}

/* *flushed is set when the device's total moved (the warning is checked then, by the caller
 * once its lock is dropped: it trails like the peaks). */
static inline uint64_t shard_tracked_add(shard_t *s, int device, int64_t delta, uint64_t t, bool *flushed)
{
    og_ledger_dev_t *d = &og_devs[device];
    int64_t p = s->pending[device] + delta;
    if ((uint64_t)p + s->batch_lo > s->batch_span) { /* |p| >= the shard's batch, in one comparison */
        s->pending[device] = 0;
        *flushed = true;
        return og_tracked_add(d, p, t);
    }
    s->pending[device] = p;
    /* the peak still sees this thread's batched bytes: exact for one allocating thread (the
     * usual PyTorch job), within OG_BATCH_BYTES per other live allocating thread otherwise; `peak`
     * shares `tracked`'s cache line, so the test costs no miss */
    uint64_t now = atomic_load_explicit(&d->tracked, memory_order_relaxed) + (uint64_t)p;
    if (delta > 0 && OG_UNLIKELY(now > atomic_load_explicit(&d->peak, memory_order_relaxed)))
        og_peak_raise(d, now, t);
    return now;
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

/* The one place a block's bytes are counted, for every path that moves a block: the
 * allocation (OG_BLOCK_IN), a free or anything else that takes it out (OG_BLOCK_OUT: a
 * teardown, an address the driver handed out again) and a block put back after the driver
 * refused its free (OG_BLOCK_BACK: in again, and the free that was counted is undone).
 * Shard lock held.  Returns the device's usage after it, for the event ring; *flushed is set
 * when the device's total moved. */
enum og_block_op { OG_BLOCK_IN, OG_BLOCK_OUT, OG_BLOCK_BACK };
uint64_t og_block_account_rare(shard_t *s, const og_block_t *b, int op, uint64_t t, bool *flushed);
/* The same with the block's fields given (from registers: a store to the shard could be to
 * the block as far as the compiler knows, which would read them again); b for the rare kinds. */
static inline __attribute__((always_inline)) uint64_t og_block_account_fields(shard_t *s, const og_block_t *b,
                                                                              uint64_t size, int device, int kind,
                                                                              int flags, int op, uint64_t t,
                                                                              bool *flushed)
{
    int sign = op == OG_BLOCK_OUT ? -1 : 1;
    atomic_store_explicit(&s->nblocks, atomic_load_explicit(&s->nblocks, memory_order_relaxed) + (uint64_t)sign,
                          memory_order_relaxed);
    /* plain and managed blocks (and arrays) of a known device: the common case, inline */
    if (OG_UNLIKELY(flags & OG_BLOCK_F_RARE))
        return og_block_account_rare(s, b, op, t, flushed);
    shard_dev_t *sd = &s->dev[device];
    OG_ASSERT(sign > 0 || (sd->blocks[kind] > 0 && sd->bytes[kind] >= size));
    sd->bytes[kind] += (uint64_t)sign * size;
    sd->blocks[kind] += (uint64_t)sign;
    sd->allocs += op == OG_BLOCK_IN;
    return shard_tracked_add(s, device, (int64_t)sign * (int64_t)size, t, flushed);
}
static inline __attribute__((always_inline)) uint64_t og_block_account(shard_t *s, const og_block_t *b, int op,
                                                                       uint64_t t, bool *flushed)
{
    return og_block_account_fields(s, b, b->size, b->device, b->kind, b->flags, op, t, flushed);
}

/* The shard's table (ledger.c).  og_table_slot: addr's slot, or the empty slot where it
 * would go; og_table_remove: empties a slot (the blocks after it move up: a slot pointer
 * is not valid after it); og_table_ensure: room for one more block, growing the table with
 * the lock dropped around the allocation — false when there is none (the block is then not
 * tracked, and counted in og_ledger_lost). */
static inline og_block_t *og_table_slot(const shard_t *s, uint64_t addr, uint64_t h)
{
    for (uint32_t i = (uint32_t)(h >> s->shift);; i = (i + 1) & s->mask) {
        og_block_t *b = &s->slots[i];
        if (OG_LIKELY(b->addr == addr) || !b->addr)
            return b;
    }
}
/* The same, for an insertion: the slot is most often empty. */
static inline og_block_t *og_table_slot_new(const shard_t *s, uint64_t addr, uint64_t h)
{
    for (uint32_t i = (uint32_t)(h >> s->shift);; i = (i + 1) & s->mask) {
        og_block_t *b = &s->slots[i];
        if (OG_LIKELY(!b->addr) || b->addr == addr)
            return b;
    }
}
void og_table_remove_shift(shard_t *s, og_block_t *b);
static inline void og_table_remove(shard_t *s, og_block_t *b)
{
    if (OG_LIKELY(!s->slots[(uint32_t)(b - s->slots + 1) & s->mask].addr))
        b->addr = 0; /* the next slot is empty: nothing moves */
    else
        og_table_remove_shift(s, b);
}
bool og_table_ensure_slow(shard_t *s);
static inline bool og_table_ensure(shard_t *s)
{
    uint64_t n = atomic_load_explicit(&s->nblocks, memory_order_relaxed);
    return OG_LIKELY(n < (s->mask + 1) / 2) || og_table_ensure_slow(s);
}

/* Things the ledger could not keep for lack of host memory, and shards it could not read at
 * exit (the dump's memory.unmeasured). */
enum og_lost {
    OG_LOST_BLOCKS,
    OG_LOST_VMM,
    OG_LOST_POOLS,
    OG_LOST_ARRAYS,
    OG_LOST_HISTORY,
    OG_LOST_SHARDS,
    OG_LOST_COUNT
};
extern _Atomic uint64_t og_ledger_lost[OG_LOST_COUNT];
static inline void og_lost(int what) { atomic_fetch_add_explicit(&og_ledger_lost[what], 1, memory_order_relaxed); }

/* The other ledger files' parts of the shared entry points (ledger.c calls them). */
void og_array_note(uint64_t handle, uint64_t t);          /* ledger_ctx.c */
size_t og_vmm_foreach(og_block_fn fn, void *arg);         /* ledger_vmm.c */
void og_pool_unmeasured(int device, char *why, size_t n); /* ledger_pool.c */
enum og_fork_phase { OG_FORK_PREPARE, OG_FORK_PARENT, OG_FORK_CHILD };
void og_vmm_atfork(int phase);
void og_ctx_atfork(int phase);
void og_pool_atfork(int phase);

#endif
