build2/tools/dump_read.o: tools/dump_read.c tools/dump.h \
 tools/../common/roles.def tools/../common/code_settings.def tools/util.h \
 common/strbuf.h tools/version.h include/oomguard.h
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/version.h:
include/oomguard.h:
