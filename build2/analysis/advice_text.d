build2/analysis/advice_text.o: analysis/advice_text.c \
 analysis/advice_text.h analysis/record.h common/human.h analysis/facts.h \
 common/phases.def common/purposes.def common/operations.def \
 common/unmeasured.h common/unmeasured.def common/code_settings.def \
 common/roles.def common/causes.def
analysis/advice_text.h:
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
common/causes.def:
