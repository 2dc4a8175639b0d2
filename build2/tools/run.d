build2/tools/run.o: tools/run.c tools/../common/options.def tools/cli.h \
 tools/util.h common/strbuf.h
tools/../common/options.def:
tools/cli.h:
tools/util.h:
common/strbuf.h:
