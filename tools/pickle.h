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

void pk_begin(struct sbuf *b);
void pk_end(struct sbuf *b);
void pk_none(struct sbuf *b);
void pk_bool(struct sbuf *b, int v);
void pk_int(struct sbuf *b, int64_t v);
void pk_uint(struct sbuf *b, uint64_t v);
void pk_float(struct sbuf *b, double v);
void pk_str(struct sbuf *b, const char *s); /* invalid UTF-8 becomes U+FFFD */
/* Containers: open, then pk_item() before each list element or dict key, then close.
 * Items are flushed in batches of 1000 as CPython does. */
void pk_list_open(struct sbuf *b, struct pk_seq *s);
void pk_dict_open(struct sbuf *b, struct pk_seq *s);
void pk_item(struct sbuf *b, struct pk_seq *s);
void pk_close(struct sbuf *b, struct pk_seq *s);
void pk_tuple2(struct sbuf *b); /* makes a tuple of the two values just written */
/* Any JSON value: objects become dicts, arrays lists, integral numbers ints. */
void pk_json(struct sbuf *b, const cJSON *v);
/* Shorthand for `key: value` inside a dict. */
void pk_key(struct sbuf *b, struct pk_seq *s, const char *key);

#endif
