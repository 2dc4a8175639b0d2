/* A bad OOMGUARD_* value falls back to the default with exactly one warning on stderr that
 * names the variable and the value (test_options.c checks the values; this checks what the
 * user is told). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "og.h"
#include "options_fixture.h"

/* Runs og_options_init with stderr going to a file; returns what was written (static). */
static const char *init_capturing_stderr(void)
{
    static char out[8192];
    char path[] = "/tmp/og-options-warn.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    og_options_init();
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, out, sizeof out - 1, 0);
    close(fd);
    out[n > 0 ? n : 0] = 0;
    return out;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void bad_values_warn_once_each(void **state)
{
    set_bad_options();
    const char *err = init_capturing_stderr();
    for (size_t i = 0; i < N_BAD_OPTIONS; i++) {
        char line[128];
        snprintf(line, sizeof line, "%s=%s is not valid", BAD_OPTIONS[i].name, BAD_OPTIONS[i].value);
        assert_int_equal(count(err, line), 1);
    }
    assert_int_equal(count(err, "warning:"), N_BAD_OPTIONS);
    /* and the defaults were used */
    assert_default_options();
    unset_bad_options();
}

static void good_values_say_nothing(void **state)
{
    setenv("OOMGUARD_STACK_DEPTH", "7", 1);
    setenv("OOMGUARD_VERBOSE", "yes", 1);
    const char *err = init_capturing_stderr();
    assert_int_equal(count(err, "warning:"), 0);
    assert_int_equal(og_opt.stack_depth, 7);
    unsetenv("OOMGUARD_STACK_DEPTH");
    unsetenv("OOMGUARD_VERBOSE");
    og_options_init();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_values_warn_once_each),
        cmocka_unit_test(good_values_say_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
