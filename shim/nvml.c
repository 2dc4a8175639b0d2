/* NVML, in one place: the process query (this process's usage of a device, contexts
 * included, and the other processes there) asked when a dump is written and once per
 * device for OOMGUARD_LIMIT, and the wrappers of nvmlDeviceGetMemoryInfo{,_v2} that show
 * the limit to tools inside the job.
 *
 * NVML's functions come from the calls table (calls.def), resolved when the driver shows
 * up; nothing here loads a library.  The few NVML types are declared from NVML's public
 * API (nvml.h is not part of the CUDA toolkit headers).
 *
 * The process list is read through nvmlDeviceGetRunningProcessDetailList (a versioned
 * struct, so its layout is known) where the driver has it.  Otherwise
 * nvmlDeviceGetComputeRunningProcesses_v3, whose entry size depends on the driver: 24 bytes
 * as documented, 32 on R535 (which wrote nvmlProcessInfo_v3_t with
 * usedGpuCcProtectedMemory), 16 reported on some others.  The buffer has room for the
 * largest, is zeroed, and the stride is chosen by plausibility (pids, sizes, MIG ids, our
 * own pid); the dump says which one was used. */
#include "og.h"
#include "record.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

#define NVML_SUCCESS                 0
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFull

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvml_proc_detail_t; /* nvmlProcessDetail_v1_t */
typedef struct {
    unsigned int version;
    unsigned int mode; /* 0: compute */
    unsigned int numProcArrayEntries;
    nvml_proc_detail_t *procArray;
} nvml_proc_detail_list_t; /* nvmlProcessDetailList_v1_t */
#define NVML_PROC_DETAIL_LIST_V1 ((unsigned)sizeof(nvml_proc_detail_list_t) | (1u << 24))

typedef struct {
    unsigned long long total, free, used;
} nvml_memory_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvml_memory_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvml_pci_t;

/* ------------------------------------------------------------------ session */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_result = -1; /* nvmlInit_v2's answer; -1: NVML absent */
static void nvml_init_once(void)
{
    og_cfn_nvmlInit_v2 init = OG_CALL(nvmlInit_v2);
    init_result = init ? init() : -1;
}

/* NULL when NVML can be asked; otherwise why not. */
static const char *nvml_unavailable(void)
{
    if (!og_opt.nvml)
        return "nvml: disabled by OOMGUARD_NVML=0";
    if (atomic_load(&og_exiting))
        return "nvml: not asked at exit (the driver may be torn down)";
    if (!OG_CALL(nvmlInit_v2) || !OG_CALL(nvmlDeviceGetHandleByPciBusId_v2))
        return "nvml: libnvidia-ml.so.1 or a needed function is missing";
    pthread_once(&init_once, nvml_init_once);
    return init_result == NVML_SUCCESS ? NULL : "nvml: nvmlInit_v2 failed";
}

/* ------------------------------------------------------------------ process list */

typedef struct {
    unsigned int pid;
    uint64_t used; /* NVML_VALUE_NOT_AVAILABLE_ULL as 0 */
} og_nvml_proc_t;

typedef struct {
    og_nvml_proc_t *p; /* malloc'ed, n entries */
    unsigned n;
    char how[96]; /* the call (and entry size) that answered */
    int err;      /* NVML's error when n is not valid */
} proc_list_t;

#define PROC_TRIES 4
#define MAX_STRIDE 32

static bool plausible(const unsigned char *e, unsigned stride, uint64_t total)
{
    unsigned int pid;
    unsigned long long used;
    memcpy(&pid, e, sizeof pid);
    memcpy(&used, e + 8, sizeof used);
    if (pid == 0 || pid > (1u << 22)) /* pid_max is at most 2^22 */
        return false;
    if (used != NVML_VALUE_NOT_AVAILABLE_ULL && total && used > total)
        return false;
    if (stride >= 24) { /* MIG ids: none (0xFFFFFFFF) or small */
        unsigned int gi, ci;
        memcpy(&gi, e + 16, sizeof gi);
        memcpy(&ci, e + 20, sizeof ci);
        if ((gi != 0xFFFFFFFFu && gi > 64) || (ci != 0xFFFFFFFFu && ci > 64))
            return false;
    }
    return true;
}

/* The stride that reads n plausible entries (ours among them when we are listed). */
static unsigned pick_stride(const unsigned char *buf, unsigned n, uint64_t total)
{
    static const unsigned strides[] = { 24, 32, 16 }; /* documented first */
    unsigned self = (unsigned)getpid(), best = 0;
    for (size_t s = 0; s < sizeof strides / sizeof *strides; s++) {
        unsigned st = strides[s], ok = 0;
        bool found_self = false;
        for (unsigned i = 0; i < n; i++) {
            if (!plausible(buf + (size_t)i * st, st, total))
                break;
            unsigned int pid;
            memcpy(&pid, buf + (size_t)i * st, sizeof pid);
            found_self |= pid == self;
            ok++;
        }
        if (ok == n && found_self)
            return st;
        if (ok == n && !best)
            best = st;
    }
    return best;
}

static bool query_detail_list(nvmlDevice_t dev, proc_list_t *out)
{
    og_cfn_nvmlDeviceGetRunningProcessDetailList f = OG_CALL(nvmlDeviceGetRunningProcessDetailList);
    if (!f)
        return false;
    unsigned cap = 64;
    for (int t = 0; t < PROC_TRIES; t++) {
        nvml_proc_detail_t *arr = calloc(cap, sizeof *arr);
        if (!arr)
            return false;
        nvml_proc_detail_list_t list = { NVML_PROC_DETAIL_LIST_V1, 0, cap, arr };
        nvmlReturn_t r = f(dev, &list);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE && list.numProcArrayEntries > cap) {
            cap = list.numProcArrayEntries + 8; /* room for a process that starts meanwhile */
            free(arr);
            continue;
        }
        if (r != NVML_SUCCESS) { /* absent on this driver, or refused */
            free(arr);
            return false;
        }
        unsigned n = list.numProcArrayEntries <= cap ? list.numProcArrayEntries : cap;
        out->p = calloc(n ? n : 1, sizeof *out->p);
        if (!out->p) {
            free(arr);
            return false;
        }
        for (unsigned i = 0; i < n; i++) {
            out->p[i].pid = arr[i].pid;
            out->p[i].used = arr[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE_ULL ? 0 : arr[i].usedGpuMemory;
        }
        out->n = n;
        snprintf(out->how, sizeof out->how, "nvmlDeviceGetRunningProcessDetailList");
        free(arr);
        return true;
    }
    return false;
}

static bool query_v3(nvmlDevice_t dev, uint64_t total, proc_list_t *out)
{
    og_cfn_nvmlDeviceGetComputeRunningProcesses_v3 f = OG_CALL(nvmlDeviceGetComputeRunningProcesses_v3);
    if (!f) {
        out->err = -1;
        return false;
    }
    unsigned cap = 64;
    for (int t = 0; t < PROC_TRIES; t++) {
        /* zeroed, and room for cap entries of the largest layout any driver writes */
        unsigned char *buf = calloc(cap, MAX_STRIDE);
        if (!buf)
            return false;
        unsigned count = cap;
        nvmlReturn_t r = f(dev, &count, buf);
        if (r == NVML_ERROR_INSUFFICIENT_SIZE && count > cap) {
            cap = count + 8;
            free(buf);
            continue;
        }
        if (r != NVML_SUCCESS || count > cap) {
            out->err = r;
            free(buf);
            return false;
        }
        unsigned stride = pick_stride(buf, count, total);
        if (count && !stride) {
            snprintf(out->how, sizeof out->how, "nvmlDeviceGetComputeRunningProcesses_v3 (entries unreadable)");
            out->err = -2;
            free(buf);
            return false;
        }
        out->p = calloc(count ? count : 1, sizeof *out->p);
        if (!out->p) {
            free(buf);
            return false;
        }
        for (unsigned i = 0; i < count; i++) {
            unsigned long long used;
            memcpy(&out->p[i].pid, buf + (size_t)i * stride, sizeof out->p[i].pid);
            memcpy(&used, buf + (size_t)i * stride + 8, sizeof used);
            out->p[i].used = used == NVML_VALUE_NOT_AVAILABLE_ULL ? 0 : used;
        }
        out->n = count;
        snprintf(out->how, sizeof out->how, "nvmlDeviceGetComputeRunningProcesses_v3 (%u-byte entries)",
                 stride ? stride : 24);
        free(buf);
        return true;
    }
    out->err = NVML_ERROR_INSUFFICIENT_SIZE;
    return false;
}

/* The processes on the device with PCI bus id `bus`; false with out->err / why set. */
static bool processes(const char *bus, uint64_t total, proc_list_t *out, const char **why)
{
    memset(out, 0, sizeof *out);
    if ((*why = nvml_unavailable()))
        return false;
    nvmlDevice_t dev;
    if (OG_CALL(nvmlDeviceGetHandleByPciBusId_v2)(bus, &dev) != NVML_SUCCESS) {
        *why = "nvml: no device with this PCI bus id";
        return false;
    }
    if (query_detail_list(dev, out) || query_v3(dev, total, out))
        return true;
    *why = "nvml: running processes not available";
    return false;
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
        snprintf(out, n, "(not visible)"); /* another container or user */
}


static int by_used_desc(const void *a, const void *b)
{
    const og_nvml_proc_t *x = a, *y = b;
    if (x->used != y->used)
        return x->used > y->used ? -1 : 1;
    return x->pid < y->pid ? -1 : x->pid > y->pid;
}

/* Fills process_used_bytes and other processes; notes what could not be measured. */
void og_nvml_measure(og_record_t *rec)
{
    /* Unknown is not zero: without a process list nobody knows what other processes hold. */
    og_unset(&rec->memory.process_used_bytes);
    og_unset(&rec->memory.other_processes_bytes);
    proc_list_t pl;
    const char *why;
    uint64_t total = og_or(rec->device.total_bytes, 0);
    if (!processes(rec->device.pci_bus_id, total, &pl, &why)) {
        if (pl.err > 0)
            og_unmeasured(rec, OG_UM_PROCESS_LIST, "%s (%d)", why, pl.err);
        else
            og_unmeasured(rec, OG_UM_PROCESS_LIST, "%s", why);
        return;
    }
    snprintf(rec->memory.nvml_process_query, sizeof rec->memory.nvml_process_query, "%s", pl.how);
    unsigned self = (unsigned)getpid();
    og_set(&rec->memory.process_used_bytes, 0);
    og_set(&rec->memory.other_processes_bytes, 0);
    bool found_self = false;
    /* largest first before the list is cut: the 12 GiB holder is the one the advice needs */
    if (pl.n > 1)
        qsort(pl.p, pl.n, sizeof *pl.p, by_used_desc);
    for (unsigned i = 0; i < pl.n; i++) {
        if (pl.p[i].pid == self) {
            found_self = true;
            rec->memory.process_used_bytes.v += pl.p[i].used;
            continue;
        }
        rec->memory.other_processes_bytes.v += pl.p[i].used;
        rec->memory.other_processes_count++;
        if (rec->memory.nother < (int)(sizeof rec->memory.other / sizeof rec->memory.other[0])) {
            og_other_proc_t *o = &rec->memory.other[rec->memory.nother++];
            o->pid = (int)pl.p[i].pid;
            o->bytes = pl.p[i].used;
            proc_name(o->pid, o->name, sizeof o->name);
        }
    }
    free(pl.p);
    if (!found_self && og_or(rec->memory.process_tracked_bytes, 0) > 0) {
        /* NVML lists host pids; inside a container our pid differs. */
        og_unset(&rec->memory.process_used_bytes);
        og_unmeasured(rec, OG_UM_PROCESS_LIST,
                      "nvml: this process (pid %d) is not in NVML's list (other pid namespace?)", (int)self);
    }
}

/* This process's usage of `device` (contexts included), for OOMGUARD_LIMIT; UINT64_MAX when
 * NVML cannot tell.  Called rarely: once per device and at failures. */
uint64_t og_nvml_process_used(int device)
{
    og_cfn_cuDeviceGetPCIBusId bus = OG_CALL(cuDeviceGetPCIBusId);
    char id[32];
    proc_list_t pl;
    const char *why;
    if (!bus || bus(id, sizeof id, device) != CUDA_SUCCESS || !processes(id, 0, &pl, &why))
        return UINT64_MAX;
    uint64_t used = UINT64_MAX;
    for (unsigned i = 0; i < pl.n; i++)
        if (pl.p[i].pid == (unsigned)getpid())
            used = pl.p[i].used;
    free(pl.p);
    return used;
}

/* ------------------------------------------------------------------ memory info wrappers */

/* CUDA ordinal of an NVML device, through its PCI bus id; -1 when unknown. */
static int nvml_cuda_ordinal(void *nvml_dev)
{
    og_cfn_nvmlDeviceGetPciInfo_v3 pci = OG_CALL(nvmlDeviceGetPciInfo_v3);
    og_cfn_cuDeviceGetByPCIBusId by_bus = OG_CALL(cuDeviceGetByPCIBusId);
    nvml_pci_t info;
    memset(&info, 0, sizeof info);
    if (!pci || !by_bus || pci(nvml_dev, &info) != NVML_SUCCESS)
        return -1;
    /* NVML's bus id has an 8-digit domain; the driver takes the short form too */
    const char *id = info.busId;
    if (strlen(id) > 12 && strncmp(id, "0000", 4) == 0)
        id += 4;
    CUdevice d;
    return by_bus(&d, id) == CUDA_SUCCESS ? (int)d : -1;
}

/* The limited view of one NVML answer; used = total - free (- reserved for _v2). */
static void limit_nvml_view(void *device, unsigned long long *total, unsigned long long *free_b,
                            unsigned long long *used, unsigned long long reserved)
{
    if (!og_limit_active())
        return;
    int d = nvml_cuda_ordinal(device);
    if (d < 0 || og_limit_bytes(d) == UINT64_MAX)
        return;
    uint64_t f = *free_b, t = *total;
    og_limit_view(d, &f, &t);
    *total = t;
    *free_b = f;
    *used = t - f - (reserved < t - f ? reserved : 0);
}

int nvmlDeviceGetMemoryInfo(void *device, void *memory)
{
    og_call_t c;
    og_enter(&c, OG_H_nvmlDeviceGetMemoryInfo, __builtin_return_address(0));
    og_fn_nvmlDeviceGetMemoryInfo real = OG_REAL(nvmlDeviceGetMemoryInfo);
    int r = real ? real(device, memory) : 999 /* NVML_ERROR_UNKNOWN */;
    if (r == NVML_SUCCESS && memory && c.active) {
        nvml_memory_t *m = memory;
        limit_nvml_view(device, &m->total, &m->free, &m->used, 0);
    }
    og_leave(&c);
    return r;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, void *memory)
{
    og_call_t c;
    og_enter(&c, OG_H_nvmlDeviceGetMemoryInfo_v2, __builtin_return_address(0));
    og_fn_nvmlDeviceGetMemoryInfo_v2 real = OG_REAL(nvmlDeviceGetMemoryInfo_v2);
    int r = real ? real(device, memory) : 999;
    if (r == NVML_SUCCESS && memory && c.active) {
        nvml_memory_v2_t *m = memory;
        limit_nvml_view(device, &m->total, &m->free, &m->used, m->reserved);
    }
    og_leave(&c);
    return r;
}
