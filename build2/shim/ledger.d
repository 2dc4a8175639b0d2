build2/shim/ledger.o: shim/ledger.c shim/ledger_int.h shim/og.h \
 /usr/local/cuda/include/cuda.h include/oomguard.h shim/hooks.def \
 shim/calls.def common/options.def common/unmeasured.h \
 common/unmeasured.def
shim/ledger_int.h:
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
common/unmeasured.h:
common/unmeasured.def:
