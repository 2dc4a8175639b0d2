/* tools/render_html.c — a self-contained HTML report: inline CSS and SVG, one
 * tiny inline script (allowed by its hash in the page's CSP), nothing fetched.
 * Every string from the dump goes through sb_html(). */
#include "human.h" /* OG_NOT_ENOUGH_ALONE */
#include "report.h"
#include "symbolize.h"
#include "version.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HTML_TOP_SITES 20
#define CHART_POINTS   1000

/* The only script; its SHA-256 is allowed by the CSP below.  It marks the page
 * as fully parsed, which the headless-browser test checks. */
#define OK_SCRIPT        "document.body.dataset.ok=\"1\";"
#define OK_SCRIPT_SHA256 "7zcKPzuLjUWvXFuvmHHFF/RkS5rSWHsU5vrO8e66mEA="

static const char CSS[] =
    ":root{--fg:#1d2330;--muted:#5f6b7a;--line:#e3e7ee;--bg:#f5f7fa;--card:#fff;--accent:#3366cc;"
    "--fw:#3b6fd8;--cached:#9dbcf2;--nonfw:#8e5ad6;--proc:#6b8bd6;--other:#e8833a;--unacc:#b9c0ca;--free:#bfe3c8;"
    "--req:#d93636;--ok:#1f9d55;--warn:#c98a00}"
    "*{box-sizing:border-box}"
    "body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,'Segoe UI',"
    "Roboto,'Helvetica Neue',Arial,sans-serif}"
    "header.top{padding:28px 40px 24px;color:#fff;background:linear-gradient(120deg,#7a1f1f,#c43c3c)}"
    "header.top.recovered{background:linear-gradient(120deg,#145c36,#1f9d55)}"
    "header.top.warning{background:linear-gradient(120deg,#7a5200,#c98a00)}"
    "header.top.exit,header.top.other{background:linear-gradient(120deg,#1b3a6b,#3366cc)}"
    ".badge{display:inline-block;font-size:11px;font-weight:700;letter-spacing:.08em;padding:3px 9px;"
    "border-radius:999px;background:rgba(255,255,255,.2);text-transform:uppercase}"
    "header h1{margin:10px 0 6px;font-size:26px;font-weight:650;line-height:1.25}"
    "header .sub{margin:0;opacity:.9;font-size:14px}"
    "main{max-width:1180px;margin:0 auto;padding:24px 28px 40px}"
    ".kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-bottom:18px}"
    ".kpi{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 16px}"
    ".kpi .k{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.05em}"
    ".kpi .v{font-size:22px;font-weight:650;margin-top:2px}.kpi .x{font-size:12px;color:var(--muted)}"
    ".kpi.bad .v{color:var(--req)}.kpi.good .v{color:var(--ok)}"
    "section.card{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:18px 22px;"
    "margin-bottom:18px;box-shadow:0 1px 2px rgba(20,30,50,.04)}"
    "section.card h2{margin:0 0 12px;font-size:16px;font-weight:650}"
    ".primary{border-left:5px solid var(--req)}.primary.recovered{border-left-color:var(--ok)}"
    ".primary .t{font-size:17px;font-weight:600}"
    "dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:4px 14px;margin:12px 0 0}"
    "dl.facts dt{color:var(--muted)}dl.facts dd{margin:0}"
    ".muted{color:var(--muted)}.mono,pre,code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}"
    "svg{display:block;width:100%;height:auto}"
    "svg text{font-family:system-ui,-apple-system,'Segoe UI',Roboto,Arial,sans-serif}"
    ".legend{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:6px 28px;margin-top:12px}"
    ".legend div{display:flex;align-items:center;gap:8px}"
    ".legend .n{margin-left:auto;font-variant-numeric:tabular-nums;white-space:nowrap}"
    ".sw{width:12px;height:12px;border-radius:3px;flex:none}"
    "table{width:100%;border-collapse:collapse;font-size:13px}"
    "th{text-align:left;font-weight:600;color:var(--muted);border-bottom:1px solid var(--line);padding:6px 8px}"
    "td{border-bottom:1px solid var(--line);padding:6px 8px;vertical-align:top}"
    "td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
    ".share{height:6px;background:#e8edf5;border-radius:3px;min-width:80px}"
    ".share i{display:block;height:6px;border-radius:3px;background:var(--fw)}"
    "details summary{cursor:pointer;color:var(--accent)}"
    "table.fixed{table-layout:fixed}"
    "table.fixed summary{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}"
    "td.mono{word-break:break-all}"
    "ol.frames{margin:6px 0 0;padding-left:22px;font-size:12px}ol.frames li{margin:1px 0;word-break:break-all}"
    "ol.frames .lib{color:var(--muted)}ol.frames .src{color:var(--accent,#2563eb)}"
    "ol.frames li.caller{font-weight:600}ol.frames .tag{font-size:10px;padding:0 4px;border-radius:3px;"
    "background:var(--accent,#2563eb);color:#fff;font-weight:400}"
    ".cause{padding:10px 0;border-bottom:1px solid var(--line)}.cause:last-child{border-bottom:0}"
    ".cause .hd{display:flex;align-items:center;gap:10px;font-weight:600}"
    ".conf{width:120px;height:8px;background:#eef1f6;border-radius:4px;overflow:hidden}"
    ".conf i{display:block;height:8px;background:var(--accent)}"
    ".ev{display:grid;grid-template-columns:minmax(160px,max-content) 1fr;gap:2px 16px;margin:8px 0 0 "
    "2px;font-size:13px}"
    ".ev .n{color:var(--muted)}"
    ".remedy{display:grid;grid-template-columns:36px 1fr;gap:4px 10px;padding:12px 0;border-bottom:1px solid "
    "var(--line)}"
    ".remedy:last-child{border-bottom:0}"
    ".rank{width:28px;height:28px;border-radius:50%;background:var(--accent);color:#fff;display:flex;"
    "align-items:center;justify-content:center;font-weight:700}"
    ".remedy .t{font-weight:600;font-size:15px}.chips{margin:4px 0}"
    ".chip{display:inline-block;font-size:12px;padding:1px 8px;border-radius:999px;margin-right:6px;background:#eef1f6}"
    ".chip.save{background:#e3f4e9;color:#17693b}.chip.cost{background:#fdf1dc;color:#7a5200}"
    "pre{background:#0f1623;color:#e6edf7;padding:10px 12px;border-radius:8px;overflow-x:auto;margin:6px 0 0;"
    "font-size:12.5px;white-space:pre-wrap;word-break:break-all}"
    ".kv{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px}.kv .n{color:var(--muted)}"
    ".kv .v{word-break:break-all}"
    "footer{max-width:1180px;margin:0 auto;padding:0 28px 30px;color:var(--muted);font-size:12px}"
    "@media print{header.top{-webkit-print-color-adjust:exact;print-color-adjust:exact}}";

struct hx {
    og_sb_t *b;
    const struct og_dump *d;
};

static int toupper_ascii(int c) { return c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c; }

static void esc(struct hx *h, const char *s, size_t max) { sb_html(h->b, s ? s : "", max, 0); }

static const char *hb(int64_t v, char out[32]) { return human_bytes(v, out); }
static const char *hbu(uint64_t v, char out[32]) { return human_bytes_u64(v, out); }

static void kpi(struct hx *h, const char *cls, const char *k, const char *v, const char *x)
{
    og_sb_printf(h->b, "<div class=\"kpi %s\"><div class=\"k\">%s</div><div class=\"v\">%s</div>", cls, k, v);
    if (x)
        og_sb_printf(h->b, "<div class=\"x\">%s</div>", x);
    og_sb_puts(h->b, "</div>");
}

static const char *status_class(const struct og_dump *d)
{
    switch (d->status) {
    case OG_ST_OOM:
        return "oom";
    case OG_ST_RECOVERED:
        return "recovered";
    case OG_ST_WARNING:
        return "warning";
    case OG_ST_EXIT:
        return "exit";
    default:
        return "other";
    }
}

void og_html_begin(og_sb_t *b, const char *title)
{
    og_sb_puts(b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                  "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
                  "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                  "style-src 'unsafe-inline'; img-src data:; script-src 'sha256-" OK_SCRIPT_SHA256 "'\">"
                  "<meta name=\"generator\" content=\"oomguard " OOMGUARD_VERSION "\"><title>");
    sb_html(b, title, 300, 0);
    og_sb_printf(b, "</title><style>%s</style></head>\n<body>\n", CSS);
}

void og_html_end(og_sb_t *b) { og_sb_puts(b, "<script>" OK_SCRIPT "</script>\n</body></html>\n"); }

static void page_head(struct hx *h)
{
    const struct og_dump *d = h->d;
    og_sb_t t;
    og_sb_init(&t);
    og_sb_printf(&t, "oomguard: %s", og_status_title(d));
    if (d->host) {
        og_sb_puts(&t, " \u2014 ");
        og_sb_puts(&t, d->host); /* escaped by og_html_begin */
    }
    if (d->pid >= 0)
        og_sb_printf(&t, " pid %lld", (long long)d->pid);
    og_html_begin(h->b, t.buf ? t.buf : "oomguard");
    og_sb_free(&t);
}

static void header(struct hx *h)
{
    const struct og_dump *d = h->d;
    char a[32], tm[40];
    static const char *const badge[] = { "oomguard dump", "Out of memory", "Recovered", "Warning", "Exit summary" };
    og_sb_printf(h->b, "<header class=\"top %s\"><span class=\"badge\">%s</span><h1>", status_class(d),
                 d->status == OG_ST_OOM && d->event.caused_by_limit == 1 ? "Limit reached" : badge[d->status]);
    if (d->event.present &&
        (d->event.requested_bytes.known || d->status == OG_ST_OOM || d->status == OG_ST_RECOVERED)) {
        esc(h, d->event.api ? d->event.api : "allocation", 60);
        og_sb_printf(h->b, " of %s %s",
                     d->event.requested_bytes.known ? hbu(d->event.requested_bytes.v, a) : "a size not given",
                     d->status == OG_ST_RECOVERED ? "failed, then succeeded"
                     : d->status == OG_ST_OOM     ? "failed"
                                                  : "requested");
    } else {
        og_sb_puts(h->b, og_status_title(d));
    }
    int64_t dev = d->event.device >= 0 ? d->event.device : d->device.index;
    if (dev >= 0)
        og_sb_printf(h->b, " on GPU %lld", (long long)dev);
    og_sb_puts(h->b, "</h1><p class=\"sub\">");
    int sep = 0;
#define SEP() og_sb_puts(h->b, sep++ ? " \u00b7 " : "")
    if (d->device.name) {
        SEP();
        esc(h, d->device.name, 80);
    }
    if (d->host) {
        SEP();
        esc(h, d->host, 80);
    }
    if (d->pid >= 0) {
        SEP();
        og_sb_printf(h->b, "pid %lld", (long long)d->pid);
    }
    if (d->rank >= 0) {
        SEP();
        og_sb_printf(h->b, "rank %lld", (long long)d->rank);
        if (d->world_size >= 0)
            og_sb_printf(h->b, "/%lld", (long long)d->world_size);
    }
    if (d->framework_name) {
        SEP();
        og_sb_puts(h->b, og_framework_title(d->framework_name));
    }
    double when = d->event.present && isfinite(d->event.t) ? d->event.t : d->time;
    if (og_format_time(when, tm)[0]) {
        SEP();
        og_sb_puts(h->b, tm);
    }
#undef SEP
    og_sb_puts(h->b, "</p></header>\n<main>\n");
}

static void kpis(struct hx *h)
{
    const struct og_dump *d = h->d;
    char a[32], b[32], x[96];
    og_sb_puts(h->b, "<div class=\"kpis\">");
    if (d->event.present && d->event.requested_bytes.known)
        kpi(h, "", "Requested", hbu(d->event.requested_bytes.v, a), NULL);
    else if (d->event.present && (d->status == OG_ST_OOM || d->status == OG_ST_RECOVERED))
        kpi(h, "", "Requested", "unknown", "size not given");
    if (d->device.free_bytes >= 0) {
        if (d->device.total_bytes > 0)
            snprintf(x, sizeof x, "of %s on the device", hb(d->device.total_bytes, b));
        kpi(h, "", "Free", hb(d->device.free_bytes, a), d->device.total_bytes > 0 ? x : NULL);
    }
    struct og_bytes sf = og_shortfall(d);
    if (d->status == OG_ST_OOM && sf.known) {
        if (!sf.neg && sf.v > 0 && d->event.caused_by_limit == 1)
            kpi(h, "bad", "Over the limit by", hbu(sf.v, a), "OOMGUARD_LIMIT refused it");
        else if (!sf.neg && sf.v > 0)
            kpi(h, "bad", "Short by", hbu(sf.v, a), "more than was free");
        else
            kpi(h, "bad", "Short by", "0 B", "enough free in total, not in one piece");
    } else if (d->status == OG_ST_OOM && d->diag.present)
        kpi(h, "bad", "Short by", "unknown", "free memory not measured");
    if (d->status == OG_ST_RECOVERED && d->event.released_between_attempts_bytes >= 0)
        kpi(h, "good", "Released to recover", hb(d->event.released_between_attempts_bytes, a),
            "by the framework between attempts");
    if (og_process_bytes(d) >= 0)
        kpi(h, "", "This process", hb(og_process_bytes(d), a),
            d->mem.process_used_bytes >= 0 ? "on the device (NVML)" : "tracked by oomguard");
    if (d->hist.peak_bytes >= 0) {
        if (isfinite(d->hist.peak_t_rel))
            snprintf(x, sizeof x, "at %.1f s", d->hist.peak_t_rel);
        kpi(h, "", "Peak", hb(d->hist.peak_bytes, a), isfinite(d->hist.peak_t_rel) ? x : NULL);
    }
    og_sb_puts(h->b, "</div>\n");
}

static void primary(struct hx *h)
{
    const struct og_cause *c = og_primary_cause(h->d);
    if (!c)
        return;
    const char *title = og_cause_title(c->id);
    og_sb_printf(h->b, "<section class=\"card primary %s\"><div class=\"muted\">Diagnosis</div><div class=\"t\">",
                 status_class(h->d));
    if (title) {
        og_sb_putc(h->b, toupper_ascii(title[0]));
        og_sb_puts(h->b, title + 1);
    } else {
        esc(h, c->id, 60);
    }
    if (isfinite(c->confidence))
        og_sb_printf(h->b, " <span class=\"muted\">(confidence %.0f%%)</span>", fmin(fmax(c->confidence, 0), 1) * 100);
    og_sb_puts(h->b, "</div>");
    if (c->summary) {
        og_sb_puts(h->b, "<p style=\"margin:6px 0 0\">");
        esc(h, c->summary, 1000);
        og_sb_puts(h->b, "</p>");
    }
    og_sb_puts(h->b, "</section>\n");
}

/* ---- chart ---- */

struct pt {
    double t, v;
};

static int pt_cmp(const void *a, const void *b)
{
    const struct pt *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

/* Usage points, sorted by time and reduced to about CHART_POINTS by keeping
 * each bucket's minimum and maximum, so spikes survive downsampling. */
static struct pt *chart_points(const struct og_dump *d, size_t *np)
{
    size_t n = 0, cap = d->hist.nsamples >= 2 ? d->hist.nsamples : d->hist.nevents;
    if (cap < 2)
        return NULL;
    struct pt *p = malloc(cap * sizeof *p);
    if (!p)
        return NULL;
    if (d->hist.nsamples >= 2) {
        for (size_t i = 0; i < d->hist.nsamples; i++)
            if (isfinite(d->hist.samples[i].t_rel) && d->hist.samples[i].live_bytes >= 0)
                p[n++] = (struct pt){ d->hist.samples[i].t_rel, (double)d->hist.samples[i].live_bytes };
    } else {
        for (size_t i = 0; i < d->hist.nevents; i++) {
            const struct og_event *e = &d->hist.events[i];
            if (isfinite(e->t_rel) && e->live_bytes >= 0 && og_event_on_device(d, e))
                p[n++] = (struct pt){ e->t_rel, (double)e->live_bytes };
        }
    }
    int sorted = 1;
    for (size_t i = 1; i < n && sorted; i++)
        sorted = p[i - 1].t <= p[i].t;
    if (!sorted)
        qsort(p, n, sizeof *p, pt_cmp);
    if (n > CHART_POINTS) {
        size_t buckets = CHART_POINTS / 2, out = 0;
        for (size_t k = 0; k < buckets; k++) {
            size_t lo = k * n / buckets, hi = (k + 1) * n / buckets, mn = lo, mx = lo;
            for (size_t i = lo; i < hi; i++) {
                if (p[i].v < p[mn].v)
                    mn = i;
                if (p[i].v > p[mx].v)
                    mx = i;
            }
            struct pt a = p[mn < mx ? mn : mx], b = p[mn < mx ? mx : mn];
            p[out++] = a;
            if (mn != mx)
                p[out++] = b;
        }
        n = out;
    }
    *np = n;
    if (n < 2) {
        free(p);
        return NULL;
    }
    return p;
}

static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

static void unit_for(double max, double *unit, const char **name)
{
    static const char *const names[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    int u = 0;
    double v = 1;
    while (u < 5 && max >= v * 1024 * 2) {
        v *= 1024;
        u++;
    }
    *unit = v;
    *name = names[u];
}

/* The time unit of an axis that spans `span` seconds: ms below 2 s, s below 2 min, min below
 * 2 h, else h (a span of 0.0023 s reads "2.3 ms", not "0.0023 s"). */
static void time_unit(double span, double *unit, const char **name)
{
    static const struct {
        double below, unit;
        const char *name;
    } units[] = {
        { 2, 0.001, "ms" },
        { 120, 1, "s" },
        { 7200, 60, "min" },
        { INFINITY, 3600, "h" },
    };
    size_t i = 0;
    while (i + 1 < sizeof units / sizeof units[0] && !(span < units[i].below))
        i++;
    *unit = units[i].unit;
    *name = units[i].name;
}

/* A tick value with the decimals its step needs (step 0.25 -> "1.25", step 5 -> "15"). */
static const char *tick(char buf[32], double v, double step)
{
    int dec = 0;
    while (dec < 6 && fabs(step * pow(10, dec) - round(step * pow(10, dec))) > 1e-6 * fmax(1, step * pow(10, dec)))
        dec++;
    if (fabs(v) < step * 1e-9)
        v = 0;
    snprintf(buf, 32, "%.*f", dec, v);
    return buf;
}

/* Width of a label in the chart's units (an estimate from the font size: the labels are
 * short and mostly digits, which are about 0.6 em wide in the sans-serif fonts used). */
static double label_width(const char *s, double size)
{
    double w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p & 0xc0) != 0x80)
            w += 0.6 * size;
    return w;
}

static void chart(struct hx *h)
{
    const struct og_dump *d = h->d;
    size_t n = 0;
    struct pt *p = chart_points(d, &n);
    if (!p)
        return;
    /* every label sits inside the plot (R: a small margin, not a label column) */
    const double W = 1000, H = 330, L = 74, R = 16, T = 16, B = 42;
    const double pw = W - L - R, ph = H - T - B;
    double t0 = p[0].t, t1 = p[n - 1].t, vmax = 0;
    for (size_t i = 0; i < n; i++)
        vmax = fmax(vmax, p[i].v);
    double tfail = d->event.present ? d->event.t_rel : NAN;
    if (isfinite(tfail)) {
        t0 = fmin(t0, tfail);
        t1 = fmax(t1, tfail);
    }
    double live_at_fail = NAN;
    if (isfinite(tfail))
        for (size_t i = 0; i < n && p[i].t <= tfail; i++)
            live_at_fail = p[i].v;
    double req = d->event.requested_bytes.known ? (double)d->event.requested_bytes.v : 0;
    if (d->device.total_bytes > 0)
        vmax = fmax(vmax, (double)d->device.total_bytes);
    if (d->device.limit_bytes >= 0)
        vmax = fmax(vmax, (double)d->device.limit_bytes);
    if (d->hist.peak_bytes >= 0)
        vmax = fmax(vmax, (double)d->hist.peak_bytes);
    if (isfinite(live_at_fail))
        vmax = fmax(vmax, live_at_fail + req);
    vmax *= 1.06;
    if (!(vmax > 0))
        vmax = 1;
    if (!(t1 > t0))
        t1 = t0 + 1;
    if (!isfinite(t1 - t0) || !isfinite(vmax)) {
        free(p);
        return;
    }
#define X(t) (L + ((t)-t0) / (t1 - t0) * pw)
#define Y(v) (T + ph - (v) / vmax * ph)

    og_sb_puts(h->b, "<section class=\"card\"><h2>Device memory over time</h2>"
                     "<svg viewBox=\"0 0 1000 330\" role=\"img\" aria-label=\"memory over time\" id=\"chart\">");
    /* y grid and labels */
    double unit;
    const char *uname;
    unit_for(vmax, &unit, &uname);
    double step = nice_step(vmax / unit, 5);
    /* Loops count steps: with hostile magnitudes `v += step` may not advance. */
    for (int k = 0; k <= 20 && step > 0 && k * step <= vmax / unit + 1e-9; k++) {
        double v = k * step, y = Y(v * unit);
        og_sb_printf(h->b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e8ecf2\"/>", L, y, L + pw,
                     y);
        og_sb_printf(h->b,
                     "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" fill=\"#5f6b7a\">%g %s</text>",
                     L - 8, y + 4, v, uname);
    }
    /* x labels, in the unit that fits the span */
    double span = t1 - t0, tu;
    const char *tn;
    time_unit(span, &tu, &tn);
    double tstep = nice_step(span / tu, 8) * tu;
    double tfirst = ceil(t0 / tstep) * tstep;
    char tb[32];
    if (tstep > 0 && isfinite(tstep) && span / tstep < 40)
        for (int k = 0; k < 40 && tfirst + k * tstep <= t1 + 1e-9; k++) {
            double t = tfirst + k * tstep;
            if (t < t0 - 1e-9)
                continue;
            og_sb_printf(
                h->b,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c9d0da\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"%s\" fill=\"#5f6b7a\">%s %s</text>",
                X(t), T + ph, X(t), T + ph + 5, X(t), T + ph + 19, X(t) > L + pw - 20 ? "end" : "middle",
                tick(tb, t / tu, tstep / tu), tn);
        }
    og_sb_printf(h->b,
                 "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" fill=\"#5f6b7a\">time since the "
                 "process started</text>",
                 L + pw / 2, H - 6);
    og_sb_printf(h->b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#8a94a3\"/>", L, T + ph, L + pw,
                 T + ph);

    /* area + line; the usage of the last point holds until the failure (the end of the axis):
     * the chart is drawn to the failure, not to the last sample before it */
    og_sb_printf(h->b, "<path fill=\"#3b6fd8\" fill-opacity=\"0.13\" d=\"M%.1f %.1f", X(p[0].t), Y(0.0));
    for (size_t i = 0; i < n; i++)
        og_sb_printf(h->b, "L%.1f %.1f", X(p[i].t), Y(p[i].v));
    og_sb_printf(h->b, "L%.1f %.1fL%.1f %.1fZ\"/>", X(t1), Y(p[n - 1].v), X(t1), Y(0.0));
    og_sb_printf(h->b,
                 "<path fill=\"none\" stroke=\"#3b6fd8\" stroke-width=\"2\" stroke-linejoin=\"round\" d=\"M%.1f %.1f",
                 X(p[0].t), Y(p[0].v));
    for (size_t i = 1; i < n; i++)
        og_sb_printf(h->b, "L%.1f %.1f", X(p[i].t), Y(p[i].v));
    if (p[n - 1].t < t1)
        og_sb_printf(h->b, "L%.1f %.1f", X(t1), Y(p[n - 1].v));
    og_sb_puts(h->b, "\"><title>device memory tracked by oomguard for this process</title></path>");

    char a[32];
    if (d->device.total_bytes > 0) {
        double y = Y((double)d->device.total_bytes);
        og_sb_printf(
            h->b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1d2330\" stroke-dasharray=\"6 4\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#1d2330\" text-anchor=\"end\">device total %s</text>",
            L, y, L + pw, y, L + pw - 6, y - 5, hb(d->device.total_bytes, a));
    }
    if (d->device.limit_bytes >= 0) {
        double y = Y((double)d->device.limit_bytes);
        og_sb_printf(
            h->b,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c98a00\" stroke-dasharray=\"3 3\" "
            "stroke-width=\"1.5\"/>"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#8a5d00\" text-anchor=\"end\">limit %s</text>",
            L, y, L + pw, y, L + pw - 6, y + 15, hb(d->device.limit_bytes, a));
    }
    if (d->hist.peak_bytes >= 0 && isfinite(d->hist.peak_t_rel) && d->hist.peak_t_rel >= t0 && d->hist.peak_t_rel <= t1)
        og_sb_printf(h->b,
                     "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#fff\" stroke=\"#3b6fd8\" stroke-width=\"2\">"
                     "<title>peak %s</title></circle>",
                     X(d->hist.peak_t_rel), Y((double)d->hist.peak_bytes), hb(d->hist.peak_bytes, a));
    if (isfinite(tfail)) {
        const char *col = d->status == OG_ST_RECOVERED ? "#1f9d55" : "#d93636";
        double x = X(tfail);
        og_sb_printf(h->b,
                     "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"4 3\" "
                     "stroke-width=\"1.5\"/>",
                     x, T, x, T + ph, col);
        if (isfinite(live_at_fail) && req > 0)
            og_sb_printf(h->b,
                         "<rect x=\"%.1f\" y=\"%.1f\" width=\"8\" height=\"%.1f\" fill=\"%s\" fill-opacity=\"0.55\">"
                         "<title>the failed request: %s on top of the usage at that moment</title></rect>",
                         x - 4, Y(live_at_fail + req), fmax(Y(live_at_fail) - Y(live_at_fail + req), 1.0), col,
                         hbu(d->event.requested_bytes.v, a));
        /* Below the device-total line, which sits near the top (the limit's label is under it
         * when there is one); on the side of the failure line that has room for it. */
        const char *what = d->status == OG_ST_RECOVERED    ? "failed, recovered"
                           : d->event.caused_by_limit == 1 ? "refused by OOMGUARD_LIMIT"
                                                           : "out of memory";
        char label[96];
        if (req > 0)
            snprintf(label, sizeof label, "%s \u00b7 %s requested", what, hbu(d->event.requested_bytes.v, a));
        else
            snprintf(label, sizeof label, "%s", what);
        double lw = label_width(label, 12);
        int right = x + 8 + lw > L + pw && x - 8 - lw >= L;
        double ly = d->device.total_bytes > 0 ? Y((double)d->device.total_bytes) + 18 : T + 14;
        if (d->device.limit_bytes >= 0 && fabs(ly - (Y((double)d->device.limit_bytes) + 15)) < 14)
            ly += 16;
        double lx = right ? x - 8 : fmin(x + 8, L + pw - lw);
        og_sb_printf(h->b,
                     "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"600\" fill=\"%s\" text-anchor=\"%s\">",
                     fmax(lx, L + 2), ly, col, right ? "end" : "start");
        sb_html(h->b, label, 96, 0);
        og_sb_puts(h->b, "</text>");
    }
    og_sb_puts(h->b, "</svg>");
    og_sb_printf(h->b,
                 "<div class=\"muted\" style=\"font-size:12px\">Device memory this process held through the "
                 "allocation APIs oomguard tracks (%zu points%s).</div></section>\n",
                 n, (d->hist.nsamples >= 2 ? d->hist.nsamples : d->hist.nevents) > n ? ", downsampled" : "");
#undef X
#undef Y
    free(p);
}

/* ---- where the memory is ---- */

static const char *part_color(int kind)
{
    static const char *const c[P_NPARTS] = { "#3b6fd8", "#9dbcf2", "#d6a23b", "#8e5ad6",
                                             "#6b8bd6", "#e8833a", "#b9c0ca", "#bfe3c8" };
    return c[kind];
}

static void breakdown(struct hx *h)
{
    const struct og_dump *d = h->d;
    struct og_part parts[P_NPARTS];
    int64_t scale;
    int n = og_breakdown(d, parts, &scale);
    if (!n || scale <= 0)
        return;
    char a[32];
    struct og_bytes req = d->event.present ? d->event.requested_bytes : (struct og_bytes){ 0 };
    /* Room on the right for a request that sticks out past the device. */
    double total = (double)scale, room = 1000 - 150;
    double free_x = -1, x = 0;
    og_sb_puts(h->b,
               "<section class=\"card\"><h2>Where the memory is</h2><svg viewBox=\"0 0 1000 104\" id=\"breakdown\">"
               "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
               "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f7d4d4\"/>"
               "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#d93636\" stroke-width=\"3\"/></pattern></defs>");
    og_sb_puts(h->b, "<text x=\"0\" y=\"12\" font-size=\"12\" fill=\"#5f6b7a\">device</text>");
    for (int i = 0; i < n; i++) {
        double w = (double)parts[i].bytes / total * room;
        if (parts[i].kind == P_FREE)
            free_x = x;
        og_sb_printf(h->b, "<rect x=\"%.2f\" y=\"18\" width=\"%.2f\" height=\"34\" fill=\"%s\"%s><title>", x, w,
                     part_color(parts[i].kind),
                     parts[i].kind == P_FREE ? " stroke=\"#1f9d55\" stroke-width=\"1\"" : "");
        esc(h, parts[i].label, 80);
        og_sb_printf(h->b, ": %s</title></rect>", hb(parts[i].bytes, a));
        x += w;
    }
    if (req.known) {
        double rx = free_x >= 0 ? free_x : x, rw = (double)req.v / total * room;
        double fw = free_x >= 0 ? x - free_x : 0; /* free segment width */
        og_sb_printf(h->b, "<text x=\"0\" y=\"72\" font-size=\"12\" fill=\"#5f6b7a\">request</text>");
        double fit = fmin(rw, fw);
        if (fit > 0)
            og_sb_printf(
                h->b, "<rect x=\"%.2f\" y=\"78\" width=\"%.2f\" height=\"20\" fill=\"#d93636\" fill-opacity=\"0.75\"/>",
                rx, fit);
        if (rw > fw)
            og_sb_printf(
                h->b,
                "<rect x=\"%.2f\" y=\"78\" width=\"%.2f\" height=\"20\" fill=\"url(#hatch)\" stroke=\"#d93636\"/>",
                rx + fit, fmin(rw - fit, 1000 - rx - fit));
        og_sb_printf(h->b,
                     "<line x1=\"%.2f\" y1=\"14\" x2=\"%.2f\" y2=\"100\" stroke=\"#d93636\" stroke-dasharray=\"3 2\"/>",
                     rx, rx);
        double lx = fmin(rx + rw + 8, 1000 - 4);
        int anchor_end = rx + rw + 8 > 1000 - 140;
        og_sb_printf(h->b,
                     "<text x=\"%.2f\" y=\"93\" font-size=\"12\" font-weight=\"600\" fill=\"#b02a2a\" "
                     "text-anchor=\"%s\">%s%s</text>",
                     anchor_end ? fmax(rx - 8, 60) : lx, anchor_end ? "end" : "start", hbu(req.v, a),
                     rw > fw && d->status != OG_ST_RECOVERED ? " \u2014 does not fit" : "");
    }
    if (d->device.limit_bytes >= 0 && (double)d->device.limit_bytes < total) {
        double lx = (double)d->device.limit_bytes / total * room;
        og_sb_printf(
            h->b,
            "<line x1=\"%.2f\" y1=\"14\" x2=\"%.2f\" y2=\"56\" stroke=\"#c98a00\" stroke-width=\"2.5\"/>"
            "<text x=\"%.2f\" y=\"11\" font-size=\"11\" fill=\"#8a5d00\" text-anchor=\"middle\">limit %s</text>",
            lx, lx, lx, hb(d->device.limit_bytes, a));
    }
    og_sb_puts(h->b, "</svg><div class=\"legend\">");
    for (int i = 0; i < n; i++) {
        og_sb_printf(h->b, "<div><span class=\"sw\" style=\"background:%s\"></span>", part_color(parts[i].kind));
        esc(h, parts[i].label, 80);
        og_sb_printf(h->b, "<span class=\"n\">%s <span class=\"muted\">%.1f%%</span></span></div>",
                     hb(parts[i].bytes, a), 100.0 * (double)parts[i].bytes / total);
    }
    if (req.known)
        og_sb_printf(h->b,
                     "<div><span class=\"sw\" style=\"background:#d93636\"></span>Failed request"
                     "<span class=\"n\">%s</span></div>",
                     hbu(req.v, a));
    og_sb_puts(h->b, "</div>");

    const cJSON *fw = d->mem.framework, *it;
    if (fw) {
        int first = 1;
        cJSON_ArrayForEach(it, fw)
        {
            size_t kl = it->string ? strlen(it->string) : 0;
            if (kl <= 6 || strcmp(it->string + kl - 6, "_bytes") || !cJSON_IsNumber(it))
                continue;
            if (first)
                og_sb_printf(h->b, "<h2 style=\"margin-top:16px\">%s allocator</h2><div class=\"kv\">",
                             og_framework_title(d->framework_name));
            first = 0;
            char key[48];
            snprintf(key, sizeof key, "%.*s", (int)(kl - 6 > 40 ? 40 : kl - 6), it->string);
            og_sb_puts(h->b, "<div class=\"n\">");
            esc(h, key, 40);
            struct og_bytes v;
            og_sb_printf(h->b, "</div><div>%s</div>", og_json_bytes(it, &v) && !v.neg ? hbu(v.v, a) : "?");
        }
        if (!first)
            og_sb_puts(h->b, "</div>");
        /* the framework's view next to the driver-level count, reconciled */
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(fw, "reserved_bytes");
        const cJSON *rsrc = cJSON_GetObjectItemCaseSensitive(fw, "reserved_source");
        struct og_bytes rv;
        if (cJSON_IsString(rsrc) && !strcmp(rsrc->valuestring, "ledger")) { /* one view: the ledger's */
            og_sb_printf(h->b,
                         "<p class=\"muted\">%s publishes no reservation: oomguard counted it at the driver from "
                         "its libraries.</p>",
                         og_framework_title(d->framework_name));
        } else if (og_json_bytes(res, &rv) && !rv.neg && rv.v <= INT64_MAX && d->mem.framework_bytes >= 0) {
            char b2[32];
            int64_t own = d->mem.framework_bytes - og_other_framework_bytes(d, NULL);
            int64_t r = (int64_t)rv.v, diff = own - r;
            og_sb_printf(h->b,
                         "<h2 style=\"margin-top:16px\">Two views</h2><div class=\"kv\">"
                         "<div class=\"n\">%s reserved</div><div>%s</div>",
                         og_framework_title(d->framework_name), hb(r, a));
            og_sb_printf(h->b, "<div class=\"n\">oomguard at the driver</div><div>%s</div>", hb(own, b2));
            og_sb_printf(h->b, "<div class=\"n\">difference</div><div>%s%s</div></div>", hb(diff < 0 ? -diff : diff, a),
                         diff == 0  ? " (the views agree)"
                         : diff > 0 ? " more at the driver: memory its libraries took outside its allocator"
                                    : " less at the driver: segments not attributed to it, or released since");
        }
    }
    og_sb_puts(h->b, "</section>\n");
}

