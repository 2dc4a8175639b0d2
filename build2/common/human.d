build2/common/human.o: common/human.c common/human.h \
 common/framework_code.def
common/human.h:
common/framework_code.def:
