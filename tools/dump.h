/* tools/dump.h — an oomguard dump (docs/dump-format.md), read and validated.
 *
 * The reader streams the JSON through cJSON: the document is assembled value by
 * value from a sliding window over the file, and the three arrays that can be
 * huge (top_sites, history.events, history.samples) are consumed element by
 * element into compact arrays, so a dump with a million sites costs neither a
 * million cJSON trees nor the file's size in memory.
 *
 * Every field the tools read is type-checked here; renderers can trust the
 * struct.  Absent or null values are: -1 for counts and ids (all of which are
 * non-negative in the format), NAN for times, NULL for strings, -1 for booleans,
 * known == 0 for struct og_bytes.
 *
 * Integers are read exactly from their text (see keep_exact_ints in dump_read.c),
 * not through cJSON's double: a request can be SIZE_MAX bytes. */
#ifndef OG_DUMP_H
#define OG_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define OG_MAX_FILE_BYTES    ((size_t)512 << 20) /* refuse bigger files */
#define OG_DEFAULT_MEM_LIMIT ((size_t)1 << 30)   /* cJSON + compact arrays */
#define OG_MAX_EXACT_INT     9007199254740992.0  /* 2^53: doubles hold integers exactly below this */

/* A byte count that can be as large as a request: up to SIZE_MAX = 2^64-1, which neither an
 * int64 nor a double holds.  Every uint64 is a value, so unknown (null or absent) is a flag of
 * its own (unknown is not zero).  `neg` is only set for a difference that may be negative
 * (diagnosis.shortfall_bytes): the value is then -v. */
struct og_bytes {
    uint64_t v;
    uint8_t known, neg;
};

enum og_status { OG_ST_OTHER, OG_ST_OOM, OG_ST_RECOVERED, OG_ST_WARNING, OG_ST_EXIT };
enum og_op { OG_OP_OTHER, OG_OP_ALLOC, OG_OP_FREE, OG_OP_FAIL };

struct og_frame {
    const char *ip, *symbol, *library;
    /* for symbolizing (tools/symbolize.c): the library's file, its build-id, ip - its base */
    const char *offset, *path, *build_id;
    /* already symbolized in the dump (optional): demangled name, source line, inlined */
    const char *function, *file, *inlined_into;
    int64_t line; /* -1 when absent */
    int inlined;  /* -1 when absent */
};

/* A Python frame (event.python_stack): line -1 when absent. */
struct og_pyframe {
    const char *file, *function;
    int64_t line;
    int64_t bytes, blocks; /* python_sites only; -1 elsewhere */
};

/* memory.framework.roles (common/roles.def gives the roles): -1 is unknown (null) or absent. */
enum og_role_ix {
#define OG_ROLE(key, label, quiet) OG_RX_##key,
#include "../common/roles.def"
#undef OG_ROLE
    OG_NROLE_IX
};

/* the settings of the program's code under memory.framework.roles (common/code_settings.def) */
enum og_setting_ix {
#define OG_CODE_SETTING(key, text) OG_SX_##key,
#include "../common/code_settings.def"
#undef OG_CODE_SETTING
    OG_DUMP_NSETTINGS
};

struct og_role_holder_view {
    const char *label, *name, *kind, *where;
    int64_t bytes, tensors;
    struct og_pyframe site;             /* file NULL: no site */
    const char *purpose, *copy_of;      /* NULL: none */
    int64_t graphs;                     /* tensors read whose autograd graph is alive; -1 unknown (null) */
    int64_t restored_bytes;             /* of its bytes, those torch.load restored onto a GPU; -1 unknown (null) */
    struct og_pyframe restored_site;    /* the torch.load line that restored most of them; file NULL: none */
    int64_t records;                    /* the like records it is a collection of; 0 none, -1 unknown (null) */
    int64_t float64_bytes;              /* of its bytes, those in float64 tensors; -1 unknown (null) */
    int64_t bound_bytes, bound_records; /* the bound its owner names for it; -1 none named (null) */
};

/* memory.framework.roles: every key the writer documents (docs/dump-format.md), read once here for
 * every renderer.  Counts -1, strings NULL, frames with file NULL: unknown or absent. */
struct og_roles_view {
    int present;
    int64_t allocated_bytes;
    int64_t bytes[OG_NROLE_IX], tensors[OG_NROLE_IX];
    struct {
        const char *cls;
        int64_t bytes, tensors, parameters_bytes;
        int64_t not_elementwise_bytes; /* of bytes: not shaped like their parameters (preconditioners); -1 unknown */
    } * optimizers;
    int noptimizers;
    struct {
        const char *dtype;
        int64_t bytes, tensors;
    } * dtypes; /* parameters_by_dtype */
    int ndtypes, has_dtypes;
    struct og_role_holder_view *holders;
    int nholders;
    struct {
        const char *cls;
        int64_t parameters_bytes, tensors, count;
        int64_t trained;         /* -1 absent (null) */
        int64_t stepped;         /* -1 absent (null) */
        int64_t elsewhere_bytes; /* parameters_elsewhere_bytes: of one, not on the failing device; 0 absent */
        int64_t training;        /* how many are in training mode; -1 absent (null) */
        int64_t float32_bytes;   /* parameters_float32_bytes: of one, those in float32; -1 absent (null) */
        int64_t quantized_bytes; /* parameters_quantized_bytes: of one, those of 8 bits or fewer; -1 absent */
        int frozen;              /* -1 absent */
    } * models;
    int nmodels;
    struct { /* statement: the failing statement (at.file NULL: none) */
        struct og_pyframe at;
        const char *target, *purpose;
        const char **names;
        int nnames;
        int64_t *ints;
        int nints;
    } statement;
    struct { /* accumulating (at.file NULL: none) */
        struct og_pyframe at;
        const char *target, *operand;
    } accumulating;
    struct { /* the settings of the program's code, in common/code_settings.def's order (at.file NULL: none) */
        struct og_pyframe at;
        const char *key;
    } settings[OG_DUMP_NSETTINGS];
    struct { /* activations_copy_of (role NULL: none) */
        const char *role;
        int64_t bytes;
    } activations_copy_of;
    int64_t *after_steps; /* allocated_after_steps, oldest first */
    int nafter_steps, has_after_steps;
    int64_t *over_run; /* allocated_over_run.bytes, oldest first */
    int nover_run;
    int64_t over_run_every; /* allocated_over_run.every, -1 absent */
    int64_t optimizer_steps, num_beams, batch_size;
    int64_t optimizer_steps_on_device; /* every optimizer's steps on the device; -1 unknown */
    struct og_child_view {             /* child_processes: multiprocessing's children alive (children_read 0: null) */
        int64_t pid;
        const char *name; /* the name their starter gave them; NULL the default one */
    } * children;
    int nchildren, children_read;
    int64_t statement_model_device;     /* -1 unknown (null) */
    const char *statement_model;        /* the name that model is read by; NULL null */
    int64_t attention_modules;          /* -1 unknown (null) */
    int64_t copy_made_bytes;            /* -1 unknown (null): no deep copy under way */
    int64_t per_sample_count;           /* -1 null: no per-sample gradient */
    int64_t lora_parameters_bytes;      /* -1 null: no LoRA adapter */
    int64_t lora_base_trainable_bytes;  /* -1 null: no LoRA adapter */
    int64_t embedding_parameters_bytes; /* -1 null: no model walked */
    int64_t embedding_tables;           /* how many tensors those tables are; -1 null (an older adapter) */
    int gradient_checkpointing;         /* -1 unknown (null) */
    int autocast_in_code;               /* 1 true, -1 unknown (null) */
    int scaler_without_autocast;        /* 1 true, -1 not said (null) */
    int backward_in_code;               /* 1 true, -1 not said (null) */
    int backward_on_stack;              /* 1 true, 0 false (none on the stack), -1 not read (null) */
    int input_requires_grad;            /* 1 true, -1 not said (null) */
    struct {                            /* operation (name NULL: none) */
        const char *name;
        struct og_pyframe frame;
        const char *argument; /* the frame's argument its row read (NULL: none) */
    } operation;
    struct { /* failing_layer (count 0: null) */
        const char *run;
        int64_t index, count;
        int alike; /* 1 its first, failing and last layers hold as many bytes of parameters, 0 not, -1 null */
    } failing_layer;
    struct { /* generation_input (ndims 0: null) */
        const char *name;
        int64_t *shape; /* batch first */
        int ndims;
    } generation_input;
    struct { /* ddp (present 0: null) */
        int present, as_view;
        int64_t wrappers, bucket_bytes;
    } ddp;
    double last_step_ms_ago; /* NAN: unknown */
    int complete;            /* -1 absent */
    const char *why;
    double elapsed_ms;
    int64_t objects_scanned, read_in_part;
};

/* memory.framework.other_frameworks: another framework's holdings on the device (-1: not read) */
struct og_other_fw_view {
    const char *framework;
    int64_t reserved_bytes, in_use_bytes, limit_bytes;
};

struct og_site {
    int64_t bytes, blocks;
    const char *library, *api;
    struct og_frame *frames;
    int nframes;
    long index; /* position in the file's top_sites array */
};

struct og_event {
    double t_rel;
    struct og_bytes bytes; /* a failed request can be SIZE_MAX */
    int64_t live_bytes;    /* -1 when absent */
    int32_t device;        /* -1 when absent */
    int32_t op;            /* enum og_op */
};

struct og_sample {
    double t_rel;
    int64_t live_bytes;
};

struct og_lib {
    const char *library;
    int64_t bytes, blocks;
    int framework;
    const char *framework_name; /* the framework whose allocator it is ("pytorch", "jax"); NULL not said */
};

struct og_proc {
    int64_t pid, bytes;
    const char *name;
};

struct og_evidence {
    const char *name;
    const cJSON *value; /* number, string, or anything else shown as JSON */
};

struct og_cause {
    const char *id, *summary;
    double confidence;
    struct og_evidence *evidence;
    int nevidence;
};

struct og_remedy {
    const char *id, *title, *why, *saving, *cost;
    int64_t rank;
    int shown;    /* 1 shown in full, 0 "also possible", -1 the dump does not say (og_remedy_shown) */
    int64_t tier; /* ranking.tier: 3 cannot cover the shortfall alone; -1 the dump does not say */
    const char **how;
    int nhow;
};

struct og_fit {
    double card_gb;
    int fits;
};

struct og_devsum {
    int64_t index, peak_bytes;
    double peak_t_rel;
    const char *peak_library;
    struct og_fit *fits; /* fits: 1 yes, 0 no, -1 unknown (null: the peak was not bounded) */
    int nfits;
    const char *unbounded_why; /* why which cards fit is unknown (NULL: known, or not said) */
};

struct og_kv {
    const char *key, *value;
};

struct og_dump {
    const char *file; /* as given on the command line, for messages */
    cJSON *root;      /* the document; streamed arrays hold all elements only with keep_all */

    const char *schema, *status_str, *generator, *host, *node, *job_id, *cmdline;
    enum og_status status;
    double time;
    int64_t pid, ppid, rank, local_rank, world_size, visible_devices;
    const char *framework_name;
    const char **framework_libs;
    int nframework_libs;
    struct og_kv *env;
    int nenv;

    struct {
        int present;
        struct og_bytes requested_bytes;
        int64_t device, result, attempts, released_between_attempts_bytes;
        const char *api, *driver_api, *library;
        int stream_ordered, caused_by_limit;
        double t, t_rel;
        struct og_frame *stack;
        int nstack;
        struct og_pyframe *python_stack; /* event.python_stack, innermost first */
        int npython_stack;
        const char *phase, *phase_source; /* event.phase (NULL: unknown) and how it was told */
        struct og_pyframe phase_frame;    /* file NULL: none */
        struct og_pyframe phase_site;     /* the program's own line at or outside it; file NULL: none */
        int recovered;                    /* recovered_by is an object */
        struct og_bytes recovered_requested_bytes;
        double recovered_t;
    } event;

    struct {
        int present;
        int64_t index, total_bytes, free_bytes, limit_bytes;
        const char *name, *pci_bus_id, *compute_capability;
    } device;

    struct {
        int64_t process_tracked_bytes, process_used_bytes, framework_bytes, framework_cached_bytes, non_framework_bytes,
            context_bytes_estimate, other_processes_bytes, host_pinned_bytes;
        int64_t contexts_made; /* memory.contexts_made: contexts the process made on the device; -1 unknown or absent */
        int primary_context;   /* memory.primary_context: 1 active, 0 not, -1 unknown or absent */
        int64_t kind_plain, kind_managed, kind_pool_reserved, kind_pool_used, kind_vmm_physical, kind_vmm_mapped;
        struct og_lib *libs;
        int nlibs;
        struct og_proc *procs;
        int nprocs;
        const char **unmeasured;
        int nunmeasured;
        const cJSON *framework;            /* adapter's view (object) or NULL */
        const cJSON *fw_snapshot;          /* memory.framework.snapshot (object) or NULL */
        const char *fw_snapshot_file;      /* memory.framework.snapshot_file (the adapter's JSON) or NULL */
        struct og_roles_view roles;        /* memory.framework.roles */
        struct og_other_fw_view *other_fw; /* memory.framework.other_frameworks */
        int nother_fw;
    } mem;

    struct {
        int present;
        int64_t peak_bytes;
        double peak_t_rel;
        const char *peak_library;
        struct og_event *events;
        size_t nevents, events_cap;
        struct og_sample *samples;
        size_t nsamples, samples_cap;
        int64_t allocs, frees, failures, unknown_frees;
        int64_t recovered_episodes, recovered_not_written; /* -1: an older dump without them */
    } hist;

    struct og_site *sites; /* the largest `keep_sites`, largest first */
    int nsites;
    struct og_pyframe *python_sites; /* python_sites: lines holding the most live memory, largest first */
    int npython_sites;
    long sites_total; /* entries in the file */
    int64_t sites_total_bytes;

    struct {
        int present;
        const char *primary;
        struct og_bytes shortfall_bytes; /* requested - free: may be negative */
        struct og_cause *causes;
        int ncauses;
    } diag;

    struct og_remedy *remedies;
    int nremedies;

    struct og_devsum *devsum;
    int ndevsum;

    struct og_arena *arena; /* owns the arrays above */
    cJSON **kept_nodes;     /* streamed site elements kept for `sites` (freed with the dump) */
    int nkept_nodes;
};

struct og_load_opts {
    int keep_all;   /* keep every streamed element in `root` (json / memory-viz output) */
    int keep_sites; /* how many of the largest top_sites to keep (default 1000) */
    int no_history; /* skip history events/samples (merge does not need them) */
};

#define OG_ERR_MAX 640
struct og_err {
    char msg[OG_ERR_MAX]; /* "<file>: <problem>" */
};

/* Process-wide setup: installs cJSON allocation hooks that cap memory use. */
void og_reader_init(size_t mem_limit);

/* Load a dump from a file ("-" = standard input) or from memory.  On failure
 * returns NULL with err->msg set; the exit code for that is OG_EXIT_INPUT. */
struct og_dump *og_dump_load_file(const char *path, const struct og_load_opts *opts, struct og_err *err);
struct og_dump *og_dump_load_mem(const char *data, size_t len, const char *name, const struct og_load_opts *opts,
                                 struct og_err *err);
void og_dump_free(struct og_dump *d);

/* Helpers for renderers. */
const char *og_op_name(int op);
/* An integer JSON value, exactly (its text where a double cannot hold it): 1 and *out set, or 0
 * when v is not an integer in [-(2^64-1), 2^64-1]. */
int og_json_bytes(const cJSON *v, struct og_bytes *out);
/* Largest history value (samples, events, peak), or -1. */
int64_t og_history_max(const struct og_dump *d);
/* Whether remedy I is shown in full (remedies[].shown; a dump without it: the first five), else it is
 * listed under "also possible". */
int og_remedy_shown(const struct og_dump *d, int i);
/* Events of the failing device (or all, when the dump does not say). */
int og_event_on_device(const struct og_dump *d, const struct og_event *e);

#endif
