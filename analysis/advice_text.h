/* Number and text helpers shared by the diagnosis and the remedies (pure, no allocation). */
#ifndef OG_ADVICE_TEXT_H
#define OG_ADVICE_TEXT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "record.h"

/* Every cause, from the one list of causes (causes.def), in its order. */
enum og_cause_kind {
#define X(name, id, rule, bonus, own1, own2, title) OG_CAUSE_##name,
#include "causes.def"
#undef X
    OG_CAUSE_COUNT
};
extern const char *const og_cause_ids[OG_CAUSE_COUNT];

static inline uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }
/* a + b, saturated one below 2^64-1: where that value once meant "not measured"; kept so that a
 * saturated figure reads as it always has */
static inline uint64_t add_sat(uint64_t a, uint64_t b) { return a >= UINT64_MAX - 1 - b ? UINT64_MAX - 1 : a + b; }

void og_vfmt(char *dst, size_t n, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
void og_fmt(char *dst, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* og_bytes_fmt's sentence style (1.30 GiB, 512 MiB, 12.5 MiB, 3.0 KiB, 17 B), returned by value
 * so a printf can take several: og_hb(a).s, og_hb(b).s */
typedef struct {
    char s[24];
} og_hb_t;
og_hb_t og_hb(double bytes);

/* a library's bytes by quarter of the run (og_lib_usage_t.by_quarter) as text: "3.71 GiB, 6.00 GiB, 6.51 GiB, 2.38 GiB",
 * as the diagnosis's evidence and the remedy's text both say it */
typedef struct {
    char s[4 * 24 + 8];
} og_quarters_t;
og_quarters_t og_quarters(const uint64_t *by_quarter);

/* a share as text: 12%, <1%, >9999%, n/a */
typedef struct {
    char s[16];
} og_pc_t;
og_pc_t og_pct(double part, double whole);

/* bounded copy of a fixed-size field (the field may lack its terminator) */
void og_cpy(char *dst, size_t n, const char *src, size_t srcn);
/* the next of the comma-separated names at *CURSOR ("model,ref"): its start and length, *CURSOR moved past it;
 * false at the end */
bool og_name_next(const char **cursor, const char **name, size_t *len);
/* NAME is one of the comma-separated names of LIST ("model,ref"); an empty NAME is in none */
bool og_name_listed(const char *list, const char *name);
/* the file name after the last '/' */
const char *og_base_name(const char *path);

/* When NVML could not list the GPU's processes: the device memory that neither this process's
 * tracked allocations nor one CUDA context (OG_CONTEXT_ALLOWANCE) explain, i.e. total - free -
 * tracked - allowance; unknown when the process list was measured or total, free or tracked are
 * unknown.  An inference, never a measurement: callers must say so. */
#define OG_CONTEXT_ALLOWANCE (512ULL << 20)
og_opt_u64_t og_other_inferred_bytes(const og_record_t *rec);

/* distinct allocation sizes (to 1 MiB, at most 64 counted) among the history's allocations: variable-length
 * batches make many, a fixed-shape loop few */
int og_distinct_alloc_sizes(const og_record_t *rec);

/* "1 process" / "2 processes": singular or plural noun after a count */
const char *og_plural(long long n, const char *one, const char *many);

#endif
