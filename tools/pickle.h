/* tools/pickle.h — a minimal pickle writer (protocol 2) for plain data.
 *
 * Only these opcodes are emitted (see CPython's Lib/pickletools.py):
 *   PROTO 0x80 n      protocol version (2)          STOP '.'        end
 *   NONE 'N'          None                          NEWTRUE 0x88 / NEWFALSE 0x89
 *   BININT1 'K' u8    0..255                        BININT2 'M' u16le  0..65535
 *   BININT 'J' s32le  other 32-bit ints             LONG1 0x8a n bytes  64-bit ints (two's complement, LE)
 *   BINFLOAT 'G' f64be                              BINUNICODE 'X' u32le len + UTF-8
 *   EMPTY_DICT '}'  EMPTY_LIST ']'  MARK '('  SETITEMS 'u'  APPENDS 'e'  TUPLE2 0x86
 * No memo, no globals, no object construction: the result unpickles into
 * dict/list/tuple/int/float/str/bool/None only. */
#ifndef OG_PICKLE_H
#define OG_PICKLE_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "util.h"

struct pk_seq {
    long n;
    int dict;
};

void pk_begin(og_sb_t *b);
void pk_end(og_sb_t *b);
void pk_none(og_sb_t *b);
void pk_bool(og_sb_t *b, int v);
void pk_int(og_sb_t *b, int64_t v);
void pk_uint(og_sb_t *b, uint64_t v);
void pk_float(og_sb_t *b, double v);
void pk_str(og_sb_t *b, const char *s); /* invalid UTF-8 becomes U+FFFD */
/* Containers: open, then pk_item() before each list element or dict key, then close.
 * Items are flushed in batches of 1000 as CPython does. */
void pk_list_open(og_sb_t *b, struct pk_seq *s);
void pk_dict_open(og_sb_t *b, struct pk_seq *s);
void pk_item(og_sb_t *b, struct pk_seq *s);
void pk_close(og_sb_t *b, struct pk_seq *s);
void pk_tuple2(og_sb_t *b); /* makes a tuple of the two values just written */
/* Any JSON value: objects become dicts, arrays lists, integral numbers ints. */
void pk_json(og_sb_t *b, const cJSON *v);
/* Shorthand for `key: value` inside a dict. */
void pk_key(og_sb_t *b, struct pk_seq *s, const char *key);

#endif
