/* Option parsing: sizes, booleans, ranges, and bad values that must fall back to the
 * default with one warning. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "og.h"

static void size_units(void **state)
{
    bool ok;
    assert_int_equal(og_parse_size("123", &ok), 123);
    assert_true(ok);
    assert_int_equal(og_parse_size("24GiB", &ok), 24LL << 30);
    assert_true(ok);
    assert_int_equal(og_parse_size("24000MB", &ok), 24000LL * 1000 * 1000);
    assert_int_equal(og_parse_size("1.5 GiB", &ok), 3LL << 29);
    assert_true(ok);
    assert_int_equal(og_parse_size("2mib", &ok), 2LL << 20);
    assert_int_equal(og_parse_size("7k", &ok), 7000);
}

static void size_rejects(void **state)
{
    bool ok;
    const char *bad[] = {"banana", "-5GB", "", "12XB", "GB", "1e30", "+3", "5 G i B"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        og_parse_size(bad[i], &ok);
        assert_false(ok);
    }
    og_parse_size(NULL, &ok);
    assert_false(ok);
}

static void env_values(void **state)
{
    setenv("OOMGUARD_STACK_DEPTH", "7", 1);
    setenv("OOMGUARD_VERBOSE", "yes", 1);
    og_options_init();
    assert_int_equal(og_opt.stack_depth, 7);
    assert_int_equal(og_opt.verbose, 1);

    /* out of range and garbage: default, not a crash or a clamp */
    setenv("OOMGUARD_STACK_DEPTH", "1000", 1);
    setenv("OOMGUARD_VERBOSE", "maybe", 1);
    setenv("OOMGUARD_HISTORY", "12abc", 1);
    og_options_init();
    assert_int_equal(og_opt.stack_depth, 16);
    assert_int_equal(og_opt.verbose, 0);
    assert_int_equal(og_opt.history, 4096);
    unsetenv("OOMGUARD_STACK_DEPTH");
    unsetenv("OOMGUARD_VERBOSE");
    unsetenv("OOMGUARD_HISTORY");
    og_options_init();
    assert_int_equal(og_opt.stack_depth, 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(size_units),
        cmocka_unit_test(size_rejects),
        cmocka_unit_test(env_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
