/* shim/ledger.c's readers and a shard whose lock will never be released: a thread that died inside
 * the ledger (killed in the middle, or stopped in a signal handler that never returns) leaves it
 * held.  The totals, the dump's snapshot and the walk of the blocks wait at most a second for it,
 * then leave that shard out and count it (memory.unmeasured says so); without that guard they
 * would wait forever (here: the watchdog gives up after 10 s and the test fails).  Once the lock is
 * free again, nothing is left out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "og.h"
#include "ledger_int.h"
#include "unmeasured.h"

#define BLOCK_ADDR 0x7f1234560000ull
#define BLOCK_SIZE (3ull << 20)

static shard_t *stuck;

/* A thread that takes the block's shard lock and ends without giving it back. */
static void *die_holding(void *arg)
{
    og_spin_lock(&stuck->lock);
    return NULL;
}

static void track_block(void)
{
    og_call_t c = { .hook = 0, .device = 0, .caller = NULL, .active = true };
    og_track_alloc(&c, BLOCK_ADDR, BLOCK_SIZE, OG_KIND_PLAIN);
    og_block_t *b = NULL;
    stuck = og_block_find_locked(BLOCK_ADDR, &b);
    assert_non_null(stuck);
    assert_non_null(b);
    og_spin_unlock(&stuck->lock);
}

typedef struct {
    int what; /* 0 totals, 1 snapshot, 2 walk */
    oomguard_device_stats_t out;
    size_t blocks;
    double seconds;
} reader_t;

static void count_block(const og_block_view_t *b, void *arg)
{
    if (b->addr == BLOCK_ADDR)
        ++*(size_t *)arg;
}

static void *read_ledger(void *arg)
{
    reader_t *r = arg;
    uint64_t t0 = og_now_ns();
    if (r->what == 0)
        og_ledger_counts(0, &r->out);
    else if (r->what == 1)
        og_ledger_snapshot(0, &r->out, count_block, &r->blocks);
    else
        og_ledger_foreach(count_block, &r->blocks);
    r->seconds = (double)(og_now_ns() - t0) / 1e9;
    return NULL;
}

/* Runs one reader under a 10 s watchdog; on a hang the lock is released so that the reader ends. */
static bool read_within(reader_t *r)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, read_ledger, r), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    if (pthread_timedjoin_np(t, NULL, &until) == 0)
        return true;
    og_spin_unlock(&stuck->lock);
    pthread_join(t, NULL);
    return false;
}

static bool unmeasured_names_the_shard(void)
{
    char why[512];
    int what;
    for (int k = 0; og_ledger_unmeasured(0, k, &what, why, sizeof why); k++)
        if (strstr(why, "stayed locked for a second") && what == OG_UM_LEDGER_BLOCKS)
            return true;
    return false;
}

static void readers_leave_a_stuck_shard_out(void **state)
{
    track_block();
    reader_t before = { .what = 0 };
    assert_true(read_within(&before));
    assert_int_equal(before.out.plain_bytes, BLOCK_SIZE);
    assert_false(unmeasured_names_the_shard());

    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, die_holding, NULL), 0);
    pthread_join(t, NULL);

    for (int what = 0; what < 3; what++) {
        reader_t r = { .what = what };
        uint64_t lost = atomic_load(&og_ledger_lost[OG_LOST_SHARDS]);
        assert_true(read_within(&r)); /* false: the reader waited for the lock for good */
        assert_true(r.seconds >= 0.9 && r.seconds < 5);
        /* (the live page's publisher, a reader too, may have given up on it meanwhile as well) */
        assert_true(atomic_load(&og_ledger_lost[OG_LOST_SHARDS]) > lost);
        assert_int_equal(r.blocks, 0);          /* the block's shard is left out */
        assert_int_equal(r.out.plain_bytes, 0); /* and its bytes with it */
    }
    assert_true(unmeasured_names_the_shard());

    /* free again: read whole, at once */
    og_spin_unlock(&stuck->lock);
    reader_t after = { .what = 1 };
    assert_true(read_within(&after));
    assert_true(after.seconds < 0.5);
    assert_int_equal(after.out.plain_bytes, BLOCK_SIZE);
    assert_int_equal(after.blocks, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(readers_leave_a_stuck_shard_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
