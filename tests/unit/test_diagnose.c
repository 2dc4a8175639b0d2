/* og_diagnose: every rule just below and just above its threshold, combinations, unknown
 * measurements, the limit, growth against a rising series and a flat sawtooth, zero and huge
 * values, and "unknown" when nothing holds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "og.h"
#include "record.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static const og_thresholds_t TH = {
    .frag_share = 0.25, .nonfw_share = 0.20, .growth_min_share = 0.05, .growth_rising_steps = 0.70,
};

/* A PyTorch process on a 24 GiB card that holds 20 GiB, nothing cached, NVML not measured. */
static og_record_t *base(void)
{
    og_record_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->status = "oom";
    r->framework = OG_FW_PYTORCH;
    strcpy(r->framework_libs, "libtorch_cuda.so, libc10_cuda.so");
    r->visible_devices = 1;
    r->rank = r->local_rank = r->world_size = -1;
    r->event.requested_bytes = 2 * GiB;
    r->event.result = 2;
    strcpy(r->event.library, "libtorch_cuda.so");
    r->device.total_bytes = 24 * GiB;
    r->device.free_bytes = 1 * GiB;
    r->device.limit_bytes = OG_UNKNOWN;
    r->device.cc_major = 8;
    r->device.cc_minor = 6;
    r->memory.process_tracked_bytes = 20 * GiB;
    r->memory.process_used_bytes = OG_UNKNOWN;
    r->memory.framework_bytes = 20 * GiB;
    r->memory.framework_cached_bytes = OG_UNKNOWN;
    r->memory.non_framework_bytes = OG_UNKNOWN;
    r->memory.context_bytes_estimate = OG_UNKNOWN;
    r->memory.nlibs = 1;
    strcpy(r->memory.by_library[0].library, "libtorch_cuda.so");
    r->memory.by_library[0].bytes = 20 * GiB;
    r->memory.by_library[0].framework = true;
    return r;
}

/* the cause with this id, or an empty one (id NULL) */
static const og_cause_t *find(const og_record_t *r, const char *id)
{
    static const og_cause_t none;
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        if (r->diagnosis.causes[i].id && strcmp(r->diagnosis.causes[i].id, id) == 0)
            return &r->diagnosis.causes[i];
    return &none;
}

static bool has(const og_record_t *r, const char *id) { return find(r, id)->id != NULL; }

static double ev(const og_cause_t *c, const char *name)
{
    for (int i = 0; i < c->nevidence; i++)
        if (strcmp(c->evidence[i].name, name) == 0)
            return c->evidence[i].is_text ? -2 : c->evidence[i].num;
    return -1;
}

static const char *evt(const og_cause_t *c, const char *name)
{
    for (int i = 0; i < c->nevidence; i++)
        if (strcmp(c->evidence[i].name, name) == 0 && c->evidence[i].is_text)
            return c->evidence[i].text;
    return NULL;
}

static double bonus(const char *id)
{
    static const char *const prio[] = {"limit", "cache_held", "fragmentation", "foreign_memory", "non_framework",
                                       "growth", "does_not_fit"};
    for (int i = 0; i < 7; i++)
        if (strcmp(id, prio[i]) == 0)
            return 0.01 * (6 - i);
    return 0;
}

/* invariants every diagnosis must keep */
static void check_shape(const og_record_t *r)
{
    assert_true(r->diagnosis.ncauses >= 1 && r->diagnosis.ncauses <= 8);
    assert_non_null(r->diagnosis.primary);
    assert_string_equal(r->diagnosis.primary, r->diagnosis.causes[0].id);
    for (int i = 0; i < r->diagnosis.ncauses; i++) {
        const og_cause_t *c = &r->diagnosis.causes[i];
        assert_non_null(c->id);
        assert_true(c->confidence >= 0 && c->confidence <= 1);
        assert_true(strlen(c->summary) > 10);
        assert_true(strlen(c->summary) < sizeof c->summary - 1);      /* never truncated */
        assert_true(c->nevidence >= 1 && c->nevidence <= 8);
        for (int e = 0; e < c->nevidence; e++)
            assert_non_null(c->evidence[e].name);
        if (i)    /* sorted by confidence + the documented tie-break bonus */
            assert_true(r->diagnosis.causes[i - 1].confidence + bonus(r->diagnosis.causes[i - 1].id) + 1e-12 >=
                        c->confidence + bonus(c->id));
    }
}

/* ------------------------------------------------------------------ does_not_fit */

static void does_not_fit_threshold(void **state)
{
    og_record_t *r = base();
    r->memory.framework_cached_bytes = 512 * MiB;
    r->memory.framework_cached_source = "pool";
    r->memory.framework_bytes = 20 * GiB;
    /* request exactly free + cache: it would fit */
    r->event.requested_bytes = 1 * GiB + 512 * MiB;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "does_not_fit"));
    assert_int_equal(r->diagnosis.shortfall_bytes, 512 * MiB);

    /* one byte more: it does not */
    r->event.requested_bytes = 1 * GiB + 512 * MiB + 1;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_true(c->confidence > 0.5 && c->confidence < 0.51);
    assert_int_equal((uint64_t)ev(c, "missing_bytes"), 1);

    /* a request far beyond free: confidence near 1, summary in GiB */
    r->event.requested_bytes = 30 * GiB;
    og_diagnose(r, &TH);
    c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_true(c->confidence > 0.9);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_non_null(strstr(c->summary, "28.50 GiB more is needed"));
    assert_int_equal(r->diagnosis.shortfall_bytes, 29 * GiB);
    free(r);
}

static void does_not_fit_cache_not_measured(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 3 * GiB;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_non_null(strstr(c->summary, "not measured"));
    assert_non_null(evt(c, "reclaimable_bytes"));
    assert_false(has(r, "fragmentation"));       /* needs the cache */
    assert_false(has(r, "non_framework"));       /* needs NVML */
    free(r);
}

/* the framework already handed its cache back and retried: nothing reclaimable, no fragmentation */
static void retry_release_is_not_reclaimable(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 3 * GiB;
    r->event.attempts = 2;
    r->memory.framework_cached_bytes = 4 * GiB;
    r->memory.framework_cached_source = "retry_release";
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_int_equal((uint64_t)ev(c, "reclaimable_bytes"), 0);
    assert_non_null(strstr(c->summary, "already released"));
    assert_false(has(r, "fragmentation"));
    free(r);
}

/* ------------------------------------------------------------------ fragmentation */

static void fragmentation_cache_covers_request(void **state)
{
    og_record_t *r = base();
    r->device.free_bytes = 0;
    r->memory.framework_cached_source = "pool";
    r->memory.framework_bytes = 100 * GiB;        /* share branch out of reach */
    r->memory.framework_cached_bytes = 2 * GiB - 1;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "fragmentation"));        /* below: cache < request and < shortfall */
    assert_true(has(r, "does_not_fit"));

    r->memory.framework_cached_bytes = 2 * GiB;   /* at: cache == request */
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_false(has(r, "does_not_fit"));
    assert_true(c->confidence >= 0.6 && c->confidence < 0.61);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_string_equal(evt(c, "rule"), "cache_covers_request");
    free(r);
}

/* the article's example: 2.50 GiB requested, 1.20 GiB free, 1.70 GiB reserved but unallocated */
static void fragmentation_free_plus_cache(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 2560 * MiB;
    r->device.free_bytes = 1229 * MiB;
    r->memory.fw.has = true;
    r->memory.fw.reserved_bytes = 22528 * MiB;
    r->memory.fw.allocated_bytes = 22528 * MiB - 1741 * MiB;
    r->memory.fw.largest_free_block_bytes = OG_UNKNOWN;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "rule"), "free_plus_cache_covers");
    assert_false(has(r, "does_not_fit"));
    assert_non_null(strstr(c->summary, "1.70 GiB cached"));
    assert_int_equal(r->diagnosis.shortfall_bytes, (2560 - 1229) * MiB);
    free(r);
}

