build2/tools/util.o: tools/util.c tools/util.h common/strbuf.h \
 common/human.h
tools/util.h:
common/strbuf.h:
common/human.h:
