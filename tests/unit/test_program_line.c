/* The program's own Python line (common/human.c, read by the failing Python line of the report and
 * the stderr summary): a frame of a framework's package (common/framework_code.def) or of the
 * interpreter's standard library is not the program's; a package installed below the standard
 * library's directory is not the standard library, and a program's own copy.py is the program's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "human.h"

static void standard_library(void **state)
{
    /* copy.deepcopy(model): the line is the one that called deepcopy, not copy.py's */
    assert_true(og_python_file_in_standard_library("/usr/lib/python3.11/copy.py"));
    assert_true(og_python_file_in_standard_library("/usr/lib/python3.11/json/decoder.py"));
    assert_true(og_python_file_in_standard_library("/opt/conda/lib/python3.10/multiprocessing/pool.py"));
    assert_true(og_python_file_in_standard_library("/home/u/.pyenv/versions/3.12.1/lib/python3.12/copy.py"));
    assert_true(og_python_file_in_standard_library("/usr/lib64/python3.9/copy.py"));
    assert_true(og_python_file_in_standard_library("/usr/local/lib/python3.13t/threading.py"));
    assert_true(og_python_file_in_standard_library("<frozen runpy>"));
    /* an installed package below it is a package's; the program's own files are the program's */
    assert_false(og_python_file_in_standard_library("/usr/local/lib/python3.11/dist-packages/numpy/core/a.py"));
    assert_false(og_python_file_in_standard_library("/w/.venv/lib/python3.11/site-packages/mylib/copy.py"));
    assert_false(og_python_file_in_standard_library("/usr/lib/python3/dist-packages/yaml/__init__.py"));
    assert_false(og_python_file_in_standard_library("/w/copy.py"));
    assert_false(og_python_file_in_standard_library("/w/lib/python/train.py"));
    assert_false(og_python_file_in_standard_library("/w/lib/pythonX.Y/train.py"));
    assert_false(og_python_file_in_standard_library("<stdin>"));
    assert_false(og_python_file_in_standard_library("<ipython-input-3-1f2e>"));
    assert_false(og_python_file_in_standard_library(""));
    assert_false(og_python_file_in_standard_library(NULL));
}

static void not_program(void **state)
{
    assert_true(og_python_file_not_program("/usr/lib/python3.11/copy.py"));
    assert_true(og_python_file_not_program("<frozen runpy>"));
    assert_true(og_python_file_not_program("/w/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py"));
    assert_true(og_python_file_not_program("/srv/x/transformers/trainer.py"));
    assert_false(og_python_file_not_program("/w/train.py"));
    assert_false(og_python_file_not_program("/w/copy.py"));
    assert_false(og_python_file_not_program("/w/.venv/lib/python3.11/site-packages/mylib/copy.py"));
    /* the framework test itself is unchanged: the standard library is not a framework */
    assert_false(og_python_file_in_framework("/usr/lib/python3.11/copy.py"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(standard_library),
        cmocka_unit_test(not_program),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
