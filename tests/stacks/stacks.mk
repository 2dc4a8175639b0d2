# tests/stacks: exact cached unwinding (test_unwind) and report-time symbolization (symprog
# built four ways).  Run by tests/stacks/run_tests.sh from `make test`.
STK_B := $(TEST_B)/stacks
STK_CXXFLAGS = -O2 -I$(CUDA_INC)
STK_LD = -L$(SIM_LIBDIR) -Wl,-rpath-link,$(SIM_LIBDIR) -lcudart
STK_PROGS := $(STK_B)/test_unwind $(STK_B)/symprog-g $(STK_B)/symprog-nog $(STK_B)/symprog-stripped \
             $(STK_B)/symprog-debuglink

$(STK_B)/test_unwind: tests/stacks/test_unwind.c $(SHIM_OBJ) | $(TEST_B)/.dir
	@mkdir -p $(STK_B)
	$(CC) $(SHIM_CFLAGS) $< $(SHIM_OBJ) -o $@ -lunwind -ldl -pthread
$(STK_B)/symprog-g: tests/stacks/symprog.cc $(SIM_LIBS) | $(TEST_B)/.dir
	@mkdir -p $(STK_B)
	$(CXX) $(STK_CXXFLAGS) -g $< -o $@ $(STK_LD)
$(STK_B)/symprog-nog: tests/stacks/symprog.cc $(SIM_LIBS) | $(TEST_B)/.dir
	@mkdir -p $(STK_B)
	$(CXX) $(STK_CXXFLAGS) -g0 $< -o $@ $(STK_LD)
$(STK_B)/symprog-stripped: $(STK_B)/symprog-nog
	strip --strip-all -o $@ $<
# debug information in a separate file, found through .gnu_debuglink
$(STK_B)/symprog-debuglink: $(STK_B)/symprog-g
	cp $< $@.tmp && objcopy --only-keep-debug $@.tmp $(STK_B)/symprog-debuglink.debug && \
	    strip --strip-debug $@.tmp && \
	    (cd $(STK_B) && objcopy --add-gnu-debuglink=symprog-debuglink.debug symprog-debuglink.tmp) && mv $@.tmp $@

test-build: $(STK_PROGS)
