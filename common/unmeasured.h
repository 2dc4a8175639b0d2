/* What a dump could not measure, as an id (memory.unmeasured_ids): the list is common/unmeasured.def.
 * Shared by the record, the ledger (which reports what it dropped) and the dump. */
#ifndef OG_UNMEASURED_H
#define OG_UNMEASURED_H

enum og_unmeasured {
#define X(name, id, what) OG_UM_##name,
#include "unmeasured.def"
#undef X
    OG_UM_COUNT
};

#endif
