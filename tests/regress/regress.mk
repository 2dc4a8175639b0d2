# tests/regress: regression tests for bugs that once passed the suite.
# Included from tests/tests.mk; run by tests/run_tests.sh through tests/regress/run_regressions.sh.
REGRESS_PROGS := $(TEST_B)/regress

$(TEST_B)/regress: tests/regress/regress.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -lcuda -ldl

test-build: $(REGRESS_PROGS)
