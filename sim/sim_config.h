/*
 * sim_config.h — SIMGPU_* configuration shared by the simulated driver
 * (libcuda.so.1) and the simulated NVML (libnvidia-ml.so.1).
 *
 * Both libraries compile sim_config.c and sim_shared.c into themselves; every
 * symbol declared here is hidden so nothing leaks into the exported ABI and
 * the two copies never interpose on each other.
 */
#ifndef SIM_CONFIG_H
#define SIM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define SIM_HIDDEN __attribute__((visibility("hidden")))

#define SIM_MAX_DEVICES     16 /* each device owns a 512 GiB fake VA window */
#define SIM_MAX_OTHER_PROCS 64
#define SIM_MAX_FAIL_RULES  32
#define SIM_NAME_MAX        96

#define SIM_KIB (1024ULL)
#define SIM_MIB (1024ULL * 1024ULL)
#define SIM_GIB (1024ULL * 1024ULL * 1024ULL)

/* Default values (documented in docs/simulator.md). */
#define SIM_DEFAULT_DEVICES      1
#define SIM_DEFAULT_MEM          (24ULL * SIM_GIB)
#define SIM_DEFAULT_NAME         "oomguard simulated GPU"
#define SIM_DEFAULT_CC_MAJOR     9
#define SIM_DEFAULT_CC_MINOR     0
#define SIM_DEFAULT_CTX_OVERHEAD (512ULL * SIM_MIB)
#define SIM_DEFAULT_GRANULARITY  (2ULL * SIM_MIB)

typedef struct sim_other_proc {
    int dev;
    unsigned int pid;
    char name[64];
    uint64_t bytes;
} sim_other_proc_t;

typedef struct sim_fail_rule {
    char name[48]; /* canonical allocating-function name, or "*" */
    uint64_t nth;  /* 1-based call number that fails */
} sim_fail_rule_t;

typedef struct sim_config {
    int devices;
    uint64_t total[SIM_MAX_DEVICES];
    char name[SIM_MAX_DEVICES][SIM_NAME_MAX];
    int cc_major[SIM_MAX_DEVICES], cc_minor[SIM_MAX_DEVICES];
    uint64_t ctx_overhead;
    uint64_t granularity;
    int n_other;
    sim_other_proc_t other[SIM_MAX_OTHER_PROCS];
    int n_fail;
    sim_fail_rule_t fail[SIM_MAX_FAIL_RULES];
    double fail_prob;
    uint64_t seed;
    char truth_file[512]; /* "" = off */
    char state_dir[512];  /* "" = off */
    char lookup_log[512]; /* SIMGPU_LOG_LOOKUPS: "" = off */
} sim_config_t;

/* Parse the SIMGPU_* environment into *cfg.  Every malformed variable prints
 * exactly one warning on stderr (unless quiet) and falls back to its default. */
SIM_HIDDEN void sim_config_load(sim_config_t *cfg, bool quiet);

/* Parse "24GiB", "512MiB", "1.5GB", "4096" (bytes).  Returns false if malformed. */
SIM_HIDDEN bool sim_parse_size(const char *s, uint64_t *out);

/* Canonical name of an allocating driver function for fault injection
 * ("cuMemAlloc" -> "cuMemAlloc_v2", "cuMemAllocAsync_ptsz" -> "cuMemAllocAsync");
 * NULL when the name is not an allocating function. */
SIM_HIDDEN const char *sim_canonical_alloc_fn(const char *name);

/* Bytes used on `dev` by other processes listed in SIMGPU_OTHER_PROCS. */
SIM_HIDDEN uint64_t sim_config_other_bytes(const sim_config_t *cfg, int dev);

/* ---- SIMGPU_STATE_DIR: usage shared between cooperating processes ---- */

typedef struct sim_peer {
    unsigned int pid;
    uint64_t used;
    uint64_t contexts;
} sim_peer_t;

/* Open (creating if needed) the per-device state files.  Returns false when the
 * directory is unusable (one warning, then the feature stays off). */
SIM_HIDDEN bool sim_shared_open(const sim_config_t *cfg);
SIM_HIDDEN bool sim_shared_enabled(void);
/* Exclusive cross-process lock on one device's state file. */
SIM_HIDDEN void sim_shared_lock(int dev);
SIM_HIDDEN void sim_shared_unlock(int dev);
/* Sum of `used` of live peers (excluding this pid) on dev. */
SIM_HIDDEN uint64_t sim_shared_others_used(int dev);
/* Publish this process's usage on dev (claims a slot on first use). */
SIM_HIDDEN void sim_shared_publish(int dev, uint64_t used, uint64_t contexts);
/* Live peers other than this process; returns how many were written (<= max). */
SIM_HIDDEN int sim_shared_peers(int dev, sim_peer_t *out, int max);
/* Forget the inherited mapping/slots in a fork child (parent's slots untouched). */
SIM_HIDDEN void sim_shared_after_fork_child(void);
/* Release this process's slots (at exit). */
SIM_HIDDEN void sim_shared_close(void);

#endif /* SIM_CONFIG_H */
