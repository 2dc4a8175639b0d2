/* Only a dependency of librtld_local.so: outside the global scope. */
int og_rtld_dep_only(void) { return 42; }
