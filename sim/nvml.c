/*
 * nvml.c — the simulated NVML (libnvidia-ml.so.1).
 *
 * NVML is how tools (nvidia-smi, oomguard's diagnosis) see the GPU from the
 * outside: totals, used memory, and which processes hold memory.  The numbers
 * must agree with what the simulated driver charges, so this library reads
 * the driver's books through the test-only simgpu_truth symbol of an
 * already-loaded libcuda.so.1 (dlopen RTLD_NOLOAD: NVML never loads the
 * driver itself).  A process without libcuda uses no device memory; it still
 * sees the configured SIMGPU_OTHER_PROCS and, with SIMGPU_STATE_DIR, the
 * usage of cooperating processes.
 */
#include "nvml_sim.h"
#include "sim_config.h"
#include "simgpu.h"

#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define NVML_API __attribute__((visibility("default")))

#define SIM_NVML_DRIVER_VERSION "580.65.06"
#define SIM_NVML_VERSION        "13.580.65.06"
#define SIM_PCI_DEVICE_ID       0x233010deu /* device 0x2330, vendor 0x10de */

struct nvmlDevice_st {
    int index;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count;
static bool g_cfg_loaded;
static sim_config_t g_cfg;
static struct nvmlDevice_st g_dev[SIM_MAX_DEVICES];

/* ================================================================ helpers */

/* When the simulated driver is in the process, make it read (and validate)
 * the configuration now, so a malformed variable is reported exactly once,
 * by the driver.  Returns whether it did. */
static bool driver_reads_config(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return false;
    int (*count)(void) = (int (*)(void))dlsym(h, "simgpu_device_count");
    if (count)
        count();
    dlclose(h);
    return count != NULL;
}

/* The driver's ground truth, when the simulated driver is in this process. */
static bool driver_truth(int dev, simgpu_truth_t *t)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (!h)
        return false;
    int (*fn)(int, simgpu_truth_t *) = (int (*)(int, simgpu_truth_t *))dlsym(h, "simgpu_truth");
    bool ok = fn && fn(dev, t) == 0;
    dlclose(h);
    return ok;
}

/* SIMGPU_NVML_GENERATION: how the process-list calls behave, as drivers of that age did.
 *   r580     (default) nvmlDeviceGetRunningProcessDetailList answers; _v3 writes 24-byte entries
 *   r535     the detail list is not supported; _v3 writes 32-byte entries (nvmlProcessInfo_v3_t
 *            with usedGpuCcProtectedMemory), past a buffer sized for 24-byte ones
 *   r525     the detail list is not supported; _v3 writes 24-byte entries
 *   legacy16 the detail list is not supported; _v3 writes 16-byte entries (pid, bytes) */
enum { GEN_R580, GEN_R535, GEN_R525, GEN_LEGACY16 };
static int g_gen = GEN_R580;

static void load_generation(void)
{
    static const char *const names[] = { "r580", "r535", "r525", "legacy16" };
    const char *v = getenv("SIMGPU_NVML_GENERATION");
    g_gen = GEN_R580;
    if (!v || !*v)
        return;
    for (int i = 0; i < 4; i++)
        if (strcasecmp(v, names[i]) == 0) {
            g_gen = i;
            return;
        }
    fprintf(stderr,
            "simgpu: warning: ignoring SIMGPU_NVML_GENERATION='%s' (r580, r535, r525 or legacy16 expected); "
            "using default r580\n",
            v);
}

static void load_config_locked(void)
{
    if (g_cfg_loaded)
        return;
    load_generation();
    sim_config_load(&g_cfg, driver_reads_config());
    for (int d = 0; d < SIM_MAX_DEVICES; d++)
        g_dev[d].index = d;
    sim_shared_open(&g_cfg);
    g_cfg_loaded = true;
}

/* Like the driver, NVML starts over in a fork child: not initialised, the
 * configuration re-read, the shared state files reopened.  The child drops
 * all NVML state, so no prepare handler (and no lock held across fork). */
static void nvml_atfork_child(void)
{
    pthread_mutex_init(&g_lock, NULL);
    if (g_cfg_loaded)
        sim_shared_after_fork_child();
    g_cfg_loaded = false;
    g_init_count = 0;
}

__attribute__((constructor)) static void nvml_ctor(void) { pthread_atfork(NULL, NULL, nvml_atfork_child); }

static bool initialized(void)
{
    pthread_mutex_lock(&g_lock);
    bool ok = g_init_count > 0;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Validates the handle without dereferencing foreign pointers. */
static int dev_index(nvmlDevice_t d)
{
    for (int i = 0; i < g_cfg.devices; i++)
        if (d == &g_dev[i])
            return i;
    return -1;
}

#define REQUIRE_INIT()                       \
    do {                                     \
        if (!initialized())                  \
            return NVML_ERROR_UNINITIALIZED; \
    } while (0)

#define REQUIRE_DEV(dev, idx) \
    int idx = dev_index(dev); \
    if (idx < 0)              \
    return NVML_ERROR_INVALID_ARGUMENT

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ================================================================== init */

static nvmlReturn_t init_common(unsigned int flags)
{
    if (flags & ~(unsigned)(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH))
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_lock);
    load_config_locked();
    g_init_count++;
    pthread_mutex_unlock(&g_lock);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlInit_v2(void) { return init_common(0); }

NVML_API nvmlReturn_t nvmlInit(void) { return init_common(0); }

NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init_common(flags); }

NVML_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NO_PERMISSION:
        return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED:
        return "Already Initialized";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER:
        return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED:
        return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT:
        return "Timeout";
    case NVML_ERROR_IRQ_ISSUE:
        return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND:
        return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM:
        return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST:
        return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED:
        return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM:
        return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE:
        return "In use by another client";
    case NVML_ERROR_MEMORY:
        return "Insufficient Memory";
    case NVML_ERROR_NO_DATA:
        return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED:
        return "Deprecated";
    case NVML_ERROR_NOT_READY:
        return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND:
        return "GPU not found";
    case NVML_ERROR_INVALID_STATE:
        return "Invalid state";
    case NVML_ERROR_UNKNOWN:
        return "Unknown Error";
    default:
        return "Unknown Error";
    }
}

/* ================================================================ system */

NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    REQUIRE_INIT();
    return copy_string(version, length, SIM_NVML_DRIVER_VERSION);
}

NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_string(version, length, SIM_NVML_VERSION);
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = 13000;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

NVML_API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    REQUIRE_INIT();
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_cfg.n_other; i++)
        if (g_cfg.other[i].pid == pid) {
            snprintf(name, length, "%s", g_cfg.other[i].name);
            return NVML_SUCCESS;
        }
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    snprintf(name, length, "%s", buf);
    return NVML_SUCCESS;
}

/* =============================================================== devices */

NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    REQUIRE_INIT();
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = (unsigned)g_cfg.devices;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!device || index >= (unsigned)g_cfg.devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_dev[index];
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* "0000:10:00.0", NVML's "00000000:10:00.0", or "10:00.0"; hex, any case. */
NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    unsigned dom = 0, bus, dv, fn;
    int n = 0;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!(sscanf(pciBusId, "%x:%x:%x.%x%n", &dom, &bus, &dv, &fn, &n) == 4 && pciBusId[n] == '\0')) {
        dom = 0;
        n = 0;
        if (!(sscanf(pciBusId, "%x:%x.%x%n", &bus, &dv, &fn, &n) == 3 && pciBusId[n] == '\0'))
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < g_cfg.devices; i++)
        if (dom == 0 && bus == (unsigned)(0x10 + i) && dv == 0 && fn == 0) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* Same bytes as the driver's cuDeviceGetUuid: "SIMGPU" + zeros + ordinal. */
static void uuid_string(int dev, char *out, size_t len)
{
    unsigned char b[16] = { 'S', 'I', 'M', 'G', 'P', 'U', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    b[15] = (unsigned char)dev;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    REQUIRE_INIT();
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_cfg.devices; i++) {
        char s[NVML_DEVICE_UUID_BUFFER_SIZE];
        uuid_string(i, s, sizeof s);
        if (strcasecmp(s, uuid) == 0) {
            *device = &g_dev[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    return copy_string(name, length, g_cfg.name[i]);
}

NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    char s[NVML_DEVICE_UUID_BUFFER_SIZE];
    uuid_string(i, s, sizeof s);
    return copy_string(uuid, length, s);
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = 0x10u + (unsigned)i;
    pci->device = 0;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = 0;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02x:00.0", pci->bus & 0xffu);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02x:00.0", pci->bus & 0xffu);
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = g_cfg.cc_major[i];
    *minor = g_cfg.cc_minor[i];
    return NVML_SUCCESS;
}

/* ================================================================ memory */

/* total / used / free as nvidia-smi would show them: this process's usage
 * (from the driver's books), configured other processes, live peers. */
static void memory_of(int dev, unsigned long long *total, unsigned long long *used)
{
    simgpu_truth_t t;
    unsigned long long self = 0;
    *total = g_cfg.total[dev];
    if (driver_truth(dev, &t)) {
        self = t.used_bytes;
        *total = t.total_bytes;
    }
    *used = self + sim_config_other_bytes(&g_cfg, dev) + sim_shared_others_used(dev);
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used;
    memory_of(i, &total, &used);
    memory->total = total;
    memory->used = used;
    memory->free = used >= total ? 0 : total - used;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    memory_of(i, &total, &used);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used >= total ? 0 : total - used;
    return NVML_SUCCESS;
}

/* ============================================================= processes */

#define MAX_PROCS (1 + SIM_MAX_OTHER_PROCS + 256)

typedef struct {
    unsigned int pid;
    unsigned long long used;
} proc_t;

static int collect_procs(int dev, const simgpu_truth_t *t, proc_t *out)
{
    int n = 0;
    /* This process appears once it holds a context or memory on the device. */
    if (t && (t->contexts > 0 || t->used_bytes > 0)) {
        out[n].pid = (unsigned)getpid();
        out[n].used = t->used_bytes;
        n++;
    }
    for (int i = 0; i < g_cfg.n_other; i++)
        if (g_cfg.other[i].dev == dev) {
            out[n].pid = g_cfg.other[i].pid;
            out[n].used = g_cfg.other[i].bytes;
            n++;
        }
    sim_peer_t peers[256];
    int np = sim_shared_peers(dev, peers, 256);
    for (int i = 0; i < np; i++) {
        out[n].pid = peers[i].pid;
        out[n].used = peers[i].used;
        n++;
    }
    return n;
}

/* The NVML convention: with *infoCount too small (e.g. 0 to query), set it
 * to the number needed and return NVML_ERROR_INSUFFICIENT_SIZE. */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, bool v1)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    proc_t procs[MAX_PROCS];
    /* Ask the driver before taking our lock: the driver's lock is never
     * taken while holding NVML's (no lock-order inversion, e.g. at fork). */
    simgpu_truth_t t;
    bool have = driver_truth(i, &t);
    pthread_mutex_lock(&g_lock);
    int n = collect_procs(i, have ? &t : NULL, procs);
    pthread_mutex_unlock(&g_lock);
    if (*infoCount < (unsigned)n) {
        *infoCount = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* the entry layout this driver generation writes (_v3 only; v1 always 16 bytes) */
    size_t stride = v1 ? sizeof(nvmlProcessInfo_v1_t) : g_gen == GEN_R535 ? 32 : g_gen == GEN_LEGACY16 ? 16 : 24;
    if (!v1 && stride != sizeof(nvmlProcessInfo_t)) {
        for (int k = 0; k < n; k++) {
            unsigned char *e = (unsigned char *)infos + (size_t)k * stride;
            unsigned long long used = procs[k].used, zero = 0;
            unsigned int none = 0xFFFFFFFFu;
            memcpy(e, &procs[k].pid, sizeof(unsigned int));
            memset(e + 4, 0, 4);
            memcpy(e + 8, &used, sizeof used);
            if (stride == 32) {
                memcpy(e + 16, &none, sizeof none);
                memcpy(e + 20, &none, sizeof none);
                memcpy(e + 24, &zero, sizeof zero); /* usedGpuCcProtectedMemory */
            }
        }
        *infoCount = (unsigned)n;
        return NVML_SUCCESS;
    }
    for (int k = 0; k < n; k++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = &((nvmlProcessInfo_v1_t *)infos)[k];
            p->pid = procs[k].pid;
            p->usedGpuMemory = procs[k].used;
        } else {
            nvmlProcessInfo_t *p = &((nvmlProcessInfo_t *)infos)[k];
            p->pid = procs[k].pid;
            p->usedGpuMemory = procs[k].used;
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *infoCount = (unsigned)n;
    return NVML_SUCCESS;
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, false);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, false);
}

NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                           nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, true);
}

/* nvmlDeviceGetRunningProcessDetailList (R550+): a versioned list, any mode.  Compute mode
 * lists this process and the others; graphics and MPS list nobody here. */
NVML_API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
    REQUIRE_INIT();
    REQUIRE_DEV(device, i);
    if (g_gen != GEN_R580)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!plist)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (plist->version != nvmlProcessDetailList_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (plist->mode > 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    proc_t procs[MAX_PROCS];
    simgpu_truth_t t;
    bool have = driver_truth(i, &t);
    pthread_mutex_lock(&g_lock);
    int n = plist->mode == 0 ? collect_procs(i, have ? &t : NULL, procs) : 0;
    pthread_mutex_unlock(&g_lock);
    if (plist->numProcArrayEntries < (unsigned)n) {
        plist->numProcArrayEntries = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n > 0 && !plist->procArray)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int k = 0; k < n; k++) {
        nvmlProcessDetail_v1_t *p = &plist->procArray[k];
        p->pid = procs[k].pid;
        p->usedGpuMemory = procs[k].used;
        p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFFu;
        p->usedGpuCcProtectedMemory = 0;
    }
    plist->numProcArrayEntries = (unsigned)n;
    return NVML_SUCCESS;
}
