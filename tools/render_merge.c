/* tools/render_merge.c — `oomguard merge` printed: the jobs of tools/merge.c (struct og_merge) as
 * text, JSON or one HTML page.  Reads the structure only. */
#include "merge.h"
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void who(og_sb_t *b, const struct og_dump *d, int html)
{
    if (d->rank >= 0)
        og_sb_printf(b, "rank %lld", (long long)d->rank);
    else
        og_sb_printf(b, "pid %lld", (long long)d->pid);
    (void)html;
}

/* ---- text ---- */

static void text_job(og_sb_t *b, const struct og_merge_job *j, int color)
{
    const char *bold = color ? "\033[1m" : "", *red = color ? "\033[31m" : "", *yellow = color ? "\033[33m" : "",
               *dim = color ? "\033[2m" : "", *rst = color ? "\033[0m" : "";
    char h[6][32], tm[40];
    const struct og_dump *d0 = j->r[0];
    og_sb_printf(b, "\n%sJob ", bold);
    sb_text(b, d0->job_id ? d0->job_id : "(no job id)", 80, 0);
    og_sb_printf(b, "%s: %d dump%s from %d host%s", rst, j->n, j->n == 1 ? "" : "s", j->hosts,
                 j->hosts == 1 ? "" : "s");
    if (d0->world_size >= 0)
        og_sb_printf(b, ", world size %lld", (long long)d0->world_size);
    og_sb_putc(b, '\n');

    if (j->first >= 0) {
        const struct og_dump *f = j->r[j->first];
        double t0 = og_merge_fail_time(f);
        og_sb_printf(b, "  %sFailed first: ", red);
        who(b, f, 0);
        og_sb_printf(b, "%s (", rst);
        sb_text(b, f->host ? f->host : "?", 60, 0);
        og_sb_printf(b, " pid %lld", (long long)f->pid);
        if (og_merge_device_of(f) >= 0)
            og_sb_printf(b, ", GPU %lld", (long long)og_merge_device_of(f));
        og_sb_puts(b, ")");
        if (og_format_time(t0, tm)[0])
            og_sb_printf(b, " at %s", tm);
        if (f->event.requested_bytes.known) {
            og_sb_puts(b, ": ");
            sb_text(b, f->event.api ? f->event.api : "allocation", 40, 0);
            og_sb_printf(b, " of %s", human_bytes_u64(f->event.requested_bytes.v, h[0]));
        }
        og_sb_putc(b, '\n');
        int later = 0;
        for (int i = 0; i < j->n; i++) {
            double t = og_merge_fail_time(j->r[i]);
            if (i == j->first || !isfinite(t))
                continue;
            og_sb_puts(b, later++ ? ", " : "  then: ");
            who(b, j->r[i], 0);
            og_sb_printf(b, " (+%.2f s)", t - t0);
        }
        if (later)
            og_sb_putc(b, '\n');
    } else {
        og_sb_puts(b, "  No rank ran out of memory.\n");
    }

    og_sb_printf(b, "\n  %s%-6s %-16s %-9s %-5s %11s %11s %11s %11s  %-16s %s%s\n", dim, "rank", "host", "pid", "gpu",
                 "used", "framework", "non-fw", "other procs", "cause", "status", rst);
    for (int i = 0; i < j->n; i++) {
        const struct og_dump *d = j->r[i];
        char rk[24], dv[24];
        snprintf(rk, sizeof rk, "%lld", (long long)d->rank);
        snprintf(dv, sizeof dv, "%lld", (long long)og_merge_device_of(d));
        og_sb_printf(b, "  %-6s ", d->rank >= 0 ? rk : "-");
        sb_text(b, d->host ? d->host : "-", 16, 0);
        for (int w = (int)text_width(d->host ? d->host : "-", 16); w < 16; w++)
            og_sb_putc(b, ' ');
        og_sb_printf(b, " %-9lld %-5s %11s %11s %11s %11s  ", (long long)d->pid, og_merge_device_of(d) >= 0 ? dv : "-",
                     og_process_bytes(d) >= 0 ? human_bytes(og_process_bytes(d), h[0]) : "-",
                     d->mem.framework_bytes >= 0 ? human_bytes(d->mem.framework_bytes, h[1]) : "-",
                     d->mem.non_framework_bytes >= 0 ? human_bytes(d->mem.non_framework_bytes, h[2]) : "-",
                     d->mem.other_processes_bytes >= 0 ? human_bytes(d->mem.other_processes_bytes, h[3]) : "-");
        const char *cause = og_merge_rank_cause(d);
        sb_text(b, cause, 16, 0);
        for (int w = (int)text_width(cause, 16); w < 17; w++)
            og_sb_putc(b, ' ');
        int first = i == j->first;
        og_sb_puts(b, d->status == OG_ST_OOM ? red : "");
        sb_text(b, d->status_str ? d->status_str : "?", 12, 0);
        og_sb_printf(b, "%s%s\n", first ? " (first)" : "", d->status == OG_ST_OOM ? rst : "");
    }

    /* GPUs that hold contexts of other ranks of the same job. */
    int any = 0;
    for (int i = 0; i < j->n; i++) {
        const struct og_dump *d = j->r[i];
        int cnt = 0;
        int64_t bytes = 0;
        for (int k = 0; k < d->mem.nprocs; k++)
            if (og_merge_rank_of_pid(j, d, d->mem.procs[k].pid) >= 0) {
                cnt++;
                bytes += d->mem.procs[k].bytes > 0 ? d->mem.procs[k].bytes : 0;
            }
        if (!cnt)
            continue;
        if (!any++)
            og_sb_printf(b, "\n  %sOther ranks on the same GPU%s\n", bold, rst);
        og_sb_printf(b, "  %s", yellow);
        who(b, d, 0);
        og_sb_printf(b, "'s GPU%s", rst);
        if (og_merge_device_of(d) >= 0)
            og_sb_printf(b, " (GPU %lld on ", (long long)og_merge_device_of(d));
        else
            og_sb_puts(b, " (on ");
        sb_text(b, d->host ? d->host : "?", 60, 0);
        og_sb_printf(b, ") holds %d context%s of other ranks, %s: pids ", cnt, cnt == 1 ? "" : "s",
                     human_bytes(bytes, h[0]));
        int c = 0;
        for (int k = 0; k < d->mem.nprocs; k++) {
            int r = og_merge_rank_of_pid(j, d, d->mem.procs[k].pid);
            if (r < 0)
                continue;
            og_sb_printf(b, "%s%lld (", c++ ? ", " : "", (long long)d->mem.procs[k].pid);
            who(b, j->r[r], 0);
            og_sb_printf(b, ", %s)", human_bytes(d->mem.procs[k].bytes, h[1]));
        }
        og_sb_putc(b, '\n');
    }

    if (j->n > 1 && j->max_i >= 0 && j->min_i >= 0) {
        int64_t spread = j->max_used - j->min_used;
        double frac = j->max_used > 0 ? (double)spread / (double)j->max_used : 0;
        og_sb_printf(b, "\n  %sSkew%s: usage ranges from %s (", bold, rst, human_bytes(j->min_used, h[0]));
        who(b, j->r[j->min_i], 0);
        og_sb_printf(b, ") to %s (", human_bytes(j->max_used, h[1]));
        who(b, j->r[j->max_i], 0);
        og_sb_printf(b, "): %s, %.1f%% of the largest", human_bytes(spread, h[2]), frac * 100);
        if (frac > SKEW_FLAG)
            og_sb_printf(b, " %s— uneven (more than %.0f%%)%s", yellow, SKEW_FLAG * 100, rst);
        og_sb_putc(b, '\n');
    }
}

/* ---- json ---- */

static void add_str(cJSON *o, const char *k, const char *v)
{
    if (!v) {
        cJSON_AddNullToObject(o, k);
        return;
    }
    og_sb_t b;
    og_sb_init(&b);
    sb_utf8(&b, v);
    cJSON_AddStringToObject(o, k, b.buf ? b.buf : "");
    og_sb_free(&b);
}

static void add_int(cJSON *o, const char *k, int64_t v)
{
    if (v < 0)
        cJSON_AddNullToObject(o, k);
    else
        cJSON_AddNumberToObject(o, k, (double)v);
}

/* Exactly, as the dump wrote it: a double would turn SIZE_MAX into 2^64. */
static void add_bytes(cJSON *o, const char *k, struct og_bytes v)
{
    char num[32];
    snprintf(num, sizeof num, "%s%" PRIu64, v.neg ? "-" : "", v.v);
    if (!v.known)
        cJSON_AddNullToObject(o, k);
    else
        cJSON_AddRawToObject(o, k, num);
}

static cJSON *json_job(const struct og_merge_job *j)
{
    cJSON *o = cJSON_CreateObject(), *ranks = cJSON_CreateArray(), *ctx = cJSON_CreateArray();
    add_str(o, "job_id", j->r[0]->job_id);
    for (int i = 0; i < j->n; i++) {
        const struct og_dump *d = j->r[i];
        cJSON *r = cJSON_CreateObject();
        add_int(r, "rank", d->rank);
        add_str(r, "host", d->host);
        add_int(r, "pid", d->pid);
        add_int(r, "device", og_merge_device_of(d));
        add_str(r, "device_name", d->device.name);
        add_int(r, "used_bytes", og_process_bytes(d));
        add_int(r, "framework_bytes", d->mem.framework_bytes);
        add_int(r, "non_framework_bytes", d->mem.non_framework_bytes);
        add_int(r, "other_processes_bytes", d->mem.other_processes_bytes);
        add_str(r, "status", d->status_str);
        add_str(r, "cause", d->diag.primary && *d->diag.primary ? d->diag.primary : NULL);
        add_bytes(r, "requested_bytes", d->event.present ? d->event.requested_bytes : (struct og_bytes){ 0 });
        if (isfinite(og_merge_fail_time(d)))
            cJSON_AddNumberToObject(r, "failed_at", og_merge_fail_time(d));
        else
            cJSON_AddNullToObject(r, "failed_at");
        add_str(r, "file", d->file);
        cJSON_AddItemToArray(ranks, r);

        cJSON *others = NULL;
        for (int k = 0; k < d->mem.nprocs; k++) {
            int ri = og_merge_rank_of_pid(j, d, d->mem.procs[k].pid);
            if (ri < 0)
                continue;
            if (!others) {
                cJSON *c = cJSON_CreateObject();
                add_int(c, "rank", d->rank);
                add_str(c, "host", d->host);
                add_int(c, "pid", d->pid);
                add_int(c, "device", og_merge_device_of(d));
                others = cJSON_AddArrayToObject(c, "contexts");
                cJSON_AddItemToArray(ctx, c);
            }
            cJSON *e = cJSON_CreateObject();
            add_int(e, "pid", d->mem.procs[k].pid);
            add_int(e, "rank", j->r[ri]->rank);
            add_int(e, "bytes", d->mem.procs[k].bytes);
            cJSON_AddItemToArray(others, e);
        }
    }
    cJSON_AddItemToObject(o, "ranks", ranks);
    if (j->first >= 0) {
        const struct og_dump *f = j->r[j->first];
        cJSON *ff = cJSON_AddObjectToObject(o, "first_failure");
        add_int(ff, "rank", f->rank);
        add_str(ff, "host", f->host);
        add_int(ff, "pid", f->pid);
        cJSON_AddNumberToObject(ff, "t", og_merge_fail_time(f));
        add_str(ff, "file", f->file);
    } else {
        cJSON_AddNullToObject(o, "first_failure");
    }
    cJSON_AddItemToObject(o, "foreign_contexts", ctx);
    if (j->max_i >= 0) {
        cJSON *s = cJSON_AddObjectToObject(o, "skew");
        int64_t spread = j->max_used - j->min_used;
        double frac = j->max_used > 0 ? (double)spread / (double)j->max_used : 0;
        add_int(s, "max_bytes", j->max_used);
        add_int(s, "max_rank", j->r[j->max_i]->rank);
        add_int(s, "min_bytes", j->min_used);
        add_int(s, "min_rank", j->r[j->min_i]->rank);
        add_int(s, "spread_bytes", spread);
        cJSON_AddNumberToObject(s, "spread_fraction", frac);
        cJSON_AddBoolToObject(s, "uneven", frac > SKEW_FLAG);
    } else {
        cJSON_AddNullToObject(o, "skew");
    }
    return o;
}

/* ---- html ---- */

static void html_job(og_sb_t *b, const struct og_merge_job *j)
{
    char h[4][32], tm[40];
    const struct og_dump *d0 = j->r[0];
    og_sb_puts(b, "<section class=\"card\"><h2>Job <span class=\"mono\">");
    sb_html(b, d0->job_id ? d0->job_id : "(no job id)", 100, 0);
    og_sb_printf(b, "</span> <span class=\"muted\" style=\"font-weight:400\">%d dump%s, %d host%s</span></h2>", j->n,
                 j->n == 1 ? "" : "s", j->hosts, j->hosts == 1 ? "" : "s");
    if (j->first >= 0) {
        const struct og_dump *f = j->r[j->first];
        og_sb_puts(b, "<div class=\"card primary\" style=\"padding:10px 14px;margin-bottom:12px\"><b>Failed first: ");
        who(b, f, 1);
        og_sb_puts(b, "</b> (");
        sb_html(b, f->host ? f->host : "?", 60, 0);
        og_sb_printf(b, ", pid %lld", (long long)f->pid);
        if (og_merge_device_of(f) >= 0)
            og_sb_printf(b, ", GPU %lld", (long long)og_merge_device_of(f));
        og_sb_puts(b, ")");
        if (og_format_time(og_merge_fail_time(f), tm)[0])
            og_sb_printf(b, " at %s", tm);
        if (f->event.requested_bytes.known)
            og_sb_printf(b, ", requesting %s", human_bytes_u64(f->event.requested_bytes.v, h[0]));
        int later = 0;
        for (int i = 0; i < j->n; i++) {
            double t = og_merge_fail_time(j->r[i]);
            if (i == j->first || !isfinite(t))
                continue;
            og_sb_puts(b, later++ ? ", " : "<br>then ");
            who(b, j->r[i], 1);
            og_sb_printf(b, " (+%.2f s)", t - og_merge_fail_time(f));
        }
        og_sb_puts(b, "</div>");
    }
    og_sb_puts(b, "<table class=\"ranks\"><thead><tr><th class=\"num\">rank</th><th>host</th><th class=\"num\">pid</th>"
                  "<th class=\"num\">GPU</th><th class=\"num\">used</th><th class=\"num\">framework</th>"
                  "<th class=\"num\">non-framework</th><th class=\"num\">other "
                  "processes</th><th>cause</th><th>status</th></tr></thead><tbody>");
    for (int i = 0; i < j->n; i++) {
        const struct og_dump *d = j->r[i];
        og_sb_puts(b, "<tr><td class=\"num\">");
        if (d->rank >= 0)
            og_sb_printf(b, "%lld", (long long)d->rank);
        og_sb_puts(b, "</td><td class=\"mono\">");
        sb_html(b, d->host ? d->host : "-", 60, 0);
        og_sb_printf(b,
                     "</td><td class=\"num\">%lld</td><td class=\"num\">%lld</td><td class=\"num\">%s</td><td "
                     "class=\"num\">%s</td>"
                     "<td class=\"num\">%s</td><td class=\"num\">%s</td><td>",
                     (long long)d->pid, (long long)og_merge_device_of(d),
                     og_process_bytes(d) >= 0 ? human_bytes(og_process_bytes(d), h[0]) : "-",
                     d->mem.framework_bytes >= 0 ? human_bytes(d->mem.framework_bytes, h[1]) : "-",
                     d->mem.non_framework_bytes >= 0 ? human_bytes(d->mem.non_framework_bytes, h[2]) : "-",
                     d->mem.other_processes_bytes >= 0 ? human_bytes(d->mem.other_processes_bytes, h[3]) : "-");
        og_sb_puts(b, "<span class=\"mono\">");
        sb_html(b, og_merge_rank_cause(d), 40, 0);
        og_sb_puts(b, "</span></td><td>");
        sb_html(b, d->status_str ? d->status_str : "?", 20, 0);
        og_sb_printf(b, "%s</td></tr>", i == j->first ? " <b style=\"color:#d93636\">(first)</b>" : "");
    }
    og_sb_puts(b, "</tbody></table>");
    for (int i = 0; i < j->n; i++) {
        const struct og_dump *d = j->r[i];
        int cnt = 0;
        for (int k = 0; k < d->mem.nprocs; k++)
            cnt += og_merge_rank_of_pid(j, d, d->mem.procs[k].pid) >= 0;
        if (!cnt)
            continue;
        og_sb_puts(b, "<p>&#9888; ");
        who(b, d, 1);
        og_sb_puts(b, "&#39;s GPU (");
        if (og_merge_device_of(d) >= 0)
            og_sb_printf(b, "GPU %lld on ", (long long)og_merge_device_of(d));
        sb_html(b, d->host ? d->host : "?", 60, 0);
        og_sb_printf(b, ") holds %d context%s of other ranks: ", cnt, cnt == 1 ? "" : "s");
        int c = 0;
        for (int k = 0; k < d->mem.nprocs; k++) {
            int r = og_merge_rank_of_pid(j, d, d->mem.procs[k].pid);
            if (r < 0)
                continue;
            og_sb_printf(b, "%spid %lld (", c++ ? ", " : "", (long long)d->mem.procs[k].pid);
            who(b, j->r[r], 1);
            og_sb_printf(b, ", %s)", human_bytes(d->mem.procs[k].bytes, h[0]));
        }
        og_sb_puts(b, "</p>");
    }
    if (j->n > 1 && j->max_i >= 0) {
        int64_t spread = j->max_used - j->min_used;
        double frac = j->max_used > 0 ? (double)spread / (double)j->max_used : 0;
        og_sb_printf(b, "<p><b>Skew:</b> %s to %s, a spread of %s (%.1f%%)%s</p>", human_bytes(j->min_used, h[0]),
                     human_bytes(j->max_used, h[1]), human_bytes(spread, h[2]), frac * 100,
                     frac > SKEW_FLAG ? " \u2014 <b style=\"color:#c98a00\">uneven</b>" : "");
    }
    og_sb_puts(b, "</section>\n");
}

int og_merge_render(og_sb_t *out, const struct og_merge_input *in, int format, int color)
{
    struct og_merge m;
    og_merge_jobs(in, &m);
    struct og_merge_job *jobs = m.jobs;
    int njobs = m.njobs;
    if (format == OG_FMT_JSON) {
        cJSON *o = cJSON_CreateObject(), *ja = cJSON_CreateArray(), *sk = cJSON_CreateArray();
        add_str(o, "dir", in->dir);
        cJSON_AddNumberToObject(o, "dumps", in->ndumps);
        for (int i = 0; i < njobs; i++)
            cJSON_AddItemToArray(ja, json_job(&jobs[i]));
        cJSON_AddItemToObject(o, "jobs", ja);
        for (int i = 0; i < in->nskipped; i++) {
            og_sb_t b;
            og_sb_init(&b);
            sb_utf8(&b, in->skipped[i]);
            cJSON_AddItemToArray(sk, cJSON_CreateString(b.buf ? b.buf : ""));
            og_sb_free(&b);
        }
        cJSON_AddItemToObject(o, "skipped", sk);
        char *s = cJSON_Print(o);
        if (s) {
            og_sb_puts(out, s);
            og_sb_putc(out, '\n');
        } else {
            out->failed = 1;
        }
        cJSON_free(s);
        cJSON_Delete(o);
    } else if (format == OG_FMT_HTML) {
        og_html_begin(out, "oomguard merge");
        og_sb_puts(out, "<header class=\"top exit\"><span class=\"badge\">merge</span><h1>");
        og_sb_printf(out, "%d dump%s in ", in->ndumps, in->ndumps == 1 ? "" : "s");
        sb_html(out, in->dir, 200, 0);
        og_sb_printf(out, "</h1><p class=\"sub\">%d job%s</p></header><main>", njobs, njobs == 1 ? "" : "s");
        for (int i = 0; i < njobs; i++)
            html_job(out, &jobs[i]);
        if (in->nskipped) {
            og_sb_printf(out, "<section class=\"card\"><h2>Skipped %d file%s</h2><ul>", in->nskipped,
                         in->nskipped == 1 ? "" : "s");
            for (int i = 0; i < in->nskipped; i++) {
                og_sb_puts(out, "<li class=\"mono\">");
                sb_html(out, in->skipped[i], 400, 0);
                og_sb_puts(out, "</li>");
            }
            og_sb_puts(out, "</ul></section>");
        }
        og_sb_puts(out, "</main>\n");
        og_html_end(out);
    } else {
        og_sb_printf(out, "%soomguard merge: %d dump%s in ", color ? "\033[2m" : "", in->ndumps,
                     in->ndumps == 1 ? "" : "s");
        sb_text(out, in->dir, 200, 0);
        og_sb_printf(out, " (%d job%s)%s\n", njobs, njobs == 1 ? "" : "s", color ? "\033[0m" : "");
        for (int i = 0; i < njobs; i++)
            text_job(out, &jobs[i], color);
        if (in->nskipped) {
            og_sb_printf(out, "\nSkipped %d file%s:\n", in->nskipped, in->nskipped == 1 ? "" : "s");
            for (int i = 0; i < in->nskipped; i++) {
                og_sb_puts(out, "  ");
                sb_text(out, in->skipped[i], 400, 0);
                og_sb_putc(out, '\n');
            }
        }
    }
    og_merge_jobs_free(&m);
    return out->failed ? -1 : 0;
}
