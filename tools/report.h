/* tools/report.h — renderers for one dump and what they share. */
#ifndef OG_REPORT_H
#define OG_REPORT_H

#include "dump.h"
#include "util.h"

/* How much of a remedy's saving and cost the text and HTML reports print: the catalog's own texts
 * fit (tests/unit/test_remedies.c checks them against the same number). */
#define OG_REMEDY_FIELD_MAX 160
/* How much of a remedy's why they print: all the shim writes (og_remedy_t.why in analysis/record.h, 512 bytes with
 * its terminator); longer (a hand-made dump) is cut there. */
#define OG_REMEDY_WHY_MAX 511

struct og_render_opts {
    int color; /* ANSI colour in text output */
    int top;   /* top allocation sites to show (0: the format's default) */
};

int og_render_text(og_sb_t *out, const struct og_dump *d, const struct og_render_opts *o);
int og_render_html(og_sb_t *out, const struct og_dump *d, const struct og_render_opts *o);
/* The validated document, pretty-printed (needs a dump loaded with keep_all). */
int og_render_json(og_sb_t *out, const struct og_dump *d);
/* A pickle in the layout of torch.cuda.memory._snapshot() (needs keep_all for
 * memory.framework.snapshot; works without it otherwise). */
int og_render_memviz(og_sb_t *out, const struct og_dump *d);

/* Page frame shared by report and merge HTML: doctype, CSP, CSS, <body>; and the
 * closing script that marks the page as fully loaded. */
void og_html_begin(og_sb_t *b, const char *title);
void og_html_end(og_sb_t *b);

/* ---- shared by the text and HTML renderers (report_common.c) ---- */

enum og_part_kind {
    P_FW_USED,
    P_FW_CACHED,
    P_OTHER_FW,
    P_NON_FW,
    P_PROCESS,
    P_OTHER_PROCS,
    P_UNACCOUNTED,
    P_FREE,
    P_NPARTS
};

struct og_part {
    int kind;
    const char *label; /* static or from og_framework_title() */
    int64_t bytes;
};

/* "Where the memory is": up to P_NPARTS parts in display order.  *scale is the
 * device total when known (else the sum of the parts). */
int og_breakdown(const struct og_dump *d, struct og_part *parts, int64_t *scale);
const char *og_framework_title(const char *name); /* "PyTorch", "JAX", ... */
/* What the libraries of frameworks other than the dump's own hold (memory.framework_bytes counts every framework's
 * allocator libraries: a JAX arena beside PyTorch), and the name of the largest of them (NULL none) */
int64_t og_other_framework_bytes(const struct og_dump *d, const char **largest);
const char *og_cause_title(const char *id); /* plain-words title of a cause id, or NULL */
const char *og_status_title(const struct og_dump *d);
const struct og_cause *og_primary_cause(const struct og_dump *d);
/* "2025-11-29 15:45:03 UTC", or "" when t is not a plausible epoch time. */
const char *og_format_time(double t, char out[40]);
/* Evidence value: sizes for *_bytes, exact integers, strings; escaped for HTML when html != 0. */
void og_evidence_value(og_sb_t *b, const struct og_evidence *e, int html);
/* Shortfall: diagnosis.shortfall_bytes, else requested - free (may be negative); unknown when neither. */
struct og_bytes og_shortfall(const struct og_dump *d);
/* The process's own usage: NVML's number, else what oomguard tracked; -1 if neither. */
int64_t og_process_bytes(const struct og_dump *d);
/* Counts for headlines. */
const char *og_result_name(int64_t result);
/* A native stack of Python code only (symbolize.h, og_stack_python_only): its "library" is the
 * interpreter.  0 when it cannot be told (no frames, no memory). */
int og_frames_python_only(const struct og_frame *frames, int n);
/* The failed call's native stack is Python code only. */
int og_event_python_only(const struct og_dump *d);
/* A Python job: a Python stack or python_sites, a framework adapter's report, or a native
 * stack of Python code only. */
int og_python_job(const struct og_dump *d);
/* The failing Python line: the innermost frame of event.python_stack outside the frameworks'
 * own packages and the standard library (common/framework_code.def: og_python_file_not_program,
 * `copy.deepcopy(model)` is the program's line, not copy.py's); when every frame is theirs (PyTorch's autograd engine
 * thread, or no Python frame at all there), event.phase_site, the program's line that called into
 * them; else the innermost; NULL when neither is known. */
const struct og_pyframe *og_failing_python_line(const struct og_dump *d);
/* The phase's line as the user reads it: event.phase_site (the program's own line), else
 * event.phase_frame; NULL when neither. */
const struct og_pyframe *og_phase_line(const struct og_dump *d);
/* Two Python frames at the same file and line (NULL: none is the same as nothing). */
int og_same_pyframe(const struct og_pyframe *a, const struct og_pyframe *b);
/* What the roles scan says beyond the table of roles (memory.framework.roles: models, parameters by
 * dtype, the failing statement, an accumulating sum, a copy among the activations, allocated after the
 * steps, the beam width, the batch size, activation checkpointing, the scan itself; memory.framework.other_frameworks): one call of fn per line
 * that has something, in one order, for the text and HTML reports alike.  text holds strings from the
 * dump: the renderer escapes it. */
typedef void (*og_fact_fn)(void *ctx, const char *label, const char *text);
void og_roles_facts(const struct og_dump *d, og_fact_fn fn, void *ctx);
/* The value of an environment variable the dump recorded, or NULL. */
const char *og_env_value(const struct og_dump *d, const char *key);

#endif
