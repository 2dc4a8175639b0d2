# oomguard — top-level build.  Each subsystem keeps its rules in its own fragment:
#   sim/sim.mk      simulated GPU (libcuda.so.1, libcudart, libnvidia-ml.so.1)
#   shim/shim.mk    liboomguard.so (the LD_PRELOAD recorder)
#   tools/tools.mk  the `oomguard` command
#   tests/tests.mk  unit + end-to-end tests, benchmarks
#   examples/examples.mk  realistic OOM scenarios, `make demo`
#   pkg/pkg.mk      `make bundle` (one relocatable directory) and `make wheel` (pip)
#
##= B=DIR             build directory (default build; build-san with SANITIZE=1, build-tsan with SANITIZE=thread)
##= SANITIZE=1        AddressSanitizer + UndefinedBehaviorSanitizer build
##= SANITIZE=thread   ThreadSanitizer build
##= OG_DEBUG=1        the ledger's invariants asserted and its books checked by the soak (make soak sets it)
##= CUDA_HOME=DIR     where include/cuda.h is (default /usr/local/cuda)
##= SOAK_OPS=N        operations per thread and device of `make soak` (default 1000000)
##= FUZZ_SECONDS=N    how long `make fuzz-smoke` fuzzes (default 20)
##= CC, CFLAGS, LDFLAGS, PREFIX, DESTDIR   as usual

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
# OG_DEBUG=1: the ledger's invariants asserted (shim/ledger_int.h) and its consistency check
# exported for the soak's program (make soak builds with it)
ifeq ($(OG_DEBUG),1)
BASE_CFLAGS += -DOG_DEBUG
endif
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
# Dependency files name each object both as $(B) was spelled and as an absolute path: a build
# directory made once with B=/abs/build and once with B=build would otherwise lose its header
# dependencies and link objects compiled against older headers.
DEPFLAGS   = -MMD -MP $(foreach t,$(sort $@ $(abspath $@)),-MT $(t))

DEB_DEPS  := build-essential uthash-dev libunwind-dev libcmocka-dev libcjson-dev python3 chromium clang libclang-rt-14-dev libdw-dev python3-yaml gcovr \
             patchelf python3-build python3-wheel python3-setuptools python3-venv python3-torch \
             clang-format tmux

.PHONY: all test bench demo install clean deps help format format-check
all:  ## liboomguard.so, the oomguard command, the simulated GPU, the examples (default)

include sim/sim.mk
include shim/shim.mk
include tools/tools.mk
include examples/examples.mk
include pkg/pkg.mk
include tests/tests.mk

deps:  ## install the Debian packages the build and the tests need (DEB_DEPS)
	@if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then echo "make deps: need root or sudo"; exit 1; fi
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_DEPS)

install: all  ## install into DESTDIR/PREFIX (default /usr/local)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/oomguard $(DESTDIR)$(PREFIX)/share/doc/oomguard $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(B)/oomguard $(DESTDIR)$(PREFIX)/bin/oomguard
	install -m 0755 $(B)/liboomguard.so $(DESTDIR)$(PREFIX)/lib/oomguard/liboomguard.so
	install -m 0644 include/oomguard.h $(DESTDIR)$(PREFIX)/include/oomguard.h
	install -d $(DESTDIR)$(PREFIX)/lib/oomguard/python
	install -m 0644 adapters/python/*.py common/framework_code.def $(DESTDIR)$(PREFIX)/lib/oomguard/python/
	install -m 0644 README.md LICENSE docs/*.md $(DESTDIR)$(PREFIX)/share/doc/oomguard/
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions
	install -m 0644 docs/man/oomguard.1 $(DESTDIR)$(PREFIX)/share/man/man1/oomguard.1
	install -m 0644 tools/completion/oomguard.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/oomguard

FORMAT_SRC = $(shell git ls-files '*.c' '*.h' 2>/dev/null)
format:  ## apply .clang-format to every C source in git
	clang-format -i --style=file $(FORMAT_SRC)
format-check:  ## fail if a C source differs from .clang-format's layout
	clang-format --dry-run --Werror --style=file $(FORMAT_SRC)

clean:  ## remove build, build-san, build-tsan, B and dist (the wheels)
	rm -rf build build-san build-tsan $(B) dist

help:  ## this list, generated from the comments on the makefiles' target lines
	@echo "oomguard: make [target] [VARIABLE=value ...]"
	@echo "targets:"
	@awk -F':.*## ' '/^[a-zA-Z][a-zA-Z0-9_-]*:.*## / { printf "  %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo "variables:"
	@sed -n 's/^##= \{0,1\}/  /p' $(MAKEFILE_LIST)

$(B):
	@mkdir -p $@
