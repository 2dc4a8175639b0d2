#ifndef OG_STRBUF_H
#define OG_STRBUF_H
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct og_sb {
    char *buf;
    size_t len, cap;
    bool failed;
} og_sb_t;

static inline void og_sb_init(og_sb_t *sb) { *sb = (og_sb_t){ 0 }; }
void og_sb_put(og_sb_t *sb, const void *s, size_t n);
void og_sb_puts(og_sb_t *sb, const char *s);
void og_sb_putc(og_sb_t *sb, int c);
void og_sb_repeat(og_sb_t *sb, const char *s, int n);
void og_sb_printf(og_sb_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void og_sb_vprintf(og_sb_t *sb, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
void og_sb_json_str(og_sb_t *sb, const char *s); /* UTF-8 kept; invalid bytes as U+FFFD */
void og_sb_text_escaped(og_sb_t *sb, const char *s, size_t n, bool keep_nl);
bool og_text_needs_escape(const char *s, bool keep_nl);
size_t og_utf8_cut(const char *s, size_t len);
size_t og_utf8_seq(const unsigned char *p, size_t n, uint32_t *cp);
void og_sb_free(og_sb_t *sb); /* and empty again, ready for reuse */
#endif
