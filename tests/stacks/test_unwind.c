/* The per-thread chain cache of stacks.c must give exactly the frames a full unwind gives.
 * Random call paths through functions with fixed frames, variable-length arrays (frames
 * found from %rbp), calls through pointers and recursion; each capture is made with the
 * cache and then with a plain unw_backtrace, and the two must be the same site with the
 * same frames.  Prints "N passed, N failed". */
#include "og.h"
#include "og_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int passed, failed;
static _Atomic int mismatches;
static __thread volatile int sink; /* per thread: two threads unwind at once */

static void check(bool ok, const char *what)
{
    if (ok)
        passed++;
    else
        failed++;
    printf("%s  %s\n", ok ? "PASS" : "FAIL", what);
}

/* The shim's entry points call og_site_capture with their own return address. */
__attribute__((noinline)) static void wrap(void)
{
    void *ra = __builtin_return_address(0);
    uint32_t id[2];
    for (int m = 0; m < 2; m++) {
        og_stack_cache_enabled = m == 0;
        id[m] = og_site_capture(ra);
    }
    og_stack_cache_enabled = true;
    const og_site_t *a = og_site_get(id[0]), *b = og_site_get(id[1]);
    if (!a || !b || a->depth != b->depth || memcmp(a->frames, b->frames, a->depth * sizeof a->frames[0]) ||
        a->frames[0] != (uintptr_t)ra) {
        if (atomic_fetch_add(&mismatches, 1) < 5)
            fprintf(stderr, "mismatch: cached site %u (%d frames), full unwind site %u (%d frames)\n", id[0],
                    a ? a->depth : -1, id[1], b ? b->depth : -1);
    }
    sink++;
}

static void step(const unsigned char *path, int i, int len);

__attribute__((noinline)) static void f_plain(const unsigned char *path, int i, int len)
{
    step(path, i + 1, len);
    sink++;
}
__attribute__((noinline)) static void f_vla(const unsigned char *path, int i, int len)
{
    volatile char buf[16 + 16 * (path[i] >> 4)]; /* frame found from %rbp */
    buf[0] = 1;
    step(path, i + 1, len);
    sink += buf[0];
}
__attribute__((noinline)) static void f_big(const unsigned char *path, int i, int len)
{
    volatile char buf[600];
    buf[i] = 2;
    step(path, i + 1, len);
    sink += buf[i];
}
static void (*volatile f_ptr)(const unsigned char *, int, int) = f_plain;
__attribute__((noinline)) static void f_indirect(const unsigned char *path, int i, int len)
{
    f_ptr(path, i, len);
    sink++;
}

static void step(const unsigned char *path, int i, int len)
{
    if (i >= len) {
        wrap();
        return;
    }
    switch (path[i] & 3) {
    case 0:
        f_plain(path, i, len);
        break;
    case 1:
        f_vla(path, i, len);
        break;
    case 2:
        f_big(path, i, len);
        break;
    default:
        f_indirect(path, i, len);
        break;
    }
    sink++;
}

/* Same capturing frame, different frames above it: two %rbp-framed functions share a
 * fixed total of stack, split differently, and the outer one calls the inner one from one
 * of two places.  The inner function's return address then sits at a different address
 * for each split; a cache that trusted the stale return address left in the arrays at the
 * old one would name the other call site. */
__attribute__((noinline)) static void split_inner(int n)
{
    volatile char buf[n];
    buf[0] = 1;
    wrap();
    sink += buf[0];
}
__attribute__((noinline)) static void split_outer(int n, int where)
{
    volatile char buf[n];
    buf[0] = 1;
    if (where) {
        split_inner(512 - n);
        sink += 3;
    } else {
        sink += 5;
        split_inner(512 - n);
    }
    sink += buf[0];
}

static void random_paths(unsigned seed, int count)
{
    unsigned char path[60];
    for (int k = 0; k < count; k++) {
        int len = (int)(rand_r(&seed) % 50);
        for (int i = 0; i < len; i++)
            path[i] = (unsigned char)rand_r(&seed);
        /* each path three times: the second records its chain, the third finds it */
        for (int r = 0; r < 3; r++)
            step(path, 0, len);
    }
}

static void *thread_main(void *arg)
{
    random_paths((unsigned)(uintptr_t)arg, 2000);
    return (void *)(uintptr_t)og_stack_chain_hits;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    og_init_slow();
    og_stack_record_cost = 0; /* record every repeated stack: the cache is what is tested */
    char what[160];
    snprintf(what, sizeof what, "stack depth %lld", (long long)og_opt.stack_depth);
    check(og_opt.stack_depth > 0, what);

    uint64_t hits0 = og_stack_chain_hits;
    random_paths(1, 3000);
    snprintf(what, sizeof what, "3000 random paths x 3: cached chains == full unwind (%d mismatches)",
             atomic_load(&mismatches));
    check(atomic_load(&mismatches) == 0, what);
    snprintf(what, sizeof what, "the cache served %llu of 9000 captures",
             (unsigned long long)(og_stack_chain_hits - hits0));
    check(og_stack_chain_hits - hits0 >= 2500, what);

    atomic_store(&mismatches, 0);
    hits0 = og_stack_chain_hits;
    for (int r = 0; r < 400; r++) {
        int n = 16 + 16 * ((r * 7) % 29);
        for (volatile int again = 0; again < 3; again++) /* the third call hits */
            split_outer(n, r & 1);
    }
    snprintf(what, sizeof what,
             "same capturing frame, frames above split differently: exact (%d mismatches, %llu hits)",
             atomic_load(&mismatches), (unsigned long long)(og_stack_chain_hits - hits0));
    check(atomic_load(&mismatches) == 0 && og_stack_chain_hits - hits0 >= 300, what);

    atomic_store(&mismatches, 0);
    pthread_t t[2];
    uintptr_t hits[2] = { 0, 0 };
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, thread_main, (void *)(uintptr_t)(100 + i));
    for (int i = 0; i < 2; i++) {
        void *h;
        pthread_join(t[i], &h);
        hits[i] = (uintptr_t)h;
    }
    snprintf(what, sizeof what, "two threads, 6000 captures each: exact (%d mismatches), %lu and %lu from the cache",
             atomic_load(&mismatches), (unsigned long)hits[0], (unsigned long)hits[1]);
    check(atomic_load(&mismatches) == 0 && hits[0] >= 1500 && hits[1] >= 1500, what);

    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
