/* tools/render_json.c — `report --format json`: the validated document,
 * pretty-printed by cJSON.  Strings are made valid UTF-8 on the way out so that
 * any JSON reader accepts the result; that happens on a copy, because the
 * validated struct og_dump points into the original tree. */
#include "report.h"
#include "symbolize.h"

#include <stdlib.h>
#include <string.h>

/* Returns a cJSON-allocated valid UTF-8 copy of s, or NULL if s is already valid. */
static char *fixed_utf8(const char *s)
{
    og_sb_t b;
    og_sb_init(&b);
    sb_utf8(&b, s);
    char *r = NULL;
    if (!b.failed && (b.len != strlen(s) || memcmp(b.buf ? b.buf : "", s, b.len))) {
        r = cJSON_malloc(b.len + 1);
        if (r)
            memcpy(r, b.buf, b.len + 1);
    }
    og_sb_free(&b);
    return r;
}

static void sanitize(cJSON *v)
{
    for (; v; v = v->next) {
        if (v->string && !(v->type & cJSON_StringIsConst)) {
            char *f = fixed_utf8(v->string);
            if (f) {
                cJSON_free(v->string);
                v->string = f;
            }
        }
        if (cJSON_IsString(v) && v->valuestring && !(v->type & cJSON_IsReference)) {
            char *f = fixed_utf8(v->valuestring);
            if (f) {
                cJSON_free(v->valuestring);
                v->valuestring = f;
            }
        }
        if (v->child)
            sanitize(v->child);
    }
}

static int needs_fix(const cJSON *v)
{
    for (; v; v = v->next) {
        if ((v->string && !utf8_valid(v->string)) ||
            (cJSON_IsString(v) && v->valuestring && !utf8_valid(v->valuestring)))
            return 1;
        if (v->child && needs_fix(v->child))
            return 1;
    }
    return 0;
}

/* Integers a double cannot hold carry their exact text (dump_read.c, keep_exact_ints): printed
 * as that text (a raw node) so that SIZE_MAX stays 18446744073709551615, not 1.8446744073709552e+19. */
static void exact_ints(cJSON *v, int raw)
{
    for (; v; v = v->next) {
        struct og_bytes n; /* canonical text only: one past 64 bits keeps cJSON's double */
        if (raw && cJSON_IsNumber(v) && v->valuestring && og_json_bytes(v, &n))
            v->type = (v->type & ~0xFF) | cJSON_Raw;
        else if (!raw && (v->type & 0xFF) == cJSON_Raw)
            v->type = (v->type & ~0xFF) | cJSON_Number;
        if (v->child)
            exact_ints(v->child, raw);
    }
}

int og_render_json(og_sb_t *out, const struct og_dump *d)
{
    cJSON *copy = NULL;
    const cJSON *doc = d->root;
    /* frames gain their names and lines (new keys only: the struct's pointers stay valid) */
    og_symbolize_json((cJSON *)doc);
    if (needs_fix(doc)) {
        copy = cJSON_Duplicate(doc, 1);
        if (!copy)
            return -1;
        sanitize(copy);
        doc = copy;
    }
    exact_ints((cJSON *)doc, 1);
    char *s = cJSON_Print(doc);
    exact_ints((cJSON *)doc, 0); /* the struct og_dump reads these nodes as numbers */
    cJSON_Delete(copy);
    if (!s)
        return -1;
    og_sb_puts(out, s);
    og_sb_putc(out, '\n');
    cJSON_free(s);
    return out->failed ? -1 : 0;
}
