build2/shim/nvml.o: shim/nvml.c shim/og.h /usr/local/cuda/include/cuda.h \
 include/oomguard.h shim/hooks.def shim/calls.def common/options.def \
 analysis/record.h common/human.h analysis/facts.h common/phases.def \
 common/purposes.def common/operations.def common/unmeasured.h \
 common/unmeasured.def common/code_settings.def common/roles.def
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
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
