/* The in-memory record of one failure (or warning, or exit summary): everything a dump
 * says, measured once.  JSON and text are both rendered from it (dump_json.c, dump.c), so
 * the two can never disagree.  Field meanings: docs/dump-format.md. */
#ifndef OG_RECORD_H
#define OG_RECORD_H

#include <stdbool.h>
#include <stdint.h>

#include "human.h" /* enum og_framework */
#include "facts.h"
#include "unmeasured.h" /* enum og_unmeasured */

#define OG_STEP_SERIES 32 /* roles.allocated_after_steps: the latest optimizer steps kept */

/* A count that may not have been measured: known says whether v holds one (v is 0 when not).
 * A zeroed record holds "not measured" in every one of these.  No byte count of the record keeps
 * "unknown" in its value: every uint64_t is a number (a request can be SIZE_MAX), and a count that
 * can go unmeasured is one of these. */
typedef struct og_opt_u64 {
    uint64_t v;
    bool known;
} og_opt_u64_t;

static inline bool og_known(og_opt_u64_t x) { return x.known; }
static inline void og_set(og_opt_u64_t *x, uint64_t v) { *x = (og_opt_u64_t){ v, true }; }
static inline void og_unset(og_opt_u64_t *x) { *x = (og_opt_u64_t){ 0, false }; }
/* the value, or `otherwise` when not measured */
static inline uint64_t og_or(og_opt_u64_t x, uint64_t otherwise) { return x.known ? x.v : otherwise; }

#define OG_QUARTERS 4

/* how many of a record's fixed array (holders, models, Python frames) are filled: its count N, clamped to the
 * array's length (a reader takes counts from a dump, which may say more or less than it holds) */
#define OG_FILLED(n, array) \
    ((n) < 0 ? 0 : (size_t)(n) > sizeof(array) / sizeof *(array) ? (int)(sizeof(array) / sizeof *(array)) : (int)(n))

typedef struct og_lib_usage {
    char library[120];
    uint64_t bytes, blocks;
    bool framework;
    int fw_kind;         /* enum og_framework of this library (OG_FW_UNKNOWN if none) */
    uint64_t pool_bytes; /* of `bytes`, blocks taken from stream-ordered pools */
    /* of `bytes`, what was taken in each quarter of the run so far (the shim's start to the reading; the live
     * blocks by their allocation time, first quarter first); unknown for a pool's own cache entry */
    uint64_t by_quarter[OG_QUARTERS];
    bool by_quarter_known;
} og_lib_usage_t;

typedef struct og_other_proc {
    int pid;
    char name[64];
    uint64_t bytes;
    bool visible;         /* the pid exists in this pid namespace (/proc/PID) */
    bool same_job;        /* same command and job (launcher/rank variables) as this process */
    long rank;            /* its RANK (or launcher equivalent), -1 when unknown */
    bool child;           /* a child of this process (DataLoader worker, subprocess) */
    bool sibling;         /* another child of this process's parent, same command (a pre-fork server's worker) */
    bool parent;          /* this process's parent (a pre-fork server's master) */
    bool same_program;    /* not of this job: this program run with another command line (a second server) */
    bool other_program;   /* a child running another program: not a fork of this one (same command line) nor a
                           multiprocessing worker (spawn/forkserver); an evaluation script this process started */
    bool same_allocation; /* a rank of the same batch allocation (SLURM_JOB_ID, ...) with this command line in a world
                             of its own (another MASTER_PORT or TORCHELASTIC_RUN_ID): one launcher of several */
} og_other_proc_t;

typedef struct og_frame {
    uintptr_t ip;
    char symbol[96];
    char library[96];
    uintptr_t offset;  /* ip - library base */
    char path[192];    /* the library's file, for symbolizing later ("" if unknown) */
    char build_id[41]; /* its GNU build-id, hex ("" if it has none) */
} og_frame_t;

typedef struct og_top_site {
    uint64_t bytes, blocks;
    char library[120];
    char api[40];
    int nframes;
    og_frame_t frames[16];
} og_top_site_t;

typedef struct og_sample {
    double t_rel;
    uint64_t live;
} og_sample_t;

/* What one history event was (OG_OP_NONE: an empty entry). */
enum og_hist_op { OG_OP_NONE, OG_OP_ALLOC, OG_OP_FREE, OG_OP_FAIL, OG_OP_POOL_GROW, OG_OP_POOL_SHRINK, OG_OP_OTHER };
const char *og_hist_op_name(enum og_hist_op op);

typedef struct og_cause {
    const char *id;    /* does_not_fit, fragmentation, ... */
    double confidence; /* 0..1 */
    char summary[384];
    int nevidence;
    struct {
        const char *name;
        bool is_text;
        double num;
        char text[64];
        bool is_bytes;
        uint64_t bytes; /* a byte count, exact (num rounds SIZE_MAX up to 2^64) */
    } evidence[12];
} og_cause_t;

/* Remedies shown in full (text, HTML, stderr); the rest are listed as "also possible", the JSON keeps all. */
#define OG_REMEDIES_SHOWN 5
/* ranking rows kept per remedy (remedies[].ranking.rows): the first ones that touched it */
#define OG_RANK_ROWS_KEPT 8
/* remedies[].ranking.estimate: -1 unknown; this, no bound (a bigger card, a cap raised: "unbounded") */
#define OG_RANK_UNBOUNDED (-2.0)

typedef struct og_remedy {
    const char *id;
    int rank;   /* 1 = first */
    bool shown; /* rank <= OG_REMEDIES_SHOWN, and not tier 3 while another is not (remedies[].shown) */
    const char *title;
    char why[512]; /* the reasoning, then the figures measured; tools/report.h prints it whole (OG_REMEDY_WHY_MAX) */
    int nhow;
    char how[6][200];
    const char *saving, *cost;
    /* how the ranking placed it (remedies[].ranking): its tier (0 leads, 1 covers the shortfall, 2 unknown,
     * 3 cannot cover it alone), its order within the tier, the bytes the ranking estimated it could save
     * (-1: unknown), and the ranking rows that brought, moved or led it, in the order they applied */
    struct {
        int tier, order;
        double estimate;
        int nrows;
        const char *rows[OG_RANK_ROWS_KEPT];
    } ranking;
} og_remedy_t;

/* A Python source line (event.python_stack, python_sites: bytes/blocks only there). */
typedef struct og_py_frame {
    char file[200];
    char function[64];
    int line;
    uint64_t bytes, blocks;
} og_py_frame_t;

/* a setting of the program's own code (common/code_settings.def) and the line that sets it */
enum og_code_setting_id {
#define OG_CODE_SETTING(key, text) OG_SETTING_##key,
#include "code_settings.def"
#undef OG_CODE_SETTING
    OG_NCODE_SETTINGS
};
/* its JSON key (and the adapter's name for it) */
static inline const char *og_code_setting_name(int i)
{
    static const char *const names[] = {
#define OG_CODE_SETTING(key, text) #key,
#include "code_settings.def"
#undef OG_CODE_SETTING
    };
    return i >= 0 && i < OG_NCODE_SETTINGS ? names[i] : "";
}
typedef struct og_code_setting {
    bool has;
    og_py_frame_t at;
    char key[32]; /* the keyword that set it (padding, output_hidden_states) */
} og_code_setting_t;

/* The framework's allocated bytes by role (memory.framework.roles), from the adapter; has = false if none. */
enum og_role {
#define OG_ROLE(key, label, quiet) OG_ROLE_##key,
#include "roles.def"

#undef OG_ROLE
    OG_NROLES
};

typedef struct og_role_holder {
    char label[160]; /* "losses (list, global in train.py)" */
    char name[64], kind[32], where[96];
    uint64_t bytes, tensors;
    bool has_site; /* site: the line that created its largest tensor (allocation history) */
    og_py_frame_t site;
    char purpose[16]; /* what its name or class says it keeps (kv_cache, ema, checkpoint, ...); "" none */
    char copy_of[24]; /* the role its blocks are a copy of (parameters, optimizer_state); "" none */
    int graphs;       /* of its first tensors with a grad_fn (at most 4 read), those whose autograd graph still holds
                         what it saved for backward; -1 not read (an older adapter) */
    /* of its bytes, those in storages torch.load restored onto a GPU (unset: not watched, an older adapter), and
     * the program's line of the torch.load call that restored most of them (has_restored_site false: none) */
    og_opt_u64_t restored;
    bool has_restored_site;
    og_py_frame_t restored_site;
    /* it is a collection of this many like records (a list, tuple, deque or dict whose first elements each hold
     * tensors of the device, of one type and as many tensors: a scene's photos, an epoch's batches); 0 not one,
     * -1 not read (an older adapter) */
    int64_t records;
    og_opt_u64_t float64; /* of its bytes, those in float64 tensors (unset: not read, an older adapter) */
    /* the bound it is kept to, as the object whose attribute it is names it (an LRU's budget_bytes, its capacity
     * in entries; a deque's maxlen): bytes and records, unset none named (or an older adapter) */
    og_opt_u64_t bound_bytes, bound_records;
} og_role_holder_t;

typedef struct og_roles {
    bool has;
    bool complete;                /* the scan finished within its time budget */
    og_opt_u64_t allocated_bytes; /* what the roles split */
    og_opt_u64_t bytes[OG_NROLES];
    uint64_t tensors[OG_NROLES]; /* storages counted */
    int noptimizers;
    struct {
        char cls[48];
        uint64_t bytes, tensors;
        og_opt_u64_t param_bytes; /* parameters on the failing device its param_groups hold */
        /* of bytes: state tensors not shaped like their parameter (more than one value: a preconditioner matrix,
         * a projection; Adam's moments are shaped like it), roles.optimizers[].not_elementwise_bytes */
        og_opt_u64_t shaped_bytes;
    } optimizers[6];
    /* roles.parameters_by_dtype: the parameters role by dtype, largest first; has_dtypes false: not measured */
    bool has_dtypes;
    int ndtypes;
    struct {
        char dtype[16]; /* "float32", "bfloat16", ... */
        uint64_t bytes, tensors;
    } dtypes[6];
    int nholders;
    og_role_holder_t holders[8];
    uint64_t elapsed_us, objects;
    og_opt_u64_t last_step_age_us; /* the latest optimizer step ended this long before the report */
    int num_beams;                 /* the beam width of the generation running at the failure; 0 unknown */
    int checkpointing;             /* activation checkpointing for the failing pass: 1 in force, -1 off, 0 unknown */
    int batch_size;                /* the batch the program names for the failing pass (an int named so); 0 unknown */
    /* roles.child_processes: the children this process started through Python's multiprocessing, alive by its own
     * record, and the name the code that started each gave it ("Dask Worker process (from Nanny)"; "" the default
     * one, as a DataLoader's workers keep); children_read false: not read (no adapter report, or multiprocessing
     * never imported) */
    bool children_read;
    int nchildren;
    struct {
        int pid;
        char name[96];
    } children[8];
    /* roles.statement_model_device: the GPU of the models the failing statement reads by name, another than the
     * failing one (a tensor made on the current device for a model on cuda:1); has_ false: none such, or not read */
    bool has_stmt_model_device;
    int stmt_model_device;
    char stmt_model_name[48];      /* roles.statement_model: the name the statement reads that model by ("" none) */
    int per_sample_count;          /* roles.per_sample_count: the most examples a per-sample gradient holds; 0 none */
    og_opt_u64_t lora_bytes;       /* roles.lora_parameters_bytes: LoRA adapters' parameters; unknown: no adapter */
    og_opt_u64_t lora_base;        /* roles.lora_base_trainable_bytes: the other weights requiring grad */
    og_opt_u64_t embedding_bytes;  /* roles.embedding_parameters_bytes: the models' embedding tables; unknown: no
                                      model walked */
    og_opt_u64_t embedding_tables; /* roles.embedding_tables: how many tensors those tables are; unknown as above */
    bool autocast_in_code;         /* the program's code on the failing stack enters autocast (false: not said) */
    /* roles.scaler_without_autocast: that code names a GradScaler and none of the program's files names autocast
     * (float16 loss scaling around a float32 forward; false: not said) */
    bool scaler_no_autocast;
    bool backward_in_code; /* roles.backward_in_code: that code calls backward (false: not said) */
    /* roles.backward_on_stack: a frame of the failing stack, the program's or a framework's, loads backward (or
     * autograd's grad) to call it: 1 one does, -1 none does (read), 0 not read */
    int backward_on_stack;
    /* roles.input_requires_grad: a tensor the outermost model's forward on the stack was given requires grad and is
     * no parameter: the program asks for the gradient of the input (false: not said) */
    bool input_grad;
    uint64_t reported_t_ns; /* when that report arrived (og_now_ns; 0 unknown) */
    double reported_t_rel;  /* the same on the history's clock (seconds since start; 0 unknown) */
    uint64_t sampled;       /* large containers and classes read in part (their first elements held no tensor) */
    char why[160];          /* why something is unknown ("" none) */
    int nmodels;            /* roles.models: the modules no other module holds, by class and size */
    struct {
        char cls[48];
        uint64_t bytes, tensors; /* parameters on the failing device, of one of them */
        int count;               /* how many such models */
        bool frozen;             /* none of their parameters requires grad */
        int named;               /* of them, held by a name of the running code (-1 unknown: an older adapter) */
        int running;             /* of them, running: a method of theirs executes (-1 unknown) */
        char names[64];          /* the names holding them, comma-separated ("" none) */
        char purpose[16];        /* what those names or the class say they are kept for (common/purposes.def: an
                                    EMA, a teacher, a reference policy; "" none said) */
        int trained;             /* of them, how many an optimizer trains (its param_groups hold a parameter of
                                    theirs); -1 unknown (no optimizer holds a parameter of the device, an older
                                    adapter) */
        int stepped;             /* of those, how many an optimizer has stepped on (its state holds an entry for a
                                    parameter of theirs); -1 unknown, as trained */
        uint64_t away;           /* parameters of one of them not on the failing device (the host, the meta
                                    device, another GPU: the rest of a model a load is moving here); 0 none or
                                    not measured */
        int training;            /* of them, how many are in training mode (Module.training); -1 unknown */
        og_opt_u64_t fp32;       /* of one of them, the parameters on the failing device in float32 (unset: not
                                    read, an older adapter) */
        og_opt_u64_t quant;      /* of one of them, those in a dtype of 8 bits or fewer (int8, packed 4-bit,
                                    float8: quantized weights; unset as fp32) */
    } models[6];
    /* roles.operation: what the failing operation is (common/operations.def; "" none matched), its frame and the
     * argument of that frame its row read ("need_weights=True"; "" none read) */
    char operation[24];
    og_py_frame_t op_frame;
    char op_argument[40];
    /* roles.generation_input: the input of the generate() call running at the failure (its name, "pixel_values";
     * "" none read) and its shape, batch first (gen_dims 0: none) */
    char gen_input[32];
    uint64_t gen_shape[6];
    int gen_dims;
    /* roles.failing_layer: the failing pass runs in layer layer_index (from 0) of a run of layer_count like layers
     * (an nn.ModuleList or nn.Sequential of one class) its model holds under layer_run (layer_count 0: none read);
     * layer_alike 1 when the run's first, failing and last layers hold as many bytes of parameters (within a tenth),
     * -1 when they do not (a U-Net's encoder blocks), 0 not read */
    char layer_run[32];
    int layer_index, layer_count, layer_alike;
    /* roles.ddp: DistributedDataParallel wrappers whose gradients are not bucket views, and the reducer's bucket
     * copy of their gradients on the failing device (ddp_wrappers 0: none) */
    int ddp_wrappers;
    uint64_t ddp_bucket_bytes;
    /* the failing statement (roles.statement): the program's line, the name its result goes to, what
     * that name (or the names it reads) says it builds; has_statement false: none was found */
    bool has_statement;
    og_py_frame_t stmt;
    char stmt_target[64], stmt_purpose[16], stmt_names[128];
    char stmt_ints[96]; /* the int values of the names it reads, comma-separated ("" none) */
    /* roles.accumulating: a running function of the program sums several passes' outputs into `accum_target`
     * (adding `accum_operand`) while their graphs are alive (backward once on the sum); has_accum false: none */
    bool has_accum;
    og_py_frame_t accum;
    char accum_target[64], accum_operand[64];
    /* settings of the program's own code (common/code_settings.def: roles.padding_to_max_length, ...): the line
     * that sets each and the keyword it used; has false: none seen */
    og_code_setting_t settings[OG_NCODE_SETTINGS];
    /* what the framework had allocated right after each of the latest steps of the optimizer that stepped
     * most on this device (roles.allocated_after_steps), oldest first; nsteps 0: none seen */
    int nsteps;
    uint64_t steps_made; /* the steps that optimizer made in all (roles.optimizer_steps) */
    /* steps_made was measured: true with nsteps 0 and steps_made 0 when the adapter watched every optimizer step
     * from the framework's import and none was made on this device (a measured zero, not an unknown) */
    bool steps_known;
    /* the steps every optimizer made on this device (roles.optimizer_steps_on_device), known when the adapter
     * watched every step from the framework's import: more than steps_made when another optimizer stepped here
     * before (a new one per round or client), so that the series does not span the device's run */
    uint64_t device_steps;
    bool device_steps_known;
    /* among the blocks no role reached (activations), a copy of this role ("" none: roles.activations_copy_of)
     * and its bytes: a copy being made that no named object holds yet */
    char act_copy_of[24];
    uint64_t act_copy_bytes;
    /* roles.copy_made_bytes: what a copy.deepcopy running at the failure made so far on the failing device (the
     * tensors of its memo); unknown: no deepcopy ran (or it was not read) */
    og_opt_u64_t copy_made;
    uint64_t step_alloc[OG_STEP_SERIES];
    /* roles.allocated_over_run: the same optimizer's allocated bytes after every step_run_every-th step of the
     * whole run (at most OG_STEP_SERIES, oldest first; the stride doubles as the run grows); nstep_run 0: none */
    int nstep_run;
    uint64_t step_run_every;
    uint64_t step_run[OG_STEP_SERIES];
    /* roles.attention_modules: the layers the walk of the models took for attention by their names; unknown: the
     * walk did not finish or met no model */
    og_opt_u64_t attention_modules;
} og_roles_t;

/* Framework adapter's own numbers (PyTorch memory_stats and friends); has = false if none. */
/* Another framework of this process and what it holds on the failing device, as its own adapter read it
 * (memory.framework.other_frameworks); unknown where not read. */
typedef struct og_other_framework {
    char framework[16]; /* "jax", "pytorch", ... */
    og_opt_u64_t reserved_bytes, in_use_bytes, limit_bytes;
} og_other_framework_t;

typedef struct og_framework_view {
    bool has;
    int device;
    uint64_t allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes;
    uint64_t largest_free_block_bytes, private_pool_bytes;
    uint64_t num_alloc_retries, num_ooms;
    char allocator_settings[256];
    char source[32];         /* "torch", ... */
    char snapshot_file[512]; /* the framework's own snapshot (JSON), "" if none */
    /* evidence for the diagnosis (zero = unknown): */
    int grad_enabled;           /* 1 autograd on at the failure, -1 off (no_grad/inference_mode) */
    int training;               /* 1 training seen (optimizer state, backward), -1 known inference/eval */
    int autocast;               /* 1 mixed precision (autocast) on at the failure, -1 off */
    bool freed_known;           /* freed_bytes_total was measured (0 freed is an answer) */
    uint64_t freed_bytes_total; /* bytes the framework freed over the process's life */
    /* reserved_bytes was a floor (OOMGUARD_FW_RESERVED_BY_LEDGER: TensorFlow's arena): the shim's ledger counted
     * the reservation instead; none of the framework's blocks seen, it is unknown (JSON null, the cache unknown) */
    bool reserved_by_ledger, reserved_unknown;
    og_opt_u64_t cap_bytes;   /* framework-imposed cap (memory fraction, set_limit); unknown: none reported */
    char cap_source[64];      /* the setting that imposes it */
    char framework[16];       /* "pytorch" | "jax" | "tensorflow" | "cupy"; "" = from `source` */
    char unmeasured_why[120]; /* why the adapter could not answer at the failure ("" = it did or none) */
    /* failures inside the framework's allocator and the Python lines (framework.c) */
    bool internal_oom;            /* the framework refused the request itself; no driver call failed */
    char api[48];                 /* the framework's allocator, event.api of an internal failure */
    og_opt_u64_t requested_bytes; /* the framework's own request; unknown: the adapter did not give it */
    og_opt_u64_t peak_bytes;      /* the framework's peak (jax peak_bytes_in_use); unknown: not reported */
    uint64_t reported_t_ns;       /* when the adapter handed these in (og_now_ns) */
    int npy_frames;               /* event.python_stack, innermost first */
    og_py_frame_t py_frames[24];
    int npy_sites; /* python_sites: lines holding the most live memory, largest first */
    og_py_frame_t py_sites[16];
    og_roles_t roles;      /* memory.framework.roles */
    char phase[24];        /* event.phase: "" unknown */
    char phase_source[96]; /* event.phase_source: how it was told, or why unknown ("" none given) */
    bool has_phase_frame;
    og_py_frame_t phase_frame; /* event.phase_frame */
    bool has_phase_site;
    og_py_frame_t phase_site; /* event.phase_site: the program's own line at or outside phase_frame */
    int nother_fw;            /* memory.framework.other_frameworks */
    og_other_framework_t other_fw[4];
} og_framework_view_t;

typedef struct og_record {
    const char *status; /* oom | recovered | warning | exit */
    double time;        /* epoch seconds */
    int pid, ppid;
    char host[256];
    char node[256];                    /* the machine, when the host name is a pod's or a task's ("": unknown) */
    long rank, local_rank, world_size; /* -1 when not set */
    char job_id[128];
    char cmdline[1024];
    enum og_framework framework;
    char framework_libs[512]; /* comma-separated framework libraries seen */
    int visible_devices;

    /* settings already in force, read from the environment (allow-listed) */
    int nenv;
    char env[48][256];            /* "NAME=value" */
    char pytorch_alloc_conf[256]; /* PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) */
    bool expandable_segments_set;
    bool max_split_set;
    bool xla_preallocate_off; /* XLA_PYTHON_CLIENT_PREALLOCATE=false */
    char tf_gpu_allocator[64];

    struct {
        /* the API's argument for a driver or runtime call: always known, SIZE_MAX and 0 included; a failure
         * an adapter reported (framework_internal) knows it only when the adapter gave it; no failure (a
         * warning, a snapshot, the exit summary): unknown */
        og_opt_u64_t requested_bytes;
        const char *api; /* API the program called (runtime name when via libcudart) */
        const char *driver_api;
        bool framework_internal; /* refused inside the framework's allocator: no driver call */
        int device;
        bool stream_ordered;
        int result;
        bool caused_by_limit;
        char library[120];
        int nframes;
        og_frame_t frames[32];
        double t, t_rel;
        int attempts;
        og_opt_u64_t released_between_attempts_bytes; /* unknown: a framework's own retry, unseen */
        bool recovered;
        uint64_t recovered_requested_bytes; /* the allocation that succeeded: a driver call's argument, known */
        double recovered_t;
    } event;

    struct {
        int index;
        char name[128];
        char pci_bus_id[32];
        int cc_major, cc_minor;
        og_opt_u64_t total_bytes, free_bytes; /* unknown when the driver did not answer */
        og_opt_u64_t limit_bytes;             /* unknown when no limit */
        og_opt_u64_t limit_usage_bytes; /* what the limit check counts (tracked + context); unknown without limit */
    } device;

    struct {
        og_opt_u64_t process_tracked_bytes; /* the ledger's total on the device; unknown: not read */
        og_opt_u64_t process_used_bytes;    /* NVML; unknown if not measured */
        uint64_t plain, managed, pool_reserved, pool_used, vmm_physical, vmm_mapped;
        int nlibs;
        og_lib_usage_t by_library[32];
        uint64_t framework_bytes;                  /* held by the framework's libraries */
        og_opt_u64_t framework_cached_bytes;       /* held but unused: unknown if not measured */
        enum og_cache_src framework_cached_source; /* OG_CACHE_NONE when not measured */
        og_opt_u64_t non_framework_bytes;          /* process_used - framework_bytes; unknown without NVML */
        og_opt_u64_t context_bytes_estimate;       /* process_used - tracked; unknown without NVML */
        int nother;
        og_other_proc_t other[32];          /* largest first */
        og_opt_u64_t other_processes_bytes; /* all of them, listed or not; unknown without NVML's list */
        int other_processes_count;          /* all of them: other[] keeps the 32 holding most */
        uint64_t host_pinned_bytes;
        int pool_owner_fw;    /* whose stream-ordered pools: 0 unknown/none, 1 the framework's, 2 the application's */
        char pool_owner[120]; /* library that took most blocks from the pools */
        int nunmeasured;
        char unmeasured[8][160];     /* the sentence, with its numbers */
        uint8_t unmeasured_what[8];  /* enum og_unmeasured of each, for rules and the dump's ids */
        char nvml_process_query[96]; /* NVML call (and entry size) that listed the processes; "" = none */
        uint64_t ipc_mapped_bytes;   /* other processes' memory opened here (cuIpcOpenMemHandle): not ours */
        /* CUDA contexts this process holds on the device: made with cuCtxCreate and still alive (-1 unknown), and
         * whether its primary context there is active (1 yes, 0 no, -1 unknown): each holds memory of its own */
        int64_t contexts_made;
        int8_t primary_context;
        og_framework_view_t fw;
    } memory;

    struct {
        uint64_t peak_bytes;
        double peak_t_rel;
        char peak_library[120];
        int nevents;
        struct og_hist_ev {
            double t_rel;
            enum og_hist_op op;
            uint64_t bytes;
            int device;
            const char *api;
            uint64_t live;
        } * events;
        int nsamples;
        og_sample_t samples[512];
        uint64_t allocs, frees, failures, unknown_frees;
        uint64_t recovered_episodes, recovered_not_written; /* failure episodes on the device, up to this record */
    } history;

    int nsites;
    og_top_site_t sites[20];

    struct {
        const char *primary;
        og_opt_u64_t shortfall_bytes; /* unknown: the record was not diagnosed from measurements */
        int ncauses;
        og_cause_t causes[8];
    } diagnosis;

    int nremedies;
    og_remedy_t remedies[20];

    /* summary across devices (peaks, which card sizes fit) */
    int nsummary;
    struct {
        int index;
        uint64_t peak_bytes;
        double peak_t_rel;
        char peak_library[120];
        uint64_t tracked_bytes;
    } summary[16];

    /* the analysis's working space (not dumped): the facts og_diagnose computed, read again by
     * og_select_remedies, and scratch too large for the failing thread's stack */
    struct {
        bool facts_valid;
        og_facts_t facts;
        og_growth_scratch_t growth;
        og_cause_t found[16]; /* every cause that holds, before ranking */
    } analysis;
} og_record_t;

/* Diagnosis thresholds (OOMGUARD_* options, see options.def). */
typedef struct og_thresholds {
    double frag_share;          /* cached >= this share of the framework's reservation */
    double nonfw_share;         /* non-framework >= this share of the process's usage */
    double growth_min_share;    /* growth: rise >= this share of the device total */
    double growth_rising_steps; /* growth: share of steps whose low point rose */
} og_thresholds_t;

/* facts.c: the facts of REC (thresholds TH, NULL for the defaults); S is scratch for the growth rule. */
void og_facts_compute(og_facts_t *f, const og_record_t *rec, const og_thresholds_t *th, og_growth_scratch_t *s);
/* facts.c: what holder i of roles.holders keeps: by its name, or a data set by its records (facts: records_dataset) */
enum og_purpose og_holder_purpose(const og_facts_t *d, const og_record_t *r, int i);
/* diagnose.c: fills rec->diagnosis from the measured fields.  Pure: no I/O, no globals. */
void og_diagnose(og_record_t *rec, const og_thresholds_t *th);
/* the same, running the rules last to first (tests: no rule depends on another) */
void og_diagnose_reversed(og_record_t *rec, const og_thresholds_t *th);
/* remedies.c: fills rec->remedies from diagnosis + measurements.  Pure. */
void og_select_remedies(og_record_t *rec);

#endif
