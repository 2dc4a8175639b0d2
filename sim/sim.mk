# sim/sim.mk — the simulated GPU: libcuda.so.1, libcudart.so.13 (+ static
# archive) and libnvidia-ml.so.1 built from sim/*.c.  See docs/simulator.md.
#
# Provides:
#   SIM_LIBDIR   directory holding the simulated libraries ($(B)/sim); put it
#                in LD_LIBRARY_PATH to run a program on the simulated GPU
#   SIM_LIBS     every file built here (depend on it)
#   SIM_INC      -I flag for sim/simgpu.h (the test-only ground-truth API)
#   targets      all (adds SIM_LIBS), sim-selftest

SIM_LIBDIR := $(B)/sim
SIM_OBJDIR := $(B)/sim/obj
SIM_INC    := -Isim

SIM_DRIVER_OBJS  := $(addprefix $(SIM_OBJDIR)/,driver.o driver_mem.o driver_proc.o sim_config.o sim_shared.o)
SIM_NVML_OBJS    := $(addprefix $(SIM_OBJDIR)/,nvml.o sim_config.o sim_shared.o)
SIM_RUNTIME_OBJS := $(SIM_OBJDIR)/runtime.o
SIM_HEADERS      := $(wildcard sim/*.h)

SIM_LIBS := $(SIM_LIBDIR)/libcuda.so.1 $(SIM_LIBDIR)/libcuda.so \
            $(SIM_LIBDIR)/libcudart.so.13 $(SIM_LIBDIR)/libcudart.so $(SIM_LIBDIR)/libcudart_static.a \
            $(SIM_LIBDIR)/libnvidia-ml.so.1 $(SIM_LIBDIR)/libnvidia-ml.so

# Same flags as the rest of the project (sanitizers included when SANITIZE=1);
# default visibility because these libraries exist to export the CUDA ABI —
# internal helpers are marked hidden in the sources and the version scripts
# keep everything but the API out of the dynamic symbol tables.
SIM_CFLAGS = $(ALL_CFLAGS) -fPIC -fvisibility=default $(SIM_INC)
# -Bsymbolic-functions: references inside each library (the cuGetProcAddress
# table, v1 -> v2 forwarding) bind to the library's own definitions, never to
# an LD_PRELOAD shim exporting the same names.
SIM_SOFLAGS = $(ALL_CFLAGS) -shared -Wl,-Bsymbolic-functions -Wl,-z,now
SIM_SYSLIBS = -ldl -lpthread -lm

.PHONY: sim sim-selftest
all: $(SIM_LIBS)
sim: $(SIM_LIBS)  ## the simulated GPU only: libcuda.so.1, libcudart.so.13, libnvidia-ml.so.1

$(SIM_OBJDIR)/%.o: sim/%.c $(SIM_HEADERS)
	@mkdir -p $(@D)
	$(CC) $(SIM_CFLAGS) $(DEPFLAGS) -c $< -o $@

-include $(wildcard $(SIM_OBJDIR)/*.d)

$(SIM_LIBDIR)/libcuda.so.1: $(SIM_DRIVER_OBJS) sim/libcuda.map
	$(CC) $(SIM_SOFLAGS) -Wl,-soname,libcuda.so.1 -Wl,--version-script=sim/libcuda.map \
	    -o $@ $(SIM_DRIVER_OBJS) $(SIM_SYSLIBS)

$(SIM_LIBDIR)/libcudart.so.13: $(SIM_RUNTIME_OBJS) sim/libcudart.map
	$(CC) $(SIM_SOFLAGS) -Wl,-soname,libcudart.so.13 -Wl,--version-script=sim/libcudart.map \
	    -o $@ $(SIM_RUNTIME_OBJS) $(SIM_SYSLIBS)

# Same object as the shared runtime: everything but the cuda* API is static,
# so the archive can be linked into any executable without symbol clashes.
# Users link it with -ldl -lpthread.
$(SIM_LIBDIR)/libcudart_static.a: $(SIM_RUNTIME_OBJS)
	@rm -f $@
	$(AR) rcs $@ $(SIM_RUNTIME_OBJS)

$(SIM_LIBDIR)/libnvidia-ml.so.1: $(SIM_NVML_OBJS) sim/libnvidia-ml.map
	$(CC) $(SIM_SOFLAGS) -Wl,-soname,libnvidia-ml.so.1 -Wl,--version-script=sim/libnvidia-ml.map \
	    -o $@ $(SIM_NVML_OBJS) $(SIM_SYSLIBS)

$(SIM_LIBDIR)/libcuda.so: $(SIM_LIBDIR)/libcuda.so.1
	ln -sf libcuda.so.1 $@
$(SIM_LIBDIR)/libcudart.so: $(SIM_LIBDIR)/libcudart.so.13
	ln -sf libcudart.so.13 $@
$(SIM_LIBDIR)/libnvidia-ml.so: $(SIM_LIBDIR)/libnvidia-ml.so.1
	ln -sf libnvidia-ml.so.1 $@

# Self-test of the simulator itself, through the runtime, the driver and NVML
# (tests/sim_selftest/), plus a program linked with the static runtime only.
$(B)/tests/sim_selftest: tests/sim_selftest/sim_selftest.c $(SIM_HEADERS) $(SIM_LIBS)
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SIM_INC) -o $@ $< -L$(SIM_LIBDIR) -lcudart -lcuda -lnvidia-ml $(SIM_SYSLIBS)

$(B)/tests/sim_static_runtime: tests/sim_selftest/static_runtime.c sim/simgpu.h $(SIM_LIBDIR)/libcudart_static.a
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(SIM_INC) -o $@ $< $(SIM_LIBDIR)/libcudart_static.a -ldl -lpthread

# A stand-in LD_PRELOAD interposer: proves cuGetProcAddress and libcuda's
# internal calls are immune to interposition (-Bsymbolic-functions).
$(B)/tests/libsim_fake_shim.so: tests/sim_selftest/fake_shim.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -fPIC -shared -o $@ $< -ldl

SIM_SELFTEST_BINS := $(B)/tests/sim_selftest $(B)/tests/sim_static_runtime $(B)/tests/libsim_fake_shim.so

sim-selftest: $(SIM_SELFTEST_BINS) $(SIM_LIBS)  ## the simulated GPU's own self-test
	LD_LIBRARY_PATH=$(SIM_LIBDIR)$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH} $(B)/tests/sim_selftest \
	    --static-runtime $(B)/tests/sim_static_runtime --fake-shim $(abspath $(B)/tests/libsim_fake_shim.so)
