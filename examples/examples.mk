# Examples: realistic out-of-memory failures on the simulated GPU (and on a real one:
# build them against NVIDIA's runtime with CUDA_HOME and run without the SIMGPU_* variables).
EX_B       := $(B)/examples
EX_CFLAGS   = $(ALL_CFLAGS) -Iexamples
EX_LD       = -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart -ldl
EX_NAMES   := too_big fragmentation other_processes non_framework growth cache_held recovered
EX_PROGS   := $(addprefix $(EX_B)/,$(EX_NAMES))
EX_LIBS    := $(EX_B)/libminitorch.so $(EX_B)/libworkspace.so $(EX_B)/libcomm.so

$(EX_B)/libminitorch.so: examples/minitorch/minitorch.c examples/minitorch/minitorch.h include/oomguard.h $(SIM_LIBS)
	@mkdir -p $(EX_B)
	$(CC) $(EX_CFLAGS) -fPIC -shared $< -o $@ $(EX_LD)
$(EX_B)/libworkspace.so: examples/workspace.c examples/common.h $(SIM_LIBS)
	@mkdir -p $(EX_B)
	$(CC) $(EX_CFLAGS) -fPIC -shared $< -o $@ $(EX_LD)
$(EX_B)/libcomm.so: examples/comm.c examples/common.h $(SIM_LIBS)
	@mkdir -p $(EX_B)
	$(CC) $(EX_CFLAGS) -fPIC -shared $< -o $@ $(EX_LD)
$(EX_B)/%: examples/%.c examples/common.h $(EX_LIBS)
	$(CC) $(EX_CFLAGS) $< -o $@ -L$(EX_B) -lminitorch -lworkspace -lcomm -Wl,-rpath,'$$ORIGIN' $(EX_LD)

examples: $(EX_PROGS)  ## the realistic OOM programs of examples/ (on the simulated GPU)
all: examples

# The demo: a fragmentation failure on a simulated 24 GiB GPU, then the report.
demo: all  ## run a fragmentation OOM on a simulated 24 GiB GPU and show the report
	@bash examples/run_example.sh $(B) fragmentation

.PHONY: examples demo
