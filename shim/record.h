/* The in-memory record of one failure (or warning, or exit summary): everything a dump
 * says, measured once.  JSON and text are both rendered from it (dump.c), so the two
 * can never disagree.  Field meanings: docs/dump-format.md. */
#ifndef OG_RECORD_H
#define OG_RECORD_H

#include <stdbool.h>
#include <stdint.h>

#define OG_UNKNOWN UINT64_MAX          /* a byte count that could not be measured */

enum og_framework { OG_FW_UNKNOWN, OG_FW_PYTORCH, OG_FW_JAX, OG_FW_TENSORFLOW, OG_FW_CUPY };

typedef struct og_lib_usage {
    char library[120];
    uint64_t bytes, blocks;
    bool framework;
} og_lib_usage_t;

typedef struct og_other_proc {
    int pid;
    char name[64];
    uint64_t bytes;
} og_other_proc_t;

typedef struct og_frame {
    uintptr_t ip;
    char symbol[96];
    char library[96];
    uintptr_t offset;                /* ip - library base */
} og_frame_t;

typedef struct og_top_site {
    uint64_t bytes, blocks;
    char library[120];
    char api[40];
    int nframes;
    og_frame_t frames[16];
} og_top_site_t;

typedef struct og_sample { double t_rel; uint64_t live; } og_sample_t;

typedef struct og_cause {
    const char *id;                  /* does_not_fit, fragmentation, ... */
    double confidence;               /* 0..1 */
    char summary[256];
    int nevidence;
    struct { const char *name; bool is_text; double num; char text[64]; } evidence[8];
} og_cause_t;

typedef struct og_remedy {
    const char *id;
    int rank;                        /* 1 = first */
    const char *title;
    char why[384];
    int nhow;
    char how[6][200];
    const char *saving, *cost;
} og_remedy_t;

/* Framework adapter's own numbers (PyTorch memory_stats and friends); has = false if none. */
typedef struct og_framework_view {
    bool has;
    int device;
    uint64_t allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes;
    uint64_t largest_free_block_bytes, private_pool_bytes;
    uint64_t num_alloc_retries, num_ooms;
    char allocator_settings[256];
    char source[32];                 /* "torch", ... */
    char snapshot_file[512];         /* the framework's own snapshot (JSON), "" if none */
} og_framework_view_t;

typedef struct og_record {
    const char *status;              /* oom | recovered | warning | exit */
    double time;                     /* epoch seconds */
    int pid, ppid;
    char host[256];
    long rank, local_rank, world_size;   /* -1 when not set */
    char job_id[128];
    char cmdline[1024];
    enum og_framework framework;
    char framework_libs[512];        /* comma-separated framework libraries seen */
    int visible_devices;

    /* settings already in force, read from the environment (allow-listed) */
    int nenv;
    char env[48][256];               /* "NAME=value" */
    char pytorch_alloc_conf[256];    /* PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) */
    bool expandable_segments_set;
    bool max_split_set;
    bool xla_preallocate_off;        /* XLA_PYTHON_CLIENT_PREALLOCATE=false */
    char tf_gpu_allocator[64];

    struct {
        uint64_t requested_bytes;
        const char *api;             /* API the program called (runtime name when via libcudart) */
        const char *driver_api;
        int device;
        bool stream_ordered;
        int result;
        bool caused_by_limit;
        char library[120];
        int nframes;
        og_frame_t frames[32];
        double t, t_rel;
        int attempts;
        uint64_t released_between_attempts_bytes;
        bool recovered;
        uint64_t recovered_requested_bytes;
        double recovered_t;
    } event;

    struct {
        int index;
        char name[128];
        char pci_bus_id[32];
        int cc_major, cc_minor;
        uint64_t total_bytes, free_bytes;
        uint64_t limit_bytes;        /* OG_UNKNOWN when no limit */
    } device;

    struct {
        uint64_t process_tracked_bytes;
        uint64_t process_used_bytes;     /* NVML; OG_UNKNOWN if not measured */
        uint64_t plain, managed, pool_reserved, pool_used, vmm_physical, vmm_mapped;
        int nlibs;
        og_lib_usage_t by_library[32];
        uint64_t framework_bytes;        /* held by the framework's libraries */
        uint64_t framework_cached_bytes; /* held but unused: OG_UNKNOWN if not measured */
        const char *framework_cached_source; /* "retry_release" | "pool" | "adapter" | NULL */
        uint64_t non_framework_bytes;    /* process_used - framework_bytes; OG_UNKNOWN without NVML */
        uint64_t context_bytes_estimate; /* process_used - tracked; OG_UNKNOWN without NVML */
        int nother;
        og_other_proc_t other[32];
        uint64_t other_processes_bytes;
        uint64_t host_pinned_bytes;
        int nunmeasured;
        char unmeasured[4][160];
        og_framework_view_t fw;
    } memory;

    struct {
        uint64_t peak_bytes;
        double peak_t_rel;
        char peak_library[120];
        int nevents;
        struct og_hist_ev { double t_rel; const char *op; uint64_t bytes; int device; const char *api; uint64_t live; } *events;
        int nsamples;
        og_sample_t samples[512];
        uint64_t allocs, frees, failures, unknown_frees;
    } history;

    int nsites;
    og_top_site_t sites[20];

    struct {
        const char *primary;
        uint64_t shortfall_bytes;
        int ncauses;
        og_cause_t causes[8];
    } diagnosis;

    int nremedies;
    og_remedy_t remedies[20];

    /* summary across devices (peaks, which card sizes fit) */
    int nsummary;
    struct { int index; uint64_t peak_bytes; double peak_t_rel; char peak_library[120]; } summary[16];
} og_record_t;

/* Diagnosis thresholds (OOMGUARD_* options, see og.h). */
typedef struct og_thresholds {
    double frag_share;           /* cached >= this share of the framework's reservation */
    double nonfw_share;          /* non-framework >= this share of the process's usage */
    double growth_min_share;     /* growth: rise >= this share of the device total */
    double growth_rising_steps;  /* growth: share of rising steps between windows */
    double growth_min_seconds;   /* growth: the samples must span at least this long (a load-up
                                    that fills memory in a burst is not a leak) */
} og_thresholds_t;

/* diagnose.c: fills rec->diagnosis from the measured fields.  Pure: no I/O, no globals. */
void og_diagnose(og_record_t *rec, const og_thresholds_t *th);
/* remedies.c: fills rec->remedies from diagnosis + measurements.  Pure. */
void og_select_remedies(og_record_t *rec);
const char *og_framework_name(enum og_framework fw);

#endif
