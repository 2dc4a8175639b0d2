build2/shim/init.o: shim/init.c shim/og.h /usr/local/cuda/include/cuda.h \
 include/oomguard.h shim/hooks.def shim/calls.def common/options.def \
 shim/symfill.h
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
shim/symfill.h:
