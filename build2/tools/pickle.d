build2/tools/pickle.o: tools/pickle.c tools/pickle.h tools/util.h \
 common/strbuf.h tools/dump.h tools/../common/roles.def \
 tools/../common/code_settings.def
tools/pickle.h:
tools/util.h:
common/strbuf.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
