/* Loaded RTLD_LOCAL; its dependency is visible to RTLD_DEFAULT lookups made from here only
 * if dlsym sees the real caller (glibc searches the caller's local scope too). */
#include <dlfcn.h>

#include "rtld.h"

int og_rtld_local_lookup(void)
{
    int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "og_rtld_dep_only");
    return f ? f() : -1;
}
