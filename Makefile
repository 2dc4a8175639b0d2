# oomguard — top-level build.  Each subsystem keeps its rules in its own fragment:
#   sim/sim.mk      simulated GPU (libcuda.so.1, libcudart, libnvidia-ml.so.1)
#   shim/shim.mk    liboomguard.so (the LD_PRELOAD recorder)
#   tools/tools.mk  the `oomguard` command
#   tests/tests.mk  unit + end-to-end tests, benchmarks
#   examples/examples.mk  realistic OOM scenarios, `make demo`
#
# Variables: CUDA_HOME (default /usr/local/cuda), PREFIX, DESTDIR, SANITIZE=1 (ASan+UBSan).

CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
DESTDIR   ?=
B         ?= build
CC        ?= cc

CUDA_INC  := $(CUDA_HOME)/include
# Only targets that compile need cuda.h: clean, help and deps work without it.
ifeq ($(wildcard $(CUDA_INC)/cuda.h),)
ifneq ($(filter-out clean help deps,$(or $(MAKECMDGOALS),all)),)
$(error cuda.h not found in $(CUDA_INC): install the CUDA toolkit headers or set CUDA_HOME=/path/to/cuda)
endif
endif

WARN      := -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS    ?= -O2 -g
BASE_CFLAGS := -std=gnu11 $(WARN) -fno-strict-aliasing -D_GNU_SOURCE -I$(CUDA_INC) -Iinclude
ifeq ($(SANITIZE),1)
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
B         := build-san
endif
# ThreadSanitizer (docs/testing.md: what it cannot see and how the tests handle it)
ifeq ($(SANITIZE),thread)
SAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer
B         := build-tsan
endif
ALL_CFLAGS = $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS)

DEB_DEPS  := build-essential uthash-dev libunwind-dev libcmocka-dev libcjson-dev python3 chromium clang libclang-rt-14-dev libdw-dev python3-yaml gcovr

.PHONY: all test bench demo install clean deps help
all:

include sim/sim.mk
include shim/shim.mk
include tools/tools.mk
include examples/examples.mk
include tests/tests.mk

deps:
	@if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then echo "make deps: need root or sudo"; exit 1; fi
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_DEPS)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/oomguard $(DESTDIR)$(PREFIX)/share/doc/oomguard $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(B)/oomguard $(DESTDIR)$(PREFIX)/bin/oomguard
	install -m 0755 $(B)/liboomguard.so $(DESTDIR)$(PREFIX)/lib/oomguard/liboomguard.so
	install -m 0644 include/oomguard.h $(DESTDIR)$(PREFIX)/include/oomguard.h
	install -d $(DESTDIR)$(PREFIX)/lib/oomguard/python
	install -m 0644 adapters/python/*.py $(DESTDIR)$(PREFIX)/lib/oomguard/python/
	install -m 0644 README.md LICENSE docs/*.md $(DESTDIR)$(PREFIX)/share/doc/oomguard/

clean:
	rm -rf build build-san build-tsan $(B)

help:
	@echo "oomguard: make [target] [VARIABLE=value ...]"
	@echo "targets:"
	@echo "  all            liboomguard.so, the oomguard command, the simulated GPU, examples (default)"
	@echo "  test           every test suite (ends with 'N passed, N failed')"
	@echo "  test-cli       the oomguard command's tests only"
	@echo "  bench          benchmarks (docs/benchmarks.md)"
	@echo "  demo           realistic OOM scenarios on the simulated GPU"
	@echo "  fuzz-smoke     fuzz the dump reader for FUZZ_SECONDS (default 20)"
	@echo "  install        into DESTDIR/PREFIX (default /usr/local)"
	@echo "  deps           install the Debian packages the build needs (DEB_DEPS)"
	@echo "  clean          remove build, build-san and B"
	@echo "variables:"
	@echo "  B=DIR          build directory (default build; build-san with SANITIZE=1)"
	@echo "  SANITIZE=1     AddressSanitizer + UndefinedBehaviorSanitizer build"
	@echo "  SANITIZE=thread  ThreadSanitizer build (default B=build-tsan)"
	@echo "  soak           16 threads x 2 devices x SOAK_OPS (1M) operations with injected failures,"
	@echo "                 ASan and TSan builds: the ledger equals the simulator's truth (minutes)"
	@echo "  CUDA_HOME=DIR  where include/cuda.h is (default /usr/local/cuda)"
	@echo "  CC, CFLAGS, LDFLAGS, PREFIX, DESTDIR"

$(B):
	@mkdir -p $@
