# The scenario corpus: realistic out-of-memory failures, each a user's program in
# tests/scenarios/progs/ with an expert's expectations in tests/scenarios/cases/NAME.json, run by
# tests/scenarios/run_scenarios.py.  The stand-in libraries carry the real libraries' names so the
# shim attributes them as it would in production.
SC_B       := $(B)/tests/scenarios
SC_LIBDIR  := $(SC_B)/lib
SC_CFLAGS   = $(ALL_CFLAGS) -Isim -Itests/scenarios/kit -pthread
SC_KITDEPS  = tests/scenarios/kit/kit.h tests/scenarios/kit/ranks.h tests/scenarios/kit/driver.h tests/scenarios/kit/truth.h include/oomguard.h $(SIM_LIBS)
SC_LIBS    := $(SC_LIBDIR)/libc10_cuda.so $(SC_LIBDIR)/libcudnn.so.9 $(SC_LIBDIR)/libnccl.so.2 \
              $(SC_LIBDIR)/xla_extension.so $(SC_LIBDIR)/libtensorflow_framework.so.2 \
              $(SC_LIBDIR)/libdali.so $(SC_LIBDIR)/cupy/cuda/memory.so
SC_PROGS   := $(patsubst tests/scenarios/progs/%.c,$(SC_B)/%,$(wildcard tests/scenarios/progs/*.c))
SC_RT       = -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart -ldl
SC_DRV      = -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcuda -ldl

$(SC_LIBDIR)/libc10_cuda.so: tests/scenarios/kit/c10.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,libc10_cuda.so $< -o $@ $(SC_RT) -lcuda
$(SC_LIBDIR)/libcudnn.so.9: tests/scenarios/kit/cudnn.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,libcudnn.so.9 $< -o $@ $(SC_RT)
$(SC_LIBDIR)/libnccl.so.2: tests/scenarios/kit/nccl.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,libnccl.so.2 $< -o $@ $(SC_RT)
$(SC_LIBDIR)/xla_extension.so: tests/scenarios/kit/xla.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,xla_extension.so $< -o $@ $(SC_DRV)
$(SC_LIBDIR)/libtensorflow_framework.so.2: tests/scenarios/kit/tf.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,libtensorflow_framework.so.2 $< -o $@ $(SC_DRV)

$(SC_LIBDIR)/libdali.so: tests/scenarios/kit/dali.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,libdali.so $< -o $@ $(SC_RT)

$(SC_LIBDIR)/cupy/cuda/memory.so: tests/scenarios/kit/cupy_pool.c $(SC_KITDEPS)
	@mkdir -p $(dir $@)
	$(CC) $(SC_CFLAGS) -fPIC -shared -Wl,-soname,memory.so $< -o $@ $(SC_RT)

# every program may use any stand-in; --as-needed keeps only those it calls
$(SC_B)/%: tests/scenarios/progs/%.c $(SC_LIBS)
	$(CC) $(SC_CFLAGS) $< -o $@ -Wl,--as-needed $(SC_LIBS) -Wl,-rpath,'$$ORIGIN/lib:$$ORIGIN/lib/cupy/cuda' $(SC_RT) -lcuda

scenario-progs: $(SC_PROGS)  ## build the scenario corpus's programs
test-build: $(SC_PROGS)

# just the corpus: make B=... test-scenarios
test-scenarios: all $(SC_PROGS)  ## the scenario corpus only
	@B=$(B) SANITIZE=$(SANITIZE) python3 tests/scenarios/run_scenarios.py

# the blind scenarios (tests/scenarios/blind/): a measurement of the rules, not part of `make test`
test-blind: all $(SC_PROGS)  ## score the diagnosis on the blind scenarios (dev and validation sets; not in make test)
	@B=$(B) python3 tests/scenarios/run_blind.py --attainable

.PHONY: scenario-progs test-scenarios test-blind
