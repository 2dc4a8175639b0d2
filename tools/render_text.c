/* tools/render_text.c — the terminal report. */
#include "human.h" /* OG_NOT_ENOUGH_ALONE */
#include "report.h"
#include "symbolize.h"
#include "version.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_TOP_SITES 10
#define TEXT_FRAMES    6
#define BAR_WIDTH      28

struct tx {
    og_sb_t *b;
    int color;
};

/* ANSI styles; empty strings when colour is off. */
static const char *st(const struct tx *t, const char *code) { return t->color ? code : ""; }
#define BOLD   "\033[1m"
#define DIM    "\033[2m"
#define RED    "\033[31m"
#define GREEN  "\033[32m"
#define YELLOW "\033[33m"
#define CYAN   "\033[36m"
#define RESET  "\033[0m"

static void heading(struct tx *t, const char *title)
{
    og_sb_printf(t->b, "\n%s%s%s\n", st(t, BOLD), title, st(t, RESET));
}

/* Untrusted text padded to `width` display columns. */
static void cell(struct tx *t, const char *s, size_t max, int width)
{
    sb_text(t->b, s ? s : "-", max, 0);
    int w = (int)text_width(s ? s : "-", max);
    for (int i = w; i < width; i++)
        og_sb_putc(t->b, ' ');
}

static void bar(struct tx *t, double frac, const char *style)
{
    static const char *const eighth[] = { "", "\u258f", "\u258e", "\u258d", "\u258c", "\u258b", "\u258a", "\u2589" };
    if (!(frac > 0))
        return;
    if (frac > 1)
        frac = 1;
    int units = (int)lround(frac * BAR_WIDTH * 8);
    if (units == 0)
        units = 1; /* visible even when tiny */
    og_sb_puts(t->b, st(t, style));
    for (int i = 0; i < units / 8; i++)
        og_sb_puts(t->b, "\u2588");
    og_sb_puts(t->b, eighth[units % 8]);
    og_sb_puts(t->b, st(t, RESET));
}

static void headline(struct tx *t, const struct og_dump *d)
{
    char h1[32], h2[32], h3[32];
    const char *color = d->status == OG_ST_OOM         ? RED
                        : d->status == OG_ST_RECOVERED ? GREEN
                        : d->status == OG_ST_WARNING   ? YELLOW
                                                       : CYAN;
    og_sb_printf(t->b, "%s%s%s%s", st(t, BOLD), st(t, color), og_status_title(d), st(t, RESET));
    if (d->device.index >= 0 || d->event.device >= 0) {
        og_sb_printf(t->b, "%s on GPU %lld", st(t, BOLD),
                     (long long)(d->event.device >= 0 ? d->event.device : d->device.index));
        if (d->device.name) {
            og_sb_puts(t->b, " (");
            sb_text(t->b, d->device.name, 80, 0);
            og_sb_puts(t->b, ")");
        }
        og_sb_puts(t->b, st(t, RESET));
    }
    if (d->status_str && d->status == OG_ST_OTHER) {
        og_sb_puts(t->b, " — status ");
        sb_text(t->b, d->status_str, 40, 0);
    }
    og_sb_putc(t->b, '\n');

    /* a failure whose size an adapter did not give (null) is still a failure: said "of a size not given" */
    bool failed = d->status == OG_ST_OOM || d->status == OG_ST_RECOVERED;
    if (d->event.present && (d->event.requested_bytes.known || failed)) {
        og_sb_puts(t->b, "  ");
        sb_text(t->b, d->event.api ? d->event.api : "allocation", 60, 0);
        if (d->event.requested_bytes.known)
            og_sb_printf(t->b, " of %s%s%s", st(t, BOLD), human_bytes_u64(d->event.requested_bytes.v, h1),
                         st(t, RESET));
        else
            og_sb_puts(t->b, " of a size not given");
        if (d->event.requested_bytes.known &&
            d->event.requested_bytes.v >= 1ull << 50) { /* past any device: the exact number says more */
            char g[32];
            og_sb_printf(t->b, " (%s bytes)", group_digits_u64(d->event.requested_bytes.v, g));
        }
        if (d->status == OG_ST_RECOVERED) {
            og_sb_puts(t->b, " failed, then succeeded");
            if (d->event.released_between_attempts_bytes > 0)
                og_sb_printf(t->b, " after the framework released %s",
                             human_bytes(d->event.released_between_attempts_bytes, h2));
        } else {
            og_sb_puts(t->b, d->status == OG_ST_OOM ? " failed" : " requested");
            if (d->device.free_bytes >= 0) {
                og_sb_printf(t->b, ": %s free", human_bytes(d->device.free_bytes, h2));
                if (d->device.total_bytes > 0)
                    og_sb_printf(t->b, " of %s", human_bytes(d->device.total_bytes, h3));
            }
            if (d->device.limit_bytes >= 0)
                og_sb_printf(t->b, " (OOMGUARD_LIMIT %s)", human_bytes(d->device.limit_bytes, h3));
            struct og_bytes sf = og_shortfall(d);
            if (sf.known && !sf.neg && sf.v > 0)
                og_sb_printf(t->b, " — %s%s %s%s", st(t, RED), human_bytes_u64(sf.v, h3),
                             d->event.caused_by_limit == 1 ? "over the limit" : "short", st(t, RESET));
            else if (sf.known && d->status == OG_ST_OOM)
                og_sb_puts(t->b, " — enough in total, but not in one piece");
            else if (!sf.known && d->status == OG_ST_OOM && d->diag.present)
                og_sb_puts(t->b, d->event.requested_bytes.known ? " — shortfall unknown (free memory not measured)"
                                                                : " — shortfall unknown (request size not given)");
        }
        og_sb_putc(t->b, '\n');
    } else if (d->status != OG_ST_EXIT && og_process_bytes(d) >= 0) {
        og_sb_printf(t->b, "  this process holds %s%s%s", st(t, BOLD), human_bytes(og_process_bytes(d), h1),
                     st(t, RESET));
        if (d->device.total_bytes > 0)
            og_sb_printf(t->b, " of %s (%.0f%%)", human_bytes(d->device.total_bytes, h2),
                         100.0 * (double)og_process_bytes(d) / (double)d->device.total_bytes);
        if (d->device.free_bytes >= 0)
            og_sb_printf(t->b, "; %s free", human_bytes(d->device.free_bytes, h3));
        og_sb_putc(t->b, '\n');
    } else if (d->status == OG_ST_EXIT) {
        for (int i = 0; i < d->ndevsum; i++)
            if (d->devsum[i].peak_bytes >= 0)
                og_sb_printf(t->b, "  GPU %lld peaked at %s%s%s\n", (long long)d->devsum[i].index, st(t, BOLD),
                             human_bytes(d->devsum[i].peak_bytes, h1), st(t, RESET));
    }
    const struct og_cause *c = og_primary_cause(d);
    if (c) {
        const char *title = og_cause_title(c->id);
        og_sb_printf(t->b, "  %sDiagnosis:%s ", st(t, BOLD), st(t, RESET));
        if (title)
            og_sb_puts(t->b, title);
        else
            sb_text(t->b, c->id, 40, 0);
        og_sb_printf(t->b, " %s(", st(t, DIM));
        sb_text(t->b, c->id ? c->id : "?", 40, 0);
        if (isfinite(c->confidence))
            og_sb_printf(t->b, ", confidence %.0f%%", fmin(fmax(c->confidence, 0), 1) * 100);
        og_sb_printf(t->b, ")%s", st(t, RESET));
        og_sb_putc(t->b, '\n');
    }
}

static void facts(struct tx *t, const struct og_dump *d)
{
    char h[32], tm[40];
    og_sb_putc(t->b, '\n');
    og_sb_puts(t->b, "  process    ");
    if (d->pid >= 0)
        og_sb_printf(t->b, "pid %lld", (long long)d->pid);
    if (d->host) {
        og_sb_puts(t->b, " on ");
        sb_text(t->b, d->host, 80, 0);
    }
    if (d->rank >= 0) {
        og_sb_printf(t->b, ", rank %lld", (long long)d->rank);
        if (d->world_size >= 0)
            og_sb_printf(t->b, " of %lld", (long long)d->world_size);
    }
    if (d->job_id) {
        og_sb_puts(t->b, ", job ");
        sb_text(t->b, d->job_id, 80, 0);
    }
    og_sb_putc(t->b, '\n');
    if (d->cmdline) {
        og_sb_puts(t->b, "  command    ");
        sb_text(t->b, d->cmdline, 160, 0);
        og_sb_putc(t->b, '\n');
    }
    if (d->framework_name) {
        og_sb_printf(t->b, "  framework  %s", og_framework_title(d->framework_name));
        if (!strcmp(og_framework_title(d->framework_name), "Framework")) {
            og_sb_puts(t->b, " ");
            sb_text(t->b, d->framework_name, 40, 0);
        }
        og_sb_putc(t->b, '\n');
    }
    double when = d->event.present && isfinite(d->event.t) ? d->event.t : d->time;
    og_format_time(when, tm);
    if (tm[0] || isfinite(d->event.t_rel)) {
        og_sb_puts(t->b, "  when       ");
        og_sb_puts(t->b, tm);
        if (isfinite(d->event.t_rel))
            og_sb_printf(t->b, "%s%.1f s after the process started", tm[0] ? ", " : "", d->event.t_rel);
        og_sb_putc(t->b, '\n');
    }
    if (d->event.present) {
        og_sb_puts(t->b, "  call       ");
        sb_text(t->b, d->event.api ? d->event.api : "?", 60, 0);
        if (d->event.driver_api) {
            og_sb_puts(t->b, " -> ");
            sb_text(t->b, d->event.driver_api, 60, 0);
        }
        if (d->event.library) {
            og_sb_puts(t->b, og_event_python_only(d) ? " from Python code via " : " from ");
            sb_text(t->b, d->event.library, 80, 0);
        }
        if (d->event.result >= 0) {
            const char *rn = og_result_name(d->event.result);
            og_sb_printf(t->b, ", result %lld%s%s%s", (long long)d->event.result, rn ? " (" : "", rn ? rn : "",
                         rn ? ")" : "");
        }
        if (d->event.stream_ordered == 1)
            og_sb_puts(t->b, ", stream-ordered");
        og_sb_putc(t->b, '\n');
        if (d->event.attempts > 1 || d->event.released_between_attempts_bytes > 0) {
            og_sb_printf(t->b, "  attempts   %lld", (long long)(d->event.attempts >= 0 ? d->event.attempts : 1));
            if (d->event.released_between_attempts_bytes >= 0)
                og_sb_printf(t->b, ", %s released by the framework between them",
                             human_bytes(d->event.released_between_attempts_bytes, h));
            og_sb_putc(t->b, '\n');
        }
    }
}

static void where(struct tx *t, const struct og_dump *d)
{
    struct og_part parts[P_NPARTS];
    int64_t scale;
    int n = og_breakdown(d, parts, &scale);
    if (!n)
        return;
    char h[32], title[96];
    if (d->device.total_bytes > 0)
        snprintf(title, sizeof title, "Where the memory is (GPU %lld, %s)",
                 (long long)(d->device.index >= 0 ? d->device.index : 0), human_bytes(d->device.total_bytes, h));
    else
        snprintf(title, sizeof title, "Where the memory is");
    heading(t, title);
    int w = 40; /* the labels' column: as wide as the longest (a process's contexts counted), up to 60 */
    for (int i = 0; i < n; i++) {
        int l = (int)text_width(parts[i].label, 60);
        w = l > w ? (l < 60 ? l : 60) : w;
    }
    for (int i = 0; i < n; i++) {
        const char *style = parts[i].kind == P_FREE          ? GREEN
                            : parts[i].kind == P_OTHER_PROCS ? YELLOW
                            : parts[i].kind == P_UNACCOUNTED ? DIM
                                                             : CYAN;
        og_sb_puts(t->b, "  ");
        cell(t, parts[i].label, 60, w);
        og_sb_printf(t->b, "%12s", human_bytes(parts[i].bytes, h));
        if (scale > 0)
            og_sb_printf(t->b, "  %5.1f%%  ", 100.0 * (double)parts[i].bytes / (double)scale);
        bar(t, scale > 0 ? (double)parts[i].bytes / (double)scale : 0, style);
        og_sb_putc(t->b, '\n');
    }
    if (d->event.present && d->event.requested_bytes.known) {
        double req = (double)d->event.requested_bytes.v;
        og_sb_puts(t->b, "  ");
        og_sb_repeat(t->b, "\u2500", w + 12);
        og_sb_putc(t->b, '\n');
        og_sb_puts(t->b, "  ");
        cell(t, d->status == OG_ST_RECOVERED ? "Requested (succeeded on retry)" : "Requested", 60, w);
        og_sb_printf(t->b, "%12s", human_bytes_u64(d->event.requested_bytes.v, h));
        if (scale > 0 && req / (double)scale < 1e3)
            og_sb_printf(t->b, "  %5.1f%%  ", 100.0 * req / (double)scale);
        else if (scale > 0) /* a request no device holds ("7e+10%"): the columns stay */
            og_sb_printf(t->b, "  %5.0e%%  ", 100.0 * req / (double)scale);
        bar(t, scale > 0 ? req / (double)scale : 0, RED);
        og_sb_putc(t->b, '\n');
    }
    /* The framework adapter's own numbers. */
    const cJSON *fw = d->mem.framework, *x;
    if (fw) {
        int first = 1;
        cJSON_ArrayForEach(x, fw)
        {
            size_t kl = x->string ? strlen(x->string) : 0;
            if (kl <= 6 || strcmp(x->string + kl - 6, "_bytes") || !cJSON_IsNumber(x))
                continue;
            if (first)
                og_sb_printf(t->b, "\n  %s allocator:", og_framework_title(d->framework_name));
            og_sb_puts(t->b, first ? " " : ", ");
            first = 0;
            char key[48];
            snprintf(key, sizeof key, "%.*s", (int)(kl - 6 > 40 ? 40 : kl - 6), x->string);
            sb_text(t->b, key, 40, 0); /* keys come from the dump too */
            struct og_bytes v;
            og_sb_printf(t->b, " %s", og_json_bytes(x, &v) && !v.neg ? human_bytes_u64(v.v, h) : "?");
        }
        if (!first)
            og_sb_putc(t->b, '\n');
        /* the modes in force at the failure, as the adapter saw them (null: not known, not shown) */
        static const struct {
            const char *key, *on, *off;
        } modes[] = {
            { "grad_enabled", "autograd on", "autograd off" },
            { "training", "training (optimizer steps ran)", "inference only" },
            { "autocast", "autocast (mixed precision) on", "autocast off" },
        };
        int nmodes = 0;
        for (size_t k = 0; k < sizeof modes / sizeof *modes; k++) {
            const cJSON *mode = cJSON_GetObjectItemCaseSensitive(fw, modes[k].key);
            if (!cJSON_IsBool(mode))
                continue;
            og_sb_puts(t->b, nmodes++ ? ", " : "  at the failure: ");
            og_sb_puts(t->b, cJSON_IsTrue(mode) ? modes[k].on : modes[k].off);
        }
        if (nmodes)
            og_sb_putc(t->b, '\n');
        /* The two views side by side: what the framework says it reserved, and what the shim
         * counted at the driver from the framework's libraries. */
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(fw, "reserved_bytes");
        const cJSON *alc = cJSON_GetObjectItemCaseSensitive(fw, "allocated_bytes");
        const cJSON *rsrc = cJSON_GetObjectItemCaseSensitive(fw, "reserved_source");
        struct og_bytes rv, av;
        if (cJSON_IsString(rsrc) && !strcmp(rsrc->valuestring, "ledger")) /* one view: the ledger's */
            og_sb_printf(t->b, "  %s publishes no reservation: oomguard counted it at the driver from its libraries\n",
                         og_framework_title(d->framework_name));
        else if (og_json_bytes(res, &rv) && !rv.neg && rv.v <= INT64_MAX && d->mem.framework_bytes >= 0) {
            char a[32], b2[32], c[32];
            /* its own libraries: another framework's in the same process are not its view */
            int64_t own = d->mem.framework_bytes - og_other_framework_bytes(d, NULL);
            int64_t r = (int64_t)rv.v, diff = own - r;
            og_sb_printf(t->b, "  two views: %s reserved %s; oomguard counted %s at the driver from its libraries",
                         og_framework_title(d->framework_name), human_bytes(r, a), human_bytes(own, b2));
            if (diff == 0)
                og_sb_puts(t->b, " (they agree)\n");
            else
                og_sb_printf(t->b, " (%s %s: %s)\n", human_bytes(diff < 0 ? -diff : diff, c),
                             diff > 0 ? "more" : "less",
                             diff > 0 ? "memory its libraries took outside its allocator, e.g. workspaces"
                                      : "segments not attributed to its libraries, or released since");
            if (og_json_bytes(alc, &av) && !av.neg && av.v <= INT64_MAX)
                og_sb_printf(t->b, "  in tensors %s, cached but unused %s\n", human_bytes((int64_t)av.v, a),
                             human_bytes(r - (int64_t)av.v, b2));
        }
    }
}

