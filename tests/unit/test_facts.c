/* og_facts_compute: the quantities every rule and remedy reads, each asserted on the facts
 * themselves (no sentence): free memory under a limit and estimated, the request against the
 * device, the growth's steps (bursts, the minimum, one pass, the every-allocation reading), a load
 * and a second copy, an imbalance, a framework cap, a rank on another GPU, a retry; the adapter's phase
 * and roles as the advice reads them, one batch's peak, NCCL's memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"
#include "advice_text.h" /* og_other_inferred_bytes */
#include "analysis_fixture.h"

static og_facts_t F;

static const og_facts_t *facts(og_record_t *r)
{
    og_facts_compute(&F, r, &TH, &r->analysis.growth);
    return &F;
}

static void free_under_a_limit_is_at_most_the_device_free(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->device.limit_bytes, 16 * GiB);
    og_set(&r->device.limit_usage_bytes, 4 * GiB);
    og_set(&r->memory.process_tracked_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB); /* the limit leaves 12 GiB, the device has 1 */
    const og_facts_t *f = facts(r);
    assert_true(f->free_known && f->limited);
    assert_int_equal(f->free_eff, 1 * GiB);
    free(r);
}

static void estimated_free_counts_the_others(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_unset(&r->device.free_bytes);
    og_set(&r->memory.process_used_bytes, 10 * GiB);
    og_set(&r->memory.other_processes_bytes, 6 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->free_known && f->free_estimated);
    assert_int_equal(f->free_eff, 8 * GiB);
    free(r);
}

static void a_request_of_the_device_size_is_not_larger(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->event.requested_bytes, 24 * GiB);
    assert_false(facts(r)->larger_than_device);
    og_set(&r->event.requested_bytes, 24 * GiB + 1);
    assert_true(facts(r)->larger_than_device);
    free(r);
}

/* a framework that publishes no reservation (TensorFlow's arena) and whose blocks the ledger did not see: its cache
 * and its largest free block are unknown, never the floor the adapter handed in (0 cached, a largest block of 0) */
static void an_unknown_reservation_is_no_empty_cache(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtensorflow_framework.so.2");
    fixture_framework(r, OG_FW_TENSORFLOW, "libtensorflow_framework.so.2");
    r->memory.fw.has = true;
    r->memory.fw.allocated_bytes = 16 * MiB;
    r->memory.fw.reserved_bytes = 11 * GiB;
    r->memory.fw.reserved_by_ledger = true;
    const og_facts_t *f = facts(r); /* the ledger counted it: the arena less the bytes in use is the cache */
    assert_true(f->cached_known);
    assert_int_equal(f->cached, 11 * GiB - 16 * MiB);
    r->memory.fw.reserved_bytes = 16 * MiB; /* none of its blocks seen: the adapter's floor stays */
    r->memory.fw.reserved_unknown = true;
    f = facts(r);
    assert_false(f->cached_known);
    assert_false(f->largest_known);
    free(r);
}

/* each step's marker is two allocations of the failing size 0.1 ms apart with nothing between */
static void bursts_are_one_step(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    double t = 0.01;
    for (int s = 0; s < 10; s++, t += 0.5) {
        ev_add(r, t, "alloc", 512 * MiB);
        ev_add(r, t + 0.0001, "alloc", 512 * MiB);
        ev_add(r, t + 0.1, "alloc", 300 * MiB); /* kept */
        ev_add(r, t + 0.2, "free", 512 * MiB);
        ev_add(r, t + 0.2, "free", 512 * MiB);
    }
    og_set(&r->event.requested_bytes, 512 * MiB);
    const og_facts_t *f = facts(r);
    assert_true(f->growth.holds);
    assert_int_equal(f->growth.marker, OG_MARK_FAILING_SIZE);
    assert_int_equal(f->growth.steps, 10);
    free(r);
}

/* one forward pass with a warm cache: 64 activations of one size back to back, ~60 us apart, with
 * pauses of the host inside the run (0.3 ms to 12 ms: another process scheduled): the run is one
 * burst, whatever the pauses, so no growth is read from it, and the same history without the
 * pauses gives the same facts */
static void pauses_of_the_host_do_not_split_a_burst(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    for (int paused = 0; paused < 2; paused++) {
        ev_reset(r);
        double t = 0.01;
        for (int i = 0; i < 32; i++, t += 0.00005)
            ev_add(r, t, "alloc", 192 * MiB);                            /* the weights */
        static const int pause_at[] = { 3, 11, 12, 25, 31, 40, 47, 58 }; /* where the host paused */
        for (int i = 0, p = 0; i < 64; i++) {
            t += 0.00006;
            if (paused && p < 8 && i == pause_at[p])
                t += p++ % 2 ? 0.0003 : 0.012;
            ev_add(r, t, "alloc", 176 * MiB);
        }
        ev_add(r, t + 6.7, "alloc", 1408 * MiB);
        og_set(&r->event.requested_bytes, 1408 * MiB);
        const og_facts_t *f = facts(r);
        assert_false(f->growth.holds);
        assert_int_equal(f->load.phase, OG_PHASE_NONE);
    }
    free(r);
}

/* a training loop that skips the batches too long to fit: each failing batch builds its forward pass
 * (one activation of one size per layer, back to back, 0.16 to 0.22 ms apart as the Python code makes
 * them), fails, and is released whole.  How the host ran it: HOST 0 quiet, 1 every gap 1.6x longer
 * (a busy machine: each gap then over the 0.25 ms an earlier rule took for a pause), 2 a 4 ms pause
 * every 20 activations (another process scheduled at every time slice: the same count each time at a
 * steady rate), 3 both, and every third gap 3 ms longer, 4 a 90 ms pause here and there (a machine
 * short of memory). */
static void skipped_batches(og_record_t *r, int host)
{
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 9 * GiB); /* weights, gradients, optimizer state */
    double t = 0.5, slow = host == 1 || host == 3 ? 1.6 : 1;
    static const int layers[] = { 61, 103, 60, 100, 75, 90, 80 };
    int nb = (int)(sizeof layers / sizeof *layers);
    for (int b = 0; b < nb; b++, t += 1.25) {
        for (int i = 0; i < layers[b]; i++) {
            double gap = (0.00016 + 0.00006 * i / layers[b]) * slow;
            if ((host == 2 || host == 3) && i % 20 == 19)
                gap += 0.004;
            if (host == 3 && i % 3 == 2)
                gap += 0.003;
            static const int stall[] = { 3, 11, 12, 25, 31, 40, 47, 58, 71, 75, 90 };
            for (size_t k = 0; host == 4 && k < sizeof stall / sizeof *stall; k++)
                gap += stall[k] == i + b ? 0.09 : 0;
            t += gap;
            ev_add(r, t, "alloc", 92 * MiB);
        }
        ev_add(r, t + 0.0002, "fail", 92 * MiB);
        if (b < nb - 1)
            for (int i = 0; i < layers[b]; i++)
                ev_add(r, t + 0.02, "free", 92 * MiB);
    }
    og_set(&r->event.requested_bytes, 92 * MiB);
    og_set(&r->device.free_bytes, 40 * MiB);
}

/* the same program gets the same steps however busy the host: a busy machine stretches the gaps of a
 * pass and pauses it at every time slice, which splits nothing; the passes never read as growth */
static void a_busy_host_does_not_split_a_pass_into_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    for (int host = 0; host < 5; host++) {
        skipped_batches(r, host);
        const og_facts_t *f = facts(r);
        if (f->growth.holds)
            fail_msg("host %d: %d steps read as growth", host, f->growth.steps);
        assert_int_equal(f->load.phase, OG_PHASE_NONE);
    }
    free(r);
}

/* a leak of KEEP blocks of one size per iteration, back to back (0.05 ms apart), then the iteration's
 * work (GAP); a temporary of another size between iterations when TEMP.  HOST 0 quiet, 1 busy: a
 * 10 ms pause inside the blocks of one iteration in ten, and 8 ms into every fifth iteration's work */
static void kept_blocks_loop(og_record_t *r, int iterations, int keep, double gap, bool temp, int host)
{
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB); /* the model */
    double t = 0.01;
    for (int s = 0; s < iterations; s++) {
        if (temp)
            ev_add(r, t, "alloc", 40 * MiB);
        for (int k = 0; k < keep; k++) {
            t += 0.00005 + (host && k == keep / 2 && s % 10 == 3 ? 0.01 : 0);
            ev_add(r, t, "alloc", 128 * MiB);
        }
        if (temp)
            ev_add(r, t + 0.0001, "free", 40 * MiB);
        t += gap + (host && s % 5 == 4 ? 0.008 : 0);
    }
    og_set(&r->event.requested_bytes, 128 * MiB);
}

/* the same leak gets the same steps (one an iteration) however busy the host: one block an iteration
 * 2 ms apart; four blocks an iteration, 20 ms apart; two blocks an iteration between temporaries */
static void a_busy_host_keeps_a_leak_s_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    static const struct {
        int iterations, keep;
        double gap;
        bool temp;
    } loops[] = { { 40, 1, 0.002, false }, { 20, 4, 0.02, false }, { 12, 2, 0.02, true } };
    for (size_t l = 0; l < sizeof loops / sizeof *loops; l++)
        for (int host = 0; host < 2; host++) {
            kept_blocks_loop(r, loops[l].iterations, loops[l].keep, loops[l].gap, loops[l].temp, host);
            const og_facts_t *f = facts(r);
            if (!f->growth.holds || f->growth.steps != loops[l].iterations)
                fail_msg("loop %zu, host %d: growth %d, %d steps", l, host, f->growth.holds, f->growth.steps);
            assert_int_equal(f->growth.per_step, (uint64_t)loops[l].keep * 128 * MiB);
        }
    free(r);
}

/* a leak whose steps reach the driver as one kept block each, 1 ms apart with nothing between (the
 * temporaries come from the framework's warm cache): steps, not a burst */
static void kept_blocks_a_step_apart_are_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB); /* the model */
    for (int s = 0; s < 60; s++)
        ev_add(r, 0.01 + 0.001 * s, "alloc", 24 * MiB);
    og_set(&r->event.requested_bytes, 24 * MiB);
    const og_facts_t *f = facts(r);
    assert_true(f->growth.holds);
    assert_int_equal(f->growth.marker, OG_MARK_FAILING_SIZE);
    assert_int_equal(f->growth.steps, 60);
    assert_int_equal(f->growth.per_step, 24 * MiB);
    free(r);
}

static void growth_needs_six_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB); /* the weights first: a leak, not a load */
    leak_loop(r, 5, 0.5, 512 * MiB, 1 * GiB);
    assert_false(facts(r)->growth.holds);
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 6, 0.5, 512 * MiB, 1 * GiB);
    assert_true(facts(r)->growth.holds);
    assert_int_equal(F.growth.steps, 6);
    free(r);
}

/* the framework freed nothing over its life: one pass keeping what it makes, not a leak */
static void one_pass_is_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    leak_loop(r, 12, 0.5, 512 * MiB, 1 * GiB);
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.freed_known = true;
    r->memory.fw.freed_bytes_total = 0;
    const og_facts_t *f = facts(r);
    assert_false(f->growth.holds);
    assert_true(f->growth.pass_built);
    r->memory.fw.freed_bytes_total = 12 * 512 * MiB; /* iterations free their temporaries */
    assert_true(facts(r)->growth.holds);
    free(r);
}

/* the low points rise to what the roles say the job keeps for good (the weights' gradients and the
 * optimizer state made at the first step) and no further: a one-off build-up, not a leak; the same
 * steps rising beyond that state are one */
static void a_rise_to_the_jobs_own_state_is_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 2 * GiB);                                 /* the weights */
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB);                        /* lows: 2 GiB rising to 4.75 GiB */
    fixture_roles(r, 2 * GiB, 1536 * MiB, 1536 * MiB, 0, 0, 512 * MiB); /* 5 GiB: weights, grads, AdamW */
    r->memory.fw.freed_known = true;
    r->memory.fw.freed_bytes_total = 12 * 512 * MiB;
    const og_facts_t *f = facts(r);
    assert_false(f->growth.holds);
    assert_true(f->growth.state_built);
    assert_int_equal(f->growth.state, 5 * GiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, 3 * GiB, 512 * MiB); /* the same bytes kept by Python: a leak */
    assert_true(facts(r)->growth.holds);
    fixture_roles(r, 2 * GiB, 1536 * MiB, 1536 * MiB, 0, 0, 512 * MiB);
    og_unset(&r->memory.fw.roles.bytes[OG_ROLE_gradients]); /* the state not measured: as before */
    assert_true(facts(r)->growth.holds);
    free(r);
}

/* the optimizer's state made one tensor at a time ends a few MiB above what the roles measure: a few MiB
 * beyond the state are not a leak even when they exceed a small shortfall (two steps' worth are needed) */
static void a_few_mib_beyond_the_state_are_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 2 * GiB);
    leak_loop(r, 20, 0.5, 512 * MiB, 256 * MiB);                        /* lows: 2 GiB rising to 6.75 GiB */
    fixture_roles(r, 2 * GiB, 2304 * MiB, 2556 * MiB, 0, 0, 512 * MiB); /* 4 MiB under the last low */
    r->memory.fw.freed_known = true;
    r->memory.fw.freed_bytes_total = 20 * 512 * MiB;
    og_set(&r->device.free_bytes, 510 * MiB); /* 2 MiB missing */
    const og_facts_t *f = facts(r);
    assert_false(f->growth.holds);
    assert_true(f->growth.state_built);
    free(r);
}

/* the adapter timed the latest optimizer step: a rise whose second half came after it is the iteration
 * still running (one pass), not memory kept across iterations; steps after the rise are iterations */
static void a_rise_since_the_last_optimizer_step_is_one_pass(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB); /* steps at 0.01, 0.51, ..., 5.51 s */
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 10 * GiB);
    r->event.t_rel = 6.0;
    assert_true(facts(r)->growth.holds);                   /* the step not timed: as before */
    og_set(&r->memory.fw.roles.last_step_age_us, 5500000); /* a step at 0.5 s: the rise came after it */
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.since_step && F.growth.pass_built);
    og_set(&r->memory.fw.roles.last_step_age_us, 200000); /* a step at 5.8 s: the steps spanned iterations */
    assert_true(facts(r)->growth.holds);
    assert_false(F.growth.since_step);
    free(r);
}

/* the adapter's age of the latest optimizer step is measured at its report: a report that came 3 s after
 * the failure (a busy host, a long roles scan) counts back from the report, and the step at 5.8 s stays
 * after the rise's middle: the steps spanned iterations */
static void a_late_report_does_not_move_the_last_step(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB); /* steps at 0.01, 0.51, ..., 5.51 s */
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 10 * GiB);
    r->event.t_rel = 6.0;
    for (int late = 0; late < 2; late++) {
        r->memory.fw.roles.reported_t_rel = late ? 9.0 : 6.0;
        og_set(&r->memory.fw.roles.last_step_age_us, late ? 3200000 : 200000); /* a step at 5.8 s */
        const og_facts_t *f = facts(r);
        assert_true(f->growth.holds);
        assert_false(f->growth.since_step);
    }
    og_set(&r->memory.fw.roles.last_step_age_us, 8500000); /* a step at 0.5 s: the rise came after it */
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.since_step);
    free(r);
}

/* steps of 1/40 of the device from almost nothing read as weights arriving, unless the adapter read
 * another phase from the stack: then they are iterations keeping a large state (a hidden state not
 * detached, 640 MiB a step) */
static void large_steps_in_a_forward_pass_are_not_a_load(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 128 * MiB); /* a small model */
    leak_loop(r, 12, 0.5, 1 * GiB, 640 * MiB);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.load_steps > 0);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    assert_true(facts(r)->growth.holds);
    assert_int_equal(F.growth.per_step, 640 * MiB);
    fixture_phase(r, "loading", "/usr/lib/torch/nn/modules/module.py", "to");
    assert_false(facts(r)->growth.holds);
    free(r);
}

/* a rise kept across iterations that the driver barely saw (a warm cache: one new segment now and then, fewer
 * than six steps): the framework's allocated bytes after each optimizer step rise 48 MiB a step; four steps
 * suffice, a small rise counts over every step made, and the series' numbers are the growth's */
static void a_rise_after_each_optimizer_step_is_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 4, 0.5, 1 * GiB, 256 * MiB); /* four steps at the driver: no reading of its own */
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 10 * GiB);
    og_set(&r->device.free_bytes, 0);
    assert_false(facts(r)->growth.holds);
    fixture_steps(r, 3, 3, 6 * GiB, 48 * MiB); /* three steps: too few */
    assert_false(facts(r)->growth.holds);
    fixture_steps(r, 25, 25, 6 * GiB, 48 * MiB); /* 1.1 GiB over 25 steps: under 5%, but at least what is missing */
    const og_facts_t *f = facts(r);
    assert_true(f->growth.holds);
    assert_int_equal(f->growth.marker, OG_MARK_OPTIMIZER_STEP);
    assert_int_equal(f->growth.per_step, 48 * MiB);
    assert_int_equal(f->growth.rise, 24 * 48 * MiB);
    assert_int_equal(f->growth.first_low, 6 * GiB);
    assert_int_equal(f->growth.steps, 25);
    og_set(&r->device.free_bytes, 2 * GiB); /* nothing missing: 1.1 GiB over the last 32 of 400 steps made is 18 GiB */
    fixture_steps(r, 400, 32, 6 * GiB, 36 * MiB);
    assert_true(facts(r)->growth.holds);
    fixture_steps(r, 32, 32, 6 * GiB, 36 * MiB); /* ... but not over 32 in all */
    assert_false(facts(r)->growth.holds);
    free(r);
}

/* the framework's allocated bytes after each of the latest optimizer steps stayed flat, or went up and down with no
 * trend: what rose at the driver (the cache warming, one forward pass of a long batch) was not kept across
 * iterations */
static void flat_after_each_optimizer_step_is_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 10 * GiB);
    assert_true(facts(r)->growth.holds);  /* the driver's reading */
    fixture_steps(r, 100, 7, 9 * GiB, 0); /* seven flat steps: too few to overrule it */
    assert_true(facts(r)->growth.holds);
    /* ... unless they are every step the run made: the whole run kept nothing across its steps (what rose at the
     * driver came in its first iteration, before the cache served the rest) */
    fixture_steps(r, 7, 7, 9 * GiB, 0);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.steps_flat);
    r->memory.fw.roles.device_steps = 35; /* ... not when other optimizers stepped there before (one per client) */
    assert_true(facts(r)->growth.holds);
    r->memory.fw.roles.device_steps_known = false; /* ... nor when that was not watched */
    assert_true(facts(r)->growth.holds);
    fixture_steps(r, 7, 7, 9 * GiB, 0);
    fixture_steps(r, 7, 7, 9 * GiB, 128 * MiB); /* ... not when they rose by more than 1% of the card */
    assert_false(facts(r)->growth.steps_flat);
    fixture_steps(r, 3, 3, 9 * GiB, 0); /* ... and not from fewer than four */
    assert_true(facts(r)->growth.holds);
    fixture_steps(r, 100, 32, 9 * GiB, 0);
    for (int i = 0; i < 32; i += 2) /* variable batches: a few MiB up and down */
        r->memory.fw.roles.step_alloc[i] += 3 * MiB;
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.steps_flat);
    /* batches of varying lengths (dynamic padding): 2.5 GiB up and down, no trend: the later half's low point 128 MiB
     * above the earlier half's, under 5% of the card and under the 256 MiB missing: nothing kept explains it */
    og_set(&r->device.free_bytes, 256 * MiB);
    fixture_steps(r, 100, 32, 9 * GiB, 0);
    for (int i = 0; i < 32; i++)
        r->memory.fw.roles.step_alloc[i] += (i % 3 ? 2560 * MiB : 0) + (i >= 16 ? 128 * MiB : 0);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.steps_flat);
    for (int i = 16; i < 32; i++) /* the later low point 1.1 GiB up: more than is missing, the driver's reading */
        r->memory.fw.roles.step_alloc[i] += 1 * GiB;
    assert_true(facts(r)->growth.holds);
    assert_false(F.growth.steps_flat);
    free(r);
}

/* the latest 32 optimizer steps each rose a little (23 MiB, 16 MiB in all: batches of varying size) and 310 were
 * made: carried over the run that would be 7 GiB, but the run's own series (every 16th step) ended where it
 * began: the run kept nothing, no growth; a series that did climb keeps the reading */
static void run_series_overrules_the_latest_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    fixture_roles(r, 16 * MiB, 0, 32 * MiB, 0, 0, 0);
    fixture_steps(r, 310, 32, 1300 * MiB, 0);
    for (int i = 1; i < 32; i++) /* up 23 MiB in most steps, down in a few: 16 MiB net */
        r->memory.fw.roles.step_alloc[i] =
            r->memory.fw.roles.step_alloc[i - 1] + (i % 8 ? 23 * MiB : 0) - (i % 8 ? 0 : 142 * MiB);
    assert_true(facts(r)->growth.holds); /* the latest steps alone: carried over 310 steps */
    og_roles_t *ro = &r->memory.fw.roles;
    ro->nstep_run = 19;
    ro->step_run_every = 16;
    for (int i = 0; i < 19; i++)
        ro->step_run[i] = 1180 * MiB + (i % 3) * 60 * MiB; /* up and down, 1.18 GiB first and last */
    assert_false(facts(r)->growth.holds);
    for (int i = 0; i < 19; i++) /* the run climbing by 400 MiB every point: the reading stands */
        ro->step_run[i] = 1180 * MiB + (uint64_t)i * 400 * MiB;
    assert_true(facts(r)->growth.holds);
    free(r);
}

/* the optimizer made one to three steps and the failure is in its training pass (or the EMA update after its step):
 * what the driver saw rise is the model, the first passes, the state the first step made and the pass running now,
 * not a leak
 * (growth.first_steps); a failure outside the training pass (an evaluation) or four steps made keep the
 * driver's reading, unless those four are every step of the run and flat (growth.steps_flat) */
static void first_steps_are_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB);
    fixture_roles(r, 1 * GiB, 0, 2 * GiB, 0, 0, 10 * GiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    assert_true(facts(r)->growth.holds); /* no step series: the driver's reading */
    fixture_steps(r, 1, 1, 9 * GiB, 0);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.first_steps);
    fixture_steps(r, 3, 3, 9 * GiB, 0);
    assert_false(facts(r)->growth.holds);
    fixture_phase(r, "ema_update", "/w/train.py", "update_ema"); /* the EMA update ends the same iteration */
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.first_steps);
    fixture_phase(r, "evaluation", "/w/train.py", "evaluate");
    assert_true(facts(r)->growth.holds);
    assert_false(F.growth.first_steps);
    fixture_phase(r, "backward", "/w/train.py", "main");
    fixture_steps(r, 100, 4, 9 * GiB, 0); /* the latest four of 100: too few to be read flat */
    assert_true(facts(r)->growth.holds);
    fixture_steps(r, 4, 4, 9 * GiB, 0); /* every step of the run, flat: nothing kept across them */
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.steps_flat);
    free(r);
}

/* PyTorch before 2.0 has no optimizer step hook, so no adapter reads the steps there: a training pass whose driver
 * history rose while the adapter's finished scan finds Python holding almost none of it is the job's own state and
 * the pass running (growth.working_set); a holder with a tenth of the rise, a second copy of the model, a failure
 * outside the training pass, a version with the hook, or an unknown version keep the driver's reading */
static void working_set_without_step_hook(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB);
    fixture_roles(r, 1 * GiB, 1 * GiB, 2 * GiB, 0, 0, 9 * GiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    assert_true(facts(r)->growth.holds); /* the version unknown: the driver's reading */
    strcpy(r->memory.fw.source, "torch 1.13.0");
    assert_int_equal(facts(r)->torch_version, 113);
    assert_false(F.growth.holds);
    assert_true(F.growth.working_set);
    fixture_phase(r, "evaluation", "/w/train.py", "evaluate");
    assert_true(facts(r)->growth.holds);
    fixture_phase(r, "backward", "/w/train.py", "main");
    assert_false(facts(r)->growth.holds);
    strcpy(r->memory.fw.source, "torch 2.0.1");
    assert_true(facts(r)->growth.holds);
    assert_false(F.growth.working_set);
    strcpy(r->memory.fw.source, "torch 1.13.0");
    r->memory.fw.roles.bytes[OG_ROLE_held_by_python] = fx_opt(600 * MiB);
    r->memory.fw.roles.bytes[OG_ROLE_activations] = fx_opt(8 * GiB + 424 * MiB);
    fixture_holder(r, "seen", "list", "local in main (train.py:40)", 600 * MiB);
    assert_true(facts(r)->growth.holds); /* 600 MiB of a 2.75 GiB rise: Python holds what a leak would keep */
    r->memory.fw.roles.holders[0].bytes = 100 * MiB;
    r->memory.fw.roles.bytes[OG_ROLE_held_by_python] = fx_opt(100 * MiB);
    assert_false(facts(r)->growth.holds);
    fixture_model(r, "Net", 1 * GiB, 2, false); /* a second copy of the model: kept, a leak's */
    assert_true(facts(r)->growth.holds);
    free(r);
}

/* no step yet: an AdamW holding the device's parameters and no state (its moments come at the first step), the
 * failure in the first forward: the rise is the model and the pass, not a leak; an SGD without momentum keeps no
 * state whatever it made, so it says nothing, nor does an Adam whose state exists */
static void before_the_first_step_is_not_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 256 * MiB);
    fixture_roles(r, 1 * GiB, 0, 0, 0, 0, 12 * GiB);
    fixture_phase(r, "forward", "/w/train.py", "forward");
    fixture_optimizer(r, "AdamW", 0);
    og_set(&r->memory.fw.roles.optimizers[0].param_bytes, 1 * GiB);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.first_steps);
    snprintf(r->memory.fw.roles.optimizers[0].cls, sizeof r->memory.fw.roles.optimizers[0].cls, "SGD");
    assert_true(facts(r)->growth.holds);
    snprintf(r->memory.fw.roles.optimizers[0].cls, sizeof r->memory.fw.roles.optimizers[0].cls, "AdamW");
    r->memory.fw.roles.optimizers[0].bytes = 2 * GiB;
    r->memory.fw.roles.bytes[OG_ROLE_optimizer_state] = fx_opt(2 * GiB);
    assert_true(facts(r)->growth.holds);
    /* whatever its state, an optimizer the adapter saw make no step (a measured 0) has ended no iteration; unknown
     * steps are not that */
    fixture_steps(r, 0, 0, 0, 0);
    assert_false(facts(r)->growth.holds);
    assert_true(F.growth.first_steps);
    snprintf(r->memory.fw.roles.optimizers[0].cls, sizeof r->memory.fw.roles.optimizers[0].cls, "SOAP");
    assert_false(facts(r)->growth.holds);
    r->memory.fw.roles.steps_known = false;
    assert_true(facts(r)->growth.holds);
    free(r);
}

/* an iteration of 16 optimizer steps (a PPO epoch over its mini-batches) keeps 1 GiB: the latest 32 steps see one
 * rise, the run's series (every 4th step of 96) a staircase of five that never fell: growth; one jump (a buffer made
 * once), a series that fell back, or a latest series flat over its steps: not */
static void run_series_staircase_is_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 20 * GiB);
    fixture_roles(r, 4 * GiB, 2 * GiB, 4 * GiB, 0, 7 * GiB, 6 * GiB);
    fixture_phase(r, "backward", "/w/ppo.py", "train");
    og_set(&r->event.requested_bytes, 88 * MiB);
    og_set(&r->device.free_bytes, 48 * MiB);
    og_roles_t *ro = &r->memory.fw.roles;
    fixture_steps(r, 96, 32, 16 * GiB, 0);
    for (int i = 16; i < 32; i++)
        ro->step_alloc[i] = 17 * GiB;
    ro->step_run_every = 4;
    ro->nstep_run = 24;
    for (int i = 0; i < 24; i++)
        ro->step_run[i] = 12 * GiB + (uint64_t)(i / 4) * GiB;
    assert_true(facts(r)->growth.holds);
    assert_true(F.growth.over_run);
    assert_int_equal(F.growth.rising, 5);
    assert_int_equal(F.growth.rise, 5 * GiB);
    for (int i = 0; i < 24; i++) /* one jump: a buffer made once */
        ro->step_run[i] = i < 12 ? 12 * GiB : 14 * GiB;
    assert_false(facts(r)->growth.over_run);
    for (int i = 0; i < 24; i++) /* up and down again */
        ro->step_run[i] = 12 * GiB + (uint64_t)(i % 8 / 2) * GiB;
    assert_false(facts(r)->growth.over_run);
    for (int i = 0; i < 24; i++)
        ro->step_run[i] = 12 * GiB + (uint64_t)(i / 4) * GiB;
    fixture_steps(r, 96, 32, 17 * GiB, 0); /* the latest 32 steps flat: nothing kept lately */
    assert_false(facts(r)->growth.holds);
    /* ... unless what Python keeps across calls is the run's rise: a cache that grows with each new key, paused */
    fixture_holder(r, "self._alibi", "dict", "attribute on AlibiEncoder", 5 * GiB);
    assert_true(facts(r)->growth.holds);
    assert_true(F.growth.kept_paused && F.growth.over_run);
    r->memory.fw.roles.holders[0].bytes = 4 * GiB; /* short of 9/10 of the 5 GiB rise: the flat reading stands */
    assert_false(facts(r)->growth.holds);
    assert_false(F.growth.over_run);
    free(r);
}

/* kept outputs of varying sizes, 10 steps all rising: the every-allocation reading needs 16 */
static void every_allocation_needs_sixteen_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    for (int steps = 10; steps <= 20; steps += 10) {
        ev_reset(r);
        for (int s = 0; s < steps; s++)
            ev_add(r, 0.01 + 0.5 * s, "alloc", (100 + 17 * (uint64_t)s) * MiB);
        og_set(&r->event.requested_bytes, 3 * GiB);
        const og_facts_t *f = facts(r);
        assert_int_equal(f->growth.holds, steps >= 16);
        if (f->growth.holds)
            assert_int_equal(f->growth.marker, OG_MARK_EVERY_ALLOCATION);
    }
    free(r);
}

/* weights: a run of equal kept blocks at the end; a second run of them earlier: a second copy */
static void loading_and_a_second_copy(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->memory.process_tracked_bytes, 4 * GiB);
    ev_reset(r);
    for (int i = 0; i < 8; i++)
        ev_add(r, 0.01 + 0.001 * i, "alloc", 512 * MiB);
    og_set(&r->event.requested_bytes, 512 * MiB);
    assert_int_equal(facts(r)->load.phase, OG_PHASE_LOADING);
    assert_int_equal(F.load.run, 8);
    for (int i = 0; i < 8; i++)
        ev_add(r, 5 + 0.001 * i, "alloc", 512 * MiB);
    assert_int_equal(facts(r)->load.phase, OG_PHASE_SECOND_LOAD);
    assert_int_equal(F.load.earlier, 8);
    /* the adapter read a forward pass from the stack: equal blocks are its layers, not a load */
    fixture_adapter(r, 8 * GiB, 8 * GiB, 0);
    fixture_phase(r, "forward", "/srv/model.py", "forward");
    assert_int_equal(facts(r)->load.phase, OG_PHASE_NONE);
    fixture_phase(r, "loading", "/x/modeling_utils.py", "from_pretrained");
    assert_int_equal(facts(r)->load.phase, OG_PHASE_SECOND_LOAD);
    free(r);
}

/* the framework's release between its failed attempts belongs to the failure, not to the load it
 * interrupted: a load of eight shards, a failed ninth, a release, a failed retry is still a load */
static void the_failures_own_release_does_not_end_a_load(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->memory.process_tracked_bytes, 4 * GiB);
    ev_reset(r);
    ev_add(r, 0.01, "alloc", 64 * MiB); /* cached before the load */
    for (int i = 0; i < 8; i++)
        ev_add(r, 0.02 + 0.001 * i, "alloc", 512 * MiB);
    ev_add(r, 0.03, "fail", 512 * MiB);
    ev_add(r, 0.031, "free", 64 * MiB); /* released before the retry */
    ev_add(r, 0.032, "fail", 512 * MiB);
    og_set(&r->event.requested_bytes, 512 * MiB);
    assert_int_equal(facts(r)->load.phase, OG_PHASE_LOADING);
    assert_int_equal(F.load.run, 8);
    free(r);
}

/* a slow load (a piece every 80 ms from a network file system) whose pieces come later when the host
 * is busy (150 ms) stays one load; a pause of seconds after a fast load is a second copy */
static void a_busy_host_does_not_split_a_slow_load(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    double t = 0.1;
    for (int i = 0; i < 22; i++, t += i % 5 == 3 ? 0.15 : 0.08)
        ev_add(r, t, "alloc", GiB);
    og_set(&r->event.requested_bytes, GiB);
    og_set(&r->memory.process_tracked_bytes, 22 * GiB);
    const og_facts_t *f = facts(r);
    assert_int_equal(f->load.phase, OG_PHASE_LOADING);
    assert_int_equal(f->load.run, 22);
    assert_int_equal(f->load.earlier, 0);
    free(r);
}

/* after optimizer steps, a run of equal kept blocks is a batch, not weights */
static void a_run_after_training_is_not_a_load(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    for (int i = 0; i < 8; i++)
        ev_add(r, 0.01 + 0.001 * i, "alloc", 512 * MiB);
    og_set(&r->event.requested_bytes, 512 * MiB);
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    assert_int_equal(facts(r)->load.phase, OG_PHASE_LOADING);
    r->memory.fw.training = 1;
    assert_int_equal(facts(r)->load.phase, OG_PHASE_NONE);
    free(r);
}

static void imbalance_needs_one_and_a_half_times(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_imbalance(r);
    assert_true(facts(r)->imbalance.holds);
    for (int i = 1; i < 4; i++)
        r->summary[i].tracked_bytes = 16 * GiB; /* 22 / 16 = 1.4x */
    og_set(&r->device.free_bytes, 0);
    assert_false(facts(r)->imbalance.holds);
    free(r);
}

static void a_cap_binds_when_the_framework_refused_or_the_device_had_room(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_adapter(r, 10 * GiB, 10 * GiB, 0);
    og_set(&r->memory.fw.cap_bytes, 11 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB); /* no room for 2 GiB */
    assert_false(facts(r)->cap.binds);
    r->memory.fw.internal_oom = true;
    assert_true(facts(r)->cap.binds);
    r->memory.fw.internal_oom = false;
    og_set(&r->device.free_bytes, 4 * GiB);
    assert_true(facts(r)->cap.binds);
    assert_int_equal(F.cap.over, 1 * GiB);
    free(r);
}

/* A device whose free memory was not read: nothing is free, nothing is short, and no other process is
 * inferred from it; read as 0, the same numbers are a measurement (the whole request is short) */
static void device_free_unknown_is_not_zero(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_unset(&r->device.free_bytes);
    og_unset(&r->device.total_bytes);
    og_unset(&r->memory.other_processes_bytes);
    const og_facts_t *f = facts(r);
    assert_false(f->phys_free.known);
    assert_false(f->free_known);
    assert_false(f->shortfall_known); /* unknown: the 0 below is no figure */
    assert_int_equal(f->shortfall, 0);
    assert_false(f->other_inferred);
    assert_false(og_known(og_other_inferred_bytes(r)));
    assert_int_equal(f->capacity, 0);
    assert_false(f->larger_than_device);
    og_set(&r->device.free_bytes, 0);
    f = facts(r);
    assert_true(f->phys_free.known && f->free_known && !f->free_estimated);
    assert_true(f->shortfall_known);
    assert_int_equal(f->shortfall, 2 * GiB);
    free(r);
}

/* No NVML list: what the device's numbers leave unexplained is inferred (total - free - tracked - one context),
 * only when total, free and tracked were all read; a measured list of none infers nothing */
static void other_processes_inferred_only_from_measured_numbers(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_unset(&r->memory.other_processes_bytes); /* 24 - 1 free - 20 tracked - 0.5 context: 2.5 GiB */
    og_opt_u64_t inf = og_other_inferred_bytes(r);
    assert_true(og_known(inf));
    assert_int_equal(inf.v, 2 * GiB + 512 * MiB);
    const og_facts_t *f = facts(r);
    assert_true(f->other_inferred);
    assert_int_equal(f->other, 2 * GiB + 512 * MiB);
    assert_int_equal(f->other_all, 0); /* the measured total stays unknown (0 in sums), not the inference */
    og_unset(&r->memory.process_tracked_bytes);
    assert_false(og_known(og_other_inferred_bytes(r)));
    og_set(&r->memory.process_tracked_bytes, 20 * GiB);
    og_unset(&r->device.total_bytes);
    assert_false(og_known(og_other_inferred_bytes(r)));
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->memory.other_processes_bytes, 0);
    assert_false(og_known(og_other_inferred_bytes(r)));
    assert_false(facts(r)->other_inferred);
    free(r);
}

/* A framework's cap is a fact only when the adapter reported one: unknown binds nothing, whatever the numbers */
static void an_unknown_cap_binds_nothing(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_adapter(r, 10 * GiB, 10 * GiB, 0);
    r->memory.fw.internal_oom = true;
    og_unset(&r->memory.fw.cap_bytes);
    const og_facts_t *f = facts(r);
    assert_false(f->cap.binds);
    assert_int_equal(f->cap.cap, 0);
    og_set(&r->memory.fw.cap_bytes, 11 * GiB);
    assert_true(facts(r)->cap.binds);
    free(r);
}

/* what the framework released between its attempts: unknown (its own retry, unseen) is not a measured release */
static void released_unknown_releases_nothing(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    r->event.attempts = 2;
    og_unset(&r->event.released_between_attempts_bytes);
    assert_int_equal(facts(r)->released, 0);
    og_set(&r->event.released_between_attempts_bytes, 3 * GiB);
    assert_int_equal(facts(r)->released, 3 * GiB);
    free(r);
}

/* which cards fit: a bounded peak only; a card of the failing size never fits */
static void fits_only_from_a_bounded_peak(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    r->nsummary = 1;
    r->summary[0].index = 0;
    r->summary[0].peak_bytes = 20 * GiB;
    og_set(&r->memory.process_tracked_bytes, 20 * GiB);
    og_set(&r->memory.process_used_bytes, 20 * GiB + 512 * MiB);
    og_set(&r->event.requested_bytes, 6 * GiB);
    og_set(&r->device.free_bytes, 3 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->fit.bounded);
    assert_int_equal(f->fit.need, 26 * GiB + 512 * MiB); /* held + request */
    assert_int_equal(f->fit.card_floor, 24 * GiB);
    assert_string_equal(f->fit.why, "");
    /* in a build-up phase the rest was never requested */
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    strcpy(r->memory.fw.phase, "forward");
    f = facts(r);
    assert_false(f->fit.bounded);
    assert_non_null(strstr(f->fit.why, "forward"));
    r->memory.fw.phase[0] = 0;
    r->memory.fw.has = false;
    /* a request of unknown size (a framework's failure that did not say it) */
    og_unset(&r->event.requested_bytes);
    f = facts(r);
    assert_false(f->fit.bounded);
    assert_non_null(strstr(f->fit.why, "not seen"));
    /* a request of 0 bytes is a size that was seen: the peak is bounded by what was held */
    og_set(&r->event.requested_bytes, 0);
    f = facts(r);
    assert_true(f->fit.bounded);
    assert_string_equal(f->fit.why, "");
    /* what the process held not measured (a failure recorded alone, NVML absent): the request is a lower bound */
    og_set(&r->event.requested_bytes, 6 * GiB);
    og_unset(&r->memory.process_tracked_bytes);
    og_unset(&r->memory.process_used_bytes);
    f = facts(r);
    assert_false(f->fit.bounded);
    assert_non_null(strstr(f->fit.why, "held was not measured"));
    og_set(&r->memory.process_used_bytes, 20 * GiB + 512 * MiB); /* NVML's figure alone bounds it */
    f = facts(r);
    assert_true(f->fit.bounded);
    assert_int_equal(f->fit.need, 26 * GiB + 512 * MiB);
    og_set(&r->memory.process_tracked_bytes, 20 * GiB);
    /* a SIZE_MAX request was seen: no card holds it (not "unknown", which would say its size was not seen) */
    og_set(&r->event.requested_bytes, UINT64_MAX);
    f = facts(r);
    assert_true(f->fit.bounded);
    assert_true(f->fit.need >= UINT64_MAX / 2); /* saturated (less a measured cache) */
    assert_string_equal(f->fit.why, "");
    /* growth: a leak fills any card */
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 8 * GiB);
    leak_loop(r, 12, 0.5, 512 * MiB, 1 * GiB);
    f = facts(r);
    assert_true(f->growth.holds);
    assert_false(f->fit.bounded);
    assert_non_null(strstr(f->fit.why, "grew"));
    /* recovered: it fit after the release; its peak is the need */
    r->event.recovered = true;
    f = facts(r);
    assert_true(f->fit.bounded);
    assert_int_equal(f->fit.need, 20 * GiB);
    assert_int_equal(f->fit.card_floor, 0);
    free(r);
}

static void local_rank_beyond_the_visible_gpus(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    r->visible_devices = 2;
    r->event.device = 0;
    r->local_rank = 1;
    assert_true(facts(r)->wrong_device);
    r->local_rank = 3;
    assert_false(facts(r)->wrong_device);
    free(r);
}

/* the ranks of this job on this machine: LOCAL_WORLD_SIZE when set, else this rank and the ranks of its job on the
 * failing GPU (not its children); more of them than visible GPUs, with a rank of the job here: they outnumber them */
static void ranks_on_the_machine(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    r->visible_devices = 1;
    assert_int_equal(facts(r)->node_ranks, 0); /* no rank */
    r->rank = r->local_rank = 1;
    r->world_size = 4;
    assert_int_equal(facts(r)->node_ranks, 1);
    assert_false(facts(r)->ranks_outnumber_gpus);
    og_other_proc_t *w = &r->memory.other[r->memory.nother++];
    w->same_job = w->child = true; /* a DataLoader worker: no rank */
    w->rank = -1;
    og_other_proc_t *o = &r->memory.other[r->memory.nother++];
    o->same_job = true;
    o->rank = 0;
    assert_int_equal(facts(r)->node_ranks, 2);
    assert_true(facts(r)->ranks_outnumber_gpus);
    strcpy(r->env[r->nenv++], "LOCAL_WORLD_SIZE=4"); /* the launcher's count, ranks on other GPUs too */
    r->visible_devices = 2;
    assert_int_equal(facts(r)->node_ranks, 4);
    assert_true(facts(r)->ranks_outnumber_gpus);
    r->visible_devices = 4;
    assert_false(facts(r)->ranks_outnumber_gpus);
    free(r);
}

static void a_retry_needs_two_attempts(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    r->event.attempts = 1;
    assert_false(facts(r)->retried);
    assert_false(F.adv.retried_zero);
    r->event.attempts = 2;
    assert_true(facts(r)->retried);
    assert_true(F.adv.retried_zero);
    r->event.recovered = true; /* the retry worked */
    assert_false(facts(r)->retried);
    assert_false(F.adv.retried_zero);
    free(r);
}

/* event.phase read into the enum; unknown without the adapter; torch.load on the stack marks a restore */
static void the_phase_as_the_adapter_said(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    assert_int_equal(facts(r)->phase, OG_JP_unknown);
    fixture_phase(r, "optimizer_step", NULL, NULL);
    assert_int_equal(facts(r)->phase, OG_JP_optimizer_step);
    assert_string_equal(og_job_phase_name(F.phase), "optimizer_step");
    fixture_phase(r, "sleeping", NULL, NULL);
    assert_int_equal(facts(r)->phase, OG_JP_unknown);
    fixture_phase(r, "loading", "/x/modeling_utils.py", "from_pretrained");
    assert_int_equal(facts(r)->phase, OG_JP_loading);
    assert_false(F.load_via_torch_load);
    fixture_phase(r, "loading", "/usr/lib/python3/dist-packages/torch/serialization.py", "load");
    assert_true(facts(r)->load_via_torch_load);
    free(r);
}

/* the roles as the advice reads them: locals are the running code's, the largest other holder is the
 * keeper, 8-bit optimizer state is not counted as shrinkable */
static void roles_for_the_advice(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    assert_false(facts(r)->roles.known);
    assert_int_equal(F.roles.keeper, -1);
    fixture_roles(r, 4 * GiB, 0, 6 * GiB, 1 * GiB, 8 * GiB, 1 * GiB);
    fixture_holder(r, "got", "list", "local in step (train.py:40)", 5 * GiB);
    fixture_holder(r, "cache", "OrderedDict", "global in train.py", 2 * GiB);
    fixture_holder(r, "hist", "list", "global in train.py", 1 * GiB);
    fixture_optimizer(r, "AdamW", 4 * GiB);
    fixture_optimizer(r, "Adam8bit", 2 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->roles.known && f->roles.act_known);
    assert_int_equal(f->roles.local_held, 5 * GiB);
    assert_int_equal(f->roles.working, 6 * GiB);
    assert_int_equal(f->roles.keeper, 1);
    assert_true(f->roles.keeper_map);
    assert_int_equal(f->roles.opt_full, 4 * GiB);
    assert_true(f->roles.opt_adam);
    assert_int_equal(f->roles.pools, 1 * GiB);
    og_unset(&r->memory.fw.roles.bytes[OG_ROLE_activations]);
    assert_false(facts(r)->roles.act_known);
    free(r);
}

/* what the adapter says the holders keep (names, copies), the models and the failing statement */
/* models the running code holds by a name (roles.models[].named/running/names) are kept on purpose, not left
 * over; one whose name the failing statement rebinds is a previous copy; the operation and DDP's buckets read */
static void models_held_by_name_operation_ddp(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_roles(r, 8 * GiB, 0, 0, 0, 0, 1 * GiB);
    fixture_model(r, "LM", 4 * GiB, 2, false);
    fixture_model_held(r, 2, 1, "base,tuned");
    assert_int_equal(facts(r)->roles.named_copies, 4 * GiB);
    assert_int_equal(F.roles.model_copies, 0);
    fixture_model_held(r, 1, 1, "tuned"); /* one copy no name reaches: a leftover */
    assert_int_equal(facts(r)->roles.named_copies, 0);
    assert_int_equal(F.roles.model_copies, 4 * GiB);
    fixture_model_held(r, 2, 1, "base,tuned");
    fixture_statement(r, "base", ""); /* `base = LM()` again: the old one is being replaced */
    assert_int_equal(facts(r)->roles.named_copies, 0);
    assert_int_equal(F.roles.model_copies, 4 * GiB);
    free(r);
    /* being built beside a model held by another name: the held one is kept on purpose, not a copy to release */
    r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_roles(r, 7 * GiB, 0, 0, 0, 0, 0);
    fixture_model(r, "LM", 4 * GiB, 1, false);
    fixture_model_held(r, 1, 0, "base");
    fixture_model(r, "LM", 3 * GiB, 1, false);
    fixture_model_held(r, 0, 1, "");
    fixture_statement(r, "tuned", "");
    fixture_phase(r, "loading", "/w/eval.py", "from_pretrained");
    assert_int_equal(facts(r)->roles.named_copies, 4 * GiB);
    assert_int_equal(F.roles.model_copies, 0);
    /* the one arriving is the one running, not the smallest: a larger model loads beside one held by name */
    fixture_model_held(r, 0, 0, ""); /* the last group (3 GiB) held by a name, not running; the first arriving */
    snprintf(r->memory.fw.roles.models[1].names, sizeof r->memory.fw.roles.models[1].names, "gen");
    r->memory.fw.roles.models[1].named = 1;
    r->memory.fw.roles.models[0].named = 0;
    r->memory.fw.roles.models[0].running = 1;
    assert_int_equal(facts(r)->roles.named_copies, 3 * GiB);
    assert_int_equal(F.roles.model_copies, 0);
    r->memory.fw.roles.models[1].named = 0; /* no name holds it: a previous copy of the arriving one */
    assert_int_equal(facts(r)->roles.model_copies, 3 * GiB);
    /* ... also while a model of another class is being built around it (a layer's __init__ runs too): one model of
     * the class is the previous copy; several alike are the blocks the outer one made so far, each a root until its
     * ModuleList takes them, and arrive with it */
    fixture_model(r, "Transformer", 64 * MiB, 1, false);
    r->memory.fw.roles.models[2].running = 1;
    assert_int_equal(facts(r)->roles.model_copies, 3 * GiB);
    r->memory.fw.roles.models[1].count = 40;
    assert_int_equal(facts(r)->roles.model_copies, 0);
    assert_int_equal(F.roles.arriving, 4 * GiB + 40 * 3ULL * GiB + 64 * MiB);
    r->memory.fw.roles.models[1].count = 1;
    r->memory.fw.roles.nmodels--;
    r->memory.fw.roles.models[0].named = 1;
    r->memory.fw.roles.models[0].running = 0;
    r->memory.fw.roles.models[1].running = 1;
    r->memory.fw.roles.models[0].named = -1; /* an adapter that did not say: the old reading */
    assert_int_equal(facts(r)->roles.model_copies, 4 * GiB);
    assert_int_equal(F.roles.operation, OG_OPERATION_NONE);
    fixture_operation(r, "cross_entropy", "cross_entropy");
    assert_int_equal(facts(r)->roles.operation, OG_OP_cross_entropy);
    fixture_operation(r, "nonsense", "f");
    assert_int_equal(facts(r)->roles.operation, OG_OPERATION_NONE);
    assert_string_equal(og_operation_name(OG_OP_image_decode), "image_decode");
    r->memory.fw.roles.ddp_wrappers = 1;
    r->memory.fw.roles.ddp_bucket_bytes = 3 * GiB;
    assert_int_equal(facts(r)->roles.ddp_buckets, 3 * GiB);
    r->memory.fw.roles.ddp_wrappers = 0;
    assert_int_equal(facts(r)->roles.ddp_buckets, 0);
    free(r);
}

static void names_copies_models_and_the_statement(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_roles(r, 4 * GiB, 4 * GiB, 8 * GiB, 0, 7 * GiB, 0);
    fixture_holder(r, "ema_params", "list", "local in main (train.py:70)", 4 * GiB);
    fixture_holder_says(r, "ema", "parameters");
    fixture_holder(r, "kv", "list", "global in serve.py", 2 * GiB);
    fixture_holder_says(r, "kv_cache", "");
    fixture_holder(r, "out", "list", "local in clone (train.py:50)", 1 * GiB);
    fixture_holder_says(r, "", "optimizer_state");
    fixture_model(r, "UNet", 2 * GiB, 2, false);
    fixture_model(r, "Teacher", 1 * GiB, 1, true);
    const og_facts_t *f = facts(r);
    assert_int_equal(f->roles.purpose_bytes[OG_PURPOSE_ema], 4 * GiB);
    assert_int_equal(f->roles.purpose_bytes[OG_PURPOSE_kv_cache], 2 * GiB);
    assert_int_equal(f->roles.copies, 5 * GiB);
    assert_int_equal(f->roles.model_copies, 2 * GiB);
    assert_int_equal(f->roles.frozen_models, 1 * GiB);
    assert_int_equal(f->roles.state, 4 * GiB + 4 * GiB + 8 * GiB + 5 * GiB); /* copies are bounded state */
    /* a second copy still arriving (a group of its own, smaller) counts while a model is being built: all but
     * the smallest trainable one of the class; a frozen one of the class is another model */
    fixture_model(r, "UNet", 1 * GiB + 512 * MiB, 1, false);
    fixture_model(r, "UNet", 512 * MiB, 1, true);
    assert_int_equal(facts(r)->roles.model_copies, 2 * GiB);
    fixture_statement(r, "weight", "");
    snprintf(r->memory.fw.roles.stmt.function, sizeof r->memory.fw.roles.stmt.function, "__init__");
    assert_int_equal(facts(r)->roles.model_copies, 2 * GiB + 2 * GiB); /* 2 + 2 + 1.5 trainable, 1.5 arriving */
    r->memory.fw.roles.has_statement = false;
    r->memory.fw.roles.nmodels -= 2;
    assert_int_equal(f->roles.building, OG_PURPOSE_NONE);
    assert_int_equal(og_purpose_of("checkpoint"), OG_PURPOSE_checkpoint);
    assert_int_equal(og_purpose_of("nonsense"), OG_PURPOSE_NONE);
    /* a statement building a checkpoint while loading: a checkpoint restore, as torch.load on the stack */
    fixture_phase(r, "loading", NULL, NULL);
    assert_false(facts(r)->load_via_torch_load);
    fixture_statement(r, "ckpt_opt", "checkpoint");
    assert_true(facts(r)->load_via_torch_load);
    assert_int_equal(F.roles.building, OG_PURPOSE_checkpoint);
    assert_int_equal(F.roles.request_shape, OG_REQ_UNKNOWN);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "16,4096,2,4096");
    assert_int_equal(facts(r)->roles.request_shape, OG_REQ_SQUARE);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "2000,4,2000,2000");
    assert_int_equal(facts(r)->roles.request_shape, OG_REQ_CUBE); /* one length three times: every triple */
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "8192,2000000,4");
    assert_int_equal(facts(r)->roles.request_shape, OG_REQ_PRODUCT);
    snprintf(r->memory.fw.roles.stmt_ints, sizeof r->memory.fw.roles.stmt_ints, "16,8192");
    assert_int_equal(facts(r)->roles.request_shape, OG_REQ_UNKNOWN); /* one size >= 128: nothing said */
    fixture_phase(r, "ema_update", NULL, NULL);
    assert_int_equal(facts(r)->phase, OG_JP_ema_update);
    assert_false(F.load_via_torch_load);
    free(r);
}

/* one batch's peak: a new size >= 4x anything before, after steps that freed what they made */
static void one_batch_peak_after_freed_steps(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    for (int s = 0; s < 10; s++) {
        ev_add(r, 0.1 * s, "alloc", 256 * MiB);
        ev_add(r, 0.1 * s + 0.01, "free", 256 * MiB);
    }
    ev_add(r, 2.0, "alloc", 1 * GiB);
    ev_add(r, 2.1, "fail", 1 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->outlier.holds);
    assert_int_equal(f->outlier.prev_max, 256 * MiB);
    assert_int_equal(f->outlier.run_bytes, 2 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB - 1); /* 3.99x: no */
    FIXTURE_EV[20].bytes = FIXTURE_EV[21].bytes = 1 * GiB - 1;
    assert_false(facts(r)->outlier.holds);
    /* nothing freed before (the driver saw no free and the framework's count is not known): no */
    ev_reset(r);
    for (int s = 0; s < 10; s++)
        ev_add(r, 0.1 * s, "alloc", 256 * MiB);
    ev_add(r, 2.0, "alloc", 2 * GiB);
    og_set(&r->event.requested_bytes, 2 * GiB);
    assert_false(facts(r)->outlier.holds);
    /* a warm cache hides the frees: the framework's own count says the steps freed */
    fixture_adapter(r, 20 * GiB, 20 * GiB, 0);
    r->memory.fw.freed_known = true;
    r->memory.fw.freed_bytes_total = 100 * GiB;
    assert_true(facts(r)->outlier.holds);
    free(r);
}

/* one batch's peak read through the batch's own new sizes: a longer batch makes every activation of a size never
 * seen (512 and 768 MiB before the failing 1 GiB); the earlier steps' largest allocation is what it is 4x of */
static void one_batch_peak_through_new_sizes(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    for (int s = 0; s < 10; s++) {
        ev_add(r, 0.1 * s, "alloc", 256 * MiB);
        ev_add(r, 0.1 * s + 0.01, "free", 256 * MiB);
    }
    ev_add(r, 2.0, "alloc", 512 * MiB);
    ev_add(r, 2.01, "alloc", 768 * MiB);
    ev_add(r, 2.02, "alloc", 1 * GiB);
    ev_add(r, 2.1, "fail", 1 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->outlier.holds);
    assert_true(f->outlier.batch_sizes);
    assert_int_equal(f->outlier.prev_max, 256 * MiB);
    /* the earlier steps' largest a little more than a quarter of the request: no */
    for (int s = 0; s < 10; s++)
        FIXTURE_EV[2 * s].bytes = FIXTURE_EV[2 * s + 1].bytes = 257 * MiB;
    assert_false(facts(r)->outlier.holds);
    free(r);
}

/* one batch's peak read through its whole pass: steps that held at most 2 GiB and gave it back, then a batch whose
 * allocations repeat the earlier sizes (neither size test sees it) and holds 3x that with its request, after 8 or more
 * optimizer steps */
static void one_batch_peak_through_its_pass(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_roles(r, 100 * MiB, 100 * MiB, 200 * MiB, 0, 0, 4 * GiB + 624 * MiB);
    fixture_steps(r, 1790, 0, 0, 0);
    ev_reset(r);
    for (int s = 0; s < 10; s++) {
        ev_add(r, 0.1 * s, "alloc", 1 * GiB);
        ev_add(r, 0.1 * s + 0.01, "alloc", 1 * GiB);
        ev_add(r, 0.1 * s + 0.02, "free", 1 * GiB);
        ev_add(r, 0.1 * s + 0.03, "free", 1 * GiB);
    }
    for (int i = 0; i < 5; i++)
        ev_add(r, 2.0 + 0.01 * i, "alloc", 1 * GiB);
    ev_add(r, 2.1, "fail", 1 * GiB);
    og_set(&r->event.requested_bytes, 1 * GiB);
    og_set(&r->memory.process_tracked_bytes, 5 * GiB);
    const og_facts_t *f = facts(r);
    assert_true(f->outlier.holds);
    assert_true(f->outlier.pass_peak);
    assert_int_equal(f->outlier.held_before, 2 * GiB);
    assert_int_equal(f->outlier.floor, 0);
    /* a little less than 3x what the earlier steps held: no */
    og_set(&r->memory.process_tracked_bytes, 5 * GiB - 1);
    assert_false(facts(r)->outlier.holds);
    og_set(&r->memory.process_tracked_bytes, 5 * GiB);
    /* 1 GiB kept between the steps (the model's state, below the history): 1 GiB of pass before, 4 + 1 - 1 now */
    for (int i = 0; i < 45; i++)
        FIXTURE_EV[i].live += 1 * GiB;
    og_set(&r->memory.process_tracked_bytes, 4 * GiB);
    assert_false(facts(r)->outlier.holds); /* 4 GiB with its request: 3 GiB above the floor, 1.5x the 2 GiB */
    og_set(&r->memory.process_tracked_bytes, 6 * GiB + 1);
    f = facts(r);
    assert_true(f->outlier.holds);
    assert_int_equal(f->outlier.floor, 1 * GiB);
    for (int i = 0; i < 45; i++)
        FIXTURE_EV[i].live -= 1 * GiB;
    og_set(&r->memory.process_tracked_bytes, 5 * GiB);
    /* 7 optimizer steps: too few to call the earlier ones the run's usual */
    r->memory.fw.roles.steps_made = 7;
    assert_false(facts(r)->outlier.holds);
    /* the steps not known: no */
    r->memory.fw.roles.steps_made = 1790;
    r->memory.fw.roles.steps_known = false;
    assert_false(facts(r)->outlier.holds);
    free(r);
}

/* NCCL's memory: which library, how much, whether it failed */
static void nccl_is_communication(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    assert_int_equal(facts(r)->comm_lib, -1);
    og_lib_usage_t *l = &r->memory.by_library[r->memory.nlibs++];
    snprintf(l->library, sizeof l->library, "/opt/nccl/lib/libnccl.so.2");
    l->bytes = 3 * GiB;
    assert_int_equal(facts(r)->comm_lib, 0);
    assert_int_equal(F.comm_bytes, 3 * GiB);
    assert_false(F.comm_failing);
    strcpy(r->event.library, "libnccl.so.2");
    assert_true(facts(r)->comm_failing);
    free(r);
}

/* NCCL's settings in force: NCCL_BUFFSIZE above its 4 MiB default adds the part of NCCL's bytes beyond what the
 * default would hold; at or below the default, unreadable, or without NCCL memory, nothing */
static void nccl_settings_in_force(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    strcpy(r->env[r->nenv++], "NCCL_BUFFSIZE=16777216");
    strcpy(r->env[r->nenv++], "NCCL_MIN_NCHANNELS=16");
    assert_int_equal(facts(r)->comm_buffsize, 16 * MiB);
    assert_int_equal(F.comm_min_channels, 16);
    assert_int_equal(F.comm_setting_excess, 0); /* no NCCL memory */
    og_lib_usage_t *l = &r->memory.by_library[r->memory.nlibs++];
    snprintf(l->library, sizeof l->library, "libnccl.so.2");
    l->bytes = 4 * GiB;
    assert_int_equal(facts(r)->comm_setting_excess, 3 * GiB); /* 4 GiB x (1 - 4/16) */
    strcpy(r->env[0], "NCCL_BUFFSIZE=4194304");
    assert_int_equal(facts(r)->comm_setting_excess, 0);
    strcpy(r->env[0], "NCCL_BUFFSIZE=64MB");
    assert_int_equal(facts(r)->comm_buffsize, 0);
    assert_int_equal(F.comm_setting_excess, 0);
    free(r);
}

/* another GPU for the work: one process seeing 2 GPUs that holds nothing on GPU 1 (idle), or holds there less than
 * the failing GPU's parameters with room for the shortfall (split); a replica holding them all, ranks of a job, or a
 * summary without the failing GPU: neither */
static void spare_gpu_idle_or_split(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    r->visible_devices = 2;
    assert_false(facts(r)->spare.idle); /* no summary: nothing known */
    r->nsummary = 1;
    r->summary[0].index = 0;
    r->summary[0].tracked_bytes = 22 * GiB;
    assert_true(facts(r)->spare.idle);
    assert_int_equal(F.spare.idle_device, 1);
    assert_false(F.spare.split);
    fixture_roles(r, 16 * GiB, 0, 0, 0, 0, 6 * GiB);
    r->nsummary = 2;
    r->summary[1].index = 1;
    r->summary[1].tracked_bytes = 15 * GiB;
    assert_false(facts(r)->spare.idle);
    assert_true(F.spare.split);
    assert_int_equal(F.spare.device, 1);
    assert_int_equal(F.spare.room, 24 * GiB - 15 * GiB - 512 * MiB);
    r->summary[1].tracked_bytes = 17 * GiB; /* more than the failing GPU's parameters: a replica */
    assert_false(facts(r)->spare.split);
    /* a small fraction of the failing GPU's 22 GiB (at most 1/8), one model alone (a device_map filled GPU 0 first):
     * its split, nothing to move whole */
    r->summary[1].tracked_bytes = 2 * GiB;
    fixture_model(r, "Teacher", 6 * GiB, 1, true);
    assert_false(facts(r)->spare.idle);
    assert_true(F.spare.split);
    /* a frozen teacher beside the student: nearly idle, the teacher moves there; not a split */
    fixture_model(r, "Student", 10 * GiB, 1, false);
    assert_true(facts(r)->spare.idle);
    assert_false(F.spare.split);
    assert_int_equal(F.spare.idle_device, 1);
    assert_int_equal(F.spare.idle_held, 2 * GiB);
    assert_int_equal(F.spare.idle_room, 24 * GiB - 2 * GiB - 512 * MiB);
    r->summary[1].tracked_bytes = 3 * GiB; /* more than 1/8: a share of a split model's layers */
    assert_false(facts(r)->spare.idle);
    assert_true(F.spare.split);
    r->summary[1].tracked_bytes = 2 * GiB;
    r->memory.fw.roles.models[0].bytes = 22 * GiB; /* no room there for the frozen model */
    assert_false(facts(r)->spare.idle);
    r->summary[1].tracked_bytes = 15 * GiB;
    r->world_size = 2;
    assert_false(facts(r)->spare.split);
    free(r);
}

/* roles.weights_only: a running model's weights are all the device holds, each other role measured and none (a
 * load or a move no phase frame names); a local's batch, a gradient, an unmeasured role, or no model running: not */
static void weights_only_needs_a_running_model_and_nothing_else(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    fixture_roles(r, 20 * GiB, 0, 0, 0, 0, 0);
    fixture_model(r, "Net", 20 * GiB, 1, false);
    assert_false(facts(r)->roles.weights_only); /* no model running: a tensor moved, a batch */
    fixture_model_held(r, 1, 1, "model");
    assert_true(facts(r)->roles.weights_only);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_held_by_python], 1 * GiB);
    assert_false(facts(r)->roles.weights_only);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_held_by_python], 0);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_gradients], 1 * GiB);
    assert_false(facts(r)->roles.weights_only);
    og_set(&r->memory.fw.roles.bytes[OG_ROLE_gradients], 0);
    og_unset(&r->memory.fw.roles.bytes[OG_ROLE_activations]); /* unknown is not none */
    assert_false(facts(r)->roles.weights_only);
    free(r);
}

/* a new communicator per evaluation: each step is NCCL's own 256 MiB, 20 steps, while the framework's cache
 * warmed up by 8 GiB once in the same window: NCCL holds the steady part (5 GiB), not the whole rise, and
 * the growth is its; a failing call of another library, or NCCL holding under 80% of the steps, is not */
static void nccl_holds_the_steady_part_of_the_growth(void **state)
{
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    ev_reset(r);
    ev_add(r, 0.001, "alloc", 4 * GiB); /* the model */
    ev_add(r, 0.01, "alloc", 256 * MiB);
    ev_add(r, 0.02, "alloc", 8 * GiB); /* the cache warming, once */
    for (int s = 1; s < 20; s++)
        ev_add(r, 0.02 + 0.5 * s, "alloc", 256 * MiB);
    og_set(&r->event.requested_bytes, 256 * MiB);
    og_lib_usage_t *l = &r->memory.by_library[r->memory.nlibs++];
    snprintf(l->library, sizeof l->library, "libnccl.so.2");
    l->bytes = 5 * GiB;
    strcpy(r->event.library, "libnccl.so.2");
    const og_facts_t *f = facts(r);
    assert_true(f->growth.holds);
    assert_true(f->growth.rise > f->comm_bytes);
    assert_true(f->comm_holds_growth);
    l->bytes = 3 * GiB; /* under 80% of 19 steps of 256 MiB */
    assert_false(facts(r)->comm_holds_growth);
    l->bytes = 5 * GiB;
    strcpy(r->event.library, "libtorch_cuda.so");
    assert_false(facts(r)->comm_holds_growth);
    free(r);
}

/* what 4-bit weights free of the parameters, by the dtypes measured: seven eighths of float32, three quarters of 16-bit,
 * half of int8 and float8, nothing of packed 4-bit (uint8); three quarters of all when the dtypes were not measured */
static void quantization_frees_by_dtype(void **state)
{
    (void)state;
    og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
    fixture_roles(r, 16 * GiB, 0, 0, 0, 0, 1 * GiB);
    fixture_dtype(r, "float32", 4 * GiB);
    fixture_dtype(r, "bfloat16", 8 * GiB);
    fixture_dtype(r, "int8", 2 * GiB);
    fixture_dtype(r, "float8_e4m3fn", 1 * GiB);
    fixture_dtype(r, "uint8", 1 * GiB);
    const og_facts_t *f = facts(r);
    assert_int_equal(f->roles.params_8bit, 3 * GiB);
    assert_int_equal(f->roles.params_packed, 1 * GiB);
    assert_true(f->roles.quant_frees == 3.5 * GiB + 6.0 * GiB + 1.5 * GiB);
    r->memory.fw.roles.has_dtypes = false;
    r->memory.fw.roles.ndtypes = 0;
    assert_true(facts(r)->roles.quant_frees == 12.0 * GiB);
    free(r);
}

/* a quantized model (half its parameters or more in 8 bits or fewer) beside a model of its class with none: the
 * reference it is checked against; not a quantized model of another class (a draft), nor two quantized models, nor
 * where the adapter did not read the quantized bytes */
static void a_quantized_model_beside_its_reference(void **state)
{
    (void)state;
    static const struct {
        const char *what;
        const char *quant_cls;
        uint64_t quant;     /* of the 7 GiB model, in 8 bits or fewer; UINT64_MAX not read */
        uint64_t ref_quant; /* of the 15 GiB one */
        uint64_t reference; /* roles.quant_reference */
    } rows[] = {
        { "an int8 export beside its bf16 original", "LlamaForCausalLM", 6 * GiB, 0, 15 * GiB },
        { "half of it int8: still quantized", "LlamaForCausalLM", 3584 * MiB, 0, 15 * GiB },
        { "under half: not quantized", "LlamaForCausalLM", 3 * GiB, 0, 0 },
        { "a quantized model of another class", "Qwen2ForCausalLM", 6 * GiB, 0, 0 },
        { "both quantized", "LlamaForCausalLM", 6 * GiB, 12 * GiB, 0 },
        { "not read (an older adapter)", "LlamaForCausalLM", UINT64_MAX, UINT64_MAX, 0 },
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        og_record_t *r = fixture_pytorch_24g("libtorch_cuda.so");
        fixture_roles(r, 22 * GiB, 0, 0, 0, 0, 0);
        fixture_model(r, "LlamaForCausalLM", 15 * GiB, 1, false);
        fixture_model(r, rows[i].quant_cls, 7 * GiB, 1, false);
        if (rows[i].quant != UINT64_MAX) {
            og_set(&r->memory.fw.roles.models[0].quant, rows[i].ref_quant);
            og_set(&r->memory.fw.roles.models[1].quant, rows[i].quant);
        }
        const og_facts_t *f = facts(r);
        if (f->roles.quant_reference != rows[i].reference)
            fail_msg("%s: quant_reference %llu", rows[i].what, (unsigned long long)f->roles.quant_reference);
        if (rows[i].reference && (f->roles.quant_group != 1 || f->roles.quant_ref_group != 0))
            fail_msg("%s: groups %d and %d", rows[i].what, f->roles.quant_group, f->roles.quant_ref_group);
        free(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_unknown_reservation_is_no_empty_cache),
        cmocka_unit_test(free_under_a_limit_is_at_most_the_device_free),
        cmocka_unit_test(ranks_on_the_machine),
        cmocka_unit_test(estimated_free_counts_the_others),
        cmocka_unit_test(a_request_of_the_device_size_is_not_larger),
        cmocka_unit_test(bursts_are_one_step),
        cmocka_unit_test(pauses_of_the_host_do_not_split_a_burst),
        cmocka_unit_test(a_busy_host_does_not_split_a_pass_into_steps),
        cmocka_unit_test(a_busy_host_keeps_a_leak_s_steps),
        cmocka_unit_test(kept_blocks_a_step_apart_are_steps),
        cmocka_unit_test(growth_needs_six_steps),
        cmocka_unit_test(one_pass_is_not_growth),
        cmocka_unit_test(a_rise_to_the_jobs_own_state_is_not_growth),
        cmocka_unit_test(a_few_mib_beyond_the_state_are_not_growth),
        cmocka_unit_test(a_rise_since_the_last_optimizer_step_is_one_pass),
        cmocka_unit_test(a_late_report_does_not_move_the_last_step),
        cmocka_unit_test(large_steps_in_a_forward_pass_are_not_a_load),
        cmocka_unit_test(a_rise_after_each_optimizer_step_is_growth),
        cmocka_unit_test(flat_after_each_optimizer_step_is_not_growth),
        cmocka_unit_test(run_series_overrules_the_latest_steps),
        cmocka_unit_test(first_steps_are_not_growth),
        cmocka_unit_test(working_set_without_step_hook),
        cmocka_unit_test(before_the_first_step_is_not_growth),
        cmocka_unit_test(run_series_staircase_is_growth),
        cmocka_unit_test(every_allocation_needs_sixteen_steps),
        cmocka_unit_test(loading_and_a_second_copy),
        cmocka_unit_test(a_run_after_training_is_not_a_load),
        cmocka_unit_test(a_busy_host_does_not_split_a_slow_load),
        cmocka_unit_test(the_failures_own_release_does_not_end_a_load),
        cmocka_unit_test(imbalance_needs_one_and_a_half_times),
        cmocka_unit_test(a_cap_binds_when_the_framework_refused_or_the_device_had_room),
        cmocka_unit_test(fits_only_from_a_bounded_peak),
        cmocka_unit_test(device_free_unknown_is_not_zero),
        cmocka_unit_test(other_processes_inferred_only_from_measured_numbers),
        cmocka_unit_test(an_unknown_cap_binds_nothing),
        cmocka_unit_test(released_unknown_releases_nothing),
        cmocka_unit_test(local_rank_beyond_the_visible_gpus),
        cmocka_unit_test(a_retry_needs_two_attempts),
        cmocka_unit_test(the_phase_as_the_adapter_said),
        cmocka_unit_test(roles_for_the_advice),
        cmocka_unit_test(names_copies_models_and_the_statement),
        cmocka_unit_test(models_held_by_name_operation_ddp),
        cmocka_unit_test(one_batch_peak_after_freed_steps),
        cmocka_unit_test(one_batch_peak_through_new_sizes),
        cmocka_unit_test(one_batch_peak_through_its_pass),
        cmocka_unit_test(nccl_is_communication),
        cmocka_unit_test(nccl_holds_the_steady_part_of_the_growth),
        cmocka_unit_test(nccl_settings_in_force),
        cmocka_unit_test(spare_gpu_idle_or_split),
        cmocka_unit_test(weights_only_needs_a_running_model_and_nothing_else),
        cmocka_unit_test(quantization_frees_by_dtype),
        cmocka_unit_test(a_quantized_model_beside_its_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
