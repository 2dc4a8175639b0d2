# tests/adapter: the stand-in torch's libc10_cuda.so (tests/adapter/lib/c10_cuda.c).  The stand-in's
# allocator (tests/adapter/fake_torch/torch/_alloc.py) reaches the CUDA runtime through it, as
# PyTorch's caching allocator does from libc10_cuda.so, so the ledger attributes its blocks as in a
# real PyTorch process.  The runners name it in FAKE_TORCH_LIBC10 (the adapter suite, the real-torch
# suite's stand-in half, the scenario corpus and the blind scenarios).
FAKE_TORCH_LIBC10 := $(TEST_B)/adapter/libc10_cuda.so

$(FAKE_TORCH_LIBC10): tests/adapter/lib/c10_cuda.c $(SIM_LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fPIC -shared -fno-optimize-sibling-calls -Wl,-soname,libc10_cuda.so $< -o $@ \
	    -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart

test-build: $(FAKE_TORCH_LIBC10)
scenario-progs: $(FAKE_TORCH_LIBC10)
