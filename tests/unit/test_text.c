/* Text that is true (common/strbuf.c): valid UTF-8 kept as it is in JSON and in the text twin;
 * control characters and bytes that are not UTF-8 escaped, visibly, in the twin; copies cut short
 * end on a whole character. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
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
        cmocka_unit_test(cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
