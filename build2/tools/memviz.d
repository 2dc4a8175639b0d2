build2/tools/memviz.o: tools/memviz.c tools/pickle.h tools/util.h \
 common/strbuf.h tools/report.h tools/dump.h tools/../common/roles.def \
 tools/../common/code_settings.def tools/symbolize.h
tools/pickle.h:
tools/util.h:
common/strbuf.h:
tools/report.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/symbolize.h:
