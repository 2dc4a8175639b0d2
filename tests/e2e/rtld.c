/* dlsym(RTLD_NEXT) and dlsym(RTLD_DEFAULT) keep answering relative to their real caller. */
#include "check.h"
#include "rtld.h"

int main(int argc, char **argv)
{
    CHECK(og_rtld_next_value() == 2, "RTLD_NEXT from libA must find libB's definition, got %d", og_rtld_next_value());
    void *h = dlopen("librtld_local.so", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen librtld_local.so: %s", dlerror());
    if (h) {
        int (*lookup)(void) = (int (*)(void))dlsym(h, "og_rtld_local_lookup");
        CHECK(lookup && lookup() == 42, "RTLD_DEFAULT from a local library must see its dependency");
    }
    /* the shim's own lookups still work */
    CHECK(dlsym(RTLD_DEFAULT, "og_rtld_probe") != NULL, "RTLD_DEFAULT for a global symbol");
    CHECK(dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere") == NULL, "unknown symbol must be NULL");
    printf("%s: %d checks, %d failed\n", argv[0], check_count, check_failures);
    return check_failures ? 1 : 0;
}
