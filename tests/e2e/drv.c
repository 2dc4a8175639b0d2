/* Real-driver robustness, one mode per scenario; run by
 * tests/e2e/run_drv.sh, which checks the dumps.  Ends with "N checks, N failed".
 *   oom        1 GiB held, then a request that cannot fit: a dump (NVML's view in it)
 *   inval      size 0 and a NULL pointer: the program's errors, not failures
 *   huge       requests of 2^53 and SIZE_MAX bytes
 *   history    300 events on one thread, then a failure (OOMGUARD_HISTORY decides how many)
 *   pools      stream-ordered pools giving memory back at synchronisation; with a limit
 *   manypools  300 pools, one block each: every one counted
 *   unreadable pools whose reservation the driver will not tell
 *   arrays     CUDA arrays through the driver and the runtime
 *   ctx        a created context destroyed, a primary context released to zero
 *   ipc        a child process opens this one's memory: mapped there, not allocated
 *   graph      the device's graph memory, counted and trimmed
 *   dlmopen    a driver opened in another link-map namespace is left alone
 *   summary    allocations, then a normal exit (OOMGUARD_SUMMARY decides the rest)
 *   lookups    no dlopen by the shim inside allocations, failures and dumps included */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "check.h"

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

static void truth_line(int dev)
{
    simgpu_truth_t t;
    p_truth(dev, &t);
    printf("truth dev=%d used=%llu other=%llu\n", dev, t.used_bytes, t.other_process_bytes);
    fflush(stdout);
}

static int mode_oom(void)
{
    void *a, *b;
    cudaSetDevice(0);
    CHECK(cudaMalloc(&a, 1 * GiB) == cudaSuccess, "1 GiB");
    CHECK(cudaMalloc(&b, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    truth_line(0);
    check_device(0, "oom");
    cudaFree(a);
    return 0;
}

static int mode_inval(void)
{
    CUdeviceptr p;
    cudaSetDevice(0);
    cudaFree(0); /* context */
    CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE, "size 0");
    CHECK(cuMemAlloc(NULL, 1 * MiB) == CUDA_ERROR_INVALID_VALUE, "NULL out-pointer");
    CHECK(cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_INVALID_VALUE, "managed size 0");
    oomguard_device_stats_t s;
    if (p_stats) {
        p_stats(0, &s);
        CHECK(s.failures == 0, "invalid values counted as %llu failures", (unsigned long long)s.failures);
    }
    check_device(0, "inval");
    return 0;
}

static int mode_huge(void)
{
    CUdeviceptr p;
    cudaSetDevice(0);
    cudaFree(0);
    CHECK(cuMemAlloc(&p, (size_t)1 << 53) == CUDA_ERROR_OUT_OF_MEMORY, "2^53");
    CHECK(cuMemAlloc(&p, SIZE_MAX) == CUDA_ERROR_OUT_OF_MEMORY, "SIZE_MAX");
    return 0;
}

static int mode_history(void)
{
    void *p;
    cudaSetDevice(0);
    for (int i = 0; i < 150; i++) {
        CHECK(cudaMalloc(&p, 1 * MiB) == cudaSuccess, "small");
        cudaFree(p);
    }
    CHECK(cudaMalloc(&p, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    return 0;
}

static int mode_pools(void)
{
    cudaStream_t s;
    void *p, *q;
    cudaSetDevice(1); /* 16 GiB; run with OOMGUARD_LIMIT=1:4GiB */
    cudaStreamCreate(&s);
    /* default pool, release threshold 0: the 3 GiB go back at the synchronisation */
    CHECK(cudaMallocAsync(&p, 3 * GiB, s) == cudaSuccess, "3 GiB from the pool");
    check_device(1, "pool grown");
    CHECK(cudaFreeAsync(p, s) == cudaSuccess, "free async");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    /* fits under a 4 GiB limit only if the pool's return was seen (no query in between: a
     * dump or a stats call would re-read the pools and hide a missed synchronisation) */
    CHECK(cudaMalloc(&q, 3 * GiB) == cudaSuccess, "3 GiB plain after the pool gave back");
    check_device(1, "plain after pool");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(1, &st);
        CHECK(st.peak_tracked_bytes <= 3 * GiB + 64 * MiB, "peak %llu: the pool's 3 GiB counted twice",
              (unsigned long long)st.peak_tracked_bytes);
    }
    cudaFree(q);
    /* again through the device-wide synchronisation and an event */
    cudaEvent_t e;
    cudaEventCreate(&e);
    CHECK(cudaMallocAsync(&p, 2 * GiB, s) == cudaSuccess, "2 GiB");
    cudaFreeAsync(p, s);
    cudaEventRecord(e, s);
    cudaEventSynchronize(e);
    CHECK(cudaMalloc(&q, 3 * GiB) == cudaSuccess, "3 GiB plain after the event");
    cudaFree(q);
    check_device(1, "after event synchronisation");
    CHECK(cudaMallocAsync(&p, 2 * GiB, s) == cudaSuccess, "2 GiB");
    cudaFreeAsync(p, s);
    cudaDeviceSynchronize();
    CHECK(cudaMalloc(&q, 3 * GiB) == cudaSuccess, "3 GiB plain after the device synchronisation");
    cudaFree(q);
    check_device(1, "after device synchronisation");
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    return 0;
}

static int mode_manypools(void)
{
    enum { N = 300 };
    static cudaMemPool_t pools[N];
    static void *blocks[N];
    cudaSetDevice(0);
    cudaFree(0);
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    for (int i = 0; i < N; i++) {
        CHECK(cudaMemPoolCreate(&pools[i], &props) == cudaSuccess, "pool %d", i);
        CHECK(cudaMallocFromPoolAsync(&blocks[i], 1 * MiB, pools[i], 0) == cudaSuccess, "block %d", i);
    }
    check_device(0, "300 pools");
    for (int i = 0; i < N; i++) {
        cudaFreeAsync(blocks[i], 0);
        cudaMemPoolDestroy(pools[i]);
    }
    check_device(0, "300 pools destroyed");
    return 0;
}

static int mode_unreadable(void)
{
    void *p, *q;
    cudaSetDevice(0);
    CHECK(cudaMallocAsync(&p, 1 * GiB, 0) == cudaSuccess, "1 GiB from an unreadable pool");
    CHECK(cudaMallocAsync(&q, 512 * MiB, 0) == cudaSuccess, "512 MiB");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.tracked_bytes == 1536 * MiB, "tracked %llu: what the pool handed out",
              (unsigned long long)st.tracked_bytes);
        CHECK(st.pool_used_bytes == 1536 * MiB, "pool used %llu", (unsigned long long)st.pool_used_bytes);
    }
    void *big;
    CHECK(cudaMalloc(&big, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    cudaFreeAsync(q, 0);
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.tracked_bytes == 1 * GiB, "tracked %llu after a free", (unsigned long long)st.tracked_bytes);
    }
    cudaFreeAsync(p, 0);
    return 0;
}

static int mode_arrays(void)
{
    cudaSetDevice(0);
    cudaFree(0);
    CUarray a2, a3;
    CUmipmappedArray mm;
    CUDA_ARRAY_DESCRIPTOR d2 = { 4096, 4096, CU_AD_FORMAT_FLOAT, 4 };                /* 256 MiB */
    CUDA_ARRAY3D_DESCRIPTOR d3 = { 512, 512, 64, CU_AD_FORMAT_UNSIGNED_INT8, 2, 0 }; /* 32 MiB */
    CUDA_ARRAY3D_DESCRIPTOR dm = { 1024, 1024, 0, CU_AD_FORMAT_HALF, 1, 0 };
    CHECK(cuArrayCreate(&a2, &d2) == CUDA_SUCCESS, "cuArrayCreate");
    CHECK(cuArray3DCreate(&a3, &d3) == CUDA_SUCCESS, "cuArray3DCreate");
    CHECK(cuMipmappedArrayCreate(&mm, &dm, 5) == CUDA_SUCCESS, "cuMipmappedArrayCreate");
    check_device(0, "driver arrays");
    cudaArray_t ra, r3;
    cudaMipmappedArray_t rm;
    struct cudaChannelFormatDesc ch = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    CHECK(cudaMallocArray(&ra, &ch, 1024, 1024, 0) == cudaSuccess, "cudaMallocArray");
    CHECK(cudaMalloc3DArray(&r3, &ch, (struct cudaExtent){ 256, 256, 16 }, 0) == cudaSuccess, "cudaMalloc3DArray");
    CHECK(cudaMallocMipmappedArray(&rm, &ch, (struct cudaExtent){ 512, 512, 0 }, 4, 0) == cudaSuccess,
          "cudaMallocMipmappedArray");
    check_device(0, "runtime arrays");
    CUarray big;
    CUDA_ARRAY_DESCRIPTOR db = { 1 << 20, 1 << 16, CU_AD_FORMAT_FLOAT, 4 }; /* 1 TiB */
    CHECK(cuArrayCreate(&big, &db) == CUDA_ERROR_OUT_OF_MEMORY, "1 TiB array must fail");
    cudaFreeArray(ra);
    cudaFreeArray(r3);
    cudaFreeMipmappedArray(rm);
    cuArrayDestroy(a2);
    cuArrayDestroy(a3);
    cuMipmappedArrayDestroy(mm);
    check_device(0, "arrays freed");
    return 0;
}

static int mode_ctx(void)
{
    CUdevice dev;
    CUcontext created, prim;
    CUdeviceptr a, b, c;
    cuInit(0);
    cuDeviceGet(&dev, 1);
    /* primary context with a block, and a created context with two */
    CHECK(cuDevicePrimaryCtxRetain(&prim, dev) == CUDA_SUCCESS, "retain");
    cuCtxSetCurrent(prim);
    CHECK(cuMemAlloc(&a, 64 * MiB) == CUDA_SUCCESS, "primary block");
    CHECK(cuCtxCreate(&created, NULL, 0, dev) == CUDA_SUCCESS, "create");
    CHECK(cuMemAlloc(&b, 128 * MiB) == CUDA_SUCCESS, "created block 1");
    CHECK(cuMemAllocManaged(&c, 32 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "created block 2");
    check_device(1, "two contexts");
    CHECK(cuCtxDestroy(created) == CUDA_SUCCESS, "destroy");
    check_device(1, "created context destroyed: its blocks gone, the primary's kept");
    cuCtxSetCurrent(prim);
    CHECK(cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS, "release to zero");
    check_device(1, "primary context released to zero");
    return 0;
}

static int mode_dlmopen(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* an instrumented library in a second namespace needs a second sanitizer runtime */
    printf("skipped: the sanitizer runtimes do not support dlmopen\n");
    return 0;
#endif
    void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("skipped: dlmopen unavailable here (%s)\n", dlerror());
        return 0;
    }
    const char *names[] = { "cuMemAlloc_v2", "cuMemFree_v2", "cuGetProcAddress_v2" };
    for (int i = 0; i < 3; i++) {
        void *f = dlsym(h, names[i]);
        Dl_info info;
        CHECK(f && dladdr(f, &info) && info.dli_fname && !strstr(info.dli_fname, "liboomguard"),
              "%s of the other namespace answered by %s", names[i], f && dladdr(f, &info) ? info.dli_fname : "?");
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = (CUresult(*)(CUcontext))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CUcontext ctx;
    CUdeviceptr p;
    CHECK(init && init(0) == CUDA_SUCCESS && retain(&ctx, 0) == CUDA_SUCCESS && setcur(ctx) == CUDA_SUCCESS,
          "other namespace's driver starts");
    CHECK(alloc && alloc(&p, 256 * MiB) == CUDA_SUCCESS, "allocation in the other namespace");
    /* the default namespace's driver and the ledger saw none of it */
    cudaSetDevice(0);
    cudaFree(0);
    check_device(0, "dlmopen");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.tracked_bytes == 0, "other namespace's 256 MiB tracked (%llu)", (unsigned long long)st.tracked_bytes);
    }
    return 0;
}

/* dlopen as the shim sees it: this program exports its own (-Wl,--export-dynamic-symbol), so
 * the shim's calls land here; those made from liboomguard.so while `counting` are counted. */
static __thread int
    counting; /* this thread's allocations only: a dump's symbolizing helper may dlopen libdw meanwhile */
static int shim_dlopens;
void *dlopen(const char *file, int mode)
{
    static void *(*real)(const char *, int);
    if (!real)
        real = (void *(*)(const char *, int))dlvsym(RTLD_NEXT, "dlopen", "GLIBC_2.34");
    if (!real)
        real = (void *(*)(const char *, int))dlvsym(RTLD_NEXT, "dlopen", "GLIBC_2.2.5");
    Dl_info info;
    if (counting && dladdr(__builtin_return_address(0), &info) && info.dli_fname &&
        strstr(info.dli_fname, "liboomguard")) {
        shim_dlopens++;
        fprintf(stderr, "shim dlopen(%s) inside an allocation\n", file ? file : "NULL");
    }
    return real(file, mode);
}

/* no dlopen (of NVML or the driver) and no look-up inside an allocation, a failure
 * included (its dump asks the driver and NVML); run with OOMGUARD_LIMIT so that the limit's
 * NVML query is on the path too */
static int mode_lookups(void)
{
    void *p, *q, *big;
    cudaSetDevice(0);
    cudaFree(0); /* the runtime starts: the driver is in the process */
    counting = 1;
    for (int i = 0; i < 100; i++) {
        CHECK(cudaMalloc(&p, 1 * MiB) == cudaSuccess, "small");
        cudaFree(p);
    }
    CHECK(cudaMallocAsync(&q, 64 * MiB, 0) == cudaSuccess, "pool");
    cudaFreeAsync(q, 0);
    CHECK(cudaMalloc(&big, 100 * GiB) == cudaErrorMemoryAllocation, "over the limit");
    CHECK(cudaMalloc(&big, 8 * GiB) == cudaErrorMemoryAllocation, "refused by the limit");
    counting = 0;
    CHECK(shim_dlopens == 0, "%d dlopen calls from the shim inside allocations", shim_dlopens);
    return 0;
}

/* the parent exports 256 MiB; a child process (the shim preloaded too) opens it:
 * mapped there, not allocated there.  The child fails an allocation so that its dump says so. */
static int mode_ipc(const char *self)
{
    CUdeviceptr p;
    CUipcMemHandle h;
    cudaSetDevice(0);
    cudaFree(0);
    CHECK(cuMemAlloc(&p, 256 * MiB) == CUDA_SUCCESS, "256 MiB to export");
    CHECK(cuIpcGetMemHandle(&h, p) == CUDA_SUCCESS, "handle");
    char hex[2 * sizeof h + 1];
    for (size_t i = 0; i < sizeof h; i++)
        sprintf(hex + 2 * i, "%02x", (unsigned char)h.reserved[i]);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s ipc-child %s", self, hex);
    CHECK(system(cmd) == 0, "child failed");
    return 0;
}

static int mode_ipc_child(const char *hex)
{
    CUipcMemHandle h;
    CUdeviceptr p;
    for (size_t i = 0; i < sizeof h; i++) {
        unsigned v = 0;
        sscanf(hex + 2 * i, "%2x", &v);
        h.reserved[i] = (char)v;
    }
    cudaSetDevice(0);
    cudaFree(0);
    CHECK(cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS, "open");
    simgpu_truth_t t;
    p_truth(0, &t);
    CHECK(t.ipc_mapped_bytes == 256 * MiB, "driver: %llu mapped", t.ipc_mapped_bytes);
    check_device(0, "ipc child: mapped, nothing allocated");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.tracked_bytes == 0 && st.plain_blocks == 0, "the mapping counted as ours: %llu bytes",
              (unsigned long long)st.tracked_bytes);
    }
    void *big;
    CHECK(cudaMalloc(&big, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS, "close");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.unknown_frees == 0, "the close was an unknown free");
    }
    return 0;
}

/* graph memory (SIMGPU_GRAPH_MEM=0:1GiB stands for graphs already run) is counted,
 * and leaves the ledger when the graph pool is trimmed */
static int mode_graph(void)
{
    void *p;
    cudaSetDevice(0);
    CHECK(cudaMalloc(&p, 64 * MiB) == cudaSuccess, "64 MiB");
    check_device(0, "graph memory counted");
    if (p_stats) {
        oomguard_device_stats_t st;
        p_stats(0, &st);
        CHECK(st.tracked_bytes == 64 * MiB + 1 * GiB, "tracked %llu", (unsigned long long)st.tracked_bytes);
    }
    CHECK(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS, "trim");
    check_device(0, "graph memory trimmed");
    void *big;
    CHECK(cudaMalloc(&big, 100 * GiB) == cudaErrorMemoryAllocation, "100 GiB must fail");
    cudaFree(p);
    return 0;
}

static int mode_summary(void)
{
    void *p;
    cudaSetDevice(0);
    CHECK(cudaMalloc(&p, 2 * GiB) == cudaSuccess, "2 GiB");
    cudaFree(p);
    CHECK(cudaMalloc(&p, 1 * GiB) == cudaSuccess, "1 GiB, kept to the end");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || check_setup() < 0)
        return 2;
    const char *m = argv[1];
    int rc = !strcmp(m, "oom")                     ? mode_oom()
             : !strcmp(m, "inval")                 ? mode_inval()
             : !strcmp(m, "huge")                  ? mode_huge()
             : !strcmp(m, "history")               ? mode_history()
             : !strcmp(m, "pools")                 ? mode_pools()
             : !strcmp(m, "manypools")             ? mode_manypools()
             : !strcmp(m, "unreadable")            ? mode_unreadable()
             : !strcmp(m, "arrays")                ? mode_arrays()
             : !strcmp(m, "ctx")                   ? mode_ctx()
             : !strcmp(m, "dlmopen")               ? mode_dlmopen()
             : !strcmp(m, "summary")               ? mode_summary()
             : !strcmp(m, "lookups")               ? mode_lookups()
             : !strcmp(m, "ipc")                   ? mode_ipc(argv[0])
             : !strcmp(m, "graph")                 ? mode_graph()
             : !strcmp(m, "ipc-child") && argc > 2 ? mode_ipc_child(argv[2])
                                                   : 2;
    if (rc == 2) {
        fprintf(stderr, "unknown mode %s\n", m);
        return 2;
    }
    return check_finish(m);
}
