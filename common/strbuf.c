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

/* The two-character escape of CP both formats write the same way (\n \r \t), and in JSON also the
 * quote and the backslash; NULL when CP has none. */
static const char *short_escape(uint32_t cp, bool json)
{
    switch (cp) {
    case '\n':
        return "\\n";
    case '\r':
        return "\\r";
    case '\t':
        return "\\t";
    case '"':
        return json ? "\\\"" : NULL;
    case '\\':
        return json ? "\\\\" : NULL;
    default:
        return NULL;
    }
}

/* JSON string with quotes: valid UTF-8 as it is (café stays café), control characters escaped,
 * each byte that is not UTF-8 as U+FFFD, so any input (library paths, command lines, process
 * names) yields valid JSON that reads back as the text it was. */
void og_sb_json_str(og_sb_t *sb, const char *s)
{
    og_sb_put(sb, "\"", 1);
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    while (n) {
        size_t run = 0; /* plain characters are copied in runs */
        while (run < n && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' && p[run] != '\\')
            run++;
        if (run) {
            og_sb_put(sb, (const char *)p, run);
            p += run, n -= run;
            continue;
        }
        uint32_t cp;
        const char *esc;
        size_t len = og_utf8_seq(p, n, &cp);
        if (!len) {
            og_sb_put(sb, "\\ufffd", 6);
            len = 1;
        } else if ((esc = short_escape(cp, true)) != NULL) {
            og_sb_put(sb, esc, 2);
        } else if (cp < 0x20) {
            og_sb_printf(sb, "\\u%04x", (unsigned)cp);
        } else {
            og_sb_put(sb, (const char *)p, len);
        }
        p += len, n -= len;
    }
    og_sb_put(sb, "\"", 1);
}

/* Characters a terminal or an editor acts on or shows misleadingly: C0 and C1 controls, DEL, the
 * bidi overrides and isolates (text that reads differently than it is), line/paragraph separators. */
static bool text_unsafe(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029 || cp == 0x200e || cp == 0x200f;
}

bool og_text_needs_escape(const char *s, bool keep_nl)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t n = strlen((const char *)p);
    while (n) {
        uint32_t cp;
        size_t len = og_utf8_seq(p, n, &cp);
        if (!len || (text_unsafe(cp) && !(keep_nl && cp == '\n')))
            return true;
        p += len, n -= len;
    }
    return false;
}

/* s[0..n) for a text file or a terminal: valid UTF-8 as it is; control characters made visible
 * (\n \r \t \e, other bytes \xNN), bytes that are not UTF-8 as \xNN, other unsafe characters as
 * \u{XXXX}.  keep_nl: a newline stays one (the renderer's own lines). */
void og_sb_text_escaped(og_sb_t *sb, const char *s, size_t n, bool keep_nl)
{
    const unsigned char *p = (const unsigned char *)s;
    while (n) {
        uint32_t cp;
        const char *esc;
        size_t len = og_utf8_seq(p, n, &cp);
        if (!len) {
            og_sb_printf(sb, "\\x%02x", p[0]);
            len = 1;
        } else if (!text_unsafe(cp) || (keep_nl && cp == '\n')) {
            og_sb_put(sb, (const char *)p, len);
        } else if ((esc = short_escape(cp, false)) != NULL) {
            og_sb_put(sb, esc, 2);
        } else if (cp < 0x80) {
            og_sb_printf(sb, "\\x%02x", (unsigned)cp);
        } else {
            og_sb_printf(sb, "\\u{%04x}", (unsigned)cp);
        }
        p += len, n -= len;
    }
}

void og_sb_free(og_sb_t *sb)
{
    free(sb->buf);
    og_sb_init(sb);
}
