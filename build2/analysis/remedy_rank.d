build2/analysis/remedy_rank.o: analysis/remedy_rank.c analysis/remedies.h \
 analysis/record.h common/human.h analysis/facts.h common/phases.def \
 common/purposes.def common/operations.def common/unmeasured.h \
 common/unmeasured.def common/code_settings.def common/roles.def \
 analysis/advice_text.h common/causes.def analysis/remedies.def
analysis/remedies.h:
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
common/causes.def:
analysis/remedies.def:
