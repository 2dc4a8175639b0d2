/* Dumps: one record rendered as JSON (docs/dump-format.md) and as text, written
 * atomically next to each other, plus the short stderr summary.
 *
 * Where: OOMGUARD_DIR, else the working directory, else the temp dir, else stderr.
 * How: a temporary file created O_EXCL (never through a symlink) with mode 0600 in the
 * target directory, written, fsync'ed, then renamed over the final name, so a reader sees
 * the old dump or the new one, never half of one. */
#include "og.h"
#include "record.h"
#include "strbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Each nested JSON object below keeps its own "first key" flag, named alike on purpose. */
#pragma GCC diagnostic ignored "-Wshadow"

/* ------------------------------------------------------------------ JSON */

static void j_u64(og_sb_t *sb, uint64_t v)
{
    if (v == OG_UNKNOWN)
        og_sb_puts(sb, "null");
    else
        og_sb_printf(sb, "%llu", (unsigned long long)v);
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
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");
}

static void j_long_or_null(og_sb_t *sb, long v)
{
    if (v < 0)
        og_sb_puts(sb, "null");
    else
        og_sb_printf(sb, "%ld", v);
}

void og_render_json(const og_record_t *r, og_sb_t *sb)
{
    bool first = true;
    og_sb_puts(sb, "{");
    K("schema"); og_sb_json_str(sb, OOMGUARD_DUMP_SCHEMA);
    K("status"); og_sb_json_str(sb, r->status);
    K("generator"); og_sb_printf(sb, "\"oomguard %s\"", OOMGUARD_VERSION);
    K("time"); og_sb_printf(sb, "%.6f", r->time);
    K("pid"); og_sb_printf(sb, "%d", r->pid);
    K("ppid"); og_sb_printf(sb, "%d", r->ppid);
    K("host"); og_sb_json_str(sb, r->host);
    K("rank"); j_long_or_null(sb, r->rank);
    K("local_rank"); j_long_or_null(sb, r->local_rank);
    K("world_size"); j_long_or_null(sb, r->world_size);
    K("job_id");
    if (r->job_id[0]) og_sb_json_str(sb, r->job_id); else og_sb_puts(sb, "null");
    K("cmdline"); og_sb_json_str(sb, r->cmdline);
    K("framework");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("name"); og_sb_json_str(sb, og_framework_name(r->framework));
        K("libraries"); og_sb_puts(sb, "[");
        const char *p = r->framework_libs;
        for (int i = 0; *p; i++) {
            size_t len = strcspn(p, ",");
            char lib[128];
            snprintf(lib, sizeof lib, "%.*s", (int)(len < 127 ? len : 127), p);
            if (i) og_sb_puts(sb, ",");
            og_sb_json_str(sb, lib);
            p += len + (p[len] == ',');
        }
        og_sb_puts(sb, "]}");
    }
    K("env");
    {
        og_sb_puts(sb, "{");
        for (int i = 0; i < r->nenv; i++) {
            const char *eq = strchr(r->env[i], '=');
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - r->env[i] : 0), r->env[i]);
            if (i) og_sb_puts(sb, ",");
            og_sb_json_str(sb, name);
            og_sb_puts(sb, ":");
            og_sb_json_str(sb, eq ? eq + 1 : "");
        }
        og_sb_puts(sb, "}");
    }
    K("visible_devices"); og_sb_printf(sb, "%d", r->visible_devices);

    K("event");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("requested_bytes"); j_u64(sb, r->event.requested_bytes);
        K("api"); og_sb_json_str(sb, r->event.api ? r->event.api : "");
        K("driver_api"); og_sb_json_str(sb, r->event.driver_api ? r->event.driver_api : "");
        K("device"); og_sb_printf(sb, "%d", r->event.device);
        K("stream_ordered"); og_sb_puts(sb, r->event.stream_ordered ? "true" : "false");
        K("result"); og_sb_printf(sb, "%d", r->event.result);
        K("caused_by_limit"); og_sb_puts(sb, r->event.caused_by_limit ? "true" : "false");
        K("library"); og_sb_json_str(sb, r->event.library);
        K("stack"); j_frames(sb, r->event.frames, r->event.nframes);
        K("t"); og_sb_printf(sb, "%.6f", r->event.t);
        K("t_rel"); og_sb_printf(sb, "%.6f", r->event.t_rel);
        K("attempts"); og_sb_printf(sb, "%d", r->event.attempts);
        K("released_between_attempts_bytes"); j_u64(sb, r->event.released_between_attempts_bytes);
        K("recovered_by");
        if (r->event.recovered) {
            og_sb_printf(sb, "{\"requested_bytes\":%llu,\"t\":%.6f}",
                         (unsigned long long)r->event.recovered_requested_bytes, r->event.recovered_t);
        } else {
            og_sb_puts(sb, "null");
        }
        og_sb_puts(sb, "}");
    }

    K("device");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("index"); og_sb_printf(sb, "%d", r->device.index);
        K("name"); og_sb_json_str(sb, r->device.name);
        K("pci_bus_id"); og_sb_json_str(sb, r->device.pci_bus_id);
        K("compute_capability"); og_sb_printf(sb, "\"%d.%d\"", r->device.cc_major, r->device.cc_minor);
        K("total_bytes"); j_u64(sb, r->device.total_bytes);
        K("free_bytes"); j_u64(sb, r->device.free_bytes);
        K("limit_bytes"); j_u64(sb, r->device.limit_bytes);
        og_sb_puts(sb, "}");
    }

    K("memory");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("process_tracked_bytes"); j_u64(sb, r->memory.process_tracked_bytes);
        K("process_used_bytes"); j_u64(sb, r->memory.process_used_bytes);
        K("by_kind");
        og_sb_printf(sb,
                     "{\"plain\":%llu,\"managed\":%llu,\"pool_reserved\":%llu,\"pool_used\":%llu,"
                     "\"vmm_physical\":%llu,\"vmm_mapped\":%llu}",
                     (unsigned long long)r->memory.plain, (unsigned long long)r->memory.managed,
                     (unsigned long long)r->memory.pool_reserved, (unsigned long long)r->memory.pool_used,
                     (unsigned long long)r->memory.vmm_physical, (unsigned long long)r->memory.vmm_mapped);
        K("by_library"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->memory.nlibs; i++) {
            const og_lib_usage_t *u = &r->memory.by_library[i];
            og_sb_puts(sb, i ? ",{\"library\":" : "{\"library\":");
            og_sb_json_str(sb, u->library);
            og_sb_printf(sb, ",\"bytes\":%llu,\"blocks\":%llu,\"framework\":%s}", (unsigned long long)u->bytes,
                         (unsigned long long)u->blocks, u->framework ? "true" : "false");
        }
        og_sb_puts(sb, "]");
        K("framework_bytes"); j_u64(sb, r->memory.framework_bytes);
        K("framework_cached_bytes"); j_u64(sb, r->memory.framework_cached_bytes);
        K("framework_cached_source");
        if (r->memory.framework_cached_source) og_sb_json_str(sb, r->memory.framework_cached_source);
        else og_sb_puts(sb, "null");
        K("non_framework_bytes"); j_u64(sb, r->memory.non_framework_bytes);
        K("context_bytes_estimate"); j_u64(sb, r->memory.context_bytes_estimate);
        K("other_processes"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->memory.nother; i++) {
            og_sb_printf(sb, "%s{\"pid\":%d,\"name\":", i ? "," : "", r->memory.other[i].pid);
            og_sb_json_str(sb, r->memory.other[i].name);
            og_sb_printf(sb, ",\"bytes\":%llu}", (unsigned long long)r->memory.other[i].bytes);
        }
        og_sb_puts(sb, "]");
        K("other_processes_bytes"); j_u64(sb, r->memory.other_processes_bytes);
        K("host_pinned_bytes"); j_u64(sb, r->memory.host_pinned_bytes);
        K("unmeasured"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->memory.nunmeasured; i++) {
            if (i) og_sb_puts(sb, ",");
            og_sb_json_str(sb, r->memory.unmeasured[i]);
        }
        og_sb_puts(sb, "]");
        K("framework");
        if (r->memory.fw.has) {
            const og_framework_view_t *f = &r->memory.fw;
            og_sb_printf(sb,
                         "{\"allocated_bytes\":%llu,\"reserved_bytes\":%llu,\"active_bytes\":%llu,"
                         "\"inactive_split_bytes\":%llu,\"largest_free_block_bytes\":%llu,"
                         "\"private_pool_bytes\":%llu,\"num_alloc_retries\":%llu,\"num_ooms\":%llu,"
                         "\"allocator_settings\":",
                         (unsigned long long)f->allocated_bytes, (unsigned long long)f->reserved_bytes,
                         (unsigned long long)f->active_bytes, (unsigned long long)f->inactive_split_bytes,
                         (unsigned long long)f->largest_free_block_bytes, (unsigned long long)f->private_pool_bytes,
                         (unsigned long long)f->num_alloc_retries, (unsigned long long)f->num_ooms);
            og_sb_json_str(sb, f->allocator_settings);
            og_sb_puts(sb, ",\"source\":");
            og_sb_json_str(sb, f->source);
            if (f->snapshot_file[0]) {
                og_sb_puts(sb, ",\"snapshot_file\":");
                og_sb_json_str(sb, f->snapshot_file);
            }
            uint64_t cached = f->reserved_bytes > f->allocated_bytes ? f->reserved_bytes - f->allocated_bytes : 0;
            /* 1 - largest free block / free cached bytes; null when either is unknown */
            if (cached && f->largest_free_block_bytes)
                og_sb_printf(sb, ",\"fragmentation\":%.4f}", 1.0 - (double)f->largest_free_block_bytes / (double)cached);
            else
                og_sb_puts(sb, ",\"fragmentation\":null}");
        } else {
            og_sb_puts(sb, "null");
        }
        og_sb_puts(sb, "}");
    }

    K("history");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("peak_bytes"); j_u64(sb, r->history.peak_bytes);
        K("peak_t_rel"); og_sb_printf(sb, "%.6f", r->history.peak_t_rel);
        K("peak_library"); og_sb_json_str(sb, r->history.peak_library);
        K("events"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->history.nevents; i++) {
            const struct og_hist_ev *e = &r->history.events[i];
            og_sb_printf(sb, "%s{\"t_rel\":%.6f,\"op\":\"%s\",\"bytes\":%llu,\"device\":%d,\"api\":\"%s\",\"live_bytes\":%llu}",
                         i ? "," : "", e->t_rel, e->op, (unsigned long long)e->bytes, e->device, e->api,
                         (unsigned long long)e->live);
        }
        og_sb_puts(sb, "]");
        K("samples"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->history.nsamples; i++)
            og_sb_printf(sb, "%s{\"t_rel\":%.6f,\"live_bytes\":%llu}", i ? "," : "", r->history.samples[i].t_rel,
                         (unsigned long long)r->history.samples[i].live);
        og_sb_puts(sb, "]");
        K("counters");
        og_sb_printf(sb, "{\"allocs\":%llu,\"frees\":%llu,\"failures\":%llu,\"unknown_frees\":%llu}",
                     (unsigned long long)r->history.allocs, (unsigned long long)r->history.frees,
                     (unsigned long long)r->history.failures, (unsigned long long)r->history.unknown_frees);
        og_sb_puts(sb, "}");
    }

    K("top_sites"); og_sb_puts(sb, "[");
    for (int i = 0; i < r->nsites; i++) {
        const og_top_site_t *t = &r->sites[i];
        og_sb_printf(sb, "%s{\"bytes\":%llu,\"blocks\":%llu,\"library\":", i ? "," : "",
                     (unsigned long long)t->bytes, (unsigned long long)t->blocks);
        og_sb_json_str(sb, t->library);
        og_sb_puts(sb, ",\"api\":");
        og_sb_json_str(sb, t->api);
        og_sb_puts(sb, ",\"frames\":");
        j_frames(sb, t->frames, t->nframes);
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");

    K("diagnosis");
    {
        bool first = true;
        og_sb_puts(sb, "{");
        K("primary"); og_sb_json_str(sb, r->diagnosis.primary ? r->diagnosis.primary : "unknown");
        K("shortfall_bytes"); j_u64(sb, r->diagnosis.shortfall_bytes);
        K("causes"); og_sb_puts(sb, "[");
        for (int i = 0; i < r->diagnosis.ncauses; i++) {
            const og_cause_t *c = &r->diagnosis.causes[i];
            og_sb_puts(sb, i ? ",{\"id\":" : "{\"id\":");
            og_sb_json_str(sb, c->id);
            og_sb_printf(sb, ",\"confidence\":%.2f,\"summary\":", c->confidence);
            og_sb_json_str(sb, c->summary);
            og_sb_puts(sb, ",\"evidence\":{");
            for (int e = 0; e < c->nevidence; e++) {
                if (e) og_sb_puts(sb, ",");
                og_sb_json_str(sb, c->evidence[e].name);
                og_sb_puts(sb, ":");
                if (c->evidence[e].is_text)
                    og_sb_json_str(sb, c->evidence[e].text);
                else if (c->evidence[e].num == (double)(uint64_t)c->evidence[e].num && c->evidence[e].num >= 0)
                    og_sb_printf(sb, "%llu", (unsigned long long)c->evidence[e].num);
                else
                    og_sb_printf(sb, "%.4f", c->evidence[e].num);
            }
            og_sb_puts(sb, "}}");
        }
        og_sb_puts(sb, "]}");
    }

    K("remedies"); og_sb_puts(sb, "[");
    for (int i = 0; i < r->nremedies; i++) {
        const og_remedy_t *m = &r->remedies[i];
        og_sb_puts(sb, i ? ",{\"id\":" : "{\"id\":");
        og_sb_json_str(sb, m->id);
        og_sb_printf(sb, ",\"rank\":%d,\"title\":", m->rank);
        og_sb_json_str(sb, m->title ? m->title : "");
        og_sb_puts(sb, ",\"why\":");
        og_sb_json_str(sb, m->why);
        og_sb_puts(sb, ",\"how\":[");
        for (int h = 0; h < m->nhow; h++) {
            if (h) og_sb_puts(sb, ",");
            og_sb_json_str(sb, m->how[h]);
        }
        og_sb_puts(sb, "],\"saving\":");
        og_sb_json_str(sb, m->saving ? m->saving : "");
        og_sb_puts(sb, ",\"cost\":");
        og_sb_json_str(sb, m->cost ? m->cost : "");
        og_sb_puts(sb, "}");
    }
    og_sb_puts(sb, "]");

    K("summary");
    og_sb_puts(sb, "{\"devices\":[");
    static const unsigned cards[] = {16, 24, 40, 48, 80, 141};
    for (int i = 0; i < r->nsummary; i++) {
        og_sb_printf(sb, "%s{\"index\":%d,\"peak_bytes\":%llu,\"peak_t_rel\":%.6f,\"peak_library\":", i ? "," : "",
                     r->summary[i].index, (unsigned long long)r->summary[i].peak_bytes, r->summary[i].peak_t_rel);
        og_sb_json_str(sb, r->summary[i].peak_library);
        og_sb_puts(sb, ",\"fits\":[");
        for (size_t c = 0; c < sizeof cards / sizeof *cards; c++)
            og_sb_printf(sb, "%s{\"card_gb\":%u,\"fits\":%s}", c ? "," : "", cards[c],
                         r->summary[i].peak_bytes <= (uint64_t)cards[c] * 1000000000ull ? "true" : "false");
        og_sb_puts(sb, "]}");
    }
    og_sb_puts(sb, "]}");
    og_sb_puts(sb, "}\n");
}

/* ------------------------------------------------------------------ text */

/* Several sizes in one printf: each gets its own buffer, taken in turn (calls are sequenced). */
static const char *human_rot(char (*hb)[32], unsigned *i, uint64_t v)
{
    return og_human(v, hb[(*i)++ % 8], sizeof hb[0]);
}
#define H(v) human_rot(hb, &hbi, (v))

void og_render_text(const og_record_t *r, og_sb_t *sb)
{
    char hb[8][32];
    unsigned hbi = 0;
    og_sb_printf(sb, "oomguard %s — %s report\n", OOMGUARD_VERSION, r->status);
    og_sb_printf(sb, "process %d on %s", r->pid, r->host);
    if (r->rank >= 0)
        og_sb_printf(sb, ", rank %ld", r->rank);
    if (r->job_id[0])
        og_sb_printf(sb, ", job %s", r->job_id);
    og_sb_printf(sb, "\ncommand: %s\nframework: %s\n\n", r->cmdline, og_framework_name(r->framework));

    if (r->event.api) {
        og_sb_printf(sb, "%s of %s (%llu bytes) on device %d failed", r->event.api, H(r->event.requested_bytes),
                     (unsigned long long)r->event.requested_bytes, r->event.device);
        if (r->event.caused_by_limit)
            og_sb_puts(sb, " (refused by OOMGUARD_LIMIT)");
        og_sb_printf(sb, ", called from %s", r->event.library);
        if (r->event.attempts > 1)
            og_sb_printf(sb, "; %d attempts, %s released in between", r->event.attempts,
                         H(r->event.released_between_attempts_bytes));
        og_sb_puts(sb, ".\n");
        if (r->event.recovered)
            og_sb_printf(sb, "RECOVERED: a later request of %s succeeded; the program went on.\n",
                         H(r->event.recovered_requested_bytes));
    }
    og_sb_printf(sb, "device %d: %s (compute capability %d.%d), total %s, free %s", r->device.index, r->device.name,
                 r->device.cc_major, r->device.cc_minor, H(r->device.total_bytes), H(r->device.free_bytes));
    if (r->device.limit_bytes != OG_UNKNOWN)
        og_sb_printf(sb, ", limit %s", H(r->device.limit_bytes));
    og_sb_puts(sb, "\n\nwhere the memory is\n");
    og_sb_printf(sb, "  this process, tracked          %12s\n", H(r->memory.process_tracked_bytes));
    og_sb_printf(sb, "    plain allocations            %12s\n", H(r->memory.plain));
    if (r->memory.managed)
        og_sb_printf(sb, "    managed                      %12s\n", H(r->memory.managed));
    if (r->memory.pool_reserved)
        og_sb_printf(sb, "    pools (reserved / in use)    %12s / %s\n", H(r->memory.pool_reserved), H(r->memory.pool_used));
    if (r->memory.vmm_physical)
        og_sb_printf(sb, "    virtual memory (physical)    %12s\n", H(r->memory.vmm_physical));
    og_sb_printf(sb, "  framework (%s)%*s%12s", og_framework_name(r->framework),
                 (int)(19 - strlen(og_framework_name(r->framework))), "", H(r->memory.framework_bytes));
    if (r->memory.framework_cached_bytes != OG_UNKNOWN)
        og_sb_printf(sb, ", cached but unused %s (%s)", H(r->memory.framework_cached_bytes),
                     r->memory.framework_cached_source);
    og_sb_printf(sb, "\n  non-framework (context, libs)  %12s\n", H(r->memory.non_framework_bytes));
    og_sb_printf(sb, "  process total (NVML)           %12s\n", H(r->memory.process_used_bytes));
    og_sb_printf(sb, "  other processes                %12s\n", H(r->memory.other_processes_bytes));
    for (int i = 0; i < r->memory.nother; i++)
        og_sb_printf(sb, "    pid %-8d %-18s %12s\n", r->memory.other[i].pid, r->memory.other[i].name,
                     H(r->memory.other[i].bytes));
    for (int i = 0; i < r->memory.nunmeasured; i++)
        og_sb_printf(sb, "  not measured: %s\n", r->memory.unmeasured[i]);
    if (r->memory.nlibs) {
        og_sb_puts(sb, "\nby library\n");
        for (int i = 0; i < r->memory.nlibs; i++)
            og_sb_printf(sb, "  %-40s %12s in %llu blocks%s\n", r->memory.by_library[i].library,
                         H(r->memory.by_library[i].bytes), (unsigned long long)r->memory.by_library[i].blocks,
                         r->memory.by_library[i].framework ? " (framework)" : "");
    }
    og_sb_printf(sb, "\npeak %s at %.3f s; %llu allocations, %llu frees, %llu failures\n", H(r->history.peak_bytes),
                 r->history.peak_t_rel, (unsigned long long)r->history.allocs, (unsigned long long)r->history.frees,
                 (unsigned long long)r->history.failures);

    og_sb_printf(sb, "\ndiagnosis: %s", r->diagnosis.primary ? r->diagnosis.primary : "unknown");
    if (r->diagnosis.shortfall_bytes && r->diagnosis.shortfall_bytes != OG_UNKNOWN)
        og_sb_printf(sb, " (short by %s)", H(r->diagnosis.shortfall_bytes));
    og_sb_puts(sb, "\n");
    for (int i = 0; i < r->diagnosis.ncauses; i++)
        og_sb_printf(sb, "  %-15s %3.0f%%  %s\n", r->diagnosis.causes[i].id, r->diagnosis.causes[i].confidence * 100,
                     r->diagnosis.causes[i].summary);

    if (r->nremedies) {
        og_sb_puts(sb, "\nwhat to do, best first\n");
        for (int i = 0; i < r->nremedies; i++) {
            const og_remedy_t *m = &r->remedies[i];
            og_sb_printf(sb, "  %d. %s [%s]\n     %s\n", m->rank, m->title ? m->title : m->id, m->id, m->why);
            for (int h = 0; h < m->nhow; h++)
                og_sb_printf(sb, "       %s\n", m->how[h]);
            if (m->saving && *m->saving)
                og_sb_printf(sb, "     saves: %s; costs: %s\n", m->saving, m->cost ? m->cost : "-");
        }
    }
    if (r->nsites) {
        og_sb_puts(sb, "\ntop allocation sites\n");
        for (int i = 0; i < r->nsites && i < 10; i++) {
            const og_top_site_t *t = &r->sites[i];
            og_sb_printf(sb, "  %s in %llu blocks via %s from %s\n", H(t->bytes), (unsigned long long)t->blocks, t->api,
                         t->library);
            for (int f = 0; f < t->nframes && f < 8; f++)
                og_sb_printf(sb, "      #%d %s%s%s+0x%llx\n", f, t->frames[f].symbol[0] ? t->frames[f].symbol : "?",
                             " in ", t->frames[f].library, (unsigned long long)t->frames[f].offset);
        }
    }
}

/* ------------------------------------------------------------------ files */

static bool write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Atomic replace of dir/name by content; false (errno set) if anything fails. */
static bool write_atomic(const char *dir, const char *name, const og_sb_t *content)
{
    char tmp[4800], final[4800];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name) >= (int)sizeof tmp ||
        snprintf(final, sizeof final, "%s/%s", dir, name) >= (int)sizeof final) {
        errno = ENAMETOOLONG;
        return false;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);   /* O_CREAT|O_EXCL, mode 0600: never follows a symlink */
    if (fd < 0)
        return false;
    bool ok = write_all(fd, content->buf, content->len) && fsync(fd) == 0;
    int saved = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    /* rename() replaces a planted symlink itself; it never writes through it */
    if (ok && rename(tmp, final) != 0) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        unlink(tmp);
        errno = saved;
        return false;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return true;
}

static atomic_int warned_dir;
static atomic_llong dumps_written;
static atomic_int warned_budget;

/* Writes both files; returns the JSON path written into `path`, or "" when all failed. */
/* One file per process: a less serious record never replaces a more serious one (an exit
 * summary or a warning must not overwrite the evidence of a failure).  A failure's own
 * "recovered" rewrite is allowed, and a new failure replaces an old one. */
static int severity(const char *status)
{
    return strcmp(status, "oom") == 0 ? 3 : strcmp(status, "recovered") == 0 ? 2
         : strcmp(status, "warning") == 0 ? 1 : 0;
}
static atomic_int written_severity = -1;

static void write_dump(const og_record_t *r, char *path, size_t pathlen)
{
    path[0] = 0;
    int sev = severity(r->status), cur = atomic_load(&written_severity);
    if (sev < cur && !(sev == 2 && cur == 3)) {
        if (og_opt.verbose)
            og_log("%s record not written: the dump file holds a %s record", r->status,
                   cur == 3 ? "oom" : cur == 2 ? "recovered" : "warning");
        return;
    }
    atomic_store(&written_severity, sev);
    if (atomic_fetch_add(&dumps_written, 1) >= og_opt.max_dumps) {
        if (!atomic_exchange(&warned_budget, 1))
            og_warn("%lld dumps written (OOMGUARD_MAX_DUMPS); later failures are counted but not dumped",
                    og_opt.max_dumps);
        return;
    }
    og_sb_t json = {0}, text = {0};
    og_render_json(r, &json);
    og_render_text(r, &text);
    path[0] = 0;
    if (json.failed || text.failed) {
        og_warn("could not render the dump (out of host memory)");
        goto out;
    }
    char base[512];
    if (r->rank >= 0)
        snprintf(base, sizeof base, "oomguard-%s-%d-rank%ld", r->host, r->pid, r->rank);
    else
        snprintf(base, sizeof base, "oomguard-%s-%d", r->host, r->pid);
    for (char *p = base; *p; p++)
        if (*p == '/')
            *p = '_';
    char cwd[4096];
    const char *tmpdir = getenv("TMPDIR");
    const char *dirs[3] = {og_opt.dir ? og_opt.dir_s : (getcwd(cwd, sizeof cwd) ? cwd : NULL),
                           tmpdir && *tmpdir ? tmpdir : "/tmp", NULL};
    for (int i = 0; dirs[i]; i++) {
        char jname[600], tname[600];
        snprintf(jname, sizeof jname, "%s.json", base);
        snprintf(tname, sizeof tname, "%s.txt", base);
        if (write_atomic(dirs[i], jname, &json) && write_atomic(dirs[i], tname, &text)) {
            snprintf(path, pathlen, "%s/%s", dirs[i], jname);
            if (i > 0 && !atomic_exchange(&warned_dir, 1))
                og_warn("could not write the dump in %s; wrote it in %s instead", dirs[0], dirs[i]);
            goto out;
        }
        if (!atomic_exchange(&warned_dir, 1) || og_opt.verbose)
            og_warn("cannot write a dump in %s: %s", dirs[i], strerror(errno));
        atomic_store(&warned_dir, 1);
    }
    /* nowhere to write: the text goes to stderr so the evidence is not lost */
    og_warn("no writable directory for the dump; here it is:");
    if (write(STDERR_FILENO, text.buf, text.len) < 0) {
        /* nothing more we can do */
    }
out:
    og_sb_free(&json);
    og_sb_free(&text);
}

/* ------------------------------------------------------------------ stderr summary */

/* The summary is printed once per failure the framework did not recover from.  Whether it
 * recovers is known only later, so it is held here and printed when the episode is over
 * unrecovered: at exit, or when a newer failure starts. */
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static char pending[2048];

static void flush_pending_locked(void)
{
    if (pending[0] && !og_opt.quiet) {
        if (write(STDERR_FILENO, pending, strlen(pending)) < 0) {
            /* stderr closed: the dump is on disk anyway */
        }
    }
    pending[0] = 0;
}

static void set_pending(const og_record_t *r, const char *path)
{
    char hb[8][32];
    unsigned hbi = 0;
    og_sb_t sb = {0};
    og_sb_printf(&sb, "oomguard: %s of %s on device %d (%s) failed: %s free of %s", r->event.api,
                 H(r->event.requested_bytes), r->device.index, r->device.name, H(r->device.free_bytes),
                 H(r->device.total_bytes));
    if (r->device.limit_bytes != OG_UNKNOWN)
        og_sb_printf(&sb, " (limit %s)", H(r->device.limit_bytes));
    og_sb_printf(&sb, "\noomguard: diagnosis: %s", r->diagnosis.primary ? r->diagnosis.primary : "unknown");
    if (r->diagnosis.ncauses)
        og_sb_printf(&sb, " — %s", r->diagnosis.causes[0].summary);
    og_sb_puts(&sb, "\n");
    for (int i = 0; i < r->nremedies && i < 3; i++)
        og_sb_printf(&sb, "oomguard:   %d. %s%s%s\n", r->remedies[i].rank,
                     r->remedies[i].title ? r->remedies[i].title : r->remedies[i].id,
                     r->remedies[i].nhow ? ": " : "", r->remedies[i].nhow ? r->remedies[i].how[0] : "");
    if (path[0])
        og_sb_printf(&sb, "oomguard: full report: oomguard report %s\n", path);
    pthread_mutex_lock(&pending_lock);
    snprintf(pending, sizeof pending, "%s", sb.buf ? sb.buf : "");
    pthread_mutex_unlock(&pending_lock);
    og_sb_free(&sb);
}

/* A fork child writes its own file (its own pid) and may have been forked while another
 * thread held the summary lock. */
void og_dump_atfork_child(void)
{
    pthread_mutex_init(&pending_lock, NULL);
    pending[0] = 0;
    atomic_store(&written_severity, -1);
    atomic_store(&dumps_written, 0);
}

void og_dump_atexit(void)
{
    pthread_mutex_lock(&pending_lock);
    flush_pending_locked();
    pthread_mutex_unlock(&pending_lock);
}

/* ------------------------------------------------------------------ entry points */

void og_write_record(og_record_t *rec)
{
    char path[4800];
    write_dump(rec, path, sizeof path);
    if (og_opt.verbose)
        og_log("%s dump written: %s", rec->status, path[0] ? path : "(stderr)");
}


void og_report_failure(const og_episode_t *ep, og_call_t *c)
{
    if (ep->attempts == 1 && c->active) {  /* a new failure: an older unrecovered one is final */
        pthread_mutex_lock(&pending_lock);
        flush_pending_locked();
        pthread_mutex_unlock(&pending_lock);
    }
    og_record_t *rec = og_record_capture("oom", ep, ep->device);
    if (!rec)
        return;
    char path[4800];
    write_dump(rec, path, sizeof path);
    set_pending(rec, path);
    if (og_opt.verbose)
        og_log("dump written: %s", path[0] ? path : "(stderr)");
    og_record_free(rec);
}

void og_report_recovered(const og_episode_t *ep, og_call_t *c)
{
    pthread_mutex_lock(&pending_lock);
    pending[0] = 0;                          /* recovered: no alarm on stderr */
    pthread_mutex_unlock(&pending_lock);
    og_record_t *rec = og_record_capture("recovered", ep, ep->device);
    if (!rec)
        return;
    char path[4800];
    write_dump(rec, path, sizeof path);
    if (og_opt.verbose)
        og_log("device %d: recovered after %d failed attempt(s); dump updated: %s", ep->device, ep->attempts,
               path);
    og_record_free(rec);
}
