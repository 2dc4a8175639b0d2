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
#include <ctype.h>

#include "record.h"
#include "analysis_fixture.h"

/* the shared fixture, with the failing call's result and the framework's one library in the breakdown */
static og_record_t *base(void)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so, libc10_cuda.so");
    r->event.result = 2;
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

/* a cause's tie-break bonus, from the list of causes */
static double bonus(const char *id)
{
    static const struct {
        const char *id;
        double bonus;
    } b[] = {
#define X(name, cid, rule, cbonus, own1, own2, title) { cid, cbonus },
#include "causes.def"
#undef X
    };
    for (size_t i = 0; i < sizeof b / sizeof *b; i++)
        if (strcmp(id, b[i].id) == 0)
            return b[i].bonus;
    return 0;
}

/* how a cause ranks: confidence + bonus, in thousandths (docs/diagnosis.md) */
static int score(const og_cause_t *c) { return (int)((c->confidence + bonus(c->id)) * 1000 + 0.5); }

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
        assert_true(strlen(c->summary) < sizeof c->summary - 1); /* never truncated */
        assert_true(c->nevidence >= 1 && c->nevidence <= 12);
        for (int e = 0; e < c->nevidence; e++)
            assert_non_null(c->evidence[e].name);
        if (i) /* sorted by confidence + the documented tie-break bonus, in thousandths */
            assert_true(score(&r->diagnosis.causes[i - 1]) >= score(c));
    }
}

/* diagnose with the default thresholds and check the invariants (every time, so no diagnosis escapes them) */
static void diag(og_record_t *r) { og_diagnose(r, &TH); }

/* ------------------------------------------------------------------ does_not_fit */

static void does_not_fit_threshold(void **state)
{
    og_record_t *r = base();
    og_set(&r->memory.framework_cached_bytes, 512 * MiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    r->memory.framework_bytes = 20 * GiB;
    /* request exactly free + cache: it would fit */
    og_set(&r->event.requested_bytes, 1 * GiB + 512 * MiB);
    diag(r);
    assert_false(has(r, "does_not_fit"));
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 512 * MiB);

    /* one byte more: it does not */
    og_set(&r->event.requested_bytes, 1 * GiB + 512 * MiB + 1);
    diag(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    /* every input measured: certain, however small the margin (not 52%) */
    assert_true(c->confidence >= 0.9);
    assert_int_equal((uint64_t)ev(c, "missing_bytes"), 1);
    assert_string_equal(evt(c, "basis"), "measured");

    /* a request far beyond free: summary in GiB */
    og_set(&r->event.requested_bytes, 20 * GiB);
    diag(r);
    c = find(r, "does_not_fit");
    assert_true(c->confidence > 0.9);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_non_null(strstr(c->summary, "18.50 GiB more is needed"));

    /* larger than the whole device: named as such */
    og_set(&r->event.requested_bytes, 30 * GiB);
    diag(r);
    c = find(r, "does_not_fit");
    assert_true(c->confidence == 1.0);
    assert_true(ev(c, "larger_than_device") == 1);
    assert_non_null(strstr(c->summary, "larger than the whole device"));
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 29 * GiB);
    free(r);
}

static void does_not_fit_cache_not_measured(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 3 * GiB);
    diag(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_non_null(strstr(c->summary, "not measured"));
    assert_non_null(evt(c, "reclaimable_bytes"));
    assert_false(has(r, "fragmentation")); /* needs the cache */
    assert_false(has(r, "non_framework")); /* needs NVML */
    free(r);
}

/* the framework already handed its cache back and retried: nothing reclaimable, no fragmentation */
static void retry_release_is_not_reclaimable(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 3 * GiB);
    r->event.attempts = 2;
    og_set(&r->memory.framework_cached_bytes, 4 * GiB);
    r->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
    diag(r);
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
    og_set(&r->device.free_bytes, 0);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    r->memory.framework_bytes = 100 * GiB; /* share branch out of reach */
    og_set(&r->memory.framework_cached_bytes, 2 * GiB - 1);
    diag(r);
    assert_false(has(r, "fragmentation")); /* below: cache < request and < shortfall */
    assert_true(has(r, "does_not_fit"));

    og_set(&r->memory.framework_cached_bytes, 2 * GiB); /* at: cache == request */
    diag(r);
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
    fixture_article_fragmentation(r, 0); /* largest free block not reported */
    diag(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "rule"), "free_plus_cache_covers");
    assert_false(has(r, "does_not_fit"));
    assert_non_null(strstr(c->summary, "1.70 GiB cached"));
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), (2560 - 1229) * MiB);
    free(r);
}

static void fragmentation_share_threshold(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 0);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    r->memory.framework_bytes = 16 * GiB;
    og_set(&r->memory.framework_cached_bytes, 4 * GiB - 1); /* just below 25% */
    diag(r);
    assert_false(has(r, "fragmentation"));
    og_set(&r->memory.framework_cached_bytes, 4 * GiB); /* exactly 25% */
    diag(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "rule"), "idle_share");
    assert_true(c->confidence >= 0.3 && c->confidence <= 0.5);
    assert_true(ev(c, "cached_share") == 0.25);
    /* the request itself does not fit: does_not_fit leads */
    assert_string_equal(r->diagnosis.primary, "does_not_fit");

    /* the share branch needs at least 256 MiB idle */
    r->memory.framework_bytes = 512 * MiB;
    og_set(&r->memory.framework_cached_bytes, 255 * MiB);
    diag(r);
    assert_false(has(r, "fragmentation"));
    free(r);
}

static void fragmentation_textbook_with_adapter(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    fixture_adapter(r, 20 * GiB, 14 * GiB, 600 * MiB); /* 6 GiB cached */
    diag(r);
    const og_cause_t *c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_true(c->confidence >= 0.95);
    assert_string_equal(evt(c, "rule"), "textbook");
    double frag = ev(c, "fragmentation");
    assert_true(frag > 0.90 && frag < 0.91); /* 1 - 600 MiB / 6 GiB */
    assert_int_equal((uint64_t)ev(c, "largest_free_block_bytes"), 600 * MiB);
    assert_non_null(strstr(c->summary, "600 MiB"));

    /* the adapter says a big enough block was there: fragmentation is unlikely */
    r->memory.fw.largest_free_block_bytes = 3 * GiB;
    diag(r);
    c = find(r, "fragmentation");
    assert_non_null(c->id);
    assert_true(c->confidence < 0.35);
    free(r);
}

/* ------------------------------------------------------------------ foreign_memory */

static void foreign_threshold(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 2 * GiB); /* shortfall 1 GiB */
    og_set(&r->memory.process_tracked_bytes, 12 * GiB);
    r->memory.framework_bytes = 12 * GiB;
    fixture_other(r, 4242, "python3", 1 * GiB - 1);
    diag(r);
    assert_false(has(r, "foreign_memory"));

    r->memory.other[0].bytes = 1 * GiB;
    og_set(&r->memory.other_processes_bytes, 1 * GiB);
    diag(r);
    const og_cause_t *c = find(r, "foreign_memory");
    assert_non_null(c->id);
    assert_true(c->confidence >= 0.45 && c->confidence <= 0.5 + 1e-9);
    assert_non_null(strstr(c->summary, "pid 4242"));
    assert_string_equal(evt(c, "largest_process"), "pid 4242 python3");

    /* much more held by others: the job alone would fit, so foreign leads does_not_fit */
    r->memory.other[0].bytes = 10 * GiB;
    og_set(&r->memory.other_processes_bytes, 10 * GiB);
    diag(r);
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
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    og_set(&r->memory.process_tracked_bytes, 14 * GiB);
    r->memory.framework_bytes = 14 * GiB;
    og_set(&r->memory.framework_cached_bytes, 3 * GiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    fixture_other(r, 100, "Xorg", 300 * MiB);
    fixture_other(r, 200, "trainer", 8 * GiB);
    diag(r);
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
    og_set(&r->event.requested_bytes, 2 * GiB); /* shortfall 1 GiB */
    og_set(&r->memory.process_used_bytes, 20 * GiB);
    r->memory.framework_bytes = 20 * GiB - nonfw;
    r->memory.non_framework_bytes = fx_opt(nonfw);
    og_set(&r->memory.context_bytes_estimate, 500 * MiB);
    r->memory.nlibs = 2;
    r->memory.by_library[0].bytes = 20 * GiB - nonfw;
    strcpy(r->memory.by_library[1].library, "/opt/lib/libcustom_kernels.so");
    r->memory.by_library[1].bytes = nonfw - 500 * MiB;
    return r;
}

static void non_framework_threshold(void **state)
{
    og_record_t *r = nonfw_base(4 * GiB - 1); /* just under 20% of 20 GiB */
    diag(r);
    assert_false(has(r, "non_framework"));
    free(r);

    r = nonfw_base(4 * GiB); /* exactly 20% */
    diag(r);
    const og_cause_t *c = find(r, "non_framework");
    assert_non_null(c->id);
    assert_true(c->confidence >= 0.35 && c->confidence < 0.6);
    assert_string_equal(evt(c, "largest_library"), "libcustom_kernels.so");
    assert_non_null(strstr(c->summary, "outside PyTorch"));
    free(r);

    /* the 1 GiB floor: a large share of a small process does not count */
    r = nonfw_base(1 * GiB - 1);
    og_set(&r->memory.process_used_bytes, 2 * GiB);
    r->memory.framework_bytes = 1 * GiB + 1;
    og_set(&r->event.requested_bytes, 1 * GiB + 512 * MiB); /* shortfall 512 MiB */
    diag(r);
    assert_false(has(r, "non_framework"));
    og_set(&r->memory.non_framework_bytes, 1 * GiB);
    diag(r);
    assert_true(has(r, "non_framework"));
    free(r);

    /* not above the shortfall: no */
    r = nonfw_base(5 * GiB);
    og_set(&r->event.requested_bytes, 7 * GiB); /* shortfall 6 GiB */
    diag(r);
    assert_false(has(r, "non_framework"));
    free(r);
}

static void non_framework_needs_nvml_and_framework(void **state)
{
    og_record_t *r = nonfw_base(8 * GiB);
    og_unset(&r->memory.process_used_bytes);
    og_unset(&r->memory.non_framework_bytes);
    og_unset(&r->memory.context_bytes_estimate);
    diag(r);
    assert_false(has(r, "non_framework"));
    free(r);

    r = nonfw_base(8 * GiB);
    r->framework = OG_FW_UNKNOWN;
    r->framework_libs[0] = 0;
    r->memory.framework_bytes = 0;
    og_set(&r->memory.non_framework_bytes, 20 * GiB);
    diag(r);
    assert_false(has(r, "non_framework"));
    free(r);
}

/* NCCL the largest library outside the framework, its buffers enlarged by the environment: the cause names the
 * settings in force and what a buffer above NCCL's 4 MiB default adds; without the settings, neither key */
static void non_framework_names_nccl_settings(void **state)
{
    og_record_t *r = nonfw_base(8 * GiB + 500 * MiB);
    strcpy(r->memory.by_library[1].library, "/usr/lib/libnccl.so.2"); /* 8 GiB */
    diag(r);
    const og_cause_t *c = find(r, "non_framework");
    assert_non_null(c->id);
    assert_null(evt(c, "library_settings"));
    assert_true(ev(c, "settings_excess_bytes") < 0);
    strcpy(r->env[r->nenv++], "NCCL_BUFFSIZE=0x4000000"); /* 64 MiB, as NCCL reads it (base 0) */
    strcpy(r->env[r->nenv++], "NCCL_MIN_NCHANNELS=32");
    diag(r);
    c = find(r, "non_framework");
    assert_string_equal(evt(c, "library_settings"), "NCCL_BUFFSIZE=67108864 NCCL_MIN_NCHANNELS=32");
    assert_true(ev(c, "settings_excess_bytes") == (double)(8 * GiB - 512 * MiB)); /* 8 GiB x (1 - 4/64) */
    free(r);
}

/* ------------------------------------------------------------------ growth */

/* event history (ev_reset, ev_add, leak_loop): analysis_fixture.h */

static void growth_is_a_pattern_of_steps(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    ev_add(r, 0, "alloc", 8 * GiB);              /* the model: another size, not a step */
    leak_loop(r, 40, 0.1, 512 * MiB, 300 * MiB); /* 40 steps, 300 MiB kept each */
    diag(r);
    const og_cause_t *c = find(r, "growth");
    assert_non_null(c->id);
    assert_int_equal((uint64_t)ev(c, "rise_per_step_bytes"), 300 * MiB);
    assert_int_equal((uint64_t)ev(c, "steps"), 40);
    assert_string_equal(evt(c, "rising_steps"), "39 of 39");
    assert_true(c->confidence >= 0.7);
    assert_non_null(strstr(c->summary, "300 MiB per step"));

    /* the same loop 100x faster (1 ms steps): still a leak, same numbers */
    ev_reset(r);
    leak_loop(r, 40, 0.001, 512 * MiB, 300 * MiB);
    diag(r);
    assert_int_equal((uint64_t)ev(find(r, "growth"), "rise_per_step_bytes"), 300 * MiB);

    /* a flat sawtooth: nothing kept, no growth */
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 0);
    diag(r);
    assert_false(has(r, "growth"));

    /* too few steps */
    ev_reset(r);
    leak_loop(r, 5, 0.1, 512 * MiB, 300 * MiB);
    diag(r);
    assert_false(has(r, "growth"));
    free(r);
}

/* the same staircase where what rose is tensors torch.load restored onto the GPU and a Python object holds
 * (roles.holders[].restored_bytes): shards arriving, a load and not a leak (growth.restored_load); a holder whose
 * restored bytes fall short of the rise leaves the growth */
static void growth_restored_by_torch_load(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 300 * MiB);
    fixture_roles(r, 0, 0, 0, 0, 40 * 300 * MiB, 512 * MiB);
    fixture_holder(r, "self.shards", "list", "on TopKDataset", 40 * 300 * MiB);
    og_set(&r->memory.fw.roles.holders[0].restored, 40 * 300 * MiB);
    diag(r);
    assert_false(has(r, "growth"));
    assert_true(r->analysis.facts.growth.restored_load);
    og_set(&r->memory.fw.roles.holders[0].restored, 20 * 300 * MiB);
    diag(r);
    assert_true(has(r, "growth"));
    assert_false(r->analysis.facts.growth.restored_load);
    free(r);
}

/* the same staircase where what rose is one library's outside the framework, taken at one time (50 camera threads
 * each loading its engine through ctypes): the framework's libraries hold less than the rise, so they cannot be
 * keeping it; state set up once, not a leak (growth.library_setup).  Taken across the run, or with the framework
 * holding as much as the rise, or no adapter measuring the framework, the growth reads as before */
static void growth_in_a_library_set_up_once(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 300 * MiB);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 1 * GiB);
    r->memory.framework_bytes = 2 * GiB;
    r->memory.by_library[0].bytes = 2 * GiB;
    r->memory.nlibs = 2;
    og_lib_usage_t *u = &r->memory.by_library[1];
    strcpy(u->library, "libffi.so.8");
    u->bytes = 40 * 300 * MiB;
    u->by_quarter_known = true;
    u->by_quarter[1] = u->bytes;
    diag(r);
    assert_false(has(r, "growth"));
    assert_true(r->analysis.facts.growth.library_setup);
    u->by_quarter[1] = u->bytes / 2; /* taken across the run: a library's leak stays a growth */
    u->by_quarter[2] = u->bytes / 2;
    diag(r);
    assert_true(has(r, "growth"));
    assert_false(r->analysis.facts.growth.library_setup);
    u->by_quarter[1] = u->bytes;
    u->by_quarter[2] = 0;
    r->memory.framework_bytes = 40 * 300 * MiB; /* the framework could be keeping it */
    diag(r);
    assert_true(has(r, "growth"));
    r->memory.framework_bytes = 2 * GiB;
    r->memory.fw.roles.has = false; /* no adapter measured the framework */
    diag(r);
    assert_true(has(r, "growth"));
    free(r);
}

/* the same staircase where what rose is an LRU a service keeps (self.entries on ChunkStore) that reached the byte
 * budget its object names (roles.holders[].bound_bytes): a cache filling to its bound, no leak; growth stays a side
 * finding below the splinters' 0.5, its evidence naming the holder and the bound.  Short of its bound (under 9/10),
 * or with no bound named, the growth reads as before */
static void growth_of_a_cache_at_its_bound(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 300 * MiB);
    fixture_roles(r, 0, 0, 0, 0, 40 * 300 * MiB, 512 * MiB);
    fixture_holder(r, "self.entries", "OrderedDict", "on ChunkStore", 40 * 300 * MiB);
    diag(r);
    double leak = find(r, "growth")->confidence;
    assert_true(leak > 0.45);
    og_set(&r->memory.fw.roles.holders[0].bound_bytes, 41 * 300 * MiB);
    diag(r);
    assert_true(r->analysis.facts.growth.bounded);
    assert_int_equal(r->analysis.facts.roles.bounded, 0);
    assert_true(find(r, "growth")->confidence <= 0.45);
    assert_string_equal(evt(find(r, "growth"), "bounded_holder"), "self.entries (OrderedDict, on ChunkStore)");
    assert_true(ev(find(r, "growth"), "bound_bytes") == 41.0 * 300 * MiB);
    og_test_check_text(find(r, "growth")->summary);
    og_set(&r->memory.fw.roles.holders[0].bound_bytes, 48 * 300 * MiB); /* 40 of 48: short of its bound */
    diag(r);
    assert_false(r->analysis.facts.growth.bounded);
    assert_true(find(r, "growth")->confidence == leak);
    og_unset(&r->memory.fw.roles.holders[0].bound_bytes); /* a bound in entries, reached */
    og_set(&r->memory.fw.roles.holders[0].bound_records, 40);
    r->memory.fw.roles.holders[0].records = 40;
    diag(r);
    assert_true(r->analysis.facts.growth.bounded);
    free(r);
}

/* the same staircase where what rose is the models' parameters in a job that does not train: weights arriving (a
 * generation job loading its models), not a leak (growth.weights_load); an optimizer's step, parameters well short of
 * the rise, a second copy of one model (a model reloaded and kept), a registry of models by key, or parameters still
 * off the device (an offloading loop moving weights here) leave the growth; a local's pool of 4 tensors made within
 * one step (an engine's KV cache) is part of the load beside the weights; the same tensors grown a little every step
 * (a cache extended token by token), or the same bytes in tensors of a step's size, are kept a step at a time: a
 * growth; so are LoRA adapters at least half the other weights (one per job, kept), named in its evidence */
static void growth_is_the_weights_arriving(void **state)
{
    static const struct {
        const char *what;
        uint64_t params;
        int training;  /* the adapter's flag: 1 an optimizer step ran */
        int copies;    /* models of one class and size */
        bool keyed;    /* held by a map's key (models[key]): a registry of models */
        uint64_t away; /* of each, parameters still off the device */
        int pool;      /* tensors of a local's 13 GiB beside the parameters (0 none) */
        bool burst;    /* the pool made within one step (else the steps' rises carry it) */
        bool load;
        bool kept;     /* the pool's holder an attribute kept across calls (not a local of main) */
        uint64_t lora; /* of the parameters, LoRA adapters' */
    } rows[] = {
        { "the weights arriving", 36 * 500 * MiB, 0, 1, false, 0, 0, false, true, false, 0 },
        { "an optimizer stepped: the job trains", 36 * 500 * MiB, 1, 1, false, 0, 0, false, false, false, 0 },
        { "parameters half the rise", 20 * 500 * MiB, 0, 1, false, 0, 0, false, false, false, 0 },
        { "two copies of one model: one reloaded and kept", 36 * 500 * MiB, 0, 2, false, 0, 0, false, false, false, 0 },
        { "a registry of models by key", 36 * 500 * MiB, 0, 2, true, 0, 0, false, false, false, 0 },
        { "parameters still elsewhere: weights coming and going", 36 * 500 * MiB, 0, 1, false, 1 * GiB, 0, false, false,
          false, 0 },
        { "a pool made within one step beside the weights", 36 * 500 * MiB, 0, 1, false, 0, 4, true, true, false, 0 },
        { "the same tensors grown a little every step", 10 * 500 * MiB, 0, 1, false, 0, 4, false, false, false, 0 },
        { "the same bytes in tensors of a step's size", 10 * 500 * MiB, 0, 1, false, 0, 26, false, false, false, 0 },
        { "a pool made within one step, kept across calls", 36 * 500 * MiB, 0, 1, false, 0, 4, true, true, true, 0 },
        { "kept across calls in tensors of a step's size", 10 * 500 * MiB, 0, 1, false, 0, 26, false, false, true, 0 },
        { "LoRA adapters piled on the weights, one per job", 36 * 500 * MiB, 0, 1, false, 0, 0, false, false, false,
          26 * 500 * MiB },
        { "one LoRA adapter beside its base", 36 * 500 * MiB, 0, 1, false, 0, 0, false, true, false, 500 * MiB },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = base();
        ev_reset(r);
        leak_loop(r, rows[i].burst ? 20 : 40, 0.1, 512 * MiB, 500 * MiB);
        if (rows[i].burst) { /* the engine's pool made between two steps, then the steps go on */
            for (int k = 0; k < rows[i].pool; k++)
                ev_add(r, 2.0 + 0.001 * k, "alloc", 26 * 500 * MiB / (uint64_t)rows[i].pool);
            for (int s = 0; s < 20; s++) {
                ev_add(r, 2.01 + 0.1 * s, "alloc", 512 * MiB);
                ev_add(r, 2.01 + 0.1 * s + 0.025, "alloc", 500 * MiB);
                ev_add(r, 2.01 + 0.1 * s + 0.05, "free", 512 * MiB);
            }
        }
        fixture_roles(r, rows[i].params, 0, 0, 0, rows[i].pool ? 26 * 500 * MiB : 0, 512 * MiB);
        if (rows[i].pool) {
            fixture_holder(r, rows[i].kept ? "self.llm" : "llm", "LLM",
                           rows[i].kept ? "on Server" : "local in main (best_of_n.py:7)", 26 * 500 * MiB);
            r->memory.fw.roles.holders[0].tensors = (uint64_t)rows[i].pool;
        }
        r->memory.fw.training = rows[i].training;
        fixture_model(r, "LlamaForCausalLM", rows[i].params / (uint64_t)rows[i].copies, rows[i].copies, false);
        if (rows[i].keyed)
            fixture_model_held(r, rows[i].copies, 0, "models[key]");
        r->memory.fw.roles.models[0].away = rows[i].away;
        if (rows[i].lora)
            og_set(&r->memory.fw.roles.lora_bytes, rows[i].lora);
        diag(r);
        if (has(r, "growth") == rows[i].load || r->analysis.facts.growth.weights_load != rows[i].load)
            fail_msg("%s: growth %d, weights_load %d", rows[i].what, has(r, "growth"),
                     r->analysis.facts.growth.weights_load);
        /* the adapters named in the growth's evidence where they are the pile that rose */
        if (ev(find(r, "growth"), "lora_parameters_bytes") != (rows[i].lora > 500 * MiB ? (double)rows[i].lora : -1))
            fail_msg("%s: lora_parameters_bytes %g", rows[i].what, ev(find(r, "growth"), "lora_parameters_bytes"));
        free(r);
    }
}

/* a growth of few steps beside another process: what Python keeps across calls (a global dict) holds the rise, so the
 * growth is measured and leads the other process's memory (a leak fills any card); without the holder the few steps
 * are a weaker reading than the others' bytes */
static void growth_kept_leads_others(void **state)
{
    for (int held = 1; held >= 0; held--) {
        og_record_t *r = base();
        fixture_growth_beside_other(r, held);
        diag(r);
        assert_true(has(r, "growth"));
        assert_true(has(r, "foreign_memory"));
        assert_string_equal(r->diagnosis.primary, held ? "growth" : "foreign_memory");
        free(r);
    }
}

static void growth_excludes_loading(void **state)
{
    og_record_t *r = base();
    /* 20 shards of 1 GiB over 2 s, then a 2 GiB request fails: a load and a real shortfall */
    ev_reset(r);
    for (int i = 0; i < 20; i++)
        ev_add(r, 0.1 * (i + 1), "alloc", GiB);
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    diag(r);
    assert_false(has(r, "growth"));
    assert_string_equal(r->diagnosis.primary, "does_not_fit");

    /* 24 shards of the failing size in one burst: one step, not 24 */
    ev_reset(r);
    for (int i = 0; i < 24; i++)
        ev_add(r, 0.001, "alloc", GiB);
    og_set(&r->event.requested_bytes, GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    diag(r);
    assert_false(has(r, "growth"));
    assert_true(has(r, "does_not_fit"));
    assert_non_null(evt(find(r, "does_not_fit"), "phase"));
    assert_string_equal(evt(find(r, "does_not_fit"), "phase"), "loading");

    /* a leak whose first step also loads the optimizer state: the rate is the typical step */
    ev_reset(r);
    ev_add(r, 0.01, "alloc", 300 * MiB);
    ev_add(r, 0.02, "alloc", 12 * GiB);
    for (int s = 1; s < 12; s++)
        ev_add(r, 0.1 * s, "alloc", 300 * MiB);
    og_set(&r->event.requested_bytes, 300 * MiB);
    diag(r);
    assert_int_equal((uint64_t)ev(find(r, "growth"), "rise_per_step_bytes"), 300 * MiB);

    /* the rise is the framework's measured cache (a pool keeping what it handed out): no leak */
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 300 * MiB);
    og_set(&r->memory.framework_cached_bytes, 12 * GiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    diag(r);
    assert_false(has(r, "growth"));
    free(r);
}

/* the leak is not what failed: small kept tensors (the size seen most often), or kept outputs of
 * varying sizes, while a large temporary could not be allocated */
static void growth_of_other_sizes(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    ev_add(r, 0, "alloc", 20 * GiB);
    for (int s = 0; s < 400; s++)
        ev_add(r, 0.01 + 0.004 * s, "alloc", 2 * MiB); /* one small segment every few requests */
    og_set(&r->event.requested_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 256 * MiB);
    diag(r);
    const og_cause_t *c = find(r, "growth");
    assert_non_null(c->id);
    assert_int_equal((uint64_t)ev(c, "rise_per_step_bytes"), 2 * MiB);
    assert_non_null(strstr(c->summary, "the size allocated most often"));

    ev_reset(r);
    ev_add(r, 0, "alloc", 8 * GiB);
    unsigned seed = 7;
    for (int s = 0; s < 60; s++) {
        seed = seed * 1103515245u + 12345u;
        ev_add(r, 0.03 * (s + 1), "alloc", (40 + (seed >> 8) % 261) * MiB);
    }
    og_set(&r->event.requested_bytes, 512 * MiB);
    diag(r);
    c = find(r, "growth");
    assert_non_null(c->id);
    assert_non_null(strstr(c->summary, "varying sizes"));
    assert_true(ev(c, "rise_per_step_bytes") >= 40.0 * MiB && ev(c, "rise_per_step_bytes") <= 300.0 * MiB);
    free(r);
}

static void growth_thresholds(void **state)
{
    og_record_t *r = base();
    /* total rise below 5% of 24 GiB: no */
    ev_reset(r);
    leak_loop(r, 20, 0.1, 256 * MiB, 60 * MiB); /* 19 x 60 MiB = 1.11 GiB < 1.2 GiB */
    diag(r);
    assert_false(has(r, "growth"));
    ev_reset(r);
    leak_loop(r, 22, 0.1, 256 * MiB, 60 * MiB); /* 21 x 60 MiB = 1.23 GiB */
    diag(r);
    assert_true(has(r, "growth"));
    /* rising in fewer than 70% of the steps: no */
    ev_reset(r);
    for (int s = 0; s < 20; s++) {
        ev_add(r, 0.1 * s, "alloc", 256 * MiB);
        if (s % 2)
            ev_add(r, 0.1 * s + 0.01, "alloc", 200 * MiB);
        ev_add(r, 0.1 * s + 0.02, "free", 256 * MiB);
    }
    og_set(&r->event.requested_bytes, 256 * MiB);
    diag(r);
    assert_false(has(r, "growth"));
    free(r);
}

/* ------------------------------------------------------------------ cache_held */

static void cache_held_other_library(void **state)
{
    og_record_t *r = base();
    strcpy(r->event.library, "/usr/lib/libnccl.so.2");
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB); /* shortfall 512 MiB */
    og_set(&r->memory.framework_cached_bytes, 512 * MiB - 1);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    diag(r);
    assert_false(has(r, "cache_held"));

    og_set(&r->memory.framework_cached_bytes, 6 * GiB);
    diag(r);
    const og_cause_t *c = find(r, "cache_held");
    assert_non_null(c->id);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    assert_string_equal(evt(c, "failing_library"), "libnccl.so.2");
    assert_non_null(strstr(c->summary, "libnccl.so.2"));
    assert_non_null(strstr(c->summary, "6.00 GiB"));
    assert_false(has(r, "fragmentation")); /* not the framework's own allocation */

    /* the framework itself failed: that is fragmentation, not cache_held */
    strcpy(r->event.library, "libc10_cuda.so");
    diag(r);
    assert_false(has(r, "cache_held"));
    assert_true(has(r, "fragmentation"));

    /* library unknown: cannot say */
    r->event.library[0] = 0;
    diag(r);
    assert_false(has(r, "cache_held"));
    free(r);
}

/* ------------------------------------------------------------------ limit */

static void limit_cause(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.free_bytes, 10 * GiB);
    og_set(&r->device.limit_bytes, 21 * GiB);
    og_set(&r->event.requested_bytes, 2 * GiB);
    r->event.caused_by_limit = true;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "limit");
    const og_cause_t *c = find(r, "limit");
    assert_true(c->confidence == 1.0);
    assert_int_equal((uint64_t)ev(c, "limit_bytes"), 21 * GiB);
    assert_int_equal((uint64_t)ev(c, "job_need_bytes"), 22 * GiB);
    assert_non_null(strstr(c->summary, "device itself had room"));
    /* free under the limit is 1 GiB: shortfall 1 GiB, not 0 */
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 1 * GiB);

    /* a limit that is set but did not refuse: no limit cause */
    r->event.caused_by_limit = false;
    diag(r);
    assert_false(has(r, "limit"));
    free(r);
}

/* ------------------------------------------------------------------ unknown, zero, huge */

static void nothing_holds_is_unknown(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 512 * MiB); /* fits in the 1 GiB free */
    diag(r);
    assert_int_equal(r->diagnosis.ncauses, 1);
    assert_string_equal(r->diagnosis.primary, "unknown");
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 0);
    assert_non_null(strstr(r->diagnosis.causes[0].summary, "512 MiB requested"));
    assert_non_null(strstr(r->diagnosis.causes[0].summary, "not measured"));
    free(r);
}

/* no word of the summaries says a byte count of nothing: "0 B missing", "short by 0 B", "0 B is free" */
static void no_zero_figure(const char *s)
{
    static const char *bad[] = { " 0 B missing", " 0 B short",  "short by 0 B",
                                 "the 0 B",      "0 B is free", "(0 B was missing)" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (strstr(s, bad[i]))
            fail_msg("'%s' in: %s", bad[i], s);
}

/* every cause: no shortfall evidence as a number, no zero figure in the summary */
static void shortfall_nowhere(const og_record_t *r)
{
    assert_false(og_known(r->diagnosis.shortfall_bytes));
    for (int i = 0; i < r->diagnosis.ncauses; i++) {
        const og_cause_t *c = &r->diagnosis.causes[i];
        double v = ev(c, "shortfall_bytes");
        assert_true(v == -1 || v == -2); /* absent, or text ("not measured") */
        no_zero_figure(c->summary);
    }
}

/* the device's free memory not read and no total to estimate it from: the shortfall is unknown, not 0; no
 * cause claims to cover it, none says a figure for it */
static void free_unknown_shortfall_unknown(void **state)
{
    og_record_t *r = base();
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    diag(r);
    check_shape(r);
    shortfall_nowhere(r);
    /* a measured cache with a small largest block: fragmentation, whose evidence does not say 0 is missing */
    fixture_article_fragmentation(r, 256 * MiB);
    fixture_adapter(r, 22528 * MiB, (22528 - 3072) * MiB, 256 * MiB); /* 3 GiB cached: more than the request */
    og_unset(&r->device.free_bytes);
    diag(r);
    check_shape(r);
    assert_true(has(r, "fragmentation"));
    shortfall_nowhere(r);
    assert_string_equal(evt(find(r, "fragmentation"), "shortfall_bytes"), "not measured");
    free(r);

    /* released between attempts, and the retry succeeded: not "0.9, it covers the shortfall", which is unknown */
    r = base();
    r->status = "recovered";
    r->event.recovered = true;
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    og_set(&r->memory.framework_cached_bytes, 3 * GiB);
    r->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
    og_set(&r->event.released_between_attempts_bytes, 3 * GiB);
    r->event.attempts = 2;
    diag(r);
    check_shape(r);
    shortfall_nowhere(r);
    assert_string_equal(evt(find(r, "fragmentation"), "rule"), "recovered_by_release");
    assert_true(find(r, "fragmentation")->confidence < 0.9);
    /* measured: the same numbers with 1 GiB free say 1 GiB short, covered by the 3 GiB released */
    og_set(&r->device.free_bytes, 1 * GiB);
    diag(r);
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 1 * GiB);
    assert_true(ev(find(r, "fragmentation"), "shortfall_bytes") == (double)GiB); /* a figure, as measured */
    free(r);
}

/* nothing holds and nothing of the device was measured: the summary names what is missing, and says no 0 B */
static void unknown_names_what_was_not_measured(void **state)
{
    og_record_t *r = base();
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    og_unset(&r->memory.process_tracked_bytes);
    og_unset(&r->memory.other_processes_bytes);
    r->memory.framework_bytes = 0;
    r->memory.nlibs = 0;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "unknown");
    const char *s = r->diagnosis.causes[0].summary;
    assert_non_null(strstr(s, "2.00 GiB requested"));
    assert_non_null(strstr(s, "free memory, total memory, tracked memory, other processes"));
    assert_null(strstr(s, "0 B"));
    free(r);
}

static void zero_record(void **state)
{
    og_record_t *r = calloc(1, sizeof *r);
    og_diagnose(r, NULL);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "unknown");
    /* every count that can go unmeasured unknown, every plain count (a request, the ledger's sums) at its
     * largest: a SIZE_MAX request of a process whose device was never read */
    og_set(&r->event.requested_bytes, UINT64_MAX);
    og_unset(&r->device.total_bytes);
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.limit_bytes);
    og_unset(&r->memory.process_tracked_bytes);
    og_unset(&r->memory.process_used_bytes);
    r->memory.framework_bytes = UINT64_MAX;
    og_unset(&r->memory.framework_cached_bytes);
    og_unset(&r->memory.non_framework_bytes);
    og_unset(&r->memory.context_bytes_estimate);
    og_unset(&r->memory.other_processes_bytes);
    r->memory.pool_reserved = r->memory.pool_used = UINT64_MAX;
    r->history.nsamples = 100; /* all zero samples at t = 0 */
    og_diagnose(r, NULL);
    check_shape(r);
    assert_string_equal(r->diagnosis.primary, "unknown");
    og_diagnose(NULL, NULL); /* no crash */
    free(r);
}

static void huge_values(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, UINT64_MAX - 2);
    og_set(&r->device.total_bytes, UINT64_MAX - 2);
    og_set(&r->device.free_bytes, UINT64_MAX - 3);
    og_set(&r->memory.framework_cached_bytes, UINT64_MAX - 2);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    og_set(&r->memory.other_processes_bytes, UINT64_MAX - 2);
    og_set(&r->memory.process_used_bytes, UINT64_MAX - 2);
    og_set(&r->memory.non_framework_bytes, UINT64_MAX - 2);
    ev_reset(r);
    for (int i = 0; i < 64; i++)
        FIXTURE_EV[r->history.nevents++] =
            (struct og_hist_ev){ .t_rel = i, .op = OG_OP_ALLOC, .bytes = UINT64_MAX - 4, .live = (uint64_t)i << 57 };
    diag(r);
    assert_int_equal(fx_v(r->diagnosis.shortfall_bytes), 1);

    og_set(&r->device.free_bytes, 0);
    og_set(&r->memory.framework_cached_bytes, 0);
    diag(r);
    assert_true(has(r, "does_not_fit"));
    free(r);
}

static void bad_thresholds_fall_back(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 0);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    r->memory.framework_bytes = 16 * GiB;
    og_set(&r->memory.framework_cached_bytes, 4 * GiB); /* 25%: holds with the default */
    og_thresholds_t bad = {
        .frag_share = -1, .nonfw_share = 0, .growth_min_share = 2, .growth_rising_steps = 0.0 / 0.0
    };
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
    og_set(&r->device.free_bytes, 0);
    og_set(&r->device.limit_bytes, 20 * GiB); /* == tracked: nothing free under the limit */
    r->event.caused_by_limit = true;
    diag(r);
    assert_int_equal(r->diagnosis.ncauses, 2);
    assert_string_equal(r->diagnosis.causes[0].id, "limit");
    assert_string_equal(r->diagnosis.causes[1].id, "does_not_fit");
    /* with the cache measured both are certain: the priority decides */
    og_set(&r->memory.framework_cached_bytes, 0);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    diag(r);
    assert_true(r->diagnosis.causes[0].confidence == 1.0 && r->diagnosis.causes[1].confidence >= 0.95);
    assert_string_equal(r->diagnosis.causes[0].id, "limit");

    /* non_framework (0.55) narrowly beats foreign_memory (0.50) despite priority: margins matter */
    og_record_t *q = base();
    og_set(&q->event.requested_bytes, 2 * GiB);
    og_set(&q->memory.process_used_bytes, 20 * GiB);
    q->memory.framework_bytes = 16 * GiB;
    og_set(&q->memory.non_framework_bytes, 4 * GiB);
    og_set(&q->memory.other_processes_bytes, 1 * GiB);
    og_diagnose(q, &TH);
    check_shape(q);
    assert_string_equal(q->diagnosis.causes[0].id, "non_framework");
    assert_string_equal(q->diagnosis.causes[1].id, "foreign_memory");
    free(q);
    free(r);
}


/* ------------------------------------------------------------------ the evidence model */

/* cuDNN fails while PyTorch holds 16 GiB whose cache was not measured: unknown is not zero */
static void unknown_cache_keeps_cache_cause(void **state)
{
    og_record_t *r = base();
    strcpy(r->event.library, "libcudnn.so.9");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    r->memory.framework_bytes = 16 * GiB;
    r->memory.by_library[0].bytes = 16 * GiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    const og_cause_t *c = find(r, "cache_held");
    assert_true(c->confidence >= 0.4 && c->confidence <= 0.65); /* an input was not measured */
    assert_non_null(strstr(c->summary, "not measured"));
    assert_null(strstr(c->summary, "live"));
    assert_string_equal(evt(c, "cached_bytes"), "not measured");
    const og_cause_t *d = find(r, "does_not_fit");
    assert_true(d->id == NULL || d->confidence <= 0.45); /* never a confident does_not_fit */
    /* measured (adapter) and small: the cache cannot cover it, does_not_fit is certain */
    fixture_adapter(r, 16 * GiB, 16 * GiB - 100 * MiB, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_true(find(r, "does_not_fit")->confidence >= 0.9);
    free(r);
}

/* other_framework leads, JAX's memory blamed for PyTorch's failure: the cause */
static const og_cause_t *jax_over_pytorch(const og_record_t *r)
{
    assert_string_equal(r->diagnosis.primary, "other_framework");
    const og_cause_t *c = find(r, "other_framework");
    assert_string_equal(evt(c, "framework"), "jax");
    assert_string_equal(evt(c, "failing_framework"), "pytorch");
    return c;
}

/* JAX preallocated 75% and PyTorch fails in the same process */
static void second_framework_reservation(void **state)
{
    og_record_t *r = base();
    fixture_second_framework(r);
    diag(r);
    const og_cause_t *c = jax_over_pytorch(r);
    assert_non_null(strstr(c->summary, "JAX holds 18.00 GiB"));
    assert_non_null(strstr(c->summary, "75%"));
    free(r);
}

/* the same, PyTorch's 5 GiB reservation splintered (400 MiB cached, its largest free block 80 MiB below a 252 MiB
 * request that the cache would cover): the splinters are in the sliver JAX's preallocation left, and that grab leads;
 * JAX holding less than PyTorch, or under half the device, leaves the textbook fragmentation first */
static void fragmentation_in_a_squeezed_reservation(void **state)
{
    og_record_t *r = base();
    fixture_second_framework(r);
    og_set(&r->event.requested_bytes, 252 * MiB);
    og_set(&r->device.free_bytes, 164 * MiB);
    fixture_adapter(r, 5 * GiB, 5 * GiB - 400 * MiB, 80 * MiB);
    diag(r);
    jax_over_pytorch(r);
    const og_cause_t *f = find(r, "fragmentation");
    assert_non_null(f->id);
    assert_true(f->confidence <= 0.7 + 1e-9);
    r->memory.nlibs = 0;
    fixture_fw_lib(r, "xla_extension.so", 10 * GiB, OG_FW_JAX); /* under half of 24 GiB */
    fixture_fw_lib(r, "libc10_cuda.so", 5 * GiB, OG_FW_PYTORCH);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_true(find(r, "fragmentation")->confidence > 0.85);
    free(r);
}

/* the same, both frameworks reaching the driver through one library (ctypes): by_library puts all 23 GiB under
 * PyTorch; JAX's adapter read its 18 GiB arena and PyTorch's its 5 GiB reservation */
static void second_framework_one_library(void **state)
{
    og_record_t *r = base();
    fixture_second_framework(r);
    r->memory.nlibs = 0;
    fixture_fw_lib(r, "libffi.so.8", 23 * GiB, OG_FW_PYTORCH);
    strcpy(r->event.library, "libffi.so.8");
    fixture_adapter(r, 5 * GiB, 5 * GiB, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit"); /* not read: nothing says it is JAX's */
    r->memory.fw.nother_fw = 1;
    og_other_framework_t *o = &r->memory.fw.other_fw[0];
    strcpy(o->framework, "jax");
    og_set(&o->reserved_bytes, 18 * GiB);
    og_set(&o->in_use_bytes, 1 * GiB);
    og_set(&o->limit_bytes, 18 * GiB);
    diag(r);
    const og_cause_t *c = jax_over_pytorch(r);
    assert_non_null(strstr(c->summary, "JAX holds 18.00 GiB"));
    free(r);
}

/* Causes rank by confidence + bonus in thousandths; an exact tie keeps the list's order (common/causes.def).
 * JAX holds 9.3 of the 24 GiB (other_framework: 0.75 + 0.2 x 0.3875 / 0.5 = 0.905, + 0.045) and every input
 * is measured (does_not_fit: 0.95, + 0): both score 0.950, and other_framework, earlier in the list, leads.
 * A little less or more JAX and the scores decide. */
static void exact_tie_keeps_list_order(void **state)
{
    static const struct {
        uint64_t jax;
        const char *first, *second;
    } rows[] = {
        { 93 * GiB / 10, "other_framework", "does_not_fit" },   /* 950 = 950: the list's order */
        { 925 * GiB / 100, "does_not_fit", "other_framework" }, /* 949 < 950 */
        { 935 * GiB / 100, "other_framework", "does_not_fit" }, /* 951 > 950 */
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = base();
        fixture_second_framework(r);
        r->memory.nlibs = 0;
        fixture_fw_lib(r, "xla_extension.so", rows[i].jax, OG_FW_JAX);
        fixture_fw_lib(r, "libc10_cuda.so", 23 * GiB - rows[i].jax, OG_FW_PYTORCH);
        og_set(&r->memory.framework_cached_bytes, 0); /* measured: nothing cached */
        r->memory.framework_cached_source = OG_CACHE_POOL;
        diag(r);
        check_shape(r);
        assert_int_equal(r->diagnosis.ncauses, 2);
        assert_string_equal(r->diagnosis.causes[0].id, rows[i].first);
        assert_string_equal(r->diagnosis.causes[1].id, rows[i].second);
        if (i == 0) /* the tie itself (a formula changed? pick the bytes that tie again) */
            assert_int_equal(score(&r->diagnosis.causes[0]), score(&r->diagnosis.causes[1]));
        free(r);
    }
}

static void peer_ranks_and_workers(void **state)
{
    og_record_t *r = base();
    fixture_peer_ranks(r);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "peer_ranks");
    assert_false(has(r, "foreign_memory")); /* the job's own ranks are not "others" */
    const og_cause_t *c = find(r, "peer_ranks");
    assert_true(c->confidence >= 0.85);
    assert_non_null(strstr(c->summary, "7 other ranks of this job"));
    assert_non_null(strstr(c->summary, "hold 3.50 GiB on GPU 0, about one CUDA context each"));
    assert_true(ev(c, "node_ranks") < 0); /* 8 ranks, 8 GPUs: not the key of ranks sharing a GPU */
    /* the same 8 ranks on a machine with 4 GPUs: ranks share a GPU, the summary says so (no "never select") */
    r->visible_devices = 4;
    diag(r);
    c = find(r, "peer_ranks");
    assert_int_equal((int)ev(c, "node_ranks"), 8);
    assert_non_null(strstr(c->summary, "which has 4 visible GPUs"));
    assert_null(strstr(c->summary, "never select"));
    r->visible_devices = 8;
    /* one child of this one with a rank of its own (Lightning's launcher runs the script again with LOCAL_RANK): a
     * rank this process launched, not a worker */
    r->memory.nother = 1;
    r->memory.other[0].child = true;
    r->memory.other[0].bytes = 3 * GiB;
    og_set(&r->memory.other_processes_bytes, 3 * GiB);
    diag(r);
    c = find(r, "peer_ranks");
    assert_int_equal((int)ev(c, "children"), 0);
    assert_int_equal((int)ev(c, "peers"), 1);
    /* one worker process, a child of this one with no rank: singular, and named as a worker */
    r->memory.other[0].rank = -1;
    diag(r);
    c = find(r, "peer_ranks");
    assert_non_null(c->id);
    assert_int_equal((int)ev(c, "children"), 1);
    assert_non_null(strstr(c->summary, "1 child process of this process"));
    assert_non_null(strstr(c->summary, "holds 3.00 GiB"));
    assert_true(ev(c, "child_programs") < 0);
    /* the child runs another program (an evaluation script it started): named as such, and counted */
    r->memory.other[0].other_program = true;
    diag(r);
    c = find(r, "peer_ranks");
    assert_non_null(strstr(c->summary, "1 process this process started, running another program"));
    assert_null(strstr(c->summary, "DataLoader"));
    assert_int_equal((int)ev(c, "child_programs"), 1);
    free(r);
}

/* a pre-fork server: three other workers of this process's parent (same command, no launcher
 * variables) each hold a copy of the model: this job's workers, counted as peers with evidence */
static void prefork_workers_are_this_job(void **state)
{
    og_record_t *r = base();
    fixture_prefork_workers(r);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "peer_ranks");
    assert_false(has(r, "foreign_memory"));
    const og_cause_t *c = find(r, "peer_ranks");
    assert_int_equal((int)ev(c, "siblings"), 3);
    assert_int_equal((int)ev(c, "parent"), 0);
    assert_int_equal((uint64_t)ev(c, "peers_bytes"), 15 * GiB);
    free(r);
}

static void dataparallel_imbalance(void **state)
{
    og_record_t *r = base();
    fixture_imbalance(r);
    diag(r);
    const og_cause_t *c = find(r, "imbalance");
    assert_non_null(c->id);
    assert_string_equal(r->diagnosis.primary, "imbalance");
    assert_non_null(strstr(c->summary, "3 other GPUs"));
    /* a DDP rank (world_size > 1) is one process per GPU: no imbalance of this kind */
    r->world_size = 4;
    diag(r);
    assert_false(has(r, "imbalance"));
    /* balanced: no */
    r->world_size = -1;
    r->summary[0].tracked_bytes = 8 * GiB;
    diag(r);
    assert_false(has(r, "imbalance"));
    free(r);
}

static void pools_whose_cache(void **state)
{
    /* the application's own pool keeps 12 GiB: its cache, not "does not fit" */
    og_record_t *r = base();
    fixture_app_pool(r);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    assert_string_equal(evt(find(r, "cache_held"), "holder"), "application_pool");
    assert_false(has(r, "does_not_fit"));
    assert_false(has(r, "fragmentation"));
    free(r);

    /* PyTorch's cudaMallocAsync pool (the framework's own) and NCCL failing: the framework's cache */
    r = base();
    strcpy(r->event.library, "libnccl.so.2");
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    r->memory.pool_reserved = 20 * GiB;
    r->memory.pool_used = 8 * GiB;
    r->memory.pool_owner_fw = 1;
    og_set(&r->memory.framework_cached_bytes, 12 * GiB);
    r->memory.framework_cached_source = OG_CACHE_POOL;
    og_set(&r->memory.process_used_bytes, 20 * GiB + 512 * MiB);
    og_set(&r->memory.non_framework_bytes, 512 * MiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    assert_false(has(r, "non_framework"));
    free(r);
}

/* Unknown is not zero: without NVML the process list is unknown; 14 GiB that neither this process's
 * allocations nor its context explain point at other processes, as an inference, never as "0 B" */
static void no_nvml_infers_other_processes(void **state)
{
    (void)state;
    og_record_t *r = base();
    og_set(&r->memory.process_tracked_bytes, 8 * GiB);
    r->memory.framework_bytes = r->memory.by_library[0].bytes = 8 * GiB;
    og_set(&r->device.free_bytes, 1 * GiB + 512 * MiB); /* 24 - 8 - 0.5 context - 14 others */
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_unset(&r->memory.other_processes_bytes);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "foreign_memory");
    const og_cause_t *c = find(r, "foreign_memory");
    assert_true(c->confidence < 0.9); /* an inference, not a measurement */
    assert_non_null(strstr(c->summary, "no NVML"));
    assert_true(ev(c, "other_inferred_bytes") == (double)(14 * GiB));
    free(r);

    /* the same numbers with a measured, empty process list: no other process to blame */
    r = base();
    og_set(&r->memory.process_tracked_bytes, 8 * GiB);
    r->memory.framework_bytes = r->memory.by_library[0].bytes = 8 * GiB;
    og_set(&r->device.free_bytes, 1 * GiB + 512 * MiB);
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->memory.other_processes_bytes, 0);
    og_set(&r->memory.process_used_bytes, 8 * GiB + 512 * MiB);
    diag(r);
    assert_false(has(r, "foreign_memory"));
    free(r);
}

static void recovered_keeps_the_failure(void **state)
{
    og_record_t *r = base();
    r->status = "recovered";
    r->event.recovered = true;
    r->event.attempts = 2;
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB); /* the numbers of the first attempt */
    og_set(&r->event.released_between_attempts_bytes, 6 * GiB);
    og_set(&r->memory.framework_cached_bytes, 6 * GiB);
    r->memory.framework_cached_source = OG_CACHE_RETRY_RELEASE;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_true(find(r, "fragmentation")->confidence >= 0.85);
    assert_non_null(strstr(find(r, "fragmentation")->summary, "retry succeeded"));
    assert_false(has(r, "does_not_fit")); /* the retry fit */
    free(r);
}

static void limit_speaks_the_checks_accounting(void **state)
{
    og_record_t *r = base();
    fixture_limit_by_context(r); /* a 400 MiB limit and a 512 MiB context: refused by the context alone */
    diag(r);
    const og_cause_t *c = find(r, "limit");
    assert_non_null(strstr(c->summary, "context alone"));
    assert_null(strstr(c->summary, " 0 B over"));
    assert_int_equal((uint64_t)ev(c, "context_bytes"), 512 * MiB);
    /* 16 GiB emulated: allocations + context + request, over by what it is */
    og_set(&r->memory.process_tracked_bytes, 15 * GiB);
    og_set(&r->device.limit_bytes, 16 * GiB);
    og_set(&r->device.limit_usage_bytes, 15 * GiB + 512 * MiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    diag(r);
    c = find(r, "limit");
    assert_non_null(strstr(c->summary, "512 MiB CUDA context"));
    assert_non_null(strstr(c->summary, "512 MiB over the limit"));
    free(r);
}

static void framework_cap_cause(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 12 * GiB, 11 * GiB, 0);
    r->memory.fw.internal_oom = true;
    og_set(&r->memory.fw.cap_bytes, 12 * GiB);
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.5)");
    og_set(&r->device.free_bytes, 10 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "framework_cap");
    assert_non_null(strstr(find(r, "framework_cap")->summary, "set_per_process_memory_fraction(0.5)"));
    /* a JAX arena under its cap but split: fragmentation, not the cap (the arena counts bytes in use) */
    strcpy(r->memory.fw.framework, "jax");
    r->memory.fw.allocated_bytes = 960 * MiB;
    r->memory.fw.reserved_bytes = 1920 * MiB;
    og_set(&r->memory.fw.cap_bytes, 1920 * MiB);
    r->memory.fw.largest_free_block_bytes = 16 * MiB;
    og_set(&r->event.requested_bytes, 24 * MiB);
    og_set(&r->device.free_bytes, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_false(has(r, "framework_cap"));
    /* a JAX arena at its cap refusing a request the whole card could not hold with what is in use: it does not fit,
     * and no setting of the cap would let it through (cap.beyond_card) */
    r->memory.fw.allocated_bytes = r->memory.fw.reserved_bytes = 17 * GiB;
    og_set(&r->memory.fw.cap_bytes, 18 * GiB);
    r->memory.fw.largest_free_block_bytes = 1 * GiB;
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 5 * GiB);
    diag(r);
    assert_true(r->analysis.facts.cap.beyond_card);
    assert_false(has(r, "framework_cap"));
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    og_set(&r->event.requested_bytes, 2 * GiB); /* what the card could hold: the cap's */
    diag(r);
    assert_false(r->analysis.facts.cap.beyond_card);
    assert_string_equal(r->diagnosis.primary, "framework_cap");
    free(r);
}

/* PyTorch's set_per_process_memory_fraction bounds the caching allocator's RESERVED bytes: 11.5 GiB
 * reserved (8 GiB in tensors, the rest cached in split blocks) + a 2 GiB segment > the 12 GiB cap is
 * a refusal by the cap, named with its setting first, though allocated + request is under it; JAX's
 * arena counts the bytes in use, so the same numbers there are not the cap's */
static void pytorch_fraction_counts_reserved(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 11 * GiB + 512 * MiB, 8 * GiB, 400 * MiB);
    r->memory.fw.internal_oom = true;
    og_set(&r->memory.fw.cap_bytes, 12 * GiB);
    strcpy(r->memory.fw.framework, "pytorch");
    strcpy(r->memory.fw.cap_source, "torch.cuda.set_per_process_memory_fraction(0.5)");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 12 * GiB);
    og_set(&r->memory.other_processes_bytes, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "framework_cap");
    const og_cause_t *c = find(r, "framework_cap");
    assert_string_equal(evt(c, "cap_counts"), "reserved");
    assert_int_equal((uint64_t)ev(c, "counted_bytes"), 11 * GiB + 512 * MiB);
    assert_int_equal((uint64_t)ev(c, "over_cap_bytes"), 1536 * MiB);
    assert_ptr_equal(strstr(c->summary, "PyTorch's cap torch.cuda.set_per_process_memory_fraction(0.5)"), c->summary);
    assert_false(has(r, "foreign_memory"));
    /* the device had no room either and others hold it: the refusal is still the cap's, never
     * blamed on them (the framework never asked the driver) */
    og_set(&r->device.free_bytes, 1 * GiB);
    fixture_other(r, 4242, "other_job", 10 * GiB);
    diag(r);
    assert_true(has(r, "framework_cap"));
    assert_false(has(r, "foreign_memory"));
    og_set(&r->device.free_bytes, 12 * GiB);
    strcpy(r->memory.fw.framework, "jax");
    diag(r);
    assert_false(has(r, "framework_cap"));
    free(r);
}

/* a failure an adapter reported without its size (framework_internal, no requested_bytes): the request is unknown,
 * never 0 bytes, so nothing is short by a figure, nothing "covers" it and nothing says it does not fit; the
 * evidence names it unmeasured.  A request of 0 bytes given as such is a size. */
static void request_not_given_is_unknown(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 20 * GiB, 14 * GiB, 0); /* 6 GiB cached: would "cover" any small request */
    r->event.framework_internal = true;
    r->memory.fw.internal_oom = true;
    og_unset(&r->event.requested_bytes);
    diag(r);
    check_shape(r);
    const og_facts_t *f = &r->analysis.facts;
    assert_true(r->analysis.facts_valid);
    assert_false(f->req_known);
    assert_false(f->shortfall_known);
    assert_false(f->larger_than_device);
    assert_false(f->fit.bounded);
    assert_false(og_known(r->diagnosis.shortfall_bytes));
    assert_false(has(r, "does_not_fit"));
    assert_false(has(r, "cache_held"));
    for (int i = 0; i < r->diagnosis.ncauses; i++) {
        const og_cause_t *c = &r->diagnosis.causes[i];
        double v = ev(c, "requested_bytes");
        assert_true(v == -1 || v == -2); /* absent, or a text */
        if (v == -2)
            assert_string_equal(evt(c, "requested_bytes"), "not measured");
        assert_null(strstr(c->summary, "0 B request"));
        assert_null(strstr(c->summary, " 0 B requested"));
    }
    const og_cause_t *fr = find(r, "fragmentation"); /* the idle share alone, never "the cache covers the request" */
    assert_non_null(fr->id);
    assert_string_equal(evt(fr, "rule"), "idle_share");
    /* a request of 0 bytes, given: a size, a shortfall of 0 measured */
    og_set(&r->event.requested_bytes, 0);
    diag(r);
    check_shape(r);
    assert_true(r->analysis.facts.req_known);
    assert_true(og_known(r->diagnosis.shortfall_bytes));
    assert_int_equal(r->diagnosis.shortfall_bytes.v, 0);
    assert_true(ev(find(r, "fragmentation"), "requested_bytes") == 0);
    free(r);
}

/* a framework's cap and a request of unknown size: the cap binds only when what it counts is already at it and
 * the framework refused; how far over, and whether the device had room, are not said */
static void framework_cap_with_request_not_given(void **state)
{
    og_record_t *r = base();
    fixture_adapter(r, 12 * GiB, 11 * GiB, 0);
    r->memory.fw.internal_oom = true;
    r->event.framework_internal = true;
    strcpy(r->memory.fw.framework, "pytorch");
    og_set(&r->memory.fw.cap_bytes, 12 * GiB);
    og_set(&r->device.free_bytes, 10 * GiB);
    og_unset(&r->event.requested_bytes);
    diag(r);
    const og_cause_t *c = find(r, "framework_cap");
    assert_non_null(c->id);
    assert_false(r->analysis.facts.cap.req_known);
    assert_string_equal(evt(c, "requested_bytes"), "not measured");
    assert_string_equal(evt(c, "over_cap_bytes"), "not measured");
    assert_null(strstr(c->summary, "0 B"));
    assert_null(strstr(c->summary, "had room for the request"));
    /* the framework view's own request, when the event lacks it, is the cap's */
    og_set(&r->memory.fw.requested_bytes, 2 * GiB);
    diag(r);
    c = find(r, "framework_cap");
    assert_true(r->analysis.facts.cap.req_known);
    assert_int_equal((uint64_t)ev(c, "requested_bytes"), 2 * GiB);
    assert_int_equal((uint64_t)ev(c, "over_cap_bytes"), 2 * GiB);
    /* under the cap with a request of unknown size: nothing says the cap was crossed */
    og_unset(&r->memory.fw.requested_bytes);
    r->memory.fw.reserved_bytes = 11 * GiB;
    r->memory.fw.allocated_bytes = 10 * GiB;
    diag(r);
    assert_false(has(r, "framework_cap"));
    free(r);
}

/* every summary over edge numbers: no impossible or ungrammatical statement (og_test_check_text: the fixture) */
static void texts_over_edge_numbers(void **state)
{
    for (size_t i = 0; i < FIXTURE_EDGE_CASES; i++) {
        og_record_t *r = base();
        fixture_edge_case(r, i);
        diag(r);
        for (int c = 0; c < r->diagnosis.ncauses; c++)
            og_test_check_text(r->diagnosis.causes[c].summary);
        if (!og_known(r->event.requested_bytes)) { /* a request not given: no shortfall, nothing does not fit */
            assert_false(og_known(r->diagnosis.shortfall_bytes));
            assert_false(has(r, "does_not_fit"));
        }
        free(r);
    }
}

/* an estimated free figure lowers does_not_fit's confidence */
static void does_not_fit_on_estimated_free(void **state)
{
    og_record_t *r = base();
    og_unset(&r->device.free_bytes); /* 24 - 20 held: 4 GiB, estimated */
    og_set(&r->event.requested_bytes, 6 * GiB);
    diag(r);
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "basis"), "cache_not_measured");
    assert_true(c->confidence < 0.4); /* 0.45 for an unmeasured cache, less 0.15 */
    free(r);
}

/* a leak that grew by more than is missing explains the shortfall better than does_not_fit */
static void does_not_fit_yields_to_growth(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 24, 0.5, 512 * MiB, 256 * MiB);
    og_set(&r->memory.process_tracked_bytes, 23 * GiB);
    og_set(&r->memory.process_used_bytes, 23 * GiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    og_set(&r->memory.framework_cached_bytes, 0); /* measured: nothing cached */
    r->memory.framework_cached_source = OG_CACHE_POOL;
    diag(r);
    assert_true(has(r, "growth"));
    const og_cause_t *c = find(r, "does_not_fit");
    assert_non_null(c->id);
    assert_string_equal(evt(c, "basis"), "growth_explains");
    assert_true(c->confidence <= 0.6);
    free(r);
}

/* ------------------------------------------------------------------ rules are functions of the facts */

/* the two diagnoses say the same: ids, confidences, summaries and evidence */
static void assert_same_diagnosis(const og_record_t *a, const og_record_t *b)
{
    assert_int_equal(a->diagnosis.ncauses, b->diagnosis.ncauses);
    assert_ptr_equal(a->diagnosis.primary, b->diagnosis.primary);
    assert_int_equal(og_known(a->diagnosis.shortfall_bytes), og_known(b->diagnosis.shortfall_bytes));
    assert_int_equal(a->diagnosis.shortfall_bytes.v, b->diagnosis.shortfall_bytes.v);
    for (int i = 0; i < a->diagnosis.ncauses; i++) {
        const og_cause_t *x = &a->diagnosis.causes[i], *y = &b->diagnosis.causes[i];
        assert_ptr_equal(x->id, y->id);
        assert_true(x->confidence == y->confidence);
        assert_string_equal(x->summary, y->summary);
        assert_int_equal(x->nevidence, y->nevidence);
        for (int e = 0; e < x->nevidence; e++) {
            assert_string_equal(x->evidence[e].name, y->evidence[e].name);
            assert_int_equal(x->evidence[e].is_text, y->evidence[e].is_text);
            assert_string_equal(x->evidence[e].text, y->evidence[e].text);
            assert_true(x->evidence[e].num == y->evidence[e].num);
            assert_int_equal(x->evidence[e].bytes, y->evidence[e].bytes);
        }
    }
}

/* diagnose R forwards and with the rules run last to first: no rule may read what another wrote */
static void assert_order_free(og_record_t *r)
{
    og_record_t *q = malloc(sizeof *q);
    assert_non_null(q);
    og_diagnose(r, &TH);
    memcpy(q, r, sizeof *q);
    og_diagnose_reversed(q, &TH);
    assert_same_diagnosis(r, q);
    free(q);
}

static void rules_run_in_any_order(void **state)
{
    for (size_t i = 0; i < FIXTURE_EDGE_CASES; i++) {
        og_record_t *r = base();
        fixture_edge_case(r, i);
        assert_order_free(r);
        free(r);
    }
    void (*const fixtures[])(og_record_t *) = { fixture_second_framework, fixture_peer_ranks, fixture_imbalance,
                                                fixture_app_pool, fixture_limit_by_context };
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) {
        og_record_t *r = base();
        fixtures[i](r);
        assert_order_free(r);
        free(r);
    }
    og_record_t *r = base();
    fixture_article_fragmentation(r, 100 * MiB);
    assert_order_free(r);
    free(r);
    /* a leak whose rise also caps does_not_fit (growth read by another rule before) */
    r = base();
    ev_reset(r);
    leak_loop(r, 24, 0.5, 512 * MiB, 256 * MiB);
    og_set(&r->memory.process_tracked_bytes, 23 * GiB);
    og_set(&r->memory.process_used_bytes, 23 * GiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    assert_order_free(r);
    assert_true(has(r, "growth"));
    free(r);
}

/* SIZE_MAX is a request like any other: with the same history it reads the steps as a 3 GiB request
 * does (it never turns the growth rule into its every-allocation mode) */
static void size_max_request_is_a_request(void **state)
{
    const uint64_t reqs[] = { 3 * GiB, UINT64_MAX };
    const og_cause_t *g[2];
    og_record_t *r[2];
    for (int k = 0; k < 2; k++) {
        r[k] = base();
        ev_reset(r[k]);
        /* a run that keeps 600 MiB of outputs of varying sizes per step: every-allocation steps */
        double t = 0.01;
        for (int s = 0; s < 12; s++, t += 0.5) {
            ev_add(r[k], t, "alloc", (400 + 37 * (uint64_t)s) * MiB);
            ev_add(r[k], t + 0.1, "alloc", 600 * MiB);
            ev_add(r[k], t + 0.2, "free", (400 + 37 * (uint64_t)s) * MiB);
        }
        og_set(&r[k]->event.requested_bytes, reqs[k]);
        og_set(&r[k]->device.total_bytes, 80 * GiB);
        og_set(&r[k]->device.free_bytes, 1 * GiB);
        diag(r[k]);
        g[k] = find(r[k], "growth");
    }
    assert_ptr_equal(g[0]->id, g[1]->id);
    if (g[0]->id)
        assert_true(g[0]->confidence == g[1]->confidence);
    free(r[0]);
    free(r[1]);
}

/* a forward pass still building holds 12 GiB of activations when a 64 MiB request fails with 256 MiB cached
 * in splinters (largest free block 32 MiB): textbook fragmentation for that request, but the splinters
 * would carry the pass a few allocations further, not through it: does_not_fit leads, fragmentation
 * stays as a side finding; without the phase (a C program) the textbook reading stands */
static void a_pass_that_outgrows_the_cache_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 2 * GiB, 2 * GiB, 0, 0, 12 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB; /* the cache: reserved - allocated */
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    fixture_phase(r, "forward", "/w/train.py", "forward");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "missing_bytes") == 64.0 * MiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    assert_null(strstr(find(r, "does_not_fit")->summary, "even after releasing"));
    fixture_phase(r, "oom_handler", "/w/serve.py", "forecast"); /* a retry inside the handler: a pass too */
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    /* the run held as much allocated at once before (the framework's peak: now and the request, and more): the pass's
     * need so far was there, live; what it lacks is a piece of the size, fragmentation again */
    og_set(&r->memory.fw.peak_bytes, r->memory.fw.allocated_bytes + 64 * MiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    assert_true(ev(find(r, "fragmentation"), "peak_allocated_bytes") == (double)r->memory.fw.peak_bytes.v);
    og_test_check_text(find(r, "fragmentation")->summary);
    og_set(&r->memory.fw.peak_bytes, r->memory.fw.allocated_bytes + 63 * MiB); /* short of the request: not */
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    /* nor after earlier failure episodes: a pass that failed before (caught, its batch skipped) made the peak too */
    og_set(&r->memory.fw.peak_bytes, r->memory.fw.allocated_bytes + 1 * GiB);
    r->history.recovered_episodes = 3;
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    r->history.recovered_episodes = 0;
    og_unset(&r->memory.fw.peak_bytes);
    r->memory.fw.reserved_bytes += 4 * GiB; /* a cache that could carry the pass: fragmentation again */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* the same pass measured in its layers (a run of 24 like layers): failing in layer 23 of 24 with 12 GiB of
 * activations made in 23 layers, about half a GiB a layer, it has the request, one layer and one of backward left,
 * 1.1 GiB, within the 2 GiB cached in splinters: whole, they would carry it: fragmentation leads, saying what is left
 * (pass_rest_bytes, pass_rest_layers); not beside a second copy of the model that holds the shortfall.  Failing in layer 3 the rest is larger than the working set: not read (the
 * working set decides); nor with checkpointing on (backward recomputes whole layers) or layers of unlike sizes; as an
 * evaluation, no backward: one layer less.  In its last layer with 256 MiB cached, the rest is more than the cache
 * and the free memory: does_not_fit, saying what is left */
static void a_pass_in_its_last_layers_is_weighed_on_what_is_left(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 2 * GiB, 2 * GiB, 0, 0, 12 * GiB);
    r->memory.fw.reserved_bytes += 2 * GiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    og_roles_t *ro = &r->memory.fw.roles;
    ro->layer_index = 22, ro->layer_count = 24, ro->layer_alike = 1;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    double layer = (double)(12 * GiB) / 23;
    uint64_t rest = 64 * MiB + (uint64_t)(2 * layer);
    assert_int_equal(r->analysis.facts.pass_rest, rest);
    assert_true(ev(find(r, "fragmentation"), "pass_rest_bytes") == (double)rest);
    assert_true(ev(find(r, "fragmentation"), "pass_rest_layers") == 1);
    og_test_check_text(find(r, "fragmentation")->summary);
    /* beside a second copy of the model holding the shortfall (a previous fold's): the working set's reading stands */
    fixture_model(r, "Eva", 2 * GiB, 2, false);
    diag(r);
    assert_int_equal(r->analysis.facts.pass_rest, 0);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    r->memory.fw.roles.nmodels = 0;
    r->memory.fw.grad_enabled = -1; /* an evaluation: no backward after it */
    fixture_phase(r, "evaluation", "/w/train.py", "validate");
    diag(r);
    assert_int_equal(r->analysis.facts.pass_rest, 64 * MiB + (uint64_t)layer);
    r->memory.fw.grad_enabled = 1;
    fixture_phase(r, "forward", "/w/train.py", "forward");
    ro->checkpointing = 1;
    diag(r);
    assert_int_equal(r->analysis.facts.pass_rest, 0);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    ro->checkpointing = 0;
    ro->layer_alike = 0;
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    ro->layer_alike = 1;
    ro->layer_index = 2; /* 21 layers to come at 4 GiB each: more than the working set, which decides */
    diag(r);
    assert_int_equal(r->analysis.facts.pass_rest, 0);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "pass_rest_bytes") < 0);
    ro->layer_index = 23;                      /* the last layer: the request and backward's one layer */
    r->memory.fw.reserved_bytes -= 1792 * MiB; /* 256 MiB cached: less than that */
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "pass_rest_bytes") == (double)(64 * MiB + 12 * GiB / 24));
    og_test_check_text(find(r, "does_not_fit")->summary);
    free(r);
}

/* a validation pass over one whole recording asks for 8 GiB on a 24 GiB card while its activations hold another 8 GiB
 * of the same pass, with 7 GiB free and 3.8 GiB cached in splinters (a quarter of the reservation: textbook
 * fragmentation for this request): defragmented, the cache serves this tensor and leaves 2.8 GiB, less than the next
 * one of its size: does_not_fit leads (pass_outgrows_cache); activations far below the request (the pass has not
 * made one such tensor), or a request under an eighth of the card: the textbook reading stands */
static void a_pass_whose_next_tensor_has_no_room_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 8 * GiB);
    og_set(&r->device.free_bytes, 7 * GiB);
    fixture_roles(r, 512 * MiB, 0, 0, 0, 0, 8 * GiB);
    r->memory.fw.reserved_bytes += 3 * GiB + 800 * MiB;
    r->memory.fw.largest_free_block_bytes = 1800 * MiB;
    r->memory.fw.grad_enabled = -1;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation"); /* no phase read: a C program */
    fixture_phase(r, "evaluation", "/w/train.py", "validate");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 2 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 8 * GiB);
    og_set(&r->device.total_bytes, 80 * GiB); /* 8 GiB is a tenth of this card */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* the running code's tensors are mostly a list its caller keeps (a screen's results, a local of main, 10 of the
 * 12 GiB): does_not_fit names that holder beside the pass (working_set_holder); a local of the model's own forward is
 * the pass's */
static void a_working_set_mostly_a_callers_holder_is_named(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 10 * GiB, 2 * GiB);
    fixture_holder(r, "results", "list", "local in main (/w/screen.py:205)", 10 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    r->memory.fw.grad_enabled = -1;
    fixture_phase(r, "evaluation", "/w/screen.py", "forward");
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "pass_working_set_bytes") == 12.0 * GiB);
    assert_string_equal(evt(find(r, "does_not_fit"), "working_set_holder"), "results");
    og_test_check_text(find(r, "does_not_fit")->summary);
    snprintf(r->memory.fw.roles.holders[0].where, sizeof r->memory.fw.roles.holders[0].where,
             "local in forward (/w/model.py:40)");
    diag(r);
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_null(evt(find(r, "does_not_fit"), "working_set_holder"));
    free(r);
}

/* an exporter folding every fp16 weight into a new tensor on the GPU (13.5 GiB of parameters, 8.26 GiB copied so far,
 * no named object holding the copy: roles.activations_copy_of parameters) fails a 112 MiB request beside 209 MiB
 * cached in 4 MiB splinters: textbook fragmentation, but the copy's rest, 5.2 GiB, is more than the cache and the free
 * memory together: does_not_fit leads (basis copy_outgrows_cache, copy_made_bytes, copy_source_bytes); no copy
 * measured, the textbook reading stands */
static void a_copy_of_the_weights_that_cannot_finish_does_not_fit(void **state)
{
    og_record_t *r = base();
    fixture_weights_copy(r);
    og_roles_t *ro = &r->memory.fw.roles;
    ro->act_copy_of[0] = '\0'; /* no copy measured */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    snprintf(ro->act_copy_of, sizeof ro->act_copy_of, "parameters");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "copy_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "copy_made_bytes") == 8458.0 * MiB);
    assert_true(ev(find(r, "does_not_fit"), "copy_source_bytes") == 13824.0 * MiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    ro->act_copy_bytes = 13700 * MiB; /* all but 124 MiB copied: the cache and the free memory hold the rest */
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_activations], 13700 * MiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* torch.load restoring a 24 GiB state dict onto the GPU beside a 14 GiB model: the storages it restored so far are
 * no role's (a load computes nothing), 272 MiB cached in splinters against a 254 MiB request: the load outgrows the
 * cache, does_not_fit leads; the same bytes with no phase read (a C program) keep the textbook reading */
static void a_restore_that_outgrows_the_cache_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 254 * MiB);
    og_set(&r->device.free_bytes, 160 * MiB);
    fixture_roles(r, 14 * GiB, 0, 0, 0, 0, 24 * GiB);
    r->memory.fw.reserved_bytes += 272 * MiB;
    r->memory.fw.largest_free_block_bytes = 6 * MiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    free(r);
}

/* memory rising 256 MiB a step for 40 steps (10 GiB kept) and a 1 GiB request failing with 1.5 GiB cached in
 * splinters (largest free block 512 MiB): defragmented, the cache would carry the rise a few steps further:
 * fragmentation is a side finding at most 0.5 and growth leads; 6 GiB of cache, more than a third of the rise,
 * could carry it a while: the splinters stay a cause of their own */
static void a_growth_that_outgrows_the_cache(void **state)
{
    og_record_t *r = base();
    ev_reset(r);
    leak_loop(r, 40, 0.1, 512 * MiB, 256 * MiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->device.free_bytes, 200 * MiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, 10 * GiB, 1 * GiB);
    r->memory.fw.reserved_bytes += 1536 * MiB;
    r->memory.fw.largest_free_block_bytes = 512 * MiB;
    diag(r);
    assert_true(has(r, "growth"));
    assert_string_equal(r->diagnosis.primary, "growth");
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    r->memory.fw.reserved_bytes += 4608 * MiB; /* 6 GiB cached */
    diag(r);
    assert_true(find(r, "fragmentation")->confidence > 0.5);
    free(r);
}

/* a generation's working set is its activations and the KV cache it builds: 1 GiB of activations and a 2 GiB
 * cache (a holder of purpose kv_cache) against 896 MiB cached in splinters: the pass outgrows the cache
 * (3 GiB >= 3 x 896 MiB); the same cache in a forward pass that is not a generation does not count, and the
 * textbook reading stands */
static void a_generation_outgrows_the_cache_with_its_kv_cache(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 880 * MiB);
    og_set(&r->device.free_bytes, 600 * MiB);
    fixture_roles(r, 16 * GiB, 0, 0, 0, 2 * GiB, 1 * GiB);
    fixture_holder(r, "self.key_cache", "list", "on DynamicCache", 2 * GiB);
    fixture_holder_says(r, "kv_cache", "");
    r->memory.fw.reserved_bytes += 896 * MiB;
    r->memory.fw.largest_free_block_bytes = 640 * MiB;
    fixture_phase(r, "generation", "/w/serve.py", "generate");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    fixture_phase(r, "forward", "/w/serve.py", "forward");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* the same for an optimizer step making AdamW's state: 4 GiB of parameters its optimizer holds, 2 GiB of moments
 * made so far, 6 GiB to come; a 64 MiB request fails with 256 MiB cached in splinters: does_not_fit leads with the
 * state still to make as its evidence; with the state made (8 GiB), the textbook reading stands */
static void an_optimizer_step_still_making_its_state_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 4 * GiB, 2 * GiB, 0, 0, 0);
    fixture_optimizer(r, "AdamW", 2 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    fixture_phase(r, "optimizer_step", "/w/train.py", "step");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "state_to_come_bytes") == 6.0 * GiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    r->memory.fw.roles.optimizers[0].bytes = 8 * GiB;
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_optimizer_state], 8 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* the first step of an optimizer that is not Adam-like (SOAP: what it makes is not twice the parameters), seen to
 * have made no step (a measured 0): all 3 GiB of its state were made by this step, still making it, 12x the 256 MiB
 * cached in splinters: does_not_fit leads, how much is to come unknown; one step made, the state is old: textbook */
static void a_first_step_of_another_optimizer_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 4 * GiB, 3 * GiB, 0, 0, 0);
    fixture_optimizer(r, "SOAP", 3 * GiB);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    fixture_phase(r, "optimizer_step", "/w/train.py", "step");
    fixture_steps(r, 0, 0, 0, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "state_made_bytes") == 3.0 * GiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    fixture_steps(r, 1, 1, 11 * GiB, 0);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    r->memory.fw.roles.steps_known = false; /* not watched: unknown is not a first step */
    r->memory.fw.roles.nsteps = 0;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* outside the step (no phase read), AdamW has yet to make its state: 8 GiB of fp32 master weights its optimizer holds
 * beside a 4 GiB model, 16 GiB of moments to come, more than the free memory, the 256 MiB cached in splinters and
 * the running code's tensors together: does_not_fit leads (the training state does not fit), fragmentation a side
 * finding; a smaller state that the pass's own 10 GiB of activations would make room for leaves the textbook
 * reading */
static void an_optimizer_yet_to_make_its_state_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 12 * GiB, 6 * GiB, 0, 0, 0, 0);
    fixture_model(r, "PhiForCausalLM", 4 * GiB, 1, false);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 8 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "state_to_come_bytes") == 16.0 * GiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    free(r);
    r = base();
    og_set(&r->event.requested_bytes, 64 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 6 * GiB, 2 * GiB, 0, 0, 0, 10 * GiB);
    fixture_model(r, "PhiForCausalLM", 2 * GiB, 1, false);
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 4 * GiB);
    r->memory.fw.reserved_bytes += 256 * MiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* CUDA graphs captured per shape: their private pools reserve 21 GiB of which their blocks use 1 GiB, the 20 GiB
 * left idle is reserved for the graphs' replays (no other request can use it, no empty_cache releases it): not a
 * fragmented cache; cache_held names the pools (evidence holder graph_pools, pool_unused_bytes) and does_not_fit
 * does not hold (releasing the pools covers it); without private pools the same idle bytes are a fragmented
 * cache */
static void idle_graph_pools_are_held_not_fragmented(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 128 * MiB);
    fixture_roles(r, 2 * GiB, 0, 0, 1 * GiB, 0, 0);
    r->memory.fw.reserved_bytes += 20 * GiB;
    r->memory.fw.private_pool_bytes = 21 * GiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "cache_held");
    assert_string_equal(evt(find(r, "cache_held"), "holder"), "graph_pools");
    assert_true(ev(find(r, "cache_held"), "pool_unused_bytes") == 20.0 * GiB);
    assert_false(has(r, "fragmentation"));
    assert_false(has(r, "does_not_fit"));
    og_test_check_text(find(r, "cache_held")->summary);
    r->memory.fw.private_pool_bytes = 0;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* the same for a deep copy under way (roles.operation copy): copy.deepcopy of an optimizer's state made 7 GiB so
 * far when a 44 MiB request fails with 486 MiB cached in splinters: does_not_fit (basis copy_outgrows_cache,
 * evidence copy_made_bytes), fragmentation a side finding; a copy that made little so far, or no copy measured,
 * leaves the textbook reading */
static void a_copy_that_outgrows_the_cache_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 44 * MiB);
    og_set(&r->device.free_bytes, 0);
    fixture_roles(r, 4 * GiB, 0, 8 * GiB, 0, 4 * GiB, 7 * GiB);
    r->memory.fw.reserved_bytes += 486 * MiB;
    r->memory.fw.largest_free_block_bytes = 12 * MiB;
    fixture_operation(r, "copy", "deepcopy");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation"); /* what the copy made is not measured */
    og_set(&r->memory.fw.roles.copy_made, 7 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "copy_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "copy_made_bytes") == 7.0 * GiB);
    assert_true(has(r, "fragmentation") && find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    og_set(&r->memory.fw.roles.copy_made, 1 * GiB); /* < 4x the cache: the splinters may carry it */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    /* ... unless its source is known: copy.deepcopy(model) of a 4 GiB model has 3 GiB left to copy, more than the
     * cache and the free memory: it outgrows them whatever it made so far */
    fixture_model(r, "Net", 4 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "model");
    fixture_statement(r, "swa_model", "ema");
    snprintf(r->memory.fw.roles.stmt_names, sizeof r->memory.fw.roles.stmt_names, "copy,deepcopy,model");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "copy_outgrows_cache");
    og_set(&r->memory.fw.roles.copy_made, 3 * GiB + 900 * MiB); /* 124 MiB left: the cache would finish it */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    r->memory.fw.roles.nmodels = 0;
    r->memory.fw.roles.has_statement = false;
    og_set(&r->memory.fw.roles.copy_made, 7 * GiB);
    r->memory.fw.roles.operation[0] = 0; /* no copy on the stack */
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* a model being loaded (phase loading) beside a previous copy: the copy arriving holds 8 GiB so far (its class
 * running, roles.models) when a 112 MiB request fails with 226 MiB cached in splinters: the load outgrows the
 * cache, does_not_fit leads (basis pass_outgrows_cache, the arriving parameters its working set); nothing
 * arriving (no model running): the textbook reading stands.  (The sizes are 12 + 8 GiB of a 24 GiB card: weights at
 * nine tenths of it are a load that fills the card, below) */
static void a_load_that_outgrows_the_cache_does_not_fit(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    r->memory.fw.reserved_bytes += 226 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    fixture_phase(r, "loading", "/w/nb.py", "from_pretrained");
    fixture_model(r, "Mistral", 12 * GiB, 1, false);
    fixture_model_held(r, 0, 0, "model");
    fixture_model(r, "Mistral", 8 * GiB, 1, false);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    fixture_model_held(r, 0, 1, "");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "pass_working_set_bytes") == 8.0 * GiB);
    assert_true(find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    free(r);
}

/* a load placing a checkpoint's shards into a model (from_pretrained; no model's own frame runs): the shard being
 * read is held by a local of the running code (4 GiB) when a 112 MiB request fails with 226 MiB cached in
 * splinters: the load's working set outgrows the cache, does_not_fit leads with it; the shard kept across calls
 * (a global: no running code's) leaves the textbook reading */
static void a_shard_being_placed_outgrows_the_cache(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    fixture_roles(r, 16 * GiB, 0, 0, 0, 4 * GiB, 0);
    r->memory.fw.reserved_bytes += 226 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    fixture_phase(r, "loading", "/w/load.py", "from_pretrained");
    fixture_holder(r, "result", "dict", "global in load.py", 4 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    r->memory.fw.roles.nholders = 0;
    fixture_holder(r, "result", "dict", "local in load_file (load.py:57)", 4 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "pass_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "pass_working_set_bytes") == 4.0 * GiB);
    assert_true(find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    free(r);
}

/* a load in float32 whose weights already hold 93% of the card (11.2 of 12 GiB) when a 26 MiB request fails with
 * 323 MiB cached in splinters: whatever is left to load, the job has no room on those weights, so does_not_fit
 * leads (basis load_fills_card, evidence parameters_bytes) and fragmentation is a side finding; weights at two
 * thirds of the card, or a cache that could not hold the request anyway, leave the other readings */
static void a_load_that_fills_the_card(void **state)
{
    og_record_t *r = base();
    og_set(&r->device.total_bytes, 12 * GiB);
    og_set(&r->event.requested_bytes, 26 * MiB);
    og_set(&r->device.free_bytes, 24 * MiB);
    fixture_roles(r, 11 * GiB + 160 * MiB, 0, 0, 0, 0, 0);
    r->memory.fw.reserved_bytes += 323 * MiB;
    r->memory.fw.largest_free_block_bytes = 14 * MiB;
    fixture_phase(r, "loading", "/w/train_dreambooth_lora_sdxl.py", "to");
    diag(r);
    assert_true(r->analysis.facts.load_fills_card);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "load_fills_card");
    assert_true(ev(find(r, "does_not_fit"), "parameters_bytes") == 11.0 * GiB + 160.0 * MiB);
    assert_true(find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    fixture_roles(r, 8 * GiB, 0, 0, 0, 0, 0); /* two thirds of the card: the splinters are the reading */
    r->memory.fw.reserved_bytes += 323 * MiB;
    r->memory.fw.largest_free_block_bytes = 14 * MiB;
    diag(r);
    assert_false(r->analysis.facts.load_fills_card);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* tensors Python objects keep across calls (a metric's list on an object: "on MeanAveragePrecision") holding many
 * times the cached splinters when a 112 MiB request fails with 226 MiB cached: defragmented, the splinters would give
 * a few allocations beside what is kept; does_not_fit leads (basis kept_outgrows_cache, evidence
 * kept_by_python_bytes), fragmentation a side finding.  The same bytes in a local of running code outside a pass
 * (no phase: whether they are kept is not known), or kept during a load, leave the textbook reading */
static void kept_tensors_outgrow_the_cache(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 100 * MiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, 4 * GiB, 0);
    r->memory.fw.reserved_bytes += 226 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    fixture_holder(r, "masks", "list", "local in evaluate (eval.py:40)", 4 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    r->memory.fw.roles.nholders = 0;
    fixture_phase(r, "evaluation", "/w/eval.py", "evaluate");
    fixture_holder(r, "self.detection_mask", "list", "on MeanAveragePrecision", 4 * GiB);
    diag(r);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "kept_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "kept_by_python_bytes") == 4.0 * GiB);
    assert_true(find(r, "fragmentation")->confidence <= 0.5);
    og_test_check_text(find(r, "does_not_fit")->summary);
    fixture_phase(r, "loading", "/w/load.py", "from_pretrained");
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    /* kept, yet not many times the cache: the splinters are the reading */
    fixture_phase(r, "evaluation", "/w/eval.py", "evaluate");
    r->memory.fw.roles.holders[0].bytes = 600 * MiB;
    diag(r);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
    free(r);
}

/* an embedding service whose functools.lru_cache of models keeps every version it loaded: nine idle models held only
 * as the cache's entries (a registry, get_model[key]) beside the one running, 18 GiB against 1 GiB of cached
 * splinters when a 128 MiB request finds no block: what is kept took the room, does_not_fit leads (basis
 * kept_outgrows_cache, the registry's bytes in kept_by_python_bytes).  The same models held by names of their own
 * are no registry: the splinters stay the reading */
static void registry_models_outgrow_the_cache(void **state)
{
    og_record_t *r = base();
    og_set(&r->event.requested_bytes, 128 * MiB);
    og_set(&r->device.free_bytes, 124 * MiB);
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    r->memory.fw.reserved_bytes += 1 * GiB;
    r->memory.fw.largest_free_block_bytes = 32 * MiB;
    fixture_phase(r, "evaluation", "/w/embed_api.py", "forward");
    fixture_model(r, "E5Model", 2 * GiB, 9, true);
    fixture_model_held(r, 9, 0, "get_model[key]");
    fixture_model(r, "E5Model", 2 * GiB, 1, true);
    fixture_model_held(r, 1, 1, "get_model[key],model");
    diag(r);
    assert_int_equal(r->analysis.facts.roles.registry_models, 18 * GiB);
    assert_int_equal(r->analysis.facts.roles.kept_across, 18 * GiB);
    assert_string_equal(r->diagnosis.primary, "does_not_fit");
    assert_string_equal(evt(find(r, "does_not_fit"), "basis"), "kept_outgrows_cache");
    assert_true(ev(find(r, "does_not_fit"), "kept_by_python_bytes") == 18.0 * GiB);
    assert_true(find(r, "fragmentation")->confidence <= 0.5);
    fixture_model_held(r, 1, 1, "model");
    r->memory.fw.roles.models[0].named = 9;
    snprintf(r->memory.fw.roles.models[0].names, sizeof r->memory.fw.roles.models[0].names, "a,b,c,d");
    diag(r);
    assert_int_equal(r->analysis.facts.roles.registry_models, 0);
    assert_string_equal(r->diagnosis.primary, "fragmentation");
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
        cmocka_unit_test(non_framework_names_nccl_settings),
        cmocka_unit_test(growth_is_a_pattern_of_steps),
        cmocka_unit_test(growth_restored_by_torch_load),
        cmocka_unit_test(growth_in_a_library_set_up_once),
        cmocka_unit_test(growth_of_a_cache_at_its_bound),
        cmocka_unit_test(growth_is_the_weights_arriving),
        cmocka_unit_test(growth_kept_leads_others),
        cmocka_unit_test(growth_excludes_loading),
        cmocka_unit_test(growth_of_other_sizes),
        cmocka_unit_test(growth_thresholds),
        cmocka_unit_test(cache_held_other_library),
        cmocka_unit_test(limit_cause),
        cmocka_unit_test(nothing_holds_is_unknown),
        cmocka_unit_test(free_unknown_shortfall_unknown),
        cmocka_unit_test(unknown_names_what_was_not_measured),
        cmocka_unit_test(zero_record),
        cmocka_unit_test(huge_values),
        cmocka_unit_test(bad_thresholds_fall_back),
        cmocka_unit_test(tie_break_priority),
        cmocka_unit_test(unknown_cache_keeps_cache_cause),
        cmocka_unit_test(second_framework_reservation),
        cmocka_unit_test(fragmentation_in_a_squeezed_reservation),
        cmocka_unit_test(second_framework_one_library),
        cmocka_unit_test(exact_tie_keeps_list_order),
        cmocka_unit_test(peer_ranks_and_workers),
        cmocka_unit_test(prefork_workers_are_this_job),
        cmocka_unit_test(dataparallel_imbalance),
        cmocka_unit_test(pools_whose_cache),
        cmocka_unit_test(no_nvml_infers_other_processes),
        cmocka_unit_test(recovered_keeps_the_failure),
        cmocka_unit_test(limit_speaks_the_checks_accounting),
        cmocka_unit_test(framework_cap_cause),
        cmocka_unit_test(request_not_given_is_unknown),
        cmocka_unit_test(framework_cap_with_request_not_given),
        cmocka_unit_test(pytorch_fraction_counts_reserved),
        cmocka_unit_test(texts_over_edge_numbers),
        cmocka_unit_test(does_not_fit_on_estimated_free),
        cmocka_unit_test(does_not_fit_yields_to_growth),
        cmocka_unit_test(rules_run_in_any_order),
        cmocka_unit_test(size_max_request_is_a_request),
        cmocka_unit_test(a_pass_that_outgrows_the_cache_does_not_fit),
        cmocka_unit_test(a_pass_in_its_last_layers_is_weighed_on_what_is_left),
        cmocka_unit_test(a_copy_of_the_weights_that_cannot_finish_does_not_fit),
        cmocka_unit_test(a_working_set_mostly_a_callers_holder_is_named),
        cmocka_unit_test(a_pass_whose_next_tensor_has_no_room_does_not_fit),
        cmocka_unit_test(a_restore_that_outgrows_the_cache_does_not_fit),
        cmocka_unit_test(a_growth_that_outgrows_the_cache),
        cmocka_unit_test(a_generation_outgrows_the_cache_with_its_kv_cache),
        cmocka_unit_test(an_optimizer_step_still_making_its_state_does_not_fit),
        cmocka_unit_test(a_first_step_of_another_optimizer_does_not_fit),
        cmocka_unit_test(an_optimizer_yet_to_make_its_state_does_not_fit),
        cmocka_unit_test(idle_graph_pools_are_held_not_fragmented),
        cmocka_unit_test(a_copy_that_outgrows_the_cache_does_not_fit),
        cmocka_unit_test(a_load_that_outgrows_the_cache_does_not_fit),
        cmocka_unit_test(a_load_that_fills_the_card),
        cmocka_unit_test(a_shard_being_placed_outgrows_the_cache),
        cmocka_unit_test(kept_tensors_outgrow_the_cache),
        cmocka_unit_test(registry_models_outgrow_the_cache),
    };
    int total = (int)(sizeof tests / sizeof *tests);
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
