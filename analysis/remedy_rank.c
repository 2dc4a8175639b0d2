/* Ranking: which remedies a failure gets and in what order.  Fills rec->remedies from the
 * diagnosis and the facts.  Pure: no I/O, no globals, no allocation.
 *
 * A few named passes, each over data:
 *   bring     each cause that holds brings its remedies (rows of `bring`)
 *   narrow    what the failure or the settings rule out (rows of `narrow`)
 *   order     the checklist (remedies.def: cheapest first), moved by the rows of `reorder`
 *   estimate  what each remedy could save, in bytes (-1 unknown), from the roles and the phase where
 *             the Python adapter measured them; tier 1: covers the shortfall (or nothing is missing),
 *             2: unknown (the estimate, or the shortfall itself), 3: cannot cover it alone
 *   lead      the primary cause's own remedies (common/causes.def) go first when they can cover it;
 *             then the rows of `lead` (LEAD_COVERS: first unless it cannot cover the shortfall)
 *   fit       every remedy: the catalog's `applies` read on the evidence, a measured nothing not listed,
 *             one that cannot cover the shortfall never leading
 *   sort      by (tier, order), stable in catalog order; inference mode never leads unless the job is
 *             known to be inference or an evaluation ran with autograd on
 *   show      the first OG_REMEDIES_SHOWN in full, but not one that cannot cover the shortfall while another
 *             can or may (folded under "also possible")
 * A row is a condition on the facts, an effect on some remedies, the facts it reads and the corpus
 * cases (tests/scenarios/cases) that motivate it; rows of a pass apply in order, a later one
 * overriding an earlier.  docs/diagnosis.md lists every row (a test checks it does).
 * At most 20 remedies, ranked 1..n without gaps. */
#include <string.h>

#include "remedies.h"

typedef struct rank {
    bool want[R_COUNT];
    int tier[R_COUNT], order[R_COUNT];
    double cover[R_COUNT];
    const char *rows[R_COUNT][OG_RANK_ROWS_KEPT]; /* the rows that touched each remedy (remedies[].ranking) */
    int nrows[R_COUNT];
} rank_t;

/* the trace: `name` touched remedy r (a row of a pass, or a step of the ranking itself) */
static void touched(rank_t *k, int r, const char *name)
{
    if (k->nrows[r] && k->rows[r][k->nrows[r] - 1] == name)
        return;
    if (k->nrows[r] < OG_RANK_ROWS_KEPT)
        k->rows[r][k->nrows[r]++] = name;
}

/* ------------------------------------------------------------------ conditions */

#define HAS(c)     (x->has[OG_CAUSE_##c])
#define PRIMARY(c) (x->primary == OG_CAUSE_##c)

static bool cache_ok(const rctx_t *x) { return x->cached_known && x->cached > 0 && !x->cache_retried; }
/* unknown is not zero: a framework's reservation may hold cache nobody measured */
static bool cache_maybe(const rctx_t *x)
{
    const og_record_t *r = x->rec;
    return !x->cached_known && r->memory.framework_bytes > 0 && !x->retried_zero;
}
static bool known_inference(const rctx_t *x) { return x->training == -1; }
static bool pytorchish(const rctx_t *x) { return x->fw == OG_FW_PYTORCH || x->fw == OG_FW_UNKNOWN; }
/* what the history says the failing request belongs to (a load), when does_not_fit holds and the
 * request fits the device */
static enum og_load_phase load_phase(const rctx_t *x)
{
    return !HAS(DNF) || x->f->larger_than_device ? OG_PHASE_NONE : x->f->load.phase;
}

static bool always(const rctx_t *x) { return x != NULL; }
static bool limit_holds(const rctx_t *x) { return HAS(LIMIT); }
static bool limit_cache(const rctx_t *x) { return HAS(LIMIT) && (cache_ok(x) || cache_maybe(x)); }
static bool cache_app_pool(const rctx_t *x) { return HAS(CACHE) && x->app_pool; }
static bool cache_framework(const rctx_t *x) { return HAS(CACHE) && !x->app_pool; }
static bool frag_holds(const rctx_t *x) { return HAS(FRAG); }
static bool frag_primary(const rctx_t *x) { return PRIMARY(FRAG); }
static bool frag_variable(const rctx_t *x) { return HAS(FRAG) && (x->variable_sizes || x->retried_zero); }
static bool frag_primary_variable(const rctx_t *x) { return PRIMARY(FRAG) && frag_variable(x); }
static bool others_hold(const rctx_t *x) { return HAS(FOREIGN) || HAS(NONFW); }
static bool growth_holds(const rctx_t *x) { return HAS(GROWTH); }
static bool growth_cache(const rctx_t *x) { return HAS(GROWTH) && cache_ok(x); }
static bool growth_on_purpose(const rctx_t *x) { return PRIMARY(GROWTH) && og_growth_without_autograd(x); }
static bool generation_growth(const rctx_t *x) { return og_generation_growth(x); }
/* the same, in a beam search (roles meta num_beams > 1) */
static bool generation_beams(const rctx_t *x) { return og_generation_growth(x) && x->f->roles.num_beams > 1; }
/* the same, read as one generation building up (growth.gen_built: the growth rule does not hold) */
static bool generation_built(const rctx_t *x) { return og_generation_growth(x) && !HAS(GROWTH); }
static bool otherfw_holds(const rctx_t *x) { return HAS(OTHERFW); }
static bool peers_hold(const rctx_t *x) { return HAS(PEERS); }
/* every peer on the GPU is a worker of this process's parent or the parent (a pre-fork server) */
static bool prefork_peers(const rctx_t *x)
{
    return HAS(PEERS) && x->npeers && x->f->nsiblings && x->f->nsiblings + x->f->nparents == x->npeers;
}
static bool prefork_primary(const rctx_t *x) { return PRIMARY(PEERS) && prefork_peers(x); }
/* every peer on the GPU is a child of this process (DataLoader workers, subprocesses it started): they are not ranks
 * on a wrong GPU, and a restart of this process starts them again the same way */
static bool child_peers(const rctx_t *x) { return HAS(PEERS) && x->npeers && x->f->nchildren == x->npeers; }
/* ... workers of this program (forks, multiprocessing's spawn; not all programs of their own): each one that touches CUDA holds a context, a cache
 * and its batches of its own */
static bool child_programs(const rctx_t *x);
static bool worker_peers(const rctx_t *x) { return child_peers(x) && !child_programs(x) && !x->f->own_children; }
static bool worker_primary(const rctx_t *x) { return PRIMARY(PEERS) && worker_peers(x); }
/* ... every one a program of its own it started (an evaluation script per epoch, not waited for): each holds its
 * context and what it loaded; fewer at once (one, waited for) or the work done in this process */
static bool child_programs(const rctx_t *x) { return HAS(PEERS) && x->f->child_programs; }
static bool child_programs_primary(const rctx_t *x) { return PRIMARY(PEERS) && child_programs(x); }
/* ... every one a child this process's Python lists as its multiprocessing child under a name the code that started it
 * gave it (facts: own_children: a dask-cuda cluster's worker, a pool's, left running; a DataLoader's workers keep the
 * default name): its memory is that work's, freed when the program closes what started it */
static bool own_children(const rctx_t *x) { return HAS(PEERS) && x->f->own_children; }
static bool own_children_primary(const rctx_t *x) { return PRIMARY(PEERS) && own_children(x); }
/* the job's ranks outnumber the machine's GPUs (facts: ranks_outnumber_gpus) and some of them hold memory here */
static bool ranks_outnumber_gpus(const rctx_t *x) { return HAS(PEERS) && x->f->ranks_outnumber_gpus; }
/* ... or, whoever the other processes on the GPU are (their identity not readable: another pid namespace), this
 * rank's own environment says srun started a torchrun per task (facts: nested_launchers), and the other processes
 * hold the missing bytes: the job's own worlds stacked on every GPU */
static bool nested_launch(const rctx_t *x)
{
    return x->f->nested_launchers && x->f->ranks_outnumber_gpus && og_covers(x, (double)x->f->other_all);
}
static bool fwcap_holds(const rctx_t *x) { return HAS(FWCAP); }
static bool imbalance_holds(const rctx_t *x) { return HAS(IMBALANCE); }
static bool dnf_cache(const rctx_t *x) { return HAS(DNF) && (cache_ok(x) || cache_maybe(x)); }
static bool dnf_holds(const rctx_t *x) { return HAS(DNF); }
static bool dnf_split_rest(const rctx_t *x) { return HAS(DNF) && x->retried_zero; }
static bool dnf_bucket(const rctx_t *x) { return HAS(DNF) && x->retried_zero && x->variable_sizes; }
/* the failing pass runs one input (roles.batch_size 1, the program's name or the model's input read): no batch
 * whose lengths could be grouped */
static bool batch_of_one(const rctx_t *x) { return x->f->roles.known && x->f->roles.batch_size == 1; }
static bool unknown_cache(const rctx_t *x) { return HAS(UNKNOWN) && (cache_ok(x) || cache_maybe(x)); }
static bool unknown_others(const rctx_t *x) { return HAS(UNKNOWN) && x->other > 0; }
static bool unknown_holds(const rctx_t *x) { return HAS(UNKNOWN); }

static bool released_nothing(const rctx_t *x) { return x->retried_zero && HAS(FRAG) && !cache_ok(x); }
static bool larger(const rctx_t *x) { return x->larger_than_device; }
static bool larger_card_exists(const rctx_t *x) { return x->larger_than_device && x->req < 141.0 * 1e9 * 0.97; }
static bool larger_than_limit_only(const rctx_t *x)
{
    return x->larger_than_device && HAS(LIMIT) && og_known(x->rec->device.limit_bytes) && x->total && x->req < x->total;
}
/* the limit refused the request because of the context it counts: nothing the job shrinks helps */
static bool limit_by_context(const rctx_t *x)
{
    const og_record_t *r = x->rec;
    return HAS(LIMIT) && og_known(r->device.limit_bytes) && og_known(r->device.limit_usage_bytes) &&
           r->device.limit_usage_bytes.v > x->tracked && x->req <= r->device.limit_bytes.v &&
           add_sat(r->device.limit_usage_bytes.v - x->tracked, x->req) > r->device.limit_bytes.v;
}
/* a confident primary cause whose own remedy covers the shortfall (another framework, peer ranks,
 * other processes): the generic ways to shrink the job would only hide the cause; nor are they the
 * answer to a snapshot, where nothing failed */
static bool own_fix_covers(const rctx_t *x)
{
    double cov = PRIMARY(OTHERFW)    ? (double)x->other_fw_bytes
                 : PRIMARY(PEERS)    ? (double)x->peers_bytes
                 : PRIMARY(FOREIGN)  ? (double)x->other
                 : PRIMARY(SNAPSHOT) ? 0
                                     : -1;
    return cov >= 0 && x->primary_conf >= 0.7 && og_covers(x, cov) && !x->larger_than_device;
}
/* the same, with no fragmentation or fragmentation only as a side finding: a pass still building or a deep copy
 * under way outgrows the cache (facts: pass_outgrows_cache, copy_outgrows_cache), which the splinters' remedies
 * cannot carry */
static bool own_fix_covers_no_frag(const rctx_t *x)
{
    return own_fix_covers(x) && (!HAS(FRAG) || x->f->pass_outgrows_cache || x->f->copy_outgrows_cache);
}
/* another framework of the process holds the missing bytes (a confident other_framework): its reservation
 * is the lever whatever the failing code was doing (an optimizer step, a load) */
static bool other_framework_covers(const rctx_t *x) { return PRIMARY(OTHERFW) && own_fix_covers(x); }
/* the process holds contexts of its own beside the primary one, and what memory outside the framework it holds
 * explains the shortfall (cause non_framework) */
static bool contexts_beyond_one(const rctx_t *x) { return HAS(NONFW) && x->f->contexts >= 2 && x->f->contexts_extra; }
static bool no_expandable(const rctx_t *x)
{
    return !pytorchish(x) || x->rec->expandable_segments_set || x->async_backend;
}
/* PyTorch's version, measured (facts: torch_version): before 2.1 its allocator has no expandable_segments (an
 * unknown key stops it at start-up); from 1.10 it reads max_split_size_mb, which keeps large cached blocks whole */
static bool before_expandable(const rctx_t *x)
{
    return pytorchish(x) && x->f->torch_version > 0 && x->f->torch_version < 201;
}
static bool max_split_instead(const rctx_t *x)
{
    return before_expandable(x) && x->f->torch_version >= 110 && !x->rec->max_split_set;
}
static bool no_tape(const rctx_t *x) { return x->fw == OG_FW_JAX || x->fw == OG_FW_CUPY; }
static bool autograd_known(const rctx_t *x) { return x->grad == -1 || x->trains == 1; }
/* the program asks for the gradient of the model's input (roles.input_requires_grad: a saliency map, integrated
 * gradients, an adversarial example): the pass needs autograd, whatever mode the model is in */
static bool input_gradient(const rctx_t *x) { return x->f->roles.input_grad; }
/* the optimizers train mostly tensors of no model (facts: roles.opt_outside): their backward runs through the
 * models */
static bool optimizes_no_model(const rctx_t *x) { return x->f->roles.opt_outside > 0; }
/* a pass with autograd on whose gradients the job reads though no model trains: a saliency map's input gradient,
 * an attribution, masks or an input optimized through the models; inference mode would lose them */
static bool autograd_needed(const rctx_t *x)
{
    return input_gradient(x) || og_attribution_pass(x) || optimizes_no_model(x);
}
static bool autocast_on(const rctx_t *x) { return x->autocast == 1; }
static bool cupy(const rctx_t *x) { return x->fw == OG_FW_CUPY; }
static bool no_zero(const rctx_t *x) { return x->fw == OG_FW_TENSORFLOW || x->fw == OG_FW_CUPY; }
static bool not_pytorch(const rctx_t *x) { return !pytorchish(x); }
static bool frag_other_framework(const rctx_t *x) { return HAS(FRAG) && !pytorchish(x); }
static bool state_exceeds_card(const rctx_t *x);
static bool model_exceeds_card(const rctx_t *x);
/* the job alone would fit on this card (what it holds + the request, 3% kept for the driver), unless its
 * state at its first optimizer step alone exceeds the card, or the model a load is moving here does; or a leak,
 * which any card fills */
static bool fits_alone_or_leak(const rctx_t *x)
{
    return !x->larger_than_device &&
           ((x->total && x->req_known && (double)add_sat(x->footprint, x->req) <= (double)x->total * 0.97 &&
             !state_exceeds_card(x) && !model_exceeds_card(x)) ||
            PRIMARY(GROWTH));
}

static bool one_gpu(const rctx_t *x) { return x->visible <= 1; }
static bool pre_volta(const rctx_t *x) { return x->cc_known && x->cc < 70; }
static bool not_known_inference(const rctx_t *x) { return !known_inference(x); }
static bool autograd_off(const rctx_t *x) { return x->grad == -1; }

static bool split_segments_lead(const rctx_t *x)
{
    return x->retried_zero && HAS(FRAG) && (PRIMARY(FRAG) || PRIMARY(DNF));
}
static bool split_segments_rest(const rctx_t *x) { return HAS(FRAG) && x->retried_zero; }
/* a second copy of a model alive (roles.models: two of one class and size) holding the missing bytes, outside
 * an EMA update (whose copy is meant) */
static bool model_copy(const rctx_t *x)
{
    return x->f->roles.model_copies && x->f->shortfall && x->f->roles.model_copies >= x->f->shortfall &&
           x->f->phase != OG_JP_ema_update;
}
static bool resident_models(const rctx_t *x);
/* a second copy of the weights arriving beside the first (the history), unless the roles say the first is a
 * model the running code holds on purpose (resident_models: two models compared, one at a time is the fix) */
static bool second_load(const rctx_t *x)
{
    return PRIMARY(DNF) && load_phase(x) == OG_PHASE_SECOND_LOAD && !resident_models(x);
}
/* (a copy replacing a model a name holds is the running job's own refresh, not a previous run's copy) */
static bool copy_replaces_model(const rctx_t *x);
static bool model_copy_primary(const rctx_t *x) { return PRIMARY(DNF) && model_copy(x) && !copy_replaces_model(x); }
/* ... a previous run's model of another size that no name reaches (facts: roles.unreached_copies): a loop's earlier
 * fold or trial, freed by dropping what keeps it (the collector, a callback) without losing the loop */
static bool unreached_copy(const rctx_t *x) { return model_copy_primary(x) && x->f->roles.unreached_copies; }
/* copies of one model run at once in this process (facts: roles.concurrent_copies: threads each running its own
 * loop, Optuna's n_jobs trials), the request not alone beyond the card: one loop at a time, or one per GPU or process,
 * holds one copy's memory where they hold it several times over */
static bool concurrent_loops(const rctx_t *x)
{
    return x->f->roles.known && x->f->roles.concurrent_copies && x->shortfall && !x->larger_than_device &&
           !PRIMARY(PEERS);
}
/* a previous copy of the model is alive beside the one the job uses (a second load, a notebook cell run again) */
bool og_previous_copy(const rctx_t *x) { return second_load(x) || model_copy_primary(x); }
static bool loading(const rctx_t *x) { return PRIMARY(DNF) && load_phase(x) == OG_PHASE_LOADING; }
static bool eval_with_autograd(const rctx_t *x)
{
    return PRIMARY(GROWTH) && known_inference(x) && x->grad == 1 && !autograd_needed(x);
}
/* the framework refused under its own cap, the cap bounds what it reserves (PyTorch, CuPy: the request
 * is a new segment from the device) and the device itself had no room for the request: raising the cap
 * cannot make it fit (facts: cap.reserved, cap.room).  An arena's cap (JAX, TensorFlow) is left alone:
 * raising it means a restart that re-reserves the arena, so what was free now is not the measure */
static bool cap_without_room(const rctx_t *x)
{
    return HAS(FWCAP) && x->f->cap.binds && x->f->cap.reserved && !x->f->cap.room;
}
/* the framework refused under its own cap without asking the driver while the device had room: the cap is
 * the cause (framework_cap at 0.99), whatever the history's steps or the cache's splinters say: what chases a
 * leak, splinters or other processes comes after every way to raise the cap or shrink the job */
static bool cap_refused_with_room(const rctx_t *x)
{
    return PRIMARY(FWCAP) && x->f->cap.binds && x->f->cap.room && x->rec->memory.fw.internal_oom;
}
/* the cap binds on a card other users share: NVML listed processes not of this job holding memory on it (not
 * inferred), so the cap is this job's share and raising it takes theirs: fitting under it comes first.  Not where the
 * card's free memory, less the request, still holds at least what the others hold now: raising the cap by the
 * request leaves them room to grow as much again (a cap copied from a card shared with a trainer, on one where a
 * small co-tenant leaves most of it free) */
static bool cap_on_shared_gpu(const rctx_t *x)
{
    const og_record_t *r = x->rec;
    bool room_beside =
        og_known(r->device.free_bytes) && x->req_known && sub0(r->device.free_bytes.v, x->req) >= x->other;
    return HAS(FWCAP) && x->f->cap.binds && x->other > 0 && !x->other_inferred && !room_beside;
}
static bool confident_growth(const rctx_t *x) { return PRIMARY(GROWTH) && x->primary_conf >= 0.7; }
static bool limit_on_shared_gpu(const rctx_t *x) { return HAS(LIMIT) && x->rec->memory.nother > 0; }
/* the memory is another user's (NVML listed the processes): restarting this process sheds only its own
 * cache, which empty_cache() returns without a restart, when nothing else a restart clears holds
 * (fragmentation, growth, memory outside the framework, a second load) and the cache was measured */
static bool restart_sheds_nothing(const rctx_t *x)
{
    return PRIMARY(FOREIGN) && !x->other_inferred && x->cached_known && !HAS(FRAG) && !HAS(GROWTH) && !HAS(NONFW) &&
           load_phase(x) != OG_PHASE_SECOND_LOAD;
}
/* the models' layers were walked and none is attention (roles.attention_modules 0, the failing operation not
 * attention): their input is a graph, a point cloud or an image, not a token sequence */
static bool no_attention_layers(const rctx_t *x) { return x->f->roles.attention == -1; }
/* no other process to stop: the memory outside the framework is in this process */
static bool no_other_process(const rctx_t *x) { return !x->other && x->rec->memory.nother <= 0; }

/* by role and phase (the Python adapter's memory.framework.roles and event.phase; unknown without it) */
#define PHASE(p) (x->f->phase == OG_JP_##p)
static const og_role_facts_t *roles_of(const rctx_t *x) { return &x->f->roles; }
/* the holder of the growth (facts: roles.grower), one with no purpose of its own (not a dataset, a KV cache, a cache:
 * their rows' levers) and no copy of a role, outside a generation (its KV cache grows per token): released, all it
 * keeps is freed, more than the rise the history saw (a list of every step's predictions kept since the first
 * step); its bytes, 0 none */
static uint64_t kept_grower(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!HAS(GROWTH) || !ro->known || ro->grower < 0 || og_generation_growth(x))
        return 0;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->grower];
    return og_holder_purpose(x->f, x->rec, ro->grower) != OG_PURPOSE_NONE || h->copy_of[0] ? 0 : ro->grower_bytes;
}
static bool in_handler(const rctx_t *x) { return PHASE(oom_handler); }
/* inside the handler of an earlier OOM, the activations alive at the failure beyond the failing request (the
 * running fallback's own need, at least) cover the shortfall: what the failed attempt still holds is the
 * missing memory, whatever the operation that failed; leaving the handler comes before the operation's fixes */
static bool handler_keeps_attempt(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return in_handler(x) && ro->known && ro->act_known && x->req_known && ro->act > x->req &&
           og_covers(x, (double)(ro->act - x->req));
}
static bool pass_outgrows(const rctx_t *x) { return x->f->pass_outgrows_cache; }
/* what Python objects keep across calls outgrows the splinters (facts: kept_outgrows_cache) */
static bool kept_outgrows(const rctx_t *x) { return x->f->kept_outgrows_cache; }
/* ... where the splinters were found (cause fragmentation), and the largest such holder has no purpose (its name's:
 * a dataset, an index, a cache, an EMA; or a data set by its records: og_holder_purpose; their own rows) and is no
 * copy of a role, the memory did not grow (growth names its own holder), and it alone covers the shortfall: a
 * program's list or attribute keeping tensors it has no need to keep on the device (a metric's per-image masks,
 * outputs kept for a later report) */
/* a holder of no purpose and no copy holds more than any role of the framework (facts: roles.dominant) and the
 * missing bytes, outside a growth (its holder's own rows): the largest thing on the device is what the program keeps */
bool og_dominant_holder(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->dominant >= 0 && !PRIMARY(GROWTH) &&
           og_covers(x, (double)x->rec->memory.fw.roles.holders[ro->dominant].bytes);
}
static bool dominant_holder(const rctx_t *x) { return og_dominant_holder(x); }
bool og_kept_holder(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!kept_outgrows(x) || !HAS(FRAG) || ro->keeper < 0 || PRIMARY(GROWTH) || !og_covers(x, (double)ro->keeper_bytes))
        return false;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->keeper];
    char where[sizeof h->where], kind[sizeof h->kind];
    og_cpy(where, sizeof where, h->where, sizeof where);
    og_cpy(kind, sizeof kind, h->kind, sizeof kind);
    /* DistributedDataParallel's reducer keeps its gradient buckets (roles.ddp, their own remedy): DDP's, not the
     * program's to release, on DDP or on a subclass of it (the reducer's own class says so) */
    bool ddp_reducer = ro->ddp_buckets && (strstr(where, "DistributedDataParallel") || strcmp(kind, "Reducer") == 0);
    return og_holder_purpose(x->f, x->rec, ro->keeper) == OG_PURPOSE_NONE && !h->copy_of[0] && !ddp_reducer;
}
static bool kept_holder(const rctx_t *x) { return og_kept_holder(x); }
/* the failing statement copies a holder whole (facts: roles.stmt_copies: torch.cat of a list of chunks, a stack of
 * kept predictions): for its length the holder is on the device twice; kept elsewhere (host memory), or built in
 * place, it is there once. Not in a growth (its holder's own row) */
static bool stmt_copies_holder(const rctx_t *x) { return roles_of(x)->stmt_copies >= 0 && !PRIMARY(GROWTH); }
/* the same, where a restart would shed only the cache: nothing grew, nothing outside the framework in the process */
static bool pass_outgrows_restart(const rctx_t *x) { return pass_outgrows(x) && !HAS(GROWTH) && !HAS(NONFW); }
static bool others_sliver(const rctx_t *x) { return x->f->others_sliver; }
/* a deep copy under way made many times the cache so far (facts: copy_outgrows_cache) */
static bool copy_outgrows(const rctx_t *x) { return x->f->copy_outgrows_cache; }
/* a loop's deep copies of one model, each kept by what the loop keeps (growth by copies, facts.c: growth_by_copies):
 * the copy the statement replaces is only the latest of them, and updating it in place would change what the loop
 * kept from it */
static bool loop_keeps_copies(const rctx_t *x) { return PRIMARY(GROWTH) && x->f->growth.marker == OG_MARK_KEPT_COPIES; }
/* a deep copy under way replaces a model that a name holds now, and that model holds the missing bytes
 * (facts: roles.copy_replaces: ref = copy.deepcopy(policy) while the previous ref lives): both copies are alive
 * at the peak; loading the new weights into the existing copy, or dropping it first, is the fix */
static bool copy_replaces_model(const rctx_t *x)
{
    const og_role_facts_t *ro = &x->f->roles;
    return ro->known && ro->copy_replaces && x->shortfall && ro->copy_replaces >= x->shortfall && !own_fix_covers(x) &&
           !x->larger_than_device && !loop_keeps_copies(x);
}
/* the failing operation is a deep copy (roles.operation copy): copy.deepcopy copies leaf tensors and records no
 * graph, so autograd's mode changes nothing it makes */
static bool copy_builds_no_graph(const rctx_t *x) { return roles_of(x)->operation == OG_OP_copy; }
/* the adapter read an evaluation or generation from the stack and autograd was on: every activation is
 * kept for a backward that never comes, in a training job too; not while a deep copy runs (it builds no graph) */
/* a forward pass with autograd on that no frame of the failing stack backpropagates (facts: roles.no_backward: no
 * backward, manual_backward or autograd.grad loaded by the program's or a framework's running code), in a job that
 * trains elsewhere or not: an acquisition, scoring or sampling pass (MC dropout in train mode) records a graph no
 * backward frees, its outputs keep it; the activations measured (that graph is what inference mode saves) */
bool og_feeds_no_backward(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PHASE(forward) && x->grad == 1 && ro->known && ro->no_backward && ro->act_known && ro->act &&
           !own_fix_covers(x);
}
static bool evaluation_autograd_on(const rctx_t *x)
{
    return (PHASE(evaluation) || PHASE(generation)) && x->grad == 1 && !copy_builds_no_graph(x) && !autograd_needed(x);
}
/* an evaluation or generation pass while the training's gradients or optimizer state live on the failing device
 * (roles gradients, optimizer_state): the pass reads neither; the gradients wait for the next zero_grad, the
 * state for a step that may never come (an evaluation cell after fit in a notebook) */
static bool training_state_idle(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return (PHASE(evaluation) || PHASE(generation)) && ro->known && (ro->grads || ro->opt);
}
/* ... and freeing it would carry the pass through: the pass's working set (its activations and the tensors the
 * running code's locals hold: a generation's cache, layer by layer) is under PASS_OVER_STATE times that state; one
 * that outgrows it (an evaluation generating with 4 beams over 16k tokens, 30 GiB so far beside 3.4 GiB of Adam
 * state) would fail a few layers later, and its own batch is the lever */
#define PASS_OVER_STATE 3
static bool training_state_carries_pass(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return training_state_idle(x) &&
           (!ro->act_known || (double)ro->working < PASS_OVER_STATE * ((double)ro->grads + (double)ro->opt));
}
static bool training_state_delays(const rctx_t *x) { return training_state_idle(x) && !training_state_carries_pass(x); }
/* outputs of earlier batches kept across calls with their graphs, in an evaluation with autograd on (facts:
 * roles.kept_graphs): the holder is the cause, autograd off for the evaluation the second fix */
static bool kept_graphs(const rctx_t *x) { return roles_of(x)->kept_graphs > 0 && !own_fix_covers(x); }
/* ... in a job not known to train (no optimizer step, gradients or optimizer state: a server, an evaluation
 * script): the graphs themselves are the waste, what holds them (a KV cache, outputs) is the job's own; autograd off
 * drops every graph at once */
static bool graphs_without_training(const rctx_t *x) { return kept_graphs(x) && x->trains != 1 && x->grad == 1; }
/* the same, read by the adapter (roles.holders[].graphs: the outputs' graphs are alive), in any phase but backward:
 * storing them detached or building no graph for them are the two fixes; checkpointing only shrinks what each kept
 * graph saves, the graphs stay */
static bool kept_graphs_measured(const rctx_t *x) { return kept_graphs(x) && roles_of(x)->graphs_measured; }
/* a confident growth that did not fail in the optimizer's step (where the state is being made) */
static bool growth_not_in_step(const rctx_t *x) { return confident_growth(x) && !PHASE(optimizer_step); }
/* a growth whose rise what Python keeps across calls holds (measured: a dict of sessions, a registry): stopping other
 * processes only delays the next failure, whatever they hold */
static bool growth_kept_measured(const rctx_t *x) { return PRIMARY(GROWTH) && x->f->growth.kept_measured; }
/* ... a confident growth whose rise the adapter found in what Python keeps: kept across calls (growth.kept_measured),
 * outputs a holder keeps with their graphs alive (the growth read from them, step_marker kept_graphs), copies of one
 * model beyond the first (roles.model_copies: a model built anew each iteration, the earlier ones kept) or one holder,
 * wherever it is (a running loop's list or dict in main), each with four fifths of the rise
 * (roles.grower); not a generation's own working set growing token by token, nor a rise a KV cache holds half of
 * (a cache grows with the batch and the length: those remedies shrink it) */
static bool measured_leak(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PRIMARY(GROWTH) && x->primary_conf >= 0.7 && !og_generation_growth(x) &&
           2 * (double)ro->purpose_bytes[OG_PURPOSE_kv_cache] < (double)x->f->growth.rise &&
           (x->f->growth.kept_measured || x->f->growth.marker == OG_MARK_KEPT_GRAPHS || x->f->growth.copies_kept ||
            (ro->grower >= 0 && (double)ro->grower_bytes >= 0.8 * (double)x->f->growth.rise));
}
/* ... whose rise is copies of one model (growth.copies_kept): a model built anew each iteration and kept, whatever
 * autograd records in the pass */
static bool copies_leak(const rctx_t *x) { return measured_leak(x) && x->f->growth.copies_kept; }
/* restoring a checkpoint: the adapter's phase is loading and its frame is torch.load's */
static bool checkpoint_restore(const rctx_t *x) { return PHASE(loading) && x->f->load_via_torch_load; }
/* a load whose one model's parameters on the device (roles.models: a single model, one copy) already fill nine
 * tenths of the card: the loaded tensors became the weights (a from_pretrained that assigns each shard's tensors
 * as the parameters), so loading on the CPU would leave them as large and the rest is still to come; the weights
 * themselves must get smaller (fewer bits) or be split over more devices; not float32 weights, which bfloat16
 * halves first (fp32_weights' lead) */
/* the weights are at least half float32 (roles.parameters_by_dtype measured) */
static bool mostly_fp32(const og_role_facts_t *ro)
{
    return ro->dtypes_known && ro->params && 2 * ro->params_fp32 >= ro->params;
}
/* the activations (measured) are at least half of what the framework has allocated: the pass is what fills it */
static bool activations_dominate(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    const og_opt_u64_t a = x->rec->memory.fw.roles.allocated_bytes;
    return ro->act_known && og_known(a) && a.v && 2 * ro->act >= a.v;
}
static bool weights_fill_card(const rctx_t *x)
{
    const og_roles_t *r = &x->rec->memory.fw.roles;
    const og_role_facts_t *ro = roles_of(x);
    /* float32 weights (at least half of them) halve first in bf16 (fp32_weights) */
    return PHASE(loading) && ro->known && x->capacity && r->nmodels == 1 && r->models[0].count == 1 &&
           !mostly_fp32(ro) && (double)r->models[0].bytes >= 0.9 * (double)x->capacity;
}
/* ... a checkpoint's restore first, unless those weights fill the card, or another job's processes (or another
 * framework of this one) hold what is missing: a restore on the host still puts the weights on this card, and
 * what the others hold is the lever (ranks of this job that restored onto one GPU are not others: their
 * checkpoints are what map_location moves) */
static bool checkpoint_restore_first(const rctx_t *x)
{
    return checkpoint_restore(x) && !weights_fill_card(x) &&
           !((PRIMARY(FOREIGN) || PRIMARY(OTHERFW)) && own_fix_covers(x));
}
/* a restored checkpoint kept after the load (facts: roles.ckpt_copy: holders whose name says checkpoint and whose
 * blocks copy the parameters or the optimizer state) holds the missing bytes, past the load (not phase loading:
 * checkpoint_restore's) and before any optimizer step of this process (a copy made after steps is a snapshot,
 * state_snapshot's): the copy torch.load put on the GPU, dead once load_state_dict copied it */
bool og_checkpoint_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    bool stepped =
        (ro->steps_known && ro->steps_made > 0) || (x->rec->memory.fw.has && x->rec->memory.fw.training == 1);
    return ro->known && ro->ckpt_copy && og_covers(x, (double)ro->ckpt_copy) && !PHASE(loading) && !stepped &&
           !x->f->snapshot_stmt && !x->larger_than_device;
}
static bool checkpoint_kept(const rctx_t *x) { return og_checkpoint_kept(x); }
/* tensors torch.load restored onto the GPU that Python objects hold (facts: roles.restored_held, measured by the
 * adapter's restore hook: a checkpoint, a file's features or embeddings) hold the missing bytes, outside a growth
 * (its own rows): where they came from is the fix, restored to host memory they cost the GPU nothing */
bool og_restored_held(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->restored_holder >= 0 && og_covers(x, (double)ro->restored_held) && !PRIMARY(GROWTH);
}
static bool restored_held(const rctx_t *x) { return og_restored_held(x); }
static bool loading_weights_phase(const rctx_t *x) { return PHASE(loading); }
static bool load_dequantizes(const rctx_t *x) { return PHASE(loading) && x->f->load_dequantizes; }
/* the optimizer keeps state not one value per parameter element (preconditioner matrices) that covers the shortfall */
static bool preconditioned_state(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->opt_shaped && og_covers(x, (double)ro->opt_shaped);
}
/* a LoRA model whose other weights require grad too (roles.lora_base_trainable_bytes: loralib's
 * mark_only_lora_as_trainable skipped, requires_grad set back on), at least 4x the adapters, and the gradients and
 * optimizer state of those weights (their share of the trained parameters' measured ones) cover the shortfall */
static double lora_base_state(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    double trained = ro->opt_params > ro->lora_base_trained ? (double)ro->opt_params : (double)ro->lora_base_trained;
    return trained > 0 ? (double)ro->lora_base_trained / trained * ((double)ro->grads + (double)ro->opt) : 0;
}
static bool lora_base_trains(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->lora_params && ro->lora_base_trained >= 4 * ro->lora_params &&
           og_covers(x, lora_base_state(x));
}
/* LoRA already in use: adapters measured (roles.lora_parameters_bytes) and what else requires grad under 4x them (a
 * head, a projector): the weights are frozen already, and "train LoRA adapters instead" is what the job does */
static bool lora_in_use(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->lora_params && ro->lora_base_trained < 4 * ro->lora_params;
}
/* gradients kept one per example (DP-SGD) cover the shortfall: they grow with the physical batch, not the length */
static bool per_sample_gradients(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->per_sample && og_covers(x, (double)ro->per_sample);
}
static bool optimizer_state(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->opt_full > 0 || (PHASE(optimizer_step) && ro->params > 0 && ro->opt == 0);
}
static bool in_optimizer_step(const rctx_t *x) { return PHASE(optimizer_step); }
static bool step_of_ranks(const rctx_t *x) { return PHASE(optimizer_step) && x->rec->world_size > 1; }
/* the phases in which activations are being made or used: the optimizer state is not the lever */
static bool activation_phase(const rctx_t *x)
{
    return PHASE(forward) || PHASE(backward) || PHASE(evaluation) || PHASE(generation);
}
/* autograd is off inside optimizer.step() and clip_grad_norm_ of a training job: not an evaluation; and
 * a load builds no graph, nor does a model's weights arriving with no phase frame naming it (roles.weights_only:
 * a model's own .to(), nothing computed yet) */
static bool kept_state_only(const rctx_t *x);
static bool no_graph_to_drop(const rctx_t *x)
{
    return PHASE(optimizer_step) || PHASE(backward) || PHASE(loading) || PHASE(ema_update) || copy_builds_no_graph(x) ||
           roles_of(x)->weights_only || kept_state_only(x);
}
static uint64_t graph_pool_bytes(const rctx_t *x)
{
    /* what the graphs' pools reserve (PyTorch's private pools), not only the tensors alive in them (roles.pools): a
     * graph keeps its pool, used or not, while it lives */
    uint64_t p = roles_of(x)->pools, priv = x->rec->memory.fw.has ? x->rec->memory.fw.private_pool_bytes : 0;
    return p > priv ? p : priv;
}
static bool graph_pools(const rctx_t *x) { return graph_pool_bytes(x) > 0; }
/* the primary cause is the cache the graphs' private pools hold unused (facts: pool_idle >= shortfall): fewer captured
 * shapes is that cause's own fix (no empty_cache releases a live graph's pool), ahead of any row of the request */
static bool graph_pools_hold_the_cache(const rctx_t *x)
{
    return PRIMARY(CACHE) && graph_pools(x) && x->f->pool_idle && x->f->pool_idle >= x->shortfall;
}
static bool graph_pools_lead(const rctx_t *x)
{
    return graph_pools(x) && (PRIMARY(DNF) || PRIMARY(CACHE) || PRIMARY(FRAG) || PRIMARY(GROWTH));
}
/* the growth is kept by a dict (or another cache) that outlives the steps */
static bool growth_in_a_cache(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return HAS(GROWTH) && ro->keeper >= 0 && ro->keeper_map && og_covers(x, (double)ro->keeper_bytes);
}
static bool growth_in_a_cache_primary(const rctx_t *x) { return PRIMARY(GROWTH) && growth_in_a_cache(x); }
/* LoRA adapters piled up (roles.lora_piled: at least half the other weights, no gradient and no optimizer state),
 * holding the missing bytes: one adapter per request or tenant, loaded and never deleted; deleting each after its
 * job, or keeping a bounded set, frees all but the ones in use */
static bool lora_piled(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->lora_piled && og_covers(x, (double)ro->lora_params);
}
/* a map kept across calls (facts: roles.keeper, a dict or another cache; its name says cache or nothing, no copy of
 * a role) holding the missing bytes, more than the running code's tensors and more than any rise the steps read (a
 * prefill building its KV cache is a rise within one call): entries kept from earlier calls, never evicted, take
 * the room each call needs */
static bool cache_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!ro->known || ro->keeper < 0 || !ro->keeper_map || !og_covers(x, (double)ro->keeper_bytes))
        return false;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->keeper];
    enum og_purpose pu = og_holder_purpose(x->f, x->rec, ro->keeper);
    return (pu == OG_PURPOSE_NONE || pu == OG_PURPOSE_cache) && !h->copy_of[0] && ro->keeper_bytes > ro->working &&
           (!HAS(GROWTH) || ro->keeper_bytes > x->f->growth.rise) && !own_fix_covers(x) && !x->larger_than_device &&
           ro->keeper != ro->bounded; /* (one at the bound the program set is bounded already) */
}
/* the models a registry by key keeps resident: a registry of one class (roles.registry_models), else different
 * models held by key and idle (roles.keyed_models) in a job not known to train (models a training step uses
 * together, a GAN's generator and discriminator, are no cache to evict from); 0 none */
uint64_t og_registry_bytes(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!ro->known)
        return 0;
    return ro->registry_models ? ro->registry_models : x->trains != 1 ? ro->keyed_models : 0;
}
/* a registry of whole models by key (roles.models: every name a map's entry) holds the missing bytes: bounded
 * by a count or not at all, not by the memory its models take */
static bool model_registry(const rctx_t *x)
{
    uint64_t reg = og_registry_bytes(x);
    return reg && og_covers(x, (double)reg);
}
/* NCCL's own memory: it failed, or the job was in a collective, or it holds all of the growth */
static bool comm_holds_growth(const rctx_t *x) { return HAS(GROWTH) && x->f->comm_holds_growth; }
static bool communication(const rctx_t *x)
{
    return x->f->comm_lib >= 0 && og_covers(x, (double)x->f->comm_bytes) &&
           (x->f->comm_failing || PHASE(collective) || comm_holds_growth(x));
}
/* NCCL's buffers hold the missing bytes outside any growth of theirs: NCCL is the largest library outside the
 * framework (cause non_framework), or the environment sizes its buffers beyond NCCL's default (NCCL_BUFFSIZE)
 * and what that adds covers the shortfall */
static bool comm_settings_cover(const rctx_t *x)
{
    return x->f->comm_setting_excess && og_covers(x, (double)x->f->comm_setting_excess);
}
static bool comm_outside(const rctx_t *x)
{
    return x->f->comm_lib >= 0 && og_covers(x, (double)x->f->comm_bytes) &&
           ((HAS(NONFW) && x->f->nonfw_big_lib == x->f->comm_lib) || comm_settings_cover(x));
}
static bool kv_cache_reserving(const rctx_t *x);
/* a peak from one batch far larger than the earlier steps' (a long document), with autograd on; not a reservation
 * the program sizes from its config (a KV pool made in one piece at start-up): no batch */
static bool one_batch_peak(const rctx_t *x)
{
    return PRIMARY(DNF) && x->f->outlier.holds && x->grad != -1 && !kv_cache_reserving(x);
}
/* the same outlier (facts: outlier) in a generation (phase generation, autograd off): one prompt far longer than the
 * others, padded across its batch, not the working set a generation builds token by token; its length is the lever
 * (an evaluation whose batch is larger than the training's is its batch's size: no phase generation) */
static bool one_input_peak(const rctx_t *x)
{
    return PRIMARY(DNF) && x->f->outlier.holds && x->grad == -1 && PHASE(generation) && !roles_of(x)->gen_fixed_inputs;
}
/* a generate() call given many inputs at once, each of a size its model's processor fixes (roles.generation_input:
 * pixel_values, input_features; facts: gen_fixed_inputs): the number of inputs per call is what grows (a page's line
 * crops, a video's frames), not a length; fixed-size chunks of them keep each call's memory the same and change no
 * output, where fewer new tokens or beams change the outputs */
static bool generation_many_inputs(const rctx_t *x)
{
    return PHASE(generation) && x->grad != 1 && x->trains != 1 && roles_of(x)->gen_fixed_inputs &&
           roles_of(x)->gen_inputs > 1;
}
/* its lead, unless a holder of the program's that is not the pass holds more than every role and the shortfall
 * (roles.dominant: a whole document's pages staged on the device before the loop, each call given a slice): the
 * inputs the call gets are not what filled the card, and chunking them only makes room beside that holder */
static bool generation_many_inputs_lead(const rctx_t *x) { return generation_many_inputs(x) && !og_dominant_holder(x); }
/* one inference input larger than the card: its length is the lever, when something says the request is a
 * model's input (a forward, evaluation or generation frame on the stack, a KV cache held, or the failing
 * statement's sizes: one length twice or more, seq x seq); otherwise (a score or similarity matrix computed outside
 * any model; the statement multiplied different sizes, users x items) splitting the operation is */
static bool larger_inference(const rctx_t *x)
{
    enum og_request_shape shape = roles_of(x)->request_shape;
    return x->larger_than_device && x->grad == -1 && pytorchish(x) && shape != OG_REQ_PRODUCT &&
           !(roles_of(x)->operation == OG_OP_conv && x->req >= roles_of(x)->working) && /* tiles: operation_dominates */
           (PHASE(forward) || PHASE(evaluation) || PHASE(generation) || roles_of(x)->kv >= 0 ||
            shape == OG_REQ_SQUARE || shape == OG_REQ_CUBE);
}
/* its lead, unless the request is cubic in that length (request_shape cube: the statement read one size three times,
 * an operation over every triple of positions, triangle attention's scores for every row at once): no model keeps
 * such a tensor (its own are at most pairs, L x L), the operation makes it and runs exactly over slices of its outer
 * axis (a chunk size), so splitting the operation leads and the input, the user's data, stays whole */
/* ... or every pair of the program's own items (a square request made outside any pass of a model: the adapter
 * read a Python stack and found no forward, evaluation or generation in it, no KV cache; a similarity or affinity
 * matrix over a whole validation set or a recording's windows): the items are the user's data, every one needed, and
 * the operation runs exactly over blocks of rows, so splitting it leads too */
static bool larger_inference_lead(const rctx_t *x)
{
    bool pairs_outside_a_pass = PHASE(unknown) && x->rec->memory.fw.npy_frames > 0 && roles_of(x)->kv < 0 &&
                                roles_of(x)->request_shape == OG_REQ_SQUARE;
    return larger_inference(x) && roles_of(x)->request_shape != OG_REQ_CUBE && !pairs_outside_a_pass;
}
/* one input at a time (roles.batch_size 1: the program's name, or the model's input read) through a model with
 * autograd off, in an evaluation or a forward outside training's steps, its failing tensor at least an
 * OG_BIG_REQ_DIV-th of the card and no KV cache building: there is no batch to shrink, and the input's size (a whole
 * recording, a full-resolution volume, a long document) is what the pass grows with; split into overlapping pieces,
 * or capped, it fits as far as needed, and the next larger input does not fail again; where one operation over it
 * dominates (operation_dominates: a convolution over the whole input, tiled with an overlap), splitting that
 * operation is the same lever and leads instead */
static bool operation_dominates(const rctx_t *x);
static bool one_input_inference(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PRIMARY(DNF) && x->grad == -1 && (PHASE(evaluation) || PHASE(forward)) && ro->known && ro->batch_size == 1 &&
           ro->kv < 0 && x->capacity && x->req * OG_BIG_REQ_DIV >= x->capacity && !operation_dominates(x);
}
/* the request is a product of two different sizes made outside any pass of a model (phase unknown with the failing
 * statement read, no KV cache: an alignment trellis of frames x characters, a score matrix of queries x items): the
 * program's own operation over its data, not a batch of a pass; splitting it (or the input it reads) is the lever */
static bool product_outside_pass(const rctx_t *x)
{
    return PHASE(unknown) && roles_of(x)->kv < 0 && roles_of(x)->request_shape == OG_REQ_PRODUCT;
}
/* no pass of a model runs: phase unknown, and the models measured (roles.models) with none of them running (a
 * notebook cell's or a script's own operation over results it keeps: no batch of the model is in flight) */
static bool no_model_runs(const rctx_t *x)
{
    const og_roles_t *r = &x->rec->memory.fw.roles;
    int nm = OG_FILLED(r->nmodels, r->models);
    if (!PHASE(unknown) || !roles_of(x)->known || nm == 0)
        return false;
    for (int i = 0; i < nm; i++)
        if (r->models[i].running != 0)
            return false; /* running, or not read (-1) */
    return true;
}
/* a one-batch peak (one_batch_peak: a request far larger than any of the earlier steps, which fit) larger than the
 * card: the batches before it fit, and autograd keeps every layer's output of this one for backward, so tiling the
 * failing operation leaves the rest of its pass as large; capping the input's length brings it back to what fit */
/* the failing statement computes something of the program's own while no pass of a model runs (no_model_runs): a
 * failing operation read (roles.operation: an upsample, a distance) or sizes a product of dimensions or one twice
 * (request_shape); a batch's input arriving (x = batch.to("cuda") before the model runs) is neither */
static bool own_operation_outside_pass(const rctx_t *x)
{
    enum og_request_shape sh = roles_of(x)->request_shape;
    return no_model_runs(x) &&
           (roles_of(x)->operation != OG_OPERATION_NONE || sh == OG_REQ_PRODUCT || sh == OG_REQ_SQUARE);
}
/* a one-batch peak that is no operation of the program's own outside a pass: that batch's length is the lever */
static bool batch_peak_in_pass(const rctx_t *x) { return one_batch_peak(x) && !own_operation_outside_pass(x); }
/* a request at least an OG_BIG_REQ_DIV-th of the card, not larger than it, while no pass of a model runs
 * (no_model_runs) and the failing statement's sizes are a product of dimensions or one of them twice (request_shape:
 * queries x corpus, frames x frames): an operation of the program's own over what it made (a score matrix of every
 * query against every document), not a batch; in chunks of rows (a running top-k) it never exists whole */
static bool own_operation_peak(const rctx_t *x)
{
    enum og_request_shape sh = roles_of(x)->request_shape;
    return PRIMARY(DNF) && no_model_runs(x) && (sh == OG_REQ_PRODUCT || sh == OG_REQ_SQUARE) && x->req_known &&
           x->capacity && x->req * OG_BIG_REQ_DIV >= x->capacity && !x->larger_than_device && !own_fix_covers(x);
}
static bool larger_outlier_batch(const rctx_t *x)
{
    return one_batch_peak(x) && x->larger_than_device && !product_outside_pass(x) && !own_operation_outside_pass(x);
}
/* a request larger than the card in a forward with autograd on, where the inputs the failing statement hands the
 * model (roles.stmt_inputs: images and targets, locals of the running loop) are already a quarter of the card: a
 * full-resolution scan's masks, a whole volume; the model's own first operations copy them (a resize to float), so
 * the input's size is the lever, ahead of splitting an operation inside the model's code */
bool og_forward_inputs_fill_card(const rctx_t *x)
{
    return PRIMARY(DNF) && x->larger_than_device && x->grad != -1 && PHASE(forward) && x->capacity &&
           roles_of(x)->stmt_inputs * 4 >= x->capacity;
}
/* the same, where one sample's share of the failing request (roles.batch_size) is at least the earlier steps'
 * largest allocation (a whole earlier batch's): no smaller batch brings it back to what fit */
static bool one_sample_peak(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return one_batch_peak(x) && ro->known && ro->batch_size >= 1 &&
           (double)x->req / (double)ro->batch_size >= (double)x->f->outlier.prev_max;
}
/* a training job copying weight-sized tensors outside the optimizer (an EMA, weight averaging, a snapshot
 * of the model): the job trains (or the statement makes a snapshot: snapshot_stmt), no phase frame (not a forward, evaluation, load or optimizer step) or the
 * adapter's ema_update, the roles measured with fewer activations than the shortfall and parameters to
 * copy, the running code's locals holding tensors; weights_update: phase ema_update, or autograd off and
 * not a snapshot (an EMA's update runs under no_grad) */
static bool weights_copy(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    /* a copy no named object holds yet: the statement builds a checkpoint, or the activations' blocks copy the
     * parameters or the optimizer state (what is left of them beyond the copy must be below the shortfall) */
    bool snap = x->f->snapshot_stmt;
    /* a snapshot or an average copies the training state about once: locals holding many times it (every
     * example's gradient kept, outputs collected) are something else the running code keeps */
    if (ro->state_known && ro->local_held > 2 * ro->state && !snap)
        return false;
    return ro->known && ro->act_known && (x->trains == 1 || snap) && (PHASE(unknown) || PHASE(ema_update)) &&
           ro->params && (ro->local_held || ro->copy_loose || snap || ro->act_copy || PHASE(ema_update)) &&
           (ro->act - ro->act_copy < x->shortfall || snap || PHASE(ema_update)) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* the same, a copy of the whole training state (model and optimizer state_dicts) kept as a snapshot:
 * the running code holds at least one full copy of the parameters, with autograd on (an update of an
 * EMA runs under no_grad) or a dict among its locals (a state_dict being copied) */
static bool state_snapshot(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return weights_copy(x) && !PHASE(ema_update) &&
           (ro->working >= ro->params || ro->copy_loose || x->f->snapshot_stmt || ro->act_copy) &&
           (x->grad != -1 || ro->local_map) && !copy_replaces_model(x);
}
/* an EMA update making a whole new copy of the weights beside the old (out of place: a dict comprehension, foreach
 * without the underscore) that the cache cannot finish (facts: copy_outgrows_cache in phase ema_update), the old copy
 * whole (ema_kept at least 9/10 of the new one: not the first copy being made, a lazy shadow or SWA's start, which
 * has nothing to update in place): in place, the update makes no copy at all */
bool og_ema_out_of_place(const rctx_t *x)
{
    const og_facts_t *f = x->f;
    return PHASE(ema_update) && f->copy_outgrows_cache && f->update_copy &&
           (double)f->roles.ema_kept >= 0.9 * (double)f->update_copy;
}
static bool ema_out_of_place(const rctx_t *x) { return og_ema_out_of_place(x); }
static bool weights_update(const rctx_t *x)
{
    return weights_copy(x) && (PHASE(ema_update) || (x->grad == -1 && !state_snapshot(x)));
}
/* no pass is running: the activations were measured at nothing and what Python objects hold is kept for a purpose
 * its name says (a KV cache, a dataset, an index: roles.holders[].purpose), not outputs; autograd's mode says
 * nothing then (allocating or loading builds no graph) and no activation remedy has anything to shrink */
static bool kept_state_only(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    uint64_t said = 0;
    for (int i = 0; i < OG_NPURPOSES; i++)
        said = add_sat(said, ro->purpose_bytes[i]);
    return ro->known && ro->act_known && ro->act == 0 && ro->held && said >= ro->held;
}
/* a KV cache reserved up front by a job that does not train: a holder kept across calls named or typed
 * as a KV cache (facts: roles.kv) holds at least the shortfall and more than the running code, autograd
 * off (or no pass running: kept_state_only), and the memory did not grow step by step (a growing cache:
 * bounded_cache) */
static bool kv_cache_reserved(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->kv >= 0 && og_covers(x, (double)ro->kv_bytes) && ro->kv_bytes > ro->working &&
           x->trains != 1 && (x->grad == -1 || kept_state_only(x)) && !PRIMARY(GROWTH) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* this process is reserving its KV cache up front: the failing statement builds what the program calls a KV cache
 * (roles.statement's purpose kv_cache: a serving engine allocating its cache layer by layer at start-up) in a job
 * not known to train, outside a generation (whose cache grows token by token: generation_working_set) and a growth;
 * what it holds so far (every holder of purpose kv_cache, the running code's too) and the request are the
 * reservation, sized by the engine's settings (a share of the card, the maximum batch and length), and half of it
 * covers the shortfall.  Autograd's mode says nothing here: allocating a cache builds no graph */
static uint64_t kv_reservation(const rctx_t *x)
{
    return add_sat(roles_of(x)->purpose_bytes[OG_PURPOSE_kv_cache], x->req);
}
/* ... or, the one request larger than the card (a pool sized from another device's total: a MIG slice's parent,
 * a bigger card's config), a pool sized from what is free: any size of it up to the whole reservation, so it covers
 * when the reservation is at least what is missing */
static bool kv_pool_beyond_card(const rctx_t *x) { return x->larger_than_device && kv_reservation(x) >= x->shortfall; }
static bool kv_cache_reserving(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->building == OG_PURPOSE_kv_cache && x->trains != 1 && !PHASE(generation) &&
           !og_generation_growth(x) && !PRIMARY(GROWTH) && x->shortfall &&
           (kv_pool_beyond_card(x) ||
            (!x->larger_than_device && 0.5 * (double)kv_reservation(x) >= (double)x->shortfall));
}
/* processes that are not this program's other instances hold the missing bytes (a stranger's, a run left over with
 * this same command line): stopping them comes first */
static bool strangers_cover(const rctx_t *x)
{
    return PRIMARY(FOREIGN) && sub0(x->other, x->f->other_same_program) >= x->shortfall;
}
static bool kv_pool_reserving_beyond(const rctx_t *x) { return kv_cache_reserving(x) && kv_pool_beyond_card(x); }
/* the reservation leads unless strangers hold the missing bytes; the other processes being this program's other
 * instances (a second server started beside the first) is no reason to stop them */
static bool kv_reserving_lead(const rctx_t *x) { return kv_cache_reserving(x) && !strangers_cover(x); }
static bool kv_reserving_second(const rctx_t *x) { return kv_cache_reserving(x) && strangers_cover(x); }
/* the KV cache leads when no larger reservation (CUDA graphs' pools) is the bigger lever */
static bool kv_cache_lead(const rctx_t *x)
{
    return kv_cache_reserved(x) && roles_of(x)->kv_bytes >= graph_pool_bytes(x);
}
/* a frozen model (a teacher) in a job that runs with autograd on: the adapter's purpose `teacher` for a
 * holder, or a model none of whose parameters requires grad (roles.models), or a running one whose parameters
 * require grad but that no optimizer trains (roles.models[].trained 0), and autograd on at the failure: its
 * forward keeps activations for a backward that never reaches its weights */
static bool frozen_model_autograd_on(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && x->grad == 1 &&
           (ro->purpose_bytes[OG_PURPOSE_teacher] || ro->frozen_models || ro->untrained_running || ro->untrained_ref) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* the same, named a teacher by the program, or measured as trained by no optimizer: a frozen model alone may be
 * one the gradient flows through (a GAN's discriminator in the generator's step, trained by its own optimizer),
 * where no_grad would be wrong, so only a teacher or an untrained model leads */
/* the gradients held are more than the optimizers' parameters (roles: gradients > opt_params > 0) beside a model in eval
 * mode that no optimizer trains (untrained_eval): the program trains something small (a textual inversion's token
 * embedding) whose gradient flows back through that model, and its backward fills the rest, the untrained model's
 * .grad, for nothing; not where a model nothing trains is named a teacher or a reference (a distillation's teacher
 * is a side branch whose output is a target: no gradient need flow through it, and no_grad is the fix) */
static bool grads_untrained(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->opt_params && ro->grads > ro->opt_params && ro->untrained_eval >= ro->grads - ro->opt_params &&
           !ro->purpose_bytes[OG_PURPOSE_teacher] && !ro->untrained_ref;
}
/* a backward through a model in eval mode whose weights require grad and hold gradients (roles gradients > 0), where
 * no optimizer holds a parameter of the device and none has state (facts: untrained_eval; opt_params and
 * optimizer_state 0): an attribution or a
 * saliency map asking for the gradient of the inputs or activations, whose backward fills every weight's .grad for
 * nothing. Backward is what runs (phase backward, the program's code calls it, or the model's input requires grad),
 * so no_grad would lose the gradient asked for: freezing the weights keeps it */
static bool weight_grads_unread(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->untrained_eval && ro->grads && ((!ro->opt_params && !ro->opt) || grads_untrained(x)) &&
           (PHASE(backward) || ro->backward_code || ro->input_grad) && !x->larger_than_device;
}
/* an attribution's pass: gradients asked for (the model's input requires grad, or the running code calls backward or
 * autograd.grad) through a model in eval mode that no optimizer trains and whose weights hold no gradient
 * (untrained_eval, roles gradients 0): integrated gradients' interpolation steps, SmoothGrad's noise samples, run as
 * one batch of copies of one input; chunks of them (the method's internal batch) give the same attribution, where
 * half precision changes the gradients it reads */
bool og_attribution_pass(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->untrained_eval && !ro->grads && !ro->opt_params && !ro->opt && x->grad == 1 &&
           (ro->input_grad || ro->backward_code || x->rec->memory.fw.roles.backward_on_stack > 0) &&
           !x->larger_than_device;
}
static bool teacher_autograd_on(const rctx_t *x)
{
    return frozen_model_autograd_on(x) && (roles_of(x)->purpose_bytes[OG_PURPOSE_teacher] ||
                                           roles_of(x)->untrained_running || roles_of(x)->untrained_ref);
}
/* gradients and optimizer state measured (or about to be made at the first step) for the parameters of
 * a training job: training fewer of them shrinks both */
/* a sparse optimizer (roles.optimizers[].class Sparse*: torch.optim.SparseAdam takes only the sparse gradients of
 * embedding tables made with sparse=True) holds at least half the tables' bytes: tables of ids (users, items) whose
 * rows a batch touches a few of, whatever their number */
bool og_sparse_id_tables(const rctx_t *x, uint64_t *state)
{
    const og_roles_t *r = &x->rec->memory.fw.roles;
    uint64_t sparse = 0, st = 0;
    for (int i = 0; i < OG_FILLED(r->noptimizers, r->optimizers); i++)
        if (!strncmp(r->optimizers[i].cls, "Sparse", 6) && og_known(r->optimizers[i].param_bytes)) {
            sparse = add_sat(sparse, r->optimizers[i].param_bytes.v);
            st = add_sat(st, r->optimizers[i].bytes);
        }
    if (state)
        *state = st;
    return og_known(r->embedding_bytes) && r->embedding_bytes.v && 2 * sparse >= r->embedding_bytes.v;
}
/* the tables are most of the model (og_embedding_tables) and many (a categorical column each: a tabular or
 * recommender model's features), or trained by a sparse optimizer (sparse_id_tables: ids), in models with no
 * attention layer (roles.attention_modules 0: a language model's vocabulary, and the copies of it a PEFT run trains,
 * are a transformer's), in a job that trains: their rows x dimensions set the parameters, the dense gradients and the
 * optimizer's state alike */
static bool categorical_tables(const rctx_t *x)
{
    return og_embedding_tables(x) && (roles_of(x)->embedding_tables >= 4 || og_sparse_id_tables(x, NULL)) &&
           roles_of(x)->attention == -1 && x->trains == 1 && !x->larger_than_device;
}
static bool trains_all_parameters(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && x->trains == 1 && ro->params && (ro->grads || ro->opt || PHASE(optimizer_step)) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* The state a training job keeps at its optimizer steps: the parameters, a gradient for each parameter an
 * optimizer holds (roles.optimizers[].parameters_bytes), and the optimizer's state: measured, and for an
 * Adam-family optimizer at least its two moments (2x those parameters: at a first step that is still making them,
 * what it made so far is part of it).  0 when no optimizer holds the failing device's parameters (the job is not
 * known to train them). */
static double state_at_step(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!ro->known || !ro->opt_params)
        return 0;
    double trained = (double)ro->opt_params;
    double st = (double)ro->opt;
    if (ro->opt_adam && 2.0 * trained > st)
        st = 2.0 * trained;
    return (double)ro->params + trained + st;
}
/* that state alone is at least the card (or the limit): whatever the batch, the job fails at its first step;
 * training fewer parameters, sharding or offloading the state are the levers */
static bool state_exceeds_card(const rctx_t *x)
{
    return x->trains == 1 && x->capacity && state_at_step(x) >= (double)x->capacity && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* The cap that refused the request, not the card: the cap (OOMGUARD_LIMIT under cause limit, or the framework's
 * own under framework_cap binding) is at most the job's state at its optimizer steps (state_at_step: no batch of
 * this job ever fits under it), and that state with this pass's activations, what the process holds outside the
 * framework (its CUDA context) and the request fits 97% of what the device gives this process without the cap:
 * its measured free bytes (device.free_bytes: other processes' memory already taken out) plus what the process
 * holds.  Raising the cap is then the whole fix; shrinking the job is for a cap it could fit under */
bool og_cap_not_the_card(const rctx_t *x, og_uncapped_t *u)
{
    const og_record_t *r = x->rec;
    og_uncapped_t v = { 0, 0, 0, 0 };
    if (HAS(LIMIT) && og_known(r->device.limit_bytes))
        v.cap = r->device.limit_bytes.v;
    else if (HAS(FWCAP) && x->f->cap.binds)
        v.cap = x->f->cap.cap;
    double state = x->trains == 1 ? state_at_step(x) : 0;
    if (u)
        *u = v;
    if (!v.cap || state <= 0 || state < (double)v.cap || !og_known(r->device.free_bytes) || !x->req_known ||
        !roles_of(x)->act_known)
        return false;
    v.state = (uint64_t)state;
    uint64_t outside = x->footprint > x->tracked ? x->footprint - x->tracked : 0;
    v.need = add_sat(add_sat(v.state, roles_of(x)->act), add_sat(outside, x->req));
    v.room = add_sat(r->device.free_bytes.v, x->footprint);
    if (u)
        *u = v;
    return (double)v.need <= 0.97 * (double)v.room;
}
static bool limit_not_the_card(const rctx_t *x) { return HAS(LIMIT) && og_cap_not_the_card(x, NULL); }
static bool fw_cap_not_the_card(const rctx_t *x) { return !HAS(LIMIT) && HAS(FWCAP) && og_cap_not_the_card(x, NULL); }
/* the weights are float32 (roles.parameters_by_dtype: at least 3/4 of the parameters' bytes) and, with
 * their gradients (which take their dtype), at least half of what the framework holds, outside an optimizer
 * step (whose state is the lever there): loaded in their checkpoint's half precision, weights and gradients
 * halve.  A bf16 checkpoint loaded without torch_dtype materialises in float32.  In a job that trains, where
 * float32 weights may be master weights kept on purpose, only in a load or a pass (the adapter's phase; not
 * code copying weights) and when the state at its steps halved (the moments take the parameters' dtype) and
 * this pass's activations fit the card: else halving moves the failure to the first step, and training
 * fewer parameters or sharding is the lever */
/* the weights are float64 (roles.parameters_by_dtype: at least 3/4 of them): everything computed from them is
 * float64 too, 8 bytes a value; autocast leaves float64 operations as they are */
static bool fp64_weights(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->dtypes_known && ro->params && (double)ro->params_fp64 >= 0.75 * (double)ro->params;
}
/* ... its lead: where the float64 weights are a network's (at least FP64_NETWORK_MIN), float64 is how the model is
 * configured (an MD potential's default_dtype) and float32 its usual alternative; a handful of float64 scalars (a
 * Gaussian process's kernel hyperparameters, a stochastic model's parameters) are a numerical method's, which chose
 * float64 for its accuracy: what it computes is sized by its data (points, paths), the lever the operation's or the
 * batch's, and float32 stays listed, not first */
#define FP64_NETWORK_MIN (1ULL << 20)
static bool fp64_network(const rctx_t *x) { return fp64_weights(x) && roles_of(x)->params_fp64 >= FP64_NETWORK_MIN; }
/* the data are float64 (roles.holders[].float64_bytes: at least a quarter of what the framework allocated): a numpy or
 * pandas array (float64 by default, rolling windows and means upcast to it) copied to the GPU as it was; float32 halves
 * it, and a model that computes on it in float64 (model.double() to match) with it */
static bool fp64_data(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    const og_opt_u64_t a = x->rec->memory.fw.roles.allocated_bytes;
    return ro->known && ro->held_fp64 && og_known(a) && 4 * ro->held_fp64 >= a.v;
}
static bool fp32_weights(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    bool alloc_known = og_known(x->rec->memory.fw.roles.allocated_bytes);
    uint64_t alloc = x->rec->memory.fw.roles.allocated_bytes.v;
    bool pass = PHASE(loading) || PHASE(forward) || PHASE(backward) || PHASE(evaluation) || PHASE(generation) ||
                (x->trains != 1 && !PHASE(optimizer_step));
    double halved = state_at_step(x) * (1.0 - 0.5 * (double)ro->params_fp32 / (double)(ro->params ? ro->params : 1));
    return ro->known && ro->dtypes_known && ro->params && (double)ro->params_fp32 >= 0.75 * (double)ro->params &&
           alloc_known && alloc && 2.0 * ((double)ro->params + (double)ro->grads) >= (double)alloc && pass &&
           !(x->capacity && halved + (double)ro->act >= (double)x->capacity) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* a model loaded in float32 beside one in half precision (roles.fp32_beside_half), in a job not known to train,
 * failing in a pass or a load: the float32 one was left in the default dtype (from_pretrained without torch_dtype),
 * not chosen for training; loaded in its checkpoint's bf16 it halves */
static bool fp32_beside_half(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->fp32_beside_half && x->trains != 1 &&
           (PHASE(loading) || PHASE(forward) || PHASE(evaluation) || PHASE(generation) || PHASE(unknown)) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* a quantized model beside a reference of its class with nothing quantized (roles.quant_reference): the program
 * measures the quantized model against its reference, which must keep its precision; the quantized one is already
 * the thing under test */
static bool quant_beside_reference(const rctx_t *x) { return roles_of(x)->quant_reference > 0; }
/* the program sums several passes' losses into one tensor whose graph is still alive (roles.accumulating), or
 * caches micro-batches' outputs with their graphs for a later backward (roles.graph_cache: a fill-and-drain
 * pipeline schedule), while a forward pass (or the one backward on the sum) runs in a job that may train: every
 * micro-batch's activations stay alive until that backward; a backward per micro-batch frees each graph as it goes */
static bool summed_microbatches(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && (ro->accumulating || ro->graph_cache >= 0) && ro->act_known && ro->act && x->trains != -1 &&
           x->grad != -1 && (PHASE(forward) || PHASE(backward) || PHASE(unknown)) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* the program pads its inputs to a fixed maximum length (roles.padding_to_max_length) and the failing pass runs
 * over them (forward, backward, evaluation, generation or unknown), activations measured: padded to each batch's
 * longest input, every activation shrinks by the padding's share (not measured: the cover stays unknown) */
static bool padded_to_max(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->pads_to_max && ro->act_known && ro->act &&
           (PHASE(forward) || PHASE(backward) || PHASE(evaluation) || PHASE(generation) || PHASE(unknown)) &&
           !own_fix_covers(x);
}
/* the same, leading, except after a confident growth (padding makes every batch the same size: it grows nothing) */
static bool padded_to_max_lead(const rctx_t *x) { return padded_to_max(x) && !confident_growth(x); }
/* the program asks a model for per-layer or per-token outputs (roles.extra_outputs: output_hidden_states,
 * output_attentions, a generation's output_scores / output_logits) and the failing pass is one that keeps them
 * (forward, evaluation, generation or unknown; not a backward or a step), activations measured, autograd not on or
 * checkpointing in force (with autograd on and no checkpointing, the graph keeps every layer's output for backward
 * already: returning them keeps nothing more, and the graph is the lever; checkpointing keeps only its boundaries,
 * and the returned outputs are more): asked only for what the job uses, the pass keeps one layer's or the chosen
 * tokens' (the share is not measured) */
static bool checkpointing_in_force(const rctx_t *x);
static bool extra_outputs(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->extra_outputs && ro->act_known && (ro->act || ro->working) &&
           (x->grad != 1 || checkpointing_in_force(x)) &&
           (PHASE(forward) || PHASE(evaluation) || PHASE(generation) || PHASE(unknown)) && !own_fix_covers(x);
}
/* a decoding pass's logits for every position (og_all_position_logits), unless another process's or framework's
 * memory is the fix */
static bool all_position_logits(const rctx_t *x) { return og_all_position_logits(x) && !own_fix_covers(x); }
/* ... first, unless the growth is held across calls by a holder of its own (kept_grower: an object's list filled
 * step after step, not a local of the running call) that covers the shortfall: that holder, not the call's
 * outputs, filled the card */
static bool extra_outputs_first(const rctx_t *x)
{
    if (!extra_outputs(x))
        return false;
    uint64_t g = kept_grower(x);
    if (!g || !og_covers(x, (double)g))
        return true;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[roles_of(x)->grower];
    char where[sizeof h->where];
    og_cpy(where, sizeof where, h->where, sizeof where);
    return og_where_local(where); /* the running call's own rise */
}
/* a rank of a multi-rank job (WORLD_SIZE > 1) fails while loading the weights: every rank loading the whole model
 * onto its GPU before a sharder (FSDP, ZeRO-3) splits it; loaded on the CPU or the meta device, each rank holds its
 * shard only (the saving: all but 1/WORLD_SIZE of what the load put here so far) */
static bool rank_loads_whole_model(const rctx_t *x)
{
    return PHASE(loading) && x->rec->world_size > 1 && !own_fix_covers(x) && !x->larger_than_device;
}
/* ... first, unless torch.load is restoring a checkpoint onto the GPU (checkpoint_restore_first): a restore on the
 * host is then what keeps each rank to its shard (the old ranks' files of an elastic restart, each loaded whole) */
static bool rank_loads_whole_model_first(const rctx_t *x)
{
    return rank_loads_whole_model(x) && !checkpoint_restore_first(x);
}
/* a load moving a model larger than the card itself onto it: its parameters here and the rest still elsewhere
 * (roles.models' parameters_elsewhere_bytes: the host, the meta device) together reach the card's capacity */
static bool model_exceeds_card(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PHASE(loading) && ro->known && ro->model_away && x->capacity &&
           add_sat(ro->model_params, ro->model_away) >= x->capacity;
}
/* ... on a rank of a multi-rank job that loads the whole model onto each rank (DeepSpeed's stages 0-2, DDP): no
 * order of loading fits it, the weights themselves must be split across the ranks (ZeRO-3, FSDP) */
static bool rank_model_exceeds_card(const rctx_t *x) { return rank_loads_whole_model(x) && model_exceeds_card(x); }
/* a dataset the job keeps on the device grows (a replay buffer filling, episodes appended): the largest holder of
 * the growth (facts: roles.grower) has the purpose dataset, kept across calls or by the running loop (a replay
 * buffer is a local of main as often as an attribute): kept in host memory and sampled a batch at a time, it
 * stops growing on the GPU */
static bool growing_dataset(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!ro->known || !PRIMARY(GROWTH) || ro->grower < 0)
        return false;
    return og_holder_purpose(x->f, x->rec, ro->grower) == OG_PURPOSE_dataset && !own_fix_covers(x);
}
/* activation checkpointing is in force for the layer that failed (roles.gradient_checkpointing true): turning it
 * on changes nothing */
static bool checkpointing_in_force(const rctx_t *x) { return roles_of(x)->known && roles_of(x)->checkpointing == 1; }
/* attention computed eagerly (roles.operation attention: its score matrices made whole) fails, or the dense mask
 * made for it (attention_mask: a packed batch's L x L block-causal mask): a fused kernel (SDPA, FlashAttention's
 * variable-length one, given the sequences' lengths) never makes them, whatever the batch or the checkpointing */
static bool eager_attention(const rctx_t *x)
{
    enum og_operation op = roles_of(x)->operation;
    return roles_of(x)->known && (op == OG_OP_attention || op == OG_OP_attention_mask) && x->req_known &&
           !own_fix_covers(x);
}
/* an attention's scores failed and the other processes hold less than the shortfall and another request of their
 * size (facts: others_short_of_scores): stopping them carries the pass one tensor further */
static bool others_short_of_scores(const rctx_t *x) { return x->f->others_short_of_scores; }
static bool eager_attention_lead(const rctx_t *x) { return eager_attention(x) && !confident_growth(x); }
/* the extra outputs asked for are the attention weights (output_attentions=True): a fused attention kernel returns
 * none, so the model runs its eager attention for them, and the outputs' remedy comes before the kernel's */
static bool attentions_asked(const rctx_t *x)
{
    const og_code_setting_t *cs = &x->rec->memory.fw.roles.settings[OG_SETTING_extra_outputs];
    return extra_outputs(x) && cs->has && strncmp(cs->key, "output_attentions", sizeof cs->key) == 0;
}
/* a batch of this job fit before the failing one: the optimizer made at least two steps (so a pass ran with
 * the state it keeps now: the first step makes an Adam-family optimizer's state, after its pass) and the failing
 * pass is one of those training passes (an evaluation or a generation is another pass: that training batches fit
 * says nothing of it), or the failing request is an outlier (>= 4x any earlier allocation after steps that freed
 * memory).  Bucketing by length evens out batches that fit; it cannot carry a pass that outgrows the cache when
 * no such batch ran */
static bool batch_fit_before(const rctx_t *x)
{
    return (roles_of(x)->steps_made >= 2 && !PHASE(evaluation) && !PHASE(generation)) || x->f->outlier.holds;
}
static bool pass_outgrows_first(const rctx_t *x) { return pass_outgrows(x) && !batch_fit_before(x); }
/* a training pass keeping every activation for backward: the job trains, autograd on, activation
 * checkpointing measured off for the failing pass (roles.gradient_checkpointing false) and the activations at
 * least half of what the framework holds: recomputing them in backward is the lever */
static bool checkpointing_off(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->checkpointing == -1 && x->trains == 1 && x->grad == 1 && activations_dominate(x) &&
           !own_fix_covers(x) && !x->larger_than_device && !og_feeds_no_backward(x);
}
/* ... and may lead, unless the failing request alone is a quarter of the card or more in a forward pass: one
 * layer's own tensor (an attention's scores over a batch folded from many series) that checkpointing keeps, and
 * makes again with its gradient in the recomputation; what sizes it (the batch) is the lever */
static bool checkpointing_off_leads(const rctx_t *x)
{
    return checkpointing_off(x) && !(PHASE(forward) && x->capacity && x->req * 4 >= x->capacity);
}
/* the optimizer's state is new since a pass of this batch fit: exactly one step made (it made the state after
 * its pass), the failing pass the next one (forward or backward), and 8 bits of that state would cover the
 * shortfall: the state tipped it, so shrinking it belongs next to shrinking the activations */
static bool state_new_since_pass(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->steps_known && ro->steps_made == 1 && ro->opt_full && (PHASE(forward) || PHASE(backward)) &&
           og_covers(x, 0.75 * (double)ro->opt_full) && !own_fix_covers(x) && !x->larger_than_device;
}

/* the evidence leaves nothing for the activation remedies to shrink: the roles measured, and the job was
 * loading, stepping its optimizer, or updating weights outside it, or a running model's weights are all the device
 * holds (roles.weights_only: a load or a move no phase frame names) */
static bool no_activations(const rctx_t *x)
{
    return roles_of(x)->known && (PHASE(loading) || PHASE(optimizer_step) || PHASE(ema_update) || weights_copy(x) ||
                                  roles_of(x)->weights_only || kept_state_only(x));
}

/* mixed precision is in force for the pass though autocast is off at the failing line: the program's running
 * code enters autocast (roles.autocast_in_code) and the failure is where autocast does not reach or keeps float32
 * anyway: a backward pass (its ops take the forward's dtypes), or the loss over logits (roles.operation
 * cross_entropy: PyTorch's autocast runs cross_entropy, log_softmax and nll_loss in float32, and the logits are
 * upcast for them); turning it on adds nothing */
/* mixed precision half applied: the program scales its float16 loss (a GradScaler) and never enters autocast, so the
 * pass that failed (forward or backward, autocast off) runs in float32 */
static bool scaler_without_autocast(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->scaler_only && x->autocast != 1 && (PHASE(forward) || PHASE(backward));
}
/* a training pass in float32 on a card with tensor cores (compute capability 7.0 or later): autocast measured off
 * at the failure and entered in no frame of the code, the weights at least half float32, autograd on in a forward
 * or backward whose activations are half of what is allocated or more: autocast halves them and runs faster, where
 * checkpointing recomputes, so half precision comes first (a bf16 flag switched off on a V100 without bf16 leaves
 * fp16 autocast with a GradScaler); not for a peak from one batch (one_batch_peak: that input's size is the lever),
 * nor beside DDP's bucket copy of the gradients (ddp_buckets_lead: a copy dropped costs nothing, it comes first) */
static bool ddp_buckets_lead(const rctx_t *x);
static bool fp32_training(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return pytorchish(x) && ro->known && x->trains == 1 && x->grad == 1 && x->autocast == -1 && !ro->autocast_code &&
           x->cc_known && x->cc >= 70 && (PHASE(forward) || PHASE(backward)) && mostly_fp32(ro) &&
           activations_dominate(x) && !own_fix_covers(x) && !x->larger_than_device && !one_batch_peak(x) &&
           !ddp_buckets_lead(x);
}
static bool autocast_in_force(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->autocast_code && x->autocast != 1 &&
           (PHASE(backward) || ro->operation == OG_OP_cross_entropy);
}

/* the failing operation is a loss over logits (roles.operation cross_entropy: cross_entropy, log_softmax,
 * nll_loss on the stack): its [tokens, vocabulary] tensors are the request; a fused or chunked loss never makes
 * them whole */
static bool cross_entropy_op(const rctx_t *x)
{
    return roles_of(x)->operation == OG_OP_cross_entropy && !own_fix_covers(x) && !x->larger_than_device;
}
/* one operation that can be split (an image decoder at full resolution, an all-pairs distance, a kernel matrix:
 * roles.operation)
 * makes a tensor at least as large as everything else the running pass holds (activations and locals): the
 * operation, not the batch's activations, is the peak; splitting it into tiles or slices shrinks that tensor */
/* what the failing operation's own full-size tensors take, alive together: an all-pairs operation makes several
 * of its pairs' size (box IoU: both corners of the overlap, its sides, the intersection; a distance: the cross term
 * and both squared norms): three of the failing size; a convolution's input and output maps at full resolution, a
 * kernel matrix and the copy its next step makes (scaled, the noise added to its diagonal): two; a decoder's
 * output: one */
static uint64_t op_tensor_bytes(const rctx_t *x)
{
    enum og_operation op = roles_of(x)->operation;
    return op == OG_OP_pairwise                            ? add_sat(x->req, add_sat(x->req, x->req))
           : op == OG_OP_conv || op == OG_OP_kernel_matrix ? add_sat(x->req, x->req)
                                                           : x->req;
}
static bool operation_dominates(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    /* a convolution, pooling or normalization over an image (roles.operation conv) with autograd off: an
     * inference pass over one huge input, tiled with an overlap (sliding windows) whatever its size, the card's
     * too; with autograd on the step keeps every layer's output for backward, the batch is the lever */
    bool conv = ro->operation == OG_OP_conv && autograd_off(x);
    uint64_t op_bytes = op_tensor_bytes(x);
    return ro->known && ro->act_known &&
           (ro->operation == OG_OP_image_decode || ro->operation == OG_OP_pairwise ||
            ro->operation == OG_OP_kernel_matrix || conv) &&
           x->req_known && op_bytes >= ro->working && !own_fix_covers(x) && (!x->larger_than_device || conv);
}
/* the failing operation is a transducer's loss or joint network (roles.operation transducer_loss): its [batch,
 * frames, target tokens, vocabulary] tensors are the request, and a smaller batch shrinks them no faster than it
 * shrinks everything else; the joint and the loss in sub-batches (a fused batch) or pruned never make them whole */
static bool transducer_op(const rctx_t *x)
{
    return roles_of(x)->operation == OG_OP_transducer_loss && !own_fix_covers(x) && !x->larger_than_device;
}
/* these lead unless short, except after a confident growth (a leak fills any card whatever the operation) */
static bool cross_entropy_lead(const rctx_t *x) { return cross_entropy_op(x) && !confident_growth(x); }
/* a training step's logits for every position (roles.stmt_logits: the failing statement makes or reads a model's
 * logits, `logits = logits.float()` before the loss; the loss itself not yet on the stack), autograd on in a job that
 * trains, the request at least an OG_BIG_REQ_DIV-th of the card: the [tokens, vocabulary] tensors a loss reads, which
 * a fused or chunked loss never makes whole */
static bool training_logits(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->stmt_logits && ro->operation != OG_OP_cross_entropy && x->trains == 1 && x->grad == 1 &&
           x->req_known && x->capacity && x->req * OG_BIG_REQ_DIV >= x->capacity && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* ... leading where those logits are at least the rest of the pass (the activations alive beside them): else the
 * pass's length and batch are the larger lever, and a fused loss comes after them */
static bool training_logits_lead(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return training_logits(x) && !confident_growth(x) && ro->act_known && x->req >= ro->act;
}
/* a graph network's message passing failed (roles.operation graph_messages: a tensor per edge or node of the graph
 * given): the graph's size is the lever, sampled subgraphs or a capped fan-out, ahead of tiling the one operation
 * (the layers after it are as large) and of a batch that is the whole graph */
static bool graph_messages(const rctx_t *x)
{
    return PRIMARY(DNF) && roles_of(x)->operation == OG_OP_graph_messages && !own_fix_covers(x);
}
static bool graph_messages_lead(const rctx_t *x) { return graph_messages(x) && !confident_growth(x); }
/* a holder keeping one record per layer of the running pass (facts: layer_holder), which with the records the layers
 * still to come would add covers the shortfall: a prefill's keys and values kept on the GPU, a hook keeping each
 * layer's output; dropping each record once used (or moving it off the GPU) keeps the pass at one layer's */
static bool layer_holder_grows(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    if (!ro->known || ro->layer_holder < 0)
        return false;
    return og_layer_holder_kept(x) && ro->layer_holder_to_come && PRIMARY(DNF) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
static uint64_t layer_holder_bytes(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->layer_holder >= 0 ? x->rec->memory.fw.roles.holders[ro->layer_holder].bytes : 0;
}
static bool transducer_lead(const rctx_t *x) { return transducer_op(x) && !confident_growth(x); }
static bool operation_dominates_lead(const rctx_t *x) { return operation_dominates(x) && !confident_growth(x); }
/* the failing call inside a comprehension of the program's (facts: comprehension) outside any pass of a model (phase
 * unknown), the running code's temporaries at least 4x the request: one result made per item and all kept until it
 * ends (a batch of decoded frames converted to float at once); in chunks of items, each reduced before the next (a
 * crop, a pool, a copy to the host), the peak is a chunk's. A copy of the model's weights made so (a snapshot,
 * [p.clone() for p in model.parameters()]) is weights_copy's: kept whole, off the GPU */
bool og_comprehension_builds(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PRIMARY(DNF) && PHASE(unknown) && x->f->comprehension >= 0 && ro->known && ro->act_known &&
           (double)ro->act >= 4.0 * (double)x->req && !weights_copy(x);
}
/* one big temporary of a computation outside any model (facts: roles.loose_operation: no parameters, no pass, the
 * statement's sizes rows x columns, the earlier temporaries of the same operation alive): a block of fewer rows,
 * reduced before the next, is the lever; there is no batch, no model to shrink */
static bool loose_operation(const rctx_t *x)
{
    return roles_of(x)->loose_operation && PRIMARY(DNF) && !own_fix_covers(x) && !x->larger_than_device;
}
/* the same in a job not known to train: one batch of the whole pipeline is the operation's slices (a sliced
 * decode runs one image at a time), so a smaller batch is not the lever before splitting */
static bool operation_dominates_inference(const rctx_t *x) { return operation_dominates(x) && x->trains != 1; }
/* models the running code holds by a name beside another of their class, not a leftover (roles.models: named,
 * running), holding the missing bytes, in a job not known to train: two models compared side by side; or, while a
 * model loads, one of another class a name holds and nothing runs, with what that name keeps beside it
 * (roles.other_resident: a generation engine kept while the scorer loads) */
static uint64_t resident_bytes(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->named_copies >= x->shortfall ? ro->named_copies : ro->other_resident;
}
static bool resident_models(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && x->trains != 1 && x->shortfall && resident_bytes(x) >= x->shortfall &&
           ro->model_copies < x->shortfall && !own_fix_covers(x) && !x->larger_than_device;
}
/* ... two of one class (a comparison, an ensemble: one at a time is the fix), or only one of another class (an
 * engine that may still serve beside the model loading: its own settings, a KV cache's size, come first) */
static bool resident_same_class(const rctx_t *x)
{
    return resident_models(x) && roles_of(x)->named_copies >= x->shortfall;
}
static bool resident_other_class(const rctx_t *x) { return resident_models(x) && !resident_same_class(x); }
/* the second copy of a model a training job's evaluation holds: one held by a name of the running code, not frozen
 * (an EMA, a teacher are kept on purpose); or a deep copy under way that rebinds no model's name (eval_model =
 * copy.deepcopy(model), not yet named): all of what it copies (facts: roles.copy_source), at least what it made */
static uint64_t eval_copy_bytes(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    uint64_t named = ro->named_frozen ? 0 : ro->named_copies;
    uint64_t making = 0;
    if (ro->operation == OG_OP_copy && ro->copy_made_known && !ro->copy_replaces)
        making = ro->copy_source > ro->copy_made ? ro->copy_source : ro->copy_made;
    return named > making ? named : making;
}
/* a training job holding a second copy of its model (copy.deepcopy(model) for evaluation), failing while
 * evaluating (the phase, or autograd off outside an optimizer step, an EMA update or a load): the copy is what
 * evaluation added */
static bool eval_copy(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    bool evaluating = x->f->phase == OG_JP_evaluation ||
                      (x->grad == -1 && (x->f->phase == OG_JP_unknown || x->f->phase == OG_JP_forward));
    return ro->known && x->trains == 1 && x->shortfall && eval_copy_bytes(x) >= x->shortfall &&
           ro->model_copies < x->shortfall && evaluating && !own_fix_covers(x) && !x->larger_than_device;
}
/* a dataset kept whole on the device (holders of purpose dataset kept across calls: a global, an attribute; facts:
 * roles.dataset_kept) holds the missing bytes, the memory did not grow (a dataset is loaded once): moved to host
 * memory and copied a batch at a time, it costs the GPU one batch */
static bool dataset_on_gpu(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->dataset_kept && x->shortfall && ro->dataset_kept >= x->shortfall && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* a search index kept whole on the device (holders of purpose index kept across calls: a retriever's vectors, a flat
 * index's matrix; facts: roles.index_kept) holds the missing bytes, the memory did not grow: searched from host
 * memory or stored compressed, it leaves the model its working memory */
static bool index_on_gpu(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->index_kept && og_covers(x, (double)ro->index_kept) && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* A second copy of weights the program keeps for good (facts: ema_kept, reference_copy, repeated_components) holds
 * the missing bytes, the memory did not grow and no other process's or rank's bytes are the measured cause: what the
 * copy is says the fix.  An EMA kept on the device between its updates, in a job not known inference */
static bool ema_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->ema_kept && og_covers(x, (double)ro->ema_kept) && x->trains != -1 && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* copies of the weights or their state kept across steps for no purpose their names say (facts: copy_kept: weight
 * snapshots for averaging, a best model, a rollback point) holding the missing bytes, in a job not known inference */
static bool copy_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->copy_kept && og_covers(x, (double)ro->copy_kept) && x->trains != -1 && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* a preference-tuning reference kept beside the trained policy, holding the missing bytes and more than any holder
 * kept across calls (a buffer that fills every iteration is the cause then, not the reference) */
static bool reference_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->reference_copy && og_covers(x, (double)ro->reference_copy) &&
           ro->keeper_bytes <= ro->reference_copy && x->trains == 1 && !PRIMARY(GROWTH) && !own_fix_covers(x) &&
           !x->larger_than_device;
}
/* ... beside a policy that trains adapters on a base of the reference's size: the policy without them is the
 * reference */
static bool reference_on_base(const rctx_t *x) { return reference_kept(x) && roles_of(x)->reference_base; }
/* ... beside a policy that trains all its weights: the reference's outputs computed first, then the reference freed
 * (one model at a time), or adapters, whose base is the reference */
static bool reference_full(const rctx_t *x) { return reference_kept(x) && !roles_of(x)->reference_base; }
/* the same frozen components loaded again for each pipeline (self.unet on three pipelines) */
static bool repeated_components(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->repeated_components && og_covers(x, (double)ro->repeated_components) && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* a second set of components beside the program's own models (facts: twin_components: a pipeline kept after it made
 * its images, its self.unet a frozen twin of the unet being trained) */
static bool pipeline_twins(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->twin_components && og_covers(x, (double)ro->twin_components) && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* the trained model, its gradients and optimizer state still referenced while another model loads */
static bool trained_model_kept(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return ro->known && ro->trained_kept && og_covers(x, (double)ro->trained_kept) && !PRIMARY(GROWTH) &&
           !own_fix_covers(x) && !x->larger_than_device;
}
/* the same, kept by other objects only (facts: trained_by_others: trainer.model, pipe.model; the program's own
 * names of it gone): those references are the fix, not a plan of one model at a time */
static bool trained_model_held_by_others(const rctx_t *x)
{
    return trained_model_kept(x) && roles_of(x)->trained_by_others;
}
/* DistributedDataParallel keeps a flat bucket copy of every gradient (roles.ddp: gradient_as_bucket_view off) */
static bool ddp_buckets(const rctx_t *x) { return roles_of(x)->ddp_buckets > 0 && x->trains != -1; }
/* the same, leading unless short, except after a confident growth (a leak fills any card) */
static bool ddp_buckets_lead(const rctx_t *x) { return ddp_buckets(x) && !confident_growth(x); }

/* another GPU for the work (facts: spare): a GPU this process leaves idle, or a GPU of a split model (not a
 * DataParallel replica) with room for the missing bytes; not for a request larger than any card, ranks of a job
 * (set_device), a limit or a cap (their own levers) */
static bool spare_ok(const rctx_t *x)
{
    return !x->larger_than_device && (!HAS(PEERS) || x->f->parent_only) && !HAS(LIMIT) && !HAS(FWCAP) && !HAS(OTHERFW);
}
static bool idle_gpu(const rctx_t *x) { return x->f->spare.idle && spare_ok(x); }
/* the failing statement reads a model whose parameters are on another GPU than the failing one (the adapter's
 * roles.statement_model_device): what it makes belongs beside that model; a device given as "cuda" is the current
 * device, the first GPU unless the code selects another */
static bool model_on_other_gpu(const rctx_t *x) { return x->f->model_gpu_elsewhere >= 0; }
static bool uneven_split(const rctx_t *x) { return x->f->spare.split && spare_ok(x); }
/* they lead unless short, except after a confident growth (a leak fills the other GPU too) */
static bool idle_gpu_lead(const rctx_t *x) { return idle_gpu(x) && !confident_growth(x); }
static bool uneven_split_lead(const rctx_t *x) { return uneven_split(x) && !confident_growth(x); }
/* a registry of models leads (a bounded set of them resident), unless another GPU of the job has the room: the models
 * placed over the cards first (a registry that put every tenant on GPU 0, the other card idle) */
static bool model_registry(const rctx_t *x);
static bool model_registry_lead(const rctx_t *x)
{
    return model_registry(x) && !idle_gpu_lead(x) && !uneven_split_lead(x);
}
/* what can move to the idle GPU: the frozen models (a teacher: its forward needs no gradient) and the models held
 * beside another of their class; 0 none measured */
static uint64_t movable_models(const rctx_t *x)
{
    return add_sat(roles_of(x)->frozen_models, roles_of(x)->named_copies);
}
/* a training state larger than this card (state_exceeds_card) while cards like it sit idle, still larger without
 * the models that could move to one of them (a frozen teacher): no one card holds it, so the state is sharded over
 * them (one process per GPU, FSDP or ZeRO-3), not a part of the work moved */
static bool state_exceeds_card_gpus(const rctx_t *x)
{
    return state_exceeds_card(x) && idle_gpu(x) && state_at_step(x) - (double)movable_models(x) >= (double)x->capacity;
}

/* ------------------------------------------------------------------ rows */

enum effect {
    WANT,         /* offer them */
    DROP,         /* do not offer them */
    ONLY,         /* offer these and nothing else */
    ORDER,        /* checklist position: value, value + step, ... */
    ORDER_COVERS, /* the same, for those whose estimate covers the shortfall (tier 1) */
    LEAD,         /* tier 0 at position value, value + step, ... */
    LEAD_COVERS,  /* the same, unless its estimate cannot cover the shortfall (tier 3) */
    TIER,         /* tier value */
    TIER_CAP,     /* tier at most value */
    DEMOTE,       /* tier value for those not leading (tier > 0) */
    REPLACE,      /* the second takes the first's place (its tier and position) */
};
static const char *const effect_names[] = {
    "want", "drop",         "only",   "order",  "order if it covers", "lead", "lead unless short",
    "tier", "tier at most", "demote", "replace"
};

#define REMS(...)           \
    {                       \
        __VA_ARGS__, R_NONE \
    }
typedef struct og_rank_row {
    const char *name;
    bool (*when)(const rctx_t *);
    enum effect effect;
    int value, step;
    int rem[16];
    const char *reads; /* the facts the condition reads */
    const char *cases; /* corpus cases that motivate it */
} og_rank_row_t;

static const og_rank_row_t bring[] = {
    { "limit", limit_holds, WANT, 0, 0,
      REMS(R_RAISE_LIMIT, R_INFERENCE, R_MIXED, R_SMALLER_BATCH, R_SHORTER_SEQ, R_CHECKPOINTING), "cause limit",
      "limit_emulates_16gb" },
    { "limit_cache", limit_cache, WANT, 0, 0, REMS(R_EMPTY_CACHE), "cause limit, cache known > 0 or unmeasured",
      "limit_emulates_16gb" },
    { "cache_app_pool", cache_app_pool, WANT, 0, 0, REMS(R_POOL_TRIM), "cause cache_held, application pool slack",
      "app_mempool_idle" },
    { "cache_framework", cache_framework, WANT, 0, 0, REMS(R_EMPTY_CACHE), "cause cache_held",
      "cudnn_workspace_cache" },
    { "fragmentation", frag_holds, WANT, 0, 0, REMS(R_EMPTY_CACHE, R_RESTART, R_EXPANDABLE), "cause fragmentation",
      "frag_varlen_adapter" },
    { "fragmentation_bucket", frag_variable, WANT, 0, 0, REMS(R_BUCKET),
      "cause fragmentation, distinct sizes >= 8 or a retry that freed 0 B", "frag_varlen_noadapter" },
    { "other_processes", others_hold, WANT, 0, 0, REMS(R_FOREIGN, R_RESTART), "cause foreign_memory or non_framework",
      "stale_process_60pct" },
    { "contexts", contexts_beyond_one, WANT, 0, 0, REMS(R_SHARE_CONTEXT),
      "cause non_framework, two or more contexts of this process on the failing device (facts: contexts)",
      "camera_threads_contexts" },
    { "growth", growth_holds, WANT, 0, 0, REMS(R_RELEASE_REFS, R_INFERENCE, R_RESTART), "cause growth",
      "loss_history_leak" },
    { "growth_cache", growth_cache, WANT, 0, 0, REMS(R_EMPTY_CACHE), "cause growth, cache known > 0",
      "leak_async_backend" },
    { "growth_kept_on_purpose", growth_on_purpose, WANT, 0, 0, REMS(R_SMALLER_BATCH, R_SHORTER_SEQ),
      "primary growth marked by the failing size, autograd off, not training", "generate_kv_cache" },
    { "generation_working_set", generation_growth, WANT, 0, 0, REMS(R_SMALLER_BATCH, R_SHORTER_SEQ, R_SMALLER_KV),
      "cause growth or growth.gen_built, not training, autograd not on, decoding (phase generation, or locals of "
      "running code keeping a KV cache; not when the roles were measured and hold no KV cache) or a KV cache "
      "holding >= half the rise; or decoding with a KV cache >= shortfall and >= 1/4 of the allocated bytes",
      "generate_kv_cache, generate_beams_kv_growth, sdxl_turbo_gradio_demo_history_keeps_gpu_images (blind)" },
    { "generation_beams", generation_beams, WANT, 0, 0, REMS(R_FEWER_BEAMS),
      "as generation_working_set, roles: num_beams > 1 (the beam width read from the generation's frames)",
      "translate_docs_beam_kv_growth (blind), generate_beams_kv_growth" },
    { "generation_many_inputs", generation_many_inputs, WANT, 0, 0, REMS(R_SMALLER_BATCH),
      "phase generation, autograd not on, not training, roles.generation_input: 2+ inputs of a size the model fixes "
      "(pixel_values, input_features, 4+ dimensions)",
      "county_records_trocr_large_every_line_of_a_page_in_one_beam_generate_tax_roll_ledger_t4 (blind)" },
    { "other_framework", otherfw_holds, WANT, 0, 0, REMS(R_OTHER_FW), "cause other_framework",
      "jax_prealloc_then_torch" },
    { "peer_ranks", peers_hold, WANT, 0, 0, REMS(R_SET_DEVICE), "cause peer_ranks", "ddp_8ranks_no_set_device" },
    { "prefork_workers", prefork_peers, WANT, 0, 0, REMS(R_FEWER_WORKERS),
      "cause peer_ranks, every peer a worker of this process's parent (or the parent)", "prefork_server_copies" },
    { "dataloader_workers", worker_peers, WANT, 0, 0, REMS(R_CUDA_OUT_OF_WORKERS, R_FEWER_WORKERS),
      "cause peer_ranks, every peer a child of this process (DataLoader workers)",
      "dataloader_workers_cuda, kornia_gpu_augment_in_spawned_workers (blind)" },
    { "child_programs", child_programs, WANT, 0, 0, REMS(R_FEWER_WORKERS),
      "cause peer_ranks, every peer a child of this process running another program (other_program: not a fork, "
      "not a multiprocessing worker)",
      "conformer_ctc_epoch_end_eval_subprocesses_pile_up_same_gpu_a100_40gb (blind)" },
    { "own_children", own_children, WANT, 0, 0, REMS(R_FOREIGN),
      "cause peer_ranks, every peer a child of this process that its multiprocessing lists under a name the code "
      "that started it gave it (roles.child_processes; facts: own_children): no DataLoader worker",
      "merlin_nvtabular_etl_dask_cuda_worker_rmm_pool_outlives_etl_session_recsys_training_a10g (blind); (unit tests: "
      "own_children_not_workers)" },
    { "nested_launch", nested_launch, WANT, 0, 0, REMS(R_ONE_RANK),
      "facts: nested_launchers (torchrun's world inside one of SLURM_NTASKS_PER_NODE > 1 srun tasks), the ranks on "
      "the node > the visible GPUs, other processes on the GPU >= shortfall",
      "slurm_srun_launches_torchrun_per_task_eight_jobs_share_each_gpu_vitl_landcover_a100_40gb (blind); (unit "
      "tests: ranks_outnumber_gpus)" },
    { "ranks_outnumber_gpus", ranks_outnumber_gpus, WANT, 0, 0, REMS(R_ONE_RANK),
      "cause peer_ranks, ranks of this job on the machine (LOCAL_WORLD_SIZE, else this rank + the ranks of its job "
      "on the GPU) > the visible GPUs (facts: node_ranks, ranks_outnumber_gpus)",
      "torchrun_two_ranks_one_gpu_workstation_modulo_device (blind); (unit tests: ranks_outnumber_gpus)" },
    { "framework_cap", fwcap_holds, WANT, 0, 0, REMS(R_FW_CAP, R_MIXED, R_SMALLER_BATCH, R_CHECKPOINTING),
      "cause framework_cap", "(unit tests: framework_cap_cause)" },
    { "imbalance", imbalance_holds, WANT, 0, 0, REMS(R_DDP, R_SMALLER_BATCH, R_MIXED), "cause imbalance",
      "dataparallel_imbalance" },
    { "does_not_fit_cache", dnf_cache, WANT, 0, 0, REMS(R_EMPTY_CACHE),
      "cause does_not_fit, cache known > 0 or unmeasured", "batch_3pct_over" },
    { "does_not_fit", dnf_holds, WANT, 0, 0,
      REMS(R_INFERENCE, R_MIXED, R_SMALLER_BATCH, R_SHORTER_SEQ, R_CHECKPOINTING, R_FLASH, R_QUANT, R_MULTI_GPU, R_ZERO,
           R_OFFLOAD, R_BIGGER),
      "cause does_not_fit", "batch_3pct_over, batch_4x_over" },
    { "does_not_fit_split_rest", dnf_split_rest, WANT, 0, 0, REMS(R_EXPANDABLE),
      "cause does_not_fit, a retry that freed 0 B", "frag_varlen_noadapter" },
    { "does_not_fit_bucket", dnf_bucket, WANT, 0, 0, REMS(R_BUCKET),
      "cause does_not_fit, a retry that freed 0 B, distinct sizes >= 8", "frag_varlen_noadapter" },
    { "in_oom_handler", in_handler, WANT, 0, 0, REMS(R_RETRY_OUTSIDE, R_RELEASE_REFS), "phase oom_handler",
      "retry_in_except (blind); (unit tests: phase_oom_handler)" },
    { "checkpoint_restore", checkpoint_restore, WANT, 0, 0, REMS(R_MAP_CPU), "phase loading, torch.load on the stack",
      "(unit tests: phase_checkpoint_restore)" },
    { "restored_held", restored_held, WANT, 0, 0, REMS(R_MAP_CPU),
      "roles: tensors Python objects hold that torch.load restored onto the GPU (holders[].restored_bytes) >= "
      "shortfall; primary not growth",
      "dinov2_linear_probe_feature_shards_torch_load_onto_gpu_l40s (blind); (unit tests: restored_by_torch_load)" },
    { "checkpoint_kept", checkpoint_kept, WANT, 0, 0, REMS(R_MAP_CPU, R_RELEASE_REFS),
      "roles: holders of purpose checkpoint copying parameters or optimizer state (roles.ckpt_copy) >= shortfall, "
      "not phase loading, no optimizer step made, no snapshot statement",
      "tinyllama_resume_ckpt_left_on_gpu (blind); (unit tests: checkpoint_kept_after_load)" },
    { "loading_phase", loading_weights_phase, WANT, 0, 0, REMS(R_LOAD_HALF, R_QUANT, R_OFFLOAD), "phase loading",
      "(unit tests: phase_loading_weights)" },
    { "preconditioned_state", preconditioned_state, WANT, 0, 0, REMS(R_PRECOND_CAP),
      "roles: optimizer state not one value per parameter element (optimizers[].not_elementwise_bytes: "
      "preconditioner matrices) >= shortfall",
      "qwen25_15b_continued_pretrain_soap_first_step_preconditioners_a6000 (blind); (unit tests: "
      "preconditioners_hold_the_state)" },
    { "lora_base_trains", lora_base_trains, WANT, 0, 0, REMS(R_LORA),
      "roles: LoRA adapters (lora_parameters_bytes), other weights requiring grad (lora_base_trainable_bytes) >= 4x "
      "them, those weights' share of gradients + optimizer state >= shortfall",
      "esm2_3b_antibody_loralib_head_unfrozen_by_skipping_mark_only_lora_a100_40gb (blind); (unit tests: "
      "lora_base_weights_train)" },
    { "per_sample_gradients", per_sample_gradients, WANT, 0, 0, REMS(R_SMALLER_BATCH, R_GHOST_CLIP),
      "roles: gradients kept one per example (per_sample_gradients_bytes) >= shortfall",
      "opacus_dp_sgd_bert_base_per_sample_grads_batch64_t4 (blind); (unit tests: per_sample_gradients)" },
    { "optimizer_state", optimizer_state, WANT, 0, 0, REMS(R_OPT_8BIT, R_ZERO, R_OFFLOAD),
      "roles: optimizer state not 8-bit > 0, or phase optimizer_step with parameters and no state yet",
      "adamw_first_step, ema_lazy_shadow (blind)" },
    { "padded_to_max", padded_to_max, WANT, 0, 0, REMS(R_DYN_PAD, R_BUCKET),
      "roles.padding_to_max_length (the program pads its inputs to a fixed maximum), activations measured, phase "
      "forward, backward, evaluation, generation or unknown",
      "ticket_classifier_bge_m3_padded_to_8192 (blind); (unit tests: padding_to_max_length)" },
    { "extra_outputs", extra_outputs, WANT, 0, 0, REMS(R_FEWER_OUTPUTS),
      "roles.extra_outputs (the program asks a model for hidden states, attentions, scores or logits of every "
      "layer or token), activations measured, phase forward, evaluation, generation or unknown, autograd not on or "
      "checkpointing in force (without it the graph keeps each layer's output already)",
      "e5_mistral_embed_output_hidden_states_all_layers, qwen7b_calibration_generate_scores_and_logits, "
      "distil_whisper_large_v3_dutch_teacher_eval_mode_records_graph_hidden_state_loss_l40s (blind)" },
    { "all_position_logits", all_position_logits, WANT, 0, 0, REMS(R_FEWER_OUTPUTS),
      "roles.stmt_logits (the failing statement makes a model's logits), no loss over them on the stack, not "
      "training, autograd off, phase forward, evaluation or generation of a job decoding or holding a KV cache, "
      "request >= 1/8 of the device",
      "react_agent_fetch_tool_42k_token_filing_prefill_all_position_logits_float_upcast_llama31_8b_l40s (blind)" },
    { "rank_loads_whole_model", rank_loads_whole_model, WANT, 0, 0, REMS(R_SHARD_LOAD),
      "phase loading, WORLD_SIZE > 1 (a rank of a multi-rank job)",
      "fsdp_lora_llama2_13b_g5_12xlarge_device_map_local_rank (blind); (unit tests: rank_loads_whole_model)" },
    { "rank_model_exceeds_card", rank_model_exceeds_card, WANT, 0, 0, REMS(R_ZERO),
      "as rank_loads_whole_model, roles: the models' parameters here + elsewhere (parameters_elsewhere_bytes) >= "
      "capacity",
      "(unit tests: rank_model_larger_than_card)" },
    { "growing_dataset", growing_dataset, WANT, 0, 0, REMS(R_DATASET_CPU, R_BOUNDED_CACHE),
      "primary growth, roles: the growth's largest holder (grower) has the purpose dataset",
      "drqv2_replay_buffer_episodes_on_gpu, dreamer_replay_buffer_float32_chunks_on_gpu (blind)" },
    { "checkpointing_in_force", checkpointing_in_force, DROP, 0, 0, REMS(R_CHECKPOINTING),
      "roles.gradient_checkpointing true (in force for the layer that failed)",
      "mistral7b_contracts_32k_lora_eager_attention (blind)" },
    { "scores_beside_others", others_short_of_scores, WANT, 0, 0, REMS(R_FLASH),
      "an attention's scores failed beside other processes short of what the pass asks next (facts: "
      "others_short_of_scores)",
      "phi3_mini_128k_contract_summaries_eager_attention_16k_prefill_beside_other_pods_timesliced_l40s (blind)" },
    { "eager_attention", eager_attention, WANT, 0, 0, REMS(R_FLASH),
      "roles.operation attention (eager_attention_forward, an attention class's _attn on the stack, "
      "nn.MultiheadAttention called with need_weights=True) or attention_mask (a dense L x L mask made whole)",
      "mistral7b_contracts_32k_lora_eager_attention, llama2_7b_longlora_96k_packed_rows_custom_4d_block_causal_mask_"
      "first_step_h100 (blind); (unit tests: eager_attention_fused_first)" },
    { "train_fewer_parameters", trains_all_parameters, WANT, 0, 0, REMS(R_LORA),
      "the job trains, roles: parameters and their gradients or optimizer state (or phase optimizer_step)",
      "adamw_first_step, ema_lazy_shadow (blind)" },
    { "summed_microbatches", summed_microbatches, WANT, 0, 0, REMS(R_BACKWARD_PER_MB),
      "roles.accumulating (losses summed, or kept in a list, with their graphs alive) or roles.graph_cache (a cache of "
      "micro-batches' outputs with their graphs for a later backward), activations measured, phase forward, backward "
      "or unknown, autograd not off, not known inference",
      "asr_accum_summed_loss, detr_accum_losses_list_single_backward, "
      "llama2_7b_pipelining_schedule_gpipe_32_microbatches_stage0_keeps_every_microbatch_4x_l40s (blind)" },
    { "state_exceeds_card", state_exceeds_card, WANT, 0, 0, REMS(R_LORA, R_OFFLOAD, R_ZERO),
      "the job trains, roles: parameters + the optimizer's parameters (gradients) + its state (Adam: 2x them to come) "
      ">= the card",
      "fullft_3b_first_backward_state (blind)" },
    { "fp64_data", fp64_data, WANT, 0, 0, REMS(R_FP32_NOT_FP64),
      "roles: holders' float64 tensors (holders[].float64_bytes) >= 1/4 of the allocated bytes",
      "jane_street_mlp_rolling_features_model_double_fold_on_gpu_kaggle_p100 (blind)" },
    { "fp64_weights", fp64_weights, WANT, 0, 0, REMS(R_FP32_NOT_FP64),
      "roles: parameters >= 3/4 float64 (parameters_by_dtype)",
      "mace_mp_li3ps4_melt_quench_md_float64_from_relax_notebook_11k_atoms_l40s (blind); (unit tests: "
      "float64_weights)" },
    { "fp32_weights", fp32_weights, WANT, 0, 0, REMS(R_LOAD_HALF),
      "roles: parameters >= 3/4 float32 (parameters_by_dtype), parameters + gradients >= half the allocated bytes; "
      "not phase optimizer_step; training: phase loading, forward, backward, evaluation or generation, the state at "
      "its steps halved + activations < the card",
      "fullft_fp32_default_dtype (blind)" },
    { "fp32_beside_half", fp32_beside_half, WANT, 0, 0, REMS(R_LOAD_HALF),
      "roles.models: a model >= 9/10 float32 beside one under half float32 (parameters_float32_bytes), the job not "
      "known to train, phase loading, forward, evaluation, generation or unknown",
      "assisted_generation_llama31_8b_draft_llama32_1b_left_fp32_meeting_transcripts_a10g (blind)" },
    { "weights_update", weights_update, WANT, 0, 0, REMS(R_IN_PLACE, R_EMA_CPU),
      "the job trains, autograd off, phase unknown, roles: parameters, locals (at most 2x the state), activations < "
      "shortfall",
      "ema_lazy_shadow, ema_foreach_temporaries (blind)" },
    { "state_snapshot", state_snapshot, WANT, 0, 0, REMS(R_SNAPSHOT_CPU),
      "as weights_update, locals >= parameters, autograd on or a dict among the locals",
      "best_state_gpu_deepcopy (blind)" },
    { "attribution_pass", og_attribution_pass, WANT, 0, 0, REMS(R_SMALLER_BATCH),
      "roles: a model in eval mode that no optimizer trains (untrained_eval), no gradients, no optimizer state; "
      "autograd on; input_requires_grad, backward_in_code or backward_on_stack",
      "captum_layer_ig_clinicalbert_readmission_discharge_note_n_steps_200_t4, "
      "chexpert_densenet121_smoothgrad_noise_tunnel_50_samples_one_batch_512px_t4 (blind)" },
    { "weight_grads_unread", weight_grads_unread, WANT, 0, 0, REMS(R_NO_WEIGHT_GRADS),
      "roles: a model in eval mode whose parameters require grad that no optimizer trains (untrained_eval), "
      "gradients > 0, no optimizer holding a parameter of the device and no optimizer state, or gradients beyond "
      "the optimizers' parameters that the untrained models' cover; phase backward, backward_in_code or "
      "input_requires_grad",
      "attribution_patching_pythia_6_9b_ioi_backward_fills_weight_grads_4090, "
      "textual_inversion_sd15_unet_eval_not_frozen_weight_grads_3070_8gb (blind)" },
    { "frozen_model_autograd_on", frozen_model_autograd_on, WANT, 0, 0, REMS(R_TEACHER_NO_GRAD),
      "roles: a holder of purpose teacher, a frozen model, a running model no optimizer trains (models[].trained "
      "0), or a reference or teacher model whose parameters require grad that no optimizer trains (untrained_ref), "
      "adapter: grad_enabled on",
      "distill_teacher_grad, ibot_vitl_teacher_deepcopy_still_requires_grad_l40s (blind)" },
    { "kv_cache_reserved", kv_cache_reserved, WANT, 0, 0, REMS(R_SMALLER_KV),
      "not training, autograd off, not growth, roles: a kept holder is a KV cache >= shortfall and > the locals",
      "static_kv_cache_prealloc (blind)" },
    { "kv_cache_reserving", kv_cache_reserving, WANT, 0, 0, REMS(R_SMALLER_KV),
      "not training, not phase generation or growth, roles: the failing statement builds a KV cache, half of it so "
      "far (every holder of purpose kv_cache) + the request >= shortfall; or, the request beyond the card, all of "
      "it >= shortfall (a pool sized from what is free)",
      "vllm_second_server_default_utilization (blind); (unit tests: kv_cache_reserving)" },
    { "graph_pools", graph_pools, WANT, 0, 0, REMS(R_GRAPH_SHAPES),
      "roles: graph_pools > 0, or the adapter's private_pool_bytes", "cuda_graph_shapes (blind)" },
    { "growth_in_a_cache", growth_in_a_cache, WANT, 0, 0, REMS(R_BOUNDED_CACHE),
      "cause growth, roles: largest holder kept across calls is a dict/cache >= shortfall",
      "dict_cache_embeddings (blind)" },
    { "lora_adapters_piled", lora_piled, WANT, 0, 0, REMS(R_RELEASE_REFS, R_BOUNDED_CACHE),
      "roles: LoRA adapters at least half the other weights, no gradients and no optimizer state (lora_piled), "
      "their bytes >= shortfall",
      "sdxl_lora_marketplace_preview_worker_load_lora_weights_per_job_never_deleted_l4 (blind); (unit tests: "
      "lora_adapters_piled)" },
    { "cache_kept", cache_kept, WANT, 0, 0, REMS(R_BOUNDED_CACHE),
      "roles: the largest holder kept across calls is a dict/cache >= shortfall, named cache or nothing, no copy of a "
      "role, > the running code's tensors and > any growth's rise, not at the bound its object names (roles.bounded)",
      "tenant_prefix_kv_cache_dict_never_evicted (blind); (unit tests: cache_kept_across_calls)" },
    { "model_registry", model_registry, WANT, 0, 0, REMS(R_BOUNDED_CACHE),
      "roles.models: >= 2 models of a class held only as a map's entries (NAME[key]) >= shortfall; or, not "
      "training, >= 2 models of any classes each held only by key, none running (roles.keyed_models)",
      "tenant_finetunes_full_copies_resident_a100_40gb, voice_gateway_four_models_lazy_loaded_l4 (blind)" },
    { "communication", communication, WANT, 0, 0, REMS(R_REUSE_PG, R_NCCL_BUF),
      "NCCL's bytes >= shortfall, and NCCL failed, phase collective or NCCL holds the growth",
      "(unit tests: nccl_growth)" },
    { "communication_outside", comm_outside, WANT, 0, 0, REMS(R_NCCL_BUF),
      "NCCL's bytes >= shortfall, and NCCL the largest library outside the framework (cause non_framework) or "
      "NCCL_BUFFSIZE above its default adding >= the shortfall",
      "megatron_nccl_buffsize_tuning_env (blind); (unit tests: nccl_settings)" },
    { "model_on_other_gpu", model_on_other_gpu, WANT, 0, 0, REMS(R_ON_MODEL_GPU),
      "roles.statement_model_device: the failing statement reads a model whose parameters are on another GPU",
      "llama31_8b_two_replica_server_static_cache_device_cuda_both_on_gpu0_2x_l40s (blind); (unit tests: "
      "statement_model_on_other_gpu)" },
    { "idle_gpu", idle_gpu, WANT, 0, 0, REMS(R_USE_IDLE_GPU),
      "one process, >= 2 visible GPUs, one of them holding nothing of this process, or at most 1/8 of the failing "
      "GPU's bytes, with models to move beside one that stays (frozen, copies) and room for them and the shortfall; "
      "not ranks or peers (save a parent alone: facts parent_only), a limit, a cap, another framework, a request "
      "larger than the card",
      "pseudo_label_teacher_student_same_gpu, distill_teacher_and_student_on_cuda0_second_card_idle (blind); (unit "
      "tests: spare_gpu)" },
    { "uneven_split", uneven_split, WANT, 0, 0, REMS(R_BALANCE_MAP),
      "one process, another GPU it uses holds less than the failing GPU's parameters, more than 1/8 of its bytes "
      "(not nearly idle), and has room for the shortfall (the failing card's size less what it holds there and a "
      "context)",
      "gptneox20b_device_map_sequential_gpu0_full (blind); (unit tests: spare_gpu)" },
    { "checkpointing_off", checkpointing_off, WANT, 0, 0, REMS(R_CHECKPOINTING),
      "the job trains, adapter: grad_enabled on, roles: gradient_checkpointing false, activations >= half the "
      "allocated bytes",
      "sft_first_forward_activations, long_ctx_lora_ckpt_flag_off (blind)" },
    { "one_input_peak", one_input_peak, WANT, 0, 0, REMS(R_SHORTER_SEQ),
      "primary does_not_fit, the outlier (as one_batch_peak), autograd off, phase generation: one prompt far longer "
      "than the others",
      "batch_summarize_llama31_8b_one_exhibit_pads_batch_to_31k_a100_40gb (blind)" },
    { "own_operation_peak", own_operation_peak, WANT, 0, 0, REMS(R_CHUNK),
      "primary does_not_fit, phase unknown, roles.models measured and none running, the failing statement's sizes a "
      "product of dimensions or one twice (request_shape), request >= 1/8 of the device and not larger",
      "beir_quora_e5_large_cos_sim_10k_queries_full_score_matrix_a10g (blind); (unit tests: "
      "larger_outlier_batch_caps_the_length)" },
    { "one_batch_peak", one_batch_peak, WANT, 0, 0, REMS(R_SHORTER_SEQ),
      "primary does_not_fit, request >= 4x any earlier allocation after freed steps (or, after 8+ optimizer steps, "
      "the pass >= 3x the most an earlier one held above the floor kept between steps), autograd not off",
      "outlier_long_batch, egnn_pdbbind_affinity_uncropped_assembly_entry_epoch7_empty_cache_every_step_a5000 "
      "(blind)" },
    { "layer_holder_grows", layer_holder_grows, WANT, 0, 0, REMS(R_RELEASE_REFS),
      "primary does_not_fit, roles: a holder keeping one record per layer the pass has run (facts: layer_holder: "
      "records = the failing layer's index, or with it, in a run of like layers of one size; >= 1/64 of the device), "
      "kept outside the running pass (not a local of running code: the pass's own outputs or cache), not of purpose "
      "kv_cache",
      "legal_filing_96k_prefill_layerwise_kv_offload_pending_list_keeps_gpu_kv_llama31_8b_nf4_4090 (blind); (unit "
      "tests: holder_of_one_record_per_layer)" },
    { "training_logits", training_logits, WANT, 0, 0, REMS(R_FUSED_CE),
      "roles.stmt_logits (the failing statement makes a model's logits), no loss over them on the stack, the job "
      "trains, autograd on, request >= 1/8 of the device, not larger than it",
      "qwen25_7b_yarn_64k_packed_lora_sft_fp32_upcast_full_vocab_logits_h100 (blind); (unit tests: "
      "training_logits_before_the_loss)" },
    { "cross_entropy_op", cross_entropy_op, WANT, 0, 0, REMS(R_FUSED_CE),
      "roles.operation cross_entropy (cross_entropy, log_softmax, nll_loss on the failing stack)",
      "gemma_lora_fp32_logits_ce (blind), perplexity_log_softmax" },
    { "transducer_op", transducer_op, WANT, 0, 0, REMS(R_CHUNK),
      "roles.operation transducer_loss (an rnnt_loss, an RNNTLoss, a joint network on the failing stack)",
      "torchaudio_conformer_rnnt_vietnamese_bpe4096_long_batch_a10g (blind)" },
    { "operation_dominates", operation_dominates, WANT, 0, 0, REMS(R_CHUNK),
      "roles.operation image_decode, pairwise or kernel_matrix, or conv with autograd off (then also larger than the "
      "device), the operation's tensors (request; 2x for conv and kernel_matrix, 3x for pairwise) >= the working set "
      "(activations + locals)",
      "sdxl_vae_decode_2048px (blind), upscale_interpolate, wsi_tumor_segmentation_whole_slide_forward, "
      "botorch_electrolyte_bo_merged_60k_points_exact_gp_float64_a6000 (blind)" },
    { "comprehension_builds", og_comprehension_builds, WANT, 0, 0, REMS(R_CHUNK),
      "primary does_not_fit, phase unknown, a comprehension on the failing stack (facts: comprehension), "
      "activations >= 4x the request",
      "camera_trap_convnext_nvjpeg_batch_decode_full_frames_to_float_before_crop_a10g (blind)" },
    { "loose_operation", loose_operation, WANT, 0, 0, REMS(R_CHUNK),
      "primary does_not_fit, roles: no parameters, phase unknown with a Python stack, request >= capacity / 8, the "
      "statement's sizes a product or a square, activations >= 0.9 x request (facts: roles.loose_operation)",
      "butina_tanimoto_chunk_tuned_on_inhouse_250k_run_on_1_6m_vendor_library_a100_80gb (blind); (unit tests: "
      "loose_operation_in_blocks)" },
    { "resident_models", resident_models, WANT, 0, 0, REMS(R_ONE_MODEL),
      "not training, roles.models: models held by a name of the running code beside one of their class (not "
      "rebound by the failing statement) >= shortfall, or while a model loads one of another class a name holds "
      "with that name's holders (roles.other_resident) >= shortfall; leftover copies < shortfall",
      "ab_compare_two_7b (blind), two_models_generate" },
    { "kept_graphs", kept_graphs, WANT, 0, 0, REMS(R_RELEASE_REFS, R_INFERENCE),
      "autograd on in phase evaluation or generation, roles: a holder kept across calls, no purpose, no copy, >= 2 "
      "tensors, fewer bytes than the activations (facts: roles.kept_graphs)",
      "val_losses_logged_without_no_grad (blind)" },
    { "eval_copy", eval_copy, WANT, 0, 0, REMS(R_EVAL_NO_COPY),
      "the job trains, roles.models: a second copy held by a name of the running code >= shortfall, not frozen, or a "
      "deep copy under way rebinding no model's name (roles.copy_source, copy_made_bytes) >= shortfall; phase "
      "evaluation (or autograd off outside a step, an EMA update, a load)",
      "eval_deepcopy_in_train_loop, eval_on_deepcopy_with_grads_kept (blind), eval_copy_forward" },
    { "dataset_on_gpu", dataset_on_gpu, WANT, 0, 0, REMS(R_DATASET_CPU),
      "roles: holders of purpose dataset kept across calls (a global, an attribute) >= shortfall, primary not growth",
      "resnet50_whole_dataset_on_gpu_speedrun (blind)" },
    { "dominant_holder", dominant_holder, WANT, 0, 0, REMS(R_RELEASE_REFS),
      "roles: while a pass runs, a holder of no purpose (or named a cache or a dataset) and no copy of a role, a local "
      "outside the pass's own code, "
      "holds more than any role of the framework (facts: roles.dominant) >= shortfall; primary not growth",
      "pythia1b_noise_scale_step_keeps_every_microbatch_grad_h100 (blind); (unit tests: dominant_holder_first)" },
    { "statement_copies_holder", stmt_copies_holder, WANT, 0, 0, REMS(R_DATASET_CPU),
      "roles: the failing statement reads a holder (no purpose, no copy of a role) and asks for its bytes within a "
      "tenth (roles.stmt_copies: torch.cat of its chunks), >= 256 MiB, not loading; primary not growth",
      "dino_vitl_knn_monitor_rank0_bank_chunks_cat_a10g (blind)" },
    { "kept_holder", kept_holder, WANT, 0, 0, REMS(R_RELEASE_REFS),
      "roles: holders kept across calls (not locals of running code) hold >= 3x the cache, not loading "
      "(kept_outgrows_cache), cause fragmentation; the largest has no purpose, copies no role and is no DDP "
      "reducer's buckets (roles.ddp), >= shortfall; primary not growth",
      "maskrcnn_val_torchmetrics_segm_map_masks_kept_on_gpu_v100_16gb (blind)" },
    { "categorical_tables", categorical_tables, WANT, 0, 0, REMS(R_SMALLER_EMB),
      "roles: embedding tables >= half the parameters, at least 4 of them (a column each) or a Sparse* optimizer "
      "training half their bytes (id tables), no attention layer in the models, a job that trains",
      "fastai_tabular_learner_criteo_2m_rows_26_categoricals_first_backward_kaggle_p100 (blind); (unit tests: "
      "embedding_tables_off_the_gpu)" },
    { "index_on_gpu", index_on_gpu, WANT, 0, 0, REMS(R_INDEX_OFF_GPU),
      "roles: holders of purpose index kept across calls (a global, an attribute) >= shortfall, primary not growth",
      "support_rag_flat_fp32_index_beside_llama8b (blind); (unit tests: index_kept_on_the_gpu)" },
    { "copy_kept", copy_kept, WANT, 0, 0, REMS(R_SNAPSHOT_CPU),
      "a job not known inference, roles.holders: copies of the parameters or the optimizer state kept across calls "
      "(a local's while a pass runs), no purpose (facts: copy_kept) >= shortfall, primary not growth",
      "pretrain_1b_lawa_window_state_dicts_cloned_on_gpu_l40s (blind); (unit tests: copies_kept_across_steps)" },
    { "ema_kept", ema_kept, WANT, 0, 0, REMS(R_EMA_CPU),
      "not known inference, roles: holders of purpose ema kept across calls and models whose names or class say ema, "
      "none running (facts: ema_kept) >= shortfall, primary not growth",
      "sd15_finetune_use_ema_shadow_unet_4090 (blind); (unit tests: weights_copies_kept)" },
    { "reference_on_base", reference_on_base, WANT, 0, 0, REMS(R_ADAPTER_REF),
      "the job trains, roles.models: a reference (names say ref/reference, or frozen of the size of the trained "
      "model's frozen part) >= shortfall and >= the largest holder kept across calls, the trained model training <= "
      "1/10 of its parameters (adapters) on a base of the reference's size (facts: reference_copy, reference_base), "
      "primary not growth",
      "dpo_mistral7b_lora_second_bf16_reference_a100_40gb (blind); (unit tests: weights_copies_kept)" },
    { "reference_full", reference_full, WANT, 0, 0, REMS(R_ONE_MODEL, R_LORA),
      "as reference_on_base, the trained model training more than 1/10 of its parameters (a full fine-tune)",
      "dpo_gemma2_2b_fullft_ref_model_resident_4090 (blind); (unit tests: weights_copies_kept)" },
    { "repeated_components", repeated_components, WANT, 0, 0, REMS(R_SHARE_COMPONENTS),
      "roles.models: >= 2 frozen groups of one count N >= 2, each model held by one attribute of N objects "
      "(facts: repeated_components, all but one set) >= shortfall, primary not growth",
      "sdxl_api_three_pipelines_each_load_same_weights_l4 (blind); (unit tests: weights_copies_kept)" },
    { "pipeline_twins", pipeline_twins, WANT, 0, 0, REMS(R_SHARE_COMPONENTS),
      "roles.models: >= 2 frozen groups held by attribute names (self.X) each of a class the program also holds by "
      "another name (facts: twin_components, the attribute-held copies) >= shortfall, primary not growth",
      "dreambooth_sdxl_lora_prior_preservation_class_image_pipe_still_loaded_a10g (blind); (unit tests: "
      "pipeline_kept_beside_training)" },
    { "trained_model_kept", trained_model_kept, WANT, 0, 0, REMS(R_ONE_MODEL),
      "roles.models: a model held by a name, not frozen, not running; phase loading: of a class no arriving model has "
      "(or one an optimizer stepped on), optimizer state made; phase forward: stepped on, beside running models whose "
      "optimizers have not stepped, none "
      "a copy of it (facts: trained_kept: its parameters, gradients and that state) >= shortfall, primary not growth",
      "gemma2_9b_qlora_merge_bf16_base_beside_trainer_4090, course_notebook_part2_convnext_beside_part1_vitl_adamw_"
      "globals_3060 (blind); (unit tests: weights_copies_kept, finished_training_beside_the_next)" },
    { "trained_model_held_by_others", trained_model_held_by_others, WANT, 0, 0, REMS(R_RELEASE_REFS),
      "as trained_model_kept, every name of that model an attribute of another object (facts: trained_by_others: "
      "trainer.model, pipe.model; no bare name, no self.X)",
      "notebook_del_model_but_pipeline_and_trainer_keep_mistral7b_adapter_reload_l4 (blind); (unit tests: "
      "trained_model_kept_by_other_objects)" },
    { "ddp_buckets", ddp_buckets, WANT, 0, 0, REMS(R_BUCKET_VIEW),
      "roles.ddp: DistributedDataParallel without gradient_as_bucket_view (its buckets copy the gradients)",
      "ddp_bucket_views_big_batch (blind), ddp_bucket_copy" },
    { "unknown_cache", unknown_cache, WANT, 0, 0, REMS(R_EMPTY_CACHE), "no cause, cache known > 0 or unmeasured",
      "(unit tests)" },
    { "unknown_others", unknown_others, WANT, 0, 0, REMS(R_FOREIGN), "no cause, other processes' bytes",
      "(unit tests)" },
    { "unknown", unknown_holds, WANT, 0, 0, REMS(R_RESTART, R_EXPANDABLE, R_INFERENCE, R_MIXED, R_SMALLER_BATCH),
      "no cause", "(unit tests)" },
};

static const og_rank_row_t narrow[] = {
    { "prefork_not_ranks", prefork_peers, DROP, 0, 0, REMS(R_SET_DEVICE),
      "cause peer_ranks, every peer a worker of this process's parent (or the parent): not ranks on a wrong GPU",
      "prefork_server_copies" },
    { "workers_not_ranks", child_peers, DROP, 0, 0, REMS(R_SET_DEVICE),
      "cause peer_ranks, every peer a child of this process (DataLoader workers, programs it started): not ranks on "
      "a wrong GPU",
      "dataloader_workers_cuda, kornia_gpu_augment_in_spawned_workers (blind)" },
    { "ranks_share_gpus", ranks_outnumber_gpus, DROP, 0, 0, REMS(R_SET_DEVICE),
      "as ranks_outnumber_gpus: no GPU is left for set_device to select", "(unit tests: ranks_outnumber_gpus)" },
    { "released_nothing", released_nothing, DROP, 0, 0, REMS(R_EMPTY_CACHE),
      "fragmentation, a retry that freed 0 B, cache not known > 0", "frag_varlen_noadapter" },
    { "larger_than_device", larger, ONLY, 0, 0, REMS(R_CHUNK, R_MULTI_GPU, R_OFFLOAD),
      "request > device or limit (does_not_fit)", "logits_larger_than_card" },
    { "kv_pool_beyond_card", kv_pool_reserving_beyond, WANT, 0, 0, REMS(R_SMALLER_KV),
      "as kv_cache_reserving, the request > device (a pool sized from another device's total: sized from what is "
      "free, it fits)",
      "a100_mig_3g40gb_pod_kv_pool_sized_from_pynvml_parent_gpu_total_llama31_8b (blind); (unit tests: "
      "kv_cache_reserving)" },
    { "larger_outlier_batch", larger_outlier_batch, WANT, 0, 0, REMS(R_SHORTER_SEQ),
      "as one_batch_peak, request > device (the earlier batches fit: the input's length is the lever), not a product "
      "of two sizes made outside any pass (phase unknown, no KV cache, roles: request_shape product), no operation of "
      "the program's own outside a pass (phase unknown, roles.models none running, an operation read or sizes a "
      "product)",
      "callcenter_wav2vec2_ctc_hour_long_recording, librivox_chapter_wav2vec2_forced_align_trellis_on_gpu_4090 "
      "(blind)" },
    { "graph_messages", graph_messages, WANT, 0, 0, REMS(R_CAP_INPUT),
      "primary does_not_fit, roles.operation graph_messages (PyTorch Geometric's or DGL's layers, a module class named "
      "as a graph convolution); after larger_than_device: a request larger than the card keeps it",
      "gat_ogbn_products_full_batch_training_edge_messages_a100_40gb, pinsage_hub_item_full_fanout_subgraph_rtx4090 "
      "(blind); (unit tests: graph_messages_sample_the_graph)" },
    { "larger_forward_inputs", og_forward_inputs_fill_card, WANT, 0, 0, REMS(R_CAP_INPUT),
      "primary does_not_fit, request > device, autograd not off, phase forward, the failing statement's input "
      "holders (roles: stmt_inputs) >= a quarter of the card",
      "seed_phenotyping_maskrcnn_tutorial_600dpi_flatbed_scans_colab_t4 (blind)" },
    { "larger_bigger_card", larger_card_exists, WANT, 0, 0, REMS(R_BIGGER),
      "request > device, < the largest card (141 GB)", "logits_larger_than_card" },
    { "larger_than_limit_only", larger_than_limit_only, WANT, 0, 0, REMS(R_RAISE_LIMIT),
      "request > limit, < device total", "(unit tests)" },
    { "larger_inference", larger_inference, WANT, 0, 0, REMS(R_SHORTER_SEQ, R_FLASH),
      "request > device, adapter: grad_enabled off, PyTorch, phase forward/evaluation/generation, a KV cache held or "
      "the statement's sizes seq x seq; not users x items",
      "long_prompt_serving, recsys_catalog_scores (blind)" },
    { "limit_by_context", limit_by_context, ONLY, 0, 0, REMS(R_RAISE_LIMIT), "limit, limit usage (context), request",
      "limit_context_alone" },
    { "own_fix_covers", own_fix_covers, DROP, 0, 0,
      REMS(R_INFERENCE, R_MIXED, R_SMALLER_BATCH, R_SHORTER_SEQ, R_CHECKPOINTING, R_FLASH, R_QUANT, R_MULTI_GPU, R_ZERO,
           R_OFFLOAD, R_BIGGER, R_OPT_8BIT, R_LORA),
      "primary other_framework/peer_ranks/foreign_memory >= 0.7, its bytes >= shortfall; a snapshot",
      "jax_prealloc_then_torch, ddp_all_on_gpu0, stale_process_60pct" },
    { "own_fix_covers_no_frag", own_fix_covers_no_frag, DROP, 0, 0, REMS(R_EXPANDABLE, R_BUCKET),
      "the same, no fragmentation (or only beside a pass or copy that outgrows the cache)",
      "cupy_pool_then_torch, kornia_gpu_augment_in_spawned_workers (blind)" },
    { "pass_outgrows_restart", pass_outgrows_restart, DROP, 0, 0, REMS(R_RESTART),
      "a pass still building holds >= 3x the cache (facts: pass_outgrows_cache), no growth and nothing outside the "
      "framework in the process (a fresh process sheds only the cache, which cannot carry the pass)",
      "celery_embed_workers_default_concurrency_each_load_e5_large_v100_32gb (blind)" },
    { "batch_of_one_no_buckets", batch_of_one, DROP, 0, 0, REMS(R_BUCKET),
      "roles: batch_size 1 (a batch of one has no lengths to group)",
      "dac44k_catalog_tokenize_whole_file_encode_24_minute_ambient_track_a10g (a blind program not yet in the set); "
      "(unit tests: batch_of_one_no_buckets)" },
    { "no_expandable", no_expandable, DROP, 0, 0, REMS(R_EXPANDABLE),
      "failing framework not PyTorch, expandable_segments already set, backend:cudaMallocAsync",
      "torch_async_backend_nccl" },
    { "no_tape", no_tape, DROP, 0, 0, REMS(R_INFERENCE), "failing framework JAX or CuPy", "(unit tests)" },
    { "autograd_known", autograd_known, DROP, 0, 0, REMS(R_INFERENCE),
      "adapter: grad_enabled off, or the job trains (facts: trains)",
      "loss_history_leak_adapter, validation_batch_too_big" },
    { "attribution_gradients", og_attribution_pass, DROP, 0, 0, REMS(R_INFERENCE),
      "as attribution_pass (the gradient the method reads needs autograd)",
      "captum_layer_ig_clinicalbert_readmission_discharge_note_n_steps_200_t4 (blind)" },
    { "gradient_asked", weight_grads_unread, DROP, 0, 0, REMS(R_TEACHER_NO_GRAD),
      "as weight_grads_unread (the backward asked for runs through the model: no_grad would lose it)",
      "attribution_patching_pythia_6_9b_ioi_backward_fills_weight_grads_4090 (blind)" },
    { "optimizes_no_model", optimizes_no_model, DROP, 0, 0, REMS(R_INFERENCE, R_TEACHER_NO_GRAD),
      "roles: the optimizers' parameters >= 4x every model's (opt_outside: masks or an input optimized through the "
      "models)",
      "gnnexplainer_aml_weekly_report_explanations_kept_in_list_l4 (blind)" },
    { "input_gradient", input_gradient, DROP, 0, 0, REMS(R_INFERENCE),
      "roles.input_requires_grad: a tensor the model's forward was given requires grad",
      "chexpert_densenet121_smoothgrad_noise_tunnel_50_samples_one_batch_512px_t4 (blind)" },
    { "no_graph_to_drop", no_graph_to_drop, DROP, 0, 0, REMS(R_INFERENCE),
      "phase optimizer_step, backward, loading or ema_update; roles.operation copy (a deep copy records no graph); "
      "roles: weights_only (a running model's weights all the device holds), or no pass running (activations 0, what "
      "Python holds all kept for a purpose: kept_state_only)",
      "adamw_first_step, ema_lazy_shadow, eval_on_deepcopy_with_grads_kept, "
      "qwen32b_bf16_to_cuda_one_a6000_second_idle, "
      "awq_engine_kv_prealloc_then_embedder_in_process_l40s (blind)" },
    { "growth_in_a_cache_no_graph", growth_in_a_cache, DROP, 0, 0, REMS(R_INFERENCE),
      "the same as growth_in_a_cache (its remedy says no_grad for the entries)", "dict_cache_embeddings (blind)" },
    { "communication_not_tensors", comm_holds_growth, DROP, 0, 0, REMS(R_INFERENCE, R_MIXED),
      "cause growth held by NCCL: its bytes >= the rise, or its own failing-size steps and >= their steady part",
      "rlhf_weight_sync_new_comm (blind); (unit tests: nccl_growth)" },
    { "autocast_on", autocast_on, DROP, 0, 0, REMS(R_MIXED), "adapter: autocast on at the failure",
      "train_bf16_batch_too_big" },
    { "scaler_without_autocast", scaler_without_autocast, WANT, 0, 0, REMS(R_MIXED),
      "roles.scaler_without_autocast (a GradScaler, autocast named nowhere in the program), autocast off at the "
      "failure, phase forward or backward",
      "unet_road_damage_seg_gradscaler_without_autocast_fp32_activations_3090 (blind); (unit tests: "
      "scaler_without_autocast)" },
    { "autocast_in_code", autocast_in_force, DROP, 0, 0, REMS(R_MIXED),
      "roles.autocast_in_code (the running code enters autocast), autocast not on at the failure, phase backward "
      "or roles.operation cross_entropy (autocast keeps it float32)",
      "qwen05b_sft_vocab_logits_fp32_ce (blind); (unit tests: autocast_in_code)" },
    { "cupy", cupy, DROP, 0, 0, REMS(R_CHECKPOINTING, R_SHORTER_SEQ, R_FLASH, R_QUANT, R_MULTI_GPU),
      "failing framework CuPy", "(unit tests)" },
    { "no_zero", no_zero, DROP, 0, 0, REMS(R_ZERO), "failing framework TensorFlow or CuPy", "(unit tests)" },
    { "embedding_tables", og_embedding_tables, DROP, 0, 0, REMS(R_LORA, R_QUANT),
      "roles: embedding tables >= half the parameters (LoRA and weight quantization are for the linear layers' "
      "weights; a table's rows are read a few at a time: cpu_offload says how to keep them off the GPU)",
      "deepfm_ad_clicks_hashed_cross_features_dense_embedding_grads_first_backward_a10g (blind); (unit tests: "
      "embedding_tables_off_the_gpu)" },
    { "lora_in_use", lora_in_use, DROP, 0, 0, REMS(R_LORA),
      "roles: LoRA adapters measured, other weights requiring grad under 4x them (the job trains adapters already)",
      "llava_next_docvqa_lora_anyres_tiles_unsorted_lengths_fragmented_cache_a100_40gb (blind); (unit tests: "
      "lora_base_weights_train)" },
    { "ddp_pytorch", not_pytorch, DROP, 0, 0, REMS(R_DDP), "failing framework not PyTorch", "(unit tests)" },
    { "dequantizing", load_dequantizes, DROP, 0, 0, REMS(R_QUANT),
      "phase loading decided by a frame named dequantize* (the job makes full-precision weights of quantized ones, "
      "to merge or export them: quantizing is what it undoes)",
      "qlora_llama31_70b_dequantize_before_adapter_merge_bf16_on_gpu_a100_80gb (blind); (unit tests: "
      "dequantizing_load)" },
    { "quantized_beside_reference", quant_beside_reference, DROP, 0, 0, REMS(R_QUANT),
      "roles.models: a model at least half in 8 bits or fewer (parameters_quantized_bytes) beside one of its class "
      "with none: a quantized model checked against its reference, which quantizing would change",
      "llama31_8b_w8a8_smoothquant_gptq_kl_eval_bf16_reference_and_int8_both_resident_l4 (blind); (unit tests: "
      "quantized_beside_reference)" },
    { "fragmentation_knobs", frag_other_framework, WANT, 0, 0, REMS(R_EMPTY_CACHE),
      "fragmentation, failing framework JAX/TensorFlow/CuPy (their allocator knobs)", "(unit tests)" },
    { "fits_alone_or_leak", fits_alone_or_leak, DROP, 0, 0, REMS(R_BIGGER, R_MULTI_GPU, R_ZERO, R_OFFLOAD),
      "footprint + request <= 97% of the device (not state_exceeds_card, nor a load of a model larger than the "
      "card: roles' parameters here + elsewhere >= capacity), or primary growth",
      "batch_3pct_over, loss_history_leak" },
    /* a leak whose rise the adapter found in what Python keeps: a fixed saving elsewhere only delays the next failure
     * (a leak fills any card), so what acts on something else is not offered at all */
    { "measured_leak_not_the_cache", measured_leak, DROP, 0, 0,
      REMS(R_EMPTY_CACHE, R_EXPANDABLE, R_RESTART, R_BUCKET, R_POOL_TRIM, R_FOREIGN),
      "primary growth >= 0.7, not a generation's working set nor a KV cache holding half the rise, "
      "growth.kept_measured (what Python keeps across calls >= 9/10 of the rise), a holder's outputs keeping their "
      "graphs (step_marker kept_graphs), roles.model_copies (copies of one model beyond the first) or roles.grower "
      "(one holder, a running loop's local too) >= 4/5 of the rise: "
      "the cache, its layout, a restart and the others' memory shed "
      "none of it for long",
      "codesearch_biencoder_trainer_xbm_bank_reset_only_per_epoch_a10g, "
      "shelf_sku_convnext_nightly_ewc_penalty_per_past_night_l4 (blind)" },
    { "measured_leak_not_the_pass", measured_leak, DROP, 0, 0,
      REMS(R_SMALLER_BATCH, R_SHORTER_SEQ, R_MIXED, R_CHECKPOINTING, R_FLASH, R_QUANT, R_OPT_8BIT, R_LORA, R_CAP_INPUT,
           R_LOAD_HALF, R_DYN_PAD, R_FUSED_CE, R_TEACHER_NO_GRAD, R_SMALLER_EMB, R_FP32_NOT_FP64),
      "as measured_leak_not_the_cache (a smaller pass, a teacher's pass without autograd, lighter or float32 "
      "weights, smaller embedding tables or optimizer state leave the kept memory growing)",
      "openfold_multimer_bait_prey_screen_keeps_every_output_dict_for_iptm_ranking_h100, "
      "prott5_human_proteome_per_residue_embeddings_dict_on_gpu_colab_t4, "
      "mace_mp_medium_screening_new_calculator_per_structure_kept_by_relaxed_atoms_4090 (blind)" },
};

static const og_rank_row_t reorder[] = {
    { "one_gpu", one_gpu, ORDER, 150, 5, REMS(R_MULTI_GPU, R_ZERO), "visible devices <= 1", "batch_4x_over" },
    { "pre_volta", pre_volta, ORDER, 1000, 0, REMS(R_MIXED), "compute capability < 7.0", "(unit tests: cc70)" },
    { "training_first", not_known_inference, ORDER, 95, 0, REMS(R_INFERENCE), "adapter: training not known -1",
      "batch_3pct_over" },
    { "no_autograd_batch", autograd_off, ORDER, 65, 0, REMS(R_SMALLER_BATCH), "adapter: grad_enabled off",
      "validation_batch_too_big" },
    { "optimizer_not_in_activation_phase", activation_phase, ORDER, 125, 0, REMS(R_OPT_8BIT),
      "phase forward, backward, evaluation or generation", "(unit tests: phase_forward_optimizer_later)" },
    { "state_new_since_pass", state_new_since_pass, ORDER, 82, 0, REMS(R_OPT_8BIT),
      "roles: optimizer_steps 1 (the step made the state after a pass of this batch fit), optimizer state not 8-bit "
      "whose 3/4 covers the shortfall, phase forward or backward",
      "vit_sgd_to_adamw_config (blind)" },
    { "fragmentation_fewer_shapes", frag_primary_variable, ORDER, 25, 0, REMS(R_BUCKET),
      "primary fragmentation, distinct sizes >= 8 or a retry that freed 0 B (fewer shapes keep the splinters from "
      "coming back; a restart only defers them)",
      "dpo_llama32_3b_lora_ultrafeedback_dynamic_padding_fragmented_cache_4090 (blind)" },
    { "limit_on_purpose", always, ORDER, 900, 0, REMS(R_RAISE_LIMIT), "-", "limit_emulates_16gb" },
};

static const og_rank_row_t lead[] = {
    { "split_segments_lead", split_segments_lead, LEAD, -30, 5, REMS(R_EXPANDABLE, R_BUCKET),
      "primary fragmentation or does_not_fit, fragmentation, a retry that freed 0 B", "frag_varlen_noadapter" },
    { "larger_chunk", larger, LEAD, -30, 0, REMS(R_CHUNK), "request > device or limit", "logits_larger_than_card" },
    { "split_segments_rest", split_segments_rest, TIER_CAP, 1, 0, REMS(R_EXPANDABLE),
      "fragmentation, a retry that freed 0 B", "frag_varlen_noadapter" },
    { "pass_outgrows_cache", pass_outgrows, TIER, 3, 0, REMS(R_EXPANDABLE, R_EMPTY_CACHE),
      "a pass still building (phase forward, backward, evaluation, generation) holds >= 3x the cache (in generation "
      "with its KV cache)",
      "skip_batch_on_oom, asr_accum_summed_loss (blind)" },
    { "copy_outgrows_cache", copy_outgrows, TIER, 3, 0, REMS(R_EXPANDABLE, R_EMPTY_CACHE, R_BUCKET),
      "a deep copy under way (roles.operation copy) made >= 3x the cache so far (roles.copy_made_bytes)",
      "lightning_spike_rollback_gpu_snapshot, trdpo_reference_refresh_deepcopy (blind)" },
    { "kept_outgrows_cache", kept_outgrows, TIER, 3, 0, REMS(R_EXPANDABLE, R_EMPTY_CACHE, R_BUCKET),
      "holders kept across calls hold >= 3x the cache, not loading (facts: kept_outgrows_cache)",
      "maskrcnn_val_torchmetrics_segm_map_masks_kept_on_gpu_v100_16gb (blind)" },
    { "no_batch_fit_yet", pass_outgrows_first, TIER, 3, 0, REMS(R_BUCKET),
      "as pass_outgrows_cache, roles: optimizer_steps < 2 or phase evaluation or generation, and the request no "
      "outlier (no batch of the failing kind fit with the state the job keeps now)",
      "sft_first_forward_activations, long_ctx_lora_ckpt_flag_off, whisper_fp32_pipeline_8gb, controlnet_train_"
      "custom_validation_sampler_keeps_graph_a10g (blind)" },
    { "one_batch_not_bucket", one_batch_peak, TIER, 3, 0, REMS(R_BUCKET),
      "as one_batch_peak (one batch far beyond every earlier one: evening the batches' lengths does not shrink it)",
      "code_lm_packing_minified_bundle_row_unsplit (blind); (unit tests: one_batch_peak_not_bucketing)" },
    { "one_sample_peak", one_sample_peak, TIER, 3, 0, REMS(R_SMALLER_BATCH),
      "as one_batch_peak, roles: the request / batch_size >= the earlier steps' largest allocation",
      "code_lm_packing_minified_bundle_row_unsplit (blind); (unit tests: one_batch_peak_not_bucketing)" },
    { "second_load", second_load, WANT, 0, 0, REMS(R_RELEASE_REFS, R_RESTART),
      "primary does_not_fit, phase second_load", "notebook_second_model" },
    { "second_load_lead", second_load, LEAD, -20, 1, REMS(R_RESTART, R_RELEASE_REFS),
      "primary does_not_fit, phase second_load", "notebook_second_model" },
    { "model_copy", model_copy_primary, WANT, 0, 0, REMS(R_RELEASE_REFS, R_RESTART),
      "primary does_not_fit, roles.models: a second copy of a model >= shortfall, not ema_update",
      "notebook_interrupted_unet_rerun (blind)" },
    { "model_copy_lead", model_copy_primary, LEAD, -32, 1, REMS(R_RESTART, R_RELEASE_REFS),
      "the same (the copy is the measured cause; splinters of the cache come after)",
      "notebook_interrupted_unet_rerun (blind)" },
    { "unreached_copy_lead", unreached_copy, LEAD, -33, 0, REMS(R_RELEASE_REFS),
      "as model_copy, the copies include a model of another size no name reaches (roles.unreached_copies): released "
      "ahead of a restart, which would lose the loop",
      "fungi_eva02_kfold_callback_trainer_cycle_folds_freed_only_by_gc_a10g (blind)" },
    { "concurrent_loops", concurrent_loops, WANT, 0, 0, REMS(R_FEWER_WORKERS),
      "roles.models: two or more copies of one model running at once (roles.concurrent_copies), not beyond the card",
      "clause_classifier_optuna_n_jobs3_deberta_v3_trials_share_one_l4 (blind); (unit tests: concurrent_loops)" },
    { "concurrent_loops_lead", concurrent_loops, LEAD_COVERS, -30, 0, REMS(R_FEWER_WORKERS),
      "the same (each copy's loop holds its own model, state and activations: fewer at once, not a smaller pass)",
      "clause_classifier_optuna_n_jobs3_deberta_v3_trials_share_one_l4 (blind); (unit tests: concurrent_loops)" },
    { "copy_replaces_model", copy_replaces_model, WANT, 0, 0, REMS(R_IN_PLACE, R_RELEASE_REFS),
      "roles.operation copy, the failing statement rebinds a name of roles.models whose model holds >= shortfall",
      "trdpo_reference_refresh_deepcopy (blind)" },
    { "copy_replaces_model_lead", copy_replaces_model, LEAD_COVERS, -34, 1, REMS(R_IN_PLACE, R_RELEASE_REFS),
      "the same (both copies alive at the peak: update the existing one in place, or drop it first)",
      "trdpo_reference_refresh_deepcopy (blind)" },
    { "loading_weights", loading, ORDER_COVERS, 20, 1, REMS(R_QUANT, R_OFFLOAD, R_MULTI_GPU, R_ZERO, R_BIGGER),
      "primary does_not_fit, phase loading", "load_13b_fp16, slow_load_13b" },
    { "loading_not_activations", loading, TIER, 3, 0,
      REMS(R_SMALLER_BATCH, R_SHORTER_SEQ, R_CHECKPOINTING, R_FLASH, R_INFERENCE),
      "primary does_not_fit, phase loading", "load_13b_fp16, load_cast_empty_cache" },
    { "eval_with_autograd", eval_with_autograd, LEAD, -21, 0, REMS(R_INFERENCE),
      "primary growth, adapter: training -1 and grad_enabled on", "eval_keeps_outputs_adapter" },
    { "growth_one_offs_last", confident_growth, DEMOTE, 3, 0,
      REMS(R_EMPTY_CACHE, R_EXPANDABLE, R_RESTART, R_BUCKET, R_POOL_TRIM), "primary growth >= 0.7",
      "train_leak_eval_fails, generate_kv_cache" },
    { "growth_not_the_state", growth_not_in_step, DEMOTE, 3, 0, REMS(R_OPT_8BIT, R_LORA),
      "primary growth >= 0.7, phase not optimizer_step", "skip_batch_on_oom, t5_bf16_adamw_state (blind)" },
    { "fragmentation_not_the_state", frag_primary, DEMOTE, 2, 0,
      REMS(R_OPT_8BIT, R_ZERO, R_OFFLOAD, R_QUANT, R_LORA, R_MULTI_GPU, R_BIGGER),
      "primary fragmentation (the free bytes are there, in splinters: shrinking the model's state is not the lever; "
      "after those that can cover, with what is not known)",
      "llava_next_docvqa_lora_anyres_tiles_unsorted_lengths_fragmented_cache_a100_40gb, "
      "ppo_qwen25_05b_four_models_response_length_growth_fragmented_cache_a10g (blind)" },
    { "growth_kept_not_others", growth_kept_measured, DEMOTE, 2, 0, REMS(R_FOREIGN),
      "primary growth, growth.kept_measured: what Python keeps across calls >= 9/10 of the rise (stopping others only "
      "delays the next failure)",
      "lab_a6000_notebook_gradio_qwen25_7b_chat_demo_session_kv_dict_never_evicted (blind)" },
    { "evaluation_autograd_on", evaluation_autograd_on, WANT, 0, 0, REMS(R_INFERENCE),
      "phase evaluation or generation, adapter: grad_enabled on; not a deep copy, not roles.input_requires_grad or "
      "an attribution_pass (the gradient is asked for)",
      "segmentation_eval_autograd_on (blind)" },
    { "evaluation_autograd_on_lead", evaluation_autograd_on, LEAD_COVERS, -21, 0, REMS(R_INFERENCE),
      "phase evaluation or generation, adapter: grad_enabled on; not a deep copy, not roles.input_requires_grad or "
      "an attribution_pass (the gradient is asked for)",
      "segmentation_eval_autograd_on (blind)" },
    { "training_state_idle", training_state_idle, WANT, 0, 0, REMS(R_FREE_TRAINING),
      "phase evaluation or generation, roles gradients or optimizer_state > 0",
      "sagemaker_notebook_vitg_eval_cell_after_fit_adamw_state_live (blind)" },
    { "training_state_idle_lead", training_state_carries_pass, LEAD_COVERS, -20, 0, REMS(R_FREE_TRAINING),
      "as training_state_idle (the pass reads neither), the pass's working set under 3x that state (more, and it "
      "outgrows what freeing it gives: its own batch leads)",
      "sagemaker_notebook_vitg_eval_cell_after_fit_adamw_state_live (blind)" },
    { "feeds_no_backward", og_feeds_no_backward, WANT, 0, 0, REMS(R_INFERENCE),
      "phase forward, autograd on, roles.backward_on_stack false (no frame of the failing stack calls backward or "
      "autograd.grad), activations measured",
      "histopath_active_learning_bald_mc_dropout_acquisition_with_autograd_t4 (blind)" },
    { "feeds_no_backward_lead", og_feeds_no_backward, LEAD_COVERS, -21, 0, REMS(R_INFERENCE),
      "as feeds_no_backward (the graph it records is what the pass holds; checkpointing would only shrink it)",
      "histopath_active_learning_bald_mc_dropout_acquisition_with_autograd_t4 (blind)" },
    { "graphs_without_training_lead", graphs_without_training, LEAD_COVERS, -23, 0, REMS(R_INFERENCE),
      "as kept_graphs, the job not known to train, adapter: grad_enabled on (build no graph: what holds them is the "
      "job's own)",
      "support_chat_sse_stream_generator_outlives_no_grad_block_mistral7b_l4 (blind); (unit tests: "
      "kept_graphs_without_training)" },
    { "categorical_tables_lead", categorical_tables, LEAD_COVERS, -24, 1, REMS(R_SMALLER_EMB, R_OFFLOAD),
      "as categorical_tables (the tables' size is the model's: smaller tables first, then off the GPU)",
      "fastai_tabular_learner_criteo_2m_rows_26_categoricals_first_backward_kaggle_p100 (blind); (unit tests: "
      "embedding_tables_off_the_gpu)" },
    { "kept_graphs_lead", kept_graphs, LEAD_COVERS, -22, 0, REMS(R_RELEASE_REFS),
      "as kept_graphs (the holder keeps every earlier batch's graph: named first, autograd off for the evaluation "
      "next)",
      "val_losses_logged_without_no_grad (blind)" },
    { "kept_graphs_measured", kept_graphs_measured, WANT, 0, 0, REMS(R_INFERENCE),
      "as kept_graphs, the graphs read alive by the adapter (roles.graphs_measured): no graph built for what is kept",
      "ppo_isaac_humanoid_rollout_collected_with_autograd_h100 (blind)" },
    { "kept_graphs_measured_lead", kept_graphs_measured, LEAD_COVERS, -21, 0, REMS(R_INFERENCE),
      "as kept_graphs_measured (after the holder's own fix)",
      "ppo_isaac_humanoid_rollout_collected_with_autograd_h100 (blind)" },
    { "cap_without_room", cap_without_room, DROP, 0, 0, REMS(R_FW_CAP),
      "framework_cap counting reserved bytes (PyTorch, CuPy), the device had no room for the request",
      "reranker_capped_shared_card (blind)" },
    { "others_short_of_scores", others_short_of_scores, DEMOTE, 3, 0, REMS(R_FOREIGN),
      "an attention's scores failed (facts: scores: a square request of an 8th of the device in a pass of models with "
      "attention), the other processes under the shortfall plus another such request (facts: others_short_of_scores)",
      "phi3_mini_128k_contract_summaries_eager_attention_16k_prefill_beside_other_pods_timesliced_l40s (blind)" },
    { "others_a_sliver", others_sliver, DEMOTE, 3, 0, REMS(R_FOREIGN),
      "other processes under 1/16 of the device, the failure inside a pass still building (facts: others_sliver)",
      "qwen14b_qlora_bnb_config_not_passed_3090, contract_clause_highlighter_output_attentions_all_layers_4090 "
      "(blind); (unit tests: others_a_sliver_of_the_device)" },
    { "cap_is_the_cause", cap_refused_with_room, DEMOTE, 3, 0,
      REMS(R_RELEASE_REFS, R_RESTART, R_EMPTY_CACHE, R_EXPANDABLE, R_BUCKET, R_FOREIGN, R_POOL_TRIM),
      "primary framework_cap, refused inside the framework, the device had room for the request",
      "config_fraction_cap_dedicated_card (blind)" },
    { "cap_on_shared_gpu", cap_on_shared_gpu, TIER, 3, 0, REMS(R_FW_CAP),
      "framework_cap binds, NVML listed processes not of this job holding memory on the card, the card's free bytes "
      "less the request under what they hold",
      "lab_quarter_card_cap_unet_finetune (blind); (unit tests: cap_on_shared_gpu)" },
    { "prefork_workers_lead", prefork_primary, LEAD, -20, 0, REMS(R_FEWER_WORKERS),
      "primary peer_ranks, every peer a worker of this process's parent (or the parent)", "prefork_server_copies" },
    { "dataloader_workers_lead", worker_primary, LEAD, -20, 1, REMS(R_CUDA_OUT_OF_WORKERS, R_FEWER_WORKERS),
      "primary peer_ranks, every peer a child of this process (DataLoader workers)",
      "dataloader_workers_cuda, kornia_gpu_augment_in_spawned_workers (blind)" },
    { "child_programs_lead", child_programs_primary, LEAD, -20, 0, REMS(R_FEWER_WORKERS),
      "primary peer_ranks, as child_programs",
      "conformer_ctc_epoch_end_eval_subprocesses_pile_up_same_gpu_a100_40gb (blind)" },
    { "own_children_lead", own_children_primary, LEAD, -20, 0, REMS(R_FOREIGN), "primary peer_ranks, as own_children",
      "merlin_nvtabular_etl_dask_cuda_worker_rmm_pool_outlives_etl_session_recsys_training_a10g (blind); (unit tests: "
      "own_children_not_workers)" },
    { "own_children_restart_again", own_children_primary, DROP, 0, 0, REMS(R_RESTART),
      "the same (a restart runs the code that starts them again)", "(unit tests: own_children_not_workers)" },
    { "workers_restart_again", worker_primary, DROP, 0, 0, REMS(R_RESTART),
      "the same (a restart starts the workers again, each taking CUDA as before)",
      "kornia_gpu_augment_in_spawned_workers (blind)" },
    { "limit_on_shared_gpu", limit_on_shared_gpu, LEAD, -20, 0, REMS(R_RAISE_LIMIT), "limit, other processes listed",
      "(unit tests)" },
    { "larger_inference_lead", larger_inference_lead, LEAD, -31, 0, REMS(R_SHORTER_SEQ),
      "as larger_inference, the statement's sizes not L x L x L (one size three times: an operation over every "
      "triple, split it), nor L x L made outside any pass of a model (phase unknown with a Python stack read, no KV "
      "cache: every pair of the program's items, split it)",
      "long_prompt_serving, recsys_catalog_scores, esmfold_2000_residue_complex_no_chunk_size (blind)" },
    { "one_input_inference_lead", one_input_inference, LEAD_COVERS, -31, 0, REMS(R_SHORTER_SEQ),
      "primary does_not_fit, autograd off, phase evaluation or forward, roles: batch_size 1, no KV cache, "
      "request >= capacity / 8, not operation_dominates (then splitting the operation leads)",
      "hdemucs_label_stems_finetune_val_whole_live_recording_unsplit_l4 (blind)" },
    { "rank_model_exceeds_card_lead", rank_model_exceeds_card, LEAD, -32, 0, REMS(R_ZERO),
      "as rank_model_exceeds_card (ahead of loading it sharded: no rank can hold it whole)",
      "(unit tests: rank_model_larger_than_card)" },
    { "retry_outside_lead", in_handler, LEAD_COVERS, -25, 0, REMS(R_RETRY_OUTSIDE), "phase oom_handler",
      "retry_in_except (blind)" },
    { "retry_outside_first", handler_keeps_attempt, LEAD_COVERS, -45, 0, REMS(R_RETRY_OUTSIDE),
      "phase oom_handler, roles: activations - the failing request >= shortfall (ahead of the operation's leads)",
      "videomae_long_video_chunk_fallback_inside_except (blind); (unit tests: handler_keeps_failed_attempt)" },
    { "checkpoint_restore_lead", checkpoint_restore_first, LEAD_COVERS, -24, 0, REMS(R_MAP_CPU),
      "phase loading, torch.load on the stack, not weights_fill_card, not a confident foreign_memory or "
      "other_framework whose bytes cover the shortfall",
      "(unit tests: phase_checkpoint_restore), mixtral_8x7b_bf16_one_h100_load, "
      "hf_eager_baseline_beside_tritonserver_trtllm_kv_fraction_l40s (blind)" },
    { "weights_fill_card_lead", weights_fill_card, LEAD, -24, 1, REMS(R_QUANT, R_MULTI_GPU, R_OFFLOAD),
      "phase loading, roles: one model (one copy) whose parameters on the device >= 90% of the card, not mostly "
      "float32 (parameters_by_dtype)",
      "mixtral_8x7b_bf16_one_h100_load (blind); (unit tests: weights_fill_the_card)" },
    { "restored_held_lead", restored_held, LEAD_COVERS, -36, 0, REMS(R_MAP_CPU),
      "as restored_held (ahead of the statement that copies them and of a dataset's row: the load put them there)",
      "dinov2_linear_probe_feature_shards_torch_load_onto_gpu_l40s (blind); (unit tests: restored_by_torch_load)" },
    { "checkpoint_kept_lead", checkpoint_kept, LEAD_COVERS, -35, 1, REMS(R_MAP_CPU, R_RELEASE_REFS),
      "as checkpoint_kept (load it to host memory, or drop it once loaded)",
      "tinyllama_resume_ckpt_left_on_gpu (blind); (unit tests: checkpoint_kept_after_load)" },
    { "communication_settings_lead", comm_settings_cover, LEAD_COVERS, -23, 0, REMS(R_NCCL_BUF),
      "NCCL_BUFFSIZE above its 4 MiB default, NCCL's bytes beyond what the default would hold >= shortfall",
      "megatron_nccl_buffsize_tuning_env (blind); (unit tests: nccl_settings)" },
    { "communication_lead", comm_holds_growth, LEAD_COVERS, -23, 1, REMS(R_REUSE_PG, R_NCCL_BUF),
      "cause growth held by NCCL: its bytes >= the rise, or its own failing-size steps and >= their steady part",
      "rlhf_weight_sync_new_comm (blind); (unit tests: nccl_growth)" },
    { "optimizer_step_lead", in_optimizer_step, LEAD_COVERS, -22, 0, REMS(R_OPT_8BIT), "phase optimizer_step",
      "adamw_first_step (blind)" },
    { "optimizer_step_ranks_lead", step_of_ranks, LEAD_COVERS, -23, 0, REMS(R_ZERO),
      "phase optimizer_step in a rank of a multi-rank job (WORLD_SIZE > 1): the ranks are there to shard the state "
      "over (ZeRO, FSDP), at full precision, ahead of an 8-bit optimizer",
      "gpt2_xl_nanogpt_ddp_grad_accum_first_adamw_step_8x_4090 (blind); (unit tests: optimizer_step_of_ranks)" },
    { "lora_base_trains_lead", lora_base_trains, LEAD_COVERS, -27, 0, REMS(R_LORA),
      "as lora_base_trains (ahead of the activations' and the optimizer's remedies: the adapters are there, the base "
      "was not frozen)",
      "esm2_3b_antibody_loralib_head_unfrozen_by_skipping_mark_only_lora_a100_40gb (blind); (unit tests: "
      "lora_base_weights_train)" },
    { "per_sample_gradients_lead", per_sample_gradients, LEAD_COVERS, -23, 1, REMS(R_SMALLER_BATCH, R_GHOST_CLIP),
      "as per_sample_gradients (ahead of the activations' remedies: a smaller physical batch, or no per-example "
      "copies at all)",
      "opacus_dp_sgd_bert_base_per_sample_grads_batch64_t4 (blind); (unit tests: per_sample_gradients)" },
    { "preconditioned_state_lead", preconditioned_state, LEAD_COVERS, -23, 0, REMS(R_PRECOND_CAP),
      "as preconditioned_state (ahead of an 8-bit optimizer: the matrices, not the moments, hold it)",
      "qwen25_15b_continued_pretrain_soap_first_step_preconditioners_a6000 (blind); (unit tests: "
      "preconditioners_hold_the_state)" },
    { "weights_update_lead", weights_update, LEAD_COVERS, -23, 1, REMS(R_IN_PLACE, R_EMA_CPU), "as weights_update",
      "ema_lazy_shadow, ema_foreach_temporaries (blind)" },
    { "state_snapshot_lead", state_snapshot, LEAD_COVERS, -23, 0, REMS(R_SNAPSHOT_CPU), "as state_snapshot",
      "best_state_gpu_deepcopy (blind)" },
    { "attribution_pass_lead", og_attribution_pass, LEAD_COVERS, -25, 0, REMS(R_SMALLER_BATCH),
      "as attribution_pass (the batch is the method's samples of one input: chunks give the same attribution)",
      "captum_layer_ig_clinicalbert_readmission_discharge_note_n_steps_200_t4, "
      "chexpert_densenet121_smoothgrad_noise_tunnel_50_samples_one_batch_512px_t4 (blind)" },
    { "weight_grads_unread_lead", weight_grads_unread, LEAD_COVERS, -30, 0, REMS(R_NO_WEIGHT_GRADS),
      "as weight_grads_unread (ahead of the activations' remedies: the gradients are the weights' size)",
      "attribution_patching_pythia_6_9b_ioi_backward_fills_weight_grads_4090 (blind)" },
    { "frozen_model_lead", teacher_autograd_on, LEAD_COVERS, -24, 0, REMS(R_TEACHER_NO_GRAD),
      "as frozen_model_autograd_on, a holder of purpose teacher or a running model no optimizer trains (not a frozen "
      "model alone)",
      "distill_teacher_grad, ibot_vitl_teacher_deepcopy_still_requires_grad_l40s (blind)" },
    { "kv_cache_lead", kv_cache_lead, LEAD_COVERS, -22, 0, REMS(R_SMALLER_KV),
      "as kv_cache_reserved, the cache >= the graph pools", "static_kv_cache_prealloc, cuda_graph_shapes (blind)" },
    { "kv_cache_reserving_lead", kv_reserving_lead, LEAD_COVERS, -22, 0, REMS(R_SMALLER_KV),
      "as kv_cache_reserving, the processes not of this program (other_processes[].same_program) < shortfall",
      "vllm_second_server_default_utilization (blind); (unit tests: kv_cache_reserving)" },
    { "kv_cache_reserving_second", kv_reserving_second, LEAD_COVERS, -19, 0, REMS(R_SMALLER_KV),
      "as kv_cache_reserving, primary foreign_memory whose processes not of this program hold >= shortfall",
      "(unit tests: kv_cache_reserving)" },
    { "kv_pool_beyond_card_lead", kv_pool_reserving_beyond, LEAD_COVERS, -32, 0, REMS(R_SMALLER_KV),
      "as kv_pool_beyond_card (ahead of splitting: a pool is no operation to split)",
      "a100_mig_3g40gb_pod_kv_pool_sized_from_pynvml_parent_gpu_total_llama31_8b (blind); (unit tests: "
      "kv_cache_reserving)" },
    { "model_registry_lead", model_registry_lead, LEAD_COVERS, -34, 0, REMS(R_BOUNDED_CACHE),
      "as model_registry, unless an idle GPU or an uneven split leads (idle_gpu_lead, uneven_split_lead)",
      "tenant_finetunes_full_copies_resident_a100_40gb, custom_voice_server_16_tenant_xtts_finetunes_num_gpus_env_"
      "missing_all_on_gpu0_2x_l4 (blind)" },
    { "bounded_cache_lead", growth_in_a_cache_primary, LEAD_COVERS, -22, 0, REMS(R_BOUNDED_CACHE),
      "primary growth, the same as growth_in_a_cache", "dict_cache_embeddings (blind)" },
    { "lora_adapters_piled_lead", lora_piled, LEAD_COVERS, -30, 1, REMS(R_RELEASE_REFS, R_BOUNDED_CACHE),
      "as lora_adapters_piled (deleting each adapter after its job first, a bounded set of them next)",
      "sdxl_lora_marketplace_preview_worker_load_lora_weights_per_job_never_deleted_l4 (blind); (unit tests: "
      "lora_adapters_piled)" },
    { "cache_kept_lead", cache_kept, LEAD_COVERS, -28, 0, REMS(R_BOUNDED_CACHE),
      "as cache_kept (ahead of a generation's working set: the entries kept from earlier calls take its room)",
      "tenant_prefix_kv_cache_dict_never_evicted (blind); (unit tests: cache_kept_across_calls)" },
    { "graph_pools_lead", graph_pools_lead, LEAD_COVERS, -21, 0, REMS(R_GRAPH_SHAPES),
      "graph pools as in graph_pools, primary does_not_fit, cache_held, fragmentation or growth",
      "cuda_graph_shapes (blind)" },
    { "graph_pools_hold_the_cache", graph_pools_hold_the_cache, LEAD_COVERS, -36, 0, REMS(R_GRAPH_SHAPES),
      "primary cache_held, held by the graphs' private pools unused (pool_idle >= shortfall)",
      "sdxl_turbo_gradio_compile_reduce_overhead_graph_per_aspect_and_count_4090 (blind)" },
    { "summed_microbatches_lead", summed_microbatches, LEAD_COVERS, -32, 0, REMS(R_BACKWARD_PER_MB),
      "as summed_microbatches (the measured cause; splinters of the cache come after)",
      "asr_accum_summed_loss, detr_accum_losses_list_single_backward (blind)" },
    { "fp64_data_lead", fp64_data, LEAD_COVERS, -26, 0, REMS(R_FP32_NOT_FP64),
      "as fp64_data (ahead of the activations' remedies: the data themselves take twice what they need)",
      "jane_street_mlp_rolling_features_model_double_fold_on_gpu_kaggle_p100 (blind)" },
    { "fp64_weights_lead", fp64_network, LEAD_COVERS, -26, 0, REMS(R_FP32_NOT_FP64),
      "as fp64_weights, those weights >= 1 MiB (a network's, not a numerical method's scalars; ahead of the "
      "activations' remedies: half of everything the model computes)",
      "mace_mp_li3ps4_melt_quench_md_float64_from_relax_notebook_11k_atoms_l40s, "
      "heston_asian_book_greeks_aad_4m_paths_one_graph_float64_a100_80gb (blind); (unit tests: float64_weights)" },
    { "fp32_weights_lead", fp32_weights, LEAD_COVERS, -20, 0, REMS(R_LOAD_HALF), "as fp32_weights",
      "fullft_fp32_default_dtype (blind)" },
    { "fp32_beside_half_lead", fp32_beside_half, LEAD_COVERS, -20, 0, REMS(R_LOAD_HALF), "as fp32_beside_half",
      "assisted_generation_llama31_8b_draft_llama32_1b_left_fp32_meeting_transcripts_a10g (blind)" },
    { "state_exceeds_card_lead", state_exceeds_card, LEAD_COVERS, -19, 1, REMS(R_LORA, R_OFFLOAD, R_ZERO),
      "as state_exceeds_card (after load_in_bf16 where halving makes it fit)",
      "fullft_3b_first_backward_state (blind)" },
    { "padded_to_max_lead", padded_to_max_lead, LEAD_COVERS, -29, 0, REMS(R_DYN_PAD),
      "as padded_to_max, primary not a confident growth (the padding is in every activation of the pass)",
      "ticket_classifier_bge_m3_padded_to_8192 (blind); (unit tests: padding_to_max_length)" },
    { "extra_outputs_lead", extra_outputs_first, LEAD_COVERS, -31, 0, REMS(R_FEWER_OUTPUTS),
      "as extra_outputs, whatever the growth (outputs kept per layer or per token are a rise within the call), "
      "unless the growth's holder is kept across calls (not a local of the running code) and covers the shortfall",
      "e5_mistral_embed_output_hidden_states_all_layers (blind)" },
    { "all_position_logits_lead", all_position_logits, LEAD_COVERS, -31, 0, REMS(R_FEWER_OUTPUTS),
      "as all_position_logits (one request of outputs the decoding step does not read)",
      "react_agent_fetch_tool_42k_token_filing_prefill_all_position_logits_float_upcast_llama31_8b_l40s (blind)" },
    { "attentions_asked_lead", attentions_asked, LEAD_COVERS, -35, 0, REMS(R_FEWER_OUTPUTS),
      "as extra_outputs, the key output_attentions (a fused attention kernel returns no weights: ahead of "
      "flash_attention; after extra_outputs_lead, whose order it overrides)",
      "contract_clause_highlighter_output_attentions_all_layers_4090 (blind); (unit tests: others_a_sliver_of_the_"
      "device)" },
    { "rank_loads_whole_model_lead", rank_loads_whole_model_first, LEAD_COVERS, -30, 0, REMS(R_SHARD_LOAD),
      "as rank_loads_whole_model, not checkpoint_restore_lead (torch.load restoring onto the GPU: map_location "
      "first)",
      "fsdp_lora_llama2_13b_g5_12xlarge_device_map_local_rank, "
      "mistral7b_fsdp_elastic_restart_16_to_8_ranks_local_state_dict_reshard_loads_every_old_shard_onto_gpu_a100_40gb "
      "(blind)" },
    { "growing_dataset_lead", growing_dataset, LEAD_COVERS, -34, 0, REMS(R_DATASET_CPU),
      "as growing_dataset (a dataset filling the GPU is the growth: releasing it breaks the job)",
      "drqv2_replay_buffer_episodes_on_gpu, dreamer_replay_buffer_float32_chunks_on_gpu (blind)" },
    { "eager_attention_lead", eager_attention_lead, LEAD_COVERS, -33, 0, REMS(R_FLASH),
      "as eager_attention, primary not a confident growth",
      "mistral7b_contracts_32k_lora_eager_attention (blind); (unit tests: eager_attention_fused_first)" },
    { "fp32_training_lead", fp32_training, LEAD_COVERS, -19, 0, REMS(R_MIXED),
      "PyTorch training in a forward or backward, autograd on, autocast measured off and in no frame of the code, "
      "weights >= half float32, compute capability >= 7.0, activations >= half of what is allocated, no peak from "
      "one batch, no DDP bucket copy leading (ahead of checkpointing: half precision halves them and runs faster)",
      "deberta_v3_large_ner_bf16_unsupported_on_v100_switched_off_trains_fp32_v100_16gb (blind); (unit tests: "
      "fp32_training_half_first)" },
    { "checkpointing_off_lead", checkpointing_off_leads, LEAD_COVERS, -18, 0, REMS(R_CHECKPOINTING),
      "as checkpointing_off, unless a forward's failing request alone is a quarter of the card or more",
      "sft_first_forward_activations, long_ctx_lora_ckpt_flag_off (blind)" },
    { "own_operation_peak_lead", own_operation_peak, LEAD_COVERS, -20, 0, REMS(R_CHUNK),
      "as own_operation_peak (ahead of one batch's length: no batch of a model is in flight)",
      "beir_quora_e5_large_cos_sim_10k_queries_full_score_matrix_a10g (blind); (unit tests: "
      "larger_outlier_batch_caps_the_length)" },
    { "one_batch_peak_lead", batch_peak_in_pass, LEAD_COVERS, -19, 0, REMS(R_SHORTER_SEQ),
      "as one_batch_peak, no operation of the program's own outside a pass (phase unknown, roles.models none "
      "running, an operation read or sizes a product)",
      "outlier_long_batch, egnn_pdbbind_affinity_uncropped_assembly_entry_epoch7_empty_cache_every_step_a5000 "
      "(blind)" },
    { "larger_outlier_batch_lead", larger_outlier_batch, LEAD, -31, 0, REMS(R_SHORTER_SEQ),
      "as larger_outlier_batch (ahead of larger_chunk's split_operation)",
      "callcenter_wav2vec2_ctc_hour_long_recording (blind)" },
    { "larger_forward_inputs_lead", og_forward_inputs_fill_card, LEAD, -31, 0, REMS(R_CAP_INPUT),
      "as larger_forward_inputs (ahead of larger_chunk's split_operation)",
      "seed_phenotyping_maskrcnn_tutorial_600dpi_flatbed_scans_colab_t4 (blind)" },
    { "generation_beams_lead", generation_beams, LEAD_COVERS, -27, 0, REMS(R_FEWER_BEAMS),
      "as generation_beams (a beam search: every beam keeps its own cache)",
      "translate_docs_beam_kv_growth (blind), generate_beams_kv_growth" },
    { "generation_working_set_lead", generation_growth, LEAD_COVERS, -26, 1, REMS(R_SMALLER_BATCH, R_SHORTER_SEQ),
      "as generation_working_set (the KV cache grows per token: not a leak)",
      "generate_kv_cache, generate_beams_kv_growth" },
    { "generation_cache_lead", generation_built, LEAD_COVERS, -24, 0, REMS(R_SMALLER_KV),
      "as generation_working_set, no growth cause (growth.gen_built, or decoding with a KV cache >= "
      "shortfall and >= 1/4 of the allocated bytes)",
      "translate_docs_beam_kv_growth, longform_eval_kv_growth (blind)" },
    { "generation_many_inputs_lead", generation_many_inputs_lead, LEAD_COVERS, -29, 0, REMS(R_SMALLER_BATCH),
      "as generation_many_inputs, no dominant holder (roles.dominant) (ahead of a generation's tokens and beams: "
      "chunks change no output)",
      "county_records_trocr_large_every_line_of_a_page_in_one_beam_generate_tax_roll_ledger_t4, "
      "donut_loan_package_splitter_whole_pdf_pixel_values_on_gpu_l4 (blind)" },
    { "one_input_peak_lead", one_input_peak, LEAD_COVERS, -28, 0, REMS(R_SHORTER_SEQ),
      "as one_input_peak (ahead of a generation's batch and cache: one prompt, not the working set)",
      "batch_summarize_llama31_8b_one_exhibit_pads_batch_to_31k_a100_40gb (blind)" },
    { "layer_holder_grows_lead", layer_holder_grows, LEAD_COVERS, -27, 0, REMS(R_RELEASE_REFS),
      "as layer_holder_grows (ahead of the pass's batch, precision and length: the holder, not the pass, grows)",
      "legal_filing_96k_prefill_layerwise_kv_offload_pending_list_keeps_gpu_kv_llama31_8b_nf4_4090 (blind); (unit "
      "tests: holder_of_one_record_per_layer)" },
    { "graph_messages_lead", graph_messages_lead, LEAD, -32, 0, REMS(R_CAP_INPUT),
      "as graph_messages, primary not a confident growth (ahead of larger_chunk's split_operation: the graph's size, "
      "not one operation)",
      "gat_ogbn_products_full_batch_training_edge_messages_a100_40gb, pinsage_hub_item_full_fanout_subgraph_rtx4090 "
      "(blind); (unit tests: graph_messages_sample_the_graph)" },
    { "training_logits_lead", training_logits_lead, LEAD_COVERS, -26, 0, REMS(R_FUSED_CE),
      "as training_logits, primary not a confident growth, the request >= the activations alive beside it",
      "qwen25_7b_yarn_64k_packed_lora_sft_fp32_upcast_full_vocab_logits_h100 (blind); (unit tests: "
      "training_logits_before_the_loss)" },
    { "cross_entropy_lead", cross_entropy_lead, LEAD_COVERS, -26, 0, REMS(R_FUSED_CE),
      "as cross_entropy_op, primary not a confident growth",
      "gemma_lora_fp32_logits_ce (blind), perplexity_log_softmax" },
    { "transducer_lead", transducer_lead, LEAD_COVERS, -26, 0, REMS(R_CHUNK),
      "as transducer_op, primary not a confident growth",
      "torchaudio_conformer_rnnt_vietnamese_bpe4096_long_batch_a10g (blind)" },
    { "comprehension_builds_lead", og_comprehension_builds, LEAD_COVERS, -27, 0, REMS(R_CHUNK),
      "as comprehension_builds",
      "camera_trap_convnext_nvjpeg_batch_decode_full_frames_to_float_before_crop_a10g (blind)" },
    { "loose_operation_lead", loose_operation, LEAD_COVERS, -27, 0, REMS(R_CHUNK), "as loose_operation",
      "butina_tanimoto_chunk_tuned_on_inhouse_250k_run_on_1_6m_vendor_library_a100_80gb (blind)" },
    { "operation_dominates_lead", operation_dominates_lead, LEAD_COVERS, -27, 0, REMS(R_CHUNK),
      "as operation_dominates, primary not a confident growth", "sdxl_vae_decode_2048px (blind), upscale_interpolate" },
    { "operation_slices_the_batch", operation_dominates_inference, DEMOTE, 3, 0, REMS(R_SMALLER_BATCH),
      "as operation_dominates, not training (a sliced operation runs the batch piece by piece)",
      "sdxl_vae_decode_2048px (blind), upscale_interpolate" },
    { "resident_models_lead", resident_same_class, LEAD_COVERS, -33, 0, REMS(R_ONE_MODEL),
      "as resident_models, models of one class", "ab_compare_two_7b (blind), two_models_generate" },
    { "resident_other_class_lead", resident_other_class, LEAD_COVERS, -20, 0, REMS(R_ONE_MODEL),
      "as resident_models, only a model of another class (roles.other_resident): after the kept KV cache's and the "
      "graph pools' own rows (-22, -21)",
      "best_of_8_vllm_llama31_8b_then_skywork_reward_model_same_script_utilization_090_a100_80gb, "
      "awq_engine_kv_prealloc_then_embedder_in_process_l40s (blind)" },
    { "eval_copy_lead", eval_copy, LEAD_COVERS, -33, 0, REMS(R_EVAL_NO_COPY), "as eval_copy",
      "eval_deepcopy_in_train_loop, eval_on_deepcopy_with_grads_kept (blind), eval_copy_forward" },
    { "dataset_on_gpu_lead", dataset_on_gpu, LEAD_COVERS, -30, 0, REMS(R_DATASET_CPU), "as dataset_on_gpu",
      "resnet50_whole_dataset_on_gpu_speedrun (blind)" },
    { "scaler_without_autocast_lead", scaler_without_autocast, LEAD_COVERS, -19, 0, REMS(R_MIXED),
      "as scaler_without_autocast (ahead of checkpointing: the half the program meant to use is not in force)",
      "unet_road_damage_seg_gradscaler_without_autocast_fp32_activations_3090 (blind); (unit tests: "
      "scaler_without_autocast)" },
    { "nested_launch_lead", nested_launch, LEAD_COVERS, -34, 0, REMS(R_ONE_RANK),
      "as nested_launch (ahead of what this rank keeps: the other worlds' ranks hold the missing bytes)",
      "slurm_srun_launches_torchrun_per_task_eight_jobs_share_each_gpu_vitl_landcover_a100_40gb (blind); (unit "
      "tests: ranks_outnumber_gpus)" },
    { "dominant_holder_lead", dominant_holder, LEAD_COVERS, -20, 0, REMS(R_RELEASE_REFS),
      "as dominant_holder (after the rows that say what the holder is for)",
      "pythia1b_noise_scale_step_keeps_every_microbatch_grad_h100 (blind); (unit tests: dominant_holder_first)" },
    { "dominant_not_the_pass", dominant_holder, DEMOTE, 3, 0,
      REMS(R_SMALLER_BATCH, R_SHORTER_SEQ, R_CHECKPOINTING, R_FLASH, R_MIXED),
      "as dominant_holder (what the program keeps, more than the pass's activations, is the waste; shrinking the "
      "pass only makes room beside it)",
      "pythia1b_noise_scale_step_keeps_every_microbatch_grad_h100 (blind); (unit tests: dominant_holder_first)" },
    { "training_state_delays", training_state_delays, DEMOTE, 3, 0, REMS(R_FREE_TRAINING),
      "as training_state_idle, the pass's working set 3x that state or more (freeing it carries the pass a few "
      "allocations further, not through)",
      "led_large_arxiv_16k_summarizer_first_eval_generate_default_eval_batch_8_beams_4_a100_40gb (blind); (unit tests: "
      "evaluation_frees_training_state)" },
    { "statement_copies_holder_lead", stmt_copies_holder, LEAD_COVERS, -30, 0, REMS(R_DATASET_CPU),
      "as statement_copies_holder (the pieces gathered in host memory, or the result built in place)",
      "dino_vitl_knn_monitor_rank0_bank_chunks_cat_a10g, scvi_lung_atlas_hvg_chunks_densified_onto_gpu_then_cat_l4 "
      "(blind)" },
    { "kept_holder_lead", kept_holder, LEAD_COVERS, -30, 0, REMS(R_RELEASE_REFS), "as kept_holder",
      "maskrcnn_val_torchmetrics_segm_map_masks_kept_on_gpu_v100_16gb (blind)" },
    { "index_on_gpu_lead", index_on_gpu, LEAD_COVERS, -30, 0, REMS(R_INDEX_OFF_GPU), "as index_on_gpu",
      "support_rag_flat_fp32_index_beside_llama8b (blind); (unit tests: index_kept_on_the_gpu)" },
    { "copy_kept_lead", copy_kept, LEAD_COVERS, -30, 0, REMS(R_SNAPSHOT_CPU), "as copy_kept",
      "pretrain_1b_lawa_window_state_dicts_cloned_on_gpu_l40s (blind); (unit tests: copies_kept_across_steps)" },
    { "ema_out_of_place_lead", ema_out_of_place, LEAD_COVERS, -31, 0, REMS(R_IN_PLACE),
      "phase ema_update, the rest of a new copy of the model's weights outgrows the cache and the free memory "
      "(copy_outgrows_cache), the old copy whole (ema_kept >= 9/10 of it); ahead of moving the kept EMA: the "
      "update's second copy is what fails",
      "aloha_dit_policy_1b_ema_state_dict_comprehension_first_update_4090 (blind); (unit tests: "
      "ema_update_out_of_place)" },
    { "ema_kept_lead", ema_kept, LEAD_COVERS, -30, 0, REMS(R_EMA_CPU), "as ema_kept",
      "sd15_finetune_use_ema_shadow_unet_4090 (blind); (unit tests: weights_copies_kept)" },
    { "reference_on_base_lead", reference_on_base, LEAD_COVERS, -34, 0, REMS(R_ADAPTER_REF),
      "as reference_on_base (ahead of the loss's and the batch's remedies: the copy is the measured cause)",
      "dpo_mistral7b_lora_second_bf16_reference_a100_40gb (blind); (unit tests: weights_copies_kept)" },
    { "reference_full_lead", reference_full, LEAD_COVERS, -34, 1, REMS(R_ONE_MODEL, R_LORA),
      "as reference_full (the reference's log-probabilities first, then adapters)",
      "dpo_gemma2_2b_fullft_ref_model_resident_4090 (blind); (unit tests: weights_copies_kept)" },
    { "repeated_components_lead", repeated_components, LEAD_COVERS, -36, 0, REMS(R_SHARE_COMPONENTS),
      "as repeated_components (ahead of one_model_at_a_time: the copies are of the same weights)",
      "sdxl_api_three_pipelines_each_load_same_weights_l4 (blind); (unit tests: weights_copies_kept)" },
    { "pipeline_twins_lead", pipeline_twins, LEAD_COVERS, -36, 0, REMS(R_SHARE_COMPONENTS),
      "as pipeline_twins (build the pipeline from the program's models, or free it once its work is done)",
      "dreambooth_sdxl_lora_prior_preservation_class_image_pipe_still_loaded_a10g (blind); (unit tests: "
      "pipeline_kept_beside_training)" },
    { "trained_model_held_by_others_lead", trained_model_held_by_others, LEAD_COVERS, -36, 0, REMS(R_RELEASE_REFS),
      "as trained_model_held_by_others (ahead of one model at a time: the program meant to free it)",
      "notebook_del_model_but_pipeline_and_trainer_keep_mistral7b_adapter_reload_l4 (blind)" },
    { "trained_model_kept_lead", trained_model_kept, LEAD_COVERS, -35, 0, REMS(R_ONE_MODEL),
      "as trained_model_kept (ahead of the load's dtype and the optimizer's remedies: training is over)",
      "gemma2_9b_qlora_merge_bf16_base_beside_trainer_4090 (blind); (unit tests: weights_copies_kept)" },
    { "ddp_buckets_lead", ddp_buckets_lead, LEAD_COVERS, -18, 0, REMS(R_BUCKET_VIEW),
      "as ddp_buckets, primary not a confident growth", "ddp_bucket_copy" },
    { "state_exceeds_card_gpus_lead", state_exceeds_card_gpus, LEAD, -29, 0, REMS(R_ZERO),
      "as state_exceeds_card, idle_gpu, that state less the models that can move (frozen, named copies) still >= the "
      "card (ahead of putting part of the work there: sharded over the GPUs)",
      "llama2_13b_full_ft_one_process_four_gpus (blind); (unit tests: state_over_card_idle_gpus)" },
    { "model_on_other_gpu_lead", model_on_other_gpu, LEAD, -36, 0, REMS(R_ON_MODEL_GPU),
      "as model_on_other_gpu (the tensor is on the wrong GPU: nothing needs to shrink)",
      "llama31_8b_two_replica_server_static_cache_device_cuda_both_on_gpu0_2x_l40s (blind)" },
    { "model_on_other_gpu_not_the_layout", model_on_other_gpu, DEMOTE, 3, 0,
      REMS(R_DDP, R_EXPANDABLE, R_EMPTY_CACHE, R_RESTART, R_BUCKET),
      "as model_on_other_gpu (what one GPU holds beyond the others is that tensor, not DataParallel's gathering or "
      "the cache's layout)",
      "llama31_8b_two_replica_server_static_cache_device_cuda_both_on_gpu0_2x_l40s (blind)" },
    { "idle_gpu_lead", idle_gpu_lead, LEAD_COVERS, -28, 0, REMS(R_USE_IDLE_GPU),
      "as idle_gpu, primary not a confident growth", "pseudo_label_teacher_student_same_gpu (blind)" },
    { "uneven_split_lead", uneven_split_lead, LEAD_COVERS, -28, 0, REMS(R_BALANCE_MAP),
      "as uneven_split, primary not a confident growth", "gptneox20b_device_map_sequential_gpu0_full (blind)" },
    { "limit_not_the_card", limit_not_the_card, LEAD, -45, 0, REMS(R_RAISE_LIMIT),
      "cause limit, the job trains, roles: the state at its optimizer steps (as state_exceeds_card) >= the limit, "
      "that state + activations + context + request <= 97% of the device's free bytes + what the process holds",
      "whisper_ft_h100_image_stale_oomguard_limit (blind); (unit tests: cap_not_the_card)" },
    { "framework_cap_not_the_card", fw_cap_not_the_card, LEAD, -45, 0, REMS(R_FW_CAP),
      "as limit_not_the_card, for cause framework_cap binding (no limit): its cap <= the state at the steps",
      "(unit tests: cap_not_the_card)" },
    { "contexts_beyond_one", contexts_beyond_one, LEAD_COVERS, -38, 0, REMS(R_SHARE_CONTEXT),
      "cause non_framework, memory.contexts_made + primary_context >= 2 on the failing device (facts: contexts), a "
      "context estimate",
      "camera_threads_contexts" },
    { "other_framework_first", other_framework_covers, LEAD_COVERS, -40, 0, REMS(R_OTHER_FW),
      "primary other_framework >= 0.7, its bytes >= shortfall", "jax_arena_torch_policy" },
    { "outside_the_framework", no_other_process, REPLACE, 0, 0, REMS(R_FOREIGN, R_NONFW_MEMORY),
      "other processes' bytes, none listed", "recovered_user_retry, dataloader_workers_cuda" },
    { "kept_graphs_not_checkpointing", kept_graphs_measured, TIER, 2, 0, REMS(R_CHECKPOINTING),
      "as kept_graphs_measured (checkpointing shrinks what each kept graph saves; the graphs stay)",
      "ppo_isaac_humanoid_rollout_collected_with_autograd_h100 (blind)" },
    { "max_split_before_expandable", max_split_instead, REPLACE, 0, 0, REMS(R_EXPANDABLE, R_MAX_SPLIT),
      "PyTorch 1.10 to 2.0 (memory.framework.source), max_split_size_mb not set: the allocator has no "
      "expandable_segments before 2.1",
      "esm2_150m_tm_regression_kaggle_p100_pinned_torch113_unsorted_lengths_fragmented_cache (blind); (unit tests: "
      "allocator_setting_by_version)" },
    { "no_expandable_before_2_1", before_expandable, DROP, 0, 0, REMS(R_EXPANDABLE),
      "PyTorch before 2.1 (memory.framework.source): its allocator stops at start-up on the unknown key",
      "(unit tests: allocator_setting_by_version)" },
    { "input_not_a_sequence", no_attention_layers, REPLACE, 0, 0, REMS(R_SHORTER_SEQ, R_CAP_INPUT),
      "roles: attention_modules 0 and the failing operation not attention (a graph network, a point-cloud or image "
      "CNN: the input's size, not a token length)",
      "kpconv_facade_scan_one_dense_sphere_batch1_l4, meshgraphnet_drivaer_outlier_fine_mesh_batch1_a6000 (blind)" },
    { "copies_leak_not_autograd", copies_leak, DROP, 0, 0, REMS(R_INFERENCE),
      "as measured_leak_not_the_cache, by roles.model_copies >= 4/5 of the rise: a pass without autograd keeps "
      "the model's copies as they are",
      "mace_mp_medium_screening_new_calculator_per_structure_kept_by_relaxed_atoms_4090 (blind)" },
};

static void apply(rank_t *k, const rctx_t *x, const og_rank_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const og_rank_row_t *w = &rows[i];
        if (!w->when(x))
            continue;
        if (w->effect == ONLY)
            memset(k->want, 0, sizeof k->want);
        if (w->effect == REPLACE) {
            int a = w->rem[0], b = w->rem[1];
            if (k->want[a]) {
                k->want[a] = false, k->want[b] = true;
                k->tier[b] = k->tier[a], k->order[b] = k->order[a], k->cover[b] = k->cover[a];
                for (int j = 0; j < k->nrows[a]; j++) /* the rows that placed it place its replacement */
                    touched(k, b, k->rows[a][j]);
                touched(k, b, w->name);
            }
            continue;
        }
        for (int j = 0; w->rem[j] != R_NONE; j++) {
            int r = w->rem[j], v = w->value + j * w->step;
            touched(k, r, w->name);
            switch (w->effect) {
            case WANT:
            case ONLY:
                k->want[r] = true;
                break;
            case DROP:
                k->want[r] = false;
                break;
            case ORDER:
                k->order[r] = v;
                break;
            case ORDER_COVERS:
                if (k->tier[r] == 1)
                    k->order[r] = v;
                break;
            case LEAD:
                k->tier[r] = 0;
                k->order[r] = v;
                break;
            case LEAD_COVERS:
                if (k->tier[r] != 3)
                    k->tier[r] = 0, k->order[r] = v;
                break;
            case TIER:
                k->tier[r] = v;
                break;
            case TIER_CAP:
                if (k->tier[r] > v)
                    k->tier[r] = v;
                break;
            case DEMOTE:
                if (k->tier[r] > 0)
                    k->tier[r] = v;
                break;
            case REPLACE:
                break;
            }
        }
    }
}
#define APPLY(k, x, rows) apply(k, x, rows, sizeof rows / sizeof *rows)

/* ------------------------------------------------------------------ estimate */

/* what each remedy could save, in bytes; -1 unknown */
/* The layers a forward pass has still to run (facts.h: roles.layers_to_come), 0 when not measured.  A remedy that
 * frees a fixed number of bytes carries the pass through only if it covers these too (pass_need, with a margin:
 * pass_short_of); one that shrinks every layer's activations (a smaller batch, half precision, checkpointing)
 * shrinks them in the same proportion. */
static double pass_to_come(const rctx_t *x) { return (double)roles_of(x)->layers_to_come; }
/* The next record of the holder that makes up the running code's working set (facts: roles.dominant_record, a
 * collection of a few like records that a caller of the pass keeps) where the request does not fit: the loop that
 * filled it adds one more when the pass ends (a view's logits, a chunk's output), so a remedy freeing less than one
 * record buys less than one more iteration; 0 otherwise */
static double record_to_come(const rctx_t *x)
{
    const og_role_facts_t *ro = roles_of(x);
    return PRIMARY(DNF) && ro->known ? ro->dominant_record : 0;
}
/* what a remedy must free for the failing pass to run to its end: the shortfall, the layers still to come and the
 * holder's next record */
static double pass_need(const rctx_t *x) { return (double)x->shortfall + pass_to_come(x) + record_to_come(x); }

/* the remedies of a pass (its batch, autograd, checkpointing, precision, length, attention kernel) save at most LIMIT:
 * what the pass's own tensors are where the failing memory is something else's */
static void cap_pass_levers(double *cover, double limit)
{
    static const int pass_levers[] = { R_SMALLER_BATCH, R_INFERENCE, R_CHECKPOINTING, R_MIXED, R_SHORTER_SEQ, R_FLASH };
    for (size_t i = 0; i < sizeof pass_levers / sizeof *pass_levers; i++)
        if (cover[pass_levers[i]] > limit)
            cover[pass_levers[i]] = limit;
}

/* below this a remedy cannot carry the pass: the need itself for one of the activations (its estimate grows with the
 * same projection); for one that frees a fixed number of bytes, the shortfall, half the layers to come (the
 * projection is an estimate: between the two it may carry the pass, tier 2) and the holder's next record */
static double pass_short_of(const rctx_t *x, int r)
{
    return (og_remedy_catalog[r].applies & AP_ACTIVATIONS)
               ? pass_need(x)
               : (double)x->shortfall + 0.5 * pass_to_come(x) + record_to_come(x);
}

static void estimate(rank_t *k, const rctx_t *x)
{
    double *cover = k->cover;
    /* for ranking only: when the cache was not measured, what the process holds bounds what is in use */
    double live = x->live_known ? (double)x->live : (double)x->tracked;
    double big = 1e30;
    for (int i = 0; i < R_COUNT; i++)
        cover[i] = -1;
    cover[R_RAISE_LIMIT] = big;
    cover[R_EMPTY_CACHE] = cache_ok(x) ? (double)x->reclaim : cache_maybe(x) ? -1 : 0;
    /* empty_cache hands back whole free segments only: PyTorch's inactive_split_bytes, the cached blocks of segments
     * partly in use, stay (0, also when not reported, leaves the whole cache) */
    if (cover[R_EMPTY_CACHE] > 0 && x->rec->memory.fw.has)
        cover[R_EMPTY_CACHE] = (double)sub0(x->reclaim, x->rec->memory.fw.inactive_split_bytes);
    cover[R_POOL_TRIM] = x->app_pool ? (double)x->f->app_slack : -1;
    cover[R_FOREIGN] = (double)x->other + (HAS(NONFW) ? (double)x->nonfw : 0) +
                       (own_children(x) ? (double)x->peers_bytes : 0); /* this job's own children, closed */
    cover[R_RELEASE_REFS] = x->growth_rise ? (double)x->growth_rise : -1;
    if (kept_graphs(x) && (double)roles_of(x)->kept_graphs > cover[R_RELEASE_REFS]) /* the earlier batches' graphs */
        cover[R_RELEASE_REFS] = (double)roles_of(x)->kept_graphs;
    if (layer_holder_grows(x) && /* the records kept so far and those the layers to come would add */
        (double)(layer_holder_bytes(x) + roles_of(x)->layer_holder_to_come) > cover[R_RELEASE_REFS])
        cover[R_RELEASE_REFS] = (double)(layer_holder_bytes(x) + roles_of(x)->layer_holder_to_come);
    if (trained_model_held_by_others(x) && (double)roles_of(x)->trained_kept > cover[R_RELEASE_REFS])
        cover[R_RELEASE_REFS] = (double)roles_of(x)->trained_kept;        /* the trained model and its state */
    if (kept_grower(x) && (double)kept_grower(x) > cover[R_RELEASE_REFS]) /* all that the growth's holder keeps */
        cover[R_RELEASE_REFS] = (double)kept_grower(x);
    if (kept_holder(x) && (double)roles_of(x)->keeper_bytes > cover[R_RELEASE_REFS]) /* all the kept holder keeps */
        cover[R_RELEASE_REFS] = (double)roles_of(x)->keeper_bytes;
    if (dominant_holder(x) && /* all that the largest holder keeps */
        (double)x->rec->memory.fw.roles.holders[roles_of(x)->dominant].bytes > cover[R_RELEASE_REFS])
        cover[R_RELEASE_REFS] = (double)x->rec->memory.fw.roles.holders[roles_of(x)->dominant].bytes;
    /* segments grown in place reuse what is cached but unused, no more: measured, that is its bound, fragmentation
     * or not (a failure that does not fit beside a small cache gains at most that cache) */
    cover[R_EXPANDABLE] = x->cached_known ? (double)x->cached : -1;
    if (live >= 0) {
        cover[R_INFERENCE] = 0.3 * live;
        cover[R_MIXED] = 0.25 * live;
        cover[R_CHECKPOINTING] = 0.3 * live;
        cover[R_SHORTER_SEQ] = 0.2 * live;
        cover[R_FLASH] = 0.1 * live;
        cover[R_QUANT] = 0.35 * live;
    }
    /* half precision halves the failing tensor too: if half of it still does not fit and the
     * shortfall is a large part of what is held, it cannot cover it (a 4x shortfall is not 3%) */
    double avail_now = x->shortfall < x->req ? (double)(x->req - x->shortfall) + (double)x->reclaim : 0;
    if (x->shortfall && (double)x->req * 0.5 > avail_now && cover[R_MIXED] >= (double)x->shortfall &&
        (double)x->shortfall * 4 > live)
        cover[R_MIXED] = (double)x->req * 0.5;
    /* the batch can shrink as far as needed: the failing tensor shrinks with it, and so do the
     * other activations */
    cover[R_SMALLER_BATCH] = (double)x->req * 0.875 > 0.25 * live ? (double)x->req * 0.875 : 0.25 * live;
    cover[R_MULTI_GPU] = cover[R_ZERO] = cover[R_OFFLOAD] = cover[R_BIGGER] = cover[R_CHUNK] = big;
    cover[R_OTHER_FW] = (double)x->other_fw_bytes;
    cover[R_SHARE_CONTEXT] = (double)x->f->contexts_extra;
    cover[R_SET_DEVICE] = (double)x->peers_bytes;
    cover[R_FEWER_WORKERS] = (double)x->peers_bytes;
    /* copies of one model running at once: every loop holds about as much as another, one at a time holds one */
    if (concurrent_loops(x) && og_known(x->rec->memory.fw.roles.allocated_bytes)) {
        const og_role_facts_t *c = roles_of(x);
        double each = (double)x->rec->memory.fw.roles.allocated_bytes.v / (double)c->concurrent_count;
        if (each * (double)(c->concurrent_count - 1) > cover[R_FEWER_WORKERS])
            cover[R_FEWER_WORKERS] = each * (double)(c->concurrent_count - 1);
    }
    /* the ranks of this job on the GPU; with nested launchers, the other processes there (the other worlds') */
    cover[R_ONE_RANK] = x->f->nested_launchers ? (double)x->f->other_all : (double)x->peers_bytes;
    cover[R_CUDA_OUT_OF_WORKERS] = (double)x->peers_bytes;
    cover[R_FW_CAP] = big;
    /* by role and phase: what each remedy shrinks, measured (the Python adapter); unknown without it */
    const og_role_facts_t *ro = roles_of(x);
    /* tensors held by Python objects may be activations a program keeps, so the activations role is a
     * lower bound and the estimates above stand (where the evidence leaves no activations at all, the
     * `fit` pass drops those remedies: AP_ACTIVATIONS) */
    if (ro->known && ro->params) /* 4-bit weights: what they free of the parameters' dtypes measured */
        cover[R_QUANT] = ro->quant_frees;
    /* tables of half the dimensions (or of half the rows: rare categories hashed together): half their parameters,
     * and of the gradients and optimizer state kept for them, in the share the tables have of the parameters */
    if (categorical_tables(x))
        cover[R_SMALLER_EMB] =
            0.5 * (double)ro->embedding * (1.0 + ((double)ro->grads + (double)ro->opt) / (double)ro->params);
    /* offloading the model or sharding its state moves at most the model's state (parameters, their gradients,
     * the optimizer's state) off this GPU: a small model beside a huge activation moves nothing that matters */
    if (ro->known && ro->params && ro->act_known)
        cover[R_OFFLOAD] = cover[R_ZERO] = (double)ro->params + (double)ro->grads + (double)ro->opt;
    /* more GPUs split the model's state (tensor or pipeline parallelism), a batch's activations (data parallelism)
     * and an attention layer's heads (tensor parallelism): a batch of one through a model with no attention layer
     * has only its state to split */
    if (ro->known && ro->params && ro->act_known && ro->batch_size == 1 && no_attention_layers(x))
        cover[R_MULTI_GPU] = (double)ro->params + (double)ro->grads + (double)ro->opt;
    /* the failed attempt's tensors, the checkpoint's copy: what the running code holds (a lower
     * bound: unknown when it does not cover) */
    if (ro->known && ro->act_known && og_covers(x, (double)ro->working))
        cover[R_RETRY_OUTSIDE] = cover[R_MAP_CPU] = (double)ro->working;
    if (checkpoint_kept(x)) /* the checkpoint's copy kept after the load */
        cover[R_MAP_CPU] = cover[R_RELEASE_REFS] = (double)ro->ckpt_copy;
    if (restored_held(x) && (double)ro->restored_held > cover[R_MAP_CPU]) /* what torch.load restored and is held */
        cover[R_MAP_CPU] = (double)ro->restored_held;
    if (ro->known && ro->params) {
        /* half of the float32 weights, and of their gradients (a parameter's gradient has its dtype); the
         * dtypes not measured: half of them all, if they load as float32 */
        double fp32 = ro->dtypes_known ? (double)ro->params_fp32 : (double)ro->params;
        cover[R_LOAD_HALF] = 0.5 * fp32 + (ro->dtypes_known ? 0.5 * (double)ro->grads * fp32 / (double)ro->params : 0);
        /* a load: the dtype it is given is the arriving model's; half of its float32 weights, the rest still to come
         * in the same proportion (not the float32 of models loaded before it, an adapter's fp32 weights) */
        if (PHASE(loading) && ro->arriving_fp32_known) {
            double whole = (double)ro->arriving + (double)ro->model_away;
            cover[R_LOAD_HALF] = 0.5 * (double)ro->arriving_fp32 * whole / (double)ro->arriving;
        }
    }
    {
        /* 8 bits keep 1 byte of each state value where the state kept og_state_value_bytes (4 for float32: 3/4
         * saved; 2 for a bf16 model's state: half); Adam's state is about to be 2x the parameters at its first step */
        double st = og_state_to_shrink(ro, PHASE(optimizer_step));
        cover[R_OPT_8BIT] = st > 0 ? (1.0 - 1.0 / og_state_value_bytes(ro, PHASE(optimizer_step))) * st : -1;
    }
    /* gradients kept one per example: ghost clipping keeps none of them; a physical batch of one keeps 1/n */
    if (ro->known && ro->per_sample) {
        cover[R_GHOST_CLIP] = (double)ro->per_sample;
        double n = ro->per_sample_n > 1 ? (double)ro->per_sample_n : 2.0;
        if ((double)ro->per_sample * (1.0 - 1.0 / n) > cover[R_SMALLER_BATCH])
            cover[R_SMALLER_BATCH] = (double)ro->per_sample * (1.0 - 1.0 / n);
    }
    /* bounded or replaced by AdamW's moments, the matrices go (what the first step still makes: not known) */
    cover[R_PRECOND_CAP] = ro->known && ro->opt_shaped ? (double)ro->opt_shaped : -1;
    {
        /* LoRA trains about 1% of the parameters: their gradients and optimizer state go (Adam's state at the
         * first step is about to be 2x the parameters) */
        double st = (double)ro->grads + (double)ro->opt + (double)ro->per_sample; /* a frozen weight has no per-example
                                                                                   gradient either */
        if (PHASE(optimizer_step) && (ro->opt_adam || !ro->opt) && (double)ro->grads + 2.0 * (double)ro->params > st)
            st = (double)ro->grads + 2.0 * (double)ro->params;
        cover[R_LORA] = ro->known && x->trains == 1 ? 0.99 * st : -1;
        if (lora_base_trains(x)) /* the base weights' share: the adapters' own state stays */
            cover[R_LORA] = lora_base_state(x);
    }
    if (training_state_idle(x)) /* the gradients, and the optimizer's state when no step follows */
        cover[R_FREE_TRAINING] = (double)ro->grads + (double)ro->opt;
    if (weights_update(x)) { /* the copy of the weights, and what its update makes beyond one copy */
        double copy = (double)ro->params, held = (double)ro->copying;
        cover[R_EMA_CPU] = held > copy ? held : copy;
        cover[R_IN_PLACE] = held > copy ? held - copy : 0;
    }
    if (ema_out_of_place(x) && (double)x->f->update_copy > cover[R_IN_PLACE]) /* the new copy, all of it */
        cover[R_IN_PLACE] = (double)x->f->update_copy;
    /* the weights are already half precision (roles.parameters_by_dtype: at least 3/4 bfloat16/float16): what
     * they compute is half precision too, and autocast has nothing left to halve */
    if (ro->known && ro->dtypes_known && ro->params && (double)ro->params_half >= 0.75 * (double)ro->params)
        cover[R_MIXED] = 0;
    /* float64 weights: autocast casts float32 operations only, a float64 one runs in float64; float32 halves the
     * weights, their gradients and the activations computed from them (the live rest of the pass) */
    if (fp64_weights(x)) {
        double frac = (double)ro->params_fp64 / (double)ro->params;
        cover[R_MIXED] = 0;
        cover[R_FP32_NOT_FP64] =
            0.5 * ((double)ro->params_fp64 + frac * (double)ro->grads + (ro->act_known ? frac * (double)ro->act : 0));
    }
    /* the gradients made; in a backward under way, every weight's, made or still to come (autograd.grad of the
     * inputs alone makes none: what its frames asked for is all it computes) */
    if (weight_grads_unread(x))
        cover[R_NO_WEIGHT_GRADS] =
            (double)(PHASE(backward) && ro->untrained_eval > ro->grads ? ro->untrained_eval : ro->grads);
    if (fp64_data(x)) /* and half the float64 tensors Python holds */
        cover[R_FP32_NOT_FP64] =
            (cover[R_FP32_NOT_FP64] > 0 ? cover[R_FP32_NOT_FP64] : 0) + 0.5 * (double)ro->held_fp64;
    /* with N micro-batches summed, N - 1 graphs go: at least half of the activations (N >= 2) */
    cover[R_BACKWARD_PER_MB] = summed_microbatches(x) ? 0.5 * (double)ro->act : -1;
    cover[R_SMALLER_KV] = kv_cache_reserved(x) ? 0.5 * (double)ro->kv_bytes
                          : kv_cache_reserving(x)
                              ? (kv_pool_beyond_card(x) ? (double)x->shortfall             /* sized to fit */
                                                        : 0.5 * (double)kv_reservation(x)) /* half */
                              : -1;
    if (generation_beams(x) && ro->purpose_bytes[OG_PURPOSE_kv_cache]) /* 1 beam of N keeps 1/N */
        cover[R_FEWER_BEAMS] = (double)ro->purpose_bytes[OG_PURPOSE_kv_cache] * (1.0 - 1.0 / (double)ro->num_beams);
    if (generation_growth(x) && ro->purpose_bytes[OG_PURPOSE_kv_cache]) /* a 4-bit cache: 3/4 of a 16-bit one */
        cover[R_SMALLER_KV] = 0.75 * (double)ro->purpose_bytes[OG_PURPOSE_kv_cache];
    cover[R_SNAPSHOT_CPU] = state_snapshot(x) ? (double)ro->copying : -1; /* the copy made so far, at least */
    if (copy_kept(x) && (double)ro->copy_kept > cover[R_SNAPSHOT_CPU])    /* the copies kept */
        cover[R_SNAPSHOT_CPU] = (double)ro->copy_kept;
    if (copy_replaces_model(x)) /* in place: no second copy at all; dropped first: the previous one */
        cover[R_IN_PLACE] = cover[R_RELEASE_REFS] = (double)ro->copy_replaces;
    if ((evaluation_autograd_on(x) || og_feeds_no_backward(x)) && ro->known && ro->act_known && ro->act)
        cover[R_INFERENCE] = 0.9 * (double)ro->act; /* what is kept for backward */
    if (restart_sheds_nothing(x))
        cover[R_RESTART] = 0;
    cover[R_GRAPH_SHAPES] = graph_pools(x) ? 0.5 * (double)graph_pool_bytes(x) : -1;
    cover[R_BOUNDED_CACHE] = ro->keeper >= 0 ? 0.9 * (double)ro->keeper_bytes : -1;
    if (model_registry(x) && (double)og_registry_bytes(x) > cover[R_BOUNDED_CACHE]) /* every entry can be evicted */
        cover[R_BOUNDED_CACHE] = (double)og_registry_bytes(x);
    if (lora_piled(x)) { /* every adapter but the ones in use */
        double a = (double)roles_of(x)->lora_params;
        cover[R_BOUNDED_CACHE] = cover[R_BOUNDED_CACHE] > 0.9 * a ? cover[R_BOUNDED_CACHE] : 0.9 * a;
        cover[R_RELEASE_REFS] = cover[R_RELEASE_REFS] > a ? cover[R_RELEASE_REFS] : a;
    }
    if (x->f->comm_lib >= 0) {
        cover[R_REUSE_PG] = comm_holds_growth(x) ? (double)x->f->comm_bytes : 0.5 * (double)x->f->comm_bytes;
        /* the buffers beyond the default's when the environment enlarged them; else half of them (2 MiB) */
        cover[R_NCCL_BUF] =
            x->f->comm_setting_excess ? (double)x->f->comm_setting_excess : 0.5 * (double)x->f->comm_bytes;
    }
    if (checkpointing_off(x)) /* each layer keeps its input, recomputes the rest in backward: half at least */
        cover[R_CHECKPOINTING] = 0.5 * (double)ro->act;
    /* a batch the program names, the activations measured: a batch an eighth as large (or of one) keeps that share
     * of the pass's activations and of the failing tensor, which scale with it */
    if (ro->known && ro->act_known && ro->batch_size >= 2) {
        double keep = ro->batch_size >= 8 ? 0.125 : 1.0 / (double)ro->batch_size;
        double by_batch = (1.0 - keep) * ((double)x->req + (double)ro->act);
        if (by_batch > cover[R_SMALLER_BATCH])
            cover[R_SMALLER_BATCH] = by_batch;
    }
    if (ro->known && ro->batch_size == 1) /* a batch of one cannot shrink: accumulation needs a smaller one */
        cover[R_SMALLER_BATCH] = 0;
    /* no batch named, and the failing tensor is the statement's sizes alone (facts: sizes_make_request): none of its
     * factors is a batch, so no smaller batch shrinks it */
    if (ro->known && ro->batch_size == 0 && ro->sizes_make_request) {
        cover[R_SMALLER_BATCH] = 0;
        /* ... a product of one input's sizes (a photo's channels x height x width, a text's tokens x vocabulary), or
         * one size read twice (a text's positions x positions: the scores of its attention, its relative logits):
         * the input can shrink as far as needed, and the failing tensor with it (a smaller photo, a shorter text,
         * quadratically for a square; where no layer attends, input_not_a_sequence gives the shorter text's place to
         * the smaller input) */
        if (ro->request_shape == OG_REQ_PRODUCT || ro->request_shape == OG_REQ_SQUARE) {
            if (0.875 * (double)x->req > cover[R_CAP_INPUT])
                cover[R_CAP_INPUT] = 0.875 * (double)x->req;
            if (0.875 * (double)x->req > cover[R_SHORTER_SEQ])
                cover[R_SHORTER_SEQ] = 0.875 * (double)x->req;
        }
    }
    /* the failing statement makes a dataset (roles.statement's purpose: X_va = torch.tensor(X_va_np, device=...)):
     * the request is the data, whole, which no batch size, precision of the pass or autograd mode changes; what the
     * remedies of a pass can save is in the activations measured (none, before the first batch), and quantization's
     * in the parameters */
    if (ro->known && ro->act_known && ro->building == OG_PURPOSE_dataset) {
        cap_pass_levers(cover, (double)ro->act);
        if (cover[R_QUANT] > ro->quant_frees)
            cover[R_QUANT] = ro->quant_frees;
    }
    /* the activations are mostly a copy of the parameters (or optimizer state) being made that cannot finish (facts:
     * role_copy_outgrows: an exporter folding every weight into a new tensor): no batch, length or precision of a
     * pass shrinks that copy, only the activations beyond it */
    if (ro->known && ro->act_known && x->f->role_copy_outgrows)
        cap_pass_levers(cover, ro->act > ro->act_copy ? (double)(ro->act - ro->act_copy) : 0);
    if (one_batch_peak(x) || one_input_peak(x)) { /* cap the length at what the earlier batches used */
        const og_outlier_facts_t *o = &x->f->outlier;
        cover[R_SHORTER_SEQ] = o->pass_peak ? (double)x->tracked + (double)x->req - (double)o->held_before
                                            : (double)o->run_bytes * (1.0 - (double)o->prev_max / (double)x->req);
    }
    if (larger_inference(x) || one_input_inference(x)) { /* the input's length can shrink as far as needed */
        cover[R_SHORTER_SEQ] = (double)x->req;
        cover[R_FLASH] = 0.9 * (double)x->req;
    }
    if (eager_attention(x)) /* a fused kernel never makes the failing score matrix */
        cover[R_FLASH] = (double)x->req;
    if (cross_entropy_op(x) || training_logits(x)) /* a fused or chunked loss never makes the failing [tokens,
                                                     vocabulary] tensor */
        cover[R_FUSED_CE] = (double)x->req;
    if (all_position_logits(x)) /* the last position's logits only: the failing tensor is not made */
        cover[R_FEWER_OUTPUTS] = (double)x->req;
    if (operation_dominates(x)) /* in eight tiles or slices: an eighth of the operation's tensors at a time */
        cover[R_CHUNK] = 0.875 * (double)op_tensor_bytes(x);
    if (transducer_op(x)) /* in eight sub-batches: an eighth of the joint's tensors at a time */
        cover[R_CHUNK] = 0.875 * (double)x->req;
    if (graph_messages(x)) /* a batch's subgraph: the failing per-edge tensor shrinks as far as needed */
        cover[R_CAP_INPUT] = (double)x->req;
    if (own_operation_peak(x)) /* in eight chunks of rows: an eighth of the failing tensor at a time */
        cover[R_CHUNK] = 0.875 * (double)x->req;
    if (og_comprehension_builds(x)) /* in eight chunks of items: an eighth of what it made, the request's included */
        cover[R_CHUNK] = 0.875 * ((double)ro->act + (double)x->req);
    if (loose_operation(x)) /* in eight blocks of rows: an eighth of its temporaries, the request's and earlier ones */
        cover[R_CHUNK] = 0.875 * ((double)ro->act + (double)x->req);
    /* the operation's tensors are one sample's (its sizes do not carry the batch) and with the state they take the
     * whole card: no batch fits, a batch of one included */
    if (operation_dominates(x) && ro->batchless_sizes &&
        (double)op_tensor_bytes(x) + (double)ro->params + (double)ro->grads + (double)ro->opt >= (double)x->capacity)
        cover[R_SMALLER_BATCH] = 0;
    cover[R_ONE_MODEL] = resident_models(x)      ? (double)resident_bytes(x)
                         : trained_model_kept(x) ? (double)ro->trained_kept
                         : reference_full(x)     ? (double)ro->reference_copy
                                                 : -1;
    cover[R_EVAL_NO_COPY] = eval_copy(x) ? (double)eval_copy_bytes(x) : -1;
    cover[R_BUCKET_VIEW] = ddp_buckets(x) ? (double)ro->ddp_buckets : -1;
    cover[R_INDEX_OFF_GPU] = index_on_gpu(x) ? (double)ro->index_kept : -1;
    if (ema_kept(x) && (double)ro->ema_kept > cover[R_EMA_CPU]) /* the whole kept copy */
        cover[R_EMA_CPU] = (double)ro->ema_kept;
    cover[R_ADAPTER_REF] = reference_on_base(x) ? (double)ro->reference_copy : -1;
    cover[R_SHARE_COMPONENTS] = repeated_components(x) ? (double)ro->repeated_components : -1;
    if (pipeline_twins(x) && (double)ro->twin_components > cover[R_SHARE_COMPONENTS]) /* the pipeline's own set */
        cover[R_SHARE_COMPONENTS] = (double)ro->twin_components;
    cover[R_DATASET_CPU] = dataset_on_gpu(x)    ? (double)ro->dataset_kept
                           : growing_dataset(x) ? (double)ro->grower_bytes
                           : stmt_copies_holder(x)
                               ? (double)x->rec->memory.fw.roles.holders[ro->stmt_copies].bytes /* the source */
                               : -1;
    if (rank_loads_whole_model(x) && ro->known && ro->params) /* all but this rank's share of what arrived */
        cover[R_SHARD_LOAD] = (double)ro->params * (1.0 - 1.0 / (double)x->rec->world_size);
    /* the models that can move to the idle GPU, as far as its room holds them (unknown when none is measured); the
     * room on the other GPU */
    uint64_t moves = movable_models(x) < x->f->spare.idle_room ? movable_models(x) : x->f->spare.idle_room;
    cover[R_USE_IDLE_GPU] = idle_gpu(x) && moves ? (double)moves : -1;
    cover[R_BALANCE_MAP] = uneven_split(x) ? (double)x->f->spare.room : -1;
    double imb = HAS(IMBALANCE) ? (double)x->f->imbalance.mine - (double)x->f->imbalance.avg : 0;
    cover[R_DDP] = imb > 0 ? imb : -1;
    if (x->retried_zero)
        cover[R_EMPTY_CACHE] = 0;
    /* the layers still to come grow what a remedy of the activations saves in proportion (their estimates are of the
     * activations made so far) */
    double to_come = pass_to_come(x);
    for (int i = 0; to_come > 0 && i < R_COUNT; i++)
        if ((og_remedy_catalog[i].applies & AP_ACTIVATIONS) && cover[i] > 0 && cover[i] < big)
            cover[i] *= 1.0 + to_come / (double)ro->act;
    /* the batch can shrink to one (gradient accumulation makes up the rest): a measured batch of b keeps 1/b of the
     * whole pass's activations, one not measured a quarter; checkpointing measured off keeps about the inputs of
     * sqrt(n) of the n layers at once (segments of sqrt(n) layers), 1/sqrt(n) of them (of fewer than 16 layers, 3/10:
     * what a layer recomputes beyond its input); half precision over float32 weights, half */
    if (to_come > 0) {
        const og_roles_t *rr = &x->rec->memory.fw.roles;
        double pass = (double)ro->act + to_come;
        double keep = ro->batch_size > 1 ? 1.0 / (double)ro->batch_size : 0.25;
        if (ro->batch_size != 1 && (1.0 - keep) * pass > cover[R_SMALLER_BATCH])
            cover[R_SMALLER_BATCH] = (1.0 - keep) * pass;
        int segs = 1; /* the whole square root of n: no libm in the shim */
        while ((segs + 1) * (segs + 1) <= rr->layer_count)
            segs++;
        double ckpt = segs > 3 ? 1.0 - 1.0 / segs : 0.7; /* a few layers: most of each layer's own temporaries */
        if (ro->checkpointing == -1 && ckpt * pass > cover[R_CHECKPOINTING])
            cover[R_CHECKPOINTING] = ckpt * pass;
        if (cover[R_MIXED] > 0 && mostly_fp32(ro) && 0.5 * pass > cover[R_MIXED]) /* float32 weights, autocast off */
            cover[R_MIXED] = 0.5 * pass;
    }
    /* an unknown shortfall: nothing can be said to cover it, nor not to (tier 2) */
    double need = pass_need(x);
    for (int i = 0; i < R_COUNT; i++) {
        k->tier[i] = !x->shortfall_known                               ? 2
                     : need <= 0 || cover[i] >= need                   ? 1
                     : cover[i] < 0 || cover[i] >= pass_short_of(x, i) ? 2
                                                                       : 3;
        if (k->tier[i] == 3 && k->want[i])
            touched(k, i, "cannot_cover");
    }
}

/* ------------------------------------------------------------------ the primary cause's own remedies */

static const int own_remedies[OG_CAUSE_COUNT][2] = {
#define X(name, id, rule, bonus, own1, own2, title) [OG_CAUSE_##name] = { R_##own1, R_##own2 },
#include "causes.def"
#undef X
};

static void lead_own(rank_t *k, const rctx_t *x)
{
    for (int j = 0; j < 2; j++) {
        int r = own_remedies[x->primary][j];
        if (r != R_NONE && k->tier[r] != 3) {
            k->tier[r] = 0, k->order[r] = -20 + j;
            touched(k, r, "primary_cause_own");
        }
    }
}

/* ------------------------------------------------------------------ fit */

/* where the catalog says a remedy can help at all (remedies.def, `applies`), read on the evidence */
static bool applies(const rctx_t *x, int ap)
{
    return !((ap & AP_TRAINING) && x->trains == -1) && !((ap & AP_NOT_TRAINING) && x->trains == 1) &&
           !((ap & AP_ACTIVATIONS) && no_activations(x)) && !((ap & AP_BACKWARD) && x->grad == -1) &&
           !((ap & AP_ATTENTION) && roles_of(x)->attention == -1) &&
           !((ap & AP_MODEL_STATE) && roles_of(x)->state_known && !roles_of(x)->state);
}

/* every remedy, whatever brought it: one the evidence rules out (its `applies`), or whose own estimate
 * is a measured nothing while bytes are missing (its text would say it cannot help), is not listed; one
 * whose own estimate cannot cover the shortfall never leads (tier 3, after all that can or may) */
static void fit(rank_t *k, const rctx_t *x)
{
    double need = pass_need(x);
    for (int i = 0; i < R_COUNT; i++) {
        if (!k->want[i])
            continue;
        if (!applies(x, og_remedy_catalog[i].applies) || (need > 0 && k->cover[i] == 0))
            k->want[i] = false;
        else if (need > 0 && k->cover[i] >= 0 && k->cover[i] < pass_short_of(x, i)) {
            k->tier[i] = 3;
            touched(k, i, "cannot_cover");
        }
    }
}

/* ------------------------------------------------------------------ entry */

void og_select_remedies(og_record_t *rec)
{
    if (!rec)
        return;
    memset(rec->remedies, 0, sizeof rec->remedies);
    rec->nremedies = 0;
    rctx_t x;
    og_remedy_context(&x, rec);
    rank_t k;
    memset(&k, 0, sizeof k);

    APPLY(&k, &x, bring);
    APPLY(&k, &x, narrow);
    for (int i = 0; i < R_COUNT; i++)
        k.order[i] = og_remedy_catalog[i].order;
    APPLY(&k, &x, reorder);
    estimate(&k, &x);
    lead_own(&k, &x);
    APPLY(&k, &x, lead);
    fit(&k, &x);

    int list[R_COUNT], n = 0;
    for (int i = 0; i < R_COUNT; i++)
        if (k.want[i])
            list[n++] = i;
    for (int i = 1; i < n; i++) { /* stable insertion sort by (tier, order) */
        int v = list[i], j = i - 1;
        while (j >= 0 && k.tier[list[j]] * 10000 + k.order[list[j]] > k.tier[v] * 10000 + k.order[v]) {
            list[j + 1] = list[j];
            j--;
        }
        list[j + 1] = v;
    }
    /* never lead with inference mode unless the job is known to be inference, evaluated with autograd on, or the pass
     * feeds no backward */
    if (n > 1 && list[0] == R_INFERENCE && !known_inference(&x) && !evaluation_autograd_on(&x) &&
        !og_feeds_no_backward(&x)) {
        list[0] = list[1];
        list[1] = R_INFERENCE;
        touched(&k, R_INFERENCE, "inference_not_first");
    }

    for (int i = 0; i < n && rec->nremedies < 20; i++) {
        const og_remedy_def_t *d = &og_remedy_catalog[list[i]];
        og_remedy_t *r = &rec->remedies[rec->nremedies];
        memset(r, 0, sizeof *r);
        r->id = d->id;
        r->title = d->title;
        r->saving = d->saving;
        r->cost = d->cost;
        if (!d->build(&x, r)) {
            memset(r, 0, sizeof *r);
            continue;
        }
        r->rank = ++rec->nremedies;
        r->shown = r->rank <= OG_REMEDIES_SHOWN;
        r->ranking.tier = k.tier[list[i]];
        r->ranking.order = k.order[list[i]];
        r->ranking.estimate = k.cover[list[i]] >= 1e29 ? OG_RANK_UNBOUNDED : k.cover[list[i]];
        r->ranking.nrows = k.nrows[list[i]];
        memcpy(r->ranking.rows, k.rows[list[i]], sizeof r->ranking.rows);
    }
    /* one whose own estimate cannot cover the shortfall is never among those shown first while another can or may:
     * it is folded under "also possible" (tier 3 sorts after every other tier, so those shown stay ranks 1..m); the
     * first is always shown (inference mode, the only one that covers, does not lead a job not known to be
     * inference: what leads then is shown, though it cannot cover) */
    bool another_covers = false;
    for (int i = 0; i < rec->nremedies; i++)
        another_covers |= rec->remedies[i].ranking.tier < 3;
    for (int i = 1; i < rec->nremedies; i++)
        if (another_covers && rec->remedies[i].ranking.tier == 3)
            rec->remedies[i].shown = false;
}

/* ------------------------------------------------------------------ the rows, for docs and tests */

int og_rank_row_text(int i, char *buf, size_t n)
{
    static const struct {
        const char *pass;
        const og_rank_row_t *rows;
        size_t n;
    } passes[] = {
        { "bring", bring, sizeof bring / sizeof *bring },
        { "narrow", narrow, sizeof narrow / sizeof *narrow },
        { "order", reorder, sizeof reorder / sizeof *reorder },
        { "lead", lead, sizeof lead / sizeof *lead },
    };
    for (size_t p = 0; p < sizeof passes / sizeof *passes; p++) {
        if (i >= (int)passes[p].n) {
            i -= (int)passes[p].n;
            continue;
        }
        const og_rank_row_t *w = &passes[p].rows[i];
        char rems[400] = "", eff[40];
        for (int j = 0; w->rem[j] != R_NONE; j++) {
            size_t l = strlen(rems);
            og_fmt(rems + l, sizeof rems - l, "%s`%s`", j ? ", " : "", og_remedy_catalog[w->rem[j]].id);
        }
        if (w->effect <= ONLY || w->effect == REPLACE)
            og_fmt(eff, sizeof eff, "%s", effect_names[w->effect]);
        else if (w->step)
            og_fmt(eff, sizeof eff, "%s %d (+%d each)", effect_names[w->effect], w->value, w->step);
        else
            og_fmt(eff, sizeof eff, "%s %d", effect_names[w->effect], w->value);
        og_fmt(buf, n, "| %s | `%s` | %s | %s | %s | %s |", passes[p].pass, w->name, w->reads, eff, rems, w->cases);
        return 1;
    }
    return 0;
}
