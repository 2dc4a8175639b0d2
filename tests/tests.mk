# Tests: unit (cmocka), end-to-end under LD_PRELOAD against the simulated GPU, the
# simulator's self-test and the CLI tests.  `make test` runs them all through
# tests/run_tests.sh, which ends with "N passed, N failed".

TEST_B      := $(B)/tests
E2E_CFLAGS   = $(ALL_CFLAGS) -Isim -Itests/e2e -pthread
E2E_LDRT     = -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR)
E2E_PROGS   := $(TEST_B)/e2e_runtime $(TEST_B)/e2e_static $(TEST_B)/e2e_driver $(TEST_B)/e2e_dlopen \
               $(TEST_B)/e2e_dlopen_global \
               $(TEST_B)/e2e_entry_points $(TEST_B)/e2e_stress $(TEST_B)/e2e_fork_exec $(TEST_B)/e2e_rtld $(TEST_B)/e2e_limit $(TEST_B)/e2e_rank $(TEST_B)/e2e_live_job \
               $(TEST_B)/e2e_drv $(TEST_B)/e2e_dumps $(TEST_B)/libno_tmpfile.so $(TEST_B)/libfake_host.so
UNIT_PROGS  := $(patsubst tests/unit/%.c,$(TEST_B)/unit_%,$(wildcard tests/unit/test_*.c))
E2E_DEPS     = tests/e2e/check.h include/oomguard.h $(SIM_LIBS) | $(TEST_B)/.dir

$(TEST_B)/.dir:
	@mkdir -p $(TEST_B) && touch $@

$(TEST_B)/e2e_runtime: tests/e2e/alloc_paths.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl
$(TEST_B)/e2e_static: tests/e2e/alloc_paths.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(SIM_LIBDIR)/libcudart_static.a -ldl -lpthread
$(TEST_B)/e2e_driver: tests/e2e/driver_api.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcuda -ldl
$(TEST_B)/e2e_dlopen: tests/e2e/dlopen_driver.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ -ldl
# a library linked with -lcuda, loaded RTLD_GLOBAL by a program that does not link the driver
$(TEST_B)/libglobal_client.so: tests/e2e/global_client.c $(SIM_LIBS) | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@ $(E2E_LDRT) -lcuda
$(TEST_B)/e2e_dlopen_global: tests/e2e/dlopen_global.c $(TEST_B)/libglobal_client.so $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN' -ldl
$(TEST_B)/e2e_entry_points: tests/e2e/entry_points.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl
$(TEST_B)/e2e_stress: tests/e2e/stress.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl
$(TEST_B)/e2e_fork_exec: tests/e2e/fork_exec.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl

$(TEST_B)/e2e_rank: tests/e2e/rank.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl
$(TEST_B)/e2e_live_job: tests/e2e/live_job.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -lcuda -ldl
$(TEST_B)/e2e_dumps: tests/e2e/dumps.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl
$(TEST_B)/libno_tmpfile.so: tests/e2e/no_tmpfile.c | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@ -ldl
$(TEST_B)/libfake_host.so: tests/e2e/fake_host.c | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@
$(TEST_B)/e2e_drv: tests/e2e/drv.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -lcuda -ldl -Wl,--export-dynamic-symbol=dlopen
$(TEST_B)/e2e_limit: tests/e2e/limit.c $(E2E_DEPS)
	$(CC) $(E2E_CFLAGS) $< -o $@ $(E2E_LDRT) -lcudart -ldl

# dlsym(RTLD_NEXT/RTLD_DEFAULT) must keep answering relative to the real caller
$(TEST_B)/librtld_next_a.so: tests/e2e/rtld_next_a.c tests/e2e/rtld.h | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@ -ldl
$(TEST_B)/librtld_next_b.so: tests/e2e/rtld_next_b.c tests/e2e/rtld.h | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@
$(TEST_B)/librtld_dep.so: tests/e2e/rtld_dep.c tests/e2e/rtld.h | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@
$(TEST_B)/librtld_local.so: tests/e2e/rtld_local.c tests/e2e/rtld.h $(TEST_B)/librtld_dep.so
	$(CC) $(ALL_CFLAGS) -fPIC -shared $< -o $@ -L$(TEST_B) -Wl,--no-as-needed -lrtld_dep -Wl,--as-needed -Wl,-rpath,'$$ORIGIN' -ldl
$(TEST_B)/e2e_rtld: tests/e2e/rtld.c tests/e2e/rtld.h $(TEST_B)/librtld_next_a.so $(TEST_B)/librtld_next_b.so $(TEST_B)/librtld_local.so
	$(CC) $(E2E_CFLAGS) $< -o $@ -L$(TEST_B) -Wl,--no-as-needed -lrtld_next_a -lrtld_next_b -Wl,--as-needed -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN' -ldl

# Unit tests link the shim's objects directly.
$(TEST_B)/unit_%: tests/unit/%.c $(SHIM_OBJ) | $(TEST_B)/.dir
	$(CC) $(SHIM_CFLAGS) -Wno-unused-function $< $(SHIM_OBJ) -o $@ -lcmocka -lunwind -ldl -pthread
$(TEST_B)/unit_test_options $(TEST_B)/unit_test_options_warn: tests/unit/options_fixture.h

# The analysis units (diagnosis, remedies, their texts) are pure: their tests link only those objects, so no
# constructor runs and no exported dlsym stands between the test and libc.
ANALYSIS_OBJ   := $(patsubst %.c,$(B)/%.o,$(ANALYSIS_SRC) $(COMMON_SRC))
ANALYSIS_UNITS := $(patsubst %,$(TEST_B)/unit_test_%,facts diagnose remedies advice_edges)
$(ANALYSIS_UNITS): $(TEST_B)/unit_%: tests/unit/%.c tests/unit/analysis_fixture.h $(ANALYSIS_OBJ) | $(TEST_B)/.dir
	$(CC) $(ALL_CFLAGS) -Ianalysis -Icommon -Wno-unused-function $< $(ANALYSIS_OBJ) -o $@ -lcmocka

include tests/stacks/stacks.mk
include tests/reader/reader.mk
test-build: all $(E2E_PROGS) $(UNIT_PROGS)  ## build every test program without running it

test: test-build  ## every test suite; ends with 'N passed, N failed'
	@B=$(B) SANITIZE=$(SANITIZE) MAKE="$(MAKE)" bash tests/run_tests.sh

# The soak: 16 threads x 2 devices x SOAK_OPS (1M) operations with injected
# failures, in an ASan+UBSan build and a TSan build of their own, both with OG_DEBUG=1 (the
# ledger's invariants asserted, its books checked at the end); tests/e2e/run_soak.sh.
SOAK_OPS ?= 1000000
soak:  ## 16 threads x 2 devices x SOAK_OPS (1M) operations with injected failures, ASan and TSan (minutes)
	$(MAKE) --no-print-directory B=build-soak-asan SANITIZE=1 OG_DEBUG=1 test-build
	$(MAKE) --no-print-directory B=build-soak-tsan SANITIZE=thread OG_DEBUG=1 test-build
	@ASAN_B=build-soak-asan TSAN_B=build-soak-tsan SOAK_OPS=$(SOAK_OPS) bash tests/e2e/run_soak.sh

.PHONY: test-build test bench soak

$(TEST_B)/bench/bench: tests/bench/bench.c $(SIM_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -pthread $< -o $@ $(E2E_LDRT) -lcudart -ldl

$(TEST_B)/bench/null/libcuda.so.1: tests/bench/null_driver.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fPIC -shared -Wl,-soname,libcuda.so.1 $< -o $@
	ln -sf libcuda.so.1 $(dir $@)libcuda.so
$(TEST_B)/bench/null_bench: tests/bench/null_bench.c $(TEST_B)/bench/null/libcuda.so.1
	$(CC) $(ALL_CFLAGS) -pthread $< -o $@ -L$(TEST_B)/bench/null -lcuda

bench: all $(TEST_B)/bench/bench $(TEST_B)/bench/null_bench  ## the shim's cost per allocation and per dump (docs/benchmarks.md)
	@B=$(B) bash tests/bench/run_bench.sh

# the scenario corpus
include tests/scenarios/scenarios.mk
include tests/adapter/adapter.mk
# regression tests, `make mutate`, `make coverage`
include tests/regress/regress.mk tests/mutate/mutate.mk tests/hostile/hostile.mk
