/* tools/util.c — output buffer, untrusted-string rendering, sizes, writing it out. */
#include <getopt.h>
#include "util.h"
#include "human.h" /* common/human.c: the dump's own formatting */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Decodes one UTF-8 sequence at s.  Returns its length (>= 1) and stores the
 * code point, or -1 in *cp for an invalid or overlong sequence (length 1 then,
 * so that the caller resynchronises on the next byte). */
static size_t utf8_next(const unsigned char *s, int32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = (int32_t)c;
        return 1;
    }
    size_t n;
    int32_t v, min;
    if ((c & 0xe0) == 0xc0) {
        n = 2, v = c & 0x1f, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        n = 3, v = c & 0x0f, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
        n = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = -1;
        return 1;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) { /* also stops at the terminating NUL */
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) {
        *cp = -1;
        return 1;
    }
    *cp = v;
    return n;
}

/* Characters that must never reach a terminal or a page as-is: C0/C1 controls,
 * DEL, and the bidi overrides that can make text read differently than it is. */
static int is_unsafe(int32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069) || cp == 0x2028 || cp == 0x2029;
}

static const char REPLACEMENT[] = "\xef\xbf\xbd"; /* U+FFFD */
static const char ELLIPSIS[] = "\xe2\x80\xa6";    /* U+2026 */

enum { MODE_TEXT, MODE_HTML, MODE_RAW };

static void sb_safe(og_sb_t *b, const char *s, size_t max_chars, unsigned flags, int mode)
{
    if (!s)
        return;
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;
    while (*p) {
        if (chars == max_chars) {
            og_sb_puts(b, ELLIPSIS);
            return;
        }
        int32_t cp;
        size_t n = utf8_next(p, &cp);
        chars++;
        if (cp < 0 && mode == MODE_RAW) {
            og_sb_puts(b, REPLACEMENT);
        } else if (cp < 0) {
            og_sb_printf(b, "\\x%02x", *p); /* shown for what it is: a byte that is not UTF-8 */
        } else if (mode == MODE_RAW) {
            og_sb_put(b, p, n);
        } else if (cp == '\n' && (flags & OG_TEXT_KEEP_NL)) {
            og_sb_putc(b, '\n');
        } else if (cp == '\n' || cp == '\t' || cp == '\r') {
            og_sb_putc(b, ' ');
        } else if (is_unsafe(cp)) {
            if (cp < 0x80)
                og_sb_printf(b, "\\x%02x", (unsigned)cp); /* ESC is \x1b: visible, inert */
            else
                og_sb_printf(b, "\\u{%04x}", (unsigned)cp);
        } else if (mode == MODE_HTML && cp == '&') {
            og_sb_puts(b, "&amp;");
        } else if (mode == MODE_HTML && cp == '<') {
            og_sb_puts(b, "&lt;");
        } else if (mode == MODE_HTML && cp == '>') {
            og_sb_puts(b, "&gt;");
        } else if (mode == MODE_HTML && cp == '"') {
            og_sb_puts(b, "&quot;");
        } else if (mode == MODE_HTML && cp == '\'') {
            og_sb_puts(b, "&#39;");
        } else {
            og_sb_put(b, p, n);
        }
        p += n;
    }
}

void sb_text(og_sb_t *b, const char *s, size_t max_chars, unsigned flags)
{
    sb_safe(b, s, max_chars, flags, MODE_TEXT);
}

void sb_html(og_sb_t *b, const char *s, size_t max_chars, unsigned flags)
{
    sb_safe(b, s, max_chars, flags, MODE_HTML);
}

void sb_utf8(og_sb_t *b, const char *s) { sb_safe(b, s, SIZE_MAX, 0, MODE_RAW); }

int utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        int32_t cp;
        p += utf8_next(p, &cp);
        if (cp < 0)
            return 0;
    }
    return 1;
}

size_t text_width(const char *s, size_t max_chars)
{
    if (!s)
        return 0;
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;
    while (*p) {
        if (chars == max_chars)
            return chars + 1; /* the ellipsis */
        int32_t cp;
        p += utf8_next(p, &cp);
        chars++;
    }
    return chars;
}

const char *human_bytes(int64_t bytes, char out[32])
{
    if (bytes < 0) {
        snprintf(out, 32, "?");
        return out;
    }
    return human_bytes_u64((uint64_t)bytes, out);
}

/* The whole uint64 range: a request can be SIZE_MAX ("16.00 EiB"). */
const char *human_bytes_u64(uint64_t bytes, char out[32])
{
    return og_bytes_fmt(out, 32, (double)bytes, OG_BYTES_FIXED);
}

const char *group_digits_u64(uint64_t v, char out[32])
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v), k = 0;
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = tmp[i];
    }
    out[k] = '\0';
    return out;
}

const char *group_digits(int64_t v, char out[32])
{
    char tmp[32];
    int neg = v < 0;
    uint64_t u = neg ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, u);
    char *o = out;
    if (neg)
        *o++ = '-';
    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            *o++ = ',';
        *o++ = tmp[i];
    }
    *o = '\0';
    return out;
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("oomguard: out of memory\n", stderr);
        exit(OG_EXIT_INPUT);
    }
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p) {
        fputs("oomguard: out of memory\n", stderr);
        exit(OG_EXIT_INPUT);
    }
    return p;
}

char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

int write_all(int fd, const og_sb_t *b, const char *what)
{
    size_t off = 0;
    while (off < b->len) {
        ssize_t n = write(fd, b->buf + off, b->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "oomguard: %s: %s\n", what, n < 0 ? strerror(errno) : "short write");
            return OG_EXIT_OUTPUT;
        }
        off += (size_t)n;
    }
    return OG_EXIT_OK;
}

int og_getopt(const char *cmd, int argc, char **argv, const char *shortopts, const struct option *lo, const char **arg,
              int *optind_out)
{
    static const char *started;
    char so[64];
    int plus = shortopts[0] == '+';
    snprintf(so, sizeof so, "%s:%s", plus ? "+" : "", shortopts + plus);
    if (started != cmd) { /* a new command line: getopt's state starts over */
        started = cmd;
        optind = 0;
    }
    opterr = 0;
    int c = getopt_long(argc + 1, argv - 1, so, lo, NULL);
    *arg = optarg;
    *optind_out = optind - 1;
    if (c == '?' || c == ':') {
        char shortname[3] = { '-', (char)optopt, 0 };
        const char *name =
            optopt && !(optind >= 2 && !strncmp(argv[optind - 2], "--", 2)) ? shortname : argv[optind - 2];
        if (c == '?')
            fprintf(stderr, "oomguard %s: unknown option %s (see oomguard %s --help)\n", cmd, name, cmd);
        else
            fprintf(stderr, "oomguard %s: %s needs a value\n", cmd, name);
        return '?';
    }
    return c;
}

const struct option og_output_options[] = {
    { "format", required_argument, NULL, 'f' },
    { "output", required_argument, NULL, 'o' },
    { "top", required_argument, NULL, OG_OPT_TOP },
    { "color", required_argument, NULL, OG_OPT_COLOR },
    { "no-color", no_argument, NULL, OG_OPT_NO_COLOR },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
};

int og_output_option(const char *cmd, int opt, const char *val, int *top, int *color_when)
{
    switch (opt) {
    case OG_OPT_TOP: {
        char *end;
        long v = strtol(val, &end, 10);
        if (!*val || *end || v < 1 || v > 100000) {
            fprintf(stderr, "oomguard %s: --top %s: expected a number from 1 to 100000\n", cmd, val);
            return -1;
        }
        *top = (int)v;
        return 1;
    }
    case OG_OPT_COLOR:
        if (!strcmp(val, "auto"))
            *color_when = 0;
        else if (!strcmp(val, "always"))
            *color_when = 1;
        else if (!strcmp(val, "never"))
            *color_when = -1;
        else {
            fprintf(stderr, "oomguard %s: --color %s: use auto, always or never\n", cmd, val);
            return -1;
        }
        return 1;
    case OG_OPT_NO_COLOR:
        *color_when = -1;
        return 1;
    default:
        return 0;
    }
}
