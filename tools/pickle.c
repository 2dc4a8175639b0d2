/* tools/pickle.c — see pickle.h for the opcodes used. */
#include "pickle.h"
#include "dump.h"

#include <math.h>
#include <string.h>

enum {
    OP_PROTO = 0x80,
    OP_STOP = '.',
    OP_NONE = 'N',
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_BININT1 = 'K',
    OP_BININT2 = 'M',
    OP_BININT = 'J',
    OP_LONG1 = 0x8a,
    OP_BINFLOAT = 'G',
    OP_BINUNICODE = 'X',
    OP_EMPTY_DICT = '}',
    OP_EMPTY_LIST = ']',
    OP_MARK = '(',
    OP_SETITEMS = 'u',
    OP_APPENDS = 'e',
    OP_TUPLE2 = 0x86,
};

#define BATCH 1000

static void op(og_sb_t *b, int c) { og_sb_putc(b, c); }

static void le(og_sb_t *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        og_sb_putc(b, (int)((v >> (8 * i)) & 0xff));
}

void pk_begin(og_sb_t *b)
{
    op(b, OP_PROTO);
    op(b, 2);
}

void pk_end(og_sb_t *b) { op(b, OP_STOP); }
void pk_none(og_sb_t *b) { op(b, OP_NONE); }
void pk_bool(og_sb_t *b, int v) { op(b, v ? OP_NEWTRUE : OP_NEWFALSE); }

void pk_int(og_sb_t *b, int64_t v)
{
    if (v >= 0 && v <= 0xff) {
        op(b, OP_BININT1);
        le(b, (uint64_t)v, 1);
    } else if (v >= 0 && v <= 0xffff) {
        op(b, OP_BININT2);
        le(b, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        op(b, OP_BININT);
        le(b, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {
        op(b, OP_LONG1);
        op(b, 8);
        le(b, (uint64_t)v, 8);
    }
}

/* Up to 2^64-1 (a request of SIZE_MAX): LONG1 is two's complement, so 9 bytes keep the sign clear. */
void pk_uint(og_sb_t *b, uint64_t v)
{
    if (v <= INT64_MAX) {
        pk_int(b, (int64_t)v);
        return;
    }
    op(b, OP_LONG1);
    op(b, 9);
    le(b, v, 8);
    og_sb_putc(b, 0);
}

void pk_float(og_sb_t *b, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    op(b, OP_BINFLOAT);
    for (int i = 7; i >= 0; i--)
        og_sb_putc(b, (int)((bits >> (8 * i)) & 0xff));
}

void pk_str(og_sb_t *b, const char *s)
{
    og_sb_t u;
    og_sb_init(&u);
    sb_utf8(&u, s ? s : "");
    if (u.failed) {
        b->failed = 1;
        og_sb_free(&u);
        return;
    }
    op(b, OP_BINUNICODE);
    le(b, (uint64_t)u.len, 4);
    og_sb_put(b, u.buf, u.len);
    og_sb_free(&u);
}

void pk_list_open(og_sb_t *b, struct pk_seq *s)
{
    s->n = 0;
    s->dict = 0;
    op(b, OP_EMPTY_LIST);
}

void pk_dict_open(og_sb_t *b, struct pk_seq *s)
{
    s->n = 0;
    s->dict = 1;
    op(b, OP_EMPTY_DICT);
}

void pk_item(og_sb_t *b, struct pk_seq *s)
{
    if (s->n % BATCH == 0) {
        if (s->n)
            op(b, s->dict ? OP_SETITEMS : OP_APPENDS);
        op(b, OP_MARK);
    }
    s->n++;
}

void pk_close(og_sb_t *b, struct pk_seq *s)
{
    if (s->n)
        op(b, s->dict ? OP_SETITEMS : OP_APPENDS);
}

void pk_tuple2(og_sb_t *b) { op(b, OP_TUPLE2); }

void pk_key(og_sb_t *b, struct pk_seq *s, const char *key)
{
    pk_item(b, s);
    pk_str(b, key);
}

void pk_json(og_sb_t *b, const cJSON *v)
{
    struct og_bytes n;
    struct pk_seq s;
    const cJSON *c;
    if (cJSON_IsObject(v)) {
        pk_dict_open(b, &s);
        cJSON_ArrayForEach(c, v)
        {
            pk_key(b, &s, c->string ? c->string : "");
            pk_json(b, c);
        }
        pk_close(b, &s);
    } else if (cJSON_IsArray(v)) {
        pk_list_open(b, &s);
        cJSON_ArrayForEach(c, v)
        {
            pk_item(b, &s);
            pk_json(b, c);
        }
        pk_close(b, &s);
    } else if (cJSON_IsString(v)) {
        pk_str(b, v->valuestring);
    } else if (cJSON_IsNumber(v) && og_json_bytes(v, &n) && (!n.neg || n.v <= INT64_MAX)) {
        if (n.neg)
            pk_int(b, -(int64_t)n.v);
        else
            pk_uint(b, n.v); /* exactly, beyond 2^53 too */
    } else if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (isfinite(x) && x == floor(x) && fabs(x) < 9.2e18)
            pk_int(b, (int64_t)x);
        else
            pk_float(b, x);
    } else if (cJSON_IsBool(v)) {
        pk_bool(b, cJSON_IsTrue(v));
    } else {
        pk_none(b);
    }
}
