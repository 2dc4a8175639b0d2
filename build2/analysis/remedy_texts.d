build2/analysis/remedy_texts.o: analysis/remedy_texts.c analysis/record.h \
 common/human.h analysis/facts.h common/phases.def common/purposes.def \
 common/operations.def common/unmeasured.h common/unmeasured.def \
 common/code_settings.def common/roles.def analysis/advice_text.h \
 common/causes.def analysis/remedies.h analysis/remedies.def
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
analysis/remedies.h:
analysis/remedies.def:
