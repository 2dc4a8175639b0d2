/* The one growable string of the project: the library renders dumps into it, the command its
 * reports (tools/ adds its own escaping for untrusted text on top).  Allocation failures are
 * sticky (sb->failed), so renderers need not check every append, and nothing aborts. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool grow(og_sb_t *sb, size_t extra)
{
    if (sb->failed)
        return false;
    if (sb->len + extra + 1 <= sb->cap)
        return true;
    size_t cap = sb->cap ? sb->cap : 4096;
    while (cap < sb->len + extra + 1)
        cap *= 2;
    char *p = realloc(sb->buf, cap);
    if (!p) {
        sb->failed = true;
        return false;
    }
    sb->buf = p;
    sb->cap = cap;
    return true;
}

void og_sb_put(og_sb_t *sb, const void *s, size_t n)
{
    if (!grow(sb, n))
        return;
    if (n) /* s may be NULL for nothing; the buffer still exists (an empty string is "", not absent) */
        memcpy(sb->buf + sb->len, s, n);
    sb->len += n;
    sb->buf[sb->len] = 0;
}

void og_sb_puts(og_sb_t *sb, const char *s) { og_sb_put(sb, s, strlen(s)); }

void og_sb_putc(og_sb_t *sb, int c)
{
    char ch = (char)c;
    og_sb_put(sb, &ch, 1);
}

void og_sb_repeat(og_sb_t *sb, const char *s, int n)
{
    for (int i = 0; i < n; i++)
        og_sb_puts(sb, s);
}

void og_sb_vprintf(og_sb_t *sb, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= 0 && (size_t)n < sizeof small)
        og_sb_put(sb, small, (size_t)n);
    else if (n >= 0 && grow(sb, (size_t)n)) {
        vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, again);
        sb->len += (size_t)n;
    }
    va_end(again);
}

void og_sb_printf(og_sb_t *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    og_sb_vprintf(sb, fmt, ap);
    va_end(ap);
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), its code point in *cp; 0 when the
 * byte at p starts none (a stray continuation byte, an overlong form, a surrogate, a cut one). */
size_t og_utf8_seq(const unsigned char *p, size_t n, uint32_t *cp)
{
    unsigned c = p[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if ((c & 0xe0) == 0xc0)
        len = 2, v = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, v = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (p[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

/* len, less an incomplete UTF-8 sequence at the end of s[0..len): where a copy was cut short */
size_t og_utf8_cut(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t k = len;
    while (k > 0 && len - k < 3 && (p[k - 1] & 0xc0) == 0x80)
        k--;
    if (k == 0 || p[k - 1] < 0xc0)
        return len;
    size_t lead = k - 1, want = p[lead] >= 0xf0 ? 4 : p[lead] >= 0xe0 ? 3 : 2;
    return len - lead < want ? lead : len;
}

/* How a format escapes text, as data: which characters it escapes and how it writes each kind.  One
 * walk (put_escaped) serves them all, so JSON and the text twin cannot drift apart in how they read
 * UTF-8. */
enum code_style {
    CODE_UFFFD,  /* \ufffd: the replacement character, whatever the byte */
    CODE_X2,     /* \xNN */
    CODE_U4,     /* \uNNNN */
    CODE_UBRACE, /* \u{NNNN} */
};
typedef struct escaping {
    uint64_t ascii_lo, ascii_hi; /* bit c of lo (c < 64), of hi (c - 64): ASCII c is escaped */
    bool wide;                   /* from U+0080: the characters wide_unsafe() names are escaped */
    uint8_t bad_byte;            /* enum code_style of a byte that is not UTF-8 */
    uint8_t ascii;               /* ... of an escaped ASCII character without a two-character escape */
    uint8_t code_point;          /* ... of an escaped character from U+0080 */
} escaping_t;

#define BIT(c)   (1ULL << ((c) % 64))
#define CONTROLS 0xffffffffULL /* U+0000..U+001F */

/* JSON: control characters, the quote and the backslash; a byte that is not UTF-8 becomes U+FFFD */
static const escaping_t json_escaping = { CONTROLS | BIT('"'), BIT('\\'), false, CODE_UFFFD, CODE_U4, CODE_U4 };
/* A text file or a terminal: what a terminal or an editor acts on or shows misleadingly (C0 and C1
 * controls, DEL, the bidi overrides and isolates, line/paragraph separators) and bytes that are not
 * UTF-8, made visible; keeping newlines (the renderer's own lines) or not. */
static const escaping_t text_escaping = { CONTROLS, BIT(0x7f), true, CODE_X2, CODE_X2, CODE_UBRACE };
static const escaping_t text_nl_escaping = { CONTROLS & ~BIT('\n'), BIT(0x7f), true, CODE_X2, CODE_X2, CODE_UBRACE };

/* from U+0080: C1 controls, the bidi marks, overrides and isolates, line/paragraph separators */
static bool wide_unsafe(uint32_t cp)
{
    return cp <= 0x9f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x200e || cp == 0x200f;
}

static bool escaped(const escaping_t *e, uint32_t cp)
{
    if (cp < 64)
        return (e->ascii_lo >> cp) & 1;
    if (cp < 128)
        return (e->ascii_hi >> (cp - 64)) & 1;
    return e->wide && wide_unsafe(cp);
}

/* The two-character escapes (\n \r \t \" \\); NULL when CP has none.  Only characters the format
 * escapes get here: the text twin never escapes a quote or a backslash. */
static const char *short_escape(uint32_t cp)
{
    switch (cp) {
    case '\n':
        return "\\n";
    case '\r':
        return "\\r";
    case '\t':
        return "\\t";
    case '"':
        return "\\\"";
    case '\\':
        return "\\\\";
    default:
        return NULL;
    }
}

static void put_code(og_sb_t *sb, enum code_style style, uint32_t v)
{
    switch (style) {
    case CODE_UFFFD:
        og_sb_put(sb, "\\ufffd", 6);
        break;
    case CODE_X2:
        og_sb_printf(sb, "\\x%02x", (unsigned)v);
        break;
    case CODE_U4:
        og_sb_printf(sb, "\\u%04x", (unsigned)v);
        break;
    case CODE_UBRACE:
        og_sb_printf(sb, "\\u{%04x}", (unsigned)v);
        break;
    }
}

/* s[0..n) escaped as E says: valid UTF-8 that E does not escape as it is, runs of plain ASCII copied
 * at once. */
static void put_escaped(og_sb_t *sb, const char *s, size_t n, const escaping_t *e)
{
    const unsigned char *p = (const unsigned char *)s;
    while (n) {
        size_t run = 0;
        while (run < n && p[run] < 0x80 && !escaped(e, p[run]))
            run++;
        if (run) {
            og_sb_put(sb, p, run);
            p += run, n -= run;
            continue;
        }
        uint32_t cp;
        const char *esc;
        size_t len = og_utf8_seq(p, n, &cp);
        if (!len) {
            put_code(sb, e->bad_byte, p[0]);
            len = 1;
        } else if (!escaped(e, cp)) {
            og_sb_put(sb, p, len);
        } else if ((esc = short_escape(cp)) != NULL) {
            og_sb_put(sb, esc, 2);
        } else {
            put_code(sb, cp < 0x80 ? e->ascii : e->code_point, cp);
        }
        p += len, n -= len;
    }
}

/* JSON string with quotes: valid UTF-8 as it is (café stays café), control characters escaped,
 * each byte that is not UTF-8 as U+FFFD, so any input (library paths, command lines, process
 * names) yields valid JSON that reads back as the text it was. */
void og_sb_json_str(og_sb_t *sb, const char *s)
{
    og_sb_put(sb, "\"", 1);
    put_escaped(sb, s ? s : "", s ? strlen(s) : 0, &json_escaping);
    og_sb_put(sb, "\"", 1);
}

bool og_text_needs_escape(const char *s, bool keep_nl)
{
    const escaping_t *e = keep_nl ? &text_nl_escaping : &text_escaping;
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    while (n) {
        uint32_t cp;
        size_t len = og_utf8_seq(p, n, &cp);
        if (!len || escaped(e, cp))
            return true;
        p += len, n -= len;
    }
    return false;
}

/* s[0..n) for a text file or a terminal: valid UTF-8 as it is; control characters made visible
 * (\n \r \t, other ASCII \xNN), bytes that are not UTF-8 as \xNN, other unsafe characters as
 * \u{XXXX}.  keep_nl: a newline stays one (the renderer's own lines). */
void og_sb_text_escaped(og_sb_t *sb, const char *s, size_t n, bool keep_nl)
{
    put_escaped(sb, s, n, keep_nl ? &text_nl_escaping : &text_escaping);
}

void og_sb_free(og_sb_t *sb)
{
    free(sb->buf);
    og_sb_init(sb);
}
