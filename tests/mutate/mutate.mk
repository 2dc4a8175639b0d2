# `make mutate` and `make coverage`.  Neither runs in CI: both take minutes.
#
#   make mutate                 every mutant of tests/mutate/mutants.txt, one at a time, on a
#                               clean copy of the tree (build-mutate/ inside it); prints the score
#   make mutate MUTATE_ARGS=--fast            without the slowest suite (PyTorch adapter)
#   make mutate MUTATE_ARGS="--match ledger"  only some mutants
#   make coverage               the test suite on a --coverage build ($(COV_B)/), then gcovr's
#                               line and branch coverage of shim/ and tools/
MUTATE_ARGS ?=
COV_B       ?= build-coverage
GCOVR       ?= gcovr
# gcovr 5.2 (Debian 12) and later; the fuzz harness is not product code
COV_FILTER   = --root . --object-directory $(COV_B) --filter 'shim/' --filter 'analysis/' --filter 'common/' --filter 'tools/' --exclude 'tools/fuzz_dump.c' \
               --gcov-ignore-parse-errors
# the shim counts from many threads at once: atomic counters, or gcov sees negative counts
COV_FLAGS    = --coverage -fprofile-update=atomic

.PHONY: mutate coverage
mutate:  ## mutation testing: each mutant of the shim must be killed by the suite (minutes)
	nice -n 10 python3 tests/mutate/mutate.py $(MUTATE_ARGS)

# A separate build directory: the instrumented objects must never mix with the normal ones.
coverage:  ## line coverage of the shim under the test suite (gcovr)
	@command -v $(GCOVR) >/dev/null || { echo "make coverage needs gcovr (apt-get install gcovr)"; exit 1; }
	rm -rf $(COV_B)
	$(MAKE) --no-print-directory B=$(COV_B) CFLAGS="-O0 -g" SAN_FLAGS="$(COV_FLAGS)" test-build
	-$(MAKE) --no-print-directory B=$(COV_B) CFLAGS="-O0 -g" SAN_FLAGS="$(COV_FLAGS)" test
	$(GCOVR) $(COV_FILTER) --print-summary --txt $(COV_B)/coverage.txt --html-details $(COV_B)/coverage.html $(COV_B)
	$(GCOVR) $(COV_FILTER) --branches --txt $(COV_B)/coverage-branches.txt $(COV_B)
	@echo "per file: lines $(COV_B)/coverage.txt, branches $(COV_B)/coverage-branches.txt, both $(COV_B)/coverage.html"
