/* tools/report_common.c — facts derived from a dump that the text and HTML
 * reports present the same way. */
#include "report.h"
#include "symbolize.h"
#include "human.h"
#include "model_dtypes.h"

#include <inttypes.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *og_framework_title(const char *name)
{
    return og_framework_display(og_framework_from_name(name), "Framework");
}

const char *og_cause_title(const char *id)
{
    /* the library's list of causes: every cause it can name has its title here */
    static const struct {
        const char *id, *title;
    } t[] = {
#define X(name, id, rule, bonus, own1, own2, title) { id, title },
#include "../common/causes.def"
#undef X
    };
    for (size_t i = 0; id && i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(id, t[i].id))
            return t[i].title;
    return NULL;
}

const char *og_status_title(const struct og_dump *d)
{
    switch (d->status) {
    case OG_ST_OOM:
        return d->event.caused_by_limit == 1 ? "Allocation refused by OOMGUARD_LIMIT" : "CUDA out of memory";
    case OG_ST_RECOVERED:
        return "Recovered from an out-of-memory error";
    case OG_ST_WARNING:
        return "Memory warning";
    case OG_ST_EXIT:
        return "Exit summary";
    default:
        return "oomguard dump";
    }
}

const struct og_cause *og_primary_cause(const struct og_dump *d)
{
    if (d->diag.primary)
        for (int i = 0; i < d->diag.ncauses; i++)
            if (d->diag.causes[i].id && !strcmp(d->diag.causes[i].id, d->diag.primary))
                return &d->diag.causes[i];
    return d->diag.ncauses ? &d->diag.causes[0] : NULL;
}

const char *og_format_time(double t, char out[40])
{
    out[0] = '\0';
    /* Range-check before converting: a hostile double must not overflow time_t. */
    if (!isfinite(t) || t < 946684800.0 || t > 32503680000.0) /* 2000 .. 3000 */
        return out;
    time_t s = (time_t)t;
    struct tm tm;
    if (gmtime_r(&s, &tm))
        strftime(out, 40, "%Y-%m-%d %H:%M:%S UTC", &tm);
    return out;
}

struct og_bytes og_shortfall(const struct og_dump *d)
{
    if (d->diag.shortfall_bytes.known && d->diag.present)
        return d->diag.shortfall_bytes;
    struct og_bytes r = d->event.requested_bytes, s = { 0 };
    if (r.known && d->device.free_bytes >= 0) {
        uint64_t f = (uint64_t)d->device.free_bytes;
        s = r.v >= f ? (struct og_bytes){ r.v - f, 1, 0 } : (struct og_bytes){ f - r.v, 1, 1 };
    }
    return s;
}

int64_t og_process_bytes(const struct og_dump *d)
{
    return d->mem.process_used_bytes >= 0 ? d->mem.process_used_bytes : d->mem.process_tracked_bytes;
}

const char *og_result_name(int64_t result)
{
    switch (result) {
    case 0:
        return "CUDA_SUCCESS";
    case 1:
        return "CUDA_ERROR_INVALID_VALUE";
    case 2:
        return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3:
        return "CUDA_ERROR_NOT_INITIALIZED";
    default:
        return NULL;
    }
}

static int64_t clamp0(int64_t v) { return v < 0 ? 0 : v; }

int64_t og_other_framework_bytes(const struct og_dump *d, const char **largest)
{
    int64_t sum = 0, most = 0;
    if (largest)
        *largest = NULL;
    for (int i = 0; i < d->mem.nlibs && d->framework_name; i++) {
        const struct og_lib *l = &d->mem.libs[i];
        if (!l->framework || !l->framework_name || strcmp(l->framework_name, d->framework_name) == 0 || l->bytes <= 0)
            continue;
        sum += l->bytes;
        if (largest && l->bytes > most) {
            most = l->bytes;
            *largest = l->framework_name;
        }
    }
    return sum;
}

/* the non-framework part: the contexts the process holds on the device where it made some of its own (each holds
 * memory of its own: memory.contexts_made, and the primary context when active) */
static const char *non_framework_label(const struct og_dump *d)
{
    static char label[80];
    if (d->mem.contexts_made <= 0)
        return "Non-framework (CUDA context, libraries)";
    int64_t n = d->mem.contexts_made + (d->mem.primary_context == 1 && d->mem.contexts_made < INT64_MAX);
    snprintf(label, sizeof label, "Non-framework (%" PRId64 " CUDA context%s, libraries)", n, n == 1 ? "" : "s");
    return label;
}

int og_breakdown(const struct og_dump *d, struct og_part *parts, int64_t *scale)
{
    int n = 0;
    int64_t sum = 0;
    const char *fw = og_framework_title(d->framework_name), *other_name;
    static char used_label[64], cached_label[64], other_label[80];
    snprintf(used_label, sizeof used_label, "%s in use", fw);
    snprintf(cached_label, sizeof cached_label, "%s cached, unused", fw);
    int64_t other = og_other_framework_bytes(d, &other_name);
    snprintf(other_label, sizeof other_label, "%s (another framework)", og_framework_title(other_name));

#define ADD(k, l, b)                                          \
    do {                                                      \
        parts[n++] = (struct og_part){ (k), (l), clamp0(b) }; \
        sum += clamp0(b);                                     \
    } while (0)

    int64_t fwb = d->mem.framework_bytes;
    if (fwb > 0) {
        if (other > fwb)
            other = fwb;
        int64_t own = fwb - other; /* this framework's libraries; another framework's apart */
        int64_t cached = d->mem.framework_cached_bytes > 0 ? d->mem.framework_cached_bytes : 0;
        if (cached > own)
            cached = own;
        ADD(P_FW_USED, used_label, own - cached);
        if (cached)
            ADD(P_FW_CACHED, cached_label, cached);
        if (other)
            ADD(P_OTHER_FW, other_label, other);
        if (d->mem.non_framework_bytes >= 0)
            ADD(P_NON_FW, non_framework_label(d), d->mem.non_framework_bytes);
        else if (d->mem.process_tracked_bytes > fwb)
            ADD(P_NON_FW, "Other libraries", d->mem.process_tracked_bytes - fwb);
    } else if (og_process_bytes(d) > 0) {
        ADD(P_PROCESS, "This process (context, libraries)", og_process_bytes(d));
    }
    if (d->mem.other_processes_bytes > 0)
        ADD(P_OTHER_PROCS, "Other processes", d->mem.other_processes_bytes);
    int64_t total = d->device.total_bytes;
    int64_t free_b = d->device.free_bytes;
    if (total > 0 && free_b >= 0 && total - free_b - sum > 0)
        ADD(P_UNACCOUNTED, "Unaccounted (driver, not measured)", total - free_b - sum);
    if (free_b >= 0)
        ADD(P_FREE, "Free", free_b);
#undef ADD
    *scale = total > 0 ? total : sum;
    return n;
}

void og_evidence_value(og_sb_t *b, const struct og_evidence *e, int html)
{
    const cJSON *v = e->value;
    /* "requested_bytes", "context_bytes_estimate": sizes, shown both ways. */
    int is_size = strstr(e->name, "bytes") != NULL;
    struct og_bytes n;
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        int integral = og_json_bytes(v, &n); /* exactly, up to 2^64-1 (a SIZE_MAX request) */
        if (integral && is_size) {
            char h[32], g[32];
            og_sb_printf(b, "%s%s (%s%s bytes)", n.neg ? "-" : "", human_bytes_u64(n.v, h), n.neg ? "-" : "",
                         group_digits_u64(n.v, g));
        } else if (integral) {
            og_sb_printf(b, "%s%" PRIu64, n.neg ? "-" : "", n.v);
        } else if (isfinite(x)) {
            og_sb_printf(b, "%.6g", x);
        } else {
            og_sb_puts(b, "(invalid number)");
        }
    } else if (cJSON_IsString(v)) {
        (html ? sb_html : sb_text)(b, v->valuestring, 300, 0);
    } else if (cJSON_IsBool(v)) {
        og_sb_puts(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        og_sb_puts(b, "null");
    } else {
        char *s = cJSON_PrintUnformatted(v);
        (html ? sb_html : sb_text)(b, s ? s : "(too large)", 200, 0);
        cJSON_free(s);
    }
}

int og_frames_python_only(const struct og_frame *frames, int n)
{
    struct og_sym *y = n > 0 ? calloc((size_t)n, sizeof *y) : NULL;
    if (!y)
        return 0;
    og_stack_symbolize(frames, n, y);
    int r = og_stack_python_only(y, n);
    free(y);
    return r;
}

int og_event_python_only(const struct og_dump *d) { return og_frames_python_only(d->event.stack, d->event.nstack); }

int og_python_job(const struct og_dump *d)
{
    if (d->event.npython_stack > 0 || d->npython_sites > 0)
        return 1;
    if (d->mem.framework && d->framework_name && strcmp(d->framework_name, "unknown"))
        return 1; /* a framework adapter reported: it runs in Python */
    return og_event_python_only(d);
}

const char *og_env_value(const struct og_dump *d, const char *key)
{
    for (int i = 0; i < d->nenv; i++)
        if (d->env[i].key && !strcmp(d->env[i].key, key))
            return d->env[i].value;
    return NULL;
}

int og_same_pyframe(const struct og_pyframe *a, const struct og_pyframe *b)
{
    return a == b || (a && b && a->file && b->file && !strcmp(a->file, b->file) && a->line == b->line);
}

const struct og_pyframe *og_phase_line(const struct og_dump *d)
{
    if (d->event.phase_site.file)
        return &d->event.phase_site;
    return d->event.phase_frame.file ? &d->event.phase_frame : NULL;
}

const struct og_pyframe *og_failing_python_line(const struct og_dump *d)
{
    for (int i = 0; i < d->event.npython_stack; i++)
        if (!og_python_file_not_program(d->event.python_stack[i].file))
            return &d->event.python_stack[i];
    /* only the framework's frames (PyTorch's autograd engine thread): the program's line that called it */
    if (d->event.phase_site.file)
        return &d->event.phase_site;
    return d->event.npython_stack > 0 ? &d->event.python_stack[0] : NULL;
}

/* "file:line in function" of a Python frame (the file's base name) */
static void pyframe_put(og_sb_t *b, const struct og_pyframe *f)
{
    const char *s = f->file ? strrchr(f->file, '/') : NULL;
    og_sb_printf(b, "%s:%lld in %s",
                 s         ? s + 1
                 : f->file ? f->file
                           : "?",
                 (long long)f->line, f->function ? f->function : "?");
}

static const char *nz(const char *s, const char *dflt) { return s && *s ? s : dflt; }

/* one model's dtype as the analysis reads it (common/model_dtypes.h); a count the dump left out (-1) is neither */
static bool model_float32(int64_t fp32, int64_t bytes)
{
    return fp32 > 0 && bytes > 0 && og_model_float32((uint64_t)fp32, (uint64_t)bytes);
}
static bool model_quantized(int64_t quant, int64_t bytes)
{
    return quant > 0 && bytes > 0 && og_model_quantized((uint64_t)quant, (uint64_t)bytes);
}

void og_roles_facts(const struct og_dump *d, og_fact_fn fn, void *ctx)
{
    const struct og_roles_view *r = &d->mem.roles;
    char a[32], c[32];
    og_sb_t b;
#define FACT(label)                \
    do {                           \
        if (b.len && !b.failed)    \
            fn(ctx, label, b.buf); \
        og_sb_free(&b);            \
    } while (0)
    if (r->present) {
        og_sb_init(&b);
        /* a model's dtype is said where the models differ, as the analysis reads them (common/model_dtypes.h): one
         * float32 beside one that is not, one quantized beside one that is not */
        bool f32 = false, other = false, quant = false, unquant = false;
        for (int i = 0; i < r->nmodels; i++) {
            const int64_t bytes = r->models[i].parameters_bytes;
            f32 = f32 || model_float32(r->models[i].float32_bytes, bytes);
            other = other || (r->models[i].float32_bytes >= 0 && r->models[i].float32_bytes < bytes);
            quant = quant || model_quantized(r->models[i].quantized_bytes, bytes);
            unquant = unquant || (r->models[i].quantized_bytes >= 0 && bytes > 0 &&
                                  !model_quantized(r->models[i].quantized_bytes, bytes));
        }
        for (int i = 0; i < r->nmodels; i++) {
            og_sb_printf(&b, "%s%s: %s of parameters", i ? "; " : "", nz(r->models[i].cls, "?"),
                         r->models[i].parameters_bytes >= 0 ? human_bytes(r->models[i].parameters_bytes, a) : "?");
            if (r->models[i].tensors >= 0)
                og_sb_printf(&b, " in %s tensor%s", group_digits(r->models[i].tensors, c),
                             r->models[i].tensors == 1 ? "" : "s");
            if (r->models[i].elsewhere_bytes > 0) /* the rest of a model a load is moving here */
                og_sb_printf(&b, " (%s more off this GPU)", human_bytes(r->models[i].elsewhere_bytes, a));
            if (f32 && other && r->models[i].float32_bytes >= 0)
                og_sb_puts(&b, model_float32(r->models[i].float32_bytes, r->models[i].parameters_bytes) ? ", float32"
                               : r->models[i].float32_bytes == 0                                        ? ", no float32"
                                                                 : ", partly float32");
            if (quant && unquant && model_quantized(r->models[i].quantized_bytes, r->models[i].parameters_bytes))
                og_sb_puts(&b, ", quantized (8 bits or fewer)");
            if (r->models[i].count > 1)
                og_sb_printf(&b, ", %lld copies", (long long)r->models[i].count);
            if (r->models[i].frozen == 1)
                og_sb_puts(&b, ", frozen");
            else if (r->models[i].trained == 0)
                og_sb_puts(&b, ", requires grad but no optimizer trains it");
            else if (r->models[i].trained > 0 && r->models[i].stepped == 0 && r->optimizer_steps > 0)
                og_sb_puts(&b, ", its optimizer keeps no state for it"); /* steps ended: a stateless SGD */
            else if (r->models[i].trained > 0 && r->models[i].stepped == 0)
                og_sb_puts(&b, ", its optimizer has not stepped yet");
        }
        FACT("models");
        og_sb_init(&b);
        for (int i = 0; i < r->ndtypes; i++) {
            og_sb_printf(&b, "%s%s %s", i ? ", " : "", nz(r->dtypes[i].dtype, "?"),
                         r->dtypes[i].bytes >= 0 ? human_bytes(r->dtypes[i].bytes, a) : "?");
            if (r->dtypes[i].tensors >= 0)
                og_sb_printf(&b, " (%s tensor%s)", group_digits(r->dtypes[i].tensors, c),
                             r->dtypes[i].tensors == 1 ? "" : "s");
        }
        FACT("parameters by dtype");
        og_sb_init(&b);
        if (r->lora_parameters_bytes >= 0) {
            og_sb_printf(&b, "%s of adapter parameters", human_bytes(r->lora_parameters_bytes, a));
            if (r->lora_base_trainable_bytes > 0)
                og_sb_printf(&b, "; other weights require grad too: %s (the base not frozen)",
                             human_bytes(r->lora_base_trainable_bytes, c));
            else if (r->lora_base_trainable_bytes == 0)
                og_sb_puts(&b, "; the other weights frozen");
        }
        FACT("LoRA");
        og_sb_init(&b);
        if (r->embedding_parameters_bytes > 0) /* a recommender's tables: their rows, not the network, are the model */
            og_sb_printf(&b, "%s of the parameters are embedding tables",
                         human_bytes(r->embedding_parameters_bytes, a));
        if (r->embedding_parameters_bytes > 0 && r->embedding_tables > 0)
            og_sb_printf(&b, " (%lld %s)", (long long)r->embedding_tables,
                         r->embedding_tables == 1 ? "table" : "tables");
        FACT("embeddings");
        og_sb_init(&b);
        if (r->statement.at.file) {
            pyframe_put(&b, &r->statement.at);
            if (r->statement.target)
                og_sb_printf(&b, ": %s = ...", r->statement.target);
            for (int i = 0; i < r->statement.nnames; i++)
                og_sb_printf(&b, "%s%s", i ? ", " : "; reads ", nz(r->statement.names[i], "?"));
            for (int i = 0; i < r->statement.nints; i++)
                og_sb_printf(&b, "%s%lld", i ? " x " : "; sizes ", (long long)r->statement.ints[i]);
            if (r->statement.purpose)
                og_sb_printf(&b, "; kept as %s", r->statement.purpose);
        }
        FACT("failing statement");
        og_sb_init(&b);
        if (r->accumulating.at.file) {
            pyframe_put(&b, &r->accumulating.at);
            og_sb_printf(&b, ": %s sums %s with its graph alive (each pass's graph stays until backward)",
                         nz(r->accumulating.target, "?"), nz(r->accumulating.operand, "?"));
        }
        FACT("accumulating");
        static const char *const setting_text[] = {
#define OG_CODE_SETTING(key, text) text,
#include "../common/code_settings.def"
#undef OG_CODE_SETTING
        };
        for (int i = 0; i < OG_DUMP_NSETTINGS; i++) {
            og_sb_init(&b);
            if (r->settings[i].at.file) {
                pyframe_put(&b, &r->settings[i].at);
                og_sb_printf(&b, ": %s%s%s%s", setting_text[i], r->settings[i].key ? " (" : "",
                             r->settings[i].key ? r->settings[i].key : "", r->settings[i].key ? ")" : "");
            }
            FACT("code setting");
        }
        og_sb_init(&b);
        if (r->activations_copy_of.role) {
            og_sb_printf(&b, "a copy of the %s being made", r->activations_copy_of.role);
            if (r->activations_copy_of.bytes >= 0)
                og_sb_printf(&b, ", %s so far", human_bytes(r->activations_copy_of.bytes, a));
        }
        FACT("among the activations");
        og_sb_init(&b);
        if (r->has_after_steps && r->nafter_steps) {
            int from = r->nafter_steps > 6 ? r->nafter_steps - 6 : 0;
            og_sb_printf(&b, "after the last %d steps", r->nafter_steps);
            if (r->optimizer_steps >= 0)
                og_sb_printf(&b, " of %s", group_digits(r->optimizer_steps, c));
            /* whether the series spans the device's whole run: no other optimizer stepped there, or how many did */
            if (r->optimizer_steps_on_device >= 0 && r->optimizer_steps_on_device == r->optimizer_steps)
                og_sb_puts(&b, " (every step on this device)");
            else if (r->optimizer_steps_on_device >= 0)
                og_sb_printf(&b, " (%s by every optimizer on this device)",
                             group_digits(r->optimizer_steps_on_device, c));
            og_sb_puts(&b, ":");
            if (from)
                og_sb_puts(&b, " ...");
            for (int i = from; i < r->nafter_steps; i++)
                og_sb_printf(&b, "%s %s", i > from ? "," : "", human_bytes(r->after_steps[i], a));
            int64_t rise = r->after_steps[r->nafter_steps - 1] - r->after_steps[0];
            if (r->nafter_steps > 1)
                og_sb_printf(&b, " (%s %s)", rise >= 0 ? "up" : "down", human_bytes(rise >= 0 ? rise : -rise, a));
        } else if (r->optimizer_steps > 0) {
            og_sb_printf(&b, "%s optimizer steps", group_digits(r->optimizer_steps, c));
        } else if (r->optimizer_steps == 0 && r->noptimizers > 0) {
            og_sb_puts(&b, "before the first optimizer step (none made yet)"); /* a measured zero */
        }
        FACT("allocated");
        og_sb_init(&b);
        if (r->nover_run > 1 && r->over_run_every > 0) {
            /* the run's series: its first and last points and its lowest and highest */
            int64_t lo = r->over_run[0], hi = r->over_run[0];
            for (int i = 1; i < r->nover_run; i++) {
                lo = r->over_run[i] < lo ? r->over_run[i] : lo;
                hi = r->over_run[i] > hi ? r->over_run[i] : hi;
            }
            char first[32], last[32], low[32], high[32];
            og_sb_printf(&b, "every %s steps: %s first, %s last (lowest %s, highest %s)",
                         group_digits(r->over_run_every, c), human_bytes(r->over_run[0], first),
                         human_bytes(r->over_run[r->nover_run - 1], last), human_bytes(lo, low), human_bytes(hi, high));
        }
        FACT("allocated over the run");
        og_sb_init(&b);
        if (isfinite(r->last_step_ms_ago))
            og_sb_printf(&b, "ended %.3f s before the report", r->last_step_ms_ago / 1000.0);
        FACT("last optimizer step");
        og_sb_init(&b);
        if (r->num_beams > 0)
            og_sb_printf(&b, "%lld", (long long)r->num_beams);
        FACT("beam width");
        og_sb_init(&b);
        if (r->generation_input.ndims > 0) {
            og_sb_printf(&b, "%s ", r->generation_input.name ? r->generation_input.name : "a tensor");
            for (int i = 0; i < r->generation_input.ndims; i++)
                og_sb_printf(&b, "%s%lld", i ? "x" : "", (long long)r->generation_input.shape[i]);
            og_sb_printf(&b, ": %lld inputs at once", (long long)r->generation_input.shape[0]);
        }
        FACT("generation input");
        og_sb_init(&b);
        if (r->attention_modules > 0)
            og_sb_printf(&b, "%lld layers in the models", (long long)r->attention_modules);
        else if (r->attention_modules == 0)
            og_sb_puts(&b, "none in the models (no layer named or built as attention)");
        FACT("attention");
        og_sb_init(&b);
        if (r->batch_size > 0)
            og_sb_printf(&b, "%lld, as the program names it", (long long)r->batch_size);
        FACT("batch size");
        og_sb_init(&b);
        if (r->failing_layer.count > 0)
            og_sb_printf(&b, "layer %lld of %lld in %s", (long long)r->failing_layer.index + 1,
                         (long long)r->failing_layer.count,
                         r->failing_layer.run ? r->failing_layer.run : "a run of like layers");
        if (r->failing_layer.count > 0 && r->failing_layer.alike == 0)
            og_sb_puts(&b, " (its layers differ in size: the layers to come are not projected)");
        FACT("failing layer");
        og_sb_init(&b);
        for (int i = 0; i < r->nchildren; i++)
            if (r->children[i].name)
                og_sb_printf(&b, "%spid %lld, named \"%s\" by the code that started it", i ? "; " : "",
                             (long long)r->children[i].pid, r->children[i].name);
            else
                og_sb_printf(&b, "%spid %lld, under multiprocessing's default name (a DataLoader worker keeps it)",
                             i ? "; " : "", (long long)r->children[i].pid);
        if (r->children_read && !r->nchildren)
            og_sb_puts(&b, "none alive in multiprocessing's record");
        FACT("child processes");
        og_sb_init(&b);
        if (r->statement_model_device >= 0)
            og_sb_printf(&b, "%s is on GPU %lld, not the failing GPU: the statement makes its tensor away from it",
                         r->statement_model ? r->statement_model : "the model it reads",
                         (long long)r->statement_model_device);
        FACT("statement's model");
        og_sb_init(&b);
        if (r->gradient_checkpointing == 1)
            og_sb_puts(&b, "on for the layer that failed");
        else if (r->gradient_checkpointing == 0)
            og_sb_puts(&b, "off: the layer that failed keeps every activation for backward");
        FACT("activation checkpointing");
        og_sb_init(&b);
        if (r->autocast_in_code == 1)
            og_sb_puts(&b, "the running code enters torch.autocast");
        if (r->scaler_without_autocast == 1) /* the adapter says one or the other; a dump is read as it is */
            og_sb_printf(&b, "%sa GradScaler, but the program never enters autocast: its passes run in float32",
                         r->autocast_in_code == 1 ? "; " : "");
        FACT("mixed precision");
        og_sb_init(&b);
        if (r->backward_in_code == 1) /* a training step though no optimizer of torch's has stepped yet */
            og_sb_puts(&b, "the running code calls backward(): a training step");
        if (r->input_requires_grad == 1) /* the gradient of the input is what the pass is for */
            og_sb_printf(&b, "%sthe model's input requires grad: the program asks for the gradient of its input",
                         r->backward_in_code == 1 ? "; " : "");
        if (r->backward_on_stack == 0) /* read, and no frame calls it: unless the input's gradient is asked for, this
                                          pass feeds no backward */
            og_sb_printf(&b, "%sno frame of the failing stack calls backward (nor autograd.grad)%s",
                         r->backward_in_code == 1 || r->input_requires_grad == 1 ? "; " : "",
                         r->input_requires_grad == 1 ? "" : ": this pass feeds none");
        FACT("backward");
        og_sb_init(&b);
        if (r->operation.name) {
            og_sb_puts(&b, r->operation.name);
            if (r->operation.frame.file) {
                og_sb_puts(&b, " at ");
                pyframe_put(&b, &r->operation.frame);
            }
            if (r->operation.argument)
                og_sb_printf(&b, ", called with %s", r->operation.argument);
        }
        FACT("failing operation");
        og_sb_init(&b);
        if (r->copy_made_bytes >= 0)
            og_sb_printf(&b, "%s made so far by the copy.deepcopy running at the failure",
                         human_bytes(r->copy_made_bytes, a));
        FACT("copy under way");
        og_sb_init(&b);
        if (r->ddp.present) {
            og_sb_printf(&b, "%lld wrapper%s", (long long)r->ddp.wrappers, r->ddp.wrappers == 1 ? "" : "s");
            if (r->ddp.as_view == 0)
                og_sb_puts(&b, " without gradient_as_bucket_view");
            if (r->ddp.bucket_bytes >= 0)
                og_sb_printf(&b, ": a %s bucket copy of the gradients", human_bytes(r->ddp.bucket_bytes, a));
        }
        FACT("DistributedDataParallel");
        og_sb_init(&b);
        if (r->objects_scanned >= 0)
            og_sb_printf(&b, "%s Python objects", group_digits(r->objects_scanned, c));
        if (isfinite(r->elapsed_ms))
            og_sb_printf(&b, "%s%.1f ms", b.len ? " in " : "", r->elapsed_ms);
        if (r->read_in_part > 0)
            og_sb_printf(&b, "%s%s large containers read in part", b.len ? ", " : "", group_digits(r->read_in_part, c));
        if (r->complete == 1)
            og_sb_puts(&b, b.len ? ", complete" : "complete");
        else if (r->complete == 0)
            og_sb_puts(&b, b.len ? ", stopped at its budget (the later roles are lower bounds)"
                                 : "stopped at its budget (the later roles are lower bounds)");
        FACT("the scan");
    }
    og_sb_init(&b);
    for (int i = 0; i < d->mem.nother_fw; i++) {
        const struct og_other_fw_view *o = &d->mem.other_fw[i];
        og_sb_printf(&b, "%s%s reserves %s", i ? "; " : "", nz(o->framework, "?"),
                     o->reserved_bytes >= 0 ? human_bytes(o->reserved_bytes, a) : "?");
        if (o->in_use_bytes >= 0)
            og_sb_printf(&b, ", %s in use", human_bytes(o->in_use_bytes, a));
        if (o->limit_bytes >= 0)
            og_sb_printf(&b, ", limit %s", human_bytes(o->limit_bytes, a));
    }
    FACT("other frameworks on this device");
#undef FACT
}
