/* Text that is true (common/strbuf.c): valid UTF-8 kept as it is in JSON and in the text twin;
 * control characters and bytes that are not UTF-8 escaped, visibly, in the twin; copies cut short
 * end on a whole character. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "og.h"
#include "strbuf.h"

static void json_is(const char *in, const char *want)
{
    og_sb_t sb = { 0 };
    og_sb_json_str(&sb, in);
    assert_false(sb.failed);
    assert_string_equal(sb.buf, want);
    og_sb_free(&sb);
}

static void text_is(const char *in, bool keep_nl, const char *want)
{
    og_sb_t sb = { 0 };
    og_sb_text_escaped(&sb, in, strlen(in), keep_nl);
    assert_string_equal(sb.buf ? sb.buf : "", want);
    assert_int_equal(og_text_needs_escape(in, keep_nl), strcmp(in, want) != 0);
    og_sb_free(&sb);
}

static void json_strings(void **state)
{
    json_is("café", "\"café\"");
    json_is("日本 \xf0\x9f\x98\x80", "\"日本 \xf0\x9f\x98\x80\""); /* 3- and 4-byte characters */
    json_is("a\"b\\c\n\t\r\x01\x1f", "\"a\\\"b\\\\c\\n\\t\\r\\u0001\\u001f\"");
    json_is("\x7f", "\"\x7f\""); /* DEL is valid JSON */
    json_is("bad\xffx", "\"bad\\ufffdx\"");
    json_is("\xc0\xaf", "\"\\ufffd\\ufffd\"");                       /* overlong '/' */
    json_is("\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\"");            /* a surrogate */
    json_is("caf\xc3", "\"caf\\ufffd\"");                            /* cut short */
    json_is("\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* past U+10FFFF */
    json_is(NULL, "\"\"");
}

static void text_strings(void **state)
{
    text_is("café 日本", false, "café 日本");
    text_is("\x1b[31mred\x1b[0m", false, "\\x1b[31mred\\x1b[0m");
    text_is("a\nb\tc\rd", false, "a\\nb\\tc\\rd");
    text_is("a\nb", true, "a\nb");
    text_is("a\"b\\c", false, "a\"b\\c"); /* quotes and backslashes are JSON's to escape, not text's */
    text_is("\xe2\x80\xae"
            "evil",
            false, "\\u{202e}evil");               /* bidi override */
    text_is("\xe2\x81\xa6x", false, "\\u{2066}x"); /* bidi isolate */
    text_is("\xc2\x85", false, "\\u{0085}");       /* C1 NEL */
    text_is("\xe2\x80\xa8", false, "\\u{2028}");   /* line separator */
    text_is("bad\xff", false, "bad\\xff");
    text_is("\x7f", false, "\\x7f");
}

/* The two formats side by side on the same tricky inputs: what each escapes and how it writes it.  One
 * walk serves both (common/strbuf.c), its policy as data: a row shows where they must agree (UTF-8 read
 * the same way, the same two-character escapes) and where they must differ. */
static void both_formats(void **state)
{
    static const struct {
        const char *in, *json, *text, *text_nl; /* json without its quotes; text_nl: newlines kept */
    } rows[] = {
        { "plain ascii", "plain ascii", "plain ascii", "plain ascii" },
        { "a\nb", "a\\nb", "a\\nb", "a\nb" },
        { "\t\r", "\\t\\r", "\\t\\r", "\\t\\r" },
        { "q\"b\\", "q\\\"b\\\\", "q\"b\\", "q\"b\\" },
        { "\x01\x1b\x1f", "\\u0001\\u001b\\u001f", "\\x01\\x1b\\x1f", "\\x01\\x1b\\x1f" },
        { "\x7f", "\x7f", "\\x7f", "\\x7f" },                 /* DEL: JSON's, not text's */
        { "\xc2\x85", "\xc2\x85", "\\u{0085}", "\\u{0085}" }, /* C1 NEL */
        { "\xc2\xa0", "\xc2\xa0", "\xc2\xa0", "\xc2\xa0" },   /* no-break space: safe */
        { "\xe2\x80\x8e\xe2\x80\x8f", "\xe2\x80\x8e\xe2\x80\x8f", "\\u{200e}\\u{200f}", "\\u{200e}\\u{200f}" },
        { "\xe2\x80\xa9", "\xe2\x80\xa9", "\\u{2029}", "\\u{2029}" },       /* paragraph separator */
        { "\xe2\x81\xa9", "\xe2\x81\xa9", "\\u{2069}", "\\u{2069}" },       /* last bidi isolate */
        { "\xe2\x81\xaa", "\xe2\x81\xaa", "\xe2\x81\xaa", "\xe2\x81\xaa" }, /* just past them */
        { "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80" },
        { "x\xff", "x\\ufffd", "x\\xff", "x\\xff" },                                       /* not UTF-8 */
        { "\xc0\xaf", "\\ufffd\\ufffd", "\\xc0\\xaf", "\\xc0\\xaf" },                      /* overlong */
        { "\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd", "\\xed\\xa0\\x80", "\\xed\\xa0\\x80" }, /* surrogate */
        { "\xe6\x97", "\\ufffd\\ufffd", "\\xe6\\x97", "\\xe6\\x97" },                      /* cut short */
        { "\x80"
          "a",
          "\\ufffda", "\\x80a", "\\x80a" }, /* a stray continuation */
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        char json[128];
        snprintf(json, sizeof json, "\"%s\"", rows[i].json);
        json_is(rows[i].in, json);
        text_is(rows[i].in, false, rows[i].text);
        text_is(rows[i].in, true, rows[i].text_nl);
    }
}

static void cut(void **state)
{
    assert_int_equal(og_utf8_cut("abc", 3), 3);
    assert_int_equal(og_utf8_cut("caf\xc3", 4), 3);
    assert_int_equal(og_utf8_cut("caf\xc3\xa9", 5), 5);
    assert_int_equal(og_utf8_cut("\xe6\x97", 2), 0);
    assert_int_equal(og_utf8_cut("x\xf0\x9f\x98", 4), 1);
    assert_int_equal(og_utf8_cut("x\xf0\x9f\x98\x80", 5), 5);
    /* a command line cut short ends on a whole character */
    char out[8];
    const char raw[] = "ééééé";
    og_cmdline_join(raw, sizeof raw, out, sizeof out);
    assert_string_equal(out, "ééé");
    og_redact_text("日本日本", out, sizeof out);
    assert_string_equal(out, "日本");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_strings),
        cmocka_unit_test(text_strings),
        cmocka_unit_test(both_formats),
        cmocka_unit_test(cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
