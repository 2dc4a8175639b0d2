build2/tools/render_text.o: tools/render_text.c tools/report.h \
 tools/dump.h tools/../common/roles.def tools/../common/code_settings.def \
 tools/util.h common/strbuf.h tools/symbolize.h tools/version.h \
 include/oomguard.h
tools/report.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/symbolize.h:
tools/version.h:
include/oomguard.h:
