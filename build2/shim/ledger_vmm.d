build2/shim/ledger_vmm.o: shim/ledger_vmm.c shim/ledger_int.h shim/og.h \
 /usr/local/cuda/include/cuda.h include/oomguard.h shim/hooks.def \
 shim/calls.def common/options.def
shim/ledger_int.h:
shim/og.h:
/usr/local/cuda/include/cuda.h:
include/oomguard.h:
shim/hooks.def:
shim/calls.def:
common/options.def:
