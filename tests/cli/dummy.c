/* tests/cli/dummy.c — an empty shared library: something harmless to put in
 * LD_PRELOAD when testing `oomguard run` without the real liboomguard.so. */
int og_test_dummy_symbol;
