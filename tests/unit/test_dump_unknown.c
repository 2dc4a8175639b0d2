/* The dump's counts that can go unmeasured (docs/dump-format.md: "null or a missing key is unknown, never
 * 0"): the record carries their known flag, and both renderings say unknown as the format does (JSON null,
 * the text twin "unknown" or nothing), never a number, least of all 2^64-1; a count that is known says its
 * number, 0 and SIZE_MAX included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"
#include "record.h"
#include "strbuf.h"
#include "dump_render.h"

#define GiB (1ULL << 30)

/* a failure of 2 GiB on device 0 (its second attempt, inside the framework's allocator) with nothing of the
 * device, the ledger, NVML or the diagnosis measured: what a zeroed record says */
static og_record_t *unmeasured(void)
{
    og_record_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->status = "oom";
    r->rank = r->local_rank = r->world_size = -1;
    r->event.api = "cudaMalloc";
    r->event.driver_api = "cuMemAlloc_v2";
    og_set(&r->event.requested_bytes, 2 * GiB);
    r->event.attempts = 2;
    r->memory.fw.has = true; /* the framework view is written, its cap not reported */
    r->event.framework_internal = true;
    return r;
}

static char *json(const og_record_t *r)
{
    og_sb_t sb = { 0 };
    og_dump_json(r, &sb);
    assert_false(sb.failed);
    assert_non_null(sb.buf);
    return sb.buf;
}

static char *text(const og_record_t *r)
{
    og_sb_t sb = { 0 };
    og_dump_text(r, &sb);
    assert_false(sb.failed);
    assert_non_null(sb.buf);
    return sb.buf;
}

static void has(const char *s, const char *want)
{
    if (!strstr(s, want))
        fail_msg("missing %s in:\n%s", want, s);
}

static void lacks(const char *s, const char *unwanted)
{
    if (strstr(s, unwanted))
        fail_msg("unexpected %s in:\n%s", unwanted, s);
}

static void unknown_is_null_in_json(void **state)
{
    og_record_t *r = unmeasured();
    char *j = json(r);
    has(j, "\"total_bytes\":null");
    has(j, "\"free_bytes\":null");
    has(j, "\"process_tracked_bytes\":null");
    has(j, "\"other_processes_bytes\":null");
    has(j, "\"other_processes_count\":null");
    has(j, "\"released_between_attempts_bytes\":null");
    has(j, "\"cap_bytes\":null");
    has(j, "\"shortfall_bytes\":null");
    lacks(j, "18446744073709551615");
    lacks(j, "1.8446744073709552e");
    free(j);
    free(r);
}

static void unknown_is_unknown_in_text(void **state)
{
    og_record_t *r = unmeasured();
    char *t = text(r);
    has(t, "total unknown, free unknown");
    has(t, "2 attempts, unknown released in between");
    has(t, "this process, tracked               unknown");
    has(t, "other processes                     unknown");
    has(t, "The framework's own allocator refused it (no driver call failed).");
    lacks(t, ": cap ");
    lacks(t, "short by");
    lacks(t, "EiB");
    free(t);
    free(r);
}

/* measured: the numbers, a measured 0 as 0 */
static void known_counts_are_numbers(void **state)
{
    og_record_t *r = unmeasured();
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->device.free_bytes, 0);
    og_set(&r->memory.process_tracked_bytes, 20 * GiB);
    og_set(&r->memory.other_processes_bytes, 0);
    r->memory.other_processes_count = 0;
    og_set(&r->event.released_between_attempts_bytes, 0);
    og_set(&r->memory.fw.cap_bytes, 12 * GiB);
    og_set(&r->diagnosis.shortfall_bytes, 2 * GiB);
    char *j = json(r);
    has(j, "\"total_bytes\":25769803776");
    has(j, "\"free_bytes\":0");
    has(j, "\"process_tracked_bytes\":21474836480");
    has(j, "\"other_processes_bytes\":0");
    has(j, "\"other_processes_count\":0");
    has(j, "\"released_between_attempts_bytes\":0");
    has(j, "\"cap_bytes\":12884901888");
    has(j, "\"shortfall_bytes\":2147483648");
    lacks(j, "null,\"free_bytes\"");
    char *t = text(r);
    has(t, "total 24.00 GiB, free 0 B");
    has(t, "2 attempts, 0 B released in between");
    has(t, ": cap 12.00 GiB");
    has(t, "(short by 2.00 GiB)");
    free(t);
    /* a measured shortfall of 0 is written, and the text says nothing of it */
    og_set(&r->diagnosis.shortfall_bytes, 0);
    free(j);
    j = json(r);
    has(j, "\"shortfall_bytes\":0");
    t = text(r);
    lacks(t, "short by");
    free(t);
    free(j);
    free(r);
}

/* the request is always a size: SIZE_MAX is written whole and read as 16 EiB, never as "unknown" */
static void a_size_max_request_is_a_size(void **state)
{
    og_record_t *r = unmeasured();
    og_set(&r->event.requested_bytes, UINT64_MAX);
    char *j = json(r);
    has(j, "\"requested_bytes\":18446744073709551615");
    char *t = text(r);
    has(t, "cudaMalloc of 16.00 EiB (18446744073709551615 bytes)");
    free(t);
    free(j);
    free(r);
}

/* a failure an adapter reported without its size: the request is null in JSON (the event's and the framework
 * view's, and the view's peak not reported), "a size not given" in the text, never 0 B */
static void a_request_not_given_is_null(void **state)
{
    og_record_t *r = unmeasured();
    r->event.api = "torch.cuda.caching_allocator";
    r->event.driver_api = "";
    og_unset(&r->event.requested_bytes);
    char *j = json(r);
    has(j, "{\"requested_bytes\":null,");
    has(j, "\"framework\":{\"allocated_bytes\"");
    has(j, ",\"requested_bytes\":null,\"cap_bytes\":null,\"peak_bytes\":null,");
    char *t = text(r);
    has(t, "torch.cuda.caching_allocator of a size not given on device 0 failed");
    lacks(t, "of 0 B");
    lacks(t, "(0 bytes)");
    free(t);
    free(j);
    /* the framework's own request and peak, when given, are numbers: 0 included */
    og_set(&r->memory.fw.requested_bytes, 0);
    og_set(&r->memory.fw.peak_bytes, 5 * GiB);
    j = json(r);
    has(j, ",\"requested_bytes\":0,\"cap_bytes\":null,\"peak_bytes\":5368709120,");
    free(j);
    free(r);
}

/* a request of 0 bytes (cudaMalloc(0), a framework's zero-size request) is a size: 0, not unknown */
static void a_zero_request_is_a_size(void **state)
{
    og_record_t *r = unmeasured();
    og_set(&r->event.requested_bytes, 0);
    char *j = json(r);
    has(j, "{\"requested_bytes\":0,");
    char *t = text(r);
    has(t, "cudaMalloc of 0 B (0 bytes) on device 0 failed");
    lacks(t, "not given");
    free(t);
    free(j);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unknown_is_null_in_json),  cmocka_unit_test(unknown_is_unknown_in_text),
        cmocka_unit_test(known_counts_are_numbers), cmocka_unit_test(a_request_not_given_is_null),
        cmocka_unit_test(a_zero_request_is_a_size), cmocka_unit_test(a_size_max_request_is_a_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
