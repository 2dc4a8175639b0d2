/* Switches and counters that only the tests touch (tests/stacks), apart from og.h so that no
 * code of the library's own sets them by mistake.  Defined in stacks.c. */
#ifndef OG_TEST_H
#define OG_TEST_H

#include "og.h"

#pragma GCC visibility push(hidden)
extern OG_TLS bool og_stack_cache_enabled;  /* false: this thread's captures are full unwinds */
extern int og_stack_record_cost;            /* captures between two chain recordings (tests: 0) */
extern OG_TLS uint64_t og_stack_chain_hits; /* captures the chain cache served */
#pragma GCC visibility pop

#endif
