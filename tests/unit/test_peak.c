/* The device's peak: allocations under the batch size are summed per thread before they reach the
 * device-wide counter, yet the peak a dump reports for one allocating thread is exact, to the
 * byte, at the moment it was reached, not only when a batch is flushed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "ledger_int.h"

static void small_blocks_reach_the_peak_exactly(void **state)
{
    og_call_t c = {
        .hook = OG_H_cuMemAlloc_v2, .device = 1, .caller = (void *)small_blocks_reach_the_peak_exactly, .active = true
    };
    const uint64_t base = 0x7d0000000000ull, block = 512 * 1024 + 4096; /* 7 of them: under the 4 MiB batch */
    for (int i = 0; i < 7; i++)
        og_track_plain(&c, base + (uint64_t)i * (1 << 20), block, OG_KIND_PLAIN);
    oomguard_device_stats_t st;
    og_ledger_stats(1, &st);
    assert_int_equal(st.tracked_bytes, 7 * block);
    assert_int_equal(st.peak_tracked_bytes, 7 * block);
    for (int i = 0; i < 7; i++) {
        og_taken_t tk;
        og_free_begin(&c, base + (uint64_t)i * (1 << 20), &tk);
        assert_true(tk.found);
        og_free_end(&c, &tk, CUDA_SUCCESS);
    }
    og_ledger_stats(1, &st);
    assert_int_equal(st.tracked_bytes, 0);
    assert_int_equal(st.peak_tracked_bytes, 7 * block); /* the peak stays */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_blocks_reach_the_peak_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
