build2/common/strbuf.o: common/strbuf.c common/strbuf.h
common/strbuf.h:
