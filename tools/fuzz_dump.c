/* tools/fuzz_dump.c — libFuzzer harness: the dump reader and every renderer,
 * into memory.  Built by `make fuzz-dump`, run by `make fuzz-smoke`. */
#include <stddef.h>
#include <stdint.h>

#include "dump.h"
#include "report.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    og_reader_init((size_t)256 << 20);
    return 0;
}

static void render_all(const struct og_dump *d)
{
    og_sb_t b;
    struct og_render_opts color = { 1, 0 }, plain = { 0, 3 };
    og_sb_init(&b);
    og_render_text(&b, d, &color);
    og_render_text(&b, d, &plain);
    og_render_html(&b, d, &plain);
    og_render_memviz(&b, d);
    og_sb_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct og_err err;
    /* Streaming mode with a tiny top-N, so that eviction from the heap runs. */
    struct og_load_opts small = { .keep_all = 0, .keep_sites = 2, .no_history = 0 };
    struct og_dump *d = og_dump_load_mem((const char *)data, size, "fuzz.json", &small, &err);
    if (d) {
        render_all(d);
        og_dump_free(d);
    }
    /* Keep-everything mode, as `report --format json` uses it. */
    struct og_load_opts all = { .keep_all = 1, .keep_sites = 1000, .no_history = 0 };
    d = og_dump_load_mem((const char *)data, size, "fuzz.json", &all, &err);
    if (d) {
        og_sb_t b;
        og_sb_init(&b);
        og_render_json(&b, d);
        og_sb_free(&b);
        render_all(d);
        og_dump_free(d);
    }
    return 0;
}
