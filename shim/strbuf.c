/* A growable string for rendering dumps, with JSON string escaping.  Allocation failures
 * are sticky (sb->failed) so renderers need not check every append. */
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

void og_sb_put(og_sb_t *sb, const char *s, size_t n)
{
    if (!grow(sb, n))
        return;
    memcpy(sb->buf + sb->len, s, n);
    sb->len += n;
    sb->buf[sb->len] = 0;
}

void og_sb_puts(og_sb_t *sb, const char *s) { og_sb_put(sb, s, strlen(s)); }

void og_sb_printf(og_sb_t *sb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        og_sb_put(sb, small, (size_t)n);
        return;
    }
    if (!grow(sb, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(sb->buf + sb->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb->len += (size_t)n;
}

/* JSON string with quotes; control characters and invalid bytes escaped so any input
 * (library paths, command lines, process names) yields valid JSON. */
void og_sb_json_str(og_sb_t *sb, const char *s)
{
    og_sb_put(sb, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        unsigned char ch = *p;
        switch (ch) {
        case '"': og_sb_put(sb, "\\\"", 2); break;
        case '\\': og_sb_put(sb, "\\\\", 2); break;
        case '\n': og_sb_put(sb, "\\n", 2); break;
        case '\r': og_sb_put(sb, "\\r", 2); break;
        case '\t': og_sb_put(sb, "\\t", 2); break;
        default:
            if (ch < 0x20 || ch >= 0x80)   /* keep output ASCII: bytes >= 0x80 may not be UTF-8 */
                og_sb_printf(sb, "\\u%04x", ch);
            else
                og_sb_put(sb, (const char *)p, 1);
        }
    }
    og_sb_put(sb, "\"", 1);
}

void og_sb_free(og_sb_t *sb)
{
    free(sb->buf);
    sb->buf = NULL;
    sb->len = sb->cap = 0;
}
