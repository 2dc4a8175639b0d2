/* Remedy texts: what each remedy says for this failure (why it applies, how to do it), tailored to
 * what the dump measured.  Which remedies are offered and in what order is the ranking's
 * (remedy_rank.c); the catalog's ids, titles and defaults are data (remedies.def).
 * Pure: no I/O, no globals, no allocation.  (<stdio.h> for vsnprintf only, <stdlib.h> for strtoull.) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "record.h"
#include "advice_text.h"
#include "facts.h"
#include "remedies.h"

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

/* Autograd was off at the failure and nothing says the job trains: inference or generation, where
 * memory kept from step to step is kept on purpose (a KV cache, collected outputs), not a graph. */
static bool no_autograd_job(const rctx_t *x) { return x->grad == -1 && x->trains != 1; }

static const char *fw_display(enum og_framework fw) { return og_framework_display(fw, "the framework"); }

/* value of NAME in the allow-listed environment, or NULL */
static const char *env_value(const og_record_t *rec, const char *name)
{
    size_t l = strlen(name);
    int n = rec->nenv < 0 ? 0 : rec->nenv > 48 ? 48 : rec->nenv;
    for (int i = 0; i < n; i++)
        if (strnlen(rec->env[i], sizeof rec->env[i]) < sizeof rec->env[i] && strncmp(rec->env[i], name, l) == 0 &&
            rec->env[i][l] == '=')
            return rec->env[i] + l + 1;
    return NULL;
}

static bool env_is(const og_record_t *rec, const char *name, const char *value)
{
    const char *v = env_value(rec, name);
    return v && strcasecmp(v, value) == 0;
}

/* The growth's steps ran without autograd: it was off when the failing call, itself one more step
 * (marked by its size), was made.  A failure of another size (an evaluation after a leaking
 * training loop) says nothing about the mode the growth happened in.  A rise that is adapters piling up
 * (roles.lora_piled) is kept by the program, not built by the running pass. */
bool og_growth_without_autograd(const rctx_t *x)
{
    return no_autograd_job(x) && x->has[OG_CAUSE_GROWTH] && x->f->growth.marker == OG_MARK_FAILING_SIZE &&
           !x->f->roles.lora_piled;
}

bool og_embedding_tables(const rctx_t *x)
{
    const og_role_facts_t *ro = &x->f->roles;
    return ro->known && ro->params && ro->embedding && 2 * ro->embedding >= ro->params;
}

/* the holder keeping one record per layer of the running pass (facts: layer_holder) is kept outside that pass: not a
 * local of running code (the pass's own outputs or the cache it decodes with) and not of purpose kv_cache; such a
 * holder is one to drop, a local one is the pass's own size */
bool og_layer_holder_kept(const rctx_t *x)
{
    int i = x->f->roles.layer_holder;
    if (!x->f->roles.known || i < 0)
        return false;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[i];
    char pu[sizeof h->purpose], where[sizeof h->where];
    og_cpy(pu, sizeof pu, h->purpose, sizeof pu);
    og_cpy(where, sizeof where, h->where, sizeof where);
    return og_purpose_of(pu) != OG_PURPOSE_kv_cache && !og_where_local(where);
}

bool og_all_position_logits(const rctx_t *x)
{
    const og_role_facts_t *ro = &x->f->roles;
    enum og_job_phase ph = x->f->phase;
    return ro->known && ro->stmt_logits && ro->operation != OG_OP_cross_entropy && x->trains != 1 && x->grad == -1 &&
           (ph == OG_JP_forward || ph == OG_JP_evaluation || ph == OG_JP_generation) &&
           (x->f->decoding || ro->purpose_bytes[OG_PURPOSE_kv_cache] > 0) && x->req_known && x->capacity &&
           x->req * OG_BIG_REQ_DIV >= x->capacity;
}

bool og_generation_growth(const rctx_t *x)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (x->f->growth.gen_built)
        return true;
    /* no growth read (too few steps, or the steps split otherwise), but the adapter read a generation and a KV
     * cache holds the missing bytes and a quarter of what the framework holds: the same working set */
    if (x->f->decoding && ro->known && x->trains != 1 && x->grad != 1 && x->shortfall &&
        ro->purpose_bytes[OG_PURPOSE_kv_cache] >= x->shortfall &&
        4 * ro->purpose_bytes[OG_PURPOSE_kv_cache] >= x->rec->memory.fw.allocated_bytes)
        return true;
    /* a generation's growth is its KV cache's, unless the roles were measured and hold no KV cache at all (a
     * diffusion pipeline's outputs kept in a list across requests: what grows is that list), or the growth's own
     * holder (roles.grower) is no KV cache and holds more than the KV caches do (a server's dict of image features
     * kept across requests: what grows is that dict) */
    uint64_t kv = ro->purpose_bytes[OG_PURPOSE_kv_cache];
    if (ro->known && ro->grower >= 0 && ro->grower < x->rec->memory.fw.roles.nholders && ro->grower_bytes > kv) {
        char pu[sizeof x->rec->memory.fw.roles.holders[0].purpose];
        og_cpy(pu, sizeof pu, x->rec->memory.fw.roles.holders[ro->grower].purpose, sizeof pu);
        if (og_purpose_of(pu) != OG_PURPOSE_kv_cache)
            return false;
    }
    return x->has[OG_CAUSE_GROWTH] && x->trains != 1 && x->grad != 1 &&
           ((x->f->decoding && !(ro->known && !kv)) || (ro->known && kv && kv >= x->f->growth.rise / 2));
}

/* The advice's view: the facts og_diagnose computed (og_diagnose's own when it ran on this record),
 * and which causes the diagnosis kept.  A cause's findings count only when the diagnosis kept it. */
void og_remedy_context(rctx_t *x, og_record_t *rec)
{
    memset(x, 0, sizeof *x);
    if (!rec->analysis.facts_valid) {
        og_facts_compute(&rec->analysis.facts, rec, NULL, &rec->analysis.growth);
        rec->analysis.facts_valid = true;
    }
    const og_facts_t *f = &rec->analysis.facts;
    const struct og_advice_facts *a = &f->adv;
    x->rec = rec;
    x->f = f;
    x->primary = OG_CAUSE_UNKNOWN;
    int n = rec->diagnosis.ncauses < 0 ? 0 : rec->diagnosis.ncauses > 8 ? 8 : rec->diagnosis.ncauses;
    for (int i = 0; i < n; i++) {
        const char *id = rec->diagnosis.causes[i].id;
        for (int c = 0; id && c < OG_CAUSE_COUNT; c++)
            if (strcmp(id, og_cause_ids[c]) == 0) {
                x->has[c] = true;
                if (i == 0)
                    x->primary = c;
            }
    }
    if (n == 0)
        x->has[OG_CAUSE_UNKNOWN] = true;
    x->primary_conf = n > 0 ? rec->diagnosis.causes[0].confidence : 0;

    x->req = f->req;
    x->req_known = f->req_known;
    x->shortfall_known = og_known(rec->diagnosis.shortfall_bytes);
    x->shortfall = og_or(rec->diagnosis.shortfall_bytes, 0);
    x->total = f->total;
    x->tracked = f->tracked;
    x->footprint = f->footprint;
    x->other = a->other;
    x->other_inferred = a->other_inferred;
    x->nonfw = f->nonfw;
    x->cached_known = a->cached_known;
    x->cached = a->cached;
    x->cache_retried = a->cache_retried;
    x->reclaim = a->reclaim;
    x->largest_known = f->largest_known;
    x->largest = f->largest;
    og_cpy(x->fail_lib, sizeof x->fail_lib, a->fail_lib, sizeof a->fail_lib);
    x->live_known = a->live_known;
    x->live = a->live;
    x->retried_zero = a->retried_zero;
    x->app_pool = x->has[OG_CAUSE_CACHE] && f->app_pool_covers;
    x->async_backend = a->async_backend;
    x->variable_sizes = f->distinct_sizes >= 8;
    x->larger_than_device = x->has[OG_CAUSE_DNF] && f->free_known && f->req && f->larger_than_device;
    if (x->has[OG_CAUSE_OTHERFW]) {
        x->other_fw = f->other_fw;
        x->other_fw_bytes = f->other_fw_bytes;
    }
    if (x->has[OG_CAUSE_PEERS]) {
        x->peers_bytes = f->peers_bytes;
        x->npeers = f->npeers;
    }
    x->growth_rise = x->has[OG_CAUSE_GROWTH] ? f->growth.rise : 0;
    x->capacity = f->capacity;
    x->grad = a->grad;
    x->training = a->training;
    x->autocast = a->autocast;
    x->trains = f->trains; /* measured in facts.c (trains) */
    x->fw = a->fw;
    x->fwname = fw_display(x->fw);
    x->cc_known = a->cc_known;
    x->cc = a->cc;
    x->visible = rec->visible_devices;
    x->world = rec->world_size;
}

/* ------------------------------------------------------------------ writing a remedy */

static void why(og_remedy_t *r, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void why(og_remedy_t *r, const char *f, ...)
{
    size_t l = strnlen(r->why, sizeof r->why);
    if (l >= sizeof r->why - 1)
        return;
    va_list ap;
    va_start(ap, f);
    og_vfmt(r->why + l, sizeof r->why - l, f, ap);
    va_end(ap);
}

static void how(og_remedy_t *r, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void how(og_remedy_t *r, const char *f, ...)
{
    if (r->nhow >= 6)
        return;
    va_list ap;
    va_start(ap, f);
    og_vfmt(r->how[r->nhow], sizeof r->how[0], f, ap);
    va_end(ap);
    r->nhow++;
}

/* "PyTorch: " in front of PyTorch lines when the framework is not known */
static const char *pt(const rctx_t *x) { return x->fw == OG_FW_UNKNOWN ? "PyTorch: " : ""; }

/* How lines that are the same for every failure, as rows: the frameworks a line is for (FW_*, or ANY) and its
 * text (printed as it is, not a format).  A row of PyTorch code (PT) reads "PyTorch: " first when the framework
 * is not known.  A builder lists its rows in the order they are shown: HOWS(x, r, { PT, "..." }, ...). */
enum {
    FW_UNKNOWN = 1 << OG_FW_UNKNOWN,
    FW_PYTORCH = 1 << OG_FW_PYTORCH,
    FW_JAX = 1 << OG_FW_JAX,
    FW_TF = 1 << OG_FW_TENSORFLOW,
    FW_CUPY = 1 << OG_FW_CUPY,
    FW_TORCH = FW_PYTORCH | FW_UNKNOWN, /* PyTorch, or what is most likely PyTorch */
    FW_ALL = FW_TORCH | FW_JAX | FW_TF | FW_CUPY,
    ANY = 0,        /* no framework named: for every one */
    PT = 1 << 8,    /* PyTorch code */
    TRAIN = 1 << 9, /* a training loop's line: not shown in a job that does not train (no_training) */
    SERVE = 1 << 10 /* a serving or evaluation job's line: shown only in a job that does not train */
};
typedef struct {
    unsigned fw; /* FW_* of the frameworks it is for, | PT for PyTorch code */
    const char *text;
} how_row_t;
/* the job does not train: known not to (trains -1), or nothing says it does while the adapter's finished scan found
 * models but no optimizer and no gradients (a server, an evaluation; a script of bare tensors, no model, is not
 * known either way) */
static bool no_training(const rctx_t *x)
{
    const og_role_facts_t *k = &x->f->roles;
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    return x->trains == -1 || (x->trains == 0 && k->known && ro->complete && OG_FILLED(ro->nmodels, ro->models) > 0 &&
                               !k->opt_params && !k->grads && ro->noptimizers <= 0);
}
static void how_rows(const rctx_t *x, og_remedy_t *r, const how_row_t *rows, size_t n)
{
    bool serving = no_training(x);
    for (size_t i = 0; i < n; i++)
        if ((!(rows[i].fw & FW_ALL) || rows[i].fw & (1u << x->fw)) && !((rows[i].fw & TRAIN) && serving) &&
            !((rows[i].fw & SERVE) && !serving))
            how(r, "%s%s", rows[i].fw & PT ? pt(x) : "", rows[i].text);
}
#define HOWS(x, r, ...)                                          \
    do {                                                         \
        static const how_row_t rows_[] = { __VA_ARGS__ };        \
        how_rows((x), (r), rows_, sizeof rows_ / sizeof *rows_); \
    } while (0)

/* What the roles say the activation remedies can shrink, or that nobody measured it: last, and only
 * when the sentence fits whole. */
static void activations_measured(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char s[160] = "";
    if (!ro->known)
        og_fmt(s, sizeof s, " What the memory is for was not measured (no roles from the Python adapter).");
    else if (ro->act_known)
        og_fmt(s, sizeof s, " Measured: %s of activations, %s held by locals of running code.",
               og_hb((double)ro->act).s, og_hb((double)ro->local_held).s);
    if (strnlen(r->why, sizeof r->why) + strlen(s) < sizeof r->why - 1)
        why(r, "%s", s);
}

/* The failing request in a sentence: its size, or that none was given (never "0 B"). */
static og_hb_t req_hb(const rctx_t *x)
{
    og_hb_t t;
    if (x->req_known)
        return og_hb((double)x->req);
    og_fmt(t.s, sizeof t.s, "(size not given)");
    return t;
}

/* The sentence that sizes an activation-halving remedy against the shortfall. */
static void activations_vs_shortfall(const rctx_t *x, og_remedy_t *r, double frees, const char *what)
{
    if (!x->shortfall) {
        why(r, " It lowers the peak so the %s request fits more easily.", req_hb(x).s);
        activations_measured(x, r);
        return;
    }
    /* a first forward pass with layers still to come: what the whole pass needs, against its whole activations */
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->layers_to_come) {
        double pass = (double)ro->act + (double)ro->layers_to_come;
        double short_by = (double)x->shortfall + (double)ro->layers_to_come;
        why(r,
            " With the %d layers still to come this pass's activations come to about %s, %s of which must go for it to "
            "end; %s frees about %s%s.",
            ro->layers_left, og_hb(pass).s, og_pct(short_by, pass).s, what, og_hb(frees * pass).s,
            frees * pass >= short_by ? "" : ", not enough alone: go further or combine it with others");
        activations_measured(x, r);
        return;
    }
    double need = (double)x->shortfall / frees;
    if (!x->live_known) {
        why(r,
            " %s more is needed; %s covers it if the activations it shrinks are at least %s (how much of the "
            "%s held is in use was not measured).",
            og_hb((double)x->shortfall).s, what, og_hb(need).s, og_hb((double)x->tracked).s);
        activations_measured(x, r);
        return;
    }
    if (need <= (double)x->live)
        why(r, " %s more is needed, %s of the %s live: %s covers it if activations are at least %s.",
            og_hb((double)x->shortfall).s, og_pct((double)x->shortfall, (double)x->live).s, og_hb((double)x->live).s,
            what, og_hb(need).s);
    else
        why(r, " %s more is needed but only %s is live: %s alone cannot cover it; combine it with others.",
            og_hb((double)x->shortfall).s, og_hb((double)x->live).s, what);
    /* the memory rises step after step (a generation's KV cache aside: that is the pass itself growing) */
    const og_growth_facts_t *g = &x->f->growth;
    if (x->primary == OG_CAUSE_GROWTH && g->holds && g->per_step && !og_generation_growth(x))
        why(r, " The memory rose by about %s per step: this delays the failure, it does not stop the rise.",
            og_hb((double)g->per_step).s);
    activations_measured(x, r);
}

/* ------------------------------------------------------------------ the remedies */

/* the cap refused a job that fits the card without it (og_cap_not_the_card): the why says the state the cap cannot
 * hold and the room the card leaves, the cost what the cap may protect (the other processes measured on the card) */
static void cap_not_the_card_text(const rctx_t *x, og_remedy_t *r)
{
    og_uncapped_t u;
    if (!og_cap_not_the_card(x, &u))
        return;
    const og_record_t *rec = x->rec;
    why(r,
        " Its optimizer-step state (%s) exceeds the cap: no batch fits; with this pass it needs ~%s of the %s the "
        "card leaves it.",
        og_hb((double)u.state).s, og_hb((double)u.need).s, og_hb((double)u.room).s);
    if (!og_known(rec->memory.other_processes_bytes))
        r->cost = "Unknown: the card's processes were not listed; on a shared GPU the cap keeps other jobs' room";
    else if (rec->memory.other_processes_bytes.v == 0)
        r->cost = "None measured: no other process holds memory on this card";
    else
        r->cost = "The room the cap kept for the other processes measured on this card";
}

static bool b_raise_limit(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    /* the check's own accounting: allocations plus the CUDA context */
    uint64_t usage = og_known(rec->device.limit_usage_bytes) && rec->device.limit_usage_bytes.v > x->tracked
                         ? rec->device.limit_usage_bytes.v
                         : x->tracked;
    uint64_t need = add_sat(usage, x->req);
    if (og_known(rec->device.limit_bytes) && usage > x->tracked)
        why(r,
            "OOMGUARD_LIMIT caps device %d at %s; the job needs at least %s (%s allocated + %s CUDA context + %s "
            "requested).",
            rec->event.device, og_hb((double)rec->device.limit_bytes.v).s, og_hb((double)need).s,
            og_hb((double)x->tracked).s, og_hb((double)(usage - x->tracked)).s, req_hb(x).s);
    else if (og_known(rec->device.limit_bytes))
        why(r, "OOMGUARD_LIMIT caps device %d at %s; the job needs at least %s (%s held + %s requested).",
            rec->event.device, og_hb((double)rec->device.limit_bytes.v).s, og_hb((double)need).s,
            og_hb((double)x->tracked).s, req_hb(x).s);
    else
        why(r, "OOMGUARD_LIMIT refused the request; the job needs at least %s (%s held + %s requested).",
            og_hb((double)need).s, og_hb((double)x->tracked).s, req_hb(x).s);
    if (og_known(rec->device.free_bytes) && rec->device.free_bytes.v >= x->req)
        why(r, " The card itself had %s free, so the request would have succeeded.",
            og_hb((double)rec->device.free_bytes.v).s);
    if (og_known(rec->device.limit_bytes) && usage > x->tracked && x->req <= rec->device.limit_bytes.v &&
        add_sat(usage - x->tracked, x->req) > rec->device.limit_bytes.v)
        how(r, "export CUDA_MODULE_LOADING=LAZY   # a smaller CUDA context: kernels load when first used");
    cap_not_the_card_text(x, r);
    og_uncapped_t u; /* a job no batch of which fits under the cap: the cap it needs is its state and this pass */
    if (og_cap_not_the_card(x, &u) && u.need > need)
        need = u.need;
    /* 10% headroom, rounded up to whole GiB */
    uint64_t sugg = (uint64_t)((double)need * 1.10 / GIB) + 1;
    how(r, "OOMGUARD_LIMIT=%lluGiB   # or for this device only: OOMGUARD_LIMIT=%d:%lluGiB", (unsigned long long)sugg,
        rec->event.device, (unsigned long long)sugg);
    HOWS(x, r, { ANY, "unset OOMGUARD_LIMIT   # no cap at all" },
         { ANY, "Or keep the cap and shrink the job with the remedies below." });
    return true;
}

static bool b_empty_cache(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    char cached[24];
    og_fmt(cached, sizeof cached, "%s", x->cached_known ? og_hb((double)x->cached).s : "an unmeasured amount");

    if (x->retried_zero)
        why(r,
            "%s already released its cache when the allocation failed and got nothing back: what it keeps is "
            "split inside segments still in use, which empty_cache() cannot return.",
            x->fwname);
    else if (x->has[OG_CAUSE_CACHE] && !x->cached_known && x->fail_lib[0])
        why(r,
            "%s holds memory of which an unmeasured part is cached but unused, and %s (outside %s's allocator) "
            "could not get %s: hand the cache back before that library allocates; memory_summary() shows how much "
            "it is.",
            fw_display(rec->framework), x->fail_lib, fw_display(rec->framework), req_hb(x).s);
    else if (x->has[OG_CAUSE_CACHE] && x->fail_lib[0])
        why(r, "%s keeps %s cached while %s could not get %s: hand the cache back before that library allocates.",
            fw_display(rec->framework), cached, x->fail_lib, req_hb(x).s);
    else if (x->has[OG_CAUSE_FRAG]) {
        why(r, "%s is cached but unused", cached);
        if (x->largest_known)
            why(r, " and the largest free block is %s, below the %s requested", og_hb((double)x->largest).s,
                req_hb(x).s);
        why(r, ": releasing the cache lets the allocator start again from fresh segments.");
    } else if (x->has[OG_CAUSE_LIMIT])
        why(r, "The limit counts cached memory too: %s of the %s held is cached but unused.", cached,
            og_hb((double)x->tracked).s);
    else if (x->primary == OG_CAUSE_DNF && x->cached_known)
        why(r,
            "Only %s is cached, less than the %s missing: tensors in use fill the memory, so this helps only "
            "together with the reductions above.",
            cached, og_hb((double)x->shortfall).s);
    else if (x->primary == OG_CAUSE_DNF)
        why(r,
            "How much of the %s this process holds is cached but unused was not measured: if it is at least the "
            "%s missing, releasing it is the cheapest fix.",
            og_hb((double)x->tracked).s, og_hb((double)x->shortfall).s);
    else if (x->has[OG_CAUSE_GROWTH])
        why(r,
            "%s is cached but unused; release it between epochs or phases so the growth does not also pin "
            "the cache.",
            cached);
    else
        why(r, "%s is cached but unused; releasing it is the first step of the checklist.", cached);

    switch (x->fw) {
    case OG_FW_JAX: {
        r->title = "Release JAX's reserved memory and let it allocate on demand";
        if (rec->xla_preallocate_off)
            why(r, " Preallocation is already off.");
        else
            how(r, "export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX reserves 75%% of the GPU at start by default");
        const og_framework_view_t *fw = &rec->memory.fw;
        uint64_t resv = fw->has ? fw->reserved_bytes : rec->memory.framework_bytes;
        if ((x->has[OG_CAUSE_CACHE] || x->has[OG_CAUSE_FOREIGN]) && x->total && x->shortfall_known &&
            resv > x->shortfall) {
            int frac = (int)(100.0 * (double)(resv - x->shortfall) / (double)x->total);
            if (frac < 5)
                frac = 5;
            if (frac > 95)
                frac = 95;
            how(r, "export XLA_PYTHON_CLIENT_MEM_FRACTION=.%02d   # caps JAX so %s more stays for others", frac,
                og_hb((double)x->shortfall).s);
        } else if (!env_value(rec, "XLA_PYTHON_CLIENT_MEM_FRACTION") && !rec->xla_preallocate_off)
            how(r, "or export XLA_PYTHON_CLIENT_MEM_FRACTION=.XX   # reserve only this share of the GPU");
        if (env_is(rec, "XLA_PYTHON_CLIENT_ALLOCATOR", "platform"))
            why(r, " XLA_PYTHON_CLIENT_ALLOCATOR=platform is already set.");
        else
            how(r, "export XLA_PYTHON_CLIENT_ALLOCATOR=platform   # exact allocate/free: no cache, no fragmentation; "
                   "slower");
        how(r, "del big_array; gc.collect(); jax.clear_caches()   # drop dead arrays and compiled programs");
        break;
    }
    case OG_FW_TENSORFLOW:
        r->title = "Let TensorFlow allocate on demand and release its memory";
        if (env_is(rec, "TF_FORCE_GPU_ALLOW_GROWTH", "true"))
            why(r, " Memory growth is already on (TF_FORCE_GPU_ALLOW_GROWTH=true).");
        else
            how(r, "for gpu in tf.config.list_physical_devices(\"GPU\"): "
                   "tf.config.experimental.set_memory_growth(gpu, True)   # before the first op");
        if (strcmp(rec->tf_gpu_allocator, "cuda_malloc_async") == 0)
            why(r, " TF_GPU_ALLOCATOR=cuda_malloc_async is already set.");
        else
            how(r, "export TF_GPU_ALLOCATOR=cuda_malloc_async   # stream-ordered allocator: less fragmentation");
        if (x->has[OG_CAUSE_CACHE] && x->total > x->shortfall)
            how(r,
                "tf.config.set_logical_device_configuration(gpu, "
                "[tf.config.LogicalDeviceConfiguration(memory_limit=%llu)])   # MiB; cap TensorFlow",
                (unsigned long long)((x->total - x->shortfall) / (1ULL << 20) * 9 / 10));
        how(r, "tf.keras.backend.clear_session(); gc.collect()   # between models");
        break;
    case OG_FW_CUPY:
        r->title = "Release CuPy's memory pool";
        how(r, "cupy.get_default_memory_pool().free_all_blocks(); "
               "cupy.get_default_pinned_memory_pool().free_all_blocks()");
        if (x->has[OG_CAUSE_FRAG])
            how(r, "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)   # stream-ordered pool: less "
                   "fragmentation");
        if (x->has[OG_CAUSE_CACHE] && x->total > x->shortfall)
            how(r, "cupy.get_default_memory_pool().set_limit(size=%llu)   # cap the pool, leave room for others",
                (unsigned long long)((x->total - x->shortfall) / 10 * 9));
        break;
    default:
        r->title = x->fw == OG_FW_PYTORCH ? "Release cached memory (torch.cuda.empty_cache)"
                                          : "Release the framework's cached memory";
        how(r, "%sdel big_tensor; gc.collect(); torch.cuda.empty_cache()   # at phase boundaries", pt(x));
        if (x->has[OG_CAUSE_CACHE] && x->fail_lib[0])
            how(r, "%scall torch.cuda.empty_cache() right before the code that makes %s allocate", pt(x), x->fail_lib);
        if (x->has[OG_CAUSE_FRAG] && rec->expandable_segments_set) {
            why(r, " expandable_segments is already on (PYTORCH_CUDA_ALLOC_CONF=%.80s).", rec->pytorch_alloc_conf);
            if (!rec->max_split_set)
                how(r,
                    "%salternative: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512   # instead of "
                    "expandable_segments: large blocks are not split",
                    pt(x));
        }
        how(r, "%sprint(torch.cuda.memory_summary())   # reserved vs allocated, before and after", pt(x));
        if (x->fw == OG_FW_UNKNOWN)
            how(r, "JAX: jax.clear_caches(); TensorFlow: tf.keras.backend.clear_session(); "
                   "CuPy: cupy.get_default_memory_pool().free_all_blocks()");
        break;
    }
    return true;
}

static bool desktop_app(const char *name);

/* how many other processes the record lists */
static int nother(const og_record_t *rec)
{
    return rec->memory.nother < 0 ? 0 : rec->memory.nother > 32 ? 32 : rec->memory.nother;
}

/* the largest other process not USED yet (now marked used), or -1 */
static int next_largest_other(const og_record_t *rec, bool used[32])
{
    int big = -1;
    for (int i = 0; i < nother(rec); i++)
        if (!used[i] && (big < 0 || rec->memory.other[i].bytes > rec->memory.other[big].bytes))
            big = i;
    if (big >= 0)
        used[big] = true;
    return big;
}

/* "kill PID" lines for the largest other processes, desktop programs excepted */
static void list_other_processes(const rctx_t *x, og_remedy_t *r, int max_how)
{
    const og_record_t *rec = x->rec;
    bool used[32] = { false };
    for (int k = 0; k < max_how; k++) {
        int big = next_largest_other(rec, used);
        if (big < 0)
            break;
        const og_other_proc_t *o = &rec->memory.other[big];
        char full[sizeof rec->memory.other[0].name], name[sizeof full];
        og_cpy(full, sizeof full, o->name, sizeof full);
        og_cpy(name, sizeof name, og_base_name(full), strlen(og_base_name(full)) + 1);
        if (o->same_job || desktop_app(name)) { /* never a kill line for a rank of this job */
            k--;
            continue;
        }
        if (!o->visible) /* a host pid: kill here would hit another process */
            how(r, "host pid %d holds %s: not visible in this container; stop it from the host (nvidia-smi there)",
                o->pid, og_hb((double)o->bytes).s);
        else
            how(r, "kill %d   # %s, %s on this GPU: only if it is yours and no longer needed", o->pid,
                name[0] ? name : "unknown", og_hb((double)o->bytes).s);
    }
}

static bool desktop_app(const char *name)
{
    static const char *const apps[] = { "Xorg",    "Xwayland", "gnome-shell", "kwin",  "chrome", "chromium", "firefox",
                                        "Discord", "discord",  "electron",    "steam", "obs",    "code" };
    for (size_t i = 0; i < sizeof apps / sizeof *apps; i++)
        if (strstr(name, apps[i]))
            return true;
    return false;
}

/* how the work a child of this process does is closed, by the name its starter gave it (a substring of it: dask's
 * Nanny names its worker "Dask Worker process (from Nanny)", a Pool its workers "SpawnPoolWorker-N"); the last row, of
 * no name, stands for any other */
static const struct {
    const char *named, *how;
} close_child[] = {
    { "Dask Worker",
      "client.close(); cluster.close()   # the dask (LocalCUDACluster) client and cluster, once their work "
      "is done; or `with LocalCUDACluster(...) as cluster, Client(cluster) as client:`" },
    { "PoolWorker",
      "pool.close(); pool.join()   # the multiprocessing Pool, once its work is done (or `with Pool(...)`)" },
    { "", "proc.join() or proc.terminate()   # the Process object that started it, before this work needs the GPU" },
};

/* every peer is this process's own child doing work of its own (facts: own_children): close that work in code */
static void own_children_text(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int big = x->f->own_child;
    const char *t = og_child_name(rec, rec->memory.other[big].pid);
    char named[sizeof rec->memory.fw.roles.children[0].name];
    og_cpy(named, sizeof named, t ? t : "", sizeof named);
    why(r,
        "No other user holds this GPU: %d %s this process started through multiprocessing %s %s on it, and %s no "
        "DataLoader worker. The largest, pid %d (%s), is named \"%s\" by the code that started it: this job's own "
        "work, left running beside this one. It gives its memory back when the program closes what started it",
        x->npeers, og_plural(x->npeers, "process", "processes"), og_plural(x->npeers, "holds", "hold"),
        og_hb((double)x->peers_bytes).s, og_plural(x->npeers, "it is", "none is"), rec->memory.other[big].pid,
        og_hb((double)rec->memory.other[big].bytes).s, named);
    if (x->shortfall)
        why(r, "; %s is missing.", og_hb((double)x->shortfall).s);
    else
        why(r, ".");
    size_t k = 0, last = sizeof close_child / sizeof *close_child - 1;
    while (k < last && !strstr(named, close_child[k].named))
        k++;
    how(r, "%s", close_child[k].how);
    if (k == last) /* what started it is not known by its name: the ways a program closes its workers */
        for (size_t i = 0; i < last; i++)
            how(r, "%s", close_child[i].how);
}

static bool b_foreign_processes(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int n = nother(rec);
    if (x->f->own_children && x->f->own_child >= 0 && !x->other) {
        own_children_text(x, r);
        return true;
    }
    if (x->other_inferred)
        why(r,
            "NVML could not list the GPU's processes here (a container without it?), but %s of this GPU "
            "is held outside this process: most likely other processes; list them on the host with nvidia-smi",
            og_hb((double)x->other).s);
    else
        why(r, "Other processes (not of this job) hold %s on this GPU", og_hb((double)x->other).s);
    bool used[32] = { false };
    for (int i = 0; i < n; i++)
        used[i] = rec->memory.other[i].same_job;
    for (int k = 0; k < 3; k++) {
        int big = next_largest_other(rec, used);
        if (big < 0)
            break;
        char full[sizeof rec->memory.other[0].name], name[32];
        og_cpy(full, sizeof full, rec->memory.other[big].name, sizeof full);
        og_cpy(name, sizeof name, og_base_name(full), strlen(og_base_name(full)) + 1);
        why(r, "%s %spid %d %s %s", k ? "," : ":", rec->memory.other[big].visible ? "" : "host ",
            rec->memory.other[big].pid, name[0] ? name : "?", og_hb((double)rec->memory.other[big].bytes).s);
    }
    if (x->shortfall)
        why(r, "; %s is missing.", og_hb((double)x->shortfall).s);
    else
        why(r, ".");
    if (x->has[OG_CAUSE_NONFW])
        why(r, " Inside this process %s more is outside %s.", og_hb((double)x->nonfw).s, x->fwname);
    how(r, "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv");
    list_other_processes(x, r, 3);
    bool desk = false;
    for (int i = 0; i < n; i++) {
        char name[sizeof rec->memory.other[0].name];
        og_cpy(name, sizeof name, rec->memory.other[i].name, sizeof name);
        desk = desk || desktop_app(name);
    }
    if (desk)
        how(r, "Desktop apps (browser, Discord, X server) hold GPU memory: turn off their hardware "
               "acceleration or close them.");
    how(r, "nvidia-smi pmon -c 1   # live per-process view");
    return true;
}

/* Memory outside the framework with no other process to stop: it is in this process. */
static bool b_non_framework_memory(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    /* nothing from other processes: the memory outside the framework is in this process */
    why(r, "%s of this process's memory is outside %s (CUDA context and other libraries)", og_hb((double)x->nonfw).s,
        x->fwname);
    /* what the non_framework cause found, when the diagnosis kept it */
    const char *lib = NULL;
    char libname[64];
    double lb = -1, ctx = -1;
    if (x->has[OG_CAUSE_NONFW] && x->f->nonfw_big_lib >= 0) {
        const og_lib_usage_t *u = &rec->memory.by_library[x->f->nonfw_big_lib];
        char full[sizeof u->library];
        og_cpy(full, sizeof full, u->library, sizeof full);
        og_cpy(libname, sizeof libname, og_base_name(full), sizeof full);
        lib = libname;
        lb = (double)u->bytes;
    }
    if (x->has[OG_CAUSE_NONFW] && og_known(rec->memory.context_bytes_estimate))
        ctx = (double)rec->memory.context_bytes_estimate.v;
    if (lib && lb > 0)
        why(r, "; the largest holder is %s with %s", lib, og_hb(lb).s);
    if (ctx >= 0)
        why(r, "; context and untracked memory ~%s", og_hb(ctx).s);
    why(r, ".");
    /* taken across the run (facts: nonfw_built_up): objects of that library made and kept one after another, or a
     * leak in it; nothing measured tells which, so the text names both */
    bool built_up = lib && lb > 0 && x->f->nonfw_built_up;
    if (built_up) {
        why(r,
            " %s took it across the run (%s by quarter), not at one time: objects of it made one after another and "
            "all alive (a pipeline or engine per size or per call, kept in a dict), or a leak in it; %s was taken "
            "before the last quarter.",
            lib, og_quarters(rec->memory.by_library[x->f->nonfw_big_lib].by_quarter).s,
            og_hb((double)x->f->nonfw_before_last).s);
        how(r,
            "Keep one %s object per purpose: drop the old ones (del, and out of any dict or list) before making "
            "the next.",
            lib);
        how(r, "If the program keeps none, %s leaks: update it, or report it with this dump.", lib);
    } else if (lib && lb > 0)
        how(r, "Check what makes %s allocate (its own cache or workspace settings) and cap it.", lib);
    how(r,
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv   # compare with %s's own "
        "numbers",
        x->fwname);
    how(r, "export CUDA_MODULE_LOADING=LAZY   # smaller CUDA context: kernels are loaded when first used");
    return true;
}

/* The process holds contexts of its own beside the primary one (facts: contexts): each holds the driver's state and
 * the modules loaded into it, and whatever the code that made it loaded there again (an engine per thread) */
static bool b_share_cuda_context(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int n = x->f->contexts;
    if (n < 2)
        return false;
    why(r,
        "This process holds %d CUDA contexts on this GPU (%lld made with cuCtxCreate%s), about %s each: every "
        "context beyond the first, %s in all, holds the driver's state and the modules loaded into it again.",
        n, (long long)rec->memory.contexts_made, rec->memory.primary_context == 1 ? ", and the primary one" : "",
        og_hb((double)og_or(rec->memory.context_bytes_estimate, 0) / n).s, og_hb((double)x->f->contexts_extra).s);
    why(r, " Threads can share one context: each makes it current instead of creating its own, and what was loaded "
           "per context (an engine, a module) can be loaded once.");
    how(r, "ctx = cuda.Device(0).retain_primary_context(); ctx.push()   # pycuda: the primary context, not "
           "make_context(); ctx.pop() when the thread is done");
    how(r, "cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);   # C: the context the runtime and "
           "PyTorch already use");
    how(r, "Load an engine once and give each thread its own execution context (TensorRT: "
           "engine.create_execution_context()), not an engine per thread.");
    return true;
}

/* what is alive from an earlier copy of the model (og_previous_copy) */
/* A deep copy under way that replaces a model a name holds (facts: roles.copy_replaces): the name the failing
 * statement rebinds (the previous copy) and the model it copies (another name of the statement that holds a
 * model), "" where none is read. */
typedef struct copy_names {
    char target[64], source[64], site[160];
} copy_names_t;

static copy_names_t copy_names(const rctx_t *x)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    copy_names_t c;
    memset(&c, 0, sizeof c);
    if (!ro->has_statement)
        return c;
    og_cpy(c.target, sizeof c.target, ro->stmt_target, sizeof c.target);
    char file[sizeof ro->stmt.file], fn[sizeof ro->stmt.function], names[sizeof ro->stmt_names];
    og_cpy(file, sizeof file, ro->stmt.file, sizeof file);
    og_cpy(fn, sizeof fn, ro->stmt.function, sizeof fn);
    og_cpy(names, sizeof names, ro->stmt_names, sizeof names);
    og_fmt(c.site, sizeof c.site, "%s:%d in %s", og_base_name(file), ro->stmt.line, fn);
    int nm = OG_FILLED(ro->nmodels, ro->models);
    for (char *p = names; *p && !c.source[0];) {
        char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        char one[64];
        og_fmt(one, sizeof one, "%.*s", (int)(l < sizeof one ? l : sizeof one - 1), p);
        for (int i = 0; i < nm && strcmp(one, c.target) != 0; i++) {
            char mn[sizeof ro->models[0].names];
            og_cpy(mn, sizeof mn, ro->models[i].names, sizeof mn);
            if (og_name_listed(mn, one)) {
                og_fmt(c.source, sizeof c.source, "%s", one);
                break;
            }
        }
        if (!e)
            break;
        p = e + 1;
    }
    return c;
}

static void previous_copy_why(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->model_copies >= x->shortfall && ro->model_copies)
        why(r,
            "A previous copy of the model is still alive in this process (%s of parameters beyond the one in use, "
            "with whatever gradients, optimizer state and tensors its run left): a notebook cell run again keeps "
            "the first run's objects through its variables and the last traceback.",
            og_hb((double)ro->model_copies).s);
    else
        why(r, "The model was loaded a second time while the first copy is still alive (a notebook cell run "
               "again, a reload without del).");
}

static bool b_restart_process(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int n = nother(rec);
    if (x->has[OG_CAUSE_FOREIGN] && n) {
        why(r,
            "A process killed or interrupted mid-run can leave its context behind until it fully exits; "
            "check that the %d process%s holding %s still do useful work.",
            n, n == 1 ? "" : "es", og_hb((double)x->other).s);
        char pids[120] = "";
        for (int i = 0, k = 0; i < n && k < 8; i++) {
            if (!rec->memory.other[i].visible || rec->memory.other[i].same_job)
                continue;
            size_t l = strlen(pids);
            og_fmt(pids + l, sizeof pids - l, "%s%d", k++ ? "," : "", rec->memory.other[i].pid);
        }
        if (pids[0])
            how(r, "ps -o pid,stat,etime,cmd -p %s   # still running what you expect?", pids);
        else
            how(r, "On the host: nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # these pids are "
                   "not visible here");
    } else if (og_previous_copy(x)) {
        previous_copy_why(x, r);
        why(r, " A restart frees all of it at once.");
    } else if (x->has[OG_CAUSE_FRAG]) {
        why(r,
            "A fresh process starts with an empty, unfragmented cache (%s is cached now); a restart between "
            "phases avoids carrying fragmentation along.",
            x->cached_known ? og_hb((double)x->cached).s : "?");
    } else if (x->has[OG_CAUSE_NONFW]) {
        why(r, "A restart drops contexts and library workspaces that accumulated in this process (%s outside %s).",
            og_hb((double)x->nonfw).s, x->fwname);
    } else {
        why(r,
            "A restart clears leftover contexts, the framework's cache and references kept by an interactive "
            "session (this process holds %s).",
            og_hb((double)x->footprint).s);
    }
    HOWS(x, r, { ANY, "fuser -v /dev/nvidia*   # every process that still has the GPU open, leftovers included" },
         { ANY, "Restart the job (in Jupyter: restart the kernel; its process keeps the memory until it exits)." });
    return true;
}

/* the label of the largest holder kept across calls ("cache (dict, global in train.py)"), or NULL */
static const char *holder_label(const rctx_t *x, int i, char *buf, size_t n)
{
    if (i < 0)
        return NULL;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[i];
    og_cpy(buf, n, h->label[0] ? h->label : h->name, sizeof h->label);
    return buf[0] ? buf : NULL;
}

/* a dataset kept whole on the device (facts: roles.dataset_kept, dataset_holder) */
static bool b_dataset_on_cpu(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (!ro->dataset_kept && ro->grower < 0 && ro->stmt_copies >= 0) { /* the failing statement copies a holder whole */
        const og_roles_t *rr = &x->rec->memory.fw.roles;
        const og_role_holder_t *h = &rr->holders[ro->stmt_copies];
        char lb[160], name[sizeof h->name], file[sizeof rr->stmt.file];
        const char *holder = holder_label(x, ro->stmt_copies, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        og_cpy(file, sizeof file, rr->stmt.file, sizeof file);
        r->title = "Gather the pieces in host memory, or build the result in place";
        why(r,
            "The failing statement (%s:%d) asks for %s, a copy of what %s holds (%llu tensor%s): for its length both "
            "are on the GPU. Gather it in host memory, or fill one preallocated tensor and drop each piece as it is "
            "copied in.",
            og_base_name(file), rr->stmt.line, og_hb((double)x->req).s, holder ? holder : "a holder",
            (unsigned long long)h->tensors, h->tensors == 1 ? "" : "s");
        r->saving = "One of the two copies: what the holder keeps, for the length of the statement";
        const char *n = name[0] ? name : "chunks";
        how(r, "%s.append(t.cpu())   # pieces in host memory; torch.cat(%s) there, one copy on the GPU if needed", n,
            n);
        how(r, "%sout = torch.empty(total, dim, device=\"cuda\"); out[i:j] = piece; del piece   # built in place",
            pt(x));
        return true;
    }
    char lb[160], name[sizeof x->rec->memory.fw.roles.holders[0].name] = "";
    /* a dataset kept across calls, or the growth's own holder when the dataset is what grows (a replay buffer) */
    bool growing = !ro->dataset_kept && ro->grower >= 0;
    int which = growing ? ro->grower : ro->dataset_holder;
    const char *holder = holder_label(x, which, lb, sizeof lb);
    if (which >= 0)
        og_cpy(name, sizeof name, x->rec->memory.fw.roles.holders[which].name, sizeof name);
    /* a data set by its records, not its name: how many like records, read one (or one batch) at a time */
    long long records = which >= 0 && og_holder_purpose(x->f, x->rec, which) == OG_PURPOSE_dataset &&
                                !x->rec->memory.fw.roles.holders[which].purpose[0]
                            ? (long long)x->rec->memory.fw.roles.holders[which].records
                            : 0;
    char many[64] = "";
    if (records > 0)
        snprintf(many, sizeof many, ", %lld like records", records);
    why(r,
        "The running code keeps %s of a dataset on the GPU%s%s%s%s%s: it is read a batch at a time, yet all of it "
        "takes the card beside the model, its state and the pass's activations. Kept in host memory (pinned) and "
        "copied one batch per step, it costs the GPU one batch.",
        og_hb((double)(growing ? ro->grower_bytes : ro->dataset_kept)).s, growing ? ", growing as it fills" : "",
        holder ? " (the largest: " : "", holder ? holder : "", many, holder ? ")" : "");
    if (records > 0 && name[0])
        how(r,
            "%s%s: build each record in host memory (.pin_memory(), not .cuda()); .cuda(non_blocking=True) only "
            "the one a step reads",
            pt(x), name);
    const char *n = name[0] && !strchr(name, '.') ? name : "images";
    how(r, "%s%s = torch.from_numpy(array).pin_memory()   # in host memory, not .cuda()", pt(x), n);
    how(r, "%sx = %s[idx].cuda(non_blocking=True)   # one batch at a time (idx on the CPU)", pt(x), n);
    how(r, "%sor DataLoader(dataset, batch_size=..., num_workers=4, pin_memory=True)", pt(x));
    return true;
}

/* a search index kept on the device (facts: roles.index_kept, index_holder): name it, its share of what the process
 * holds, and what float32 vectors cost against float16 or a compressed index */
static bool b_index_off_gpu(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char lb[160], name[sizeof x->rec->memory.fw.roles.holders[0].name] = "";
    const char *holder = holder_label(x, ro->index_holder, lb, sizeof lb);
    if (ro->index_holder >= 0)
        og_cpy(name, sizeof name, x->rec->memory.fw.roles.holders[ro->index_holder].name, sizeof name);
    uint64_t held = x->rec->memory.fw.allocated_bytes;
    why(r, "%s keeps %s of a search index on the GPU", holder ? holder : "The running code",
        og_hb((double)ro->index_kept).s);
    if (held >= ro->index_kept && held)
        why(r, ", %.0f%% of the %s this process holds", 100.0 * (double)ro->index_kept / (double)held,
            og_hb((double)held).s);
    if (ro->params)
        why(r, " beside %s of model weights", og_hb((double)ro->params).s);
    why(r, ": every request's own memory must fit in what it leaves. Searched from host memory, or stored as "
           "float16 or a compressed index, it gives most of that back.");
    const char *n = name[0] ? name : "vectors";
    how(r, "%s%s = %s.half()   # float16 vectors: half of float32, scores nearly the same", pt(x), n, n);
    how(r, "index = faiss.IndexFlatIP(dim); index.add(vectors_cpu)   # exact search on the CPU; GPU memory for "
           "the model");
    how(r, "faiss.IndexIVFPQ(quantizer, dim, nlist, m, 8)   # a compressed index: bytes per vector m, not 4 x dim");
    return true;
}

/* the checkpoint kept after its load (og_checkpoint_kept): name its holder, what it copies and its bytes */
static void checkpoint_kept_why(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->ckpt_holder];
    char lb[160], copy[sizeof h->copy_of];
    const char *label = holder_label(x, ro->ckpt_holder, lb, sizeof lb);
    og_cpy(copy, sizeof copy, h->copy_of, sizeof copy);
    why(r,
        "%s holds %s on the GPU, a copy of the %s: a checkpoint torch.load put back on the device it was saved "
        "from. load_state_dict copied it into the model, yet the copy stays while the name refers to it.",
        label ? label : "A checkpoint", og_hb((double)ro->ckpt_copy).s,
        strcmp(copy, "optimizer_state") == 0 ? "optimizer state" : "parameters");
}

/* the holder keeps one tensor (a tensor bound to a name, or a container of one) */
static bool one_tensor(const og_role_holder_t *h)
{
    char kind[sizeof h->kind];
    og_cpy(kind, sizeof kind, h->kind, sizeof kind);
    return h->tensors == 1 || strcmp(kind, "Tensor") == 0;
}

/* how a holder N keeps less on the device: ONE tensor kept whole is read a slice at a time (each batch moved as the
 * loop reaches it); a list gets host copies, numbers, and is cleared once read */
static void keep_less_how(const rctx_t *x, og_remedy_t *r, const char *n, bool one)
{
    if (one) {
        how(r, "%s%s = %s.cpu().pin_memory()   # kept in host memory", pt(x), n, n);
        how(r, "%sx = %s[i:i + batch].cuda(non_blocking=True)   # a batch at a time on the GPU", pt(x), n);
        return;
    }
    how(r, "%s.append(t.detach().cpu())   # what is kept for later (a metric, a report) in host memory", n);
    how(r, "%s.append(t.item())   # a number, not a tensor, where a number is all that is read", n);
    how(r, "%s.clear()   # (or del) once read: nothing on the device outlives its use", n);
}

/* the model class whose copies beyond the first hold the most (roles.models: count > 1), -1 none */
static int copies_group(const rctx_t *x)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    int best = -1, n = OG_FILLED(ro->nmodels, ro->models);
    for (int i = 0; i < n; i++)
        if (ro->models[i].count > 1 && (best < 0 || (double)ro->models[i].bytes * (ro->models[i].count - 1) >
                                                        (double)ro->models[best].bytes * (ro->models[best].count - 1)))
            best = i;
    return best;
}

/* LoRA adapters piled up (roles.lora_piled): how many bytes, and how many times the other weights */
static void lora_pile_why(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    why(r,
        "The models hold %s of LoRA adapters' parameters, %.1fx their other weights (%s), with no gradient and no "
        "optimizer state: one adapter is a few percent of its base, so these are many, loaded one after another "
        "(per job, tenant or request) and kept. Deactivating an adapter (set_adapters, disable_adapters) keeps its "
        "weights on the GPU; deleting it frees them.",
        og_hb((double)ro->lora_params).s, og_lora_ratio(ro), og_hb((double)(ro->params - ro->lora_params)).s);
}

static void group_names(const rctx_t *x, int i, char *buf, size_t n);

static bool b_release_references(const rctx_t *x, og_remedy_t *r)
{
    const og_growth_facts_t *g = &x->f->growth;
    bool grew = x->has[OG_CAUSE_GROWTH];
    double first = grew ? (double)g->first_low : -1, last = grew ? (double)g->last_low : -1;
    double step = grew ? (double)g->per_step : -1;
    char stepbuf[32];
    og_fmt(stepbuf, sizeof stepbuf, "%d of %d", g->rising, g->transitions);
    const char *steps = grew ? stepbuf : NULL;
    bool kept_on_purpose = (og_growth_without_autograd(x) || og_generation_growth(x)) &&
                           (x->fw == OG_FW_PYTORCH || x->fw == OG_FW_UNKNOWN);
    if (!grew && x->f->roles.copy_replaces && og_covers(x, (double)x->f->roles.copy_replaces)) {
        copy_names_t c = copy_names(x);
        const char *t = c.target[0] ? c.target : "the copy";
        why(r,
            "The failing statement (%s) makes a new deep copy of %s to rebind %s while the copy %s holds now (%s "
            "of parameters) is still alive: for the length of the copy both are on the GPU. Drop the old one "
            "first and the new one takes its place.",
            c.site, c.source[0] ? c.source : "the model", t, t, og_hb((double)x->f->roles.copy_replaces).s);
        how(r, "del %s   # and any other name of the old copy, before making the new one", t);
        how(r, "%s = copy.deepcopy(%s)   # now only one copy at a time", t, c.source[0] ? c.source : "model");
        return true;
    }
    const og_roles_t *rr = &x->rec->memory.fw.roles;
    if (!grew && og_layer_holder_kept(x) && x->f->roles.layer_holder_to_come &&
        og_covers(x, (double)(rr->holders[x->f->roles.layer_holder].bytes + x->f->roles.layer_holder_to_come))) {
        /* a holder keeping one record per layer of the running pass (facts: layer_holder) */
        const og_role_holder_t *h = &rr->holders[x->f->roles.layer_holder];
        char lb[160], name[sizeof h->name];
        const char *holder = holder_label(x, x->f->roles.layer_holder, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        r->saving = "What the holder keeps for every layer: one layer's at a time";
        why(r,
            "%s keeps one record per layer of the running pass, %lld so far (%s, about %s each): the %lld layers "
            "still to come would add about %s more. Use each layer's record and drop it from the GPU before the "
            "next layer runs (copied to the host, wait for the copy, then release it), and the pass holds one "
            "layer's at a time.",
            holder ? holder : "A holder", (long long)h->records, og_hb((double)h->bytes).s,
            og_hb((double)h->bytes / (double)(h->records > 0 ? h->records : 1)).s,
            (long long)(rr->layer_count - h->records), og_hb((double)x->f->roles.layer_holder_to_come).s);
        how(r,
            "%shost = t.to(\"cpu\", non_blocking=True); event.record(); ...; event.synchronize(); del t   # then "
            "the GPU copy goes",
            pt(x));
        how(r, "%s.clear()   # or pop each layer's entry once it is used; keep no GPU tensor per layer",
            name[0] ? name : "holder");
        return true;
    }
    if (!grew && x->f->roles.trained_by_others && og_covers(x, (double)x->f->roles.trained_kept)) {
        const og_role_facts_t *ro = &x->f->roles;
        char cls[sizeof rr->models[0].cls], names[sizeof rr->models[0].names];
        og_cpy(cls, sizeof cls, rr->models[ro->trained_group].cls, sizeof cls);
        group_names(x, ro->trained_group, names, sizeof names);
        bool loads = x->f->phase == OG_JP_loading;
        r->saving = "The trained model, its gradients and its optimizer state";
        why(r,
            "The trained %s is still alive: %s, attributes of other objects, reach it (no name of the program's "
            "own does), and with its optimizer state it holds %s that %s needs room beside. A del of the "
            "program's name frees nothing while they hold it, nor do gc.collect() and empty_cache(): drop those "
            "references first.",
            cls[0] ? cls : "model", names, og_hb((double)ro->trained_kept).s,
            loads ? "the model being loaded" : "the training starting now");
        char obj[sizeof names];
        const char *cur = names, *p;
        size_t l;
        og_cpy(obj, sizeof obj, names, sizeof names);
        if (og_name_next(&cur, &p, &l))
            og_fmt(obj, sizeof obj, "%.*s", (int)l, p);
        char *dot = strrchr(obj, '.');
        if (dot)
            *dot = 0; /* the object holding it: trainer of trainer.model */
        how(r, "%sdel %s   # each object that holds it (a pipeline, a trainer), or set its attribute to None", pt(x),
            obj);
        how(r, "%sgc.collect(); torch.cuda.empty_cache()   # then load; a notebook: or restart the kernel", pt(x));
        return true;
    }
    if (x->f->roles.lora_piled && og_covers(x, (double)x->f->roles.lora_params)) {
        lora_pile_why(x, r);
        r->saving = "Every adapter but the ones the running job uses";
        how(r,
            "%spipe.delete_adapters(name)   # diffusers: after the job that used it (unload_lora_weights() drops "
            "them all)",
            pt(x));
        how(r, "%smodel.delete_adapter(name)   # PEFT: the same for a PeftModel", pt(x));
        return true;
    }
    /* a loop's deep copies of one model, each kept (growth by copies): what each copy gave, not the copy */
    if (grew && g->marker == OG_MARK_KEPT_COPIES && x->f->roles.copy_source_group >= 0) {
        const og_roles_t *ro = &x->rec->memory.fw.roles;
        int s = x->f->roles.copy_source_group;
        char src[sizeof ro->models[0].names], target[sizeof ro->stmt_target];
        og_cpy(src, sizeof src, ro->models[s].names, sizeof src);
        og_cpy(target, sizeof target, ro->stmt_target, sizeof target);
        char *comma = strchr(src, ',');
        if (comma)
            *comma = 0; /* its first name */
        why(r,
            "The loop makes a deep copy of %s (%s of parameters) every iteration and keeps each: %ld copies no name "
            "of the running code holds are on the GPU, %s in all, the one %s holds now among them, and the copy "
            "under way is the next. Keep what each copy gave (its numbers; its weights on the host or on disk) and "
            "drop the copy before making the next.",
            src[0] ? src : "the model", og_hb((double)g->per_step).s, g->seen - 1, og_hb((double)g->rise).s,
            target[0] ? target : "the statement's name");
        how(r, "results.append({\"score\": score})   # the numbers only; a copy to reuse: its state_dict on the CPU or "
               "on disk");
        how(r, "del %s   # before the next copy.deepcopy(%s): one copy alive at a time", target[0] ? target : "copy",
            src[0] ? src : "model");
        return true;
    }
    /* a growth that is copies of one model (growth.copies_kept): a model built anew each iteration while something
     * keeps every earlier one (a result that keeps its calculator or pipeline) */
    int cg = copies_group(x);
    if (grew && cg >= 0 && g->copies_kept) {
        const og_roles_t *ro = &x->rec->memory.fw.roles;
        char cls[sizeof ro->models[0].cls], names[sizeof ro->models[0].names];
        og_cpy(cls, sizeof cls, ro->models[cg].cls, sizeof cls);
        og_cpy(names, sizeof names, ro->models[cg].names, sizeof names);
        why(r,
            "%d copies of %s (%s of parameters each, %s beyond the first) are alive%s%s%s: the low point rose "
            "from %s to %s, in %s steps. Each iteration builds the model anew and something keeps every earlier "
            "copy. Build it once, before the loop, and reuse it; and keep results without the model they came "
            "from.",
            ro->models[cg].count, cls[0] ? cls : "one model", og_hb((double)ro->models[cg].bytes).s,
            og_hb((double)x->f->roles.model_copies).s, names[0] ? ", reached by the names " : "", names,
            names[0] ? " (and what they hold)" : "", og_hb(first).s, og_hb(last).s, steps);
        how(r, "model = build_model(...)   # once, before the loop: every iteration uses the same one");
        how(r, "results.append(result)   # only after dropping its reference to the model (result.model = None, "
               "atoms.calc = None), or copy the numbers out");
        return true;
    }
    /* outputs kept with their graphs alive: read by the adapter (then also as a growth, one per iteration), or
     * inferred in an evaluation from a holder kept across calls */
    bool by_graphs = grew && g->marker == OG_MARK_KEPT_GRAPHS;
    if ((!grew || by_graphs) && x->f->roles.kept_graphs && og_covers(x, (double)x->f->roles.kept_graphs)) {
        const og_role_facts_t *kf = &x->f->roles;
        const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[kf->graph_holder];
        char lb[160], name[sizeof h->name];
        const char *holder = holder_label(x, kf->graph_holder, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        if (kf->graphs_history) {
            why(r,
                "IPython's output history, %s, keeps %llu cell %s alive (read by the adapter): a model's output "
                "displayed by a cell keeps the activations of the pass that made it, about %s of the %s in all. Drop "
                "them from the history, and look at outputs without a graph.",
                holder ? holder : "Out", (unsigned long long)h->tensors,
                og_plural((long long)h->tensors, "result with its autograd graph",
                          "results with their autograd graphs"),
                og_hb((double)kf->kept_graphs).s, og_hb((double)kf->act).s);
            how(r, "Out.clear(); _ = __ = ___ = None   # or %%reset -f out; also del _5 for each numbered result");
            how(r,
                "%swith torch.no_grad(): model(xb).shape   # a quick look keeps no graph; a cell ending in ; keeps "
                "nothing",
                pt(x));
        } else if (kf->graphs_measured) {
            why(r,
                "%s holds %llu outputs whose autograd graphs are alive (read by the adapter): each keeps the "
                "activations of the pass that made it, about %s of the %s in all. Store them detached, or build no "
                "graph for them.",
                holder ? holder : "A holder", (unsigned long long)h->tensors, og_hb((double)kf->kept_graphs).s,
                og_hb((double)kf->act).s);
            how(r, "%s.append(out.detach())   # the value without its graph (.item() for a number)",
                name[0] ? name : "kept");
            how(r, "%swith torch.no_grad():   # around the pass whose outputs are only stored (a rollout, metrics)",
                pt(x));
        } else {
            why(r,
                "Autograd is on in this evaluation, and %s, kept across calls, holds %llu tensors of earlier batches: "
                "each (a loss, an output) is the root of its batch's graph, so those batches' activations stay alive, "
                "about %s of the %s.",
                holder ? holder : "a holder", (unsigned long long)h->tensors, og_hb((double)kf->kept_graphs).s,
                og_hb((double)kf->act).s);
            how(r, "%s: keep loss.item() (a number), or output.detach().cpu(), not the tensor: its graph goes",
                name[0] ? name : "the holder");
            how(r, "%swith torch.no_grad():   # and model.eval(): the evaluation builds no graph at all", pt(x));
        }
        return true;
    }
    /* a caller's local keeping one record per call of the running code (growth by records): name it and keep the
     * records' numbers or host copies, not the GPU objects each call made */
    if (grew && g->marker == OG_MARK_KEPT_RECORDS) {
        const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[g->holder];
        char lb[160], name[sizeof h->name];
        const char *holder = holder_label(x, g->holder, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        why(r,
            "%s keeps one record for every call of the running code: %ld records of about %s each, %s in all, and "
            "the call under way builds the next. Store each record's numbers or host copies, and let the GPU objects "
            "the call made go when it returns.",
            holder ? holder : "A caller's local", g->seen - 1, og_hb((double)g->per_step).s, og_hb((double)g->rise).s);
        how(r,
            "%s[key] = {k: v.cpu() for k, v in out.items()}   # host copies (a metric: .compute().cpu()), or .item()",
            name[0] ? name : "results");
        how(r, "%sdel out   # the call's own GPU objects once stored; or reuse one metric object with .reset()", pt(x));
        return true;
    }
    if (!grew && og_checkpoint_kept(x)) {
        checkpoint_kept_why(x, r);
        char name[sizeof x->rec->memory.fw.roles.holders[0].name];
        og_cpy(name, sizeof name, x->rec->memory.fw.roles.holders[x->f->roles.ckpt_holder].name, sizeof name);
        why(r, " Drop it once loaded.");
        how(r, "%sdel %s   # right after model.load_state_dict(...) and optimizer.load_state_dict(...)", pt(x),
            name[0] ? name : "ckpt");
        how(r, "%sgc.collect(); torch.cuda.empty_cache()   # if a reference cycle still holds it", pt(x));
        return true;
    }
    if (!grew && og_kept_holder(x)) {
        const og_role_facts_t *kf = &x->f->roles;
        const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[kf->keeper];
        char lb[160], name[sizeof h->name];
        const char *holder = holder_label(x, kf->keeper, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        r->saving = "All that the holder keeps on the GPU";
        why(r,
            "%s keeps %s on the GPU across calls%s%llu tensor%s): more than is missing, and many times the %s of "
            "cached splinters, which defragmented would give the job a few allocations more beside it. Keep on "
            "the GPU only what the next step computes with.",
            holder ? holder : "A holder", og_hb((double)kf->keeper_bytes).s, " (", (unsigned long long)h->tensors,
            h->tensors == 1 ? "" : "s", og_hb((double)x->cached).s);
        keep_less_how(x, r, name[0] ? name : "kept", one_tensor(h));
        return true;
    }
    if (!grew && og_dominant_holder(x)) {
        const og_role_facts_t *kf = &x->f->roles;
        const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[kf->dominant];
        char lb[160], name[sizeof h->name];
        const char *holder = holder_label(x, kf->dominant, lb, sizeof lb);
        og_cpy(name, sizeof name, h->name, sizeof name);
        r->saving = "All that the holder keeps on the GPU";
        why(r,
            "%s holds %s on the GPU in %llu tensor%s: more than the parameters, the gradients, the optimizer state or "
            "the running pass, the largest thing on the device. Keep there only what the next step computes with.",
            holder ? holder : "A holder", og_hb((double)h->bytes).s, (unsigned long long)h->tensors,
            h->tensors == 1 ? "" : "s");
        keep_less_how(x, r, name[0] ? name : "kept", one_tensor(h));
        return true;
    }
    if (!grew && og_previous_copy(x) && x->f->roles.unreached_copies) {
        why(r,
            "%s of parameters belong to a model of the running one's class that no name of the running code reaches "
            "and that does not run, with whatever gradients and optimizer state it kept: a previous fold's or "
            "trial's. `del` and empty_cache() free nothing while something still refers to it: a reference cycle "
            "(a callback pointing back at its trainer) waits for the garbage collector, a hook or a closure keeps it.",
            og_hb((double)x->f->roles.unreached_copies).s);
        how(r,
            "%sdel model, optimizer, trainer; import gc; gc.collect(); torch.cuda.empty_cache()   # after each fold "
            "or trial, before the next is built",
            pt(x));
        how(r,
            "%sbreak the cycle: trainer.callbacks.clear() at the end of fit, or callbacks keep a "
            "weakref.proxy(trainer)",
            pt(x));
        return true;
    }
    if (!grew && og_previous_copy(x)) {
        previous_copy_why(x, r);
        why(r, " Free it before building the new one.");
        how(r, "%sdel model, optimizer   # the previous run's names (and any outputs, losses kept from it)", pt(x));
        how(r, "sys.last_traceback = sys.last_value = None   # in Jupyter: %%reset -f, or %%xdel NAME; the traceback "
               "of an interrupted cell keeps its frames alive");
        how(r, "%simport gc; gc.collect(); torch.cuda.empty_cache()   # then run the cell again", pt(x));
        return true;
    }
    if (first >= 0 && last >= 0 && kept_on_purpose && og_generation_growth(x))
        why(r,
            "The low point rose (%s), from %s to %s, about %s per step, within a generation: its KV cache "
            "grows by a position per new token for every sequence and beam, its working set, not a leak.",
            steps ? steps : "most steps", og_hb(first).s, og_hb(last).s, og_hb(step > 0 ? step : 0).s);
    else if (first >= 0 && last >= 0 && kept_on_purpose)
        why(r,
            "The low point rose from step to step (%s), from %s to %s, about %s per step, with autograd off: no "
            "graph is kept, so most often this is a KV cache growing with every generated token (batch x tokens) "
            "or outputs collected on the GPU.",
            steps ? steps : "most steps", og_hb(first).s, og_hb(last).s, og_hb(step > 0 ? step : 0).s);
    else if (first >= 0 && last >= 0 && g->marker == OG_MARK_OPTIMIZER_STEP)
        why(r,
            "Right after each optimizer step the framework's allocated memory rose (%s), from %s to %s, about %s "
            "per step: something keeps tensors alive from one iteration to the next.",
            steps ? steps : "most steps", og_hb(first).s, og_hb(last).s, og_hb(step > 0 ? step : 0).s);
    else if (first >= 0 && last >= 0)
        why(r,
            "The low point of this process's memory rose from step to step (%s), from %s to %s, about %s per "
            "step: something keeps tensors alive from one iteration to the next.",
            steps ? steps : "most steps", og_hb(first).s, og_hb(last).s, og_hb(step > 0 ? step : 0).s);
    else
        why(r, "Live memory grows over the run: something keeps tensors alive from one iteration to the next.");
    char lb[160];
    const og_role_facts_t *rf = &x->f->roles;
    int hi = rf->grower >= 0 ? rf->grower : rf->keeper; /* the holder of the growth, else the largest kept */
    const char *holder = holder_label(x, hi, lb, sizeof lb);
    if (holder) {
        if (hi == rf->grower && og_generation_growth(x))
            why(r, " Held by %s (%s).", holder, og_hb((double)rf->grower_bytes).s);
        else if (hi == rf->grower)
            why(r, " It is held by %s (%s): release what it keeps and the growth stops.", holder,
                og_hb((double)rf->grower_bytes).s);
        else
            why(r, " The largest holder kept across calls: %s, %s.", holder, og_hb((double)rf->keeper_bytes).s);
        char name[sizeof x->rec->memory.fw.roles.holders[0].name];
        og_cpy(name, sizeof name, x->rec->memory.fw.roles.holders[hi].name, sizeof name);
        how(r, "%s: keep numbers (.item()) or host copies (.detach().cpu()), or empty it each step",
            name[0] ? name : "that holder");
    }
    if (kept_on_purpose) {
        how(r,
            "%smodel.generate(inputs, max_new_tokens=N)   # the KV cache holds batch x (prompt + new tokens) "
            "positions: fewer of either",
            pt(x));
        how(r, "%sresults.append(output.cpu())   # or .tolist(): collect outputs on the host, not the GPU", pt(x));
        how(r,
            "%smodel.generate(inputs, cache_implementation=\"quantized\")   # Hugging Face: a 4-bit KV cache; "
            "or a paged cache server (vLLM)",
            pt(x));
        if (x->trains != -1) /* nobody said whether training steps ran before: their leak fits too */
            how(r, "%slosses.append(loss.detach().item())   # if training steps ran before: keep numbers, not tensors",
                pt(x));
        return true;
    }
    HOWS(x, r, { FW_JAX, "losses.append(float(loss))   # not the device array; or jax.device_get(loss)" },
         { FW_JAX, "big_array.delete()   # free a large jax.Array as soon as it is no longer needed" },
         { FW_JAX, "jax.clear_caches()   # if shapes change every step, compiled programs pile up" },
         { FW_TF, "losses.append(float(loss))   # or loss.numpy(); a kept tensor keeps its memory" },
         { FW_TF, "Build models and tf.function objects once, outside the loop; tf.keras.backend.clear_session() "
                  "between models." },
         { FW_CUPY, "results.append(float(x.sum()))   # or x.get(): keep host copies, not device arrays" },
         { FW_CUPY, "del x; cupy.get_default_memory_pool().free_all_blocks()" },
         { FW_TORCH | PT | TRAIN,
           "losses.append(loss.detach().item())   # not losses.append(loss): that keeps every step's graph" },
         { FW_TORCH | PT | TRAIN, "del outputs, loss   # before the next step; optimizer.zero_grad(set_to_none=True)" },
         { FW_TORCH | PT | SERVE,
           "state.pop(request_id, None)   # when a request or session ends; or an LRU of a fixed size" },
         { FW_TORCH | PT | SERVE,
           "result = output.cpu()   # keep host copies of what a request returns, not GPU tensors" },
         { FW_TORCH | PT, "torch.cuda.memory._record_memory_history(); ...; "
                          "torch.cuda.memory._dump_snapshot(\"snap.pickle\")   # who holds it" });
    return true;
}

static bool b_expandable_segments(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    if (x->has[OG_CAUSE_FRAG]) {
        why(r, "%s is cached but unused", x->cached_known ? og_hb((double)x->cached).s : "Memory");
        if (x->largest_known)
            why(r, " while the largest free block is only %s", og_hb((double)x->largest).s);
        why(r,
            ": with expandable segments the allocator grows its segments in place instead of needing a new "
            "contiguous %s.",
            req_hb(x).s);
    } else
        why(r, "Reduces fragmentation, the usual reason for a failure while memory is cached but unused.");
    if (rec->max_split_set)
        why(r, " max_split_size_mb is set; expandable segments is the more general fix.");
    if (x->fw == OG_FW_UNKNOWN)
        why(r, " This is a PyTorch setting; the framework was not detected.");
    char conf[200];
    if (rec->pytorch_alloc_conf[0])
        og_fmt(conf, sizeof conf, "%.120s,expandable_segments:True", rec->pytorch_alloc_conf);
    else
        og_fmt(conf, sizeof conf, "expandable_segments:True");
    how(r, "%sexport PYTORCH_CUDA_ALLOC_CONF=%s   # before the process starts", pt(x), conf);
    how(r, "Windows PowerShell: $env:PYTORCH_CUDA_ALLOC_CONF=\"%s\"", conf);
    if (!rec->max_split_set)
        how(r, "alternative: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512   # large blocks are not split");
    if (x->fw == OG_FW_UNKNOWN)
        how(r, "JAX: XLA_PYTHON_CLIENT_ALLOCATOR=platform; TensorFlow: TF_GPU_ALLOCATOR=cuda_malloc_async");
    return true;
}

/* PyTorch 1.10 to 2.0 (the ranking offers it there in expandable_segments' place): blocks above the size are never
 * split, so a cached block a large request fits stays whole for it.  The size: the largest power of two MiB at or
 * under the request (blocks of its size stay whole), within 64-512 MiB; 512 without a request */
static bool b_max_split_size_mb(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    uint64_t mb = 512, req_mb = x->req_known ? x->req >> 20 : 0;
    if (req_mb) {
        for (mb = 64; mb < 512 && mb * 2 <= req_mb; mb *= 2)
            ;
    }
    if (x->f->torch_version)
        why(r,
            "PyTorch %d.%d has no expandable_segments (it came in 2.1, and this version stops at start-up on the "
            "key). ",
            x->f->torch_version / 100, x->f->torch_version % 100);
    if (x->has[OG_CAUSE_FRAG]) {
        why(r, "%s is cached but unused", x->cached_known ? og_hb((double)x->cached).s : "Memory");
        if (x->largest_known)
            why(r, " while the largest free block is only %s", og_hb((double)x->largest).s);
        why(r, ": smaller tensors split the large cached blocks. ");
    }
    why(r,
        "With max_split_size_mb:%llu the allocator never splits a cached block larger than %llu MiB, so one "
        "that fits a request of %s stays whole for it.",
        (unsigned long long)mb, (unsigned long long)mb, req_hb(x).s);
    char conf[200];
    if (rec->pytorch_alloc_conf[0])
        og_fmt(conf, sizeof conf, "%.120s,max_split_size_mb:%llu", rec->pytorch_alloc_conf, (unsigned long long)mb);
    else
        og_fmt(conf, sizeof conf, "max_split_size_mb:%llu", (unsigned long long)mb);
    how(r, "%sexport PYTORCH_CUDA_ALLOC_CONF=%s   # before the process starts", pt(x), conf);
    how(r, "Windows PowerShell: $env:PYTORCH_CUDA_ALLOC_CONF=\"%s\"", conf);
    how(r, "or upgrade to PyTorch 2.1 or later: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True grows segments in "
           "place");
    return true;
}

static bool b_inference_mode(const rctx_t *x, og_remedy_t *r)
{
    if (og_feeds_no_backward(x)) { /* measured: nothing on the failing stack backpropagates this pass */
        why(r,
            "The failing forward pass runs with autograd on, yet no frame of the failing stack calls backward (nor "
            "autograd.grad): the graph it records, %s of activations now, waits for a backward that never comes, "
            "and outputs kept from it keep theirs. Run it under torch.inference_mode() and it keeps none; dropout "
            "still samples in train mode (it follows module.train(), not autograd).",
            og_hb((double)x->f->roles.act).s);
        how(r, "%swith torch.inference_mode():   # or torch.no_grad(): scoring, acquisition, sampling passes", pt(x));
        how(r, "%s    outputs = model(inputs)   # leave the model in train() if its dropout must sample", pt(x));
        return true;
    }
    if (x->has[OG_CAUSE_GROWTH] && !x->has[OG_CAUSE_DNF])
        why(r, "An evaluation loop run with autograd on keeps every graph it builds; without it nothing is kept "
               "for backward.");
    else {
        why(r, "For inference or evaluation nothing needs to be kept for backward: typically 30-50%% less memory.");
        if (x->shortfall && x->live && x->live_known) {
            double s = (double)x->shortfall / (double)x->live;
            why(r, " %s is missing, %s of the %s live: %s.", og_hb((double)x->shortfall).s,
                og_pct((double)x->shortfall, (double)x->live).s, og_hb((double)x->live).s,
                s <= 0.30   ? "likely enough"
                : s <= 0.50 ? "may be enough"
                            : "not enough alone");
        } else if (x->shortfall && x->tracked) {
            /* how much of what is held is in use was not measured: size it against what is held */
            double s = (double)x->shortfall / (double)x->tracked;
            why(r, " %s is missing, %s of the %s this process holds (in use or cached: not measured): %s.",
                og_hb((double)x->shortfall).s, og_pct((double)x->shortfall, (double)x->tracked).s,
                og_hb((double)x->tracked).s,
                s <= 0.15   ? "likely enough"
                : s <= 0.30 ? "may be enough"
                            : "not enough alone");
        }
    }
    why(r, " Training code that calls backward cannot use it.");
    if (x->fw == OG_FW_TENSORFLOW) {
        how(r, "outputs = model(inputs, training=False)   # outside tf.GradientTape");
        how(r, "model.predict(dataset)   # batched inference without gradients");
    } else {
        how(r, "%swith torch.inference_mode():   # or torch.no_grad(); and model.eval()", pt(x));
        how(r, "%s    outputs = model(inputs)", pt(x));
        if (x->fw == OG_FW_UNKNOWN)
            how(r, "TensorFlow: model(inputs, training=False) outside tf.GradientTape.");
    }
    return true;
}

static bool b_mixed_precision(const rctx_t *x, og_remedy_t *r)
{
    bool bf16 = x->cc_known && x->cc >= 80, fp16 = x->cc_known && x->cc < 80, old = x->cc_known && x->cc < 70;
    if (x->f->roles.scaler_only && x->autocast != 1)
        why(r, "The program scales its loss with a GradScaler but never enters autocast: the scaler is there, the "
               "half precision is not, and every activation is float32. ");
    if (old)
        why(r,
            "Compute capability %d.%d is older than Volta: no tensor cores, so half precision brings little "
            "speed and fp16 is fragile; ranked last.",
            x->cc / 10, x->cc % 10);
    else if (bf16)
        why(r,
            "Half precision halves activation storage; this GPU (cc %d.%d) supports bf16, which needs no loss "
            "scaling.",
            x->cc / 10, x->cc % 10);
    else if (fp16)
        why(r,
            "Half precision halves activation storage; this GPU (cc %d.%d) has no bf16 (needs 8.0+): use fp16 "
            "with loss scaling.",
            x->cc / 10, x->cc % 10);
    else
        why(r, "Half precision halves activation storage; bf16 needs compute capability 8.0+, otherwise use fp16 "
               "with loss scaling.");
    activations_vs_shortfall(x, r, 0.5, "halving them");
    const char *dt = bf16 ? "bfloat16" : "float16";
    switch (x->fw) {
    case OG_FW_JAX:
        how(r,
            "Flax: nn.Dense(features, dtype=jnp.%s, param_dtype=jnp.float32)   # compute in half, keep fp32 "
            "params",
            dt);
        if (!bf16)
            how(r, "fp16 loss scaling with jmp: policy = jmp.get_policy(\"params=float32,compute=float16,"
                   "output=float32\"); jmp.DynamicLossScale");
        else
            how(r, "or cast for the forward pass: jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)");
        break;
    case OG_FW_TENSORFLOW:
        if (bf16)
            how(r, "tf.keras.mixed_precision.set_global_policy(\"mixed_bfloat16\")   # or \"mixed_float16\"");
        else
            how(r, "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")   # Keras fit() scales the loss");
        how(r, "custom loops: optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)");
        break;
    case OG_FW_CUPY:
        how(r, "x = x.astype(cupy.float16)   # half the bytes per element; check the precision you need");
        break;
    default:
        if (!fp16)
            how(r, "%swith torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):   # cc 8.0+", pt(x));
        if (!bf16) {
            how(r, "%sscaler = torch.amp.GradScaler(\"cuda\")   # fp16 needs loss scaling", pt(x));
            how(r, "%swith torch.autocast(device_type=\"cuda\", dtype=torch.float16): loss = model(batch).loss", pt(x));
            how(r, "%sscaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()", pt(x));
        } else
            how(r, "%s    loss = model(batch).loss   # then loss.backward() as usual", pt(x));
        if (x->fw == OG_FW_UNKNOWN)
            how(r, "TensorFlow: tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")");
        break;
    }
    return true;
}

static bool b_smaller_batch(const rctx_t *x, og_remedy_t *r)
{
    if (og_attribution_pass(x)) { /* the batch is the method's copies of one input */
        r->title = "Smaller internal batch (the attribution's samples in chunks)";
        r->cost = "More, smaller passes; the same attribution";
        why(r, "The pass asks for gradients through a model in eval mode that nothing trains: an attribution, whose "
               "batch is the method's samples of one input (integrated gradients' steps, SmoothGrad's noisy copies) "
               "run at once. In chunks the attribution is the same, where half precision changes the gradients it "
               "reads.");
        activations_vs_shortfall(x, r, 0.5, "halving the chunk");
        HOWS(x, r,
             { PT, "ig.attribute(inputs, n_steps=200, internal_batch_size=16)   # Captum: steps in chunks of 16" },
             { PT, "NoiseTunnel(saliency).attribute(x, nt_samples=50, nt_samples_batch_size=10)" });
        return true;
    }
    /* autograd off at the failure: generation, inference or a validation pass, where the batch shrinks
     * without gradient accumulation */
    if (x->grad == -1 && (x->fw == OG_FW_PYTORCH || x->fw == OG_FW_UNKNOWN)) {
        if (x->trains == 1)
            why(r, "Autograd was off at the failure inside a training job: a validation or evaluation pass. Its "
                   "batch can be smaller than training's, with nothing to accumulate; memory falls with it.");
        else if (x->f->phase == OG_JP_generation && x->f->roles.gen_fixed_inputs && x->f->roles.gen_inputs > 1) {
            const og_role_facts_t *ro = &x->f->roles;
            why(r, "The generate() call decodes %llu inputs at once", (unsigned long long)ro->gen_inputs);
            if (ro->num_beams > 1)
                why(r, " (x %d beams: %llu sequences)", ro->num_beams,
                    (unsigned long long)ro->gen_inputs * (unsigned long long)ro->num_beams);
            why(r, ": the encoder's output and the KV cache of every one of them are made together. Each input has a "
                   "size the model fixes, so the number of inputs per call is what grows: fixed-size chunks keep "
                   "every call's memory the same, with the same outputs.");
        } else if (x->f->phase == OG_JP_generation)
            why(r, "Without autograd what grows with the batch is the activations and the KV cache of every "
                   "sequence being generated: half the sequences at once, half of it; no accumulation is needed.");
        else
            why(r, "Without autograd what grows with the batch is the activations: half the samples at once, half "
                   "of them; no accumulation is needed.");
        activations_vs_shortfall(x, r, 0.5, "halving the batch");
        r->title = "Smaller batch (fewer samples at once)";
        r->cost = "More, smaller calls; nothing to accumulate without training";
        if (x->trains == 1)
            HOWS(x, r, { PT, "val_loader = DataLoader(val_set, batch_size=train_batch_size // 2)   # or smaller" });
        else if (x->f->phase == OG_JP_generation && x->f->roles.gen_fixed_inputs && x->f->roles.gen_inputs > 1)
            HOWS(x, r,
                 { PT, "for chunk in pixel_values.split(16): ids.extend(model.generate(chunk, ...))   # 16 inputs "
                       "per call, whatever a page or a batch holds" });
        else if (x->f->phase == OG_JP_generation)
            HOWS(x, r,
                 { PT, "for i in range(0, len(prompts), 16): model.generate(prompts[i:i + 16], ...)   # fewer "
                       "sequences per call" });
        else
            HOWS(x, r,
                 { PT, "outputs = [model(chunk) for chunk in inputs.split(n)]   # fewer samples per call (a dict of "
                       "inputs: split each tensor alike)" },
                 { PT,
                   "DataLoader(dataset, batch_size=batch_size // 2)   # evaluation: no gradient accumulation needed" });
        return true;
    }
    if (x->f->roles.per_sample) {
        /* DP-SGD: the per-example gradients are the physical batch times the trained parameters */
        const og_role_facts_t *ro = &x->f->roles;
        why(r, "%s of gradients are kept one per example", og_hb((double)ro->per_sample).s);
        if (ro->per_sample_n > 1)
            why(r, " (%d examples, %s each)", ro->per_sample_n, og_hb((double)ro->per_sample / ro->per_sample_n).s);
        why(r, ": they grow with the physical batch, not with the length of an input. Keep the logical batch (the "
               "privacy accounting's) and bound the physical one; the per-example gradients and the activations "
               "fall with it.");
        HOWS(x, r, { PT, "from opacus.utils.batch_memory_manager import BatchMemoryManager" },
             { PT, "with BatchMemoryManager(data_loader=train_loader, max_physical_batch_size=16, "
                   "optimizer=optimizer) as loader:" },
             { PT, "    for batch in loader: ...   # the optimizer steps once per logical batch" });
        return true;
    }
    why(r, "Activation memory grows linearly with the batch size; gradient accumulation keeps the effective "
           "batch.");
    activations_vs_shortfall(x, r, 0.5, "halving the batch");
    HOWS(x, r, { FW_JAX, "batch_size //= 2" },
         { FW_JAX, "optimizer = optax.MultiSteps(optax.adamw(lr), every_k_schedule=2)   # same effective batch" },
         { FW_TF, "model.fit(x, y, batch_size=batch_size // 2)" },
         { FW_TF, "optimizer = tf.keras.optimizers.AdamW(lr, gradient_accumulation_steps=2)   # Keras 3" },
         { FW_CUPY, "for chunk in cupy.array_split(x, 2): ...   # process the data in smaller pieces" },
         { FW_TORCH | PT, "batch_size //= 2; accum_steps = 2   # effective batch = batch_size x accum_steps" },
         { FW_TORCH | PT, "loss = model(batch).loss / accum_steps; loss.backward()" },
         { FW_TORCH | PT, "if (step + 1) % accum_steps == 0: optimizer.step(); optimizer.zero_grad()" });
    return true;
}

/* a peak from one batch (facts: outlier) in a pass with autograd on: the sentence that says so, by what was compared
 * (the request with the earlier steps' largest allocation, or the whole pass with the most they held); false and
 * nothing written otherwise */
static bool outlier_why(const rctx_t *x, og_remedy_t *r, const char *what)
{
    const og_outlier_facts_t *o = &x->f->outlier;
    if (x->primary != OG_CAUSE_DNF || !o->holds || x->grad == -1)
        return false;
    if (o->pass_peak && o->held_before > o->floor) {
        double now = (double)x->tracked + (double)x->req - (double)o->floor,
               before = (double)o->held_before - (double)o->floor;
        why(r,
            "This step's pass holds %s with its request, %.1fx the most an earlier one held (%s) in a run of %llu "
            "optimizer steps that gave their memory back (above the %s kept between steps): one %s than the rest, "
            "not a leak.",
            og_hb(now).s, now / before, og_hb(before).s, (unsigned long long)x->f->roles.steps_made,
            og_hb((double)o->floor).s, what);
    } else if (o->prev_max)
        why(r,
            "The failing request, %s, is %.0fx the largest allocation of the earlier steps (%s), which had "
            "freed what they made: one %s than the rest, not a leak.",
            req_hb(x).s, (double)x->req / (double)o->prev_max, og_hb((double)o->prev_max).s, what);
    else
        return false;
    return true;
}

static bool b_shorter_sequences(const rctx_t *x, og_remedy_t *r)
{
    if (outlier_why(x, r, "batch far longer")) {
        why(r, " Cap the length (truncate or split long samples) or batch by a token budget.");
        how(r, "tokenizer(texts, truncation=True, max_length=L)   # or split documents longer than L into pieces");
        how(r, "Batch by a token budget: add samples while sum(lengths) <= N tokens (fixed memory per step).");
        how(r, "Sort or bucket samples by length so one long sample does not pad a whole batch.");
        return true;
    }
    if (og_generation_growth(x) && !x->larger_than_device) {
        const og_growth_facts_t *g = &x->f->growth;
        bool b = g->gen_built;
        double per = (double)(b ? g->gen_per_step : g->per_step), lo = (double)(b ? g->gen_first : g->first_low),
               hi = (double)(b ? g->gen_last : g->last_low);
        r->title = "Fewer new tokens (max_new_tokens) or beams";
        r->cost = "Shorter outputs, or a narrower beam search";
        /* the rise is the KV cache only where the roles measured a cache holding half of it: a generation asked for
         * per-token scores or hidden states keeps those too, and a cache in the library's own locals is not read */
        uint64_t kv = x->f->roles.known ? x->f->roles.purpose_bytes[OG_PURPOSE_kv_cache] : 0;
        if (hi > lo && 2 * (double)kv >= hi - lo)
            why(r,
                "A generation's KV cache holds batch x beams x (prompt + new tokens) positions and grew by about %s "
                "per step, from %s to %s: fewer new tokens or beams (or a shorter prompt) cut it in proportion.",
                og_hb(per).s, og_hb(lo).s, og_hb(hi).s);
        else
            why(r,
                "A generation keeps, for every new token of every beam and sequence, its KV cache and whatever else it "
                "was asked to return per token; what it held grew by about %s per step, from %s to %s: fewer new "
                "tokens or beams (or a shorter prompt) cut it in proportion.",
                og_hb(per).s, og_hb(lo).s, og_hb(hi).s);
        if (x->shortfall && per > 0) {
            double tokens = (double)x->shortfall / per;
            if (tokens < 1)
                why(r, " %s more was needed: less than one token's worth.", og_hb((double)x->shortfall).s);
            else if (tokens < 1.5)
                why(r, " %s more was needed: about one token's worth.", og_hb((double)x->shortfall).s);
            else
                why(r, " %s more was needed: about %.0f tokens' worth.", og_hb((double)x->shortfall).s, tokens);
        }
        how(r, "%smodel.generate(inputs, max_new_tokens=N // 2)   # the cache grows by one position per new token",
            pt(x));
        how(r, "%smodel.generate(inputs, num_beams=1)   # or fewer beams: each beam keeps its own cache", pt(x));
        how(r, "tokenizer(prompts, truncation=True, max_length=L)   # a shorter prompt starts a smaller cache");
        return true;
    }
    if (x->larger_than_device && x->grad == -1) {
        if (x->f->roles.request_shape == OG_REQ_CUBE)
            why(r,
                "Autograd was off: one input needs %s in one operation over every triple of its positions, more "
                "than the card; that grows with the cube of its length. A shorter input (a cropped sequence) "
                "shrinks it, if the data allows.",
                req_hb(x).s);
        else
            why(r,
                "Autograd was off: one input (a prompt) needs %s, more than the card; attention without a fused "
                "kernel grows with the square of its length. Cap the input length the server accepts.",
                req_hb(x).s);
        how(r, "Reject or truncate inputs above a maximum (e.g. max_input_length / max_model_len in the server).");
        how(r, "tokenizer(prompt, truncation=True, max_length=L)");
        return true;
    }
    why(r, "Without a fused attention kernel attention memory grows with the square of the sequence length: "
           "2048 -> 1024 tokens cuts it by about 75%%.");
    if (x->shortfall)
        why(r, " %s more is needed.", og_hb((double)x->shortfall).s);
    how(r, "tokenizer(texts, truncation=True, max_length=1024)   # Hugging Face tokenizers");
    how(r, "Lower max_seq_len / block_size in the training or serving config.");
    if (x->fw == OG_FW_TENSORFLOW)
        how(r, "tf.keras.utils.pad_sequences(seqs, maxlen=1024, truncating=\"post\")");
    if (x->fw == OG_FW_JAX)
        how(r, "Pad to a few fixed lengths (e.g. 512/1024) so shorter batches do not recompile.");
    return true;
}

/* the models have no attention layer (roles.attention_modules 0): the input is a graph, a mesh, a point cloud, an
 * image or a long signal (a recording, a time series), whose size (not a token length) the activations follow;
 * cutting it means partitioning, tiling or windowing */
static void operation_site(const rctx_t *x, char *buf, size_t n);

static bool b_cap_input_size(const rctx_t *x, og_remedy_t *r)
{
    if (x->f->roles.operation == OG_OP_graph_messages) { /* a graph network's message passing */
        char site[200];
        operation_site(x, site, sizeof site);
        r->saving = "The graph's share of every layer: a batch's sampled subgraph instead of the whole graph";
        why(r,
            "The failing request, %s, is made by a graph network's message passing%s: a tensor per edge (or node) of "
            "the graph it was given, and every layer after it makes its own. Train and infer on sampled subgraphs "
            "(a batch of target nodes and a capped number of neighbours per hop) or on clusters of the graph, and "
            "cap the fan-out of hub nodes: each step then holds a batch's edges, not the graph's.",
            req_hb(x).s, site);
        if (x->shortfall)
            why(r, " %s more is needed.", og_hb((double)x->shortfall).s);
        how(r,
            "%sloader = NeighborLoader(data, num_neighbors=[15, 10], batch_size=1024, input_nodes=train_idx)   # "
            "PyTorch Geometric",
            pt(x));
        how(r, "%sClusterLoader(ClusterData(data, num_parts=1500), batch_size=20)   # or GraphSAINT's samplers", pt(x));
        how(r, "dgl.dataloading.NeighborSampler([15, 10])   # DGL; a hub node's neighbours capped the same way");
        return true;
    }
    if (outlier_why(x, r, "input far larger"))
        why(r, " ");
    if (og_forward_inputs_fill_card(x)) {
        const og_role_facts_t *ro = &x->f->roles;
        why(r,
            "The inputs the failing statement hands the model (%s) already hold %s, %.0f%% of the card, and the "
            "model's own first operations copy them (a resize, a cast to float): downscale or tile them before "
            "they reach the GPU. ",
            ro->stmt_input_names, og_hb((double)ro->stmt_inputs).s,
            100.0 * (double)ro->stmt_inputs / (double)x->capacity);
    }
    why(r, "The models have no attention layer: activations follow the input's size (nodes, points, pixels, samples "
           "of a signal); partition, subsample, tile or window inputs above what fit.");
    if (x->shortfall)
        why(r, " %s more is needed.", og_hb((double)x->shortfall).s);
    how(r, "Skip or split samples above a size budget in the Dataset (count nodes/edges, points, pixels or "
           "signal samples).");
    how(r, "Partition a large graph or mesh into subgraphs (with halo nodes) and run them one at a time.");
    how(r, "Subsample a dense point cloud (grid or voxel subsampling, a max points per input) or crop it.");
    how(r, "Tile or downscale an oversized image or volume (overlapping tiles, stitched afterwards).");
    how(r, "Run a long recording or series in overlapping windows (a few seconds of audio each) and join the "
           "outputs (overlap-add, or the codec's own chunked encode).");
    return true;
}

static bool b_gradient_checkpointing(const rctx_t *x, og_remedy_t *r)
{
    why(r, "Activations are recomputed during backward instead of stored: 50-70%% of them freed for about 30%% "
           "more step time; best for long-context transformers.");
    activations_vs_shortfall(x, r, 0.6, "freeing 60% of them");
    HOWS(x, r, { FW_JAX, "block_fn = jax.checkpoint(block_fn)   # a.k.a. jax.remat; Flax: nn.remat(Block)" },
         { FW_TF, "y = tf.recompute_grad(block)(x)   # recompute this block's activations in backward" },
         { FW_TORCH | FW_CUPY | PT, "model.gradient_checkpointing_enable()   # Hugging Face models" },
         { FW_TORCH | FW_CUPY | PT,
           "from torch.utils.checkpoint import checkpoint; x = checkpoint(block, x, use_reentrant=False)" },
         { FW_UNKNOWN, "JAX: jax.checkpoint(block_fn); TensorFlow: tf.recompute_grad(block)" });
    return true;
}

static bool b_flash_attention(const rctx_t *x, og_remedy_t *r)
{
    bool old = x->cc_known && x->cc < 80;
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    /* what the failing operation makes whole that a fused kernel never makes (roles.operation, its frame) */
    static const struct {
        enum og_operation op;
        const char *what, *fused;
    } whole[] = {
        { OG_OP_attention, "an attention score matrix computed eagerly", "a fused kernel never makes it" },
        { OG_OP_attention_mask, "a dense attention mask made whole",
          "FlashAttention's variable-length kernel takes each sequence's length (position_ids of a packed batch) and "
          "never makes one" },
    };
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++) {
        if (x->f->roles.operation != whole[i].op)
            continue;
        char fn[sizeof ro->op_frame.function], file[sizeof ro->op_frame.file];
        og_cpy(fn, sizeof fn, ro->op_frame.function, sizeof fn);
        og_cpy(file, sizeof file, ro->op_frame.file, sizeof file);
        why(r, "The failing %s is %s (%s, %s:%d): %s. ", og_hb((double)x->req).s, whole[i].what, fn, og_base_name(file),
            ro->op_frame.line, whole[i].fused);
    }
    /* nn.MultiheadAttention asked for its weights (the row read need_weights=True): PyTorch 2 runs its fused
     * kernel when they are not asked for, whatever the card */
    char arg[sizeof ro->op_argument];
    og_cpy(arg, sizeof arg, ro->op_argument, sizeof arg);
    bool mha_weights = x->f->roles.operation == OG_OP_attention && !strcmp(arg, "need_weights=True");
    if (mha_weights)
        why(r, "It was called with need_weights=True (MultiheadAttention's default), which makes every head's "
               "softmax whole; without weights PyTorch 2 runs the fused kernel. ");
    if (old)
        why(r,
            "FlashAttention-2 needs compute capability 8.0+ (this GPU: %d.%d); a memory-efficient SDPA kernel "
            "still makes attention memory linear in the sequence length.",
            x->cc / 10, x->cc % 10);
    else
        why(r, "Fused attention keeps attention memory linear instead of quadratic in the sequence length: 4-10x "
               "less above 4096 tokens, little for short sequences.");
    switch (x->fw) {
    case OG_FW_JAX:
        how(r, "jax.nn.dot_product_attention(q, k, v, implementation=\"cudnn\")   # fused; cc 8.0+");
        break;
    case OG_FW_TENSORFLOW:
        how(r, "TensorFlow has no built-in FlashAttention: use your model library's fused attention, or shorter "
               "sequences.");
        break;
    default:
        if (mha_weights) {
            how(r, "out, _ = mha(query, key, value, need_weights=False)   # PyTorch 2.0+: the fused kernel, no "
                   "L x L weights");
            break;
        }
        if (old) {
            how(r, "%sAutoModelForCausalLM.from_pretrained(name, attn_implementation=\"sdpa\")", pt(x));
            how(r, "%storch.nn.functional.scaled_dot_product_attention(q, k, v)   # picks a memory-efficient kernel",
                pt(x));
        } else {
            how(r, "pip install flash-attn --no-build-isolation");
            how(r,
                "%sAutoModelForCausalLM.from_pretrained(name, attn_implementation=\"flash_attention_2\", "
                "torch_dtype=torch.bfloat16)",
                pt(x));
            if (x->f->roles.operation == OG_OP_attention_mask)
                how(r,
                    "%sDataCollatorWithFlattening()   # packed rows by position_ids, no mask: flash_attention_2 "
                    "reads each document's length",
                    pt(x));
        }
        break;
    }
    return true;
}

static bool b_quantization(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->known && ro->params) {
        /* the weights measured: 4-bit keeps an eighth of float32 weights, a quarter of 16-bit ones, half of int8 */
        double freed = ro->quant_frees;
        why(r, "The model's weights are %s of the %s held (measured", og_hb((double)ro->params).s,
            og_hb((double)x->footprint).s);
        if (ro->params_fp32)
            why(r, "; %s of them float32", og_hb((double)ro->params_fp32).s);
        if (ro->params_8bit)
            why(r, "; %s already int8 or float8", og_hb((double)ro->params_8bit).s);
        if (ro->params_packed)
            why(r, "; %s already packed 4-bit (uint8)", og_hb((double)ro->params_packed).s);
        why(r, "): 4-bit frees at most about %s of them", og_hb(freed).s);
        if (x->shortfall)
            why(r, ", %s the %s missing.", freed >= (double)x->shortfall ? "enough for" : "short of",
                og_hb((double)x->shortfall).s);
        else
            why(r, ".");
    } else {
        why(r, "For inference the weights dominate: 8-bit halves and 4-bit quarters them (a 70B model: 140 GB in "
               "fp16, ~70 GB in int8, ~35-40 GB in 4-bit).");
        if (x->shortfall && 2.0 * (double)x->shortfall <= (double)x->footprint)
            why(r, " 8-bit covers the %s missing if at least %s of the %s held are fp16 weights.",
                og_hb((double)x->shortfall).s, og_hb(2.0 * (double)x->shortfall).s, og_hb((double)x->footprint).s);
        else if (x->shortfall)
            why(r,
                " 8-bit alone cannot cover the %s missing: even if all %s held were fp16 weights it would free half "
                "of that; 4-bit frees about three quarters.",
                og_hb((double)x->shortfall).s, og_hb((double)x->footprint).s);
    }
    const char *cdt = x->cc_known && x->cc < 80 ? "float16" : "bfloat16";
    if (x->fw == OG_FW_JAX || x->fw == OG_FW_TENSORFLOW)
        how(r, "Load pre-quantized int8/4-bit weights (AWQ, GPTQ) in a runtime that serves them, e.g. vLLM; the "
               "PyTorch route is below.");
    how(r,
        "%sbnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", "
        "bnb_4bit_compute_dtype=torch.%s)",
        x->fw == OG_FW_PYTORCH ? "" : "PyTorch: ", cdt);
    how(r, "%smodel = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb)   # or load_in_8bit=True",
        x->fw == OG_FW_PYTORCH ? "" : "PyTorch: ");
    how(r, "Or load a checkpoint already quantized with AWQ or GPTQ.");
    return true;
}

static bool b_allocate_on_model_device(const rctx_t *x, og_remedy_t *r)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    int dev = x->rec->event.device, gpu = ro->stmt_model_device;
    char model[sizeof ro->stmt_model_name], target[sizeof ro->stmt_target], file[sizeof ro->stmt.file];
    og_cpy(model, sizeof model, ro->stmt_model_name, sizeof model);
    og_cpy(target, sizeof target, ro->stmt_target, sizeof target);
    og_cpy(file, sizeof file, ro->stmt.file, sizeof file);
    why(r,
        "The failing statement (%s:%d) reads %s, whose parameters are on GPU %d, yet makes its tensor on GPU %d: a "
        "device given as \"cuda\" (or none) is the current device, GPU %d unless the code selects another. Made "
        "beside its model, on GPU %d, it takes nothing here.",
        ro->has_statement ? og_base_name(file) : "?", ro->has_statement ? ro->stmt.line : 0,
        model[0] ? model : "a model", gpu, dev, dev, gpu);
    how(r, "%s%s = ...(..., device=%s.device)   # beside its model, not on the current device", pt(x),
        target[0] ? target : "out", model[0] ? model : "model");
    how(r, "%swith torch.cuda.device(%d): ...   # or torch.cuda.set_device(%d) before building what belongs there",
        pt(x), gpu, gpu);
    return true;
}

static bool b_use_idle_gpu(const rctx_t *x, og_remedy_t *r)
{
    const og_spare_facts_t *s = &x->f->spare;
    const og_role_facts_t *ro = &x->f->roles;
    int idle = s->idle_device, dev = x->rec->event.device;
    if (s->idle_held)
        why(r,
            "GPU %d is visible to this process and it holds only %s there, about %s left free (a card like this "
            "one), while GPU %d ran out (what other processes hold on GPU %d was not measured).",
            idle, og_hb((double)s->idle_held).s, og_hb((double)s->idle_room).s, dev, idle);
    else
        why(r,
            "GPU %d is visible to this process and it holds nothing there, while GPU %d ran out (what other "
            "processes hold on GPU %d was not measured).",
            idle, dev, idle);
    uint64_t movable = add_sat(ro->frozen_models, ro->named_copies);
    if (x->f->parent_only) { /* started on its parent's GPU: the whole program moves, not a part of it */
        why(r,
            " The other memory on GPU %d is this process's parent's (%s): started with GPU %d as its own, this "
            "program runs beside nothing.",
            dev, og_hb((double)x->f->peers_bytes).s, idle);
        how(r,
            "subprocess.Popen(cmd, env={**os.environ, \"CUDA_VISIBLE_DEVICES\": \"%d\"})   # in the parent: the "
            "child's own GPU",
            idle);
        how(r, "CUDA_VISIBLE_DEVICES=%d python this_script.py   # started by hand", idle);
        return true;
    }
    if (movable)
        why(r,
            " %s of models here run beside the one being trained or used (%s): each can run on GPU %d, passing "
            "only its small outputs across.",
            og_hb((double)movable).s,
            ro->frozen_models ? "a frozen one: its forward needs no gradient" : "held by name", idle);
    else
        why(r, " Put part of the work there: a second model, or half of this one's layers.");
    how(r, "%s%s.to(\"cuda:%d\")   # the other model on GPU %d; outputs.to(\"cuda:%d\") before the next step", pt(x),
        ro->frozen_models ? "teacher" : "other_model", idle, idle, dev);
    how(r, "%sfrom_pretrained(name, device_map=\"balanced\")   # one model's layers over both GPUs", pt(x));
    how(r, "CUDA_VISIBLE_DEVICES=%d python other_part.py   # or run that part as its own process on GPU %d", idle,
        idle);
    return true;
}

static bool b_balance_device_map(const rctx_t *x, og_remedy_t *r)
{
    const og_spare_facts_t *s = &x->f->spare;
    const og_role_facts_t *ro = &x->f->roles;
    int dev = x->rec->event.device;
    why(r,
        "GPU %d ran out holding %s of parameters, while this process holds %s on GPU %d, which keeps about %s "
        "free (a card like this one): the model's layers are split unevenly. A balanced split leaves both GPUs "
        "room for the activations and caches that come with the layers.",
        dev, og_hb((double)ro->params).s, og_hb((double)s->held).s, s->device, og_hb((double)s->room).s);
    /* about half of the room moves to the other GPU: what the failing GPU keeps of the weights, in whole GiB */
    double keep = ((double)ro->params - (double)s->room / 2) / GIB;
    how(r, "%sfrom_pretrained(name, device_map=\"balanced\")   # or \"balanced_low_0\": GPU 0 also holds the inputs",
        pt(x));
    if (keep >= 1)
        how(r, "%smax_memory={%d: \"%dGiB\", %d: \"%dGiB\"}   # about: fewer layers on GPU %d, more on GPU %d", pt(x),
            dev, (int)keep, s->device, (int)(((double)x->total - (double)(1ull << 30)) / GIB), dev, s->device);
    HOWS(x, r, { PT, "infer_auto_device_map(model, max_memory=...)   # Accelerate: see the split before loading" });
    return true;
}

static bool b_multi_gpu(const rctx_t *x, og_remedy_t *r)
{
    int n = x->visible;
    if (n > 1) {
        r->title = "Split the work across the visible GPUs";
        if (x->world > 1)
            why(r,
                "This job already runs %ld ranks: data parallelism (DDP) splits only the batch, each GPU still "
                "holds the whole model; tensor or pipeline parallelism splits the model itself.",
                x->world);
        else
            why(r,
                "%d GPUs are visible but one of them ran out: data parallelism (DDP) splits the batch, tensor or "
                "pipeline parallelism splits the model itself.",
                n);
    } else {
        r->title = "Add GPUs and split the model";
        why(r,
            "Only %s GPU is visible: with more, tensor or pipeline parallelism splits the model (e.g. 70B "
            "inference on 2x 80 GB with tensor parallelism).",
            n == 1 ? "one" : "one (or an unknown number of)");
    }
    int k = n > 1 ? n : 2;
    switch (x->fw) {
    case OG_FW_JAX:
        how(r, "mesh = jax.sharding.Mesh(jax.devices(), (\"model\",)); place weights with "
               "NamedSharding(mesh, P(None, \"model\"))");
        break;
    case OG_FW_TENSORFLOW:
        how(r, "strategy = tf.distribute.MirroredStrategy()   # build and compile the model under strategy.scope()");
        break;
    default:
        how(r,
            "%storchrun --nproc_per_node=%d train.py   # with DistributedDataParallel(model, device_ids=[local_rank])",
            pt(x), k);
        how(r, "vllm serve <model> --tensor-parallel-size %d   # inference: the weights are split across GPUs", k);
        how(r, "%sAutoModelForCausalLM.from_pretrained(name, device_map=\"auto\")   # layers spread over the GPUs",
            pt(x));
        how(r, "%snn.DataParallel(model) is the one-line start, but slower than DDP", pt(x));
        break;
    }
    return true;
}

static bool b_zero_fsdp(const rctx_t *x, og_remedy_t *r)
{
    int n = x->visible;
    if (n > 1)
        why(r,
            "For training: with %d GPUs, ZeRO-3 / FSDP full sharding keeps about 1/%d of the parameters, "
            "gradients and optimizer state on each GPU.",
            n, n);
    else
        why(r,
            "For training on several GPUs (only %s visible now): ZeRO-3 / FSDP shard parameters, gradients and "
            "optimizer state, so each GPU holds 1/N of them (70B+ on 8x 80 GB).",
            n == 1 ? "one is" : "one or none");
    int k = n > 1 ? n : 8;
    if (x->fw == OG_FW_JAX) {
        how(r, "Shard parameters and optimizer state over a mesh axis: NamedSharding(mesh, P(\"fsdp\")) on their "
               "largest dimension.");
        return true;
    }
    how(r, "%saccelerate config   # choose FSDP (FULL_SHARD) or DeepSpeed ZeRO stage 3", pt(x));
    how(r, "%saccelerate launch --num_processes %d train.py", pt(x), k);
    HOWS(x, r, { PT, "model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD)   # torch.distributed.fsdp" },
         { ANY, "DeepSpeed config: \"zero_optimization\": {\"stage\": 3}" });
    return true;
}

static bool b_smaller_embedding_tables(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->embedding && ro->params)
        why(r, "%s of the %s of parameters are embedding tables", og_hb((double)ro->embedding).s,
            og_hb((double)ro->params).s);
    else
        why(r, "The embedding tables are most of the model");
    uint64_t sparse_state = 0;
    if (og_sparse_id_tables(x, &sparse_state)) { /* tables of ids a sparse optimizer trains: their rows are the ids */
        why(r,
            ", %d of them, trained by a sparse optimizer (%s of its state): tables of ids, a row per id seen, so they "
            "and the optimizer's moments grow with the ids. A fixed number of rows (ids hashed into buckets, or the "
            "ids not seen lately evicted) bounds both.",
            ro->embedding_tables > 0 ? ro->embedding_tables : 1, og_hb((double)sparse_state).s);
        if (x->shortfall && ro->embedding)
            why(r, " %s more is needed; tables of half the rows free about %s with their state.",
                og_hb((double)x->shortfall).s, og_hb(0.5 * ((double)ro->embedding + (double)sparse_state)).s);
        how(r,
            "%semb = nn.Embedding(n_buckets, dim, sparse=True); rows = ids %% n_buckets   # a fixed table, "
            "whatever the ids",
            pt(x));
        how(r,
            "%sevict ids not seen for N days into a shared row (TorchRec's managed-collision modules keep a fixed "
            "capacity this way)",
            pt(x));
        return true;
    }
    if (ro->embedding_tables > 1)
        why(r, ", %d of them: a categorical column each", ro->embedding_tables);
    why(r, ". A table is rows x dimensions, and its dense gradient and optimizer state repeat it; default size rules "
           "give wide tables to columns of many categories. Fewer dimensions there, or rare categories hashed into "
           "shared rows, shrink all three.");
    if (x->shortfall && ro->embedding)
        why(r, " %s more is needed; tables of half the size free about %s with their gradients.",
            og_hb((double)x->shortfall).s,
            og_hb(ro->params ? 0.5 * (double)ro->embedding * (1.0 + (double)ro->grads / (double)ro->params) : 0).s);
    how(r, "%snn.Embedding(num_categories, 16)   # 16-64 dimensions for a column of many categories", pt(x));
    how(r, "%scode = hash(value) %% n_buckets   # rare categories share rows; or a minimum count for a row of its own",
        pt(x));
    how(r, "%stabular_learner(dls, emb_szs={\"user_id\": 32, \"item_id\": 32})   # fastai: sizes by column name",
        pt(x));
    return true;
}

static bool b_cpu_offload(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (og_embedding_tables(x)) { /* the tables are most of the model: their rows, not the network, are the lever */
        r->title = "Keep the embedding tables off the GPU, or update only the rows a batch touches";
        why(r,
            "%s of the %s of parameters are embedding tables. A dense gradient is the whole table's size whatever the "
            "batch, and Adam keeps two more of it; a batch reads only a few of its rows. Kept in host memory (or "
            "updated sparsely, row by row) the tables stop taking the card.",
            og_hb((double)ro->embedding).s, og_hb((double)ro->params).s);
        how(r,
            "%snn.Embedding(rows, dim, sparse=True); torch.optim.SparseAdam(emb.parameters())   # gradients and "
            "state for the rows a batch touches; a dense optimizer for the rest",
            pt(x));
        how(r,
            "%sTorchRec's EmbeddingBagCollection with FBGEMM (UVM caching: the table in host memory, hot rows on "
            "the GPU)",
            pt(x));
        how(r, "%sor fewer rows: a smaller hash space, or the hashing trick on the crossed features", pt(x));
        return true;
    }
    why(r, "Keep part of the model in host RAM and bring it over when needed: it fits, but steps get 3-10x "
           "slower (offload to disk is slower still).");
    if (x->shortfall)
        why(r, " At least %s has to move off the GPU.", og_hb((double)x->shortfall).s);
    unsigned long long budget = x->total ? (unsigned long long)((double)x->total * 0.85 / GIB) : 0;
    if (budget < 1)
        budget = 1;
    switch (x->fw) {
    case OG_FW_JAX:
        how(r, "x_host = jax.device_put(x, jax.devices(\"cpu\")[0])   # keep rarely used arrays on the host");
        break;
    case OG_FW_TENSORFLOW:
        how(r, "with tf.device(\"/CPU:0\"): ...   # place large embedding tables on the host");
        break;
    case OG_FW_CUPY:
        how(r, "Keep large arrays in host memory (numpy) and copy chunks with cupy.asarray() when needed.");
        break;
    default:
        how(r,
            "%sAutoModelForCausalLM.from_pretrained(name, device_map=\"auto\", max_memory={%d: \"%lluGiB\", "
            "\"cpu\": \"64GiB\"})",
            pt(x), x->rec->event.device, budget);
        how(r, "%soffload_folder=\"offload\"   # only if RAM is short too: disk is the slowest", pt(x));
        how(r, "DeepSpeed ZeRO-Offload: \"offload_optimizer\": {\"device\": \"cpu\"}   # training");
        break;
    }
    return true;
}

static bool b_bigger_gpu(const rctx_t *x, og_remedy_t *r)
{
    static const struct {
        int gb;
        const char *cards;
    } cards[] = {
        { 16, "V100 16GB, T4" },   { 24, "RTX 4090, A10, L4" }, { 40, "A100 40GB" },
        { 48, "RTX A6000, L40S" }, { 80, "A100 80GB, H100" },   { 141, "H200" },
    };
    /* the process alone on a fresh card: what it holds now plus the request; 3% kept for the driver */
    uint64_t need = add_sat(x->footprint, x->req);
    if (!x->f->fit.bounded && !x->req_known) { /* what it held, and a request of a size not given */
        why(r,
            "The job needs more than the %s it held (the failing request's size was not given); this card has %s. "
            "Its full peak was not seen, so no card size can be promised to fit it.",
            og_hb((double)x->footprint).s, og_hb((double)x->total).s);
        how(r, "Measure the peak first: run once on a larger card with OOMGUARD_SUMMARY=1 (prints the peak per GPU).");
        how(r, "Or a smaller model of the same family (e.g. 70B -> 13B).");
        return true;
    }
    if (!x->f->fit.bounded) { /* only a lower bound: no card size can be promised */
        why(r,
            "The job needs at least %s (%s held + %s requested); this card has %s. Its full peak was not seen "
            "(%s), so no card size can be promised to fit it.",
            og_hb((double)need).s, og_hb((double)x->footprint).s, req_hb(x).s, og_hb((double)x->total).s,
            x->f->fit.why);
        how(r, "Measure the peak first: run once on a larger card with OOMGUARD_SUMMARY=1 (prints the peak per GPU).");
        how(r, "Or a smaller model of the same family (e.g. 70B -> 13B).");
        return true;
    }
    int fit = -1;
    for (size_t i = 0; i < sizeof cards / sizeof *cards; i++)
        if ((double)need <= cards[i].gb * GIB * 0.97 && (double)cards[i].gb * GIB > (double)x->total * 1.01) {
            fit = (int)i;
            break;
        }
    if (fit >= 0) {
        why(r,
            "The job needs about %s (%s held + %s requested); this card has %s. The smallest common card that "
            "fits is %d GB (%s).",
            og_hb((double)need).s, og_hb((double)x->footprint).s, req_hb(x).s, og_hb((double)x->total).s, cards[fit].gb,
            cards[fit].cards);
        how(r, "Run on a %d GB card (%s), e.g. rented for the run.", cards[fit].gb, cards[fit].cards);
    } else {
        why(r,
            "The job needs about %s (%s held + %s requested): no single common card (up to 141 GB) fits it with "
            "room to spare; shrink the model or split it across GPUs.",
            og_hb((double)need).s, og_hb((double)x->footprint).s, req_hb(x).s);
        how(r, "Split across GPUs (tensor parallel or ZeRO-3/FSDP) or quantize, then pick the card count.");
    }
    HOWS(x, r, { ANY, "Or a smaller model of the same family (e.g. 70B -> 13B)." },
         { ANY, "Or, for inference, a managed API instead of self-hosting." });
    return true;
}

static bool b_other_framework(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int k = x->other_fw;
    const char *me = x->fw == OG_FW_UNKNOWN ? "the failing framework" : x->fwname;
    if (k == OG_FW_JAX) {
        if (rec->xla_preallocate_off) {
            r->title = "Cap or release what JAX/XLA holds on this GPU";
            why(r,
                "JAX (XLA) holds %s of this GPU in the same process, leaving %s short by %s. Preallocation is "
                "already off: these are JAX's arrays and the freed memory its allocator keeps.",
                og_hb((double)x->other_fw_bytes).s, me, og_hb((double)x->shortfall).s);
            how(r, "del the JAX arrays you no longer need (or move them to host with jax.device_get) before the "
                   "PyTorch phase");
        } else {
            r->title = "Stop JAX/XLA from preallocating the GPU";
            why(r,
                "JAX (XLA) holds %s of this GPU in the same process: by default it preallocates 75%% of the "
                "memory when its client starts, leaving %s short by %s.",
                og_hb((double)x->other_fw_bytes).s, me, og_hb((double)x->shortfall).s);
            how(r, "export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX allocates on demand");
        }
        int frac = x->total ? (int)(100.0 * (double)sub0(x->other_fw_bytes, x->shortfall) / (double)x->total) : 0;
        if (frac >= 5 && frac <= 95)
            how(r, "export XLA_PYTHON_CLIENT_MEM_FRACTION=.%02d   # or cap what JAX may take", frac);
        else
            how(r, "export XLA_PYTHON_CLIENT_MEM_FRACTION=.25   # or cap what JAX may take (here 25%%)");
        how(r, "export JAX_PLATFORMS=cpu   # when JAX need not use the GPU at all (data loading, metrics)");
    } else if (k == OG_FW_TENSORFLOW) {
        r->title = "Stop TensorFlow from taking the whole GPU";
        why(r,
            "TensorFlow holds %s of this GPU in the same process: by default it maps nearly all free memory at "
            "start, leaving %s short by %s.",
            og_hb((double)x->other_fw_bytes).s, me, og_hb((double)x->shortfall).s);
        if (env_is(rec, "TF_FORCE_GPU_ALLOW_GROWTH", "true"))
            why(r, " Memory growth is already on: TensorFlow really uses that much.");
        else {
            how(r, "export TF_FORCE_GPU_ALLOW_GROWTH=true   # allocate on demand");
            how(r, "for gpu in tf.config.list_physical_devices(\"GPU\"): "
                   "tf.config.experimental.set_memory_growth(gpu, True)   # before the first op");
        }
        how(r, "tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit="
               "4096)])   # or a hard cap in MiB");
        how(r, "tf.config.set_visible_devices([], \"GPU\")   # when TensorFlow need not use the GPU");
    } else {
        r->title = "Limit the other framework's memory";
        why(r, "%s holds %s of this GPU in the same process, more than the %s missing.", fw_display(k),
            og_hb((double)x->other_fw_bytes).s, og_hb((double)x->shortfall).s);
        if (k == OG_FW_CUPY)
            how(r,
                "cupy.get_default_memory_pool().free_all_blocks(); cupy.get_default_memory_pool().set_limit(size=...)");
        else if (k == OG_FW_PYTORCH)
            how(r, "torch.cuda.empty_cache(); torch.cuda.set_per_process_memory_fraction(0.5)   # PyTorch's share");
    }
    return true;
}

/* the workers of a pre-fork server (gunicorn, uWSGI, multiprocessing): each loads its own copy */
static bool b_fewer_workers(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->concurrent_copies && ro->concurrent_group >= 0 && !x->npeers) {
        /* copies of one model running at once in this process (threads, each its own loop) */
        const og_roles_t *mr = &rec->memory.fw.roles;
        char cls[sizeof mr->models[0].cls];
        og_cpy(cls, sizeof cls, mr->models[ro->concurrent_group].cls, sizeof cls);
        int n = ro->concurrent_count;
        double each = og_known(mr->allocated_bytes) ? (double)mr->allocated_bytes.v / (double)n : 0;
        r->title = "Fewer copies at once: run the model's loops one after another";
        r->saving = "All but one copy's parameters, gradients, optimizer state and activations";
        r->cost = "Loops run one after another (or on more GPUs): the sweep takes longer on one card";
        why(r,
            "%d copies of %s are on GPU %d and %d of them were running at the failure: threads of this process, each "
            "running its own loop (Optuna's n_jobs, a thread pool). Each copy holds its own parameters, gradients, "
            "optimizer state and activations",
            n, cls, rec->event.device, ro->concurrent_runs);
        if (each > 0)
            why(r, ", about %s each of the %s allocated; one at a time holds one copy's", og_hb(each).s,
                og_hb((double)mr->allocated_bytes.v).s);
        why(r, ". Their loops starting one after another is what rose, not a leak.");
        how(r, "%sstudy.optimize(objective, n_trials=n_trials, n_jobs=1)   # Optuna: one trial at a time on this GPU",
            pt(x));
        how(r, "%sThreadPoolExecutor(max_workers=1)   # or as many as the card holds the largest of at once", pt(x));
        how(r, "CUDA_VISIBLE_DEVICES=1 python tune.py ...   # or one process per GPU, each running one loop");
        return true;
    }
    if (x->f->child_programs) {
        /* programs this process started (an evaluation script each epoch) */
        int n = x->npeers;
        r->title = "Fewer processes at once: wait for each one this process starts, or do its work here";
        r->saving = "All but one of their CUDA contexts and what each loaded";
        why(r,
            "%d %s this process started, each running another program, %s %s on GPU %d, about %s each: a CUDA "
            "context and a copy of what it works on (a model to evaluate) each. Started without waiting, they pile "
            "up; one at a time, in this process or on another GPU they do not. Do not stop them: they are this "
            "job's.",
            n, og_plural(n, "process", "processes"), og_plural(n, "holds", "hold"), og_hb((double)x->peers_bytes).s,
            rec->event.device, og_hb((double)x->peers_bytes / (double)n).s);
        how(r, "%sif proc is not None: proc.wait()   # before starting the next one (subprocess.Popen)", pt(x));
        how(r,
            "%swith torch.no_grad(): evaluate(model, loader)   # in this process: no second context, no second "
            "copy of the model",
            pt(x));
        how(r, "CUDA_VISIBLE_DEVICES=1 python evaluate.py ...   # or on a GPU the training does not use");
        return true;
    }
    if (x->npeers && x->f->nchildren == x->npeers) { /* this process's own children: DataLoader workers */
        int n = x->npeers, keep = n / 2;
        double each = (double)x->peers_bytes / (double)n;
        r->title = "Fewer DataLoader workers";
        r->saving = "Each worker's CUDA context, cache and prefetched batches";
        why(r,
            "%d child %s of this process (DataLoader workers) %s %s on GPU %d, about %s each: every worker that "
            "touches CUDA keeps a context, a cache and the batches it prefetched of its own. Fewer workers, fewer "
            "of those (%d instead of %d frees about %s); none at all once CUDA stays out of them. Do not stop "
            "them by hand: they are this job's.",
            n, og_plural(n, "process", "processes"), og_plural(n, "holds", "hold"), og_hb((double)x->peers_bytes).s,
            rec->event.device, og_hb(each).s, keep, n, og_hb(each * (double)(n - keep)).s);
        how(r,
            "%sDataLoader(dataset, num_workers=%d, prefetch_factor=2)   # each worker using CUDA costs its context, "
            "cache and batches",
            pt(x), keep);
        how(r, "%sprefetch_factor=1   # fewer batches waiting in each worker", pt(x));
        return true;
    }
    int workers = x->f->nsiblings + 1; /* this one too */
    why(r,
        "%d other %s of this job (%s) %s %s on GPU %d: every worker of a pre-fork server creates its own CUDA "
        "context and loads its own copy of the model, so the GPU holds one copy per worker (%d here). Do not "
        "stop them: they are this job.",
        x->npeers, og_plural(x->npeers, "process", "processes"),
        x->f->nparents ? "the workers of this process's parent and the parent itself" : "workers of the same parent",
        og_plural(x->npeers, "holds", "hold"), og_hb((double)x->peers_bytes).s, rec->event.device, workers);
    how(r, "gunicorn --workers %d ...   # (or uvicorn --workers, uWSGI processes=): fewer model copies per GPU",
        workers > 2 ? workers - 1 : 1);
    HOWS(x, r,
         { ANY, "Or one process per GPU that owns the model and batches requests (threads or async handlers, a "
                "model server such as Triton, TorchServe or vLLM)" },
         { ANY, "Or give each worker its own GPU: CUDA_VISIBLE_DEVICES per worker (gunicorn post_fork hook)" });
    return true;
}

/* the job's own children (DataLoader workers) hold the memory: each one that touches CUDA has its own context */
static bool b_cuda_out_of_workers(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    why(r,
        "%d child %s of this process (DataLoader workers) %s %s on GPU %d: a worker that calls .cuda() or builds "
        "CUDA tensors (in the Dataset, its transforms or collate_fn) gets a CUDA context, a cache and batches of its "
        "own. Do not kill them: fix the pipeline, and the workers hold nothing on the GPU.",
        x->npeers, og_plural(x->npeers, "process", "processes"), og_plural(x->npeers, "holds", "hold"),
        og_hb((double)x->peers_bytes).s, rec->event.device);
    how(r,
        "%sreturn CPU tensors from Dataset/collate_fn; move the batch in the main process: "
        "batch = batch.to(\"cuda\", non_blocking=True)",
        pt(x));
    how(r,
        "%saugment on the GPU there, on the whole batch (kornia.augmentation, torchvision.transforms.v2 on a CUDA "
        "batch), or on the CPU in the workers",
        pt(x));
    how(r, "%sDataLoader(..., pin_memory=True)   # fast host-to-GPU copies without CUDA in the workers", pt(x));
    return true;
}

static bool b_set_device(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    if (x->npeers)
        why(r,
            "%d other %s of this job %s %s on GPU %d, about one CUDA context each: every rank creates its "
            "context on the current device, GPU 0 unless it selects its own first.",
            x->npeers, og_plural(x->npeers, "rank", "ranks"), og_plural(x->npeers, "holds", "hold"),
            og_hb((double)x->peers_bytes).s, rec->event.device);
    else
        why(r, "This rank (LOCAL_RANK=%ld) runs on GPU %d: it did not select its own GPU first.", rec->local_rank,
            rec->event.device);
    why(r, " Do not stop those processes: they are this job's ranks.");
    HOWS(x, r,
         { PT, "local_rank = int(os.environ[\"LOCAL_RANK\"]); torch.cuda.set_device(local_rank)   # first "
               "thing, before any CUDA call" },
         { PT, "torch.load(path, map_location=f\"cuda:{local_rank}\")   # not the GPU it was saved from" },
         { PT, "dist.init_process_group(\"nccl\", device_id=torch.device(\"cuda\", local_rank))" },
         { ANY, "Or give each rank one GPU: CUDA_VISIBLE_DEVICES=$LOCAL_RANK in the per-rank launch script." });
    return true;
}

static bool b_ddp(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    double ratio = x->has[OG_CAUSE_IMBALANCE] ? x->f->imbalance.ratio : -1;
    double avg = x->has[OG_CAUSE_IMBALANCE] ? (double)x->f->imbalance.avg : -1;
    why(r,
        "GPU %d carries %.1fx what the other GPUs of this process hold (%s on average): nn.DataParallel gathers "
        "every output there and keeps the optimizer state there. One process per GPU balances it.",
        rec->event.device, ratio > 0 ? ratio : 1.0, og_hb(avg > 0 ? avg : 0).s);
    int n = x->visible > 1 ? x->visible : 2;
    how(r, "%storchrun --nproc_per_node=%d train.py   # one process per GPU", pt(x), n);
    HOWS(x, r,
         { PT, "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])   # instead of "
               "nn.DataParallel(model)" },
         { PT, "or FSDP(model) to also shard parameters, gradients and optimizer state" });
    return true;
}

static void operation_site(const rctx_t *x, char *buf, size_t n);

/* one operation that fits the device but makes a tensor at least as large as the rest of the pass (roles.operation:
 * an image decoder at full resolution, an all-pairs distance): tiles or slices of it */
static bool chunk_operation(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char site[200];
    operation_site(x, site, sizeof site);
    bool decode = ro->operation == OG_OP_image_decode, conv = ro->operation == OG_OP_conv,
         kernel = ro->operation == OG_OP_kernel_matrix;
    if (ro->operation == OG_OP_transducer_loss) {
        why(r,
            "The failing request, %s, is made by the transducer's loss or joint network%s: it holds every frame "
            "against every target token over the whole vocabulary, for the whole batch at once. Computed for a few "
            "utterances at a time (the encoder still runs on the whole batch), or pruned to the tokens near each "
            "frame's alignment, it is never whole.",
            req_hb(x).s, site);
        HOWS(x, r,
             { PT, "for i in range(0, B, 4): loss_i = rnnt_loss(joiner(enc[i:i + 4], pred[i:i + 4]), ...); "
                   "loss_i.backward(retain_graph=True)   # the joint and its loss by sub-batch" },
             { PT, "NeMo: model.joint.fuse_loss_wer = True; joint.fused_batch_size = 4   # the same, built in" },
             { PT, "k2.rnnt_loss_pruned(...)   # pruned RNN-T: only the tokens near each frame's alignment" });
        return true;
    }
    why(r,
        "The failing request, %s, is one %s%s, at least as large as everything else the running pass holds "
        "(%s)%s: that operation, not the batch, is the peak. Computed in tiles or slices it needs a fraction of "
        "it at a time.",
        req_hb(x).s,
        decode   ? "image decode at full resolution"
        : conv   ? "convolution over the whole image"
        : kernel ? "kernel matrix over every pair of the points"
                 : "all-pairs computation",
        site, og_hb((double)ro->working).s, x->larger_than_device ? ", and larger than the whole device" : "");
    if (conv)
        HOWS(x, r,
             { PT, "sliding_window_inference(x, roi_size=(1024, 1024), sw_batch_size=4, predictor=model, "
                   "overlap=0.25)   # monai.inferers: overlapping tiles, stitched" },
             { PT, "or loop over tiles of the input yourself (near the size the model was trained on) and stitch "
                   "the outputs" });
    else if (kernel)
        HOWS(x, r,
             { PT, "ScaleKernel(gpytorch.kernels.keops.RBFKernel(ard_num_dims=d))   # KeOps: K(X, X) in tiles, "
                   "never stored whole (MaternKernel too)" },
             { PT, "or fewer points: inducing points (botorch's SingleTaskVariationalGP, gpytorch's ApproximateGP), "
                   "or fit on a subset near the region of interest" });
    else if (decode)
        HOWS(x, r,
             { PT, "pipe.enable_vae_tiling()   # decode in overlapping tiles; pipe.enable_vae_slicing() decodes one "
                   "image of a batch at a time" },
             { PT, "vae.tiled_decode(latents)   # or decode the latents in spatial tiles and stitch the images" });
    else
        HOWS(x, r,
             { PT, "for rows in torch.split(a, 4096): out.append(torch.cdist(rows, b).topk(k, largest=False))   # "
                   "keep only what each block needs" });
    return true;
}

/* one big temporary of a computation outside any model (facts: roles.loose_operation): blocks of fewer rows, each
 * reduced before the next; the block that keeps each temporary near a quarter of what is free, from the statement's
 * first size (its rows) */
static bool chunk_loose_operation(const rctx_t *x, og_remedy_t *r)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    char file[sizeof ro->stmt.file], ints[sizeof ro->stmt_ints];
    og_cpy(file, sizeof file, ro->stmt.file, sizeof file);
    og_cpy(ints, sizeof ints, ro->stmt_ints, sizeof ints);
    char sizes[3 * sizeof ints];
    size_t o = 0;
    for (const char *p = ints; *p && o + 4 < sizeof sizes; p++) /* 8192,1600000 -> 8192 x 1600000 */
        o += (size_t)snprintf(sizes + o, sizeof sizes - o, *p == ',' ? " x " : "%c", *p);
    sizes[o] = 0;
    why(r,
        "The failing request, %s, is one temporary of a computation outside any model (%s:%d, sizes %s), and the "
        "running code already holds %s of temporaries beside it: the operation's size, not a batch, is the peak. "
        "Computed over fewer rows at a time, each block reduced (top-k, a count, a threshold) before the next, it "
        "needs a fraction of that.",
        req_hb(x).s, og_base_name(file), ro->stmt.line, sizes[0] ? sizes : "not read",
        og_hb((double)x->f->roles.act).s);
    unsigned long long rows = strtoull(ints, NULL, 10), block = 0;
    if (rows > 1 && x->req && x->f->free_eff) {
        double fit = (double)rows * (double)x->f->free_eff / (4.0 * (double)x->req);
        for (block = 1; (double)(block * 2) <= fit && block * 2 < rows;)
            block *= 2;
    }
    if (block)
        how(r,
            "%sfor i in range(0, n, %llu): sim = f(x[i:i + %llu], library); keep(sim.topk(k)); del sim   # %llu rows "
            "of %llu at a time: each temporary about %s",
            pt(x), block, block, block, rows, og_hb((double)x->req * (double)block / (double)rows).s);
    else
        how(r, "%sfor i in range(0, n, block): sim = f(x[i:i + block], library); keep(sim.topk(k)); del sim", pt(x));
    how(r, "Size the block by rows x columns (what each temporary holds), not by rows alone: it must shrink as the "
           "library grows.");
    return true;
}

/* a comprehension making one result per item and keeping them all (remedy_rank.c: comprehension_builds) */
static bool chunk_comprehension(const rctx_t *x, og_remedy_t *r)
{
    const og_framework_view_t *fw = &x->rec->memory.fw;
    int i = x->f->comprehension, n = OG_FILLED(fw->npy_frames, fw->py_frames);
    char file[sizeof fw->py_frames[0].file], fn[sizeof fw->py_frames[0].function];
    og_cpy(file, sizeof file, fw->py_frames[i].file, sizeof file);
    og_cpy(fn, sizeof fn, i + 1 < n ? fw->py_frames[i + 1].function : "", sizeof fn);
    why(r,
        "The failing call runs inside a comprehension (%s:%d%s%s) that makes one tensor per item and keeps every one "
        "until it ends: %s of them so far beside the %s asked for, outside any model's pass. Over chunks of items, "
        "each reduced before the next (cropped or resized, pooled, copied to the host), it needs a chunk's worth.",
        og_base_name(file), fw->py_frames[i].line, fn[0] ? " in " : "", fn, og_hb((double)x->f->roles.act).s,
        req_hb(x).s);
    how(r, "%sfor i in range(0, len(items), chunk): out.extend(reduce(f(t)) for t in items[i:i + chunk])", pt(x));
    how(r, "Reduce each item where it is made (crop or resize before the cast to float) so only the small result is "
           "kept.");
    return true;
}

static bool b_chunk(const rctx_t *x, og_remedy_t *r)
{
    if (og_comprehension_builds(x) && !x->larger_than_device)
        return chunk_comprehension(x, r);
    /* a convolution larger than the card in an inference pass is tiled as any (remedy_rank.c: operation_dominates) */
    bool conv_tiles =
        x->f->roles.operation == OG_OP_conv && x->grad == -1 && x->req_known && x->req >= x->f->roles.working;
    if ((!x->larger_than_device || conv_tiles) && x->f->roles.operation != OG_OPERATION_NONE)
        return chunk_operation(x, r);
    if (!x->larger_than_device && x->f->roles.loose_operation)
        return chunk_loose_operation(x, r);
    why(r,
        "The request alone, %s, is larger than the whole %s (%s): no setting of this process can fit it. Split "
        "the operation into pieces that fit, shard the tensor across GPUs, or keep it off the GPU.",
        req_hb(x).s, og_known(x->rec->device.limit_bytes) && x->capacity < x->total ? "limit" : "device",
        og_hb((double)x->capacity).s);
    unsigned long long k = x->capacity ? (unsigned long long)(x->req / (x->capacity / 2 ? x->capacity / 2 : 1)) + 1 : 4;
    if (k < 2)
        k = 2;
    switch (x->fw) {
    case OG_FW_JAX:
        how(r, "jax.lax.map(f, xs.reshape(%llu, -1, *xs.shape[1:]))   # %llu chunks, one at a time", k, k);
        break;
    case OG_FW_CUPY:
        how(r, "for part in cupy.array_split(x, %llu): ...   # %llu pieces", k, k);
        break;
    default:
        how(r,
            "%sfor part in torch.chunk(x, %llu, dim=0): out.append(f(part))   # %llu chunks, each under half the "
            "card",
            pt(x), k, k);
        how(r,
            "%slogits: compute the loss over the vocabulary in chunks (e.g. a chunked cross-entropy) instead "
            "of one [batch, seq, vocab] tensor",
            pt(x));
        break;
    }
    how(r, "Or shard it (tensor parallelism) or keep it in host memory and stream pieces to the GPU.");
    return true;
}

static bool b_pool_trim(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    double slack = x->app_pool ? (double)x->f->app_slack : -1;
    char owner[64], used_by[80] = "";
    og_cpy(owner, sizeof owner, rec->memory.pool_owner[0] ? rec->memory.pool_owner : "the application",
           sizeof rec->memory.pool_owner);
    if (x->app_pool)
        og_fmt(used_by, sizeof used_by, " (used by %s)", owner);
    why(r,
        "The application's own stream-ordered pool%s keeps %s of freed memory reserved: a pool returns memory to "
        "the device only when trimmed or when its release threshold allows it at a synchronization.",
        used_by, og_hb(slack > 0 ? slack : 0).s);
    HOWS(
        x, r, { ANY, "cudaStreamSynchronize(stream); cudaMemPoolTrimTo(pool, 0);   // before the large allocation" },
        { ANY, "uint64_t keep = 0; cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);   // a "
               "lower threshold: freed memory goes back at each synchronization" },
        { ANY, "Or allocate the large buffer from the same pool (cudaMallocFromPoolAsync) so it reuses that memory." });
    return true;
}

static bool b_bucketing(const rctx_t *x, og_remedy_t *r)
{
    (void)x;
    why(r, "Batches of many different lengths leave differently sized holes in the allocator's segments; batches "
           "of similar length (or padded to a few fixed lengths) reuse the same blocks.");
    HOWS(x, r,
         { ANY, "Sort or bucket samples by length: e.g. a length-grouped sampler (Hugging Face group_by_length=True)" },
         { ANY, "Pad to a few fixed lengths (e.g. multiples of 256 tokens) so the shapes repeat" });
    return true;
}

static bool b_fw_cap(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    bool capped = x->has[OG_CAUSE_FWCAP];
    char srcbuf[sizeof rec->memory.fw.cap_source];
    og_cpy(srcbuf, sizeof srcbuf, rec->memory.fw.cap_source, sizeof rec->memory.fw.cap_source);
    const char *src = !capped ? NULL : srcbuf[0] ? srcbuf : "unknown";
    double cap = capped ? (double)x->f->cap.cap : -1, over = capped ? (double)x->f->cap.over : -1;
    why(r, "The framework refused the request under its own cap (%s, %s)",
        src && strcmp(src, "unknown") ? src : "a memory fraction or pool limit", og_hb(cap > 0 ? cap : 0).s);
    if (over > 0)
        why(r, "; it needed %s more than the cap allows.", og_hb(over).s);
    else
        why(r, ".");
    bool uncapped = og_cap_not_the_card(x, NULL); /* its own sentence says the room the card leaves */
    if (og_known(rec->device.free_bytes) && !uncapped)
        why(r, " The device had %s free.", og_hb((double)rec->device.free_bytes.v).s);
    if (capped && x->other > 0 && !x->other_inferred && uncapped)
        why(r, " Other processes hold %s on this card.", og_hb((double)x->other).s);
    else if (capped && x->other > 0 && !x->other_inferred)
        why(r,
            " Other processes hold %s on this card: on a shared GPU the cap is this job's share, and raising it "
            "takes theirs.",
            og_hb((double)x->other).s);
    cap_not_the_card_text(x, r);
    double need = cap > 0 ? cap + (over > 0 ? over : 0) : 0;
    og_uncapped_t u;
    if (og_cap_not_the_card(x, &u) && (double)u.need > need)
        need = (double)u.need;
    double frac = x->total && need > 0 ? need * 1.1 / (double)x->total : 0;
    switch (x->fw) {
    case OG_FW_JAX:
        if (frac > 0 && frac < 0.96)
            how(r,
                "export XLA_PYTHON_CLIENT_MEM_FRACTION=.%02d   # was the cap; or XLA_PYTHON_CLIENT_PREALLOCATE=false",
                (int)(frac * 100) + 1);
        else
            how(r, "export XLA_PYTHON_CLIENT_PREALLOCATE=false   # allocate on demand instead of a fixed arena");
        break;
    case OG_FW_CUPY:
        how(r, "cupy.get_default_memory_pool().set_limit(size=0)   # 0 = no limit; or a larger size");
        break;
    case OG_FW_TENSORFLOW:
        how(r, "tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration("
               "memory_limit=...)])   # a larger memory_limit, in MiB");
        break;
    default:
        if (frac > 0 && frac < 1)
            how(r, "%storch.cuda.set_per_process_memory_fraction(%.2f)   # or remove the call", pt(x), frac);
        else
            how(r, "%sremove torch.cuda.set_per_process_memory_fraction(...)", pt(x));
        break;
    }
    how(r, "Or keep the cap and shrink the job with the remedies below.");
    return true;
}

/* ------------------------------------------------------------------ by role and phase */

/* " (train.py:40 in step)": where the adapter saw the phase (the program's own line, event.phase_site, else
 * the frame that decided), "" when it did not say */
typedef struct {
    char s[160];
} where_t;
static where_t phase_at(const rctx_t *x)
{
    where_t o = { "" };
    const og_framework_view_t *fw = &x->rec->memory.fw;
    if (!fw->has_phase_frame && !fw->has_phase_site)
        return o;
    const og_py_frame_t *w = fw->has_phase_site ? &fw->phase_site : &fw->phase_frame; /* the program's line first */
    char file[sizeof w->file], fn[sizeof w->function];
    og_cpy(file, sizeof file, w->file, sizeof file);
    og_cpy(fn, sizeof fn, w->function, sizeof fn);
    og_fmt(o.s, sizeof o.s, " (%s:%d in %s)", og_base_name(file), w->line, fn);
    return o;
}

/* HEAD, where the adapter saw the phase, REST; then, when WORKING is given and the roles measured it, what the
 * running code holds: " (<bytes>WORKING)" */
static void why_in_phase(const rctx_t *x, og_remedy_t *r, const char *head, const char *rest, const char *working)
{
    const og_role_facts_t *ro = &x->f->roles;
    why(r, "%s%s%s", head, phase_at(x).s, rest);
    if (working && ro->known && ro->working)
        why(r, " (%s%s)", og_hb((double)ro->working).s, working);
}

static bool b_retry_outside_except(const rctx_t *x, og_remedy_t *r)
{
    why_in_phase(x, r, "The failing allocation ran inside the except block of an earlier out-of-memory error",
                 ": while the handler runs, the exception's traceback keeps every frame of the failed attempt alive, "
                 "and with them its tensors",
                 " of activations and temporaries here");
    why(r, ". A smaller retry started in the handler runs beside them; leave the handler first.");
    HOWS(x, r,
         { PT,
           "try: out = step(batch) / except torch.cuda.OutOfMemoryError: oom = True   # only note it in the handler" },
         { PT, "if oom: gc.collect(); torch.cuda.empty_cache(); out = step(smaller_batch)   # the failed "
               "attempt's tensors are gone" },
         { ANY, "Do not keep the exception (e = err; self.last_error = err): it holds the traceback and its frames." });
    return true;
}

/* tensors torch.load restored onto the GPU, held by a Python object (og_restored_held): name the holder, the bytes
 * restored and the line that loaded them */
static void restored_held_why(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->restored_holder < 0)
        return;
    const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->restored_holder];
    char lb[160], file[sizeof h->restored_site.file];
    const char *label = holder_label(x, ro->restored_holder, lb, sizeof lb);
    why(r, "%s holds %s that torch.load restored onto the GPU", label ? label : "A Python object",
        og_hb((double)h->restored.v).s);
    if (h->has_restored_site) {
        og_cpy(file, sizeof file, h->restored_site.file, sizeof file);
        why(r, " (%s:%d)", og_base_name(file), h->restored_site.line);
    }
    why(r, ": without map_location it puts every tensor back on the device it was saved from.");
    if (ro->stmt_copies == ro->restored_holder)
        why(r, " The failing statement copies them whole, so for its length they are on the GPU twice.");
}

static bool b_map_location_cpu(const rctx_t *x, og_remedy_t *r)
{
    if (og_restored_held(x) && !og_checkpoint_kept(x)) {
        restored_held_why(x, r);
        why(r, " Loaded to host memory they cost the GPU nothing; move one batch (or one part) at a time.");
        HOWS(
            x, r,
            { PT, "data = torch.load(path, map_location=\"cpu\")   # host memory, not the GPU it was saved from" },
            { PT,
              "x = torch.cat(parts).pin_memory()   # on the host; per step: xb = x[i:i + bs].cuda(non_blocking=True)" },
            { ANY, "safetensors: load_file(path, device=\"cpu\")" });
        return true;
    }
    if (og_checkpoint_kept(x)) {
        checkpoint_kept_why(x, r);
        why(r, " Loaded to host memory, it costs the GPU nothing.");
        HOWS(x, r,
             { PT, "ckpt = torch.load(path, map_location=\"cpu\")   # then model.load_state_dict(ckpt[\"model\"])" },
             { PT, "optimizer.load_state_dict(ckpt[\"optimizer\"]); del ckpt   # the optimizer moves its state to "
                   "its parameters' device" },
             { ANY, "safetensors: load_file(path, device=\"cpu\")" });
        return true;
    }
    why_in_phase(x, r, "The failure came while restoring a checkpoint",
                 ": torch.load puts every tensor back on the device it was saved from, so the checkpoint's copy of "
                 "the weights and optimizer state lands on the GPU beside the model and optimizer it is loaded into",
                 " loaded so far");
    why(r, ".");
    HOWS(x, r, { PT, "ckpt = torch.load(path, map_location=\"cpu\")   # then model.load_state_dict(ckpt[\"model\"])" },
         { PT, "optimizer.load_state_dict(ckpt[\"optimizer\"]); del ckpt   # load_state_dict copies to the "
               "parameters' device" },
         { ANY, "safetensors: load_file(path, device=\"cpu\")" });
    return true;
}

static bool b_float32_instead_of_float64(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (!ro->params_fp64 && !ro->held_fp64)
        return false; /* only where float64 weights or data were measured */
    if (ro->fp64_holder >= 0) {
        const og_role_holder_t *h = &x->rec->memory.fw.roles.holders[ro->fp64_holder];
        char label[sizeof h->label];
        og_cpy(label, sizeof label, h->label, sizeof label);
        why(r,
            "%s holds %s of float64 tensors (measured; %s in all the holders): numpy's and pandas' default dtype, "
            "kept when an array is copied to the GPU as it is. float32 halves them. ",
            label, og_hb((double)h->float64.v).s, og_hb((double)ro->held_fp64).s);
        HOWS(x, r,
             { PT, "X = torch.from_numpy(X_np.astype(np.float32)).cuda()   # or torch.as_tensor(X_np, "
                   "dtype=torch.float32, device=\"cuda\")" });
    }
    if (!ro->params_fp64) {
        why(r, "Cast the data before the copy; a model made float64 to match them (model.double()) goes back to "
               "float32 with them.");
        HOWS(x, r, { PT, "model = model.float()   # where .double() was called to match float64 inputs" });
        return true;
    }
    why(r,
        "%s of the %s of parameters are float64 (measured): what the model computes from them is float64 too, 8 "
        "bytes a value",
        og_hb((double)ro->params_fp64).s, og_hb((double)ro->params).s);
    if (ro->act_known && ro->act)
        why(r, " (%s of activations and temporaries now)", og_hb((double)ro->act).s);
    why(r, ". Autocast leaves float64 operations in float64; float32 weights and inputs halve them all.");
    HOWS(x, r, { PT, "model = model.float(); x = x.float()   # the inputs too: a float64 input promotes the result" },
         { PT, "torch.set_default_dtype(torch.float32)   # where the program set float64 (new tensors, ASE/MD "
               "calculators' default_dtype)" },
         { PT, "with torch.autocast(...) does not do this: float64 operations are not eligible" });
    return true;
}

static bool b_load_in_bf16(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (x->f->phase == OG_JP_loading)
        why_in_phase(x, r, "The failure came while loading the weights", ". ", NULL);
    why(r, "A model built or loaded in float32 takes 4 bytes per parameter: checkpoints are mostly bf16/fp16, and "
           "loading them in their own dtype halves the weights");
    if (ro->known && ro->params && ro->dtypes_known) {
        why(r, " (measured: %s of the %s of parameters are float32", og_hb((double)ro->params_fp32).s,
            og_hb((double)ro->params).s);
        if (ro->grads)
            why(r, "; their gradients, %s, take the same dtype and halve with them", og_hb((double)ro->grads).s);
        why(r, ")");
        if (ro->fp32_group >= 0) { /* one model left in float32 beside one the program loaded in half precision */
            const og_roles_t *rr = &x->rec->memory.fw.roles;
            char cls[sizeof rr->models[0].cls];
            og_cpy(cls, sizeof cls, rr->models[ro->fp32_group].cls, sizeof cls);
            why(r,
                ". %s (%s of parameters) is float32 beside a model in half precision (from_pretrained without "
                "torch_dtype loads float32); in bf16 it would hold %s",
                cls[0] ? cls : "One model", og_hb((double)rr->models[ro->fp32_group].bytes).s,
                og_hb((double)rr->models[ro->fp32_group].bytes / 2).s);
        }
    } else if (ro->known && ro->params) {
        why(r, " (%s of parameters now: %s if they are float32)", og_hb((double)ro->params).s,
            og_hb((double)ro->params / 2).s);
    }
    why(r, ".");
    HOWS(x, r,
         { PT, "AutoModel.from_pretrained(name, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True)   # or "
               "torch_dtype=\"auto\": the checkpoint's dtype" },
         { PT,
           "model = build_model().to(torch.bfloat16); model.load_state_dict(torch.load(path, map_location=\"cpu\"))" },
         { PT, "next(model.parameters()).dtype   # float32 here doubles a bf16 checkpoint" });
    return true;
}

static bool b_eight_bit_optimizer(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (x->f->phase == OG_JP_optimizer_step)
        why_in_phase(x, r, "The failure came in the optimizer's step", ", which creates its state at the first step.",
                     NULL);
    /* the state's width per value as the parameters' dtypes measure it (og_state_value_bytes) */
    int each = (int)(og_state_value_bytes(ro, x->f->phase == OG_JP_optimizer_step) + 0.5);
    if (ro->opt)
        why(r, "%sThe optimizer state holds %s%s", r->why[0] ? " " : "", og_hb((double)ro->opt).s,
            ro->opt_adam ? " (Adam: two moments a parameter)" : "");
    else if (ro->params)
        why(r, "%sThe parameters hold %s; Adam's state is twice that", r->why[0] ? " " : "",
            og_hb((double)ro->params).s);
    why(r,
        ": 8-bit state keeps 1 byte per value, not %d (%d of every %d bytes of it saved); a paged optimizer moves it "
        "to CPU under pressure; LoRA keeps state only for what trains.",
        each, each - 1, each);
    HOWS(x, r,
         { PT, "import bitsandbytes as bnb; optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=lr)   # or "
               "bnb.optim.PagedAdamW8bit" },
         { ANY, "Hugging Face Trainer: TrainingArguments(optim=\"adamw_bnb_8bit\")   # or \"paged_adamw_8bit\"" },
         { PT, "optimizer = torch.optim.Adafactor(model.parameters(), lr=lr)   # or SGD: less state than "
               "Adam's two moments" });
    return true;
}

static bool b_preconditioner_dim_cap(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    const og_roles_t *rr = &x->rec->memory.fw.roles;
    /* the class whose matrices are largest names the optimizer */
    int best = -1;
    for (int i = 0; i < rr->noptimizers && i < (int)(sizeof rr->optimizers / sizeof rr->optimizers[0]); i++)
        if (og_known(rr->optimizers[i].shaped_bytes) &&
            (best < 0 || rr->optimizers[i].shaped_bytes.v > rr->optimizers[best].shaped_bytes.v))
            best = i;
    char cls[sizeof rr->optimizers[0].cls] = "the optimizer";
    if (best >= 0 && rr->optimizers[best].cls[0])
        og_cpy(cls, sizeof cls, rr->optimizers[best].cls, sizeof cls);
    why(r,
        "%s keeps %s of its %s of state in tensors not shaped like their parameters: preconditioners, d x d for "
        "each dimension it preconditions, where Adam keeps two values per weight.",
        cls, og_hb((double)ro->opt_shaped).s, og_hb((double)ro->opt).s);
    if (x->f->phase == OG_JP_optimizer_step && ro->steps_known && ro->steps_made == 0)
        why(r, " Its first step is making them now: more is to come.");
    why(r, " A bound on the dimensions it preconditions removes the widest; AdamW for the widest layers, theirs.");
    HOWS(x, r,
         { PT, "optimizer = SOAP(model.parameters(), lr=lr, max_precond_dim=2048)   # wider dimensions stay "
               "unpreconditioned" },
         { PT, "Distributed Shampoo: DistributedShampoo(model.parameters(), lr=lr, max_preconditioner_dim=2048)   # "
               "blocks of at most 2048" },
         { PT, "or two parameter groups: the embedding and the MLP's wide weights under torch.optim.AdamW, the rest "
               "preconditioned" });
    return true;
}

static bool b_ghost_clipping(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (!ro->per_sample)
        return false; /* only where gradients kept one per example were measured */
    why(r, "%s of gradients are kept one per example", og_hb((double)ro->per_sample).s);
    if (ro->per_sample_n > 1)
        why(r, " (%d examples)", ro->per_sample_n);
    why(r, " to clip each example's gradient. Ghost clipping computes each example's gradient norm without "
           "storing the gradient, then clips in a second backward pass: none of them is kept.");
    HOWS(x, r,
         { PT, "model, optimizer, criterion, train_loader = privacy_engine.make_private(module=model, "
               "optimizer=optimizer, criterion=criterion, data_loader=train_loader, ..." },
         { PT, "    noise_multiplier=sigma, max_grad_norm=C, grad_sample_mode=\"ghost\")   # Opacus 1.5+" },
         { PT, "loss = criterion(model(x), y); loss.backward()   # the wrapped criterion runs both passes" });
    return true;
}

static bool b_lora(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->lora_params && ro->lora_base_trained >= 4 * ro->lora_params) {
        /* the adapters are there and the base trains beside them */
        r->title = "Train only the LoRA adapters: freeze the base weights";
        why(r,
            "The model has LoRA adapters (%s of parameters), yet %s of its other weights require grad too, each "
            "with its gradient and optimizer state (%s of gradients and %s of optimizer state "
            "measured in all). Freezing them leaves the adapters' (and a head's) state only.",
            og_hb((double)ro->lora_params).s, og_hb((double)ro->lora_base_trained).s, og_hb((double)ro->grads).s,
            og_hb((double)ro->opt).s);
        HOWS(x, r,
             { ANY, "loralib: lora.mark_only_lora_as_trainable(model, bias=\"lora_only\"); then unfreeze a head by "
                    "name: model.classifier.requires_grad_(True)" },
             { ANY, "peft: LoraConfig(..., modules_to_save=[\"classifier\"]); model.print_trainable_parameters()   "
                    "# a few percent, not all" },
             { ANY, "optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)   # "
                    "built after freezing" });
        return true;
    }
    why(r, "Every trained parameter (%s of them here) brings its gradient", og_hb((double)ro->params).s);
    if (ro->grads || ro->opt)
        why(r, " and its optimizer state (%s of gradients, %s of optimizer state measured)", og_hb((double)ro->grads).s,
            og_hb((double)ro->opt).s);
    else if (x->f->phase == OG_JP_optimizer_step)
        why(r, " and its optimizer state, which the first step is creating now");
    why(r, ". LoRA freezes the weights and trains small low-rank adapters (about 1%% of the parameters): the "
           "gradients and the optimizer state nearly vanish; QLoRA also keeps the frozen weights in 4-bit.");
    HOWS(x, r,
         { ANY, "peft: model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=[\"q_proj\", "
                "\"v_proj\"]))" },
         { ANY, "optimizer = torch.optim.AdamW((p for p in model.parameters() if p.requires_grad), lr=lr)   # the "
                "adapters only" },
         { ANY, "QLoRA: from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_4bit=True)), then "
                "prepare_model_for_kbit_training(model) and the LoRA config above" });
    return true;
}

/* What the copy remedies' sentences name: where the running code copies (" (update_ema at ema.py:40)", from
 * the holder it keeps, or ""), what it holds, and the model's weights (its parameters, roles.models, without a
 * copy being made beside them). */
typedef struct {
    char site[200];
    og_hb_t held, weights;
} copy_words_t;
static copy_words_t copy_words(const rctx_t *x)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    const og_role_facts_t *rf = &x->f->roles;
    copy_words_t c = { "", og_hb((double)rf->copying),
                       og_hb((double)(rf->model_params && rf->model_params < rf->params ? rf->model_params
                                                                                        : rf->params)) };
    int nh = OG_FILLED(ro->nholders, ro->holders);
    for (int i = 0; i < nh && !c.site[0]; i++) {
        char where[sizeof ro->holders[0].where];
        og_cpy(where, sizeof where, ro->holders[i].where, sizeof where);
        if (og_where_local(where))
            og_fmt(c.site, sizeof c.site, " (%s)", where + sizeof OG_WHERE_LOCAL - 1);
    }
    return c;
}

static bool b_in_place_update(const rctx_t *x, og_remedy_t *r)
{
    if (x->f->roles.copy_replaces && og_covers(x, (double)x->f->roles.copy_replaces)) {
        copy_names_t n = copy_names(x);
        const char *t = n.target[0] ? n.target : "ref", *s = n.source[0] ? n.source : "model";
        why(r,
            "The failing statement (%s) refreshes %s with a new deep copy while the old copy (%s of parameters) "
            "is alive: copied into the existing tensors instead, the refresh takes no new GPU memory.",
            n.site, t, og_hb((double)x->f->roles.copy_replaces).s);
        how(r, "%s.load_state_dict(%s.state_dict())   # copies into %s's own tensors, in place", t, s, t);
        how(r,
            "with torch.no_grad(): [r.lerp_(p, alpha) for r, p in zip(%s.parameters(), %s.parameters())]   # a soft "
            "update in place (TRL's SyncRefModelCallback)",
            t, s);
        return true;
    }
    if (og_ema_out_of_place(x)) {
        const og_role_facts_t *ro = &x->f->roles;
        why(r,
            "The EMA update builds a new copy of the %s of weights beside the one it replaces (%s of it so far; the "
            "rest needs more than the cache and the free memory): written out of place ({k: decay * ema[k] + ...}, "
            "torch._foreach_mul). Updated in place, it makes no copy at all.",
            og_hb((double)x->f->update_copy).s, og_hb((double)ro->act).s);
        HOWS(x, r,
             { PT, "torch._foreach_lerp_(ema_params, model_params, 1 - decay)   # in place, under torch.no_grad()" },
             { PT, "for e, p in zip(ema.parameters(), model.parameters()): e.lerp_(p, 1 - decay)" },
             { PT, "torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))   # in-place "
                   "EMA" });
        return true;
    }
    copy_words_t c = copy_words(x);
    why(r,
        "With autograd off after the optimizer's steps the running code%s holds %s, more than one copy of the "
        "%s of weights: an update written out of place (ema = decay * ema + (1 - decay) * p, "
        "torch._foreach_mul) makes a new tensor for every one it replaces. Updated in place, the copy it "
        "updates is the only one.",
        c.site, c.held.s, c.weights.s);
    HOWS(x, r, { PT, "torch._foreach_lerp_(ema_params, model_params, 1 - decay)   # in place, under torch.no_grad()" },
         { PT, "for e, p in zip(ema_params, model_params): e.mul_(decay).add_(p, alpha=1 - decay)" },
         { PT,
           "torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))   # in-place EMA" });
    return true;
}

/* the names of model group I ("ema_model"), or "" */
static void group_names(const rctx_t *x, int i, char *buf, size_t n)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    buf[0] = 0;
    if (i >= 0 && i < ro->nmodels && ro->models[i].named > 0)
        og_cpy(buf, n, ro->models[i].names, sizeof ro->models[i].names);
}

/* an EMA kept on the device between its updates (facts: roles.ema_kept): name its holder or model and its bytes
 * against the trained weights */
static void ema_kept_why(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char lb[160], names[80];
    const char *holder = holder_label(x, ro->ema_holder, lb, sizeof lb);
    group_names(x, ro->ema_model, names, sizeof names);
    if (!holder && names[0])
        holder = names;
    why(r,
        "%s keeps %s on the GPU: an EMA (averaged) copy of the weights, kept there between its updates beside the "
        "%s of weights, gradients and optimizer state that training needs. It is read only when the average is "
        "updated or evaluated: kept in host memory, updated every few steps, it gives those bytes back.",
        holder ? holder : "The program", og_hb((double)ro->ema_kept).s,
        og_hb((double)(ro->params + ro->grads + ro->opt)).s);
}

static bool b_ema_on_cpu(const rctx_t *x, og_remedy_t *r)
{
    copy_words_t c = copy_words(x);
    if (x->f->roles.ema_kept && og_covers(x, (double)x->f->roles.ema_kept)) {
        ema_kept_why(x, r);
        HOWS(x, r,
             { ANY, "diffusers: ema_unet = EMAModel(unet.parameters(), ...); ema_unet.to(\"cpu\")   # keep the "
                    "shadow in host memory; ema_unet.step(unet.parameters()) every N steps" },
             { ANY, "timm: ModelEmaV3(model, decay=0.9999, device=\"cpu\")   # or Lightning's EMA with "
                    "cpu_offload" },
             { PT, "if step % N == 0: torch._foreach_lerp_(ema_cpu, [p.detach().cpu() for p in "
                   "model.parameters()], 1 - decay ** N)" });
        return true;
    }
    why(r,
        "Autograd was off in a training job outside the optimizer's step, and the running code%s holds %s: a "
        "copy of the %s of weights (an EMA, an averaged or best model) is being made or updated on the GPU "
        "beside the weights, gradients and optimizer state. Kept in host memory it costs no GPU memory; "
        "updating it every few steps spreads the copy.",
        c.site, c.held.s, c.weights.s);
    HOWS(x, r,
         { PT, "ema = {k: v.detach().to(\"cpu\", copy=True) for k, v in model.state_dict().items()}   # the "
               "copy in host memory" },
         { PT, "if step % N == 0: [e.lerp_(p.detach().cpu(), 1 - decay ** N) for e, p in zip(ema.values(), "
               "model.state_dict().values())]" },
         { ANY, "timm: ModelEmaV3(model, decay=0.9999, device=\"cpu\")   # or Lightning's EMA with cpu_offload" });
    return true;
}

static bool b_backward_per_microbatch(const rctx_t *x, og_remedy_t *r)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    char target[sizeof ro->accum_target], operand[sizeof ro->accum_operand], file[sizeof ro->accum.file],
        fn[sizeof ro->accum.function];
    og_cpy(target, sizeof target, ro->accum_target, sizeof target);
    og_cpy(operand, sizeof operand, ro->accum_operand, sizeof operand);
    og_cpy(file, sizeof file, ro->accum.file, sizeof file);
    og_cpy(fn, sizeof fn, ro->accum.function, sizeof fn);
    if (ro->has_accum && !operand[0]) /* the list form: no operand, the statement appends to the list */
        why(r,
            "The program keeps each micro-batch's loss in the list %s (%s:%d in %s) and calls backward once on "
            "them: every micro-batch's graph, with the activations it saved, stays alive until then.",
            target[0] ? target : "of losses", og_base_name(file), ro->accum.line, fn);
    else if (ro->has_accum)
        why(r,
            "The program adds each micro-batch's %s into %s (%s:%d in %s) and calls backward once on the sum: "
            "every micro-batch's graph, with the activations it saved, stays alive until then.",
            operand[0] ? operand : "loss", target[0] ? target : "a total", og_base_name(file), ro->accum.line, fn);
    else if (x->f->roles.graph_cache >= 0) {
        const og_role_holder_t *h = &ro->holders[x->f->roles.graph_cache];
        char lb[160];
        const char *holder = holder_label(x, x->f->roles.graph_cache, lb, sizeof lb);
        why(r,
            "%s keeps %lld micro-batches' outputs with their autograd graphs for a backward later in the step: a "
            "fill-and-drain schedule (GPipe) runs every micro-batch's forward before the first backward, so each "
            "one's activations stay alive until then. A 1F1B schedule runs each micro-batch's backward once the "
            "pipeline is full, so only about as many as there are stages are in flight.",
            holder ? holder : "A cache", (long long)h->records);
        if (x->f->roles.act_known)
            why(r, " Measured: %s of activations.", og_hb((double)x->f->roles.act).s);
        HOWS(x, r,
             { PT,
               "schedule = Schedule1F1B(stage, n_microbatches=n, loss_fn=loss_fn)   # torch.distributed.pipelining, "
               "not ScheduleGPipe" },
             { PT, "ScheduleInterleaved1F1B(stages, n_microbatches=n, loss_fn=loss_fn)   # several stages per rank: "
                   "a smaller bubble" },
             { PT, "DeepSpeed PipelineEngine and Megatron run 1F1B already: fewer micro-batches per step keeps fewer "
                   "in flight under GPipe" });
        return true;
    } else
        why(r, "Losses summed over micro-batches keep every micro-batch's graph alive until the one backward.");
    if (x->f->roles.act_known)
        why(r,
            " Measured: %s of activations; a backward per micro-batch keeps one micro-batch's alive (at least "
            "half of them go).",
            og_hb((double)x->f->roles.act).s);
    HOWS(x, r,
         { PT, "for mb in micro_batches: (model(**mb).loss / len(micro_batches)).backward()   # frees this graph" },
         { PT, "optimizer.step(); optimizer.zero_grad(set_to_none=True)   # once, after the last: the same gradients" },
         { PT, "running_loss += loss.item()   # for logging keep a number, not the tensor and its graph" },
         { PT,
           "with model.no_sync(): ...   # DistributedDataParallel: skip the all-reduce before the last micro-batch" });
    return true;
}

static bool b_no_weight_gradients(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->opt_params) { /* an optimizer trains something else: its gradient flows back through these weights */
        why(r,
            "The weights of the models in eval mode (%s) require grad, but no optimizer holds them; the optimizers "
            "hold %s of parameters. The backward toward those fills a .grad for every weight it passes through, %s "
            "beyond the trained parameters' so far, that nothing reads. Frozen, the weights take no gradient, and "
            "autograd still carries it through them to what is trained.",
            og_hb((double)ro->untrained_eval).s, og_hb((double)ro->opt_params).s,
            og_hb((double)(ro->grads - ro->opt_params)).s);
        HOWS(x, r, { PT, "model.requires_grad_(False)   # each model no optimizer trains, once after loading" },
             { PT, "for g in optimizer.param_groups: [p.requires_grad_(True) for p in g[\"params\"]]   # only "
                   "what is trained takes a gradient" });
        return true;
    }
    why(r,
        "The model's weights (%s, in eval mode) require grad, but no optimizer in the job holds them: the backward the "
        "program asks for (an attribution, a saliency map, a probe of the activations) fills a .grad for every "
        "weight, %s so far, that nothing reads. Frozen, the weights take no gradient; autograd still carries the "
        "gradient to the inputs and activations that require it.",
        og_hb((double)ro->untrained_eval).s, og_hb((double)ro->grads).s);
    HOWS(x, r, { PT, "model.requires_grad_(False)   # once, after loading: the weights get no .grad" },
         { PT, "grads = torch.autograd.grad(metric, [acts])   # only the gradients asked for; not metric.backward()" });
    return true;
}

static bool b_teacher_no_grad(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    uint64_t frozen = ro->purpose_bytes[OG_PURPOSE_teacher] ? ro->purpose_bytes[OG_PURPOSE_teacher] : ro->frozen_models;
    if (!frozen && ro->untrained_running) {
        why(r,
            "A model running at the failure (%s of parameters) requires grad, but no optimizer trains it (a "
            "teacher deep-copied from the student, a target network): with autograd on its forward keeps every "
            "activation, and backward fills its .grad, for weights nothing updates. Freeze it and run it under "
            "torch.no_grad().",
            og_hb((double)ro->untrained_running).s);
        HOWS(x, r,
             { PT, "teacher.requires_grad_(False)   # right after copy.deepcopy(student): a copy keeps requires_grad" },
             { PT, "with torch.no_grad(): t_out = teacher(batch)   # its EMA update needs no graph either" });
        return true;
    }
    if (!frozen && ro->untrained_ref) {
        why(r,
            "A reference or teacher model (%s of parameters) requires grad, but no optimizer trains it: .eval() turns "
            "off dropout, not autograd, so each forward of it with autograd on keeps every activation until a backward "
            "that updates nothing. Freeze it and compute its outputs under torch.no_grad().",
            og_hb((double)ro->untrained_ref).s);
        HOWS(x, r, { PT, "ref_model.requires_grad_(False)   # once, after loading it" },
             { PT,
               "with torch.no_grad(): ref_logps = logps(ref_model, batch)   # or precompute them once, then free it" });
        return true;
    }
    why(r,
        "Autograd was on at the failure while a frozen model (a teacher, a reference model: %s) is part of the "
        "job. Run with autograd on, its forward keeps every activation for a backward that never reaches its "
        "weights; under torch.no_grad() each layer's activations are freed as the next one runs.",
        og_hb((double)frozen).s);
    HOWS(x, r, { PT, "with torch.no_grad(): t_out = teacher(batch)   # or torch.inference_mode(); then the student" },
         { PT, "teacher.eval(); teacher.requires_grad_(False)   # frozen weights keep no gradients either" },
         { ANY, "A loss on the teacher's features needs no graph through the teacher: t_out.detach() is enough (not "
                "so for a model the gradient must flow through, e.g. a GAN's discriminator)." });
    return true;
}

static bool b_snapshot_to_cpu(const rctx_t *x, og_remedy_t *r)
{
    copy_words_t c = copy_words(x);
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->copy_kept && og_covers(x, (double)ro->copy_kept)) { /* copies kept across steps (facts: copy_kept) */
        const og_roles_t *rr = &x->rec->memory.fw.roles;
        char lb[160], role[sizeof rr->holders[0].copy_of] = "";
        const char *holder = holder_label(x, ro->copy_holder, lb, sizeof lb);
        uint64_t mine = ro->copy_kept;
        if (ro->copy_holder >= 0) {
            og_cpy(role, sizeof role, rr->holders[ro->copy_holder].copy_of, sizeof role);
            mine = rr->holders[ro->copy_holder].bytes;
        }
        why(r,
            "%s keeps %s on the GPU: copies of the %s kept beside the model (weight snapshots for averaging or "
            "interpolating, a best model, a rollback point), %s of them in all. They are read only when averaged, "
            "interpolated or restored: in host memory or on disk they take nothing on the card.",
            holder ? holder : "The program", og_hb((double)mine).s,
            strcmp(role, "optimizer_state") == 0 ? "optimizer state, or of the weights twice (two copies of the "
                                                   "weights have the sizes of Adam's two moments)"
                                                 : "weights",
            og_hb((double)ro->copy_kept).s);
        HOWS(x, r,
             { PT, "snap = [p.detach().to(\"cpu\", copy=True) for p in model.parameters()]   # a snapshot in host "
                   "memory (.pin_memory() for fast copies back)" },
             { PT, "torch.save(model.state_dict(), f\"snap_{step}.pt\")   # or on disk; average them on the CPU "
                   "at the end" },
             { ANY, "Keep a running average on the CPU instead of a window of copies: one copy, updated every N "
                    "steps" });
        return true;
    }
    why(r,
        "Outside the training step the running code%s holds %s copied so far from the model's %s of weights "
        "and their state: a snapshot of the model (the best model so far) made on the GPU beside what it "
        "copies. A one-off copy, not a leak: in host memory or on disk it takes nothing on the card.",
        c.site, c.held.s, c.weights.s);
    HOWS(x, r, { PT, "best = {k: v.detach().to(\"cpu\", copy=True) for k, v in model.state_dict().items()}" },
         { PT, "torch.save({\"model\": model.state_dict(), \"optim\": optimizer.state_dict()}, \"best.pt\")   "
               "# reload with map_location=\"cpu\" at the end" },
         { ANY, "Do not deepcopy optimizer.state_dict() on the GPU: its moments are twice the weights (Adam)." });
    return true;
}

static bool b_fewer_beams(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    int nb = ro->num_beams;
    uint64_t kv = ro->purpose_bytes[OG_PURPOSE_kv_cache];
    why(r, "The generation runs a beam search of %d beams: every beam keeps its own KV cache and logits", nb);
    if (kv)
        why(r, " (the cache held %s at the failure)", og_hb((double)kv).s);
    why(r, ", so memory grows with the beam width times the new tokens.");
    if (nb > 4)
        why(r, " 4 beams keep 4/%d of it; 1 (greedy or sampling) keeps 1/%d.", nb, nb);
    else
        why(r, " 1 beam (greedy or sampling) keeps 1/%d of it.", nb);
    how(r, "%smodel.generate(inputs, num_beams=%d)   # or generation_config.num_beams; 1: greedy or do_sample=True",
        pt(x), nb > 4 ? 4 : 1);
    how(r, "%smodel.generate(inputs, num_beams=N, early_stopping=True)   # stop when N hypotheses are done", pt(x));
    return true;
}

static bool b_smaller_kv_cache(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (og_generation_growth(x) && ro->kv < 0) {
        /* a cache growing within the generation: a fixed one sized for what is generated, or a smaller kind */
        r->title = "A smaller KV cache: quantized, offloaded, or preallocated to the length you generate";
        if (ro->purpose_bytes[OG_PURPOSE_kv_cache])
            why(r, "The KV cache held %s at the failure and grows with every new token. ",
                og_hb((double)ro->purpose_bytes[OG_PURPOSE_kv_cache]).s);
        why(r, "A 4-bit or offloaded cache keeps a fraction of it on the GPU; a static cache preallocated for the "
               "batch and length you generate fails at the start, not after many tokens, and does not fragment.");
        how(r, "%smodel.generate(inputs, cache_implementation=\"quantized\")   # Hugging Face: a 4-bit KV cache",
            pt(x));
        how(r,
            "%smodel.generate(inputs, cache_implementation=\"offloaded\")   # the cache in host memory, layer by "
            "layer",
            pt(x));
        how(r, "%smodel.generate(inputs, cache_implementation=\"static\", max_new_tokens=N)   # sized up front", pt(x));
        return true;
    }
    if (ro->kv < 0 && ro->building == OG_PURPOSE_kv_cache) {
        /* the cache being reserved when it failed (a serving engine's start-up), sized as a share of the card */
        const og_record_t *rec = x->rec;
        if (x->larger_than_device && x->capacity) {
            /* one piece larger than the card: sized from another device's total, not this one's */
            why(r,
                "This process was reserving its KV cache when it failed: the %s it asked for in one piece is more "
                "than this whole device (%s): it was sized for more memory than this device has (a MIG slice's "
                "parent GPU as pynvml reports it, a config written for a larger card). Size it from what this device "
                "has free.",
                req_hb(x).s, og_hb((double)x->capacity).s);
            HOWS(x, r,
                 { PT, "free, total = torch.cuda.mem_get_info()   # this device (a MIG slice's own size), not "
                       "pynvml's parent GPU" },
                 { ANY, "num_blocks = int(free * 0.9) // block_bytes   # the pool from what is free" });
            return true;
        }
        why(r,
            "This process was reserving its KV cache when it failed: %s so far, and the %s it asked for was the "
            "next piece. A serving engine sizes that cache as a share of the whole card (vLLM: "
            "--gpu-memory-utilization, 0.9 by default), not of what is free",
            og_hb((double)ro->purpose_bytes[OG_PURPOSE_kv_cache]).s, req_hb(x).s);
        int big = x->f->same_program_big;
        if (big >= 0 && x->f->other_same_program) {
            char name[sizeof rec->memory.other[0].name];
            og_cpy(name, sizeof name, rec->memory.other[big].name, sizeof name);
            why(r, "; another instance of this program (pid %d %s) holds %s on this GPU: give each its share.",
                rec->memory.other[big].pid, name, og_hb((double)x->f->other_same_program).s);
        } else if (x->other)
            why(r, "; other processes hold %s on this GPU.", og_hb((double)x->other).s);
        else
            why(r, ".");
        if (x->total && x->other && x->other < x->total) {
            /* this process's share: what the others leave, less a twentieth for contexts and growth */
            double share = (double)(x->total - x->other) / (double)x->total - 0.05;
            if (share >= 0.05)
                how(r, "vLLM: --gpu-memory-utilization %.2f   # this server's share of the card: the others hold %s",
                    (double)(int)(share * 20) / 20, og_hb((double)x->other).s);
        }
        HOWS(x, r,
             { ANY, "vLLM: --num-gpu-blocks-override N or a smaller --max-model-len   # a KV cache of a set size" },
             { ANY, "SGLang: --mem-fraction-static; Text Generation Inference: --cuda-memory-fraction" });
        return true;
    }
    char lb[160];
    const char *label = holder_label(x, ro->kv, lb, sizeof lb);
    why(r,
        "%s holds %s, reserved up front and kept across calls, and the running code could not get %s beside "
        "it: a KV cache preallocated for the largest batch and length the server allows takes the memory that "
        "each request's own tensors need. Its size is a setting: half the maximum batch or length halves it.",
        label ? label : "A KV cache", og_hb((double)ro->kv_bytes).s, req_hb(x).s);
    HOWS(x, r,
         { PT,
           "StaticCache(config=model.config, max_batch_size=B / 2, max_cache_len=L)   # or a smaller max_cache_len" },
         { ANY, "vLLM: --gpu-memory-utilization 0.8 --max-num-seqs N --max-model-len L   # a smaller KV cache" },
         { ANY, "Text Generation Inference: --max-batch-total-tokens N" });
    return true;
}

/* a registry of whole models by key (roles.models, og_role_facts_t.registry_models): name it, say how many of its
 * models fit beside the rest of the job, and how to bound it by memory */
static bool registry_text(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    const og_roles_t *rr = &x->rec->memory.fw.roles;
    int g = ro->registry_group;
    char names[sizeof rr->models[0].names], cls[sizeof rr->models[0].cls];
    og_cpy(names, sizeof names, rr->models[g].names, sizeof names);
    og_cpy(cls, sizeof cls, rr->models[g].cls, sizeof cls);
    char *cut = strchr(names, ',');
    if (cut)
        *cut = 0;
    if ((cut = strstr(names, "[key]")) != NULL) /* the map itself */
        *cut = 0;
    uint64_t each = rr->models[g].bytes, rest = x->footprint, held = ro->registry_models + ro->arriving;
    rest = rest > held ? rest - held : 0;
    uint64_t budget = x->total > rest ? x->total - rest : 0;
    why(r,
        "%s keeps %d %s models resident on the GPU by key (%s of parameters each, %s in all): a registry "
        "bounded by a count, or not at all, fills the card before it evicts.",
        names, rr->models[g].named, cls[0] ? cls : "", og_hb((double)each).s, og_hb((double)ro->registry_models).s);
    if (each && budget)
        why(r,
            " The rest of the job leaves %s of the %s card: at most %llu of them fit; evict before loading "
            "when the resident ones and the next would pass that.",
            og_hb((double)budget).s, og_hb((double)x->total).s, (unsigned long long)(budget / each));
    HOWS(x, r,
         { ANY, "while resident_bytes + next_bytes > budget: registry.popitem(last=False)   # evict by memory, "
                "least recently used first" },
         { PT, "evicted.to(\"cpu\")   # keep evicted models in host RAM: back on the GPU in seconds, not a load "
               "from disk" },
         { ANY, "Fine-tunes of one base: serve them as LoRA adapters over one shared base model (vLLM "
                "--enable-lora, S-LoRA)" });
    return true;
}

/* different models held by key, none running (og_role_facts_t.keyed_models): name the map and each idle model,
 * say what the one arriving needs, and how to keep only the models in use on the GPU */
static bool keyed_models_text(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    const og_roles_t *rr = &x->rec->memory.fw.roles;
    char names[sizeof rr->models[0].names];
    og_cpy(names, sizeof names, rr->models[ro->keyed_group].names, sizeof names);
    char *cut = strchr(names, ',');
    if (cut)
        *cut = 0;
    if ((cut = strstr(names, "[key]")) != NULL) /* the map itself */
        *cut = 0;
    why(r, "%s keeps %d idle models on the GPU by key:", names, ro->keyed_count);
    int nm = OG_FILLED(rr->nmodels, rr->models), listed = 0;
    for (int i = 0; i < nm; i++) {
        char cls[sizeof rr->models[0].cls], ni[sizeof rr->models[0].names];
        og_cpy(ni, sizeof ni, rr->models[i].names, sizeof ni);
        og_cpy(cls, sizeof cls, rr->models[i].cls, sizeof cls);
        if (rr->models[i].running || rr->models[i].named < 1 || !strstr(ni, "[key]"))
            continue;
        if (listed == 3) {
            why(r, ", ...");
            break;
        }
        why(r, "%s %s (%s)", listed++ ? "," : "", cls[0] ? cls : "a model", og_hb((double)rr->models[i].bytes).s);
    }
    why(r, "; %s in all", og_hb((double)ro->keyed_models).s);
    if (ro->arriving)
        why(r, ", and the model being loaded holds %s so far", og_hb((double)ro->arriving).s);
    why(r, ". Keep only the models in use on the GPU: evict an idle one before loading the next.");
    HOWS(x, r,
         { PT, "old = MODELS.pop(key); old.to(\"cpu\"); del old; torch.cuda.empty_cache()   # evict an idle model "
               "before loading another (host RAM: back on the GPU in seconds)" },
         { ANY, "while resident_bytes + next_bytes > budget: evict the least recently used model   # an LRU "
                "bounded by memory, not by a count" },
         { ANY, "Or serve the models from separate processes or GPUs, each sized for its own model" });
    return true;
}

static bool b_bounded_cache(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    if (ro->registry_group >= 0 && (ro->keeper < 0 || ro->registry_models >= ro->keeper_bytes))
        return registry_text(x, r);
    if (!ro->registry_models && ro->keyed_group >= 0 && og_registry_bytes(x) &&
        (ro->keeper < 0 || ro->keyed_models >= ro->keeper_bytes))
        return keyed_models_text(x, r);
    if (ro->lora_piled && og_covers(x, (double)ro->lora_params) &&
        (ro->keeper < 0 || ro->lora_params >= ro->keeper_bytes)) {
        why(r,
            "The models hold %s of LoRA adapters' parameters, %.1fx their other weights: every adapter loaded so far. "
            "Keep a bounded set, the N used last, deleting the oldest before loading a new one.",
            og_hb((double)ro->lora_params).s, og_lora_ratio(ro));
        r->saving = "The adapters beyond the bound";
        how(r,
            "%sif len(loaded) >= N: pipe.delete_adapters(loaded.pop(0))   # before load_lora_weights(path, "
            "adapter_name=new)",
            pt(x));
        how(r, "vLLM: --enable-lora --max-loras N --max-cpu-loras M   # adapters kept in host memory, N on the GPU");
        return true;
    }
    char lb[160];
    const char *label = holder_label(x, x->f->roles.keeper, lb, sizeof lb);
    why(r, "%s keeps %s of tensors on the GPU from one step to the next", label ? label : "A cache",
        og_hb((double)ro->keeper_bytes).s);
    if (x->has[OG_CAUSE_GROWTH] && x->f->growth.per_step)
        why(r, ", and memory grew by about %s per step", og_hb((double)x->f->growth.per_step).s);
    why(r, ": a cache with no bound grows until the card is full. Bound it, keep its entries in host memory, or "
           "store only what is needed (detached, smaller).");
    /* the lines name the holder where it is a mapping the program keeps by a name (self.bank, ChatSession.cache) */
    char name[sizeof x->rec->memory.fw.roles.holders[0].name] = "cache";
    if (ro->keeper >= 0 && ro->keeper_map && x->rec->memory.fw.roles.holders[ro->keeper].name[0])
        og_cpy(name, sizeof name, x->rec->memory.fw.roles.holders[ro->keeper].name, sizeof name);
    how(r, "%s%s[key] = value.detach().cpu()   # entries in host memory; .to(\"cuda\") when used", pt(x), name);
    how(r, "if len(%s) >= N: %s.pop(next(iter(%s)))   # evict the oldest (or functools.lru_cache(maxsize=N))", name,
        name, name);
    how(r, "%swith torch.no_grad(): value = encoder(x)   # an entry made with autograd on keeps its graph", pt(x));
    return true;
}

static bool b_fewer_graph_shapes(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    uint64_t pools = ro->pools ? ro->pools : x->rec->memory.fw.private_pool_bytes;
    why(r,
        "%s is in the private memory pools of live CUDA graphs: every captured graph keeps its own pool, which "
        "empty_cache() does not return, so capturing a graph for every shape multiplies it.",
        og_hb((double)pools).s);
    HOWS(x, r,
         { ANY,
           "Capture a few sizes (e.g. batch 1, 2, 4, 8, 16, 32, 64) and pad each batch up to the next captured one." },
         { PT, "with torch.cuda.graph(g, pool=first_graph.pool()): ...   # captures that run one at a time "
               "can share one pool" },
         { ANY, "Serving engines: fewer capture sizes (vLLM: cuda_graph_sizes), or --enforce-eager to capture none." });
    return true;
}

static bool b_reuse_process_groups(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    char lib[sizeof rec->memory.by_library[0].library];
    og_cpy(lib, sizeof lib, x->f->comm_lib >= 0 ? rec->memory.by_library[x->f->comm_lib].library : "NCCL", sizeof lib);
    why(r, "%s (collective communication) holds %s on this GPU", og_base_name(lib), og_hb((double)x->f->comm_bytes).s);
    if (x->has[OG_CAUSE_GROWTH] && x->f->comm_holds_growth)
        why(r,
            x->f->comm_bytes >= x->f->growth.rise
                ? ", at least all of the growth (%s)"
                : ", the growth's step-by-step part (the steps were its own allocations, "
                  "%s of rise in all)",
            og_hb((double)x->f->growth.rise).s);
    why(r, ": every communicator (each dist.new_group, each process group created anew) gets its own buffers, and "
           "creating groups again and again (per evaluation, per step) piles them up.");
    HOWS(x, r, { PT, "eval_group = dist.new_group(ranks)   # once, at start-up; reuse it in every evaluation" },
         { PT, "dist.destroy_process_group(group)   # for a group no longer needed" },
         { ANY, "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT   # logs every communicator created" });
    return true;
}

static bool b_nccl_buffsize(const rctx_t *x, og_remedy_t *r)
{
    const og_facts_t *f = x->f;
    why(r,
        "NCCL holds %s on this GPU; each communicator keeps buffers per channel and peer, sized by NCCL_BUFFSIZE "
        "(4 MiB by default).",
        og_hb((double)f->comm_bytes).s);
    if (f->comm_setting_excess) {
        why(r,
            " NCCL_BUFFSIZE=%llu (%s) is set in this job's environment: at the default NCCL would hold about %s, "
            "%s less.",
            (unsigned long long)f->comm_buffsize, og_hb((double)f->comm_buffsize).s,
            og_hb((double)(f->comm_bytes - f->comm_setting_excess)).s, og_hb((double)f->comm_setting_excess).s);
        how(r, "unset NCCL_BUFFSIZE   # back to NCCL's 4 MiB default (this job sets %llu)",
            (unsigned long long)f->comm_buffsize);
    }
    if (f->comm_min_channels) {
        why(r, " NCCL_MIN_NCHANNELS=%d forces at least %d channels on every communicator, each with its own buffers.",
            f->comm_min_channels, f->comm_min_channels);
        how(r, "unset NCCL_MIN_NCHANNELS   # let NCCL choose the channels for this topology");
    }
    if (!f->comm_setting_excess)
        HOWS(x, r, { ANY, "export NCCL_BUFFSIZE=2097152   # 2 MiB buffers: less memory per communicator" });
    if (!f->comm_min_channels)
        HOWS(x, r, { ANY, "export NCCL_MAX_NCHANNELS=4   # fewer channels, fewer buffers (slower collectives)" });
    return true;
}

/* "cross_entropy at train.py:108" from roles.operation's frame, or "" */
static void operation_site(const rctx_t *x, char *buf, size_t n)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    char file[sizeof ro->op_frame.file], fn[sizeof ro->op_frame.function];
    og_cpy(file, sizeof file, ro->op_frame.file, sizeof file);
    og_cpy(fn, sizeof fn, ro->op_frame.function, sizeof fn);
    const char *base = strrchr(file, '/');
    buf[0] = 0;
    if (fn[0] && file[0])
        og_fmt(buf, n, " (%s at %s:%d)", fn, base ? base + 1 : file, ro->op_frame.line);
}

/* the names the running code holds models of group classes by ("base, tuned"), from roles.models */
static void model_names(const rctx_t *x, char *buf, size_t n)
{
    const og_roles_t *ro = &x->rec->memory.fw.roles;
    int nm = OG_FILLED(ro->nmodels, ro->models);
    size_t l = 0;
    buf[0] = 0;
    for (int i = 0; i < nm && l + 1 < n; i++) {
        char names[sizeof ro->models[0].names];
        og_cpy(names, sizeof names, ro->models[i].names, sizeof names);
        if (ro->models[i].named <= 0 || !names[0])
            continue;
        og_fmt(buf + l, n - l, "%s%s", l ? ", " : "", names);
        l = strlen(buf);
    }
}

static bool b_fused_cross_entropy(const rctx_t *x, og_remedy_t *r)
{
    char site[200];
    operation_site(x, site, sizeof site);
    /* models measured with no attention layer and no embedding table: no tokens and no vocabulary, the classes of a
     * dense prediction scored at every position (pixels, voxels, points) */
    const og_opt_u64_t emb = x->rec->memory.fw.roles.embedding_bytes;
    if (x->f->roles.attention == -1 && og_known(emb) && emb.v == 0) {
        r->saving = "The loss's [positions, classes] tensors: the scores' float32 copy and their log-probabilities";
        r->cost = "A loop over slabs of positions; the same loss";
        why(r,
            "The failing request, %s, is made by the loss over the per-class scores%s: cross-entropy over many "
            "classes at every position (pixels, voxels, points) makes [positions, classes] tensors (float32 scores, "
            "their log-probabilities), one set per output the loss reads. Computed over slabs of positions it never "
            "makes them whole: the same loss and gradients.",
            req_hb(x).s, site);
        HOWS(x, r,
             { PT, "loss = sum(F.cross_entropy(out[:, :, s], target[:, s], reduction=\"sum\") for s in slabs) / "
                   "target.numel()   # a slab of positions at a time, each under torch.utils.checkpoint" },
             { ANY, "Do not upcast the whole output to float32 for the loss: log_softmax accumulates in float32 "
                    "itself under autocast" });
        return true;
    }
    if (x->f->roles.operation != OG_OP_cross_entropy && x->f->roles.stmt_logits) {
        const og_roles_t *ro = &x->rec->memory.fw.roles;
        char file[sizeof ro->stmt.file], fn[sizeof ro->stmt.function];
        og_cpy(file, sizeof file, ro->stmt.file, sizeof file);
        og_cpy(fn, sizeof fn, ro->stmt.function, sizeof fn);
        why(r,
            "The failing request, %s, is the model's logits for every position (%s:%d in %s), made for the loss of "
            "this training step: cross-entropy over a large vocabulary makes [tokens, vocabulary] tensors (float32 "
            "logits, their log-probabilities). A fused or chunked loss never makes them whole: the same loss and "
            "gradients.",
            req_hb(x).s, og_base_name(file), ro->stmt.line, fn);
    } else
        why(r,
            "The failing request, %s, is made by the loss over the logits%s: cross-entropy over a large vocabulary "
            "makes [tokens, vocabulary] tensors (float32 logits, their log-probabilities). A fused or chunked loss "
            "never makes them whole: the same loss and gradients.",
            req_hb(x).s, site);
    HOWS(x, r,
         { PT, "loss = chunked_ce(hidden, lm_head.weight, labels, chunk=1024)   # logits of 1024 tokens at a time, "
               "each chunk under torch.utils.checkpoint so backward recomputes it" },
         { ANY, "A fused linear cross-entropy (e.g. Liger Kernel's, or cut-cross-entropy) computes the loss from the "
                "hidden states and the output layer without the logits" },
         { ANY, "Do not upcast the whole logits to float32 for the loss: the fused kernels accumulate in float32 "
                "themselves" });
    return true;
}

/* a preference-tuning reference kept beside the policy (facts: roles.reference_copy, reference_group,
 * reference_base) */
static bool b_adapter_disabled_reference(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char names[80];
    group_names(x, ro->reference_group, names, sizeof names);
    why(r,
        "%s%s%s holds %s of frozen weights beside the model being trained, which trains adapters on a base of the "
        "same size (its optimizer trains %s of its parameters): the reference is a second copy of that base. The "
        "policy with its adapters switched off computes exactly the reference's outputs, from the one copy.",
        names[0] ? "The reference model (" : "A frozen reference model", names, names[0] ? ")" : "",
        og_hb((double)ro->reference_copy).s, og_hb((double)ro->opt_params).s);
    HOWS(x, r,
         { ANY, "TRL: DPOTrainer(model=peft_model, ref_model=None, ...)   # the adapters are disabled for the "
                "reference pass" },
         { ANY, "with model.disable_adapter(): ref_logits = model(**batch).logits   # peft, under torch.no_grad()" },
         { ANY, "Or precompute the reference log-probabilities once (TRL: precompute_ref_log_probs=True), then free "
                "the reference" });
    return true;
}

/* pipelines that each loaded the same components (facts: roles.repeated_components, repeated_count) */
static bool b_share_pipeline_components(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    const og_roles_t *rr = &x->rec->memory.fw.roles;
    char names[80], cls[sizeof rr->models[0].cls] = "";
    if (!ro->repeated_components || !og_covers(x, (double)ro->repeated_components)) { /* a second set (twins) */
        group_names(x, ro->twin_group, names, sizeof names);
        if (ro->twin_group >= 0)
            og_cpy(cls, sizeof cls, rr->models[ro->twin_group].cls, sizeof cls);
        why(r,
            "A second set of the components is on the GPU: %d frozen models held as attributes of an object (the "
            "largest %s%s%s%s) are copies of models this program holds by other names, %s in all: a pipeline kept "
            "after its work, beside the models being trained or run. Built from the program's own models it adds no "
            "weights; or free it once its work is done.",
            ro->twin_groups, cls[0] ? cls : "model", names[0] ? " (" : "", names, names[0] ? ")" : "",
            og_hb((double)ro->twin_components).s);
        HOWS(x, r,
             { ANY, "diffusers: pipe = StableDiffusionXLPipeline.from_pretrained(base, unet=unet, "
                    "text_encoder=text_encoder_one, text_encoder_2=text_encoder_two, vae=vae)" },
             { PT, "del pipe; gc.collect(); torch.cuda.empty_cache()   # once its images are made, before training" });
        return true;
    }
    group_names(x, ro->repeated_group, names, sizeof names);
    if (ro->repeated_group >= 0)
        og_cpy(cls, sizeof cls, rr->models[ro->repeated_group].cls, sizeof cls);
    why(r,
        "Every component is on the GPU %d times: %d objects each hold their own %s%s%s%s and the other "
        "components, frozen models of the same classes and sizes, %s beyond one set. Built from the first "
        "pipeline's components, the others share its weights.",
        ro->repeated_count, ro->repeated_count, cls[0] ? cls : "model", names[0] ? " (" : "", names,
        names[0] ? ")" : "", og_hb((double)ro->repeated_components).s);
    HOWS(x, r,
         { ANY, "diffusers: img2img = StableDiffusionXLImg2ImgPipeline(**txt2img.components)   # or "
                "AutoPipelineForImage2Image.from_pipe(txt2img)" },
         { ANY, "Load each model once and pass the same object to every wrapper that needs it" });
    return true;
}

static bool b_one_model_at_a_time(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char names[160];
    if (ro->trained_kept && og_covers(x, (double)ro->trained_kept) && ro->named_copies < x->shortfall) {
        const og_roles_t *rr = &x->rec->memory.fw.roles;
        char cls[sizeof rr->models[0].cls] = "";
        group_names(x, ro->trained_group, names, sizeof names);
        if (ro->trained_group >= 0)
            og_cpy(cls, sizeof cls, rr->models[ro->trained_group].cls, sizeof cls);
        bool loads = x->f->phase == OG_JP_loading; /* else a new training's first pass (facts.h: trained_kept) */
        why(r,
            "Another model is %s while the trained %s%s%s%s and its optimizer state are still referenced: %s "
            "(%s of optimizer state) that %s needs room beside. That training is over: freed first (or saved and "
            "freed), they leave the card to the model %s.",
            loads ? "loading" : "starting to train", cls[0] ? cls : "model", names[0] ? " (" : "", names,
            names[0] ? ")" : "", og_hb((double)ro->trained_kept).s, og_hb((double)ro->opt).s,
            loads ? "the load" : "its first pass", loads ? "being loaded" : "training now");
        if (loads)
            HOWS(x, r,
                 { PT, "model.save_pretrained(out_dir); del trainer, model, optimizer; gc.collect(); "
                       "torch.cuda.empty_cache()   # before the next from_pretrained" },
                 { ANY, "Or run the next step (merge, export, evaluation) in a process of its own, which starts "
                        "with an empty card" });
        else
            HOWS(x, r,
                 { PT, "torch.save(model.state_dict(), path); del model, optimizer; gc.collect(); "
                       "torch.cuda.empty_cache()   # before the next experiment" },
                 { ANY, "Or run each experiment in a process of its own (a notebook: restart the kernel), which "
                        "starts with an empty card" });
        return true;
    }
    if (ro->reference_copy && !ro->reference_base && og_covers(x, (double)ro->reference_copy) &&
        ro->named_copies < x->shortfall && !(ro->trained_kept && og_covers(x, (double)ro->trained_kept))) {
        group_names(x, ro->reference_group, names, sizeof names);
        why(r,
            "The reference model%s%s%s holds %s on the GPU beside the policy being trained, its gradients and "
            "optimizer state, for one thing: the reference log-probabilities of each batch. Computed once over the "
            "dataset before training (one model at a time), they need the reference only then; freed after, it "
            "leaves the card to training.",
            names[0] ? " (" : "", names, names[0] ? ")" : "", og_hb((double)ro->reference_copy).s);
        HOWS(x, r,
             { ANY, "TRL: DPOConfig(precompute_ref_log_probs=True)   # one pass of the reference before training, "
                    "then it is not needed" },
             { PT, "ref_logps = [reference_logps(ref_model, b) for b in loader]; del ref_model; gc.collect(); "
                   "torch.cuda.empty_cache()" },
             { ANY, "Or train LoRA adapters: the policy with its adapters disabled is then the reference, one "
                    "copy of the base" });
        return true;
    }
    model_names(x, names, sizeof names);
    if (ro->named_copies < x->shortfall && ro->other_group >= 0) {
        /* another class (roles.other_resident): the name's model and what it keeps beside it */
        const og_roles_t *rr = &x->rec->memory.fw.roles;
        char cls[sizeof rr->models[0].cls];
        og_cpy(cls, sizeof cls, rr->models[ro->other_group].cls, sizeof cls);
        group_names(x, ro->other_group, names, sizeof names);
        why(r,
            "The running code holds %s (%s of parameters) by a name, %s, none of whose code runs, while another "
            "model loads; with what that name keeps beside it (an engine's KV cache, buffers) freeing it gives back "
            "%s. Done with, it can be freed before the next model loads; its outputs kept in host memory or on "
            "disk.",
            cls, og_hb((double)rr->models[ro->other_group].bytes).s, names[0] ? names : "held by name",
            og_hb((double)ro->other_resident).s);
    } else
        why(r,
            "The running code holds %s of another model of the same class on the GPU (%s) beside the one it %s: "
            "two models resident at once for a comparison or an ensemble. One at a time needs room for one.",
            og_hb((double)ro->named_copies).s, names[0] ? names : "held by name",
            x->f->phase == OG_JP_loading ? "is loading" : "runs");
    if (ro->quant_reference) /* a quantized model checked against its reference, which keeps its precision */
        why(r,
            " Of the two, one is quantized (%s of its %s in 8 bits or fewer) and the other (%s) is not: a quantized "
            "model checked against its reference, whose outputs at full precision can be saved from a pass of its "
            "own.",
            og_hb((double)x->rec->memory.fw.roles.models[ro->quant_group].quant.v).s,
            og_hb((double)x->rec->memory.fw.roles.models[ro->quant_group].bytes).s,
            og_hb((double)ro->quant_reference).s);
    HOWS(x, r,
         { ANY, "Run the first model over the whole set and save its outputs (to host memory or disk), then free "
                "it before the next one loads; compare the saved outputs" });
    /* one name held beside the running model is the one to free; of several, which is done with is the program's
     * to say: the line names them, not one of them */
    if (names[0] && !strchr(names, ','))
        how(r, "%sdel %s; gc.collect(); torch.cuda.empty_cache()   # once its outputs are saved, before the next loads",
            pt(x), names);
    else if (names[0])
        how(r, "%sdel model_done; gc.collect(); torch.cuda.empty_cache()   # model_done: whichever of %s is finished",
            pt(x), names);
    else
        how(r, "%sdel model_done; gc.collect(); torch.cuda.empty_cache()   # the first model, before the next loads",
            pt(x));
    HOWS(x, r,
         { ANY, "Or put each model on its own GPU (device_map, .to(\"cuda:1\")), or keep the idle one in host memory "
                "and move it to the GPU only for its turn" });
    return true;
}

static bool b_eval_without_copy(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    char names[160];
    model_names(x, names, sizeof names);
    bool named = !ro->named_frozen && ro->named_copies && og_covers(x, (double)ro->named_copies);
    if (!named && ro->operation == OG_OP_copy && ro->copy_made_known) {
        copy_names_t c = copy_names(x);
        why(r,
            "The failing statement (%s) makes a deep copy of %s (%s of parameters; %s made so far) to evaluate it, "
            "next to the weights, gradients and optimizer state that training keeps: the copy is what the "
            "evaluation added. Evaluating the training model itself needs no copy.",
            c.site[0] ? c.site : "a copy.deepcopy", c.source[0] ? c.source : "the model",
            og_hb((double)(ro->copy_source > ro->copy_made ? ro->copy_source : ro->copy_made)).s,
            og_hb((double)ro->copy_made).s);
    } else
        why(r,
            "A training job holds a second copy of its model, %s, by a name of the running code (%s), while it "
            "evaluates: a copy made for the evaluation (copy.deepcopy(model)) next to the weights, gradients and "
            "optimizer state that training keeps. Evaluating the training model itself needs no copy.",
            og_hb((double)ro->named_copies).s, names[0] ? names : "held by name");
    HOWS(x, r, { PT, "model.eval(); with torch.no_grad(): score = validate(model, loader)   # then model.train()" },
         { ANY, "If a frozen copy is really needed: keep it in host memory (copy.deepcopy(model).to(\"cpu\")) or "
                "evaluate a saved checkpoint in another process" });
    return true;
}

static bool b_free_training_state(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    why(r,
        "The failing pass is %s, which reads neither the gradients nor the optimizer's state, yet both are still on "
        "the GPU: %s of gradients and %s of optimizer state (%s together). The gradients of the last backward live "
        "until the next zero_grad; the optimizer's state as long as the optimizer object does.",
        x->f->phase == OG_JP_generation ? "a generation" : "an evaluation", og_hb((double)ro->grads).s,
        og_hb((double)ro->opt).s, og_hb((double)ro->grads + (double)ro->opt).s);
    HOWS(x, r, { PT, "optimizer.zero_grad(set_to_none=True)   # before the evaluation: the gradients go" },
         { PT, "del optimizer; torch.cuda.empty_cache()   # when training is over (a notebook's evaluation cell)" },
         { ANY, "Evaluating between steps: keep the optimizer, free the gradients only (the next backward makes them "
                "again)" });
    return true;
}

static bool b_gradient_as_bucket_view(const rctx_t *x, og_remedy_t *r)
{
    const og_role_facts_t *ro = &x->f->roles;
    why(r,
        "DistributedDataParallel runs without gradient_as_bucket_view: its reducer keeps a flat bucket copy "
        "of every gradient for the all-reduce, %s on this GPU (the wrapped model's parameters that require "
        "grad). With views, the gradients live in the buckets and the copy goes.",
        og_hb((double)ro->ddp_buckets).s);
    HOWS(x, r, { PT, "model = DDP(model, device_ids=[local_rank], gradient_as_bucket_view=True)" },
         { ANY, "Keep optimizer.zero_grad() (set_to_none is fine); code must not assign a new tensor to p.grad" });
    return true;
}

static bool b_dynamic_padding(const rctx_t *x, og_remedy_t *r)
{
    const og_code_setting_t *cs = &x->rec->memory.fw.roles.settings[OG_SETTING_padding_to_max_length];
    char file[sizeof cs->at.file], fn[sizeof cs->at.function];
    og_cpy(file, sizeof file, cs->at.file, sizeof file);
    og_cpy(fn, sizeof fn, cs->at.function, sizeof fn);
    if (cs->has)
        why(r,
            "The program pads every input to a fixed maximum length (%s:%d in %s), not to each batch's longest: "
            "every layer computes and keeps activations for the padding.",
            og_base_name(file), cs->at.line, fn);
    else
        why(r, "Inputs padded to a fixed maximum length make every layer compute and keep activations for the "
               "padding.");
    if (x->f->roles.act_known)
        why(r, " Measured: %s of activations; they shrink by the padding's share (not measured).",
            og_hb((double)x->f->roles.act).s);
    HOWS(x, r, { PT, "enc = tokenizer(texts, padding=True, truncation=True, max_length=512)   # the batch's longest" },
         { PT, "or tokenize without padding and batch with DataCollatorWithPadding(tokenizer)" },
         { ANY, "Group inputs of similar length in a batch (group_by_length=True) so little padding is left" });
    return true;
}

static bool b_only_needed_outputs(const rctx_t *x, og_remedy_t *r)
{
    const og_code_setting_t *cs = &x->rec->memory.fw.roles.settings[OG_SETTING_extra_outputs];
    char file[sizeof cs->at.file], fn[sizeof cs->at.function], key[sizeof cs->key];
    og_cpy(file, sizeof file, cs->at.file, sizeof file);
    og_cpy(fn, sizeof fn, cs->at.function, sizeof fn);
    og_cpy(key, sizeof key, cs->key, sizeof key);
    if (!cs->has && og_all_position_logits(x)) { /* the logits of every position of a decoding pass */
        char site[200];
        operation_site(x, site, sizeof site);
        why(r,
            "The failing request, %s, is logits over the vocabulary for every position of the input%s, in a pass "
            "with a KV cache and autograd off: a decoding step reads the last position's only. Asked for that one "
            "(or the long input fed in chunks), the pass makes a fraction of it; the weights and the cache are as "
            "before.",
            req_hb(x).s, site);
        HOWS(x, r,
             { PT, "out = model(input_ids, past_key_values=cache, logits_to_keep=1)   # transformers: the last "
                   "position's logits (num_logits_to_keep in older versions)" },
             { PT, "h = model.model(input_ids, past_key_values=cache).last_hidden_state; "
                   "logits = model.lm_head(h[:, -1:])" },
             { PT, "for part in input_ids.split(4096, dim=1): out = model(part, past_key_values=cache, "
                   "logits_to_keep=1)   # a long prompt prefilled in chunks" });
        return true;
    }
    if (cs->has)
        why(r,
            "The program asks the model for %s=True (%s:%d in %s): it keeps one tensor per layer or per generated "
            "token until the call returns, beside what the job needs.",
            key[0] ? key : "extra outputs", og_base_name(file), cs->at.line, fn);
    else
        why(r, "Outputs kept for every layer or every generated token stay until the call returns.");
    if (x->f->roles.act_known)
        why(r, " Measured: %s of activations and temporaries; their share of it was not measured.",
            og_hb((double)x->f->roles.act).s);
    HOWS(
        x, r, { PT, "out = model(**batch)   # last_hidden_state only: no output_hidden_states / output_attentions" },
        { PT, "h = {}; model.layers[k].register_forward_hook(lambda m, i, o: h.update(k=o))   # the one layer needed" },
        { PT, "generate(..., return_dict_in_generate=False)   # or keep only the chosen tokens' log-probabilities" });
    return true;
}

static bool b_shard_before_load(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    const og_role_facts_t *ro = &x->f->roles;
    why_in_phase(x, r, "The failure came while loading the weights", NULL, " loaded so far");
    why(r, ": each of the job's %ld ranks loads the whole model onto its own GPU before it is sharded",
        rec->world_size);
    if (ro->known && ro->params)
        why(r, " (%s of parameters here so far; a shard would be about %s)", og_hb((double)ro->params).s,
            og_hb((double)ro->params / (double)rec->world_size).s);
    why(r, ". Loaded on the CPU or the meta device, each rank only ever holds its own shard on the GPU.");
    HOWS(x, r,
         { PT, "model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, low_cpu_mem_usage=True)"
               "   # no device_map: on the CPU" },
         { PT, "model = FSDP(model, device_id=local_rank, sync_module_states=True)   # rank 0 loads, the others "
               "build on the meta device (param_init_fn)" },
         { ANY, "DeepSpeed ZeRO-3: build the model inside deepspeed.zero.Init() (or Hugging Face's "
                "is_deepspeed_zero3_enabled path) so each rank materializes its partition only" });
    return true;
}

static bool b_one_rank_per_gpu(const rctx_t *x, og_remedy_t *r)
{
    const og_record_t *rec = x->rec;
    int n = x->f->node_ranks, v = rec->visible_devices;
    if (x->f->nested_launchers) { /* srun around torchrun: a world per task */
        int t = x->f->nested_launchers;
        why(r,
            "This rank's environment says srun started %d tasks on this node (SLURM_NTASKS_PER_NODE) and torchrun "
            "started %d ranks in each (LOCAL_WORLD_SIZE): %d worlds of the same training, %d ranks on %d visible %s. "
            "Other processes hold %s on GPU %d: the other worlds' ranks with this local rank. Start one launcher per "
            "node, or let srun start the ranks without torchrun.",
            t, t ? n / t : 0, t, n, v, og_plural(v, "GPU", "GPUs"), og_hb((double)x->f->other_all).s,
            rec->event.device);
        how(r, "#SBATCH --ntasks-per-node=1   # then: srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=%d ...", v);
        how(r,
            "or #SBATCH --ntasks-per-node=%d --gpus-per-task=1; srun python train.py   # RANK from SLURM_PROCID, "
            "LOCAL_RANK from SLURM_LOCALID",
            v);
        return true;
    }
    why(r,
        "%d ranks of this job run on this machine, which has %d visible %s: %d other %s of the job %s %s on GPU %d, "
        "each with its own context and tensors. No set_device can part them: some ranks must share a GPU "
        "(local_rank %% device_count()).",
        n, v, og_plural(v, "GPU", "GPUs"), x->npeers, og_plural(x->npeers, "rank", "ranks"),
        og_plural(x->npeers, "holds", "hold"), og_hb((double)x->peers_bytes).s, rec->event.device);
    how(r, "torchrun --nproc-per-node=%d ...   # one rank per GPU (or --nproc-per-node=gpu)", v);
    HOWS(x, r,
         { PT, "assert int(os.environ[\"LOCAL_WORLD_SIZE\"]) <= torch.cuda.device_count()   # fail at start, "
               "not local_rank % device_count()" },
         { ANY, "Keep the global batch with gradient accumulation across the fewer ranks, or run on more GPUs." });
    return true;
}

/* ------------------------------------------------------------------ the catalog */

const og_remedy_def_t og_remedy_catalog[R_COUNT] = {
#define X(name, id, order, build, applies, title, saving, cost) \
    [R_##name] = { id, title, saving, cost, order, applies, build },
#include "remedies.def"
#undef X
};
