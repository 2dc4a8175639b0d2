/* tools/dump_read.c — reads and validates an oomguard dump (see dump.h).
 *
 * Parsing is done by cJSON only.  The reader walks the top-level object (and
 * `history`) member by member, handing each value to cJSON_ParseWithLengthOpts,
 * which also says where the value ended.  The big arrays are walked element by
 * element the same way, so that each element can be validated, reduced to a
 * compact struct and freed.  The input is read through a window that slides
 * over the file; a step that runs off the end of the window is retried once
 * more data is in. */
#include "dump.h"
#include "util.h"
#include "version.h"

#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Memory: cJSON allocates through these hooks, which refuse to go past a limit
 * so that a hostile dump fails with a message instead of exhausting the host. */

static size_t g_mem_limit = OG_DEFAULT_MEM_LIMIT;
static size_t g_mem_used;
static int g_mem_exhausted;

struct mem_hdr {
    size_t size;
    size_t pad; /* keeps the payload 16-byte aligned */
};

static int mem_charge(size_t n)
{
    if (n > g_mem_limit || g_mem_used > g_mem_limit - n) {
        g_mem_exhausted = 1;
        return 0;
    }
    g_mem_used += n;
    return 1;
}

static void mem_uncharge(size_t n) { g_mem_used = n > g_mem_used ? 0 : g_mem_used - n; }

static void *hook_malloc(size_t n)
{
    if (n > SIZE_MAX - sizeof(struct mem_hdr) || !mem_charge(n))
        return NULL;
    struct mem_hdr *h = malloc(sizeof *h + n);
    if (!h) {
        mem_uncharge(n);
        g_mem_exhausted = 1;
        return NULL;
    }
    h->size = n;
    return h + 1;
}

static void hook_free(void *p)
{
    if (!p)
        return;
    struct mem_hdr *h = (struct mem_hdr *)p - 1;
    mem_uncharge(h->size);
    free(h);
}

void og_reader_init(size_t mem_limit)
{
    static cJSON_Hooks hooks = { hook_malloc, hook_free };
    if (mem_limit)
        g_mem_limit = mem_limit;
    cJSON_InitHooks(&hooks);
}

/* A growable array charged against the same limit. */
static int grow_charged(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t ncap = *cap ? *cap * 2 : 256;
    while (ncap < need)
        ncap *= 2;
    if (ncap > SIZE_MAX / elem || !mem_charge((ncap - *cap) * elem))
        return 0;
    void *np = realloc(*p, ncap * elem);
    if (!np) {
        mem_uncharge((ncap - *cap) * elem);
        g_mem_exhausted = 1;
        return 0;
    }
    *p = np;
    *cap = ncap;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Arena for the dump's small arrays: freed all at once with the dump. */

struct og_arena {
    struct og_arena *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

static void *arena_alloc(struct og_arena **head, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct og_arena *a = *head;
    if (!a || a->cap - a->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (!mem_charge(cap))
            return NULL;
        a = malloc(sizeof *a + cap);
        if (!a) {
            g_mem_exhausted = 1;
            return NULL;
        }
        a->next = *head;
        a->used = 0;
        a->cap = cap;
        *head = a;
    }
    void *p = a->data + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(struct og_arena *a)
{
    while (a) {
        struct og_arena *next = a->next;
        mem_uncharge(a->cap);
        free(a);
        a = next;
    }
}

/* ------------------------------------------------------------------------ */
/* The input window. */

#define WINDOW_MIN   ((size_t)64 << 10)
#define WINDOW_START ((size_t)4 << 20)

struct src {
    int fd;    /* -1: everything is already in buf */
    char *buf; /* buf[len] is always '\0' */
    size_t cap, len, pos;
    uint64_t base;  /* file offset of buf[0] */
    uint64_t lines; /* newlines before buf[0] */
    uint64_t col0;  /* bytes between the last of them and buf[0] */
    int eof;
};

enum { S_OK, S_MORE, S_ERR, S_END };
enum ctx { CTX_TOP, CTX_HISTORY };
enum target { T_NONE, T_SITES, T_EVENTS, T_SAMPLES };

struct cand {
    int64_t bytes;
    long index;
    cJSON *node;
};

struct path {
    const struct path *up;
    const char *key; /* NULL: array element `idx` */
    long idx;
};

struct loader {
    struct src s;
    const struct og_load_opts *o;
    struct og_dump *d;
    struct og_err *err;
    int failed;    /* err holds a fatal error */
    int deferred;  /* err holds a validation error found while streaming */
    int schema_ok; /* the schema key was seen and accepted */
    int seen[4];   /* streamed arrays already seen (by target) */
    int seen_history;
    cJSON *stream_arr[4];
    long stream_idx;
    struct cand *heap;
    int nheap, heapcap;
};

static void set_err(struct loader *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct loader *L, const char *fmt, ...)
{
    og_sb_t b;
    og_sb_init(&b);
    sb_text(&b, L->d->file, 200, 0);
    og_sb_puts(&b, ": ");
    va_list ap;
    va_start(ap, fmt);
    og_sb_vprintf(&b, fmt, ap);
    va_end(ap);
    snprintf(L->err->msg, sizeof L->err->msg, "%s", b.buf ? b.buf : "error");
    og_sb_free(&b);
    L->failed = 1;
}

static int err_too_complex(struct loader *L)
{
    set_err(L, "too large to load: it needs more than %zu MiB of memory", g_mem_limit >> 20);
    return S_ERR;
}

/* Drops buf[0, keep) and reads more.  1: more data, 0: at end of input, -1: error. */
static int src_fill(struct loader *L, size_t keep)
{
    struct src *s = &L->s;
    if (s->eof)
        return 0;
    for (size_t i = 0; i < keep; i++) {
        if (s->buf[i] == '\n') {
            s->lines++;
            s->col0 = 0;
        } else {
            s->col0++;
        }
    }
    memmove(s->buf, s->buf + keep, s->len - keep);
    s->len -= keep;
    s->pos -= keep;
    s->base += keep;
    if (s->len == s->cap) {
        /* One value fills the whole window: make room for it. */
        size_t ncap = s->cap * 2;
        if (ncap > OG_MAX_FILE_BYTES)
            ncap = OG_MAX_FILE_BYTES;
        if (ncap <= s->len) {
            set_err(L, "too large (the limit is %zu MiB)", OG_MAX_FILE_BYTES >> 20);
            return -1;
        }
        char *nb = realloc(s->buf, ncap + 1);
        if (!nb) {
            err_too_complex(L);
            return -1;
        }
        s->buf = nb;
        s->cap = ncap;
    }
    size_t before = s->len;
    while (s->len < s->cap) {
        ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            set_err(L, "read error: %s", strerror(errno));
            return -1;
        }
        if (n == 0) {
            s->eof = 1;
            break;
        }
        s->len += (size_t)n;
    }
    s->buf[s->len] = '\0';
    if (s->base + s->len > OG_MAX_FILE_BYTES) {
        set_err(L, "too large (the limit is %zu MiB)", OG_MAX_FILE_BYTES >> 20);
        return -1;
    }
    return s->len > before || s->eof ? 1 : 0;
}

/* Runs a step; when it needs more input, slides the window and runs it again
 * from where it began.  Steps only return S_MORE while more input may come. */
#define STEP(call)                        \
    do {                                  \
        size_t mark_ = L->s.pos;          \
        int r_;                           \
        while ((r_ = (call)) == S_MORE) { \
            L->s.pos = mark_;             \
            if (src_fill(L, mark_) < 0)   \
                return S_ERR;             \
            mark_ = L->s.pos;             \
        }                                 \
        if (r_ != S_OK)                   \
            return S_ERR;                 \
    } while (0)

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* S_OK with a character at pos, S_MORE, or S_END at the true end of the input. */
static int skip_ws(struct loader *L)
{
    struct src *s = &L->s;
    while (s->pos < s->len && is_ws((unsigned char)s->buf[s->pos]))
        s->pos++;
    if (s->pos < s->len)
        return S_OK;
    return s->eof ? S_END : S_MORE;
}

/* 1-based line and column of buf[at] in the whole file. */
static void src_line_col(const struct src *s, size_t at, unsigned long long *line, unsigned long long *col)
{
    uint64_t l = s->lines, c = s->col0;
    for (size_t i = 0; i < at && i < s->len; i++) {
        if (s->buf[i] == '\n') {
            l++;
            c = 0;
        } else {
            c++;
        }
    }
    *line = (unsigned long long)l + 1;
    *col = (unsigned long long)c + 1;
}

static void describe_char(const struct src *s, size_t at, char out[32])
{
    if (at >= s->len) {
        snprintf(out, 32, "end of file");
        return;
    }
    unsigned c = (unsigned char)s->buf[at];
    if (c > 0x20 && c < 0x7f && c != '\'')
        snprintf(out, 32, "'%c'", c);
    else if (c == '\'')
        snprintf(out, 32, "\"'\"");
    else
        snprintf(out, 32, "byte 0x%02x", c);
}

/* Reports a syntax error at buf[at].  `from` is where the current step began and
 * `depth` the nesting depth there; they let us tell a file that merely stops
 * early ("truncated") and one nested beyond cJSON's limit from other errors.
 * This scan only classifies an error that cJSON already found. */
static int syntax_error(struct loader *L, size_t at, size_t from, int depth, const char *expected)
{
    struct src *s = &L->s;
    if (at > s->len)
        at = s->len;
    int in_str = 0, esc = 0, depth_at = depth, d = depth;
    size_t open_quote = 0;
    for (size_t i = from; i < s->len; i++) {
        if (i == at)
            depth_at = d;
        unsigned char c = (unsigned char)s->buf[i];
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
            open_quote = i;
        } else if (c == '[' || c == '{') {
            d++;
        } else if (c == ']' || c == '}') {
            d--;
        }
    }
    if (at == s->len)
        depth_at = d;

    unsigned long long line, col;
    src_line_col(s, at, &line, &col);
    if (at < s->len && (s->buf[at] == '[' || s->buf[at] == '{') && depth_at - depth >= CJSON_NESTING_LIMIT) {
        set_err(L, "not JSON (line %llu, column %llu: nested more than %d levels deep)", line, col,
                CJSON_NESTING_LIMIT);
        return S_ERR;
    }
    /* The file stops early when it ends inside a string or an open bracket and
     * nothing structural follows the point where cJSON gave up. */
    int unbalanced = in_str || d > 0;
    int tail_clean = 1;
    if (in_str) {
        tail_clean = at >= open_quote;
    } else {
        for (size_t i = at; i < s->len; i++)
            if (s->buf[i] && strchr(",:]}", s->buf[i])) {
                tail_clean = 0;
                break;
            }
    }
    if (unbalanced && (at + 1 >= s->len || tail_clean)) {
        unsigned long long end_line, end_col;
        src_line_col(s, s->len, &end_line, &end_col);
        set_err(L, "truncated (the JSON stops in the middle of a value at line %llu, column %llu)", end_line, end_col);
        return S_ERR;
    }
    char what[32];
    describe_char(s, at, what);
    set_err(L, "not JSON (line %llu, column %llu: unexpected %s%s%s)", line, col, what, expected ? ", expected " : "",
            expected ? expected : "");
    return S_ERR;
}

/* ------------------------------------------------------------------------ */
/* Exact integers.  cJSON reads every number into a double, exact only below 2^53, but the
 * shim writes requests up to SIZE_MAX (2^64-1) as plain decimal integers.  So that byte
 * counts are read exactly, the text of each integer a double cannot hold (16 digits or more)
 * is kept on its number node, in valuestring: cJSON leaves that NULL for numbers, frees it with
 * the node and copies it in cJSON_Duplicate.  The number tokens of the text cJSON just parsed
 * are paired, in order, with the tree's number nodes in document order (the order cJSON links
 * them in); a token whose value is not the node's stops the pairing, and the numbers after it
 * stay doubles (refused where an exact integer is needed, never misread).  Fractions and
 * exponents are read as doubles: an integer of 2^53 or more must be written as digits. */

#define EXACT_DIGITS 16 /* fewer digits: below 10^15 < 2^53, exact as a double */

/* The next number token at or after *p (strings skipped); 0 at the end. */
static int next_number(const char **p, const char *end, const char **tok, size_t *len)
{
    const char *q = *p;
    while (q < end) {
        char c = *q;
        if (c == '"') {
            for (q++; q < end && *q != '"'; q++)
                if (*q == '\\' && q + 1 < end)
                    q++;
            q++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            const char *t = q;
            while (q < end && *q && strchr("0123456789+-.eE", *q))
                q++;
            *tok = t;
            *len = (size_t)(q - t);
            *p = q;
            return 1;
        } else {
            q++;
        }
    }
    *p = q;
    return 0;
}

struct exact_walk {
    const char *p, *end;
    int stop; /* 1: out of step with the text, 2: out of memory */
};

static void exact_nodes(struct exact_walk *w, cJSON *v)
{
    for (; v && !w->stop; v = v->next) {
        if (cJSON_IsNumber(v)) {
            const char *tok;
            size_t len, digits = 0;
            int integer = 1;
            if (!next_number(&w->p, w->end, &tok, &len) || len > 64) {
                w->stop = 1;
                return;
            }
            for (size_t i = 0; i < len; i++) {
                if (tok[i] >= '0' && tok[i] <= '9')
                    digits++;
                else if (i || tok[i] != '-')
                    integer = 0;
            }
            char text[65];
            memcpy(text, tok, len);
            text[len] = '\0';
            if (strtod(text, NULL) != v->valuedouble) {
                w->stop = 1;
                return;
            }
            /* kept in canonical form ("-" and digits, no leading zero) where it fits 64 bits, so
             * that it prints as JSON; as written where it does not (quoted when refused) */
            struct og_bytes x;
            cJSON tmp = { .type = cJSON_Number, .valuestring = text };
            if (integer && digits >= EXACT_DIGITS && !v->valuestring) {
                char canon[32];
                if (og_json_bytes(&tmp, &x)) {
                    snprintf(canon, sizeof canon, "%s%" PRIu64, x.neg ? "-" : "", x.v);
                    len = strlen(canon);
                    memcpy(text, canon, len + 1);
                }
                v->valuestring = cJSON_malloc(len + 1);
                if (!v->valuestring) {
                    w->stop = 2;
                    return;
                }
                memcpy(v->valuestring, text, len + 1);
            }
        } else if (v->child) {
            exact_nodes(w, v->child);
        }
    }
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Whether the text holds a run of EXACT_DIGITS digits.  Such a run covers one of every
 * EXACT_DIGITS consecutive bytes, so only those are looked at unless one is a digit. */
static int has_long_digit_run(const char *start, const char *end)
{
    size_t n = (size_t)(end - start);
    for (size_t i = EXACT_DIGITS - 1; i < n; i += EXACT_DIGITS) {
        if (!is_digit(start[i]))
            continue;
        size_t a = i, b = i;
        while (a > 0 && is_digit(start[a - 1]))
            a--;
        while (b + 1 < n && is_digit(start[b + 1]))
            b++;
        if (b - a + 1 >= EXACT_DIGITS)
            return 1;
        i = b; /* the next run starts after this one */
    }
    return 0;
}

/* 0, or -1 when memory ran out.  Most values hold no long digit run: a quick look first. */
static int keep_exact_ints(cJSON *v, const char *start, const char *end)
{
    if (!has_long_digit_run(start, end))
        return 0;
    struct exact_walk w = { start, end, 0 };
    exact_nodes(&w, v);
    return w.stop == 2 ? -1 : 0;
}

int og_json_bytes(const cJSON *v, struct og_bytes *out)
{
    if (!cJSON_IsNumber(v))
        return 0;
    if (v->valuestring) {
        const char *s = v->valuestring;
        int neg = *s == '-';
        uint64_t x = 0;
        if (neg)
            s++;
        if (!*s)
            return 0;
        for (; *s; s++) {
            if (*s < '0' || *s > '9' || x > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
                return 0;
            x = x * 10 + (uint64_t)(*s - '0');
        }
        *out = (struct og_bytes){ x, 1, (uint8_t)(neg && x) };
        return 1;
    }
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x) || fabs(x) > OG_MAX_EXACT_INT)
        return 0;
    *out = (struct og_bytes){ (uint64_t)fabs(x), 1, x < 0 };
    return 1;
}

/* ------------------------------------------------------------------------ */
/* What cJSON reads silently but a reader of evidence must refuse: a key given twice (cJSON finds
 * the first, JSON tools the last), "\u0000" (cJSON's string stops there) and a number that
 * underflows (1e-400 would read as 0 bytes).  Each check looks at one value cJSON parsed, with
 * its text [start, end). */

static int cmp_names(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The first key given twice in an object of v's tree, or NULL (-1 in *oom when memory ran out). */
static const char *duplicate_key(const cJSON *v, int *oom)
{
    for (; v && !*oom; v = v->next) {
        if (cJSON_IsObject(v) && v->child && v->child->next) {
            size_t n = 0, i = 0;
            for (const cJSON *c = v->child; c; c = c->next)
                n++;
            const char **names = n > SIZE_MAX / sizeof *names ? NULL : cJSON_malloc(n * sizeof *names);
            if (!names) {
                *oom = 1;
                return NULL;
            }
            for (const cJSON *c = v->child; c; c = c->next)
                names[i++] = c->string ? c->string : "";
            qsort(names, n, sizeof *names, cmp_names);
            const char *dup = NULL;
            for (i = 1; i < n && !dup; i++)
                if (!strcmp(names[i - 1], names[i]))
                    dup = names[i];
            cJSON_free(names);
            if (dup)
                return dup;
        }
        if (v->child) {
            const char *dup = duplicate_key(v->child, oom);
            if (dup)
                return dup;
        }
    }
    return NULL;
}

/* Has v's tree a number that is zero or below the smallest normal double? (only then the text is
 * read again for an underflow) */
static int has_tiny_number(const cJSON *v)
{
    for (; v; v = v->next) {
        if (cJSON_IsNumber(v) && fabs(v->valuedouble) < DBL_MIN)
            return 1;
        if (v->child && has_tiny_number(v->child))
            return 1;
    }
    return 0;
}

/* The first number token in [p, end) that underflows: digits that are not all zero, read as zero
 * or as a subnormal.  NULL when none. */
static const char *underflowing_number(const char *p, const char *end, size_t *len)
{
    const char *tok;
    while (next_number(&p, end, &tok, len)) {
        int nonzero = 0;
        for (size_t i = 0; i < *len && tok[i] != 'e' && tok[i] != 'E'; i++)
            nonzero |= tok[i] >= '1' && tok[i] <= '9';
        if (!nonzero)
            continue;
        char small[64], *text = *len < sizeof small ? small : cJSON_malloc(*len + 1);
        if (!text)
            continue; /* cannot tell: let it pass as cJSON read it */
        memcpy(text, tok, *len);
        text[*len] = 0;
        double x = strtod(text, NULL);
        if (text != small)
            cJSON_free(text);
        if (fabs(x) < DBL_MIN)
            return tok;
    }
    return NULL;
}

static int duplicate_err(struct loader *L, const char *key)
{
    og_sb_t b;
    og_sb_init(&b);
    sb_text(&b, key, 80, 0);
    set_err(L, "the key \"%s\" is given twice in one object: refused, readers disagree on which one counts",
            b.buf ? b.buf : "");
    og_sb_free(&b);
    return S_ERR;
}

/* S_OK, or S_ERR with the message set */
static int check_value(struct loader *L, const cJSON *v, const char *start, const char *end)
{
    struct src *s = &L->s;
    unsigned long long line, col;
    for (const char *p = start; (p = memchr(p, '\\', (size_t)(end - p))) != NULL; p += 2) {
        if (end - p >= 6 && !memcmp(p, "\\u0000", 6)) {
            src_line_col(s, (size_t)(p - s->buf), &line, &col);
            set_err(L, "a string holds \\u0000 (line %llu, column %llu): refused, it would cut the string short", line,
                    col);
            return S_ERR;
        }
        if (end - p < 2)
            break;
    }
    int oom = 0;
    const char *dup = duplicate_key(v, &oom);
    if (oom)
        return err_too_complex(L);
    if (dup) {
        return duplicate_err(L, dup);
    }
    size_t len;
    const char *tok = has_tiny_number(v) ? underflowing_number(start, end, &len) : NULL;
    if (tok) {
        src_line_col(s, (size_t)(tok - s->buf), &line, &col);
        set_err(L, "the number %.*s%s (line %llu, column %llu) is too small for a double (it would read as 0): refused",
                (int)(len > 40 ? 40 : len), tok, len > 40 ? "..." : "", line, col);
        return S_ERR;
    }
    return S_OK;
}

/* Parses one JSON value at pos with cJSON. */
static int parse_value(struct loader *L, cJSON **out, size_t from, int depth)
{
    struct src *s = &L->s;
    const char *start = s->buf + s->pos, *end = NULL;
    g_mem_exhausted = 0;
    cJSON *v = cJSON_ParseWithLengthOpts(start, s->len - s->pos, &end, 0);
    if (!v) {
        if (g_mem_exhausted)
            return err_too_complex(L);
        if (!s->eof)
            return S_MORE;
        size_t at = end ? (size_t)(end - s->buf) : s->pos;
        return syntax_error(L, at, from, depth, NULL);
    }
    if (keep_exact_ints(v, start, end) < 0) {
        cJSON_Delete(v);
        return err_too_complex(L);
    }
    if (check_value(L, v, start, end) != S_OK) {
        cJSON_Delete(v);
        return S_ERR;
    }
    s->pos = (size_t)(end - s->buf);
    *out = v;
    return S_OK;
}

/* Expects one of `chars` after optional whitespace; stores which one. */
static int expect_one_of(struct loader *L, const char *chars, char *got, size_t from, int depth, const char *expected)
{
    int r = skip_ws(L);
    if (r == S_MORE)
        return S_MORE;
    if (r == S_END)
        return syntax_error(L, L->s.len, from, depth, expected);
    char c = L->s.buf[L->s.pos];
    if (!c || !strchr(chars, c))
        return syntax_error(L, L->s.pos, from, depth, expected);
    L->s.pos++;
    *got = c;
    return S_OK;
}

/* ------------------------------------------------------------------------ */
/* Field access with type checks.  Each returns 1 (value stored), 0 (absent or
 * null: sentinel stored) or -1 (wrong type: error recorded). */

static void path_fmt(og_sb_t *b, const struct path *p)
{
    if (!p)
        return;
    path_fmt(b, p->up);
    if (p->key) {
        if (p->up)
            og_sb_putc(b, '.');
        sb_text(b, p->key, 60, 0);
    } else {
        og_sb_printf(b, "[%ld]", p->idx);
    }
}

static void describe_json(og_sb_t *b, const cJSON *v)
{
    if (cJSON_IsString(v)) {
        og_sb_puts(b, "a string (\"");
        sb_text(b, v->valuestring, 40, 0);
        og_sb_puts(b, "\")");
    } else if (cJSON_IsNumber(v) && v->valuestring) {
        sb_text(b, v->valuestring, 70, 0); /* its exact text (keep_exact_ints) */
    } else if (cJSON_IsNumber(v)) {
        if (isfinite(v->valuedouble))
            og_sb_printf(b, "%.17g", v->valuedouble);
        else
            og_sb_puts(b, "a number too large to represent");
    } else if (cJSON_IsBool(v)) {
        og_sb_puts(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsArray(v)) {
        og_sb_puts(b, "an array");
    } else if (cJSON_IsObject(v)) {
        og_sb_puts(b, "an object");
    } else {
        og_sb_puts(b, "null");
    }
}

static int field_err(struct loader *L, const struct path *at, const char *key, const char *expected, const cJSON *got)
{
    if (L->failed || L->deferred)
        return -1;
    struct path p = { at, key, 0 };
    og_sb_t b;
    og_sb_init(&b);
    path_fmt(&b, key ? &p : at);
    og_sb_puts(&b, ": expected ");
    og_sb_puts(&b, expected);
    og_sb_puts(&b, ", found ");
    describe_json(&b, got);
    set_err(L, "%s", b.buf ? b.buf : "invalid field");
    og_sb_free(&b);
    return -1;
}

static const cJSON *member(const cJSON *obj, const char *key)
{
    const cJSON *v = obj ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* int64 fields (counts, ids, sizes bounded by a device): exact integers in [lo, 2^63-1]. */
static int check_int(struct loader *L, const cJSON *v, const struct path *at, const char *key, int64_t lo, int64_t *out)
{
    struct og_bytes b;
    if (!cJSON_IsNumber(v))
        return field_err(L, at, key, "an integer", v);
    if (!og_json_bytes(v, &b) || (b.neg ? lo >= 0 || b.v > (uint64_t)-lo : b.v > INT64_MAX))
        return field_err(L, at, key,
                         lo < 0 ? "an integer of magnitude below 2^63" : "a non-negative integer below 2^63", v);
    *out = b.neg ? -(int64_t)b.v : (int64_t)b.v;
    return 1;
}

static int get_int_min(struct loader *L, const cJSON *obj, const struct path *at, const char *key, int64_t lo,
                       int64_t *out)
{
    const cJSON *v = member(obj, key);
    *out = -1;
    if (!v)
        return 0;
    return check_int(L, v, at, key, lo, out);
}

static int get_int(struct loader *L, const cJSON *obj, const struct path *at, const char *key, int64_t *out)
{
    return get_int_min(L, obj, at, key, 0, out);
}

/* Byte counts that can reach SIZE_MAX (requests and what derives from them): exact over the
 * whole uint64 range; `signed_ok` for a difference (-(2^64-1) .. 2^64-1). */
static int check_bytes(struct loader *L, const cJSON *v, const struct path *at, const char *key, int signed_ok,
                       struct og_bytes *out)
{
    if (!cJSON_IsNumber(v))
        return field_err(L, at, key, "an integer", v);
    if (!og_json_bytes(v, out) || (out->neg && !signed_ok)) {
        *out = (struct og_bytes){ 0 };
        return field_err(L, at, key,
                         signed_ok ? "an integer of magnitude below 2^64" : "a non-negative integer below 2^64", v);
    }
    return 1;
}

static int get_bytes(struct loader *L, const cJSON *obj, const struct path *at, const char *key, int signed_ok,
                     struct og_bytes *out)
{
    const cJSON *v = member(obj, key);
    *out = (struct og_bytes){ 0 };
    if (!v)
        return 0;
    return check_bytes(L, v, at, key, signed_ok, out);
}

static int get_num(struct loader *L, const cJSON *obj, const struct path *at, const char *key, double *out)
{
    const cJSON *v = member(obj, key);
    *out = NAN;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return field_err(L, at, key, "a finite number", v);
    *out = v->valuedouble;
    return 1;
}

static int get_str(struct loader *L, const cJSON *obj, const struct path *at, const char *key, const char **out)
{
    const cJSON *v = member(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsString(v) || !v->valuestring)
        return field_err(L, at, key, "a string", v);
    *out = v->valuestring;
    return 1;
}

static int get_bool(struct loader *L, const cJSON *obj, const struct path *at, const char *key, int *out)
{
    const cJSON *v = member(obj, key);
    *out = -1;
    if (!v)
        return 0;
    if (!cJSON_IsBool(v))
        return field_err(L, at, key, "true or false", v);
    *out = cJSON_IsTrue(v);
    return 1;
}

static int get_obj(struct loader *L, const cJSON *obj, const struct path *at, const char *key, const cJSON **out)
{
    const cJSON *v = member(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsObject(v))
        return field_err(L, at, key, "an object", v);
    *out = v;
    return 1;
}

static int get_arr(struct loader *L, const cJSON *obj, const struct path *at, const char *key, const cJSON **out)
{
    const cJSON *v = member(obj, key);
    *out = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsArray(v))
        return field_err(L, at, key, "an array", v);
    *out = v;
    return 1;
}

#define TRY(x)         \
    do {               \
        if ((x) < 0)   \
            return -1; \
    } while (0)

/* Frames: [{ip, symbol, library, offset, path, build_id, function, file, line, inlined}],
 * inlined_into}, all optional; converted when `out` is given. */
static int read_frames(struct loader *L, const cJSON *arr, const struct path *at, struct og_frame **out, int *nout)
{
    int n = 0, i = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, arr) n++;
    struct og_frame *v = NULL;
    if (out && n) {
        v = arena_alloc(&L->d->arena, (size_t)n * sizeof *v);
        if (!v)
            return err_too_complex(L), -1;
    }
    cJSON_ArrayForEach(f, arr)
    {
        struct path p = { at, NULL, i };
        struct og_frame tmp, *fr = v ? &v[i] : &tmp;
        if (!cJSON_IsObject(f))
            return field_err(L, &p, NULL, "a frame object", f);
        TRY(get_str(L, f, &p, "ip", &fr->ip));
        TRY(get_str(L, f, &p, "symbol", &fr->symbol));
        TRY(get_str(L, f, &p, "library", &fr->library));
        TRY(get_str(L, f, &p, "offset", &fr->offset));
        TRY(get_str(L, f, &p, "path", &fr->path));
        TRY(get_str(L, f, &p, "build_id", &fr->build_id));
        TRY(get_str(L, f, &p, "function", &fr->function));
        TRY(get_str(L, f, &p, "file", &fr->file));
        TRY(get_int(L, f, &p, "line", &fr->line));
        TRY(get_bool(L, f, &p, "inlined", &fr->inlined));
        TRY(get_str(L, f, &p, "inlined_into", &fr->inlined_into));
        i++;
    }
    if (out) {
        *out = v;
        *nout = n;
    }
    return 0;
}

/* Python frames: [{file, line, function}] (event.python_stack). */
static int read_pyframes(struct loader *L, const cJSON *arr, const struct path *at, struct og_pyframe **out, int *nout)
{
    int n = 0, i = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, arr) n++;
    struct og_pyframe *v = n ? arena_alloc(&L->d->arena, (size_t)n * sizeof *v) : NULL;
    if (n && !v)
        return err_too_complex(L), -1;
    cJSON_ArrayForEach(f, arr)
    {
        struct path p = { at, NULL, i };
        if (!cJSON_IsObject(f))
            return field_err(L, &p, NULL, "a frame object", f);
        TRY(get_str(L, f, &p, "file", &v[i].file));
        TRY(get_int(L, f, &p, "line", &v[i].line));
        TRY(get_str(L, f, &p, "function", &v[i].function));
        TRY(get_int(L, f, &p, "bytes", &v[i].bytes)); /* python_sites only */
        TRY(get_int(L, f, &p, "blocks", &v[i].blocks));
        i++;
    }
    *out = v;
    *nout = n;
    return 0;
}

/* One Python frame object ({file, line, function}) or null: file NULL then. */
static int read_pyframe_obj(struct loader *L, const cJSON *obj, const char *key, const struct path *at,
                            struct og_pyframe *f)
{
    const cJSON *o;
    memset(f, 0, sizeof *f);
    f->line = f->bytes = f->blocks = -1;
    TRY(get_obj(L, obj, at, key, &o));
    if (!o)
        return 0;
    struct path p = { at, key, 0 };
    TRY(get_str(L, o, &p, "file", &f->file));
    TRY(get_int(L, o, &p, "line", &f->line));
    TRY(get_str(L, o, &p, "function", &f->function));
    return 1;
}

static int read_strings(struct loader *L, const cJSON *arr, const struct path *at, const char ***out, int *nout);
static int read_ints(struct loader *L, const cJSON *arr, const struct path *at, int64_t **out, int *nout);

/* An array of the roles object: its elements counted, room for them in the arena, each an object. */
#define ROLES_ARRAY(key, ptr, n, each)                                             \
    do {                                                                           \
        const cJSON *arr_, *x;                                                     \
        TRY(get_arr(L, o, &p, key, &arr_));                                        \
        int k_ = 0;                                                                \
        cJSON_ArrayForEach(x, arr_) k_++;                                          \
        (ptr) = k_ ? arena_alloc(&L->d->arena, (size_t)k_ * sizeof *(ptr)) : NULL; \
        if (k_ && !(ptr))                                                          \
            return err_too_complex(L), -1;                                         \
        if (k_)                                                                    \
            memset((ptr), 0, (size_t)k_ * sizeof *(ptr));                          \
        cJSON_ArrayForEach(x, arr_)                                                \
        {                                                                          \
            struct path pe = { &p, key, (n) };                                     \
            if (!cJSON_IsObject(x))                                                \
                return field_err(L, &pe, NULL, "an object", x);                    \
            each;                                                                  \
            (n)++;                                                                 \
        }                                                                          \
    } while (0)

/* memory.framework.roles: every key the writer documents (docs/dump-format.md), each validated and kept
 * in the one view every renderer reads; every role's bytes a byte count or null (common/roles.def names
 * them).  tests/cli/check_roles_read.py fails when a documented key leaves the report unchanged. */
static int read_roles(struct loader *L, const cJSON *fw, const struct path *pf, struct og_roles_view *r)
{
    static const char *const keys[OG_NROLE_IX] = {
#define OG_ROLE(key, label, quiet) #key,
#include "../common/roles.def"
#undef OG_ROLE
    };
    const cJSON *o, *arr;
    memset(r, 0, sizeof *r);
    r->complete = -1;
    r->elapsed_ms = r->last_step_ms_ago = NAN;
    r->optimizer_steps = r->num_beams = r->attention_modules = r->objects_scanned = r->read_in_part =
        r->activations_copy_of.bytes = r->optimizer_steps_on_device = -1;
    r->batch_size = r->statement_model_device = r->gradient_checkpointing = r->autocast_in_code =
        r->scaler_without_autocast = r->backward_in_code = r->backward_on_stack = r->input_requires_grad = -1;
    r->copy_made_bytes = r->per_sample_count = r->lora_parameters_bytes = r->lora_base_trainable_bytes =
        r->embedding_parameters_bytes = r->embedding_tables = -1;
    r->ddp.wrappers = r->ddp.bucket_bytes = -1;
    r->ddp.as_view = -1;
    TRY(get_obj(L, fw, pf, "roles", &o));
    if (!o)
        return 0;
    r->present = 1;
    struct path p = { pf, "roles", 0 };
    char key[64];
    TRY(get_int(L, o, &p, "allocated_bytes", &r->allocated_bytes));
    for (int i = 0; i < OG_NROLE_IX; i++) {
        snprintf(key, sizeof key, "%s_bytes", keys[i]);
        TRY(get_int(L, o, &p, key, &r->bytes[i]));
        snprintf(key, sizeof key, "%s_tensors", keys[i]);
        TRY(get_int(L, o, &p, key, &r->tensors[i]));
    }
    ROLES_ARRAY("optimizers", r->optimizers, r->noptimizers, {
        TRY(get_str(L, x, &pe, "class", &r->optimizers[r->noptimizers].cls));
        TRY(get_int(L, x, &pe, "bytes", &r->optimizers[r->noptimizers].bytes));
        TRY(get_int(L, x, &pe, "tensors", &r->optimizers[r->noptimizers].tensors));
        TRY(get_int(L, x, &pe, "parameters_bytes", &r->optimizers[r->noptimizers].parameters_bytes));
        TRY(get_int(L, x, &pe, "not_elementwise_bytes", &r->optimizers[r->noptimizers].not_elementwise_bytes));
    });
    TRY(get_arr(L, o, &p, "parameters_by_dtype", &arr));
    r->has_dtypes = arr != NULL;
    ROLES_ARRAY("parameters_by_dtype", r->dtypes, r->ndtypes, {
        TRY(get_str(L, x, &pe, "dtype", &r->dtypes[r->ndtypes].dtype));
        TRY(get_int(L, x, &pe, "bytes", &r->dtypes[r->ndtypes].bytes));
        TRY(get_int(L, x, &pe, "tensors", &r->dtypes[r->ndtypes].tensors));
    });
    ROLES_ARRAY("holders", r->holders, r->nholders, {
        struct og_role_holder_view *h = &r->holders[r->nholders];
        TRY(get_str(L, x, &pe, "label", &h->label));
        TRY(get_str(L, x, &pe, "name", &h->name));
        TRY(get_str(L, x, &pe, "kind", &h->kind));
        TRY(get_str(L, x, &pe, "where", &h->where));
        TRY(get_int(L, x, &pe, "bytes", &h->bytes));
        TRY(get_int(L, x, &pe, "tensors", &h->tensors));
        TRY(read_pyframe_obj(L, x, "site", &pe, &h->site));
        TRY(get_str(L, x, &pe, "purpose", &h->purpose));
        TRY(get_str(L, x, &pe, "copy_of", &h->copy_of));
        h->graphs = h->restored_bytes = h->records = h->float64_bytes = h->bound_bytes = h->bound_records = -1;
        TRY(get_int(L, x, &pe, "graphs", &h->graphs));
        TRY(get_int(L, x, &pe, "restored_bytes", &h->restored_bytes));
        TRY(read_pyframe_obj(L, x, "restored_site", &pe, &h->restored_site));
        TRY(get_int(L, x, &pe, "records", &h->records));
        TRY(get_int(L, x, &pe, "float64_bytes", &h->float64_bytes));
        TRY(get_int(L, x, &pe, "bound_bytes", &h->bound_bytes));
        TRY(get_int(L, x, &pe, "bound_records", &h->bound_records));
    });
    ROLES_ARRAY("models", r->models, r->nmodels, {
        TRY(get_str(L, x, &pe, "class", &r->models[r->nmodels].cls));
        TRY(get_int(L, x, &pe, "parameters_bytes", &r->models[r->nmodels].parameters_bytes));
        TRY(get_int(L, x, &pe, "tensors", &r->models[r->nmodels].tensors));
        TRY(get_int(L, x, &pe, "count", &r->models[r->nmodels].count));
        TRY(get_bool(L, x, &pe, "frozen", &r->models[r->nmodels].frozen));
        TRY(get_int(L, x, &pe, "trained", &r->models[r->nmodels].trained));
        TRY(get_int(L, x, &pe, "stepped", &r->models[r->nmodels].stepped));
        TRY(get_int(L, x, &pe, "parameters_elsewhere_bytes", &r->models[r->nmodels].elsewhere_bytes));
        r->models[r->nmodels].training = r->models[r->nmodels].float32_bytes = -1;
        r->models[r->nmodels].quantized_bytes = -1;
        TRY(get_int(L, x, &pe, "training", &r->models[r->nmodels].training));
        TRY(get_int(L, x, &pe, "parameters_float32_bytes", &r->models[r->nmodels].float32_bytes));
        TRY(get_int(L, x, &pe, "parameters_quantized_bytes", &r->models[r->nmodels].quantized_bytes));
    });
    const cJSON *so;
    if (read_pyframe_obj(L, o, "statement", &p, &r->statement.at) < 0)
        return -1;
    TRY(get_obj(L, o, &p, "statement", &so));
    if (so) {
        struct path ps = { &p, "statement", 0 };
        TRY(get_str(L, so, &ps, "target", &r->statement.target));
        TRY(get_str(L, so, &ps, "purpose", &r->statement.purpose));
        TRY(get_arr(L, so, &ps, "names", &arr));
        if (arr)
            TRY(read_strings(L, arr, &(struct path){ &ps, "names", 0 }, &r->statement.names, &r->statement.nnames));
        TRY(get_arr(L, so, &ps, "ints", &arr));
        TRY(read_ints(L, arr, &(struct path){ &ps, "ints", 0 }, &r->statement.ints, &r->statement.nints));
    }
    const cJSON *ao;
    if (read_pyframe_obj(L, o, "accumulating", &p, &r->accumulating.at) < 0)
        return -1;
    TRY(get_obj(L, o, &p, "accumulating", &ao));
    if (ao) {
        struct path pa = { &p, "accumulating", 0 };
        TRY(get_str(L, ao, &pa, "target", &r->accumulating.target));
        TRY(get_str(L, ao, &pa, "operand", &r->accumulating.operand));
    }
    static const char *const setting_keys[] = {
#define OG_CODE_SETTING(key, text) #key,
#include "../common/code_settings.def"
#undef OG_CODE_SETTING
    };
    for (int i = 0; i < OG_DUMP_NSETTINGS; i++) {
        const cJSON *sto;
        if (read_pyframe_obj(L, o, setting_keys[i], &p, &r->settings[i].at) < 0)
            return -1;
        TRY(get_obj(L, o, &p, setting_keys[i], &sto));
        if (sto) {
            struct path ps = { &p, setting_keys[i], 0 };
            TRY(get_str(L, sto, &ps, "key", &r->settings[i].key));
        }
    }
    const cJSON *co;
    TRY(get_obj(L, o, &p, "activations_copy_of", &co));
    if (co) {
        struct path pc = { &p, "activations_copy_of", 0 };
        TRY(get_str(L, co, &pc, "role", &r->activations_copy_of.role));
        TRY(get_int(L, co, &pc, "bytes", &r->activations_copy_of.bytes));
    }
    TRY(get_arr(L, o, &p, "allocated_after_steps", &arr));
    r->has_after_steps = arr != NULL;
    TRY(read_ints(L, arr, &(struct path){ &p, "allocated_after_steps", 0 }, &r->after_steps, &r->nafter_steps));
    TRY(get_int(L, o, &p, "optimizer_steps", &r->optimizer_steps));
    TRY(get_int(L, o, &p, "optimizer_steps_on_device", &r->optimizer_steps_on_device));
    const cJSON *run;
    r->over_run_every = -1;
    TRY(get_obj(L, o, &p, "allocated_over_run", &run));
    if (run) {
        struct path pr = { &p, "allocated_over_run", 0 };
        TRY(get_int(L, run, &pr, "every", &r->over_run_every));
        TRY(get_arr(L, run, &pr, "bytes", &arr));
        TRY(read_ints(L, arr, &(struct path){ &pr, "bytes", 0 }, &r->over_run, &r->nover_run));
    }
    TRY(get_int(L, o, &p, "num_beams", &r->num_beams));
    TRY(get_int(L, o, &p, "attention_modules", &r->attention_modules));
    TRY(get_num(L, o, &p, "last_optimizer_step_ms_ago", &r->last_step_ms_ago));
    TRY(get_bool(L, o, &p, "complete", &r->complete));
    TRY(get_str(L, o, &p, "why", &r->why));
    TRY(get_num(L, o, &p, "elapsed_ms", &r->elapsed_ms));
    TRY(get_int(L, o, &p, "objects_scanned", &r->objects_scanned));
    TRY(get_int(L, o, &p, "read_in_part", &r->read_in_part));
    TRY(get_bool(L, o, &p, "gradient_checkpointing", &r->gradient_checkpointing));
    TRY(get_int(L, o, &p, "batch_size", &r->batch_size));
    TRY(get_int(L, o, &p, "statement_model_device", &r->statement_model_device));
    TRY(get_str(L, o, &p, "statement_model", &r->statement_model));
    TRY(get_int(L, o, &p, "copy_made_bytes", &r->copy_made_bytes));
    TRY(get_int(L, o, &p, "per_sample_count", &r->per_sample_count));
    TRY(get_int(L, o, &p, "lora_parameters_bytes", &r->lora_parameters_bytes));
    TRY(get_int(L, o, &p, "lora_base_trainable_bytes", &r->lora_base_trainable_bytes));
    TRY(get_int(L, o, &p, "embedding_parameters_bytes", &r->embedding_parameters_bytes));
    TRY(get_int(L, o, &p, "embedding_tables", &r->embedding_tables));
    TRY(get_bool(L, o, &p, "autocast_in_code", &r->autocast_in_code));
    TRY(get_bool(L, o, &p, "scaler_without_autocast", &r->scaler_without_autocast));
    TRY(get_bool(L, o, &p, "backward_in_code", &r->backward_in_code));
    TRY(get_bool(L, o, &p, "backward_on_stack", &r->backward_on_stack));
    TRY(get_bool(L, o, &p, "input_requires_grad", &r->input_requires_grad));
    const cJSON *q;
    TRY(get_obj(L, o, &p, "operation", &q)); /* the failing operation */
    if (q) {
        struct path pq = { &p, "operation", 0 };
        TRY(get_str(L, q, &pq, "name", &r->operation.name));
        TRY(read_pyframe_obj(L, q, "frame", &pq, &r->operation.frame));
        TRY(get_str(L, q, &pq, "argument", &r->operation.argument));
    }
    TRY(get_obj(L, o, &p, "failing_layer", &q)); /* where in its run of like layers the failing pass is */
    if (q) {
        struct path pl = { &p, "failing_layer", 0 };
        TRY(get_str(L, q, &pl, "run", &r->failing_layer.run));
        TRY(get_int(L, q, &pl, "index", &r->failing_layer.index));
        TRY(get_int(L, q, &pl, "count", &r->failing_layer.count));
        TRY(get_bool(L, q, &pl, "alike", &r->failing_layer.alike));
    }
    TRY(get_obj(L, o, &p, "generation_input", &q)); /* what the running generate() call decodes at once */
    if (q) {
        struct path pg = { &p, "generation_input", 0 };
        TRY(get_str(L, q, &pg, "name", &r->generation_input.name));
        TRY(get_arr(L, q, &pg, "shape", &arr));
        TRY(read_ints(L, arr, &(struct path){ &pg, "shape", 0 }, &r->generation_input.shape,
                      &r->generation_input.ndims));
    }
    ROLES_ARRAY("child_processes", r->children, r->nchildren,
                { /* this process's multiprocessing children */
                  TRY(get_int(L, x, &pe, "pid", &r->children[r->nchildren].pid));
                  TRY(get_str(L, x, &pe, "name", &r->children[r->nchildren].name));
                });
    r->children_read = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "child_processes"));
    TRY(get_obj(L, o, &p, "ddp", &q)); /* DDP's bucket copy of the gradients */
    if (q) {
        struct path pq = { &p, "ddp", 0 };
        r->ddp.present = 1;
        TRY(get_int(L, q, &pq, "wrappers", &r->ddp.wrappers));
        TRY(get_int(L, q, &pq, "bucket_bytes", &r->ddp.bucket_bytes));
        TRY(get_bool(L, q, &pq, "gradient_as_bucket_view", &r->ddp.as_view));
    }
    return 1;
}
#undef ROLES_ARRAY

static int read_site(struct loader *L, const cJSON *el, const struct path *at, struct og_site *s, int convert)
{
    if (!cJSON_IsObject(el))
        return field_err(L, at, NULL, "an object", el);
    TRY(get_int(L, el, at, "bytes", &s->bytes));
    TRY(get_int(L, el, at, "blocks", &s->blocks));
    TRY(get_str(L, el, at, "library", &s->library));
    TRY(get_str(L, el, at, "api", &s->api));
    const cJSON *frames;
    TRY(get_arr(L, el, at, "frames", &frames));
    if (frames)
        TRY(read_frames(L, frames, &(struct path){ at, "frames", 0 }, convert ? &s->frames : NULL, &s->nframes));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Streamed elements. */

static const struct path P_SITES = { NULL, "top_sites", 0 };
static const struct path P_HISTORY = { NULL, "history", 0 };
static const struct path P_EVENTS = { &P_HISTORY, "events", 0 };
static const struct path P_SAMPLES = { &P_HISTORY, "samples", 0 };

/* Min-heap on (bytes, then later index): the root is the weakest kept site. */
static int cand_weaker(const struct cand *a, const struct cand *b)
{
    return a->bytes != b->bytes ? a->bytes < b->bytes : a->index > b->index;
}

static void heap_down(struct cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_weaker(&h[l], &h[m]))
            m = l;
        if (r < n && cand_weaker(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void heap_up(struct cand *h, int i)
{
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_weaker(&h[i], &h[p]))
            return;
        struct cand t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

/* Takes ownership of `el` unless it is kept in the document (keep_all). */
static int consume_site(struct loader *L, cJSON *el, long idx)
{
    int keep_all = L->o->keep_all;
    if (keep_all)
        cJSON_AddItemToArray(L->stream_arr[T_SITES], el);
    if (L->deferred) {
        if (!keep_all)
            cJSON_Delete(el);
        return 0;
    }
    struct og_site s = { 0 };
    struct path p = { &P_SITES, NULL, idx };
    if (read_site(L, el, &p, &s, 0) < 0) {
        L->failed = 0; /* reported later, once the schema is known to be ours */
        L->deferred = 1;
        if (!keep_all)
            cJSON_Delete(el);
        return 0;
    }
    int64_t bytes = s.bytes < 0 ? 0 : s.bytes;
    L->d->sites_total++;
    L->d->sites_total_bytes = bytes > INT64_MAX - L->d->sites_total_bytes ? INT64_MAX : L->d->sites_total_bytes + bytes;

    struct cand c = { bytes, idx, el };
    int k = L->o->keep_sites > 0 ? L->o->keep_sites : 1000;
    if (L->nheap < k) {
        if (L->nheap == L->heapcap) {
            size_t cap = (size_t)L->heapcap;
            if (!grow_charged((void **)&L->heap, &cap, (size_t)L->nheap + 1, sizeof *L->heap)) {
                if (!keep_all)
                    cJSON_Delete(el);
                return err_too_complex(L);
            }
            L->heapcap = (int)cap;
        }
        L->heap[L->nheap] = c;
        heap_up(L->heap, L->nheap++);
    } else if (cand_weaker(&L->heap[0], &c)) {
        if (!keep_all)
            cJSON_Delete(L->heap[0].node);
        L->heap[0] = c;
        heap_down(L->heap, L->nheap, 0);
    } else if (!keep_all) {
        cJSON_Delete(el);
    }
    return 0;
}

static int op_of(const char *s)
{
    if (!s)
        return OG_OP_OTHER;
    if (!strcmp(s, "alloc"))
        return OG_OP_ALLOC;
    if (!strcmp(s, "free"))
        return OG_OP_FREE;
    if (!strcmp(s, "fail"))
        return OG_OP_FAIL;
    return OG_OP_OTHER;
}

static int read_event(struct loader *L, const cJSON *el, const struct path *p, int samples, struct og_event *e)
{
    int64_t dev;
    const char *op = NULL, *api;
    if (!cJSON_IsObject(el))
        return field_err(L, p, NULL, "an object", el);
    TRY(get_num(L, el, p, "t_rel", &e->t_rel));
    TRY(get_int(L, el, p, "live_bytes", &e->live_bytes));
    if (samples)
        return 0;
    TRY(get_str(L, el, p, "op", &op));
    TRY(get_bytes(L, el, p, "bytes", 0, &e->bytes));
    TRY(get_int(L, el, p, "device", &dev));
    TRY(get_str(L, el, p, "api", &api));
    e->device = dev > INT32_MAX ? -1 : (int32_t)dev;
    e->op = op_of(op);
    return 0;
}

/* Events and samples: validated, then kept as compact structs. */
static int consume_event(struct loader *L, cJSON *el, long idx, int samples)
{
    int ret = 0;
    struct og_dump *d = L->d;
    if (L->o->keep_all)
        cJSON_AddItemToArray(L->stream_arr[samples ? T_SAMPLES : T_EVENTS], el);
    if (!L->deferred) {
        struct path p = { samples ? &P_SAMPLES : &P_EVENTS, NULL, idx };
        struct og_event e = { 0 };
        if (read_event(L, el, &p, samples, &e) < 0) {
            L->failed = 0; /* reported later, once the schema is known to be ours */
            L->deferred = 1;
        } else if (L->o->no_history) {
            /* merge does not draw charts */
        } else if (samples) {
            if (grow_charged((void **)&d->hist.samples, &d->hist.samples_cap, d->hist.nsamples + 1,
                             sizeof *d->hist.samples))
                d->hist.samples[d->hist.nsamples++] = (struct og_sample){ e.t_rel, e.live_bytes };
            else
                ret = -1;
        } else {
            if (grow_charged((void **)&d->hist.events, &d->hist.events_cap, d->hist.nevents + 1, sizeof e))
                d->hist.events[d->hist.nevents++] = e;
            else
                ret = -1;
        }
    }
    if (!L->o->keep_all)
        cJSON_Delete(el);
    if (ret < 0)
        err_too_complex(L);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* The walk. */

/* Checks `schema` as soon as it is seen, so that a newer dump is refused before
 * its (possibly different) arrays are validated. */
static int check_schema(struct loader *L, const cJSON *v)
{
    if (!cJSON_IsString(v) || !v->valuestring) {
        og_sb_t b;
        og_sb_init(&b);
        describe_json(&b, v);
        set_err(L, "not an oomguard dump (\"schema\" is %s, expected \"oomguard.dump/1\")", b.buf ? b.buf : "?");
        og_sb_free(&b);
        return S_ERR;
    }
    const char *s = v->valuestring;
    og_sb_t shown;
    og_sb_init(&shown);
    sb_text(&shown, s, 64, 0);
    int ret = S_OK;
    size_t plen = strlen(OG_SCHEMA_PREFIX);
    if (strncmp(s, OG_SCHEMA_PREFIX, plen) || s[plen] < '0' || s[plen] > '9') {
        set_err(L, "not an oomguard dump (schema \"%s\")", shown.buf ? shown.buf : "");
        ret = S_ERR;
    } else {
        char *end;
        errno = 0;
        unsigned long major = strtoul(s + plen, &end, 10);
        if (*end != '\0' && *end != '.') {
            set_err(L, "not an oomguard dump (schema \"%s\")", shown.buf ? shown.buf : "");
            ret = S_ERR;
        } else if (errno || major > OG_SCHEMA_MAJOR) {
            set_err(L, "schema %s is newer than this oomguard understands (%s%d)", shown.buf ? shown.buf : "",
                    OG_SCHEMA_PREFIX, OG_SCHEMA_MAJOR);
            ret = S_ERR;
        } else if (major < OG_SCHEMA_MAJOR) {
            set_err(L, "schema %s is not supported (this oomguard reads %s%d)", shown.buf ? shown.buf : "",
                    OG_SCHEMA_PREFIX, OG_SCHEMA_MAJOR);
            ret = S_ERR;
        }
    }
    og_sb_free(&shown);
    if (ret == S_OK)
        L->schema_ok = 1;
    return ret;
}

struct member {
    cJSON *key;   /* string item holding the key */
    cJSON *value; /* M_VALUE */
    int kind;
    int target; /* M_STREAM */
    int more;   /* M_VALUE: a ',' followed */
};

enum { M_END, M_VALUE, M_STREAM, M_OBJECT };

static void member_clear(struct member *m)
{
    cJSON_Delete(m->key);
    cJSON_Delete(m->value);
    memset(m, 0, sizeof *m);
}

static int st_member(struct loader *L, int ctx, int after_comma, struct member *m, int depth)
{
    struct src *s = &L->s;
    size_t from = s->pos;
    memset(m, 0, sizeof *m);
    int r = skip_ws(L);
    if (r == S_MORE)
        return S_MORE;
    if (r == S_END)
        return syntax_error(L, s->len, from, depth, NULL);
    char c = s->buf[s->pos];
    if (c == '}' && !after_comma) {
        s->pos++;
        m->kind = M_END;
        return S_OK;
    }
    if (c != '"')
        return syntax_error(L, s->pos, from, depth, after_comma ? "a key" : "a key or '}'");
    r = parse_value(L, &m->key, from, depth);
    if (r != S_OK)
        return r;
    char got;
    r = expect_one_of(L, ":", &got, from, depth, "':'");
    if (r == S_OK)
        r = skip_ws(L);
    if (r == S_END)
        r = syntax_error(L, s->len, from, depth, NULL);
    if (r != S_OK) {
        member_clear(m);
        return r;
    }
    const char *key = m->key->valuestring;
    c = s->buf[s->pos];
    int target = T_NONE;
    if (ctx == CTX_TOP && !strcmp(key, "top_sites"))
        target = T_SITES;
    else if (ctx == CTX_HISTORY && !strcmp(key, "events"))
        target = T_EVENTS;
    else if (ctx == CTX_HISTORY && !strcmp(key, "samples"))
        target = T_SAMPLES;
    if (target != T_NONE && c == '[' && !L->seen[target]) {
        s->pos++;
        m->kind = M_STREAM;
        m->target = target;
        return S_OK;
    }
    if (ctx == CTX_TOP && !strcmp(key, "history") && c == '{' && !L->seen_history) {
        s->pos++;
        m->kind = M_OBJECT;
        return S_OK;
    }
    r = parse_value(L, &m->value, from, depth);
    if (r == S_OK)
        r = expect_one_of(L, ",}", &got, from, depth, "',' or '}'");
    if (r != S_OK) {
        member_clear(m);
        return r;
    }
    m->kind = M_VALUE;
    m->more = got == ',';
    return S_OK;
}

static int st_after(struct loader *L, int *more, int depth)
{
    char got;
    int r = expect_one_of(L, ",}", &got, L->s.pos, depth, "',' or '}'");
    if (r == S_OK)
        *more = got == ',';
    return r;
}

/* One array element plus the ',' or ']' after it. */
static int st_element(struct loader *L, int first, cJSON **el, int *more, int depth)
{
    struct src *s = &L->s;
    size_t from = s->pos;
    *el = NULL;
    int r = skip_ws(L);
    if (r == S_MORE)
        return S_MORE;
    if (r == S_END)
        return syntax_error(L, s->len, from, depth, NULL);
    if (first && s->buf[s->pos] == ']') {
        s->pos++;
        *more = 0;
        return S_OK;
    }
    r = parse_value(L, el, from, depth);
    char got;
    if (r == S_OK)
        r = expect_one_of(L, ",]", &got, from, depth, "',' or ']'");
    if (r != S_OK) {
        cJSON_Delete(*el);
        *el = NULL;
        return r;
    }
    *more = got == ',';
    return S_OK;
}

static int walk_array(struct loader *L, int target, int depth)
{
    long idx = 0;
    for (int more = 1, first = 1; more; first = 0) {
        cJSON *el;
        STEP(st_element(L, first, &el, &more, depth));
        if (!el)
            break;
        int r = target == T_SITES ? consume_site(L, el, idx) : consume_event(L, el, idx, target == T_SAMPLES);
        if (r < 0 || L->failed)
            return S_ERR;
        idx++;
    }
    return S_OK;
}

static int add_member(struct loader *L, cJSON *obj, cJSON *key, cJSON *value)
{
    if (!cJSON_AddItemToObject(obj, key->valuestring, value)) {
        cJSON_Delete(value);
        return err_too_complex(L);
    }
    return S_OK;
}

static int walk_object(struct loader *L, int ctx, cJSON *obj, int depth)
{
    for (int after_comma = 0;; after_comma = 1) {
        struct member m;
        STEP(st_member(L, ctx, after_comma, &m, depth));
        if (m.kind == M_END)
            return S_OK;
        if (cJSON_GetObjectItemCaseSensitive(obj, m.key->valuestring)) {
            duplicate_err(L, m.key->valuestring);
            member_clear(&m);
            return S_ERR;
        }
        int r = S_OK, more = 0;
        if (m.kind == M_VALUE) {
            if (ctx == CTX_TOP && !strcmp(m.key->valuestring, "schema") && !L->schema_ok &&
                !cJSON_GetObjectItemCaseSensitive(obj, "schema"))
                r = check_schema(L, m.value);
            more = m.more;
            if (r == S_OK) {
                r = add_member(L, obj, m.key, m.value);
                m.value = NULL;
            }
        } else {
            cJSON *child = m.kind == M_STREAM ? cJSON_CreateArray() : cJSON_CreateObject();
            if (!child) {
                r = err_too_complex(L);
            } else {
                r = add_member(L, obj, m.key, child);
                if (r == S_OK && m.kind == M_STREAM) {
                    L->seen[m.target] = 1;
                    L->stream_arr[m.target] = child;
                    r = walk_array(L, m.target, depth + 1);
                } else if (r == S_OK) {
                    L->seen_history = 1;
                    r = walk_object(L, CTX_HISTORY, child, depth + 1);
                }
            }
        }
        int kind = m.kind;
        member_clear(&m);
        if (r != S_OK)
            return S_ERR;
        if (kind != M_VALUE) /* a value step consumed its delimiter already */
            STEP(st_after(L, &more, depth));
        if (!more)
            return S_OK;
    }
}

/* The document must be an object; anything else is parsed whole only to say
 * whether it is JSON at all. */
static int st_open(struct loader *L, int *is_object)
{
    struct src *s = &L->s;
    /* A UTF-8 byte order mark is tolerated at the very start. */
    if (s->base == 0 && s->pos == 0 && s->len >= 3 && !memcmp(s->buf, "\xef\xbb\xbf", 3))
        s->pos = 3;
    int r = skip_ws(L);
    if (r == S_MORE)
        return S_MORE;
    if (r == S_END) {
        set_err(L, "empty file (expected a JSON object)");
        return S_ERR;
    }
    if (s->buf[s->pos] == '{') {
        s->pos++;
        *is_object = 1;
        return S_OK;
    }
    cJSON *v = NULL;
    r = parse_value(L, &v, s->pos, 0);
    if (r != S_OK)
        return r;
    const char *what = cJSON_IsArray(v)    ? "an array"
                       : cJSON_IsString(v) ? "a string"
                       : cJSON_IsNumber(v) ? "a number"
                       : cJSON_IsBool(v)   ? "a boolean"
                                           : "null";
    set_err(L, "not an oomguard dump (the JSON is %s, expected an object)", what);
    cJSON_Delete(v);
    return S_ERR;
}

static int st_trailing(struct loader *L)
{
    int r = skip_ws(L);
    if (r == S_MORE)
        return S_MORE;
    if (r == S_END)
        return S_OK;
    char what[32];
    describe_char(&L->s, L->s.pos, what);
    unsigned long long line, col;
    src_line_col(&L->s, L->s.pos, &line, &col);
    set_err(L, "not JSON (line %llu, column %llu: unexpected %s after the end of the document)", line, col, what);
    return S_ERR;
}

static int walk_document(struct loader *L)
{
    int is_object = 0;
    STEP(st_open(L, &is_object));
    L->d->root = cJSON_CreateObject();
    if (!L->d->root)
        return err_too_complex(L);
    if (walk_object(L, CTX_TOP, L->d->root, 1) != S_OK)
        return S_ERR;
    STEP(st_trailing(L));
    return S_OK;
}

/* ------------------------------------------------------------------------ */
/* Validation of the assembled document into struct og_dump. */

static int count_items(const cJSON *arr)
{
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) n++;
    return n;
}

#define ARENA_ARRAY(ptr, n)                                                       \
    do {                                                                          \
        (ptr) = (n) ? arena_alloc(&d->arena, (size_t)(n) * sizeof *(ptr)) : NULL; \
        if ((n) && !(ptr))                                                        \
            return err_too_complex(L), -1;                                        \
    } while (0)

static int read_strings(struct loader *L, const cJSON *arr, const struct path *at, const char ***out, int *nout)
{
    struct og_dump *d = L->d;
    int n = count_items(arr), i = 0;
    const char **v;
    ARENA_ARRAY(v, n);
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        if (!cJSON_IsString(x) || !x->valuestring)
            return field_err(L, &(struct path){ at, NULL, i }, NULL, "a string", x);
        v[i++] = x->valuestring;
    }
    *out = v;
    *nout = n;
    return 0;
}

/* an array of integers (none: NULL, 0) into the arena */
static int read_ints(struct loader *L, const cJSON *arr, const struct path *at, int64_t **out, int *nout)
{
    struct og_dump *d = L->d;
    int n = count_items(arr), i = 0;
    int64_t *v;
    ARENA_ARRAY(v, n);
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        TRY(check_int(L, x, &(struct path){ at, NULL, i }, NULL, 0, &v[i]));
        i++;
    }
    *out = v;
    *nout = n;
    return 0;
}

static int v_top(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    TRY(get_str(L, r, NULL, "status", &d->status_str));
    static const struct {
        const char *s;
        enum og_status st;
    } st[] = {
        { "oom", OG_ST_OOM }, { "recovered", OG_ST_RECOVERED }, { "warning", OG_ST_WARNING }, { "exit", OG_ST_EXIT }
    };
    d->status = OG_ST_OTHER;
    for (size_t i = 0; d->status_str && i < sizeof st / sizeof st[0]; i++)
        if (!strcmp(d->status_str, st[i].s))
            d->status = st[i].st;
    TRY(get_str(L, r, NULL, "generator", &d->generator));
    TRY(get_num(L, r, NULL, "time", &d->time));
    TRY(get_int(L, r, NULL, "pid", &d->pid));
    TRY(get_int(L, r, NULL, "ppid", &d->ppid));
    TRY(get_str(L, r, NULL, "host", &d->host));
    TRY(get_str(L, r, NULL, "node", &d->node));
    TRY(get_int(L, r, NULL, "rank", &d->rank));
    TRY(get_int(L, r, NULL, "local_rank", &d->local_rank));
    TRY(get_int(L, r, NULL, "world_size", &d->world_size));
    TRY(get_str(L, r, NULL, "job_id", &d->job_id));
    TRY(get_str(L, r, NULL, "cmdline", &d->cmdline));
    TRY(get_int(L, r, NULL, "visible_devices", &d->visible_devices));

    const cJSON *fw, *libs, *env;
    TRY(get_obj(L, r, NULL, "framework", &fw));
    struct path pfw = { NULL, "framework", 0 };
    TRY(get_str(L, fw, &pfw, "name", &d->framework_name));
    TRY(get_arr(L, fw, &pfw, "libraries", &libs));
    if (libs)
        TRY(read_strings(L, libs, &(struct path){ &pfw, "libraries", 0 }, &d->framework_libs, &d->nframework_libs));

    TRY(get_obj(L, r, NULL, "env", &env));
    if (env) {
        struct path penv = { NULL, "env", 0 };
        int n = count_items(env), i = 0;
        ARENA_ARRAY(d->env, n);
        const cJSON *x;
        cJSON_ArrayForEach(x, env)
        {
            if (!cJSON_IsString(x) || !x->valuestring)
                return field_err(L, &penv, x->string, "a string", x);
            d->env[i].key = x->string;
            d->env[i++].value = x->valuestring;
        }
        d->nenv = n;
    }
    return 0;
}

static int v_event(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *e, *stack, *rb;
    const struct path p = { NULL, "event", 0 };
    TRY(get_obj(L, r, NULL, "event", &e));
    d->event.present = e != NULL;
    TRY(get_bytes(L, e, &p, "requested_bytes", 0, &d->event.requested_bytes));
    TRY(get_str(L, e, &p, "api", &d->event.api));
    TRY(get_str(L, e, &p, "driver_api", &d->event.driver_api));
    TRY(get_int(L, e, &p, "device", &d->event.device));
    TRY(get_bool(L, e, &p, "stream_ordered", &d->event.stream_ordered));
    TRY(get_int(L, e, &p, "result", &d->event.result));
    TRY(get_bool(L, e, &p, "caused_by_limit", &d->event.caused_by_limit));
    TRY(get_str(L, e, &p, "library", &d->event.library));
    TRY(get_num(L, e, &p, "t", &d->event.t));
    TRY(get_num(L, e, &p, "t_rel", &d->event.t_rel));
    TRY(get_int(L, e, &p, "attempts", &d->event.attempts));
    TRY(get_int(L, e, &p, "released_between_attempts_bytes", &d->event.released_between_attempts_bytes));
    TRY(get_arr(L, e, &p, "stack", &stack));
    if (stack)
        TRY(read_frames(L, stack, &(struct path){ &p, "stack", 0 }, &d->event.stack, &d->event.nstack));
    const cJSON *pystack;
    TRY(get_arr(L, e, &p, "python_stack", &pystack));
    if (pystack)
        TRY(read_pyframes(L, pystack, &(struct path){ &p, "python_stack", 0 }, &d->event.python_stack,
                          &d->event.npython_stack));
    TRY(get_str(L, e, &p, "phase", &d->event.phase));
    TRY(get_str(L, e, &p, "phase_source", &d->event.phase_source));
    TRY(read_pyframe_obj(L, e, "phase_frame", &p, &d->event.phase_frame));
    TRY(read_pyframe_obj(L, e, "phase_site", &p, &d->event.phase_site));
    TRY(get_obj(L, e, &p, "recovered_by", &rb));
    d->event.recovered = rb != NULL;
    struct path prb = { &p, "recovered_by", 0 };
    TRY(get_bytes(L, rb, &prb, "requested_bytes", 0, &d->event.recovered_requested_bytes));
    TRY(get_num(L, rb, &prb, "t", &d->event.recovered_t));
    return 0;
}

static int v_device(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *v;
    const struct path p = { NULL, "device", 0 };
    TRY(get_obj(L, r, NULL, "device", &v));
    d->device.present = v != NULL;
    TRY(get_int(L, v, &p, "index", &d->device.index));
    TRY(get_str(L, v, &p, "name", &d->device.name));
    TRY(get_str(L, v, &p, "pci_bus_id", &d->device.pci_bus_id));
    TRY(get_str(L, v, &p, "compute_capability", &d->device.compute_capability));
    TRY(get_int(L, v, &p, "total_bytes", &d->device.total_bytes));
    TRY(get_int(L, v, &p, "free_bytes", &d->device.free_bytes));
    TRY(get_int(L, v, &p, "limit_bytes", &d->device.limit_bytes));
    return 0;
}

static int v_memory(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *m, *k, *libs, *procs, *unm, *fw;
    const struct path p = { NULL, "memory", 0 };
    TRY(get_obj(L, r, NULL, "memory", &m));
    TRY(get_int(L, m, &p, "process_tracked_bytes", &d->mem.process_tracked_bytes));
    TRY(get_int(L, m, &p, "process_used_bytes", &d->mem.process_used_bytes));
    TRY(get_int(L, m, &p, "framework_bytes", &d->mem.framework_bytes));
    TRY(get_int(L, m, &p, "framework_cached_bytes", &d->mem.framework_cached_bytes));
    TRY(get_int_min(L, m, &p, "non_framework_bytes", -INT64_MAX, &d->mem.non_framework_bytes));
    TRY(get_int_min(L, m, &p, "context_bytes_estimate", -INT64_MAX, &d->mem.context_bytes_estimate));
    TRY(get_int(L, m, &p, "other_processes_bytes", &d->mem.other_processes_bytes));
    TRY(get_int(L, m, &p, "host_pinned_bytes", &d->mem.host_pinned_bytes));
    TRY(get_int(L, m, &p, "contexts_made", &d->mem.contexts_made));
    TRY(get_bool(L, m, &p, "primary_context", &d->mem.primary_context));
    /* Differences of two measurements can dip below zero; show them as unknown. */
    if (d->mem.non_framework_bytes < 0)
        d->mem.non_framework_bytes = -1;
    if (d->mem.context_bytes_estimate < 0)
        d->mem.context_bytes_estimate = -1;

    TRY(get_obj(L, m, &p, "by_kind", &k));
    struct path pk = { &p, "by_kind", 0 };
    TRY(get_int(L, k, &pk, "plain", &d->mem.kind_plain));
    TRY(get_int(L, k, &pk, "managed", &d->mem.kind_managed));
    TRY(get_int(L, k, &pk, "pool_reserved", &d->mem.kind_pool_reserved));
    TRY(get_int(L, k, &pk, "pool_used", &d->mem.kind_pool_used));
    TRY(get_int(L, k, &pk, "vmm_physical", &d->mem.kind_vmm_physical));
    TRY(get_int(L, k, &pk, "vmm_mapped", &d->mem.kind_vmm_mapped));

    TRY(get_arr(L, m, &p, "by_library", &libs));
    if (libs) {
        struct path pl = { &p, "by_library", 0 };
        int n = count_items(libs), i = 0;
        ARENA_ARRAY(d->mem.libs, n);
        const cJSON *x;
        cJSON_ArrayForEach(x, libs)
        {
            struct path pe = { &pl, NULL, i };
            struct og_lib *l = &d->mem.libs[i++];
            if (!cJSON_IsObject(x))
                return field_err(L, &pe, NULL, "an object", x);
            TRY(get_str(L, x, &pe, "library", &l->library));
            TRY(get_int(L, x, &pe, "bytes", &l->bytes));
            TRY(get_int(L, x, &pe, "blocks", &l->blocks));
            TRY(get_bool(L, x, &pe, "framework", &l->framework));
            TRY(get_str(L, x, &pe, "framework_name", &l->framework_name));
        }
        d->mem.nlibs = n;
    }
    TRY(get_arr(L, m, &p, "other_processes", &procs));
    if (procs) {
        struct path pp = { &p, "other_processes", 0 };
        int n = count_items(procs), i = 0;
        ARENA_ARRAY(d->mem.procs, n);
        const cJSON *x;
        cJSON_ArrayForEach(x, procs)
        {
            struct path pe = { &pp, NULL, i };
            struct og_proc *o = &d->mem.procs[i++];
            if (!cJSON_IsObject(x))
                return field_err(L, &pe, NULL, "an object", x);
            TRY(get_int(L, x, &pe, "pid", &o->pid));
            TRY(get_str(L, x, &pe, "name", &o->name));
            TRY(get_int(L, x, &pe, "bytes", &o->bytes));
        }
        d->mem.nprocs = n;
    }
    TRY(get_arr(L, m, &p, "unmeasured", &unm));
    if (unm)
        TRY(read_strings(L, unm, &(struct path){ &p, "unmeasured", 0 }, &d->mem.unmeasured, &d->mem.nunmeasured));
    TRY(get_obj(L, m, &p, "framework", &fw));
    d->mem.framework = fw;
    if (fw) {
        /* The adapter's own numbers: every *_bytes key must be a byte count. */
        struct path pf = { &p, "framework", 0 };
        const cJSON *x;
        cJSON_ArrayForEach(x, fw)
        {
            size_t n = x->string ? strlen(x->string) : 0;
            struct og_bytes ignored; /* the adapter's requested_bytes can be SIZE_MAX too */
            if (n > 6 && !strcmp(x->string + n - 6, "_bytes") && !cJSON_IsNull(x))
                TRY(check_bytes(L, x, &pf, x->string, 0, &ignored));
        }
        /* the other frameworks' holdings: objects with a name and byte counts (or null) */
        const cJSON *others;
        TRY(get_arr(L, fw, &pf, "other_frameworks", &others));
        if (others) {
            struct path po = { &pf, "other_frameworks", 0 };
            int i = 0, n = count_items(others);
            ARENA_ARRAY(d->mem.other_fw, n);
            cJSON_ArrayForEach(x, others)
            {
                struct path pe = { &po, NULL, i };
                struct og_other_fw_view *v = &d->mem.other_fw[i++];
                if (!cJSON_IsObject(x))
                    return field_err(L, &pe, NULL, "an object", x);
                TRY(get_str(L, x, &pe, "framework", &v->framework));
                TRY(get_int(L, x, &pe, "reserved_bytes", &v->reserved_bytes));
                TRY(get_int(L, x, &pe, "in_use_bytes", &v->in_use_bytes));
                TRY(get_int(L, x, &pe, "limit_bytes", &v->limit_bytes));
            }
            d->mem.nother_fw = n;
        }
        TRY(get_obj(L, fw, &pf, "snapshot", &d->mem.fw_snapshot));
        TRY(get_str(L, fw, &pf, "snapshot_file", &d->mem.fw_snapshot_file));
        TRY(read_roles(L, fw, &pf, &d->mem.roles));
    }
    return 0;
}

static int v_history(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *h, *c, *x;
    const struct path p = { NULL, "history", 0 };
    TRY(get_obj(L, r, NULL, "history", &h));
    d->hist.present = h != NULL;
    TRY(get_int(L, h, &p, "peak_bytes", &d->hist.peak_bytes));
    TRY(get_num(L, h, &p, "peak_t_rel", &d->hist.peak_t_rel));
    TRY(get_str(L, h, &p, "peak_library", &d->hist.peak_library));
    /* events and samples were streamed; anything else there is the wrong type. */
    TRY(get_arr(L, h, &p, "events", &x));
    TRY(get_arr(L, h, &p, "samples", &x));
    TRY(get_obj(L, h, &p, "counters", &c));
    struct path pc = { &p, "counters", 0 };
    TRY(get_int(L, c, &pc, "allocs", &d->hist.allocs));
    TRY(get_int(L, c, &pc, "frees", &d->hist.frees));
    TRY(get_int(L, c, &pc, "failures", &d->hist.failures));
    TRY(get_int(L, c, &pc, "unknown_frees", &d->hist.unknown_frees));
    TRY(get_int(L, c, &pc, "recovered_episodes", &d->hist.recovered_episodes));
    TRY(get_int(L, c, &pc, "recovered_not_written", &d->hist.recovered_not_written));
    return 0;
}

static int v_diagnosis(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *g, *causes;
    const struct path p = { NULL, "diagnosis", 0 };
    TRY(get_obj(L, r, NULL, "diagnosis", &g));
    d->diag.present = g != NULL;
    TRY(get_str(L, g, &p, "primary", &d->diag.primary));
    TRY(get_bytes(L, g, &p, "shortfall_bytes", 1, &d->diag.shortfall_bytes));
    TRY(get_arr(L, g, &p, "causes", &causes));
    if (!causes)
        return 0;
    struct path pcs = { &p, "causes", 0 };
    int n = count_items(causes), i = 0;
    ARENA_ARRAY(d->diag.causes, n);
    const cJSON *x;
    cJSON_ArrayForEach(x, causes)
    {
        struct path pe = { &pcs, NULL, i };
        struct og_cause *c = &d->diag.causes[i++];
        const cJSON *ev;
        if (!cJSON_IsObject(x))
            return field_err(L, &pe, NULL, "an object", x);
        TRY(get_str(L, x, &pe, "id", &c->id));
        TRY(get_num(L, x, &pe, "confidence", &c->confidence));
        TRY(get_str(L, x, &pe, "summary", &c->summary));
        TRY(get_obj(L, x, &pe, "evidence", &ev));
        if (ev) {
            int ne = count_items(ev), j = 0;
            ARENA_ARRAY(c->evidence, ne);
            const cJSON *y;
            cJSON_ArrayForEach(y, ev)
            {
                c->evidence[j].name = y->string ? y->string : "";
                c->evidence[j++].value = y;
            }
            c->nevidence = ne;
        }
    }
    d->diag.ncauses = n;
    return 0;
}

static int v_remedies(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *arr;
    const struct path p = { NULL, "remedies", 0 };
    TRY(get_arr(L, r, NULL, "remedies", &arr));
    if (!arr)
        return 0;
    int n = count_items(arr), i = 0;
    ARENA_ARRAY(d->remedies, n);
    const cJSON *x;
    cJSON_ArrayForEach(x, arr)
    {
        struct path pe = { &p, NULL, i };
        struct og_remedy *m = &d->remedies[i++];
        const cJSON *how;
        if (!cJSON_IsObject(x))
            return field_err(L, &pe, NULL, "an object", x);
        TRY(get_str(L, x, &pe, "id", &m->id));
        TRY(get_int(L, x, &pe, "rank", &m->rank));
        TRY(get_bool(L, x, &pe, "shown", &m->shown));
        const cJSON *rk;
        TRY(get_obj(L, x, &pe, "ranking", &rk));
        m->tier = -1;
        if (rk)
            TRY(get_int_min(L, rk, &(struct path){ &pe, "ranking", 0 }, "tier", 0, &m->tier));
        TRY(get_str(L, x, &pe, "title", &m->title));
        TRY(get_str(L, x, &pe, "why", &m->why));
        TRY(get_str(L, x, &pe, "saving", &m->saving));
        TRY(get_str(L, x, &pe, "cost", &m->cost));
        TRY(get_arr(L, x, &pe, "how", &how));
        if (how)
            TRY(read_strings(L, how, &(struct path){ &pe, "how", 0 }, &m->how, &m->nhow));
    }
    d->nremedies = n;
    return 0;
}

static int v_summary(struct loader *L, const cJSON *r)
{
    struct og_dump *d = L->d;
    const cJSON *s, *devs;
    const struct path p = { NULL, "summary", 0 };
    TRY(get_obj(L, r, NULL, "summary", &s));
    TRY(get_arr(L, s, &p, "devices", &devs));
    if (!devs)
        return 0;
    struct path pd = { &p, "devices", 0 };
    int n = count_items(devs), i = 0;
    ARENA_ARRAY(d->devsum, n);
    const cJSON *x;
    cJSON_ArrayForEach(x, devs)
    {
        struct path pe = { &pd, NULL, i };
        struct og_devsum *v = &d->devsum[i++];
        const cJSON *fits;
        if (!cJSON_IsObject(x))
            return field_err(L, &pe, NULL, "an object", x);
        TRY(get_int(L, x, &pe, "index", &v->index));
        TRY(get_int(L, x, &pe, "peak_bytes", &v->peak_bytes));
        TRY(get_num(L, x, &pe, "peak_t_rel", &v->peak_t_rel));
        TRY(get_str(L, x, &pe, "peak_library", &v->peak_library));
        TRY(get_str(L, x, &pe, "unbounded_why", &v->unbounded_why));
        TRY(get_arr(L, x, &pe, "fits", &fits));
        if (!fits)
            continue;
        struct path pf = { &pe, "fits", 0 };
        int nf = count_items(fits), j = 0;
        ARENA_ARRAY(v->fits, nf);
        const cJSON *y;
        cJSON_ArrayForEach(y, fits)
        {
            struct path pfe = { &pf, NULL, j };
            struct og_fit *f = &v->fits[j++];
            if (!cJSON_IsObject(y))
                return field_err(L, &pfe, NULL, "an object", y);
            TRY(get_num(L, y, &pfe, "card_gb", &f->card_gb));
            TRY(get_bool(L, y, &pfe, "fits", &f->fits));
        }
        v->nfits = nf;
    }
    d->ndevsum = n;
    return 0;
}

static int cand_stronger_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int finish_sites(struct loader *L)
{
    struct og_dump *d = L->d;
    const cJSON *v;
    TRY(get_arr(L, d->root, NULL, "top_sites", &v));
    const cJSON *ps;
    TRY(get_arr(L, d->root, NULL, "python_sites", &ps));
    if (ps)
        TRY(read_pyframes(L, ps, &(struct path){ NULL, "python_sites", 0 }, &d->python_sites, &d->npython_sites));
    if (!L->nheap)
        return 0;
    qsort(L->heap, (size_t)L->nheap, sizeof *L->heap, cand_stronger_cmp);
    ARENA_ARRAY(d->sites, L->nheap);
    if (!L->o->keep_all) {
        ARENA_ARRAY(d->kept_nodes, L->nheap);
        for (int i = 0; i < L->nheap; i++)
            d->kept_nodes[i] = L->heap[i].node;
        d->nkept_nodes = L->nheap;
    }
    for (int i = 0; i < L->nheap; i++) {
        struct path p = { &P_SITES, NULL, L->heap[i].index };
        TRY(read_site(L, L->heap[i].node, &p, &d->sites[i], 1));
        d->sites[i].index = L->heap[i].index;
    }
    d->nsites = L->nheap;
    return 0;
}

static int validate(struct loader *L)
{
    const cJSON *r = L->d->root;
    if (!L->schema_ok) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(r, "schema");
        if (!s) {
            set_err(L, "not an oomguard dump (no \"schema\" key)");
            return -1;
        }
        if (check_schema(L, s) != S_OK)
            return -1;
    }
    if (L->deferred) {
        L->failed = 1;
        return -1;
    }
    TRY(v_top(L, r));
    TRY(v_event(L, r));
    TRY(v_device(L, r));
    TRY(v_memory(L, r));
    TRY(v_history(L, r));
    TRY(finish_sites(L));
    TRY(v_diagnosis(L, r));
    TRY(v_remedies(L, r));
    TRY(v_summary(L, r));
    return 0;
}

/* ------------------------------------------------------------------------ */

void og_dump_free(struct og_dump *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nkept_nodes; i++)
        cJSON_Delete(d->kept_nodes[i]);
    cJSON_Delete(d->root);
    mem_uncharge(d->hist.events_cap * sizeof *d->hist.events);
    mem_uncharge(d->hist.samples_cap * sizeof *d->hist.samples);
    free(d->hist.events);
    free(d->hist.samples);
    arena_free(d->arena);
    free(d);
}

static struct og_dump *load(struct loader *L)
{
    struct og_dump *d = L->d;
    int ok = walk_document(L) == S_OK && !L->failed && validate(L) == 0 && !L->failed;
    /* Sites still held by the heap but not handed to the dump. */
    if (!ok && !L->o->keep_all && !d->nkept_nodes)
        for (int i = 0; i < L->nheap; i++)
            cJSON_Delete(L->heap[i].node);
    mem_uncharge((size_t)L->heapcap * sizeof *L->heap);
    free(L->heap);
    free(L->s.buf);
    if (!ok) {
        og_dump_free(d);
        return NULL;
    }
    return d;
}

static struct og_dump *new_dump(struct loader *L, const char *name, const struct og_load_opts *opts, struct og_err *err)
{
    static const struct og_load_opts defaults = { 0, 1000, 0 };
    memset(L, 0, sizeof *L);
    L->o = opts ? opts : &defaults;
    L->err = err;
    L->s.fd = -1;
    err->msg[0] = '\0';
    g_mem_exhausted = 0;
    struct og_dump *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err->msg, sizeof err->msg, "%s: out of memory", name);
        return NULL;
    }
    d->file = name;
    L->d = d;
    return d;
}

struct og_dump *og_dump_load_mem(const char *data, size_t len, const char *name, const struct og_load_opts *opts,
                                 struct og_err *err)
{
    struct loader L;
    struct og_dump *d = new_dump(&L, name, opts, err);
    if (!d)
        return NULL;
    if (len > OG_MAX_FILE_BYTES) {
        set_err(&L, "too large (the limit is %zu MiB)", OG_MAX_FILE_BYTES >> 20);
        og_dump_free(d);
        return NULL;
    }
    L.s.buf = malloc(len + 1);
    if (!L.s.buf) {
        set_err(&L, "out of memory");
        og_dump_free(d);
        return NULL;
    }
    if (len)
        memcpy(L.s.buf, data, len);
    L.s.buf[len] = '\0';
    L.s.len = L.s.cap = len;
    L.s.eof = 1;
    return load(&L);
}

struct og_dump *og_dump_load_file(const char *path, const struct og_load_opts *opts, struct og_err *err)
{
    struct loader L;
    struct og_dump *d = new_dump(&L, strcmp(path, "-") ? path : "(standard input)", opts, err);
    if (!d)
        return NULL;
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY) : 0;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        set_err(&L, "%s", strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        set_err(&L, "is a directory (expected a dump file)");
        goto fail;
    }
    size_t cap = WINDOW_START;
    if (S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > OG_MAX_FILE_BYTES) {
            char h[32];
            set_err(&L, "too large (%s; the limit is %zu MiB)", human_bytes((int64_t)st.st_size, h),
                    OG_MAX_FILE_BYTES >> 20);
            goto fail;
        }
        /* Small files fit the window whole. */
        if ((size_t)st.st_size + 1 < cap)
            cap = (size_t)st.st_size + 1 > WINDOW_MIN ? (size_t)st.st_size + 1 : WINDOW_MIN;
    }
    L.s.fd = fd;
    L.s.cap = cap;
    L.s.buf = malloc(cap + 1);
    if (!L.s.buf) {
        set_err(&L, "out of memory");
        goto fail;
    }
    L.s.buf[0] = '\0';
    if (src_fill(&L, 0) < 0)
        goto fail;
    d = load(&L);
    if (fd > 0)
        close(fd);
    return d;
fail:
    if (fd > 0)
        close(fd);
    free(L.s.buf);
    og_dump_free(d);
    return NULL;
}

/* ------------------------------------------------------------------------ */

const char *og_op_name(int op)
{
    switch (op) {
    case OG_OP_ALLOC:
        return "alloc";
    case OG_OP_FREE:
        return "free";
    case OG_OP_FAIL:
        return "fail";
    default:
        return "other";
    }
}

int og_remedy_shown(const struct og_dump *d, int i)
{
    if (i < 0 || i >= d->nremedies)
        return 0;
    return d->remedies[i].shown >= 0 ? d->remedies[i].shown : i < 5; /* dumps before `shown`: the first five */
}

int og_event_on_device(const struct og_dump *d, const struct og_event *e)
{
    return d->event.device < 0 || e->device < 0 || e->device == d->event.device;
}

int64_t og_history_max(const struct og_dump *d)
{
    int64_t m = d->hist.peak_bytes;
    for (size_t i = 0; i < d->hist.nsamples; i++)
        if (d->hist.samples[i].live_bytes > m)
            m = d->hist.samples[i].live_bytes;
    for (size_t i = 0; i < d->hist.nevents; i++)
        if (og_event_on_device(d, &d->hist.events[i]) && d->hist.events[i].live_bytes > m)
            m = d->hist.events[i].live_bytes;
    return m;
}
