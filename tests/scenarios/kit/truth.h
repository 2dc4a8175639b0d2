/* Ground-truth marks for the scenario corpus: at the moments that matter (a failed attempt, a
 * release between attempts, a recovery) the stand-in libraries append one JSON line with the
 * simulator's books for every device to $SCEN_TRUTH/truth-<pid>.jsonl.  The checker compares the
 * dump with the mark that belongs to it.  Test code only: the product never sees this (the shim
 * must not know it runs on the simulator); without SCEN_TRUTH or off the simulator it does nothing. */
#ifndef SCEN_TRUTH_H
#define SCEN_TRUTH_H
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>

#include "simgpu.h"

static inline void scen_mark(const char *kind, const char *lib, int device, unsigned long long requested,
                             const char *extra_fmt, ...)
{
    const char *dir = getenv("SCEN_TRUTH");
    if (!dir || !*dir)
        return;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*truth)(int, simgpu_truth_t *) = h ? (int (*)(int, simgpu_truth_t *))dlsym(h, "simgpu_truth") : NULL;
    int (*count)(void) = h ? (int (*)(void))dlsym(h, "simgpu_device_count") : NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/truth-%d.jsonl", dir, (int)getpid());
    FILE *f = fopen(path, "a");
    if (!f) {
        if (h)
            dlclose(h);
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    fprintf(f, "{\"kind\":\"%s\",\"lib\":\"%s\",\"pid\":%d,\"device\":%d,\"requested\":%llu,\"t\":%.6f,\"extra\":{",
            kind, lib, (int)getpid(), device, requested, tv.tv_sec + tv.tv_usec / 1e6);
    if (extra_fmt) {
        va_list ap;
        va_start(ap, extra_fmt);
        vfprintf(f, extra_fmt, ap);
        va_end(ap);
    }
    fprintf(f, "},\"truth\":[");
    int n = count ? count() : 0;
    for (int d = 0; d < n; d++) {
        simgpu_truth_t t;
        if (!truth || truth(d, &t) != 0)
            continue;
        fprintf(f,
                "%s{\"device\":%d,\"total_bytes\":%llu,\"free_bytes\":%llu,\"context_bytes\":%llu,"
                "\"alloc_requested_bytes\":%llu,\"alloc_charged_bytes\":%llu,\"alloc_blocks\":%llu,"
                "\"managed_requested_bytes\":%llu,\"vmm_physical_bytes\":%llu,\"pool_reserved_bytes\":%llu,"
                "\"pool_used_bytes\":%llu,\"other_process_bytes\":%llu,\"used_bytes\":%llu,"
                "\"peak_used_bytes\":%llu,\"failed_allocs\":%llu,\"contexts\":%llu,\"peak_rounding_bytes\":%llu,"
                "\"alloc_threads\":%llu}",
                d ? "," : "", d, t.total_bytes, t.free_bytes, t.context_bytes, t.alloc_requested_bytes,
                t.alloc_charged_bytes, t.alloc_blocks, t.managed_requested_bytes, t.vmm_physical_bytes,
                t.pool_reserved_bytes, t.pool_used_bytes, t.other_process_bytes, t.used_bytes, t.peak_used_bytes,
                t.failed_allocs, t.contexts, t.peak_rounding_bytes, t.alloc_threads);
    }
    fprintf(f, "]}\n");
    fclose(f);
    dlclose(h);
}

/* For a failure outside the framework (cuDNN, NCCL): PyTorch's books at that moment, when its
 * adapter is on (the shim can then ask it through the adapter's query).  Writes the extra JSON
 * members into buf ("" when there is nothing to add). */
static inline const char *scen_fw_extra(char *buf, size_t n, int device)
{
    buf[0] = 0;
    int (*on)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "c10_adapter_enabled");
    void (*st)(int, void *) = (void (*)(int, void *))dlsym(RTLD_DEFAULT, "c10_memory_stats");
    if (on && st && on()) {
        unsigned long long s[8] = { 0 }; /* c10_stats_t: allocated, reserved, ... */
        st(device, s);
        snprintf(buf, n, "\"allocated\":%llu,\"reserved\":%llu,\"query\":1", s[0], s[1]);
    }
    return buf;
}
#endif
