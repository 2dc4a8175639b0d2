/* The framework's own view of its memory, handed in by an adapter (adapters/python):
 *   oomguard_framework_report()  numbers at a driver failure (PyTorch's out-of-memory observer);
 *   oomguard_framework_oom()     the framework failed a request: rewrite the driver failure's dump,
 *                                or write a dump of its own for a failure inside the framework's
 *                                allocator (memory fraction, XLA arena, CuPy pool limit);
 *   oomguard_framework_set_query()  a query the shim calls at a driver failure when that cannot
 *                                deadlock (include/oomguard.h states the rules, og_query_at_failure
 *                                below enforces them).
 * Stored as the latest report; dumps written afterwards use it. */
#include "og.h"
#include "record.h"
#include "strbuf.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t fw_lock = PTHREAD_MUTEX_INITIALIZER;
static og_framework_view_t fw_view;

/* does the caller's struct reach field f? (adapters built against an older header pass less) */
#define HAS(s, f) ((s)->struct_size >= offsetof(oomguard_framework_stats_t, f) + sizeof((s)->f))

/* cut at n - 1 bytes, on a whole character: these are labels, a shortened one is still useful */
static void copy_str(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < n; i++)
        dst[i] = src[i];
    if (src && src[i])
        i = og_utf8_cut(dst, i);
    dst[i] = 0;
}

/* A field of the adapter's roles where "-" means none: left as it is then. */
static void copy_field(char *dst, size_t n, const char *field)
{
    if (strcmp(field, "-") != 0)
        copy_str(dst, n, field);
}

/* "N,N,..." -> at most max numbers (the list ends at anything that is not a digit or a comma); how many were read */
static int u64_list(const char *p, uint64_t *out, int max)
{
    int n = 0;
    while (*p >= '0' && *p <= '9' && n < max) {
        char *e;
        out[n++] = strtoull(p, &e, 10);
        if (*e != ',')
            break;
        p = e + 1;
    }
    return n;
}

/* "file\tline\tfunction[\tbytes\tblocks]\n"... -> frames; malformed lines are skipped. */
static int parse_lines(const char *s, og_py_frame_t *out, int max, bool sized)
{
    int n = 0;
    while (s && *s && n < max) {
        const char *end = strchr(s, '\n');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), s);
        s = end ? end + 1 : s + len;
        char *save = NULL, *file = strtok_r(line, "\t", &save), *ln = strtok_r(NULL, "\t", &save);
        char *fn = strtok_r(NULL, "\t", &save);
        if (!file || !ln || !fn)
            continue;
        og_py_frame_t *f = &out[n];
        memset(f, 0, sizeof *f);
        copy_str(f->file, sizeof f->file, file);
        copy_str(f->function, sizeof f->function, fn);
        f->line = atoi(ln);
        if (sized) {
            char *b = strtok_r(NULL, "\t", &save), *k = strtok_r(NULL, "\t", &save);
            if (!b || !k)
                continue;
            f->bytes = strtoull(b, NULL, 10);
            f->blocks = strtoull(k, NULL, 10);
        }
        n++;
    }
    return n;
}

/* Splits one line at tabs in place: up to max fields; returns how many. */
static int split_tabs(char *line, char **f, int max)
{
    int n = 0;
    while (n < max) {
        f[n++] = line;
        char *t = strchr(line, '\t');
        if (!t)
            break;
        *t = 0;
        line = t + 1;
    }
    return n;
}

/* a byte count of the roles' lines: "-" (or anything not a number) is unknown */
static og_opt_u64_t role_u64(const char *s)
{
    og_opt_u64_t r = { 0, false };
    char *end = NULL;
    if (!s || *s < '0' || *s > '9')
        return r;
    unsigned long long v = strtoull(s, &end, 10);
    if (end && *end == 0 && v != UINT64_MAX) /* strtoull's overflow: not a count */
        og_set(&r, v);
    return r;
}

static const char *const role_keys[OG_NROLES] = {
#define OG_ROLE(key, label, quiet) #key,
#include "roles.def"
#undef OG_ROLE
};

/* The adapter's roles (oomguard_framework_stats_t.roles): "role\tNAME\tBYTES\tTENSORS",
 * "optimizer\tCLASS\tBYTES\tTENSORS[\tPARAMETER_BYTES]", "dtype\tNAME\tBYTES\tTENSORS", "holder\tBYTES\tTENSORS\tLABEL\tNAME\tKIND\tWHERE\tFILE\tLINE\tFUNCTION[\tPURPOSE\tCOPY_OF[\tGRAPHS[\tRESTORED_BYTES\tRESTORED_FILE\tRESTORED_LINE\tRESTORED_FUNCTION[\tRECORDS]]]]",
 * "statement\tFILE\tLINE\tFUNCTION\tTARGET\tPURPOSE\tNAMES[\tINTS]" ('-': none),
 * "accumulating\tFILE\tLINE\tFUNCTION\tTARGET\tOPERAND", "setting\tFACT\tFILE\tLINE\tFUNCTION\tKEY"
 * (FACT a name of common/code_settings.def),
 * "steps\tMADE\tALLOCATED,ALLOCATED,...[\tON_DEVICE]" (after each of an optimizer's latest steps, oldest first;
 * ON_DEVICE the steps every optimizer made on the device, when every one was watched),
 * "meta\tKEY\tVALUE" lines; unknown lines and roles are skipped.  A role not given stays unknown. */
static void parse_roles(const char *s, og_roles_t *r)
{
    memset(r, 0, sizeof *r); /* every role's bytes, allocated_bytes, last_step_age_us: unknown */
    r->has = true;
    while (s && *s) {
        const char *end = strchr(s, '\n');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char line[2048], *f[21];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), s);
        s = end ? end + 1 : s + len;
        int n = split_tabs(line, f, 21); /* the longest record: holder */
        if (!strcmp(f[0], "role") && n >= 4) {
            for (int i = 0; i < OG_NROLES; i++)
                if (!strcmp(f[1], role_keys[i])) {
                    r->bytes[i] = role_u64(f[2]);
                    r->tensors[i] = strtoull(f[3], NULL, 10);
                }
        } else if (!strcmp(f[0], "optimizer") && n >= 4 &&
                   r->noptimizers < (int)(sizeof r->optimizers / sizeof r->optimizers[0])) {
            copy_str(r->optimizers[r->noptimizers].cls, sizeof r->optimizers[0].cls, f[1]);
            r->optimizers[r->noptimizers].bytes = strtoull(f[2], NULL, 10);
            r->optimizers[r->noptimizers].tensors = strtoull(f[3], NULL, 10);
            if (n >= 5)
                r->optimizers[r->noptimizers].param_bytes = role_u64(f[4]);
            else
                og_unset(&r->optimizers[r->noptimizers].param_bytes);
            if (n >= 6)
                r->optimizers[r->noptimizers].shaped_bytes = role_u64(f[5]);
            else
                og_unset(&r->optimizers[r->noptimizers].shaped_bytes);
            r->noptimizers++;
        } else if (!strcmp(f[0], "dtype") && n >= 4 && r->ndtypes < (int)(sizeof r->dtypes / sizeof r->dtypes[0])) {
            copy_str(r->dtypes[r->ndtypes].dtype, sizeof r->dtypes[0].dtype, f[1]);
            r->dtypes[r->ndtypes].bytes = strtoull(f[2], NULL, 10);
            r->dtypes[r->ndtypes].tensors = strtoull(f[3], NULL, 10);
            r->ndtypes++;
        } else if (!strcmp(f[0], "holder") && n >= 10 &&
                   r->nholders < (int)(sizeof r->holders / sizeof r->holders[0])) {
            og_role_holder_t *h = &r->holders[r->nholders++];
            h->bytes = strtoull(f[1], NULL, 10);
            h->tensors = strtoull(f[2], NULL, 10);
            copy_str(h->label, sizeof h->label, f[3]);
            copy_str(h->name, sizeof h->name, f[4]);
            copy_str(h->kind, sizeof h->kind, f[5]);
            copy_str(h->where, sizeof h->where, f[6]);
            h->has_site = strcmp(f[7], "-") != 0 && f[7][0];
            if (h->has_site) {
                copy_str(h->site.file, sizeof h->site.file, f[7]);
                h->site.line = atoi(f[8]);
                copy_str(h->site.function, sizeof h->site.function, f[9]);
            }
            if (n >= 11)
                copy_field(h->purpose, sizeof h->purpose, f[10]);
            if (n >= 12)
                copy_field(h->copy_of, sizeof h->copy_of, f[11]);
            h->graphs = n >= 13 ? atoi(f[12]) : -1;
            og_unset(&h->restored);
            if (n >= 14 && f[13][0] >= '0' && f[13][0] <= '9')
                og_set(&h->restored, strtoull(f[13], NULL, 10));
            h->has_restored_site = n >= 17 && strcmp(f[14], "-") != 0 && f[14][0];
            if (h->has_restored_site) {
                copy_str(h->restored_site.file, sizeof h->restored_site.file, f[14]);
                h->restored_site.line = atoi(f[15]);
                copy_str(h->restored_site.function, sizeof h->restored_site.function, f[16]);
            }
            h->records = n >= 18 ? strtoll(f[17], NULL, 10) : -1;
            og_unset(&h->float64);
            if (n >= 19 && f[18][0] >= '0' && f[18][0] <= '9')
                og_set(&h->float64, strtoull(f[18], NULL, 10));
            og_unset(&h->bound_bytes);
            og_unset(&h->bound_records);
            if (n >= 20 && f[19][0] >= '0' && f[19][0] <= '9')
                og_set(&h->bound_bytes, strtoull(f[19], NULL, 10));
            if (n >= 21 && f[20][0] >= '0' && f[20][0] <= '9')
                og_set(&h->bound_records, strtoull(f[20], NULL, 10));
        } else if (!strcmp(f[0], "model") && n >= 6 && r->nmodels < (int)(sizeof r->models / sizeof r->models[0])) {
            copy_str(r->models[r->nmodels].cls, sizeof r->models[0].cls, f[1]);
            r->models[r->nmodels].bytes = strtoull(f[2], NULL, 10);
            r->models[r->nmodels].tensors = strtoull(f[3], NULL, 10);
            r->models[r->nmodels].count = atoi(f[4]);
            r->models[r->nmodels].frozen = atoi(f[5]) != 0;
            r->models[r->nmodels].named = n >= 9 ? atoi(f[6]) : -1;
            r->models[r->nmodels].running = n >= 9 ? atoi(f[7]) : -1;
            if (n >= 9)
                copy_field(r->models[r->nmodels].names, sizeof r->models[0].names, f[8]);
            if (n >= 10)
                copy_field(r->models[r->nmodels].purpose, sizeof r->models[0].purpose, f[9]);
            r->models[r->nmodels].trained = n >= 11 && f[10][0] >= '0' && f[10][0] <= '9' ? atoi(f[10]) : -1;
            r->models[r->nmodels].stepped = n >= 12 && f[11][0] >= '0' && f[11][0] <= '9' ? atoi(f[11]) : -1;
            r->models[r->nmodels].away = n >= 13 ? strtoull(f[12], NULL, 10) : 0;
            r->models[r->nmodels].training = n >= 14 && f[13][0] >= '0' && f[13][0] <= '9' ? atoi(f[13]) : -1;
            og_unset(&r->models[r->nmodels].fp32);
            if (n >= 15 && f[14][0] >= '0' && f[14][0] <= '9')
                og_set(&r->models[r->nmodels].fp32, strtoull(f[14], NULL, 10));
            og_unset(&r->models[r->nmodels].quant);
            if (n >= 16 && f[15][0] >= '0' && f[15][0] <= '9')
                og_set(&r->models[r->nmodels].quant, strtoull(f[15], NULL, 10));
            r->nmodels++;
        } else if (!strcmp(f[0], "operation") && n >= 5 && !r->operation[0]) {
            copy_field(r->operation, sizeof r->operation, f[1]);
            copy_str(r->op_frame.file, sizeof r->op_frame.file, f[2]);
            r->op_frame.line = atoi(f[3]);
            copy_str(r->op_frame.function, sizeof r->op_frame.function, f[4]);
            if (n >= 6)
                copy_field(r->op_argument, sizeof r->op_argument, f[5]);
        } else if (!strcmp(f[0], "layer") && n >= 4 && !r->layer_count) {
            int i = atoi(f[2]), c = atoi(f[3]);
            if (i >= 0 && c > i) {
                r->layer_index = i, r->layer_count = c;
                r->layer_alike = n < 5 || !strcmp(f[4], "-") ? 0 : atoi(f[4]) > 0 ? 1 : -1;
                copy_field(r->layer_run, sizeof r->layer_run, f[1]);
            }
        } else if (!strcmp(f[0], "generation_input") && n >= 3 && !r->gen_dims) {
            r->gen_dims = u64_list(f[2], r->gen_shape, 6);
            if (r->gen_dims)
                copy_field(r->gen_input, sizeof r->gen_input, f[1]);
        } else if (!strcmp(f[0], "ddp") && n >= 3) {
            r->ddp_wrappers = atoi(f[1]) > 0 ? atoi(f[1]) : 0;
            r->ddp_bucket_bytes = r->ddp_wrappers ? strtoull(f[2], NULL, 10) : 0;
        } else if (!strcmp(f[0], "statement") && n >= 7 && !r->has_statement) {
            r->has_statement = true;
            copy_str(r->stmt.file, sizeof r->stmt.file, f[1]);
            r->stmt.line = atoi(f[2]);
            copy_str(r->stmt.function, sizeof r->stmt.function, f[3]);
            copy_field(r->stmt_target, sizeof r->stmt_target, f[4]);
            copy_field(r->stmt_purpose, sizeof r->stmt_purpose, f[5]);
            copy_field(r->stmt_names, sizeof r->stmt_names, f[6]);
            if (n >= 8)
                copy_field(r->stmt_ints, sizeof r->stmt_ints, f[7]);
        } else if (!strcmp(f[0], "child") && n >= 3 &&
                   r->nchildren < (int)(sizeof r->children / sizeof r->children[0])) {
            r->children[r->nchildren].pid = atoi(f[1]);
            if (strcmp(f[2], "-") != 0) /* a name the program chose: shown as a credential's shape allows */
                og_redact_text(f[2], r->children[r->nchildren].name, sizeof r->children[0].name);
            r->nchildren += r->children[r->nchildren].pid > 0;
        } else if (!strcmp(f[0], "steps") && n >= 3) {
            r->steps_made = strtoull(f[1], NULL, 10);
            r->steps_known = true;
            r->nsteps = u64_list(f[2], r->step_alloc, OG_STEP_SERIES);
            if (n >= 4) {
                r->device_steps = strtoull(f[3], NULL, 10);
                r->device_steps_known = true;
            }
        } else if (!strcmp(f[0], "steps_run") && n >= 3) {
            r->step_run_every = strtoull(f[1], NULL, 10);
            r->nstep_run = u64_list(f[2], r->step_run, OG_STEP_SERIES);
            if (!r->step_run_every)
                r->nstep_run = 0;
        } else if (!strcmp(f[0], "accumulating") && n >= 6 && !r->has_accum) {
            r->has_accum = true;
            copy_str(r->accum.file, sizeof r->accum.file, f[1]);
            r->accum.line = atoi(f[2]);
            copy_str(r->accum.function, sizeof r->accum.function, f[3]);
            copy_field(r->accum_target, sizeof r->accum_target, f[4]);
            copy_field(r->accum_operand, sizeof r->accum_operand, f[5]);
        } else if (!strcmp(f[0], "setting") && n >= 6) {
            for (int i = 0; i < OG_NCODE_SETTINGS; i++) {
                og_code_setting_t *cs = &r->settings[i];
                if (strcmp(f[1], og_code_setting_name(i)) != 0 || cs->has)
                    continue;
                cs->has = true;
                copy_str(cs->at.file, sizeof cs->at.file, f[2]);
                cs->at.line = atoi(f[3]);
                copy_str(cs->at.function, sizeof cs->at.function, f[4]);
                copy_field(cs->key, sizeof cs->key, f[5]);
            }
        } else if (!strcmp(f[0], "meta") && n >= 3) {
            if (!strcmp(f[1], "allocated"))
                r->allocated_bytes = role_u64(f[2]);
            else if (!strcmp(f[1], "complete"))
                r->complete = atoi(f[2]) != 0;
            else if (!strcmp(f[1], "elapsed_us"))
                r->elapsed_us = strtoull(f[2], NULL, 10);
            else if (!strcmp(f[1], "last_step_age_us"))
                r->last_step_age_us = role_u64(f[2]);
            else if (!strcmp(f[1], "objects"))
                r->objects = strtoull(f[2], NULL, 10);
            else if (!strcmp(f[1], "sampled"))
                r->sampled = strtoull(f[2], NULL, 10);
            else if (!strcmp(f[1], "by_dtype"))
                r->has_dtypes = atoi(f[2]) != 0;
            else if (!strcmp(f[1], "attention_modules"))
                r->attention_modules = role_u64(f[2]);
            else if (!strcmp(f[1], "num_beams"))
                r->num_beams = atoi(f[2]) > 0 ? atoi(f[2]) : 0;
            else if (!strcmp(f[1], "checkpointing"))
                r->checkpointing = !strcmp(f[2], "1") ? 1 : !strcmp(f[2], "0") ? -1 : 0;
            else if (!strcmp(f[1], "batch_size"))
                r->batch_size = atoi(f[2]) > 0 ? atoi(f[2]) : 0;
            else if (!strcmp(f[1], "children_read"))
                r->children_read = atoi(f[2]) != 0;
            else if (!strcmp(f[1], "statement_model_device") && atoi(f[2]) >= 0) {
                r->has_stmt_model_device = true;
                r->stmt_model_device = atoi(f[2]);
                if (n >= 4)
                    copy_field(r->stmt_model_name, sizeof r->stmt_model_name, f[3]);
            } else if (!strcmp(f[1], "autocast_in_code"))
                r->autocast_in_code = !strcmp(f[2], "1");
            else if (!strcmp(f[1], "scaler_without_autocast"))
                r->scaler_no_autocast = !strcmp(f[2], "1");
            else if (!strcmp(f[1], "backward_in_code"))
                r->backward_in_code = !strcmp(f[2], "1");
            else if (!strcmp(f[1], "input_requires_grad"))
                r->input_grad = !strcmp(f[2], "1");
            else if (!strcmp(f[1], "backward_on_stack"))
                r->backward_on_stack = !strcmp(f[2], "1") ? 1 : !strcmp(f[2], "0") ? -1 : 0;
            else if (!strcmp(f[1], "why"))
                copy_str(r->why, sizeof r->why, f[2]);
            else if (!strcmp(f[1], "copy_made"))
                r->copy_made = role_u64(f[2]);
            else if (!strcmp(f[1], "lora_bytes"))
                r->lora_bytes = role_u64(f[2]);
            else if (!strcmp(f[1], "lora_base_bytes"))
                r->lora_base = role_u64(f[2]);
            else if (!strcmp(f[1], "embedding_bytes"))
                r->embedding_bytes = role_u64(f[2]);
            else if (!strcmp(f[1], "embedding_tables"))
                r->embedding_tables = role_u64(f[2]);
            else if (!strcmp(f[1], "per_sample_count"))
                r->per_sample_count = atoi(f[2]) > 0 ? atoi(f[2]) : 0;
            else if (!strcmp(f[1], "activations_copy_of") && n >= 4) {
                copy_field(r->act_copy_of, sizeof r->act_copy_of, f[2]);
                r->act_copy_bytes = r->act_copy_of[0] ? strtoull(f[3], NULL, 10) : 0;
            }
        }
    }
}

/* The other frameworks' holdings (oomguard_framework_stats_t.other_frameworks):
 * "framework\treserved\tin_use|-\tlimit|-" lines; a line without a name or a reservation is skipped. */
static int parse_other_frameworks(const char *s, og_other_framework_t *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        const char *end = strchr(s, '\n');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char line[256], *f[4];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line - 1 ? len : sizeof line - 1), s);
        s = end ? end + 1 : s + len;
        if (split_tabs(line, f, 4) < 4 || !f[0][0])
            continue;
        og_other_framework_t *o = &out[n];
        memset(o, 0, sizeof *o);
        copy_str(o->framework, sizeof o->framework, f[0]);
        o->reserved_bytes = role_u64(f[1]);
        o->in_use_bytes = role_u64(f[2]);
        o->limit_bytes = role_u64(f[3]);
        if (og_known(o->reserved_bytes))
            n++;
    }
    return n;
}

/* The request the adapter gave: a 0 counts only with OOMGUARD_FW_REQUEST_KNOWN (before that flag, and in an
 * adapter that does not set it, the struct's 0 said "not given"); unknown otherwise, never 0 bytes. */
static og_opt_u64_t given_request(const oomguard_framework_stats_t *s)
{
    uint64_t flags = HAS(s, flags) ? s->flags : 0;
    og_opt_u64_t r = { 0, false };
    if (HAS(s, requested_bytes) && (s->requested_bytes || (flags & OOMGUARD_FW_REQUEST_KNOWN)))
        og_set(&r, s->requested_bytes);
    return r;
}

/* What the struct says, merged into *v (the numbers only when the adapter filled them). */
static int fill_view(og_framework_view_t *v, const oomguard_framework_stats_t *s)
{
    if (!s || s->struct_size < offsetof(oomguard_framework_stats_t, snapshot_path))
        return -1;
    uint64_t flags = HAS(s, flags) ? s->flags : 0;
    if (!(flags & OOMGUARD_FW_NO_NUMBERS)) {
        memset(v, 0, sizeof *v); /* a new report replaces the old one whole */
        v->has = true;
        v->allocated_bytes = s->allocated_bytes;
        v->reserved_bytes = s->reserved_bytes;
        v->active_bytes = s->active_bytes;
        v->inactive_split_bytes = s->inactive_split_bytes;
        v->largest_free_block_bytes = s->largest_free_block_bytes;
        v->private_pool_bytes = s->private_pool_bytes;
        v->num_alloc_retries = s->num_alloc_retries;
        v->num_ooms = s->num_ooms;
        copy_str(v->allocator_settings, sizeof v->allocator_settings, s->allocator_settings);
        copy_str(v->source, sizeof v->source, s->source ? s->source : "adapter");
        if (HAS(s, snapshot_path) && s->snapshot_path)
            copy_str(v->snapshot_file, sizeof v->snapshot_file, s->snapshot_path);
        v->device = (int)s->device;
        if (HAS(s, framework))
            copy_str(v->framework, sizeof v->framework, s->framework);
        if (HAS(s, api))
            copy_str(v->api, sizeof v->api, s->api);
        v->requested_bytes = given_request(s);
        if (HAS(s, cap_bytes) && s->cap_bytes) /* the struct's 0: no cap reported */
            og_set(&v->cap_bytes, s->cap_bytes);
        if (HAS(s, cap_source))
            copy_str(v->cap_source, sizeof v->cap_source, s->cap_source);
        if (HAS(s, peak_bytes) && (s->peak_bytes || (flags & OOMGUARD_FW_PEAK_KNOWN)))
            og_set(&v->peak_bytes, s->peak_bytes);
        if (HAS(s, grad_enabled))
            v->grad_enabled = s->grad_enabled;
        if (HAS(s, training))
            v->training = s->training;
        if (HAS(s, autocast))
            v->autocast = s->autocast;
        v->reserved_by_ledger = (flags & OOMGUARD_FW_RESERVED_BY_LEDGER) != 0;
        if (HAS(s, freed_bytes_total) && (flags & OOMGUARD_FW_FREED_KNOWN)) {
            v->freed_known = true;
            v->freed_bytes_total = s->freed_bytes_total;
        }
    }
    if (HAS(s, python_stack) && s->python_stack)
        v->npy_frames = parse_lines(s->python_stack, v->py_frames, 24, false);
    if (HAS(s, python_sites) && s->python_sites)
        v->npy_sites = parse_lines(s->python_sites, v->py_sites, 16, true);
    if (HAS(s, roles) && s->roles) {
        parse_roles(s->roles, &v->roles);
        v->roles.reported_t_ns = og_now_ns(); /* the step's age counts back from here */
    }
    if (HAS(s, phase) && s->phase)
        copy_str(v->phase, sizeof v->phase, s->phase);
    if (HAS(s, phase_source) && s->phase_source)
        copy_str(v->phase_source, sizeof v->phase_source, s->phase_source);
    if (HAS(s, phase_frame) && s->phase_frame) { /* the frame that decided, then the program's own line */
        og_py_frame_t two[2];
        int n = parse_lines(s->phase_frame, two, 2, false);
        v->has_phase_frame = n >= 1;
        v->has_phase_site = n == 2;
        if (n >= 1)
            v->phase_frame = two[0];
        if (n == 2)
            v->phase_site = two[1];
    }
    if (HAS(s, other_frameworks) && s->other_frameworks)
        v->nother_fw =
            parse_other_frameworks(s->other_frameworks, v->other_fw, (int)(sizeof v->other_fw / sizeof v->other_fw[0]));
    if (HAS(s, unmeasured_why) && s->unmeasured_why)
        copy_str(v->unmeasured_why, sizeof v->unmeasured_why, s->unmeasured_why);
    v->reported_t_ns = og_now_ns();
    return 0;
}

/* Fresh struct views are big (Python lines): built in static storage under build_lock,
 * which is taken only by adapter calls (never on an allocation path). */
static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;
static og_framework_view_t build_view;

static int store(const oomguard_framework_stats_t *s, bool internal_oom, int *device)
{
    pthread_mutex_lock(&build_lock);
    pthread_mutex_lock(&fw_lock);
    build_view = fw_view;
    pthread_mutex_unlock(&fw_lock);
    int r = fill_view(&build_view, s);
    if (r == 0) {
        build_view.internal_oom = internal_oom;
        *device = build_view.device;
        pthread_mutex_lock(&fw_lock);
        fw_view = build_view;
        pthread_mutex_unlock(&fw_lock);
    }
    pthread_mutex_unlock(&build_lock);
    return r;
}

/* set while the interpreter runs the refresh for a snapshot (refresh_on_interpreter) */
static OG_TLS int in_refresh;

OG_EXPORT int oomguard_framework_report(const oomguard_framework_stats_t *s)
{
    int device = 0;
    if (store(s, false, &device) != 0)
        return -1;
    if (in_refresh)
        return 0; /* numbers of now, for the snapshot: an open failure's dump keeps its own */
    og_init_slow();
    og_in_shim++; /* nothing done while rewriting the dump is recorded */
    og_oom_refresh(device);
    og_in_shim--;
    return 0;
}

OG_EXPORT int oomguard_framework_oom(const oomguard_framework_stats_t *s)
{
    int device = 0;
    if (!s || s->struct_size < offsetof(oomguard_framework_stats_t, snapshot_path))
        return -1;
    og_init_slow();
    uint64_t t0 = og_now_ns(); /* before store(): the Python lines belong to this failure */
    uint64_t window = (uint64_t)og_opt.retry_window_ms * 1000000ull;
    bool driver_failed = s->device >= 0 && s->device < OG_MAX_DEVICES && og_oom_open_recent((int)s->device, window);
    if (store(s, !driver_failed, &device) != 0)
        return -1;
    og_in_shim++;
    if (driver_failed) {
        og_oom_refresh(device); /* the driver's failure is the event; these are its numbers */
        og_oom_final(device);   /* and the framework gave up on it: no later success recovers it */
    } else if (device >= 0 && device < OG_MAX_DEVICES) {
        /* No call reached the driver: the framework's allocator refused the request itself. */
        og_episode_t ep;
        memset(&ep, 0, sizeof ep);
        ep.device = device;
        ep.hook = -1;
        ep.kind = OG_KIND_PLAIN;
        ep.attempts = 1;
        ep.caller = __builtin_return_address(0);
        ep.site = og_site_capture(ep.caller);
        ep.first_t_ns = ep.last_t_ns = t0;
        /* the adapter's request, when it gave one: unknown stays unknown (a 0 given with the flag is a size) */
        og_opt_u64_t req = given_request(s);
        ep.requested_known = og_known(req);
        ep.first_requested = ep.requested = og_or(req, 0);
        ep.result = CUDA_ERROR_OUT_OF_MEMORY;
        og_call_t c = { .hook = -1, .device = device, .caller = ep.caller, .active = true };
        og_report_failure(&ep, &c);
    }
    og_in_shim--;
    return 0;
}

void og_framework_view_get(og_framework_view_t *out)
{
    pthread_mutex_lock(&fw_lock);
    *out = fw_view;
    pthread_mutex_unlock(&fw_lock);
}

/* ------------------------------------------------------------------ the query */

static _Atomic(oomguard_query_fn) query_fn;
static _Atomic(void *) query_ctx;
static atomic_uint query_flags;
static OG_TLS int in_query;

OG_EXPORT int oomguard_framework_set_query(oomguard_query_fn fn, void *ctx, unsigned flags)
{
    atomic_store(&query_fn, NULL); /* never a new function with the old context */
    atomic_store(&query_ctx, ctx);
    atomic_store(&query_flags, flags);
    atomic_store(&query_fn, fn);
    return 0;
}

/* CPython, looked up in the process (the interpreter or libpython exports them). */
typedef int (*py_int_fn)(void);
typedef void *(*py_ptr_fn)(void);
static struct {
    py_int_fn is_initialized, gc_disable, gc_enable;
    py_ptr_fn unchecked_get, this_thread_state;
} py;

static void py_resolve(void)
{
    if (py.is_initialized && py.unchecked_get && py.this_thread_state)
        return;
    py.is_initialized = (py_int_fn)og_dlsym_real(RTLD_DEFAULT, "Py_IsInitialized");
    py.unchecked_get = (py_ptr_fn)og_dlsym_real(RTLD_DEFAULT, "PyThreadState_GetUnchecked"); /* 3.13 */
    if (!py.unchecked_get)
        py.unchecked_get = (py_ptr_fn)og_dlsym_real(RTLD_DEFAULT, "_PyThreadState_UncheckedGet");
    py.this_thread_state = (py_ptr_fn)og_dlsym_real(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    py.gc_disable = (py_int_fn)og_dlsym_real(RTLD_DEFAULT, "PyGC_Disable"); /* 3.10 */
    py.gc_enable = (py_int_fn)og_dlsym_real(RTLD_DEFAULT, "PyGC_Enable");
}

/* Does this thread hold the GIL?  Only read, never acquired.  The thread state that holds
 * the GIL (3.9-3.11: the interpreter's current one; 3.12+: this thread's attached one) must
 * be this thread's own.  PyGILState_Check is not used: it answers 1 when its check is off
 * (sub-interpreters) or before Python is initialised. */
static bool py_holds_gil(const char **why)
{
    py_resolve();
    if (!py.is_initialized || !py.unchecked_get || !py.this_thread_state) {
        *why = "framework query skipped: no Python interpreter found in the process";
        return false;
    }
    if (!py.is_initialized()) {
        *why = "framework query skipped: Python is not initialised";
        return false;
    }
    void *t = py.unchecked_get();
    if (!t || t != py.this_thread_state()) {
        *why = "framework query skipped: the failing thread does not hold the Python GIL "
               "(taking it inside the allocation could deadlock)";
        return false;
    }
    if (!py.gc_disable || !py.gc_enable) {
        *why = "framework query skipped: this Python cannot pause its garbage collector (3.10+ needed)";
        return false;
    }
    return true;
}

void og_query_at_failure(int device)
{
    oomguard_query_fn fn = atomic_load(&query_fn);
    if (!fn || in_query || device < 0 || device >= OG_MAX_DEVICES)
        return;
    void *ctx = atomic_load(&query_ctx);
    unsigned flags = atomic_load(&query_flags);
    const char *why = NULL;
    int gc_was = -1;
    if ((flags & OOMGUARD_QUERY_NEEDS_GIL) && !py_holds_gil(&why)) {
        pthread_mutex_lock(&fw_lock);
        copy_str(fw_view.unmeasured_why, sizeof fw_view.unmeasured_why, why);
        pthread_mutex_unlock(&fw_lock);
        return;
    }
    if (flags & OOMGUARD_QUERY_NEEDS_GIL)
        gc_was = py.gc_disable(); /* no finalizer (freeing device memory) inside the failing call */
    oomguard_framework_stats_t *s = calloc(1, sizeof *s);
    if (s) {
        s->struct_size = sizeof *s;
        s->device = device;
        s->flags = OOMGUARD_FW_NO_NUMBERS;
        in_query++;
        int r = fn(ctx, device, s);
        in_query--;
        if (r == 0) {
            s->struct_size = sizeof *s; /* the query fills, it does not shrink the struct */
            int d = device;
            store(s, false, &d);
        }
        free(s);
    }
    if (gc_was > 0)
        py.gc_enable();
}

/* ------------------------------------------------------------------ fresh numbers for a snapshot */

/* `oomguard snapshot` is served by the live page's thread, which holds no GIL: the adapter's
 * numbers it has are those of its last report.  A Python adapter's query can give fresh ones,
 * but only on a thread holding the GIL at a point where calling the framework is safe.  So the
 * shim asks the interpreter to run it as a pending call (Py_AddPendingCall, callable without
 * the GIL: the main thread runs it between two bytecodes, GIL held), waits a bounded time for
 * the adapter's report, and otherwise writes with the numbers it has and says how old they are
 * and why.  Never a signal; the program is never stopped or waited on. */
typedef int (*py_pending_fn)(int (*)(void *), void *);
static atomic_bool refresh_queued; /* a pending call is in the interpreter's queue */
static atomic_uint refresh_runs;   /* pending calls that ran */

static int refresh_on_interpreter(void *arg)
{
    int device = (int)(intptr_t)arg;
    oomguard_query_fn fn = atomic_load(&query_fn);
    void *ctx = atomic_load(&query_ctx);
    if (fn && !in_query) {
        oomguard_framework_stats_t *s = calloc(1, sizeof *s);
        if (s) {
            s->struct_size = sizeof *s;
            s->device = device;
            s->flags = OOMGUARD_FW_NO_NUMBERS | OOMGUARD_QUERY_REFRESH;
            in_query++;
            in_refresh++;
            fn(ctx, device, s); /* the adapter reports with oomguard_framework_report() */
            in_refresh--;
            in_query--;
            free(s);
        }
    }
    atomic_store(&refresh_queued, false);
    atomic_fetch_add(&refresh_runs, 1);
    return 0;
}

bool og_framework_refresh(int device, unsigned wait_ms, char *why, size_t n)
{
    why[0] = 0;
    oomguard_query_fn fn = atomic_load(&query_fn);
    if (!fn || !(atomic_load(&query_flags) & OOMGUARD_QUERY_NEEDS_GIL))
        return false; /* no Python adapter: its numbers come as it reports them */
    py_resolve();
    py_pending_fn add = (py_pending_fn)og_dlsym_real(RTLD_DEFAULT, "Py_AddPendingCall");
    if (!add || !py.is_initialized || !py.is_initialized())
        return false;
    uint64_t t0 = og_now_ns();
    unsigned runs = atomic_load(&refresh_runs);
    const char *cause = "the main thread did not come back to Python code (a long C call, a wait)";
    if (!atomic_exchange(&refresh_queued, true) && add(refresh_on_interpreter, (void *)(intptr_t)device) != 0) {
        atomic_store(&refresh_queued, false);
        cause = "the interpreter's queue of pending calls was full";
    } else {
        for (uint64_t until = t0 + (uint64_t)wait_ms * 1000000ull; og_now_ns() < until;) {
            if (atomic_load(&refresh_runs) != runs)
                break;
            struct timespec ts = { 0, 5 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
        if (atomic_load(&refresh_runs) != runs)
            cause = "the adapter was asked but did not report";
    }
    pthread_mutex_lock(&fw_lock);
    uint64_t at = fw_view.reported_t_ns;
    pthread_mutex_unlock(&fw_lock);
    if (at >= t0)
        return true;
    if (at)
        snprintf(why, n, "framework numbers: the adapter's last report, %.1f s old: %s in %u ms",
                 (double)(og_now_ns() - at) / 1e9, cause, wait_ms);
    else
        snprintf(why, n, "framework numbers: none reported yet: %s in %u ms", cause, wait_ms);
    return false;
}

void og_framework_atfork_child(void)
{
    pthread_mutex_init(&fw_lock, NULL);
    pthread_mutex_init(&build_lock, NULL);
    memset(&fw_view, 0, sizeof fw_view);
    in_query = 0;
    in_refresh = 0;
    atomic_store(&refresh_queued, false);
}

/* ------------------------------------------------------------------ is the Python view missing? */

static int py_state = OG_PY_NONE; /* written once by the constructor, single-threaded */
static char py_detail[256];

void og_python_started(int state, const char *detail)
{
    py_state = state;
    copy_str(py_detail, sizeof py_detail, detail ? detail : "");
}

/* Why an interpreter given the adapter on PYTHONPATH never imported it: its own flags say (the
 * legacy globals mirror the configuration), else its command line does. */
static const char *python_flags_why(void)
{
    static const struct {
        const char *global;
        char opt;
        const char *why;
    } flags[] = {
        { "Py_IsolatedFlag", 'I', "python -I (isolated) ignores PYTHONPATH" },
        { "Py_IgnoreEnvironmentFlag", 'E', "python -E ignores PYTHONPATH" },
        { "Py_NoSiteFlag", 'S', "python -S imports no site, so no sitecustomize" },
    };
    size_t nf = sizeof flags / sizeof *flags;
    for (size_t i = 0; i < nf; i++) {
        const int *g = og_dlsym_real(RTLD_DEFAULT, flags[i].global);
        if (g && *g)
            return flags[i].why;
    }
    /* the interpreter's options: argv words before the script, -c or -m */
    char buf[4096];
    FILE *f = fopen("/proc/self/cmdline", "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    bool skip = false; /* this word is the argument of -W or -X */
    for (size_t at = strlen(buf) + 1; at < n; at += strlen(buf + at) + 1) {
        const char *a = buf + at;
        if (skip) {
            skip = false;
            continue;
        }
        if (a[0] != '-' || !a[1] || a[1] == '-')
            break;
        for (const char *c = a + 1; *c; c++) {
            for (size_t i = 0; i < nf; i++)
                if (*c == flags[i].opt)
                    return flags[i].why;
            if (*c == 'c' || *c == 'm')
                return NULL; /* the rest is the program */
            if (*c == 'W' || *c == 'X') {
                skip = !c[1]; /* -X dev, or -Xdev */
                break;
            }
        }
    }
    return NULL;
}

bool og_python_adapter_missing(char *why, size_t n, bool *loud)
{
    const char *m = getenv(OG_PY_MARKER);
    if (py_state == OG_PY_NONE || (m && !strcmp(m, "1")))
        return false;
    *loud = py_state != OG_PY_OFF;
    const char *flags = py_state == OG_PY_PATH_SET ? python_flags_why() : NULL;
    if (py_state == OG_PY_OFF)
        snprintf(why, n, "python adapter: off (OOMGUARD_PYTHON_ADAPTER=0) and not imported: no framework view");
    else if (py_state == OG_PY_NO_DIR)
        snprintf(why, n, "python adapter: not loaded: no adapters directory next to liboomguard.so in %.60s",
                 py_detail);
    else if (flags)
        snprintf(why, n, "python adapter: not loaded: %s; no framework view", flags);
    else
        snprintf(why, n,
                 "python adapter: not loaded: sitecustomize.py did not run (another one first on "
                 "sys.path?); no framework view");
    return true;
}
