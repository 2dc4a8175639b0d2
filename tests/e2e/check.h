/* Shared by the end-to-end programs: compare what liboomguard.so counted with what the
 * simulated driver really holds.  Both are looked up at run time so the same program runs
 * with or without the shim (without it, the comparison is skipped and says so). */
#ifndef OG_E2E_CHECK_H
#define OG_E2E_CHECK_H

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oomguard.h"
#include "simgpu.h"

static int check_failures;
static int check_count;
static int check_ledger_count; /* of check_count: comparisons with the shim's ledger */

#define CHECK(cond, ...)                                         \
    do {                                                         \
        check_count++;                                           \
        if (!(cond)) {                                           \
            check_failures++;                                    \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
        }                                                        \
    } while (0)

/* A check of the shim's numbers (made only when the shim is there) */
#define LEDGER_CHECK(...)     \
    do {                      \
        check_ledger_count++; \
        CHECK(__VA_ARGS__);   \
    } while (0)

static int (*p_truth)(int, simgpu_truth_t *);
static int (*p_stats)(int, oomguard_device_stats_t *);

static inline int check_setup(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libcuda.so.1", RTLD_NOW);
    p_truth = h ? (int (*)(int, simgpu_truth_t *))dlsym(h, "simgpu_truth") : NULL;
    p_stats = (int (*)(int, oomguard_device_stats_t *))dlsym(RTLD_DEFAULT, "oomguard_device_stats");
    if (!p_truth) {
        fprintf(stderr, "FAIL: simulated driver has no simgpu_truth\n");
        return -1;
    }
    return p_stats ? 1 : 0;
}

#define EQ(what, a, b)                                                                                             \
    CHECK((uint64_t)(a) == (uint64_t)(b), "[%s] dev %d %s: shim %" PRIu64 " != driver %" PRIu64, label, dev, what, \
          (uint64_t)(a), (uint64_t)(b))

/* The ledger equals the driver's ground truth, to the byte, for one device. */
static inline void check_device(int dev, const char *label)
{
    if (!p_stats || !p_truth)
        return;
    int first = check_count;
    simgpu_truth_t t;
    oomguard_device_stats_t s;
    CHECK(p_truth(dev, &t) == 0, "[%s] truth for device %d", label, dev);
    CHECK(p_stats(dev, &s) == 0, "[%s] stats for device %d", label, dev);
    EQ("plain+managed bytes", s.plain_bytes + s.managed_bytes, t.alloc_requested_bytes);
    EQ("plain+managed blocks", s.plain_blocks + s.managed_blocks, t.alloc_blocks);
    EQ("managed bytes", s.managed_bytes, t.managed_requested_bytes);
    EQ("vmm physical", s.vmm_physical_bytes, t.vmm_physical_bytes);
    EQ("vmm handles", s.vmm_handles, t.vmm_handles);
    EQ("pool reserved", s.pool_reserved_bytes, t.pool_reserved_bytes);
    EQ("pool used", s.pool_used_bytes, t.pool_used_bytes);
    EQ("pool blocks", s.pool_blocks, t.pool_blocks);
    if (dev == 0) {
        EQ("host pinned bytes", s.host_pinned_bytes, t.host_pinned_bytes);
        EQ("host pinned blocks", s.host_pinned_blocks, t.host_pinned_blocks);
    }
    /* tracked = everything the process took, except the context overhead */
    uint64_t driver_tracked =
        t.alloc_requested_bytes + t.vmm_physical_bytes + t.pool_reserved_bytes + t.graph_reserved_bytes;
    EQ("tracked total", s.tracked_bytes, driver_tracked);
    check_ledger_count += check_count - first;
}

static inline int check_finish(const char *name)
{
    /* the checks of the program's own calls, the same with or without the shim
       (tests/regress/e2e_pair.sh compares the two runs) */
    printf("api checks: %d\n", check_count - check_ledger_count);
    if (!p_stats)
        printf("%s: %d checks, ledger comparison skipped (no liboomguard.so)\n", name, check_count);
    else
        printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
