/* A job for the live view's tests (tests/e2e/run_live.sh): holds device memory in steps the
 * test drives, and writes the simulator's truth after each step, so that `oomguard top` and
 * `oomguard snapshot` can be checked against it.
 *
 * usage: e2e_live_job MODE CTL
 *   grow   one more 256 MiB block each time CTL/grow.go.N appears (N = 1, 2, ...); when
 *          CTL/grow.shrink appears, its last two blocks freed (once)
 *   limit  under OOMGUARD_LIMIT=3GiB: 1 GiB twice, 768 MiB, then 512 MiB that the limit refuses
 *   plain  1 GiB and three 64 MiB blocks
 *   kinds  one block of each kind: 64 MiB cudaMalloc, 32 MiB managed, 48 MiB from the default
 *          stream-ordered pool (which also keeps 16 MiB freed into it), 16 MiB of VMM physical
 *          memory (cuMemCreate)
 * Each writes CTL/MODE.truth ("step S pid P tracked T used U failed F") after every change
 * (written whole: a temp file renamed), then waits for CTL/stop, frees everything and exits
 * 0.  It installs a SIGUSR1/SIGUSR2 handler and says at exit how often it ran: a snapshot
 * must not use the program's signals.
 * With LIVE_JOB_FRAMEWORK=NAME it also reports, after every step, a framework's own numbers
 * (oomguard_framework_report(), as an adapter does: allocated half of what it holds, reserved
 * all of it), adding "fw_allocated A fw_reserved R" to its truth. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oomguard.h"
#include "simgpu.h"

#define MiB (1024ull * 1024)

static volatile sig_atomic_t usr_signals;
static void on_usr(int sig) { usr_signals++; }

static void truth(const char *ctl, const char *mode, int step)
{
    simgpu_truth_t t;
    if (simgpu_truth(0, &t) != 0)
        return;
    unsigned long long held = t.alloc_requested_bytes + t.vmm_physical_bytes + t.pool_reserved_bytes;
    const char *fw = getenv("LIVE_JOB_FRAMEWORK");
    int (*report)(const oomguard_framework_stats_t *) = NULL;
    if (fw && *fw)
        report = (int (*)(const oomguard_framework_stats_t *))dlsym(RTLD_DEFAULT, "oomguard_framework_report");
    oomguard_framework_stats_t st = { .struct_size = sizeof st, .device = 0 };
    st.allocated_bytes = held / 2;
    st.reserved_bytes = held;
    st.framework = fw;
    st.source = fw;
    if (report && report(&st) != 0)
        report = NULL;
    char tmp[512], path[512];
    snprintf(tmp, sizeof tmp, "%s/%s.truth.tmp", ctl, mode);
    snprintf(path, sizeof path, "%s/%s.truth", ctl, mode);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "step %d pid %d tracked %llu used %llu failed %llu", step, (int)getpid(), held, t.used_bytes,
            t.failed_allocs);
    if (report)
        fprintf(f, " fw_allocated %llu fw_reserved %llu", held / 2, held);
    if (!strcmp(mode, "kinds"))
        fprintf(f, " plain %llu managed %llu pool %llu pool_used %llu vmm %llu",
                t.alloc_requested_bytes - t.managed_requested_bytes, t.managed_requested_bytes, t.pool_reserved_bytes,
                t.pool_used_bytes, t.vmm_physical_bytes);
    fputc('\n', f);
    fclose(f);
    rename(tmp, path);
}

static int exists(const char *ctl, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", ctl, name);
    return access(p, F_OK) == 0;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    const char *mode = argv[1], *ctl = argv[2];
    signal(SIGUSR1, on_usr);
    signal(SIGUSR2, on_usr);
    void *blocks[64];
    int n = 0, step = 0, shrunk = 0;
    cudaSetDevice(0);
    if (!strcmp(mode, "grow")) {
        truth(ctl, mode, step);
        while (!exists(ctl, "stop")) {
            char go[64];
            snprintf(go, sizeof go, "grow.go.%d", step + 1);
            if (exists(ctl, go) && n < 64) {
                if (cudaMalloc(&blocks[n], 256 * MiB) == cudaSuccess)
                    n++;
                truth(ctl, mode, ++step);
            } else if (exists(ctl, "grow.shrink") && !shrunk && n >= 2) {
                cudaFree(blocks[--n]);
                cudaFree(blocks[--n]);
                shrunk = 1;
                truth(ctl, mode, ++step);
            }
            usleep(20000);
        }
    } else if (!strcmp(mode, "kinds")) {
        void *plain = NULL, *managed = NULL, *pooled = NULL;
        CUmemGenericAllocationHandle h = 0;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        int ok = cudaMalloc(&plain, 64 * MiB) == cudaSuccess &&
                 cudaMallocManaged(&managed, 32 * MiB, cudaMemAttachGlobal) == cudaSuccess &&
                 cudaMallocAsync(&pooled, 48 * MiB, 0) == cudaSuccess &&
                 cuMemCreate(&h, 16 * MiB, &prop, 0) == CUDA_SUCCESS;
        void *cached = NULL; /* freed into the pool, which keeps it until a synchronisation */
        ok = ok && cudaMallocAsync(&cached, 16 * MiB, 0) == cudaSuccess && cudaFreeAsync(cached, 0) == cudaSuccess;
        truth(ctl, mode, ++step);
        while (!exists(ctl, "stop"))
            usleep(20000);
        cudaFree(plain);
        cudaFree(managed);
        cudaFreeAsync(pooled, 0);
        cudaStreamSynchronize(0);
        if (h)
            cuMemRelease(h);
        n = ok ? 4 : 0;
        printf("%s: pid %d done, %d block(s), %d signal(s) of the program's own\n", mode, (int)getpid(), n,
               (int)usr_signals);
        return usr_signals ? 3 : ok ? 0 : 4;
    } else {
        static const unsigned long long limit_steps[] = { 1024 * MiB, 1024 * MiB, 768 * MiB, 512 * MiB };
        static const unsigned long long plain_steps[] = { 1024 * MiB, 64 * MiB, 64 * MiB, 64 * MiB };
        const unsigned long long *s = !strcmp(mode, "limit") ? limit_steps : plain_steps;
        for (int i = 0; i < 4; i++)
            if (cudaMalloc(&blocks[n], s[i]) == cudaSuccess)
                n++;
        truth(ctl, mode, ++step);
        while (!exists(ctl, "stop"))
            usleep(20000);
    }
    for (int i = 0; i < n; i++)
        cudaFree(blocks[i]);
    printf("%s: pid %d done, %d block(s), %d signal(s) of the program's own\n", mode, (int)getpid(), n,
           (int)usr_signals);
    return usr_signals ? 3 : 0;
}
