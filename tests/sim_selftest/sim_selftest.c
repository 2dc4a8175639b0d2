/*
 * sim_selftest.c — self-test of the simulated GPU (sim/): driver, runtime and
 * NVML, checked against the simulator's ground truth (simgpu_truth).
 *
 * Every section runs in its own fork()ed child.  A fork child is a fresh
 * process for the simulator (state reset, configuration re-read), so each
 * section sets its own SIMGPU_* environment and can assert exact byte counts.
 * The parent only orchestrates and adds up the results; a child that crashes
 * or exits non-zero (e.g. a sanitizer report) counts as a failure.
 *
 * Build and run: make sim-selftest
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nvml_sim.h"
#include "runtime_tables.h"
#include "simgpu.h"

/* Per-thread-default-stream entry points: exported by every libcudart, but
 * declared by cuda_runtime_api.h only when compiling for per-thread streams. */
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                            unsigned int cudaVersion, unsigned long long flags,
                                                            enum cudaDriverEntryPointQueryResult *driverStatus);

#define KiB (1024ULL)
#define MiB (1024ULL * 1024ULL)
#define GiB (1024ULL * 1024ULL * 1024ULL)

/* ------------------------------------------------------------ framework */

static int g_pass, g_fail;
static const char *g_section = "main";

static void check(bool ok, const char *what, int line)
{
    if (ok) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL [%s] line %d: %s\n", g_section, line, what);
    fflush(stdout);
}

static void check_eq(unsigned long long a, unsigned long long b, const char *ea, const char *eb, int line)
{
    if (a == b) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL [%s] line %d: %s == %s: got %llu (0x%llx), expected %llu (0x%llx)\n", g_section, line, ea, eb, a, a, b,
           b);
    fflush(stdout);
}

static const char *cu_name(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s)
        return "?";
    return s;
}

static void check_cu(CUresult got, CUresult want, const char *expr, int line)
{
    if (got == want) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL [%s] line %d: %s returned %s (%d), expected %s (%d)\n", g_section, line, expr, cu_name(got), got,
           cu_name(want), want);
    fflush(stdout);
}

static void check_rt(cudaError_t got, cudaError_t want, const char *expr, int line)
{
    if (got == want) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL [%s] line %d: %s returned %s (%d), expected %s (%d)\n", g_section, line, expr, cudaGetErrorName(got),
           got, cudaGetErrorName(want), want);
    fflush(stdout);
}

static void check_str(const char *got, const char *want, const char *expr, int line)
{
    if (got && strcmp(got, want) == 0) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL [%s] line %d: %s is \"%s\", expected \"%s\"\n", g_section, line, expr, got ? got : "(null)", want);
    fflush(stdout);
}

#define CHECK(c)             check((c), #c, __LINE__)
#define CHECK_EQ(a, b)       check_eq((unsigned long long)(a), (unsigned long long)(b), #a, #b, __LINE__)
#define CHECK_CU(call, want) check_cu((call), (want), #call, __LINE__)
#define CHECK_RT(call, want) check_rt((call), (want), #call, __LINE__)
#define CHECK_STR(got, want) check_str((got), (want), #got, __LINE__)
#define OK                   CUDA_SUCCESS

static simgpu_truth_t T(int dev)
{
    simgpu_truth_t t;
    memset(&t, 0xff, sizeof t);
    if (simgpu_truth(dev, &t) != 0)
        memset(&t, 0, sizeof t);
    return t;
}

static ssize_t read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Run fn in a fork child and add its pass/fail counts to ours.  Also used
 * inside sections (grandchildren).  `payload` lets the child send back extra
 * bytes (e.g. a failure pattern). */
static void run_forked(const char *name, void (*fn)(void *), void *arg, void *payload, size_t payload_len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        check(false, "pipe()", __LINE__);
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        check(false, "fork()", __LINE__);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        g_pass = g_fail = 0;
        g_section = name;
        char out[8192];
        memset(out, 0, sizeof out);
        fn(payload_len ? out + 2 * sizeof(int) : arg);
        ((int *)out)[0] = g_pass;
        ((int *)out)[1] = g_fail;
        if (write(fds[1], out, 2 * sizeof(int) + payload_len) < 0)
            _exit(3);
        close(fds[1]);
        fflush(NULL);
        exit(0);
    }
    close(fds[1]);
    char in[8192];
    memset(in, 0, sizeof in);
    ssize_t n = read_full(fds[0], in, 2 * sizeof(int) + payload_len);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int pass = ((int *)in)[0], fail = ((int *)in)[1];
    g_pass += pass;
    g_fail += fail;
    if (payload_len)
        memcpy(payload, in + 2 * sizeof(int), payload_len);
    if (n != (ssize_t)(2 * sizeof(int) + payload_len) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        g_fail++;
        printf("FAIL [%s] child died or exited non-zero (status 0x%x)\n", name, status);
    }
    if (strcmp(g_section, "main") == 0)
        printf("[%s] %d passed, %d failed\n", name, pass, fail);
    fflush(stdout);
}

/* The configuration most sections use. */
static void base_env(void)
{
    static const char *const clear[] = { "SIMGPU_FAIL_NTH",   "SIMGPU_FAIL_PROB", "SIMGPU_SEED",
                                         "SIMGPU_TRUTH_FILE", "SIMGPU_STATE_DIR", "SIMGPU_LOG_LOOKUPS" };
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++)
        unsetenv(clear[i]);
    setenv("SIMGPU_DEVICES", "2", 1);
    setenv("SIMGPU_MEM", "0:8GiB,1:4GiB", 1);
    setenv("SIMGPU_NAME", "0:Sim A,1:Sim B", 1);
    setenv("SIMGPU_CC", "0:9.0,1:8.6", 1);
    setenv("SIMGPU_CTX_OVERHEAD", "256MiB", 1);
    setenv("SIMGPU_GRANULARITY", "2MiB", 1);
    setenv("SIMGPU_OTHER_PROCS", "0:4242:Xorg:1GiB;1:777:python:512MiB", 1);
}

/* cuInit, then the primary context of `dev` retained and made current (three
 * checks, reported at the caller's line): how most sections start. */
static CUcontext init_primary(int dev, int line)
{
    CUcontext c = NULL;
    check_cu(cuInit(0), OK, "cuInit(0)", line);
    check_cu(cuDevicePrimaryCtxRetain(&c, dev), OK, "cuDevicePrimaryCtxRetain(&c, dev)", line);
    check_cu(cuCtxSetCurrent(c), OK, "cuCtxSetCurrent(c)", line);
    return c;
}
#define INIT_PRIMARY(dev) init_primary((dev), __LINE__)

static void *libcuda(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD); }

static char g_tmpdir[256];

/* =================================================== driver: basics etc. */

static void sec_driver(void *unused)
{
    base_env();
    CUdeviceptr d = 0;
    int n = -1, v = 0;
    size_t fr = 0, to = 0, total = 0;

    /* Before cuInit. */
    CHECK_CU(cuMemAlloc(&d, 1), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuDriverGetVersion(&v), OK);
    CHECK_EQ(v, 13000);
    CHECK_EQ(simgpu_device_count(), 2);
    CHECK_CU(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuInit(0), OK);
    CHECK_CU(cuInit(0), OK);

    /* Devices. */
    CUdevice dev = -1;
    CHECK_CU(cuDeviceGetCount(&n), OK);
    CHECK_EQ(n, 2);
    CHECK_CU(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cuDeviceGet(&dev, 1), OK);
    CHECK_EQ(dev, 1);
    char name[64];
    CHECK_CU(cuDeviceGetName(name, sizeof name, 0), OK);
    CHECK_STR(name, "Sim A");
    CHECK_CU(cuDeviceGetName(name, sizeof name, 1), OK);
    CHECK_STR(name, "Sim B");
    CHECK_CU(cuDeviceGetName(name, 4, 1), OK);
    CHECK_STR(name, "Sim");
    CHECK_CU(cuDeviceGetName(name, sizeof name, 5), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cuDeviceTotalMem(&total, 0), OK);
    CHECK_EQ(total, 8 * GiB);
    CHECK_CU(cuDeviceTotalMem(&total, 1), OK);
    CHECK_EQ(total, 4 * GiB);
    /* Attribute values (a = -1 first: each call must write its answer). */
    static const struct {
        CUdevice_attribute attr;
        const char *name;
        int dev, want;
    } k_attrs[] = {
#define ATTR(name, dev, want) { CU_DEVICE_ATTRIBUTE_##name, #name, dev, want }
        ATTR(COMPUTE_CAPABILITY_MAJOR, 1, 8),
        ATTR(COMPUTE_CAPABILITY_MINOR, 1, 6),
        ATTR(COMPUTE_CAPABILITY_MAJOR, 0, 9),
        ATTR(MULTIPROCESSOR_COUNT, 0, 132),
        ATTR(PCI_BUS_ID, 1, 0x11),
        ATTR(PCI_DEVICE_ID, 1, 0),
        ATTR(PCI_DOMAIN_ID, 1, 0),
        ATTR(MEMORY_POOLS_SUPPORTED, 0, 1),
        ATTR(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0, 1),
        ATTR(MAXIMUM_TEXTURE1D_WIDTH, 0, 0), /* not simulated: 0 with success */
#undef ATTR
    };
    int a = -1;
    for (size_t i = 0; i < sizeof k_attrs / sizeof k_attrs[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "cuDeviceGetAttribute(%s, dev %d)", k_attrs[i].name, k_attrs[i].dev);
        a = -1;
        check_cu(cuDeviceGetAttribute(&a, k_attrs[i].attr, k_attrs[i].dev), OK, what, __LINE__);
        check_eq((unsigned long long)a, (unsigned long long)k_attrs[i].want, what, "expected", __LINE__);
    }
    CHECK_CU(cuDeviceGetAttribute(&a, (CUdevice_attribute)0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
    char bus[32];
    CHECK_CU(cuDeviceGetPCIBusId(bus, sizeof bus, 1), OK);
    CHECK_STR(bus, "0000:11:00.0");
    CHECK_CU(cuDeviceGetPCIBusId(bus, sizeof bus, 0), OK);
    CHECK_STR(bus, "0000:10:00.0");
    CHECK_CU(cuDeviceGetByPCIBusId(&dev, "0000:11:00.0"), OK);
    CHECK_EQ(dev, 1);
    CHECK_CU(cuDeviceGetByPCIBusId(&dev, "00000000:10:00.0"), OK);
    CHECK_EQ(dev, 0);
    CHECK_CU(cuDeviceGetByPCIBusId(&dev, "11:00.0"), OK);
    CHECK_EQ(dev, 1);
    CHECK_CU(cuDeviceGetByPCIBusId(&dev, "0000:12:00.0"), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cuDeviceGetByPCIBusId(&dev, "garbage"), CUDA_ERROR_INVALID_VALUE);
    CUuuid u0, u1;
    CHECK_CU(cuDeviceGetUuid(&u0, 0), OK);
    CHECK_CU(cuDeviceGetUuid(&u1, 1), OK);
    CHECK(memcmp(&u0, &u1, sizeof u0) != 0);

    /* Error strings and the private export tables. */
    const char *s = NULL;
    CHECK_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), OK);
    CHECK_STR(s, "CUDA_ERROR_OUT_OF_MEMORY");
    CHECK_CU(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), OK);
    CHECK_STR(s, "out of memory");
    CHECK_CU(cuGetErrorString(CUDA_ERROR_INVALID_CONTEXT, &s), OK);
    CHECK_STR(s, "invalid device context");
    CHECK_CU(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    const void *tbl = &tbl;
    CUuuid id = { { 0 } };
    CHECK_CU(cuGetExportTable(&tbl, &id), CUDA_ERROR_NOT_SUPPORTED);

    /* No context yet. */
    CHECK_CU(cuMemAlloc(&d, 1 * MiB), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuMemGetInfo(&fr, &to), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuMemAlloc(NULL, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    CUcontext cur = (CUcontext)1;
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == NULL);
    CHECK_CU(cuCtxPopCurrent(&cur), CUDA_ERROR_INVALID_CONTEXT);

    simgpu_truth_t t = T(0), t1 = T(1);
    CHECK_EQ(t.total_bytes, 8 * GiB);
    CHECK_EQ(t.other_process_bytes, 1 * GiB);
    CHECK_EQ(t.free_bytes, 7 * GiB);
    CHECK_EQ(t.used_bytes, 0);
    CHECK_EQ(t.contexts, 0);
    CHECK_EQ(t1.other_process_bytes, 512 * MiB);
    CHECK_EQ(t1.free_bytes, 4 * GiB - 512 * MiB);
    simgpu_truth_t dummy;
    CHECK_EQ(simgpu_truth(2, &dummy), -1);
    CHECK_EQ(simgpu_truth(0, NULL), -1);

    /* Primary context. */
    CUcontext p0 = NULL, p0b = NULL;
    CHECK_CU(cuDevicePrimaryCtxRetain(&p0, 0), OK);
    t = T(0);
    CHECK_EQ(t.context_bytes, 256 * MiB);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t.used_bytes, 256 * MiB);
    CHECK_EQ(t.free_bytes, 7 * GiB - 256 * MiB);
    unsigned fl = 99;
    int act = -1;
    CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &act), OK);
    CHECK_EQ(act, 1);
    CHECK_EQ(fl, 0);
    CHECK_CU(cuDevicePrimaryCtxRetain(&p0b, 0), OK);
    CHECK(p0 == p0b);
    CHECK_EQ(T(0).context_bytes, 256 * MiB);
    CHECK_CU(cuCtxSetCurrent(p0), OK);
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == p0);
    CHECK_CU(cuCtxGetDevice(&dev), OK);
    CHECK_EQ(dev, 0);
    unsigned ver = 0;
    CHECK_CU(cuCtxGetApiVersion(NULL, &ver), OK);
    CHECK(ver > 0);

    /* Plain allocations: charged in whole granules. */
    CUdeviceptr a1 = 0, a2 = 0;
    CHECK_CU(cuMemAlloc(&a1, 1), OK);
    CHECK(a1 != 0 && a1 % 256 == 0);
    CHECK_CU(cuMemAlloc(&a2, 3 * MiB), OK);
    CHECK(a2 != a1 && a2 % 256 == 0);
    t = T(0);
    CHECK_EQ(t.alloc_requested_bytes, 1 + 3 * MiB);
    CHECK_EQ(t.alloc_charged_bytes, 6 * MiB);
    CHECK_EQ(t.alloc_blocks, 2);
    CHECK_EQ(t.used_bytes, 256 * MiB + 6 * MiB);
    CHECK_EQ(t.peak_used_bytes, 256 * MiB + 6 * MiB);
    CHECK_EQ(t.peak_rounding_bytes, 6 * MiB - (1 + 3 * MiB)); /* the rounding of the blocks that made the peak */
    CHECK_CU(cuMemGetInfo(&fr, &to), OK);
    CHECK_EQ(fr, t.free_bytes);
    CHECK_EQ(fr, 8 * GiB - 1 * GiB - 256 * MiB - 6 * MiB);
    CHECK_EQ(to, 8 * GiB);

    CUdeviceptr base = 0;
    size_t sz = 0;
    CHECK_CU(cuMemGetAddressRange(&base, &sz, a2 + 100), OK);
    CHECK_EQ(base, a2);
    CHECK_EQ(sz, 3 * MiB);
    CHECK_CU(cuMemGetAddressRange(NULL, &sz, a1), OK);
    CHECK_EQ(sz, 1);
    CHECK_CU(cuMemGetAddressRange(&base, &sz, 0x1234), CUDA_ERROR_NOT_FOUND);
    int ord = -1;
    unsigned mt = 0;
    CHECK_CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a2 + 5), OK);
    CHECK_EQ(ord, 0);
    CHECK_CU(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a2), OK);
    CHECK_EQ(mt, CU_MEMORYTYPE_DEVICE);
    CUcontext pc = NULL;
    CHECK_CU(cuPointerGetAttribute(&pc, CU_POINTER_ATTRIBUTE_CONTEXT, a2), OK);
    CHECK(pc == p0);
    CHECK_CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 0x1234), CUDA_ERROR_INVALID_VALUE);
    CUpointer_attribute attrs[2] = { CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE };
    void *data[2] = { &ord, &mt };
    CHECK_CU(cuPointerGetAttributes(2, attrs, data, 0x1234), OK);
    CHECK_EQ(mt, 0);

    CHECK_CU(cuMemFree(a2 + 256), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemFree(0x1234), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemFree(a2), OK);
    CHECK_CU(cuMemFree(a2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(T(0).peak_rounding_bytes, 6 * MiB - (1 + 3 * MiB)); /* the peak's, not what is live now */
    CHECK_EQ(T(0).alloc_charged_bytes - T(0).alloc_requested_bytes, 2 * MiB - 1);
    t = T(0);
    CHECK_EQ(t.alloc_blocks, 1);
    CHECK_EQ(t.alloc_charged_bytes, 2 * MiB);
    CHECK_EQ(t.alloc_requested_bytes, 1);

    /* Pitch: rows padded to 512 bytes. */
    CUdeviceptr pp = 0;
    size_t pitch = 0;
    CHECK_CU(cuMemAllocPitch(&pp, &pitch, 1000, 10, 4), OK);
    CHECK_EQ(pitch, 1024);
    CHECK_CU(cuMemAllocPitch(&pp, &pitch, 1000, 10, 3), CUDA_ERROR_INVALID_VALUE);
    t = T(0);
    CHECK_EQ(t.alloc_requested_bytes, 1 + 10240);
    CHECK_EQ(t.alloc_charged_bytes, 4 * MiB);
    CHECK_EQ(t.alloc_blocks, 2);

    /* Managed memory is real host memory, charged to the context's device. */
    CUdeviceptr m = 0;
    CHECK_CU(cuMemAllocManaged(&m, 5 * MiB, CU_MEM_ATTACH_GLOBAL), OK);
    CHECK_CU(cuMemAllocManaged(&d, 1, 0), CUDA_ERROR_INVALID_VALUE);
    t = T(0);
    CHECK_EQ(t.managed_requested_bytes, 5 * MiB);
    CHECK_EQ(t.alloc_charged_bytes, 10 * MiB);
    CHECK_EQ(t.alloc_blocks, 3);
    CHECK_EQ(t.alloc_requested_bytes, 1 + 10240 + 5 * MiB);
    unsigned char *mp = (unsigned char *)(uintptr_t)m;
    mp[0] = 42;
    mp[5 * MiB - 1] = 7;
    bool ism = false;
    CHECK_CU(cuPointerGetAttribute(&ism, CU_POINTER_ATTRIBUTE_IS_MANAGED, m), OK);
    CHECK(ism);
    unsigned char buf[64];
    memset(buf, 0, sizeof buf);
    CHECK_CU(cuMemcpyDtoH(buf, m, 1), OK);
    CHECK_EQ(buf[0], 42);
    CHECK_CU(cuMemcpyHtoD(m + 1, "xy", 2), OK);
    CHECK_EQ(mp[1], 'x');
    CHECK_CU(cuMemsetD8(m + 8, 9, 4), OK);
    CHECK_EQ(mp[11], 9);

    /* Fake device memory: writes are accepted, reads give zeros, bounds hold. */
    CHECK_CU(cuMemcpyHtoD(a1, buf, 1), OK);
    CHECK_CU(cuMemcpyHtoD(a1, buf, 2), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemcpyHtoD(0x1234, buf, 1), CUDA_ERROR_INVALID_VALUE);
    memset(buf, 0xff, sizeof buf);
    CHECK_CU(cuMemcpyDtoH(buf, pp, 16), OK);
    CHECK_EQ(buf[0], 0);
    CHECK_EQ(buf[15], 0);
    CHECK_CU(cuMemcpyDtoD(pp, a1, 1), OK);
    CHECK_CU(cuMemsetD8(pp, 1, 10240), OK);
    CHECK_CU(cuMemsetD8(pp, 1, 10241), CUDA_ERROR_INVALID_VALUE);
    /* A freed device pointer is rejected, never dereferenced. */
    CHECK_CU(cuMemcpy(a2, (CUdeviceptr)(uintptr_t)buf, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemcpy((CUdeviceptr)(uintptr_t)buf, a2, 4), CUDA_ERROR_INVALID_VALUE);

    /* Out of memory: exact boundary. */
    fr = T(0).free_bytes;
    CHECK_EQ(fr, 7 * GiB - 256 * MiB - 10 * MiB);
    CHECK_CU(cuMemAlloc(&d, fr + 1), CUDA_ERROR_OUT_OF_MEMORY);
    t = T(0);
    CHECK_EQ(t.failed_allocs, 1);
    CHECK_EQ(t.injected_failures, 0);
    CHECK_EQ(t.alloc_blocks, 3);
    CUdeviceptr all = 0;
    CHECK_CU(cuMemAlloc(&all, fr), OK);
    CHECK_EQ(T(0).free_bytes, 0);
    CHECK_CU(cuMemGetInfo(&fr, &to), OK);
    CHECK_EQ(fr, 0);
    CHECK_CU(cuMemAlloc(&d, 1), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(T(0).failed_allocs, 2);
    CHECK_EQ(T(0).peak_used_bytes, 7 * GiB);
    CHECK_CU(cuMemFree(all), OK);

    /* Pinned host memory: real, process-wide, not charged to a device. */
    void *h = NULL, *h2 = NULL;
    uint64_t used_before = T(0).used_bytes;
    CHECK_CU(cuMemHostAlloc(&h, 1000, CU_MEMHOSTALLOC_PORTABLE), OK);
    CHECK(h != NULL);
    if (h)
        memset(h, 0xab, 1000);
    CHECK_CU(cuMemAllocHost(&h2, 4096), OK);
    t = T(0);
    CHECK_EQ(t.host_pinned_bytes, 1000 + 4096);
    CHECK_EQ(t.host_pinned_blocks, 2);
    CHECK_EQ(t.used_bytes, used_before);
    CHECK_EQ(T(1).host_pinned_bytes, 0);
    CHECK_CU(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h + 10), OK);
    CHECK_EQ(mt, CU_MEMORYTYPE_HOST);
    void *hp = NULL;
    CHECK_CU(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, (CUdeviceptr)(uintptr_t)h), OK);
    CHECK(hp == h);
    CHECK_CU(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, a1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)h, 0x11, 1000), OK);
    CHECK_EQ(((unsigned char *)h)[999], 0x11);
    CHECK_CU(cuMemFreeHost((char *)h + 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemFreeHost(h), OK);
    CHECK_CU(cuMemFreeHost(h2), OK);
    CHECK_CU(cuMemFreeHost(h2), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemHostAlloc(&h, 10, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(T(0).host_pinned_bytes, 0);
    CHECK_EQ(T(0).host_pinned_blocks, 0);

    /* Streams and events: valid handles, no-ops. */
    CUstream st = NULL;
    CUevent ev = NULL;
    CHECK_CU(cuStreamCreate(&st, 0), OK);
    CHECK_CU(cuStreamCreate(&st, 0x40), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuStreamSynchronize(st), OK);
    CHECK_CU(cuStreamQuery(st), OK);
    CHECK_CU(cuEventCreate(&ev, 0), OK);
    CHECK_CU(cuEventRecord(ev, st), OK);
    CHECK_CU(cuEventSynchronize(ev), OK);
    CHECK_CU(cuEventQuery(ev), OK);
    CHECK_CU(cuEventDestroy(ev), OK);
    CHECK_CU(cuEventDestroy(ev), CUDA_ERROR_INVALID_HANDLE);
    CHECK_CU(cuStreamDestroy(st), OK);
    CHECK_CU(cuStreamSynchronize(st), CUDA_ERROR_INVALID_HANDLE);
    CHECK_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD), OK);
    CHECK_CU(cuStreamSynchronize(NULL), OK);
    CHECK_CU(cuCtxSynchronize(), OK);

    /* A created context on device 1: pushed, charged, and its allocations
     * and streams die with it. */
    CUcontext c1 = NULL, popped = NULL;
    CHECK_CU(cuCtxCreate(&c1, NULL, 0, 1), OK);
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == c1);
    t1 = T(1);
    CHECK_EQ(t1.contexts, 1);
    CHECK_EQ(t1.context_bytes, 256 * MiB);
    CUdeviceptr d1 = 0;
    CHECK_CU(cuMemAlloc(&d1, 8 * MiB), OK);
    CHECK_EQ(T(1).alloc_charged_bytes, 8 * MiB);
    CHECK_EQ(T(0).alloc_blocks, 3);
    CUstream s1 = NULL;
    CHECK_CU(cuStreamCreate(&s1, 0), OK);
    CHECK_CU(cuCtxPopCurrent(&popped), OK);
    CHECK(popped == c1);
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == p0);
    CHECK_CU(cuCtxGetDevice_v2(&dev, c1), OK);
    CHECK_EQ(dev, 1);
    CHECK_CU(cuCtxDestroy(c1), OK);
    t1 = T(1);
    CHECK_EQ(t1.contexts, 0);
    CHECK_EQ(t1.context_bytes, 0);
    CHECK_EQ(t1.alloc_blocks, 0);
    CHECK_EQ(t1.used_bytes, 0);
    CHECK_EQ(t1.peak_used_bytes, 256 * MiB + 8 * MiB);
    CHECK_CU(cuMemFree(d1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuStreamSynchronize(s1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_CU(cuCtxPushCurrent(c1), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK_CU(cuCtxDestroy(c1), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuCtxDestroy(p0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuCtxGetDevice_v2(&dev, c1), CUDA_ERROR_CONTEXT_IS_DESTROYED);

    /* Destroying the current context pops it. */
    CUcontext c2 = NULL;
    CHECK_CU(cuCtxCreate(&c2, NULL, CU_CTX_SCHED_YIELD, 0), OK);
    CHECK_EQ(T(0).contexts, 2);
    CHECK_EQ(T(0).context_bytes, 512 * MiB);
    CHECK_CU(cuCtxGetFlags(&fl), OK);
    CHECK_EQ(fl, CU_CTX_SCHED_YIELD);
    CHECK_CU(cuCtxDestroy(c2), OK);
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == p0);
    CHECK_EQ(T(0).contexts, 1);

    /* Primary context reset on device 1: allocations gone, releases that
     * the reset wiped out are still accepted, then no more. */
    CUcontext q = NULL;
    CHECK_CU(cuDevicePrimaryCtxRetain(&q, 1), OK);
    CHECK_CU(cuDevicePrimaryCtxRetain(&q, 1), OK);
    CHECK_CU(cuCtxPushCurrent(q), OK);
    CHECK_CU(cuMemAlloc(&d1, 2 * MiB), OK);
    CHECK_EQ(T(1).alloc_blocks, 1);
    CHECK_CU(cuDevicePrimaryCtxReset(1), OK);
    t1 = T(1);
    CHECK_EQ(t1.contexts, 0);
    CHECK_EQ(t1.alloc_blocks, 0);
    CHECK_EQ(t1.used_bytes, 0);
    CHECK_CU(cuDevicePrimaryCtxGetState(1, &fl, &act), OK);
    CHECK_EQ(act, 0);
    CHECK_CU(cuMemAlloc(&d1, 1), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK_CU(cuCtxPopCurrent(NULL), OK);
    CHECK_CU(cuDevicePrimaryCtxRelease(1), OK);
    CHECK_CU(cuDevicePrimaryCtxRelease(1), OK);
    CHECK_CU(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);

    /* cuDevicePrimaryCtxSetFlags: v1 refused on an active context, v2 not. */
    CUresult (*setflags_v1)(CUdevice, unsigned int) =
        (CUresult(*)(CUdevice, unsigned int))dlsym(libcuda(), "cuDevicePrimaryCtxSetFlags");
    CHECK(setflags_v1 != NULL);
    if (setflags_v1)
        CHECK_CU(setflags_v1(0, CU_CTX_SCHED_SPIN), CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
    CHECK_CU(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_SPIN), OK);
    CHECK_CU(cuDevicePrimaryCtxGetState(0, &fl, &act), OK);
    CHECK_EQ(fl, CU_CTX_SCHED_SPIN);

    /* The 32-bit-era v1 allocator is not supported on a 64-bit device. */
    CUresult (*alloc_v1)(unsigned int *, unsigned int) =
        (CUresult(*)(unsigned int *, unsigned int))dlsym(libcuda(), "cuMemAlloc");
    unsigned int d32 = 0;
    CHECK(alloc_v1 != NULL);
    if (alloc_v1)
        CHECK_CU(alloc_v1(&d32, 16), CUDA_ERROR_NOT_SUPPORTED);

    /* Releasing the primary context to zero frees what was allocated in it
     * (including the managed buffer: do not touch mp after this). */
    CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
    CHECK_EQ(T(0).contexts, 1);
    CHECK_CU(cuDevicePrimaryCtxRelease(0), OK);
    t = T(0);
    CHECK_EQ(t.contexts, 0);
    CHECK_EQ(t.context_bytes, 0);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK_EQ(t.alloc_charged_bytes, 0);
    CHECK_EQ(t.managed_requested_bytes, 0);
    CHECK_EQ(t.used_bytes, 0);
    CHECK_EQ(t.free_bytes, 7 * GiB);
    CHECK_CU(cuMemAlloc(&d, 1), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK_CU(cuCtxSetCurrent(NULL), OK);
    CHECK_CU(cuCtxGetCurrent(&cur), OK);
    CHECK(cur == NULL);
}

/* ============================================ driver: cuGetProcAddress */

static void sec_proc_address(void *unused)
{
    base_env();
    CHECK_CU(cuInit(0), OK);
    void *lib = libcuda();
    CHECK(lib != NULL);
    static const struct {
        const char *base;
        int ver;
        unsigned long long flags;
        const char *abi;
    } cases[] = {
        { "cuMemAlloc", 3020, 0, "cuMemAlloc_v2" },
        { "cuMemAlloc", 2000, 0, "cuMemAlloc" },
        { "cuMemAlloc", 13000, 2, "cuMemAlloc_v2" },
        { "cuMemAlloc", 13000, 1, "cuMemAlloc_v2" },
        { "cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2" },
        { "cuMemFree", 12000, 0, "cuMemFree_v2" },
        { "cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2" },
        { "cuMemAllocManaged", 6000, 0, "cuMemAllocManaged" },
        { "cuMemAllocHost", 3020, 0, "cuMemAllocHost_v2" },
        { "cuMemHostAlloc", 2020, 0, "cuMemHostAlloc" },
        { "cuMemAllocAsync", 11020, 0, "cuMemAllocAsync" },
        { "cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz" },
        { "cuMemAllocAsync", 12000, 1, "cuMemAllocAsync" },
        { "cuMemFreeAsync", 11020, 2, "cuMemFreeAsync_ptsz" },
        { "cuMemFreeAsync", 11020, 0, "cuMemFreeAsync" },
        { "cuMemAllocFromPoolAsync", 11020, 2, "cuMemAllocFromPoolAsync_ptsz" },
        { "cuStreamSynchronize", 7000, 2, "cuStreamSynchronize_ptsz" },
        { "cuStreamSynchronize", 6050, 2, "cuStreamSynchronize" },
        { "cuStreamSynchronize", 7000, 0, "cuStreamSynchronize" },
        { "cuMemcpyHtoD", 7000, 2, "cuMemcpyHtoD_v2_ptds" },
        { "cuMemcpyHtoD", 3020, 0, "cuMemcpyHtoD_v2" },
        { "cuMemcpy", 7000, 2, "cuMemcpy_ptds" },
        { "cuCtxCreate", 12050, 0, "cuCtxCreate_v4" },
        { "cuCtxCreate", 11040, 0, "cuCtxCreate_v3" },
        { "cuCtxCreate", 3020, 0, "cuCtxCreate_v2" },
        { "cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2" },
        { "cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2" },
        { "cuCtxGetDevice", 12000, 0, "cuCtxGetDevice" },
        { "cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2" },
        { "cuDevicePrimaryCtxRelease", 7000, 0, "cuDevicePrimaryCtxRelease" },
        { "cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2" },
        { "cuDevicePrimaryCtxReset", 12000, 0, "cuDevicePrimaryCtxReset_v2" },
        { "cuGetProcAddress", 11030, 0, "cuGetProcAddress" },
        { "cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2" },
        { "cuDeviceTotalMem", 3020, 0, "cuDeviceTotalMem_v2" },
        { "cuDeviceGetUuid", 9020, 0, "cuDeviceGetUuid" },
        { "cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2" },
        { "cuMemCreate", 12000, 0, "cuMemCreate" },
        { "cuMemMap", 10020, 0, "cuMemMap" },
        { "cuMemRetainAllocationHandle", 11000, 0, "cuMemRetainAllocationHandle" },
        { "cuMemGetDefaultMemPool", 13000, 0, "cuMemGetDefaultMemPool" },
        { "cuGetExportTable", 3000, 0, "cuGetExportTable" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
        CUresult r = cuGetProcAddress(cases[i].base, &fn, cases[i].ver, cases[i].flags, &st);
        void *want = dlsym(lib, cases[i].abi);
        char what[160];
        snprintf(what, sizeof what, "lookup %s %d %llu -> %s", cases[i].base, cases[i].ver, cases[i].flags,
                 cases[i].abi);
        check(r == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && want && fn == want, what, __LINE__);
    }
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK_CU(cuGetProcAddress("cuMemAllocAsync", &fn, 11010, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    fn = (void *)1;
    CHECK_CU(cuGetProcAddress("cuBogus", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK(fn == NULL);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK_CU(cuGetProcAddress("cuMemAlloc_v2", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, NULL), OK);
    CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 13010, 0, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 13000, 4, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuGetProcAddress(NULL, &fn, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuGetProcAddress("cuMemAlloc", NULL, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);

    /* The CUDA 11.3 four-argument form. */
    PFN_cuGetProcAddress_v11030 gpa_v1 = (PFN_cuGetProcAddress_v11030)dlsym(lib, "cuGetProcAddress");
    CHECK(gpa_v1 != NULL);
    if (gpa_v1) {
        CHECK_CU(gpa_v1("cuMemFree", &fn, 3020, 0), OK);
        CHECK(fn == dlsym(lib, "cuMemFree_v2"));
        CHECK_CU(gpa_v1("cuNothing", &fn, 3020, 0), CUDA_ERROR_NOT_FOUND);
    }

    /* A looked-up pointer is the real function. */
    PFN_cuMemGetInfo_v3020 getinfo = NULL;
    CHECK_CU(cuGetProcAddress("cuMemGetInfo", (void **)&getinfo, 3020, 0, NULL), OK);
    size_t f = 0, t = 0;
    if (getinfo) {
        CHECK_CU(getinfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
        CUcontext c;
        CHECK_CU(cuDevicePrimaryCtxRetain(&c, 1), OK);
        CHECK_CU(cuCtxSetCurrent(c), OK);
        CHECK_CU(getinfo(&f, &t), OK);
        CHECK_EQ(t, 4 * GiB);
        CHECK_EQ(f, 4 * GiB - 512 * MiB - 256 * MiB);
    }
}

/* ================================================================= VMM */

static void sec_vmm(void *unused)
{
    base_env();
    INIT_PRIMARY(0);

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), OK);
    CHECK_EQ(g, 2 * MiB);
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), OK);
    CHECK_EQ(g, 2 * MiB);
    prop.location.id = 7;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_DEVICE);
    prop.location.id = 0;

    CUmemGenericAllocationHandle hd = 0, hr = 0, h1 = 0, hx = 0;
    CHECK_CU(cuMemCreate(&hd, 3 * MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&hd, 4 * MiB, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&hd, 4 * MiB, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemCreate(&hd, 4 * MiB, &prop, 0), OK);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.vmm_physical_bytes, 4 * MiB);
    CHECK_EQ(t.vmm_handles, 1);
    CHECK_EQ(t.used_bytes, 256 * MiB + 4 * MiB);

    CUdeviceptr va = 0, x = 0;
    CHECK_CU(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0), OK);
    CHECK(va != 0 && va % (2 * MiB) == 0);
    CHECK_EQ(T(0).used_bytes, 256 * MiB + 4 * MiB);
    CHECK_CU(cuMemAddressReserve(&x, 1000, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressReserve(&x, 8 * MiB, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);

    CHECK_CU(cuMemMap(va, 4 * MiB, 2 * MiB, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va + 1 * MiB, 2 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va, 6 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va, 4 * MiB, 0, hd + 999, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(0x2000000, 2 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va, 4 * MiB, 0, hd, 0), OK);
    CHECK_CU(cuMemMap(va, 4 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va + 2 * MiB, 2 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemMap(va + 4 * MiB, 4 * MiB, 0, hd, 0), OK); /* aliasing the same memory */
    CHECK_EQ(T(0).vmm_physical_bytes, 4 * MiB);

    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = 0;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(va, 8 * MiB, &ad, 1), OK);
    CHECK_CU(cuMemSetAccess(va, 10 * MiB, &ad, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemSetAccess(va, 8 * MiB, &ad, 0), CUDA_ERROR_INVALID_VALUE);

    int ord = -1;
    CHECK_CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va + 100), OK);
    CHECK_EQ(ord, 0);
    CUdeviceptr base = 0;
    size_t sz = 0;
    CHECK_CU(cuMemGetAddressRange(&base, &sz, va + 4 * MiB + 5), OK);
    CHECK_EQ(base, va + 4 * MiB);
    CHECK_EQ(sz, 4 * MiB);

    CHECK_CU(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + 123)), OK);
    CHECK_EQ(hr, hd);
    CHECK_CU(cuMemRetainAllocationHandle(&hr, (void *)(uintptr_t)(va + 9 * MiB)), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp got;
    memset(&got, 0, sizeof got);
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, hd), OK);
    CHECK_EQ(got.location.id, 0);
    CHECK_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);

    /* Releasing the handle does not free mapped memory. */
    CHECK_CU(cuMemRelease(hd), OK);
    CHECK_CU(cuMemRelease(hd), OK);
    CHECK_CU(cuMemRelease(hd), CUDA_ERROR_INVALID_VALUE);
    t = T(0);
    CHECK_EQ(t.vmm_physical_bytes, 4 * MiB);
    CHECK_EQ(t.vmm_handles, 1);
    CHECK_CU(cuMemMap(va, 2 * MiB, 0, hd, 0), CUDA_ERROR_INVALID_VALUE); /* released handle */

    CHECK_CU(cuMemUnmap(va, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemUnmap(va + 2 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    CHECK_CU(cuMemUnmap(va, 4 * MiB), OK);
    CHECK_EQ(T(0).vmm_physical_bytes, 4 * MiB); /* one mapping left */
    CHECK_CU(cuMemUnmap(va + 4 * MiB, 4 * MiB), OK);
    t = T(0);
    CHECK_EQ(t.vmm_physical_bytes, 0);
    CHECK_EQ(t.vmm_handles, 0);
    CHECK_EQ(t.used_bytes, 256 * MiB);
    CHECK_CU(cuMemAddressFree(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAddressFree(va, 8 * MiB), OK);
    CHECK_CU(cuMemAddressFree(va, 8 * MiB), CUDA_ERROR_INVALID_VALUE);

    /* One unmap may cover several consecutive mappings. */
    CUmemGenericAllocationHandle ha = 0, hb = 0;
    CHECK_CU(cuMemCreate(&ha, 2 * MiB, &prop, 0), OK);
    CHECK_CU(cuMemCreate(&hb, 2 * MiB, &prop, 0), OK);
    CUdeviceptr va2 = 0;
    CHECK_CU(cuMemAddressReserve(&va2, 4 * MiB, 0, va, 0), OK);
    CHECK_EQ(va2, va); /* the freed range is honoured as a hint */
    CHECK_CU(cuMemMap(va2, 2 * MiB, 0, ha, 0), OK);
    CHECK_CU(cuMemMap(va2 + 2 * MiB, 2 * MiB, 0, hb, 0), OK);
    CHECK_CU(cuMemRelease(ha), OK);
    CHECK_CU(cuMemRelease(hb), OK);
    CHECK_EQ(T(0).vmm_handles, 2);
    CHECK_CU(cuMemUnmap(va2, 4 * MiB), OK);
    CHECK_EQ(T(0).vmm_handles, 0);
    CHECK_CU(cuMemAddressFree(va2, 4 * MiB), OK);

    /* Physical memory is charged to prop.location.id's device. */
    prop.location.id = 1;
    CHECK_CU(cuMemCreate(&h1, 2 * MiB, &prop, 0), OK);
    CHECK_EQ(T(1).vmm_physical_bytes, 2 * MiB);
    CHECK_EQ(T(0).vmm_physical_bytes, 0);
    CHECK_CU(cuMemRelease(h1), OK); /* never mapped: freed now */
    CHECK_EQ(T(1).vmm_physical_bytes, 0);
    CHECK_CU(cuMemCreate(&hx, 4 * GiB, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(T(1).failed_allocs, 1);
    CHECK_EQ(T(1).used_bytes, 0);
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CHECK_CU(cuMemCreate(&hx, 2 * MiB, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
}

/* =============================================================== pools */

static void sec_pools(void *unused)
{
    base_env();
    INIT_PRIMARY(0);

    CUmemoryPool dp = NULL, cp = NULL, got = NULL;
    CHECK_CU(cuDeviceGetDefaultMemPool(&dp, 0), OK);
    CHECK(dp != NULL);
    CHECK_CU(cuDeviceGetMemPool(&cp, 0), OK);
    CHECK(cp == dp);
    CUmemoryPool dp1 = NULL;
    CHECK_CU(cuDeviceGetDefaultMemPool(&dp1, 1), OK);
    CHECK(dp1 != dp);

    /* A first small allocation reserves a 32 MiB chunk. */
    CUdeviceptr b1 = 0, b2 = 0, b3 = 0;
    CHECK_CU(cuMemAllocAsync(&b1, 1 * MiB, NULL), OK);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 32 * MiB);
    CHECK_EQ(t.pool_used_bytes, 1 * MiB);
    CHECK_EQ(t.pool_blocks, 1);
    CHECK_EQ(t.used_bytes, 256 * MiB + 32 * MiB);
    CHECK_CU(cuMemAllocAsync(&b2, 1000, CU_STREAM_PER_THREAD), OK);
    CHECK(b2 != b1 && b2 % 256 == 0);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 32 * MiB);
    CHECK_EQ(t.pool_used_bytes, 1 * MiB + 1000);
    CHECK_EQ(t.pool_blocks, 2);
    cuuint64_t val = 0;
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &val), OK);
    CHECK_EQ(val, 32 * MiB);
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &val), OK);
    CHECK_EQ(val, 1 * MiB + 1000);
    int reuse = 0;
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse), OK);
    CHECK_EQ(reuse, 1);
    CHECK_CU(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, b2), OK);
    CHECK(got == dp);
    CUdeviceptr base = 0;
    size_t sz = 0;
    CHECK_CU(cuMemGetAddressRange(&base, &sz, b2 + 10), OK);
    CHECK_EQ(base, b2);
    CHECK_EQ(sz, 1000);
    CHECK_CU(cuMemAllocAsync(&b3, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemAllocAsync(&b3, 1, (CUstream)(uintptr_t)0x5555), CUDA_ERROR_INVALID_HANDLE);

    /* Freed blocks stay reserved until a synchronize (threshold 0). */
    CHECK_CU(cuMemFreeAsync(b1, NULL), OK);
    t = T(0);
    CHECK_EQ(t.pool_used_bytes, 1000); /* requested bytes, not the rounded block */
    CHECK_EQ(t.pool_reserved_bytes, 32 * MiB);
    CHECK_EQ(t.pool_blocks, 1);
    CHECK_CU(cuMemFree(b2), OK); /* cuMemFree accepts pool memory */
    CHECK_CU(cuMemFreeAsync(b2, NULL), CUDA_ERROR_INVALID_VALUE);
    t = T(0);
    CHECK_EQ(t.pool_used_bytes, 0);
    CHECK_EQ(t.pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuStreamSynchronize(NULL), OK);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.used_bytes, 256 * MiB);

    /* Watermarks reset only to the current value. */
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &val), OK);
    CHECK_EQ(val, 32 * MiB);
    val = 5;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &val), CUDA_ERROR_INVALID_VALUE);
    val = 0;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &val), OK);
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &val), OK);
    CHECK_EQ(val, 0);
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &val), OK);
    CHECK_EQ(val, 1 * MiB + 1000);
    val = 5;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &val), CUDA_ERROR_INVALID_VALUE);
    val = 0;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &val), OK);
    CHECK_CU(cuMemPoolGetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &val), OK);
    CHECK_EQ(val, 0); /* nothing in use now */
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &val), CUDA_ERROR_INVALID_VALUE);

    /* Release threshold: memory under it survives synchronisation. */
    val = 64 * MiB;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &val), OK);
    CHECK_CU(cuMemAllocAsync(&b1, 40 * MiB, NULL), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 40 * MiB); /* a big request gets its own exact chunk */
    CHECK_CU(cuMemFreeAsync(b1, NULL), OK);
    CHECK_CU(cuCtxSynchronize(), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 40 * MiB);
    CHECK_CU(cuMemPoolTrimTo(dp, 50 * MiB), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 40 * MiB);
    CHECK_CU(cuMemPoolTrimTo(dp, 0), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);

    /* Freed space is reused. */
    CHECK_CU(cuMemAllocAsync(&b1, 1 * MiB, NULL), OK);
    CHECK_CU(cuMemAllocAsync(&b2, 2 * MiB, NULL), OK);
    CHECK_CU(cuMemFreeAsync(b1, NULL), OK);
    CHECK_CU(cuMemAllocAsync(&b3, 512 * KiB, NULL), OK);
    CHECK_EQ(b3, b1);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuMemFreeAsync(b2, NULL), OK);
    CHECK_CU(cuMemFreeAsync(b3, NULL), OK);
    CHECK_CU(cuMemPoolTrimTo(dp, 0), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);

    /* Explicit pools. */
    CUmemPoolProps pp;
    memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    pp.location.id = 9;
    CUmemoryPool mp = NULL, mx = NULL;
    CHECK_CU(cuMemPoolCreate(&mp, &pp), CUDA_ERROR_INVALID_DEVICE);
    pp.location.id = 0;
    pp.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
    CHECK_CU(cuMemPoolCreate(&mp, &pp), CUDA_ERROR_INVALID_VALUE);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    CHECK_CU(cuMemPoolCreate(&mp, &pp), OK);
    CUdeviceptr c1 = 0, c2 = 0, c3 = 0;
    CHECK_CU(cuMemAllocFromPoolAsync(&c1, 3 * MiB, mp, NULL), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuDeviceSetMemPool(1, mp), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuDeviceSetMemPool(0, mp), OK);
    CHECK_CU(cuDeviceGetMemPool(&cp, 0), OK);
    CHECK(cp == mp);
    /* The CUDA 13 location-based calls see the same current pool, apart from the default. */
    CUmemLocation loc0 = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
    CHECK_CU(cuMemGetMemPool(&got, &loc0, CU_MEM_ALLOCATION_TYPE_PINNED), OK);
    CHECK(got == mp);
    CHECK_CU(cuMemGetDefaultMemPool(&got, &loc0, CU_MEM_ALLOCATION_TYPE_PINNED), OK);
    CHECK(got == dp);
    CHECK_CU(cuMemSetMemPool(&loc0, CU_MEM_ALLOCATION_TYPE_PINNED, dp), OK);
    CHECK_CU(cuDeviceGetMemPool(&cp, 0), OK);
    CHECK(cp == dp);
    CHECK_CU(cuMemSetMemPool(&loc0, CU_MEM_ALLOCATION_TYPE_PINNED, mp), OK);
    CHECK_CU(cuMemAllocAsync(&c2, 1 * MiB, NULL), OK);
    CHECK_CU(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, c2), OK);
    CHECK(got == mp);
    CHECK_CU(cuMemPoolDestroy(dp), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemPoolDestroy(mp), OK); /* outstanding blocks: freed later */
    CHECK_CU(cuDeviceGetMemPool(&cp, 0), OK);
    CHECK(cp == dp);
    CHECK_CU(cuMemAllocFromPoolAsync(&c3, 1, mp, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuMemPoolDestroy(mp), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuMemFreeAsync(c1, NULL), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuMemFreeAsync(c2, NULL), OK);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.pool_blocks, 0);

    /* maxSize caps a pool. */
    pp.maxSize = 40 * MiB;
    CHECK_CU(cuMemPoolCreate(&mx, &pp), OK);
    CHECK_CU(cuMemAllocFromPoolAsync(&c1, 30 * MiB, mx, NULL), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_CU(cuMemAllocFromPoolAsync(&c2, 20 * MiB, mx, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(T(0).failed_allocs, 1);
    CHECK_CU(cuMemAllocFromPoolAsync(&c2, 2 * MiB, mx, NULL), OK); /* the 2 MiB left in the chunk */
    CHECK_CU(cuMemFreeAsync(c1, NULL), OK);
    CHECK_CU(cuMemFreeAsync(c2, NULL), OK);
    CHECK_CU(cuMemPoolDestroy(mx), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);

    /* A full device: the pool gives back its idle chunks before failing. */
    val = ~0ULL;
    CHECK_CU(cuMemPoolSetAttribute(dp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &val), OK);
    CHECK_CU(cuMemAllocAsync(&b1, 1 * MiB, NULL), OK);
    CHECK_CU(cuMemFreeAsync(b1, NULL), OK);
    CHECK_CU(cuStreamSynchronize(NULL), OK);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB); /* kept: threshold is huge */
    uint64_t fr = T(0).free_bytes;
    CHECK_EQ(fr, 7 * GiB - 256 * MiB - 32 * MiB);
    CUdeviceptr big = 0, y = 0, z = 0;
    CHECK_CU(cuMemAlloc(&big, fr - 20 * MiB), OK);
    CHECK_EQ(T(0).free_bytes, 20 * MiB);
    CHECK_CU(cuMemAllocAsync(&y, 40 * MiB, NULL), OK);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 40 * MiB);
    CHECK_EQ(t.free_bytes, 12 * MiB);
    CHECK_EQ(t.failed_allocs, 1);
    CHECK_CU(cuMemAllocAsync(&z, 40 * MiB, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    t = T(0);
    CHECK_EQ(t.failed_allocs, 2);
    CHECK_EQ(t.pool_reserved_bytes, 40 * MiB);
    CHECK_CU(cuMemFreeAsync(y, NULL), OK);
    CHECK_CU(cuMemFree(big), OK);
    CHECK_CU(cuMemPoolTrimTo(dp, 0), OK);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.used_bytes, 256 * MiB);
    CHECK_EQ(t.alloc_blocks, 0);

    /* CUDA 13 location-based pool queries. */
    CUmemLocation loc = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
    CHECK_CU(cuMemGetDefaultMemPool(&got, &loc, CU_MEM_ALLOCATION_TYPE_PINNED), OK);
    CHECK(got == dp);
    CHECK_CU(cuMemGetMemPool(&got, &loc, CU_MEM_ALLOCATION_TYPE_PINNED), OK);
    CHECK(got == dp);
    CHECK_CU(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, dp1), CUDA_ERROR_INVALID_VALUE);
    loc.type = CU_MEM_LOCATION_TYPE_HOST;
    CHECK_CU(cuMemGetDefaultMemPool(&got, &loc, CU_MEM_ALLOCATION_TYPE_PINNED), CUDA_ERROR_NOT_SUPPORTED);

    /* Absurd sizes fail cleanly, without reserving anything. */
    CHECK_CU(cuMemAllocAsync(&z, ~0ULL - 100, NULL), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CU(cuMemAlloc(&z, ~0ULL - 100), CUDA_ERROR_OUT_OF_MEMORY);
    t = T(0);
    CHECK_EQ(t.failed_allocs, 4);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.used_bytes, 256 * MiB);
}

/* ===================================================== fault injection */

static void sec_fault_nth(void *unused)
{
    base_env();
    setenv("SIMGPU_FAIL_NTH", "cuMemAlloc:3,*:6,cuMemAllocPitch:1", 1);
    INIT_PRIMARY(0); /* contexts are not allocating calls */
    CUdeviceptr d[8];
    void *h = NULL;
    CHECK_CU(cuMemAlloc(&d[0], 1), OK);                       /* cuMemAlloc #1, any #1 */
    CHECK_CU(cuMemAlloc(&d[1], 1), OK);                       /* #2, any #2 */
    CHECK_CU(cuMemAlloc(&d[2], 1), CUDA_ERROR_OUT_OF_MEMORY); /* #3: injected */
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.injected_failures, 1);
    CHECK_EQ(t.failed_allocs, 1);
    CHECK_EQ(t.alloc_blocks, 2);
    CHECK_CU(cuMemAllocManaged(&d[3], 4096, CU_MEM_ATTACH_GLOBAL), OK);   /* any #4 */
    CHECK_CU(cuMemHostAlloc(&h, 64, 0), OK);                              /* any #5 */
    CHECK_CU(cuMemAllocAsync(&d[4], 64, NULL), CUDA_ERROR_OUT_OF_MEMORY); /* any #6: injected */
    CHECK_CU(cuMemAlloc(&d[5], 1), OK);                                   /* cuMemAlloc #4, any #7 */
    t = T(0);
    CHECK_EQ(t.injected_failures, 2);
    CHECK_EQ(t.failed_allocs, 2);
    CHECK_EQ(t.alloc_blocks, 4);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.host_pinned_blocks, 1);

    /* Through the runtime: the injected failure is cudaErrorMemoryAllocation
     * and becomes the thread's last error. */
    void *rp = NULL;
    size_t pitch = 0;
    CHECK_RT(cudaMallocPitch(&rp, &pitch, 100, 2), cudaErrorMemoryAllocation);
    CHECK_RT(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_RT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RT(cudaGetLastError(), cudaSuccess);
    CHECK_RT(cudaMallocPitch(&rp, &pitch, 100, 2), cudaSuccess);
    CHECK_EQ(T(0).injected_failures, 3);
    CHECK_EQ(T(0).failed_allocs, 3);
    CHECK_CU(cuMemFreeHost(h), OK);
}

/* The failure pattern of 200 allocations under SIMGPU_FAIL_PROB=0.5. */
static void prob_pattern(void *out)
{
    base_env();
    setenv("SIMGPU_FAIL_PROB", "0.5", 1);
    setenv("SIMGPU_SEED", "42", 1);
    unsigned char *bits = out;
    INIT_PRIMARY(0);
    int fails = 0;
    for (int i = 0; i < 200; i++) {
        CUdeviceptr d;
        CUresult r = cuMemAlloc(&d, 1 + (size_t)i);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            bits[i / 8] |= (unsigned char)(1u << (i % 8));
            fails++;
        } else {
            CHECK_CU(r, OK);
            CHECK_CU(cuMemFree(d), OK);
        }
    }
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.injected_failures, fails);
    CHECK_EQ(t.failed_allocs, fails);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK(fails > 60 && fails < 140);
}

static void sec_fault_prob(void *unused)
{
    unsigned char a[32] = { 0 }, b[32] = { 0 };
    run_forked("fault-prob/a", prob_pattern, NULL, a, 25);
    run_forked("fault-prob/b", prob_pattern, NULL, b, 25);
    CHECK(memcmp(a, b, 25) == 0); /* same seed, same decisions */
    int ones = 0;
    for (int i = 0; i < 25; i++)
        ones += __builtin_popcount(a[i]);
    CHECK(ones > 60 && ones < 140);
}

/* ============================================ bad configuration values */

static void sec_bad_env(void *unused)
{
    base_env();
    unsetenv("SIMGPU_NAME");
    setenv("SIMGPU_DEVICES", "abc", 1);
    setenv("SIMGPU_MEM", "12XB", 1);
    setenv("SIMGPU_GRANULARITY", "3000", 1);
    setenv("SIMGPU_OTHER_PROCS", "0:1:x", 1);
    setenv("SIMGPU_FAIL_NTH", "cuBogus:1", 1);
    setenv("SIMGPU_CC", "nine", 1);
    unsetenv("SIMGPU_CTX_OVERHEAD");
    char path[300];
    snprintf(path, sizeof path, "%s/stderr-bad-env.txt", g_tmpdir);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    simgpu_truth_t t = T(0);
    simgpu_truth_t t1;
    int have_dev1 = simgpu_truth(1, &t1);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK_EQ(t.total_bytes, 24 * GiB);
    CHECK_EQ(t.other_process_bytes, 0);
    CHECK_EQ(have_dev1, -1);
    CHECK_EQ(simgpu_device_count(), 1);

    char text[4096] = { 0 };
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f)
        fclose(f);
    text[n] = '\0';
    int lines = 0;
    for (char *p = text; (p = strstr(p, "simgpu: warning:")); p++)
        lines++;
    CHECK_EQ(lines, 6);
    CHECK(strstr(text, "SIMGPU_DEVICES='abc'") != NULL);
    CHECK(strstr(text, "SIMGPU_MEM='12XB'") != NULL);
    CHECK(strstr(text, "SIMGPU_GRANULARITY") != NULL);
    CHECK(strstr(text, "SIMGPU_OTHER_PROCS") != NULL);
    CHECK(strstr(text, "SIMGPU_FAIL_NTH") != NULL);
    CHECK(strstr(text, "SIMGPU_CC") != NULL);
    /* ...each with the parser's reason. */
    CHECK(strstr(text, "SIMGPU_MEM='12XB' (malformed value)") != NULL);
    CHECK(strstr(text, "SIMGPU_OTHER_PROCS='0:1:x' (expected DEV:PID:NAME:BYTES)") != NULL);
    CHECK(strstr(text, "SIMGPU_FAIL_NTH='cuBogus:1' (not an allocating function") != NULL);

    /* Defaults in effect: 512 MiB context overhead, 2 MiB granules. */
    INIT_PRIMARY(0);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 1), OK);
    t = T(0);
    CHECK_EQ(t.context_bytes, 512 * MiB);
    CHECK_EQ(t.alloc_charged_bytes, 2 * MiB);
    int a = 0;
    CHECK_CU(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), OK);
    CHECK_EQ(a, 9);
}

/* Units and fractional sizes. */
static void sec_sizes(void *unused)
{
    base_env();
    setenv("SIMGPU_DEVICES", "4", 1);
    setenv("SIMGPU_MEM", "80GB,1:1.5GiB,2:512MiB,3:1073741824", 1);
    setenv("SIMGPU_CTX_OVERHEAD", "0", 1);
    setenv("SIMGPU_GRANULARITY", "64KiB", 1);
    unsetenv("SIMGPU_OTHER_PROCS");
    CHECK_EQ(T(0).total_bytes, 80000000000ULL);
    CHECK_EQ(T(1).total_bytes, 1536 * MiB);
    CHECK_EQ(T(2).total_bytes, 512 * MiB);
    CHECK_EQ(T(3).total_bytes, 1 * GiB);
    CHECK_CU(cuInit(0), OK);
    CUcontext c;
    CHECK_CU(cuDevicePrimaryCtxRetain(&c, 3), OK);
    CHECK_CU(cuCtxSetCurrent(c), OK);
    simgpu_truth_t t = T(3);
    CHECK_EQ(t.context_bytes, 0);
    CHECK_EQ(t.contexts, 1);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 100 * KiB), OK);
    CHECK_EQ(T(3).alloc_charged_bytes, 128 * KiB);
}

/* ================================================================ fork */

static void fork_grandchild(void *unused)
{
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.contexts, 0);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK_EQ(t.used_bytes, 0);
    CHECK_EQ(t.peak_used_bytes, 0);
    CHECK_EQ(t.free_bytes, 7 * GiB);
    CUdeviceptr d;
    CUcontext c;
    CHECK_CU(cuMemAlloc(&d, 1), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_CU(cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    /* The runtime starts over by itself. */
    void *p = NULL;
    CHECK_RT(cudaMalloc(&p, 1 * MiB), cudaSuccess);
    t = T(0);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t.alloc_blocks, 1);
    CHECK_EQ(t.used_bytes, 256 * MiB + 2 * MiB);
    CHECK_RT(cudaFree(p), cudaSuccess);
}

static void sec_fork(void *unused)
{
    base_env();
    INIT_PRIMARY(0);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 10 * MiB), OK);
    void *p = NULL;
    CHECK_RT(cudaMalloc(&p, 4 * MiB), cudaSuccess);
    CHECK_EQ(T(0).alloc_blocks, 2);
    run_forked("fork/child", fork_grandchild, NULL, NULL, 0);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.alloc_blocks, 2);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t.used_bytes, 256 * MiB + 14 * MiB);
    CHECK_CU(cuMemAlloc(&d, 1), OK);
}

/* ============================================================ no device */

static void sec_no_device(void *unused)
{
    base_env();
    setenv("SIMGPU_DEVICES", "0", 1);
    unsetenv("SIMGPU_OTHER_PROCS");
    unsetenv("SIMGPU_MEM");
    unsetenv("SIMGPU_NAME");
    unsetenv("SIMGPU_CC");
    CHECK_CU(cuInit(0), CUDA_ERROR_NO_DEVICE);
    int n = -1;
    CHECK_CU(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_RT(cudaGetDeviceCount(&n), cudaErrorNoDevice);
    CHECK_EQ(n, 0);
    void *p = NULL;
    CHECK_RT(cudaMalloc(&p, 16), cudaErrorNoDevice);
    CHECK_RT(cudaGetLastError(), cudaErrorNoDevice);
    int v = 0;
    CHECK_RT(cudaDriverGetVersion(&v), cudaSuccess);
    CHECK_EQ(v, 13000);
    simgpu_truth_t t;
    CHECK_EQ(simgpu_truth(0, &t), -1);
    unsigned cnt = 9;
    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetCount_v2(&cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 0);
    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);
}

/* ================================================================ NVML */

