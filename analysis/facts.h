/* The facts of one failure: every quantity the causes and the remedies decide on, computed once from
 * the record (facts.c) before any rule runs.  Rules read them (const) and never write them, so the
 * order in which the causes run decides nothing but ties.  Pure data: no pointers into CUDA, no I/O.
 *
 * Known and unknown are explicit: a quantity that may be unmeasured comes with its `*_known` flag (or
 * an og_qty_t), never a sentinel value.  Rules over these facts: diagnose.c; remedies: remedies.c. */
#ifndef OG_FACTS_H
#define OG_FACTS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* A byte count that may be unknown (unknown is not zero). */
typedef struct og_qty {
    bool known;
    uint64_t v;
} og_qty_t;

/* Where the failing framework's cached-but-unused bytes were measured. */
enum og_cache_src {
    OG_CACHE_NONE,          /* not measured */
    OG_CACHE_ADAPTER,       /* the adapter's reserved - allocated */
    OG_CACHE_RETRY_RELEASE, /* what the framework freed between its failed attempts */
    OG_CACHE_POOL,          /* the slack of the framework's own stream-ordered pool */
    OG_CACHE_MEASURED,      /* measured, source not named */
};
const char *og_cache_src_name(enum og_cache_src s);

/* Which allocations mark the growth rule's steps. */
/* Which allocations mark the growth rule's steps; OG_MARK_OPTIMIZER_STEP: no allocation, the optimizer's own
 * steps (the framework's allocated bytes right after each, roles.allocated_after_steps); OG_MARK_KEPT_GRAPHS: none
 * either, the outputs a holder keeps with their graphs alive (roles.holders[].graphs), one per iteration;
 * OG_MARK_KEPT_RECORDS: none, the like records a caller's local keeps, one per call of the running code;
 * OG_MARK_KEPT_COPIES: none, the copies of one model a loop made and keeps, one per iteration */
enum og_step_marker {
    OG_MARK_FAILING_SIZE,
    OG_MARK_MODAL_SIZE,
    OG_MARK_EVERY_ALLOCATION,
    OG_MARK_OPTIMIZER_STEP,
    OG_MARK_KEPT_GRAPHS,
    OG_MARK_KEPT_RECORDS,
    OG_MARK_KEPT_COPIES
};

/* What the job was doing when it failed, read from the history by does_not_fit. */
enum og_load_phase { OG_PHASE_NONE, OG_PHASE_LOADING, OG_PHASE_SECOND_LOAD };

/* What the job was doing, from the adapter (event.phase; common/phases.def); OG_JP_unknown: not said. */
enum og_job_phase {
#define OG_JOB_PHASE(name) OG_JP_##name,
#include "phases.def"
#undef OG_JOB_PHASE
    OG_JP_COUNT
};
const char *og_job_phase_name(enum og_job_phase p);
/* the name a child of this process was given (roles.child_processes); "" the default one; NULL not listed or read */
struct og_record;
const char *og_child_name(const struct og_record *rec, int pid);

#define OG_NFW              5 /* enum og_framework values */
#define OG_GROWTH_MAX_STEPS 512
/* a big request: at least an OG_BIG_REQ_DIV-th of the device, one tensor the size of a layer's output over a
 * whole input (a recording, a volume, a long document), not one of a pass's many small temporaries */
#define OG_BIG_REQ_DIV 8
/* a holder that is a collection of at least this many like records (roles.holders[].records), kept across calls,
 * holds the data set whatever its name: more than any model has layers, fewer than a real data set has samples */
#define OG_RECORDS_MIN 128

/* Scratch of the growth rule: the low points of up to OG_GROWTH_MAX_STEPS steps and their rises. */
typedef struct og_growth_scratch {
    uint64_t ring[OG_GROWTH_MAX_STEPS], lows[OG_GROWTH_MAX_STEPS], rises[OG_GROWTH_MAX_STEPS];
    double tring[OG_GROWTH_MAX_STEPS]; /* when each step began (t_rel of its marker) */
} og_growth_scratch_t;

/* Growth: the low points of the latest steps of the history (see diagnose.c, growth). */
typedef struct og_growth_facts {
    bool holds; /* the rule's pattern is there (the rule then reports it) */
    enum og_step_marker marker;
    uint64_t size;                  /* the marker size (unused for OG_MARK_EVERY_ALLOCATION) */
    long seen;                      /* steps in the whole history */
    int steps, rising, transitions; /* steps read (<= OG_GROWTH_MAX_STEPS), rising among transitions */
    uint64_t per_step, rise, first_low, last_low;
    uint64_t max_step; /* the largest rise of one step (a driver's reading; 0 the optimizer's series) */
    double rising_share;
    /* side findings of the attempts, read by does_not_fit */
    int load_steps;           /* steps that were a load instead (0 none) */
    uint64_t load_step_bytes; /* what each of those steps added (the median) */
    bool pass_built;          /* rising steps over a working set with nothing freed: one pass */
    bool state_built;         /* the low points rose to the job's measured state and no further */
    bool since_step;          /* the second half of the rise came after the latest optimizer step */
    /* one generation building its KV cache: the adapter read a generation, what the running code holds is at
     * least half the rise; its numbers (per step, first and last low point) for the advice */
    bool gen_built;
    uint64_t gen_per_step, gen_first, gen_last;
    uint64_t state; /* that state (parameters, buffers, gradients, optimizer state, pools) */
    /* what the framework had allocated right after each of the latest optimizer steps (the adapter):
     * flat over >= 8 of them (no rise in most, within 1% of the device; or no rise in most and no trend, the later
     * half's low point above the earlier half's by less than growth_min of the device and the missing bytes: batches
     * of varying lengths): nothing was kept across those iterations, whatever the driver saw (the cache warming, a
     * one-off copy after them) */
    bool steps_flat;
    /* the optimizer made fewer steps than that series needs (1 to 3), or none yet (an Adam-like optimizer holds the
     * device's parameters and no state: its moments come at its first step), and the failure is in its training pass
     * (phase forward, backward or optimizer_step): what the driver saw rise is the model arriving, the first
     * passes, the state made at the first step and the pass running now; no iteration repeated enough to keep
     * anything across them */
    bool first_steps;
    /* the latest steps flat, the run's series a staircase (over_run) that what Python objects keep across calls
     * (roles: holders kept across calls, registry models) accounts for, at least 9/10 of its rise: held */
    bool kept_paused;
    /* a reading of the driver's held, and what rose is what torch.load restored onto the GPU and Python holds
     * (roles.restored_held >= 9/10 of the rise): a load arriving, not a leak; holds false */
    bool restored_load;
    /* a reading of the driver's held, and copies of one model run at once in this process (roles.concurrent_copies):
     * each loop's low point is no low point of the others, so the loops starting one after another read as a rise;
     * holds false */
    bool concurrent_loops;
    /* a reading of the driver's held, and what rose is one library's outside the framework (not NCCL's): the
     * adapter measured the framework, whose libraries hold less than the rise, and that library holds at least 9/10
     * of it, taken within one quarter of the run (by_library[].by_quarter): state it set up once (a context's
     * engines, a workspace per thread), not a leak of the framework's tensors; holds false, non_framework names it */
    bool library_setup;
    /* a reading of the driver's held in a training job on a PyTorch whose optimizer steps no adapter can read (before
     * 2.0: no step hook; facts: torch_version), failing in its training pass, and the adapter's finished scan found
     * Python holding under a tenth of the rise (locals and what is kept across calls), no second copy or map of
     * models and no outputs' graphs kept: what rose is the parameters, the gradients, the optimizer state and the
     * running pass's activations, each made once as the cache warmed (the driver sees a segment when the framework
     * needs one), not tensors kept across iterations; holds false */
    bool working_set;
    /* a reading of the driver's held, and what rose is the models' parameters (roles.params >= 9/10 of the rise) in a
     * job nothing says trains, Python keeping nothing across calls, no second copy of a model, no map of models by
     * key and no model with parameters still elsewhere: the weights arriving (a generation job loading its models),
     * not a leak; holds false.  Beside the parameters, what holders keep in a pool made within one step counts with
     * them (reserved_at_once: an engine's KV cache, four tensors or more, each larger than two typical steps' rise,
     * together no more than the largest step's) */
    bool weights_load;
    uint64_t reserved_at_once;
    /* the growth holds and what Python keeps across calls (roles.kept_across: holders kept across calls, a registry's
     * models) is at least 9/10 of its rise: where the rise went was measured, not read from the steps alone */
    bool kept_measured;
    /* the growth holds and copies of one model beyond the first (roles.model_copies) are at least 4/5 of its rise: a
     * model built anew each iteration while the earlier ones are kept */
    bool copies_kept;
    /* the growth holds and it is a cache filling to the bound the program names (roles.bounded: the growth's holder,
     * or holders at their bound keeping 9/10 of the rise): it stops there, no leak */
    bool bounded;
    /* read from the run's series (roles.allocated_over_run, every `every`-th optimizer step of the whole run): a
     * staircase, flat within an iteration of many optimizer steps and up between them, never down; steps, rising and
     * transitions then count the series' points and its rises */
    bool over_run;
    uint64_t every;
    int holder; /* OG_MARK_KEPT_RECORDS: the holder (index in roles.holders); -1 otherwise */
} og_growth_facts_t;

/* The load that the failing request may be part of (a run of equal allocations kept). */
typedef struct og_load_facts {
    enum og_load_phase phase;
    int run, earlier; /* allocations of the run, and of an earlier run of the same size */
} og_load_facts_t;

/* What a holder is kept for, as the program names it (common/purposes.def); OG_PURPOSE_NONE: nothing said. */
enum og_purpose {
#define OG_PURPOSE(name) OG_PURPOSE_##name,
#include "purposes.def"
#undef OG_PURPOSE
    OG_NPURPOSES,
    OG_PURPOSE_NONE = OG_NPURPOSES
};
enum og_purpose og_purpose_of(const char *name);

/* A holder's where (roles.holders[].where) names a local variable of a frame ("local in main (train.py:40)"), not an
 * attribute or a module's global: what lives while that frame runs, not what outlasts the call. */
#define OG_WHERE_LOCAL "local in "
static inline bool og_where_local(const char *where)
{
    return strncmp(where, OG_WHERE_LOCAL, sizeof OG_WHERE_LOCAL - 1) == 0;
}

/* What the failing operation is (roles.operation; common/operations.def); OG_OPERATION_NONE: not said. */
enum og_operation {
#define OG_OPERATION(name) OG_OP_##name,
#include "operations.def"
#undef OG_OPERATION
    OG_NOPERATIONS,
    OG_OPERATION_NONE = OG_NOPERATIONS
};
enum og_operation og_operation_of(const char *name);
const char *og_operation_name(enum og_operation op);

/* What the framework's allocated bytes are for (memory.framework.roles), as the advice reads them.
 * known = false: not measured (no adapter, a C program): every remedy keeps its unmeasured estimate. */
typedef struct og_role_facts {
    bool known;
    bool act_known;                           /* the activations role was measured (the scan finished) */
    uint64_t params, grads, opt, pools, held; /* roles; 0 when that role is unknown */
    uint64_t act;                             /* activations and temporaries (0 when unknown) */
    uint64_t opt_full; /* optimizer state not already 8-bit (its class says 8bit): what 8 bits shrink */
    bool opt_adam;     /* an Adam-family optimizer (two moments: 8 B per fp32 parameter) */
    /* optimizers' state not one value per element of its parameter (roles.optimizers[].not_elementwise_bytes:
     * preconditioner matrices of Shampoo or SOAP, projections); 0 none or not measured */
    uint64_t opt_shaped;
    /* gradients kept one per example (roles.per_sample_gradients_bytes: DP-SGD's grad_sample) and the examples
     * they hold (roles.per_sample_count, the physical batch); 0 none or not measured */
    uint64_t per_sample;
    int per_sample_n;
    /* LoRA adapters' parameters (roles.lora_parameters_bytes; 0: no adapter or not measured) and the other weights
     * that require grad (roles.lora_base_trainable_bytes): a LoRA model whose base was never frozen */
    uint64_t lora_params, lora_base_trained;
    /* adapters piled up: LoRA parameters at least half of the other weights, in a job with no gradient and no
     * optimizer state (one adapter is a few percent of its base; this is one per request or tenant, loaded and kept) */
    bool lora_piled;
    /* the models' embedding tables' parameters (roles.embedding_parameters_bytes; 0 none or not measured) and how many
     * tensors they are (roles.embedding_tables; 0 none or not measured) */
    uint64_t embedding;
    int embedding_tables;
    uint64_t opt_params;    /* parameters on the failing device that optimizers' param_groups hold (0: none or
                            unknown): an optimizer made for this model */
    bool dtypes_known;      /* roles.parameters_by_dtype was measured ... */
    uint64_t params_fp32;   /* ... and this many bytes of the parameters are float32 (0 when unknown) */
    uint64_t params_half;   /* ... and this many are bfloat16 or float16 (0 when unknown) */
    uint64_t params_fp64;   /* ... and this many are float64 (0 when unknown) */
    uint64_t params_8bit;   /* ... and this many are int8 or float8 (0 when unknown) */
    uint64_t params_packed; /* ... and this many uint8: 4-bit weights packed two to a byte (0 when unknown) */
    /* what 4-bit weights would free of the parameters (the quantization remedy's saving, its text and its estimate):
     * seven eighths of the float32 bytes, three quarters of the 16-bit ones, half the 8-bit ones, nothing of those
     * already packed in 4 bits (uint8) or of another dtype; three quarters of all when the dtypes were not measured;
     * 0 without roles */
    double quant_frees;
    /* of the listed holders' bytes, those in float64 tensors (roles.holders[].float64_bytes; 0 none or not read), and
     * the holder with most of them (index in roles.holders, -1 none): a numpy or pandas array copied as it was */
    uint64_t held_fp64;
    int fp64_holder;
    uint64_t local_held;  /* held_by_python holders that are local variables of running functions */
    uint64_t kept_held;   /* held_by_python holders kept across calls (every listed holder not a local) */
    uint64_t kept_across; /* kept_held and the registry's models (registry_models): what Python keeps across calls */
    uint64_t working;     /* act + local_held: the running computation's tensors */
    /* of local_held, the holders the failing statement reads by name that keep no autograd graph and copy no role
     * (images and targets handed to model(images, targets)): the pass's inputs, as the program holds them */
    uint64_t stmt_inputs;
    /* the failing statement assigns or reads a model's logits by name (`logits = logits.float()`, `lm_logits`,
     * `out.logits`): the vocabulary-wide scores of every position it was given */
    bool stmt_logits;
    char stmt_input_names[96];            /* their names, comma-separated, as many as fit */
    uint64_t purpose_bytes[OG_NPURPOSES]; /* held_by_python by what the holders' names say they keep */
    /* of them, holders of purpose dataset kept across calls (a global, an attribute; not a local of a running
     * function): a dataset kept whole on the device, and the largest such holder (index in roles.holders, -1 none) */
    uint64_t dataset_kept;
    int dataset_holder;
    /* of them, bit i: holder i is a data set by its records, not by its name (record_datasets) */
    unsigned records_dataset;
    /* the same for holders of purpose index (a retriever's vectors, a flat or FAISS index kept on the device): their
     * bytes and the largest one (index in roles.holders, -1 none) */
    uint64_t index_kept;
    int index_holder;
    /* a second copy of weights the program keeps on the device for good (facts.c: roles for holders, weights_copies
     * for models).  ema_kept: an
     * EMA or averaged copy (holders of purpose ema kept across calls, and models whose names or class say ema, none
     * running); its largest holder (ema_holder, index in roles.holders) and model group (ema_model, index in
     * roles.models), -1 none */
    uint64_t ema_kept;
    int ema_holder, ema_model;
    /* copies of the parameters or the optimizer state kept across calls for no purpose their names say (holders
     * with copy_of, not locals of the running code, purpose none): weight snapshots for averaging (LAWA, SWA
     * windows), a best model, a rollback point, in a list or dict of the program's; copy_holder the largest (index
     * in roles.holders), -1 none */
    uint64_t copy_kept;
    int copy_holder;
    /* a reference policy kept beside the trained model (preference tuning: models none running whose names say
     * reference, or a frozen model of the size of the trained model's frozen part while that model trains at most a
     * tenth of its parameters): its bytes, its group (reference_group, -1 none); reference_base: the trained model
     * trains at most a tenth of its parameters (adapters) and its frozen part is the reference's size (within a
     * tenth): the policy with its adapters disabled is that reference */
    uint64_t reference_copy;
    int reference_group;
    bool reference_base;
    /* whole sets of components loaded again: >= 2 frozen model groups each of the same count N >= 2, every model of
     * each held by one attribute name of N objects (self.unet on three pipelines): the copies beyond the first
     * (repeated_count - 1 of each), 0 none; repeated_group: the largest group's index in roles.models */
    uint64_t repeated_components;
    int repeated_count, repeated_group;
    /* a second set of components beside the program's own models: >= 2 frozen groups held by attribute names
     * (self.unet, self.text_encoder_2: a pipeline kept after it made its images) each of a class the program also
     * holds by another name (a group of the class within a tenth of its size, trained or not, or more copies in
     * the group than attribute names): the attribute-held copies' bytes (twin_components), those groups
     * (twin_groups) and the largest (twin_group, -1 none).  Such a group is no preference-tuning reference though
     * its size is the trained model's base */
    uint64_t twin_components;
    int twin_groups, twin_group;
    /* a trained model kept while another loads (phase loading): a group held by a name, not frozen, not running, of
     * a class no arriving group has, after training made optimizer state: its parameters, gradients and that
     * state (training is over: a merge, an export, an evaluation of another model).  Or while another trains, in
     * its first forward: a group held by a name, not frozen, not running, that an optimizer has stepped on
     * (roles.models[].stepped), while every running model is trained by optimizers that have not stepped on it
     * yet and none is a copy of it (class and size): a notebook's second experiment beside the first's model and
     * optimizer (a GAN's two models have both stepped after its first iteration).  trained_group its index in
     * roles.models, -1 none */
    uint64_t trained_kept;
    int trained_group;
    /* every name of the trained_group is an attribute of another object (trainer.model, pipe.model; not self.X, not
     * a bare name): the program's own names of it are gone (a `del model` that freed nothing), other objects keep
     * it alive */
    bool trained_by_others;
    enum og_purpose building; /* what the failing statement builds (roles.statement) */
    /* the sizes the failing statement read (roles.statement.ints, those >= 128): one of them twice
     * (seq * seq: quadratic in a length, attention scores), one of them three times or more (L * L * L:
     * cubic in a length, an operation over every triple of positions, as triangle attention's scores for
     * every row at once), or several, all different (users * items: a product of dimensions, a score matrix);
     * unknown otherwise */
    enum og_request_shape { OG_REQ_UNKNOWN, OG_REQ_SQUARE, OG_REQ_CUBE, OG_REQ_PRODUCT } request_shape;
    uint64_t copies;        /* held_by_python holders whose blocks copy the parameters or the optimizer state */
    uint64_t model_copies;  /* roles.models: the parameters of every model beyond the first of its class and size;
                               while a model is being built, of every trainable one of its class beyond the smallest */
    uint64_t frozen_models; /* roles.models: parameters of models none of whose parameters requires grad */
    /* roles.models: parameters of the running models (running > 0) whose parameters require grad but that no
     * optimizer trains (trained 0: a teacher deep-copied from the student, a target network); 0 (not known) when
     * the optimizers train more parameters than the models they train hold (a ZeRO partition, master weights) */
    uint64_t untrained_running;
    /* roles.models: parameters of the models whose names say reference or teacher (models[].purpose), whose
     * parameters require grad and that no optimizer trains (trained 0): each forward of theirs with autograd on
     * records a graph for nothing (ref_model.eval() turns off dropout, not autograd), running now or not */
    uint64_t untrained_ref;
    /* roles.models: parameters of the models whose parameters require grad, all in eval mode (models[].training 0),
     * that no optimizer trains: trained 0, or no optimizer at all in the process (roles.optimizers empty, trained
     * null); a backward through them fills a .grad nothing reads (an attribution, a saliency map). 0 none or not
     * known */
    uint64_t untrained_eval;
    bool state_known; /* every role a training job keeps for good was measured ... */
    uint64_t state;   /* ... params + buffers + grads + opt + pools: the job's own state */
    /* the failing statement copies a holder whole: it reads a name that holds tensors (the holder's name, or its
     * last attribute: self.bank_chunks -> bank_chunks) and the request is that holder's bytes within a tenth
     * (torch.cat(chunks), torch.stack(preds), chunks.clone()): both are on the device for its length; the holder's
     * index in roles.holders, -1 none (a holder of no purpose, no copy of a role, >= 256 MiB, outside a load) */
    int stmt_copies;
    /* the failing request is one big temporary of a computation outside any model: no parameters on the device,
     * no pass running (phase unknown, a Python stack read), the request at least an OG_BIG_REQ_DIV-th of the card,
     * the failing statement's sizes a product of two or the same size twice (rows x columns: a similarity, a
     * distance over a library), and the activations already holding 9/10 of it (the operation's earlier
     * temporaries): the operation's size, not a batch, is the peak (a chunk of rows x every column) */
    bool loose_operation;
    /* roles.holders[].restored_bytes: what torch.load restored onto the GPU (map_location not the CPU) of the
     * tensors Python objects hold, kept or local, and the holder with the most of it (index, -1 none) */
    uint64_t restored_held;
    int restored_holder;
    /* a holder of no purpose (or named a cache or a dataset) and no copy of a role that holds more than any role of the
     * framework (parameters,
     * gradients, optimizer state, graph pools, activations) and any other holder while a pass runs (phase forward,
     * backward, evaluation, generation), a local of code outside the running pass (a training loop's list in
     * main(); holders kept across calls have their own rows: kept_outgrows_cache); its index in
     * roles.holders, -1 none.  The largest thing on the device is what the program keeps there */
    int dominant;
    /* the bytes of one record of that holder where it is a collection of like records (roles.holders[].records, 2 or
     * more and fewer than a data set's, OG_RECORDS_MIN: a view's logits, a chunk's output); 0 otherwise */
    double dominant_record;
    int keeper; /* index in roles.holders of the largest holder kept across calls, -1 none */
    uint64_t keeper_bytes;
    bool keeper_map; /* that holder is a dict or another mapping/cache */
    int kv;          /* index in roles.holders of the largest holder kept across calls whose purpose is kv_cache
                        (its type or name: StaticCache, past_key_values, kv), -1 none */
    uint64_t kv_bytes;
    uint64_t local_map; /* held by locals of running functions that are dicts (a state_dict being copied) */
    uint64_t local_kv;  /* held by locals of running functions whose purpose is kv_cache: a decoding loop's own cache */
    int num_beams;      /* the beam width of the generation running at the failure (roles meta); 0 unknown */
    uint64_t gen_inputs;   /* roles.generation_input: how many inputs the running generate() call decodes at once (its
                            input's leading dimension); 0 unknown */
    bool gen_fixed_inputs; /* ... and each is of a size the model's processor fixes, with no token axis of its own
                              (pixel_values, input_features, or an input of four dimensions or more: images,
                              frames): what grows with the call is the number of inputs, not a length */
    int attention;         /* the models compute attention: 1 (roles.attention_modules > 0, the failing operation is
                           attention, or a generation or a KV cache: decoding), -1 the walk of their layers met none,
                           0 unknown */
    int checkpointing;     /* roles.gradient_checkpointing: 1 in force for the failing pass, -1 off, 0 unknown */
    int batch_size;        /* roles.batch_size: the batch the program names for the failing pass; 0 unknown */
    bool batchless_sizes;  /* the failing statement's int operands are known, one at least a dimension (>= 128),
                               and none is the batch size (> 1): the failing tensor is one sample's, it does not
                               shrink with the batch (box IoU of one image's anchors x boxes) */
    /* the request is the failing statement's sizes and nothing else (the product of its int operands, one a dimension
     * >= 128, two or more of them, times 1, 2, 4 or 8 bytes, is the request less its rounding, under 2 MiB) and no name it reads is a batch's: one prompt's
     * heads x length x length scores, one photo's channels x height x width; no batch is among its factors */
    bool sizes_make_request;
    bool autocast_code; /* roles.autocast_in_code: the program's running code enters autocast (false: not said) */
    bool backward_code; /* roles.backward_in_code: the program's running code calls backward (false: not said) */
    bool input_grad;    /* roles.input_requires_grad: the program asks for the gradient of the model's input */
    /* roles.backward_on_stack false: the failing stack was read and no frame on it, the program's or a framework's,
     * calls backward or autograd's grad: the pass feeds no backward (false: it does, or not read) */
    bool no_backward;
    bool scaler_only;    /* roles.scaler_without_autocast: a GradScaler, autocast named nowhere in the program */
    uint64_t steps_made; /* roles.optimizer_steps: the steps the optimizer made before the failure; 0 none or
                              unknown (steps_known says which) */
    bool steps_known;
    uint64_t model_params; /* roles.models: the parameters of every model (each group's times its count); 0 none */
    uint64_t model_away;   /* roles.models: their parameters not on the failing device (parameters_elsewhere_bytes) */
    /* roles.models: the parameters of the models at least 9/10 float32 (parameters_float32_bytes), beside another
     * model under half float32 (one loaded in bf16/fp16 or quantized): a model loaded in its default float32 next to
     * one loaded in half precision (a draft beside its target, a VAE or encoder beside a half-precision model), and
     * the largest such group (index in roles.models, -1 none) */
    uint64_t fp32_beside_half;
    int fp32_group;
    /* roles.models: a quantized model (half its parameters or more in 8 bits or fewer, parameters_quantized_bytes)
     * beside a model of the same class with none quantized: the program compares a quantized model with its
     * reference (an int8 export checked against the bf16 original, a perplexity or KL gate), and quantizing the
     * reference would change what it measures.  The reference's parameters (0: no such pair) and the two groups, the
     * quantized one and its reference (indexes in roles.models, -1 none) */
    uint64_t quant_reference;
    int quant_group, quant_ref_group;
    /* a copy of a model being made that no module holds yet (copy.deepcopy building its parameters one by one):
     * parameters beyond every model's (when models were measured) and gradients beyond them too */
    uint64_t copy_loose;
    /* optimizers' param_groups hold more parameters than every model has (opt_params > model_params): the optimizers
     * train parameters of their own beside the models (fp32 master weights), and opt_params of the parameters (and
     * of the gradients) beyond the models' are theirs, not a copy; 0 otherwise */
    uint64_t master;
    /* the optimizers train mostly tensors of no model: their parameters are at least 4x every model's (more than
     * fp32 master weights or a ZeRO partition of them could be): an explainer's masks (a mask registered on a layer
     * counts as that model's), an input optimized through a fixed model, a prompt's embeddings; opt_params, 0
     * otherwise. Their backward runs through the models: autograd is the job */
    uint64_t opt_outside;
    uint64_t copying; /* what the running code's copy holds so far: working + copy_loose */
    /* nothing computed yet: a model of roles.models is running (its .to() or __init__ executes) while all the
     * framework holds on the device is weights: the activations measured and none, no tensors held by Python
     * objects (locals included), no gradients, optimizer state or graph pools: its weights arriving, a load or a
     * move that no phase frame names */
    bool weights_only;
    bool accumulating;  /* roles.accumulating: the program sums several passes' losses with their graphs alive */
    bool pads_to_max;   /* roles.padding_to_max_length: the program pads its inputs to a fixed maximum length */
    bool extra_outputs; /* roles.extra_outputs: the program asks a model for per-layer or per-token outputs */
    uint64_t act_copy;  /* of the activations, blocks that copy the parameters or the optimizer state (the adapter's
                          roles.activations_copy_of: a copy no named object holds yet), 0 none */
    uint64_t act_copy_source; /* the bytes of the role it copies (the parameters or the optimizer state); 0 none */
    /* holders kept across calls (not locals of running code) that reached the bound the program names for them
     * (roles.holders[].bound_bytes, bound_records: at least 9/10 of it): an LRU at its budget; the largest's index in
     * roles.holders (-1 none) and their bytes */
    int bounded;
    uint64_t bounded_bytes;
    int grower; /* index in roles.holders of the largest holder (kept across calls or a local of a running
                           loop) holding at least half of what the growth's steps kept (the median rise per step
                           times the steps), -1 none or no growth */
    uint64_t grower_bytes;
    enum og_operation operation; /* what the failing operation is (roles.operation), OG_OPERATION_NONE unknown */
    /* models the running code holds by a name beside another of their class (roles.models: named, running): the
     * parameters of every such model but one per class, when the program holds them on purpose (a local, a
     * global, an attribute), not a leftover; a model whose name the failing statement is about to rebind is a
     * previous copy (a cell run again), not one of these.  0 none or not measured */
    uint64_t named_copies;
    /* while a model arrives (phase loading, roles.arriving), a model of another class that the running code holds
     * by a name, none of whose methods runs, not rebound by the failing statement (a generation engine kept after
     * its work while the scorer loads: vLLM's LLM as `llm`, then a reward model), with what holders of that name
     * keep beside it (the engine's KV cache): what freeing that name gives back.  other_group: its index in
     * roles.models, -1 none */
    uint64_t other_resident;
    int other_group;
    /* of model_copies, the models of a group apart (another size) that no name of the running code reaches and
     * that do not run, beside one of their class that a name holds or that runs: a previous fold's or trial's, kept
     * by a reference cycle or a callback, not a cell run again; 0 none */
    uint64_t unreached_copies;
    /* models of one class (a group of roles.models) of which two or more copies run at once (models[].running >= 2:
     * each `self` of a running frame, threads of one process each running its own loop: Optuna's n_jobs trials, a
     * thread per request): the copies beyond the first, a model's parameters each; they are the job's concurrent
     * loops, not leftovers (counted in no model_copies).  concurrent_runs: how many run at once (the largest such
     * group's running), concurrent_count: its copies, concurrent_group: its index in roles.models, -1 none */
    uint64_t concurrent_copies;
    int concurrent_runs, concurrent_count, concurrent_group;
    /* roles.models: a registry of whole models, one group of >= 2 models of a class that the running code
     * holds only through a map, by key (every name NAME[key]: a dict of models per tenant, an LRU of them);
     * its parameters, counted in neither model_copies nor named_copies; 0 none.  registry_group: its index
     * in roles.models, -1 none */
    uint64_t registry_models;
    int registry_group;
    /* roles.models: different models held by key in one process, idle: groups whose every name is a map's entry
     * (NAME[key]: MODELS["asr"], MODELS["llm"]) and none of whose models runs at the failure (no __init__,
     * from_pretrained or .to() of theirs executes), not a registry group above; their parameters when there are
     * >= 2 such models (one model by key is a name, not a map of models), else 0.  keyed_count: how many;
     * keyed_group: the largest one's index in roles.models, -1 none */
    uint64_t keyed_models;
    int keyed_count;
    int keyed_group;
    /* a checkpoint held beside the state it was loaded into: holders (wherever kept, a local of main() too) whose
     * name or class says checkpoint (roles.holders[].purpose: ckpt, checkpoint, state_dict) and whose blocks copy
     * the parameters or the optimizer state (copy_of): their bytes, 0 none; ckpt_holder: the largest one's index
     * in roles.holders, -1 none */
    uint64_t ckpt_copy;
    int ckpt_holder;
    bool named_frozen;    /* those models are frozen (a teacher, an EMA): kept beside the trained one on purpose */
    uint64_t ddp_buckets; /* roles.ddp: DDP's flat bucket copy of the gradients (gradient_as_bucket_view off), 0 none */
    /* a deep copy under way (roles.copy_made_bytes): what it made so far on the failing device; known false: no
     * copy.deepcopy ran at the failure (or the adapter did not read it) */
    bool copy_made_known;
    uint64_t copy_made;
    /* the same copy's pieces: copy.deepcopy makes a model's submodules before the model holds them, so while it runs
     * the copies in groups of roles.models no name reaches (named 0), up to copy_made, are that copy, not a previous
     * one; removed from model_copies.  0 none, or no copy under way */
    uint64_t copy_pieces;
    /* graphs kept by outputs of earlier batches: autograd on in an evaluation or a generation (no backward comes to
     * free a graph), the activations measured, and a holder kept across calls (a global, an attribute: not a local
     * of the running code) with no purpose of its own (not a dataset, a cache, an EMA: roles.holders[].purpose) and
     * no copy of a role holds >= 2 tensors, its own bytes below the activations: each of its tensors (a loss, the
     * logits of a batch appended to a history) is the root of its batch's graph, every activation of that batch
     * alive through it.  graph_holder: that holder (index in roles.holders, the one with the most tensors; -1
     * none); kept_graphs: the activations but the running batch's share, act x n / (n + 1) for n kept tensors.
     * Or, measured, in any phase but backward: a holder (a running loop's local list too) at least 2 of whose
     * tensors read have their graphs alive (roles.holders[].graphs; never a module's own locals), the program not
     * summing losses for one backward (roles.accumulating): a rollout collected with autograd on, a hidden state
     * carried without detach.  graphs_measured: the holder was found so */
    int graph_holder;
    /* a cache of forward outputs with their graphs alive for the backward the running code calls later: a holder of
     * purpose cache (a pipeline stage's fwd_cache) with >= 2 like records and >= 2 graphs alive, in a forward pass
     * whose stack calls backward (roles.backward_on_stack): a fill-and-drain schedule keeps every micro-batch's
     * activations until its backward (index in roles.holders; -1 none) */
    int graph_cache;
    uint64_t kept_graphs;
    bool graphs_measured;
    bool graphs_history; /* that holder is IPython's output history (holders[].purpose output_history: Out, _5) */
    /* the failing operation is a copy (roles.operation copy) and the failing statement rebinds a name that holds a
     * model now (roles.models[].names: ref = copy.deepcopy(policy) while the previous ref lives): that model's
     * parameters, the copy the new one replaces; 0 none */
    uint64_t copy_replaces;
    /* the same copy's source, when the failing statement reads a name of a model (roles.models[].names, not the
     * name it rebinds): that model's parameters, what the whole copy needs; 0 not known.  copy_source_group: its
     * group (index in roles.models), -1 not known */
    uint64_t copy_source;
    int copy_source_group;
    /* while a model is being built (phase loading): the parameters the models running now hold (roles.models
     * running: their __init__, from_pretrained or .to() executes), what the load made so far; 0 none */
    uint64_t arriving;
    /* of those, the parameters in float32 (roles.models[].parameters_float32_bytes); arriving_fp32_known false when
     * nothing arrives or a group of them was not read */
    uint64_t arriving_fp32;
    bool arriving_fp32_known;
    /* the layers a forward pass has still to run (roles.failing_layer: it failed in layer layer_index of a run of
     * layer_count >= 4 like layers, the run's first, failing and last layers of one size: alike), with autograd on and checkpointing not on (each layer keeps its activations for
     * backward), in a training's first pass (roles.optimizer_steps a measured 0: no pass of the job ended, nothing
     * else bounds this one) of one loss (not accumulating: the activations of earlier passes kept for a summed loss
     * are no layers of this one): the activations made so far, in layer_index + 1 layers, times the
     * layer_count - layer_index - 1 it has not reached; 0 when any of it is not measured */
    uint64_t layers_to_come;
    int layers_left; /* layer_count - layer_index - 1 of them, when layers_to_come is not 0 */
    /* a holder that keeps one record per layer the running pass has run (roles.holders[].records equal to the layers
     * before the failing one, or with it: roles.failing_layer, a run of >= 4 like layers of one size, the failing one
     * neither the first nor the last), in a pass (phase forward, backward, evaluation, generation): a prefill's
     * per-layer keys and values, a hook keeping each layer's output.  layer_holder its index in roles.holders (-1
     * none); layer_holder_to_come the records the layers still to come would add, at its bytes per record */
    int layer_holder;
    uint64_t layer_holder_to_come;
} og_role_facts_t;