/* One line of og_roles_facts: a term and its description */
static void html_fact(void *ctx, const char *label, const char *text)
{
    struct hx *h = ctx;
    og_sb_puts(h->b, "<dt>");
    esc(h, label, 80);
    og_sb_puts(h->b, "</dt><dd>");
    esc(h, text, 600);
    og_sb_puts(h->b, "</dd>");
}

/* What the allocated memory is for (memory.framework.roles) and what the job was doing
 * (event.phase): the first card when the adapter measured them. */
static void roles_card(struct hx *h)
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
    const struct og_dump *d = h->d;
    const struct og_roles_view *r = &d->mem.roles;
    char a[32];
    if (!r->present && !d->event.phase && !d->mem.nother_fw)
        return;
    og_sb_puts(h->b, "<section class=\"card\" id=\"roles\">");
    if (d->event.phase) {
        og_sb_puts(h->b, "<h2>Phase: ");
        esc(h, d->event.phase, 40);
        og_sb_puts(h->b, "</h2>");
        /* the program's own line (event.phase_site), then the framework's frame that decided */
        const struct og_pyframe *site = og_phase_line(d), *f = &d->event.phase_frame;
        if (site || f->file || d->event.phase_source) {
            og_sb_puts(h->b, "<p class=\"muted\">");
            for (int k = 0; k < 2; k++) {
                const struct og_pyframe *w = k ? f : site;
                if (!w || !w->file || (k && og_same_pyframe(w, site)))
                    continue;
                og_sb_puts(h->b, k && site ? "decided in <code>" : "<code>");
                esc(h, w->file, 200);
                og_sb_printf(h->b, ":%lld</code> in <code>", (long long)w->line);
                esc(h, w->function, 80);
                og_sb_puts(h->b, "</code> ");
            }
            if (d->event.phase_source) {
                og_sb_puts(h->b, "(from the ");
                esc(h, d->event.phase_source, 96);
                og_sb_puts(h->b, ")");
            }
            og_sb_puts(h->b, "</p>");
        }
    }
    if (r->present) {
        og_sb_puts(h->b, "<h2>What the allocated memory is for");
        if (r->allocated_bytes >= 0)
            og_sb_printf(h->b, " <span class=\"muted\">(%s allocated)</span>", hb(r->allocated_bytes, a));
        og_sb_puts(h->b, "</h2><table class=\"roles\"><tbody>");
        for (int i = 0; i < OG_NROLE_IX; i++) {
            if (quiet[i] && r->bytes[i] <= 0)
                continue;
            og_sb_puts(h->b, "<tr><td>");
            esc(h, labels[i], 60);
            if (r->tensors[i] > 0)
                og_sb_printf(h->b, " <span class=\"muted\">%lld tensor%s</span>", (long long)r->tensors[i],
                             r->tensors[i] == 1 ? "" : "s");
            if (i == OG_RX_per_sample_gradients && r->per_sample_count > 0)
                og_sb_printf(h->b, " <span class=\"muted\">one gradient per example, %lld examples</span>",
                             (long long)r->per_sample_count);
            if (r->bytes[i] < 0) {
                og_sb_puts(h->b, "</td><td class=\"num\">unknown</td><td></td></tr>");
                continue;
            }
            double pct = r->allocated_bytes > 0 ? 100.0 * (double)r->bytes[i] / (double)r->allocated_bytes : 0;
            og_sb_printf(h->b,
                         "</td><td class=\"num\">%s</td><td><svg width=\"200\" height=\"10\"><rect width=\"%.1f\" "
                         "height=\"10\" fill=\"#3b82c4\"/></svg></td></tr>",
                         hb(r->bytes[i], a), pct > 100 ? 200.0 : pct * 2.0);
            for (int k = 0; i == OG_RX_optimizer_state && k < r->noptimizers; k++) {
                og_sb_puts(h->b, "<tr><td style=\"padding-left:22px\">");
                esc(h, r->optimizers[k].cls, 48);
                if (r->optimizers[k].tensors >= 0)
                    og_sb_printf(h->b, " <span class=\"muted\">%lld tensors</span>",
                                 (long long)r->optimizers[k].tensors);
                if (r->optimizers[k].parameters_bytes >= 0)
                    og_sb_printf(h->b, " <span class=\"muted\">for %s of parameters</span>",
                                 hb(r->optimizers[k].parameters_bytes, a));
                if (r->optimizers[k].not_elementwise_bytes > 0)
                    og_sb_printf(h->b, " <span class=\"muted\">%s of it matrices (not one value per weight)</span>",
                                 hb(r->optimizers[k].not_elementwise_bytes, a));
                og_sb_printf(h->b, "</td><td class=\"num\">%s</td><td></td></tr>", hb(r->optimizers[k].bytes, a));
            }
            for (int k = 0; i == OG_RX_held_by_python && k < r->nholders; k++) {
                const struct og_role_holder_view *x = &r->holders[k];
                og_sb_puts(h->b, "<tr><td style=\"padding-left:22px\"><code title=\"");
                const char *parts[][2] = { { "name", x->name }, { "kind", x->kind }, { "where", x->where } };
                for (size_t q = 0; q < sizeof parts / sizeof *parts; q++)
                    if (parts[q][1]) {
                        og_sb_printf(h->b, "%s%s: ", q ? "; " : "", parts[q][0]);
                        esc(h, parts[q][1], 120);
                    }
                og_sb_puts(h->b, "\">");
                esc(h, x->label, 160);
                og_sb_puts(h->b, "</code>");
                if (x->tensors >= 0)
                    og_sb_printf(h->b, " <span class=\"muted\">%lld tensors</span>", (long long)x->tensors);
                if (x->purpose) {
                    og_sb_puts(h->b, " <span class=\"muted\">kept as ");
                    esc(h, x->purpose, 40);
                    og_sb_puts(h->b, "</span>");
                }
                if (x->copy_of) {
                    og_sb_puts(h->b, " <span class=\"muted\">a copy of the ");
                    esc(h, x->copy_of, 40);
                    og_sb_puts(h->b, "</span>");
                }
                if (x->records > 0)
                    og_sb_printf(h->b, " <span class=\"muted\">%lld like records</span>", (long long)x->records);
                if (x->graphs > 0)
                    og_sb_puts(h->b, " <span class=\"muted\">keeping their autograd graphs</span>");
                if (x->restored_bytes > 0) {
                    og_sb_printf(h->b, " <span class=\"muted\">%s restored onto the GPU by torch.load",
                                 hb(x->restored_bytes, a));
                    if (x->restored_site.file) {
                        og_sb_puts(h->b, " at ");
                        esc(h, x->restored_site.file, 200);
                        og_sb_printf(h->b, ":%lld", (long long)x->restored_site.line);
                    }
                    og_sb_puts(h->b, "</span>");
                }
                if (x->float64_bytes > 0)
                    og_sb_printf(h->b, " <span class=\"muted\">%s of it float64</span>", hb(x->float64_bytes, a));
                if (x->bound_bytes > 0)
                    og_sb_printf(h->b, " <span class=\"muted\">kept to %s (its object's bound)</span>",
                                 hb(x->bound_bytes, a));
                if (x->bound_records > 0)
                    og_sb_printf(h->b, " <span class=\"muted\">kept to %lld entries (its bound)</span>",
                                 (long long)x->bound_records);
                if (x->site.file) {
                    og_sb_puts(h->b, " <span class=\"muted\">made at ");
                    esc(h, x->site.file, 200);
                    og_sb_printf(h->b, ":%lld</span>", (long long)x->site.line);
                }
                og_sb_printf(h->b, "</td><td class=\"num\">%s</td><td></td></tr>", hb(x->bytes, a));
            }
        }
        og_sb_puts(h->b, "</tbody></table>");
        if (r->why) {
            og_sb_puts(h->b, "<p class=\"muted\">");
            esc(h, r->why, 200);
            og_sb_puts(h->b, "</p>");
        }
    }
    og_sb_puts(h->b, "<dl class=\"facts\">");
    og_roles_facts(d, html_fact, h);
    og_sb_puts(h->b, "</dl></section>\n");
}

static void causes(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!d->diag.ncauses)
        return;
    og_sb_puts(h->b, "<section class=\"card\"><h2>Diagnosis</h2>");
    for (int i = 0; i < d->diag.ncauses; i++) {
        const struct og_cause *c = &d->diag.causes[i];
        double conf = isfinite(c->confidence) ? fmin(fmax(c->confidence, 0), 1) : 0;
        og_sb_puts(h->b, "<div class=\"cause\"><div class=\"hd\"><code>");
        esc(h, c->id ? c->id : "?", 60);
        og_sb_printf(
            h->b,
            "</code><span class=\"conf\"><i style=\"width:%.0f%%\"></i></span><span class=\"muted\">%.0f%%</span>",
            conf * 100, conf * 100);
        const char *title = og_cause_title(c->id);
        if (title)
            og_sb_printf(h->b, "<span class=\"muted\" style=\"font-weight:400\">%s</span>", title);
        og_sb_puts(h->b, "</div>");
        if (c->summary) {
            og_sb_puts(h->b, "<div style=\"margin-top:4px\">");
            esc(h, c->summary, 2000);
            og_sb_puts(h->b, "</div>");
        }
        if (c->nevidence) {
            og_sb_puts(h->b, "<div class=\"ev\">");
            for (int j = 0; j < c->nevidence && j < 50; j++) {
                og_sb_puts(h->b, "<div class=\"n mono\">");
                esc(h, c->evidence[j].name, 60);
                og_sb_puts(h->b, "</div><div>");
                og_evidence_value(h->b, &c->evidence[j], 1);
                og_sb_puts(h->b, "</div>");
            }
            og_sb_puts(h->b, "</div>");
        }
        og_sb_puts(h->b, "</div>");
    }
    og_sb_puts(h->b, "</section>\n");
}

static void remedies(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!d->nremedies)
        return;
    og_sb_puts(h->b, "<section class=\"card\" id=\"remedies\"><h2>What to do</h2>");
    int folded = 0;
    for (int i = 0; i < d->nremedies && i < 30; i++) {
        const struct og_remedy *r = &d->remedies[i];
        if (!og_remedy_shown(d, i)) {
            folded++;
            continue;
        }
        og_sb_printf(h->b, "<div class=\"remedy\"><div class=\"rank\">%lld</div><div><div class=\"t\">",
                     (long long)(r->rank >= 0 && r->rank < 1000 ? r->rank : i + 1));
        esc(h, r->title ? r->title : r->id ? r->id : "?", 300);
        if (r->id) {
            og_sb_puts(h->b, " <code class=\"muted\" style=\"font-size:12px;font-weight:400\">");
            esc(h, r->id, 60);
            og_sb_puts(h->b, "</code>");
        }
        og_sb_puts(h->b, "</div>");
        if (r->saving || r->cost) {
            og_sb_puts(h->b, "<div class=\"chips\">");
            if (r->saving) {
                og_sb_puts(h->b, "<span class=\"chip save\">saves ");
                esc(h, r->saving, OG_REMEDY_FIELD_MAX);
                og_sb_puts(h->b, "</span>");
            }
            if (r->cost) {
                og_sb_puts(h->b, "<span class=\"chip cost\">cost: ");
                esc(h, r->cost, OG_REMEDY_FIELD_MAX);
                og_sb_puts(h->b, "</span>");
            }
            og_sb_puts(h->b, "</div>");
        }
        if (r->why) {
            og_sb_puts(h->b, "<div>");
            esc(h, r->why, OG_REMEDY_WHY_MAX);
            og_sb_puts(h->b, "</div>");
        }
        if (r->nhow) {
            og_sb_puts(h->b, "<pre>");
            for (int j = 0; j < r->nhow && j < 40; j++) {
                sb_html(h->b, r->how[j], 500, OG_TEXT_KEEP_NL);
                og_sb_putc(h->b, '\n');
            }
            og_sb_puts(h->b, "</pre>");
        }
        og_sb_puts(h->b, "</div></div>");
    }
    if (folded) { /* the rest, one line each, folded */
        og_sb_printf(h->b, "<details id=\"also-possible\"><summary>Also possible (%d)</summary><ol class=\"also\">",
                     folded);
        for (int i = 0; i < d->nremedies && i < 30; i++) {
            const struct og_remedy *r = &d->remedies[i];
            if (og_remedy_shown(d, i))
                continue;
            og_sb_printf(h->b, "<li value=\"%lld\">", (long long)(r->rank >= 1 && r->rank < 1000 ? r->rank : i + 1));
            esc(h, r->title ? r->title : r->id ? r->id : "?", 300);
            if (r->id) {
                og_sb_puts(h->b, " <code class=\"muted\">");
                esc(h, r->id, 60);
                og_sb_puts(h->b, "</code>");
            }
            og_sb_printf(h->b, "%s</li>", r->tier == 3 ? OG_NOT_ENOUGH_ALONE : "");
        }
        og_sb_puts(h->b, "</ol></details>");
    }
    og_sb_puts(h->b, "</section>\n");
}

/* One frame: name (demangled), file:line (full path on hover), library; "library+offset"
 * when nothing names it. */
static void frame_item(struct hx *h, const struct og_sym *y, int is_caller)
{
    og_sb_puts(h->b, is_caller ? "<li class=\"caller\">" : "<li>");
    if (y->function) {
        og_sb_puts(h->b, "<span class=\"fn\">");
        esc(h, y->function, 300);
        og_sb_puts(h->b, "</span>");
        if (y->inlined) {
            og_sb_puts(h->b, y->inlined_into ? " <span class=\"lib\">(inlined into " : " <span class=\"lib\">(inlined");
            if (y->inlined_into)
                esc(h, y->inlined_into, 200);
            og_sb_puts(h->b, ")</span>");
        }
        if (y->file && y->line > 0) {
            const char *base = strrchr(y->file, '/');
            og_sb_puts(h->b, " <span class=\"src\" title=\"");
            esc(h, y->file, 400);
            og_sb_puts(h->b, "\">");
            esc(h, base ? base + 1 : y->file, 120);
            og_sb_printf(h->b, ":%lld</span>", (long long)y->line);
        }
        if (y->module) {
            og_sb_puts(h->b, " <span class=\"lib\">");
            esc(h, y->module, 100);
            og_sb_puts(h->b, "</span>");
        }
    } else {
        esc(h, y->where, 200);
    }
    if (is_caller)
        og_sb_puts(h->b, " <span class=\"tag\">caller</span>");
    og_sb_puts(h->b, "</li>");
}

/* Runs of interpreter frames and of CUDA-library frames fold into one item; the first
 * frame outside the CUDA libraries and the framework's allocator is marked as the caller. */
static void frame_list(struct hx *h, const struct og_frame *f, int n, int max)
{
    struct og_sym *y = n > 0 ? calloc((size_t)n, sizeof *y) : NULL;
    if (!y)
        return;
    int caller = og_stack_symbolize(f, n, y);
    if (og_stack_python_only(y, n)) {
        og_sb_printf(h->b,
                     "<ol class=\"frames mono\"><li class=\"muted\">%s (%d native frame%s: the interpreter, "
                     "the CUDA libraries)</li></ol>",
                     OG_PYTHON_CODE_LINE, n, n == 1 ? "" : "s");
        free(y);
        return;
    }
    og_sb_puts(h->b, "<ol class=\"frames mono\">");
    int items = 0, i = 0;
    while (i < n && items < max) {
        int run = og_fold_run(y, n, i);
        if (run >= 2) {
            og_sb_printf(h->b, "<li class=\"muted\">\u2026 %d %s (", run, og_fold_label(&y[i]));
            esc(h, y[i].function ? y[i].function : y[i].where, 80);
            og_sb_puts(h->b, " \u2026 ");
            esc(h, y[i + run - 1].function ? y[i + run - 1].function : y[i + run - 1].where, 80);
            og_sb_puts(h->b, ")</li>");
            i += run;
        } else {
            frame_item(h, &y[i], i == caller);
            i++;
        }
        items++;
    }
    if (n > i)
        og_sb_printf(h->b, "<li class=\"muted\">\u2026 %d more frames</li>", n - i);
    og_sb_puts(h->b, "</ol>");
    free(y);
}

/* The caller's name for a site's one-line label. */
static void caller_label(struct hx *h, const struct og_frame *f, int n)
{
    struct og_sym *y = n > 0 ? calloc((size_t)n, sizeof *y) : NULL;
    if (!y)
        return;
    int caller = og_stack_symbolize(f, n, y);
    if (og_stack_python_only(y, n)) {
        og_sb_puts(h->b, OG_PYTHON_CODE_LINE);
        free(y);
        return;
    }
    const struct og_sym *c = &y[caller >= 0 ? caller : 0];
    esc(h, c->function ? c->function : c->where, 90);
    if (c->function && c->file && c->line > 0) {
        const char *base = strrchr(c->file, '/');
        og_sb_puts(h->b, " ");
        esc(h, base ? base + 1 : c->file, 60);
        og_sb_printf(h->b, ":%lld", (long long)c->line);
    }
    free(y);
}

static void sites(struct hx *h, int top)
{
    const struct og_dump *d = h->d;
    if (!d->nsites)
        return;
    char a[32], g[32];
    int shown = d->nsites < top ? d->nsites : top;
    og_sb_printf(h->b,
                 "<section class=\"card\"><h2>Top allocation sites <span class=\"muted\" style=\"font-weight:400\">"
                 "%d of %s, %s in all</span></h2>",
                 shown, group_digits(d->sites_total, g), hb(d->sites_total_bytes, a));
    og_sb_puts(h->b,
               "<table id=\"sites\" class=\"fixed\"><colgroup><col style=\"width:4%\"><col style=\"width:10%\">"
               "<col style=\"width:10%\"><col style=\"width:8%\"><col style=\"width:11%\"><col style=\"width:15%\">"
               "<col style=\"width:42%\"></colgroup><thead><tr><th class=\"num\">#</th><th "
               "class=\"num\">memory</th><th>share</th>"
               "<th class=\"num\">blocks</th><th>api</th><th>library</th><th>where</th></tr></thead><tbody>");
    double max = d->sites[0].bytes > 0 ? (double)d->sites[0].bytes : 1;
    for (int i = 0; i < shown; i++) {
        const struct og_site *s = &d->sites[i];
        og_sb_printf(h->b,
                     "<tr><td class=\"num\">%d</td><td class=\"num\">%s</td>"
                     "<td><div class=\"share\"><i style=\"width:%.1f%%\"></i></div></td><td class=\"num\">%s</td><td "
                     "class=\"mono\">",
                     i + 1, hb(s->bytes, a), s->bytes > 0 ? 100.0 * (double)s->bytes / max : 0.0,
                     s->blocks >= 0 ? group_digits(s->blocks, g) : "-");
        esc(h, s->api ? s->api : "-", 40);
        og_sb_puts(h->b, "</td><td class=\"mono\">");
        esc(h, og_frames_python_only(s->frames, s->nframes) ? "Python code" : s->library ? s->library : "-", 80);
        og_sb_puts(h->b, "</td><td>");
        if (s->nframes) {
            /* Labelled with the caller: the runtime's and the allocator's own frames
             * are the same for every site. */
            og_sb_puts(h->b, "<details><summary class=\"mono\" style=\"font-size:12px\">");
            caller_label(h, s->frames, s->nframes);
            og_sb_puts(h->b, "</summary>");
            frame_list(h, s->frames, s->nframes, 40);
            og_sb_puts(h->b, "</details>");
        } else {
            og_sb_puts(h->b, "<span class=\"muted\">no stack</span>");
        }
        og_sb_puts(h->b, "</td></tr>");
    }
    og_sb_puts(h->b, "</tbody></table></section>\n");
}

/* The first thing a Python user reads, right under the diagnosis: the failing Python line and
 * its stack, the lines holding the most live memory (python_sites), or how to get them. */
static void python_first(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!og_python_job(d))
        return;
    og_sb_puts(h->b, "<section class=\"card\" id=\"python\"><h2>Python lines</h2>");
    const struct og_pyframe *mine = og_failing_python_line(d);
    if (mine) {
        const struct og_pyframe *p = mine;
        og_sb_puts(
            h->b,
            "<div class=\"muted\">The failing line</div><div class=\"mono\" style=\"font-size:15px;font-weight:600\">");
        esc(h, p->file ? p->file : "?", 300);
        if (p->line > 0)
            og_sb_printf(h->b, ":%lld", (long long)p->line);
        og_sb_puts(h->b, " in ");
        esc(h, p->function ? p->function : "?", 200);
        og_sb_puts(h->b, "</div>");
        og_sb_puts(h->b, "<div class=\"muted\" style=\"margin-top:10px\">Python stack</div><ol class=\"frames mono\">");
        for (int i = 0; i < d->event.npython_stack && i < 64; i++) {
            p = &d->event.python_stack[i];
            og_sb_puts(h->b, "<li><span class=\"fn\">");
            esc(h, p->function ? p->function : "?", 200);
            og_sb_puts(h->b, "</span> <span class=\"src\">");
            esc(h, p->file ? p->file : "?", 300);
            if (p->line > 0)
                og_sb_printf(h->b, ":%lld", (long long)p->line);
            og_sb_puts(h->b, "</span></li>");
        }
        og_sb_puts(h->b, "</ol>");
    }
    if (d->npython_sites > 0) {
        char a[32], g[32];
        og_sb_puts(h->b,
                   "<div class=\"muted\" style=\"margin-top:10px\">Python lines holding the most live memory</div>"
                   "<table id=\"python-sites\"><thead><tr><th class=\"num\">memory</th><th class=\"num\">blocks</th>"
                   "<th>line</th></tr></thead><tbody>");
        for (int i = 0; i < d->npython_sites && i < 50; i++) {
            const struct og_pyframe *p = &d->python_sites[i];
            og_sb_printf(h->b, "<tr><td class=\"num\">%s</td><td class=\"num\">%s</td><td class=\"mono\">",
                         p->bytes >= 0 ? hb(p->bytes, a) : "-", p->blocks >= 0 ? group_digits(p->blocks, g) : "-");
            esc(h, p->file ? p->file : "?", 300);
            og_sb_printf(h->b, ":%lld in ", (long long)p->line);
            esc(h, p->function ? p->function : "?", 200);
            og_sb_puts(h->b, "</td></tr>");
        }
        og_sb_puts(h->b, "</tbody></table>");
    } else if (d->framework_name && !strcmp(d->framework_name, "pytorch")) {
        const char *v = og_env_value(d, "OOMGUARD_PYTHON_STACKS");
        og_sb_puts(
            h->b,
            v && !strcmp(v, "1")
                ? "<p class=\"muted\" id=\"python-hint\">Python lines holding memory: none reported although "
                  "<code>OOMGUARD_PYTHON_STACKS=1</code> (the adapter could not read PyTorch's allocation history).</p>"
                : "<p class=\"muted\" id=\"python-hint\">Python lines holding memory: not recorded; run with "
                  "<code>OOMGUARD_PYTHON_STACKS=1</code> to list them (costs per allocation).</p>");
    }
    og_sb_puts(h->b, "</section>\n");
}

/* summary.devices: each GPU's peak and the card sizes it would fit on. */
static void fits(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!d->ndevsum)
        return;
    char a[32];
    og_sb_puts(h->b, "<section class=\"card\"><h2>Peak per GPU, and the cards it fits on</h2><table><thead><tr>"
                     "<th class=\"num\">GPU</th><th class=\"num\">peak</th><th class=\"num\">at</th><th>mostly</th>"
                     "<th>fits on</th></tr></thead><tbody>");
    for (int i = 0; i < d->ndevsum && i < 64; i++) {
        const struct og_devsum *v = &d->devsum[i];
        og_sb_printf(h->b, "<tr><td class=\"num\">%lld</td><td class=\"num\">%s</td><td class=\"num\">",
                     (long long)v->index, v->peak_bytes >= 0 ? hb(v->peak_bytes, a) : "-");
        if (isfinite(v->peak_t_rel))
            og_sb_printf(h->b, "%.1f s", v->peak_t_rel);
        og_sb_puts(h->b, "</td><td class=\"mono\">");
        esc(h, v->peak_library ? v->peak_library : "-", 80);
        og_sb_puts(h->b, "</td><td>");
        for (int j = 0; j < v->nfits && j < 32; j++)
            og_sb_printf(h->b, "<span class=\"chip %s\">%g GB %s</span>", v->fits[j].fits == 1 ? "save" : "cost",
                         v->fits[j].card_gb,
                         v->fits[j].fits == 1   ? "\u2713"
                         : v->fits[j].fits == 0 ? "\u2717"
                                                : "?");
        if (v->unbounded_why) {
            og_sb_puts(h->b, "<div class=\"muted\">? unknown: ");
            esc(h, v->unbounded_why, 200);
            og_sb_puts(h->b, "</div>");
        }
        og_sb_puts(h->b, "</td></tr>");
    }
    og_sb_puts(h->b, "</tbody></table></section>\n");
}

static void failed_call(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!d->event.present)
        return;
    char a[32];
    og_sb_puts(h->b, "<section class=\"card\"><h2>The failed call</h2><div class=\"kv\">");
#define KV(name) og_sb_puts(h->b, "<div class=\"n\">" name "</div><div class=\"v\">")
    if (d->event.api) {
        KV("api");
        esc(h, d->event.api, 80);
        if (d->event.driver_api) {
            og_sb_puts(h->b, " \u2192 ");
            esc(h, d->event.driver_api, 80);
        }
        og_sb_puts(h->b, "</div>");
    }
    if (d->event.library) {
        KV("called from");
        if (og_event_python_only(d))
            og_sb_puts(h->b, "Python code, via ");
        esc(h, d->event.library, 120);
        og_sb_puts(h->b, "</div>");
    }
    if (d->event.requested_bytes.known) {
        char g[32];
        KV("requested");
        og_sb_printf(h->b, "%s (%s bytes)</div>", hbu(d->event.requested_bytes.v, a),
                     group_digits_u64(d->event.requested_bytes.v, g));
    } else if (d->status == OG_ST_OOM || d->status == OG_ST_RECOVERED) {
        KV("requested");
        og_sb_puts(h->b, "size not given</div>");
    }
    if (d->event.result >= 0) {
        const char *rn = og_result_name(d->event.result);
        KV("result");
        og_sb_printf(h->b, "%lld%s%s%s</div>", (long long)d->event.result, rn ? " (" : "", rn ? rn : "", rn ? ")" : "");
    }
    if (d->event.attempts >= 0) {
        KV("attempts");
        og_sb_printf(h->b, "%lld", (long long)d->event.attempts);
        if (d->event.released_between_attempts_bytes >= 0)
            og_sb_printf(h->b, ", %s released between them", hb(d->event.released_between_attempts_bytes, a));
        og_sb_puts(h->b, "</div>");
    }
    if (d->event.stream_ordered >= 0 || d->event.caused_by_limit >= 0) {
        KV("kind");
        og_sb_printf(h->b, "%s%s</div>", d->event.stream_ordered == 1 ? "stream-ordered (pool)" : "plain",
                     d->event.caused_by_limit == 1 ? ", refused by OOMGUARD_LIMIT" : "");
    }
#undef KV
    og_sb_puts(h->b, "</div>");
    if (d->event.npython_stack > 0) /* the Python lines are at the top of the page */
        og_sb_puts(
            h->b,
            "<div class=\"muted\" style=\"margin-top:10px\">Python stack: <a href=\"#python\">at the top</a></div>");
    if (d->event.nstack) {
        og_sb_puts(h->b, d->event.npython_stack > 0
                             ? "<div class=\"muted\" style=\"margin-top:10px\">Native stack</div>"
                             : "<div class=\"muted\" style=\"margin-top:10px\">Stack</div>");
        frame_list(h, d->event.stack, d->event.nstack, 64);
    }
    og_sb_puts(h->b, "</section>\n");
}

static void processes(struct hx *h)
{
    const struct og_dump *d = h->d;
    if (!d->mem.nprocs)
        return;
    char a[32];
    og_sb_puts(h->b, "<section class=\"card\"><h2>Other processes on this GPU</h2><table><thead><tr>"
                     "<th class=\"num\">pid</th><th>name</th><th class=\"num\">memory</th></tr></thead><tbody>");
    for (int i = 0; i < d->mem.nprocs && i < 200; i++) {
        og_sb_printf(h->b, "<tr><td class=\"num\">%lld</td><td class=\"mono\">", (long long)d->mem.procs[i].pid);
        esc(h, d->mem.procs[i].name, 200);
        og_sb_printf(h->b, "</td><td class=\"num\">%s</td></tr>", hb(d->mem.procs[i].bytes, a));
    }
    og_sb_puts(h->b, "</tbody></table></section>\n");
}

static void details(struct hx *h)
{
    const struct og_dump *d = h->d;
    char a[32];
    og_sb_puts(h->b, "<section class=\"card\"><h2>Process and environment</h2><div class=\"kv\">");
    if (d->cmdline) {
        og_sb_puts(h->b, "<div class=\"n\">command</div><div class=\"v mono\">");
        esc(h, d->cmdline, 2000);
        og_sb_puts(h->b, "</div>");
    }
    if (d->pid >= 0)
        og_sb_printf(h->b, "<div class=\"n\">pid</div><div class=\"v\">%lld (parent %lld)</div>", (long long)d->pid,
                     (long long)d->ppid);
    if (d->job_id) {
        og_sb_puts(h->b, "<div class=\"n\">job</div><div class=\"v mono\">");
        esc(h, d->job_id, 200);
        og_sb_puts(h->b, "</div>");
    }
    if (d->device.pci_bus_id || d->device.compute_capability) {
        og_sb_puts(h->b, "<div class=\"n\">device</div><div class=\"v\">");
        esc(h, d->device.name ? d->device.name : "?", 100);
        if (d->device.pci_bus_id) {
            og_sb_puts(h->b, ", PCI ");
            esc(h, d->device.pci_bus_id, 40);
        }
        if (d->device.compute_capability) {
            og_sb_puts(h->b, ", compute capability ");
            esc(h, d->device.compute_capability, 20);
        }
        og_sb_puts(h->b, "</div>");
    }
    for (int i = 0; i < d->mem.nlibs && i < 50; i++) {
        og_sb_puts(h->b, i ? "<div></div><div class=\"v\">" : "<div class=\"n\">by library</div><div class=\"v\">");
        og_sb_puts(h->b, "<span class=\"mono\">");
        esc(h, d->mem.libs[i].library, 120);
        og_sb_printf(h->b, "</span> %s%s</div>", hb(d->mem.libs[i].bytes, a),
                     d->mem.libs[i].framework == 1 ? " (framework)" : "");
    }
    if (d->mem.host_pinned_bytes >= 0)
        og_sb_printf(h->b, "<div class=\"n\">pinned host memory</div><div class=\"v\">%s</div>",
                     hb(d->mem.host_pinned_bytes, a));
    for (int i = 0; i < d->mem.nunmeasured && i < 50; i++) {
        og_sb_puts(h->b, i ? "<div></div><div class=\"v\">" : "<div class=\"n\">not measured</div><div class=\"v\">");
        esc(h, d->mem.unmeasured[i], 300);
        og_sb_puts(h->b, "</div>");
    }
    og_sb_puts(h->b, "</div>");
    if (d->nenv) {
        og_sb_printf(
            h->b,
            "<details style=\"margin-top:10px\"><summary>environment (%d variables)</summary><div class=\"kv mono\" "
            "style=\"margin-top:6px;font-size:12px\">",
            d->nenv);
        for (int i = 0; i < d->nenv && i < 200; i++) {
            og_sb_puts(h->b, "<div class=\"n\">");
            esc(h, d->env[i].key, 80);
            og_sb_puts(h->b, "</div><div class=\"v\">");
            esc(h, d->env[i].value, 500);
            og_sb_puts(h->b, "</div>");
        }
        og_sb_puts(h->b, "</div></details>");
    }
    og_sb_puts(h->b, "</section>\n");
}

static void footer(struct hx *h)
{
    const struct og_dump *d = h->d;
    og_sb_puts(h->b, "</main>\n<footer>Report by oomguard " OOMGUARD_VERSION " from <span class=\"mono\">");
    esc(h, d->file, 200);
    og_sb_puts(h->b, "</span>");
    if (d->generator) {
        og_sb_puts(h->b, ", written by ");
        esc(h, d->generator, 60);
    }
    og_sb_puts(h->b, ".</footer>\n");
    og_html_end(h->b);
}

int og_render_html(og_sb_t *out, const struct og_dump *d, const struct og_render_opts *o)
{
    struct hx h = { out, d };
    page_head(&h);
    header(&h);
    roles_card(&h);
    kpis(&h);
    primary(&h);
    python_first(&h);
    chart(&h);
    breakdown(&h);
    causes(&h);
    remedies(&h);
    sites(&h, o && o->top > 0 ? o->top : HTML_TOP_SITES);
    fits(&h);
    failed_call(&h);
    processes(&h);
    details(&h);
    footer(&h);
    return out->failed ? -1 : 0;
}
