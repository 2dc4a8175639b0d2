build2/tools/report_common.o: tools/report_common.c tools/report.h \
 tools/dump.h tools/../common/roles.def tools/../common/code_settings.def \
 tools/util.h common/strbuf.h tools/symbolize.h common/human.h \
 tools/../common/causes.def
tools/report.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/symbolize.h:
common/human.h:
tools/../common/causes.def:
