build2/shim/fatal.o: shim/fatal.c shim/og.h \
 /usr/local/cuda/include/cuda.h include/oomguard.h shim/hooks.def \
 shim/calls.def common/options.def
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