static void sec_nvml(void *unused)
{
    base_env();
    unsigned cnt = 0;
    nvmlDevice_t d0 = NULL, d1 = NULL, dx = NULL;
    CHECK_EQ(nvmlDeviceGetCount_v2(&cnt), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    CHECK_STR(nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE), "Insufficient Size");
    CHECK_EQ(nvmlInitWithFlags(0x100), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetCount_v2(&cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 2);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(1, &d1), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(2, &dx), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("0000:10:00.0", &dx), NVML_SUCCESS);
    CHECK(dx == d0);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("00000000:11:00.0", &dx), NVML_SUCCESS);
    CHECK(dx == d1);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("00000000:1A:00.0", &dx), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2("nonsense", &dx), NVML_ERROR_INVALID_ARGUMENT);
    unsigned idx = 9;
    CHECK_EQ(nvmlDeviceGetIndex(d1, &idx), NVML_SUCCESS);
    CHECK_EQ(idx, 1);
    char name[96];
    CHECK_EQ(nvmlDeviceGetName(d1, name, sizeof name), NVML_SUCCESS);
    CHECK_STR(name, "Sim B");
    CHECK_EQ(nvmlDeviceGetName(d1, name, 3), NVML_ERROR_INSUFFICIENT_SIZE);
    int maj = 0, min = 0;
    CHECK_EQ(nvmlDeviceGetCudaComputeCapability(d1, &maj, &min), NVML_SUCCESS);
    CHECK_EQ(maj, 8);
    CHECK_EQ(min, 6);
    nvmlPciInfo_t pci;
    CHECK_EQ(nvmlDeviceGetPciInfo_v3(d1, &pci), NVML_SUCCESS);
    CHECK_STR(pci.busId, "00000000:11:00.0");
    CHECK_STR(pci.busIdLegacy, "0000:11:00.0");
    CHECK_EQ(pci.bus, 0x11);
    char uuid[96], drv[80];
    CHECK_EQ(nvmlDeviceGetUUID(d1, uuid, sizeof uuid), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(uuid, &dx), NVML_SUCCESS);
    CHECK(dx == d1);
    CHECK_EQ(nvmlSystemGetDriverVersion(drv, sizeof drv), NVML_SUCCESS);
    CHECK(strlen(drv) > 0);
    int cv = 0;
    CHECK_EQ(nvmlSystemGetCudaDriverVersion(&cv), NVML_SUCCESS);
    CHECK_EQ(cv, 13000);
    char pname[64];
    CHECK_EQ(nvmlSystemGetProcessName(4242, pname, sizeof pname), NVML_SUCCESS);
    CHECK_STR(pname, "Xorg");

    /* Before this process touches the GPU: only the configured others. */
    nvmlMemory_t mem;
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d0, &mem), NVML_SUCCESS);
    CHECK_EQ(mem.total, 8 * GiB);
    CHECK_EQ(mem.used, 1 * GiB);
    CHECK_EQ(mem.free, 7 * GiB);
    nvmlProcessInfo_t procs[8];
    unsigned n = 0;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(n, 1);
    n = 8;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &n, procs), NVML_SUCCESS);
    CHECK_EQ(n, 1);
    CHECK_EQ(procs[0].pid, 4242);
    CHECK_EQ(procs[0].usedGpuMemory, 1 * GiB);
    CHECK_EQ(procs[0].gpuInstanceId, 0xFFFFFFFFu);

    /* Now with a context and memory on device 0. */
    INIT_PRIMARY(0);
    CUdeviceptr dp;
    CHECK_CU(cuMemAlloc(&dp, 100 * MiB), OK);
    simgpu_truth_t t = T(0);
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d0, &mem), NVML_SUCCESS);
    CHECK_EQ(mem.used, t.used_bytes + 1 * GiB);
    CHECK_EQ(mem.free, t.free_bytes);
    size_t fr = 0, to = 0;
    CHECK_CU(cuMemGetInfo(&fr, &to), OK);
    CHECK_EQ(mem.free, fr);
    CHECK_EQ(mem.total, to);
    nvmlMemory_v2_t mem2;
    memset(&mem2, 0, sizeof mem2);
    CHECK_EQ(nvmlDeviceGetMemoryInfo_v2(d0, &mem2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    mem2.version = nvmlMemory_v2;
    CHECK_EQ(nvmlDeviceGetMemoryInfo_v2(d0, &mem2), NVML_SUCCESS);
    CHECK_EQ(mem2.reserved, 0);
    CHECK_EQ(mem2.used, mem.used);
    CHECK_EQ(mem2.free, mem.free);

    n = 1;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &n, procs), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(n, 2);
    n = 8;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &n, procs), NVML_SUCCESS);
    CHECK_EQ(n, 2);
    bool seen_self = false, seen_xorg = false;
    for (unsigned i = 0; i < n; i++) {
        if (procs[i].pid == (unsigned)getpid()) {
            seen_self = true;
            CHECK_EQ(procs[i].usedGpuMemory, t.used_bytes);
            CHECK_EQ(procs[i].usedGpuMemory, 256 * MiB + 100 * MiB);
        }
        if (procs[i].pid == 4242)
            seen_xorg = true;
    }
    CHECK(seen_self && seen_xorg);
    /* Device 1: no context here, only the configured python process. */
    n = 8;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d1, &n, procs), NVML_SUCCESS);
    CHECK_EQ(n, 1);
    CHECK_EQ(procs[0].pid, 777);
    CHECK_EQ(procs[0].usedGpuMemory, 512 * MiB);

    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d0, &mem), NVML_ERROR_UNINITIALIZED);
}

/* ============================================================= runtime */

static void *thread_malloc(void *arg)
{
    void **p = arg;
    cudaError_t e = cudaMalloc(p, 6 * MiB);
    return (void *)(intptr_t)e;
}

static void sec_runtime(void *unused)
{
    base_env();
    int n = 0, v = 0;
    CHECK_RT(cudaGetDeviceCount(&n), cudaSuccess);
    CHECK_EQ(n, 2);
    CHECK_RT(cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK_EQ(v, 13000);
    CHECK_RT(cudaDriverGetVersion(&v), cudaSuccess);
    CHECK_EQ(v, 13000);
    CHECK_EQ(T(0).contexts, 0); /* querying devices creates no context */

    struct cudaDeviceProp prop;
    CHECK_RT(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
    CHECK_STR(prop.name, "Sim B");
    CHECK_EQ(prop.totalGlobalMem, 4 * GiB);
    CHECK_EQ(prop.major, 8);
    CHECK_EQ(prop.minor, 6);
    CHECK_EQ(prop.multiProcessorCount, 132);
    CHECK_EQ(prop.pciBusID, 0x11);
    CHECK_EQ(prop.memoryPoolsSupported, 1);
    CHECK_RT(cudaGetDeviceProperties(&prop, 2), cudaErrorInvalidDevice);
    CHECK_RT(cudaGetLastError(), cudaErrorInvalidDevice);
    int a = 0;
    CHECK_RT(cudaDeviceGetAttribute(&a, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    CHECK_EQ(a, 9);
    CHECK_RT(cudaDeviceGetAttribute(&a, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    CHECK_EQ(a, 132);
    CHECK_EQ(T(0).contexts, 0);

    /* cudaMalloc(…, 0) creates the context and returns NULL. */
    void *p = (void *)1, *q = NULL, *r = NULL;
    CHECK_RT(cudaMalloc(&p, 0), cudaSuccess);
    CHECK(p == NULL);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t.context_bytes, 256 * MiB);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK_RT(cudaMalloc(&p, 10 * MiB), cudaSuccess);
    CHECK(p != NULL);
    t = T(0);
    CHECK_EQ(t.alloc_charged_bytes, 10 * MiB);
    CHECK_EQ(t.alloc_requested_bytes, 10 * MiB);
    size_t fr = 0, to = 0;
    CHECK_RT(cudaMemGetInfo(&fr, &to), cudaSuccess);
    CHECK_EQ(fr, t.free_bytes);
    CHECK_EQ(to, 8 * GiB);
    CHECK_EQ(fr, 7 * GiB - 256 * MiB - 10 * MiB);

    /* Out of memory: the right code, and the thread's sticky last error. */
    CHECK_RT(cudaMalloc(&q, fr + 1), cudaErrorMemoryAllocation);
    CHECK_EQ(T(0).failed_allocs, 1);
    CHECK_RT(cudaMalloc(&q, 1 * MiB), cudaSuccess); /* success does not clear it */
    CHECK_RT(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_RT(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
    CHECK_RT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_RT(cudaGetLastError(), cudaSuccess);
    CHECK_STR(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
    CHECK_STR(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation");
    CHECK_STR(cudaGetErrorName((cudaError_t)12345), "unrecognized error code");
    for (size_t i = 0; i < sizeof k_cuda_error_names / sizeof k_cuda_error_names[0]; i++)
        if (strcmp(cudaGetErrorName((cudaError_t)k_cuda_error_names[i].code), k_cuda_error_names[i].name) != 0)
            CHECK(!"cudaGetErrorName covers every enumerator");
    CHECK_RT(cudaFree(q), cudaSuccess);
    CHECK_RT(cudaFree((char *)p + 1), cudaErrorInvalidValue);
    CHECK_RT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_RT(cudaFree(NULL), cudaSuccess);

    /* Managed, pitch, pinned. */
    CHECK_RT(cudaMallocManaged(&q, 0, cudaMemAttachGlobal), cudaErrorInvalidValue);
    CHECK_RT(cudaMallocManaged(&q, 1 * MiB, cudaMemAttachGlobal), cudaSuccess);
    memset(q, 0x5a, 1 * MiB);
    CHECK_EQ(T(0).managed_requested_bytes, 1 * MiB);
    size_t pitch = 0;
    CHECK_RT(cudaMallocPitch(&r, &pitch, 100, 3), cudaSuccess);
    CHECK_EQ(pitch, 512);
    CHECK_EQ(T(0).alloc_requested_bytes, 10 * MiB + 1 * MiB + 1536);
    void *h = NULL, *h2 = NULL;
    CHECK_RT(cudaMallocHost(&h, 3000), cudaSuccess);
    CHECK_RT(cudaHostAlloc(&h2, 5000, cudaHostAllocMapped | cudaHostAllocPortable), cudaSuccess);
    CHECK_RT(cudaHostAlloc(&h2, 5000, 0x100), cudaErrorInvalidValue);
    CHECK_EQ(T(0).host_pinned_bytes, 8000);
    CHECK_EQ(T(0).host_pinned_blocks, 2);
    CHECK_RT(cudaFreeHost(h), cudaSuccess);
    CHECK_RT(cudaFreeHost(h2), cudaSuccess);
    CHECK_EQ(T(0).host_pinned_bytes, 0);

    /* Copies and sets: real bytes for managed memory. */
    char hb[16] = "hello, world";
    CHECK_RT(cudaMemcpy(p, hb, sizeof hb, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_RT(cudaMemcpy(q, hb, sizeof hb, cudaMemcpyDefault), cudaSuccess);
    CHECK_STR((char *)q, "hello, world");
    CHECK_RT(cudaMemset(q, 'z', 2), cudaSuccess);
    CHECK_EQ(((char *)q)[1], 'z');
    CHECK_RT(cudaMemcpy(hb, p, sizeof hb, (enum cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
    CHECK_RT(cudaMemcpyAsync(hb, q, 4, cudaMemcpyDeviceToHost, NULL), cudaSuccess);
    CHECK_EQ(hb[0], 'z');
    CHECK_RT(cudaMemsetAsync(p, 0, 16, cudaStreamPerThread), cudaSuccess);
    CHECK_RT(cudaGetLastError(), cudaErrorInvalidMemcpyDirection);

    /* Devices are per thread; cudaSetDevice creates the context at once. */
    CHECK_RT(cudaSetDevice(5), cudaErrorInvalidDevice);
    CHECK_RT(cudaSetDevice(1), cudaSuccess);
    CHECK_EQ(T(1).contexts, 1);
    int dev = -1;
    CHECK_RT(cudaGetDevice(&dev), cudaSuccess);
    CHECK_EQ(dev, 1);
    void *p1 = NULL;
    CHECK_RT(cudaMalloc(&p1, 3 * MiB), cudaSuccess);
    CHECK_EQ(T(1).alloc_charged_bytes, 4 * MiB);
    pthread_t th;
    void *tp = NULL, *ret = NULL;
    uint64_t before = T(0).alloc_charged_bytes, threads = T(0).alloc_threads;
    CHECK_EQ(T(1).alloc_threads, 1); /* this thread's first allocation on device 1 */
    pthread_create(&th, NULL, thread_malloc, &tp);
    pthread_join(th, &ret);
    CHECK_EQ((intptr_t)ret, cudaSuccess);
    CHECK_EQ(T(0).alloc_charged_bytes, before + 6 * MiB); /* new thread: device 0 */
    CHECK_EQ(T(0).alloc_threads, threads + 1);            /* a thread more allocated there */
    CHECK_RT(cudaFree(tp), cudaSuccess);
    CHECK_RT(cudaFree(p1), cudaSuccess);
    CHECK_RT(cudaMemcpy(p1, hb, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_RT(cudaSetDevice(0), cudaSuccess);

    /* Stream-ordered allocation, legacy and per-thread entry points. */
    cudaStream_t s = NULL;
    CHECK_RT(cudaStreamCreate(&s), cudaSuccess);
    void *a1 = NULL, *a2 = NULL, *a3 = NULL;
    CHECK_RT(cudaMallocAsync(&a1, 2 * MiB, s), cudaSuccess);
    CHECK_RT(cudaMallocAsync_ptsz(&a2, 2 * MiB, cudaStreamPerThread), cudaSuccess);
    CHECK_RT(cudaMallocAsync(&a3, 0, s), cudaSuccess);
    CHECK(a3 == NULL);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 32 * MiB);
    CHECK_EQ(t.pool_used_bytes, 4 * MiB);
    CHECK_RT(cudaFreeAsync(a1, s), cudaSuccess);
    CHECK_RT(cudaFreeAsync_ptsz(a2, cudaStreamPerThread), cudaSuccess);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_RT(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);
    cudaEvent_t ev;
    CHECK_RT(cudaEventCreate(&ev), cudaSuccess);
    CHECK_RT(cudaEventRecord(ev, s), cudaSuccess);
    CHECK_RT(cudaEventSynchronize(ev), cudaSuccess);
    CHECK_RT(cudaEventDestroy(ev), cudaSuccess);
    CHECK_RT(cudaStreamDestroy(s), cudaSuccess);
    CHECK_RT(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
    CHECK_RT(cudaStreamSynchronize_ptsz(cudaStreamPerThread), cudaSuccess);

    /* Pools through the runtime. */
    cudaMemPool_t dpool = NULL, mpool = NULL;
    CUmemoryPool drvpool = NULL;
    CHECK_RT(cudaDeviceGetDefaultMemPool(&dpool, 0), cudaSuccess);
    CHECK_CU(cuDeviceGetDefaultMemPool(&drvpool, 0), OK);
    CHECK(dpool == (cudaMemPool_t)drvpool);
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    CHECK_RT(cudaMemPoolCreate(&mpool, &props), cudaSuccess);
    CHECK_RT(cudaMallocFromPoolAsync(&a1, 5 * MiB, mpool, NULL), cudaSuccess);
    CHECK_RT(cudaMallocFromPoolAsync_ptsz(&a2, 1 * MiB, mpool, cudaStreamPerThread), cudaSuccess);
    cuuint64_t val = 0;
    CHECK_RT(cudaMemPoolGetAttribute(mpool, cudaMemPoolAttrReservedMemCurrent, &val), cudaSuccess);
    CHECK_EQ(val, 32 * MiB);
    CHECK_RT(cudaMemPoolGetAttribute(mpool, cudaMemPoolAttrUsedMemCurrent, &val), cudaSuccess);
    CHECK_EQ(val, 6 * MiB);
    val = ~0ULL;
    CHECK_RT(cudaMemPoolSetAttribute(mpool, cudaMemPoolAttrReleaseThreshold, &val), cudaSuccess);
    CHECK_RT(cudaFreeAsync(a1, NULL), cudaSuccess);
    CHECK_RT(cudaFreeAsync(a2, NULL), cudaSuccess);
    CHECK_RT(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_EQ(T(0).pool_reserved_bytes, 32 * MiB);
    CHECK_RT(cudaMemPoolTrimTo(mpool, 0), cudaSuccess);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);
    CHECK_RT(cudaMemPoolDestroy(mpool), cudaSuccess);
    CHECK_RT(cudaMemPoolDestroy(dpool), cudaErrorInvalidValue);
    CHECK_RT(cudaGetLastError(), cudaErrorInvalidValue);

    /* Driver entry points through the runtime. */
    void *lib = libcuda();
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
    CHECK_RT(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 12000, cudaEnableDefault, &qr), cudaSuccess);
    CHECK(fn == dlsym(lib, "cuMemAlloc_v2"));
    CHECK_EQ(qr, cudaDriverEntryPointSuccess);
    CHECK_RT(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 12000, cudaEnablePerThreadDefaultStream, &qr),
             cudaSuccess);
    CHECK(fn == dlsym(lib, "cuMemAllocAsync_ptsz"));
    CHECK_RT(cudaGetDriverEntryPointByVersion_ptsz("cuMemFreeAsync", &fn, 12000, cudaEnableDefault, &qr), cudaSuccess);
    CHECK(fn == dlsym(lib, "cuMemFreeAsync_ptsz"));
    CHECK_RT(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 12000, cudaEnableDefault, &qr), cudaSuccess);
    CHECK(fn == NULL);
    CHECK_EQ(qr, cudaDriverEntryPointSymbolNotFound);
    CHECK_RT(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault, &qr), cudaSuccess);
    CHECK(fn == NULL);
    CHECK_EQ(qr, cudaDriverEntryPointVersionNotSufficent);
    CHECK_RT(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 99000, cudaEnableDefault, &qr), cudaErrorInvalidValue);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK_RT(cudaGetDriverEntryPoint("cuCtxGetDevice", &fn, cudaEnableDefault, &qr), cudaSuccess);
#pragma GCC diagnostic pop
    CHECK(fn == dlsym(lib, "cuCtxGetDevice_v2")); /* the runtime's own version: 13000 */

    /* cudaDeviceReset destroys the context and its cudaMalloc memory (pools
     * and VMM survive); the next call builds a fresh context. */
    CHECK_RT(cudaMallocAsync(&a1, 1 * MiB, NULL), cudaSuccess);
    t = T(0);
    CHECK(t.alloc_blocks >= 3);
    CHECK_RT(cudaDeviceReset(), cudaSuccess);
    t = T(0);
    CHECK_EQ(t.contexts, 0);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK_EQ(t.pool_blocks, 1);
    CHECK_RT(cudaMalloc(&p, 1), cudaSuccess);
    t = T(0);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t.alloc_blocks, 1);
    CHECK_RT(cudaFreeAsync(a1, NULL), cudaSuccess);
    CHECK_RT(cudaDeviceSynchronize(), cudaSuccess);
    CHECK_EQ(T(0).pool_reserved_bytes, 0);
}

/* The runtime replays NVIDIA's lookup sequence exactly. */
static void sec_lookups(void *unused)
{
    base_env();
    char path[300];
    snprintf(path, sizeof path, "%s/lookups.txt", g_tmpdir);
    unlink(path);
    setenv("SIMGPU_LOG_LOOKUPS", path, 1);
    int n = 0;
    CHECK_RT(cudaGetDeviceCount(&n), cudaSuccess);
    void *p = NULL;
    CHECK_RT(cudaMallocAsync_ptsz(&p, 1, cudaStreamPerThread), cudaSuccess); /* no further lookups */
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    char line[256];
    size_t i = 0, mismatches = 0, nlook = sizeof k_cudart13_lookups / sizeof k_cudart13_lookups[0];
    bool saw_pt_alloc = false;
    while (fgets(line, sizeof line, f)) {
        char want[256];
        if (i < nlook) {
            snprintf(want, sizeof want, "%s %d %u\n", k_cudart13_lookups[i].name, k_cudart13_lookups[i].version,
                     k_cudart13_lookups[i].flags);
            if (strcmp(want, line) != 0 && mismatches++ < 3)
                printf("  lookup %zu: got '%.*s', expected '%.*s'\n", i, (int)strcspn(line, "\n"), line,
                       (int)strcspn(want, "\n"), want);
        }
        if (strcmp(line, "cuMemAllocAsync 11020 2\n") == 0)
            saw_pt_alloc = true;
        i++;
    }
    fclose(f);
    CHECK_EQ(i, nlook);
    CHECK_EQ(i, 440);
    CHECK_EQ(mismatches, 0);
    CHECK(saw_pt_alloc);
}

/* ===================================================== shared state dir */

static unsigned g_peer_pid;

static void state_peer(void *unused)
{
    /* A fresh process on the same simulated GPU as its parent. */
    CHECK_CU(cuInit(0), OK);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.other_process_bytes, 1 * GiB + 256 * MiB + 1 * GiB);
    CUcontext c;
    CHECK_CU(cuDevicePrimaryCtxRetain(&c, 0), OK);
    CHECK_CU(cuCtxSetCurrent(c), OK);
    size_t fr = 0, to = 0;
    CHECK_CU(cuMemGetInfo(&fr, &to), OK);
    CHECK_EQ(fr, 8 * GiB - 1 * GiB - (1 * GiB + 256 * MiB) - 256 * MiB);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, fr + 2 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_CU(cuMemAlloc(&d, fr), OK);

    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t d0;
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    nvmlProcessInfo_t procs[8];
    unsigned n = 8;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &n, procs), NVML_SUCCESS);
    CHECK_EQ(n, 3);
    bool seen_parent = false;
    for (unsigned i = 0; i < n; i++)
        if (procs[i].pid == g_peer_pid) {
            seen_parent = true;
            CHECK_EQ(procs[i].usedGpuMemory, 1 * GiB + 256 * MiB);
        }
    CHECK(seen_parent);
    nvmlMemory_t mem;
    CHECK_EQ(nvmlDeviceGetMemoryInfo(d0, &mem), NVML_SUCCESS);
    CHECK_EQ(mem.free, 0);
    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);
}

/* Takes a slot, then dies without running destructors: the slot stays
 * behind with a dead pid, which peers must ignore. */
static int state_crasher(void)
{
    CUcontext c;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS)
        return 1;
    return 0;
}

static void sec_state_dir(void *unused)
{
    base_env();
    char dir[300];
    snprintf(dir, sizeof dir, "%s/state", g_tmpdir);
    setenv("SIMGPU_STATE_DIR", dir, 1);
    INIT_PRIMARY(0);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 1 * GiB), OK);
    g_peer_pid = (unsigned)getpid();
    run_forked("state-dir/peer", state_peer, NULL, NULL, 0);
    /* The peer exited (and released its slot): only the configured process. */
    CHECK_EQ(T(0).other_process_bytes, 1 * GiB);

    /* A peer killed without cleanup is ignored once dead. */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(state_crasher());
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ(T(0).other_process_bytes, 1 * GiB);
    size_t fr = 0, to = 0;
    CHECK_CU(cuMemGetInfo(&fr, &to), OK);
    CHECK_EQ(fr, 8 * GiB - 1 * GiB - 256 * MiB - 1 * GiB);
}

/* ============================================================ truth file */

static void truth_writer(void *unused)
{
    INIT_PRIMARY(0);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 3 * MiB), OK);
    g_peer_pid = (unsigned)getpid();
}

static void sec_truth_file(void *unused)
{
    base_env();
    char pat[300];
    snprintf(pat, sizeof pat, "%s/truth-%%p.json", g_tmpdir);
    setenv("SIMGPU_TRUTH_FILE", pat, 1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* exit() runs the driver's destructor, which writes the file. */
        truth_writer(NULL);
        exit(g_fail ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char path[320];
    snprintf(path, sizeof path, "%s/truth-%d.json", g_tmpdir, (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    char line[2048];
    int lines = 0;
    bool dev0_ok = false, dev1_ok = false;
    while (fgets(line, sizeof line, f)) {
        lines++;
        if (strstr(line, "\"device\":0,") && strstr(line, "\"alloc_blocks\":1,") &&
            strstr(line, "\"alloc_requested_bytes\":3145728,") && strstr(line, "\"context_bytes\":268435456,") &&
            strstr(line, "\"other_process_bytes\":1073741824,"))
            dev0_ok = true;
        if (strstr(line, "\"device\":1,") && strstr(line, "\"used_bytes\":0,"))
            dev1_ok = true;
    }
    fclose(f);
    CHECK_EQ(lines, 2);
    CHECK(dev0_ok);
    CHECK(dev1_ok);
}

/* ============================================================== threads */

#define N_THREADS 8
#define N_ITERS   3000

static CUcontext g_thread_ctx;
static int g_thread_fails[N_THREADS];

static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned seed = (unsigned)id * 7919u + 1;
    CUdeviceptr live[16] = { 0 };
    int bad = 0;
    if (cuCtxSetCurrent(g_thread_ctx) != CUDA_SUCCESS)
        return (void *)1;
    for (int i = 0; i < N_ITERS; i++) {
        int slot = (int)(rand_r(&seed) % 16);
        if (live[slot]) {
            CUresult r = (i & 1) ? cuMemFree(live[slot]) : cuMemFreeAsync(live[slot], CU_STREAM_PER_THREAD);
            bad += r != CUDA_SUCCESS;
            live[slot] = 0;
            continue;
        }
        size_t size = 1 + rand_r(&seed) % (3 * MiB);
        CUresult r = (rand_r(&seed) & 1) ? cuMemAlloc(&live[slot], size)
                                         : cuMemAllocAsync(&live[slot], size, CU_STREAM_PER_THREAD);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            g_thread_fails[id]++;
        else
            bad += r != CUDA_SUCCESS;
        if (r != CUDA_SUCCESS)
            live[slot] = 0;
        if (i % 500 == 0)
            cuStreamSynchronize(CU_STREAM_PER_THREAD);
    }
    for (int s = 0; s < 16; s++)
        if (live[s])
            bad += cuMemFree(live[s]) != CUDA_SUCCESS;
    return (void *)(intptr_t)bad;
}

/* The runtime from many threads at once, starting with its initialisation. */
static int g_rt_fails[N_THREADS];

static void *hammer_runtime(void *arg)
{
    int id = (int)(intptr_t)arg;
    unsigned seed = (unsigned)id * 104729u + 3;
    int bad = 0;
    if (cudaSetDevice(id % 2) != cudaSuccess)
        return (void *)1;
    for (int i = 0; i < 500; i++) {
        void *p = NULL;
        size_t size = 1 + rand_r(&seed) % (1 * MiB);
        cudaError_t e = (i & 1) ? cudaMalloc(&p, size) : cudaMallocAsync(&p, size, cudaStreamPerThread);
        if (e == cudaErrorMemoryAllocation) {
            g_rt_fails[id]++;
            continue;
        }
        bad += e != cudaSuccess;
        bad += ((i & 2) ? cudaFree(p) : cudaFreeAsync(p, cudaStreamPerThread)) != cudaSuccess;
    }
    bad += cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess;
    cudaGetLastError();
    return (void *)(intptr_t)bad;
}

/* N_THREADS threads of fn(i), joined; each must return 0 (one check each).
 * Returns the sum of the failures they counted in thread_fails[]. */
static int run_threads(void *(*fn)(void *), const int *thread_fails)
{
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&th[i], NULL, fn, (void *)(intptr_t)i);
    int fails = 0;
    for (int i = 0; i < N_THREADS; i++) {
        void *ret = NULL;
        pthread_join(th[i], &ret);
        CHECK_EQ((intptr_t)ret, 0);
        fails += thread_fails[i];
    }
    return fails;
}

static void sec_threads(void *unused)
{
    base_env();
    setenv("SIMGPU_FAIL_PROB", "0.01", 1);
    setenv("SIMGPU_SEED", "7", 1);
    CHECK_CU(cuInit(0), OK);
    CHECK_CU(cuDevicePrimaryCtxRetain(&g_thread_ctx, 0), OK);
    int fails = run_threads(hammer, g_thread_fails);
    simgpu_truth_t t = T(0);
    CHECK_EQ(t.alloc_blocks, 0);
    CHECK_EQ(t.alloc_charged_bytes, 0);
    CHECK_EQ(t.pool_blocks, 0);
    CHECK_EQ(t.pool_used_bytes, 0);
    CHECK_EQ(t.injected_failures, fails);
    CHECK_EQ(t.failed_allocs, fails);
    CHECK(fails > 0);
    CUcontext c;
    CHECK_CU(cuCtxSetCurrent(g_thread_ctx), OK);
    CHECK_CU(cuCtxSynchronize(), OK);
    t = T(0);
    CHECK_EQ(t.pool_reserved_bytes, 0);
    CHECK_EQ(t.used_bytes, 256 * MiB);
    (void)c;

    fails += run_threads(hammer_runtime, g_rt_fails);
    simgpu_truth_t t1 = T(1);
    t = T(0);
    CHECK_EQ(t.alloc_blocks + t1.alloc_blocks, 0);
    CHECK_EQ(t.pool_blocks + t1.pool_blocks, 0);
    CHECK_EQ(t.injected_failures + t1.injected_failures, fails);
    CHECK_EQ(t.contexts, 1);
    CHECK_EQ(t1.contexts, 1);
}

/* ================================================================= main */

/* The static runtime is a separate program (it must not link libcuda). */
static void run_static_runtime_test(const char *path)
{
    fflush(NULL);
    int rc = system(path);
    if (rc == 0) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL [static-runtime] %s exited with status 0x%x\n", path, rc);
    }
    printf("[static-runtime] %s\n", rc == 0 ? "ok" : "FAILED");
}

/* ============================================ under an LD_PRELOAD shim */

/* Runs in a re-executed copy of this program with fake_shim.so preloaded. */
/* Driver generations as NVML's process list writes them (SIMGPU_NVML_GENERATION). */
static void sec_nvml_generation(void *arg)
{
    const char *gen = arg;
    base_env();
    setenv("SIMGPU_NVML_GENERATION", gen, 1);
    setenv("SIMGPU_OTHER_PROCS", "0:4242:a:1GiB;0:777:b:2GiB", 1);
    size_t stride = !strcmp(gen, "r535") ? 32 : !strcmp(gen, "legacy16") ? 16 : 24;
    nvmlDevice_t d0;
    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    unsigned count = 1;
    unsigned char buf[2 * 32 + 16];
    memset(buf, 0xAB, sizeof buf);
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &count, (nvmlProcessInfo_t *)buf),
             NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(count, 2);
    CHECK_EQ(buf[0], 0xAB); /* nothing written on INSUFFICIENT_SIZE */
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(d0, &count, (nvmlProcessInfo_t *)buf), NVML_SUCCESS);
    unsigned pid0, pid1;
    unsigned long long used1;
    memcpy(&pid0, buf, 4);
    memcpy(&pid1, buf + stride, 4);
    memcpy(&used1, buf + stride + 8, 8);
    CHECK_EQ(pid0, 4242);
    CHECK_EQ(pid1, 777);
    CHECK_EQ(used1, 2ull << 30);
    CHECK_EQ(buf[2 * stride], 0xAB); /* nothing past the last entry */
    nvmlProcessDetail_v1_t det[4];
    nvmlProcessDetailList_t list = { nvmlProcessDetailList_v1, 0, 4, det };
    nvmlReturn_t want = !strcmp(gen, "r580") ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
    CHECK_EQ(nvmlDeviceGetRunningProcessDetailList(d0, &list), want);
    if (want == NVML_SUCCESS) {
        CHECK_EQ(list.numProcArrayEntries, 2);
        CHECK_EQ(det[1].pid, 777);
        CHECK_EQ(det[1].usedGpuMemory, 2ull << 30);
        list.numProcArrayEntries = 1;
        CHECK_EQ(nvmlDeviceGetRunningProcessDetailList(d0, &list), NVML_ERROR_INSUFFICIENT_SIZE);
        CHECK_EQ(list.numProcArrayEntries, 2);
        list.version = 1;
        CHECK_EQ(nvmlDeviceGetRunningProcessDetailList(d0, &list), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        nvmlProcessDetailList_t gfx = { nvmlProcessDetailList_v1, 1, 4, det };
        CHECK_EQ(nvmlDeviceGetRunningProcessDetailList(d0, &gfx), NVML_SUCCESS);
        CHECK_EQ(gfx.numProcArrayEntries, 0);
    }
    nvmlShutdown();
}

/* CUDA arrays, IPC handles, unreadable pool attributes, the teardown at exit. */
static void sec_more_memory(void *unused)
{
    base_env();
    setenv("SIMGPU_POOL_ATTRS", "unreadable", 1);
    CUdevice dev;
    CUcontext ctx;
    simgpu_truth_t t0, t;
    CHECK_CU(cuInit(0), CUDA_SUCCESS);
    CHECK_CU(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    CHECK_CU(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    simgpu_truth(0, &t0);
    CUarray a;
    CUmipmappedArray m;
    CUDA_ARRAY_DESCRIPTOR d2 = { 1024, 1024, CU_AD_FORMAT_FLOAT, 4 };               /* 16 MiB */
    CUDA_ARRAY3D_DESCRIPTOR dm = { 256, 256, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0 }; /* 64 KiB+16+4+1 KiB */
    CUDA_ARRAY_DESCRIPTOR bad = { 16, 16, CU_AD_FORMAT_FLOAT, 3 };
    CHECK_CU(cuArrayCreate_v2(&a, &d2), CUDA_SUCCESS);
    CHECK_CU(cuMipmappedArrayCreate(&m, &dm, 4), CUDA_SUCCESS);
    CHECK_CU(cuArrayCreate_v2(&a, &bad), CUDA_ERROR_INVALID_VALUE);
    simgpu_truth(0, &t);
    CHECK_EQ(t.alloc_requested_bytes - t0.alloc_requested_bytes, (16ull << 20) + 65536 + 16384 + 4096 + 1024);
    CHECK_EQ(t.alloc_blocks - t0.alloc_blocks, 2);
    CHECK_CU(cuArrayDestroy(a), CUDA_SUCCESS);
    CHECK_CU(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
    CHECK_CU(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
    simgpu_truth(0, &t);
    CHECK_EQ(t.alloc_requested_bytes, t0.alloc_requested_bytes);
    /* IPC: a handle of a plain allocation; this process may not open its own */
    CUdeviceptr p, q;
    CUipcMemHandle h;
    CHECK_CU(cuMemAlloc_v2(&p, 8 << 20), CUDA_SUCCESS);
    CHECK_CU(cuIpcGetMemHandle(&h, p + 512), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cuIpcGetMemHandle(&h, p), CUDA_SUCCESS);
    CHECK_CU(cuIpcOpenMemHandle_v2(&q, h, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_CU(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    /* unreadable pool reservation (the rest of the pool works) */
    CUmemoryPool pool;
    cuuint64_t v = 0;
    CHECK_CU(cuDeviceGetMemPool(&pool, dev), CUDA_SUCCESS);
    CHECK_CU(cuMemAllocAsync(&q, 4 << 20, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v), CUDA_SUCCESS);
    CHECK_EQ(v, 4 << 20);
    CHECK_CU(cuMemFreeAsync(q, NULL), CUDA_SUCCESS);
    CHECK_CU(cuMemFree_v2(p), CUDA_SUCCESS);
}

static void sec_preload(void)
{
    base_env();
    int *calls = (int *)dlsym(RTLD_DEFAULT, "sim_fake_shim_calls");
    CHECK(calls != NULL);
    if (!calls)
        return;
    void *lib = libcuda();
    void *shim_alloc = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    void *drv_alloc = dlsym(lib, "cuMemAlloc_v2");
    CHECK(shim_alloc != NULL && drv_alloc != NULL && shim_alloc != drv_alloc);

    /* The program's own call goes through the shim. */
    INIT_PRIMARY(0);
    CUdeviceptr d;
    CHECK_CU(cuMemAlloc(&d, 1 * MiB), OK);
    CHECK_EQ(*calls, 1);

    /* cuGetProcAddress hands out the driver's own function... */
    void *fn = NULL;
    CHECK_CU(cuGetProcAddress("cuMemAlloc", &fn, 3020, 0, NULL), OK);
    CHECK(fn == drv_alloc);
    CHECK(fn != shim_alloc);
    if (fn)
        CHECK_CU(((PFN_cuMemAlloc_v3020)fn)(&d, 1 * MiB), OK);
    CHECK_EQ(*calls, 1);

    /* ...so does the runtime, which only uses cuGetProcAddress. */
    void *p = NULL;
    CHECK_RT(cudaMalloc(&p, 1 * MiB), cudaSuccess);
    CHECK_EQ(*calls, 1);
    CHECK_EQ(T(0).alloc_blocks, 3);

    /* Internal forwarding (v1 -> _v2) stays inside libcuda. */
    CUresult (*uuid_v1)(CUuuid *, CUdevice) = (CUresult(*)(CUuuid *, CUdevice))dlsym(lib, "cuDeviceGetUuid");
    CUuuid u;
    CHECK(uuid_v1 != NULL);
    if (uuid_v1)
        CHECK_CU(uuid_v1(&u, 0), OK);
    CHECK_EQ(*calls, 1);
}

static void run_preload_test(const char *self, const char *shim)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LD_PRELOAD", shim, 1);
        /* A preloaded library precedes the sanitizer runtime in the load
         * order; that is fine here, so skip ASan's link-order check. */
        const char *asan = getenv("ASAN_OPTIONS");
        char opts[512];
        snprintf(opts, sizeof opts, "%s%sverify_asan_link_order=0", asan ? asan : "", asan && *asan ? ":" : "");
        setenv("ASAN_OPTIONS", opts, 1);
        execl(self, self, "--preload-check", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok) {
        g_pass++;
    } else {
        g_fail++;
        printf("FAIL [preload] child exited with status 0x%x\n", status);
    }
    printf("[preload] %s\n", ok ? "ok" : "FAILED");
}

int main(int argc, char **argv)
{
    const char *static_rt = NULL, *fake_shim = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--preload-check") == 0) {
            g_section = "preload";
            sec_preload();
            printf("[preload] %d passed, %d failed\n", g_pass, g_fail);
            return g_fail ? 1 : 0;
        } else if (strcmp(argv[i], "--static-runtime") == 0 && i + 1 < argc) {
            static_rt = argv[++i];
        } else if (strcmp(argv[i], "--fake-shim") == 0 && i + 1 < argc) {
            fake_shim = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--static-runtime PROGRAM] [--fake-shim LIBRARY]\n", argv[0]);
            return 2;
        }
    }
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/sim_selftest.XXXXXX");
    if (!mkdtemp(g_tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* The sections, in order; each runs in its own fork child. */
    static const struct {
        const char *name;
        void (*fn)(void *);
        void *arg;
    } k_sections[] = {
        { "driver", sec_driver, NULL },
        { "proc-address", sec_proc_address, NULL },
        { "vmm", sec_vmm, NULL },
        { "pools", sec_pools, NULL },
        { "fault-nth", sec_fault_nth, NULL },
        { "fault-prob", sec_fault_prob, NULL },
        { "bad-env", sec_bad_env, NULL },
        { "sizes", sec_sizes, NULL },
        { "fork", sec_fork, NULL },
        { "no-device", sec_no_device, NULL },
        { "nvml", sec_nvml, NULL },
        { "runtime", sec_runtime, NULL },
        { "lookups", sec_lookups, NULL },
        { "state-dir", sec_state_dir, NULL },
        { "truth-file", sec_truth_file, NULL },
        { "threads", sec_threads, NULL },
        { "nvml-r580", sec_nvml_generation, "r580" },
        { "nvml-r535", sec_nvml_generation, "r535" },
        { "nvml-r525", sec_nvml_generation, "r525" },
        { "nvml-legacy16", sec_nvml_generation, "legacy16" },
        { "more-memory", sec_more_memory, NULL },
    };
    for (size_t i = 0; i < sizeof k_sections / sizeof k_sections[0]; i++)
        run_forked(k_sections[i].name, k_sections[i].fn, k_sections[i].arg, NULL, 0);
    if (static_rt)
        run_static_runtime_test(static_rt);
    if (fake_shim) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) {
            self[n] = '\0';
            run_preload_test(self, fake_shim);
        }
    }

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", g_tmpdir);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
