build2/tools/stats.o: tools/stats.c tools/cli.h tools/dump.h \
 tools/../common/roles.def tools/../common/code_settings.def \
 tools/report.h tools/util.h common/strbuf.h tools/stats.h \
 tools/version.h include/oomguard.h
tools/cli.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/report.h:
tools/util.h:
common/strbuf.h:
tools/stats.h:
tools/version.h:
include/oomguard.h:
