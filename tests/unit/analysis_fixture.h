/* The record both analysis unit tests start from (test_diagnose.c, test_remedies.c): one builder, so a new
 * record field gets its neutral value in one place. */
#ifndef OG_ANALYSIS_FIXTURE_H
#define OG_ANALYSIS_FIXTURE_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* A fixture's argument (a table's entry) that stands for "not measured": the record itself has no such
 * value (its counts carry a known flag), fx_opt turns this one into an unknown count. */
#define FX_UNMEASURED UINT64_MAX

/* a count for the record: FX_UNMEASURED stands for "not measured" */
static inline og_opt_u64_t fx_opt(uint64_t v)
{
    og_opt_u64_t o = { 0, false };
    if (v != FX_UNMEASURED)
        og_set(&o, v);
    return o;
}

/* a count the test expects measured, its value */
#define fx_v(x) (assert_true(og_known(x)), (x).v)

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static const og_thresholds_t TH = {
    .frag_share = 0.25,
    .nonfw_share = 0.20,
    .growth_min_share = 0.05,
    .growth_rising_steps = 0.70,
};

/* A PyTorch process on a 24 GiB cc 8.6 card that holds 20 GiB and asks for 2 GiB with 1 GiB free; NVML and the
 * cache not measured.  FW_LIBS is the framework_libs text the test expects. */
static og_record_t *fixture_pytorch_24g(const char *fw_libs)
{
    og_record_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->status = "oom";
    r->framework = OG_FW_PYTORCH;
    snprintf(r->framework_libs, sizeof r->framework_libs, "%s", fw_libs);
    r->visible_devices = 1;
    r->rank = r->local_rank = r->world_size = -1;
    og_set(&r->event.requested_bytes, 2 * GiB);
    strcpy(r->event.library, "libtorch_cuda.so");
    og_set(&r->device.total_bytes, 24 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    og_unset(&r->device.limit_bytes);
    r->device.cc_major = 8;
    r->device.cc_minor = 6;
    og_set(&r->memory.process_tracked_bytes, 20 * GiB);
    og_set(&r->memory.other_processes_bytes, 0); /* NVML listed no other process */
    og_set(&r->event.released_between_attempts_bytes, 0);
    og_unset(&r->memory.process_used_bytes);
    r->memory.framework_bytes = 20 * GiB;
    og_unset(&r->memory.framework_cached_bytes);
    og_unset(&r->memory.non_framework_bytes);
    og_unset(&r->memory.context_bytes_estimate);
    return r;
}

/* ------------------------------------------------------------------ set-ups both files build on */

/* the failing call comes from framework FW, whose one library LIB is also the failing library */
static void fixture_framework(og_record_t *r, enum og_framework fw, const char *lib)
{
    r->framework = fw;
    snprintf(r->framework_libs, sizeof r->framework_libs, "%s", lib);
    snprintf(r->event.library, sizeof r->event.library, "%s", lib);
}

/* no framework seen; the failing call comes from LIB (an application or its own allocator) */
static void fixture_no_framework(og_record_t *r, const char *lib)
{
    r->framework = OG_FW_UNKNOWN;
    r->framework_libs[0] = 0;
    snprintf(r->event.library, sizeof r->event.library, "%s", lib);
}

/* one more process on the device (NAME may be NULL), counted in other_processes_bytes */
static og_other_proc_t *fixture_other(og_record_t *r, int pid, const char *name, uint64_t bytes)
{
    assert_true(r->memory.nother < (int)(sizeof r->memory.other / sizeof *r->memory.other));
    og_other_proc_t *o = &r->memory.other[r->memory.nother++];
    o->pid = pid;
    if (name)
        snprintf(o->name, sizeof o->name, "%s", name);
    o->bytes = bytes;
    og_set(&r->memory.other_processes_bytes, og_or(r->memory.other_processes_bytes, 0) + bytes);
    return o;
}

/* one more framework library in the per-library breakdown */
static void fixture_fw_lib(og_record_t *r, const char *lib, uint64_t bytes, enum og_framework kind)
{
    og_lib_usage_t *l = &r->memory.by_library[r->memory.nlibs++];
    snprintf(l->library, sizeof l->library, "%s", lib);
    l->bytes = bytes;
    l->framework = true;
    l->fw_kind = kind;
}

/* what the framework's allocator says: RESERVED held, ALLOCATED of it in use, the largest free block (0: not
 * reported, as an adapter says it) */
static void fixture_adapter(og_record_t *r, uint64_t reserved, uint64_t allocated, uint64_t largest_free)
{
    r->memory.fw.has = true;
    r->memory.fw.reserved_bytes = reserved;
    r->memory.fw.allocated_bytes = allocated;
    r->memory.fw.largest_free_block_bytes = largest_free;
}

/* the article's fragmentation example: 2.50 GiB requested, 1.20 GiB free, 1.70 GiB reserved but unallocated */
static void fixture_article_fragmentation(og_record_t *r, uint64_t largest_free)
{
    og_set(&r->event.requested_bytes, 2560 * MiB);
    og_set(&r->device.free_bytes, 1229 * MiB);
    fixture_adapter(r, 22528 * MiB, (22528 - 1741) * MiB, largest_free);
}

/* JAX preallocated 18 of the 23 GiB this process holds and PyTorch (libc10_cuda.so) fails for 2 GiB */
static void fixture_second_framework(og_record_t *r)
{
    r->framework = OG_FW_PYTORCH;
    strcpy(r->event.library, "libc10_cuda.so");
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    og_set(&r->memory.process_tracked_bytes, 23 * GiB);
    r->memory.framework_bytes = 23 * GiB;
    r->memory.nlibs = 0;
    fixture_fw_lib(r, "xla_extension.so", 18 * GiB, OG_FW_JAX);
    fixture_fw_lib(r, "libc10_cuda.so", 5 * GiB, OG_FW_PYTORCH);
}

/* rank 0 of 8 asks for 2 GiB on a full GPU 0 where the 7 other ranks (visible, same job) hold 512 MiB each */
static void fixture_peer_ranks(og_record_t *r)
{
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 0);
    r->world_size = 8;
    r->rank = r->local_rank = 0;
    r->visible_devices = 8; /* a GPU for each rank: they land on GPU 0 for want of set_device */
    for (int i = 0; i < 7; i++) {
        og_other_proc_t *o = fixture_other(r, 100 + i, NULL, 512 * MiB);
        o->same_job = o->visible = true;
        o->rank = i + 1;
    }
}

/* a pre-fork server's worker asks for 4 GiB with 1 GiB free while three other workers of its parent (same
 * command, no launcher variables; visible, same job) hold 5 GiB each: a copy of the model per worker */
static void fixture_prefork_workers(og_record_t *r)
{
    og_set(&r->event.requested_bytes, 4 * GiB);
    og_set(&r->device.free_bytes, 1 * GiB);
    for (int i = 0; i < 3; i++) {
        og_other_proc_t *o = fixture_other(r, 200 + i, "python3", 5 * GiB);
        o->visible = o->same_job = o->sibling = true;
    }
}

/* one process over 4 visible GPUs: 22 GiB on GPU 0, 7 GiB on each other, 2 GiB more wanted on GPU 0 */
static void fixture_imbalance(og_record_t *r)
{
    og_set(&r->event.requested_bytes, 2 * GiB);
    og_set(&r->device.free_bytes, 512 * MiB);
    r->visible_devices = 4;
    r->nsummary = 4;
    for (int i = 0; i < 4; i++) {
        r->summary[i].index = i;
        r->summary[i].tracked_bytes = i == 0 ? 22 * GiB : 7 * GiB;
    }
}

/* no framework: the application's own stream-ordered pool keeps 12 GiB idle and its 10 GiB request fails */
static void fixture_app_pool(og_record_t *r)
{
    fixture_no_framework(r, "solver");
    r->memory.nlibs = 0;
    r->memory.framework_bytes = 0;
    og_set(&r->event.requested_bytes, 10 * GiB);
    og_set(&r->device.free_bytes, 5 * GiB);
    r->memory.pool_reserved = 12 * GiB;
    r->memory.pool_used = 0;
    r->memory.pool_owner_fw = 2;
    og_set(&r->memory.framework_cached_bytes, 12 * GiB); /* capture's "pool" source: the app's, not a framework's */
    r->memory.framework_cached_source = OG_CACHE_POOL;
}

/* a 400 MiB OOMGUARD_LIMIT that a 512 MiB context alone exceeds: 20 MiB refused with 20 GiB free */
static void fixture_limit_by_context(og_record_t *r)
{
    og_set(&r->memory.process_tracked_bytes, 0);
    r->memory.framework_bytes = 0;
    r->memory.by_library[0].bytes = 0;
    og_set(&r->device.limit_bytes, 400 * MiB);
    og_set(&r->device.limit_usage_bytes, 512 * MiB);
    og_set(&r->device.free_bytes, 20 * GiB);
    og_set(&r->event.requested_bytes, 20 * MiB);
    r->event.caused_by_limit = true;
}

/* ------------------------------------------------------------------ event history */

/* allocations and frees on the device, `live` after each (one test at a time: a static buffer) */
static struct og_hist_ev FIXTURE_EV[4096];
static void ev_reset(og_record_t *r)
{
    r->history.events = FIXTURE_EV;
    r->history.nevents = 0;
}
static uint64_t ev_live(const og_record_t *r)
{
    return r->history.nevents ? FIXTURE_EV[r->history.nevents - 1].live : 0;
}
static void ev_add(og_record_t *r, double t, const char *op, uint64_t bytes)
{
    assert_true(r->history.nevents < (int)(sizeof FIXTURE_EV / sizeof *FIXTURE_EV));
    uint64_t live = ev_live(r);
    enum og_hist_op o = strcmp(op, "alloc") == 0  ? OG_OP_ALLOC
                        : strcmp(op, "free") == 0 ? OG_OP_FREE
                        : strcmp(op, "fail") == 0 ? OG_OP_FAIL
                                                  : OG_OP_OTHER;
    live = o == OG_OP_ALLOC ? live + bytes : o == OG_OP_FREE ? live - bytes : live;
    FIXTURE_EV[r->history.nevents++] = (struct og_hist_ev){ .t_rel = t, .op = o, .bytes = bytes, .live = live };
}

/* a training loop: each step allocates `act` (the size that will fail), keeps `keep`, frees act */
static void leak_loop(og_record_t *r, int steps, double dt, uint64_t act, uint64_t keep)
{
    double t = 0.01;
    for (int s = 0; s < steps; s++, t += dt) {
        ev_add(r, t, "alloc", act);
        if (keep)
            ev_add(r, t + dt / 4, "alloc", keep);
        ev_add(r, t + dt / 2, "free", act);
    }
    og_set(&r->event.requested_bytes, act);
}

/* ------------------------------------------------------------------ texts over edge numbers */

/* FIXTURE_EDGE_CASES records: every request x free x cache below, each in FIXTURE_EDGE_VARIANTS variants
 * (plain, a cuDNN call, another process, the limit, no framework) */
/* the requests, and one more case past them: a request not given (an adapter's failure without its size) */
static const uint64_t FIXTURE_EDGE_REQ[] = { 0, 1, 1024, 2 * GiB, 24 * GiB, 30 * GiB, UINT64_MAX /* SIZE_MAX */ };
static const uint64_t FIXTURE_EDGE_FREE[] = { 0, 1, 1 * GiB, FX_UNMEASURED };
static const uint64_t FIXTURE_EDGE_CACHE[] = { 0, 1, 4 * GiB, 40 * GiB, FX_UNMEASURED };
#define FIXTURE_N(a)          (sizeof(a) / sizeof *(a))
#define FIXTURE_EDGE_VARIANTS 5
#define FIXTURE_EDGE_CASES                                                                              \
    ((FIXTURE_N(FIXTURE_EDGE_REQ) + 1) * FIXTURE_N(FIXTURE_EDGE_FREE) * FIXTURE_N(FIXTURE_EDGE_CACHE) * \
     FIXTURE_EDGE_VARIANTS)

/* edge case I (0 <= I < FIXTURE_EDGE_CASES) applied to R; its variant is I % FIXTURE_EDGE_VARIANTS */
static void fixture_edge_case(og_record_t *r, size_t i)
{
    int variant = (int)(i % FIXTURE_EDGE_VARIANTS);
    i /= FIXTURE_EDGE_VARIANTS;
    uint64_t cache = FIXTURE_EDGE_CACHE[i % FIXTURE_N(FIXTURE_EDGE_CACHE)];
    i /= FIXTURE_N(FIXTURE_EDGE_CACHE);
    r->device.free_bytes = fx_opt(FIXTURE_EDGE_FREE[i % FIXTURE_N(FIXTURE_EDGE_FREE)]);
    size_t req = i / FIXTURE_N(FIXTURE_EDGE_FREE);
    if (req < FIXTURE_N(FIXTURE_EDGE_REQ))
        og_set(&r->event.requested_bytes, FIXTURE_EDGE_REQ[req]);
    else
        og_unset(&r->event.requested_bytes);
    r->memory.framework_cached_bytes = fx_opt(cache);
    r->memory.framework_cached_source = cache == FX_UNMEASURED ? OG_CACHE_NONE : OG_CACHE_POOL;
    if (variant == 1)
        strcpy(r->event.library, "libcudnn.so.9");
    if (variant == 2)
        fixture_other(r, 5, NULL, 6 * GiB);
    if (variant == 3) {
        r->event.caused_by_limit = true;
        og_set(&r->device.limit_bytes, 16 * GiB);
        og_set(&r->device.limit_usage_bytes, 20 * GiB + 300 * MiB);
    }
    if (variant == 4)
        fixture_no_framework(r, "app");
}

/* ------------------------------------------------------------------ the text checker */

/* "1.50 GiB" -> bytes; -1 when P does not start with a size */
static double fixture_parse_size(const char *p)
{
    char *end;
    double v = strtod(p, &end);
    if (end == p)
        return -1;
    while (*end == ' ')
        end++;
    if (!strncmp(end, "TiB", 3))
        return v * 1099511627776.0;
    if (!strncmp(end, "GiB", 3))
        return v * 1073741824.0;
    if (!strncmp(end, "MiB", 3))
        return v * 1048576.0;
    if (!strncmp(end, "KiB", 3))
        return v * 1024.0;
    if (!strncmp(end, "B", 1))
        return v;
    return -1;
}

/* a sentence the user reads: no "n/a", no "1 processes", no "A of the B" with A > B */
static void og_test_check_text(const char *t)
{
    if (strstr(t, "n/a"))
        fail_msg("n/a in: %s", t);
    static const char *const bad[] = { "1 processes", "1 ranks", "1 GPUs", "1 blocks", "1 steps", "1 others hold" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *p = strstr(t, bad[i]);
        if (p && (p == t || !isdigit((unsigned char)p[-1])))
            fail_msg("ungrammatical '%s' in: %s", bad[i], t);
    }
    for (const char *p = strstr(t, " of the "); p; p = strstr(p + 1, " of the ")) {
        const char *q = p;
        while (q > t && q[-1] != ' ')
            q--;
        const char *num = q;
        if (q > t + 1) { /* "1.50 GiB of the": the number is a word before */
            const char *w = q - 2;
            while (w > t && w[-1] != ' ')
                w--;
            num = w;
        }
        double a = fixture_parse_size(num), b = fixture_parse_size(p + 8);
        if (a >= 0 && b >= 0 && a > b * 1.0001)
            fail_msg("impossible statement in: %s", t);
    }
}

/* ------------------------------------------------------------------ roles and phase (the Python adapter) */

/* memory.framework.roles of a scan that finished: each role's bytes (0 a measured nothing), the adapter's
 * allocated = reserved = their sum */
static og_roles_t *fixture_roles(og_record_t *r, uint64_t params, uint64_t grads, uint64_t opt, uint64_t pools,
                                 uint64_t held, uint64_t act)
{
    uint64_t sum = params + grads + opt + pools + held + act;
    fixture_adapter(r, sum, sum, 0);
    og_roles_t *ro = &r->memory.fw.roles;
    memset(ro, 0, sizeof *ro);
    ro->has = ro->complete = true;
    ro->allocated_bytes = fx_opt(sum);
    og_unset(&ro->last_step_age_us);
    og_set(&ro->bytes[OG_ROLE_buffers], 0);
    ro->bytes[OG_ROLE_parameters] = fx_opt(params);
    ro->bytes[OG_ROLE_gradients] = fx_opt(grads);
    ro->bytes[OG_ROLE_optimizer_state] = fx_opt(opt);
    ro->bytes[OG_ROLE_graph_pools] = fx_opt(pools);
    ro->bytes[OG_ROLE_held_by_python] = fx_opt(held);
    ro->bytes[OG_ROLE_activations] = fx_opt(act);
    return ro;
}

/* a holder of held_by_python: NAME of KIND, WHERE ("global in train.py", "local in step (train.py:40)") */
static void fixture_holder(og_record_t *r, const char *name, const char *kind, const char *where, uint64_t bytes)
{
    og_roles_t *ro = &r->memory.fw.roles;
    og_role_holder_t *h = &ro->holders[ro->nholders++];
    snprintf(h->name, sizeof h->name, "%s", name);
    snprintf(h->kind, sizeof h->kind, "%s", kind);
    snprintf(h->where, sizeof h->where, "%s", where);
    snprintf(h->label, sizeof h->label, "%s (%s, %s)", name, kind, where);
    h->bytes = bytes;
    h->tensors = 1;
}

/* a growth of 9 steps of 500 MiB beside another process's 3 GiB, 256 MiB free: HELD, a global dict keeps the rise
 * (roles.kept_across); else the same bytes are activations */
static void fixture_growth_beside_other(og_record_t *r, bool held)
{
    ev_reset(r);
    leak_loop(r, 9, 0.1, 512 * MiB, 500 * MiB);
    fixture_roles(r, 2 * GiB, 0, 0, 0, held ? 4500 * MiB : 0, held ? 512 * MiB : 5012 * MiB);
    if (held)
        fixture_holder(r, "SESSIONS", "dict", "global in app.py", 4500 * MiB);
    fixture_other(r, 4242, "python3", 3 * GiB)->visible = true;
    og_set(&r->device.free_bytes, 256 * MiB);
}

/* the last holder's purpose (what its name says it keeps) and the role its blocks copy ("" none) */
static void fixture_holder_says(og_record_t *r, const char *purpose, const char *copy_of)
{
    og_role_holder_t *h = &r->memory.fw.roles.holders[r->memory.fw.roles.nholders - 1];
    snprintf(h->purpose, sizeof h->purpose, "%s", purpose);
    snprintf(h->copy_of, sizeof h->copy_of, "%s", copy_of);
}

/* COUNT models of class CLS, BYTES of parameters each (roles.models) */
static void fixture_model(og_record_t *r, const char *cls, uint64_t bytes, int count, bool frozen)
{
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->models[ro->nmodels].cls, sizeof ro->models[0].cls, "%s", cls);
    ro->models[ro->nmodels].bytes = bytes;
    ro->models[ro->nmodels].tensors = 10;
    ro->models[ro->nmodels].count = count;
    ro->models[ro->nmodels].trained = -1; /* not said: set it where a test reads it */
    ro->models[ro->nmodels].stepped = -1;
    ro->models[ro->nmodels].training = -1;
    ro->models[ro->nmodels++].frozen = frozen;
}

/* the last model group: NAMED of them held by a name of the running code (NAMES), RUNNING of them running */
static void fixture_model_held(og_record_t *r, int named, int running, const char *names)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->models[ro->nmodels - 1].named = named;
    ro->models[ro->nmodels - 1].running = running;
    snprintf(ro->models[ro->nmodels - 1].names, sizeof ro->models[0].names, "%s", names);
}

/* model group I: NAMED of them held by the running code's names NAMES, RUNNING of them running */
static void fixture_model_held_n(og_record_t *r, int i, int named, int running, const char *names)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->models[i].named = named;
    ro->models[i].running = running;
    snprintf(ro->models[i].names, sizeof ro->models[0].names, "%s", names);
}

/* the last model group's purpose, what its names or class say (roles.models[].purpose; "" none) */
static void fixture_model_says(og_record_t *r, const char *purpose)
{
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->models[ro->nmodels - 1].purpose, sizeof ro->models[0].purpose, "%s", purpose);
}

/* roles.operation: the failing operation NAME (common/operations.def) decided at FUNCTION of /w/train.py */
static void fixture_operation(og_record_t *r, const char *name, const char *function)
{
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->operation, sizeof ro->operation, "%s", name);
    snprintf(ro->op_frame.file, sizeof ro->op_frame.file, "/w/train.py");
    snprintf(ro->op_frame.function, sizeof ro->op_frame.function, "%s", function);
    ro->op_frame.line = 108;
}

/* the failing statement (roles.statement): TARGET ("" none) and what it builds (PURPOSE, "" none) */
static void fixture_statement(og_record_t *r, const char *target, const char *purpose)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_statement = true;
    snprintf(ro->stmt.file, sizeof ro->stmt.file, "/w/train.py");
    snprintf(ro->stmt.function, sizeof ro->stmt.function, "main");
    ro->stmt.line = 7;
    snprintf(ro->stmt_target, sizeof ro->stmt_target, "%s", target);
    snprintf(ro->stmt_purpose, sizeof ro->stmt_purpose, "%s", purpose);
}

static void fixture_optimizer(og_record_t *r, const char *cls, uint64_t bytes)
{
    og_roles_t *ro = &r->memory.fw.roles;
    snprintf(ro->optimizers[ro->noptimizers].cls, sizeof ro->optimizers[0].cls, "%s", cls);
    ro->optimizers[ro->noptimizers++].bytes = bytes;
}

/* roles.parameters_by_dtype measured, with BYTES of the parameters of DTYPE ("float32", "bfloat16") */
static void fixture_dtype(og_record_t *r, const char *dtype, uint64_t bytes)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_dtypes = true;
    snprintf(ro->dtypes[ro->ndtypes].dtype, sizeof ro->dtypes[0].dtype, "%s", dtype);
    ro->dtypes[ro->ndtypes].bytes = bytes;
    ro->dtypes[ro->ndtypes++].tensors = 10;
}

/* roles.accumulating: main (train.py:12) sums OPERAND into TARGET with their graphs alive */
static void fixture_accumulating(og_record_t *r, const char *target, const char *operand)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->has_accum = true;
    snprintf(ro->accum.file, sizeof ro->accum.file, "/w/train.py");
    snprintf(ro->accum.function, sizeof ro->accum.function, "main");
    ro->accum.line = 12;
    snprintf(ro->accum_target, sizeof ro->accum_target, "%s", target);
    snprintf(ro->accum_operand, sizeof ro->accum_operand, "%s", operand);
}

/* a setting of the program's code (roles.padding_to_max_length, roles.extra_outputs) at train.py:105 in FUNCTION */
static void fixture_setting(og_record_t *r, int which, const char *function, const char *key)
{
    og_code_setting_t *cs = &r->memory.fw.roles.settings[which];
    cs->has = true;
    snprintf(cs->at.file, sizeof cs->at.file, "/w/train.py");
    snprintf(cs->at.function, sizeof cs->at.function, "%s", function);
    cs->at.line = 105;
    snprintf(cs->key, sizeof cs->key, "%s", key);
}

/* the adapter's allocated bytes right after each optimizer step (roles.allocated_after_steps) */
static void fixture_steps(og_record_t *r, uint64_t made, int n, uint64_t first, uint64_t per_step)
{
    og_roles_t *ro = &r->memory.fw.roles;
    ro->nsteps = n;
    ro->steps_made = made;
    ro->steps_known = true;
    ro->device_steps = made; /* no other optimizer stepped on the device */
    ro->device_steps_known = true;
    for (int i = 0; i < n; i++)
        ro->step_alloc[i] = first + per_step * (uint64_t)i;
}

/* an exporter folding every fp16 weight of a 13.5 GiB model into a new tensor on the GPU, 8.26 GiB of the copy made
 * so far (roles.activations_copy_of parameters, all the activations), failing a 112 MiB request beside 209 MiB cached
 * in 4 MiB splinters, 42 MiB free, autograd off: a copy whose rest the cache and the free memory cannot hold */
static void fixture_weights_copy(og_record_t *r)
{
    og_set(&r->event.requested_bytes, 112 * MiB);
    og_set(&r->device.free_bytes, 42 * MiB);
    fixture_roles(r, 13824 * MiB, 0, 0, 0, 0, 8458 * MiB);
    r->memory.fw.reserved_bytes += 209 * MiB;
    r->memory.fw.largest_free_block_bytes = 4 * MiB;
    r->memory.fw.grad_enabled = -1;
    snprintf(r->memory.fw.roles.act_copy_of, sizeof r->memory.fw.roles.act_copy_of, "parameters");
    r->memory.fw.roles.act_copy_bytes = 8458 * MiB;
}

/* event.phase and the frame that decided it (FILE NULL: no frame) */
static void fixture_phase(og_record_t *r, const char *phase, const char *file, const char *function)
{
    r->memory.fw.has = true;
    snprintf(r->memory.fw.phase, sizeof r->memory.fw.phase, "%s", phase);
    r->memory.fw.has_phase_frame = file != NULL;
    if (file) {
        snprintf(r->memory.fw.phase_frame.file, sizeof r->memory.fw.phase_frame.file, "%s", file);
        snprintf(r->memory.fw.phase_frame.function, sizeof r->memory.fw.phase_frame.function, "%s", function);
        r->memory.fw.phase_frame.line = 42;
    }
}

#endif
