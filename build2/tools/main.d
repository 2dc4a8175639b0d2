build2/tools/main.o: tools/main.c tools/cli.h tools/dump.h \
 tools/../common/roles.def tools/../common/code_settings.def \
 tools/merge.h tools/util.h common/strbuf.h tools/report.h \
 tools/version.h include/oomguard.h
tools/cli.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/merge.h:
tools/util.h:
common/strbuf.h:
tools/report.h:
tools/version.h:
include/oomguard.h:
