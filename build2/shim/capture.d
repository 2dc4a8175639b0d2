build2/shim/capture.o: shim/capture.c shim/og.h \
 /usr/local/cuda/include/cuda.h include/oomguard.h shim/hooks.def \
 shim/calls.def common/options.def analysis/record.h common/human.h \
 analysis/facts.h common/phases.def common/purposes.def \
 common/operations.def common/unmeasured.h common/unmeasured.def \
 common/code_settings.def common/roles.def analysis/advice_text.h \
 analysis/record.h common/causes.def
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
analysis/advice_text.h:
analysis/record.h:
common/causes.def:
