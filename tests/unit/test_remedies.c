/* og_select_remedies: selection per cause, settings already in force, compute capability,
 * framework knobs (PyTorch, JAX, TensorFlow, CuPy), naming other processes, multi-GPU advice,
 * does_not_fit never leading with empty_cache, and ranks 1..n without gaps; the same causes, growth facts and
 * remedies however the host timed the same allocations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>

#include "record.h"
#include "remedies.h"
#include "analysis_fixture.h"

/* every id the catalog has (remedies.def): the list the dump may name */
static const char *const ALL_IDS[] = {
#define X(name, id, order, build, applies, title, saving, cost) id,
#include "remedies.def"
#undef X
};

/* the remedies chosen by role and phase: none without the Python adapter's roles and phase */
static const char *const ROLE_PHASE_IDS[] = {
    "retry_outside_except", "map_location_cpu",    "load_in_bf16",
    "reuse_process_groups", "nccl_buffsize",       "fewer_graph_shapes",
    "bounded_cache",        "eight_bit_optimizer", "lora",
    "in_place_update",      "ema_on_cpu",          "smaller_kv_cache",
    "snapshot_to_cpu",      "teacher_no_grad",     "backward_per_microbatch",
    "fewer_beams",
};

static og_record_t *base(void) { return fixture_pytorch_24g("libtorch_cuda.so,libc10_cuda.so"); }

/* the article's fragmentation example, with the PyTorch adapter */
static og_record_t *frag(void)
{
    og_record_t *r = base();
    fixture_article_fragmentation(r, 300 * MiB);
    return r;
}

/* 8 GiB requested with 1 GiB free and 300 MiB cached: does not fit, even on this card alone */
static og_record_t *dnf(void)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->memory.framework_cached_bytes, 300 * MiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    return r;
}

static void check_shape(const og_record_t *r);

/* diagnose, select, and check the invariants of the list (every run, so no list escapes them) */
/* NCCL fails for 1 GiB with 256 MiB free while the framework keeps 6 GiB cached */
static og_record_t *nccl_cache_held(void)
{
    og_record_t *r = base();
    strcpy(r->event.library, "libnccl.so.2");
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    og_set(&r->memory.framework_cached_bytes, 6 * GiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    return r;
}

static void run(og_record_t *r)
{
    og_diagnose(r, &TH);
    og_select_remedies(r);
    check_shape(r);
}

/* run, and the diagnosis leads with PRIMARY */
static void run_primary(og_record_t *r, const char *primary)
{
    run(r);
    assert_string_equal(r->diagnosis.primary, primary);
}

static const og_remedy_t *rem(const og_record_t *r, const char *id)
{
    static const og_remedy_t none;
    for (int i = 0; i < r->nremedies; i++)
        if (strcmp(r->remedies[i].id, id) == 0)
            return &r->remedies[i];
    return &none;
}

static int rank_of(const og_record_t *r, const char *id) { return rem(r, id)->rank; }

static bool has_cause(const og_record_t *r, const char *id)
{
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (r->diagnosis.causes[i].id && strcmp(r->diagnosis.causes[i].id, id) == 0)
            return true;
    return false;
}

/* the text evidence NAME of cause ID, or NULL */
static const char *evt_of(const og_record_t *r, const char *id, const char *name)
{
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (r->diagnosis.causes[i].id && strcmp(r->diagnosis.causes[i].id, id) == 0)
            for (int e = 0; e < r->diagnosis.causes[i].nevidence; e++)
                if (strcmp(r->diagnosis.causes[i].evidence[e].name, name) == 0 &&
                    r->diagnosis.causes[i].evidence[e].is_text)
                    return r->diagnosis.causes[i].evidence[e].text;
    return NULL;
}

/* the byte evidence NAME of cause ID, or -1 */
static int64_t evb_of(const og_record_t *r, const char *id, const char *name)
{
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (r->diagnosis.causes[i].id && strcmp(r->diagnosis.causes[i].id, id) == 0)
            for (int e = 0; e < r->diagnosis.causes[i].nevidence; e++)
                if (strcmp(r->diagnosis.causes[i].evidence[e].name, name) == 0 &&
                    r->diagnosis.causes[i].evidence[e].is_bytes)
                    return (int64_t)r->diagnosis.causes[i].evidence[e].bytes;
    return -1;
}

static bool how_has(const og_remedy_t *m, const char *s)
{
    for (int h = 0; h < m->nhow; h++)
        if (strstr(m->how[h], s))
            return true;
    return false;
}

static bool any_how_has(const og_record_t *r, const char *s)
{
    for (int i = 0; i < r->nremedies; i++)
        if (how_has(&r->remedies[i], s))
            return true;
    return false;
}

static bool ranked_by(const og_remedy_t *m, const char *row)
{
    for (int i = 0; i < m->ranking.nrows; i++)
        if (strcmp(m->ranking.rows[i], row) == 0)
            return true;
    return false;
}

/* the trace of the ranking (remedies[].ranking) says how remedy i was placed: a row brought it, the list
 * is sorted by (tier, order) but for inference mode moved off the lead */
static void check_ranking(const og_record_t *r, int i)
{
    const og_remedy_t *m = &r->remedies[i];
    assert_true(m->ranking.nrows >= 1 && m->ranking.nrows <= OG_RANK_ROWS_KEPT);
    for (int j = 0; j < m->ranking.nrows; j++)
        assert_non_null(m->ranking.rows[j]);
    assert_true(m->ranking.tier >= 0 && m->ranking.tier <= 3);
    assert_true(m->ranking.estimate >= 0 || m->ranking.estimate == -1 || m->ranking.estimate == OG_RANK_UNBOUNDED);
    if (i == 0)
        return;
    const og_remedy_t *p = &r->remedies[i - 1];
    if (ranked_by(p, "inference_not_first") || ranked_by(m, "inference_not_first"))
        return;
    assert_true(p->ranking.tier < m->ranking.tier ||
                (p->ranking.tier == m->ranking.tier && p->ranking.order <= m->ranking.order));
}

/* invariants of every remedy list */
static void check_shape(const og_record_t *r)
{
    assert_true(r->nremedies >= 1 && r->nremedies <= 20);
    bool covered = false; /* one can or may cover the shortfall */
    for (int i = 0; i < r->nremedies; i++)
        covered |= r->remedies[i].ranking.tier < 3;
    for (int i = 0; i < r->nremedies; i++) {
        const og_remedy_t *m = &r->remedies[i];
        assert_int_equal(m->rank, i + 1); /* 1..n, no gaps */
        /* five shown in full, the rest "also possible", as is one that cannot cover while another can or may */
        assert_int_equal(m->shown, i < 5 && !(i > 0 && covered && m->ranking.tier == 3));
        bool known_id = false;
        for (size_t k = 0; k < sizeof ALL_IDS / sizeof *ALL_IDS; k++)
            known_id = known_id || strcmp(m->id, ALL_IDS[k]) == 0;
        assert_true(known_id);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(m->id, r->remedies[j].id); /* each once */
        assert_non_null(m->title);
        assert_non_null(m->saving);
        assert_non_null(m->cost);
        assert_true(strlen(m->why) > 20 && strlen(m->why) < sizeof m->why - 1);
        assert_true(m->nhow >= 1 && m->nhow <= 6);
        for (int h = 0; h < m->nhow; h++)
            assert_true(strlen(m->how[h]) > 5 && strlen(m->how[h]) < sizeof m->how[0] - 1);
        check_ranking(r, i);
    }
}

/* the record on a card of compute capability MAJOR.MINOR, remedies selected and checked */
static void run_on_cc(og_record_t *r, int major, int minor)
{
    r->device.cc_major = major;
    r->device.cc_minor = minor;
    run(r);
}

/* ------------------------------------------------------------------ per cause */

static void fragmentation_selection(void **state)
{
    og_record_t *r = frag();
    run_primary(r, "fragmentation");
    assert_string_equal(r->remedies[0].id, "empty_cache");
    assert_true(ranked_by(&r->remedies[0], "fragmentation")); /* the row that brought it */
    assert_string_equal(r->remedies[0].ranking.rows[0], "fragmentation");
    assert_true(how_has(&r->remedies[0], "torch.cuda.empty_cache()"));
    assert_non_null(strstr(r->remedies[0].why, "1.70 GiB"));
    assert_non_null(strstr(r->remedies[0].why, "300 MiB"));
    const og_remedy_t *e = rem(r, "expandable_segments");
    assert_non_null(e->id);
    assert_true(how_has(e, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    assert_true(how_has(e, "max_split_size_mb:512"));
    assert_true(rank_of(r, "restart_process") > 0);
    /* nothing about shrinking the job */
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "bigger_gpu"), 0);
    free(r);
}

/* the same cache, all of it in segments partly in use (PyTorch's inactive_split_bytes): empty_cache hands back whole
 * free segments only, so it releases nothing and cannot lead; expandable_segments does */
static void empty_cache_releases_no_split_segment(void **state)
{
    og_record_t *r = frag();
    r->memory.fw.inactive_split_bytes = 1741 * MiB;
    run_primary(r, "fragmentation");
    assert_string_equal(r->remedies[0].id, "expandable_segments");
    assert_true(rank_of(r, "empty_cache") != 1);
    free(r);
}

/* PyTorch's version as its adapter reports it (memory.framework.source): before 2.1 the allocator has no
 * expandable_segments and stops at start-up on the key, so from 1.10 max_split_size_mb takes its place; before 1.10
 * neither exists; a max_split_size_mb already set is not offered again; an unknown version keeps expandable_segments */
static void allocator_setting_by_version(void **state)
{
    static const struct {
        const char *source;
        bool max_split_set;
        const char *first; /* NULL: neither setting listed */
    } rows[] = {
        { "torch 1.13.0", false, "max_split_size_mb" },
        { "torch 2.0.1+cu118", false, "max_split_size_mb" },
        { "torch 1.10.2", false, "max_split_size_mb" },
        { "torch 2.1.2", false, "expandable_segments" },
        { "torch 2.11.0", false, "expandable_segments" },
        { "torch 1.9.1", false, NULL },
        { "torch 1.13.0", true, NULL },
        { "", false, "expandable_segments" },
        { "jax 0.4.30", false, "expandable_segments" },
        { "torch x.y", false, "expandable_segments" },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = frag();
        r->memory.fw.inactive_split_bytes = 1741 * MiB; /* empty_cache frees nothing: the setting leads */
        strcpy(r->memory.fw.source, rows[i].source);
        if (rows[i].max_split_set) {
            r->max_split_set = true;
            strcpy(r->pytorch_alloc_conf, "max_split_size_mb:256");
        }
        run_primary(r, "fragmentation");
        bool old = strncmp(rows[i].source, "torch 1.", 8) == 0 || strncmp(rows[i].source, "torch 2.0", 9) == 0;
        if (rows[i].first)
            assert_string_equal(r->remedies[0].id, rows[i].first);
        else
            assert_string_not_equal(r->remedies[0].id, "max_split_size_mb");
        if (old) {
            assert_int_equal(rank_of(r, "expandable_segments"), 0);
            assert_false(any_how_has(r, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments"));
        } else
            assert_int_equal(rank_of(r, "max_split_size_mb"), 0);
        if (rows[i].first && !strcmp(rows[i].first, "max_split_size_mb")) {
            /* the request is 2 GiB: blocks up to 512 MiB may split, none larger */
            assert_true(how_has(&r->remedies[0], "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"));
            assert_true(ranked_by(&r->remedies[0], "max_split_before_expandable"));
        }
        if (!rows[i].first)
            assert_int_equal(rank_of(r, "max_split_size_mb"), 0);
        free(r);
    }
}

/* fp32 master weights an optimizer trains beside a bf16 model (hand-written mixed precision: the optimizer holds
 * more parameters than the model has): those parameters and their gradients are the optimizer's, not a snapshot of
 * the model copied so far; snapshot_to_cpu is not offered */
static void master_weights_are_no_snapshot(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 320 * MiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    fixture_roles(r, 12 * GiB, 6 * GiB, 0, 0, 0, 0);
    fixture_model(r, "PhiForCausalLM", 4 * GiB, 1, false);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 8 * GiB);
    r->memory.fw.grad_enabled = 1;
    run(r);
    assert_int_equal(rank_of(r, "snapshot_to_cpu"), 0);
    free(r);
}

static void does_not_fit_selection(void **state)
{
    og_record_t *r = dnf();
    run_primary(r, "does_not_fit");
    /* 7 GiB missing of an 8 GiB request: ranked by what can cover it, then by cost:
     * a smaller batch (the failing tensor shrinks with it) first, then moving or splitting the
     * model; halving activations (mixed precision, checkpointing) cannot cover 7 GiB alone */
    assert_string_equal(r->remedies[0].id, "smaller_batch");
    const char *order[] = { "smaller_batch", "cpu_offload", "bigger_gpu", "mixed_precision" };
    for (size_t i = 1; i < sizeof order / sizeof *order; i++) {
        assert_true(rank_of(r, order[i - 1]) > 0);
        assert_true(rank_of(r, order[i - 1]) < rank_of(r, order[i]));
    }
    assert_true(rank_of(r, "inference_mode") > 1); /* not known to be inference: never first */
    /* the trace says why mixed precision is behind: its estimate cannot cover the 7 GiB */
    const og_remedy_t *mp = rem(r, "mixed_precision");
    assert_int_equal(mp->ranking.tier, 3);
    assert_true(ranked_by(mp, "cannot_cover"));
    assert_true(mp->ranking.estimate >= 0 && mp->ranking.estimate < 7.0 * GiB);
    /* ... nor is one like it in the top three the reports show while others can or may */
    assert_false(mp->shown);
    for (int i = 0; i < 3; i++)
        assert_true(r->remedies[i].shown && r->remedies[i].ranking.tier < 3);
    assert_true(rem(r, "bigger_gpu")->ranking.estimate == OG_RANK_UNBOUNDED);
    assert_int_equal(rem(r, "smaller_batch")->ranking.tier, 1);
    /* empty_cache is there (300 MiB cached) but never first: after smaller_batch */
    assert_true(rank_of(r, "empty_cache") > rank_of(r, "smaller_batch"));
    assert_non_null(strstr(rem(r, "empty_cache")->why, "300 MiB"));
    /* the shortfall sizes the advice */
    assert_non_null(strstr(rem(r, "smaller_batch")->why, "7.00 GiB more is needed"));
    /* 20 GiB held + 8 GiB requested: a 40 GB card */
    assert_non_null(strstr(rem(r, "bigger_gpu")->why, "40 GB"));
    /* no fragmentation remedy */
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    assert_int_equal(rank_of(r, "release_references"), 0);
    free(r);
}

static void does_not_fit_never_leads_with_empty_cache(void **state)
{
    og_record_t *r = dnf();
    og_set(&r->memory.framework_cached_bytes, 6 * GiB); /* lots cached, still not enough */
    og_set(&r->event.requested_bytes, 16 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "empty_cache");
    assert_true(rank_of(r, "empty_cache") > 1);

    /* cache not measured: unknown is not zero, empty_cache stays in play, but not first */
    og_unset(&r->memory.framework_cached_bytes);
    run(r);
    assert_true(rank_of(r, "empty_cache") > 1);
    assert_non_null(strstr(rem(r, "empty_cache")->why, "not measured"));

    /* the framework already released its cache and retried: empty_cache would change nothing */
    og_set(&r->memory.framework_cached_bytes, 2 * GiB);
    r->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
    r->event.attempts = 2;
    run(r);
    assert_int_equal(rank_of(r, "empty_cache"), 0);
    free(r);
}

/* One photo's VAE encode at full resolution: the failing statement's sizes (channels x height x width, read from
 * c0, h, w) times four bytes are the request, rounded up to 2 MiB as PyTorch's allocator does, and no name it
 * reads is a batch's.  No batch is among the tensor's factors: a smaller batch cannot shrink it (tier 3), a smaller
 * input can (cap_input_size leads).  A batch among the names read, or a request beyond the sizes, says nothing */
static void request_of_one_inputs_sizes(void **state)
{
    og_record_t *r = base();
    uint64_t req = 128ull * 4000 * 6000 * 4 + 1310720;
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->memory.process_tracked_bytes, 19 * GiB);
    r->memory.framework_bytes = 19 * GiB;
    fixture_roles(r, 7 * GiB, 0, 0, 0, 0, 12 * GiB);
    fixture_phase(r, "evaluation", "/w/inpaint.py", "encode");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->memory.fw.roles.attention_modules, 0);
    r->memory.fw.roles.has_statement = true;
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,c0,h,w,self,dtype");
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "128,4000,6000");
    og_set(&r->event.requested_bytes, req);
    og_set(&r->device.free_bytes, 4 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.sizes_make_request);
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_true(rank_of(r, "smaller_batch") == 0 || rank_of(r, "smaller_batch") > 3);
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,n_images,c0,h,w");
    run(r);
    assert_false(r->analysis.facts.roles.sizes_make_request);
    /* a count of what a batch holds (n_pairs x heads x length x length: a reranker's passages at once) is a batch;
     * a count of the model's own dimensions (NUM_HEADS) is not */
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,n_pairs,c0,h,w");
    run(r);
    assert_false(r->analysis.facts.roles.sizes_make_request);
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,NUM_HEADS,h,w");
    run(r);
    assert_true(r->analysis.facts.roles.sizes_make_request);
    /* one size alone (n * 4 bytes: a count, as a Monte Carlo book's paths) is no input's shape */
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "%llu", 128ull * 4000 * 6000);
    run(r);
    assert_false(r->analysis.facts.roles.sizes_make_request);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "128,4000,6000");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,c0,h,w,self,dtype");
    og_set(&r->event.requested_bytes, req + 4 * MiB); /* beyond the sizes and their rounding */
    run(r);
    assert_false(r->analysis.facts.roles.sizes_make_request);
    og_set(&r->event.requested_bytes, req);
    r->memory.fw.roles.batch_size = 4; /* a batch the program names: its own reading stands */
    run(r);
    assert_int_equal(rank_of(r, "smaller_batch"), 1);
    /* one size read twice (a chapter's 36k positions x positions, two heads: its relative logits) in a model that
     * attends: the text can shrink as far as needed, quadratically for its scores, and the shorter text leads */
    r->memory.fw.roles.batch_size = 0;
    og_set(&r->memory.fw.roles.attention_modules, 6);
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch,empty,HEADS,seq_len,seq_len");
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "2,36001,36001");
    uint64_t sq = 2ull * 36001 * 36001 * 4;
    og_set(&r->event.requested_bytes, (sq + 2 * MiB - 1) / (2 * MiB) * (2 * MiB));
    og_set(&r->device.free_bytes, 4 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.sizes_make_request);
    assert_int_equal(r->analysis.facts.roles.request_shape, OG_REQ_SQUARE);
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    free(r);
}

/* A 16k-token prefill in eager attention fails on its first layer's scores (the statement's sizes heads x seq x seq)
 * beside other processes holding more than the shortfall but less than it and another request of the scores' size:
 * the softmax and every later layer ask as much again, so the pass does not fit, fused attention is offered and
 * stopping the others cannot carry it (tier 3).  Models without attention: no scores, the others read as before */
static void attention_scores_beside_others(void **state)
{
    og_record_t *r = base();
    og_set(&r->memory.process_tracked_bytes, 16 * GiB);
    r->memory.framework_bytes = 16 * GiB;
    fixture_roles(r, 7 * GiB, 0, 0, 0, 0, 9 * GiB);
    fixture_phase(r, "generation", "/w/summarize.py", "generate");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.roles.has_statement = true;
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "32,16384,16384");
    og_set(&r->memory.fw.roles.attention_modules, 96);
    fixture_other(r, 4242, "python3", 3 * GiB);
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 2 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.scores && r->analysis.facts.others_short_of_scores);
    assert_true(rank_of(r, "flash_attention") > 0);
    assert_true(ranked_by(rem(r, "flash_attention"), "scores_beside_others"));
    assert_int_equal(rem(r, "foreign_processes")->ranking.tier, 3);
    assert_true(ranked_by(rem(r, "foreign_processes"), "others_short_of_scores"));
    assert_true(evb_of(r, "foreign_memory", "scores_bytes") == 4 * GiB || !rem(r, "foreign_processes")->shown);
    /* the others hold the shortfall and another request of the scores' size: stopping them may carry it */
    og_set(&r->event.requested_bytes, 3 * GiB);
    r->memory.other[0].bytes = 5 * GiB;
    og_set(&r->memory.other_processes_bytes, 5 * GiB);
    og_set(&r->device.free_bytes, 2 * GiB + 512 * MiB);
    run(r);
    assert_true(r->analysis.facts.scores);
    assert_false(r->analysis.facts.others_short_of_scores);
    assert_false(ranked_by(rem(r, "foreign_processes"), "others_short_of_scores"));
    /* no attention in the models: a square request is no attention's scores */
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 2 * GiB);
    r->memory.other[0].bytes = 3 * GiB;
    og_set(&r->memory.other_processes_bytes, 3 * GiB);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    fixture_phase(r, "forward", "/w/segment.py", "forward"); /* no generation: nothing says the model attends */
    run(r);
    assert_false(r->analysis.facts.scores);
    assert_false(ranked_by(rem(r, "foreign_processes"), "others_short_of_scores"));
    assert_int_equal(evb_of(r, "foreign_memory", "scores_bytes"), -1);
    free(r);
}

static void foreign_names_the_pids(void **state)
{
    og_record_t *r = base();
    og_set(&r->memory.process_tracked_bytes, 12 * GiB);
    r->memory.framework_bytes = 12 * GiB;
    fixture_other(r, 77, "/usr/lib/xorg/Xorg", 200 * MiB);
    fixture_other(r, 4242, "python3", 9 * GiB);
    run_primary(r, "foreign_memory");
    const og_remedy_t *f = &r->remedies[0];
    assert_string_equal(f->id, "foreign_processes");
    assert_non_null(strstr(f->why, "pid 4242 python3 9.00 GiB"));
    assert_non_null(strstr(f->why, "pid 77 Xorg"));
    assert_true(how_has(f, "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"));
    assert_false(how_has(f, "kill 4242")); /* not visible in this pid namespace: a host pid */
    assert_true(how_has(f, "host pid 4242"));
    assert_false(how_has(f, "kill 77")); /* the X server is not killed: its settings are */
    assert_true(how_has(f, "hardware acceleration"));
    r->memory.other[1].visible = true; /* visible here: a kill line, with care */
    run(r);
    assert_true(how_has(&r->remedies[0], "kill 4242"));
    assert_true(how_has(rem(r, "restart_process"), "4242"));
    /* a rank of this very job is never a process to stop */
    r->memory.other[1].same_job = true;
    r->memory.other[1].rank = 1;
    run(r);
    assert_false(any_how_has(r, "kill 4242"));
    /* 12 GiB + 2 GiB fits this card alone: no bigger card, no extra GPUs, no offload */
    assert_int_equal(rank_of(r, "bigger_gpu"), 0);
    assert_int_equal(rank_of(r, "multi_gpu_parallelism"), 0);
    assert_int_equal(rank_of(r, "cpu_offload"), 0);
    free(r);
}

/* a growth that is copies of one model (roles.models: a calculator built anew per item, every earlier one kept by the
 * results): a measured leak whose holder is the copies; the holder's text names the class and the count, and neither
 * a pass without autograd nor a smaller pass is offered (each only delays the next failure); copies under four
 * fifths of the rise: not this */
static void growth_of_model_copies(void **state)
{
    og_record_t *r = base();
    static struct og_hist_ev ev[64];
    uint64_t live = 4 * GiB;
    for (int s = 0; s < 16; s++) { /* each item: 64 MiB of activations, a 1 GiB model kept */
        ev[3 * s] = (struct og_hist_ev){ .t_rel = s * 0.1, .op = OG_OP_ALLOC, .bytes = GiB, .live = live += GiB };
        ev[3 * s + 1] = (struct og_hist_ev){
            .t_rel = s * 0.1 + 0.01, .op = OG_OP_ALLOC, .bytes = 64 * MiB, .live = live += 64 * MiB
        };
        ev[3 * s + 2] = (struct og_hist_ev){
            .t_rel = s * 0.1 + 0.02, .op = OG_OP_FREE, .bytes = 64 * MiB, .live = live -= 64 * MiB
        };
    }
    r->history.events = ev;
    r->history.nevents = 48;
    fixture_roles(r, 17 * GiB, 0, 0, 0, 3 * GiB, 64 * MiB); /* and 3 GiB of outputs kept */
    fixture_model(r, "ScaleShiftMACE", GiB, 17, true);
    fixture_model_held(r, 1, 1, "atoms,opt");
    fixture_phase(r, "forward", "/w/screen.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 128 * MiB);
    og_set(&r->device.free_bytes, 64 * MiB);
    run_primary(r, "growth");
    assert_int_equal(r->analysis.facts.roles.model_copies, 16 * GiB);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "17 copies of ScaleShiftMACE"));
    assert_true(how_has(&r->remedies[0], "once, before the loop"));
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "restart_process"), 0);
    r->memory.fw.roles.models[0].count = 2; /* one copy: the rise is something else */
    run_primary(r, "growth");
    assert_null(strstr(r->remedies[0].why, "copies of ScaleShiftMACE"));
    assert_true(rank_of(r, "inference_mode") > 0);
    free(r);
}

static void growth_selection(void **state)
{
    og_record_t *r = base();
    static struct og_hist_ev ev[64];
    uint64_t live = 4 * GiB;
    for (int s = 0; s < 16; s++) { /* each step: 512 MiB of activations, 1 GiB kept */
        ev[3 * s] =
            (struct og_hist_ev){ .t_rel = s * 0.1, .op = OG_OP_ALLOC, .bytes = 512 * MiB, .live = live += 512 * MiB };
        ev[3 * s + 1] =
            (struct og_hist_ev){ .t_rel = s * 0.1 + 0.01, .op = OG_OP_ALLOC, .bytes = GiB, .live = live += GiB };
        ev[3 * s + 2] = (struct og_hist_ev){
            .t_rel = s * 0.1 + 0.02, .op = OG_OP_FREE, .bytes = 512 * MiB, .live = live -= 512 * MiB
        };
    }
    r->history.events = ev;
    r->history.nevents = 48;
    og_set(&r->event.requested_bytes, 512 * MiB);
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(how_has(&r->remedies[0], "loss.detach().item()"));
    assert_non_null(strstr(r->remedies[0].why, "15 of 15"));
    assert_non_null(strstr(r->remedies[0].why, "1.00 GiB per step"));
    assert_true(rank_of(r, "inference_mode") > 1);
    /* a leak gets no bigger card, no more GPUs, no offloading */
    assert_int_equal(rank_of(r, "multi_gpu_parallelism"), 0);
    assert_int_equal(rank_of(r, "cpu_offload"), 0);
    assert_int_equal(rank_of(r, "zero_fsdp"), 0);
    assert_int_equal(rank_of(r, "empty_cache"), 0); /* cache not measured */
    assert_int_equal(rank_of(r, "bigger_gpu"), 0);
    /* a restart's estimate cannot cover the shortfall: ranked third, it is folded under "also possible" */
    assert_int_equal(rank_of(r, "restart_process"), 3);
    assert_int_equal(rem(r, "restart_process")->ranking.tier, 3);
    assert_false(rem(r, "restart_process")->shown);
    free(r);
}

static void cache_held_selection(void **state)
{
    og_record_t *r = nccl_cache_held();
    run_primary(r, "cache_held");
    assert_string_equal(r->remedies[0].id, "empty_cache");
    assert_non_null(strstr(r->remedies[0].why, "libnccl.so.2"));
    assert_true(how_has(&r->remedies[0], "libnccl.so.2"));
    free(r);
}

static void limit_selection(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.limit_bytes, 16 * GiB);
    og_set(&r->device.free_bytes, 9 * GiB);
    og_set(&r->memory.process_tracked_bytes, 15 * GiB);
    r->event.caused_by_limit = true;
    run_primary(r, "limit");
    /* alone on the GPU the limit emulates a smaller card: making the job fit comes first */
    assert_string_not_equal(r->remedies[0].id, "raise_limit");
    const og_remedy_t *l = rem(r, "raise_limit");
    assert_non_null(l->id);
    assert_true(how_has(l, "OOMGUARD_LIMIT=19GiB"));
    assert_non_null(strstr(l->why, "9.00 GiB free"));
    /* on a shared GPU (others present) the cap protects them: raising it is the decision to make */
    fixture_other(r, 99, NULL, 1 * GiB);
    run(r);
    assert_string_equal(r->remedies[0].id, "raise_limit");
    assert_true(rank_of(r, "smaller_batch") > 1);
    assert_int_equal(rank_of(r, "bigger_gpu"), 0); /* the card has room: the cap is the problem */
    free(r);
}

/* 205 MiB missing on a 24 GiB card: PyTorch holds 12 GiB and LIB, outside the framework, 7 GiB */
static og_record_t *beside_a_library(const char *lib)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1843 * MiB);
    og_set(&r->memory.process_used_bytes, 20 * GiB);
    og_set(&r->memory.process_tracked_bytes, 19 * GiB);
    r->memory.framework_bytes = 12 * GiB;
    og_set(&r->memory.non_framework_bytes, 8 * GiB);
    og_set(&r->memory.context_bytes_estimate, 1 * GiB);
    r->memory.nlibs = 2;
    strcpy(r->memory.by_library[0].library, "libtorch_cuda.so");
    r->memory.by_library[0].framework = true;
    r->memory.by_library[0].bytes = 12 * GiB;
    strcpy(r->memory.by_library[1].library, lib);
    r->memory.by_library[1].bytes = 7 * GiB;
    return r;
}

static void non_framework_selection(void **state)
{
    og_record_t *r = beside_a_library("/opt/trt/libnvinfer.so.10");
    run_primary(r, "non_framework");
    const og_remedy_t *f = &r->remedies[0];
    assert_string_equal(f->id, "non_framework_memory"); /* its own id: not "stop other processes" */
    assert_int_equal(rank_of(r, "foreign_processes"), 0);
    assert_non_null(strstr(f->why, "libnvinfer.so.10"));
    assert_true(how_has(f, "libnvinfer.so.10"));
    assert_true(rank_of(r, "restart_process") > 0);
    free(r);
}

/* contexts of the process's own beside its primary one (memory.contexts_made): share_cuda_context is offered and leads
 * when what the contexts beyond the first hold covers the shortfall, its text naming the count; one context (the
 * primary alone), or a count not measured, offers nothing of the kind */
static void contexts_beyond_the_primary(void **state)
{
    og_record_t *r = beside_a_library("libffi.so.8");
    og_set(&r->memory.context_bytes_estimate, 6 * GiB);
    r->memory.contexts_made = 11;
    r->memory.primary_context = 1;
    run_primary(r, "non_framework");
    assert_string_equal(r->remedies[0].id, "share_cuda_context");
    assert_non_null(strstr(r->remedies[0].why, "12 CUDA contexts"));
    assert_int_equal(r->analysis.facts.contexts, 12);
    assert_true(r->analysis.facts.contexts_extra == 11 * (6 * GiB / 12));
    r->memory.contexts_made = 0; /* the primary context alone */
    run_primary(r, "non_framework");
    assert_int_equal(rank_of(r, "share_cuda_context"), 0);
    r->memory.contexts_made = -1; /* not measured */
    run_primary(r, "non_framework");
    assert_int_equal(r->analysis.facts.contexts, -1);
    assert_int_equal(rank_of(r, "share_cuda_context"), 0);
    free(r);
}

/* the failing call's framework, by the ledger's class of its library when its name says nothing: CuPy's allocator is
 * cupy/cuda/memory.*.so ("memory.so"), in a process that loaded PyTorch first; the advice is CuPy's (an array
 * library: an outlier's lever is the input's size, not a token length) */
static void failing_framework_by_the_ledger(void **state)
{
    og_record_t *r = beside_a_library("libcudnn.so.9");
    r->framework = OG_FW_PYTORCH;
    strcpy(r->event.library, "memory.so");
    strcpy(r->memory.by_library[1].library, "memory.so");
    r->memory.by_library[1].framework = true;
    r->memory.by_library[1].fw_kind = OG_FW_CUPY;
    run(r);
    assert_int_equal(r->analysis.facts.adv.fw, OG_FW_CUPY);
    r->memory.by_library[1].framework = false; /* not a framework's library: the process's framework stands */
    run(r);
    assert_int_equal(r->analysis.facts.adv.fw, OG_FW_PYTORCH);
    free(r);
}

/* NCCL the largest library outside the framework: nccl_buffsize is offered after the cause's own remedy; with
 * NCCL_BUFFSIZE above its default, what the setting adds covers the shortfall and it leads, its text naming the
 * setting and NCCL's bytes at the default */
static void nccl_settings(void **state)
{
    og_record_t *r = beside_a_library("libnccl.so.2");
    run_primary(r, "non_framework");
    assert_string_equal(r->remedies[0].id, "non_framework_memory");
    assert_int_equal(rank_of(r, "nccl_buffsize"), 2);
    assert_false(how_has(rem(r, "nccl_buffsize"), "unset NCCL_BUFFSIZE"));
    strcpy(r->env[r->nenv++], "NCCL_BUFFSIZE=33554432"); /* 32 MiB: 7/8 of NCCL's bytes beyond the default's */
    run_primary(r, "non_framework");
    const og_remedy_t *m = &r->remedies[0];
    assert_string_equal(m->id, "nccl_buffsize");
    assert_non_null(strstr(m->why, "NCCL_BUFFSIZE=33554432"));
    assert_non_null(strstr(m->why, "6.12 GiB less"));
    assert_true(how_has(m, "unset NCCL_BUFFSIZE"));
    assert_string_equal(evt_of(r, "non_framework", "library_settings"), "NCCL_BUFFSIZE=33554432");
    free(r);
}

/* the library outside the framework took its bytes across the run (four quarters of its 7 GiB): objects of that
 * library made one after another and kept, or a leak in it; nothing measured tells which, so the library's remedy
 * keeps its place and its text names both, with the bytes by quarter. Taken at one time (all in one quarter, or
 * spread over two), or with the times unknown (an older dump), it is its settings */
static void library_built_up(void **state)
{
    og_record_t *r = beside_a_library("libdali.so");
    og_lib_usage_t *u = &r->memory.by_library[1];
    uint64_t q[OG_QUARTERS] = { 2 * GiB, 2 * GiB, 2 * GiB, 1 * GiB };
    memcpy(u->by_quarter, q, sizeof q);
    u->by_quarter_known = true;
    run_primary(r, "non_framework");
    assert_true(r->analysis.facts.nonfw_built_up);
    assert_int_equal(r->analysis.facts.nonfw_before_last, 6 * GiB);
    const og_remedy_t *m = &r->remedies[0];
    assert_string_equal(m->id, "non_framework_memory");
    assert_non_null(strstr(m->why, "across the run (2.00 GiB, 2.00 GiB, 2.00 GiB, 1.00 GiB"));
    assert_non_null(strstr(m->why, "6.00 GiB"));
    assert_true(how_has(m, "drop the old ones"));
    assert_false(how_has(m, "workspace settings"));
    assert_int_equal(rank_of(r, "release_references"), 0);
    assert_string_equal(evt_of(r, "non_framework", "largest_library_by_quarter"),
                        "2.00 GiB, 2.00 GiB, 2.00 GiB, 1.00 GiB");
    assert_int_equal(evb_of(r, "non_framework", "largest_library_older_bytes"), 6 * GiB);

    uint64_t two[OG_QUARTERS] = { 6 * GiB, 0, 0, 1 * GiB }; /* at the start and once more: not built up */
    memcpy(u->by_quarter, two, sizeof two);
    run_primary(r, "non_framework");
    assert_false(r->analysis.facts.nonfw_built_up);
    assert_true(how_has(&r->remedies[0], "workspace settings"));
    assert_int_equal(evb_of(r, "non_framework", "largest_library_older_bytes"), -1);

    memcpy(u->by_quarter, q, sizeof q);
    u->by_quarter_known = false; /* a dump without the times */
    run_primary(r, "non_framework");
    assert_false(r->analysis.facts.nonfw_built_up);

    u->by_quarter_known = true; /* NCCL's communicators are read by NCCL's rules, not as a library's objects */
    strcpy(u->library, "libnccl.so.2");
    run_primary(r, "non_framework");
    assert_false(r->analysis.facts.nonfw_built_up);
    free(r);
}

static void unknown_cause_selection(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 512 * MiB);
    run_primary(r, "unknown");
    assert_true(rank_of(r, "restart_process") > 0);
    assert_true(rank_of(r, "smaller_batch") > 0);
    assert_int_equal(rank_of(r, "foreign_processes"), 0); /* nobody else on the device */
    assert_int_equal(rank_of(r, "bigger_gpu"), 0);
    free(r);
}

/* ------------------------------------------------------------------ settings in force */

static void expandable_segments_already_set(void **state)
{
    og_record_t *r = frag();
    r->expandable_segments_set = true;
    strcpy(r->pytorch_alloc_conf, "expandable_segments:True");
    run(r);
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    assert_false(any_how_has(r, "expandable_segments:True"));
    const og_remedy_t *e = rem(r, "empty_cache");
    assert_int_equal(e->rank, 1);
    assert_non_null(strstr(e->why, "already on"));
    assert_true(how_has(e, "max_split_size_mb:512"));

    /* both set: no allocator advice repeated */
    r->max_split_set = true;
    strcpy(r->pytorch_alloc_conf, "expandable_segments:True,max_split_size_mb:256");
    run(r);
    assert_false(any_how_has(r, "max_split_size_mb:512"));
    assert_false(any_how_has(r, "expandable_segments:True"));

    /* an existing conf is kept when expandable_segments is added */
    og_record_t *q = frag();
    q->max_split_set = true;
    strcpy(q->pytorch_alloc_conf, "max_split_size_mb:256");
    run(q);
    assert_true(how_has(rem(q, "expandable_segments"),
                        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256,expandable_segments:True"));
    assert_false(how_has(rem(q, "expandable_segments"), "alternative: PYTORCH_CUDA_ALLOC_CONF=max_split"));
    free(q);
    free(r);
}

/* ------------------------------------------------------------------ compute capability */

static void bf16_or_fp16_by_cc(void **state)
{
    og_record_t *r = dnf();
    run_on_cc(r, 8, 0);
    const og_remedy_t *m = rem(r, "mixed_precision");
    assert_true(how_has(m, "dtype=torch.bfloat16"));
    assert_false(how_has(m, "GradScaler"));
    assert_true(how_has(rem(r, "flash_attention"), "flash_attention_2"));

    run_on_cc(r, 7, 5);
    m = rem(r, "mixed_precision");
    assert_true(how_has(m, "GradScaler"));
    assert_true(how_has(m, "dtype=torch.float16"));
    assert_false(how_has(m, "bfloat16"));
    assert_non_null(strstr(m->why, "7.5"));
    assert_false(how_has(rem(r, "flash_attention"), "flash_attention_2"));
    assert_true(how_has(rem(r, "flash_attention"), "sdpa"));
    assert_true(how_has(rem(r, "quantization"), "bnb_4bit_compute_dtype=torch.float16"));
    /* Turing is not pre-Volta: mixed precision is not sent to the end */
    assert_true(rank_of(r, "mixed_precision") < r->nremedies);
    free(r);
}

static void pre_volta_ranks_mixed_precision_last(void **state)
{
    og_record_t *r = dnf();
    run_on_cc(r, 6, 1);
    const og_remedy_t *m = rem(r, "mixed_precision");
    assert_int_equal(m->rank, r->nremedies);
    assert_non_null(strstr(m->why, "Volta"));
    free(r);
}

/* ------------------------------------------------------------------ frameworks */

static void jax_knobs(void **state)
{
    og_record_t *r = frag();
    fixture_framework(r, OG_FW_JAX, "xla_extension.so");
    run(r);
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    assert_false(any_how_has(r, "PYTORCH_CUDA_ALLOC_CONF"));
    assert_false(any_how_has(r, "torch."));
    const og_remedy_t *e = rem(r, "empty_cache");
    assert_int_equal(e->rank, 1);
    assert_true(how_has(e, "XLA_PYTHON_CLIENT_PREALLOCATE=false"));
    assert_true(how_has(e, "XLA_PYTHON_CLIENT_ALLOCATOR=platform"));
    assert_true(how_has(e, "jax.clear_caches()"));

    /* already off: not suggested again */
    r->xla_preallocate_off = true;
    r->nenv = 1;
    strcpy(r->env[0], "XLA_PYTHON_CLIENT_ALLOCATOR=platform");
    run(r);
    e = rem(r, "empty_cache");
    assert_false(how_has(e, "XLA_PYTHON_CLIENT_PREALLOCATE"));
    assert_false(how_has(e, "XLA_PYTHON_CLIENT_ALLOCATOR"));
    assert_non_null(strstr(e->why, "already off"));

    /* does_not_fit in JAX: remat and bf16 dtypes, no inference_mode (no tape outside jax.grad) */
    og_record_t *q = dnf();
    fixture_framework(q, OG_FW_JAX, "xla_extension.so");
    run(q);
    assert_int_equal(rank_of(q, "inference_mode"), 0);
    assert_true(how_has(rem(q, "gradient_checkpointing"), "jax.checkpoint"));
    assert_true(how_has(rem(q, "mixed_precision"), "jnp.bfloat16"));
    assert_false(any_how_has(q, "torch.autocast"));
    free(q);
    free(r);
}

static void jax_mem_fraction_for_cache_held(void **state)
{
    og_record_t *r = nccl_cache_held();
    r->framework = OG_FW_JAX;
    strcpy(r->framework_libs, "xla_extension.so");
    run_primary(r, "cache_held");
    /* (20 GiB reserved - 768 MiB missing) / 24 GiB = .80 */
    assert_true(how_has(rem(r, "empty_cache"), "XLA_PYTHON_CLIENT_MEM_FRACTION=.80"));
    free(r);
}

static void tensorflow_knobs(void **state)
{
    og_record_t *r = base();
    fixture_framework(r, OG_FW_TENSORFLOW, "libtensorflow_framework.so.2");
    og_set(&r->memory.framework_cached_bytes, 3 * GiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    run_primary(r, "fragmentation");
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    const og_remedy_t *e = rem(r, "empty_cache");
    assert_true(how_has(e, "tf.config.experimental.set_memory_growth(gpu, True)"));
    assert_true(how_has(e, "TF_GPU_ALLOCATOR=cuda_malloc_async"));

    strcpy(r->tf_gpu_allocator, "cuda_malloc_async");
    r->nenv = 1;
    strcpy(r->env[0], "TF_FORCE_GPU_ALLOW_GROWTH=true");
    run(r);
    e = rem(r, "empty_cache");
    assert_false(how_has(e, "TF_GPU_ALLOCATOR"));
    assert_false(how_has(e, "set_memory_growth"));
    assert_non_null(strstr(e->why, "already set"));

    /* does_not_fit on a Turing card: mixed_float16, no ZeRO/FSDP, inference with training=False */
    og_record_t *q = dnf();
    fixture_framework(q, OG_FW_TENSORFLOW, "libtensorflow_framework.so.2");
    run_on_cc(q, 7, 5);
    assert_true(how_has(rem(q, "mixed_precision"), "set_global_policy(\"mixed_float16\")"));
    assert_int_equal(rank_of(q, "zero_fsdp"), 0);
    assert_true(how_has(rem(q, "inference_mode"), "training=False"));
    assert_false(any_how_has(q, "torch.autocast"));
    assert_false(any_how_has(q, "torch.utils"));
    /* the PyTorch-only route for quantization is labelled as such */
    assert_true(how_has(rem(q, "quantization"), "PyTorch: bnb = BitsAndBytesConfig"));
    free(q);
    free(r);
}

static void cupy_and_unknown_framework(void **state)
{
    og_record_t *r = dnf();
    r->framework = OG_FW_CUPY;
    strcpy(r->framework_libs, "cupy_backends");
    strcpy(r->event.library, "memory.cpython-311-x86_64-linux-gnu.so"); /* CuPy's allocator module */
    run(r);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "flash_attention"), 0);
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_true(how_has(rem(r, "empty_cache"), "free_all_blocks()"));
    free(r);

    /* unknown framework: the PyTorch line, labelled, plus the others' equivalents */
    r = frag();
    fixture_no_framework(r, "libmyalloc.so");
    run(r);
    const og_remedy_t *e = rem(r, "expandable_segments");
    assert_non_null(e->id);
    assert_true(how_has(e, "PyTorch: export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
    assert_true(how_has(e, "TF_GPU_ALLOCATOR=cuda_malloc_async"));
    assert_non_null(strstr(e->why, "PyTorch setting"));
    assert_true(how_has(rem(r, "empty_cache"), "PyTorch: del"));
    free(r);

    assert_string_equal(og_framework_name(OG_FW_PYTORCH), "pytorch");
    assert_string_equal(og_framework_name(OG_FW_JAX), "jax");
    assert_string_equal(og_framework_name(OG_FW_TENSORFLOW), "tensorflow");
    assert_string_equal(og_framework_name(OG_FW_CUPY), "cupy");
    assert_string_equal(og_framework_name(OG_FW_UNKNOWN), "unknown");
    assert_string_equal(og_framework_name((enum og_framework)99), "unknown");
}

/* the frameworks' native libraries (common/framework_libs.def), by base name or by a directory of the path */
static void framework_libraries(void **state)
{
    static const struct {
        const char *base, *path;
        enum og_framework fw;
    } cases[] = {
        { "libc10_cuda.so", NULL, OG_FW_PYTORCH },
        { "libtorch_cuda.so", "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so", OG_FW_PYTORCH },
        { "xla_extension.so", NULL, OG_FW_JAX },
        { "libfoo.so", "/venv/site-packages/jaxlib/libfoo.so", OG_FW_JAX },
        { "xla_cuda_plugin.so", "/venv/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so", OG_FW_JAX },
        { "xla_cuda_plugin.so", NULL, OG_FW_JAX },
        { "libtensorflow_framework.so.2", NULL, OG_FW_TENSORFLOW },
        { "memory.cpython-311-x86_64-linux-gnu.so", "/venv/site-packages/cupy/cuda/memory.cpython-311.so", OG_FW_CUPY },
        { "libnccl.so.2", "/usr/lib/libnccl.so.2", OG_FW_UNKNOWN },
        { "libcudnn.so.9", NULL, OG_FW_UNKNOWN },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(og_framework_of(cases[i].base, cases[i].path), cases[i].fw);
    assert_int_equal(og_framework_of(NULL, NULL), OG_FW_UNKNOWN);
}

/* ------------------------------------------------------------------ multi-GPU */

/* a click-through model whose parameters are mostly hashed embedding tables (5 of 6 GiB) fails in its first backward,
 * its AdamW state to come: the state exceeds the card, and LoRA or weight quantization are for linear layers'
 * weights: keeping the tables off the GPU (or sparse row updates) leads, titled so; a model whose embedding is a
 * small share of it (a language model's vocabulary) keeps LoRA first; two tables a sparse optimizer trains are ids,
 * and smaller tables lead there too */
static void embedding_tables_off_the_gpu(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 6 * GiB, 4 * GiB, 0, 0, 0, 2 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 6 * GiB);
    fixture_model(r, "DeepFM", 6 * GiB, 1, false);
    og_set(&r->memory.fw.roles.embedding_bytes, 5 * GiB);
    fixture_phase(r, "backward", "/w/ctr.py", "backward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "cpu_offload");
    assert_string_equal(r->remedies[0].title,
                        "Keep the embedding tables off the GPU, or update only the rows a batch touches");
    assert_true(how_has(&r->remedies[0], "SparseAdam"));
    assert_int_equal(rank_of(r, "lora"), 0);
    assert_int_equal(rank_of(r, "quantization"), 0);
    assert_int_equal(rank_of(r, "smaller_embedding_tables"), 0); /* how many tables: not measured */
    /* a table per categorical column (26 of them): their size is the model's, smaller tables first, then off the GPU;
     * 3 tables (a word, a position and a type table) are no such set */
    og_set(&r->memory.fw.roles.embedding_tables, 26);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_embedding_tables");
    assert_string_equal(r->remedies[1].id, "cpu_offload");
    assert_non_null(strstr(r->remedies[0].why, "26 of them"));
    og_set(&r->memory.fw.roles.attention_modules, 24); /* a transformer's vocabulary and its trained copies */
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "smaller_embedding_tables"), 0);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    og_set(&r->memory.fw.roles.embedding_tables, 3);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "cpu_offload");
    assert_int_equal(rank_of(r, "smaller_embedding_tables"), 0);
    /* two tables a SparseAdam trains (sparse=True: a user-id and an item-id table): ids, whatever their number */
    og_set(&r->memory.fw.roles.embedding_tables, 2);
    fixture_optimizer(r, "SparseAdam", 10 * GiB);
    og_set(&r->memory.fw.roles.optimizers[1].param_bytes, 5 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_embedding_tables");
    assert_non_null(strstr(r->remedies[0].why, "trained by a sparse optimizer (10.00 GiB of its state)"));
    assert_true(how_has(&r->remedies[0], "rows = ids % n_buckets"));
    assert_false(how_has(&r->remedies[0], "tabular_learner"));
    og_set(&r->memory.fw.roles.optimizers[1].param_bytes, 2 * GiB); /* under half the tables' bytes */
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "smaller_embedding_tables"), 0);
    r->memory.fw.roles.noptimizers = 1;
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 6 * GiB);
    og_set(&r->memory.fw.roles.embedding_bytes, 1 * GiB); /* a language model's vocabulary: a small share */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "lora");
    free(r);
}

/* a full fine-tune in one process on GPU 0 of two, at its first AdamW step: 6 GiB of parameters, their gradients and
 * 8 GiB of moments made so far, 4 GiB to come (2 x 6 GiB in all): 24 GiB of state at the step is the whole 24 GiB card,
 * so no card like it holds the state and moving part of the work to GPU 1 does not either: sharding the state over the
 * GPUs leads; with half the parameters the state fits one card and the idle GPU leads as before */
static void state_over_card_idle_gpus(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 6 * GiB, 6 * GiB, 8 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 6 * GiB);
    fixture_model(r, "LlamaForCausalLM", 6 * GiB, 1, false);
    fixture_phase(r, "optimizer_step", "/w/train.py", "step");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    r->visible_devices = 2;
    r->nsummary = 1;
    r->summary[0].tracked_bytes = 20 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "zero_fsdp");
    assert_true(ranked_by(&r->remedies[0], "state_exceeds_card_gpus_lead"));
    assert_true(rank_of(r, "use_idle_gpu") > 1);
    fixture_roles(r, 3 * GiB, 3 * GiB, 4 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 4 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 3 * GiB);
    r->summary[0].tracked_bytes = 10 * GiB;
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(&r->remedies[0], "state_exceeds_card_gpus_lead"));
    /* a frozen 10 GiB teacher beside a 4 GiB student: 26 GiB of state at the step, but 16 GiB without the teacher,
     * which can move to GPU 1: the idle GPU leads */
    fixture_roles(r, 14 * GiB, 4 * GiB, 4 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 4 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
    r->memory.fw.roles.nmodels = 0;
    fixture_model(r, "Teacher", 10 * GiB, 1, true);
    fixture_model(r, "Student", 4 * GiB, 1, false);
    r->summary[0].tracked_bytes = 22 * GiB;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.opt_params == 4 * GiB);
    assert_string_equal(r->remedies[0].id, "use_idle_gpu");
    assert_true(ranked_by(rem(r, "zero_fsdp"), "state_exceeds_card_lead"));
    free(r);
}

/* a teacher and a student on GPU 0 of two, GPU 1 untouched: putting the frozen teacher on GPU 1 leads, its text
 * naming the GPU; a model split over both GPUs unevenly (GPU 1 holds less than GPU 0's parameters): balancing the
 * split leads; the other GPU a replica (DataParallel: it holds the parameters too): neither, imbalance's own fix */
static void spare_gpu(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 17 * GiB, 4 * GiB, 2 * GiB, 0, 0, 0);
    fixture_model(r, "Teacher", 13 * GiB, 1, true);
    fixture_model(r, "Student", 4 * GiB, 1, false);
    fixture_phase(r, "optimizer_step", "/w/train.py", "step");
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    r->visible_devices = 2;
    r->nsummary = 1;
    r->summary[0].tracked_bytes = 23 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "use_idle_gpu");
    assert_non_null(strstr(r->remedies[0].why, "GPU 1 is visible"));
    assert_true(how_has(&r->remedies[0], "teacher.to(\"cuda:1\")"));
    assert_int_equal(rank_of(r, "balance_device_map"), 0);
    /* GPU 1 holds a small buffer (a kNN bank), a small fraction of GPU 0's: nearly idle, the teacher moves there;
     * no model's layers are split over the two */
    r->nsummary = 2;
    r->summary[1].index = 1;
    r->summary[1].tracked_bytes = 625 * MiB;
    run(r);
    assert_string_equal(r->remedies[0].id, "use_idle_gpu");
    assert_non_null(strstr(r->remedies[0].why, "holds only 625"));
    assert_int_equal(rank_of(r, "balance_device_map"), 0);
    free(r);

    r = base();
    fixture_roles(r, 22 * GiB, 0, 0, 0, 0, 1 * GiB);
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 1 * GiB + 512 * MiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    r->visible_devices = 2;
    r->nsummary = 2;
    r->summary[0].tracked_bytes = 23 * GiB;
    r->summary[1].index = 1;
    r->summary[1].tracked_bytes = 16 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "balance_device_map");
    assert_non_null(strstr(r->remedies[0].why, "holds 16.00 GiB on GPU 1"));
    assert_true(how_has(&r->remedies[0], "max_memory={0:"));
    assert_int_equal(rank_of(r, "use_idle_gpu"), 0);
    r->summary[1].tracked_bytes = 22 * GiB; /* a replica's worth: not a split */
    run(r);
    assert_int_equal(rank_of(r, "balance_device_map"), 0);
    free(r);
}

/* an evaluation the trainer started as a child process on the trainer's GPU, the other GPU untouched: the parent's
 * cached step is the other memory (peer_ranks names the parent), and starting the child on the idle GPU leads,
 * not set_device (no ranks here); a sibling worker beside the parent (a pre-fork server) is no such case, nor is a
 * child that is a rank of its own */
static void child_on_parents_gpu(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 2 * GiB);
    fixture_phase(r, "evaluation", "/w/ppl_eval.py", "evaluate");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 4 * GiB + 640 * MiB);
    og_set(&r->device.free_bytes, 1 * GiB + 512 * MiB);
    r->visible_devices = 2;
    r->nsummary = 1;
    r->summary[0].tracked_bytes = 3 * GiB + 800 * MiB;
    og_other_proc_t *o = fixture_other(r, 4100, "python3", 18 * GiB + 800 * MiB);
    o->same_job = o->visible = o->parent = true;
    o->rank = -1;
    run(r); /* does_not_fit leads here: the fixture has no NVML reading of this process, so "alone it would fit" is
             * not known; the parent's bytes are peer_ranks' */
    assert_true(r->analysis.facts.parent_only);
    assert_true(has_cause(r, "peer_ranks"));
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (!strcmp(r->diagnosis.causes[i].id, "peer_ranks"))
            assert_non_null(strstr(r->diagnosis.causes[i].summary, "its parent"));
    assert_string_equal(r->remedies[0].id, "use_idle_gpu");
    assert_true(how_has(&r->remedies[0], "\"CUDA_VISIBLE_DEVICES\": \"1\""));
    assert_non_null(strstr(r->remedies[0].why, "parent's"));
    assert_true(rank_of(r, "set_device") > 1);
    o->parent = false;
    o->sibling = true;
    run(r);
    assert_false(r->analysis.facts.parent_only);
    assert_int_equal(rank_of(r, "use_idle_gpu"), 0);
    o->parent = true;
    o->sibling = false;
    r->rank = 1;
    r->world_size = 2;
    run(r);
    assert_false(r->analysis.facts.parent_only);
    assert_int_equal(rank_of(r, "use_idle_gpu"), 0);
    free(r);
}

/* replica 1's static KV cache made with device="cuda" lands on GPU 0 beside replica 0 while replica 1's weights are
 * on GPU 1 (the adapter: the statement reads `model`, whose parameters are on GPU 1): making it beside its model
 * leads, the statement and the model named; nothing that shrinks the cache leads; a statement whose model is on the
 * failing GPU is no such case */
static void statement_model_on_other_gpu(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 48 * GiB);
    fixture_roles(r, 15 * GiB, 0, 0, 0, 16 * GiB, 13 * GiB);
    fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, false);
    fixture_statement(r, "cache", "cache");
    r->memory.fw.grad_enabled = -1;
    r->visible_devices = 2;
    og_set(&r->event.requested_bytes, 256 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    run(r);
    assert_int_equal(rank_of(r, "allocate_on_model_device"), 0);
    r->memory.fw.roles.has_stmt_model_device = true;
    r->memory.fw.roles.stmt_model_device = 1;
    snprintf(r->memory.fw.roles.stmt_model_name, sizeof r->memory.fw.roles.stmt_model_name, "model");
    run(r);
    assert_string_equal(r->remedies[0].id, "allocate_on_model_device");
    assert_true(ranked_by(&r->remedies[0], "model_on_other_gpu_lead"));
    assert_non_null(strstr(r->remedies[0].why, "reads model, whose parameters are on GPU 1, yet makes its tensor "
                                               "on GPU 0"));
    assert_true(how_has(&r->remedies[0], "cache = ...(..., device=model.device)"));
    assert_true(how_has(&r->remedies[0], "torch.cuda.device(1)"));
    assert_true(rank_of(r, "distributed_data_parallel") == 0 || rank_of(r, "distributed_data_parallel") > 3);
    r->nsummary = 2; /* what this process holds on each GPU: the failing one far more (imbalance) */
    r->summary[0].index = 0;
    r->summary[0].tracked_bytes = 44 * GiB;
    r->summary[1].index = 1;
    r->summary[1].tracked_bytes = 15 * GiB;
    run(r);
    assert_true(has_cause(r, "imbalance"));
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (!strcmp(r->diagnosis.causes[i].id, "imbalance"))
            assert_non_null(strstr(r->diagnosis.causes[i].summary, "for model, whose parameters are on GPU 1"));
    r->memory.fw.roles.stmt_model_device = 0; /* the model is on the failing GPU */
    run(r);
    assert_int_equal(rank_of(r, "allocate_on_model_device"), 0);
    free(r);
}

static void multi_gpu_depends_on_visible_devices(void **state)
{
    og_record_t *r = dnf();
    run(r);
    const og_remedy_t *m = rem(r, "multi_gpu_parallelism");
    assert_non_null(strstr(m->title, "Add GPUs"));
    assert_true(m->rank > rank_of(r, "cpu_offload"));
    assert_true(rank_of(r, "zero_fsdp") > rank_of(r, "cpu_offload"));

    r->visible_devices = 4;
    run(r);
    m = rem(r, "multi_gpu_parallelism");
    assert_null(strstr(m->title, "Add GPUs"));
    assert_true(m->rank < rank_of(r, "cpu_offload"));
    assert_true(rank_of(r, "zero_fsdp") < rank_of(r, "cpu_offload"));
    assert_true(how_has(m, "--nproc_per_node=4"));
    assert_true(how_has(m, "--tensor-parallel-size 4"));
    assert_non_null(strstr(rem(r, "zero_fsdp")->why, "1/4"));

    /* already data parallel: DDP will not shrink the per-GPU model */
    r->world_size = 4;
    run(r);
    assert_non_null(strstr(rem(r, "multi_gpu_parallelism")->why, "already runs 4 ranks"));
    free(r);
}

/* ------------------------------------------------------------------ robustness */

static void empty_and_null_records(void **state)
{
    og_record_t *r = calloc(1, sizeof *r);
    og_diagnose(r, NULL);
    og_select_remedies(r);
    check_shape(r);
    og_select_remedies(NULL);

    /* without a diagnosis at all: treated as unknown */
    memset(r, 0, sizeof *r);
    og_select_remedies(r);
    check_shape(r);
    free(r);
}

static void huge_request_fits_no_card(void **state)
{
    og_record_t *r = dnf();
    og_set(&r->event.requested_bytes, 200 * GiB);
    run(r);
    /* larger than the device: split it first; nothing that rearranges this process */
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_int_equal(rank_of(r, "empty_cache"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    assert_int_equal(rank_of(r, "bigger_gpu"), 0); /* no card has 200 GiB */
    free(r);
}


/* ------------------------------------------------------------------ the scenario corpus's lessons */

static void second_framework_knobs(void **state)
{
    og_record_t *r = base();
    fixture_second_framework(r);
    run(r);
    const og_remedy_t *m = &r->remedies[0];
    assert_string_equal(m->id, "other_framework_memory");
    assert_true(how_has(m, "XLA_PYTHON_CLIENT_PREALLOCATE=false"));
    assert_true(how_has(m, "XLA_PYTHON_CLIENT_MEM_FRACTION"));
    assert_true(how_has(m, "JAX_PLATFORMS=cpu"));
    assert_int_equal(rank_of(r, "smaller_batch"), 0); /* the job is not too big: JAX took the room */
    assert_false(any_how_has(r, "Flax"));             /* advice follows the failing call: PyTorch */
    /* TensorFlow instead */
    strcpy(r->memory.by_library[0].library, "libtensorflow_framework.so.2");
    r->memory.by_library[0].fw_kind = OG_FW_TENSORFLOW;
    run(r);
    assert_string_equal(r->remedies[0].id, "other_framework_memory");
    assert_true(how_has(&r->remedies[0], "set_memory_growth"));
    assert_true(how_has(&r->remedies[0], "TF_FORCE_GPU_ALLOW_GROWTH=true"));
    free(r);
}

/* the workers of a pre-fork server: fewer workers first, never set_device (they are not ranks on a
 * wrong GPU), never a line that stops them */
static void prefork_workers_get_fewer_workers_never_kill(void **state)
{
    og_record_t *r = base();
    fixture_prefork_workers(r);
    run(r);
    assert_string_equal(r->remedies[0].id, "fewer_workers");
    assert_int_equal(rank_of(r, "set_device"), 0);
    assert_int_equal(rank_of(r, "foreign_processes"), 0);
    assert_false(any_how_has(r, "kill "));
    free(r);
}

/* the ninth worker of a pre-fork server dies building its model on the device (760 MiB made so far) over 26 MiB of
 * splintered cache, the eight siblings holding 31 GiB: fewer workers first; a restart, which sheds only the cache,
 * not listed; nothing arriving (no model being built): the splinters' reading, a restart listed */
static void prefork_worker_building_its_model_no_restart(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 16 * MiB);
    og_set(&r->device.free_bytes, 14 * MiB);
    for (int i = 0; i < 8; i++) {
        og_other_proc_t *o = fixture_other(r, 200 + i, "python3", 3 * GiB + 864 * MiB);
        o->visible = o->same_job = o->sibling = true;
    }
    fixture_roles(r, 760 * MiB, 0, 0, 0, 0, 0);
    r->memory.fw.reserved_bytes += 26 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    fixture_phase(r, "loading", "/w/tasks.py", "__init__");
    fixture_model(r, "XLMRobertaModel", 760 * MiB, 1, false);
    fixture_model_held(r, 0, 1, "");
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "fewer_workers");
    assert_int_equal(rank_of(r, "restart_process"), 0);
    r->memory.fw.roles.models[0].running = 0; /* nothing being built: the splinters are the cause, a restart listed */
    run_primary(r, "fragmentation");
    assert_true(rank_of(r, "restart_process") > 0);
    free(r);
}

static void peers_get_set_device_never_kill(void **state)
{
    og_record_t *r = base();
    fixture_peer_ranks(r);
    run(r);
    assert_string_equal(r->remedies[0].id, "set_device");
    assert_true(how_has(&r->remedies[0], "torch.cuda.set_device(local_rank)"));
    assert_true(how_has(&r->remedies[0], "map_location"));
    assert_false(any_how_has(r, "kill "));
    assert_int_equal(rank_of(r, "foreign_processes"), 0);
    /* DataLoader workers (children): keep CUDA out of them (its own id), then fewer workers; not set_device (they
     * are not ranks on a wrong GPU), no restart in the top 3 (a restart starts them again), never a kill line */
    for (int i = 0; i < 7; i++)
        r->memory.other[i].child = true; /* still ranks (LOCAL_RANK each): ranks this process launched */
    run(r);
    assert_string_equal(r->remedies[0].id, "set_device");
    for (int i = 0; i < 7; i++)
        r->memory.other[i].rank = -1;
    run(r);
    assert_string_equal(r->remedies[0].id, "cuda_out_of_workers");
    assert_true(how_has(&r->remedies[0], "collate_fn") || strstr(r->remedies[0].why, "collate_fn"));
    assert_string_equal(r->remedies[1].id, "fewer_workers");
    assert_true(how_has(&r->remedies[1], "num_workers=3"));
    assert_int_equal(rank_of(r, "set_device"), 0);
    assert_false(rank_of(r, "restart_process") > 0 && rank_of(r, "restart_process") <= 3);
    assert_false(any_how_has(r, "kill "));
    /* the pass still building outgrows a splintered cache (fragmentation only a side finding): the splinters'
     * remedies are not offered beside the workers' own fix */
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 12 * GiB);
    r->memory.fw.reserved_bytes += 20 * MiB;
    r->memory.fw.largest_free_block_bytes = 2 * MiB;
    og_set(&r->event.requested_bytes, 20 * MiB);
    og_set(&r->device.free_bytes, 8 * MiB);
    fixture_phase(r, "backward", "/w/train.py", "backward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "peer_ranks");
    assert_true(has_cause(r, "fragmentation"));
    assert_string_equal(r->remedies[0].id, "cuda_out_of_workers");
    assert_int_equal(rank_of(r, "expandable_segments"), 0);
    assert_int_equal(rank_of(r, "restart_process"), 0);
    /* the children run another program (an evaluation script each epoch, not waited for; not forks, not
     * multiprocessing workers): fewer at once leads, told as programs started, not DataLoader workers; CUDA kept out
     * of workers is no fix for them.  One of them a worker after all: the workers' reading stands */
    for (int i = 0; i < 7; i++)
        r->memory.other[i].other_program = true;
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "fewer_workers");
    assert_true(ranked_by(&r->remedies[0], "child_programs_lead"));
    assert_non_null(strstr(r->remedies[0].why, "7 processes this process started, each running another program"));
    assert_null(strstr(r->remedies[0].why, "DataLoader"));
    assert_true(how_has(&r->remedies[0], "proc.wait()"));
    assert_int_equal(rank_of(r, "cuda_out_of_workers"), 0);
    assert_int_equal(rank_of(r, "set_device"), 0);
    assert_false(any_how_has(r, "kill "));
    r->memory.other[3].other_program = false;
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "cuda_out_of_workers");
    for (int i = 0; i < 7; i++)
        r->memory.other[i].other_program = false;
    /* one worker of eight not a child (a rank of the job): set_device stays, and no workers' rows */
    r->memory.other[0].child = false;
    run(r);
    assert_true(rank_of(r, "set_device") > 0);
    assert_int_equal(rank_of(r, "cuda_out_of_workers"), 0);
    free(r);
}

/* this process's own multiprocessing child, named by the code that started it (a dask-cuda Nanny's worker, left
 * running with its RMM pool): not a DataLoader worker, so keeping CUDA out of workers is no fix; close the work that
 * started it (stopping that process, its id), no kill line, no restart (the program starts it again).  Listed with the
 * default name, or not read at all, it may be a DataLoader's worker: the workers' reading stands */
static void own_children_not_workers(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 600 * MiB, 600 * MiB, 1200 * MiB, 0, 0, 200 * MiB);
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1400 * MiB);
    og_other_proc_t *w = fixture_other(r, 4711, "python3", 18 * GiB + 500 * MiB);
    w->visible = w->same_job = w->child = true;
    w->rank = -1;
    og_roles_t *ro = &r->memory.fw.roles;
    ro->children_read = true;
    ro->nchildren = 1;
    ro->children[0].pid = 4711;
    snprintf(ro->children[0].name, sizeof ro->children[0].name, "Dask Worker process (from Nanny)");
    run_primary(r, "peer_ranks");
    assert_true(r->analysis.facts.own_children);
    assert_string_equal(r->remedies[0].id, "foreign_processes");
    assert_true(ranked_by(&r->remedies[0], "own_children_lead"));
    assert_non_null(strstr(r->remedies[0].why, "pid 4711 (18.49 GiB), is named \"Dask Worker process (from Nanny)\""));
    assert_true(how_has(&r->remedies[0], "cluster.close()"));
    assert_false(how_has(&r->remedies[0], "pool.join()"));
    assert_int_equal(rank_of(r, "cuda_out_of_workers"), 0);
    assert_int_equal(rank_of(r, "restart_process"), 0);
    assert_int_equal(rank_of(r, "set_device"), 0);
    assert_false(any_how_has(r, "kill "));
    /* a name the table does not know: every way a program closes its workers */
    snprintf(ro->children[0].name, sizeof ro->children[0].name, "etl-worker");
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "foreign_processes");
    assert_true(how_has(&r->remedies[0], "proc.join()") && how_has(&r->remedies[0], "pool.join()") &&
                how_has(&r->remedies[0], "cluster.close()"));
    /* the default name (a DataLoader's workers keep it), another pid, nothing read: maybe workers */
    for (int k = 0; k < 3; k++) {
        ro->children[0].name[0] = '\0';
        ro->children[0].pid = k == 1 ? 4712 : 4711;
        ro->children_read = k != 2;
        run_primary(r, "peer_ranks");
        assert_false(r->analysis.facts.own_children);
        assert_string_equal(r->remedies[0].id, "cuda_out_of_workers");
    }
    free(r);
    (void)state;
}

static void imbalance_gets_ddp_before_smaller_batch(void **state)
{
    og_record_t *r = base();
    fixture_imbalance(r);
    run(r);
    assert_string_equal(r->remedies[0].id, "distributed_data_parallel");
    assert_true(how_has(&r->remedies[0], "DistributedDataParallel"));
    assert_true(rank_of(r, "smaller_batch") > 1);
    free(r);
}

static void app_pool_gets_trim(void **state)
{
    og_record_t *r = base();
    fixture_app_pool(r);
    run(r);
    assert_string_equal(r->remedies[0].id, "pool_trim");
    /* who uses the pool, in its parenthesis, before the sentence goes on */
    assert_non_null(strstr(r->remedies[0].why, "pool (used by the application) keeps 12.00 GiB"));
    assert_true(how_has(&r->remedies[0], "cudaMemPoolTrimTo"));
    assert_true(how_has(&r->remedies[0], "cudaMemPoolAttrReleaseThreshold"));
    assert_int_equal(rank_of(r, "empty_cache"), 0);
    free(r);
}

/* the framework released its cache between two attempts and got 0 B back (a retry that freed nothing), after 16
 * allocations of 16 different sizes from FIRST up by 20 MiB, live rising by STEP each (variable-length batches) */
static void released_nothing_after_varied_sizes(og_record_t *r, struct og_hist_ev ev[16], uint64_t first, uint64_t step)
{
    r->event.attempts = 2;
    og_set(&r->event.released_between_attempts_bytes, 0);
    for (int i = 0; i < 16; i++)
        ev[i] = (struct og_hist_ev){ .t_rel = i * 0.1,
                                     .op = OG_OP_ALLOC,
                                     .bytes = first + 20 * (uint64_t)i * MiB,
                                     .live = (uint64_t)(i + 1) * step };
    r->history.events = ev;
    r->history.nevents = 16;
}

/* PyTorch released its cache, got 0 B back and failed again: empty_cache does not lead */
static void released_nothing_expandable_leads(void **state)
{
    og_record_t *r = base();
    strcpy(r->event.library, "libc10_cuda.so");
    og_set(&r->event.requested_bytes, 992 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    static struct og_hist_ev ev[16];
    released_nothing_after_varied_sizes(r, ev, 900 * MiB, GiB);
    run(r);
    assert_true(has_cause(r, "fragmentation"));
    assert_string_equal(r->remedies[0].id, "expandable_segments");
    assert_true(rank_of(r, "bucket_by_length") > 0 && rank_of(r, "bucket_by_length") <= 3);
    assert_true(rank_of(r, "empty_cache") != 1);
    free(r);
}

/* a whole track through one model, one input at a time (roles.batch_size 1), fails for 14.9 GiB beside 1.2 GiB
 * cached and 5 GiB free, the retry freeing nothing: grouping lengths has no batch to group, and growing segments in
 * place gains at most what is cached, short of the 8.7 GiB missing (listed after all that can cover); a batch of
 * eight keeps bucketing */
static void batch_of_one_no_buckets(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 295 * MiB, 0, 0, 0, 239 * MiB, 15 * GiB);
    fixture_phase(r, "evaluation", "/w/tokenize.py", "forward");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.reserved_bytes = r->memory.fw.allocated_bytes + 1270 * MiB;
    og_set(&r->memory.framework_cached_bytes, 1270 * MiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    og_set(&r->event.requested_bytes, 15299 * MiB);
    og_set(&r->device.free_bytes, 5174 * MiB);
    static struct og_hist_ev ev[16];
    released_nothing_after_varied_sizes(r, ev, 100 * MiB, 512 * MiB);
    r->memory.fw.roles.batch_size = 8;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "bucket_by_length") > 0);
    assert_true(rank_of(r, "expandable_segments") == 0 || rem(r, "expandable_segments")->ranking.tier == 3);
    r->memory.fw.roles.batch_size = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "bucket_by_length"), 0);
    free(r);
}

/* a 3% and a 4x shortfall do not get the same list */
static void shortfall_size_shapes_the_list(void **state)
{
    og_record_t *a = base(), *b = base();
    og_set(&a->event.requested_bytes, 1030 * MiB); /* 3% over the 1 GiB free */
    og_set(&b->event.requested_bytes, 12 * GiB);   /* 4x the 3 GiB free */
    og_set(&b->device.free_bytes, 3 * GiB);
    og_set(&a->memory.framework_cached_bytes, 0);
    og_set(&b->memory.framework_cached_bytes, 0);
    a->memory.framework_cached_source = b->memory.framework_cached_source = OG_CACHE_POOL;
    run(a);
    run(b);
    bool same = a->nremedies >= 3 && b->nremedies >= 3;
    for (int i = 0; i < 3 && same; i++)
        same = strcmp(a->remedies[i].id, b->remedies[i].id) == 0;
    assert_false(same);
    assert_string_not_equal(a->remedies[0].id, "inference_mode");
    assert_int_equal(rank_of(a, "bigger_gpu"), 0); /* 3% over: the job fits this card */
    free(a);
    free(b);
}

static void inference_mode_leads_only_when_known(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 1100 * MiB);
    og_set(&r->memory.framework_cached_bytes, 0);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    run(r);
    assert_string_not_equal(r->remedies[0].id, "inference_mode");
    /* the adapter says: grad on, no optimizer, eval: inference without no_grad */
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = -1;
    run(r);
    assert_true(rank_of(r, "inference_mode") >= 1 && rank_of(r, "inference_mode") <= 3);
    /* grad already off: inference mode has nothing to give */
    r->memory.fw.grad_enabled = -1;
    run(r);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    /* known training: not offered */
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run(r);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

static void limit_refused_by_context_alone(void **state)
{
    og_record_t *r = base();
    fixture_limit_by_context(r);
    run(r);
    assert_string_equal(r->remedies[0].id, "raise_limit");
    assert_int_equal(r->nremedies, 1); /* nothing the job shrinks can help */
    assert_non_null(strstr(r->remedies[0].why, "CUDA context"));
    free(r);
}

static void remedy_texts_over_edge_numbers(void **state)
{
    for (size_t i = 0; i < FIXTURE_EDGE_CASES; i++) {
        og_record_t *r = base();
        fixture_edge_case(r, i);
        bool no_framework = i % FIXTURE_EDGE_VARIANTS == 4;
        run(r);
        for (int k = 0; k < r->nremedies; k++) {
            og_test_check_text(r->remedies[k].why);
            for (int h = 0; h < r->remedies[k].nhow; h++)
                og_test_check_text(r->remedies[k].how[h]);
            /* framework-specific lines are labelled when the framework is unknown */
            if (no_framework)
                for (int h = 0; h < r->remedies[k].nhow; h++)
                    if (strstr(r->remedies[k].how[h], "torch."))
                        assert_non_null(strstr(r->remedies[k].how[h], "PyTorch"));
        }
        free(r);
    }
}

/* a failure an adapter reported without its size: no remedy sizes itself against a request of "0 B", none
 * covers a shortfall that was not measured, and a bigger card is not promised from it */
static void request_not_given_sizes_nothing(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->event.framework_internal = true;
    r->memory.fw.internal_oom = true;
    og_unset(&r->event.requested_bytes);
    run(r);
    assert_false(og_known(r->diagnosis.shortfall_bytes));
    assert_true(r->nremedies > 0);
    for (int k = 0; k < r->nremedies; k++) {
        const og_remedy_t *m = &r->remedies[k];
        assert_null(strstr(m->why, "0 B request"));
        assert_null(strstr(m->why, "+ 0 B"));
        assert_null(strstr(m->why, "get 0 B"));
        assert_null(strstr(m->why, "smallest common card that fits"));
    }
    free(r);
}

/* autocast already on at the failure: mixed precision is in force, it is not offered again */
static void autocast_on_drops_mixed_precision(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.autocast = -1;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "mixed_precision") > 0);
    r->memory.fw.autocast = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
}

/* ------------------------------------------------------------------ by role and phase */

/* 16 steps that each keep 1 GiB (a leak), the failing request one more step */
static void leaking_steps(og_record_t *r)
{
    static struct og_hist_ev ev[64];
    uint64_t live = 4 * GiB;
    for (int s = 0; s < 16; s++) {
        ev[3 * s] =
            (struct og_hist_ev){ .t_rel = s * 0.1, .op = OG_OP_ALLOC, .bytes = 512 * MiB, .live = live += 512 * MiB };
        ev[3 * s + 1] =
            (struct og_hist_ev){ .t_rel = s * 0.1 + 0.01, .op = OG_OP_ALLOC, .bytes = GiB, .live = live += GiB };
        ev[3 * s + 2] = (struct og_hist_ev){
            .t_rel = s * 0.1 + 0.02, .op = OG_OP_FREE, .bytes = 512 * MiB, .live = live -= 512 * MiB
        };
    }
    r->history.events = ev;
    r->history.nevents = 48;
    og_set(&r->event.requested_bytes, 512 * MiB);
}

/* unknown is not zero: without roles and phase (a C program) the list is today's */
static void no_roles_no_role_remedies(void **state)
{
    og_record_t *r = dnf();
    run_primary(r, "does_not_fit");
    for (size_t i = 0; i < sizeof ROLE_PHASE_IDS / sizeof *ROLE_PHASE_IDS; i++)
        assert_int_equal(rank_of(r, ROLE_PHASE_IDS[i]), 0);
    assert_true(rank_of(r, "smaller_batch") > 0);
    assert_non_null(strstr(rem(r, "gradient_checkpointing")->why, "not measured (no roles"));
    free(r);
}

/* retrying inside the except block of an earlier OOM: leave the handler first */
static void phase_oom_handler(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 0, 0, 0, 0, 12 * GiB);
    fixture_phase(r, "oom_handler", "/srv/train.py", "step");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "retry_outside_except");
    assert_non_null(strstr(r->remedies[0].why, "train.py:42 in step"));
    assert_true(rank_of(r, "release_references") > 0);
    free(r);
}

/* a fallback inside the handler fails in attention while the failed attempt's activations are alive: they
 * cover the shortfall beyond the failing request, so leaving the handler leads over the fused kernel; with
 * activations that do not (the fallback's own need), the operation's remedy leads */
static void handler_keeps_failed_attempt(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 14 * GiB);
    fixture_operation(r, "attention", "_attn");
    fixture_phase(r, "oom_handler", "/srv/extract.py", "main");
    og_set(&r->event.requested_bytes, 3 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "retry_outside_except");
    assert_true(rank_of(r, "flash_attention") > 1);
    fixture_roles(r, 11 * GiB, 0, 0, 0, 0, 4 * GiB); /* 4 GiB - 3 GiB requested < 2 GiB short */
    fixture_operation(r, "attention", "_attn");
    fixture_phase(r, "oom_handler", "/srv/extract.py", "main");
    og_set(&r->event.requested_bytes, 3 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "flash_attention");
    free(r);
}

/* restoring a checkpoint with torch.load: map_location="cpu" first, the activation remedies not offered */
static void phase_checkpoint_restore(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 0, 0, 0, 12 * GiB, 0);
    fixture_holder(r, "result", "dict", "local in load (serialization.py:1025)", 12 * GiB);
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    assert_true(rank_of(r, "load_in_bf16") > 1);
    assert_true(rank_of(r, "smaller_batch") == 0 || rank_of(r, "smaller_batch") > 3);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

/* A 4-bit model made bfloat16 on the card to merge its adapter (model.dequantize()): 23 GiB of weights so far.
 * Quantizing is what the job undoes: not offered; moving the work off the card is.  The same load from
 * from_pretrained keeps quantization */
static void dequantizing_load(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 23 * GiB, 0, 0, 0, 0, 0);
    fixture_dtype(r, "bfloat16", 17 * GiB);
    og_set(&r->memory.process_tracked_bytes, 23 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    fixture_phase(r, "loading", "/w/merge.py", "dequantize");
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.load_dequantizes);
    assert_int_equal(rank_of(r, "quantization"), 0);
    assert_true(rank_of(r, "cpu_offload") > 0 && rank_of(r, "cpu_offload") <= 2);
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/transformers/modeling_utils.py", "from_pretrained");
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.load_dequantizes);
    assert_true(rank_of(r, "quantization") > 0);
    free(r);
}

/* a restore beside a server of another job holding most of the card (a TensorRT-LLM KV pool): the weights go to this
 * card wherever they are restored, so the other process's memory leads, not map_location */
static void checkpoint_restore_beside_others(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 0);
    fixture_other(r, 3101, "tritonserver", 18 * GiB);
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 18 * MiB);
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    run_primary(r, "foreign_memory");
    assert_string_equal(r->remedies[0].id, "foreign_processes");
    assert_true(rank_of(r, "map_location_cpu") > 1);
    free(r);
}

/* a from_pretrained that assigns each shard's tensors as the parameters: the one model's 22 GiB of weights already on
 * the 24 GiB card, 1 GiB of the current shard in the loader's dict: the weights themselves do not fit, so fewer bits
 * lead (and more devices), not loading the shard on the CPU; the same load with 12 GiB of weights here restores
 * on the CPU first as before */
static void weights_fill_the_card(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 22 * GiB, 0, 0, 0, 1 * GiB, 0);
    fixture_model(r, "MixtralForCausalLM", 22 * GiB, 1, true);
    fixture_holder(r, "result", "dict", "local in load_file (load.py:57)", 1 * GiB);
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "quantization");
    assert_true(ranked_by(&r->remedies[0], "weights_fill_card_lead"));
    assert_true(rank_of(r, "map_location_cpu") != 1);
    fixture_dtype(r, "float32", 22 * GiB); /* float32 weights: bfloat16 halves them first */
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "quantization"), "weights_fill_card_lead"));
    r->memory.fw.roles.ndtypes = 0;
    r->memory.fw.roles.has_dtypes = false;
    fixture_roles(r, 12 * GiB, 0, 0, 0, 1 * GiB, 0);
    r->memory.fw.roles.nmodels = 0;
    fixture_model(r, "MixtralForCausalLM", 12 * GiB, 1, true);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    free(r);
}

/* the failing statement builds a checkpoint (ckpt_opt = ...) with no torch.load frame: map_location="cpu" */
static void statement_checkpoint_restore(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 0, 0, 0, 0, 20 * GiB, 0);
    fixture_holder(r, "got", "list", "local in alloc_n (resume.py:25)", 12 * GiB);
    fixture_phase(r, "loading", "/w/resume.py", "<module>");
    fixture_statement(r, "ckpt_opt", "checkpoint");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    free(r);
}

/* an EMA made or updated after the step (phase ema_update): the activations are gone, no activation
 * remedy, no inference_mode */
static void phase_ema_update(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 5 * GiB, 0, 10 * GiB, 0, 5 * GiB, 0);
    fixture_optimizer(r, "AdamW", 10 * GiB);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    fixture_phase(r, "ema_update", "/w/train.py", "main");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

/* a second copy of the same model alive (a notebook cell run again): restart or release it first, before
 * the splinters of the cache; an EMA's copy is meant */
static void second_copy_of_a_model(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 6 * GiB, 3 * GiB, 6 * GiB, 0, 0, 7 * GiB);
    fixture_model(r, "UNet2DConditionModel", 3 * GiB, 2, false);
    fixture_phase(r, "forward", "/w/unet.py", "forward");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "restart_process") == 1 || rank_of(r, "release_references") == 1);
    fixture_phase(r, "ema_update", "/w/train.py", "main");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "restart_process") != 1 && rank_of(r, "release_references") != 1);
    free(r);
    /* the cell run again fails while its new model is still being built (a group of its own, smaller): the
     * first run's model is released or the kernel restarted, not the activations' advice; the texts say so */
    r = base();
    fixture_roles(r, 7 * GiB, 4 * GiB, 8 * GiB, 0, 0, 4 * GiB);
    fixture_model(r, "LM", 4 * GiB, 1, false);
    fixture_model(r, "LM", 3 * GiB, 1, false);
    fixture_statement(r, "weight", "");
    snprintf(r->memory.fw.roles.stmt.function, sizeof r->memory.fw.roles.stmt.function, "__init__");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "restart_process") == 1 || rank_of(r, "release_references") == 1);
    assert_true(rank_of(r, "restart_process") <= 2 && rank_of(r, "release_references") <= 2);
    assert_non_null(strstr(rem(r, "restart_process")->why, "previous copy of the model"));
    assert_true(how_has(rem(r, "release_references"), "sys.last_traceback"));
    /* the same models in a forward pass: two models of one class (a query and a document encoder), not a copy */
    snprintf(r->memory.fw.roles.stmt.function, sizeof r->memory.fw.roles.stmt.function, "forward");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "restart_process") != 1 && rank_of(r, "release_references") != 1);
    free(r);
}

/* the failing request is cross-entropy's over the logits (roles.operation): a fused or chunked loss leads, its
 * text names the operation's frame; without the operation, nothing says so */
static void cross_entropy_fused_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 5 * GiB, 0, 0, 0, 0, 12 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 80 * MiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 7 * GiB + 512 * MiB);
    og_set(&r->device.free_bytes, 6 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "fused_cross_entropy"), 0);
    fixture_operation(r, "cross_entropy", "cross_entropy");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_non_null(strstr(r->remedies[0].why, "cross_entropy at train.py:108"));
    assert_non_null(strstr(r->remedies[0].why, "[tokens, vocabulary]"));
    /* models measured with no attention layer and no embedding table (a segmentation network): per-class scores at
     * every position, not a vocabulary; unknown embeddings keep the language model's words */
    r->memory.fw.roles.attention_modules = fx_opt(0);
    og_set(&r->memory.fw.roles.embedding_bytes, 0);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_non_null(strstr(r->remedies[0].why, "[positions, classes]"));
    assert_null(strstr(r->remedies[0].why, "vocabulary"));
    assert_null(strstr(r->remedies[0].saving, "vocabulary"));
    assert_null(strstr(r->remedies[0].cost, "tokens"));
    assert_false(how_has(&r->remedies[0], "lm_head"));
    og_unset(&r->memory.fw.roles.embedding_bytes);
    run_primary(r, "does_not_fit");
    assert_non_null(strstr(r->remedies[0].why, "[tokens, vocabulary]"));
    r->memory.fw.roles.attention_modules = fx_opt(12);
    assert_int_equal(rank_of(r, "restart_process"), 0);
    assert_true(rank_of(r, "mixed_precision") > 0);
    /* the weights measured in bfloat16: what they compute is half precision already, autocast halves nothing */
    fixture_dtype(r, "bfloat16", 5 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
}

/* a model of the running one's class and another size that no name reaches and that does not run (a previous
 * fold's, kept by a reference cycle) holds the missing bytes: releasing it (gc.collect) leads, ahead of a restart
 * that would lose the loop; a frozen one (a teacher) or one a name holds is no leftover */
static og_record_t *fold_beside_leftover(bool frozen, int named)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB + 300 * MiB, 0, GiB, 4 * GiB + 500 * MiB, 0, 12 * GiB);
    fixture_optimizer(r, "AdamW", 4 * GiB + 500 * MiB);
    fixture_model(r, "Eva", GiB + 150 * MiB, 1, frozen);
    fixture_model_held(r, named, 0, named ? "previous" : "");
    fixture_model(r, "Eva", GiB + 140 * MiB, 1, false);
    fixture_model_held(r, 1, 1, "model");
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 192 * MiB);
    og_set(&r->device.free_bytes, 128 * MiB);
    return r;
}

static void unreached_leftover_released_first(void **state)
{
    og_record_t *r = fold_beside_leftover(false, 0);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.unreached_copies, GiB + 150 * MiB);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "no name of the running code reaches"));
    assert_true(how_has(&r->remedies[0], "gc.collect()"));
    assert_true(rank_of(r, "restart_process") > 1);
    free(r);
    for (int i = 0; i < 2; i++) {
        r = fold_beside_leftover(i == 0, i == 0 ? 0 : 1);
        run_primary(r, "does_not_fit");
        assert_int_equal(r->analysis.facts.roles.unreached_copies, 0);
        free(r);
    }
}

/* a training job's forward pass with autograd on that no frame of the failing stack backpropagates
 * (roles.backward_on_stack false: an acquisition pass with MC dropout after a round of training): inference mode
 * leads, though the job trains, and checkpointing is not brought; a frame that calls backward, or a stack not read,
 * keeps the training's rules (inference mode dropped) */
static void forward_feeding_no_backward(void **state)
{
    for (int on_stack = -1; on_stack <= 1; on_stack++) {
        og_record_t *r = base();
        fixture_roles(r, 30 * MiB, 0, 30 * MiB, 60 * MiB, 0, 12 * GiB);
        fixture_optimizer(r, "AdamW", 60 * MiB);
        og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 30 * MiB);
        fixture_phase(r, "forward", "/w/al_loop.py", "forward");
        r->memory.fw.grad_enabled = 1;
        r->memory.fw.training = 1;
        r->memory.fw.roles.checkpointing = -1;
        r->memory.fw.roles.backward_on_stack = on_stack;
        og_set(&r->event.requested_bytes, 726 * MiB);
        og_set(&r->device.free_bytes, 258 * MiB);
        run_primary(r, "does_not_fit");
        if (on_stack == -1) {
            assert_string_equal(r->remedies[0].id, "inference_mode");
            assert_non_null(strstr(r->remedies[0].why, "no frame of the failing stack calls backward"));
            assert_int_equal(r->analysis.facts.roles.no_backward, 1);
        } else {
            assert_int_equal(rank_of(r, "inference_mode"), 0);
            assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
        }
        free(r);
    }
}

/* the failing request is a transducer's joint over [batch, frames, tokens, vocabulary] (roles.operation
 * transducer_loss): the joint and loss in sub-batches lead, said as such; a confident growth keeps its own lead */
static void transducer_loss_split_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 128 * MiB, 0, 0, 256 * MiB, 0, 14 * GiB);
    fixture_optimizer(r, "AdamW", 256 * MiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 128 * MiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 6 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "split_operation"), 0);
    fixture_operation(r, "transducer_loss", "rnnt_loss");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_non_null(strstr(r->remedies[0].why, "transducer"));
    assert_true(how_has(&r->remedies[0], "fused_batch_size"));
    assert_int_equal(rank_of(r, "fused_cross_entropy"), 0);
    free(r);
}

/* a first forward pass with autograd on, no optimizer of torch's, no gradient yet: whether the job trains is unknown
 * and inference mode stays listed; the running code calling backward (roles.backward_in_code: a closure scipy's
 * L-BFGS calls) says the pass is a training step, and inference mode goes */
static void backward_in_code_trains(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 14 * GiB);
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/fit.py", "forward");
    og_set(&r->event.requested_bytes, 6 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "inference_mode") > 0);
    r->memory.fw.roles.backward_in_code = true;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

/* the running code enters autocast (roles.autocast_in_code) while the loss over the logits fails with autocast off
 * (it keeps them float32 anyway), or a backward pass fails: mixed precision is in force and not listed; the same
 * code failing in a forward pass outside autocast, or no such code, keeps it */
static void autocast_in_code(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 14 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 2 * GiB);
    fixture_dtype(r, "float32", 2 * GiB);
    fixture_operation(r, "cross_entropy", "cross_entropy");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.autocast = -1;
    og_set(&r->event.requested_bytes, 9 * GiB);
    og_set(&r->device.free_bytes, 6 * GiB + 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_true(rank_of(r, "mixed_precision") > 0);
    r->memory.fw.roles.autocast_in_code = true;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    /* a forward pass of the same code outside the autocast block: it could still halve */
    r->memory.fw.roles.operation[0] = 0;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "mixed_precision") > 0);
    fixture_phase(r, "backward", "/w/train.py", "backward");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
}

/* a GradScaler and autocast named nowhere in the program (roles.scaler_without_autocast): the forward runs in float32
 * though the program meant half precision; mixed precision leads, ahead of checkpointing, its text says why; autocast
 * on at the failure, or the optimizer's step, not this */
static void scaler_without_autocast(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 20 * GiB);
    fixture_dtype(r, "float32", 1 * GiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.autocast = -1;
    r->memory.fw.roles.checkpointing = -1;
    fixture_phase(r, "forward", "/w/train_seg.py", "forward");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    r->memory.fw.roles.scaler_no_autocast = true;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "mixed_precision");
    assert_true(ranked_by(&r->remedies[0], "scaler_without_autocast_lead"));
    assert_non_null(strstr(r->remedies[0].why, "GradScaler but never enters autocast"));
    r->memory.fw.autocast = 1;
    run(r);
    assert_false(ranked_by(&r->remedies[0], "scaler_without_autocast_lead"));
    r->memory.fw.autocast = -1;
    fixture_phase(r, "optimizer_step", "/w/train_seg.py", "step");
    run(r);
    assert_string_not_equal(r->remedies[0].id, "mixed_precision");
    free(r);
}

/* the program pads its inputs to a fixed maximum length (roles.padding_to_max_length) and a forward pass over them
 * fails with the activations holding the card: dynamic padding leads, named with the line; without the padding
 * fact it is not offered; a failure where no activations are made (loading, the optimizer's step) does not list it */
static void padding_to_max_length(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 20 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 2 * GiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.roles.checkpointing = -1;
    og_set(&r->event.requested_bytes, 256 * MiB);
    og_set(&r->device.free_bytes, 138 * MiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "dynamic_padding"), 0);
    fixture_setting(r, OG_SETTING_padding_to_max_length, "tokenize", "padding");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "dynamic_padding");
    assert_non_null(strstr(r->remedies[0].why, "train.py:105 in tokenize"));
    assert_true(rank_of(r, "bucket_by_length") > 0);
    fixture_phase(r, "optimizer_step", "/w/train.py", "step");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "dynamic_padding"), 0);
    fixture_phase(r, "loading", "/w/train.py", "load");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "dynamic_padding"), 0);
    free(r);
}

/* the program asks its model for every layer's hidden states (roles.extra_outputs) and an evaluation pass fails:
 * only_needed_outputs leads, named with the line and the keyword, even beside a growth (outputs kept per layer
 * are a rise within the call); without the fact it is not offered; in backward it is not listed */
static void extra_outputs_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 13 * GiB, 0, 0, 0, 0, 8 * GiB);
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 896 * MiB);
    og_set(&r->device.free_bytes, 600 * MiB);
    fixture_phase(r, "evaluation", "/w/embed.py", "encode");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "only_needed_outputs"), 0);
    fixture_setting(r, OG_SETTING_extra_outputs, "embed", "output_hidden_states");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "only_needed_outputs");
    assert_non_null(strstr(r->remedies[0].why, "output_hidden_states=True (train.py:105 in embed)"));
    fixture_phase(r, "backward", "/w/train.py", "backward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "only_needed_outputs"), 0);
    free(r);
}

/* A desktop session's few hundred MiB beside a pass still building (facts: others_sliver): they cover this one
 * request, not the rest of the pass, so the job does not fit and stopping them is not the advice; the same bytes
 * with no phase (a C program) or others holding a real share of the card keep foreign_memory.  Attention weights
 * asked for (output_attentions=True) come before a fused kernel, which returns none */
static void others_a_sliver_of_the_device(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 23 * GiB, 0, 0, 0, 0, 0);
    fixture_other(r, 1201, "Xorg", 412 * MiB);
    fixture_other(r, 1377, "gnome-shell", 186 * MiB);
    og_set(&r->event.requested_bytes, 136 * MiB);
    og_set(&r->device.free_bytes, 74 * MiB);
    fixture_phase(r, "loading", "/w/train.py", "from_pretrained");
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.others_sliver);
    assert_true(rank_of(r, "foreign_processes") == 0 || rank_of(r, "foreign_processes") > 3);
    fixture_phase(r, "", NULL, NULL);
    run_primary(r, "foreign_memory"); /* no phase: this request may be the last; alone the job would fit */
    assert_false(r->analysis.facts.others_sliver);
    free(r);

    r = base();
    fixture_roles(r, 18 * GiB, 0, 0, 0, 0, 0);
    fixture_other(r, 2210, "python3", 5 * GiB);
    og_set(&r->event.requested_bytes, 136 * MiB);
    og_set(&r->device.free_bytes, 74 * MiB);
    fixture_phase(r, "loading", "/w/train.py", "from_pretrained");
    run_primary(r, "foreign_memory"); /* a colleague's job: a fifth of the card */
    assert_false(r->analysis.facts.others_sliver);
    free(r);

    r = base();
    fixture_roles(r, 752 * MiB, 0, 0, 0, 0, 20 * GiB);
    fixture_operation(r, "attention", "eager_attention_forward");
    fixture_setting(r, OG_SETTING_extra_outputs, "review", "output_attentions");
    r->memory.fw.grad_enabled = -1;
    fixture_phase(r, "evaluation", "/w/review.py", "review");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "only_needed_outputs");
    assert_string_equal(r->remedies[1].id, "flash_attention");
    fixture_setting(r, OG_SETTING_extra_outputs, "review", "output_hidden_states");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "flash_attention");
    free(r);
}

/* attention computed eagerly (roles.operation attention) fails making a 64 GiB score matrix in a training step with
 * checkpointing on at batch 1: fused attention leads (it never makes the matrix), named with the function; no
 * operation measured: it does not lead */
static void eager_attention_fused_first(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    fixture_roles(r, 14 * GiB, 0, 0, 0, 0, 2 * GiB);
    fixture_operation(r, "attention", "eager_attention_forward");
    r->memory.fw.roles.checkpointing = 1;
    r->memory.fw.roles.batch_size = 1;
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    og_set(&r->event.requested_bytes, 64 * GiB);
    og_set(&r->device.free_bytes, 62 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "flash_attention");
    assert_non_null(strstr(r->remedies[0].why, "eager_attention_forward"));
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0); /* in force already */
    assert_false(how_has(&r->remedies[0], "need_weights=False"));
    /* a dense L x L mask made whole (transformers' _update_causal_mask of a packed batch): the variable-length kernel
     * never makes one */
    fixture_operation(r, "attention_mask", "_update_causal_mask");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "flash_attention");
    assert_non_null(strstr(r->remedies[0].why, "dense attention mask made whole (_update_causal_mask"));
    fixture_operation(r, "attention", "eager_attention_forward");
    /* nn.MultiheadAttention called with need_weights=True (the argument its row read): call it without weights */
    fixture_operation(r, "attention", "multi_head_attention_forward");
    snprintf(r->memory.fw.roles.op_argument, sizeof r->memory.fw.roles.op_argument, "need_weights=True");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "flash_attention");
    assert_true(how_has(&r->remedies[0], "need_weights=False"));
    r->memory.fw.roles.operation[0] = 0;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "flash_attention") != 1);
    free(r);
}

/* a training forward whose batch of BATCH samples goes far beyond the earlier steps: twelve steps that free what they
 * make (256 MiB at most), then new sizes of 1 and 2 GiB and 3 GiB failing, the cache splintered (a retry freed
 * nothing) */
static og_record_t *outlier_pass(int batch)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 2 * GiB, 4 * GiB, 0, 0, 12 * GiB);
    fixture_adapter(r, 21 * GiB, 20 * GiB, 64 * MiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    r->memory.fw.roles.batch_size = batch;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    ev_reset(r);
    double t = 0.01;
    for (int s = 0; s < 12; s++, t += 0.1) { /* steps that free what they make */
        ev_add(r, t, "alloc", 256 * MiB);
        ev_add(r, t + 0.01, "free", 256 * MiB);
    }
    ev_add(r, t, "alloc", 1 * GiB);
    ev_add(r, t + 0.01, "alloc", 2 * GiB);
    ev_add(r, t + 0.02, "alloc", 3 * GiB);
    ev_add(r, t + 0.03, "fail", 3 * GiB);
    og_set(&r->event.requested_bytes, 3 * GiB);
    og_set(&r->device.free_bytes, 2560 * MiB);
    r->event.attempts = 2;
    return r;
}

/* the same peak where the failing batch repeats the earlier steps' sizes (a molecule of many more atoms: more
 * allocations, none larger): read through the whole pass, 8 GiB of state kept between steps, the earlier passes
 * at most 2 GiB above it, this one 12 GiB with its request; the input's size leads, and the saving is the pass
 * brought back to what fit */
static void outlier_read_through_the_pass(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 2 * GiB, 4 * GiB, 0, 0, 9 * GiB);
    fixture_adapter(r, 18 * GiB, 17 * GiB, 64 * MiB);
    og_set(&r->memory.process_tracked_bytes, 18 * GiB);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    fixture_steps(r, 500, 0, 0, 0);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB); /* the model's state */
    double t = 0.01;
    for (int s = 0; s < 12; s++, t += 0.1) {
        ev_add(r, t, "alloc", 1 * GiB);
        ev_add(r, t + 0.01, "alloc", 1 * GiB);
        ev_add(r, t + 0.02, "free", 1 * GiB);
        ev_add(r, t + 0.03, "free", 1 * GiB);
    }
    for (int i = 0; i < 10; i++)
        ev_add(r, t + 0.001 * i, "alloc", 1 * GiB);
    ev_add(r, t + 0.02, "fail", 2 * GiB);
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.outlier.pass_peak);
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_non_null(strstr(r->remedies[0].why, "6.0x the most an earlier one held"));
    /* the earlier passes held 5 GiB above the state: this one is no outlier, and the input's size does not lead */
    for (int i = 1; i < 49; i++)
        if (FIXTURE_EV[i].live > 9 * GiB)
            FIXTURE_EV[i].live += 3 * GiB;
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.outlier.holds);
    assert_string_not_equal(r->remedies[0].id, "cap_input_size");
    free(r);
}

/* a training forward asking for more than the card, whose statement hands the model inputs that already hold a
 * third of it (a scan's full-resolution masks, copied to float by the model's resize): capping the input's size leads
 * ahead of splitting an operation inside the model; inputs the statement does not read, or a sixth of the card, and
 * splitting the operation leads */
static void forward_inputs_fill_the_card(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 170 * MiB, 0, 0, 0, 8 * GiB, 400 * MiB);
    fixture_holder(r, "images", "list", "local in train_one_epoch (train.py:302)", 1 * GiB);
    fixture_holder(r, "targets", "list", "local in train_one_epoch (train.py:302)", 7 * GiB);
    fixture_statement(r, "loss_dict", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "model,images,targets");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    fixture_phase(r, "forward", "/w/mask_rcnn.py", "forward");
    og_set(&r->event.requested_bytes, 25 * GiB);
    og_set(&r->device.free_bytes, 15 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.stmt_inputs, 8 * GiB);
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_non_null(strstr(r->remedies[0].why, "(images, targets) already hold 8.00 GiB"));
    assert_true(rank_of(r, "split_operation") > 1);
    /* a sixth of the card: splitting the operation leads */
    r->memory.fw.roles.holders[1].bytes = 3 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    r->memory.fw.roles.holders[1].bytes = 7 * GiB;
    /* the targets kept by a global (read by the statement, but not the running code's batch): not its inputs */
    snprintf(r->memory.fw.roles.holders[1].where, sizeof r->memory.fw.roles.holders[1].where, "global in train.py");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.stmt_inputs, 1 * GiB);
    assert_string_equal(r->remedies[0].id, "split_operation");
    snprintf(r->memory.fw.roles.holders[1].where, sizeof r->memory.fw.roles.holders[1].where,
             "local in train_one_epoch (train.py:302)");
    /* the statement reads neither: not its inputs */
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "model,batch");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.stmt_inputs, 0);
    assert_string_equal(r->remedies[0].id, "split_operation");
    /* autograd off (an inference through a model with no attention layer): the input's size leads by another row,
     * one inference's input, and says nothing of a training forward's copies */
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "model,images,targets");
    og_set(&r->memory.fw.roles.attention_modules, 0);
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->analysis.facts.roles.stmt_input_names, "images, targets");
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_null(strstr(r->remedies[0].why, "already hold"));
    free(r);
}

/* a batch of decoded frames converted to float in a list comprehension, outside any model's pass: 16 GiB made so far
 * beside a 134 MiB request, 447 MiB cached in splinters. The comprehension is still building: what it holds outgrows
 * any defragmented cache (does_not_fit, not fragmentation), and chunks of items, each reduced, lead. Without its
 * frame (Python 3.12 runs comprehensions inline) the textbook splinters decide */
static void comprehension_still_building(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 100 * MiB, 0, 0, 0, 4 * GiB, 16 * GiB);
    fixture_adapter(r, 20 * GiB + 547 * MiB, 20 * GiB + 100 * MiB, 11 * MiB);
    og_set(&r->memory.process_tracked_bytes, 20 * GiB + 547 * MiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.npy_frames = 4;
    r->memory.fw.py_frames[0] = (og_py_frame_t){ .file = "/w/cam.py", .line = 50, .function = "_tensor" };
    r->memory.fw.py_frames[1] = (og_py_frame_t){ .file = "/w/cam.py", .line = 216, .function = "<listcomp>" };
    r->memory.fw.py_frames[2] = (og_py_frame_t){ .file = "/w/cam.py", .line = 216, .function = "gpu_batch" };
    r->memory.fw.py_frames[3] = (og_py_frame_t){ .file = "/w/cam.py", .line = 228, .function = "main" };
    og_set(&r->event.requested_bytes, 134 * MiB);
    og_set(&r->device.free_bytes, 2 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.comprehension, 1);
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_non_null(strstr(r->remedies[0].why, "inside a comprehension (cam.py:216 in gpu_batch)"));
    snprintf(r->memory.fw.py_frames[1].function, sizeof r->memory.fw.py_frames[1].function, "gpu_batch");
    run_primary(r, "fragmentation");
    assert_int_equal(r->analysis.facts.comprehension, -1);
    free(r);
}

/* the models' layers walked and no attention layer met (a graph network): fused attention is not listed and
 * capping the input's size (cap_input_size) takes the place of a shorter sequence length; attention layers there,
 * an attention operation failing in a layer not named so, the walk unknown, or a decoding model: fused attention
 * stays and the length is the input's */
static void no_attention_layers_no_fused_attention(void **state)
{
    og_record_t *r = outlier_pass(1); /* one mesh, far beyond the earlier ones */
    og_set(&r->memory.fw.roles.attention_modules, 0);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.attention, -1);
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_non_null(strstr(r->remedies[0].why, "one input far larger than the rest"));
    assert_false(any_how_has(r, "truncation=True"));
    assert_int_equal(rank_of(r, "shorter_sequences"), 0);
    assert_int_equal(rank_of(r, "flash_attention"), 0);
    og_set(&r->memory.fw.roles.attention_modules, 24); /* a transformer's layers */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.attention, 1);
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_int_equal(rank_of(r, "cap_input_size"), 0);
    assert_true(rank_of(r, "flash_attention") > 0);
    og_unset(&r->memory.fw.roles.attention_modules); /* not walked: unknown rules nothing out */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.attention, 0);
    assert_true(rank_of(r, "flash_attention") > 0);
    og_set(&r->memory.fw.roles.attention_modules, 0); /* none by name, but the failing operation is attention */
    fixture_operation(r, "attention", "forward");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.attention, 1);
    assert_true(rank_of(r, "flash_attention") > 0);
    r->memory.fw.roles.operation[0] = 0; /* none by name, but decoding with a KV cache: attention's keys and values */
    fixture_holder(r, "past_key_values", "list", "local in generate (lm.py:40)", 1 * GiB);
    fixture_holder_says(r, "kv_cache", "");
    fixture_phase(r, "generation", "lm.py", "generate");
    run(r);
    assert_int_equal(r->analysis.facts.roles.attention, 1);
    assert_int_equal(rank_of(r, "cap_input_size"), 0);
    free(r);
}

/* a diffusion demo keeps every generated image in a global list: memory rises request after request in phase
 * generation, the roles measured and no KV cache among them: what grows is the list, so releasing it leads, not the
 * generation's own working set (a smaller batch); the same list said to be a KV cache is that working set; beside a
 * smaller KV cache of the running generate(), the list is still what grows */
static void generation_growth_without_kv_cache(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 256 * MiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 600 * MiB);
    fixture_roles(r, 6 * GiB, 0, 0, 0, 10 * GiB, 1 * GiB);
    fixture_holder(r, "history", "list", "global in app.py", 10 * GiB);
    fixture_phase(r, "generation", "/srv/app.py", "generate");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    fixture_holder_says(r, "kv_cache", "");
    run(r);
    assert_string_not_equal(r->remedies[0].id, "release_references");
    /* the list again beside generate()'s own KV cache (1 GiB, a local): the growth's holder (roles.grower) is the
     * list, far larger than the cache: what grows is the list, releasing it leads */
    fixture_holder_says(r, "", "");
    fixture_holder(r, "past_key_values", "tuple", "local in generate (app.py:40)", 1 * GiB);
    fixture_holder_says(r, "kv_cache", "");
    run(r);
    assert_int_equal(r->analysis.facts.roles.grower, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    free(r);
}

/* a rank of a 4-rank job fails while loading 20 GiB of weights onto its GPU: loading on the CPU or the meta
 * device and letting the sharder place each rank's part leads, its saving three quarters of what arrived; the
 * same load in a single process does not offer it */
static void rank_loads_whole_model(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    fixture_phase(r, "loading", "/w/train.py", "from_pretrained");
    r->world_size = 4;
    r->rank = r->local_rank = 1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shard_before_load");
    assert_non_null(strstr(r->remedies[0].why, "each of the job's 4 ranks"));
    /* torch.load restoring a file onto the GPU (an elastic restart reading every old rank's shard): the restore on
     * the host leads */
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    assert_true(rank_of(r, "shard_before_load") > 1);
    fixture_phase(r, "loading", "/w/train.py", "from_pretrained");
    r->world_size = 1;
    r->rank = r->local_rank = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "shard_before_load"), 0);
    free(r);
}

/* the same rank, where the model being moved here is larger than the card (20 GiB here, 8 GiB still on the host:
 * 28 GiB for a 24 GiB card): no rank can ever hold it whole, so partitioning the weights (ZeRO-3, FSDP) leads and
 * loading it sharded follows; with the rest of it small enough to fit, loading sharded leads as before */
static void rank_model_larger_than_card(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    fixture_model(r, "Qwen2ForCausalLM", 20 * GiB, 1, false);
    r->memory.fw.roles.models[0].away = 8 * GiB;
    fixture_phase(r, "loading", "/w/train.py", "to");
    r->world_size = 4;
    r->rank = r->local_rank = 1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "zero_fsdp");
    assert_true(ranked_by(&r->remedies[0], "rank_model_exceeds_card_lead"));
    assert_int_equal(rank_of(r, "shard_before_load"), 2);
    r->memory.fw.roles.models[0].away = 1 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shard_before_load");
    free(r);
}

/* one operation that can be split (an image decode) makes a tensor at least the pass's working set: split it
 * first; in inference a smaller batch is not in the top 3 (slicing runs the batch piece by piece); a working set
 * larger than the request: the batch, not the operation, and split_operation is not brought */
static void operation_dominates_split_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 6 * GiB, 0, 0, 0, 0, 2 * GiB);
    fixture_operation(r, "image_decode", "decode");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 7 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(how_has(&r->remedies[0], "enable_vae_tiling"));
    assert_null(strstr(r->remedies[0].why, "larger than the whole"));
    assert_true(rank_of(r, "smaller_batch") == 0 || rank_of(r, "smaller_batch") > 3);
    fixture_operation(r, "pairwise", "cdist"); /* an all-pairs distance: split in blocks of rows */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(how_has(&r->remedies[0], "torch.cdist"));
    fixture_operation(r, "kernel_matrix", "evaluate_kernel"); /* a GP's K(X, X): tiles (KeOps) or fewer points */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(how_has(&r->remedies[0], "keops"));
    fixture_roles(r, 6 * GiB, 0, 0, 0, 0, 9 * GiB);
    fixture_operation(r, "image_decode", "decode");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "split_operation"), 0);
    /* an all-pairs operation keeps several tensors of its pairs' size (box IoU: both corners, the sides): 8 GiB of
     * them against 20 GiB of activations still dominates (3 x 8 >= 20); against 25 GiB it does not */
    fixture_roles(r, 6 * GiB, 0, 0, 0, 0, 20 * GiB);
    fixture_operation(r, "pairwise", "box_iou");
    og_set(&r->device.total_bytes, 80 * GiB);
    og_set(&r->device.free_bytes, 7 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    fixture_roles(r, 6 * GiB, 0, 0, 0, 0, 25 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "split_operation"), 0);
    free(r);
}

/* a convolution over one huge image (roles.operation conv) with autograd off, its one output larger than the
 * card: tile the input (split_operation) first, not a shorter sequence; the same convolution with autograd on
 * (a training step keeps every layer's output): split_operation is not brought */
static void conv_inference_tiles_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 5 * GiB, 0, 0, 0, 0, 0);
    fixture_operation(r, "conv", "_conv_forward");
    fixture_phase(r, "forward", "/w/segment.py", "forward");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 36 * GiB);
    og_set(&r->device.free_bytes, 18 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.operation, OG_OP_conv);
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(strstr(r->remedies[0].why, "convolution") != NULL);
    assert_true(rank_of(r, "shorter_sequences") != 1);
    /* within the card: a 20 GiB output beside its 22 GiB input map (a layer's input and output alive together)
     * still tiles first; an 8 GiB output beside them is not the peak */
    fixture_roles(r, 16 * MiB, 0, 0, 0, 0, 22 * GiB);
    fixture_operation(r, "conv", "_conv_forward");
    og_set(&r->event.requested_bytes, 20 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    og_set(&r->event.requested_bytes, 8 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "split_operation"), 0);
    fixture_roles(r, 5 * GiB, 0, 0, 0, 0, 0);
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 7 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "split_operation"), 0);
    free(r);
}

/* two models of one class held by names of the running code (base, and tuned being loaded), in a job not known
 * to train: one at a time leads, no restart in the top 3; the same first model held by the name the failing
 * statement rebinds is a previous copy (a cell run again): restart or release it first */
static void two_models_one_at_a_time(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 23 * GiB + 512 * MiB, 0, 0, 0, 0, 0);
    fixture_model(r, "LM", 12 * GiB + 512 * MiB, 1, false);
    fixture_model_held(r, 1, 0, "base");
    fixture_model(r, "LM", 11 * GiB, 1, false);
    fixture_model_held(r, 0, 1, "");
    fixture_statement(r, "tuned", "");
    fixture_phase(r, "loading", "/w/eval.py", "from_pretrained");
    og_set(&r->event.requested_bytes, 84 * MiB);
    og_set(&r->device.free_bytes, 26 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.named_copies, 12 * GiB + 512 * MiB);
    assert_int_equal(r->analysis.facts.roles.model_copies, 0);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    assert_non_null(strstr(r->remedies[0].why, "base"));
    assert_true(how_has(&r->remedies[0], "del base;")); /* the model held beside the one loading, by its name */
    assert_true(rank_of(r, "restart_process") == 0 || rank_of(r, "restart_process") > 3);
    fixture_statement(r, "base", "");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "one_model_at_a_time"), 0);
    assert_true(rank_of(r, "restart_process") == 1 || rank_of(r, "release_references") == 1);
    /* ... also where the name reaches it through an object of the program (the pipeline `base` holds it) */
    snprintf(r->memory.fw.roles.models[0].names, sizeof r->memory.fw.roles.models[0].names, "base.unet");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "one_model_at_a_time"), 0);
    fixture_statement(r, "bas", ""); /* a name that only begins the same: another name */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    free(r);
}

/* a server keeps six fine-tunes of one model resident in a dict by key (self.resident[key]) and the seventh fails
 * while loading: bound the registry by memory first (its text names the map and how many fit), neither a
 * previous copy's restart nor one model at a time; the same six held by six names of their own are not a
 * registry */
static void model_registry_bounded(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 40 * GiB);
    og_set(&r->device.free_bytes, 6 * MiB);
    og_set(&r->event.requested_bytes, 20 * MiB);
    fixture_roles(r, 39 * GiB, 0, 0, 0, 0, 0);
    fixture_model(r, "LM", 6 * GiB, 6, true);
    fixture_model_held(r, 6, 0, "self.resident[key]");
    fixture_model(r, "LM", 3 * GiB, 1, true);
    fixture_model_held(r, 0, 1, "");
    fixture_phase(r, "loading", "/w/serve.py", "from_pretrained");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.registry_models, 36 * GiB);
    assert_int_equal(r->analysis.facts.roles.named_copies, 0);
    assert_string_equal(r->remedies[0].id, "bounded_cache");
    assert_non_null(strstr(r->remedies[0].why, "self.resident keeps 6 LM models"));
    assert_non_null(strstr(r->remedies[0].why, "at most 6 of them fit"));
    assert_true(rank_of(r, "restart_process") == 0 || rank_of(r, "restart_process") > 3);
    /* a second card of the job idle (every tenant put on GPU 0): the models placed over the cards lead, the
     * registry's bound after them */
    r->visible_devices = 2;
    r->nsummary = 1;
    r->summary[0].tracked_bytes = 39 * GiB;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "use_idle_gpu") == 1 || rank_of(r, "balance_device_map") == 1);
    assert_false(ranked_by(rem(r, "bounded_cache"), "model_registry_lead"));
    r->visible_devices = 1;
    r->nsummary = 0;
    fixture_model_held(r, 0, 1, "");
    r->memory.fw.roles.nmodels = 1;
    fixture_model_held(r, 6, 0, "a,b,c,d");
    fixture_model(r, "LM", 3 * GiB, 1, true);
    fixture_model_held(r, 0, 1, "");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.registry_models, 0);
    assert_int_equal(rank_of(r, "bounded_cache"), 0);
    free(r);
}

/* a serving process keeps different models by key (MODELS["asr"], MODELS["llm"]), none running, and the next one
 * fails while loading: evict the idle ones first (bounded_cache, its text naming the map and each model); one model
 * by key is a name, not a map of models; in a training job models by key are used together (a GAN): not a cache */
static void keyed_models_evicted(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.free_bytes, 128 * MiB);
    og_set(&r->event.requested_bytes, 416 * MiB);
    fixture_roles(r, 23 * GiB + 512 * MiB, 0, 0, 0, 0, 0);
    fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "MODELS[key]");
    fixture_model(r, "LlamaForCausalLM", 4 * GiB + 512 * MiB, 1, true);
    fixture_model_held(r, 0, 1, "");
    fixture_model(r, "Whisper", 3 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "MODELS[key]");
    fixture_model(r, "Embedder", 1 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "MODELS[key]");
    fixture_phase(r, "loading", "/w/gateway.py", "from_pretrained");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.keyed_models, 19 * GiB);
    assert_int_equal(r->analysis.facts.roles.keyed_count, 3);
    assert_int_equal(r->analysis.facts.roles.registry_models, 0);
    assert_string_equal(r->remedies[0].id, "bounded_cache");
    assert_non_null(strstr(r->remedies[0].why, "MODELS keeps 3 idle models"));
    assert_non_null(strstr(r->remedies[0].why, "Whisper (3.00 GiB)"));
    assert_true(how_has(&r->remedies[0], "MODELS.pop(key)"));
    /* the same models in a training job: no cache to evict from */
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_not_equal(rank_of(r, "bounded_cache"), 1);
    /* one model by key beside the one loading: no map of models */
    r->memory.fw.training = 0;
    r->memory.fw.roles.nmodels = 2;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.keyed_models, 0);
    assert_int_equal(r->analysis.facts.roles.keyed_group, -1);
    assert_int_not_equal(rank_of(r, "bounded_cache"), 1);
    free(r);
}

/* a checkpoint restored onto the GPU and still referenced (ckpt, a local of main) after load_state_dict copied it,
 * failing in the first backward: load it to host memory or drop it, first, named; after an optimizer step (a
 * snapshot, not a restore), without a copy of a role, or while loading: not this rule */
static void checkpoint_kept_after_load(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.free_bytes, 150 * MiB);
    og_set(&r->event.requested_bytes, 168 * MiB);
    fixture_roles(r, 4 * GiB, 1 * GiB + 512 * MiB, 8 * GiB, 0, 4 * GiB, 5 * GiB + 768 * MiB);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_holder(r, "ckpt", "dict", "local in main (train.py:131)", 4 * GiB);
    fixture_holder_says(r, "checkpoint", "parameters");
    fixture_phase(r, "backward", "/w/train.py", "main");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.ckpt_copy, 4 * GiB);
    assert_int_equal(r->analysis.facts.roles.ckpt_holder, 0);
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    assert_string_equal(r->remedies[1].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "ckpt (dict, local in main (train.py:131)) holds 4.00 GiB"));
    assert_true(how_has(&r->remedies[0], "map_location=\"cpu\""));
    assert_true(how_has(&r->remedies[1], "del ckpt"));
    /* an optimizer step ran: a copy made while training is a snapshot, not a restore */
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "map_location_cpu"), 0);
    r->memory.fw.training = 0;
    /* the load itself (phase loading) is checkpoint_restore's */
    fixture_phase(r, "loading", "/w/train.py", "main");
    run_primary(r, "does_not_fit");
    assert_int_not_equal(rank_of(r, "release_references"), 2);
    fixture_phase(r, "backward", "/w/train.py", "main");
    /* a dict named ckpt whose blocks copy no role: not the checkpoint's copy */
    fixture_holder_says(r, "checkpoint", "");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.ckpt_copy, 0);
    assert_int_equal(rank_of(r, "map_location_cpu"), 0);
    free(r);
}

/* a training job holding a second copy of its model by a name of the running code while it evaluates: evaluate
 * without the copy, no restart; the same copy left over (no name holds it): the previous copy's advice */
static void eval_copy_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 9 * GiB, 4 * GiB + 512 * MiB, 9 * GiB, 0, 0, 640 * MiB);
    fixture_model(r, "Summarizer", 4 * GiB + 512 * MiB, 2, false);
    fixture_model_held(r, 2, 0, "model,eval_model");
    fixture_optimizer(r, "AdamW", 9 * GiB);
    fixture_phase(r, "evaluation", "/w/train.py", "validate");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 640 * MiB);
    og_set(&r->device.free_bytes, 300 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "eval_without_copy");
    assert_non_null(strstr(r->remedies[0].why, "eval_model"));
    assert_true(rank_of(r, "restart_process") == 0 || rank_of(r, "restart_process") > 3);
    fixture_model_held(r, 1, 0, "model");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "eval_without_copy"), 0);
    assert_true(rank_of(r, "restart_process") == 1 || rank_of(r, "release_references") == 1);
    free(r);
}

/* the evaluation's copy still being made (eval_model = copy.deepcopy(model), no name holds it yet): the submodules
 * it made so far are its pieces, not a previous copy (facts: copy_pieces), so no restart; evaluate without the copy
 * leads, its saving the whole source's parameters; a deep copy records no graph, so no inference_mode either, though
 * autograd is on in the evaluation phase.  The same copy rebinding a name that holds a model is a replacement */
static void eval_copy_under_way_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 5 * GiB + 27 * 128 * MiB, 5 * GiB, 10 * GiB, 0, 8 * MiB, 0);
    fixture_model(r, "Decoder", 5 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "model");
    fixture_model(r, "DecoderLayer", 128 * MiB, 27, false);
    fixture_model_held(r, 0, 0, "");
    fixture_optimizer(r, "AdamW", 10 * GiB);
    fixture_operation(r, "copy", "__deepcopy__");
    og_set(&r->memory.fw.roles.copy_made, 27 * 128 * MiB);
    fixture_statement(r, "eval_model", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "copy,deepcopy,model");
    fixture_phase(r, "evaluation", "/w/finetune.py", "evaluate");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 128 * MiB);
    og_set(&r->device.free_bytes, 108 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.copy_pieces, 26 * 128 * MiB);
    assert_int_equal(r->analysis.facts.roles.model_copies, 0);
    assert_string_equal(r->remedies[0].id, "eval_without_copy");
    assert_non_null(strstr(r->remedies[0].why, "5.00 GiB of parameters"));
    assert_non_null(strstr(r->remedies[0].why, "deep copy of model"));
    assert_true(rank_of(r, "restart_process") == 0 || rank_of(r, "restart_process") > 3);
    assert_true(rank_of(r, "inference_mode") == 0 || rank_of(r, "inference_mode") > 3);
    /* ref = copy.deepcopy(policy) while the previous ref lives: the replacement's advice, not the evaluation's */
    fixture_model_held(r, 1, 0, "model,eval_model");
    r->memory.fw.roles.models[0].count = 2;
    r->memory.fw.roles.models[0].named = 2;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "in_place_update");
    free(r);
}

/* test-time augmentation keeping every view's full-resolution logits in a list local to the caller of the pass (7
 * like records of 2 GiB): the next view adds one more record, so a remedy freeing less than one (quantizing 212 MiB
 * of weights) cannot carry the job and stays out of the top three, though it covers the 8 MiB the request lacks;
 * the holder is named first.  A holder of one record says nothing of a loop: the weights' remedy is judged on the
 * shortfall alone */
static void holder_next_record_to_come(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 212 * MiB, 0, 0, 0, 14 * GiB, 1200 * MiB);
    fixture_holder(r, "view_logits", "list", "local in predict_tta (tta.py:156)", 14 * GiB);
    r->memory.fw.roles.holders[0].records = 7;
    r->memory.fw.roles.holders[0].tensors = 7;
    fixture_model(r, "DeepLabV3Plus", 212 * MiB, 1, true);
    fixture_phase(r, "evaluation", "/w/tta.py", "forward");
    r->memory.fw.grad_enabled = 0;
    og_set(&r->event.requested_bytes, 16 * MiB);
    og_set(&r->device.free_bytes, 8 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "release_references");
    int q = rank_of(r, "quantization");
    assert_true(q == 0 || q > 3);
    r->memory.fw.roles.holders[0].records = 1;
    run_primary(r, "does_not_fit");
    q = rank_of(r, "quantization");
    assert_true(q > 0 && q <= 3);
    free(r);
}

/* a fill-and-drain pipeline schedule (GPipe): the stage's fwd_cache keeps 14 micro-batches' outputs with their graphs
 * for the backward its step calls later (facts: roles.graph_cache): a backward per micro-batch (1F1B) leads, and the
 * layers still to come are not projected from every micro-batch's activations; no backward on the stack (an
 * evaluation caching outputs), a single record or a holder of no purpose (a leak, read by kept_graphs): not this */
static void pipeline_cache_keeps_microbatch_graphs(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 6 * GiB, 0, 0, 0, 224 * MiB, 37 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 6 * GiB);
    fixture_holder(r, "self.fwd_cache", "dict", "on PipelineStage", 224 * MiB);
    fixture_holder_says(r, "cache", "");
    r->memory.fw.roles.holders[0].records = 14;
    r->memory.fw.roles.holders[0].tensors = 28;
    r->memory.fw.roles.holders[0].graphs = 14;
    r->memory.fw.roles.backward_on_stack = 1;
    r->memory.fw.roles.layer_count = 8;
    r->memory.fw.roles.layer_index = 2;
    r->memory.fw.roles.layer_alike = 1;
    r->memory.fw.roles.steps_known = true; /* the optimizer has made no step: the first forward */
    fixture_phase(r, "forward", "/w/pipe.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 16 * MiB);
    og_set(&r->device.free_bytes, 14 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.graph_cache, 0);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    assert_string_equal(r->remedies[0].id, "backward_per_microbatch");
    assert_true(how_has(&r->remedies[0], "Schedule1F1B"));
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    r->memory.fw.roles.backward_on_stack = -1; /* nothing on the stack backpropagates what it caches */
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_cache, -1);
    r->memory.fw.roles.backward_on_stack = 1;
    r->memory.fw.roles.holders[0].records = 1;
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_cache, -1);
    r->memory.fw.roles.holders[0].records = 14;
    fixture_holder_says(r, "", "");
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_cache, -1);
    free(r);
}

/* a checkpoint sweep whose main() keeps each call's metric states in a local dict: 4 like records of 3.5 GiB, and the
 * call under way holds one more of the same size beside it (facts: growth by records): growth, however few steps
 * the driver saw, with the holder named and its records stored as host copies; not when what Python holds beside it
 * is no record's size, when the dict has one record, or when it is the running pass's own local */
static void records_kept_by_a_caller(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1200 * MiB, 0, 0, 0, 35 * GiB / 2, 200 * MiB);
    fixture_holder(r, "results", "dict", "local in main (sweep.py:178)", 14 * GiB);
    r->memory.fw.roles.holders[0].records = 4;
    r->memory.fw.roles.holders[0].tensors = 12;
    fixture_holder(r, "self.confmat", "Tensor", "on MulticlassConfusionMatrix", 7 * GiB / 2);
    fixture_phase(r, "evaluation", "/w/sweep.py", "evaluate");
    r->memory.fw.grad_enabled = 0;
    og_set(&r->event.requested_bytes, 7 * GiB / 2);
    og_set(&r->device.free_bytes, 5 * GiB / 2);
    run_primary(r, "growth");
    assert_int_equal(r->analysis.facts.growth.marker, OG_MARK_KEPT_RECORDS);
    assert_int_equal(r->analysis.facts.growth.holder, 0);
    assert_int_equal(r->analysis.facts.growth.seen, 5);
    assert_int_equal(r->analysis.facts.growth.per_step, 7 * GiB / 2);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(how_has(&r->remedies[0], "results[key] ="));
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    /* what the call holds beside it is not one more record: no loop's records are read */
    r->memory.fw.roles.holders[1].bytes = 1 * GiB;
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_held_by_python], 15 * GiB);
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_RECORDS);
    /* ... unless each record keeps a copy of the running model: five copies of one model, one running, four records
     * (a trainer per scene kept in a results dict, the running scene's state spread over other names) */
    fixture_model(r, "NeRFNetwork", 1 * GiB, 5, false);
    fixture_model_held(r, 1, 1, "model");
    run_primary(r, "growth");
    assert_int_equal(r->analysis.facts.growth.marker, OG_MARK_KEPT_RECORDS);
    r->memory.fw.roles.models[r->memory.fw.roles.nmodels - 1].running = 2; /* two loops at once: not one more */
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_RECORDS);
    r->memory.fw.roles.models[r->memory.fw.roles.nmodels - 1].running = 1;
    r->memory.fw.roles.models[r->memory.fw.roles.nmodels - 1].count = 4; /* copies that are not one a record */
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_RECORDS);
    r->memory.fw.roles.nmodels--;
    r->memory.fw.roles.holders[1].bytes = 7 * GiB / 2;
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_held_by_python], 35 * GiB / 2);
    r->memory.fw.roles.holders[0].records = 1; /* one record: no loop seen */
    r->memory.fw.roles.holders[0].bytes = 14 * GiB;
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_RECORDS);
    r->memory.fw.roles.holders[0].records = 4; /* the running pass's own local: its working set, not a loop's */
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in evaluate (sweep.py:160)");
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_RECORDS);
    free(r);
}

/* a rollout collected with autograd on before the optimizer's first step: a running loop's local lists keep outputs
 * whose graphs the adapter read alive (roles.holders[].graphs): the holder is the cause, named first, and the
 * optimizer not having stepped yet does not make the rise one pass's, nor do the optimizer's steps read flat (the
 * outputs kept between steps); no graph read alive, or losses kept for one
 * backward (roles.accumulating), or the failure in backward: not this */
static void kept_graphs_measured_in_a_loop(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 10 * MiB, 0, 0, 0, 7 * MiB, 78 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    r->memory.fw.roles.optimizers[0].param_bytes = r->memory.fw.roles.bytes[OG_ROLE_parameters];
    fixture_holder(r, "logprobs", "list", "local in main (train_ppo.py:82)", 7 * MiB);
    r->memory.fw.roles.holders[0].tensors = 414;
    r->memory.fw.roles.holders[0].graphs = 4;
    fixture_phase(r, "forward", "/w/train_ppo.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 16 * MiB);
    og_set(&r->device.free_bytes, 14 * MiB);
    run_primary(r, "growth"); /* measured: each iteration left its graph; nothing was freed for the driver to see */
    assert_int_equal(r->analysis.facts.roles.graph_holder, 0);
    assert_true(r->analysis.facts.roles.graphs_measured);
    assert_false(r->analysis.facts.growth.first_steps);
    assert_int_equal(r->analysis.facts.growth.marker, OG_MARK_KEPT_GRAPHS);
    assert_int_equal(r->analysis.facts.growth.seen, 414);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "logprobs"));
    assert_true(how_has(&r->remedies[0], "logprobs.append(out.detach())"));
    assert_string_equal(r->remedies[1].id, "inference_mode"); /* build no graph for what is only stored */
    /* the kept graphs are a measured leak though the holder's own bytes are a few scalars: neither a smaller pass nor
     * a restart is offered, each only delaying the next failure */
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_int_equal(rank_of(r, "restart_process"), 0);
    /* the optimizer's latest 32 steps flat (a learner whose labels stalled: it serves and keeps outputs, and makes
     * no step): the holder's graphs are measured, and hold whatever the steps did */
    fixture_steps(r, 328, 32, 10 * MiB, 0);
    run_primary(r, "growth");
    assert_true(r->analysis.facts.growth.steps_flat);
    assert_int_equal(r->analysis.facts.growth.marker, OG_MARK_KEPT_GRAPHS);
    assert_string_equal(r->remedies[0].id, "release_references");
    r->memory.fw.roles.nsteps = 0;
    r->memory.fw.roles.steps_known = false;
    r->memory.fw.roles.holders[0].tensors = 4; /* too few outputs to be a loop's iterations: no growth read */
    run(r);
    assert_false(r->analysis.facts.growth.holds && r->analysis.facts.growth.marker == OG_MARK_KEPT_GRAPHS);
    assert_true(r->analysis.facts.roles.graphs_measured); /* yet graphs alive say iterations ended: no first step */
    assert_false(r->analysis.facts.growth.first_steps);
    r->memory.fw.roles.holders[0].tensors = 414;
    r->memory.fw.roles.holders[0].graphs = 1; /* one graph read alive: the running pass's own output */
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_holder, -1);
    assert_true(r->analysis.facts.growth.first_steps);
    r->memory.fw.roles.holders[0].graphs = 4;
    r->memory.fw.roles.has_accum = true; /* losses kept for one backward: backward_per_microbatch's case */
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_holder, -1);
    r->memory.fw.roles.has_accum = false;
    fixture_phase(r, "backward", "/w/train_ppo.py", "update");
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_holder, -1);
    free(r);
}

/* A notebook's training forward fails while IPython's output history (Out, a global the display hook fills) keeps an
 * earlier cell's model output with its graph: one graph alive in the history is never the running pass's (a cell's
 * result is stored when its cell ends), so the history is the holder of kept graphs and releasing it leads; the same
 * single graph in a global of the program is read as the running pass's own */
static void output_history_keeps_a_graph(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 94 * MiB, 0, 0, 0, 224 * MiB, 22 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    fixture_steps(r, 0, 0, 0, 0);
    fixture_holder(r, "Out", "dict", "global in notebook.py", 224 * MiB);
    r->memory.fw.roles.holders[0].tensors = 1;
    r->memory.fw.roles.holders[0].graphs = 1;
    strcpy(r->memory.fw.roles.holders[0].purpose, "output_history");
    fixture_phase(r, "forward", "/w/notebook.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 84 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.graph_holder, 0);
    assert_true(r->analysis.facts.roles.graphs_history);
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 11 * GiB);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(how_has(&r->remedies[0], "Out.clear()"));
    /* the same holder with no purpose: one graph alive may be the running pass's own output */
    r->memory.fw.roles.holders[0].purpose[0] = '\0';
    strcpy(r->memory.fw.roles.holders[0].name, "outs");
    run(r);
    assert_int_equal(r->analysis.facts.roles.graph_holder, -1);
    assert_false(r->analysis.facts.roles.graphs_history);
    free(r);
}

/* kept_graphs_holder_first's holder in a job not known to train (no optimizer, no gradients: a server's generation loop): the graphs
 * are the waste, not what holds them; autograd off (inference_mode) leads, the holder second */
static void kept_graphs_without_training(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 14 * GiB, 0, 0, 0, 4096, 6 * GiB);
    fixture_holder(r, "self.history", "defaultdict", "attribute on Server", 4096);
    r->memory.fw.roles.holders[0].tensors = 7;
    fixture_phase(r, "evaluation", "/w/serve.py", "stream");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 122 * MiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.kept_graphs > 0);
    assert_string_equal(r->remedies[0].id, "inference_mode");
    assert_true(ranked_by(&r->remedies[0], "graphs_without_training_lead"));
    assert_string_equal(r->remedies[1].id, "release_references");
    r->memory.fw.grad_enabled = -1; /* autograd already off: not this row */
    run(r);
    assert_false(ranked_by(&r->remedies[0], "graphs_without_training_lead"));
    free(r);
}

/* a training job's evaluation with autograd on appends each loss to a history kept across calls (an attribute):
 * every loss roots its batch's graph (facts: roles.kept_graphs, act x n / (n + 1)), so the holder is named first and
 * autograd off for the evaluation comes second; a local of the running code, a holder of a purpose (a dataset), one
 * tensor, or autograd off: no such graphs */
static void kept_graphs_holder_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 108 * MiB, 0, 219 * MiB, 0, 4096, 23 * GiB);
    fixture_optimizer(r, "AdamW", 219 * MiB);
    fixture_holder(r, "self.history", "defaultdict", "attribute on Trainer", 4096);
    r->memory.fw.roles.holders[0].tensors = 7;
    fixture_phase(r, "evaluation", "/w/train_seg.py", "validate");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 122 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.graph_holder, 0);
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 23 * GiB / 8 * 7);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_string_equal(r->remedies[1].id, "inference_mode");
    assert_non_null(strstr(r->remedies[0].why, "self.history"));
    assert_true(how_has(&r->remedies[0], "loss.item()"));
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in validate (train_seg.py:88)");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 0);
    assert_string_equal(r->remedies[0].id, "inference_mode");
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "attribute on Trainer");
    fixture_holder_says(r, "dataset", "");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 0);
    fixture_holder_says(r, "", "");
    r->memory.fw.roles.holders[0].tensors = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 0);
    r->memory.fw.roles.holders[0].tensors = 7;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 0);
    assert_true(rank_of(r, "release_references") != 1);
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/train_seg.py", "forward"); /* a training pass: its backward frees the graphs */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.kept_graphs, 0);
    free(r);
}

/* DistributedDataParallel without gradient_as_bucket_view (roles.ddp): its buckets copy the gradients; the
 * remedy saves them and leads when they cover the shortfall, and is not there without a wrapper */
static void ddp_buckets_as_views(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 3 * GiB, 0, 6 * GiB, 0, 3 * GiB, 10 * GiB + 512 * MiB);
    fixture_optimizer(r, "AdamW", 6 * GiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 240 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "gradient_as_bucket_view"), 0);
    r->memory.fw.roles.ddp_wrappers = 1;
    r->memory.fw.roles.ddp_bucket_bytes = 3 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "gradient_as_bucket_view");
    assert_non_null(strstr(r->remedies[0].why, "3.00 GiB"));
    assert_true(how_has(&r->remedies[0], "gradient_as_bucket_view=True"));
    free(r);
}

/* loading weights (from_pretrained): in their checkpoint's dtype; no activation remedy, no map_location */
static void phase_loading_weights(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    fixture_phase(r, "loading", "/venv/transformers/modeling_utils.py", "from_pretrained");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "load_in_bf16");
    assert_int_equal(rank_of(r, "map_location_cpu"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

/* a model's .to("cuda") fails part way, no phase frame naming it (the model's own .to()): the device holds its
 * weights and nothing computed from them (roles.weights_only), so no activation remedy is listed; the input batch
 * held by a local beside a running model is no such load: a smaller batch stays */
static void weights_only_no_activation_remedies(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    fixture_model(r, "Qwen2ForCausalLM", 20 * GiB, 1, false);
    fixture_model_held(r, 1, 1, "model");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "shorter_sequences"), 0);
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_int_equal(rank_of(r, "inference_mode"), 0); /* weights arriving build no graph */
    free(r);

    r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 1 * GiB, 0);
    fixture_holder(r, "batch", "Tensor", "local in main (serve.py:40)", 1 * GiB);
    fixture_model(r, "Qwen2ForCausalLM", 20 * GiB, 1, false);
    fixture_model_held(r, 1, 1, "model");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0);
    free(r);
}

/* the first optimizer.step() makes AdamW's state: an 8-bit optimizer; autograd off there is not inference */
static void phase_optimizer_step(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 8 * GiB, 4 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 4 * GiB);
    fixture_phase(r, "optimizer_step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py", "_init_group");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "eight_bit_optimizer");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
    /* already 8-bit: nothing to gain */
    r = base();
    fixture_roles(r, 8 * GiB, 8 * GiB, 4 * GiB, 0, 0, 0);
    fixture_optimizer(r, "PagedAdamW8bit", 4 * GiB);
    fixture_phase(r, "optimizer_step", "/venv/bitsandbytes/optim/optimizer.py", "step");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "eight_bit_optimizer"), 0);
    free(r);
}

/* an 8-bit optimizer keeps 1 byte per state value: three quarters of a float32 model's Adam state, half of a bf16
 * model's (PyTorch keeps the state in the parameters' dtype).  A first step short of 8.7 GiB, 16 GiB of state to be
 * made: a float32 model's 8-bit state frees 12 GiB and leads; a bf16 model's frees 8 GiB, not enough alone */
static void eight_bit_saves_by_the_state_width(void **state)
{
    for (int half = 0; half < 2; half++) {
        og_record_t *r = base();
        fixture_roles(r, 8 * GiB, 8 * GiB, 4 * GiB, 0, 0, 0);
        fixture_optimizer(r, "AdamW", 4 * GiB);
        fixture_dtype(r, half ? "bfloat16" : "float32", 8 * GiB);
        fixture_phase(r, "optimizer_step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py", "_init_group");
        r->memory.fw.grad_enabled = -1;
        og_set(&r->event.requested_bytes, 10 * GiB);
        run_primary(r, "does_not_fit");
        if (half) {
            assert_true(rank_of(r, "eight_bit_optimizer") != 1);
            assert_non_null(strstr(rem(r, "eight_bit_optimizer")->why, "not 2 (1 of every 2 bytes"));
        } else {
            assert_string_equal(r->remedies[0].id, "eight_bit_optimizer");
            assert_non_null(strstr(r->remedies[0].why, "not 4 (3 of every 4 bytes"));
        }
        free(r);
    }
}

/* a first step in rank 0 of 8 (DDP) on a card the model's state fills: the ranks are there to shard the state over, at full precision; ZeRO/FSDP
 * leads, the 8-bit optimizer next */
static void optimizer_step_of_ranks(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 8 * GiB, 6 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 6 * GiB);
    og_set(&r->memory.process_tracked_bytes, 22 * GiB + 512 * MiB);
    fixture_phase(r, "optimizer_step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py", "_init_group");
    r->memory.fw.grad_enabled = -1;
    r->rank = r->local_rank = 0;
    r->world_size = 8;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "zero_fsdp");
    assert_true(ranked_by(&r->remedies[0], "optimizer_step_ranks_lead"));
    assert_int_equal(rank_of(r, "eight_bit_optimizer"), 2);
    free(r);
}

/* SOAP's first step: of its 12 GiB of state, 9 GiB are preconditioner matrices (not shaped like their parameters):
 * bounding them leads, ahead of an 8-bit optimizer, and its text names the class, the matrices and the first step;
 * matrices that cannot cover the shortfall, or none measured, leave the 8-bit optimizer first */
static void preconditioners_hold_the_state(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 4 * GiB, 12 * GiB, 0, 0, 0);
    fixture_optimizer(r, "SOAP", 12 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].shaped_bytes, 9 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
    fixture_steps(r, 0, 0, 0, 0);
    fixture_phase(r, "optimizer_step", "/w/soap.py", "update_preconditioner");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "preconditioner_dim_cap");
    assert_true(r->analysis.facts.roles.opt_shaped == 9 * GiB);
    assert_non_null(strstr(r->remedies[0].why, "SOAP"));
    assert_non_null(strstr(r->remedies[0].why, "first step"));
    assert_true(rank_of(r, "eight_bit_optimizer") > 1);
    og_set(&r->memory.fw.roles.optimizers[0].shaped_bytes, 512 * MiB); /* short of the 1 GiB missing */
    run(r);
    assert_string_equal(r->remedies[0].id, "eight_bit_optimizer");
    og_unset(&r->memory.fw.roles.optimizers[0].shaped_bytes);
    run(r);
    assert_int_equal(rank_of(r, "preconditioner_dim_cap"), 0);
    free(r);
}

/* a 1.1B policy's first EMA update written as a dict comprehension, after its first AdamW step: 1.41 GiB of the new
 * 4.29 GiB copy made, 608 MiB cached in splinters: the rest of the copy outgrows the cache (does_not_fit, not
 * fragmentation, and not growth: the driver's staircase of equal blocks is the first iteration's build-up), and
 * updating in place leads, its text naming the copy; without an old EMA copy (the first one being made) or with the
 * copy nearly made (the rest fits the cache) the row does not hold */
static void ema_update_out_of_place(void **state)
{
    og_record_t *r = base();
    og_roles_t *ro = fixture_roles(r, 8788 * MiB, 4394 * MiB, 8746 * MiB, 0, 0, 1444 * MiB);
    r->memory.fw.reserved_bytes += 608 * MiB;
    r->memory.fw.largest_free_block_bytes = 27 * MiB;
    fixture_optimizer(r, "AdamW", 8746 * MiB);
    og_set(&ro->optimizers[0].param_bytes, 4394 * MiB);
    fixture_model(r, "DiffusionTransformerPolicy", 4394 * MiB, 1, false);
    fixture_model(r, "DiffusionTransformerPolicy", 4394 * MiB, 1, true);
    fixture_model_held(r, 1, 0, "ema_model");
    fixture_model_says(r, "ema");
    fixture_steps(r, 1, 0, 0, 0);
    fixture_phase(r, "ema_update", "/w/train.py", "update_ema");
    og_set(&r->event.requested_bytes, 36 * MiB);
    og_set(&r->device.free_bytes, 32 * MiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.copy_outgrows_cache && r->analysis.facts.update_copy == 4394 * MiB);
    assert_false(has_cause(r, "growth"));
    assert_string_equal(r->remedies[0].id, "in_place_update");
    assert_non_null(strstr(r->remedies[0].why, "EMA update builds a new copy"));
    assert_int_equal(evb_of(r, "does_not_fit", "copy_source_bytes"), 4394 * MiB);
    r->memory.fw.roles.nmodels = 1; /* no old copy: the first one being made (a lazy shadow), nothing to update */
    run(r);
    assert_true(r->analysis.facts.copy_outgrows_cache);
    assert_null(strstr(rem(r, "in_place_update")->why, "EMA update builds a new copy"));
    r->memory.fw.roles.nmodels = 2;
    og_set(&ro->bytes[OG_ROLE_activations], 4100 * MiB); /* nearly made: the rest fits the cache */
    run(r);
    assert_false(r->analysis.facts.copy_outgrows_cache);
    assert_null(strstr(rem(r, "in_place_update")->why, "EMA update builds a new copy"));
    free(r);
}

/* loralib adapters on ESM-2 3B, but mark_only_lora_as_trainable skipped: the adapters' layers' base weights require
 * grad (8.8 GiB beside 60 MiB of adapters), 17.8 GiB of AdamW state: LoRA leads as "freeze the base" (its text names
 * the adapters and those weights); the base frozen (a head trained beside, PEFT's modules_to_save): the job trains
 * adapters already and LoRA is not offered; no adapter measured: LoRA keeps its catalog title */
static void lora_base_weights_train(void **state)
{
    og_record_t *r = base();
    og_roles_t *ro = fixture_roles(r, 10 * GiB, 0, 17 * GiB + 820 * MiB, 0, 0, 10 * GiB + 540 * MiB);
    fixture_optimizer(r, "AdamW", 17 * GiB + 820 * MiB);
    og_set(&ro->optimizers[0].param_bytes, 8 * GiB + 920 * MiB);
    og_set(&ro->lora_bytes, 60 * MiB);
    og_set(&ro->lora_base, 8 * GiB + 860 * MiB);
    fixture_steps(r, 1, 0, 0, 0);
    fixture_phase(r, "forward", "/w/finetune.py", "forward");
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.lora_params == 60 * MiB &&
                r->analysis.facts.roles.lora_base_trained == 8 * GiB + 860 * MiB);
    assert_string_equal(r->remedies[0].id, "lora");
    bool led = false; /* by this row */
    for (int k = 0; k < r->remedies[0].ranking.nrows; k++)
        led = led || strcmp(r->remedies[0].ranking.rows[k], "lora_base_trains_lead") == 0;
    assert_true(led);
    assert_non_null(strstr(r->remedies[0].title, "freeze the base"));
    assert_non_null(strstr(r->remedies[0].why, "LoRA adapters"));
    assert_true(how_has(&r->remedies[0], "mark_only_lora_as_trainable"));
    og_set(&ro->lora_base, 0); /* the base frozen: the job trains adapters already, LoRA is not offered again */
    run(r);
    assert_int_equal(rank_of(r, "lora"), 0);
    og_set(&ro->lora_base, 8 * GiB + 860 * MiB);
    og_unset(&ro->lora_bytes);
    run(r);
    assert_null(strstr(rem(r, "lora")->title, "freeze the base"));
    free(r);
}

/* Fragmentation in a full fine-tune whose training state is measured (AdamW's 6 GiB beside 3 GiB of weights and their
 * gradients), batches of 16 sizes: the free bytes are there in splinters, so what shrinks the state (offload, ZeRO, an
 * 8-bit optimizer, LoRA) comes after the allocator's remedies and fewer shapes, and fewer shapes before a restart.
 * The same state in a job that does not fit keeps them among the first */
static void fragmentation_not_the_state(void **state)
{
    static const char *const state_levers[] = { "cpu_offload", "zero_fsdp", "eight_bit_optimizer", "lora" };
    og_record_t *r = base();
    fixture_roles(r, 3 * GiB, 3 * GiB, 6 * GiB, 0, 0, 4 * GiB);
    fixture_optimizer(r, "AdamW", 6 * GiB);
    fixture_adapter(r, 22 * GiB, 16 * GiB, 300 * MiB); /* 6 GiB cached, in splinters of 300 MiB at most */
    og_set(&r->event.requested_bytes, 2560 * MiB);
    og_set(&r->device.free_bytes, 200 * MiB);
    fixture_steps(r, 40, 0, 0, 0);
    fixture_phase(r, "backward", "/w/train.py", "backward");
    static struct og_hist_ev ev[16];
    for (int i = 0; i < 16; i++)
        ev[i] = (struct og_hist_ev){
            .t_rel = i * 0.1, .op = OG_OP_ALLOC, .bytes = 100 * MiB + 20 * (uint64_t)i * MiB, .live = 20 * GiB
        };
    r->history.events = ev;
    r->history.nevents = 16;
    run_primary(r, "fragmentation");
    bool demoted = false;
    for (size_t i = 0; i < sizeof state_levers / sizeof *state_levers; i++) {
        int k = rank_of(r, state_levers[i]);
        assert_true(k == 0 || k > 3);
        demoted = demoted || (k > 0 && ranked_by(rem(r, state_levers[i]), "fragmentation_not_the_state"));
    }
    assert_true(demoted);
    assert_true(rank_of(r, "bucket_by_length") > 0 && rank_of(r, "bucket_by_length") < rank_of(r, "restart_process"));
    assert_true(ranked_by(rem(r, "bucket_by_length"), "fragmentation_fewer_shapes"));
    /* no splinters to speak of: the request does not fit, and moving the state off the GPU is a lever again */
    fixture_adapter(r, 16 * GiB + 64 * MiB, 16 * GiB, 64 * MiB);
    og_set(&r->device.free_bytes, 400 * MiB);
    run_primary(r, "does_not_fit");
    bool offered = false;
    for (size_t i = 0; i < sizeof state_levers / sizeof *state_levers; i++)
        offered = offered || (rank_of(r, state_levers[i]) > 0 && rank_of(r, state_levers[i]) <= 3);
    assert_true(offered);
    free(r);
}

/* a prefill (autograd off) failing in layer 16 of 32 while a holder keeps one record per layer run, 15 of them: the
 * 17 to come would add as much again, the splinters of the cache carry it no further, and the holder is the lever;
 * a holder whose records are not the layers run (8 of them) is not one */
static void holder_of_one_record_per_layer(void **state)
{
    (void)state;
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 24 * GiB);
    og_roles_t *ro = fixture_roles(r, 5 * GiB + 320 * MiB, 0, 0, 0, 5 * GiB + 640 * MiB, 7 * GiB + 512 * MiB);
    fixture_holder(r, "self._pending", "list", "on LayerwiseOffloadedCache", 5 * GiB + 640 * MiB);
    r->memory.fw.roles.holders[0].records = 15;
    r->memory.fw.roles.holders[0].tensors = 30;
    fixture_phase(r, "evaluation", "/w/prefill.py", "forward");
    r->memory.fw.grad_enabled = -1;
    strcpy(ro->layer_run, "layers");
    ro->layer_index = 15, ro->layer_count = 32, ro->layer_alike = 1;
    uint64_t sum = 5 * GiB + 320 * MiB + 5 * GiB + 640 * MiB + 7 * GiB + 512 * MiB;
    fixture_adapter(r, sum + 2630 * MiB, sum, 1880 * MiB); /* 2.6 GiB cached, in splinters */
    og_set(&r->event.requested_bytes, 2620 * MiB);
    og_set(&r->device.free_bytes, 2440 * MiB);
    run(r);
    assert_int_equal(r->analysis.facts.roles.layer_holder, 0);
    assert_int_equal(r->analysis.facts.roles.layer_holder_to_come, (5 * GiB + 640 * MiB) * 17 / 15);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_int_equal(evb_of(r, "does_not_fit", "layer_holder_to_come_bytes"), (5 * GiB + 640 * MiB) * 17 / 15);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "one record per layer of the running pass, 15 so far"));
    /* the same list a local of the running forward (a decoder's next_cache filled layer by layer): the pass's own
     * size, its projection said, nothing to drop */
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in forward (led.py:175)");
    run(r);
    assert_int_equal(r->analysis.facts.roles.layer_holder, 0);
    assert_false(ranked_by(rem(r, "release_references"), "layer_holder_grows"));
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "on LayerwiseOffloadedCache");
    r->memory.fw.roles.holders[0].records = 8;
    run(r);
    assert_int_equal(r->analysis.facts.roles.layer_holder, -1);
    assert_false(ranked_by(rem(r, "release_references"), "layer_holder_grows"));
    free(r);
}

/* A training's first forward pass that failed in layer 12 of 24 with 10 GiB of activations made: the twelve layers
 * still to come make about as much again.  An 8-bit optimizer's 3 GiB covers the 512 MiB missing now, not the pass: it cannot
 * lead (tier 3); a smaller batch and checkpointing shrink every layer's activations and carry it.  Without the layer
 * measured, the shortfall alone is what a remedy must cover */
static void layers_still_to_come(void **state)
{
    og_record_t *r = base();
    og_roles_t *ro = fixture_roles(r, 2 * GiB, 2 * GiB, 4 * GiB, 0, 0, 10 * GiB);
    fixture_optimizer(r, "AdamW", 4 * GiB);
    fixture_steps(r, 0, 0, 0, 0); /* the first pass: no step made yet */
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    ro->checkpointing = -1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    int k = rank_of(r, "eight_bit_optimizer");
    assert_true(k > 0 && rem(r, "eight_bit_optimizer")->ranking.tier < 3);
    strcpy(ro->layer_run, "layers");
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    assert_int_equal(evb_of(r, "does_not_fit", "layers_to_come_bytes"), -1);
    ro->layer_index = 11, ro->layer_count = 24;
    ro->layer_alike = -1; /* layers of unlike sizes (a U-Net's encoder): the ones to come are not projected */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    assert_true(rem(r, "eight_bit_optimizer")->ranking.tier < 3);
    ro->layer_alike = 1;
    run_primary(r, "does_not_fit");
    /* the twelve layers to come, the pass's need beside this allocation's: said in the diagnosis */
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 10 * GiB);
    assert_int_equal(r->analysis.facts.roles.layers_left, 12);
    assert_int_equal(evb_of(r, "does_not_fit", "layers_to_come_bytes"), 10 * GiB);
    assert_int_equal(evb_of(r, "does_not_fit", "pass_missing_bytes"),
                     evb_of(r, "does_not_fit", "missing_bytes") + 10 * GiB);
    assert_int_equal(rem(r, "eight_bit_optimizer")->ranking.tier, 3);
    assert_false(rem(r, "eight_bit_optimizer")->shown);
    assert_true(rem(r, "eight_bit_optimizer")->ranking.estimate < 10.0 * GiB);
    static const char *const pass_levers[] = { "smaller_batch", "gradient_checkpointing" };
    for (size_t i = 0; i < 2; i++) {
        assert_true(rank_of(r, pass_levers[i]) > 0 && rank_of(r, pass_levers[i]) <= 3);
        assert_true(rem(r, pass_levers[i])->ranking.tier < 3);
        assert_true(rem(r, pass_levers[i])->ranking.estimate >= 10.0 * GiB + 512.0 * MiB);
    }
    /* float32 weights, autocast off: half precision halves the whole pass, the layers to come included; in layer 12
     * of 24 half of it is short of what the twelve to come need, in layer 17 it covers the seven left */
    fixture_dtype(r, "float32", 2 * GiB);
    r->memory.fw.autocast = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rem(r, "mixed_precision")->ranking.tier, 3);
    ro->layer_index = 16;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "mixed_precision") > 0 && rem(r, "mixed_precision")->ranking.tier < 3);
    assert_true(rem(r, "mixed_precision")->ranking.estimate >= 0.5 * (10.0 + 10.0 * 7 / 17) * GiB - 1);
    /* in layer 18 (six to come, 3.3 GiB): the 8-bit optimizer's 3 GiB is past half of what is missing with them and
     * short of all of it: it may carry the pass (tier 2), the projection being an estimate */
    ro->layer_index = 17;
    run_primary(r, "does_not_fit");
    assert_int_equal(rem(r, "eight_bit_optimizer")->ranking.tier, 2);
    /* a later step (a pass of the job ended before: it bounds this one), or losses summed over passes (the activations
     * are several passes'): no projection, the 8-bit optimizer covers the shortfall again */
    ro->layer_index = 11;
    fixture_steps(r, 40, 0, 0, 0);
    run(r);
    assert_true(rem(r, "eight_bit_optimizer")->id == NULL || rem(r, "eight_bit_optimizer")->ranking.tier < 3);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    assert_int_equal(evb_of(r, "does_not_fit", "layers_to_come_bytes"), -1);
    fixture_steps(r, 0, 0, 0, 0);
    ro->has_accum = true;
    run(r);
    assert_true(rem(r, "eight_bit_optimizer")->id == NULL || rem(r, "eight_bit_optimizer")->ranking.tier < 3);
    ro->has_accum = false;
    /* checkpointing on (a layer keeps only its input), or the last layer (none to come): no projection */
    ro->checkpointing = 1;
    run(r);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    ro->checkpointing = -1;
    ro->layer_index = 23;
    run(r);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    ro->layer_index = 11;
    run(r);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 10 * GiB);
    /* autograd off (nothing kept for backward): each layer frees what the one before made, no pass to come */
    r->memory.fw.grad_enabled = -1;
    run(r);
    assert_true(rem(r, "eight_bit_optimizer")->id == NULL || rem(r, "eight_bit_optimizer")->ranking.tier < 3);
    assert_int_equal(r->analysis.facts.roles.layers_to_come, 0);
    free(r);
}

/* An image server that loads a LoRA per job and never deletes it: 12 GiB of adapters beside 6.5 GiB of other
 * weights, no gradient, no optimizer state.  Deleting each adapter after its job leads, a bounded set of them next,
 * their texts name the adapters; one adapter (a few percent of its base), or a job that trains them, is no pile */
static void lora_adapters_piled(void **state)
{
    og_record_t *r = base();
    og_roles_t *ro = fixture_roles(r, 18 * GiB + 512 * MiB, 0, 0, 0, 0, 1 * GiB);
    og_set(&ro->lora_bytes, 12 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    run(r);
    assert_true(r->analysis.facts.roles.lora_piled);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_string_equal(r->remedies[1].id, "bounded_cache");
    bool led = false; /* by this row */
    for (int k = 0; k < r->remedies[0].ranking.nrows; k++)
        led = led || strcmp(r->remedies[0].ranking.rows[k], "lora_adapters_piled_lead") == 0;
    assert_true(led);
    assert_non_null(strstr(r->remedies[0].why, "LoRA adapters"));
    assert_true(how_has(&r->remedies[0], "delete_adapters"));
    assert_true(how_has(&r->remedies[1], "delete_adapters"));
    og_set(&ro->lora_bytes, 3 * GiB); /* under half the other weights (15.5 GiB): adapters of a model, not a pile */
    run(r);
    assert_false(r->analysis.facts.roles.lora_piled);
    og_set(&ro->lora_bytes, 12 * GiB);
    ro->bytes[OG_ROLE_optimizer_state] = fx_opt(2 * GiB); /* the adapters train */
    run(r);
    assert_false(r->analysis.facts.roles.lora_piled);
    free(r);
}

/* DP-SGD's backward: 7.5 GiB of gradients kept one per example (64 of them) beside 6 GiB of activations: a smaller
 * physical batch leads (its text names the examples and Opacus' BatchMemoryManager), ghost clipping second, the
 * activations' remedies after them; per-example gradients short of the shortfall lead nothing, and without them
 * measured ghost clipping is not listed */
static void per_sample_gradients(void **state)
{
    og_record_t *r = base();
    og_roles_t *ro = fixture_roles(r, 420 * MiB, 120 * MiB, 0, 0, 0, 6 * GiB + 7680 * MiB);
    og_set(&ro->bytes[OG_ROLE_activations], 6 * GiB);
    og_set(&ro->bytes[OG_ROLE_per_sample_gradients], 7680 * MiB);
    ro->per_sample_count = 64;
    fixture_optimizer(r, "AdamW", 0);
    og_set(&ro->optimizers[0].param_bytes, 330 * MiB);
    fixture_phase(r, "backward", "/w/dp_finetune.py", "main");
    og_set(&r->event.requested_bytes, 576 * MiB);
    og_set(&r->device.free_bytes, 492 * MiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.per_sample == 7680 * MiB && r->analysis.facts.roles.per_sample_n == 64);
    assert_string_equal(r->remedies[0].id, "smaller_batch");
    assert_non_null(strstr(r->remedies[0].why, "64 examples"));
    assert_true(how_has(&r->remedies[0], "BatchMemoryManager"));
    assert_int_equal(rank_of(r, "ghost_clipping"), 2);
    assert_true(rank_of(r, "mixed_precision") > 2 && rank_of(r, "gradient_checkpointing") > 2);
    og_set(&ro->bytes[OG_ROLE_per_sample_gradients], 16 * MiB); /* short of the 84 MiB missing */
    run(r);
    assert_int_not_equal(rank_of(r, "ghost_clipping"), 1);
    assert_null(strstr(r->remedies[0].why, "per example"));
    og_unset(&ro->bytes[OG_ROLE_per_sample_gradients]);
    ro->per_sample_count = 0;
    run(r);
    assert_int_equal(rank_of(r, "ghost_clipping"), 0);
    free(r);
}

/* an MD force call on a float64 model: 40 MiB of weights, 21 GiB of float64 activations (forces need autograd): float32
 * leads (its text names the measured float64 weights), mixed precision is not offered first (autocast leaves float64
 * operations as they are); float32 weights, or the dtypes not measured: not listed */
static void float64_weights(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 40 * MiB, 0, 0, 0, 0, 21 * GiB);
    fixture_dtype(r, "float64", 40 * MiB);
    fixture_phase(r, "forward", "/w/md.py", "forward");
    og_set(&r->event.requested_bytes, 3 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.params_fp64 == 40 * MiB);
    assert_string_equal(r->remedies[0].id, "float32_instead_of_float64");
    assert_non_null(strstr(r->remedies[0].why, "float64"));
    assert_true(rank_of(r, "mixed_precision") == 0 || rank_of(r, "mixed_precision") > 3);
    /* a handful of float64 scalars (a Gaussian process's hyperparameters, 4 KiB): the method's precision; float32
     * stays listed, not first */
    r->memory.fw.roles.ndtypes = 0;
    fixture_roles(r, 4096, 0, 0, 0, 0, 21 * GiB);
    fixture_dtype(r, "float64", 4096);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "float32_instead_of_float64") > 1);
    assert_false(ranked_by(rem(r, "float32_instead_of_float64"), "fp64_weights_lead"));
    fixture_roles(r, 40 * MiB, 0, 0, 0, 0, 21 * GiB);
    r->memory.fw.roles.ndtypes = 0;
    fixture_dtype(r, "float32", 40 * MiB);
    run(r);
    assert_int_equal(rank_of(r, "float32_instead_of_float64"), 0);
    r->memory.fw.roles.ndtypes = 0;
    r->memory.fw.roles.has_dtypes = false;
    run(r);
    assert_int_equal(rank_of(r, "float32_instead_of_float64"), 0);
    free(r);
}

/* float64 data (a numpy array copied as it was) fill the card before the model exists, and the failing statement
 * uploads the next split: float32 is listed, with the holder named; the remedies of a pass (none runs: no activations
 * measured) cannot cover the data and leave the top three */
static void float64_data(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 0, 0, 0, 0, 14 * GiB + 640 * MiB, 0);
    fixture_holder(r, "X_tr", "Tensor", "global in fold.py", 14 * GiB + 640 * MiB);
    fixture_holder_says(r, "dataset", "");
    og_set(&r->memory.fw.roles.holders[0].float64, 14 * GiB + 640 * MiB);
    fixture_statement(r, "X_va", "dataset");
    og_set(&r->event.requested_bytes, 3 * GiB + 680 * MiB);
    og_set(&r->device.free_bytes, 558 * MiB);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.held_fp64 == 14 * GiB + 640 * MiB);
    assert_int_equal(r->analysis.facts.roles.fp64_holder, 0);
    assert_true(rank_of(r, "float32_instead_of_float64") >= 1 && rank_of(r, "float32_instead_of_float64") <= 2);
    assert_true(ranked_by(rem(r, "float32_instead_of_float64"), "fp64_data_lead"));
    assert_non_null(strstr(rem(r, "float32_instead_of_float64")->why, "X_tr (Tensor, global in fold.py) holds"));
    assert_true(how_has(rem(r, "float32_instead_of_float64"), "astype(np.float32)"));
    for (int i = 0; i < 3; i++) {
        assert_string_not_equal(r->remedies[i].id, "smaller_batch");
        assert_string_not_equal(r->remedies[i].id, "inference_mode");
    }
    /* the dtype not read (an older adapter): no float64 is said; the upload of a dataset still takes nothing from a
     * smaller batch */
    og_unset(&r->memory.fw.roles.holders[0].float64);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "float32_instead_of_float64"), 0);
    assert_true(rank_of(r, "smaller_batch") == 0 || rem(r, "smaller_batch")->ranking.tier == 3);
    free(r);
    /* two holders of float64, the larger second, a third of the allocated bytes with float32 activations beside
     * them: the larger is named */
    r = base();
    fixture_roles(r, 0, 0, 0, 0, 6 * GiB, 12 * GiB);
    fixture_holder(r, "y_tr", "Tensor", "global in fold.py", 1 * GiB);
    og_set(&r->memory.fw.roles.holders[0].float64, 1 * GiB);
    fixture_holder(r, "feats", "Tensor", "global in fold.py", 5 * GiB);
    og_set(&r->memory.fw.roles.holders[1].float64, 5 * GiB);
    og_set(&r->event.requested_bytes, 3 * GiB);
    og_set(&r->device.free_bytes, 558 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.fp64_holder, 1);
    assert_true(ranked_by(rem(r, "float32_instead_of_float64"), "fp64_data_lead"));
    assert_non_null(strstr(rem(r, "float32_instead_of_float64")->why, "feats (Tensor, global in fold.py) holds"));
    free(r);
}

/* an attribution's backward through a 6.9B model in eval mode whose weights still require grad, no optimizer in
 * the process: freezing the weights leads (the gradients of the activations are what the program asks for), and
 * no_grad for a teacher is not offered; with an optimizer training it, or the model in training mode, nothing of
 * it is said */
static void weight_gradients_nothing_reads(void **state)
{
    /* the driver saw the low point rise through the first backward (no optimizer step ever made): the model arriving,
     * its gradients and that pass's activations, not a leak */
    {
        og_record_t *r = base();
        leaking_steps(r);
        fixture_roles(r, 4 * GiB, 4 * GiB, 0, 0, 0, 12 * GiB);
        fixture_phase(r, "backward", "/w/patching.py", "main");
        r->memory.fw.grad_enabled = 1;
        r->memory.fw.roles.steps_known = true;
        og_set(&r->device.free_bytes, 256 * MiB);
        run(r);
        assert_true(r->analysis.facts.growth.state_built);
        assert_false(has_cause(r, "growth"));
        r->memory.fw.roles.steps_made = 3; /* steps made: iterations ended, the activations may be kept ones */
        run(r);
        assert_true(has_cause(r, "growth"));
        free(r);
    }
    og_record_t *r = base();
    fixture_roles(r, 12 * GiB + 790 * MiB, 7 * GiB, 0, 0, 700 * MiB, 3 * GiB);
    fixture_model(r, "GPTNeoXForCausalLM", 12 * GiB + 790 * MiB, 1, false);
    r->memory.fw.roles.models[0].training = 0;
    fixture_phase(r, "backward", "/w/patching.py", "main");
    r->memory.fw.roles.backward_in_code = true;
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 128 * MiB);
    og_set(&r->device.free_bytes, 32 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_eval, 12 * GiB + 790 * MiB);
    assert_string_equal(r->remedies[0].id, "no_weight_gradients");
    assert_true(how_has(&r->remedies[0], "requires_grad_(False)"));
    assert_int_equal(rank_of(r, "teacher_no_grad"), 0);
    r->memory.fw.roles.backward_in_code = false; /* an evaluation's forward, no backward asked for: not this */
    fixture_phase(r, "evaluation", "/w/patching.py", "forward");
    run(r);
    assert_int_equal(rank_of(r, "no_weight_gradients"), 0);
    fixture_phase(r, "backward", "/w/patching.py", "main");
    r->memory.fw.roles.backward_in_code = true;
    /* a frozen model beside it, running, trained by nothing (a ControlNet's UNet): frozen, not untrained */
    fixture_model(r, "UNet2DConditionModel", 3 * GiB, 1, true);
    r->memory.fw.roles.models[1].trained = 0;
    r->memory.fw.roles.models[1].running = 1;
    r->memory.fw.roles.models[1].training = 0;
    run(r);
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    assert_int_equal(r->analysis.facts.roles.untrained_eval, 12 * GiB + 790 * MiB);
    r->memory.fw.roles.nmodels = 1;
    r->memory.fw.roles.models[0].training = 1; /* in training mode: the gradients may be a hand-written update's */
    run(r);
    assert_int_equal(rank_of(r, "no_weight_gradients"), 0);
    r->memory.fw.roles.models[0].training = 0;
    r->memory.fw.roles.noptimizers = 1; /* an optimizer somewhere, holding none of it: not known untrained */
    run(r);
    assert_int_equal(rank_of(r, "no_weight_gradients"), 0);
    free(r);
}

/* textual inversion: an optimizer trains the text encoder's token embedding (145 MiB), and the UNet in eval mode that
 * no optimizer trains still requires grad, so the backward toward the embedding fills the UNet's .grad (gradients
 * 897 MiB, beyond the optimizer's parameters): freezing the models nothing trains leads; with gradients no more than
 * what the optimizer holds, the untrained model took none: not this */
static void weight_grads_beside_a_small_trained_part(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 897 * MiB, 0, 0, 0, 2280 * MiB);
    fixture_model(r, "UNet2DConditionModel", 3310 * MiB, 1, false);
    r->memory.fw.roles.models[0].trained = 0;
    r->memory.fw.roles.models[0].training = 0;
    fixture_model(r, "CLIPTextModel", 470 * MiB, 1, false);
    r->memory.fw.roles.models[1].trained = 1;
    r->memory.fw.roles.models[1].training = 0;
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 145 * MiB);
    fixture_phase(r, "backward", "/w/textual_inversion.py", "main");
    r->memory.fw.roles.backward_in_code = true;
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 58 * MiB);
    og_set(&r->device.free_bytes, 12 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_eval, 3310 * MiB);
    assert_string_equal(r->remedies[0].id, "no_weight_gradients");
    assert_true(how_has(&r->remedies[0], "each model no optimizer trains"));
    /* the model nothing trains named a teacher (a distillation): a side branch, run under no_grad instead */
    snprintf(r->memory.fw.roles.models[0].purpose, sizeof r->memory.fw.roles.models[0].purpose, "teacher");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "no_weight_gradients"), 0);
    r->memory.fw.roles.models[0].purpose[0] = 0;
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_gradients], 145 * MiB); /* only the embedding's gradient */
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "no_weight_gradients"), 0);
    free(r);
}

/* a saliency map: the model's input requires grad, the model in eval mode: inference_mode is not offered (the map is
 * the input's gradient), and no evaluation-with-autograd row brings it back */
static void input_gradient_keeps_autograd(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 27 * MiB, 0, 0, 0, 3 * MiB, 13 * GiB);
    fixture_phase(r, "evaluation", "/w/saliency.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 800 * MiB);
    og_set(&r->device.free_bytes, 480 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "inference_mode");
    r->memory.fw.roles.input_grad = true;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.input_grad);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    /* the model in eval mode, trained by nothing, its weights without gradients: an attribution, whose batch is the
     * method's samples of one input; in chunks first, ahead of half precision */
    fixture_model(r, "DenseNet", 27 * MiB, 1, false);
    r->memory.fw.roles.models[0].training = 0;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_batch");
    assert_true(how_has(&r->remedies[0], "internal_batch_size"));
    r->memory.fw.roles.models[0].training = 1; /* in training mode: not known to be an attribution */
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "smaller_batch"), "attribution_pass_lead"));
    r->memory.fw.roles.nmodels = 0;
    /* the running code calls backward through a model in eval mode that nothing trains (integrated gradients'
     * autograd.grad): an attribution, not offered either; the same in a job whose optimizer trains the model (its
     * validation called from the training loop): offered */
    fixture_model(r, "BertForSequenceClassification", 27 * MiB, 1, false);
    r->memory.fw.roles.models[0].training = 0;
    r->memory.fw.roles.input_grad = false;
    r->memory.fw.roles.backward_in_code = true;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    r->memory.fw.roles.models[0].trained = 1;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "inference_mode") > 0);
    free(r);
}

/* quantization's text reads the weights measured: 16 GiB of bfloat16 weights of an inference job, 4-bit frees about
 * 12 GiB, enough for the 1 GiB missing; 2 GiB of float32 weights beside 60 GiB of activations, short of 4 GiB
 * missing (an eighth kept: 1.75 GiB freed); without roles the text says what it would need */
static void quantization_reads_the_weights(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 16 * GiB, 0, 0, 0, 0, 6 * GiB);
    fixture_dtype(r, "bfloat16", 16 * GiB);
    fixture_phase(r, "generation", "/srv/app.py", "generate");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run(r);
    assert_non_null(strstr(rem(r, "quantization")->why, "weights are 16.00 GiB"));
    assert_non_null(strstr(rem(r, "quantization")->why, "4-bit frees at most about 12.00 GiB"));
    assert_non_null(strstr(rem(r, "quantization")->why, "enough for the 1.00 GiB missing"));
    r->memory.fw.roles.ndtypes = 0;
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 60 * GiB);
    fixture_dtype(r, "float32", 2 * GiB);
    og_set(&r->event.requested_bytes, 5 * GiB);
    run(r);
    assert_true(rank_of(r, "quantization") > 0);
    assert_non_null(strstr(rem(r, "quantization")->why, "2.00 GiB of them float32"));
    assert_non_null(strstr(rem(r, "quantization")->why, "short of"));
    r->memory.fw.roles.has = false;
    og_set(&r->event.requested_bytes, 2 * GiB);
    run(r);
    assert_null(strstr(rem(r, "quantization")->why, "measured"));
    free(r);
}

/* float32 weights (a bf16 checkpoint loaded without torch_dtype) that, with their gradients, are the bulk
 * of a full fine-tune: load them in half precision first; quantizing is not for a job that trains */
static void fp32_weights_load_in_half(void **state)
{
    enum { FIRST, ABSENT, NOT_FIRST };
    static const struct {
        const char *what;
        uint64_t params, grads, act; /* roles */
        uint64_t fp32, bf16;         /* the parameters by dtype; both 0: not measured */
        const char *phase;           /* NULL: none reported */
        const char *file;            /* where the adapter saw it (in a function named as the phase), or NULL */
        int grad_enabled, training;
        int load;         /* where load_in_bf16 ranks */
        int quantization; /* its rank: 0 not listed, 2 after the first, -1 not asserted */
    } rows[] = {
        { "a full fine-tune on float32 weights", 10 * GiB, 9 * GiB, 1 * GiB, 10 * GiB, 0, "backward", NULL, 1, 0, FIRST,
          0 },
        { "the weights already bfloat16: nothing to halve", 10 * GiB, 9 * GiB, 1 * GiB, 0, 10 * GiB, "backward", NULL,
          0, 0, ABSENT, -1 },
        { "half of them float32 (a mixed model): under the three quarters the rule asks", 10 * GiB, 9 * GiB, 1 * GiB,
          5 * GiB, 5 * GiB, "backward", NULL, 0, 0, ABSENT, -1 },
        { "the dtypes not measured (an older adapter): not brought outside a load", 10 * GiB, 9 * GiB, 1 * GiB, 0, 0,
          "backward", NULL, 0, 0, ABSENT, -1 },
        { "float32 weights a small part of what is held (activations are the bulk)", 2 * GiB, 2 * GiB, 16 * GiB,
          2 * GiB, 0, "backward", NULL, 0, 0, ABSENT, -1 },
        { "a job that trains, failing outside a load or a pass (code copying weights): float32 may be master weights",
          10 * GiB, 9 * GiB, 1 * GiB, 10 * GiB, 0, NULL, NULL, 0, 1, NOT_FIRST, -1 },
        { "inference on float32 weights: loading in half precision before quantizing them", 16 * GiB, 0, 4 * GiB,
          16 * GiB, 0, "forward", "/srv/model.py", -1, 0, FIRST, 2 },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = base();
        fixture_roles(r, rows[i].params, rows[i].grads, 0, 0, 0, rows[i].act);
        if (rows[i].fp32)
            fixture_dtype(r, "float32", rows[i].fp32);
        if (rows[i].bf16)
            fixture_dtype(r, "bfloat16", rows[i].bf16);
        if (rows[i].phase)
            fixture_phase(r, rows[i].phase, rows[i].file, rows[i].file ? rows[i].phase : NULL);
        r->memory.fw.grad_enabled = rows[i].grad_enabled;
        r->memory.fw.training = rows[i].training;
        run_primary(r, "does_not_fit");
        int load = rank_of(r, "load_in_bf16"), quant = rank_of(r, "quantization");
        bool ok = rows[i].load == FIRST ? load == 1 : rows[i].load == ABSENT ? load == 0 : load != 1;
        if (rows[i].quantization >= 0)
            ok = ok && (rows[i].quantization ? quant >= rows[i].quantization : quant == 0);
        if (!ok)
            fail_msg("%s: load_in_bf16 ranked %d, quantization %d", rows[i].what, load, quant);
        free(r);
    }
}

/* a draft model left in float32 beside its bf16 target (roles.models[].parameters_float32_bytes), generating: load
 * the float32 one in bf16 first, though float32 is under the three quarters of the parameters fp32_weights asks; not
 * where every model is float32 (nothing says half precision is the program's choice), nor in a job that trains */
static void fp32_model_beside_half(void **state)
{
    static const struct {
        const char *what;
        uint64_t draft_fp32; /* of the draft's 4 GiB, its float32 bytes; UINT64_MAX: not read (an older adapter) */
        uint64_t target_fp32;
        int training; /* the adapter's flag: 1 an optimizer step ran */
        bool first;   /* load_in_bf16 first, and the draft named in its text */
    } rows[] = {
        { "a float32 draft beside a bf16 target", 4 * GiB, 0, 0, true },
        { "both in bf16", 0, 0, 0, false },
        { "both float32: the program chose no half precision", 4 * GiB, 15 * GiB, 0, false },
        { "not read (an older adapter)", UINT64_MAX, UINT64_MAX, 0, false },
        { "a job that trains: float32 may be the trained copy", 4 * GiB, 0, 1, false },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = base();
        fixture_roles(r, 19 * GiB, 0, 0, 0, 0, 1 * GiB);
        fixture_dtype(r, "float32", rows[i].draft_fp32 == UINT64_MAX ? 4 * GiB : rows[i].draft_fp32);
        fixture_dtype(r, "bfloat16", 15 * GiB);
        fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, false);
        fixture_model(r, "LlamaForCausalLM", 4 * GiB, 1, false);
        if (rows[i].draft_fp32 != UINT64_MAX) {
            og_set(&r->memory.fw.roles.models[0].fp32, rows[i].target_fp32);
            og_set(&r->memory.fw.roles.models[1].fp32, rows[i].draft_fp32);
        }
        fixture_phase(r, "generation", "/srv/assist.py", "generate");
        r->memory.fw.grad_enabled = 0;
        r->memory.fw.training = rows[i].training;
        run_primary(r, "does_not_fit");
        assert_int_equal(r->analysis.facts.roles.fp32_beside_half,
                         rows[i].draft_fp32 == 4 * GiB && !rows[i].target_fp32 ? 4 * GiB : 0);
        int load = rank_of(r, "load_in_bf16");
        if (rows[i].first != (load == 1))
            fail_msg("%s: load_in_bf16 ranked %d", rows[i].what, load);
        if (rows[i].first)
            assert_non_null(
                strstr(rem(r, "load_in_bf16")->why, "LlamaForCausalLM (4.00 GiB of parameters) is float32"));
        free(r);
    }
}

/* an int8 export loading beside its bf16 original for a KL comparison, the card short: one model at a time, and
 * quantization not listed (the reference must keep its precision, the other is quantized already); a quantized
 * model of another class beside it leaves quantization to the ranking */
static void quantized_beside_reference(void **state)
{
    for (int same = 1; same >= 0; same--) {
        og_record_t *r = base();
        fixture_roles(r, 22 * GiB, 0, 0, 0, 0, 0);
        fixture_dtype(r, "bfloat16", 16 * GiB);
        fixture_dtype(r, "int8", 6 * GiB);
        fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, false);
        fixture_model_held(r, 1, 0, "base");
        og_set(&r->memory.fw.roles.models[0].quant, 0);
        fixture_model(r, same ? "LlamaForCausalLM" : "Qwen2ForCausalLM", 7 * GiB, 1, false);
        og_set(&r->memory.fw.roles.models[1].quant, 6 * GiB);
        fixture_phase(r, "loading", "/w/eval_w8a8.py", "from_pretrained");
        r->memory.fw.grad_enabled = 0;
        run_primary(r, "does_not_fit");
        int quant = rank_of(r, "quantization");
        if (same ? quant != 0 : quant == 0)
            fail_msg("same class %d: quantization ranked %d", same, quant);
        if (same && (rank_of(r, "one_model_at_a_time") != 1 ||
                     !strstr(rem(r, "one_model_at_a_time")->why, "6.00 GiB of its 7.00 GiB in 8 bits or fewer")))
            fail_msg("one_model_at_a_time ranked %d: %s", rank_of(r, "one_model_at_a_time"),
                     rem(r, "one_model_at_a_time")->why ? rem(r, "one_model_at_a_time")->why : "");
        free(r);
    }
}

/* a growth that a global dict of sessions holds, beside a colleague's process: the dict is bounded first, and stopping
 * the colleague's job (which only delays the next failure) is not among the first three; without the measured
 * holder the other process leads */
static void growth_kept_not_others(void **state)
{
    for (int held = 1; held >= 0; held--) {
        og_record_t *r = base();
        fixture_growth_beside_other(r, held);
        run_primary(r, held ? "growth" : "foreign_memory");
        int f = rank_of(r, "foreign_processes");
        if (held ? f >= 1 && f <= 3 : f != 1)
            fail_msg("held %d: foreign_processes ranked %d", held, f);
        if (held) { /* a server, a model, no optimizer and no gradients: a request's lines, not a training loop's */
            const og_remedy_t *rr = &r->remedies[rank_of(r, "release_references") - 1];
            assert_true(how_has(rr, "losses.append(")); /* no model measured: not known not to train */
            fixture_model(r, "WhisperForConditionalGeneration", 2 * GiB, 1, true);
            run(r);
            rr = &r->remedies[rank_of(r, "release_references") - 1];
            assert_true(how_has(rr, "state.pop(request_id, None)"));
            assert_false(how_has(rr, "losses.append("));
            fixture_optimizer(r, "AdamW", 1 * GiB);
            run(r);
            rr = &r->remedies[rank_of(r, "release_references") - 1];
            assert_true(how_has(rr, "losses.append("));
            assert_false(how_has(rr, "state.pop(request_id, None)"));
        }
        free(r);
    }
}

/* a leak the adapter measured (a running loop's dict in main holds the rise): releasing what it keeps is the fix, and
 * what acts on something else (a smaller pass, the cache and its layout, a restart) is not offered at all; a holder
 * with a fifth of the rise measures no leak, and those stay */
static void measured_leak_only_its_remedies(void **state)
{
    static const char *const elsewhere[] = { "smaller_batch",   "shorter_sequences",   "mixed_precision",
                                             "restart_process", "expandable_segments", "empty_cache",
                                             "quantization" };
    for (int measured = 1; measured >= 0; measured--) {
        og_record_t *r = base();
        leaking_steps(r);
        fixture_roles(r, 4 * GiB, 0, 0, 0, 15 * GiB, 1 * GiB);
        fixture_holder(r, "results", "dict", "local in main (screen.py:80)", measured ? 15 * GiB : 3 * GiB);
        r->memory.fw.grad_enabled = -1;
        og_set(&r->device.free_bytes, 256 * MiB);
        run_primary(r, "growth");
        assert_true(r->diagnosis.causes[0].confidence >= 0.7);
        assert_string_equal(r->remedies[0].id, "release_references");
        int offered = 0;
        for (size_t i = 0; i < sizeof elsewhere / sizeof *elsewhere; i++)
            offered += rank_of(r, elsewhere[i]) > 0;
        if (measured ? offered != 0 : offered == 0)
            fail_msg("measured %d: %d of the remedies acting elsewhere offered", measured, offered);
        /* the same rise held by a KV cache (named so): it grows with the batch and the length, whose remedies stay */
        snprintf(r->memory.fw.roles.holders[0].purpose, sizeof r->memory.fw.roles.holders[0].purpose, "kv_cache");
        run_primary(r, "growth");
        assert_true(rank_of(r, "smaller_batch") > 0);
        free(r);
    }
}

/* a full fine-tune whose state at its first step (weights 12, gradients 12, AdamW's moments 24 GiB) exceeds
 * the card even in half precision: train fewer parameters, offload or shard the state, not load in bf16; where
 * halving makes the state and this pass fit (weights 10 GiB: 20 GiB halved), load_in_bf16 first, then those */
static void state_exceeds_card_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 12 * GiB, 7 * GiB, 0, 0, 0, 4 * GiB);
    fixture_dtype(r, "float32", 12 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 12 * GiB);
    fixture_phase(r, "backward", NULL, NULL);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "lora");
    assert_int_equal(rank_of(r, "cpu_offload"), 2);
    assert_int_equal(rank_of(r, "zero_fsdp"), 3);
    assert_true(rank_of(r, "load_in_bf16") == 0 || rank_of(r, "load_in_bf16") > 3);
    free(r);
    r = base();
    fixture_roles(r, 10 * GiB, 9 * GiB, 0, 0, 0, 1 * GiB);
    fixture_dtype(r, "float32", 10 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 10 * GiB);
    fixture_phase(r, "backward", NULL, NULL);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "load_in_bf16");
    assert_int_equal(rank_of(r, "lora"), 2);
    free(r);
}

/* the first forward pass of a training job: no optimizer step ran and no gradient exists yet, but an
 * optimizer holds the failing device's parameters: the job trains (no inference_mode, no quantization);
 * parameters that require grad alone say nothing (a loaded model requires grad for inference too) */
static void trains_before_the_first_step(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 3 * GiB);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "quantization"), 0);
    free(r);
    /* an optimizer that holds none of this device's parameters: not known to train */
    r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "inference_mode") > 0);
    assert_true(rank_of(r, "quantization") > 0);
    free(r);
}

/* the losses of several micro-batches summed with their graphs alive (roles.accumulating), failing in the next
 * micro-batch's forward pass: a backward per micro-batch first; nothing of the kind without the measured sum */
static void summed_microbatches_backward_each(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_accumulating(r, "total", "loss");
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "backward_per_microbatch");
    assert_non_null(strstr(r->remedies[0].why, "into total (train.py:12 in main)"));
    assert_true(how_has(&r->remedies[0], ".backward()"));
    free(r);
    /* the losses kept in a list for one backward (roles.accumulating with no operand): the same lead, said so */
    r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_accumulating(r, "losses", "");
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "backward_per_microbatch");
    assert_non_null(strstr(r->remedies[0].why, "in the list losses (train.py:12 in main)"));
    free(r);
    /* no sum measured: not listed */
    r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "backward_per_microbatch"), 0);
    free(r);
    /* autograd off at the failure (no graph is built now) or a job known to be inference: not listed */
    r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_accumulating(r, "total", "loss");
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "backward_per_microbatch"), 0);
    free(r);
    r = base();
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 17 * GiB);
    fixture_accumulating(r, "total", "loss");
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "backward_per_microbatch"), 0);
    free(r);
}

/* in a forward pass the optimizer's state is not the lever: it comes after the activation remedies */
static void phase_forward_optimizer_later(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 0, 8 * GiB, 0, 0, 8 * GiB);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "eight_bit_optimizer") > rank_of(r, "gradient_checkpointing"));
    assert_true(rank_of(r, "gradient_checkpointing") > 0);
    assert_non_null(strstr(rem(r, "gradient_checkpointing")->why, "Measured: 8.00 GiB of activations"));
    free(r);
}

/* a training job's forward pass failing inside a layer with activation checkpointing measured off
 * (roles.gradient_checkpointing false) and the activations most of what is allocated: checkpointing leads;
 * unknown or in force, it does not; a batch of one (roles.batch_size 1) gets no smaller batch */
static og_record_t *first_forward(int checkpointing, int batch, uint64_t params, uint64_t act)
{
    og_record_t *r = base();
    fixture_roles(r, params, 0, 0, 0, 0, act);
    fixture_optimizer(r, "AdamW", 0);
    r->memory.fw.roles.optimizers[0].param_bytes = fx_opt(params);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.roles.checkpointing = checkpointing;
    r->memory.fw.roles.batch_size = batch;
    return r;
}

/* A first forward in float32 on a V100 (cc 7.0), autocast measured off and in no frame of the code: half precision
 * leads, checkpointing next (its text says fp16 with a GradScaler: no bf16 before cc 8.0); autocast in the code,
 * half-precision weights, or a card without tensor cores leave checkpointing first */
static void fp32_training_half_first(void **state)
{
    og_record_t *r = first_forward(-1, 0, 3 * GiB, 17 * GiB);
    fixture_dtype(r, "float32", 3 * GiB);
    r->memory.fw.autocast = -1;
    r->device.cc_major = 7;
    r->device.cc_minor = 0;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "mixed_precision");
    assert_string_equal(r->remedies[1].id, "gradient_checkpointing");
    bool led = false; /* by this row */
    for (int k = 0; k < r->remedies[0].ranking.nrows; k++)
        led = led || strcmp(r->remedies[0].ranking.rows[k], "fp32_training_lead") == 0;
    assert_true(led);
    assert_true(how_has(&r->remedies[0], "GradScaler"));
    r->memory.fw.roles.autocast_in_code = true; /* entered in the code (a region that ended): not plain float32 */
    run(r);
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    r->memory.fw.roles.autocast_in_code = false;
    r->memory.fw.roles.ndtypes = 0;
    fixture_dtype(r, "bfloat16", 3 * GiB); /* half-precision weights */
    run(r);
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    r->memory.fw.roles.ndtypes = 0;
    fixture_dtype(r, "bfloat16", 1843 * MiB); /* 60% bf16, 40% float32: mostly half already */
    fixture_dtype(r, "float32", 1229 * MiB);
    run(r);
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    r->memory.fw.roles.ndtypes = 0;
    fixture_dtype(r, "float32", 3 * GiB);
    r->device.cc_major = 6; /* a P100: no tensor cores */
    run(r);
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
}

static void checkpointing_off_leads(void **state)
{
    og_record_t *r = first_forward(-1, 0, 3 * GiB, 17 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    assert_true(rank_of(r, "smaller_batch") > 1);
    free(r);
    r = first_forward(0, 0, 3 * GiB, 17 * GiB); /* not measured: the checklist's order */
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
    r = first_forward(1, 0, 3 * GiB, 17 * GiB); /* in force already */
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
    r = first_forward(-1, 0, 3 * GiB, 17 * GiB); /* autograd off: nothing is kept for backward */
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    free(r);
    r = first_forward(-1, 0, 12 * GiB, 8 * GiB); /* activations a small part of what is held: not the lever */
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
    /* the failing request alone a quarter of the card (one layer's scores over a batch of 128): the batch that sizes
     * it leads, its eighth covering the shortfall (7/8 of the request and the activations); checkpointing is listed */
    r = first_forward(-1, 128, 1 * GiB, 15 * GiB);
    og_set(&r->event.requested_bytes, 7 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB); /* 6.5 GiB short: more than 7/8 of the request alone */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_batch");
    assert_true(rank_of(r, "gradient_checkpointing") > 1);
    free(r);
    r = first_forward(-1, 128, 1 * GiB, 15 * GiB); /* a request of a twelfth of the card: checkpointing leads */
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
}

static void batch_of_one_cannot_shrink(void **state)
{
    og_record_t *r = first_forward(-1, 1, 3 * GiB, 17 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_string_equal(r->remedies[0].id, "gradient_checkpointing");
    free(r);
    r = first_forward(-1, 8, 3 * GiB, 17 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0);
    free(r);
}

/* a pass that outgrows the splintered cache while the retry freed nothing: bucketing leads only where a batch
 * of the job fit with the state it keeps now (two optimizer steps or more); a first pass too big for the card
 * does not get it first */
static void bucketing_needs_a_batch_that_fit(void **state)
{
    for (int made = 0; made <= 5; made += 5) {
        og_record_t *r = base();
        og_set(&r->event.requested_bytes, 64 * MiB);
        og_set(&r->device.free_bytes, 0);
        r->event.attempts = 2;
        og_set(&r->event.released_between_attempts_bytes, 0);
        fixture_roles(r, 4 * GiB, 2 * GiB, 2 * GiB, 0, 0, 12 * GiB);
        r->memory.fw.reserved_bytes += 256 * MiB;
        r->memory.fw.largest_free_block_bytes = 32 * MiB;
        fixture_phase(r, "forward", "/w/train.py", "forward");
        if (made)
            fixture_steps(r, (uint64_t)made, made, 10 * GiB, 0);
        run_primary(r, "does_not_fit");
        assert_true(has_cause(r, "fragmentation"));
        if (made)
            assert_string_equal(r->remedies[0].id, "bucket_by_length");
        else
            assert_true(rank_of(r, "bucket_by_length") == 0 || rank_of(r, "bucket_by_length") > 3);
        /* an evaluation pass of a job whose training batches fit: not one of those batches */
        fixture_phase(r, "evaluation", "/w/train.py", "forward");
        run_primary(r, "does_not_fit");
        assert_true(rank_of(r, "bucket_by_length") == 0 || rank_of(r, "bucket_by_length") > 3);
        free(r);
    }
}

/* the optimizer's one step made its state after a pass of this batch fit, and the next pass fails: 8-bit
 * state comes next to the activation remedies (in the top three); after more steps it comes after them */
static void state_new_since_the_pass(void **state)
{
    for (int made = 1; made <= 5; made += 4) {
        og_record_t *r = base();
        fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 0, 8 * GiB);
        fixture_optimizer(r, "AdamW", 8 * GiB);
        og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
        fixture_phase(r, "backward", "/srv/model.py", "main");
        r->memory.fw.grad_enabled = 1;
        fixture_steps(r, (uint64_t)made, made, 16 * GiB, 0);
        run_primary(r, "does_not_fit");
        int k = rank_of(r, "eight_bit_optimizer");
        if (made == 1)
            assert_true(k > 0 && k <= 3);
        else
            assert_true(k > 3);
        free(r);
    }
}

/* CUDA graphs' private pools: capture fewer shapes, first */
static void graph_pools_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 0, 0, 0, 8 * GiB, 12 * GiB, 0);
    r->memory.fw.private_pool_bytes = 8 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fewer_graph_shapes");
    free(r);
    /* the pools reserve 16 GiB while 46 MiB of tensors live in them (a graph keeps its pool whole, used or not),
     * the primary cause that unused reservation: fewer shapes saves half the pools, not half the tensors, and as
     * that cause's own fix it leads, ahead of splitting the 4 GiB operation that failed beside them */
    r = base();
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1536 * MiB);
    fixture_roles(r, 5 * GiB, 0, 0, 46 * MiB, 1 * GiB, 1 * GiB);
    r->memory.fw.reserved_bytes += 16 * GiB;
    r->memory.fw.private_pool_bytes = 16 * GiB + 46 * MiB;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "cache_held");
    const og_remedy_t *g = rem(r, "fewer_graph_shapes");
    assert_true(g->ranking.estimate >= 8.0 * GiB);
    assert_string_equal(r->remedies[0].id, "fewer_graph_shapes");
    assert_true(ranked_by(g, "graph_pools_hold_the_cache"));
    free(r);
}

/* a leak into a dict kept across steps: bound the cache, name it (in its lines too); not inference_mode */
static void growth_in_a_dict(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "self.bank", "dict", "on Paster", 15 * GiB);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "bounded_cache");
    assert_non_null(strstr(r->remedies[0].why, "self.bank (dict, on Paster)"));
    assert_true(how_has(&r->remedies[0], "self.bank[key] = value.detach().cpu()")); /* its lines name the map */
    assert_true(how_has(&r->remedies[0], "if len(self.bank) >= N"));
    assert_int_equal(rank_of(r, "release_references"), 2);
    assert_true(how_has(rem(r, "release_references"), "self.bank: keep numbers"));
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
    /* a list: release_references names it, no cache to bound */
    r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "losses", "list", "global in train.py", 15 * GiB);
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "losses (list, global in train.py)"));
    assert_int_equal(rank_of(r, "bounded_cache"), 0);
    free(r);
}

/* the holder of the growth is named wherever it is kept: a list the running training loop fills (a local of
 * main) holding at least half of what the steps kept; a small local (a batch's outputs) is not; and a rise
 * read from the optimizer's steps (the driver saw no steps) leads with releasing it, not the state */
static void growth_names_its_holder(void **state)
{
    og_record_t *r = base();
    leaking_steps(r); /* 15 steps of 1 GiB */
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "previews", "list", "local in main (train.py:65)", 15 * GiB);
    fixture_holder(r, "outs", "list", "local in step (train.py:40)", 1 * GiB);
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "previews (list, local in main (train.py:65))"));
    assert_true(how_has(&r->remedies[0], "previews: keep numbers"));
    free(r);
    r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "outs", "list", "local in step (train.py:40)", 1 * GiB); /* a step's worth: not the holder */
    run_primary(r, "growth");
    assert_null(strstr(r->remedies[0].why, "outs (list"));
    free(r);
    r = base();
    r->history.nevents = 0;
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 19 * GiB);
    og_roles_t *ro = &r->memory.fw.roles;
    ro->nsteps = 20;
    ro->steps_made = 20;
    for (int i = 0; i < 20; i++)
        ro->step_alloc[i] = 4 * GiB + (uint64_t)i * 64 * MiB;
    r->memory.fw.training = 1;
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "after each optimizer step"));
    assert_true(rank_of(r, "eight_bit_optimizer") == 0 || rank_of(r, "eight_bit_optimizer") > 3);
    free(r);
}

/* a metric keeps every step's predictions on the GPU (self.preds, a list on the metric): the window of steps the
 * optimizer reports rose less than the shortfall, but releasing the holder frees all it keeps since the first step,
 * so release_references leads, named, before the activation remedies; a holder whose name says it is a cache (its
 * own lever) is not counted */
static void growth_holder_kept_covers(void **state)
{
    og_record_t *r = base();
    r->history.nevents = 0;
    og_set(&r->device.free_bytes, 40 * MiB);
    og_set(&r->event.requested_bytes, 640 * MiB);
    fixture_roles(r, 4 * GiB, 4 * GiB, 512 * MiB, 0, 10 * GiB, 3 * GiB + 512 * MiB);
    fixture_optimizer(r, "Adagrad", 512 * MiB);
    fixture_steps(r, 996, 32, 18 * GiB, 10 * MiB);
    fixture_holder(r, "self.preds", "list", "on MultitaskAUROC", 5 * GiB);
    fixture_holder(r, "self.target", "list", "on MultitaskAUROC", 5 * GiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "growth");
    assert_int_equal(r->analysis.facts.roles.grower, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].why, "It is held by self.preds (list, on MultitaskAUROC) (5.00 GiB)"));
    assert_true(how_has(&r->remedies[0], "self.preds: keep numbers (.item()) or host copies (.detach().cpu())"));
    /* named as a cache (a list: no map to bound): release_references' estimate is the window's rise alone; what
     * Python keeps is the leak all the same (growth.kept_measured), so nothing acting elsewhere (a smaller pass) is
     * offered and it leads */
    snprintf(r->memory.fw.roles.holders[0].purpose, sizeof r->memory.fw.roles.holders[0].purpose, "cache");
    snprintf(r->memory.fw.roles.holders[1].purpose, sizeof r->memory.fw.roles.holders[1].purpose, "cache");
    run_primary(r, "growth");
    assert_true(r->analysis.facts.growth.kept_measured);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "release_references"), 1);
    /* the same kept lists beside a model asked for every layer's hidden states: the holder kept across calls filled
     * the card, so releasing it still leads and the asked-for outputs follow; a local of the running call growing
     * instead is the outputs' own rise, and they lead.  Autograd off: with it on, the graph keeps every layer's output
     * for backward already, and asking for fewer outputs keeps nothing less (not listed) */
    r->memory.fw.roles.holders[0].purpose[0] = r->memory.fw.roles.holders[1].purpose[0] = 0;
    fixture_setting(r, OG_SETTING_extra_outputs, "forward", "output_hidden_states");
    run_primary(r, "growth");
    assert_int_equal(rank_of(r, "only_needed_outputs"), 0);
    r->memory.fw.roles.checkpointing = 1; /* ... unless checkpointing keeps only its boundaries */
    run_primary(r, "growth");
    assert_true(rank_of(r, "only_needed_outputs") > 1);
    r->memory.fw.roles.checkpointing = 0;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(rank_of(r, "only_needed_outputs") > 1);
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in forward (m.py:9)");
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "only_needed_outputs");
    free(r);
}

/* the growth is all NCCL's (communicators made again and again): reuse process groups, NCCL_BUFFSIZE */
static void nccl_growth(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    strcpy(r->event.library, "libnccl.so.2");
    r->memory.nlibs = 0;
    fixture_fw_lib(r, "libtorch_cuda.so", 4 * GiB, OG_FW_PYTORCH);
    og_lib_usage_t *l = &r->memory.by_library[r->memory.nlibs++];
    snprintf(l->library, sizeof l->library, "libnccl.so.2");
    l->bytes = 16 * GiB;
    run(r);
    const og_cause_t *g = NULL;
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (strcmp(r->diagnosis.causes[i].id, "growth") == 0)
            g = &r->diagnosis.causes[i];
    assert_non_null(g);
    bool named = false;
    for (int i = 0; i < g->nevidence; i++)
        named =
            named || (strcmp(g->evidence[i].name, "library") == 0 && strcmp(g->evidence[i].text, "libnccl.so.2") == 0);
    assert_true(named);
    assert_string_equal(r->remedies[0].id, "reuse_process_groups");
    assert_int_equal(rank_of(r, "nccl_buffsize"), 2);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
}

/* one batch far longer than the flat run before it: cap the length, first */
static void one_batch_peak_caps_the_length(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    double t = 0.01;
    for (int i = 0; i < 10; i++) /* the weights, 10 GiB */
        ev_add(r, 0.001 * i, "alloc", 1 * GiB);
    for (int s = 0; s < 12; s++, t += 0.1) { /* steps that free what they make */
        ev_add(r, t, "alloc", 256 * MiB);
        ev_add(r, t + 0.01, "free", 256 * MiB);
    }
    for (int i = 0; i < 2; i++) /* one batch: 4 GiB tensors */
        ev_add(r, t + 0.01 * i, "alloc", 4 * GiB);
    ev_add(r, t + 0.1, "fail", 4 * GiB);
    og_set(&r->event.requested_bytes, 4 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_non_null(strstr(r->remedies[0].why, "4x the largest allocation"));
    free(r);
}

/* the same peak, larger than the card, in a job whose autograd is on: the batches before it fit and the pass keeps
 * every layer's output of this one, so its length leads, ahead of splitting the failing operation */
static void larger_outlier_batch_caps_the_length(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    double t = 0.01;
    for (int i = 0; i < 4; i++) /* the weights and the optimizer state, 4 GiB */
        ev_add(r, 0.001 * i, "alloc", 1 * GiB);
    for (int s = 0; s < 12; s++, t += 0.1) { /* steps that free what they make */
        ev_add(r, t, "alloc", 256 * MiB);
        ev_add(r, t + 0.01, "free", 256 * MiB);
    }
    ev_add(r, t + 0.1, "fail", 80 * GiB);
    og_set(&r->event.requested_bytes, 80 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_int_equal(rank_of(r, "split_operation"), 2);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    /* the request a product of two sizes the program's own statement made outside any pass of a model (an alignment
     * trellis of frames x characters; no phase, no KV cache): its operation, not a batch's length: split it */
    fixture_roles(r, 1200 * MiB, 0, 0, 0, 0, 20 * MiB);
    r->memory.fw.roles.has_statement = true;
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "174033,53611");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.request_shape, OG_REQ_PRODUCT);
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_false(ranked_by(rem(r, "shorter_sequences"), "larger_outlier_batch_lead"));
    fixture_phase(r, "forward", "/w/model.py", "forward"); /* the same sizes in a model's forward: its input's length */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    /* no pass runs (phase unknown) and the model measured idle: a notebook cell's own operation over the results it
     * keeps (all validation logits upsampled at once: an operation read), no batch in flight: split it; the model
     * running, or no operation of its own (a batch's input copied to the GPU before the model runs): its length */
    r->memory.fw.roles.stmt_ints[0] = 0;
    fixture_phase(r, "unknown", "/w/nb.py", "cell_8");
    fixture_model(r, "SegformerForSemanticSegmentation", 90 * MiB, 1, false);
    fixture_model_held(r, 1, 0, "model");
    run_primary(r, "does_not_fit"); /* no operation read: a batch's input arriving before the model runs */
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    fixture_operation(r, "image_decode", "interpolate");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_false(ranked_by(rem(r, "shorter_sequences"), "larger_outlier_batch_lead"));
    r->memory.fw.roles.operation[0] = 0;
    r->memory.fw.roles.models[0].running = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    /* not larger than the card: a score matrix of every query against every document the program makes after its
     * model ran (queries x corpus, no model running): split it, not one batch's length */
    r->memory.fw.roles.models[0].running = 0;
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "10000,522931");
    og_set(&r->event.requested_bytes, 19 * GiB);
    FIXTURE_EV[r->history.nevents - 1].bytes = 19 * GiB;
    og_set(&r->device.free_bytes, 16 * GiB); /* 3 GiB short: an eighth of the matrix at a time fits */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(ranked_by(&r->remedies[0], "own_operation_peak_lead"));
    assert_false(ranked_by(rem(r, "shorter_sequences"), "one_batch_peak_lead"));
    r->memory.fw.roles.models[0].running = 1; /* its model running: one batch far longer than the rest */
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    og_set(&r->event.requested_bytes, 80 * GiB);
    FIXTURE_EV[r->history.nevents - 1].bytes = 80 * GiB;
    og_unset(&r->device.free_bytes);
    r->memory.fw.roles.nmodels = 0;
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "174033,53611");
    fixture_phase(r, "forward", "/w/model.py", "forward");
    /* with autograd off the peak is one inference's operation: no outlier batch, split it */
    r->memory.fw.has = true;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_int_equal(rank_of(r, "shorter_sequences"), 0);
    free(r);
}

/* the same outlier in a generation (autograd off, phase generation: a prompt far longer than the others, padded across
 * its batch of 16): capping the input's length leads, ahead of a smaller batch for the whole job and of the KV
 * cache; an evaluation's outlier (its batch larger than the training's) is no prompt: not this row */
static void one_prompt_peak_in_generation(void **state)
{
    og_record_t *r = outlier_pass(16);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = -1;
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 18 * GiB);
    r->memory.fw.roles.batch_size = 16;
    fixture_phase(r, "generation", "/w/summarize.py", "generate");
    r->event.attempts = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_true(ranked_by(&r->remedies[0], "one_input_peak_lead"));
    assert_true(rank_of(r, "smaller_batch") != 1);
    fixture_phase(r, "evaluation", "/w/train.py", "validate");
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "shorter_sequences"), "one_input_peak"));
    free(r);
}

/* one whole recording evaluated at a batch of one, autograd off, through a model with no attention layer (its failing
 * tensor 4 GiB of the 24 GiB card, an eighth or more): no batch to shrink, the input's size is the lever, so capping
 * it (overlapping pieces, tiles) leads and a smaller batch is not offered; the same request at a batch of 8, or with
 * autograd on (a training step), or under an eighth of the card, is not this row; one convolution over the whole
 * input that dominates the pass is split instead (operation_dominates leads) */
static void one_input_evaluation_caps_the_input(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 14 * GiB);
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    r->memory.fw.roles.batch_size = 1;
    fixture_phase(r, "evaluation", "/w/separate.py", "validate");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_true(ranked_by(&r->remedies[0], "one_input_inference_lead"));
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 6 * GiB);
    fixture_operation(r, "conv", "forward");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.roles.batch_size = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_false(ranked_by(rem(r, "cap_input_size"), "one_input_inference_lead"));
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 14 * GiB);
    og_set(&r->memory.fw.roles.attention_modules, 0);
    r->memory.fw.roles.operation[0] = 0;
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.roles.batch_size = 1;
    r->memory.fw.roles.batch_size = 8;
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "cap_input_size"), "one_input_inference_lead"));
    r->memory.fw.roles.batch_size = 1;
    og_set(&r->event.requested_bytes, 2 * GiB);
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "cap_input_size"), "one_input_inference_lead"));
    og_set(&r->event.requested_bytes, 4 * GiB);
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/separate.py", "forward");
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "cap_input_size"), "one_input_inference_lead"));
    free(r);
}

/* one batch far beyond the earlier steps (its new sizes 1 and 2 GiB, then 3 GiB failing; the steps' largest
 * 256 MiB), with the cache splintered: capping the length leads, not bucketing by length; with two
 * samples a batch, one sample's share is still beyond a whole earlier batch: no smaller batch either */
static void one_batch_peak_not_bucketing(void **state)
{
    og_record_t *r = outlier_pass(2);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_true(rank_of(r, "bucket_by_length") == 0 || rank_of(r, "bucket_by_length") > 3);
    assert_true(rank_of(r, "smaller_batch") == 0 || rank_of(r, "smaller_batch") > 3);
    free(r);
}

/* a smaller batch without autograd: an evaluation splits its inputs, a generation its prompts (generate's code only
 * where the phase is a generation) */
static void an_inference_batch_splits_as_its_phase_runs(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 0, 0, 0, 0, 10 * GiB);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = -1;
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    fixture_phase(r, "evaluation", "/w/screen.py", "forward");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0);
    assert_true(how_has(rem(r, "smaller_batch"), ".split("));
    assert_false(how_has(rem(r, "smaller_batch"), "generate("));
    fixture_phase(r, "generation", "/w/summarize.py", "generate");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0);
    assert_true(how_has(rem(r, "smaller_batch"), "generate("));
    free(r);
}

/* one inference input larger than the card: cap its length before splitting the operation (not every pair of the
 * program's own items) */
static void larger_inference_caps_the_input(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 40 * GiB);
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.grad_enabled = -1;
    fixture_phase(r, "evaluation", "/srv/serve.py", "forward");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    assert_true(rank_of(r, "flash_attention") > 0);
    assert_true(rank_of(r, "split_operation") > 0);
    free(r);
    /* nothing says it is a model's input (no forward frame, no KV cache): a score matrix; split it */
    r = base();
    og_set(&r->event.requested_bytes, 40 * GiB);
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(rank_of(r, "shorter_sequences") == 0 || rank_of(r, "shorter_sequences") > 3);
    free(r);
    /* one length twice (every pair of a validation set's embeddings), read from a Python stack on which no pass of a
     * model runs: the items are the program's data, the operation splits by rows; the same square inside an
     * evaluation's forward is the model's input (attention's L x L): shorter inputs lead */
    r = base();
    og_set(&r->event.requested_bytes, 40 * GiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, 16 * GiB, 2 * GiB);
    r->memory.fw.grad_enabled = -1;
    fixture_statement(r, "sims", "");
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "103000,103000");
    r->memory.fw.npy_frames = 2;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_false(ranked_by(rem(r, "shorter_sequences"), "larger_inference_lead"));
    r->memory.fw.npy_frames = 0; /* no stack read: nothing says no pass runs (no attention layer measured: the
                                      input's size, cap_input_size, stands for its length) */
    run_primary(r, "does_not_fit");
    assert_true(ranked_by(&r->remedies[0], "larger_inference_lead"));
    r->memory.fw.npy_frames = 2;
    fixture_phase(r, "evaluation", "/w/eval.py", "forward");
    run_primary(r, "does_not_fit");
    assert_true(ranked_by(&r->remedies[0], "larger_inference_lead"));
    free(r);
}

/* where a remedy can help at all is the catalog's (`applies`), read on the evidence, for every remedy: a
 * full fine-tune whose optimizer state did not fit gets no weight quantization (inference or QLoRA only:
 * that is `lora`); a job not known to train keeps it */
static void applies_by_job(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 0, 6 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 6 * GiB);
    fixture_phase(r, "optimizer_step", "/usr/lib/python3/dist-packages/torch/optim/adamw.py", "_init_group");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "quantization"), 0);
    assert_true(rank_of(r, "lora") > 0 && rank_of(r, "lora") <= 3);
    assert_non_null(strstr(rem(r, "lora")->why, "6.00 GiB of optimizer state"));
    free(r);
    /* the same weights, nothing says the job trains: quantization stays, LoRA is not offered */
    r = base();
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "quantization") > 0);
    assert_int_equal(rank_of(r, "lora"), 0);
    free(r);
    /* known inference (the adapter's training -1) with autograd off: nothing kept for backward, no optimizer */
    r = dnf();
    fixture_adapter(r, 20 * GiB, 20 * GiB - 300 * MiB, 0);
    r->memory.fw.training = -1;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "gradient_checkpointing"), 0);
    assert_int_equal(rank_of(r, "eight_bit_optimizer"), 0);
    assert_true(rank_of(r, "quantization") > 0);
    free(r);
}

/* a remedy whose own estimate is a measured nothing is not listed (its text would say it cannot help):
 * no cache to release when the adapter measured none */
static void measured_nothing_not_listed(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 8 * GiB);
    fixture_adapter(r, 22 * GiB, 22 * GiB, 0);
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "empty_cache"), 0);
    assert_true(rank_of(r, "smaller_batch") > 0);
    free(r);
}

/* weights updated outside the optimizer with autograd off in a training job (an EMA): in place first when
 * the running code holds more than one copy of the weights; the copy on the CPU; no activation remedy */
static void weights_update_outside_the_step(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 7 * GiB + 512 * MiB, 0);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_holder(r, "tensors", "list", "local in _foreach_mul (ema.py:49)", 4 * GiB);
    fixture_holder(r, "out", "list", "local in _foreach_mul (ema.py:49)", 3 * GiB + 512 * MiB);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "in_place_update");
    assert_non_null(strstr(r->remedies[0].why, "_foreach_mul (ema.py:49)"));
    assert_int_equal(rank_of(r, "ema_on_cpu"), 2);
    const char *none[] = { "smaller_batch",     "mixed_precision", "gradient_checkpointing",
                           "shorter_sequences", "flash_attention", "inference_mode",
                           "quantization" };
    for (size_t i = 0; i < sizeof none / sizeof *none; i++)
        assert_int_equal(rank_of(r, none[i]), 0);
    free(r);
    /* the copy being made (a lazy deepcopy): less than one copy held, nothing to update in place */
    r = base();
    fixture_roles(r, 5 * GiB, 0, 10 * GiB, 0, 8 * GiB, 0);
    fixture_optimizer(r, "AdamW", 10 * GiB);
    fixture_holder(r, "grads", "list", "global in train.py", 5 * GiB);
    fixture_holder(r, "got", "list", "local in deepcopy (copy.py:172)", 3 * GiB);
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "ema_on_cpu");
    assert_int_equal(rank_of(r, "in_place_update"), 0);
    free(r);
    /* the same memory in a validation pass (the adapter read evaluation from the stack): the batch */
    r = base();
    fixture_roles(r, 5 * GiB, 0, 10 * GiB, 0, 8 * GiB, 0);
    fixture_holder(r, "got", "list", "local in evaluate (train.py:90)", 3 * GiB);
    fixture_phase(r, "evaluation", "/srv/train.py", "evaluate");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "ema_on_cpu"), 0);
    assert_true(rank_of(r, "smaller_batch") > 0);
    free(r);
}

/* the holder's purpose as the adapter reads it from its name or class (common/purposes.def) */
static void fixture_purpose(og_record_t *r, const char *purpose)
{
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->holders[ro->nholders - 1].purpose, sizeof ro->holders[0].purpose, "%s", purpose);
}

/* no remedy text says a figure for a shortfall nobody measured: "0 B missing", "0 B more", "short by 0 B" */
static void no_zero_shortfall_text(const og_record_t *r)
{
    static const char *bad[] = { " 0 B missing", "0 B is missing", " 0 B more",       "short by 0 B",
                                 "the 0 B",      "At least 0 B",   "0 B was missing", "so 0 B more" };
    for (int i = 0; i < r->nremedies; i++) {
        const og_remedy_t *m = &r->remedies[i];
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
            if (strstr(m->why, bad[b]))
                fail_msg("%s: '%s' in: %s", m->id, bad[b], m->why);
            for (int h = 0; h < m->nhow; h++)
                if (strstr(m->how[h], bad[b]))
                    fail_msg("%s: '%s' in: %s", m->id, bad[b], m->how[h]);
        }
    }
}

/* the device's free memory not read, no total to estimate it from: the shortfall is unknown, and no remedy is
 * judged to cover it (none leads for covering it, none says a figure for it) */
static void unknown_shortfall_is_covered_by_nothing(void **state)
{
    og_record_t *(*make[])(void) = { base, frag, dnf, nccl_cache_held };
    for (size_t i = 0; i < sizeof make / sizeof *make; i++) {
        og_record_t *r = make[i]();
        og_unset(&r->device.free_bytes);
        og_unset(&r->device.total_bytes);
        run(r);
        assert_false(og_known(r->diagnosis.shortfall_bytes));
        no_zero_shortfall_text(r);
        free(r);
    }
    /* a 15 GiB KV cache: smaller_kv_cache leads when it covers the 1 GiB missing, not when nobody knows
     * what is missing */
    og_record_t *r = base();
    fixture_roles(r, 8 * GiB, 0, 0, 0, 15 * GiB + 512 * MiB, 0);
    fixture_holder(r, "kv", "list", "global in serve.py", 15 * GiB);
    fixture_purpose(r, "kv_cache");
    fixture_holder(r, "got", "list", "local in prefill (serve.py:25)", 512 * MiB);
    r->memory.fw.grad_enabled = -1;
    run(r);
    assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    run(r);
    assert_false(og_known(r->diagnosis.shortfall_bytes));
    assert_string_not_equal(r->remedies[0].id, "smaller_kv_cache");
    no_zero_shortfall_text(r);
    free(r);
    /* the same cache reserved by an engine while another model loads beside it, autograd on (loading builds no
     * graph): no activations, what Python holds all a KV cache (kept_state_only): the cache leads, and nothing that
     * shrinks a pass or its graph is offered */
    r = base();
    fixture_roles(r, 8 * GiB, 0, 0, 0, 15 * GiB, 0);
    fixture_holder(r, "self.kv_cache", "list", "attribute on LLM", 15 * GiB);
    fixture_purpose(r, "kv_cache");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    fixture_holder(r, "outs", "list", "global in serve.py", 1 * GiB); /* outputs kept, no purpose: not only state */
    r->memory.fw.roles.bytes[OG_ROLE_held_by_python].v += 1 * GiB;
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "smaller_kv_cache");
    free(r);
    /* growth into a dict: bounding the cache leads by its bytes against the shortfall only when known */
    r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "cache", "dict", "global in train.py", 15 * GiB);
    r->memory.fw.grad_enabled = 1;
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    run(r);
    assert_false(og_known(r->diagnosis.shortfall_bytes));
    no_zero_shortfall_text(r);
    free(r);
}

/* a KV cache reserved up front by a server (the adapter's purpose kv_cache): make it smaller, first; a
 * global kept for another purpose (or none) is not a KV cache */
/* a server reserving its KV cache at start-up (the failing statement builds a KV cache, a local list so far) on an
 * 80 GiB card where another process holds 43 GiB: when that process is another instance of this program (a second
 * server set up otherwise), the reservation leads and its text names the share left; when it is a stranger (or a
 * run of this command line left over), stopping it leads and the reservation follows; a job that trains, or a
 * statement building something else, gets none of it */
static void kv_cache_reserving(void **state)
{
    for (int stranger = 0; stranger <= 1; stranger++) {
        og_record_t *r = base();
        og_set(&r->device.total_bytes, 80 * GiB);
        fixture_roles(r, 0, 0, 0, 0, 34 * GiB, 0);
        fixture_holder(r, "kv_cache", "list", "local in serve (serve.py:44)", 31 * GiB);
        fixture_holder_says(r, "kv_cache", "");
        fixture_holder(r, "weights", "list", "local in serve (serve.py:44)", 3 * GiB);
        fixture_statement(r, "", "kv_cache");
        og_other_proc_t *o = fixture_other(r, 4242, "python3", 43 * GiB);
        o->visible = true;
        o->same_program = !stranger;
        og_set(&r->memory.process_used_bytes, 34 * GiB + 512 * MiB);
        og_set(&r->event.requested_bytes, 2 * GiB + 512 * MiB);
        og_set(&r->device.free_bytes, 2 * GiB + 256 * MiB); /* 256 MiB missing */
        run_primary(r, "foreign_memory");
        if (!stranger) {
            assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
            assert_true(rank_of(r, "foreign_processes") > 1);
            assert_non_null(strstr(r->remedies[0].why, "another instance of this program (pid 4242"));
            assert_true(how_has(&r->remedies[0], "--gpu-memory-utilization 0.40"));
        } else {
            assert_string_equal(r->remedies[0].id, "foreign_processes");
            assert_int_equal(rank_of(r, "smaller_kv_cache"), 2);
        }
        fixture_statement(r, "", "");
        run_primary(r, "foreign_memory");
        assert_int_equal(rank_of(r, "smaller_kv_cache"), 0);
        free(r);
    }
    /* one piece larger than the card (a pool sized from a MIG slice's parent GPU), after warm-up passes that freed
     * what they made: sized from what is free it fits, ahead of splitting an operation, and no batch made it (no
     * shorter length); without the statement saying so, the request is an operation to split */
    for (int kv = 1; kv >= 0; kv--) {
        og_record_t *r = base();
        ev_reset(r);
        double t = 0.01;
        for (int i = 0; i < 15; i++) /* the weights */
            ev_add(r, 0.001 * i, "alloc", 1 * GiB);
        for (int s = 0; s < 12; s++, t += 0.1) { /* warm-up passes that free what they make */
            ev_add(r, t, "alloc", 112 * MiB);
            ev_add(r, t + 0.01, "free", 112 * MiB);
        }
        ev_add(r, t + 0.1, "fail", 55 * GiB);
        fixture_roles(r, 0, 0, 0, 0, 15 * GiB, 0);
        fixture_holder(r, "self.weights", "list", "on ModelRunner", 15 * GiB);
        fixture_statement(r, "kv_cache", kv ? "kv_cache" : "");
        og_set(&r->memory.process_used_bytes, 15 * GiB + 512 * MiB);
        og_set(&r->event.requested_bytes, 55 * GiB);
        og_set(&r->device.free_bytes, 8 * GiB);
        run_primary(r, "does_not_fit");
        if (kv) {
            assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
            assert_true(how_has(&r->remedies[0], "mem_get_info"));
            assert_int_equal(rank_of(r, "shorter_sequences"), 0);
        } else {
            assert_int_equal(rank_of(r, "smaller_kv_cache"), 0);
            assert_true(rank_of(r, "shorter_sequences") > 0); /* a batch's peak: what the rows read without it */
        }
        free(r);
    }
}

static void kv_cache_reserved_first(void **state)
{
    const char *names[][3] = { { "kv", "list", "kv_cache" },
                               { "self.past_key_values", "tuple", "kv_cache" },
                               { "engine.cache", "StaticCache", "kv_cache" },
                               { "embeddings", "list", "" },
                               { "lookup", "dict", "cache" } };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        og_record_t *r = base();
        fixture_roles(r, 8 * GiB, 0, 0, 0, 15 * GiB + 512 * MiB, 0);
        fixture_holder(r, names[i][0], names[i][1], "global in serve.py", 15 * GiB);
        fixture_purpose(r, names[i][2]);
        fixture_holder(r, "got", "list", "local in prefill (serve.py:25)", 512 * MiB);
        r->memory.fw.grad_enabled = -1;
        run_primary(r, "does_not_fit");
        if (i < 3) {
            assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
            assert_non_null(strstr(r->remedies[0].why, names[i][0]));
        } else
            assert_int_equal(rank_of(r, "smaller_kv_cache"), 0);
        free(r);
    }
    /* CUDA graphs' pools larger than the cache: capturing fewer shapes is the bigger lever and leads */
    og_record_t *r = base();
    fixture_roles(r, 0, 0, 0, 9 * GiB, 14 * GiB + 512 * MiB, 0);
    r->memory.fw.private_pool_bytes = 9 * GiB;
    fixture_holder(r, "weights", "list", "global in serve.py", 8 * GiB);
    fixture_holder(r, "kv", "list", "global in serve.py", 6 * GiB);
    fixture_purpose(r, "kv_cache");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "fewer_graph_shapes");
    assert_true(rank_of(r, "smaller_kv_cache") > 1);
    free(r);
}

/* memory rising step by step within one inference call (an evaluation pass keeping every layer's output), autograd
 * off, the rise in the call's activations: one pass building up, not a leak; the same rise held by a list the
 * loop keeps (outputs appended without .cpu()) stays a growth, and so does one with autograd on */
static void inference_call_building(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 0, 16 * GiB);
    fixture_phase(r, "evaluation", "embed.py", "encode");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->device.free_bytes, 256 * MiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.growth.pass_built && !r->analysis.facts.growth.holds);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "preds", "list", "local in main (embed.py:40)", 15 * GiB);
    run_primary(r, "growth");
    /* ... but held by a local of the model's own forward (each layer's attention map, stacked at the end): that
     * call's working set, made anew by every call */
    r->memory.fw.roles.nholders = 0;
    fixture_holder(r, "attn_weights", "list", "local in forward (esm.py:186)", 15 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.growth.pass_built);
    /* ... not by a local of the frame that decided the phase: the evaluation loop there keeps every batch's logits */
    r->memory.fw.roles.nholders = 0;
    fixture_holder(r, "all_logits", "list", "local in encode (embed.py:81)", 15 * GiB);
    run_primary(r, "growth");
    /* autograd on (a saliency map's forward keeps each layer's output for the input's gradient), no holder keeping
     * a graph: the pass building up too; a list of outputs whose graphs the adapter read alive: a growth */
    fixture_roles(r, 4 * GiB, 0, 0, 0, 0, 16 * GiB);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.growth.pass_built);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 7 * MiB, 16 * GiB);
    fixture_holder(r, "outs", "list", "local in main (embed.py:40)", 7 * MiB);
    r->memory.fw.roles.holders[0].tensors = 4; /* too few for the graphs' own reading: the driver's steps decide */
    r->memory.fw.roles.holders[0].graphs = 4;
    run_primary(r, "growth");
    /* a retry inside the handler of the earlier OOM, autograd off: the retry's pass building beside the failed
     * attempt's tensors, not a leak either */
    r->memory.fw.grad_enabled = -1;
    fixture_phase(r, "oom_handler", "embed.py", "encode");
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.growth.pass_built);
    free(r);
}

/* a hand-written decoding loop (the stack shows a forward or an evaluation, no generate()) whose own local keeps the
 * KV cache it extends block by block, autograd off: decoding too, the generation's working set, not a growth; the
 * same cache kept across calls on an attribute (a prefix cache by tenant) stays a growth */
static void decoding_loop_kv_growth(void **state)
{
    static const char *const phases[] = { "evaluation", "forward" };
    for (int i = 0; i < 2; i++) {
        og_record_t *r = base();
        leaking_steps(r);
        fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
        fixture_holder(r, "past_key_values", "list", "local in sample (gen.py:81)", 15 * GiB);
        fixture_purpose(r, "kv_cache");
        fixture_phase(r, phases[i], "gen.py", "forward");
        r->memory.fw.grad_enabled = -1;
        og_set(&r->device.free_bytes, 256 * MiB);
        run_primary(r, "does_not_fit");
        assert_true(r->analysis.facts.decoding);
        assert_true(r->analysis.facts.growth.gen_built && !r->analysis.facts.growth.holds);
        assert_int_equal(rank_of(r, "release_references"), 0);
        assert_true(rank_of(r, "smaller_kv_cache") >= 1 && rank_of(r, "smaller_kv_cache") <= 3);
        r->memory.fw.roles.nholders = 0;
        fixture_holder(r, "self.prefix_cache", "dict", "on ChatService", 15 * GiB);
        fixture_purpose(r, "kv_cache");
        run_primary(r, "growth");
        assert_false(r->analysis.facts.decoding);
        free(r);
    }
}

/* the run's series (roles.allocated_over_run): from FIRST, rising by RISE over four points */
static void fixture_run_series(og_record_t *r, uint64_t first, uint64_t rise)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->nstep_run = 4;
    ro->step_run_every = 64;
    for (int i = 0; i < 4; i++)
        ro->step_run[i] = first + rise * (uint64_t)i / 3;
}

/* the driver's history of 16 passes from LIVE bytes, each allocating 512 MiB and 128 MiB and freeing the 512 MiB:
 * 128 MiB kept per pass, a staircase (48 events) */
static void staircase_of_passes(struct og_hist_ev ev[48], uint64_t live)
{
    for (int k = 0; k < 16; k++) {
        ev[3 * k] =
            (struct og_hist_ev){ .t_rel = k * 0.1, .op = OG_OP_ALLOC, .bytes = 512 * MiB, .live = live += 512 * MiB };
        ev[3 * k + 1] = (struct og_hist_ev){
            .t_rel = k * 0.1 + 0.01, .op = OG_OP_ALLOC, .bytes = 128 * MiB, .live = live += 128 * MiB
        };
        ev[3 * k + 2] = (struct og_hist_ev){
            .t_rel = k * 0.1 + 0.02, .op = OG_OP_FREE, .bytes = 512 * MiB, .live = live -= 512 * MiB
        };
    }
}

/* a holder no name gives a purpose, kept across calls, that is a collection of OG_RECORDS_MIN or more like records
 * (a scene's photos on the GPU, roles.holders[].records) there since the run's first step holds the data set: keeping
 * it in host memory leads, saying how many records; fewer records, records keeping their graphs (outputs), a running
 * function's local, no run series (when they came unknown), or records the series rose by (each batch's predictions
 * appended): not a data set */
static og_record_t *records_on_the_gpu(int64_t records, int graphs, const char *where)
{
    og_record_t *r = base();
    fixture_roles(r, 100 * MiB, 0, 0, 0, 12 * GiB, 8 * GiB);
    fixture_run_series(r, 12 * GiB + 200 * MiB, 100 * MiB);
    fixture_optimizer(r, "SGD", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 100 * MiB);
    fixture_holder(r, "self.frames", "list", where, 12 * GiB);
    r->memory.fw.roles.holders[0].records = records;
    r->memory.fw.roles.holders[0].graphs = graphs;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.autocast = 1;
    return r;
}

static void records_kept_as_a_dataset(void **state)
{
    og_record_t *r = records_on_the_gpu(720, 0, "on Scene");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    assert_true(r->analysis.facts.roles.records_dataset == 1u);
    assert_int_equal(r->analysis.facts.roles.dataset_kept, 12 * GiB);
    assert_non_null(strstr(r->remedies[0].why, "self.frames (list, on Scene), 720 like records"));
    assert_true(how_has(&r->remedies[0], "self.frames: build each record in host memory"));
    free(r);
    static const struct {
        int64_t records;
        int graphs;
        const char *where;
    } not_data[] = { { OG_RECORDS_MIN - 1, 0, "on Scene" },
                     { 720, 1, "on Scene" },
                     { -1, 0, "on Scene" },
                     { 720, 0, "local in train (train.py:40)" } };
    for (size_t i = 0; i < sizeof not_data / sizeof *not_data + 3; i++) {
        size_t j = i < sizeof not_data / sizeof *not_data ? i : 0;
        r = records_on_the_gpu(i == j ? not_data[j].records : 720, not_data[j].graphs, not_data[j].where);
        if (i == j + sizeof not_data / sizeof *not_data)
            r->memory.fw.roles.nstep_run = 0; /* no series: when they came unknown */
        else if (i > sizeof not_data / sizeof *not_data)
            fixture_run_series(r, i % 2 ? 6 * GiB : 13 * GiB, i % 2 ? 0 : 6 * GiB); /* after the first point; rose by */
        run(r);
        assert_int_equal(r->analysis.facts.roles.records_dataset, 0);
        assert_int_equal(rank_of(r, "dataset_on_cpu"), 0);
        free(r);
    }
    /* with a growth (128 MiB kept per step, from 12 GiB): the photos there before the first step are the data set;
     * records the run's series rose by are not (each batch's outputs appended) */
    static struct og_hist_ev ev[48];
    staircase_of_passes(ev, 12 * GiB);
    uint64_t sizes[] = { 12 * GiB, 2 * GiB };
    for (int i = 0; i < 2; i++) {
        r = base();
        r->history.events = ev;
        r->history.nevents = 48;
        og_set(&r->event.requested_bytes, 512 * MiB);
        fixture_roles(r, 1 * GiB, 0, 0, 0, sizes[i], 0);
        fixture_run_series(r, 12 * GiB + 512 * MiB, 15 * 128 * MiB);
        fixture_holder(r, "self.frames", "list", "on Scene", sizes[i]);
        r->memory.fw.roles.holders[0].records = 720;
        og_set(&r->device.free_bytes, 256 * MiB);
        r->memory.fw.grad_enabled = 1;
        run_primary(r, "growth");
        assert_int_equal(r->analysis.facts.roles.records_dataset, i == 0 ? 1u : 0u);
        assert_int_equal(rank_of(r, "dataset_on_cpu") == 1, i == 0);
        free(r);
    }
    /* the records in a dict kept across calls: a data set by its records is no cache of earlier calls' entries, as a
     * named one is not (og_holder_purpose: every reader of a holder's purpose) */
    r = records_on_the_gpu(720, 0, "on Scene");
    og_cpy(r->memory.fw.roles.holders[0].kind, sizeof r->memory.fw.roles.holders[0].kind, "dict", 5);
    run(r);
    assert_true(r->analysis.facts.roles.keeper_map);
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    assert_int_equal(rank_of(r, "bounded_cache"), 0);
    free(r);
}

/* three copies of one model, two of them running at once (threads of one process, each its own trial's loop:
 * Optuna's n_jobs=3): the driver's low points rise as the loops start beside each other (a staircase of 512 MiB
 * passes keeping 128 MiB each), which is no growth; the copies are the job's, not leftovers, and running them one at
 * a time leads (about two thirds of what is allocated).  One copy running: the others are leftovers, not loops, and
 * the staircase is a growth again */
static void concurrent_loops(void **state)
{
    (void)state;
    static struct og_hist_ev ev[48];
    staircase_of_passes(ev, 4 * GiB);
    for (int running = 2; running >= 1; running--) {
        og_record_t *r = base();
        r->history.events = ev;
        r->history.nevents = 48;
        og_set(&r->event.requested_bytes, 512 * MiB);
        fixture_roles(r, 3 * GiB, 0, 2 * GiB, 0, 0, 1 * GiB);
        fixture_model(r, "DebertaV2ForSequenceClassification", 1 * GiB, 3, false);
        fixture_model_held(r, 1, running, "model");
        fixture_optimizer(r, "AdamW", 2 * GiB);
        fixture_phase(r, "forward", "/w/tune.py", "forward");
        og_set(&r->device.free_bytes, 256 * MiB);
        r->memory.fw.grad_enabled = 1;
        run(r);
        const og_role_facts_t *k = &r->analysis.facts.roles;
        if (running == 2) {
            assert_int_equal(k->concurrent_copies, 2 * GiB);
            assert_int_equal(k->concurrent_runs, 2);
            assert_int_equal(k->concurrent_count, 3);
            assert_int_equal(k->model_copies, 0);
            assert_true(r->analysis.facts.growth.concurrent_loops);
            assert_false(has_cause(r, "growth"));
            assert_string_equal(r->remedies[0].id, "fewer_workers");
            assert_true(how_has(&r->remedies[0], "n_jobs=1"));
            assert_non_null(strstr(r->remedies[0].why, "3 copies of DebertaV2ForSequenceClassification"));
        } else {
            assert_int_equal(k->concurrent_copies, 0);
            assert_int_equal(k->model_copies, 2 * GiB);
            assert_false(r->analysis.facts.growth.concurrent_loops);
            assert_string_equal(r->diagnosis.primary, "growth");
            assert_int_equal(rank_of(r, "fewer_workers"), 0);
        }
        free(r);
    }
}

/* a replay buffer (a holder of purpose dataset, local in main) grows until the card is full: keeping it in host
 * memory leads, its bytes the growth's holder's; the same holder without the purpose is a leak to release */
static void growing_dataset_to_host(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 19 * GiB, 0);
    fixture_holder(r, "replay", "deque", "local in main (rl.py:40)", 19 * GiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "growth");
    assert_int_equal(rank_of(r, "dataset_on_cpu"), 0);
    fixture_holder_says(r, "dataset", "");
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    assert_non_null(strstr(r->remedies[0].why, "growing as it fills"));
    free(r);
}

/* a prefill of a 42k-token tool output in a hand-written agent loop: the failing statement makes the logits of every
 * position (logits = logits.float(), 20 GiB) beside the weights and a DynamicCache; the decoding step reads the last
 * position's, so asking for those leads, estimated at the request; a statement named otherwise, or a pass with
 * autograd on (a training forward needs every position's logits), gets no such remedy */
static void all_position_logits_of_a_prefill(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 44 * GiB);
    fixture_roles(r, 15 * GiB, 0, 0, 0, 6 * GiB, 10 * GiB);
    fixture_holder(r, "self.key_cache", "list", "on DynamicCache", 6 * GiB);
    fixture_purpose(r, "kv_cache");
    fixture_statement(r, "logits", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "logits, float");
    fixture_phase(r, "evaluation", "agent.py", "forward");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 20 * GiB);
    og_set(&r->device.free_bytes, 10 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.stmt_logits);
    assert_string_equal(r->remedies[0].id, "only_needed_outputs");
    assert_true(how_has(&r->remedies[0], "logits_to_keep=1"));
    static const char *const named[] = { "lm_logits", "out.logits" };
    for (size_t i = 0; i < 2; i++) {
        fixture_statement(r, named[i], "");
        r->memory.fw.roles.stmt_names[0] = 0;
        run(r);
        assert_true(r->analysis.facts.roles.stmt_logits);
    }
    fixture_statement(r, "logit_scale", ""); /* a name that merely starts so is not the logits */
    run(r);
    assert_false(r->analysis.facts.roles.stmt_logits);
    assert_int_equal(rank_of(r, "only_needed_outputs"), 0);
    fixture_statement(r, "logits", "");
    r->memory.fw.grad_enabled = 1;
    run(r);
    assert_int_equal(rank_of(r, "only_needed_outputs"), 0);
    free(r);
}

/* a full-batch graph network's message passing makes a per-edge tensor three times the card: sampled subgraphs (the
 * graph's size) lead, ahead of tiling the one operation; the same request in an image convolution is split */
static void graph_messages_sample_the_graph(void **state)
{
    (void)state;
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 40 * GiB);
    fixture_roles(r, 64 * MiB, 0, 128 * MiB, 0, 0, 14 * GiB);
    fixture_optimizer(r, "Adam", 128 * MiB);
    fixture_operation(r, "graph_messages", "forward");
    fixture_phase(r, "forward", "/w/gat.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 120 * GiB);
    og_set(&r->device.free_bytes, 24 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "cap_input_size");
    assert_true(ranked_by(&r->remedies[0], "graph_messages_lead"));
    assert_true(how_has(&r->remedies[0], "NeighborLoader"));
    fixture_operation(r, "conv", "forward");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_false(ranked_by(rem(r, "cap_input_size"), "graph_messages"));
    free(r);
}

/* a training step's logits for every position upcast before the loss (logits = logits.float(), 37 GiB of a 64k-token
 * packed row over a 152k vocabulary): the loss is not on the stack yet, and a fused or chunked loss never makes them
 * whole, so it leads, estimated at the request; the same statement with autograd off (an evaluation) is not this */
static void training_logits_before_the_loss(void **state)
{
    (void)state;
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    fixture_roles(r, 14 * GiB, 0, 0, 0, 0, 31 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    fixture_statement(r, "logits", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "torch, empty, tokens, VOCAB");
    fixture_phase(r, "forward", "/w/sft.py", "forward");
    r->memory.fw.training = 1;
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 37 * GiB);
    og_set(&r->device.free_bytes, 31 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.stmt_logits);
    assert_string_equal(r->remedies[0].id, "fused_cross_entropy");
    assert_true(ranked_by(&r->remedies[0], "training_logits_lead"));
    assert_non_null(strstr(r->remedies[0].why, "the model's logits for every position ("));
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = -1;
    run(r);
    assert_false(ranked_by(rem(r, "fused_cross_entropy"), "training_logits"));
    free(r);
}

/* a generation engine a local of main() holds (vLLM's LLM as `llm`: its model and a KV cache it reserved up front)
 * while the scorer loads (rm = ...from_pretrained, the model built in the library's own frames: none running, no
 * name yet): its cache is a reservation whose size is a setting, first, and freeing the engine follows; not while
 * the KV cache is the one the statement reserves, nor, with no name assigned, for a nameless model */
static void engine_kept_while_the_scorer_loads(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    fixture_roles(r, 22 * GiB, 0, 0, 0, 56 * GiB, 0);
    fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "llm");
    fixture_model(r, "LlamaForSequenceClassification", 7 * GiB, 1, false);
    fixture_holder(r, "llm", "LLM", "local in main (best_of_n.py:470)", 56 * GiB);
    fixture_purpose(r, "kv_cache");
    fixture_statement(r, "rm", "");
    fixture_phase(r, "loading", "modeling_utils.py", "from_pretrained");
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 28 * MiB);
    run_primary(r, "does_not_fit");
    const og_role_facts_t *k = &r->analysis.facts.roles;
    assert_int_equal(k->arriving, 7 * GiB);                   /* the one model no name holds: the scorer arriving */
    assert_int_equal(k->other_resident, 15 * GiB + 56 * GiB); /* the engine's model and what `llm` keeps */
    assert_int_equal(k->kv_bytes, 56 * GiB);                  /* the cache kept beside the load, not the load's own */
    assert_int_equal(k->local_held, 0);
    /* the engine's own setting first (it may still serve), then freeing it */
    assert_string_equal(r->remedies[0].id, "smaller_kv_cache");
    assert_true(rank_of(r, "one_model_at_a_time") >= 2 && rank_of(r, "one_model_at_a_time") <= 3);
    assert_true(how_has(rem(r, "one_model_at_a_time"), "del llm;"));
    assert_int_equal(rank_of(r, "release_references"), 0);
    /* the scorer of the engine's own class: two models of one class, named_copies reads them, not this */
    snprintf(r->memory.fw.roles.models[1].cls, sizeof r->memory.fw.roles.models[1].cls, "LlamaForCausalLM");
    run(r);
    assert_int_equal(r->analysis.facts.roles.other_resident, 0);
    snprintf(r->memory.fw.roles.models[1].cls, sizeof r->memory.fw.roles.models[1].cls,
             "LlamaForSequenceClassification");
    /* the statement reserving that cache (a server's start-up): the reservation in progress stays the running code's */
    fixture_statement(r, "rm", "kv_cache");
    run(r);
    assert_int_equal(r->analysis.facts.roles.kv_bytes, 0);
    assert_int_equal(r->analysis.facts.roles.local_held, 56 * GiB);
    /* no name assigned by the statement: nothing says the nameless model is the one arriving */
    fixture_statement(r, "", "");
    run(r);
    assert_int_equal(r->analysis.facts.roles.arriving, 0);
    assert_int_equal(r->analysis.facts.roles.other_resident, 0);
    free(r);
}

/* a generation building step by step (a beam search keeping a vocabulary-sized score tensor per step in generate()'s
 * own locals) whose request finds its bytes in the cache only in pieces: an earlier, shorter generation's peak does
 * not bound this one, so the pass outgrows the splinters (does_not_fit) rather than their layout (fragmentation);
 * and what rose per step is not called the KV cache where no KV cache holds it */
static void generation_outgrows_an_earlier_peak(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "out", "list", "local in generate (lm.py:40)", 15 * GiB);
    fixture_phase(r, "generation", "lm.py", "generate");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->device.free_bytes, 256 * MiB);
    r->memory.fw.reserved_bytes += GiB; /* cached, in pieces of at most 384 MiB */
    r->memory.fw.largest_free_block_bytes = 384 * MiB;
    og_set(&r->memory.fw.peak_bytes, r->memory.fw.allocated_bytes + GiB);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.growth.gen_built);
    assert_false(r->analysis.facts.held_before);
    assert_string_equal(evt_of(r, "does_not_fit", "basis"), "pass_outgrows_cache");
    assert_true(has_cause(r, "fragmentation"));
    assert_null(strstr(rem(r, "shorter_sequences")->why, "KV cache holds"));
    /* the same per-step rise held by a KV cache is called one */
    fixture_purpose(r, "kv_cache");
    run_primary(r, "does_not_fit");
    assert_non_null(strstr(rem(r, "shorter_sequences")->why, "KV cache holds"));
    /* a generation whose steps were not seen building (no history) is not known to outrun the earlier peak, which
     * stands: fragmentation */
    r->history.nevents = 0;
    run_primary(r, "fragmentation");
    assert_false(r->analysis.facts.growth.gen_built);
    assert_true(r->analysis.facts.held_before);
    free(r);
}

/* memory rising token by token within one generation (its KV cache, held by generate()'s own locals), autograd off:
 * the generation's working set, not a leak: fewer sequences, fewer new tokens or beams lead, then the cache's kind */
static void generation_kv_growth(void **state)
{
    for (int named_by_phase = 0; named_by_phase < 2; named_by_phase++) {
        og_record_t *r = base();
        leaking_steps(r);
        fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
        fixture_holder(r, named_by_phase ? "out" : "past_key_values", "list", "local in generate (lm.py:40)", 15 * GiB);
        if (named_by_phase)
            fixture_phase(r, "generation", "lm.py", "generate");
        else
            fixture_purpose(r, "kv_cache");
        r->memory.fw.grad_enabled = -1;
        og_set(&r->device.free_bytes, 256 * MiB);
        /* read in a generate() frame, held by its locals: one generation building up, not a growth */
        run_primary(r, named_by_phase ? "does_not_fit" : "growth");
        assert_int_equal(r->analysis.facts.growth.gen_built, named_by_phase);
        assert_string_equal(r->remedies[0].id, "smaller_batch");
        assert_string_equal(r->remedies[1].id, "shorter_sequences");
        assert_true(how_has(&r->remedies[1], "max_new_tokens"));
        assert_true(how_has(&r->remedies[1], "num_beams"));
        assert_true(named_by_phase ? rank_of(r, "release_references") == 0 : rank_of(r, "release_references") > 2);
        assert_int_equal(rank_of(r, "smaller_kv_cache"), named_by_phase ? 3 : 4);
        assert_int_equal(rank_of(r, "inference_mode"), 0);
        free(r);
    }
    /* a beam search (the adapter read num_beams from the generation's frames): fewer beams first */
    {
        og_record_t *r = base();
        leaking_steps(r);
        fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
        fixture_holder(r, "past_key_values", "list", "local in generate (lm.py:40)", 15 * GiB);
        fixture_purpose(r, "kv_cache");
        fixture_phase(r, "generation", "lm.py", "generate");
        r->memory.fw.roles.num_beams = 12;
        r->memory.fw.grad_enabled = -1;
        og_set(&r->device.free_bytes, 256 * MiB);
        run_primary(r, "does_not_fit");
        assert_string_equal(r->remedies[0].id, "fewer_beams");
        assert_true(how_has(&r->remedies[0], "num_beams=4"));
        assert_non_null(strstr(r->remedies[0].why, "4 beams keep 4/12 of it; 1 (greedy or sampling) keeps 1/12."));
        assert_string_equal(r->remedies[1].id, "smaller_batch");
        /* the generate() call was given 612 images at once (roles.generation_input): chunks of them lead, ahead of
         * fewer beams, and say how many; token ids (a length of their own) leave the beams first */
        snprintf(r->memory.fw.roles.gen_input, sizeof r->memory.fw.roles.gen_input, "pixel_values");
        r->memory.fw.roles.gen_dims = 4;
        memcpy(r->memory.fw.roles.gen_shape, (uint64_t[]){ 612, 3, 384, 384 }, 4 * sizeof(uint64_t));
        run_primary(r, "does_not_fit");
        assert_true(r->analysis.facts.roles.gen_fixed_inputs);
        assert_string_equal(r->remedies[0].id, "smaller_batch");
        assert_non_null(strstr(r->remedies[0].why, "decodes 612 inputs at once (x 12 beams: 7344 sequences)"));
        assert_true(how_has(&r->remedies[0], "pixel_values.split(16)"));
        assert_string_equal(r->remedies[1].id, "fewer_beams");
        snprintf(r->memory.fw.roles.gen_input, sizeof r->memory.fw.roles.gen_input, "input_ids");
        r->memory.fw.roles.gen_dims = 2;
        run_primary(r, "does_not_fit");
        assert_false(r->analysis.facts.roles.gen_fixed_inputs);
        assert_int_equal(r->analysis.facts.roles.gen_inputs, 612);
        assert_string_equal(r->remedies[0].id, "fewer_beams");
        r->memory.fw.roles.gen_dims = 0;
        r->memory.fw.roles.num_beams = 4; /* 4 beams: only greedy or sampling is fewer */
        run_primary(r, "does_not_fit");
        assert_non_null(strstr(rem(r, "fewer_beams")->why, "1 beam (greedy or sampling) keeps 1/4 of it."));
        r->memory.fw.roles.num_beams = 1; /* greedy: no beams to drop */
        run_primary(r, "does_not_fit");
        assert_int_equal(rank_of(r, "fewer_beams"), 0);
        free(r);
    }
    /* no steps read at all, the adapter read a generation and its KV cache holds the missing bytes: the same */
    {
        og_record_t *r = base();
        fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
        fixture_holder(r, "past_key_values", "list", "local in generate (lm.py:40)", 15 * GiB);
        fixture_purpose(r, "kv_cache");
        fixture_phase(r, "generation", "lm.py", "generate");
        r->memory.fw.grad_enabled = -1;
        run_primary(r, "does_not_fit");
        assert_string_equal(r->remedies[0].id, "smaller_batch");
        assert_string_equal(r->remedies[1].id, "shorter_sequences");
        assert_int_equal(rank_of(r, "smaller_kv_cache"), 3);
        free(r);
    }
    /* the same growth in a training job (an optimizer step ran): a leak, release_references leads */
    og_record_t *r = base();
    leaking_steps(r);
    fixture_roles(r, 4 * GiB, 0, 0, 0, 16 * GiB, 0);
    fixture_holder(r, "past_key_values", "list", "global in train.py", 15 * GiB);
    fixture_purpose(r, "kv_cache");
    r->memory.fw.training = 1;
    run_primary(r, "growth");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_int_equal(rank_of(r, "smaller_kv_cache"), 0);
    free(r);
}

/* ------------------------------------------------------------------ the host's timing moves nothing */

/* The shapes of history the jitter test replays: GENERATION a batched generate() after its weights (fp32, 15 GiB in
 * 30 shards back to back), its prefill, then one 64 MiB block of KV cache kept a token, the tokens slowing from 0.3
 * to 0.85 ms apart as the context grows (a run of gaps rising smoothly through the 0.8 ms a pause takes), failing for
 * the next block; with the adapter (phase generation, the cache a local of generate(), autograd off) or without;
 * GENERATION_PACED the same with the adapter, its tokens 3 to 8 ms apart (a model's decoding step);
 * LOOP a training loop on a warm cache that keeps three 128 MiB blocks an iteration (back to back, 40 us apart), then
 * 12 ms of work: only the kept blocks reach the driver, its pauses are its steps; LEAK a loop that allocates a 512
 * MiB temporary, keeps 96 MiB and frees the temporary, 50 ms an iteration. */
enum jitter_shape { JS_GENERATION, JS_GENERATION_NO_ADAPTER, JS_GENERATION_PACED, JS_LOOP, JS_LEAK, JS_COUNT };

/* xorshift64*: the draws are the same on every libc */
static uint64_t jitter_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* 2^U for U in [-1, 1] (the series of e^(U ln 2): no libm in the analysis units) */
static double jitter_factor(double u)
{
    double x = u * 0.6931471805599453, term = 1, sum = 1;
    for (int k = 1; k < 20; k++)
        sum += term *= x / k;
    return sum;
}

/* the shape's history into R, each gap between events multiplied by a factor in [0.5, 2] (2^u, u uniform in
 * [-1, 1]: as likely halved as doubled) drawn from SEED; SEED 0: as the program ran on a quiet host */
static void jitter_history(og_record_t *r, enum jitter_shape shape, uint64_t seed)
{
    static struct og_hist_ev plan[512];
    int n = 0;
    uint64_t live = 0;
    double t = 0.001;
#define PLAN(dt, o, b)                                                                        \
    do {                                                                                      \
        t += (dt);                                                                            \
        live = (o) == OG_OP_ALLOC ? live + (b) : (o) == OG_OP_FREE ? live - (b) : live;       \
        plan[n++] = (struct og_hist_ev){ .t_rel = t, .op = (o), .bytes = (b), .live = live }; \
    } while (0)
    if (shape <= JS_GENERATION_PACED) {
        double pace = shape == JS_GENERATION_PACED ? 10 : 1;
        for (int i = 0; i < 30; i++)
            PLAN(0.00002, OG_OP_ALLOC, 512 * MiB); /* the weights */
        PLAN(0.0002, OG_OP_ALLOC, 2 * GiB);        /* the prompts' prefill */
        PLAN(0.00003, OG_OP_ALLOC, 512 * MiB);
        PLAN(0.004, OG_OP_ALLOC, 16 * MiB); /* the first token's logits */
        for (int k = 0; live + 64 * MiB <= 23 * GiB + 448 * MiB; k++)
            PLAN((0.0003 + 0.00055 * k / 92.0) * pace, OG_OP_ALLOC, 64 * MiB); /* one block of KV cache a token */
        PLAN(0.00085, OG_OP_FAIL, 64 * MiB);
    } else if (shape == JS_LOOP) {
        PLAN(0, OG_OP_ALLOC, 8 * GiB); /* the model */
        for (int s = 0; s < 25; s++)
            for (int k = 0; k < 3; k++)
                PLAN(k ? 0.00004 : 0.012, OG_OP_ALLOC, 128 * MiB);
        PLAN(0.012, OG_OP_FAIL, 128 * MiB);
    } else {
        PLAN(0, OG_OP_ALLOC, 8 * GiB);
        for (int s = 0; s < 30; s++) {
            PLAN(0.03, OG_OP_ALLOC, 512 * MiB);
            PLAN(0.01, OG_OP_ALLOC, 96 * MiB);
            PLAN(0.01, OG_OP_FREE, 512 * MiB);
        }
        PLAN(0.03, OG_OP_FAIL, 512 * MiB);
    }
#undef PLAN
    ev_reset(r);
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    double at = 0;
    for (int i = 0; i < n; i++) {
        double gap = plan[i].t_rel - (i ? plan[i - 1].t_rel : 0);
        if (seed)
            gap *= jitter_factor((double)(jitter_next(&s) >> 11) / 9007199254740992.0 * 2 - 1);
        at += gap;
        FIXTURE_EV[r->history.nevents] = plan[i];
        FIXTURE_EV[r->history.nevents++].t_rel = at;
    }
    r->event.t_rel = at;
    og_set(&r->event.requested_bytes, plan[n - 1].bytes);
    og_set(&r->memory.process_tracked_bytes, live);
    r->memory.framework_bytes = live;
    og_set(&r->device.free_bytes, 40 * MiB);
}

/* the shape's record, diagnosed and ranked */
static og_record_t *jitter_run(enum jitter_shape shape, uint64_t seed)
{
    og_record_t *r = base();
    jitter_history(r, shape, seed);
    if (shape == JS_GENERATION || shape == JS_GENERATION_PACED) {
        uint64_t params = 15 * GiB, held = r->memory.framework_bytes - params;
        og_roles_t *ro = fixture_roles(r, params, 0, 0, 0, held, 0);
        ro->has_dtypes = true;
        ro->ndtypes = 1;
        snprintf(ro->dtypes[0].dtype, sizeof ro->dtypes[0].dtype, "float32");
        ro->dtypes[0].bytes = params;
        fixture_holder(r, "cache", "list", "local in generate (gen.py:50)", held);
        fixture_phase(r, "generation", "gen.py", "generate");
        r->memory.fw.grad_enabled = -1;
        r->memory.fw.freed_known = true;
        r->memory.fw.freed_bytes_total = 26 * GiB; /* each token's temporaries */
    }
    run(r);
    return r;
}

/* what the analysis concluded: the causes, the growth's and the load's facts, the remedies in order */
static void jitter_answer(const og_record_t *r, char *out, size_t cap)
{
    const og_facts_t *f = &r->analysis.facts;
    const og_growth_facts_t *g = &f->growth;
    size_t n = (size_t)snprintf(out, cap, "causes:");
    for (int i = 0; i < r->diagnosis.ncauses && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, " %s", r->diagnosis.causes[i].id);
    if (n < cap)
        n += (size_t)snprintf(
            out + n, cap - n,
            "\ngrowth: holds %d marker %d size %llu seen %ld steps %d rising %d/%d per_step %llu rise %llu"
            " low %llu..%llu load %d x %llu pass %d state %d since %d gen %d %llu %llu..%llu"
            "\nload: %d run %d earlier %d\nremedies:",
            g->holds, (int)g->marker, (unsigned long long)g->size, g->seen, g->steps, g->rising, g->transitions,
            (unsigned long long)g->per_step, (unsigned long long)g->rise, (unsigned long long)g->first_low,
            (unsigned long long)g->last_low, g->load_steps, (unsigned long long)g->load_step_bytes, g->pass_built,
            g->state_built, g->since_step, g->gen_built, (unsigned long long)g->gen_per_step,
            (unsigned long long)g->gen_first, (unsigned long long)g->gen_last, (int)f->load.phase, f->load.run,
            f->load.earlier);
    for (int i = 0; i < r->nremedies && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, " %s", r->remedies[i].id);
}

/* The same allocations give the same answer however the host timed them: each shape replayed 200 times with every
 * gap drawn anew in [0.5, 2] times the program's own (seeded) must give the quiet host's causes, growth and load
 * facts and remedies, in order.  What each shape is read as: the generation's blocks one burst (back to back at a
 * typical gap under 0.8 ms, however many of the last gaps pass it): no step, no growth and no generation read from
 * them, with the adapter or without; at a decoding step's pace, every token a step: one generation building
 * (gen_built, not a growth); the loop's and the leak's steps (growth over 25 and 30 steps). */
static void timing_moves_no_answer(void **state)
{
    static char want[2048], got[2048];
    for (int shape = 0; shape < JS_COUNT; shape++) {
        og_record_t *r = jitter_run(shape, 0);
        const og_growth_facts_t *g = &r->analysis.facts.growth;
        switch (shape) {
        case JS_GENERATION:
        case JS_GENERATION_NO_ADAPTER:
            assert_false(g->holds || g->gen_built);
            assert_string_equal(r->diagnosis.primary, "does_not_fit");
            break;
        case JS_GENERATION_PACED: /* a loop of one block a token: one generation building, not a growth */
            assert_true(g->gen_built && !g->holds);
            assert_int_equal(g->gen_per_step, 64 * MiB);
            assert_string_equal(r->diagnosis.primary, "does_not_fit");
            break;
        case JS_LOOP:
            assert_true(g->holds);
            assert_int_equal(g->steps, 25);
            assert_int_equal(g->per_step, 3 * 128 * MiB);
            break;
        default:
            assert_true(g->holds);
            assert_int_equal(g->steps, 30);
        }
        jitter_answer(r, want, sizeof want);
        free(r);
        for (uint64_t seed = 1; seed <= 200; seed++) {
            r = jitter_run(shape, seed);
            jitter_answer(r, got, sizeof got);
            free(r);
            if (strcmp(want, got) != 0)
                fail_msg("shape %d, draw %llu:\n%s\nquiet host:\n%s", shape, (unsigned long long)seed, got, want);
        }
    }
}

/* a snapshot of the training state (deepcopy of state_dicts) made on the GPU with autograd on, outside
 * any step: keep it on the CPU or on disk, first; no activation remedy */
static void state_snapshot_first(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 7 * GiB + 512 * MiB, 0);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_holder(r, "best", "dict", "local in main (train.py:74)", 4 * GiB);
    fixture_holder(r, "out", "list", "local in deepcopy_state (train.py:50)", 3 * GiB + 512 * MiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "snapshot_to_cpu");
    assert_int_equal(rank_of(r, "ema_on_cpu"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    free(r);
    /* many times the whole state held by the running code's list (every example's gradient kept): not a
     * snapshot, and releasing what the list keeps comes first */
    r = base();
    fixture_roles(r, 512 * MiB, 512 * MiB, 0, 0, 22 * GiB, 0);
    fixture_holder(r, "per_example_grads", "list", "local in dp_step (train.py:90)", 22 * GiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "snapshot_to_cpu"), 0);
    free(r);
    /* less than one copy of the weights held by the running code: not a snapshot of the state */
    r = base();
    fixture_roles(r, 8 * GiB, 4 * GiB, 8 * GiB, 0, 3 * GiB, 0);
    fixture_holder(r, "got", "list", "local in step (train.py:50)", 3 * GiB);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "snapshot_to_cpu"), 0);
    free(r);
    /* copy.deepcopy(model) part way: its parameters and gradients are no module's yet (parameters and
     * gradients beyond the one model's), no local holds them: a snapshot still, first, saving what it copied */
    r = base();
    fixture_roles(r, 6 * GiB + 768 * MiB, 6 * GiB + 768 * MiB, 10 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 10 * GiB);
    fixture_model(r, "Encoder", 5 * GiB, 1, false);
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "snapshot_to_cpu");
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    assert_int_equal(rank_of(r, "mixed_precision"), 0);
    assert_non_null(strstr(r->remedies[0].why, "3.50 GiB copied so far from the model's 5.00 GiB"));
    /* snapshot = {k: v.clone() for k, v in model.state_dict().items()} after optimizer steps: the adapter said
     * loading from the statement alone (it builds a checkpoint), the comprehension's tensors are no holder's
     * (activations): a snapshot made, not a checkpoint restored; not map_location, not a second load */
    og_record_t *s = base();
    fixture_roles(s, 5 * GiB, 5 * GiB, 10 * GiB, 0, 0, 2 * GiB + 512 * MiB);
    fixture_optimizer(s, "AdamW", 10 * GiB);
    fixture_model(s, "Net", 5 * GiB, 1, false);
    fixture_phase(s, "loading", NULL, NULL);
    snprintf(s->memory.fw.phase_source, sizeof s->memory.fw.phase_source,
             "the failing statement reads model, state_dict, items (checkpoint)");
    fixture_statement(s, "snapshot", "checkpoint");
    s->memory.fw.grad_enabled = 1;
    s->memory.fw.training = 1;
    run_primary(s, "does_not_fit");
    assert_string_equal(s->remedies[0].id, "snapshot_to_cpu");
    assert_int_equal(rank_of(s, "map_location_cpu"), 0);
    assert_int_equal(rank_of(s, "restart_process"), 0);
    assert_int_equal(rank_of(s, "smaller_batch"), 0);
    /* weights_before = [p.clone() for p in model.parameters()]: no purpose in the names, the copy no holder's,
     * but the activations' blocks copy the parameters (roles.activations_copy_of): a snapshot still */
    s->memory.fw.phase[0] = 0;
    s->memory.fw.roles.has_statement = false;
    snprintf(s->memory.fw.roles.act_copy_of, sizeof s->memory.fw.roles.act_copy_of, "parameters");
    s->memory.fw.roles.act_copy_bytes = 2 * GiB + 256 * MiB;
    run_primary(s, "does_not_fit");
    assert_string_equal(s->remedies[0].id, "snapshot_to_cpu");
    assert_int_equal(rank_of(s, "smaller_batch"), 0);
    s->memory.fw.roles.act_copy_of[0] = 0; /* plain activations: no copy seen */
    run_primary(s, "does_not_fit");
    assert_int_equal(rank_of(s, "snapshot_to_cpu"), 0);
    fixture_phase(s, "loading", NULL, NULL);
    fixture_statement(s, "snapshot", "checkpoint");
    s->memory.fw.training = 1;
    /* before any optimizer step the same statement restores a checkpoint, where Python holds tensors on the device
     * (the restored dict); with nothing held there it copies a state dict from the host into the parameters, and
     * map_location has nothing to move */
    s->memory.fw.training = 0;
    run_primary(s, "does_not_fit");
    assert_int_equal(rank_of(s, "map_location_cpu"), 0);
    og_set(&s->memory.fw.roles.bytes[OG_ROLE_held_by_python], 2 * GiB);
    og_set(&s->memory.fw.roles.bytes[OG_ROLE_activations], 512 * MiB);
    run_primary(s, "does_not_fit");
    assert_int_equal(rank_of(s, "snapshot_to_cpu"), 0);
    assert_true(rank_of(s, "map_location_cpu") > 0);
    og_set(&s->memory.fw.roles.bytes[OG_ROLE_held_by_python], 0);
    og_set(&s->memory.fw.roles.bytes[OG_ROLE_activations], 2 * GiB + 512 * MiB);
    /* ... unless a deep copy is running that has made part of its copy on the device (best_state =
     * copy.deepcopy(model.state_dict()) with an optimizer no step hook reads): it copies, it loads nothing */
    fixture_operation(s, "copy", "deepcopy");
    og_set(&s->memory.fw.roles.copy_made, 2 * GiB);
    run_primary(s, "does_not_fit");
    assert_true(s->analysis.facts.snapshot_stmt);
    assert_string_equal(s->remedies[0].id, "snapshot_to_cpu");
    assert_int_equal(rank_of(s, "map_location_cpu"), 0);
    og_set(&s->memory.fw.roles.copy_made, 0); /* nothing copied yet: the statement's word stands */
    run_primary(s, "does_not_fit");
    assert_false(s->analysis.facts.snapshot_stmt);
    free(s);
    /* the same parameters all in the one model (none beyond it): no copy seen */
    r->memory.fw.roles.models[0].bytes = 6 * GiB + 768 * MiB;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "snapshot_to_cpu"), 0);
    free(r);
}

/* a copy.deepcopy under way that made many times the cache (facts: copy_outgrows_cache): the splinters' remedies
 * cannot carry it (tier 3: never in the lead); a snapshot of the optimizer's state being deep-copied leads with
 * snapshot_to_cpu.  A copy that rebinds a name holding a model of its own (ref = copy.deepcopy(policy) while the
 * previous ref lives: roles.copy_replaces) leads with an in-place update and dropping the old copy first; no
 * restart, no snapshot */
static void copy_under_way(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 44 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 0, 8 * GiB, 0, 4 * GiB, 7 * GiB);
    r->memory.fw.reserved_bytes += 486 * MiB;
    r->memory.fw.largest_free_block_bytes = 12 * MiB;
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_model(r, "Llama", 4 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "model");
    fixture_holder(r, "weights", "list", "local in on_train_batch_end (train.py:77)", 4 * GiB);
    snprintf(r->memory.fw.roles.act_copy_of, sizeof r->memory.fw.roles.act_copy_of, "optimizer_state");
    r->memory.fw.roles.act_copy_bytes = 7 * GiB;
    fixture_operation(r, "copy", "deepcopy");
    og_set(&r->memory.fw.roles.copy_made, 7 * GiB);
    fixture_statement(r, "optim_state", "");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "snapshot_to_cpu");
    for (int i = 0; i < 3 && i < r->nremedies; i++) {
        assert_string_not_equal(r->remedies[i].id, "expandable_segments");
        assert_string_not_equal(r->remedies[i].id, "empty_cache");
        assert_string_not_equal(r->remedies[i].id, "bucket_by_length");
    }
    free(r);
    r = base();
    og_set(&r->event.requested_bytes, 40 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 12 * GiB, 4 * GiB, 8 * GiB, 0, 0, 0);
    r->memory.fw.reserved_bytes += 196 * MiB;
    r->memory.fw.largest_free_block_bytes = 16 * MiB;
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_model(r, "Llama", 4 * GiB, 2, false);
    fixture_model_held(r, 2, 0, "policy,ref");
    fixture_model(r, "Module", 176 * MiB, 17, false);
    fixture_operation(r, "copy", "__deepcopy__");
    og_set(&r->memory.fw.roles.copy_made, 3 * GiB);
    fixture_statement(r, "ref", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "copy,deepcopy,policy,eval");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "in_place_update");
    assert_string_equal(r->remedies[1].id, "release_references");
    assert_true(how_has(&r->remedies[0], "ref.load_state_dict(policy.state_dict())"));
    assert_true(how_has(&r->remedies[1], "del ref"));
    assert_int_equal(rank_of(r, "restart_process") > 0 && rank_of(r, "restart_process") <= 3, 0);
    assert_int_equal(rank_of(r, "snapshot_to_cpu"), 0);
    assert_int_equal(rank_of(r, "smaller_batch"), 0);
    /* the statement binds a new name (best = copy.deepcopy(model)): not a replacement; a snapshot again */
    fixture_statement(r, "best", "");
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "in_place_update"), 0);
    /* a loop's copies, each kept: beside base, the copy qmodel holds and one more that no name holds (a results
     * list keeps them); the refresh is the latest of many: the loop keeps a copy an iteration (growth by copies) and
     * dropping the kept copies is the fix, not an update in place of the latest */
    r->memory.fw.roles.nmodels = 0;
    fixture_model(r, "Llama", 4 * GiB, 2, false);
    fixture_model_held(r, 1, 0, "base");
    fixture_model(r, "Llama", 4 * GiB, 1, false);
    fixture_model_held(r, 0, 0, "qmodel");
    fixture_model(r, "Module", 176 * MiB, 17, false);
    fixture_statement(r, "qmodel", "");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "copy,deepcopy,base");
    r->memory.fw.grad_enabled = 0;
    r->memory.fw.training = 0;
    run_primary(r, "growth");
    assert_string_equal(evt_of(r, "growth", "step_marker"), "kept_copies");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(how_has(&r->remedies[0], "del qmodel"));
    assert_true(rank_of(r, "in_place_update") != 1);
    /* no copy of base beyond the one qmodel holds (the results list keeps numbers): the refresh again */
    r->memory.fw.roles.models[0].count = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "in_place_update");
    free(r);
}

/* a dataset kept whole on the GPU (a global holder of purpose dataset) holds the missing bytes in a training
 * pass: keep it in host memory first; as a local of the running loop (one batch) or short of the shortfall: no */
static void dataset_kept_on_the_gpu(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 100 * MiB, 0, 0, 0, 12 * GiB, 8 * GiB);
    fixture_optimizer(r, "SGD", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 100 * MiB);
    fixture_holder(r, "train_images", "Tensor", "global in train.py", 11 * GiB);
    fixture_holder_says(r, "dataset", "");
    fixture_holder(r, "val_images", "Tensor", "global in train.py", 1 * GiB);
    fixture_holder_says(r, "dataset", "");
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.autocast = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    assert_non_null(strstr(r->remedies[0].why, "train_images"));
    assert_true(how_has(&r->remedies[0], "train_images[idx].cuda(non_blocking=True)"));
    free(r);
    r = base();
    fixture_roles(r, 100 * MiB, 0, 0, 0, 12 * GiB, 8 * GiB);
    fixture_holder(r, "images", "list", "local in train (train.py:40)", 12 * GiB);
    fixture_holder_says(r, "dataset", "");
    fixture_phase(r, "forward", "/w/train.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "dataset_on_cpu"), 0);
    free(r);
}

/* a dict kept across requests (self.prefix_cache on a service) holds earlier requests' KV prefixes, never evicted,
 * and the next prefill fails: the prefill's own growth reads as a generation's working set, yet the map holds far
 * more than that rise, so bounding it leads; the same map no larger than the rise, or named as a dataset: not */
static void cache_kept_across_calls(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.free_bytes, 20 * MiB);
    og_set(&r->event.requested_bytes, 24 * MiB);
    fixture_roles(r, 8 * GiB, 0, 0, 0, 14 * GiB + 512 * MiB, 0);
    fixture_holder(r, "self.prefix_cache", "dict", "on ChatService", 13 * GiB);
    fixture_holder_says(r, "cache", "");
    fixture_holder(r, "self.key_cache", "list", "on DynamicCache", 768 * MiB);
    fixture_holder_says(r, "kv_cache", "");
    fixture_holder(r, "self.value_cache", "list", "on DynamicCache", 768 * MiB);
    fixture_holder_says(r, "kv_cache", "");
    fixture_phase(r, "generation", "/w/chat.py", "generate");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.keeper, 0);
    assert_string_equal(r->remedies[0].id, "bounded_cache");
    assert_non_null(strstr(r->remedies[0].why, "self.prefix_cache (dict, on ChatService) keeps 13.00 GiB"));
    /* the map at the byte budget its object names: bounded already, no cache to bound first */
    og_set(&r->memory.fw.roles.holders[0].bound_bytes, 13 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.bounded, 0);
    assert_int_not_equal(rank_of(r, "bounded_cache"), 1);
    og_unset(&r->memory.fw.roles.holders[0].bound_bytes);
    /* the same map of a dataset's tensors: not a cache to bound */
    fixture_holder_says(r, "", "");
    snprintf(r->memory.fw.roles.holders[0].purpose, sizeof r->memory.fw.roles.holders[0].purpose, "dataset");
    snprintf(r->memory.fw.roles.holders[1].purpose, sizeof r->memory.fw.roles.holders[1].purpose, "kv_cache");
    snprintf(r->memory.fw.roles.holders[2].purpose, sizeof r->memory.fw.roles.holders[2].purpose, "kv_cache");
    run_primary(r, "does_not_fit");
    assert_int_not_equal(rank_of(r, "bounded_cache"), 1);
    free(r);
}


/* a similarity over a compound library, outside any model: no parameters, no pass (a Python stack, phase unknown),
 * the statement's sizes rows x library (8192 x 1600000), 48 GiB asked beside 48 GiB of the operation's earlier
 * temporaries on an 80 GiB card: blocks of fewer rows lead, the block sized from the free memory (512 rows); with
 * parameters on the device (a model's pass) it is not this row */
static void loose_operation_in_blocks(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    og_set(&r->device.free_bytes, 15 * GiB);
    og_set(&r->event.requested_bytes, 48 * GiB);
    fixture_roles(r, 0, 0, 0, 0, 12 * GiB, 48 * GiB);
    r->memory.fw.npy_frames = 2;
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_statement = true;
    snprintf(ro->stmt.file, sizeof ro->stmt.file, "/w/butina.py");
    snprintf(ro->stmt.function, sizeof ro->stmt.function, "neighbours");
    ro->stmt.line = 57;
    snprintf(ro->stmt_target, sizeof ro->stmt_target, "union");
    snprintf(ro->stmt_names, sizeof ro->stmt_names, "torch,empty,rows,n");
    snprintf(ro->stmt_ints, sizeof ro->stmt_ints, "8192,1600000");
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.loose_operation);
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(ranked_by(&r->remedies[0], "loose_operation_lead"));
    assert_non_null(strstr(r->remedies[0].why, "sizes 8192 x 1600000"));
    assert_true(how_has(&r->remedies[0], "range(0, n, 512)"));
    og_set(&ro->bytes[OG_ROLE_parameters], 2 * GiB);
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.roles.loose_operation);
    free(r);
}

/* a score computed over data with no model on the device (an ensemble's pairwise differences: 58 GiB asked beside
 * 59 GiB of temporaries on an 80 GiB card), every role of a model's state measured at 0 B: nothing to quantize,
 * offload or shard is listed; with a model's weights on the device they are */
static void no_model_state_no_weight_remedies(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    og_set(&r->device.free_bytes, 20 * GiB);
    og_set(&r->event.requested_bytes, 58 * GiB);
    fixture_roles(r, 0, 0, 0, 0, 0, 59 * GiB);
    r->memory.fw.npy_frames = 2;
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.state_known);
    assert_int_equal(rank_of(r, "quantization"), 0);
    assert_int_equal(rank_of(r, "cpu_offload"), 0);
    assert_int_equal(rank_of(r, "zero_fsdp"), 0);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_parameters], 30 * GiB);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 29 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "quantization") > 0 || rank_of(r, "cpu_offload") > 0);
    free(r);
}

/* the failing statement copies a holder whole (torch.cat(self.bank_chunks): the request is what the list holds):
 * gathering the pieces in host memory, or building the result in place, leads, named with the statement's line; a request that is not the holder's
 * size, a holder whose name says a dataset, or a load, is no such copy */
static void statement_copies_a_holder(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 10 * GiB);
    og_set(&r->device.free_bytes, 5 * GiB);
    fixture_roles(r, 3 * GiB, 1 * GiB, 3 * GiB, 0, 10 * GiB, 150 * MiB);
    fixture_holder(r, "self.bank_chunks", "list", "on KNNMonitor", 10 * GiB);
    r->memory.fw.roles.holders[0].tensors = 1220;
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_statement = true;
    snprintf(ro->stmt.file, sizeof ro->stmt.file, "/w/knn.py");
    snprintf(ro->stmt.function, sizeof ro->stmt.function, "build_bank");
    ro->stmt.line = 154;
    snprintf(ro->stmt_target, sizeof ro->stmt_target, "bank");
    snprintf(ro->stmt_names, sizeof ro->stmt_names, "torch,cat,self,bank_chunks");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.stmt_copies, 0);
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    assert_string_equal(r->remedies[0].title, "Gather the pieces in host memory, or build the result in place");
    assert_true(ranked_by(&r->remedies[0], "statement_copies_holder_lead"));
    assert_non_null(strstr(r->remedies[0].why, "knn.py:154"));
    assert_non_null(strstr(r->remedies[0].why, "a copy of what self.bank_chunks (list, on KNNMonitor) holds (1220"));
    assert_true(how_has(&r->remedies[0], "self.bank_chunks.append(t.cpu())"));
    og_set(&r->event.requested_bytes, 8 * GiB); /* not the holder's size: another tensor */
    run(r);
    assert_int_equal(r->analysis.facts.roles.stmt_copies, -1);
    og_set(&r->event.requested_bytes, 10 * GiB);
    fixture_holder_says(r, "dataset", "");
    run(r);
    assert_int_equal(r->analysis.facts.roles.stmt_copies, -1);
    fixture_holder_says(r, "", "");
    fixture_phase(r, "loading", "/w/load.py", "load_state_dict");
    run(r);
    assert_int_equal(r->analysis.facts.roles.stmt_copies, -1);
    free(r);
}

/* feature shards torch.load restored onto the GPU (no map_location: back where they were saved from) held in a list
 * that the failing statement concatenates: loading them to host memory leads (restored_held_lead), named with the
 * holder, the bytes restored and the loading line; restored bytes not measured, or none, leave the statement's own
 * row (dataset_on_cpu: gather the pieces in host memory) first */
static void restored_by_torch_load(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 45 * GiB);
    og_set(&r->event.requested_bytes, 36 * GiB);
    og_set(&r->device.free_bytes, 8 * GiB);
    fixture_roles(r, 20 * MiB, 0, 0, 0, 36 * GiB, 0);
    fixture_holder(r, "shards", "list", "local in main (probe.py:79)", 36 * GiB);
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_statement = true;
    snprintf(ro->stmt.file, sizeof ro->stmt.file, "/w/probe.py");
    snprintf(ro->stmt.function, sizeof ro->stmt.function, "main");
    ro->stmt.line = 79;
    snprintf(ro->stmt_target, sizeof ro->stmt_target, "X");
    snprintf(ro->stmt_names, sizeof ro->stmt_names, "cat,shards");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.restored_holder, -1);
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    og_role_holder_t *h = &ro->holders[0];
    og_set(&h->restored, 36 * GiB);
    h->has_restored_site = true;
    snprintf(h->restored_site.file, sizeof h->restored_site.file, "/w/probe.py");
    snprintf(h->restored_site.function, sizeof h->restored_site.function, "<listcomp>");
    h->restored_site.line = 77;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.restored_holder, 0);
    assert_int_equal(r->analysis.facts.roles.restored_held, 36 * GiB);
    assert_string_equal(r->remedies[0].id, "map_location_cpu");
    assert_true(ranked_by(&r->remedies[0], "restored_held_lead"));
    assert_non_null(strstr(r->remedies[0].why, "that torch.load restored onto the GPU (probe.py:77)"));
    assert_non_null(strstr(r->remedies[0].why, "copies them whole"));
    assert_true(how_has(&r->remedies[0], "map_location=\"cpu\""));
    og_set(&h->restored, 0); /* watched, nothing restored: the statement's row */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.restored_holder, -1);
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    free(r);
}

/* a gradient-noise-scale measurement keeps every micro-batch's gradient in a list of the training loop (a local of
 * main() while backward runs): 40 GiB, more than the parameters, the optimizer state or the pass's activations:
 * releasing what it keeps leads, named; the same list as a local of the module's own forward (the pass's working
 * set), or with the activations unmeasured, is no such holder */
/* a document's pages staged whole on the device before the loop (a bare tensor a running function holds, of which
 * the generate() call gets a slice: the adapter names it a holder): keeping them in host memory and moving each batch
 * leads, not chunks of the call's inputs, which only make room beside them */
static void staged_inputs_not_the_call(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 22 * GiB + 512 * MiB);
    og_set(&r->event.requested_bytes, 1875 * MiB);
    og_set(&r->device.free_bytes, 588 * MiB);
    fixture_roles(r, 770 * MiB, 0, 0, 0, 17 * GiB + 140 * MiB, 3600 * MiB);
    fixture_holder(r, "pixel_values", "Tensor", "local in split_package (split.py:513)", 17 * GiB + 140 * MiB);
    fixture_phase(r, "generation", "split.py", "generate");
    r->memory.fw.grad_enabled = -1;
    snprintf(r->memory.fw.roles.gen_input, sizeof r->memory.fw.roles.gen_input, "pixel_values");
    r->memory.fw.roles.gen_dims = 4;
    memcpy(r->memory.fw.roles.gen_shape, (uint64_t[]){ 4, 3, 2560, 1920 }, 4 * sizeof(uint64_t));
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.roles.gen_fixed_inputs);
    assert_int_equal(r->analysis.facts.roles.dominant, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(ranked_by(&r->remedies[0], "dominant_holder_lead"));
    assert_true(how_has(&r->remedies[0], "pixel_values = pixel_values.cpu().pin_memory()"));
    assert_false(ranked_by(rem(r, "smaller_batch"), "generation_many_inputs_lead"));
    /* without the staged pages the call's inputs are what grows: chunks of them lead */
    r->memory.fw.roles.nholders = 0;
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_held_by_python], 0);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 20 * GiB + 700 * MiB);
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "smaller_batch");
    assert_true(ranked_by(&r->remedies[0], "generation_many_inputs_lead"));
    free(r);
    (void)state;
}

static void dominant_holder_first(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    og_set(&r->event.requested_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    fixture_roles(r, 4 * GiB, 0, 8 * GiB, 0, 40 * GiB, 26 * GiB);
    fixture_holder(r, "micro_grads", "list", "local in main (noise_scale.py:264)", 40 * GiB);
    r->memory.fw.roles.holders[0].tensors = 1960;
    fixture_phase(r, "backward", "/usr/lib/torch/autograd/__init__.py", "backward");
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.dominant, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(ranked_by(&r->remedies[0], "dominant_holder_lead"));
    assert_non_null(
        strstr(r->remedies[0].why, "micro_grads (list, local in main (noise_scale.py:264)) holds 40.00 GiB"));
    assert_true(how_has(&r->remedies[0], "micro_grads.append(t.detach().cpu())"));
    /* the pass's remedies only make room beside what the list keeps: none of them in the top three */
    for (int i = 0; i < 3 && i < r->nremedies; i++)
        assert_true(strcmp(r->remedies[i].id, "smaller_batch") && strcmp(r->remedies[i].id, "shorter_sequences") &&
                    strcmp(r->remedies[i].id, "gradient_checkpointing"));
    assert_true(rank_of(r, "smaller_batch") > 3);
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in forward (model.py:80)");
    run(r);
    assert_int_equal(r->analysis.facts.roles.dominant, -1);
    /* a helper the running forward called (its list of the tensors it concatenates): the pass's own, whether the
     * label kept its line or not; the same name not inside a forward on the failing stack: a holder */
    static const char *const helper[] = { "local in cat (gnn.py:52)", "local in cat (a_file_name_too_long_for_the_la" };
    r->memory.fw.npy_frames = 3;
    r->memory.fw.py_frames[0] = (og_py_frame_t){ .file = "/w/gnn.py", .line = 48, .function = "_f32" };
    r->memory.fw.py_frames[1] = (og_py_frame_t){ .file = "/w/gnn.py", .line = 52, .function = "cat" };
    r->memory.fw.py_frames[2] = (og_py_frame_t){ .file = "/w/gnn.py", .line = 142, .function = "forward" };
    for (int i = 0; i < 2; i++) {
        snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "%s", helper[i]);
        run(r);
        assert_int_equal(r->analysis.facts.roles.dominant, -1);
    }
    snprintf(r->memory.fw.py_frames[2].function, sizeof r->memory.fw.py_frames[2].function, "main");
    run(r);
    assert_int_equal(r->analysis.facts.roles.dominant, 0);
    r->memory.fw.npy_frames = 0;
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in main (noise_scale.py:264)");
    og_unset(&r->memory.fw.roles.bytes[OG_ROLE_activations]);
    run(r);
    assert_int_equal(r->analysis.facts.roles.dominant, -1);
    /* a training loop's `cache` of every batch, filled before epoch 1 (its name says cache): a caller's local that
     * outlives the steps is what the program keeps, whatever it is called; one named a KV cache is the pass's */
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 26 * GiB);
    snprintf(r->memory.fw.roles.holders[0].purpose, sizeof r->memory.fw.roles.holders[0].purpose, "cache");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.dominant, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    snprintf(r->memory.fw.roles.holders[0].purpose, sizeof r->memory.fw.roles.holders[0].purpose, "kv_cache");
    run(r);
    assert_int_equal(r->analysis.facts.roles.dominant, -1);
    free(r);
}

/* a hand-written DPO loop: ref_model.eval() but its parameters still require grad and no optimizer trains it; the
 * policy's forward fails with autograd on: running the reference under no_grad is in the top three, said of the
 * reference (untrained_ref); a reference an optimizer's reach was not measured for (trained unknown) is not */
static void reference_records_a_graph(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 48 * GiB);
    og_set(&r->event.requested_bytes, 1800 * MiB);
    og_set(&r->device.free_bytes, 900 * MiB);
    fixture_roles(r, 12 * GiB, 0, 0, 0, 0, 34 * GiB);
    fixture_model(r, "Qwen2ForCausalLM", 6 * GiB, 1, false);
    fixture_model_held(r, 1, 1, "policy,model");
    r->memory.fw.roles.models[0].trained = 1;
    fixture_model(r, "Qwen2ForCausalLM", 6 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "ref_model");
    fixture_model_says(r, "reference");
    r->memory.fw.roles.models[1].trained = 0;
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 6 * GiB);
    fixture_phase(r, "forward", "/w/dpo.py", "forward");
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_ref, 6 * GiB);
    int at = rank_of(r, "teacher_no_grad");
    assert_true(at >= 1 && at <= 3);
    assert_non_null(strstr(r->remedies[at - 1].why, "A reference or teacher model (6.00 GiB of parameters)"));
    r->memory.fw.roles.models[1].trained = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_ref, 0);
    assert_int_equal(rank_of(r, "teacher_no_grad"), 0);
    free(r);
}

/* DreamBooth with prior preservation: the SDXL pipeline that made the class images is still held while the same
 * weights train (a LoRA on the unet, the text encoders and VAE loaded again by the program's own names): its frozen
 * self.unet is a twin of the trained unet, not a preference-tuning reference; sharing the components (or freeing the
 * pipeline) leads.  One frozen twin alone (a DPO trainer's self.ref_model beside self.model) is no set: the
 * reference reading stays */
static void pipeline_kept_beside_training(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->event.requested_bytes, 2560 * MiB);
    og_set(&r->device.free_bytes, 850 * MiB);
    fixture_roles(r, 14 * GiB, 24 * MiB, 48 * MiB, 0, 0, 6 * GiB);
    fixture_model(r, "UNet2DConditionModel", 5 * GiB + 24 * MiB, 1, false);
    fixture_model_held(r, 1, 1, "unet");
    fixture_model(r, "UNet2DConditionModel", 5 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "self.unet");
    fixture_model(r, "CLIPTextModelWithProjection", 1300 * MiB, 1, true);
    fixture_model_held(r, 1, 0, "self.text_encoder_2");
    fixture_model(r, "CLIPTextModelWithProjection", 1300 * MiB, 1, true);
    fixture_model_held(r, 1, 0, "text_encoder_two");
    fixture_model(r, "CLIPTextModel", 240 * MiB, 2, true);
    fixture_model_held(r, 2, 0, "text_encoder_one,self.text_encoder");
    fixture_optimizer(r, "AdamW", 48 * MiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 24 * MiB);
    fixture_phase(r, "forward", "/w/train_dreambooth.py", "forward");
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.twin_groups, 3);
    assert_int_equal(r->analysis.facts.roles.twin_components, 5 * GiB + 1300 * MiB + 240 * MiB);
    assert_int_equal(r->analysis.facts.roles.reference_copy, 0);
    assert_string_equal(r->remedies[0].id, "share_pipeline_components");
    assert_true(ranked_by(&r->remedies[0], "pipeline_twins_lead"));
    assert_non_null(strstr(r->remedies[0].why, "3 frozen models held as attributes"));
    assert_int_equal(rank_of(r, "adapter_disabled_reference"), 0);
    /* the trainer's attribute twin alone: a reference on the base */
    r->memory.fw.roles.nmodels = 2;
    fixture_model_held(r, 1, 0, "self.ref_model");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.twin_components, 0);
    assert_int_equal(r->analysis.facts.roles.reference_copy, 5 * GiB);
    assert_string_equal(r->remedies[0].id, "adapter_disabled_reference");
    free(r);
}

/* a metric's list kept on an object holds many times the cached splinters (kept_outgrows_cache) when a 112 MiB request
 * fails in an evaluation: releasing what it keeps leads, named, with its own lines (a list: .cpu(), .item(),
 * clear()); expandable segments and empty_cache cannot carry it (tier 3).  One tensor kept whole is read a slice at
 * a time from host memory; a holder whose name says a dataset gets its own remedy, not this one; with no splinters
 * found (nothing cached) the holder is no reading of this row */
static void kept_holder_outgrows_the_splinters(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, 4 * GiB, 0);
    r->memory.fw.reserved_bytes += 226 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    fixture_phase(r, "evaluation", "/w/eval.py", "evaluate");
    r->memory.fw.grad_enabled = -1;
    fixture_holder(r, "self.detection_mask", "list", "on MeanAveragePrecision", 4 * GiB);
    r->memory.fw.roles.holders[0].tensors = 104;
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.kept_outgrows_cache);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(ranked_by(&r->remedies[0], "kept_holder_lead"));
    assert_non_null(strstr(r->remedies[0].why, "self.detection_mask (list, on MeanAveragePrecision) keeps 4.00 GiB"));
    assert_non_null(strstr(r->remedies[0].why, "104 tensors"));
    assert_true(how_has(&r->remedies[0], "self.detection_mask.append(t.detach().cpu())"));
    assert_true(rank_of(r, "expandable_segments") == 0 || rem(r, "expandable_segments")->ranking.tier == 3);
    snprintf(r->memory.fw.roles.holders[0].kind, sizeof r->memory.fw.roles.holders[0].kind, "Tensor");
    r->memory.fw.roles.holders[0].tensors = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_true(how_has(&r->remedies[0], "self.detection_mask[i:i + batch].cuda(non_blocking=True)"));
    fixture_holder_says(r, "dataset", "");
    run_primary(r, "does_not_fit");
    assert_false(ranked_by(rem(r, "release_references"), "kept_holder"));
    assert_string_equal(r->remedies[0].id, "dataset_on_cpu");
    /* DistributedDataParallel's reducer keeping its gradient buckets (roles.ddp): DDP's own, with its own remedy */
    fixture_holder_says(r, "", "");
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "on DistributedDataParallel");
    r->memory.fw.roles.ddp_wrappers = 1;
    r->memory.fw.roles.ddp_bucket_bytes = 4 * GiB;
    run(r);
    assert_false(ranked_by(rem(r, "release_references"), "kept_holder"));
    /* on the program's own subclass of it (class DDP(DistributedDataParallel)): the reducer's class says whose */
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "on DDP");
    run(r);
    assert_true(ranked_by(rem(r, "release_references"), "kept_holder"));
    snprintf(r->memory.fw.roles.holders[0].kind, sizeof r->memory.fw.roles.holders[0].kind, "Reducer");
    run(r);
    assert_false(ranked_by(rem(r, "release_references"), "kept_holder"));
    r->memory.fw.roles.ddp_wrappers = 0;
    r->memory.fw.roles.ddp_bucket_bytes = 0;
    run(r);
    assert_true(ranked_by(rem(r, "release_references"), "kept_holder"));
    fixture_holder_says(r, "", "");
    r->memory.fw.reserved_bytes -= 226 * MiB; /* nothing cached: no splinters to outgrow */
    r->memory.fw.largest_free_block_bytes = 0;
    run(r);
    assert_false(r->analysis.facts.kept_outgrows_cache && ranked_by(rem(r, "release_references"), "kept_holder"));
    assert_false(ranked_by(rem(r, "release_references"), "kept_holder"));
    free(r);
}

/* a search index kept on the GPU (an attribute of purpose index: a retriever's flat float32 vectors) beside a model
 * whose generation fails: move or compress the index first, named, its share of the process said; the same bytes
 * of no purpose, or a local of the running code: not this remedy */
static void index_kept_on_the_gpu(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.free_bytes, 100 * MiB);
    og_set(&r->event.requested_bytes, 600 * MiB);
    fixture_roles(r, 8 * GiB, 0, 0, 0, 12 * GiB, 3 * GiB);
    fixture_holder(r, "self.vectors", "Tensor", "on GpuFlatIndex", 12 * GiB);
    fixture_holder_says(r, "index", "");
    fixture_phase(r, "generation", "/w/rag.py", "generate");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.index_kept, 12 * GiB);
    assert_string_equal(r->remedies[0].id, "index_off_gpu");
    assert_non_null(strstr(r->remedies[0].why, "self.vectors (Tensor, on GpuFlatIndex) keeps 12.00 GiB"));
    assert_non_null(strstr(r->remedies[0].why, "beside 8.00 GiB of model weights"));
    assert_true(how_has(&r->remedies[0], "self.vectors = self.vectors.half()"));
    fixture_holder_says(r, "", "");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.index_kept, 0);
    assert_int_equal(rank_of(r, "index_off_gpu"), 0);
    free(r);
    r = base();
    og_set(&r->device.free_bytes, 100 * MiB);
    og_set(&r->event.requested_bytes, 600 * MiB);
    fixture_roles(r, 8 * GiB, 0, 0, 0, 12 * GiB, 3 * GiB);
    fixture_holder(r, "index", "Tensor", "local in search (rag.py:40)", 12 * GiB);
    fixture_holder_says(r, "index", "");
    fixture_phase(r, "generation", "/w/rag.py", "generate");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "index_off_gpu"), 0);
    free(r);
}

/* A second copy of weights the program keeps (facts: ema_kept, reference_copy, repeated_components, trained_kept):
 * what the copy is names the fix that leads; the same bytes without that evidence (a local being updated, a full
 * fine-tune's reference, one model group repeated, no optimizer state yet) do not bring it */
static void weights_copies_kept(void **state)
{
    /* an EMA shadow kept on its object between updates, in a backward pass 20 MiB short */
    og_record_t *r = base();
    fixture_roles(r, 3 * GiB + 512 * MiB, 1536 * MiB, 6 * GiB, 0, 3 * GiB, 8 * GiB);
    fixture_holder(r, "self.shadow_params", "list", "on EMAModel", 3 * GiB);
    fixture_holder_says(r, "ema", "parameters");
    fixture_model(r, "UNet2DConditionModel", 3 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "unet");
    fixture_optimizer(r, "AdamW", 6 * GiB);
    fixture_phase(r, "backward", "/w/train.py", "main");
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 204 * MiB);
    og_set(&r->device.free_bytes, 184 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.ema_kept, 3 * GiB);
    assert_string_equal(r->remedies[0].id, "ema_on_cpu");
    assert_non_null(strstr(r->remedies[0].why, "self.shadow_params (list, on EMAModel) keeps 3.00 GiB"));
    /* the same list as a local of the running update: an update under way, not a copy kept */
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in update (train.py:80)");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.ema_kept, 0);
    assert_string_not_equal(r->remedies[0].id, "ema_on_cpu");
    /* an EMA model (its names say ema), not running */
    fixture_model(r, "UNet2DConditionModel", 3 * GiB, 1, true);
    fixture_model_held(r, 1, 0, "ema_unet");
    fixture_model_says(r, "ema");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.ema_kept, 3 * GiB);
    assert_string_equal(r->remedies[0].id, "ema_on_cpu");
    assert_non_null(strstr(r->remedies[0].why, "ema_unet keeps 3.00 GiB"));
    free(r);

    /* a DPO reference beside a policy training adapters on a base of its size; the loss fails 2.2 GiB short */
    r = base();
    fixture_roles(r, 27 * GiB + 256 * MiB, 0, 0, 0, 0, 10 * GiB);
    fixture_model(r, "PeftModel", 13 * GiB + 768 * MiB, 1, false);
    fixture_model_held(r, 1, 0, "policy,model");
    fixture_model(r, "MistralForCausalLM", 13 * GiB + 512 * MiB, 1, true);
    fixture_model_held(r, 1, 0, "frozen");
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 256 * MiB);
    fixture_operation(r, "cross_entropy", "log_softmax");
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1800 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.reference_copy, 13 * GiB + 512 * MiB);
    assert_true(r->analysis.facts.roles.reference_base);
    assert_string_equal(r->remedies[0].id, "adapter_disabled_reference");
    assert_non_null(strstr(r->remedies[0].why, "(frozen) holds 13.50 GiB"));
    /* a full fine-tune: the policy's optimizer trains all of it; the reference is a model of its own */
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 13 * GiB + 768 * MiB);
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.roles.reference_base);
    assert_int_equal(rank_of(r, "adapter_disabled_reference"), 0);
    /* ... whose names say reference: its log-probabilities first, then freed (one model at a time), or adapters */
    fixture_model_says(r, "reference");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.reference_copy, 13 * GiB + 512 * MiB);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    assert_non_null(strstr(r->remedies[0].why, "The reference model (frozen) holds 13.50 GiB"));
    /* a buffer kept across calls larger than the reference (rollouts never trimmed) is the cause, not it */
    fixture_holder(r, "self.rollouts", "list", "on PPOTrainer", 16 * GiB);
    run_primary(r, "does_not_fit");
    assert_string_not_equal(r->remedies[0].id, "one_model_at_a_time");
    free(r);

    /* three pipelines each loaded the same components (self.unet, self.text_encoder on three objects) */
    r = base();
    fixture_roles(r, 3 * (5 * GiB + GiB), 0, 0, 0, 0, 200 * MiB);
    fixture_model(r, "UNet2DConditionModel", 5 * GiB, 3, true);
    fixture_model_held(r, 3, 1, "self.unet");
    fixture_model(r, "CLIPTextModel", GiB, 3, true);
    fixture_model_held(r, 3, 0, "self.text_encoder");
    fixture_phase(r, "evaluation", "/w/app.py", "forward");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 2560 * MiB);
    og_set(&r->device.free_bytes, 2400 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.repeated_components, 2 * (5 * GiB + GiB));
    assert_int_equal(r->analysis.facts.roles.repeated_count, 3);
    assert_string_equal(r->remedies[0].id, "share_pipeline_components");
    assert_non_null(strstr(r->remedies[0].why, "UNet2DConditionModel (self.unet)"));
    /* the same pipelines held by three globals: each component named by the path that reaches it, one attribute of
     * each; a name that is no attribute (a variable of its own) is not a pipeline's component */
    fixture_model_held_n(r, 0, 3, 1, "pipe_a.unet,pipe_b.unet,pipe_c.unet");
    fixture_model_held_n(r, 1, 3, 0, "pipe_a.text_encoder,pipe_b.text_encoder,pipe_c.text_encoder");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.repeated_components, 2 * (5 * GiB + GiB));
    fixture_model_held_n(r, 1, 3, 0, "pipe_a.text_encoder,pipe_b.vae,pipe_c.text_encoder");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.repeated_components, 0);
    fixture_model_held_n(r, 1, 3, 0, "text_encoder,pipe_b.text_encoder,pipe_c.text_encoder");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.repeated_components, 0);
    fixture_model_held_n(r, 1, 3, 0, "self.text_encoder");
    /* one model repeated alone (two wrappers of a class each holding a model: perhaps different weights) */
    r->memory.fw.roles.nmodels = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.repeated_components, 0);
    assert_int_equal(rank_of(r, "share_pipeline_components"), 0);
    free(r);

    /* a base model loading for a merge while the trained adapter model and its optimizer state live on */
    r = base();
    fixture_roles(r, 22 * GiB, 0, 1600 * MiB, 0, 0, 0);
    fixture_model(r, "Gemma2ForCausalLM", 15 * GiB, 1, false);
    fixture_model_held(r, 0, 1, "");
    fixture_model(r, "PeftModel", 7 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "model,self.model");
    fixture_optimizer(r, "AdamW", 1600 * MiB);
    fixture_phase(r, "loading", "/w/merge.py", "from_pretrained");
    og_set(&r->event.requested_bytes, 378 * MiB);
    og_set(&r->device.free_bytes, 360 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 7 * GiB + 1600 * MiB);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    assert_non_null(strstr(r->remedies[0].why, "trained PeftModel (model,self.model)"));
    /* the trained model of the base's own class (a QLoRA LlamaForCausalLM, its adapters inside): a load of that class
     * beside one an optimizer stepped on is still the finished training kept, not a second copy; one no optimizer
     * stepped on yet is a copy arriving (model_copies' own) */
    og_cpy(r->memory.fw.roles.models[1].cls, sizeof r->memory.fw.roles.models[1].cls, "Gemma2ForCausalLM",
           sizeof "Gemma2ForCausalLM");
    r->memory.fw.roles.models[1].trained = r->memory.fw.roles.models[1].stepped = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 7 * GiB + 1600 * MiB);
    r->memory.fw.roles.models[1].stepped = 0;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    r->memory.fw.roles.models[1].stepped = -1;
    /* before any optimizer state: the second model is part of the job's setup (a teacher, a reward model) */
    r->memory.fw.roles.bytes[OG_ROLE_optimizer_state] = fx_opt(0);
    r->memory.fw.roles.optimizers[0].bytes = 0;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    free(r);
}

/* an evaluation with autograd on inside a training job: every activation kept for a backward that never
 * comes; no_grad / inference_mode first, though the job trains */
static void evaluation_with_autograd_on(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 18 * GiB);
    fixture_optimizer(r, "AdamW", 2 * GiB);
    fixture_phase(r, "evaluation", "/srv/train.py", "evaluate");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "inference_mode");
    free(r);
    /* the same in a forward pass of training: not offered */
    r = base();
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 18 * GiB);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    free(r);
}

/* the same evaluation with autograd on, where the optimizer's parameters are 10x every model's (an explainer's masks
 * trained through a model in eval mode): the gradients are the job, inference mode is not offered; at 2x the
 * models' (fp32 master weights beside a bf16 model) it is */
static void optimizer_trains_no_model_keeps_autograd(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB, 1 * GiB, 4 * GiB, 0, 0, 14 * GiB);
    fixture_model(r, "GraphSAGE", 200 * MiB, 1, false);
    fixture_optimizer(r, "Adam", 4 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 2 * GiB);
    fixture_phase(r, "evaluation", "/srv/explain.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 0;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.opt_outside, 2 * GiB);
    assert_int_equal(rank_of(r, "inference_mode"), 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 400 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.opt_outside, 0);
    assert_string_equal(r->remedies[0].id, "inference_mode");
    free(r);
}

/* an evaluation after training with its gradients and AdamW's state alive (a notebook's evaluation cell after fit):
 * freeing them leads; a forward pass of training uses them: not offered; an evaluation of a job that made no
 * gradients or optimizer state: not offered either */
static void evaluation_frees_training_state(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 0, 5 * GiB);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_phase(r, "evaluation", "/tmp/ipykernel_2817/1203466271.py", "forward");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "free_training_state");
    free(r);
    /* an evaluation that generates with beams, its cache 40 GiB so far (a local of the running code) beside 12 GiB of
     * training state: freeing the state carries it a few layers further, it does not lead */
    r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 40 * GiB, 2 * GiB);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_holder(r, "next_cache", "list", "local in forward (led.py:175)", 40 * GiB);
    fixture_phase(r, "generation", "/w/led.py", "generate");
    r->memory.fw.grad_enabled = 0;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_not_equal(rank_of(r, "free_training_state"), 1);
    assert_true(rank_of(r, "free_training_state") > 0);
    free(r);
    r = base();
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 0, 5 * GiB);
    fixture_optimizer(r, "AdamW", 8 * GiB);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "free_training_state"), 0);
    free(r);
    r = base();
    fixture_roles(r, 4 * GiB, 0, 0, 0, 0, 13 * GiB);
    fixture_phase(r, "evaluation", "/srv/eval.py", "forward");
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "free_training_state"), 0);
    free(r);
}

/* a small model (33 MiB of weights) upscaling one huge image under no_grad: offloading the model or sharding its
 * state moves at most what the model holds, far less than the 3.5 GiB missing: both come after what can cover (a
 * bigger card); a 12 GiB model beside the same activations: offloading it covers the missing bytes */
static void offload_moves_only_the_model(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 33 * MiB, 0, 0, 0, 0, 9 * GiB);
    fixture_phase(r, "evaluation", "/w/upscale.py", "forward");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 8 * GiB + 600 * MiB);
    og_set(&r->device.free_bytes, 5 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "cpu_offload") == 0 || rank_of(r, "cpu_offload") > rank_of(r, "bigger_gpu"));
    assert_true(rank_of(r, "zero_fsdp") == 0 || rank_of(r, "zero_fsdp") > rank_of(r, "bigger_gpu"));
    fixture_roles(r, 12 * GiB, 0, 0, 0, 0, 9 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "cpu_offload") > 0 && rank_of(r, "cpu_offload") < rank_of(r, "bigger_gpu"));
    free(r);
}

/* the same upscaler, one image (batch 1) through a network with no attention layer: more GPUs split only the model's
 * 33 MiB, so splitting the model is not in the top three; a batch of 8 (data parallelism splits it), or a model with
 * attention layers (tensor parallelism splits their heads), keeps it among what can cover */
static void multi_gpu_splits_only_the_state_of_one_sample(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 33 * MiB, 0, 0, 0, 0, 9 * GiB);
    fixture_phase(r, "evaluation", "/w/upscale.py", "forward");
    r->memory.fw.grad_enabled = -1;
    r->memory.fw.roles.batch_size = 1;
    og_set(&r->memory.fw.roles.attention_modules, 0);
    og_set(&r->event.requested_bytes, 8 * GiB + 600 * MiB);
    og_set(&r->device.free_bytes, 5 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "multi_gpu_parallelism") == 0 || rank_of(r, "multi_gpu_parallelism") > 3);
    r->memory.fw.roles.batch_size = 8;
    run_primary(r, "does_not_fit");
    assert_in_range(rank_of(r, "multi_gpu_parallelism"), 1, 3);
    r->memory.fw.roles.batch_size = 1;
    og_set(&r->memory.fw.roles.attention_modules, 24);
    run_primary(r, "does_not_fit");
    assert_in_range(rank_of(r, "multi_gpu_parallelism"), 1, 3);
    free(r);
}

/* a notebook's second experiment in its first forward while the first's model (named, not running) and the AdamW
 * state its optimizer made live on: one model at a time, first; negative controls: the running model's optimizer has
 * stepped too (a GAN after its first iteration), the kept model's has not stepped, the kept one is a copy of the
 * running one (class and size), or not measured (an older adapter) */
/* the trained model kept while another loads, reached only by attributes of other objects (a trainer's, a pipeline's:
 * the program's own name of it deleted): dropping those references leads (facts: trained_by_others); the model
 * arriving runs no forward, so it is no teacher to run under no_grad; its dtype, not the kept adapters' float32,
 * sizes a half-precision load */
static void trained_model_kept_by_other_objects(void **state)
{
    (void)state;
    og_record_t *r = base();
    fixture_roles(r, 21 * GiB + 600 * MiB, 0, 104 * MiB, 0, 0, 0);
    fixture_model(r, "MistralForCausalLM", 8 * GiB, 1, false);
    fixture_model_held(r, 1, 1, "model");
    r->memory.fw.roles.models[0].trained = 0;
    og_set(&r->memory.fw.roles.models[0].fp32, 0);
    fixture_model(r, "PeftModelForCausalLM", 13 * GiB + 512 * MiB, 1, false);
    fixture_model_held(r, 1, 0, "trainer.model,trainer.model_wrapped");
    r->memory.fw.roles.models[1].trained = r->memory.fw.roles.models[1].stepped = 1;
    og_set(&r->memory.fw.roles.models[1].fp32, 52 * MiB);
    fixture_optimizer(r, "AdamW", 104 * MiB);
    fixture_phase(r, "loading", "/w/nb.py", "from_pretrained");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 90 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 13 * GiB + 512 * MiB + 104 * MiB);
    assert_true(r->analysis.facts.roles.trained_by_others);
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    assert_true(r->analysis.facts.roles.arriving_fp32_known);
    assert_int_equal(r->analysis.facts.roles.arriving_fp32, 0);
    assert_string_equal(r->remedies[0].id, "release_references");
    assert_non_null(strstr(r->remedies[0].how[0], "del trainer "));
    assert_string_equal(r->remedies[1].id, "one_model_at_a_time");
    assert_int_equal(rank_of(r, "teacher_no_grad"), 0);
    assert_true(rank_of(r, "load_in_bf16") == 0 || rank_of(r, "load_in_bf16") > 3);
    /* a name of the program's own (or of the running object) still holds it: one model at a time leads */
    fixture_model_held_n(r, 1, 1, 0, "model,trainer.model");
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.roles.trained_by_others);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    fixture_model_held_n(r, 1, 1, 0, "self.model");
    run_primary(r, "does_not_fit");
    assert_false(r->analysis.facts.roles.trained_by_others);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    free(r);
}

static void finished_training_beside_the_next(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 2 * GiB + 1200 * MiB + 2400 * MiB, 1200 * MiB, 2400 * MiB, 0, 0, 5 * GiB);
    fixture_model(r, "VisionTransformer", 1200 * MiB, 1, false);
    fixture_model_held(r, 1, 0, "vit");
    fixture_model(r, "ConvNeXt", 800 * MiB, 1, false);
    fixture_model_held(r, 1, 1, "convnext,model");
    r->memory.fw.roles.models[0].trained = r->memory.fw.roles.models[1].trained = 1;
    r->memory.fw.roles.models[0].stepped = 1;
    r->memory.fw.roles.models[1].stepped = 0;
    fixture_optimizer(r, "AdamW", 2400 * MiB);
    fixture_phase(r, "forward", "/w/hw3.py", "forward");
    og_set(&r->event.requested_bytes, 600 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 1200 * MiB + 1200 * MiB + 2400 * MiB);
    assert_string_equal(r->remedies[0].id, "one_model_at_a_time");
    assert_non_null(strstr(r->remedies[0].why, "trained VisionTransformer (vit)"));
    r->memory.fw.roles.models[1].stepped = 1; /* both have stepped: a GAN's two models */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    r->memory.fw.roles.models[1].stepped = 0;
    r->memory.fw.roles.models[0].stepped = 0; /* the kept one's optimizer made no state */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    r->memory.fw.roles.models[0].stepped = 1;
    r->memory.fw.roles.models[1].stepped = -1; /* not measured */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    r->memory.fw.roles.models[1].stepped = 0;
    og_cpy(r->memory.fw.roles.models[1].cls, sizeof r->memory.fw.roles.models[1].cls, "VisionTransformer",
           sizeof "VisionTransformer");
    r->memory.fw.roles.models[1].bytes = 1200 * MiB; /* a copy of the kept one running */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 0);
    r->memory.fw.roles.models[1].bytes = 800 * MiB; /* the same class, another size: not a copy */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.trained_kept, 1200 * MiB + 1200 * MiB + 2400 * MiB);
    free(r);
}

/* weight snapshots for averaging kept across steps in a list on the trainer (a copy of the parameters by their sizes,
 * no purpose in their name) while the next step's forward fails: snapshots to the CPU, first; a caller's local holding
 * them while the pass runs too; negative controls: a local while no pass runs (the copy being made), a holder named an
 * EMA (its own remedy), a job known to be inference */
static void copies_kept_across_steps(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 5 * GiB + 600 * MiB, 5 * GiB + 600 * MiB, 11 * GiB + 128 * MiB, 0, 11 * GiB + 128 * MiB,
                  10 * GiB + 600 * MiB);
    fixture_optimizer(r, "AdamW", 11 * GiB + 128 * MiB);
    fixture_holder(r, "self.lawa_buffer", "deque", "on Trainer", 11 * GiB + 128 * MiB);
    fixture_holder_says(r, "", "parameters");
    fixture_phase(r, "forward", "/w/pretrain.py", "forward");
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 300 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.copy_kept, 11 * GiB + 128 * MiB);
    assert_string_equal(r->remedies[0].id, "snapshot_to_cpu");
    assert_non_null(strstr(r->remedies[0].why, "self.lawa_buffer"));
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "local in main");
    run_primary(r, "does_not_fit"); /* a caller's local while a pass runs: kept beside it */
    assert_int_equal(r->analysis.facts.roles.copy_kept, 11 * GiB + 128 * MiB);
    fixture_phase(r, "", NULL, NULL); /* no pass runs: the running code is making the copy */
    run(r);
    assert_int_equal(r->analysis.facts.roles.copy_kept, 0);
    fixture_phase(r, "forward", "/w/pretrain.py", "forward");
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "global in train.py");
    fixture_phase(r, "ema_update", "/w/pretrain.py", "update_ema"); /* an average being updated: its own rows */
    run(r);
    assert_int_equal(r->analysis.facts.roles.copy_kept, 0);
    fixture_phase(r, "forward", "/w/pretrain.py", "forward");
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where, "on Trainer");
    fixture_holder_says(r, "ema", "parameters");
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.copy_kept, 0);
    assert_string_equal(r->remedies[0].id, "ema_on_cpu");
    fixture_holder_says(r, "", "parameters");
    fixture_roles(r, 5 * GiB + 600 * MiB, 0, 0, 0, 11 * GiB + 128 * MiB, 10 * GiB + 600 * MiB);
    r->memory.fw.roles.noptimizers = 0;
    r->memory.fw.training = -1; /* inference only */
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "snapshot_to_cpu") != 1);
    free(r);
}

/* a frozen teacher in a training job with autograd on: run it under no_grad, first; autograd off: not offered */
static void teacher_with_autograd_on(void **state)
{
    og_record_t *r = base();
    fixture_roles(r, 0, 0, 0, 0, 23 * GiB + 512 * MiB, 0);
    fixture_holder(r, "student", "list", "global in distill.py", 8 * GiB);
    fixture_holder(r, "teacher", "list", "global in distill.py", 6 * GiB);
    fixture_purpose(r, "teacher");
    fixture_holder(r, "t_acts", "list", "global in distill.py", 6 * GiB);
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "teacher_no_grad");
    assert_non_null(strstr(r->remedies[0].why, "6.00 GiB"));
    r->memory.fw.grad_enabled = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(rank_of(r, "teacher_no_grad"), 0);
    free(r);
    /* a frozen model alone (maybe a GAN's discriminator the gradient flows through): listed, not first */
    r = base();
    fixture_roles(r, 6 * GiB, 2 * GiB, 4 * GiB, 0, 0, 11 * GiB + 512 * MiB);
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->models[0].cls, sizeof ro->models[0].cls, "Discriminator");
    ro->models[0].bytes = 4 * GiB;
    ro->models[0].count = 1;
    ro->models[0].frozen = true;
    ro->nmodels = 1;
    r->memory.fw.grad_enabled = 1;
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "teacher_no_grad") > 1);
    free(r);
    /* a running copy of the student that still requires grad, which no optimizer trains (measured: trained 0, the
     * student's group trained 1): its graph is for nothing, freeze it first; trained by its own optimizer (a GAN's
     * discriminator), or not known: not first */
    r = base();
    fixture_roles(r, 2 * GiB, 1 * GiB, 2 * GiB, 0, 0, 18 * GiB);
    fixture_optimizer(r, "AdamW", 2 * GiB);
    fixture_model(r, "ViTLarge", 1 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "student");
    r->memory.fw.roles.models[0].trained = 1;
    fixture_model(r, "ViTLarge", 1 * GiB, 1, false);
    fixture_model_held(r, 1, 1, "teacher_net");
    r->memory.fw.roles.models[1].trained = 0;
    fixture_phase(r, "forward", "/w/ibot.py", "forward");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 1 * GiB);
    assert_string_equal(r->remedies[0].id, "teacher_no_grad");
    assert_true(how_has(&r->remedies[0], "requires_grad_(False)"));
    r->memory.fw.roles.models[1].trained = 1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    assert_true(rank_of(r, "teacher_no_grad") != 1);
    r->memory.fw.roles.models[1].trained = -1;
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    r->memory.fw.roles.models[1].trained = 0;
    r->memory.fw.roles.models[1].running = 0; /* kept, not running now: its forward is not what fails */
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    /* running again, the optimizer's parameters measured: the student's 1 GiB, what the student holds: the teacher
     * is untrained; a flat partition no model holds (ZeRO's fp32 shard: 512 MiB, every model trained 0): which model
     * it trains is not measured, none is known untrained */
    r->memory.fw.roles.models[1].running = 1;
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 1 * GiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 1 * GiB);
    r->memory.fw.roles.models[0].trained = 0;
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 512 * MiB);
    run_primary(r, "does_not_fit");
    assert_int_equal(r->analysis.facts.roles.untrained_running, 0);
    assert_true(rank_of(r, "teacher_no_grad") != 1);
    free(r);
}

/* a refusal by the framework's own cap where the device itself has no room for the request: raising the
 * cap cannot make it fit, so it does not lead */
static void cap_without_room_not_first(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 5 * GiB, 5 * GiB, 0);
    r->memory.fw.internal_oom = true;
    og_set(&r->memory.fw.cap_bytes, 10 * GiB + 800 * MiB);
    strcpy(r->memory.fw.framework, "pytorch");
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.45)");
    r->memory.fw.grad_enabled = -1;
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 6 * GiB);
    run_primary(r, "framework_cap");
    assert_string_not_equal(r->remedies[0].id, "raise_framework_cap");
    assert_true(rank_of(r, "raise_framework_cap") == 0 || rank_of(r, "raise_framework_cap") > 3);
    /* room on the device: raising the cap is the first fix */
    og_set(&r->device.free_bytes, 12 * GiB);
    run_primary(r, "framework_cap");
    assert_string_equal(r->remedies[0].id, "raise_framework_cap");
    free(r);
}

/* the cap refused inside the framework with the device's room to spare while the history also reads as growth
 * and the cache as splinters: the cap is the cause, what chases a leak, splinters or other processes comes after
 * every way to raise the cap or shrink the job */
static void cap_with_room_no_leak_hunt(void **state)
{
    og_record_t *r = base();
    leaking_steps(r);
    fixture_adapter(r, 9 * GiB + 500 * MiB, 9 * GiB, 100 * MiB);
    r->memory.fw.internal_oom = true;
    og_set(&r->memory.fw.cap_bytes, 9 * GiB + 600 * MiB);
    strcpy(r->memory.fw.framework, "pytorch");
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.4)");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    og_set(&r->device.free_bytes, 14 * GiB);
    run_primary(r, "framework_cap");
    assert_string_equal(r->remedies[0].id, "raise_framework_cap");
    static const char *const chase[] = { "release_references", "restart_process", "empty_cache", "expandable_segments",
                                         "foreign_processes" };
    for (size_t i = 0; i < sizeof chase / sizeof *chase; i++)
        assert_true(rank_of(r, chase[i]) == 0 || rank_of(r, chase[i]) > 3);
    free(r);
}

/* the cap refused with room on the device, on a card where NVML lists other users' processes: the cap is this
 * job's share, and raising it (listed, its text saying whose memory it takes) comes after every way to fit under
 * it; the same card with no other process, or with one whose holding the free memory covers beside the request:
 * raising it leads */
static void cap_on_shared_gpu(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 80 * GiB);
    fixture_roles(r, 3 * GiB, 0, 0, 0, 0, 15 * GiB);
    r->memory.fw.internal_oom = true;
    og_set(&r->memory.fw.cap_bytes, 20 * GiB);
    strcpy(r->memory.fw.framework, "pytorch");
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.25)");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    og_set(&r->event.requested_bytes, 2 * GiB + 512 * MiB);
    og_set(&r->device.free_bytes, 22 * GiB);
    run_primary(r, "framework_cap");
    assert_string_equal(r->remedies[0].id, "raise_framework_cap");
    fixture_other(r, 48213, "python3", 18 * GiB)->visible = true;
    fixture_other(r, 51877, "python3", 21 * GiB)->visible = true;
    run_primary(r, "framework_cap");
    assert_string_not_equal(r->remedies[0].id, "raise_framework_cap");
    assert_true(rank_of(r, "raise_framework_cap") > 3);
    assert_non_null(strstr(rem(r, "raise_framework_cap")->why, "Other processes hold 39.00 GiB"));
    assert_true(rank_of(r, "mixed_precision") <= 3 && rank_of(r, "smaller_batch") <= 4);
    /* one co-tenant of 9.5 GiB on a card with 51 GiB free: the free memory less the request still holds what it
     * holds, so the cap is no share of a partitioned card: raising it leads again */
    r->memory.nother = 0;
    og_unset(&r->memory.other_processes_bytes);
    fixture_other(r, 41877, "python3", 9 * GiB + 512 * MiB)->visible = true;
    og_set(&r->device.free_bytes, 51 * GiB);
    run_primary(r, "framework_cap");
    assert_string_equal(r->remedies[0].id, "raise_framework_cap");
    assert_false(ranked_by(&r->remedies[0], "cap_on_shared_gpu"));
    og_set(&r->device.free_bytes, 11 * GiB); /* less the request, 8.5 GiB: under the co-tenant's */
    run_primary(r, "framework_cap");
    assert_true(rank_of(r, "raise_framework_cap") > 3);
    free(r);
}

/* a cap the job's state at its optimizer steps alone exceeds (weights 6, gradients 6, AdamW's moments 12 GiB to come:
 * 24 GiB under a 20 GiB OOMGUARD_LIMIT) on an 80 GiB card that holds that state and the pass (~36 GiB): no batch fits
 * under the cap and the card holds the job, so raising the cap leads, asking for the whole need, its cost saying no
 * other process holds memory on the card; the same job on a 32 GiB card that cannot hold it either: the job's own
 * remedies first; the state under the cap (weights 2 GiB): fitting under it first; the framework's own cap (a
 * memory fraction) read the same way, its cost naming the other processes' room */
static og_record_t *capped_job(uint64_t params, uint64_t total, uint64_t free)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, total);
    fixture_roles(r, params, params / 2, 0, 0, 0, 10 * GiB);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, params);
    fixture_phase(r, "backward", NULL, NULL);
    r->memory.fw.grad_enabled = 1;
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, free);
    return r;
}
static void cap_not_the_card(void **state)
{
    uint64_t held = 6 * GiB + 3 * GiB + 10 * GiB;
    og_record_t *r = capped_job(6 * GiB, 80 * GiB, 60 * GiB);
    og_set(&r->device.limit_bytes, 20 * GiB);
    og_set(&r->device.limit_usage_bytes, held);
    r->event.caused_by_limit = true;
    run_primary(r, "limit");
    assert_string_equal(r->remedies[0].id, "raise_limit");
    assert_non_null(strstr(r->remedies[0].cost, "None measured"));
    assert_true(how_has(&r->remedies[0], "OOMGUARD_LIMIT=39GiB")); /* (24 + 10 + 1 GiB) + 10% */
    assert_non_null(strstr(r->remedies[0].why, "exceeds the cap"));
    free(r);
    r = capped_job(6 * GiB, 32 * GiB, 12 * GiB);
    og_set(&r->device.limit_bytes, 20 * GiB);
    og_set(&r->device.limit_usage_bytes, held);
    r->event.caused_by_limit = true;
    run_primary(r, "limit");
    assert_string_not_equal(r->remedies[0].id, "raise_limit");
    assert_null(strstr(rem(r, "raise_limit")->why, "exceeds the cap"));
    free(r);
    r = capped_job(2 * GiB, 80 * GiB, 60 * GiB);
    og_set(&r->device.limit_bytes, 20 * GiB);
    og_set(&r->device.limit_usage_bytes, 2 * GiB + 1 * GiB + 10 * GiB + 6 * GiB);
    og_set(&r->memory.process_tracked_bytes, 19 * GiB);
    r->event.caused_by_limit = true;
    run_primary(r, "limit");
    assert_string_not_equal(r->remedies[0].id, "raise_limit");
    free(r);
    /* the framework's cap on a card where another process holds 8 GiB and the rest has room for the job */
    r = capped_job(6 * GiB, 80 * GiB, 40 * GiB);
    r->memory.fw.internal_oom = true;
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->memory.fw.cap_bytes, 20 * GiB);
    strcpy(r->memory.fw.framework, "pytorch");
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.25)");
    fixture_other(r, 48213, "python3", 8 * GiB)->visible = true;
    run_primary(r, "framework_cap");
    assert_string_equal(r->remedies[0].id, "raise_framework_cap");
    assert_non_null(strstr(r->remedies[0].cost, "other processes measured"));
    assert_non_null(strstr(r->remedies[0].why, "exceeds the cap"));
    free(r);
}

/* two ranks of a torchrun job on a machine with one GPU (local_rank % device_count() puts both on GPU 0), rank 0
 * holding 16 GiB there: one rank per GPU leads and set_device (no GPU left to select) is not listed; without
 * LOCAL_WORLD_SIZE the ranks are counted on the GPU; the same two ranks on a machine with two GPUs: the missing
 * set_device, as before */
static void ranks_outnumber_gpus(void **state)
{
    og_record_t *r = base();
    og_set(&r->memory.process_tracked_bytes, 7 * GiB);
    r->memory.framework_bytes = 7 * GiB;
    r->rank = r->local_rank = 1;
    r->world_size = 2;
    og_other_proc_t *o = fixture_other(r, 4242, "python3", 16 * GiB);
    o->visible = o->same_job = true;
    o->rank = 0;
    strcpy(r->env[r->nenv++], "LOCAL_WORLD_SIZE=2");
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "one_rank_per_gpu");
    assert_int_equal(rank_of(r, "set_device"), 0);
    assert_true(how_has(&r->remedies[0], "--nproc-per-node=1"));
    assert_non_null(strstr(r->remedies[0].why, "2 ranks of this job"));
    r->nenv = 0;
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "one_rank_per_gpu");
    strcpy(r->env[r->nenv++], "LOCAL_WORLD_SIZE=2");
    r->visible_devices = 2;
    run_primary(r, "peer_ranks");
    assert_string_equal(r->remedies[0].id, "set_device");
    assert_int_equal(rank_of(r, "one_rank_per_gpu"), 0);
    /* the other process is a rank of another launcher of the same allocation (srun around torchrun): two worlds of 2
     * ranks on 2 GPUs */
    o->same_allocation = true;
    run_primary(r, "peer_ranks");
    assert_int_equal(r->analysis.facts.node_ranks, 4);
    assert_string_equal(r->remedies[0].id, "one_rank_per_gpu");
    free(r);
    /* torchrun's rank 0 of 8 inside Slurm task 5 of 8 on an 8-GPU node (srun around torchrun), the other processes on
     * its GPU unreadable (another pid namespace: not known to be this job's) holding the missing bytes: its own
     * environment says 8 worlds of 8 ranks share the node; without the Slurm tasks it says nothing */
    r = base();
    og_set(&r->memory.process_tracked_bytes, 7 * GiB);
    r->memory.framework_bytes = 7 * GiB;
    r->rank = r->local_rank = 0;
    r->world_size = 8;
    r->visible_devices = 8;
    o = fixture_other(r, 4242, "python", 16 * GiB);
    o->visible = false;
    static const char *const env[] = { "LOCAL_WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=9c2e", "SLURM_PROCID=5",
                                       "SLURM_NTASKS_PER_NODE=8" };
    for (size_t i = 0; i < sizeof env / sizeof *env; i++)
        strcpy(r->env[r->nenv++], env[i]);
    run(r);
    assert_int_equal(r->analysis.facts.nested_launchers, 8);
    assert_int_equal(r->analysis.facts.node_ranks, 64);
    assert_string_equal(r->remedies[0].id, "one_rank_per_gpu");
    assert_true(how_has(&r->remedies[0], "--ntasks-per-node=1"));
    assert_int_equal(r->analysis.facts.nworld_peers, 0); /* 1 other process where 7 other worlds' would be */
    assert_true(rank_of(r, "foreign_processes") > 0);
    /* two tasks on the node: the one other process is the other world's rank with this local rank, this job's */
    strcpy(r->env[3], "SLURM_NTASKS_PER_NODE=2");
    run_primary(r, "peer_ranks");
    assert_int_equal(r->analysis.facts.nworld_peers, 1);
    assert_string_equal(r->remedies[0].id, "one_rank_per_gpu");
    assert_int_equal(rank_of(r, "foreign_processes"), 0);
    assert_false(any_how_has(r, "kill "));
    r->nenv = 3; /* no SLURM_NTASKS_PER_NODE */
    run(r);
    assert_int_equal(r->analysis.facts.nested_launchers, 0);
    assert_int_equal(rank_of(r, "one_rank_per_gpu"), 0);
    free(r);
}

/* another user's process holds the memory (NVML listed it) and this process's cache was measured: a
 * restart of this process sheds nothing the others hold, so it is not listed */
static void foreign_no_restart_of_this_process(void **state)
{
    og_record_t *r = base();
    og_set(&r->memory.process_tracked_bytes, 6 * GiB);
    r->memory.framework_bytes = 6 * GiB;
    fixture_adapter(r, 6 * GiB, 6 * GiB - 2 * MiB, 0);
    fixture_other(r, 48213, "python3", 17 * GiB);
    run_primary(r, "foreign_memory");
    assert_string_equal(r->remedies[0].id, "foreign_processes");
    assert_int_equal(rank_of(r, "restart_process"), 0);
    free(r);
}

/* a training step's all-pairs operation over one sample (box IoU of 196,416 anchors x 6,000 boxes, batch 4):
 * its three tensors of the failing size take the card with the weights, so no batch fits, one image included:
 * smaller_batch is not in the top three; the same sizes with the batch among them (4 x ...) shrink with it; a
 * card the operation leaves room on keeps it */
static void batchless_operation_takes_the_card(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->device.free_bytes, 5 * GiB + 512 * MiB);
    og_set(&r->event.requested_bytes, 8 * GiB + 800 * MiB);
    fixture_roles(r, 132 * MiB, 0, 0, 0, 1 * GiB, 16 * GiB);
    fixture_operation(r, "pairwise", "box_iou");
    fixture_statement(r, "rb", "");
    r->memory.fw.grad_enabled = 1;
    r->memory.fw.training = 1;
    r->memory.fw.roles.batch_size = 4;
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "196416,6000");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_true(rank_of(r, "smaller_batch") == 0 || rank_of(r, "smaller_batch") > 3);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "4,196416,6000");
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0 && rank_of(r, "smaller_batch") <= 3);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "196416,6000");
    og_set(&r->device.total_bytes, 80 * GiB);
    run_primary(r, "does_not_fit");
    assert_true(rank_of(r, "smaller_batch") > 0 && rank_of(r, "smaller_batch") <= 3);
    free(r);
}

/* the same request larger than the card, but the failing statement multiplied different sizes (users x
 * items: a score matrix): split the operation, no sequence to shorten; the same size twice (seq x seq:
 * attention scores) keeps the maximum input length first */
static void larger_product_is_split(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 40 * GiB);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 1 * GiB, 18 * GiB);
    r->memory.fw.grad_enabled = -1;
    fixture_statement(r, "scores", "");
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "8192,2000000");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_int_equal(rank_of(r, "shorter_sequences"), 0);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "8,16,65536,65536");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "shorter_sequences");
    /* one length three times (L x heads x L x L: triangle attention's scores for every row at once): an operation
     * over every triple, which runs over slices of its outer axis; the input stays whole, a shorter one second */
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "2000,4,2000,2000");
    run_primary(r, "does_not_fit");
    assert_string_equal(r->remedies[0].id, "split_operation");
    assert_int_equal(rank_of(r, "shorter_sequences"), 2);
    free(r);
}

/* ------------------------------------------------------------------ the docs say what the code does */

/* docs/diagnosis.md (read from the repository root, where the suites run) */
static char *read_diagnosis_doc(void)
{
    FILE *f = fopen("docs/diagnosis.md", "r");
    assert_non_null(f);
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* one id per remedy, one title per id: `oomguard stats` counts remedies by id; and each remedy says
 * its own saving and cost (a row copied from another remedy's says what that one would cost) */
static void one_id_per_remedy(void **state)
{
    for (int i = 0; i < R_COUNT; i++) {
        assert_non_null(og_remedy_catalog[i].id);
        assert_non_null(og_remedy_catalog[i].build);
        for (int j = 0; j < i; j++) {
            assert_string_not_equal(og_remedy_catalog[i].id, og_remedy_catalog[j].id);
            assert_string_not_equal(og_remedy_catalog[i].title, og_remedy_catalog[j].title);
            assert_string_not_equal(og_remedy_catalog[i].saving, og_remedy_catalog[j].saving);
            assert_string_not_equal(og_remedy_catalog[i].cost, og_remedy_catalog[j].cost);
        }
        /* the report prints a saving and a cost up to OG_REMEDY_FIELD_MAX (160) characters
         * (tools/report.h): a catalog text longer than that would be cut mid-sentence */
        assert_true(strlen(og_remedy_catalog[i].saving) <= 160);
        assert_true(strlen(og_remedy_catalog[i].cost) <= 160);
    }
}

/* the table of ranking rows in the docs is the code's, line for line */
static void docs_list_the_ranking_rows(void **state)
{
    char *doc = read_diagnosis_doc();
    char *p = strstr(doc, "<!-- rank-rows");
    assert_non_null(p);
    char *end = strstr(p, "<!-- /rank-rows -->");
    assert_non_null(end);
    *end = 0;
    p = strstr(p, "| --- |");
    assert_non_null(p);
    p = strchr(p, '\n') + 1;
    char want[1024];
    int i = 0;
    for (; og_rank_row_text(i, want, sizeof want); i++) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl);
        *nl = 0;
        if (strcmp(p, want) != 0)
            fail_msg("docs/diagnosis.md rank row %d:\n  docs: %s\n  code: %s", i, p, want);
        p = nl + 1;
    }
    assert_true(i > 20);
    assert_string_equal(p, ""); /* no row the code does not have */
}

/* the causes table of the docs names exactly the causes of common/causes.def */
static void docs_list_the_causes(void **state)
{
    char *doc = read_diagnosis_doc();
    char *t = strstr(doc, "## Causes");
    assert_non_null(t);
    char *end = strstr(t, "\n## ");
    assert_non_null(end);
    int rows = 0;
    for (char *p = t; p && p < end; p = strchr(p + 1, '\n'))
        rows += strncmp(p, "\n| `", 4) == 0;
    static const char *const ids[] = {
#define X(name, id, rule, bonus, own1, own2, title) id,
#include "causes.def"
#undef X
    };
    int n = 0;
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
        char cell[64];
        snprintf(cell, sizeof cell, "\n| `%s` |", ids[i]);
        char *at = strstr(t, cell);
        if (strcmp(ids[i], "unknown") == 0)
            continue; /* no rule: it is named in the text */
        if (!at || at > end)
            fail_msg("docs/diagnosis.md: no row for the cause %s", ids[i]);
        n++;
    }
    assert_int_equal(rows, n);
}

/* an exporter folding every fp16 weight into a new tensor on the GPU (13.5 GiB of parameters, 8.26 GiB of the copy made,
 * roles.activations_copy_of parameters) that cannot finish: the remedies of a pass (a smaller batch, mixed precision,
 * shorter inputs) save at most the activations beyond the copy, none here, and none is in the top three */
static void a_copy_of_the_weights_takes_nothing_from_a_pass(void **state)
{
    og_record_t *r = base();
    fixture_weights_copy(r);
    run_primary(r, "does_not_fit");
    assert_true(r->analysis.facts.role_copy_outgrows);
    static const char *const levers[] = { "smaller_batch",   "mixed_precision",        "shorter_sequences",
                                          "flash_attention", "gradient_checkpointing", "inference_mode" };
    for (size_t i = 0; i < sizeof levers / sizeof *levers; i++) {
        const og_remedy_t *m = rem(r, levers[i]);
        assert_true(m->rank == 0 || m->rank > 3);
        assert_true(m->rank == 0 || m->ranking.estimate <= 0);
    }
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_copy_of_the_weights_takes_nothing_from_a_pass),
        cmocka_unit_test(fragmentation_selection),
        cmocka_unit_test(empty_cache_releases_no_split_segment),
        cmocka_unit_test(allocator_setting_by_version),
        cmocka_unit_test(master_weights_are_no_snapshot),
        cmocka_unit_test(does_not_fit_selection),
        cmocka_unit_test(does_not_fit_never_leads_with_empty_cache),
        cmocka_unit_test(attention_scores_beside_others),
        cmocka_unit_test(request_of_one_inputs_sizes),
        cmocka_unit_test(foreign_names_the_pids),
        cmocka_unit_test(growth_of_model_copies),
        cmocka_unit_test(growth_selection),
        cmocka_unit_test(cache_held_selection),
        cmocka_unit_test(limit_selection),
        cmocka_unit_test(non_framework_selection),
        cmocka_unit_test(contexts_beyond_the_primary),
        cmocka_unit_test(failing_framework_by_the_ledger),
        cmocka_unit_test(nccl_settings),
        cmocka_unit_test(library_built_up),
        cmocka_unit_test(unknown_cause_selection),
        cmocka_unit_test(expandable_segments_already_set),
        cmocka_unit_test(bf16_or_fp16_by_cc),
        cmocka_unit_test(pre_volta_ranks_mixed_precision_last),
        cmocka_unit_test(jax_knobs),
        cmocka_unit_test(jax_mem_fraction_for_cache_held),
        cmocka_unit_test(tensorflow_knobs),
        cmocka_unit_test(cupy_and_unknown_framework),
        cmocka_unit_test(multi_gpu_depends_on_visible_devices),
        cmocka_unit_test(embedding_tables_off_the_gpu),
        cmocka_unit_test(state_over_card_idle_gpus),
        cmocka_unit_test(spare_gpu),
        cmocka_unit_test(child_on_parents_gpu),
        cmocka_unit_test(statement_model_on_other_gpu),
        cmocka_unit_test(weights_only_no_activation_remedies),
        cmocka_unit_test(empty_and_null_records),
        cmocka_unit_test(huge_request_fits_no_card),
        cmocka_unit_test(second_framework_knobs),
        cmocka_unit_test(peers_get_set_device_never_kill),
        cmocka_unit_test(prefork_workers_get_fewer_workers_never_kill),
        cmocka_unit_test(prefork_worker_building_its_model_no_restart),
        cmocka_unit_test(imbalance_gets_ddp_before_smaller_batch),
        cmocka_unit_test(app_pool_gets_trim),
        cmocka_unit_test(released_nothing_expandable_leads),
        cmocka_unit_test(batch_of_one_no_buckets),
        cmocka_unit_test(shortfall_size_shapes_the_list),
        cmocka_unit_test(inference_mode_leads_only_when_known),
        cmocka_unit_test(limit_refused_by_context_alone),
        cmocka_unit_test(remedy_texts_over_edge_numbers),
        cmocka_unit_test(request_not_given_sizes_nothing),
        cmocka_unit_test(autocast_on_drops_mixed_precision),
        cmocka_unit_test(no_roles_no_role_remedies),
        cmocka_unit_test(phase_oom_handler),
        cmocka_unit_test(handler_keeps_failed_attempt),
        cmocka_unit_test(phase_checkpoint_restore),
        cmocka_unit_test(dequantizing_load),
        cmocka_unit_test(weights_fill_the_card),
        cmocka_unit_test(statement_checkpoint_restore),
        cmocka_unit_test(phase_ema_update),
        cmocka_unit_test(second_copy_of_a_model),
        cmocka_unit_test(phase_loading_weights),
        cmocka_unit_test(phase_optimizer_step),
        cmocka_unit_test(optimizer_step_of_ranks),
        cmocka_unit_test(preconditioners_hold_the_state),
        cmocka_unit_test(per_sample_gradients),
        cmocka_unit_test(lora_base_weights_train),
        cmocka_unit_test(lora_adapters_piled),
        cmocka_unit_test(fragmentation_not_the_state),
        cmocka_unit_test(layers_still_to_come),
        cmocka_unit_test(holder_of_one_record_per_layer),
        cmocka_unit_test(ema_update_out_of_place),
        cmocka_unit_test(phase_forward_optimizer_later),
        cmocka_unit_test(float64_weights),
        cmocka_unit_test(float64_data),
        cmocka_unit_test(weight_gradients_nothing_reads),
        cmocka_unit_test(weight_grads_beside_a_small_trained_part),
        cmocka_unit_test(input_gradient_keeps_autograd),
        cmocka_unit_test(quantization_reads_the_weights),
        cmocka_unit_test(fp32_weights_load_in_half),
        cmocka_unit_test(fp32_model_beside_half),
        cmocka_unit_test(quantized_beside_reference),
        cmocka_unit_test(checkpoint_restore_beside_others),
        cmocka_unit_test(growth_kept_not_others),
        cmocka_unit_test(measured_leak_only_its_remedies),
        cmocka_unit_test(trains_before_the_first_step),
        cmocka_unit_test(state_exceeds_card_first),
        cmocka_unit_test(summed_microbatches_backward_each),
        cmocka_unit_test(checkpointing_off_leads),
        cmocka_unit_test(fp32_training_half_first),
        cmocka_unit_test(transducer_loss_split_first),
        cmocka_unit_test(forward_feeding_no_backward),
        cmocka_unit_test(unreached_leftover_released_first),
        cmocka_unit_test(batch_of_one_cannot_shrink),
        cmocka_unit_test(bucketing_needs_a_batch_that_fit),
        cmocka_unit_test(state_new_since_the_pass),
        cmocka_unit_test(graph_pools_first),
        cmocka_unit_test(growth_in_a_dict),
        cmocka_unit_test(growth_names_its_holder),
        cmocka_unit_test(nccl_growth),
        cmocka_unit_test(one_batch_peak_caps_the_length),
        cmocka_unit_test(larger_outlier_batch_caps_the_length),
        cmocka_unit_test(one_input_evaluation_caps_the_input),
        cmocka_unit_test(one_batch_peak_not_bucketing),
        cmocka_unit_test(one_prompt_peak_in_generation),
        cmocka_unit_test(larger_inference_caps_the_input),
        cmocka_unit_test(an_inference_batch_splits_as_its_phase_runs),
        cmocka_unit_test(applies_by_job),
        cmocka_unit_test(measured_nothing_not_listed),
        cmocka_unit_test(weights_update_outside_the_step),
        cmocka_unit_test(kv_cache_reserved_first),
        cmocka_unit_test(kv_cache_reserving),
        cmocka_unit_test(unknown_shortfall_is_covered_by_nothing),
        cmocka_unit_test(generation_kv_growth),
        cmocka_unit_test(generation_outgrows_an_earlier_peak),
        cmocka_unit_test(engine_kept_while_the_scorer_loads),
        cmocka_unit_test(all_position_logits_of_a_prefill),
        cmocka_unit_test(training_logits_before_the_loss),
        cmocka_unit_test(graph_messages_sample_the_graph),
        cmocka_unit_test(decoding_loop_kv_growth),
        cmocka_unit_test(timing_moves_no_answer),
        cmocka_unit_test(cross_entropy_fused_first),
        cmocka_unit_test(backward_in_code_trains),
        cmocka_unit_test(autocast_in_code),
        cmocka_unit_test(scaler_without_autocast),
        cmocka_unit_test(padding_to_max_length),
        cmocka_unit_test(extra_outputs_first),
        cmocka_unit_test(rank_loads_whole_model),
        cmocka_unit_test(rank_model_larger_than_card),
        cmocka_unit_test(eager_attention_fused_first),
        cmocka_unit_test(outlier_read_through_the_pass),
        cmocka_unit_test(forward_inputs_fill_the_card),
        cmocka_unit_test(comprehension_still_building),
        cmocka_unit_test(no_attention_layers_no_fused_attention),
        cmocka_unit_test(inference_call_building),
        cmocka_unit_test(growing_dataset_to_host),
        cmocka_unit_test(records_kept_as_a_dataset),
        cmocka_unit_test(concurrent_loops),
        cmocka_unit_test(operation_dominates_split_first),
        cmocka_unit_test(batchless_operation_takes_the_card),
        cmocka_unit_test(conv_inference_tiles_first),
        cmocka_unit_test(two_models_one_at_a_time),
        cmocka_unit_test(model_registry_bounded),
        cmocka_unit_test(keyed_models_evicted),
        cmocka_unit_test(checkpoint_kept_after_load),
        cmocka_unit_test(growth_holder_kept_covers),
        cmocka_unit_test(index_kept_on_the_gpu),
        cmocka_unit_test(kept_holder_outgrows_the_splinters),
        cmocka_unit_test(loose_operation_in_blocks),
        cmocka_unit_test(no_model_state_no_weight_remedies),
        cmocka_unit_test(statement_copies_a_holder),
        cmocka_unit_test(restored_by_torch_load),
        cmocka_unit_test(pipeline_kept_beside_training),
        cmocka_unit_test(reference_records_a_graph),
        cmocka_unit_test(dominant_holder_first),
        cmocka_unit_test(own_children_not_workers),
        cmocka_unit_test(staged_inputs_not_the_call),
        cmocka_unit_test(weights_copies_kept),
        cmocka_unit_test(copies_kept_across_steps),
        cmocka_unit_test(eight_bit_saves_by_the_state_width),
        cmocka_unit_test(trained_model_kept_by_other_objects),
        cmocka_unit_test(finished_training_beside_the_next),
        cmocka_unit_test(others_a_sliver_of_the_device),
        cmocka_unit_test(cache_kept_across_calls),
        cmocka_unit_test(eval_copy_first),
        cmocka_unit_test(eval_copy_under_way_first),
        cmocka_unit_test(kept_graphs_holder_first),
        cmocka_unit_test(kept_graphs_without_training),
        cmocka_unit_test(output_history_keeps_a_graph),
        cmocka_unit_test(records_kept_by_a_caller),
        cmocka_unit_test(pipeline_cache_keeps_microbatch_graphs),
        cmocka_unit_test(holder_next_record_to_come),
        cmocka_unit_test(kept_graphs_measured_in_a_loop),
        cmocka_unit_test(offload_moves_only_the_model),
        cmocka_unit_test(multi_gpu_splits_only_the_state_of_one_sample),
        cmocka_unit_test(ddp_buckets_as_views),
        cmocka_unit_test(state_snapshot_first),
        cmocka_unit_test(copy_under_way),
        cmocka_unit_test(dataset_kept_on_the_gpu),
        cmocka_unit_test(evaluation_with_autograd_on),
        cmocka_unit_test(optimizer_trains_no_model_keeps_autograd),
        cmocka_unit_test(evaluation_frees_training_state),
        cmocka_unit_test(framework_libraries),
        cmocka_unit_test(generation_growth_without_kv_cache),
        cmocka_unit_test(cap_without_room_not_first),
        cmocka_unit_test(cap_on_shared_gpu),
        cmocka_unit_test(cap_not_the_card),
        cmocka_unit_test(ranks_outnumber_gpus),
        cmocka_unit_test(cap_with_room_no_leak_hunt),
        cmocka_unit_test(teacher_with_autograd_on),
        cmocka_unit_test(foreign_no_restart_of_this_process),
        cmocka_unit_test(larger_product_is_split),
        cmocka_unit_test(one_id_per_remedy),
        cmocka_unit_test(docs_list_the_ranking_rows),
        cmocka_unit_test(docs_list_the_causes),
    };
    int total = (int)(sizeof tests / sizeof *tests);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
