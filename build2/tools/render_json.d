build2/tools/render_json.o: tools/render_json.c tools/report.h \
 tools/dump.h tools/../common/roles.def tools/../common/code_settings.def \
 tools/util.h common/strbuf.h tools/symbolize.h
tools/report.h:
tools/dump.h:
tools/../common/roles.def:
tools/../common/code_settings.def:
tools/util.h:
common/strbuf.h:
tools/symbolize.h:
