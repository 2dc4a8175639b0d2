# liboomguard.so — the LD_PRELOAD recorder.  Hidden by default; only the interposed
# CUDA/dlsym symbols and the oomguard_* API are exported.
# Three layers go into it: common/ (what the library and the command share), analysis/ (pure: a record
# in, a diagnosis and remedies out; built without the shim's headers, so it cannot reach a CUDA
# header or a global of the recorder) and shim/ (doors, books, capture, dump files).
COMMON_SRC   := $(wildcard common/*.c)
ANALYSIS_SRC := $(wildcard analysis/*.c)
SHIM_SRC     := $(wildcard shim/*.c) $(ANALYSIS_SRC) $(COMMON_SRC)
SHIM_OBJ     := $(patsubst %.c,$(B)/%.o,$(SHIM_SRC))
SHIM_LIB     := $(B)/liboomguard.so
LAYER_CFLAGS  = $(ALL_CFLAGS) -fPIC -fvisibility=hidden -pthread
SHIM_CFLAGS   = $(LAYER_CFLAGS) -Ishim -Ianalysis -Icommon

all: $(SHIM_LIB)

$(B)/shim/%.o: shim/%.c shim/og.h shim/hooks.def shim/calls.def common/roles.def include/oomguard.h
	@mkdir -p $(dir $@)
	$(CC) $(SHIM_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(B)/analysis/%.o: analysis/%.c
	@mkdir -p $(dir $@)
	$(CC) $(LAYER_CFLAGS) -Ianalysis -Icommon $(DEPFLAGS) -c $< -o $@

$(B)/common/%.o: common/%.c
	@mkdir -p $(dir $@)
	$(CC) $(LAYER_CFLAGS) -Icommon $(DEPFLAGS) -c $< -o $@

$(SHIM_LIB): $(SHIM_OBJ)
	$(CC) -shared -Wl,-soname,liboomguard.so -Wl,-z,now -Wl,-z,relro -Wl,--no-undefined \
	    $(SAN_FLAGS) $(LDFLAGS) -o $@ $^ -lunwind -ldl -pthread

-include $(SHIM_OBJ:.o=.d)
