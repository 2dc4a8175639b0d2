build2/tools/symbolize.o: tools/symbolize.c tools/symbolize.h \
 tools/dump.h tools/../common/roles.def tools/../common/code_settings.def
tools/symbolize.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
