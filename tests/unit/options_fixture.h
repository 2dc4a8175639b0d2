/* The malformed option values both option tests feed in (test_options.c: the fallback,
 * test_options_warn.c: the warning), and the defaults they must leave in force. */
#ifndef OG_OPTIONS_FIXTURE_H
#define OG_OPTIONS_FIXTURE_H

#include <stdlib.h>

#include "og.h"

/* out of range and garbage */
static const struct {
    const char *name, *value;
} BAD_OPTIONS[] = {
    { "OOMGUARD_STACK_DEPTH", "1000" },
    { "OOMGUARD_VERBOSE", "maybe" },
    { "OOMGUARD_HISTORY", "12abc" },
};
#define N_BAD_OPTIONS (sizeof BAD_OPTIONS / sizeof *BAD_OPTIONS)

static void set_bad_options(void)
{
    for (size_t i = 0; i < N_BAD_OPTIONS; i++)
        setenv(BAD_OPTIONS[i].name, BAD_OPTIONS[i].value, 1);
}

static void unset_bad_options(void)
{
    for (size_t i = 0; i < N_BAD_OPTIONS; i++)
        unsetenv(BAD_OPTIONS[i].name);
}

/* the defaults of the options above: what a bad value falls back to */
static void assert_default_options(void)
{
    assert_int_equal(og_opt.stack_depth, 16);
    assert_int_equal(og_opt.verbose, 0);
    assert_int_equal(og_opt.history, 4096);
}

#endif