/* the LoRA adapters' parameters over the models' other weights (roles.lora_parameters_bytes against the rest of the
 * parameters); 0 when no adapter or nothing else was measured */
/* The optimizer state an 8-bit optimizer would shrink: what is not already 8-bit (opt_full), or, in the optimizer's
 * step (IN_STEP) of an Adam-like optimizer or one not yet holding state, twice the parameters it is about to make at
 * its first step when that is more */
static inline double og_state_to_shrink(const og_role_facts_t *k, bool in_step)
{
    double st = (double)k->opt_full, first = 2.0 * (double)k->params;
    return in_step && (k->opt_adam || !k->opt) && first > st ? first : st;
}

/* The bytes of one value of that state: PyTorch keeps the state in each parameter's dtype, so Adam's two moments
 * (one for others) take as many values as the parameters have, each as wide as its parameter
 * (roles.parameters_by_dtype: 4 for float32, 2 for a bf16 model), or wider where the state measured says so (float32
 * moments of bf16 weights); 4 when the dtypes were not measured */
static inline double og_state_value_bytes(const og_role_facts_t *k, bool in_step)
{
    double st = og_state_to_shrink(k, in_step);
    double values = k->dtypes_known ? (double)k->params_fp32 / 4 + (double)k->params_half / 2 +
                                          (double)k->params_fp64 / 8 + (double)k->params_8bit
                                    : 0;
    if (values <= 0 || st <= 0)
        return 4;
    double each = st / ((k->opt_adam || !k->opt ? 2 : 1) * values);
    return each < 1 ? 1 : each > 8 ? 8 : each;
}

static inline double og_lora_ratio(const og_role_facts_t *k)
{
    return k->lora_params && k->params > k->lora_params ? (double)k->lora_params / (double)(k->params - k->lora_params)
                                                        : 0;
}

/* A peak from one batch: the failing request (and the equal allocations just before it) is a size the
 * history never saw, at least 4x the largest allocation before it, after earlier steps freed memory; or, where
 * the batch made other new sizes before the request, at least 4x the largest allocation before those. */
typedef struct og_outlier_facts {
    bool holds;
    uint64_t prev_max;  /* the largest allocation before the failing run */
    uint64_t run_bytes; /* the failing run of that new size, kept, the request included */
    int run;
    /* read through the failing batch's own new sizes (the allocations just before the run, of sizes the history
     * never saw, none larger than the request): prev_max is the largest allocation of the earlier steps */
    bool batch_sizes;
    /* read through the whole pass: after 8 or more optimizer steps, what is allocated now and the request are at
     * least 3x the most the history held before its last release to the driver (held_before), both above what was
     * left after that release (floor: the state the steps keep) */
    bool pass_peak;
    uint64_t held_before, floor;
} og_outlier_facts_t;

/* One process driving several GPUs. */
typedef struct og_imbalance_facts {
    bool holds;
    uint64_t mine, avg; /* the failing GPU's tracked bytes, the others' average */
    int nother;
    double ratio; /* mine / the most of any other */
} og_imbalance_facts_t;

/* Another GPU this process could place work on (one process, not a distributed job, that sees >= 2 GPUs).
 * idle: a visible GPU where this process holds nothing and never held anything (what other processes hold
 * there is not measured); failing that, the GPU it uses that holds the least when that is a small fraction of the
 * failing GPU's bytes (at most 1/8: a feature bank, a metric's buffers), and models can move there (the frozen ones
 * and those held beside another of their class, not every model: another one stays) and its room holds them and
 * the missing bytes: nearly idle, a GPU to move a model onto (one model alone split by a device_map is not).  split: a GPU it uses
 * besides the failing one that holds less than the parameters on the failing one (a DataParallel replica holds
 * them all: not a replica), more than that small fraction (not nearly idle), and has room for the missing bytes:
 * the failing card's size less what this process holds there and a context (the record measures the failing
 * card's size only: the cards of one machine are taken to be alike). */
typedef struct og_spare_facts {
    bool idle;
    int idle_device;               /* the lowest untouched GPU's index, else the nearly idle one; -1 none */
    uint64_t idle_held, idle_room; /* what this process holds there (0: untouched), the room left there */
    bool split;
    int device;          /* the GPU it uses that holds the least, -1 none */
    uint64_t held, room; /* what it holds there, the room left there */
} og_spare_facts_t;

/* Which card sizes the job fits: what a card must hold on the failing device, and whether that is a
 * bounded peak (known) or only a lower bound (the job grows, or failed before its need was seen). */
typedef struct og_fit_facts {
    bool bounded;        /* `need` is the job's peak: fits/does not fit can be said for any card */
    uint64_t need;       /* the peak (bounded) or at least this (not bounded) */
    uint64_t card_floor; /* a card of at most this size never fits (the failing device's size; 0 none) */
    char why[128];       /* why the peak is not bounded ("" when it is) */
} og_fit_facts_t;

typedef struct og_facts {
    /* thresholds in force (validated; defaults for a missing or invalid value) */
    double frag_share, nonfw_share, growth_min_share, growth_rising_steps;

    /* the request and the device */
    uint64_t req;   /* the API's argument: SIZE_MAX and 0 are requests like any other; 0 when not known */
    bool req_known; /* a failure an adapter reported without its size: no shortfall, no "covers", no "fits" */
    bool recovered;
    uint64_t total; /* 0 when unknown */
    bool limited;
    uint64_t limit, usage_lim; /* OOMGUARD_LIMIT and what it counts */
    og_qty_t phys_free;        /* the device's own free bytes */
    bool free_known, free_estimated;
    bool shortfall_known; /* free known (or estimated): else `shortfall` is 0 and no figure */
    uint64_t free_eff, shortfall, capacity;
    bool larger_than_device;

    /* this process and the others */
    uint64_t tracked;
    bool tracked_known; /* the ledger's total was measured (a failure recorded alone has none) */
    bool used_known;
    uint64_t used, footprint;
    uint64_t other_all, other, peers_bytes;
    int npeers, nothers, nchildren; /* nchildren: children of this process without a rank of their own (workers) */
    /* of npeers, the other worlds' ranks of a nested launch (nested_launchers): unreadable processes, one per other
     * srun task on the node */
    int nworld_peers;
    int nchild_programs; /* of the children, those running another program (memory.other_processes[].other_program) */
    bool child_programs; /* every peer is such a child: programs this process started (an evaluation per epoch) */
    /* of the children, those the adapter listed as this process's multiprocessing children (roles.child_processes)
     * with a name the code that started them gave them (a dask-cuda Nanny's worker, a Pool's): not a DataLoader's
     * workers, which keep the default name; a child not listed, or listed with the default name, may be one */
    int nchild_own;
    bool own_children;       /* every peer is a child known to be no DataLoader worker (nchild_own == npeers) */
    int own_child;           /* the largest of those (memory.other_processes index); -1 none */
    int nsiblings, nparents; /* peers that are workers of the same parent (a pre-fork server) or its master */
    /* every peer is this process's parent, and this process is no rank: a program the job's own process started on
     * the parent's GPU (an evaluation child beside its trainer) */
    bool parent_only;
    /* the GPU of the models the failing statement reads, another than the failing one (roles.statement_model_device:
     * the statement makes its tensor away from its model); -1 none or not read */
    int model_gpu_elsewhere;
    bool peers_small, other_inferred;
    /* of `other`, processes that run this program with another command line (memory.other_processes[].same_program):
     * other instances of it set up otherwise (a second server), not strangers; their bytes and the largest's index */
    uint64_t other_same_program;
    int same_program_big;
    bool wrong_device; /* LOCAL_RANK names another visible GPU than the failing one */
    /* ranks of this job on this machine: LOCAL_WORLD_SIZE (torchrun's) times the launchers of its allocation with a
     * rank on the failing GPU (this one and other_processes[].same_allocation: srun around torchrun starts one per
     * task), else this rank and the peers of its job on the failing GPU that carry a rank (not its children, its
     * parent or a pre-fork server's workers); 0 when this process is no rank (no RANK, WORLD_SIZE <= 1) */
    int node_ranks;
    /* this rank is torchrun's (LOCAL_WORLD_SIZE > 1, TORCHELASTIC_RUN_ID) inside one of SLURM_NTASKS_PER_NODE > 1
     * tasks srun started on this node (SLURM_PROCID): srun around torchrun, one world per task; that many launchers,
     * 0 none */
    int nested_launchers;
    /* node_ranks > the visible GPUs (>= 1) and another rank of this job on the failing GPU (or, with nested launchers,
     * other processes on it whose identity could not be read): the launcher started more
     * ranks than the machine has GPUs, so some share one (local_rank % device_count()), whatever set_device selects */
    bool ranks_outnumber_gpus;

    /* frameworks */
    int failing_fw; /* 1 the failing library is a framework's, 0 not, -1 cannot tell */
    int ffw;        /* enum og_framework of the failing call */
    const char *fwname;
    uint64_t resv[OG_NFW], fw_resv_all;
    uint64_t
        other_fw_unlisted; /* others' bytes their adapters read beyond any framework library's (non_framework excludes them) */
    int other_fw;          /* the largest reservation of another framework than ffw, -1 none */
    uint64_t other_fw_bytes;

    /* the failing framework's cache */
    bool cached_known, retried;
    enum og_cache_src cached_src;
    uint64_t cached, reclaim, reservation, released;
    /* of the framework's reserved-but-unallocated bytes, what is idle in CUDA-graph private pools at least (their
     * reservation less every allocated byte but the parameters and buffers): reserved for the graphs' replays, so
     * not in `cached` (no other request can use it, no empty_cache releases it); 0 without private pools */
    uint64_t pool_idle;
    bool largest_known;
    uint64_t largest, app_slack;
    bool app_pool_covers; /* the application's own pool keeps at least the shortfall */
    int distinct_sizes;   /* distinct allocation sizes (to 1 MiB, at most 64) in the history */

    /* a framework-imposed cap (memory fraction, set_limit) the adapter reported */
    struct og_cap_facts {
        bool binds; /* counted + request exceed it, and the framework refused or the device had room */
        uint64_t cap, req, alloc, over; /* req, over: 0 when the request's size is not known */
        bool req_known;
        bool reserved;    /* the cap bounds what the framework reserves (PyTorch, CuPy), not what is in use */
        uint64_t counted; /* what the cap counts: reserved bytes, or allocated (JAX, TensorFlow: in use) */
        bool room;        /* the device itself had room for the request */
        bool beyond_card; /* in use + the request exceed the device's capacity: no cap lets it through (binds false) */
    } cap;

    /* patterns in the history and across devices */
    og_fit_facts_t fit;
    og_growth_facts_t growth;
    og_load_facts_t load;
    og_imbalance_facts_t imbalance;
    og_spare_facts_t spare;
    bool nonfw_holds; /* memory outside the framework explains the shortfall */
    /* the CUDA contexts this process holds on the failing device (memory.contexts_made + its primary one; -1
     * unknown), and what those beyond the first hold: the context estimate x (contexts - 1) / contexts, every context
     * about as large as another (0 with fewer than two, or no estimate) */
    int contexts;
    uint64_t contexts_extra;
    uint64_t nonfw;    /* non_framework_bytes, 0 when unknown */
    int nonfw_big_lib; /* index in by_library of the largest non-framework library, -1 none */
    /* that library (not NCCL: comm_lib's rules) took its live memory across the run, not at one time: at least
     * NONFW_BUILT_QUARTERS of the run's quarters (by_library bytes_by_quarter) each hold an eighth of its bytes or
     * more. Objects of that library made one after another and all still alive (a pipeline, plan, engine or index
     * made per size, per call or per epoch, kept in a dict or list), or a leak inside the library: what is measured
     * does not tell which. nonfw_before_last: of its bytes, those taken before the run's last quarter (the older
     * objects'; the newest may be in use); 0 when not so */
    bool nonfw_built_up;
    uint64_t nonfw_before_last;
    /* a comprehension of the program's is on the failing stack (Python up to 3.11 runs each in a frame of its own:
     * <listcomp>, <dictcomp>, <setcomp>, <genexpr>): its index in memory.framework.python_stack (innermost first),
     * -1 none. The running code makes one result per item and keeps them all until it ends (every frame of a batch
     * converted at once): a working set still building, like a pass's */
    int comprehension;

    /* what the job was doing, what its memory is for (the Python adapter; unknown without it) */
    enum og_job_phase phase;
    /* a generation running: the phase generation, or a forward or evaluation whose running code keeps a KV cache
     * in a local (a hand-written decoding loop: roles.local_kv) */
    bool decoding;
    /* loading a checkpoint: torch.load (torch/serialization.py) on the failing stack, or the failing
     * statement builds what the program calls a checkpoint (roles.statement.purpose) */
    bool load_via_torch_load;
    /* phase loading decided by a frame named dequantize*: full-precision weights made of quantized ones
     * (transformers' model.dequantize(), dequantize_and_replace) */
    bool load_dequantizes;
    /* a checkpoint being made, not restored: the adapter's phase `loading` came from the failing statement
     * alone (it builds what the program calls a checkpoint: snapshot = {k: v.clone() for k, v in
     * model.state_dict().items()}), torch.load is not on the stack and the optimizer has stepped; the phase
     * is then read as unknown, and the running code's tensors (a comprehension's are no holder's: activations) are
     * the copy so far (roles.copying) */
    bool snapshot_stmt;
    og_role_facts_t roles;
    /* the job trains: 1 (an optimizer step ran; the roles hold gradients or optimizer state; an optimizer
     * holds parameters of the failing device; the failing stack was in backward or an optimizer step),
     * -1 known inference only (the adapter's training -1), 0 unknown; trains_why: which evidence said so */
    int trains;
    const char *trains_why;
    /* PyTorch's version as its adapter reported it (memory.framework.source, "torch 1.13.0"): major * 100 + minor; 0
     * unknown (no adapter, another framework).  What the version lacks is not measured: before 2.0 no optimizer step
     * hook (roles.optimizer_steps), before 2.1 no expandable_segments */
    int torch_version;
    /* a pass still building (forward, backward, evaluation, generation; an optimizer's first step: the state it
     * made so far) holds at least 3x the cache (and the request), the cache under frag_share of the reservation:
     * it cannot carry the pass; or a pass asks for at least an eighth of the device, its activations already hold
     * about as much, and the free memory with a defragmented cache would leave less than the request after it: the
     * next tensor of that size has no room; or a load whose weights already hold nine tenths of the card or limit
     * (load_fills_card): whatever is left to load, the job on them has no room, and no layout of the cache makes it */
    bool pass_outgrows_cache;
    bool load_fills_card;
    /* ... not read for a pass building when the run held as much at once before (held_before): the framework's peak
     * allocated (PyTorch's allocated_bytes.all.peak) is at least what is allocated now and the request, so what this
     * pass needs so far was there, live, at one time; the pieces, not the total, are what it lacks.  Not for a
     * generation building step by step (growth.gen_built): its length is its output's, and an earlier one's peak,
     * of another length, does not bound it */
    bool held_before;
    /* a forward pass or an evaluation failing in a measured layer (roles.failing_layer: layer i, from 0, of a run of
     * n >= 4 like layers; checkpointing not in force, whose backward recomputes whole layers): what it has left to
     * make, the request (the failing layer's next tensor) and the n - i - 1 layers after it at what each of the
     * i + 1 so far made (the activations over i + 1), one layer's more where a backward follows (it frees each
     * layer's activations as it makes that layer's gradients, so one layer's temporaries come on top), and what a
     * holder keeping a record per layer will add (layer_holder_to_come); not beside copies of a model beyond the
     * first holding the shortfall (model_copies: a previous fold's model took the room).  Set only where it is less
     * than the pass's working set: a pass past its middle, for which what it made so far overstates what is to
     * come.  Then it, measured, decides pass_outgrows_cache: the pass outgrows the cache when its rest is more than
     * the free memory and the whole cache together (the cache under frag_share of its reservation), and fits them,
     * defragmented, otherwise.  pass_rest_layers: n - i - 1, the layers after the failing one; 0 when not set */
    uint64_t pass_rest;
    int pass_rest_layers;
    /* the failure is inside a pass still building (phase loading, forward, backward, evaluation, generation or
     * optimizer_step: more requests follow) and the other processes hold under 1/16 of the device (a desktop
     * session, a monitoring agent): their bytes may cover this one request, not the rest of the pass, so the job
     * alone is not known to fit and stopping them is not the fix */
    bool others_sliver;
    /* the failing request is an attention's scores: the failing statement read one length twice (request_shape
     * square: seq x seq) in models that compute attention (roles.attention 1), inside a pass (forward, backward,
     * evaluation, generation), at least an OG_BIG_REQ_DIV-th of the device.  Eager attention holds the scores and
     * their softmax at once (in float32, twice their size), and every layer makes its own: the pass's next requests
     * are at least as large, so room for this one request carries it no further; other processes' bytes below the
     * shortfall plus another such request (others_short_of_scores; not for a request larger than the device, which
     * no other process's bytes could hold) are not what the pass lacks */
    bool scores;
    bool others_short_of_scores;
    /* the same for an optimizer step still making an Adam-family state: what it has yet to make (2x the parameters
     * its optimizers hold, less the state made so far) is that many times the cache; 0 not so */
    uint64_t state_to_come;
    /* the same for the first step of an optimizer that is not Adam-like (the adapter saw it make no step): the state
     * it made so far, all of it by this step (how much more is to come is not known); 0 not so */
    uint64_t first_step_state;
    /* the same for a deep copy under way (roles.operation copy): what it made so far (roles.copy_made_bytes) is at
     * least 4x the cache (and the request), the cache under frag_share of the reservation: the cache would carry
     * the copy a few tensors further, not through it */
    bool copy_outgrows_cache;
    /* ... or, outside a deep copy, a copy of a role being made (roles.act_copy) whose rest (act_copy_source less
     * act_copy) exceeds the cache and the free memory together: the copy cannot finish however the cache is laid out */
    bool role_copy_outgrows;
    /* phase ema_update: the new copy an out-of-place update makes, the trained weights (the optimizers' parameters;
     * without an optimizer, every model's); 0 when the phase is another */
    uint64_t update_copy;
    /* the same for memory that rose step after step (growth.holds): the rise is at least PASS_OVER_CACHE times the
     * cache (and the request), the cache under frag_share of the reservation: defragmented, the splinters would carry
     * the rise a step or two further; what keeps rising is the cause */
    bool growth_outgrows_cache;
    /* the same for tensors Python objects keep across calls (roles.kept_across: a metric's lists, a dataset or cache
     * kept on the device, the models a registry or an lru_cache keeps by key), outside a load (a load's own reading: pass_outgrows_cache): they are at least
     * PASS_OVER_CACHE times the cache (and the request), the cache under frag_share of the reservation:
     * defragmented, the splinters would give the job a few more allocations beside what is kept, and what is kept
     * is what took the room */
    bool kept_outgrows_cache;
    og_outlier_facts_t outlier;
    /* a collective-communication library (NCCL): its index in by_library (-1 none), bytes, and
     * whether the failing call was its own */
    int comm_lib;
    uint64_t comm_bytes;
    bool comm_failing;
    /* growth holds and is that library's: it holds all of the rise, or the steps are its own
     * allocations (the failing call is its, marked by the failing size) and it holds their steady
     * part (the median rise per step over every step, give or take a fifth; one-off jumps such as the
     * framework's cache warming are not its) */
    bool comm_holds_growth;
    /* NCCL's settings in force (the captured environment): NCCL_BUFFSIZE in bytes (0 unset or unreadable) and
     * NCCL_MIN_NCHANNELS (0 unset); of comm_bytes, what a buffer size above NCCL's 4 MiB default adds:
     * comm_bytes x (1 - 4 MiB / NCCL_BUFFSIZE) (0 none: unset, at or below the default, or no NCCL memory) */
    uint64_t comm_buffsize;
    int comm_min_channels;
    uint64_t comm_setting_excess;

    /* what the advice reads (its definitions, kept apart where they differ from the causes') */
    struct og_advice_facts {
        int fw;         /* the failing library's framework by name, else the record's */
        uint64_t other; /* others' bytes, without this job's ranks; inferred without NVML */
        bool other_inferred;
        bool cached_known, cache_retried;
        uint64_t cached, reclaim;
        bool live_known;
        uint64_t live;
        bool retried_zero;  /* released its cache, got 0 B back, failed again */
        bool async_backend; /* PyTorch's backend:cudaMallocAsync */
        bool cc_known;
        int cc;                       /* major * 10 + minor */
        int grad, training, autocast; /* adapter evidence, 0 unknown */
        char fail_lib[64];
    } adv;
} og_facts_t;

#endif