static void fragmentation_share_threshold(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 8 * GiB;
    r->device.free_bytes = 0;
    r->memory.framework_cached_source = "pool";
    r->memory.framework_bytes = 16 * GiB;
    r->memory.framework_cached_bytes = 4 * GiB - 1;   /* just below 25% */
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "fragmentation"));
    r->memory.framework_cached_bytes = 4 * GiB;       /* exactly 25% */
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "rule"), "idle_share");
    assert_true(c->confidence >= 0.3 && c->confidence <= 0.5);
    assert_true(ev(c, "cached_share") == 0.25);
    /* the request itself does not fit: does_not_fit leads */
    assert_string_equal(r->diagnosis.primary, "does_not_fit");

    /* the share branch needs at least 256 MiB idle */
    r->memory.framework_bytes = 512 * MiB;
    r->memory.framework_cached_bytes = 255 * MiB;
    og_diagnose(r, &TH);
    assert_false(has(r, "fragmentation"));
    free(r);
}

static void fragmentation_textbook_with_adapter(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 2 * GiB;
    r->device.free_bytes = 256 * MiB;
    r->memory.fw.has = true;
    r->memory.fw.reserved_bytes = 20 * GiB;
    r->memory.fw.allocated_bytes = 14 * GiB;           /* 6 GiB cached */
    r->memory.fw.largest_free_block_bytes = 600 * MiB;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_true(c->confidence >= 0.95);
    assert_string_equal(evt(c, "rule"), "textbook");
    double frag = ev(c, "fragmentation");
    assert_true(frag > 0.90 && frag < 0.91);          /* 1 - 600 MiB / 6 GiB */
    assert_int_equal((uint64_t)ev(c, "largest_free_block_bytes"), 600 * MiB);
    assert_non_null(strstr(c->summary, "600 MiB"));

    /* the adapter says a big enough block was there: fragmentation is unlikely */
    r->memory.fw.largest_free_block_bytes = 3 * GiB;
    og_diagnose(r, &TH);
    c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_true(c->confidence < 0.35);
    free(r);
}

/* ------------------------------------------------------------------ foreign_memory */

static void foreign_threshold(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 2 * GiB;       /* shortfall 1 GiB */
    r->memory.process_tracked_bytes = 12 * GiB;
    r->memory.framework_bytes = 12 * GiB;
    r->memory.nother = 1;
    r->memory.other[0].pid = 4242;
    strcpy(r->memory.other[0].name, "python3");
    r->memory.other[0].bytes = r->memory.other_processes_bytes = 1 * GiB - 1;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "foreign_memory"));

    r->memory.other[0].bytes = r->memory.other_processes_bytes = 1 * GiB;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "foreign_memory");
    assert_non_null(c->id);
    assert_true(c->confidence >= 0.45 && c->confidence <= 0.5 + 1e-9);
    assert_non_null(strstr(c->summary, "pid 4242"));
    assert_string_equal(evt(c, "largest_process"), "pid 4242 python3");

    /* much more held by others: the job alone would fit, so foreign leads does_not_fit */
    r->memory.other[0].bytes = r->memory.other_processes_bytes = 10 * GiB;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "foreign_memory");
    assert_true(find(r, "foreign_memory")->confidence > 0.8);
    const og_cause_t *d = find(r, "does_not_fit");
    assert_non_null(d->id);
    assert_true(d->confidence <= 0.45);
    free(r);
}

static void fragmentation_and_foreign(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 2 * GiB;
    r->device.free_bytes = 512 * MiB;
    r->memory.process_tracked_bytes = 14 * GiB;
    r->memory.framework_bytes = 14 * GiB;
    r->memory.framework_cached_bytes = 3 * GiB;
    r->memory.framework_cached_source = "pool";
    r->memory.nother = 2;
    r->memory.other[0].pid = 100;
    strcpy(r->memory.other[0].name, "Xorg");
    r->memory.other[0].bytes = 300 * MiB;
    r->memory.other[1].pid = 200;
    strcpy(r->memory.other[1].name, "trainer");
    r->memory.other[1].bytes = 8 * GiB;
    r->memory.other_processes_bytes = 8 * GiB + 300 * MiB;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_true(has(r, "fragmentation"));
    assert_true(has(r, "foreign_memory"));
    assert_false(has(r, "does_not_fit"));
    assert_string_equal(evt(find(r, "foreign_memory"), "largest_process"), "pid 200 trainer");
    assert_non_null(strstr(find(r, "foreign_memory")->summary, "2 other processes hold"));
    free(r);
}

/* ------------------------------------------------------------------ non_framework */

static og_record_t *nonfw_base(uint64_t nonfw)
{
    og_record_t *r = base();
    r->event.requested_bytes = 2 * GiB;                   /* shortfall 1 GiB */
    r->memory.process_used_bytes = 20 * GiB;
    r->memory.framework_bytes = 20 * GiB - nonfw;
    r->memory.non_framework_bytes = nonfw;
    r->memory.context_bytes_estimate = 500 * MiB;
    r->memory.nlibs = 2;
    r->memory.by_library[0].bytes = 20 * GiB - nonfw;
    strcpy(r->memory.by_library[1].library, "/opt/lib/libcustom_kernels.so");
    r->memory.by_library[1].bytes = nonfw - 500 * MiB;
    return r;
}

static void non_framework_threshold(void **state)
{
    og_record_t *r = nonfw_base(4 * GiB - 1);             /* just under 20% of 20 GiB */
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "non_framework"));
    free(r);

    r = nonfw_base(4 * GiB);                              /* exactly 20% */
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "non_framework");
    assert_non_null(c->id);
    assert_true(c->confidence >= 0.35 && c->confidence < 0.6);
    assert_string_equal(evt(c, "largest_library"), "libcustom_kernels.so");
    assert_non_null(strstr(c->summary, "outside PyTorch"));
    free(r);

    /* the 1 GiB floor: a large share of a small process does not count */
    r = nonfw_base(1 * GiB - 1);
    r->memory.process_used_bytes = 2 * GiB;
    r->memory.framework_bytes = 1 * GiB + 1;
    r->event.requested_bytes = 1 * GiB + 512 * MiB;       /* shortfall 512 MiB */
    og_diagnose(r, &TH);
    assert_false(has(r, "non_framework"));
    r->memory.non_framework_bytes = 1 * GiB;
    og_diagnose(r, &TH);
    assert_true(has(r, "non_framework"));
    free(r);

    /* not above the shortfall: no */
    r = nonfw_base(5 * GiB);
    r->event.requested_bytes = 7 * GiB;                   /* shortfall 6 GiB */
    og_diagnose(r, &TH);
    assert_false(has(r, "non_framework"));
    free(r);
}

static void non_framework_needs_nvml_and_framework(void **state)
{
    og_record_t *r = nonfw_base(8 * GiB);
    r->memory.process_used_bytes = OG_UNKNOWN;
    r->memory.non_framework_bytes = OG_UNKNOWN;
    r->memory.context_bytes_estimate = OG_UNKNOWN;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "non_framework"));
    free(r);

    r = nonfw_base(8 * GiB);
    r->framework = OG_FW_UNKNOWN;
    r->framework_libs[0] = 0;
    r->memory.framework_bytes = 0;
    r->memory.non_framework_bytes = 20 * GiB;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "non_framework"));
    free(r);
}

/* ------------------------------------------------------------------ growth */

static void fill_samples(og_record_t *r, int n, uint64_t (*f)(int i, int n))
{
    r->history.nsamples = n;
    for (int i = 0; i < n; i++) {
        r->history.samples[i].t_rel = i * 0.5;
        r->history.samples[i].live = f(i, n);
    }
}

/* sawtooth: every step allocates 3 GiB of activations and frees them */
static uint64_t flat_saw(int i, int n) { (void)n; return 6 * GiB + (uint64_t)(i % 4) * GiB; }
/* the same sawtooth on a base that rises 1 GiB per window */
static uint64_t rising_saw(int i, int n) { return 4 * GiB + (uint64_t)i * 8 / n * GiB + (uint64_t)(i % 4) * (GiB / 2); }

static void growth_rising_vs_flat(void **state)
{
    og_record_t *r = base();
    fill_samples(r, 64, rising_saw);
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "growth");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "rising_steps"), "7 of 7");
    assert_int_equal((uint64_t)ev(c, "first_trough_bytes"), 4 * GiB);
    assert_int_equal((uint64_t)ev(c, "last_trough_bytes"), 11 * GiB);
    assert_int_equal((uint64_t)ev(c, "rise_per_step_bytes"), GiB);
    assert_true(c->confidence > 0.9);

    fill_samples(r, 64, flat_saw);
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "growth"));

    /* too few samples */
    fill_samples(r, 15, rising_saw);
    og_diagnose(r, &TH);
    assert_false(has(r, "growth"));
    free(r);
}

/* 8 windows of 4 samples each with the given troughs */
static void troughs(og_record_t *r, const uint64_t t[8])
{
    r->history.nsamples = 32;
    for (int i = 0; i < 32; i++) {
        r->history.samples[i].t_rel = i;
        r->history.samples[i].live = t[i / 4] + (i % 4 == 1 ? 0 : 2 * GiB);
    }
}

static void growth_thresholds(void **state)
{
    og_record_t *r = base();
    /* 5 of 7 rising steps (0.714 >= 0.70), rise 8 GiB */
    const uint64_t five[8] = {2 * GiB, 4 * GiB, 3 * GiB, 5 * GiB, 7 * GiB, 6 * GiB, 8 * GiB, 10 * GiB};
    troughs(r, five);
    og_diagnose(r, &TH);
    assert_true(has(r, "growth"));
    assert_string_equal(evt(find(r, "growth"), "rising_steps"), "5 of 7");
    /* 4 of 7 (0.571): no */
    const uint64_t four[8] = {2 * GiB, 4 * GiB, 3 * GiB, 5 * GiB, 4 * GiB, 6 * GiB, 5 * GiB, 10 * GiB};
    troughs(r, four);
    og_diagnose(r, &TH);
    assert_false(has(r, "growth"));

    /* total rise exactly 5% of 24 GiB (1.2 GiB) in 7 equal steps: yes; one step less: no */
    uint64_t t[8];
    uint64_t rise = 24 * GiB / 20 + 1;      /* 5% of 24 GiB, rounded up */
    for (int i = 0; i < 8; i++)
        t[i] = 2 * GiB + rise * (uint64_t)i / 7;
    troughs(r, t);
    og_diagnose(r, &TH);
    assert_true(has(r, "growth"));
    assert_int_equal((uint64_t)ev(find(r, "growth"), "rise_bytes"), rise);
    for (int i = 0; i < 8; i++)
        t[i] = 2 * GiB + (rise - 7 * MiB) * (uint64_t)i / 7;
    troughs(r, t);
    og_diagnose(r, &TH);
    assert_false(has(r, "growth"));

    /* steps of 1 MiB are noise (below max(1 MiB, total/1000)), whatever the total */
    for (int i = 0; i < 8; i++)
        t[i] = 2 * GiB + (uint64_t)i * MiB;
    troughs(r, t);
    og_thresholds_t lax = TH;
    lax.growth_min_share = 0.0001;
    og_diagnose(r, &lax);
    assert_false(has(r, "growth"));
    free(r);
}

/* ------------------------------------------------------------------ cache_held */

static void cache_held_other_library(void **state)
{
    og_record_t *r = base();
    strcpy(r->event.library, "/usr/lib/libnccl.so.2");
    r->event.requested_bytes = 1 * GiB;
    r->device.free_bytes = 512 * MiB;                  /* shortfall 512 MiB */
    r->memory.framework_cached_bytes = 512 * MiB - 1;
    r->memory.framework_cached_source = "pool";
    og_diagnose(r, &TH);
    check_shape(r);
    assert_false(has(r, "cache_held"));

    r->memory.framework_cached_bytes = 6 * GiB;
    og_diagnose(r, &TH);
    check_shape(r);
    const og_cause_t *c = find(r, "cache_held");
    assert_non_null(c->id);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    assert_string_equal(evt(c, "failing_library"), "libnccl.so.2");
    assert_non_null(strstr(c->summary, "libnccl.so.2"));
    assert_non_null(strstr(c->summary, "6.00 GiB"));
    assert_false(has(r, "fragmentation"));             /* not the framework's own allocation */

    /* the framework itself failed: that is fragmentation, not cache_held */
    strcpy(r->event.library, "libc10_cuda.so");
    og_diagnose(r, &TH);
    assert_false(has(r, "cache_held"));
    assert_true(has(r, "fragmentation"));

    /* library unknown: cannot say */
    r->event.library[0] = 0;
    og_diagnose(r, &TH);
    assert_false(has(r, "cache_held"));
    free(r);
}

/* ------------------------------------------------------------------ limit */

static void limit_cause(void **state)
{
    og_record_t *r = base();
    r->device.free_bytes = 10 * GiB;
    r->device.limit_bytes = 21 * GiB;
    r->event.requested_bytes = 2 * GiB;
    r->event.caused_by_limit = true;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "limit");
    const og_cause_t *c = find(r, "limit");
    assert_true(c->confidence == 1.0);
    assert_int_equal((uint64_t)ev(c, "limit_bytes"), 21 * GiB);
    assert_int_equal((uint64_t)ev(c, "job_need_bytes"), 22 * GiB);
    assert_non_null(strstr(c->summary, "device itself had room"));
    /* free under the limit is 1 GiB: shortfall 1 GiB, not 0 */
    assert_int_equal(r->diagnosis.shortfall_bytes, 1 * GiB);

    /* a limit that is set but did not refuse: no limit cause */
    r->event.caused_by_limit = false;
    og_diagnose(r, &TH);
    assert_false(has(r, "limit"));
    free(r);
}

/* ------------------------------------------------------------------ unknown, zero, huge */

static void nothing_holds_is_unknown(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 512 * MiB;              /* fits in the 1 GiB free */
    og_diagnose(r, &TH);
    check_shape(r);
    assert_int_equal(r->diagnosis.ncauses, 1);
    assert_string_equal(r->diagnosis.primary, "unknown");
    assert_int_equal(r->diagnosis.shortfall_bytes, 0);
    assert_non_null(strstr(r->diagnosis.causes[0].summary, "512 MiB requested"));
    assert_non_null(strstr(r->diagnosis.causes[0].summary, "not measured"));
    free(r);
}

static void zero_record(void **state)
{
    og_record_t *r = calloc(1, sizeof *r);
    og_diagnose(r, NULL);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "unknown");
    /* all unknown */
    r->event.requested_bytes = OG_UNKNOWN;
    r->device.total_bytes = r->device.free_bytes = r->device.limit_bytes = OG_UNKNOWN;
    r->memory.process_tracked_bytes = r->memory.process_used_bytes = OG_UNKNOWN;
    r->memory.framework_bytes = r->memory.framework_cached_bytes = OG_UNKNOWN;
    r->memory.non_framework_bytes = r->memory.context_bytes_estimate = OG_UNKNOWN;
    r->memory.other_processes_bytes = r->memory.pool_reserved = r->memory.pool_used = OG_UNKNOWN;
    r->history.nsamples = 100;                          /* all zero samples at t = 0 */
    og_diagnose(r, NULL);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "unknown");
    og_diagnose(NULL, NULL);                            /* no crash */
    free(r);
}

static void huge_values(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = UINT64_MAX - 2;
    r->device.total_bytes = UINT64_MAX - 2;
    r->device.free_bytes = UINT64_MAX - 3;
    r->memory.framework_cached_bytes = UINT64_MAX - 2;
    r->memory.framework_cached_source = "pool";
    r->memory.other_processes_bytes = UINT64_MAX - 2;
    r->memory.process_used_bytes = UINT64_MAX - 2;
    r->memory.non_framework_bytes = UINT64_MAX - 2;
    r->history.nsamples = 512;
    for (int i = 0; i < 512; i++) {
        r->history.samples[i].t_rel = i;
        r->history.samples[i].live = (uint64_t)i << 52;
    }
    og_diagnose(r, &TH);
    check_shape(r);
    assert_int_equal(r->diagnosis.shortfall_bytes, 1);
    assert_true(has(r, "growth"));

    r->device.free_bytes = 0;
    r->memory.framework_cached_bytes = 0;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_true(has(r, "does_not_fit"));
    free(r);
}

static void bad_thresholds_fall_back(void **state)
{
    og_record_t *r = base();
    r->event.requested_bytes = 8 * GiB;
    r->device.free_bytes = 0;
    r->memory.framework_cached_source = "pool";
    r->memory.framework_bytes = 16 * GiB;
    r->memory.framework_cached_bytes = 4 * GiB;       /* 25%: holds with the default */
    og_thresholds_t bad = {.frag_share = -1, .nonfw_share = 0, .growth_min_share = 2, .growth_rising_steps = 0.0 / 0.0};
    og_diagnose(r, &bad);
    assert_true(has(r, "fragmentation"));
    og_thresholds_t strict = TH;
    strict.frag_share = 0.5;
    og_diagnose(r, &strict);
    assert_false(has(r, "fragmentation"));
    free(r);
}

/* equal confidences follow the documented priority: limit before does_not_fit */
static void tie_break_priority(void **state)
{
    og_record_t *r = base();
    r->device.free_bytes = 0;
    r->device.limit_bytes = 20 * GiB;                  /* == tracked: nothing free under the limit */
    r->event.caused_by_limit = true;
    og_diagnose(r, &TH);
    check_shape(r);
    assert_int_equal(r->diagnosis.ncauses, 2);
    assert_true(r->diagnosis.causes[0].confidence == 1.0 && r->diagnosis.causes[1].confidence == 1.0);
    assert_string_equal(r->diagnosis.causes[0].id, "limit");
    assert_string_equal(r->diagnosis.causes[1].id, "does_not_fit");

    /* non_framework (0.55) narrowly beats foreign_memory (0.50) despite priority: margins matter */
    og_record_t *q = base();
    q->event.requested_bytes = 2 * GiB;
    q->memory.process_used_bytes = 20 * GiB;
    q->memory.framework_bytes = 16 * GiB;
    q->memory.non_framework_bytes = 4 * GiB;
    q->memory.other_processes_bytes = 1 * GiB;
    og_diagnose(q, &TH);
    check_shape(q);
    assert_string_equal(q->diagnosis.causes[0].id, "non_framework");
    assert_string_equal(q->diagnosis.causes[1].id, "foreign_memory");
    free(q);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(does_not_fit_threshold),
        cmocka_unit_test(does_not_fit_cache_not_measured),
        cmocka_unit_test(retry_release_is_not_reclaimable),
        cmocka_unit_test(fragmentation_cache_covers_request),
        cmocka_unit_test(fragmentation_free_plus_cache),
        cmocka_unit_test(fragmentation_share_threshold),
        cmocka_unit_test(fragmentation_textbook_with_adapter),
        cmocka_unit_test(foreign_threshold),
        cmocka_unit_test(fragmentation_and_foreign),
        cmocka_unit_test(non_framework_threshold),
        cmocka_unit_test(non_framework_needs_nvml_and_framework),
        cmocka_unit_test(growth_rising_vs_flat),
        cmocka_unit_test(growth_thresholds),
        cmocka_unit_test(cache_held_other_library),
        cmocka_unit_test(limit_cause),
        cmocka_unit_test(nothing_holds_is_unknown),
        cmocka_unit_test(zero_record),
        cmocka_unit_test(huge_values),
        cmocka_unit_test(bad_thresholds_fall_back),
        cmocka_unit_test(tie_break_priority),
    };
    int total = (int)(sizeof tests / sizeof *tests);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
