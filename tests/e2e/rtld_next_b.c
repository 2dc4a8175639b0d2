#include "rtld.h"

int og_rtld_probe(void) { return 2; }
