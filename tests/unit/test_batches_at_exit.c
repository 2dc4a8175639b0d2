/* A thread's batched bytes reach the device's total when the thread ends.  Allocations under the
 * batch size are summed per shard before they reach the device-wide counter (ledger_int.h); a
 * program that makes a thread per piece of work (a worker pool of short-lived threads, a backward
 * pass on a thread of its own) must not leave each thread's last batch out of the counter, the
 * peak and the history's usage.  Frees made later by another thread, of blocks whose threads
 * are gone, must bring the counter back to the exact sum too.
 *
 * Its own program: the main thread allocates nothing here, so once the workers have ended no
 * live thread owns a shard and every figure is exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <pthread.h>
#include <cmocka.h>

#include "ledger_int.h"

#define DEVICE 2
#define BLOCKS 6 /* a thread's blocks: 6 x 516 KiB, under the batch */
static const uint64_t base = 0x7e0000000000ull, block = 512 * 1024 + 4096;
#define ONE_BY_ONE (3 * SHARDS + 5) /* every shard given out three times and more */
#define AT_ONCE    (2 * SHARDS)     /* then twice as many at once: two live threads a shard */
#define THREADS    (ONE_BY_ONE + AT_ONCE)

static uint64_t addr_of(int thread, int i) { return base + ((uint64_t)thread * 8 + (uint64_t)i) * (1 << 20); }

static void *allocate(void *arg)
{
    int k = (int)(intptr_t)arg;
    og_call_t c = { .hook = OG_H_cuMemAlloc_v2, .device = DEVICE, .caller = (void *)allocate, .active = true };
    for (int i = 0; i < BLOCKS; i++)
        og_track_plain(&c, addr_of(k, i), block, OG_KIND_PLAIN);
    return NULL;
}

static void *free_all(void *arg)
{
    og_call_t c = { .hook = OG_H_cuMemFree_v2, .device = DEVICE, .caller = (void *)free_all, .active = true };
    for (int k = 0; k < THREADS; k++)
        for (int i = 0; i < BLOCKS; i++) {
            og_taken_t tk;
            og_free_begin(&c, addr_of(k, i), &tk);
            if (!tk.found)
                return (void *)1;
            og_free_end(&c, &tk, CUDA_SUCCESS);
        }
    return NULL;
}

static uint64_t peak(void) { return atomic_load(&og_devs[DEVICE].peak); }

static void short_lived_threads_leave_nothing_out(void **state)
{
    /* one after the other: each thread's peak is exact, so the device's is */
    for (int k = 0; k < ONE_BY_ONE; k++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, allocate, (void *)(intptr_t)k), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
    }
    oomguard_device_stats_t st;
    og_ledger_stats(DEVICE, &st);
    uint64_t total = (uint64_t)ONE_BY_ONE * BLOCKS * block;
    assert_int_equal(st.tracked_bytes, total);
    assert_int_equal(og_ledger_tracked(DEVICE), total); /* the counter holds every thread's last batch */
    assert_int_equal(peak(), total);

    /* at the same time, sharing shards: a thread that ends adds its shard's batch, whoever made
     * it, and the last to end brings the counter to the whole, its highest (nothing was freed:
     * the counter never passed the truth) */
    pthread_t ts[AT_ONCE];
    for (int k = 0; k < AT_ONCE; k++)
        assert_int_equal(pthread_create(&ts[k], NULL, allocate, (void *)(intptr_t)(ONE_BY_ONE + k)), 0);
    for (int k = 0; k < AT_ONCE; k++)
        assert_int_equal(pthread_join(ts[k], NULL), 0);
    total = (uint64_t)THREADS * BLOCKS * block;
    og_ledger_stats(DEVICE, &st);
    assert_int_equal(st.tracked_bytes, total);
    assert_int_equal(og_ledger_tracked(DEVICE), total);
    assert_int_equal(peak(), total);

    /* another thread frees them all: their shards have no live thread, nothing waits in them */
    pthread_t t;
    void *bad;
    assert_int_equal(pthread_create(&t, NULL, free_all, NULL), 0);
    assert_int_equal(pthread_join(t, &bad), 0);
    assert_null(bad);
    og_ledger_stats(DEVICE, &st);
    assert_int_equal(st.tracked_bytes, 0);
    assert_int_equal(og_ledger_tracked(DEVICE), 0);
    assert_int_equal(peak(), total); /* the peak stays */
    assert_int_equal(st.allocs, (uint64_t)THREADS * BLOCKS);
    assert_int_equal(st.frees, (uint64_t)THREADS * BLOCKS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(short_lived_threads_leave_nothing_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
