# tests/reader: byte counts past 2^53 read exactly by every `oomguard` reader, and CUDA arrays
# leaving the ledger with their context.  Run by tests/reader/run_tests.sh from `make test`.
$(TEST_B)/reader_bignum: tests/reader/bignum.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -lcuda -ldl

test-build: $(TEST_B)/reader_bignum
