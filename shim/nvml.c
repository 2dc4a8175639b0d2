/* NVML, asked only when a dump is being written: this process's usage on the device
 * (contexts included) and the other processes there.  Loaded lazily with dlopen so that
 * the shim works where NVML is absent; the dump then says what it could not measure.
 * The few NVML types are declared here from NVML's public API (nvml.h is not part of the
 * CUDA toolkit headers). */
#include "og.h"
#include "record.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} og_nvml_proc_t;                       /* nvmlProcessInfo_t as taken by ..._v3 */

#define NVML_SUCCESS 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull

static struct {
    pthread_once_t once;
    bool ok;
    char why[160];
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*by_bus)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned int *, og_nvml_proc_t *);
} nv = {.once = PTHREAD_ONCE_INIT};

static void nvml_load(void)
{
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nv.why, sizeof nv.why, "nvml: libnvidia-ml.so.1 could not be loaded");
        return;
    }
    nv.init = (nvmlReturn_t (*)(void))dlsym(h, "nvmlInit_v2");
    nv.by_bus = (nvmlReturn_t (*)(const char *, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    nv.procs = (nvmlReturn_t (*)(nvmlDevice_t, unsigned int *, og_nvml_proc_t *))dlsym(
        h, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!nv.init || !nv.by_bus || !nv.procs) {
        snprintf(nv.why, sizeof nv.why, "nvml: a needed function is missing (driver too old?)");
        return;
    }
    nvmlReturn_t r = nv.init();
    if (r != NVML_SUCCESS) {
        snprintf(nv.why, sizeof nv.why, "nvml: nvmlInit_v2 failed (%d)", r);
        return;
    }
    nv.ok = true;
}

static void proc_name(int pid, char *out, size_t n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    FILE *f = fopen(path, "re");
    out[0] = 0;
    if (f) {
        if (fgets(out, (int)n, f))
            out[strcspn(out, "\n")] = 0;
        fclose(f);
    }
    if (!out[0])
        snprintf(out, n, "(not visible)");   /* another container or user */
}

/* Fills process_used_bytes and other processes; notes what could not be measured. */
void og_nvml_measure(og_record_t *rec)
{
    rec->memory.process_used_bytes = OG_UNKNOWN;
    if (!og_opt.nvml) {
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160, "nvml: disabled by OOMGUARD_NVML=0");
        return;
    }
    pthread_once(&nv.once, nvml_load);
    if (!nv.ok) {
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160, "%s", nv.why);
        return;
    }
    nvmlDevice_t dev;
    if (nv.by_bus(rec->device.pci_bus_id, &dev) != NVML_SUCCESS) {
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160, "nvml: no device with PCI bus id %s",
                 rec->device.pci_bus_id);
        return;
    }
    og_nvml_proc_t procs[64];
    unsigned int count = 64;
    nvmlReturn_t r = nv.procs(dev, &count, procs);
    if (r != NVML_SUCCESS && r != NVML_ERROR_INSUFFICIENT_SIZE) {
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160,
                 "nvml: running processes not available (%d)", r);
        return;
    }
    if (count > 64)
        count = 64;
    int self = (int)getpid();
    rec->memory.process_used_bytes = 0;
    bool found_self = false;
    for (unsigned i = 0; i < count; i++) {
        uint64_t used = procs[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ULL ? 0 : procs[i].usedGpuMemory;
        if ((int)procs[i].pid == self) {
            found_self = true;
            rec->memory.process_used_bytes += used;
            continue;
        }
        rec->memory.other_processes_bytes += used;
        if (rec->memory.nother < (int)(sizeof rec->memory.other / sizeof rec->memory.other[0])) {
            og_other_proc_t *o = &rec->memory.other[rec->memory.nother++];
            o->pid = (int)procs[i].pid;
            o->bytes = used;
            proc_name(o->pid, o->name, sizeof o->name);
        }
    }
    if (!found_self && rec->memory.process_tracked_bytes > 0) {
        /* NVML lists host pids; inside a container our pid differs. */
        rec->memory.process_used_bytes = OG_UNKNOWN;
        snprintf(rec->memory.unmeasured[rec->memory.nunmeasured++], 160,
                 "nvml: this process (pid %d) is not in NVML's list (other pid namespace?)", self);
    }
}

/* This process's usage of `device` (contexts included), for OOMGUARD_LIMIT; UINT64_MAX when
 * NVML cannot tell.  Called rarely: once per device and at failures. */
uint64_t og_nvml_process_used(int device)
{
    if (!og_opt.nvml)
        return UINT64_MAX;
    pthread_once(&nv.once, nvml_load);
    if (!nv.ok)
        return UINT64_MAX;
    CUresult (*bus)(char *, int, CUdevice) = (CUresult(*)(char *, int, CUdevice))og_cuda_sym("cuDeviceGetPCIBusId");
    char id[32];
    nvmlDevice_t dev;
    if (!bus || bus(id, sizeof id, device) != CUDA_SUCCESS || nv.by_bus(id, &dev) != NVML_SUCCESS)
        return UINT64_MAX;
    og_nvml_proc_t procs[64];
    unsigned int count = 64;
    nvmlReturn_t r = nv.procs(dev, &count, procs);
    if (r != NVML_SUCCESS)
        return UINT64_MAX;
    int self = (int)getpid();
    for (unsigned i = 0; i < count && i < 64; i++)
        if ((int)procs[i].pid == self && procs[i].usedGpuMemory != NVML_VALUE_NOT_AVAILABLE_ULL)
            return procs[i].usedGpuMemory;
    return UINT64_MAX;
}
