/* cuGetProcAddress answers checked against an independent table: the (name, cudaVersion,
 * flags) requests NVIDIA's libcudart 13 makes (shared/reference/cudart13-driver-lookups.txt,
 * the memory functions of it) plus a few neighbours, each with the ABI that the CUDA headers
 * say answers it.  test_hooks.c derives its expectations from hooks.def itself; this table
 * does not, so a wrong version or a wrong per-thread flag in hooks.def fails here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"

#define PTSZ   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
#define LEGACY CU_GET_PROC_ADDRESS_LEGACY_STREAM
#define PASS   NULL /* not ours: the driver's pointer comes back untouched */

static const struct {
    const char *name;
    int version;
    uint64_t flags;
    void *abi; /* our export of the ABI that answers, or PASS */
} table[] = {
    /* lines of cudart13-driver-lookups.txt */
    { "cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress },
    { "cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2 },
    { "cuDeviceTotalMem", 3020, 0, (void *)cuDeviceTotalMem_v2 },
    { "cuDevicePrimaryCtxReset", 7000, 0, (void *)cuDevicePrimaryCtxReset },
    { "cuMemGetInfo", 3020, 0, (void *)cuMemGetInfo_v2 },
    { "cuMemAllocManaged", 6000, 0, (void *)cuMemAllocManaged },
    { "cuMemAlloc", 3020, 0, (void *)cuMemAlloc_v2 },
    { "cuMemAllocPitch", 3020, 0, (void *)cuMemAllocPitch_v2 },
    { "cuMemFree", 3020, 0, (void *)cuMemFree_v2 },
    { "cuMemFreeHost", 2000, 0, (void *)cuMemFreeHost },
    { "cuMemHostAlloc", 2020, 0, (void *)cuMemHostAlloc },
    { "cuMemAllocAsync", 11020, 0, (void *)cuMemAllocAsync },
    { "cuMemAllocAsync", 11020, PTSZ, (void *)cuMemAllocAsync_ptsz },
    { "cuMemAllocFromPoolAsync", 11020, 0, (void *)cuMemAllocFromPoolAsync },
    { "cuMemAllocFromPoolAsync", 11020, PTSZ, (void *)cuMemAllocFromPoolAsync_ptsz },
    { "cuMemFreeAsync", 11020, 0, (void *)cuMemFreeAsync },
    { "cuMemFreeAsync", 11020, PTSZ, (void *)cuMemFreeAsync_ptsz },
    { "cuMemPoolTrimTo", 11020, 0, (void *)cuMemPoolTrimTo },
    { "cuMemPoolDestroy", 11020, 0, (void *)cuMemPoolDestroy },
    { "cuMemCreate", 12000, 0, (void *)cuMemCreate },
    { "cuDevicePrimaryCtxRelease", 7000, 0, (void *)cuDevicePrimaryCtxRelease },
    { "cuCtxSynchronize", 2000, 0, (void *)cuCtxSynchronize },
    { "cuCtxSynchronize", 13000, 0, (void *)cuCtxSynchronize_v2 },
    { "cuArrayCreate", 3020, 0, (void *)cuArrayCreate_v2 },
    { "cuArray3DCreate", 3020, 0, (void *)cuArray3DCreate_v2 },
    { "cuArrayDestroy", 2000, 0, (void *)cuArrayDestroy },
    { "cuMipmappedArrayCreate", 5000, 0, (void *)cuMipmappedArrayCreate },
    { "cuMipmappedArrayDestroy", 5000, 0, (void *)cuMipmappedArrayDestroy },
    { "cuEventSynchronize", 2000, 0, (void *)cuEventSynchronize },
    { "cuStreamSynchronize", 2000, 0, (void *)cuStreamSynchronize },
    { "cuStreamSynchronize", 7000, PTSZ, (void *)cuStreamSynchronize_ptsz },
    { "cuInit", 2000, 0, PASS },
    { "cuMemPoolGetAttribute", 11020, 0, PASS },
    { "cuMemcpyAsync", 7000, PTSZ, PASS },
    { "cuLaunchKernel", 7000, PTSZ, PASS },
    { "cuMemGetAddressRange", 3020, 0, PASS },
    { "cuDeviceGetAttribute", 2000, 0, PASS },
    /* the same functions asked by other runtimes and by programs */
    { "cuDevicePrimaryCtxReset", 11000, 0, (void *)cuDevicePrimaryCtxReset_v2 },
    { "cuDevicePrimaryCtxReset", 13000, 0, (void *)cuDevicePrimaryCtxReset_v2 },
    { "cuMemAlloc", 13000, 0, (void *)cuMemAlloc_v2 },
    { "cuMemAlloc", 2000, 0, PASS }, /* the 32-bit v1 ABI */
    { "cuMemGetInfo", 2000, 0, PASS },
    { "cuDeviceTotalMem", 2000, 0, PASS },
    { "cuMemAllocHost", 3020, 0, (void *)cuMemAllocHost_v2 },
    { "cuMemAllocHost", 2000, 0, PASS },
    { "cuMemAllocAsync", 11020, LEGACY, (void *)cuMemAllocAsync },
    { "cuMemAllocAsync", 11010, 0, PASS },                /* before stream-ordered allocation */
    { "cuMemAlloc", 12000, PTSZ, (void *)cuMemAlloc_v2 }, /* no per-thread variant: the legacy one */
    { "cuMemCreate", 10020, 0, (void *)cuMemCreate },
    { "cuMemCreate", 10010, 0, PASS },
    { "cuMemRelease", 12000, 0, (void *)cuMemRelease },
    { "cuMemMap", 12000, 0, (void *)cuMemMap },
    { "cuMemUnmap", 12000, 0, (void *)cuMemUnmap },
    { "cuMemRetainAllocationHandle", 11000, 0, (void *)cuMemRetainAllocationHandle },
    { "cuMemRetainAllocationHandle", 10020, 0, PASS },
    { "cuGetProcAddress", 11020, 0, PASS },
    { "cuDevicePrimaryCtxRelease", 11000, 0, (void *)cuDevicePrimaryCtxRelease_v2 },
    { "cuCtxDestroy", 2000, 0, (void *)cuCtxDestroy },
    { "cuCtxDestroy", 4000, 0, (void *)cuCtxDestroy_v2 },
    { "cuStreamSynchronize", 7000, LEGACY, (void *)cuStreamSynchronize },
};

static void every_request_gets_the_right_abi(void **state)
{
    static char driver_ptr[sizeof table / sizeof *table];
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        void *real = &driver_ptr[i];
        void *got = og_proc_wrapper(table[i].name, table[i].version, table[i].flags, real);
        void *want = table[i].abi ? table[i].abi : real;
        if (got != want)
            fail_msg("%s %d flags %llu: got %p, want %s", table[i].name, table[i].version,
                     (unsigned long long)table[i].flags, got,
                     table[i].abi ? "our wrapper of that ABI" : "the driver's");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_request_gets_the_right_abi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
