/* The history rings: a dump's copy holds a full ring's newest events, all of them when it gets the
 * ring's lock, and leaves out the one slot a writer could be rewriting when it cannot (the
 * holder may have died holding it: the copy goes on after a second without the lock). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(copy_with_and_without_the_lock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
