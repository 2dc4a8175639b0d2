build2/tools/top.o: tools/top.c tools/cli.h shim/live.h tools/util.h \
 common/strbuf.h
tools/cli.h:
shim/live.h:
tools/util.h:
common/strbuf.h:
