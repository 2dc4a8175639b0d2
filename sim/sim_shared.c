/*
 * sim_shared.c — SIMGPU_STATE_DIR: device usage shared between processes.
 *
 * Multi-rank tests start several processes on the "same" simulated GPU.  Each
 * process publishes its usage per device in a slot of a small mmap'd file
 * (<dir>/simgpu-dev<N>.state); cuMemGetInfo, the OOM check and NVML add up
 * the slots of the other live processes.
 *
 * Locking: a process only ever writes its own slot (atomic 64-bit stores) and
 * claims a slot with a compare-and-swap on its pid, so readers need no lock.
 * flock() on the file serialises the driver's check-then-charge so two ranks
 * cannot both take the last free bytes.  flock locks belong to the open file
 * description, which a fork child shares with its parent — so the child closes
 * and reopens the files instead of inheriting them.  Dead pids (kill(pid,0) == ESRCH) are ignored and their
 * slots recycled; pid reuse by an unrelated process is not detected.
 */
#include "sim_config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARED_MAGIC   0x474d4953u /* "SIMG" */
#define SHARED_VERSION 1u
#define SHARED_SLOTS   256

typedef struct shared_slot {
    uint32_t pid;
    uint32_t pad;
    uint64_t used;
    uint64_t contexts;
    uint64_t reserved;
} shared_slot_t;

typedef struct shared_file {
    uint32_t magic, version, nslots, pad;
    shared_slot_t slot[SHARED_SLOTS];
} shared_file_t;

static struct {
    bool enabled;
    int ndev;
    int fd[SIM_MAX_DEVICES];
    shared_file_t *map[SIM_MAX_DEVICES];
    int my_slot[SIM_MAX_DEVICES];
} g_sh;

static bool pid_alive(uint32_t pid)
{
    if (pid == 0)
        return false;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

bool sim_shared_enabled(void) { return g_sh.enabled; }

bool sim_shared_open(const sim_config_t *cfg)
{
    if (g_sh.enabled || !cfg->state_dir[0] || cfg->devices == 0)
        return g_sh.enabled;
    if (mkdir(cfg->state_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "simgpu: warning: SIMGPU_STATE_DIR '%s' unusable (%s); cross-process sharing off\n",
                cfg->state_dir, strerror(errno));
        return false;
    }
    for (int d = 0; d < cfg->devices; d++) {
        char path[600];
        snprintf(path, sizeof path, "%s/simgpu-dev%d.state", cfg->state_dir, d);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        void *m = MAP_FAILED;
        if (fd >= 0) {
            flock(fd, LOCK_EX);
            struct stat st;
            if (fstat(fd, &st) == 0 &&
                (st.st_size >= (off_t)sizeof(shared_file_t) || ftruncate(fd, sizeof(shared_file_t)) == 0))
                m = mmap(NULL, sizeof(shared_file_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                shared_file_t *f = m;
                if (f->magic != SHARED_MAGIC || f->version != SHARED_VERSION || f->nslots != SHARED_SLOTS) {
                    memset(f, 0, sizeof *f);
                    f->magic = SHARED_MAGIC;
                    f->version = SHARED_VERSION;
                    f->nslots = SHARED_SLOTS;
                }
            }
            flock(fd, LOCK_UN);
        }
        if (fd < 0 || m == MAP_FAILED) {
            fprintf(stderr, "simgpu: warning: cannot use state file '%s' (%s); cross-process sharing off\n", path,
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            for (int e = 0; e < d; e++) {
                munmap(g_sh.map[e], sizeof(shared_file_t));
                close(g_sh.fd[e]);
            }
            return false;
        }
        g_sh.fd[d] = fd;
        g_sh.map[d] = m;
        g_sh.my_slot[d] = -1;
    }
    g_sh.ndev = cfg->devices;
    g_sh.enabled = true;
    return true;
}

void sim_shared_lock(int dev)
{
    if (g_sh.enabled && dev >= 0 && dev < g_sh.ndev)
        while (flock(g_sh.fd[dev], LOCK_EX) != 0 && errno == EINTR)
            ;
}

void sim_shared_unlock(int dev)
{
    if (g_sh.enabled && dev >= 0 && dev < g_sh.ndev)
        flock(g_sh.fd[dev], LOCK_UN);
}

uint64_t sim_shared_others_used(int dev)
{
    if (!g_sh.enabled || dev < 0 || dev >= g_sh.ndev)
        return 0;
    uint32_t self = (uint32_t)getpid();
    uint64_t sum = 0;
    shared_file_t *f = g_sh.map[dev];
    for (int i = 0; i < SHARED_SLOTS; i++) {
        uint32_t pid = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
        if (pid == 0 || pid == self || !pid_alive(pid))
            continue;
        sum += __atomic_load_n(&f->slot[i].used, __ATOMIC_ACQUIRE);
    }
    return sum;
}

int sim_shared_peers(int dev, sim_peer_t *out, int max)
{
    if (!g_sh.enabled || dev < 0 || dev >= g_sh.ndev)
        return 0;
    uint32_t self = (uint32_t)getpid();
    int n = 0;
    shared_file_t *f = g_sh.map[dev];
    for (int i = 0; i < SHARED_SLOTS && n < max; i++) {
        uint32_t pid = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
        if (pid == 0 || pid == self || !pid_alive(pid))
            continue;
        uint64_t used = __atomic_load_n(&f->slot[i].used, __ATOMIC_ACQUIRE);
        uint64_t ctxs = __atomic_load_n(&f->slot[i].contexts, __ATOMIC_ACQUIRE);
        if (used == 0 && ctxs == 0)
            continue;
        out[n].pid = pid;
        out[n].used = used;
        out[n].contexts = ctxs;
        n++;
    }
    return n;
}

/* Lock-free claim: compare-and-swap the pid field from empty (or a dead pid)
 * to ours, so it is correct whether or not the caller holds the flock. */
static int claim_slot(int dev)
{
    shared_file_t *f = g_sh.map[dev];
    uint32_t self = (uint32_t)getpid();
    for (int i = 0; i < SHARED_SLOTS; i++)
        if (__atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE) == self)
            return i;
    for (int i = 0; i < SHARED_SLOTS; i++) {
        uint32_t pid = __atomic_load_n(&f->slot[i].pid, __ATOMIC_ACQUIRE);
        if (pid != 0 && pid_alive(pid))
            continue;
        if (__atomic_compare_exchange_n(&f->slot[i].pid, &pid, self, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&f->slot[i].used, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&f->slot[i].contexts, 0, __ATOMIC_RELEASE);
            return i;
        }
    }
    return -1;
}

void sim_shared_publish(int dev, uint64_t used, uint64_t contexts)
{
    if (!g_sh.enabled || dev < 0 || dev >= g_sh.ndev)
        return;
    if (g_sh.my_slot[dev] < 0) {
        if (used == 0 && contexts == 0)
            return;
        g_sh.my_slot[dev] = claim_slot(dev);
        if (g_sh.my_slot[dev] < 0) {
            static bool warned;
            if (!warned) {
                warned = true;
                fprintf(stderr, "simgpu: warning: all %d state slots in use; this process is invisible to peers\n",
                        SHARED_SLOTS);
            }
            return;
        }
    }
    shared_slot_t *s = &g_sh.map[dev]->slot[g_sh.my_slot[dev]];
    __atomic_store_n(&s->used, used, __ATOMIC_RELEASE);
    __atomic_store_n(&s->contexts, contexts, __ATOMIC_RELEASE);
}

void sim_shared_after_fork_child(void)
{
    if (!g_sh.enabled)
        return;
    /* Drop the inherited mappings without touching the parent's slots. */
    for (int d = 0; d < g_sh.ndev; d++) {
        munmap(g_sh.map[d], sizeof(shared_file_t));
        close(g_sh.fd[d]);
    }
    memset(&g_sh, 0, sizeof g_sh);
}

void sim_shared_close(void)
{
    if (!g_sh.enabled)
        return;
    uint32_t self = (uint32_t)getpid();
    for (int d = 0; d < g_sh.ndev; d++) {
        int i = g_sh.my_slot[d];
        if (i >= 0 && __atomic_load_n(&g_sh.map[d]->slot[i].pid, __ATOMIC_ACQUIRE) == self) {
            __atomic_store_n(&g_sh.map[d]->slot[i].used, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&g_sh.map[d]->slot[i].contexts, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&g_sh.map[d]->slot[i].pid, 0, __ATOMIC_RELEASE);
        }
        munmap(g_sh.map[d], sizeof(shared_file_t));
        close(g_sh.fd[d]);
    }
    memset(&g_sh, 0, sizeof g_sh);
}
