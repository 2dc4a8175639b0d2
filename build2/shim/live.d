build2/shim/live.o: shim/live.c shim/og.h /usr/local/cuda/include/cuda.h \
 include/oomguard.h shim/hooks.def shim/calls.def common/options.def \
 shim/live.h analysis/record.h common/human.h analysis/facts.h \
 common/phases.def common/purposes.def common/operations.def \
 common/unmeasured.h common/unmeasured.def common/code_settings.def \
 common/roles.def
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
shim/live.h:
analysis/record.h:
common/human.h:
analysis/facts.h:
common/phases.def:
common/purposes.def:
common/operations.def:
common/unmeasured.h:
common/unmeasured.def:
common/code_settings.def:
common/roles.def:
