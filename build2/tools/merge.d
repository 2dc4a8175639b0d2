build2/tools/merge.o: tools/merge.c tools/merge.h tools/dump.h \
 tools/../common/roles.def tools/../common/code_settings.def tools/util.h \
 common/strbuf.h tools/report.h
tools/merge.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/report.h:
