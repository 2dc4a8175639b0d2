/* The two renderings of one record (docs/dump-format.md): JSON in dump_json.c, text in dump.c.  Named og_dump_*
 * so they do not clash with the report tool's og_render_* (tools/report.h), which read a dump back. */
#ifndef OG_DUMP_RENDER_H
#define OG_DUMP_RENDER_H

#include "record.h"
#include "strbuf.h"

void og_dump_json(const og_record_t *r, og_sb_t *sb);
void og_dump_text(const og_record_t *r, og_sb_t *sb);

#endif
