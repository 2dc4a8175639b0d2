/* The history rings: a dump's copy holds a full ring's newest events, all of them when it gets the
 * ring's lock, and leaves out the one slot a writer could be rewriting when it cannot (the
 * holder may have died holding it: the copy goes on after a second without the lock). */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "ledger_int.h"

enum { EXTRA = 10 };

/* OOMGUARD_HISTORY allocations and EXTRA more by this thread, of 1, 2, ... bytes: the thread's
 * ring holds the newest OOMGUARD_HISTORY of them. */
static shard_t *fill(void)
{
    og_call_t c = { .hook = OG_H_cuMemAlloc_v2, .device = 0, .caller = (void *)fill, .active = true };
    size_t n = (size_t)og_opt.history + EXTRA;
    for (size_t i = 0; i < n; i++)
        og_track_plain(&c, 0x7f0000000000ull + i * 4096, i + 1, OG_KIND_PLAIN);
    for (int i = 0; i < SHARDS; i++)
        if (atomic_load(&og_shards[i].ring.head) == n)
            return &og_shards[i];
    return NULL;
}

static void copy_with_and_without_the_lock(void **state)
{
    size_t h = (size_t)og_opt.history, n = h + EXTRA;
    shard_t *s = fill();
    assert_non_null(s);
    og_history_event_t *out = calloc(og_history_capacity(), sizeof *out);
    assert_non_null(out);

    /* the lock had: the whole ring, oldest first */
    size_t got = og_history_copy(out, og_history_capacity());
    assert_int_equal(got, h);
    assert_int_equal(out[0].bytes, n - h + 1);
    assert_int_equal(out[got - 1].bytes, n);
    assert_int_equal(out[got - 1].op, OG_EV_ALLOC);
    assert_int_equal(out[got - 1].hook, OG_H_cuMemAlloc_v2);
    assert_int_equal(out[got - 1].device, 0);
    assert_int_equal(out[got - 1].live, n * (n + 1) / 2);

    /* held by someone else for good: after a second, all but the oldest (its slot is the next
     * one written), the newest still there and in order */
    og_spin_lock(&s->lock);
    got = og_history_copy(out, og_history_capacity());
    og_spin_unlock(&s->lock);
    assert_int_equal(got, h - 1);
    assert_int_equal(out[0].bytes, n - h + 2);
    assert_int_equal(out[got - 1].bytes, n);
    for (size_t i = 1; i < got; i++)
        assert_int_equal(out[i].bytes, out[i - 1].bytes + 1);

    /* free again: all of it */
    assert_int_equal(og_history_copy(out, og_history_capacity()), h);
    free(out);
}

/* The clock as the shim reads it: the kernel's, counted, and 20 ms late on every other read while
 * `jitter` is set (a busy machine preempting the reader between its tick and its clock reads). */
static int clock_reads, jitter;
int clock_gettime(clockid_t id, struct timespec *ts)
{
    int r = (int)syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && jitter && clock_reads % 2) {
        ts->tv_nsec += 20000000;
        ts->tv_sec += ts->tv_nsec / 1000000000;
        ts->tv_nsec %= 1000000000;
    }
    clock_reads++;
    return r;
}

/* Stamps are converted to nanoseconds once per copy, at one rate, after the rings are merged in
 * the order their ticks say: a failure (the slow paths' ring) recorded after allocations (a
 * shard's ring) stays after them however the clock jitters, and a copy reads the clock a few
 * times, not once per event. */
static void one_rate_per_copy(void **state)
{
    usleep(2000); /* past the first million ticks: the rate is measured, not assumed */
    og_call_t c = { .hook = OG_H_cuMemAlloc_v2, .device = 0, .caller = (void *)fill, .active = true };
    for (int i = 0; i < 50; i++)
        og_track_plain(&c, 0x7e0000000000ull + (uint64_t)i * 4096, 4096, OG_KIND_PLAIN);
    og_history_add(OG_EV_FAIL, OG_H_cuMemAlloc_v2, 0, 1ull << 40, 0, og_ticks());
    og_history_event_t *out = calloc(og_history_capacity(), sizeof *out);
    assert_non_null(out);
    int fewest_reads = INT_MAX;
    for (int round = 0; round < 20; round++) {
        jitter = 1;
        clock_reads = 0;
        size_t got = og_history_copy(out, og_history_capacity());
        int reads = clock_reads;
        jitter = 0;
        assert_true(got > 1);
        if (reads < fewest_reads)
            fewest_reads = reads;
        assert_int_equal(out[got - 1].op, OG_EV_FAIL);
        for (size_t i = 1; i < got; i++)
            assert_true(out[i].t_ns >= out[i - 1].t_ns);
    }
    /* A copy that waits for a lock another thread holds (the machine is busy) reads the clock
     * while it waits; the fewest reads of 20 copies is the copy's own cost, and a rate read per
     * event would make it 50 or more. */
    assert_true(fewest_reads <= 8);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(copy_with_and_without_the_lock),
        cmocka_unit_test(one_rate_per_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
