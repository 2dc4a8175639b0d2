/* The dump's JSON (docs/dump-format.md), one function per top-level key, named and ordered like the reader's
 * validators in tools/dump_read.c (v_top, v_event, ...), so a key added on one side is easy to find on the other. */
#include "og.h"
#include "record.h"
#include "strbuf.h"
#include "dump_render.h"
#include "symfill.h"

#include <stdio.h>
#include <string.h>

/* A count: every value is a number, 2^64-1 included (a request of SIZE_MAX). */
static void j_u64(og_sb_t *sb, uint64_t v) { og_sb_printf(sb, "%llu", (unsigned long long)v); }

/* A count that may not have been measured: null when not. */
static void j_opt(og_sb_t *sb, og_opt_u64_t v)
{
    if (og_known(v))
        j_u64(sb, v.v);
    else
        og_sb_puts(sb, "null");
}

static void j_key(og_sb_t *sb, const char *k, bool *first)
{
    if (!*first)
        og_sb_puts(sb, ",");
    *first = false;
    og_sb_json_str(sb, k);
    og_sb_puts(sb, ":");
}
#define K(name) j_key(sb, name, &first)

/* ,"k":"v" and ,"k":N|null: one more member of an object that already has one */
static void j_more_str(og_sb_t *sb, const char *k, const char *v)
{
    bool first = false;
    K(k);
    og_sb_json_str(sb, v);
}

static void j_more_opt(og_sb_t *sb, const char *k, og_opt_u64_t v)
{
    bool first = false;
    K(k);
    j_opt(sb, v);
}

/* Names and lines resolved in this process (symfill.c), when they are known by now. */
static void j_frame_names(og_sb_t *sb, uintptr_t ip)
{
    const og_symfill_ent_t *e = og_symfill_get(ip);
    if (!e || !e->function[0])
        return;
    bool first = false;
    K("function");
    og_sb_json_str(sb, e->function);
    if (e->file[0] && e->line > 0) {
        K("file");
        og_sb_json_str(sb, e->file);
        K("line");
        og_sb_printf(sb, "%d", e->line);
    }
    K("inlined");
    og_sb_puts(sb, e->inlined ? "true" : "false");
    if (e->inlined && e->inlined_into[0]) {
        K("inlined_into");
        og_sb_json_str(sb, e->inlined_into);
    }
}

static void j_frames(og_sb_t *sb, const og_frame_t *f, int n)
{
    og_sb_puts(sb, "[");
    for (int i = 0; i < n; i++) {
        bool first = true;
        og_sb_puts(sb, i ? ",{" : "{");
        K("ip");
        og_sb_printf(sb, "\"0x%llx\"", (unsigned long long)f[i].ip);
        K("symbol");
        og_sb_json_str(sb, f[i].symbol);
        K("library");
        og_sb_json_str(sb, f[i].library);
        K("offset");
        og_sb_printf(sb, "\"0x%llx\"", (unsigned long long)f[i].offset);
        K("path"); /* path + build_id + offset: what `oomguard report` symbolizes from */
        if (f[i].path[0])
            og_sb_json_str(sb, f[i].path);
        else
            og_sb_puts(sb, "null");
        K("build_id");
        if (f[i].build_id[0])
            og_sb_json_str(sb, f[i].build_id);
        else
            og_sb_puts(sb, "null");
        j_frame_names(sb, f[i].ip);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
}

/* Python lines (event.python_stack, python_sites): bytes/blocks only for sites. */
static void j_py_frames(og_sb_t *sb, const og_py_frame_t *f, int n, bool sized)
{
    og_sb_puts(sb, "[");
    for (int i = 0; i < n; i++) {
        og_sb_puts(sb, i ? ",{\"file\":" : "{\"file\":");
        og_sb_json_str(sb, f[i].file);
        og_sb_printf(sb, ",\"line\":%d,\"function\":", f[i].line);
        og_sb_json_str(sb, f[i].function);
        if (sized)
            og_sb_printf(sb, ",\"bytes\":%llu,\"blocks\":%llu", (unsigned long long)f[i].bytes,
                         (unsigned long long)f[i].blocks);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
}

/* one Python line as an object: {file, line, function} */
/* A Python frame's object left open, for callers that add their own keys: {"file","line","function" */
static void j_py_frame_open(og_sb_t *sb, const og_py_frame_t *f)
{
    og_sb_puts(sb, "{\"file\":");
    og_sb_json_str(sb, f->file);
    og_sb_printf(sb, ",\"line\":%d,\"function\":", f->line);
    og_sb_json_str(sb, f->function);
}

static void j_py_frames_one(og_sb_t *sb, const og_py_frame_t *f)
{
    j_py_frame_open(sb, f);
    og_sb_puts(sb, "}");
}

/* a comma-separated list as a JSON array of strings; NULL: null */
static void j_csv_strs(og_sb_t *sb, const char *csv)
{
    if (!csv) {
        og_sb_puts(sb, "null");
        return;
    }
    char buf[128]; /* the longest list the record keeps (stmt_names) */
    _Static_assert(sizeof buf >= sizeof((og_roles_t *)0)->stmt_names, "a list cut short");
    snprintf(buf, sizeof buf, "%s", csv);
    og_sb_puts(sb, "[");
    int k = 0;
    for (char *p = buf, *e; p && *p; p = e ? e + 1 : NULL) {
        e = strchr(p, ',');
        if (e)
            *e = 0;
        if (!*p)
            continue;
        og_sb_puts(sb, k++ ? "," : "");
        og_sb_json_str(sb, p);
    }
    og_sb_puts(sb, "]");
}

static void j_str_or_null(og_sb_t *sb, const char *s)
{
    if (s[0])
        og_sb_json_str(sb, s);
    else
        og_sb_puts(sb, "null");
}

/* memory.framework.roles: the allocated bytes by role (common/roles.def), or null when not measured */
static void j_roles(og_sb_t *sb, const og_roles_t *r)
{
    if (!r->has) {
        og_sb_puts(sb, "null");
        return;
    }
    bool first = true;
    og_sb_puts(sb, "{");
    K("allocated_bytes");
    j_opt(sb, r->allocated_bytes);
#define OG_ROLE(k, label, quiet)                                                \
    K(#k "_bytes");                                                             \
    j_opt(sb, r->bytes[OG_ROLE_##k]);                                           \
    K(#k "_tensors");                                                           \
    if (OG_ROLE_##k == OG_ROLE_activations || !og_known(r->bytes[OG_ROLE_##k])) \
        og_sb_puts(sb, "null");                                                 \
    else                                                                        \
        og_sb_printf(sb, "%llu", (unsigned long long)r->tensors[OG_ROLE_##k]);
#include "roles.def"
#undef OG_ROLE
    K("optimizers");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->noptimizers; i++) {
        og_sb_puts(sb, i ? ",{\"class\":" : "{\"class\":");
        og_sb_json_str(sb, r->optimizers[i].cls);
        og_sb_printf(sb, ",\"bytes\":%llu,\"tensors\":%llu,\"parameters_bytes\":",
                     (unsigned long long)r->optimizers[i].bytes, (unsigned long long)r->optimizers[i].tensors);
        j_opt(sb, r->optimizers[i].param_bytes);
        og_sb_puts(sb, ",\"not_elementwise_bytes\":");
        j_opt(sb, r->optimizers[i].shaped_bytes);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
    K("parameters_by_dtype");
    if (r->has_dtypes) {
        og_sb_puts(sb, "[");
        for (int i = 0; i < r->ndtypes; i++) {
            og_sb_puts(sb, i ? ",{\"dtype\":" : "{\"dtype\":");
            og_sb_json_str(sb, r->dtypes[i].dtype);
            og_sb_printf(sb, ",\"bytes\":%llu,\"tensors\":%llu}", (unsigned long long)r->dtypes[i].bytes,
                         (unsigned long long)r->dtypes[i].tensors);
        }
        og_sb_puts(sb, "]");
    } else {
        og_sb_puts(sb, "null");
    }
    K("holders");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->nholders; i++) {
        const og_role_holder_t *h = &r->holders[i];
        og_sb_puts(sb, i ? ",{\"label\":" : "{\"label\":");
        og_sb_json_str(sb, h->label);
        j_more_str(sb, "name", h->name);
        j_more_str(sb, "kind", h->kind);
        j_more_str(sb, "where", h->where);
        og_sb_printf(sb, ",\"bytes\":%llu,\"tensors\":%llu,\"site\":", (unsigned long long)h->bytes,
                     (unsigned long long)h->tensors);
        if (h->has_site)
            j_py_frames_one(sb, &h->site);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"purpose\":");
        j_str_or_null(sb, h->purpose);
        og_sb_puts(sb, ",\"copy_of\":");
        j_str_or_null(sb, h->copy_of);
        og_sb_puts(sb, ",\"graphs\":");
        if (h->graphs >= 0)
            og_sb_printf(sb, "%d", h->graphs);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"restored_bytes\":");
        j_opt(sb, h->restored);
        og_sb_puts(sb, ",\"restored_site\":");
        if (h->has_restored_site)
            j_py_frames_one(sb, &h->restored_site);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"records\":");
        if (h->records >= 0)
            og_sb_printf(sb, "%lld", (long long)h->records);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"float64_bytes\":");
        j_opt(sb, h->float64);
        og_sb_puts(sb, ",\"bound_bytes\":");
        j_opt(sb, h->bound_bytes);
        og_sb_puts(sb, ",\"bound_records\":");
        j_opt(sb, h->bound_records);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
    K("models");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->nmodels; i++) {
        og_sb_puts(sb, i ? ",{\"class\":" : "{\"class\":");
        og_sb_json_str(sb, r->models[i].cls);
        og_sb_printf(sb, ",\"parameters_bytes\":%llu,\"tensors\":%llu,\"count\":%d,\"frozen\":%s",
                     (unsigned long long)r->models[i].bytes, (unsigned long long)r->models[i].tensors,
                     r->models[i].count, r->models[i].frozen ? "true" : "false");
        /* how many the running code holds by a name and runs, and those names (null: not measured) */
        if (r->models[i].named >= 0)
            og_sb_printf(sb, ",\"named\":%d,\"running\":%d,\"names\":", r->models[i].named,
                         r->models[i].running >= 0 ? r->models[i].running : 0);
        else
            og_sb_puts(sb, ",\"named\":null,\"running\":null,\"names\":");
        j_csv_strs(sb, r->models[i].named >= 0 ? r->models[i].names : NULL);
        og_sb_puts(sb, ",\"purpose\":");
        j_str_or_null(sb, r->models[i].purpose);
        og_sb_puts(sb, ",\"trained\":");
        if (r->models[i].trained >= 0)
            og_sb_printf(sb, "%d", r->models[i].trained);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"stepped\":");
        if (r->models[i].stepped >= 0)
            og_sb_printf(sb, "%d", r->models[i].stepped);
        else
            og_sb_puts(sb, "null");
        og_sb_printf(sb, ",\"parameters_elsewhere_bytes\":%llu", (unsigned long long)r->models[i].away);
        og_sb_puts(sb, ",\"training\":");
        if (r->models[i].training >= 0)
            og_sb_printf(sb, "%d", r->models[i].training);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"parameters_float32_bytes\":");
        if (og_known(r->models[i].fp32))
            og_sb_printf(sb, "%llu", (unsigned long long)r->models[i].fp32.v);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, ",\"parameters_quantized_bytes\":");
        if (og_known(r->models[i].quant))
            og_sb_printf(sb, "%llu", (unsigned long long)r->models[i].quant.v);
        else
            og_sb_puts(sb, "null");
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
    K("operation");
    if (r->operation[0]) {
        og_sb_puts(sb, "{\"name\":");
        og_sb_json_str(sb, r->operation);
        og_sb_puts(sb, ",\"frame\":");
        j_py_frames_one(sb, &r->op_frame);
        og_sb_puts(sb, ",\"argument\":");
        j_str_or_null(sb, r->op_argument);
        og_sb_puts(sb, "}");
    } else
        og_sb_puts(sb, "null");
    K("ddp");
    if (r->ddp_wrappers > 0)
        og_sb_printf(sb, "{\"wrappers\":%d,\"gradient_as_bucket_view\":false,\"bucket_bytes\":%llu}", r->ddp_wrappers,
                     (unsigned long long)r->ddp_bucket_bytes);
    else
        og_sb_puts(sb, "null");
    K("statement");
    if (r->has_statement) {
        j_py_frame_open(sb, &r->stmt);
        og_sb_puts(sb, ",\"target\":");
        j_str_or_null(sb, r->stmt_target);
        og_sb_puts(sb, ",\"purpose\":");
        j_str_or_null(sb, r->stmt_purpose);
        og_sb_puts(sb, ",\"names\":");
        j_csv_strs(sb, r->stmt_names);
        og_sb_puts(sb, ",\"ints\":[");
        int k = 0;
        for (const char *p = r->stmt_ints; *p;) { /* digits and commas only: anything else ends it */
            char *e;
            unsigned long long v = strtoull(p, &e, 10);
            if (e == p)
                break;
            og_sb_printf(sb, "%s%llu", k++ ? "," : "", v);
            p = *e == ',' ? e + 1 : e;
            if (*e != ',')
                break;
        }
        og_sb_puts(sb, "]}");
    } else
        og_sb_puts(sb, "null");
    K("accumulating");
    if (r->has_accum) {
        j_py_frame_open(sb, &r->accum);
        og_sb_puts(sb, ",\"target\":");
        j_str_or_null(sb, r->accum_target);
        og_sb_puts(sb, ",\"operand\":");
        j_str_or_null(sb, r->accum_operand);
        og_sb_puts(sb, "}");
    } else
        og_sb_puts(sb, "null");
    for (int i = 0; i < OG_NCODE_SETTINGS; i++) { /* common/code_settings.def */
        const og_code_setting_t *cs = &r->settings[i];
        K(og_code_setting_name(i));
        if (cs->has) {
            j_py_frame_open(sb, &cs->at);
            og_sb_puts(sb, ",\"key\":");
            j_str_or_null(sb, cs->key);
            og_sb_puts(sb, "}");
        } else
            og_sb_puts(sb, "null");
    }
    K("complete");
    og_sb_puts(sb, r->complete ? "true" : "false");
    K("why");
    if (r->why[0])
        og_sb_json_str(sb, r->why);
    else
        og_sb_puts(sb, "null");
    K("elapsed_ms");
    og_sb_printf(sb, "%.3f", (double)r->elapsed_us / 1000.0);
    K("attention_modules");
    if (r->attention_modules.known)
        og_sb_printf(sb, "%llu", (unsigned long long)r->attention_modules.v);
    else
        og_sb_puts(sb, "null");
    K("num_beams");
    if (r->num_beams > 0)
        og_sb_printf(sb, "%d", r->num_beams);
    else
        og_sb_puts(sb, "null");
    K("generation_input");
    if (r->gen_dims > 0) {
        og_sb_puts(sb, "{\"name\":");
        og_sb_json_str(sb, r->gen_input);
        og_sb_puts(sb, ",\"shape\":[");
        for (int i = 0; i < r->gen_dims && i < 6; i++)
            og_sb_printf(sb, "%s%llu", i ? "," : "", (unsigned long long)r->gen_shape[i]);
        og_sb_puts(sb, "]}");
    } else
        og_sb_puts(sb, "null");
    K("failing_layer");
    if (r->layer_count > 0) {
        og_sb_puts(sb, "{\"run\":");
        og_sb_json_str(sb, r->layer_run);
        og_sb_printf(sb, ",\"index\":%d,\"count\":%d,\"alike\":%s}", r->layer_index, r->layer_count,
                     r->layer_alike > 0   ? "true"
                     : r->layer_alike < 0 ? "false"
                                          : "null");
    } else
        og_sb_puts(sb, "null");
    K("gradient_checkpointing");
    og_sb_puts(sb, r->checkpointing > 0 ? "true" : r->checkpointing < 0 ? "false" : "null");
    K("batch_size");
    if (r->batch_size > 0)
        og_sb_printf(sb, "%d", r->batch_size);
    else
        og_sb_puts(sb, "null");
    K("child_processes");
    if (r->children_read) {
        og_sb_putc(sb, '[');
        for (int i = 0; i < r->nchildren && i < (int)(sizeof r->children / sizeof r->children[0]); i++) {
            og_sb_printf(sb, "%s{\"pid\":%d,\"name\":", i ? "," : "", r->children[i].pid);
            j_str_or_null(sb, r->children[i].name);
            og_sb_putc(sb, '}');
        }
        og_sb_putc(sb, ']');
    } else
        og_sb_puts(sb, "null");
    K("statement_model_device");
    if (r->has_stmt_model_device)
        og_sb_printf(sb, "%d", r->stmt_model_device);
    else
        og_sb_puts(sb, "null");
    K("statement_model");
    j_str_or_null(sb, r->has_stmt_model_device ? r->stmt_model_name : "");
    K("autocast_in_code");
    og_sb_puts(sb, r->autocast_in_code ? "true" : "null");
    K("scaler_without_autocast");
    og_sb_puts(sb, r->scaler_no_autocast ? "true" : "null");
    K("backward_in_code");
    og_sb_puts(sb, r->backward_in_code ? "true" : "null");
    K("backward_on_stack");
    og_sb_puts(sb, r->backward_on_stack > 0 ? "true" : r->backward_on_stack < 0 ? "false" : "null");
    K("input_requires_grad");
    og_sb_puts(sb, r->input_grad ? "true" : "null");
    K("last_optimizer_step_ms_ago");
    if (!og_known(r->last_step_age_us))
        og_sb_puts(sb, "null");
    else
        og_sb_printf(sb, "%.3f", (double)r->last_step_age_us.v / 1000.0);
    K("activations_copy_of");
    if (r->act_copy_of[0]) {
        og_sb_puts(sb, "{\"role\":");
        og_sb_json_str(sb, r->act_copy_of);
        og_sb_printf(sb, ",\"bytes\":%llu}", (unsigned long long)r->act_copy_bytes);
    } else
        og_sb_puts(sb, "null");
    K("copy_made_bytes");
    j_opt(sb, r->copy_made);
    K("lora_parameters_bytes");
    j_opt(sb, r->lora_bytes);
    K("lora_base_trainable_bytes");
    j_opt(sb, r->lora_base);
    K("embedding_parameters_bytes");
    j_opt(sb, r->embedding_bytes);
    K("embedding_tables");
    j_opt(sb, r->embedding_tables);
    K("per_sample_count");
    if (r->per_sample_count > 0)
        og_sb_printf(sb, "%d", r->per_sample_count);
    else
        og_sb_puts(sb, "null");
    K("allocated_after_steps");
    if (r->nsteps > 0) {
        og_sb_puts(sb, "[");
        for (int i = 0; i < r->nsteps && i < OG_STEP_SERIES; i++)
            og_sb_printf(sb, "%s%llu", i ? "," : "", (unsigned long long)r->step_alloc[i]);
        og_sb_puts(sb, "]");
    } else
        og_sb_puts(sb, "null");
    K("optimizer_steps");
    if (r->steps_known)
        og_sb_printf(sb, "%llu", (unsigned long long)r->steps_made);
    else
        og_sb_puts(sb, "null");
    K("optimizer_steps_on_device");
    if (r->device_steps_known)
        og_sb_printf(sb, "%llu", (unsigned long long)r->device_steps);
    else
        og_sb_puts(sb, "null");
    K("allocated_over_run");
    if (r->nsteps > 0 && r->nstep_run > 0) {
        og_sb_printf(sb, "{\"every\":%llu,\"bytes\":[", (unsigned long long)r->step_run_every);
        for (int i = 0; i < r->nstep_run && i < OG_STEP_SERIES; i++)
            og_sb_printf(sb, "%s%llu", i ? "," : "", (unsigned long long)r->step_run[i]);
        og_sb_puts(sb, "]}");
    } else
        og_sb_puts(sb, "null");
    K("objects_scanned");
    og_sb_printf(sb, "%llu", (unsigned long long)r->objects);
    K("read_in_part");
    og_sb_printf(sb, "%llu", (unsigned long long)r->sampled);
    og_sb_puts(sb, "}");
}

static void j_long_or_null(og_sb_t *sb, long v)
{
    if (v < 0)
        og_sb_puts(sb, "null");
    else
        og_sb_printf(sb, "%ld", v);
}

static void w_framework(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("name");
    og_sb_json_str(sb, og_framework_name(r->framework));
    K("libraries");
    og_sb_puts(sb, "[");
    const char *p = r->framework_libs;
    for (int i = 0; *p; i++) {
        size_t len = strcspn(p, ",");
        char lib[128];
        snprintf(lib, sizeof lib, "%.*s", (int)(len < 127 ? len : 127), p);
        if (i)
            og_sb_puts(sb, ",");
        og_sb_json_str(sb, lib);
        p += len + (p[len] == ',');
    }
    og_sb_puts(sb, "]}");
}

static void w_env(og_sb_t *sb, const og_record_t *r)
{
    og_sb_puts(sb, "{");
    for (int i = 0; i < r->nenv; i++) {
        const char *eq = strchr(r->env[i], '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - r->env[i] : 0), r->env[i]);
        if (i)
            og_sb_puts(sb, ",");
        og_sb_json_str(sb, name);
        og_sb_puts(sb, ":");
        og_sb_json_str(sb, eq ? eq + 1 : "");
    }
    og_sb_puts(sb, "}");
}

/* the scalars before "event", and the framework and env objects among them */
static void w_top(og_sb_t *sb, const og_record_t *r, bool *first_)
{
#define KT(name) j_key(sb, name, first_)
    KT("schema");
    og_sb_json_str(sb, OOMGUARD_DUMP_SCHEMA);
    KT("status");
    og_sb_json_str(sb, r->status);
    KT("generator");
    og_sb_printf(sb, "\"oomguard %s\"", OOMGUARD_VERSION);
    KT("time");
    og_sb_printf(sb, "%.6f", r->time);
    KT("pid");
    og_sb_printf(sb, "%d", r->pid);
    KT("ppid");
    og_sb_printf(sb, "%d", r->ppid);
    KT("host");
    og_sb_json_str(sb, r->host);
    KT("node");
    if (r->node[0])
        og_sb_json_str(sb, r->node);
    else
        og_sb_puts(sb, "null");
    KT("rank");
    j_long_or_null(sb, r->rank);
    KT("local_rank");
    j_long_or_null(sb, r->local_rank);
    KT("world_size");
    j_long_or_null(sb, r->world_size);
    KT("job_id");
    if (r->job_id[0])
        og_sb_json_str(sb, r->job_id);
    else
        og_sb_puts(sb, "null");
    KT("cmdline");
    og_sb_json_str(sb, r->cmdline);
    KT("framework");
    w_framework(sb, r);
    KT("env");
    w_env(sb, r);
    KT("visible_devices");
    og_sb_printf(sb, "%d", r->visible_devices);
#undef KT
}

static void w_event(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    /* the API's argument, known for every driver or runtime call (SIZE_MAX and 0 are requests like any other);
     * null: an adapter reported the failure without its size */
    K("requested_bytes");
    j_opt(sb, r->event.requested_bytes);
    K("api");
    og_sb_json_str(sb, r->event.api ? r->event.api : "");
    K("driver_api");
    og_sb_json_str(sb, r->event.driver_api ? r->event.driver_api : "");
    K("device");
    og_sb_printf(sb, "%d", r->event.device);
    K("stream_ordered");
    og_sb_puts(sb, r->event.stream_ordered ? "true" : "false");
    K("result");
    og_sb_printf(sb, "%d", r->event.result);
    K("caused_by_limit");
    og_sb_puts(sb, r->event.caused_by_limit ? "true" : "false");
    K("library");
    og_sb_json_str(sb, r->event.library);
    K("stack");
    j_frames(sb, r->event.frames, r->event.nframes);
    K("python_stack");
    j_py_frames(sb, r->memory.fw.py_frames, r->memory.fw.npy_frames, false);
    K("framework_internal");
    og_sb_puts(sb, r->event.framework_internal ? "true" : "false");
    /* what the job was doing, from the adapter (null: unknown; phase_source says how or why) */
    K("phase");
    if (r->memory.fw.phase[0])
        og_sb_json_str(sb, r->memory.fw.phase);
    else
        og_sb_puts(sb, "null");
    K("phase_frame");
    if (r->memory.fw.phase[0] && r->memory.fw.has_phase_frame)
        j_py_frames_one(sb, &r->memory.fw.phase_frame);
    else
        og_sb_puts(sb, "null");
    K("phase_site");
    if (r->memory.fw.phase[0] && r->memory.fw.has_phase_site)
        j_py_frames_one(sb, &r->memory.fw.phase_site);
    else
        og_sb_puts(sb, "null");
    K("phase_source");
    if (r->memory.fw.phase_source[0])
        og_sb_json_str(sb, r->memory.fw.phase_source);
    else if (!r->memory.fw.npy_frames && !r->memory.fw.phase[0])
        og_sb_json_str(sb, "no Python stack");
    else
        og_sb_puts(sb, "null");
    K("t");
    og_sb_printf(sb, "%.6f", r->event.t);
    K("t_rel");
    og_sb_printf(sb, "%.6f", r->event.t_rel);
    K("attempts");
    og_sb_printf(sb, "%d", r->event.attempts);
    K("released_between_attempts_bytes");
    j_opt(sb, r->event.released_between_attempts_bytes);
    K("recovered_by");
    if (r->event.recovered) {
        og_sb_printf(sb, "{\"requested_bytes\":%llu,\"t\":%.6f}",
                     (unsigned long long)r->event.recovered_requested_bytes, r->event.recovered_t);
    } else {
        og_sb_puts(sb, "null");
    }
    og_sb_puts(sb, "}");
}

static void w_device(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("index");
    og_sb_printf(sb, "%d", r->device.index);
    K("name");
    og_sb_json_str(sb, r->device.name);
    K("pci_bus_id");
    og_sb_json_str(sb, r->device.pci_bus_id);
    K("compute_capability");
    og_sb_printf(sb, "\"%d.%d\"", r->device.cc_major, r->device.cc_minor);
    K("total_bytes");
    j_opt(sb, r->device.total_bytes);
    K("free_bytes");
    j_opt(sb, r->device.free_bytes);
    K("limit_bytes");
    j_opt(sb, r->device.limit_bytes);
    K("limit_usage_bytes");
    j_opt(sb, r->device.limit_usage_bytes);
    og_sb_puts(sb, "}");
}

static void w_memory(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("process_tracked_bytes");
    j_opt(sb, r->memory.process_tracked_bytes);
    K("process_used_bytes");
    j_opt(sb, r->memory.process_used_bytes);
    K("by_kind");
    og_sb_printf(sb,
                 "{\"plain\":%llu,\"managed\":%llu,\"pool_reserved\":%llu,\"pool_used\":%llu,"
                 "\"vmm_physical\":%llu,\"vmm_mapped\":%llu}",
                 (unsigned long long)r->memory.plain, (unsigned long long)r->memory.managed,
                 (unsigned long long)r->memory.pool_reserved, (unsigned long long)r->memory.pool_used,
                 (unsigned long long)r->memory.vmm_physical, (unsigned long long)r->memory.vmm_mapped);
    K("by_library");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->memory.nlibs; i++) {
        const og_lib_usage_t *u = &r->memory.by_library[i];
        og_sb_puts(sb, i ? ",{\"library\":" : "{\"library\":");
        og_sb_json_str(sb, u->library);
        og_sb_printf(sb, ",\"bytes\":%llu,\"blocks\":%llu,\"framework\":%s", (unsigned long long)u->bytes,
                     (unsigned long long)u->blocks, u->framework ? "true" : "false");
        /* whose framework (several can share a process), and what came from pools */
        og_sb_printf(sb, ",\"framework_name\":");
        if (u->framework)
            og_sb_json_str(sb, og_framework_name(u->fw_kind));
        else
            og_sb_puts(sb, "null");
        og_sb_printf(sb, ",\"pool_bytes\":%llu,\"bytes_by_quarter\":", (unsigned long long)u->pool_bytes);
        _Static_assert(OG_QUARTERS == 4, "bytes_by_quarter prints four");
        if (u->by_quarter_known)
            og_sb_printf(sb, "[%llu,%llu,%llu,%llu]}", (unsigned long long)u->by_quarter[0],
                         (unsigned long long)u->by_quarter[1], (unsigned long long)u->by_quarter[2],
                         (unsigned long long)u->by_quarter[3]);
        else
            og_sb_puts(sb, "null}");
    }
    og_sb_puts(sb, "]");
    K("framework_bytes");
    j_u64(sb, r->memory.framework_bytes);
    K("framework_cached_bytes");
    j_opt(sb, r->memory.framework_cached_bytes);
    K("framework_cached_source");
    if (r->memory.framework_cached_source != OG_CACHE_NONE)
        og_sb_json_str(sb, og_cache_src_name(r->memory.framework_cached_source));
    else
        og_sb_puts(sb, "null");
    K("non_framework_bytes");
    j_opt(sb, r->memory.non_framework_bytes);
    K("context_bytes_estimate");
    j_opt(sb, r->memory.context_bytes_estimate);
    K("other_processes");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->memory.nother; i++) {
        og_sb_printf(sb, "%s{\"pid\":%d,\"name\":", i ? "," : "", r->memory.other[i].pid);
        og_sb_json_str(sb, r->memory.other[i].name);
        og_sb_printf(sb,
                     ",\"bytes\":%llu,\"visible\":%s,\"same_job\":%s,\"child\":%s,\"rank\":%ld,\"sibling\":%s,"
                     "\"parent\":%s,\"same_program\":%s,\"other_program\":%s,\"same_allocation\":%s}",
                     (unsigned long long)r->memory.other[i].bytes, r->memory.other[i].visible ? "true" : "false",
                     r->memory.other[i].same_job ? "true" : "false", r->memory.other[i].child ? "true" : "false",
                     r->memory.other[i].rank, r->memory.other[i].sibling ? "true" : "false",
                     r->memory.other[i].parent ? "true" : "false", r->memory.other[i].same_program ? "true" : "false",
                     r->memory.other[i].other_program ? "true" : "false",
                     r->memory.other[i].same_allocation ? "true" : "false");
    }
    og_sb_puts(sb, "]");
    K("other_processes_bytes");
    j_opt(sb, r->memory.other_processes_bytes);
    K("other_processes_count");
    if (!og_known(r->memory.other_processes_bytes))
        og_sb_puts(sb, "null");
    else
        og_sb_printf(sb, "%d", r->memory.other_processes_count);
    K("host_pinned_bytes");
    j_u64(sb, r->memory.host_pinned_bytes);
    K("pool_owner");
    if (r->memory.pool_owner_fw) {
        og_sb_printf(sb, "{\"library\":");
        og_sb_json_str(sb, r->memory.pool_owner);
        og_sb_printf(sb, ",\"framework\":%s}", r->memory.pool_owner_fw == 1 ? "true" : "false");
    } else
        og_sb_puts(sb, "null");
    K("ipc_mapped_bytes");
    j_u64(sb, r->memory.ipc_mapped_bytes);
    K("contexts_made");
    if (r->memory.contexts_made >= 0)
        og_sb_printf(sb, "%lld", (long long)r->memory.contexts_made);
    else
        og_sb_puts(sb, "null");
    K("primary_context");
    og_sb_puts(sb, r->memory.primary_context < 0 ? "null" : r->memory.primary_context ? "true" : "false");
    K("nvml_process_query");
    if (r->memory.nvml_process_query[0])
        og_sb_json_str(sb, r->memory.nvml_process_query);
    else
        og_sb_puts(sb, "null");
    K("unmeasured");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->memory.nunmeasured; i++) {
        if (i)
            og_sb_puts(sb, ",");
        og_sb_json_str(sb, r->memory.unmeasured[i]);
    }
    og_sb_puts(sb, "]");
    K("unmeasured_ids");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->memory.nunmeasured; i++) {
        static const char *const ids[OG_UM_COUNT] = {
#define X(name, id, what) [OG_UM_##name] = id,
#include "unmeasured.def"
#undef X
        };
        og_sb_printf(sb, "%s\"%s\"", i ? "," : "",
                     r->memory.unmeasured_what[i] < OG_UM_COUNT ? ids[r->memory.unmeasured_what[i]] : "unknown");
    }
    og_sb_puts(sb, "]");
    K("framework");
    if (r->memory.fw.has) {
        const og_framework_view_t *f = &r->memory.fw;
        og_sb_printf(sb, "{\"allocated_bytes\":%llu,\"reserved_bytes\":", (unsigned long long)f->allocated_bytes);
        if (f->reserved_unknown) /* the framework publishes none and the ledger held none of its blocks */
            og_sb_puts(sb, "null");
        else
            og_sb_printf(sb, "%llu", (unsigned long long)f->reserved_bytes);
        og_sb_printf(sb,
                     ",\"active_bytes\":%llu,"
                     "\"inactive_split_bytes\":%llu,\"largest_free_block_bytes\":%llu,"
                     "\"private_pool_bytes\":%llu,\"num_alloc_retries\":%llu,\"num_ooms\":%llu,"
                     "\"allocator_settings\":",
                     (unsigned long long)f->active_bytes, (unsigned long long)f->inactive_split_bytes,
                     (unsigned long long)f->largest_free_block_bytes, (unsigned long long)f->private_pool_bytes,
                     (unsigned long long)f->num_alloc_retries, (unsigned long long)f->num_ooms);
        og_sb_json_str(sb, f->allocator_settings);
        j_more_str(sb, "source", f->source);
        /* who measured reserved_bytes: the framework's allocator, or the ledger where it publishes none */
        og_sb_printf(sb, ",\"reserved_source\":%s",
                     f->reserved_unknown     ? "null"
                     : f->reserved_by_ledger ? "\"ledger\""
                                             : "\"framework\"");
        if (f->snapshot_file[0])
            j_more_str(sb, "snapshot_file", f->snapshot_file);
        j_more_str(sb, "framework", f->framework);
        j_more_str(sb, "api", f->api);
        /* what the adapter did not report (no request given, no cap in force, no peak known): null, never
         * "0 B", which a reader would take for a measured request, cap or peak */
        j_more_opt(sb, "requested_bytes", f->requested_bytes);
        j_more_opt(sb, "cap_bytes", f->cap_bytes);
        j_more_opt(sb, "peak_bytes", f->peak_bytes);
        j_more_str(sb, "cap_source", f->cap_source);
        og_sb_printf(sb, ",\"grad_enabled\":%s,\"training\":%s,\"autocast\":%s",
                     f->grad_enabled > 0   ? "true"
                     : f->grad_enabled < 0 ? "false"
                                           : "null",
                     f->training > 0   ? "true"
                     : f->training < 0 ? "false"
                                       : "null",
                     f->autocast > 0   ? "true"
                     : f->autocast < 0 ? "false"
                                       : "null");
        if (f->freed_known)
            og_sb_printf(sb, ",\"freed_bytes_total\":%llu", (unsigned long long)f->freed_bytes_total);
        else
            og_sb_puts(sb, ",\"freed_bytes_total\":null");
        uint64_t cached = f->reserved_bytes > f->allocated_bytes ? f->reserved_bytes - f->allocated_bytes : 0;
        /* 1 - largest free block / free cached bytes; null when either is unknown */
        if (cached && f->largest_free_block_bytes)
            og_sb_printf(sb, ",\"fragmentation\":%.4f", 1.0 - (double)f->largest_free_block_bytes / (double)cached);
        else
            og_sb_puts(sb, ",\"fragmentation\":null");
        og_sb_puts(sb, ",\"other_frameworks\":[");
        for (int i = 0; i < f->nother_fw; i++) {
            const og_other_framework_t *o = &f->other_fw[i];
            og_sb_printf(sb, "%s{\"framework\":", i ? "," : "");
            og_sb_json_str(sb, o->framework);
            og_sb_puts(sb, ",\"reserved_bytes\":");
            j_opt(sb, o->reserved_bytes);
            og_sb_puts(sb, ",\"in_use_bytes\":");
            j_opt(sb, o->in_use_bytes);
            og_sb_puts(sb, ",\"limit_bytes\":");
            j_opt(sb, o->limit_bytes);
            og_sb_puts(sb, "}");
        }
        og_sb_puts(sb, "]");
        og_sb_puts(sb, ",\"roles\":");
        j_roles(sb, &f->roles);
        og_sb_puts(sb, "}");
    } else {
        og_sb_puts(sb, "null");
    }
    og_sb_puts(sb, "}");
}

static void w_history(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("peak_bytes");
    j_u64(sb, r->history.peak_bytes);
    K("peak_t_rel");
    og_sb_printf(sb, "%.6f", r->history.peak_t_rel);
    K("peak_library");
    og_sb_json_str(sb, r->history.peak_library);
    K("events");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->history.nevents; i++) {
        const struct og_hist_ev *e = &r->history.events[i];
        og_sb_printf(sb,
                     "%s{\"t_rel\":%.6f,\"op\":\"%s\",\"bytes\":%llu,\"device\":%d,\"api\":\"%s\",\"live_bytes\":%llu}",
                     i ? "," : "", e->t_rel, og_hist_op_name(e->op), (unsigned long long)e->bytes, e->device, e->api,
                     (unsigned long long)e->live);
    }
    og_sb_puts(sb, "]");
    K("samples");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->history.nsamples; i++)
        og_sb_printf(sb, "%s{\"t_rel\":%.6f,\"live_bytes\":%llu}", i ? "," : "", r->history.samples[i].t_rel,
                     (unsigned long long)r->history.samples[i].live);
    og_sb_puts(sb, "]");
    K("counters");
    og_sb_printf(sb,
                 "{\"allocs\":%llu,\"frees\":%llu,\"failures\":%llu,\"unknown_frees\":%llu,"
                 "\"recovered_episodes\":%llu,\"recovered_not_written\":%llu}",
                 (unsigned long long)r->history.allocs, (unsigned long long)r->history.frees,
                 (unsigned long long)r->history.failures, (unsigned long long)r->history.unknown_frees,
                 (unsigned long long)r->history.recovered_episodes,
                 (unsigned long long)r->history.recovered_not_written);
    og_sb_puts(sb, "}");
}

static void w_top_sites(og_sb_t *sb, const og_record_t *r)
{
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->nsites; i++) {
        const og_top_site_t *t = &r->sites[i];
        og_sb_printf(sb, "%s{\"bytes\":%llu,\"blocks\":%llu,\"library\":", i ? "," : "", (unsigned long long)t->bytes,
                     (unsigned long long)t->blocks);
        og_sb_json_str(sb, t->library);
        j_more_str(sb, "api", t->api);
        og_sb_puts(sb, ",\"frames\":");
        j_frames(sb, t->frames, t->nframes);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
}

static void w_diagnosis(og_sb_t *sb, const og_record_t *r)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("primary");
    og_sb_json_str(sb, r->diagnosis.primary ? r->diagnosis.primary : "unknown");
    K("shortfall_bytes");
    j_opt(sb, r->diagnosis.shortfall_bytes);
    K("causes");
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->diagnosis.ncauses; i++) {
        const og_cause_t *c = &r->diagnosis.causes[i];
        og_sb_puts(sb, i ? ",{\"id\":" : "{\"id\":");
        og_sb_json_str(sb, c->id);
        og_sb_printf(sb, ",\"confidence\":%.2f,\"summary\":", c->confidence);
        og_sb_json_str(sb, c->summary);
        og_sb_puts(sb, ",\"evidence\":{");
        for (int e = 0; e < c->nevidence; e++) {
            if (e)
                og_sb_puts(sb, ",");
            og_sb_json_str(sb, c->evidence[e].name);
            og_sb_puts(sb, ":");
            if (c->evidence[e].is_text)
                og_sb_json_str(sb, c->evidence[e].text);
            else if (c->evidence[e].is_bytes)
                og_sb_printf(sb, "%llu", (unsigned long long)c->evidence[e].bytes);
            else if (c->evidence[e].num >= 0 && c->evidence[e].num < 18446744073709551616.0 &&
                     c->evidence[e].num == (double)(uint64_t)c->evidence[e].num)
                og_sb_printf(sb, "%llu", (unsigned long long)c->evidence[e].num);
            else
                og_sb_printf(sb, "%.4f", c->evidence[e].num);
        }
        og_sb_puts(sb, "}}");
    }
    og_sb_puts(sb, "]}");
}

