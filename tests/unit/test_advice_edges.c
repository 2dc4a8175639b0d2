/* Remedies at the edges of compute capability: 7.0 (Volta) is not "before Volta"; 8.0 is the
 * first with bf16.  One record, only the compute capability changes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "record.h"
#include "analysis_fixture.h"

/* the shared fixture with 8 GiB requested (1 GiB free: does not fit) on a card of compute capability MAJOR.MINOR */
static og_record_t *record(int major, int minor)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so,libc10_cuda.so");
    og_set(&r->event.requested_bytes, 8 * GiB);
    r->device.cc_major = major;
    r->device.cc_minor = minor;
    og_diagnose(r, &TH);
    og_select_remedies(r);
    return r;
}

static const og_remedy_t *mixed(const og_record_t *r)
{
    for (int i = 0; i < r->nremedies; i++)
        if (strcmp(r->remedies[i].id, "mixed_precision") == 0)
            return &r->remedies[i];
    fail_msg("no mixed_precision remedy (cc %d.%d)", r->device.cc_major, r->device.cc_minor);
    return NULL;
}

static void volta_is_not_pre_volta(void **state)
{
    og_record_t *v70 = record(7, 0), *v75 = record(7, 5), *p61 = record(6, 1);
    const og_remedy_t *m70 = mixed(v70), *m75 = mixed(v75), *m61 = mixed(p61);
    /* cc 7.0 ranks mixed precision exactly as 7.5 does, and not last as 6.1 does */
    assert_int_equal(m70->rank, m75->rank);
    assert_true(m61->rank > m70->rank);
    assert_int_equal(m61->rank, p61->nremedies);
    assert_null(strstr(m70->why, "older than Volta"));
    assert_non_null(strstr(m61->why, "older than Volta"));
    free(v70);
    free(v75);
    free(p61);
}

static void bf16_from_ampere(void **state)
{
    og_record_t *a80 = record(8, 0), *t75 = record(7, 5);
    assert_non_null(strstr(mixed(a80)->why, "supports bf16"));
    assert_non_null(strstr(mixed(t75)->why, "no bf16"));
    free(a80);
    free(t75);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(volta_is_not_pre_volta),
        cmocka_unit_test(bf16_from_ampere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
