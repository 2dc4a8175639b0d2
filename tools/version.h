/* tools/version.h — the version `oomguard --version` prints: OOMGUARD_VERSION of
 * include/oomguard.h (owned by the library), the single source of truth.  The fallback
 * below only serves a compile without include/ on the path. */
#ifndef OG_TOOLS_VERSION_H
#define OG_TOOLS_VERSION_H

#if defined(__has_include)
#if __has_include(<oomguard.h>)
#include <oomguard.h>
#endif
#endif

#ifndef OOMGUARD_VERSION
#define OOMGUARD_VERSION "0.1.0"
#endif

/* The dump schema major version this reader understands. */
#define OG_SCHEMA_PREFIX "oomguard.dump/"
#define OG_SCHEMA_MAJOR  1

#endif