/* how the ranking placed one remedy: evidence for "why is this first", read by the scenario harness */
static void w_ranking(og_sb_t *sb, const og_remedy_t *m)
{
    double e = m->ranking.estimate;
    og_sb_printf(sb, ",\"ranking\":{\"tier\":%d,\"order\":%d,\"estimate\":\"%s\",\"estimate_bytes\":", m->ranking.tier,
                 m->ranking.order,
                 e == OG_RANK_UNBOUNDED ? "unbounded"
                 : e < 0                ? "unknown"
                                        : "bytes");
    if (e >= 0)
        og_sb_printf(sb, "%.0f", e);
    else
        og_sb_puts(sb, "null");
    og_sb_puts(sb, ",\"rows\":[");
    for (int i = 0; i < m->ranking.nrows && i < OG_RANK_ROWS_KEPT; i++) {
        if (i)
            og_sb_puts(sb, ",");
        og_sb_json_str(sb, m->ranking.rows[i] ? m->ranking.rows[i] : "");
    }
    og_sb_puts(sb, "]}");
}

static void w_remedies(og_sb_t *sb, const og_record_t *r)
{
    og_sb_puts(sb, "[");
    for (int i = 0; i < r->nremedies; i++) {
        const og_remedy_t *m = &r->remedies[i];
        og_sb_puts(sb, i ? ",{\"id\":" : "{\"id\":");
        og_sb_json_str(sb, m->id);
        og_sb_printf(sb, ",\"rank\":%d,\"shown\":%s,\"title\":", m->rank, m->shown ? "true" : "false");
        og_sb_json_str(sb, m->title ? m->title : "");
        j_more_str(sb, "why", m->why);
        og_sb_puts(sb, ",\"how\":[");
        for (int h = 0; h < m->nhow; h++) {
            if (h)
                og_sb_puts(sb, ",");
            og_sb_json_str(sb, m->how[h]);
        }
        og_sb_puts(sb, "],\"saving\":");
        og_sb_json_str(sb, m->saving ? m->saving : "");
        j_more_str(sb, "cost", m->cost ? m->cost : "");
        w_ranking(sb, m);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
}

static void w_summary(og_sb_t *sb, const og_record_t *r)
{
    og_sb_puts(sb, "{\"devices\":[");
    static const unsigned cards[] = { 16, 24, 40, 48, 80, 141 };
    for (int i = 0; i < r->nsummary; i++) {
        og_sb_printf(sb, "%s{\"index\":%d,\"peak_bytes\":%llu,\"peak_t_rel\":%.6f,\"peak_library\":", i ? "," : "",
                     r->summary[i].index, (unsigned long long)r->summary[i].peak_bytes, r->summary[i].peak_t_rel);
        og_sb_json_str(sb, r->summary[i].peak_library);
        /* on the device of a failure, what a card must hold and whether that is known: the analysis's
         * fact (facts.c, fit); elsewhere, the peak so far */
        bool failing = r->event.api && r->summary[i].index == r->event.device && strcmp(r->status, "exit") != 0 &&
                       strcmp(r->status, "warning") != 0 && r->analysis.facts_valid;
        const og_fit_facts_t *f = &r->analysis.facts.fit;
        uint64_t need = failing ? f->need : r->summary[i].peak_bytes;
        bool bounded = !failing || f->bounded;
        og_sb_printf(sb, ",\"need_bytes\":%llu,\"need_bounded\":%s,\"unbounded_why\":", (unsigned long long)need,
                     bounded ? "true" : "false");
        if (bounded)
            og_sb_puts(sb, "null");
        else
            og_sb_json_str(sb, f->why);
        og_sb_puts(sb, ",\"fits\":[");
        for (size_t c = 0; c < sizeof cards / sizeof *cards; c++) {
            uint64_t card = (uint64_t)cards[c] * 1000000000ull;
            /* too small for what it held and asked, or no larger than the card it failed on: no; room
             * for a bounded peak: yes; room only for a lower bound: unknown */
            const char *v = need > card || (failing && card <= f->card_floor) ? "false" : bounded ? "true" : "null";
            og_sb_printf(sb, "%s{\"card_gb\":%u,\"fits\":%s}", c ? "," : "", cards[c], v);
        }
        og_sb_puts(sb, "]}");
    }
    og_sb_puts(sb, "]}");
}

void og_dump_json(const og_record_t *r, og_sb_t *sb)
{
    bool first = true;
    og_sb_puts(sb, "{");
    w_top(sb, r, &first);
    K("event");
    w_event(sb, r);
    K("device");
    w_device(sb, r);
    K("memory");
    w_memory(sb, r);
    K("history");
    w_history(sb, r);
    K("python_sites");
    j_py_frames(sb, r->memory.fw.py_sites, r->memory.fw.npy_sites, true);
    K("top_sites");
    w_top_sites(sb, r);
    K("diagnosis");
    w_diagnosis(sb, r);
    K("remedies");
    w_remedies(sb, r);
    K("summary");
    w_summary(sb, r);
    og_sb_puts(sb, "}\n");
}
