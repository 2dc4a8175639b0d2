# tests/adapter: the stand-in torch's libc10_cuda.so (tests/adapter/lib/c10_cuda.c).  The stand-in's
# allocator (tests/adapter/fake_torch/torch/_alloc.py) reaches the CUDA runtime through it, as
# PyTorch's caching allocator does from libc10_cuda.so, so the ledger attributes its blocks as in a
# real PyTorch process.  The runners name it in FAKE_TORCH_LIBC10 (the adapter suite, the real-torch
# suite's stand-in half, the scenario corpus and the blind scenarios).
FAKE_TORCH_LIBC10 := $(TEST_B)/adapter/libc10_cuda.so

#
# The stand-in JAX, CuPy and TensorFlow allocate through the same forwarders built under their real
# counterparts' names and places (a jaxlib, cupy or tensorflow directory, as in site-packages), named
# in FAKE_JAX_XLA_EXTENSION, FAKE_CUPY_MEMORY and FAKE_TF_FRAMEWORK by the same runners.
FAKE_JAX_XLA_EXTENSION := $(TEST_B)/adapter/jaxlib/xla_extension.so
FAKE_CUPY_MEMORY       := $(TEST_B)/adapter/cupy/cuda/memory.so
FAKE_TF_FRAMEWORK      := $(TEST_B)/adapter/tensorflow/libtensorflow_framework.so.2
FAKE_FW_LIBS := $(FAKE_TORCH_LIBC10) $(FAKE_JAX_XLA_EXTENSION) $(FAKE_CUPY_MEMORY) $(FAKE_TF_FRAMEWORK)

# fwd_lib SONAME PREFIX [EXTRA]: the forwarders of tests/adapter/lib/c10_cuda.c as that library; EXTRA
# "-DFWD_DRIVER -lcuda" for XLA's and TensorFlow's, which allocate with the driver API as the real ones do
fwd_lib = @mkdir -p $(dir $@) && \
	$(CC) $(ALL_CFLAGS) -fPIC -shared -fno-optimize-sibling-calls -DFWD_PREFIX=$(2) -Wl,-soname,$(1) $< -o $@ \
	    -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart $(3)

$(FAKE_TORCH_LIBC10): tests/adapter/lib/c10_cuda.c $(SIM_LIBS)
	$(call fwd_lib,libc10_cuda.so,c10_)
$(FAKE_JAX_XLA_EXTENSION): tests/adapter/lib/c10_cuda.c $(SIM_LIBS)
	$(call fwd_lib,xla_extension.so,xla_,-DFWD_DRIVER -lcuda)
$(FAKE_CUPY_MEMORY): tests/adapter/lib/c10_cuda.c $(SIM_LIBS)
	$(call fwd_lib,memory.so,cupy_)
$(FAKE_TF_FRAMEWORK): tests/adapter/lib/c10_cuda.c $(SIM_LIBS)
	$(call fwd_lib,libtensorflow_framework.so.2,tf_,-DFWD_DRIVER -lcuda)

test-build: $(FAKE_FW_LIBS)
scenario-progs: $(FAKE_FW_LIBS)
