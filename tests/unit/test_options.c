/* Option parsing: sizes, booleans, ranges, and bad values that must fall back to the
 * default with one warning (the warning itself is asserted in test_options_warn.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"
#include "options_fixture.h"

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
    const char *bad[] = { "banana", "-5GB", "", "12XB", "GB", "1e30", "+3", "5 G i B" };
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
    set_bad_options();
    og_options_init();
    assert_default_options();
    unset_bad_options();
    og_options_init();
    assert_int_equal(og_opt.stack_depth, 16);
}

static void clear_env(void)
{
    for (int i = 0; i < OG_OPT_COUNT; i++)
        unsetenv(og_option_env(i));
}

/* Every default in common/options.def is a value the parser takes (a typo there would make the
 * library warn about its own default at every start-up), and an empty environment gives it. */
static void defaults_parse(void **state)
{
    clear_env();
    for (int i = 0; i < OG_OPT_COUNT; i++) {
        assert_non_null(og_option_env(i));
        assert_memory_equal(og_option_env(i), "OOMGUARD_", 9);
        if (!og_option_valid(i, og_option_default(i)))
            fail_msg("%s: default \"%s\" does not parse", og_option_env(i), og_option_default(i));
        for (int j = 0; j < i; j++)
            assert_string_not_equal(og_option_env(i), og_option_env(j));
    }
    og_options_init();
    assert_int_equal(og_opt.stack_depth, 16);
    assert_int_equal(og_opt.history, 4096);
    assert_int_equal(og_opt.frag_share, 2500); /* hundredths of a percent */
    assert_int_equal(og_opt.max_dumps, 200);
    assert_int_equal(og_opt.nvml, 1);
    assert_string_equal(og_opt.framework_s, "auto");
    assert_string_equal(og_opt.dir_s, "");
    assert_string_equal(og_opt.limit_s, "");
    assert_false(og_option_valid(OG_OPT_COUNT, "1"));
    assert_false(og_option_valid(-1, "1"));
}

/* Strings live in the table too: a closed set is checked, an empty value means unset, and a
 * value longer than its buffer is refused whole, never cut short into another value. */
static void string_options(void **state)
{
    clear_env();
    setenv("OOMGUARD_FRAMEWORK", "jax", 1);
    setenv("OOMGUARD_DIR", "/scratch/oom", 1);
    setenv("OOMGUARD_LIMIT", "0:24GiB", 1);
    og_options_init();
    assert_string_equal(og_opt.framework_s, "jax");
    assert_string_equal(og_opt.dir_s, "/scratch/oom");
    assert_string_equal(og_opt.limit_s, "0:24GiB");

    setenv("OOMGUARD_FRAMEWORK", "banana", 1);
    setenv("OOMGUARD_DIR", "", 1);
    char longv[700];
    memset(longv, 0, sizeof longv);
    for (size_t i = 0; i + 7 < sizeof longv - 1; i += 7)
        memcpy(longv + i, "0:1GiB,", 7);
    setenv("OOMGUARD_LIMIT", longv, 1);
    og_options_init();
    assert_string_equal(og_opt.framework_s, "auto");
    assert_string_equal(og_opt.dir_s, "");
    assert_string_equal(og_opt.limit_s, "");
    assert_false(og_option_valid(OG_OPT_limit, longv));
    assert_true(og_option_valid(OG_OPT_dir, ""));

    /* the longest value that fits is taken whole */
    char dir[4097]; /* og_opt.dir_s holds 4095 characters */
    memset(dir, 'd', sizeof dir - 1);
    dir[sizeof dir - 1] = 0;
    assert_false(og_option_valid(OG_OPT_dir, dir));
    dir[sizeof dir - 2] = 0;
    assert_true(og_option_valid(OG_OPT_dir, dir));
    clear_env();
}

static void percent_and_bool(void **state)
{
    assert_true(og_option_valid(OG_OPT_frag_share, "12.5%"));
    assert_true(og_option_valid(OG_OPT_frag_share, "12.5"));
    assert_false(og_option_valid(OG_OPT_frag_share, "150%"));
    assert_false(og_option_valid(OG_OPT_frag_share, "-1%"));
    assert_false(og_option_valid(OG_OPT_frag_share, "5%%"));
    assert_true(og_option_valid(OG_OPT_verbose, "on"));
    assert_false(og_option_valid(OG_OPT_verbose, "2"));
    assert_false(og_option_valid(OG_OPT_stack_depth, "65"));
    assert_true(og_option_valid(OG_OPT_stack_depth, "64"));
    assert_false(og_option_valid(OG_OPT_max_dumps, "0"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(size_units),     cmocka_unit_test(size_rejects),   cmocka_unit_test(env_values),
        cmocka_unit_test(defaults_parse), cmocka_unit_test(string_options), cmocka_unit_test(percent_and_bool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
