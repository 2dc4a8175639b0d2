/* Two libraries defining the same symbol; A asks for the *next* definition, the idiom of
 * interposers everywhere.  Under a shim that answered RTLD_NEXT relative to itself, A
 * would get its own function back (and recurse forever in real life). */
#include <dlfcn.h>

#include "rtld.h"

int og_rtld_probe(void) { return 1; }
int og_rtld_next_value(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "og_rtld_probe");
    return next ? next() : -1;
}
