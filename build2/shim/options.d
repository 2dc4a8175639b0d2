build2/shim/options.o: shim/options.c shim/og.h \
 /usr/local/cuda/include/cuda.h include/oomguard.h shim/hooks.def \
 shim/calls.def common/options.def common/human.h
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
common/human.h:
