# tools/tools.mk — the `oomguard` command (tools/*.c), its tests and fuzzer.
#
#   $(B)/oomguard      the command, linked with cJSON
#   test-cli           build and run tests/cli (ends with "N passed, N failed")
#   fuzz-dump          $(B)/fuzz-dump: libFuzzer harness over the dump reader and renderers
#   fuzz-smoke         run fuzz-dump for FUZZ_SECONDS (default 20) over tests/fixtures

TOOLS_SRC  := $(filter-out tools/fuzz_dump.c,$(wildcard tools/*.c))
TOOLS_HDR  := $(wildcard tools/*.h) $(wildcard include/oomguard.h) shim/live.h
# common/ is what the command shares with the library: common/human.c formats sizes and names frameworks
# (the report spells them as the dump does); the options, causes and roles lists.
TOOLS_SHARED := common/human.c common/strbuf.c
TOOLS_OBJ  := $(patsubst tools/%.c,$(B)/tools/%.o,$(TOOLS_SRC)) $(patsubst %.c,$(B)/%.o,$(TOOLS_SHARED))
TOOLS_LIBS := -lcjson -lm -ldw -lelf -lstdc++ -ldl
FUZZ_CC    ?= clang
FUZZ_SECONDS ?= 20

.PHONY: test-cli fuzz-dump fuzz-smoke
all: $(B)/oomguard

$(B)/tools/%.o: tools/%.c $(TOOLS_HDR) common/human.h common/strbuf.h | $(B)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itools -iquote common -iquote shim $(DEPFLAGS) -c $< -o $@

$(B)/oomguard: $(TOOLS_OBJ)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(TOOLS_OBJ) $(TOOLS_LIBS)

-include $(TOOLS_OBJ:.o=.d)

# Test helpers: max-RSS/time runner and a do-nothing library for LD_PRELOAD checks.
# Built without sanitizers: an ASan-instrumented library cannot be preloaded into sh.
$(B)/cli-test/og-measure: tests/cli/measure.c | $(B)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -o $@ $<

$(B)/cli-test/libdummy.so: tests/cli/dummy.c | $(B)
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -shared -fPIC -o $@ $<

# The fuzzer links the same reader/renderer sources as the command (not main.c/run.c).
FUZZ_SRC := tools/fuzz_dump.c $(filter-out tools/main.c tools/run.c tools/top.c,$(TOOLS_SRC)) $(TOOLS_SHARED)
$(B)/fuzz-dump: $(FUZZ_SRC) $(TOOLS_HDR) common/human.h | $(B)
	$(FUZZ_CC) $(BASE_CFLAGS) -Itools -iquote common -iquote shim -g -O1 -fno-omit-frame-pointer \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -o $@ $(FUZZ_SRC) $(TOOLS_LIBS)

fuzz-dump: $(B)/fuzz-dump  ## the libFuzzer harness of the dump reader (clang)

# New inputs go to a private corpus directory (runs may overlap); crashes are
# saved as $(B)/fuzz-crash-*.
fuzz-smoke: $(B)/fuzz-dump  ## fuzz the dump reader for FUZZ_SECONDS (default 20)
	@corpus=$$(mktemp -d "$${TMPDIR:-/tmp}/oomguard-fuzz.XXXXXX") && \
	$(B)/fuzz-dump -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 \
	    -artifact_prefix=$(B)/fuzz- -print_final_stats=1 "$$corpus" tests/fixtures; \
	rc=$$?; rm -rf "$$corpus"; exit $$rc

test-cli: $(B)/oomguard $(B)/cli-test/og-measure $(B)/cli-test/libdummy.so  ## the oomguard command's tests only
	@B=$(B) SANITIZE=$(SANITIZE) FUZZ_CC=$(FUZZ_CC) FUZZ_SECONDS=$(FUZZ_SECONDS) \
	    MAKE="$(MAKE)" bash tests/cli/run_tests.sh

include tests/stats/stats.mk
