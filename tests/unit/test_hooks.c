/* The hook list drives every door into the shim: check each entry is routed, and that
 * cuGetProcAddress answers map (base name, version, flags) to the right ABI. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"

/* Fake "real" functions: distinct addresses the mapping must remember. */
static char fake_real[OG_H_COUNT];

static void every_hook_is_found_by_name(void **state)
{
    for (int i = 0; i < OG_H_COUNT; i++) {
        assert_int_equal(og_hook_find(og_hooks[i].name), i);
        assert_non_null(og_hooks[i].wrapper);
        assert_non_null(og_hooks[i].base);
    }
    assert_int_equal(og_hook_find("cuMemcpy"), -1);
    assert_int_equal(og_hook_find("malloc"), -1);
    assert_int_equal(og_hook_find(NULL), -1);
}

static void proc_answers_every_driver_hook(void **state)
{
    /* Asking for (base, since, ptsz?) gives back exactly that entry's wrapper. */
    for (int i = 0; i < OG_H_COUNT; i++) {
        const og_hook_t *h = &og_hooks[i];
        if (h->lib != OG_LIB_CUDA)
            continue;
        uint64_t flags = h->ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
        void *w = og_proc_wrapper(h->base, h->since, flags, &fake_real[i]);
        assert_ptr_equal(w, h->wrapper);
        assert_ptr_equal(atomic_load(&og_real_ptrs[i]), &fake_real[i]);
        /* a later minor version still gets the newest ABI at or below it */
        assert_ptr_equal(og_proc_wrapper(h->base, h->since + 5, flags, &fake_real[i]), h->wrapper);
    }
}

static void proc_versions_and_flags(void **state)
{
    char other;
    /* older ABIs are not ours: passed through untouched */
    assert_ptr_equal(og_proc_wrapper("cuMemAlloc", 2000, 0, &other), &other);
    assert_ptr_equal(og_proc_wrapper("cuGetProcAddress", 11020, 0, &other), &other);
    /* version picks v1 vs v2 of cuGetProcAddress */
    assert_ptr_equal(og_proc_wrapper("cuGetProcAddress", 11030, 0, &fake_real[OG_H_cuGetProcAddress]),
                     (void *)cuGetProcAddress);
    assert_ptr_equal(og_proc_wrapper("cuGetProcAddress", 12000, 0, &fake_real[OG_H_cuGetProcAddress_v2]),
                     (void *)cuGetProcAddress_v2);
    /* legacy and default flags: legacy stream; per-thread: _ptsz */
    assert_ptr_equal(
        og_proc_wrapper("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &fake_real[OG_H_cuMemAllocAsync]),
        (void *)cuMemAllocAsync);
    assert_ptr_equal(og_proc_wrapper("cuMemAllocAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                     &fake_real[OG_H_cuMemAllocAsync_ptsz]),
                     (void *)cuMemAllocAsync_ptsz);
    /* per-thread requested for a function with no such variant: the legacy one */
    assert_ptr_equal(og_proc_wrapper("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                     &fake_real[OG_H_cuMemAlloc_v2]),
                     (void *)cuMemAlloc_v2);
    /* names we do not hook, and NULLs */
    assert_ptr_equal(og_proc_wrapper("cuMemcpy", 12000, 0, &other), &other);
    assert_null(og_proc_wrapper("cuMemAlloc", 12000, 0, NULL));
    assert_ptr_equal(og_proc_wrapper(NULL, 12000, 0, &other), &other);
}

static void one_real_pointer_per_name(void **state)
{
    char second;
    void *first = atomic_load(&og_real_ptrs[OG_H_cuMemFree_v2]);
    assert_non_null(first);
    og_proc_wrapper("cuMemFree", 12000, 0, &second);
    assert_ptr_equal(atomic_load(&og_real_ptrs[OG_H_cuMemFree_v2]), first);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_hook_is_found_by_name),
        cmocka_unit_test(proc_answers_every_driver_hook),
        cmocka_unit_test(proc_versions_and_flags),
        cmocka_unit_test(one_real_pointer_per_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
