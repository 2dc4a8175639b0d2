build2/tools/render_stats.o: tools/render_stats.c tools/report.h \
 tools/dump.h tools/../common/roles.def tools/../common/code_settings.def \
 tools/util.h common/strbuf.h tools/stats.h tools/version.h \
 include/oomguard.h
tools/report.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/stats.h:
tools/version.h:
include/oomguard.h:
