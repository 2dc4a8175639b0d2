# tests/hostile: the shim in a hostile process (host malloc failing inside it, thousands of threads).
# Included from tests/tests.mk; run by tests/run_tests.sh through tests/hostile/run_hostile.sh.
HOSTILE_PROGS := $(TEST_B)/hostile/failmalloc.so $(TEST_B)/hostile/hostile_malloc $(TEST_B)/hostile/thread_rss

$(TEST_B)/hostile/failmalloc.so: tests/hostile/failmalloc.c | $(TEST_B)/.dir
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -fPIC -shared $< -o $@ -ldl
$(TEST_B)/hostile/hostile_malloc: tests/hostile/hostile_malloc.c $(E2E_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl

$(TEST_B)/hostile/thread_rss: tests/hostile/thread_rss.c $(E2E_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart

test-build: $(HOSTILE_PROGS)