static void others(struct tx *t, const struct og_dump *d)
{
    if (!d->mem.nprocs)
        return;
    char h[32];
    heading(t, "Other processes on this GPU");
    og_sb_printf(t->b, "  %s%-10s %-40s %12s%s\n", st(t, DIM), "pid", "name", "memory", st(t, RESET));
    int shown = d->mem.nprocs < 20 ? d->mem.nprocs : 20;
    for (int i = 0; i < shown; i++) {
        const struct og_proc *p = &d->mem.procs[i];
        og_sb_printf(t->b, "  %-10lld ", (long long)p->pid);
        cell(t, p->name, 38, 40);
        og_sb_printf(t->b, " %12s\n", human_bytes(p->bytes, h));
    }
    if (d->mem.nprocs > shown)
        og_sb_printf(t->b, "  ... and %d more\n", d->mem.nprocs - shown);
}

static void causes(struct tx *t, const struct og_dump *d)
{
    if (!d->diag.ncauses)
        return;
    heading(t, "Diagnosis");
    for (int i = 0; i < d->diag.ncauses; i++) {
        const struct og_cause *c = &d->diag.causes[i];
        og_sb_printf(t->b, "  %d. %s", i + 1, st(t, BOLD));
        sb_text(t->b, c->id ? c->id : "?", 40, 0);
        og_sb_puts(t->b, st(t, RESET));
        if (isfinite(c->confidence))
            og_sb_printf(t->b, "  %.0f%%", fmin(fmax(c->confidence, 0), 1) * 100);
        const char *title = og_cause_title(c->id);
        if (title)
            og_sb_printf(t->b, "  %s%s%s", st(t, DIM), title, st(t, RESET));
        og_sb_putc(t->b, '\n');
        if (c->summary) {
            og_sb_puts(t->b, "     ");
            sb_text(t->b, c->summary, 600, 0);
            og_sb_putc(t->b, '\n');
        }
        int shown = c->nevidence < 12 ? c->nevidence : 12;
        for (int j = 0; j < shown; j++) {
            og_sb_puts(t->b, "       ");
            og_sb_puts(t->b, st(t, DIM));
            cell(t, c->evidence[j].name, 40, 32);
            og_sb_puts(t->b, st(t, RESET));
            og_sb_putc(t->b, ' ');
            og_evidence_value(t->b, &c->evidence[j], 0);
            og_sb_putc(t->b, '\n');
        }
        if (c->nevidence > shown)
            og_sb_printf(t->b, "       ... and %d more\n", c->nevidence - shown);
    }
}

static void remedies(struct tx *t, const struct og_dump *d)
{
    if (!d->nremedies)
        return;
    heading(t, "What to do (best first)");
    int folded = 0;
    for (int i = 0; i < d->nremedies; i++) {
        const struct og_remedy *r = &d->remedies[i];
        if (!og_remedy_shown(d, i)) {
            folded++;
            continue;
        }
        og_sb_printf(t->b, "  %lld. %s", (long long)(r->rank >= 0 ? r->rank : i + 1), st(t, BOLD));
        sb_text(t->b, r->title ? r->title : r->id ? r->id : "?", 120, 0);
        og_sb_puts(t->b, st(t, RESET));
        if (r->id) {
            og_sb_printf(t->b, " %s[", st(t, DIM));
            sb_text(t->b, r->id, 40, 0);
            og_sb_printf(t->b, "]%s", st(t, RESET));
        }
        og_sb_putc(t->b, '\n');
        if (r->saving || r->cost) {
            og_sb_puts(t->b, "     ");
            if (r->saving) {
                og_sb_printf(t->b, "%ssaves%s ", st(t, GREEN), st(t, RESET));
                sb_text(t->b, r->saving, OG_REMEDY_FIELD_MAX, 0);
            }
            if (r->cost) {
                og_sb_puts(t->b, r->saving ? "; " : "");
                og_sb_printf(t->b, "%scost%s ", st(t, YELLOW), st(t, RESET));
                sb_text(t->b, r->cost, OG_REMEDY_FIELD_MAX, 0);
            }
            og_sb_putc(t->b, '\n');
        }
        if (r->why) {
            og_sb_puts(t->b, "     ");
            sb_text(t->b, r->why, OG_REMEDY_WHY_MAX, 0);
            og_sb_putc(t->b, '\n');
        }
        int nh = r->nhow < 12 ? r->nhow : 12;
        for (int j = 0; j < nh; j++) {
            og_sb_printf(t->b, "       %s|%s ", st(t, DIM), st(t, RESET));
            sb_text(t->b, r->how[j], 200, 0);
            og_sb_putc(t->b, '\n');
        }
    }
    if (!folded)
        return;
    og_sb_printf(t->b, "  %sAlso possible%s\n", st(t, DIM), st(t, RESET)); /* one line each */
    for (int i = 0, n = 0; i < d->nremedies && n < 30; i++) {
        const struct og_remedy *r = &d->remedies[i];
        if (og_remedy_shown(d, i))
            continue;
        n++;
        og_sb_printf(t->b, "  %lld. ", (long long)(r->rank >= 0 ? r->rank : i + 1));
        sb_text(t->b, r->title ? r->title : r->id ? r->id : "?", 120, 0);
        if (r->id) {
            og_sb_printf(t->b, " %s[", st(t, DIM));
            sb_text(t->b, r->id, 40, 0);
            og_sb_printf(t->b, "]%s", st(t, RESET));
        }
        og_sb_printf(t->b, "%s\n", r->tier == 3 ? OG_NOT_ENOUGH_ALONE : "");
    }
}

static const char *base_name(const char *p)
{
    const char *s = p ? strrchr(p, '/') : NULL;
    return s ? s + 1 : p;
}

/* One frame: name (demangled), file:line, library; "library+offset" when nothing names it. */
static void frame_line(struct tx *t, const struct og_sym *y, int is_caller)
{
    og_sb_puts(t->b, is_caller ? "    => at " : "       at ");
    if (y->function) {
        sb_text(t->b, y->function, 110, 0);
        if (y->inlined) {
            og_sb_printf(t->b, " %s(inlined%s", st(t, DIM), y->inlined_into ? " into " : "");
            if (y->inlined_into)
                sb_text(t->b, y->inlined_into, 60, 0);
            og_sb_printf(t->b, ")%s", st(t, RESET));
        }
        if (y->file && y->line > 0) {
            og_sb_puts(t->b, "  ");
            sb_text(t->b, base_name(y->file), 60, 0);
            og_sb_printf(t->b, ":%lld", (long long)y->line);
        }
        if (y->module) {
            og_sb_printf(t->b, "  %s", st(t, DIM));
            sb_text(t->b, y->module, 60, 0);
            og_sb_puts(t->b, st(t, RESET));
        }
    } else {
        sb_text(t->b, y->where, 120, 0);
    }
    if (is_caller)
        og_sb_printf(t->b, "  %s<- caller%s", st(t, DIM), st(t, RESET));
    og_sb_putc(t->b, '\n');
}

/* At most `max` lines: runs of interpreter frames fold into one, and the first frame
 * outside the CUDA libraries and the framework's allocator is marked as the caller. */
static void frames(struct tx *t, const struct og_frame *f, int n, int max)
{
    struct og_sym *y = n > 0 ? calloc((size_t)n, sizeof *y) : NULL;
    if (!y)
        return;
    int caller = og_stack_symbolize(f, n, y);
    if (og_stack_python_only(y, n)) {
        og_sb_printf(t->b, "       %s%s (%d native frame%s: the interpreter, the CUDA libraries)%s\n", st(t, DIM),
                     OG_PYTHON_CODE_LINE, n, n == 1 ? "" : "s", st(t, RESET));
        free(y);
        return;
    }
    int lines = 0, i = 0;
    while (i < n && lines < max) {
        int run = og_fold_run(y, n, i);
        if (run >= 2) {
            og_sb_printf(t->b, "       %s... %d %s (", st(t, DIM), run, og_fold_label(&y[i]));
            sb_text(t->b, y[i].function ? y[i].function : y[i].where, 50, 0);
            og_sb_puts(t->b, " ... ");
            sb_text(t->b, y[i + run - 1].function ? y[i + run - 1].function : y[i + run - 1].where, 50, 0);
            og_sb_printf(t->b, ")%s\n", st(t, RESET));
            i += run;
        } else {
            frame_line(t, &y[i], i == caller);
            i++;
        }
        lines++;
    }
    if (n > i)
        og_sb_printf(t->b, "       %s... %d more frames%s\n", st(t, DIM), n - i, st(t, RESET));
    free(y);
}

static void sites(struct tx *t, const struct og_dump *d, int top)
{
    if (!d->nsites)
        return;
    char h[32], g[32], title[128];
    int shown = d->nsites < top ? d->nsites : top;
    snprintf(title, sizeof title, "Top allocation sites (%d of %s, %s in all)", shown, group_digits(d->sites_total, g),
             human_bytes(d->sites_total_bytes, h));
    heading(t, title);
    og_sb_printf(t->b, "  %s%3s %12s %8s  %-16s %s%s\n", st(t, DIM), "#", "memory", "blocks", "api", "library",
                 st(t, RESET));
    for (int i = 0; i < shown; i++) {
        const struct og_site *s = &d->sites[i];
        og_sb_printf(t->b, "  %3d %12s %8s  ", i + 1, human_bytes(s->bytes, h),
                     s->blocks >= 0 ? group_digits(s->blocks, g) : "-");
        cell(t, s->api, 16, 16);
        og_sb_putc(t->b, ' ');
        sb_text(t->b,
                og_frames_python_only(s->frames, s->nframes) ? "Python code"
                : s->library                                 ? s->library
                                                             : "-",
                80, 0);
        og_sb_putc(t->b, '\n');
        frames(t, s->frames, s->nframes, TEXT_FRAMES);
    }
}

/* python_sites (OOMGUARD_PYTHON_STACKS=1): the program's lines that hold the most live memory. */
static void python_sites(struct tx *t, const struct og_dump *d, int top)
{
    if (!d->npython_sites)
        return;
    char h[32], g[32];
    heading(t, "Python lines holding the most live memory");
    for (int i = 0; i < d->npython_sites && i < top; i++) {
        const struct og_pyframe *p = &d->python_sites[i];
        og_sb_printf(t->b, "  %3d %12s %8s  ", i + 1, p->bytes >= 0 ? human_bytes(p->bytes, h) : "-",
                     p->blocks >= 0 ? group_digits(p->blocks, g) : "-");
        sb_text(t->b, p->file ? p->file : "?", 120, 0);
        og_sb_printf(t->b, ":%lld in ", (long long)p->line);
        sb_text(t->b, p->function ? p->function : "?", 60, 0);
        og_sb_putc(t->b, '\n');
    }
}

/* One line of og_roles_facts: "  label: text" */
static void text_fact(void *ctx, const char *label, const char *text)
{
    struct tx *t = ctx;
    og_sb_printf(t->b, "  %s%s:%s ", st(t, DIM), label, st(t, RESET));
    sb_text(t->b, text, 600, 0);
    og_sb_putc(t->b, '\n');
}

/* What the allocated memory is for (memory.framework.roles) and what the job was doing
 * (event.phase): first in the report when the adapter measured them. */
static void roles_table(struct tx *t, const struct og_dump *d)
{
    static const char *const labels[OG_NROLE_IX] = {
#define OG_ROLE(key, label, quiet) label,
#include "../common/roles.def"
#undef OG_ROLE
    };
    static const bool quiet[OG_NROLE_IX] = {
#define OG_ROLE(key, label, q) q,
#include "../common/roles.def"
#undef OG_ROLE
    };
    const struct og_roles_view *r = &d->mem.roles;
    char h[32];
    if (d->event.phase) {
        og_sb_printf(t->b, "\n%sPhase:%s ", st(t, BOLD), st(t, RESET));
        sb_text(t->b, d->event.phase, 40, 0);
        /* the program's own line (event.phase_site), then the framework's frame that decided */
        const struct og_pyframe *site = og_phase_line(d), *f = &d->event.phase_frame;
        for (int k = 0; k < 2; k++) {
            const struct og_pyframe *w = k ? f : site;
            if (!w || !w->file || (k && og_same_pyframe(w, site)))
                continue;
            og_sb_puts(t->b, k ? (site ? "; decided in " : " (") : " (");
            sb_text(t->b, base_name(w->file), 120, 0);
            og_sb_printf(t->b, ":%lld in ", (long long)w->line);
            sb_text(t->b, w->function ? w->function : "?", 60, 0);
        }
        if (site || f->file)
            og_sb_puts(t->b, ")");
        if (d->event.phase_source) {
            og_sb_puts(t->b, st(t, DIM));
            /* "stack", "thread that called backward()" take an article; "the failing statement ..." has its own */
            og_sb_puts(t->b, strncmp(d->event.phase_source, "the ", 4) == 0 ? " — from " : " — from the ");
            sb_text(t->b, d->event.phase_source, 96, 0);
            og_sb_puts(t->b, st(t, RESET));
        }
        og_sb_putc(t->b, '\n');
    }
    if (!r->present) {
        og_roles_facts(d, text_fact, t);
        return;
    }
    og_sb_printf(t->b, "\n%sWhat the allocated memory is for%s", st(t, BOLD), st(t, RESET));
    if (r->allocated_bytes >= 0)
        og_sb_printf(t->b, " (%s allocated)", human_bytes(r->allocated_bytes, h));
    og_sb_putc(t->b, '\n');
    for (int i = 0; i < OG_NROLE_IX; i++) {
        if (quiet[i] && r->bytes[i] <= 0)
            continue;
        og_sb_puts(t->b, "  ");
        cell(t, labels[i], 40, 30);
        if (r->bytes[i] < 0) {
            og_sb_printf(t->b, "%12s\n", "unknown");
            continue;
        }
        og_sb_printf(t->b, "%12s  ", human_bytes(r->bytes[i], h));
        if (r->allocated_bytes > 0)
            bar(t, (double)r->bytes[i] / (double)r->allocated_bytes, CYAN);
        if (r->tensors[i] > 0)
            og_sb_printf(t->b, "  %s%lld tensor%s%s", st(t, DIM), (long long)r->tensors[i],
                         r->tensors[i] == 1 ? "" : "s", st(t, RESET));
        if (i == OG_RX_per_sample_gradients && r->per_sample_count > 0)
            og_sb_printf(t->b, "%s, one gradient per example, %lld examples%s", st(t, DIM),
                         (long long)r->per_sample_count, st(t, RESET));
        og_sb_putc(t->b, '\n');
        if (i == OG_RX_optimizer_state)
            for (int k = 0; k < r->noptimizers; k++) {
                og_sb_puts(t->b, "    ");
                sb_text(t->b, r->optimizers[k].cls ? r->optimizers[k].cls : "?", 40, 0);
                og_sb_printf(t->b, " %s", human_bytes(r->optimizers[k].bytes, h));
                if (r->optimizers[k].tensors >= 0)
                    og_sb_printf(t->b, " in %lld tensor%s", (long long)r->optimizers[k].tensors,
                                 r->optimizers[k].tensors == 1 ? "" : "s");
                if (r->optimizers[k].parameters_bytes >= 0)
                    og_sb_printf(t->b, ", for %s of parameters", human_bytes(r->optimizers[k].parameters_bytes, h));
                if (r->optimizers[k].not_elementwise_bytes > 0)
                    og_sb_printf(t->b, "; %s of it matrices (not one value per weight)",
                                 human_bytes(r->optimizers[k].not_elementwise_bytes, h));
                og_sb_putc(t->b, '\n');
            }
        if (i == OG_RX_held_by_python)
            for (int k = 0; k < r->nholders; k++) {
                const struct og_role_holder_view *x = &r->holders[k];
                og_sb_printf(t->b, "    %10s  ", human_bytes(x->bytes, h));
                sb_text(t->b, x->label ? x->label : "?", 160, 0);
                if (x->tensors >= 0)
                    og_sb_printf(t->b, ", %lld tensor%s", (long long)x->tensors, x->tensors == 1 ? "" : "s");
                if (x->purpose) {
                    og_sb_puts(t->b, ", kept as ");
                    sb_text(t->b, x->purpose, 40, 0);
                }
                if (x->copy_of) {
                    og_sb_puts(t->b, ", a copy of the ");
                    sb_text(t->b, x->copy_of, 40, 0);
                }
                if (x->records > 0)
                    og_sb_printf(t->b, ", %lld like records", (long long)x->records);
                if (x->graphs > 0)
                    og_sb_puts(t->b, ", keeping their autograd graphs");
                if (x->restored_bytes > 0) {
                    og_sb_printf(t->b, ", %s restored onto the GPU by torch.load", human_bytes(x->restored_bytes, h));
                    if (x->restored_site.file) {
                        og_sb_puts(t->b, " at ");
                        sb_text(t->b, base_name(x->restored_site.file), 120, 0);
                        og_sb_printf(t->b, ":%lld", (long long)x->restored_site.line);
                    }
                }
                if (x->float64_bytes > 0)
                    og_sb_printf(t->b, ", %s of it float64", human_bytes(x->float64_bytes, h));
                if (x->bound_bytes > 0)
                    og_sb_printf(t->b, ", kept to %s (its object's bound)", human_bytes(x->bound_bytes, h));
                if (x->bound_records > 0)
                    og_sb_printf(t->b, ", kept to %lld entries (its bound)", (long long)x->bound_records);
                if (x->site.file) {
                    og_sb_puts(t->b, st(t, DIM));
                    og_sb_puts(t->b, ", made at ");
                    sb_text(t->b, base_name(x->site.file), 120, 0);
                    og_sb_printf(t->b, ":%lld", (long long)x->site.line);
                    og_sb_puts(t->b, st(t, RESET));
                }
                og_sb_putc(t->b, '\n');
            }
    }
    if (r->why) {
        og_sb_puts(t->b, "  (");
        sb_text(t->b, r->why, 200, 0);
        og_sb_puts(t->b, ")\n");
    }
    og_roles_facts(d, text_fact, t);
}

/* The Python stack of the failed call, innermost first (at most `max` lines). */
static void python_stack(struct tx *t, const struct og_dump *d, int max)
{
    const struct og_pyframe *mine = og_failing_python_line(d);
    for (int i = 0; i < d->event.npython_stack && i < max; i++) {
        const struct og_pyframe *p = &d->event.python_stack[i];
        og_sb_puts(t->b, p == mine ? "    => at " : "       at ");
        sb_text(t->b, p->function ? p->function : "?", 80, 0);
        og_sb_puts(t->b, "  ");
        sb_text(t->b, p->file ? p->file : "?", 100, 0);
        if (p->line > 0)
            og_sb_printf(t->b, ":%lld", (long long)p->line);
        og_sb_printf(t->b, "  %s(Python)%s%s\n", st(t, DIM), st(t, RESET), p == mine ? "  <- the failing line" : "");
    }
    if (d->event.npython_stack > max)
        og_sb_printf(t->b, "       %s... %d more Python frames%s\n", st(t, DIM), d->event.npython_stack - max,
                     st(t, RESET));
    if (mine && mine == &d->event.phase_site) { /* the failing thread ran only the framework's code */
        og_sb_puts(t->b, "    => at ");
        sb_text(t->b, mine->function ? mine->function : "?", 80, 0);
        og_sb_puts(t->b, "  ");
        sb_text(t->b, mine->file ? mine->file : "?", 100, 0);
        if (mine->line > 0)
            og_sb_printf(t->b, ":%lld", (long long)mine->line);
        og_sb_printf(t->b, "  %s(Python, the thread that called the framework)%s  <- the failing line\n", st(t, DIM),
                     st(t, RESET));
    }
}

/* The first screen of a Python job: the failing Python line and the lines holding memory,
 * before the numbers; or how to get the latter when they were not recorded. */
static void python_first(struct tx *t, const struct og_dump *d)
{
    if (!og_python_job(d))
        return;
    if (d->event.npython_stack > 0 || og_failing_python_line(d)) {
        heading(t, "Python stack of the failed call (innermost first)");
        python_stack(t, d, 8);
    }
    if (d->npython_sites > 0) {
        python_sites(t, d, 5);
        if (d->npython_sites > 5)
            og_sb_printf(t->b, "      %s... %d more below%s\n", st(t, DIM), d->npython_sites - 5, st(t, RESET));
    } else if (d->framework_name && !strcmp(d->framework_name, "pytorch")) {
        const char *v = og_env_value(d, "OOMGUARD_PYTHON_STACKS");
        if (v && !strcmp(v, "1"))
            og_sb_printf(t->b,
                         "\n%sPython lines holding memory: none reported although OOMGUARD_PYTHON_STACKS=1 "
                         "(the adapter could not read PyTorch's allocation history).%s\n",
                         st(t, DIM), st(t, RESET));
        else
            og_sb_printf(t->b,
                         "\n%sPython lines holding memory: not recorded; run with OOMGUARD_PYTHON_STACKS=1 "
                         "to list them (costs per allocation).%s\n",
                         st(t, DIM), st(t, RESET));
    }
}

static void failed_stack(struct tx *t, const struct og_dump *d)
{
    if (!d->event.nstack && !d->event.npython_stack)
        return;
    heading(t, "Stack of the failed call");
    /* the Python lines first: they are what the user wrote (the first screen shows up to
     * eight; a longer stack is shown whole here) */
    if (d->event.npython_stack > 8)
        python_stack(t, d, 16);
    else if (d->event.npython_stack > 0)
        og_sb_printf(t->b, "       %s(the Python lines: at the top of this report)%s\n", st(t, DIM), st(t, RESET));
    if (d->event.npython_stack > 0)
        og_sb_printf(t->b, "     %snative:%s\n", st(t, DIM), st(t, RESET));
    frames(t, d->event.stack, d->event.nstack, 16);
}

/* One-line sparkline of the usage history. */
static void sparkline(struct tx *t, const struct og_dump *d)
{
    static const char *const lv[] = { "\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588" };
    enum { W = 60 };
    int64_t bucket[W];
    int have[W] = { 0 };
    size_t n = d->hist.nsamples ? d->hist.nsamples : d->hist.nevents;
    if (n < 2)
        return;
    int64_t max = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (d->hist.nsamples)
            v = d->hist.samples[i].live_bytes;
        else if (og_event_on_device(d, &d->hist.events[i]))
            v = d->hist.events[i].live_bytes;
        else
            continue;
        if (v < 0)
            continue;
        size_t k = i * W / n;
        if (!have[k] || v > bucket[k])
            bucket[k] = v;
        have[k] = 1;
        if (v > max)
            max = v;
    }
    if (max <= 0)
        return;
    og_sb_printf(t->b, "  usage      %s", st(t, CYAN));
    for (int k = 0; k < W; k++)
        og_sb_puts(t->b, have[k] ? lv[(int)((double)bucket[k] / (double)max * 7.0 + 0.5)] : " ");
    og_sb_printf(t->b, "%s\n", st(t, RESET));
}

static void history(struct tx *t, const struct og_dump *d)
{
    char h[32], g[4][32];
    if (!d->hist.present && !d->ndevsum)
        return;
    heading(t, "History");
    if (d->hist.peak_bytes >= 0) {
        og_sb_printf(t->b, "  peak       %s%s%s", st(t, BOLD), human_bytes(d->hist.peak_bytes, h), st(t, RESET));
        if (isfinite(d->hist.peak_t_rel))
            og_sb_printf(t->b, " at %.1f s", d->hist.peak_t_rel);
        if (d->hist.peak_library) {
            og_sb_puts(t->b, ", mostly ");
            sb_text(t->b, d->hist.peak_library, 60, 0);
        }
        og_sb_putc(t->b, '\n');
    }
    sparkline(t, d);
    if (d->hist.allocs >= 0 || d->hist.frees >= 0)
        og_sb_printf(t->b, "  calls      %s allocations, %s frees, %s failures, %s unknown frees\n",
                     d->hist.allocs >= 0 ? group_digits(d->hist.allocs, g[0]) : "?",
                     d->hist.frees >= 0 ? group_digits(d->hist.frees, g[1]) : "?",
                     d->hist.failures >= 0 ? group_digits(d->hist.failures, g[2]) : "?",
                     d->hist.unknown_frees >= 0 ? group_digits(d->hist.unknown_frees, g[3]) : "?");
    if (d->hist.recovered_episodes > 0) /* the framework's flush-and-retry: failures it recovered from */
        og_sb_printf(t->b,
                     "  recovered  %s failure episode%s up to this record, %s of them without a record of its own\n",
                     group_digits(d->hist.recovered_episodes, g[0]), d->hist.recovered_episodes == 1 ? "" : "s",
                     d->hist.recovered_not_written >= 0 ? group_digits(d->hist.recovered_not_written, g[1]) : "?");
    for (int i = 0; i < d->ndevsum; i++) {
        const struct og_devsum *s = &d->devsum[i];
        if (!s->nfits)
            continue;
        og_sb_printf(t->b, "  GPU %lld fits ", (long long)s->index);
        for (int j = 0; j < s->nfits && j < 16; j++) {
            const char *mark = s->fits[j].fits == 1 ? "yes" : s->fits[j].fits == 0 ? "no" : "?";
            og_sb_printf(t->b, "%s%g GB: %s%s%s", j ? ", " : "", s->fits[j].card_gb,
                         st(t, s->fits[j].fits == 1 ? GREEN : RED), mark, st(t, RESET));
        }
        og_sb_putc(t->b, '\n');
        if (s->unbounded_why) {
            og_sb_puts(t->b, "             ? unknown: ");
            sb_text(t->b, s->unbounded_why, 200, 0);
            og_sb_putc(t->b, '\n');
        }
    }
}

static void context(struct tx *t, const struct og_dump *d)
{
    char h[32];
    if (d->mem.nunmeasured) {
        heading(t, "Not measured");
        for (int i = 0; i < d->mem.nunmeasured && i < 20; i++) {
            og_sb_puts(t->b, "  - ");
            sb_text(t->b, d->mem.unmeasured[i], 200, 0);
            og_sb_putc(t->b, '\n');
        }
    }
    if (d->mem.host_pinned_bytes > 0)
        og_sb_printf(t->b, "\n  Pinned host memory (not on the GPU): %s\n", human_bytes(d->mem.host_pinned_bytes, h));
}

int og_render_text(og_sb_t *out, const struct og_dump *d, const struct og_render_opts *o)
{
    struct tx t = { out, o && o->color };
    int top = o && o->top > 0 ? o->top : TEXT_TOP_SITES;
    og_sb_printf(out, "%soomguard report: ", st(&t, DIM));
    sb_text(out, d->file, 200, 0);
    og_sb_printf(out, "%s\n", st(&t, RESET));
    headline(&t, d);
    python_first(&t, d);
    roles_table(&t, d);
    facts(&t, d);
    where(&t, d);
    others(&t, d);
    causes(&t, d);
    remedies(&t, d);
    sites(&t, d, top);
    if (d->npython_sites > 5) /* the first screen showed five */
        python_sites(&t, d, top);
    failed_stack(&t, d);
    history(&t, d);
    context(&t, d);
    return out->failed ? -1 : 0;
}
