/* Regression tests for bugs that once passed the whole suite: each mode is one
 * scenario whose expected numbers are worked out by hand, checked against the shim's
 * counters, the simulator's ground truth, or (from tests/regress/run_regressions.sh) the dump.
 *
 *   regress MODE [ARG...]   modes: reset pool batch failed-free release cross-thread vmm-retain
 *                     invalid episode episode-pool episode-vmm warn-band warn-limit two-devices
 *                     pitch-host limit-exact limit-pool
 * Run with LD_PRELOAD=liboomguard.so, SIMGPU_DEVICES=2 SIMGPU_MEM=0:24GiB,1:16GiB. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include "check.h"

#define MiB      (1024ull * 1024)
#define GiB      (1024ull * MiB)
#define OK(call) CHECK((call) == 0, "%s", #call)

/* DEV current, with its primary context made (cudaFree(0): how CUDA programs force it) */
static void use_device(int dev)
{
    OK(cudaSetDevice(dev));
    OK(cudaFree(0));
}

/* DEV current, its default stream-ordered pool set to keep all it reserves, and BYTES reserved in it
 * (allocated and freed again): the pool holds them unused */
static cudaMemPool_t pool_keeping(int dev, size_t bytes)
{
    void *a;
    cudaMemPool_t pool;
    OK(cudaSetDevice(dev));
    OK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep_all = UINT64_MAX;
    OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    OK(cudaMallocAsync(&a, bytes, 0));
    OK(cudaFreeAsync(a, 0));
    OK(cudaStreamSynchronize(0));
    return pool;
}

/* the properties of plain VMM device memory on DEV, for cuMemCreate */
static CUmemAllocationProp vmm_prop(int dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    return prop;
}

static oomguard_device_stats_t stats(int dev)
{
    oomguard_device_stats_t s;
    memset(&s, 0, sizeof s);
    if (p_stats)
        CHECK(p_stats(dev, &s) == 0, "stats of device %d", dev);
    return s;
}

/* cudaDeviceReset frees every plain and managed block of that device's primary context,
 * and nothing on another device. */
static void mode_reset(void)
{
    void *keep0, *plain1, *managed1;
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&keep0, 8 * MiB));
    OK(cudaSetDevice(1));
    OK(cudaMalloc(&plain1, 32 * MiB));
    OK(cudaMallocManaged(&managed1, 64 * MiB, cudaMemAttachGlobal));
    oomguard_device_stats_t s = stats(1);
    CHECK(s.managed_bytes == 64 * MiB && s.managed_blocks == 1, "managed block on device 1 before the reset");
    /* a block of another context on device 1: the primary context's reset leaves it */
    CUcontext prim, created;
    CUdeviceptr other;
    OK(cuCtxGetCurrent(&prim));
    OK(cuCtxCreate(&created, NULL, 0, 1));
    OK(cuMemAlloc(&other, 16 * MiB));
    OK(cuCtxSetCurrent(prim));
    OK(cudaDeviceReset());
    s = stats(1);
    CHECK(s.plain_bytes == 16 * MiB && s.managed_bytes == 0,
          "device 1 after reset: %llu plain, %llu managed bytes "
          "(want only the other context's 16 MiB)",
          (unsigned long long)s.plain_bytes, (unsigned long long)s.managed_bytes);
    CHECK(s.plain_blocks == 1 && s.managed_blocks == 0, "device 1 after reset: %llu plain, %llu managed blocks",
          (unsigned long long)s.plain_blocks, (unsigned long long)s.managed_blocks);
    check_device(1, "after reset");
    OK(cuCtxDestroy(created));
    s = stats(1);
    CHECK(s.plain_bytes + s.managed_bytes == 0 && s.plain_blocks + s.managed_blocks == 0,
          "device 1 with both contexts gone: nothing left");
    check_device(1, "other context destroyed");
    s = stats(0);
    CHECK(s.plain_bytes == 8 * MiB && s.plain_blocks == 1, "device 0 keeps its block across device 1's reset");
    check_device(0, "other device after reset");
    OK(cudaSetDevice(0));
    OK(cudaFree(keep0));
    check_device(0, "freed");
}

/* A pool of device 1 used while device 0 is current: the pool's device is charged. */
static void mode_pool(void)
{
    cudaMemPool_t pool1;
    OK(cudaSetDevice(1));
    OK(cudaDeviceGetDefaultMemPool(&pool1, 1));
    use_device(0);
    void *p = NULL;
    OK(cudaMallocFromPoolAsync(&p, 64 * MiB, pool1, 0));
    OK(cudaStreamSynchronize(0));
    oomguard_device_stats_t s0 = stats(0), s1 = stats(1);
    CHECK(s0.pool_used_bytes == 0 && s0.pool_blocks == 0, "device 0 shows %llu pool bytes",
          (unsigned long long)s0.pool_used_bytes);
    CHECK(s1.pool_used_bytes == 64 * MiB && s1.pool_blocks == 1, "device 1 shows %llu pool bytes",
          (unsigned long long)s1.pool_used_bytes);
    check_device(0, "pool of device 1 used from device 0");
    check_device(1, "pool of device 1 used from device 0");
    OK(cudaFreeAsync(p, 0));
    OK(cudaStreamSynchronize(0));
    check_device(1, "pool block freed");
}

/* 64 x 1 MiB allocated, then freed, then a request that fails: the failure event's live
 * bytes must be the usage within one batch step (checked in the dump by the script). */
static void mode_batch(void)
{
    void *keep, *p;
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&keep, 3 * MiB));
    void *blocks[64];
    for (int i = 0; i < 64; i++)
        OK(cudaMalloc(&blocks[i], 1 * MiB));
    for (int i = 0; i < 64; i++)
        OK(cudaFree(blocks[i]));
    CHECK(cudaMalloc(&p, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    (void)cudaGetLastError();
    check_device(0, "after the batch");
}

/* A free the driver refuses (no current context): the block stays, allocs +1, frees +0. */
static void mode_failed_free(void)
{
    use_device(0);
    oomguard_device_stats_t before = stats(0);
    CUdeviceptr d;
    OK(cuMemAlloc(&d, 5 * MiB));
    CUcontext ctx;
    OK(cuCtxGetCurrent(&ctx));
    OK(cuCtxSetCurrent(NULL));
    CUresult r = cuMemFree(d);
    CHECK(r != CUDA_SUCCESS, "cuMemFree without a context must fail (got %d)", (int)r);
    OK(cuCtxSetCurrent(ctx));
    oomguard_device_stats_t after = stats(0);
    if (p_stats) {
        CHECK(after.allocs == before.allocs + 1, "allocs moved by %lld, want +1",
              (long long)(after.allocs - before.allocs));
        CHECK(after.frees == before.frees, "frees moved by %lld, want 0", (long long)(after.frees - before.frees));
        CHECK(after.plain_blocks == before.plain_blocks + 1 && after.plain_bytes == before.plain_bytes + 5 * MiB,
              "the block is still in the ledger");
    }
    check_device(0, "after the refused free");
    OK(cuMemFree(d));
    after = stats(0);
    if (p_stats)
        CHECK(after.frees == before.frees + 1 && after.plain_blocks == before.plain_blocks, "then freed once");
    check_device(0, "after the real free");
}

/* The driver's answer to a bogus release reaches the caller, shim or not. */
static void mode_release(void)
{
    use_device(0);
    CUresult r = cuMemRelease((CUmemGenericAllocationHandle)0xdeadbeefull);
    printf("cuMemRelease(bogus) = %d\n", (int)r);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "cuMemRelease of a bogus handle returned %d, want %d", (int)r,
          (int)CUDA_ERROR_INVALID_VALUE);
    /* the same for every other hooked call the driver refuses (the script compares the lines) */
    CUdeviceptr bogus = (CUdeviceptr)0x7f0000001000ull;
    CUmemGenericAllocationHandle h;
    printf("cuMemFree(bogus) = %d\n", (int)cuMemFree(bogus));
    printf("cuMemFreeAsync(bogus) = %d\n", (int)cuMemFreeAsync(bogus, 0));
    printf("cuMemFreeHost(bogus) = %d\n", (int)cuMemFreeHost((void *)0x1000));
    printf("cuMemUnmap(bogus) = %d\n", (int)cuMemUnmap(bogus, 2 * MiB));
    printf("cuMemMap(bogus) = %d\n", (int)cuMemMap(bogus, 2 * MiB, 0, (CUmemGenericAllocationHandle)0xdeadbeefull, 0));
    printf("cuMemRetainAllocationHandle(bogus) = %d\n", (int)cuMemRetainAllocationHandle(&h, (void *)bogus));
    printf("cuMemAlloc(0) = %d\n", (int)cuMemAlloc(&bogus, 0));
    printf("cuMemAllocManaged(0) = %d\n", (int)cuMemAllocManaged(&bogus, 0, CU_MEM_ATTACH_GLOBAL));
}

/* Blocks allocated by one thread and freed by another (autograd's pattern). */
#define XT_N 32
static void *xt_ptrs[XT_N];
static void *xt_alloc(void *arg)
{
    cudaSetDevice(0);
    for (int i = 0; i < XT_N; i++)
        if (cudaMalloc(&xt_ptrs[i], (size_t)(i + 1) * MiB) != cudaSuccess)
            return (void *)1;
    return NULL;
}
static void *xt_free(void *arg)
{
    cudaSetDevice(0);
    for (int i = 0; i < XT_N; i++)
        if (cudaFree(xt_ptrs[i]) != cudaSuccess)
            return (void *)1;
    return NULL;
}
static void mode_cross_thread(void)
{
    OK(cudaSetDevice(0));
    oomguard_device_stats_t before = stats(0);
    pthread_t t;
    void *rv;
    pthread_create(&t, NULL, xt_alloc, NULL);
    pthread_join(t, &rv);
    CHECK(rv == NULL, "allocating thread");
    check_device(0, "allocated by thread A");
    pthread_create(&t, NULL, xt_free, NULL);
    pthread_join(t, &rv);
    CHECK(rv == NULL, "freeing thread");
    oomguard_device_stats_t after = stats(0);
    if (p_stats) {
        CHECK(after.frees == before.frees + XT_N, "frees +%lld, want +%d", (long long)(after.frees - before.frees),
              XT_N);
        CHECK(after.unknown_frees == before.unknown_frees, "no free is unknown (%llu)",
              (unsigned long long)after.unknown_frees);
        CHECK(after.plain_blocks == before.plain_blocks, "no block left");
    }
    check_device(0, "freed by thread B");
}

/* VMM: a retained handle needs one more release; mapped memory lives until unmapped. */
static void mode_vmm_retain(void)
{
    use_device(1);
    CUmemAllocationProp prop = vmm_prop(1);
    CUmemGenericAllocationHandle h, h2;
    OK(cuMemCreate(&h, 8 * MiB, &prop, 0));
    CUdeviceptr va;
    OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    OK(cuMemMap(va, 8 * MiB, 0, h, 0));
    OK(cuMemRetainAllocationHandle(&h2, (void *)va));
    CHECK(h2 == h, "retained handle is the same");
    OK(cuMemRelease(h));
    check_device(1, "released once, retained, mapped");
    OK(cuMemUnmap(va, 8 * MiB));
    check_device(1, "unmapped, one reference left");
    if (p_stats)
        CHECK(stats(1).vmm_physical_bytes == 8 * MiB, "still held by the retained reference");
    OK(cuMemRelease(h2));
    check_device(1, "all released");
    if (p_stats)
        CHECK(stats(1).vmm_physical_bytes == 0, "gone");
    OK(cuMemAddressFree(va, 8 * MiB));
    /* a failed cuMemCreate on device 1 while device 0 is current is device 1's failure */
    OK(cudaSetDevice(0));
    uint64_t f0 = stats(0).failures, f1 = stats(1).failures;
    CHECK(cuMemCreate(&h, 64 * GiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "64 GiB VMM must fail");
    if (p_stats)
        CHECK(stats(1).failures == f1 + 1 && stats(0).failures == f0, "the failure is device 1's");
}

/* An invalid request is the program's error: no failure counted, no dump. */
static void mode_invalid(void)
{
    use_device(0);
    CUdeviceptr d;
    CUresult r = cuMemAlloc(&d, 0);
    CHECK(r == CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(0) = %d", (int)r);
    if (p_stats)
        CHECK(stats(0).failures == 0, "no failure counted");
}

/* The recovered episode: 4 GiB held; 30 GiB fails; the 4 GiB freed; 29 GiB fails; a small
 * unrelated allocation; 20 GiB succeeds.  The script checks the dump. */
static void mode_episode(void)
{
    void *a, *big, *small, *ok;
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&a, 4 * GiB));
    CHECK(cudaMalloc(&big, 30 * GiB) == cudaErrorMemoryAllocation, "30 GiB fails");
    (void)cudaGetLastError();
    OK(cudaFree(a));
    CHECK(cudaMalloc(&big, 29 * GiB) == cudaErrorMemoryAllocation, "29 GiB fails");
    (void)cudaGetLastError();
    if (getenv("REGRESS_NO_RECOVERY")) /* the job dies here: the second attempt is final */
        return;
    OK(cudaMalloc(&small, 1 * MiB));
    OK(cudaMalloc(&ok, 20 * GiB));
    check_device(0, "after the recovery");
    cudaFree(ok);
    cudaFree(small);
}

/* The framework's release between attempts through a pool trim and through a VMM release:
 * 4 GiB held, 30 GiB fails, the 4 GiB given back, 29 GiB fails (the script checks that the
 * dump says 4 GiB were released between the attempts). */
static void mode_episode_pool(void)
{
    void *big;
    cudaMemPool_t pool = pool_keeping(0, 4 * GiB), other; /* the pool keeps the 4 GiB reserved */
    /* the failing requests come from a second pool (a failing pool trims itself first) */
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    OK(cudaMemPoolCreate(&other, &props));
    CHECK(cudaMallocFromPoolAsync(&big, 30 * GiB, other, 0) == cudaErrorMemoryAllocation, "30 GiB fails");
    (void)cudaGetLastError();
    OK(cudaMemPoolTrimTo(pool, 0));
    CHECK(cudaMallocFromPoolAsync(&big, 29 * GiB, other, 0) == cudaErrorMemoryAllocation, "29 GiB fails");
    (void)cudaGetLastError();
}

static void mode_episode_vmm(void)
{
    use_device(0);
    CUmemAllocationProp prop = vmm_prop(0);
    CUmemGenericAllocationHandle h;
    CUdeviceptr d;
    OK(cuMemCreate(&h, 4 * GiB, &prop, 0));
    CHECK(cuMemAlloc(&d, 30 * GiB) == CUDA_ERROR_OUT_OF_MEMORY, "30 GiB fails");
    OK(cuMemRelease(h));
    CHECK(cuMemAlloc(&d, 29 * GiB) == CUDA_ERROR_OUT_OF_MEMORY, "29 GiB fails");
}

/* Under OOMGUARD_LIMIT (1:4GiB) the limited view is exact: every small allocation shows at
 * once in the free memory cudaMemGetInfo reports (nothing is batched while a limit is set). */
static void mode_limit_exact(void)
{
    void *p[3];
    size_t f0, f, t;
    use_device(1);
    OK(cudaMemGetInfo(&f0, &t));
    CHECK(t == 4 * GiB, "limited total %zu", t);
    for (int i = 0; i < 3; i++) {
        OK(cudaMalloc(&p[i], 1 * MiB));
        OK(cudaMemGetInfo(&f, &t));
        CHECK(f == f0 - (size_t)(i + 1) * MiB, "after %d x 1 MiB: free %zu, want %zu", i + 1, f,
              (size_t)(f0 - (size_t)(i + 1) * MiB));
    }
    for (int i = 0; i < 3; i++)
        OK(cudaFree(p[i]));
    OK(cudaMemGetInfo(&f, &t));
    CHECK(f == f0, "all freed: free %zu, want %zu", f, f0);
}

/* Under OOMGUARD_LIMIT (1:4GiB) a pool serves from its unused reservation first: 3 GiB
 * reserved and free again in the pool, 2 GiB more from it needs no new memory and passes
 * although 3.5 GiB (context included) already count against the limit. */
static void mode_limit_pool(void)
{
    void *a, *b;
    pool_keeping(1, 3 * GiB);
    CHECK(cudaMallocAsync(&b, 2 * GiB, 0) == cudaSuccess, "2 GiB from the pool's spare reservation refused");
    (void)cudaGetLastError();
    OK(cudaFreeAsync(b, 0));
    OK(cudaStreamSynchronize(0));
    CHECK(cudaMalloc(&a, 1 * GiB) == cudaErrorMemoryAllocation, "1 GiB of new memory must be refused");
    (void)cudaGetLastError();
    check_device(1, "pool under the limit");
}

/* OOMGUARD_WARN_AT=50% of 24 GiB (12 GiB), re-armed below 95% of it (11.4 GiB):
 * 13 GiB warns; down to 10; up to 11.5 (inside the band: not re-armed) and 12.5: no new
 * warning; down to 0 and up to 12.5: the second warning.  The script counts them. */
static void mode_warn_band(void)
{
    void *a, *b, *c, *d;
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&a, 10 * GiB));
    OK(cudaMalloc(&b, 3 * GiB));    /* 13 GiB: warning 1 */
    OK(cudaFree(b));                /* 10 GiB */
    OK(cudaMalloc(&c, 1536 * MiB)); /* 11.5 GiB */
    OK(cudaMalloc(&d, 1 * GiB));    /* 12.5 GiB */
    OK(cudaFree(d));
    OK(cudaFree(c));
    OK(cudaFree(a));                /* 0 */
    OK(cudaMalloc(&a, 10 * GiB));   /* 10 GiB: re-armed */
    OK(cudaMalloc(&b, 2560 * MiB)); /* 12.5 GiB: warning 2 */
    OK(cudaFree(b));
    OK(cudaFree(a));
}

/* OOMGUARD_LIMIT=8GiB, OOMGUARD_WARN_AT=50%: the threshold is half the limit, 4 GiB. */
static void mode_warn_limit(void)
{
    void *a;
    OK(cudaSetDevice(0));
    OK(cudaMalloc(&a, 5 * GiB));
    OK(cudaFree(a));
}

/* One failure on each device (OOMGUARD_MAX_DUMPS is checked by the script). */
static void mode_two_devices(void)
{
    void *p;
    for (int dev = 0; dev < 2; dev++) {
        OK(cudaSetDevice(dev));
        CHECK(cudaMalloc(&p, 30 * GiB) == cudaErrorMemoryAllocation, "30 GiB on device %d fails", dev);
        (void)cudaGetLastError();
    }
    OK(cudaSetDevice(0));
    CHECK(cudaMalloc(&p, 40 * GiB) == cudaErrorMemoryAllocation, "40 GiB on device 0 fails");
    (void)cudaGetLastError();
}

/* Pitched rows are padded by the driver; pinned host memory is counted and given back. */
static void mode_pitch_host(void)
{
    void *p, *h;
    size_t pitch = 0;
    OK(cudaSetDevice(1));
    OK(cudaMallocPitch(&p, &pitch, 1000, 333));
    CHECK(pitch > 1000, "the simulator pads rows (pitch %zu)", pitch);
    if (p_stats)
        CHECK(stats(1).plain_bytes == (uint64_t)pitch * 333, "pitched block counted as pitch x height");
    check_device(1, "pitched");
    OK(cudaMallocHost(&h, 3 * MiB));
    check_device(0, "pinned");
    OK(cudaFreeHost(h));
    check_device(0, "pinned freed");
    if (p_stats)
        CHECK(stats(0).host_pinned_bytes == 0 && stats(0).host_pinned_blocks == 0, "no pinned memory left");
    OK(cudaFree(p));
    check_device(1, "pitched freed");
}

static const struct {
    const char *name;
    void (*fn)(void);
} modes[] = {
    { "reset", mode_reset },
    { "pool", mode_pool },
    { "batch", mode_batch },
    { "failed-free", mode_failed_free },
    { "release", mode_release },
    { "cross-thread", mode_cross_thread },
    { "vmm-retain", mode_vmm_retain },
    { "invalid", mode_invalid },
    { "episode", mode_episode },
    { "warn-band", mode_warn_band },
    { "warn-limit", mode_warn_limit },
    { "two-devices", mode_two_devices },
    { "pitch-host", mode_pitch_host },
    { "episode-pool", mode_episode_pool },
    { "episode-vmm", mode_episode_vmm },
    { "limit-exact", mode_limit_exact },
    { "limit-pool", mode_limit_pool },
};

int main(int argc, char **argv)
{
    if (argc < 2) { /* more arguments are ignored (the redaction test passes secrets) */
        fprintf(stderr, "usage: %s MODE\n", argv[0]);
        return 2;
    }
    OK(cuInit(0));
    if (check_setup() < 0)
        return 1;
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        if (strcmp(argv[1], modes[i].name) == 0) {
            modes[i].fn();
            return check_finish(argv[1]);
        }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
