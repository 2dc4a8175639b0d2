# liboomguard.so — the LD_PRELOAD recorder.  Hidden by default; only the interposed
# CUDA/dlsym symbols and the oomguard_* API are exported.
SHIM_SRC  := $(wildcard shim/*.c)
SHIM_OBJ  := $(patsubst shim/%.c,$(B)/shim/%.o,$(SHIM_SRC))
SHIM_LIB  := $(B)/liboomguard.so
SHIM_CFLAGS = $(ALL_CFLAGS) -fPIC -fvisibility=hidden -pthread -Ishim

all: $(SHIM_LIB)

$(B)/shim/%.o: shim/%.c shim/og.h shim/hooks.def shim/calls.def shim/roles.def include/oomguard.h
	@mkdir -p $(dir $@)
	$(CC) $(SHIM_CFLAGS) -MMD -MP -c $< -o $@

$(SHIM_LIB): $(SHIM_OBJ)
	$(CC) -shared -Wl,-soname,liboomguard.so -Wl,-z,now -Wl,-z,relro -Wl,--no-undefined \
	    $(SAN_FLAGS) $(LDFLAGS) -o $@ $^ -lunwind -ldl -pthread

-include $(SHIM_OBJ:.o=.d)
