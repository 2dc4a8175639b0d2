/* shim/framework.c: what an adapter hands in (the struct's versions, the Python lines, a
 * stack-only report) and the guards of the query the shim calls at a failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"
#include "record.h"

static og_framework_view_t view;

static void get(void) { og_framework_view_get(&view); }

static oomguard_framework_stats_t base(void)
{
    oomguard_framework_stats_t s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.device = 3; /* no failure open there: nothing is rewritten */
    s.allocated_bytes = 100;
    s.reserved_bytes = 300;
    s.source = "torch 9.9";
    return s;
}

static void struct_versions(void **state)
{
    oomguard_framework_stats_t s = base();
    assert_int_equal(oomguard_framework_report(NULL), -1);
    s.struct_size = offsetof(oomguard_framework_stats_t, snapshot_path) - 1;
    assert_int_equal(oomguard_framework_report(&s), -1);
    /* the first release's struct: the fields after snapshot_path are not read */
    s.struct_size = offsetof(oomguard_framework_stats_t, snapshot_path);
    s.api = "must not be read";
    s.python_stack = "a.py\t1\tf\n";
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_true(view.has);
    assert_int_equal(view.reserved_bytes, 300);
    assert_string_equal(view.api, "");
    assert_int_equal(view.npy_frames, 0);
}

static void python_lines(void **state)
{
    oomguard_framework_stats_t s = base();
    s.framework = "pytorch";
    s.api = "torch.cuda.caching_allocator";
    s.requested_bytes = 4096;
    s.cap_bytes = 1 << 20;
    s.cap_source = "torch.cuda.set_per_process_memory_fraction(0.5)";
    s.grad_enabled = -1;
    /* malformed lines (too few fields) are skipped, not misread */
    s.python_stack = "/x/alloc.py\t232\tmalloc\nbroken line\n/x/train.py\t17\t<module>\n";
    s.python_sites = "/x/train.py\t12\tstep\t8388608\t3\n/x/train.py\t9\n/x/model.py\t40\tfwd\t4096\t1";
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_int_equal(view.npy_frames, 2);
    assert_string_equal(view.py_frames[0].file, "/x/alloc.py");
    assert_int_equal(view.py_frames[0].line, 232);
    assert_string_equal(view.py_frames[1].function, "<module>");
    assert_int_equal(view.npy_sites, 2);
    assert_int_equal(view.py_sites[0].bytes, 8388608);
    assert_int_equal(view.py_sites[0].blocks, 3);
    assert_string_equal(view.py_sites[1].file, "/x/model.py");
    assert_true(og_known(view.cap_bytes));
    assert_int_equal(view.cap_bytes.v, 1 << 20);
    assert_string_equal(view.framework, "pytorch");
    assert_int_equal(view.grad_enabled, -1);
    assert_false(view.internal_oom);
    assert_true(view.reported_t_ns > 0);
}

/* the struct's cap_bytes 0 is "no cap reported": the view's cap is unknown, not a cap of 0 bytes (which every
 * request would cross); a report without it replaces one that had it */
static void no_cap_is_unknown(void **state)
{
    oomguard_framework_stats_t s = base();
    s.cap_bytes = 1 << 20;
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_true(og_known(view.cap_bytes));
    s.cap_bytes = 0;
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_true(view.has);
    assert_false(og_known(view.cap_bytes));
    assert_int_equal(view.cap_bytes.v, 0);
}

/* the struct's requested_bytes and peak_bytes: 0 without OOMGUARD_FW_REQUEST_KNOWN / _PEAK_KNOWN is "not given"
 * (adapters older than the flags); with the flag 0 is a size; any other value is one with or without it */
static void request_and_peak_known_only_when_given(void **state)
{
    oomguard_framework_stats_t s = base();
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_false(og_known(view.requested_bytes));
    assert_false(og_known(view.peak_bytes));
    s.flags = OOMGUARD_FW_REQUEST_KNOWN | OOMGUARD_FW_PEAK_KNOWN;
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_true(og_known(view.requested_bytes));
    assert_int_equal(view.requested_bytes.v, 0);
    assert_true(og_known(view.peak_bytes));
    assert_int_equal(view.peak_bytes.v, 0);
    s.flags = 0;
    s.requested_bytes = 4096;
    s.peak_bytes = 1 << 20;
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_true(og_known(view.requested_bytes));
    assert_int_equal(view.requested_bytes.v, 4096);
    assert_true(og_known(view.peak_bytes));
    assert_int_equal(view.peak_bytes.v, 1 << 20);
    /* a struct too old to hold the field: not given */
    s.struct_size = offsetof(oomguard_framework_stats_t, requested_bytes);
    assert_int_equal(oomguard_framework_report(&s), 0);
    get();
    assert_false(og_known(view.requested_bytes));
    assert_false(og_known(view.peak_bytes));
}

static void stack_only_keeps_numbers(void **state)
{
    oomguard_framework_stats_t s = base();
    assert_int_equal(oomguard_framework_report(&s), 0);
    oomguard_framework_stats_t q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    q.device = 3;
    q.flags = OOMGUARD_FW_NO_NUMBERS;
    q.python_stack = "/y/job.py\t5\t<module>\n";
    assert_int_equal(oomguard_framework_report(&q), 0);
    get();
    assert_true(view.has);
    assert_int_equal(view.allocated_bytes, 100);
    assert_int_equal(view.reserved_bytes, 300);
    assert_int_equal(view.npy_frames, 1);
    assert_string_equal(view.py_frames[0].file, "/y/job.py");
}

/* ---------------------------------------------------------------- the query */

static int calls;
static int query(void *ctx, int device, oomguard_framework_stats_t *out)
{
    calls++;
    assert_ptr_equal(ctx, &calls);
    assert_int_equal(out->flags, OOMGUARD_FW_NO_NUMBERS);
    og_query_at_failure(device); /* never called from inside itself */
    out->python_stack = "/q/asked.py\t7\tstep\n";
    return 0;
}

static void query_needs_gil(void **state)
{
    /* this test program is no Python interpreter: a query that needs the GIL is never called */
    calls = 0;
    oomguard_framework_set_query(query, &calls, OOMGUARD_QUERY_NEEDS_GIL);
    og_query_at_failure(3);
    assert_int_equal(calls, 0);
    get();
    assert_non_null(strstr(view.unmeasured_why, "no Python interpreter"));
    oomguard_framework_set_query(NULL, NULL, 0);
}

static void query_called_once(void **state)
{
    calls = 0;
    oomguard_framework_set_query(query, &calls, 0);
    og_query_at_failure(3);
    assert_int_equal(calls, 1); /* the nested call inside did not run it again */
    get();
    assert_int_equal(view.npy_frames, 1);
    assert_string_equal(view.py_frames[0].file, "/q/asked.py");
    og_query_at_failure(-1); /* no device: not asked */
    og_query_at_failure(OG_MAX_DEVICES);
    assert_int_equal(calls, 1);
    oomguard_framework_set_query(NULL, NULL, 0);
    og_query_at_failure(3);
    assert_int_equal(calls, 1);
}

int main(void)
{
    og_init_slow();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(struct_versions),
        cmocka_unit_test(python_lines),
        cmocka_unit_test(stack_only_keeps_numbers),
        cmocka_unit_test(query_needs_gil),
        cmocka_unit_test(query_called_once),
        cmocka_unit_test(no_cap_is_unknown),
        cmocka_unit_test(request_and_peak_known_only_when_given),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
