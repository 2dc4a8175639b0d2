/* Remedies, shared by their texts (remedy_texts.c) and their ranking (remedy_rank.c).  Pure. */
#ifndef OG_REMEDIES_H
#define OG_REMEDIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "record.h"
#include "advice_text.h"
#include "facts.h"

/* Where a remedy can help at all (the catalog's `applies`; the ranking's `fit` pass reads it):
 *   AP_ANY           any job
 *   AP_TRAINING      a job that trains: it shrinks gradients, optimizer state or what backward keeps;
 *                    not for a job known to be inference only
 *   AP_NOT_TRAINING  a job not known to train (weights quantized in place are frozen: QLoRA is `lora`)
 *   AP_ACTIVATIONS   the failing code makes activations: not while loading weights, stepping the
 *                    optimizer or updating weights outside it, when the roles were measured
 *   AP_BACKWARD      autograd keeps something for backward: not with autograd off at the failure
 *   AP_ATTENTION     the models compute attention: not where the walk of their layers met none (roles
 *                    attention_modules 0) and the failing operation is not attention
 *   AP_MODEL_STATE   the job keeps a model's state on the device: not where every role of it was measured
 *                    (parameters, buffers, gradients, optimizer state, graph pools) and none holds a byte */
enum og_applies {
    AP_ANY = 0,
    AP_TRAINING = 1 << 0,
    AP_NOT_TRAINING = 1 << 1,
    AP_ACTIVATIONS = 1 << 2,
    AP_BACKWARD = 1 << 3,
    AP_ATTENTION = 1 << 4,
    AP_MODEL_STATE = 1 << 5,
};

enum og_rem {
#define X(name, id, order, build, applies, title, saving, cost) R_##name,
#include "remedies.def"
#undef X
    R_COUNT,
    R_NONE = -1
};

/* What the advice reads: the facts, which causes the diagnosis kept, and a few views of them. */
typedef struct rctx {
    const og_record_t *rec;
    const og_facts_t *f;
    enum og_framework fw;
    const char *fwname;
    bool has[OG_CAUSE_COUNT];
    int primary;
    double primary_conf; /* the primary cause's confidence */
    uint64_t req, shortfall, total, tracked, footprint, live, other, nonfw;
    bool req_known;       /* false: an adapter reported the failure without its size; `req` is then 0, no figure */
    bool shortfall_known; /* false: the device's free memory was not read; `shortfall` is then 0, no figure, and
                             nothing can be judged to cover it (og_covers) */
    bool other_inferred;  /* `other` inferred from total - free - tracked (no NVML) */
    bool cached_known, cache_retried;
    uint64_t cached, reclaim, largest;
    bool largest_known;
    bool cc_known;
    int cc; /* major * 10 + minor */
    int visible;
    long world;
    char fail_lib[64];
    bool live_known;         /* false when the framework's cache was not measured */
    bool retried_zero;       /* the framework released its cache, got 0 B back, and failed again */
    bool larger_than_device; /* the request alone exceeds the device (or the limit) */
    bool app_pool;           /* the cache is the application's own stream-ordered pool */
    bool async_backend;      /* PyTorch's backend:cudaMallocAsync */
    bool variable_sizes;     /* many different allocation sizes: variable-length batches */
    int other_fw;            /* the other framework holding memory (other_framework), or 0 */
    uint64_t other_fw_bytes, peers_bytes, capacity, growth_rise;
    int npeers;
    int grad, training; /* adapter evidence, 0 unknown */
    int autocast;       /* adapter evidence: 1 mixed precision on at the failure, -1 off, 0 unknown */
    int trains;         /* the job trains (facts: trains): 1 (an optimizer step ran, gradients or optimizer
                           state measured, an optimizer holds the device's parameters, phase backward or
                           optimizer_step), -1 known inference only (training -1), 0 unknown */
} rctx_t;

/* BYTES cover the shortfall: never when it is unknown (unknown is not zero) */
static inline bool og_covers(const rctx_t *x, double bytes)
{
    return x->shortfall_known && bytes >= (double)x->shortfall;
}

typedef struct og_remedy_def {
    const char *id, *title, *saving, *cost;
    int order;   /* checklist position, x10 */
    int applies; /* enum og_applies: where it can help at all */
    bool (*build)(const rctx_t *, og_remedy_t *);
} og_remedy_def_t;

extern const og_remedy_def_t og_remedy_catalog[R_COUNT];

/* the advice's view of REC (computes the facts when og_diagnose did not) */
void og_remedy_context(rctx_t *x, og_record_t *rec);
/* the growth's steps ran without autograd (a KV cache, outputs kept on purpose) */
bool og_growth_without_autograd(const rctx_t *x);
/* a previous copy of the model is alive and does not fit beside the new one: a second load in the history, or
 * roles.models (a notebook cell run again while the first run's model, optimizer and traceback live on) */
bool og_previous_copy(const rctx_t *x);
/* a forward pass with autograd on that no frame of the failing stack backpropagates (facts: roles.no_backward) */
bool og_feeds_no_backward(const rctx_t *x);
/* an attribution's pass: the gradient of an input or activation asked for through a model no optimizer trains,
 * whose weights hold no gradient (remedy_rank.c: attribution_pass) */
bool og_attribution_pass(const rctx_t *x);
/* a request larger than the card in a forward with autograd on whose statement's inputs (roles.stmt_inputs) are a
 * quarter of the card or more (remedy_rank.c: larger_forward_inputs) */
bool og_forward_inputs_fill_card(const rctx_t *x);
/* the failing call inside a comprehension of the program's outside any pass, its temporaries 4x the request or more
 * (remedy_rank.c: comprehension_builds) */
bool og_comprehension_builds(const rctx_t *x);
/* the growth is one generation's working set: a KV cache rising token by token within a request (the
 * job decoding (facts.decoding), or a KV cache holding at least half the rise; growth.gen_built; or, with no
 * growth read, decoding with a KV cache holding the missing bytes and a quarter of the framework's
 * allocated bytes), in a job not known to train, autograd not on: not memory kept across iterations */
bool og_generation_growth(const rctx_t *x);
/* the failing statement makes a model's logits (roles.stmt_logits) for every position of its input in a pass of a
 * job decoding with a KV cache (autograd off, not training: a prefill of a long prompt, a tool's output fed whole),
 * a request of at least an eighth of the device: a decoding step reads the last position's logits only, so asked for
 * that one, the pass makes 1/length of them.  Not under a loss over the logits (an evaluation's perplexity reads
 * every position) */
bool og_all_position_logits(const rctx_t *x);
bool og_layer_holder_kept(const rctx_t *x);
/* the models a registry by key keeps resident on the GPU (roles.registry_models, else roles.keyed_models in a job
 * not known to train), 0 none */
uint64_t og_registry_bytes(const rctx_t *x);
/* a restored checkpoint kept on the GPU after its load (roles.ckpt_copy covers the shortfall, past the load, before
 * any optimizer step) */
bool og_checkpoint_kept(const rctx_t *x);
/* an EMA update out of place making a new copy beside a whole old one, past what the cache can give (facts:
 * copy_outgrows_cache, update_copy, roles.ema_kept) */
bool og_ema_out_of_place(const rctx_t *x);
/* Python objects hold tensors torch.load restored onto the GPU, >= the shortfall (roles.restored_held) */
bool og_restored_held(const rctx_t *x);
/* the models' parameters are mostly embedding tables (roles.embedding_parameters_bytes at least half of the
 * parameters): a recommender's or a sparse-feature model's tables, read a few rows a batch */
bool og_embedding_tables(const rctx_t *x);
/* a Sparse* optimizer (torch.optim.SparseAdam) trains at least half the embedding tables' bytes: tables of ids; STATE
 * (may be NULL) gets those optimizers' state bytes */
bool og_sparse_id_tables(const rctx_t *x, uint64_t *state);
/* a holder of no purpose kept across calls covers the shortfall while what Python keeps outgrows the splinters
 * (facts.kept_outgrows_cache; roles.keeper), the memory did not grow */
bool og_kept_holder(const rctx_t *x);
/* a holder of no purpose holds more than any role of the framework and the shortfall (roles.dominant) */
bool og_dominant_holder(const rctx_t *x);

/* the cap that refused the request, not the card: the cap is at most the job's state at its optimizer steps and
 * that state, this pass's activations, the context and the request fit the device without the cap (its free
 * bytes + what the process holds); U (may be NULL) gets the cap, the state, that need and that room */
typedef struct og_uncapped {
    uint64_t cap, state, need, room;
} og_uncapped_t;
bool og_cap_not_the_card(const rctx_t *x, og_uncapped_t *u);

/* Row I of the ranking's tables (passes in order) as a line of docs/diagnosis.md's table; 0 past the last. */
int og_rank_row_text(int i, char *buf, size_t n);

#endif
