/* Only a dependency of librtld_local.so: outside the global scope. */
#include "rtld.h"

int og_rtld_dep_only(void) { return 42; }
