# pkg/pkg.mk — oomguard as one relocatable directory, and that directory as a Python wheel.
#
#   bundle   $(B)/bundle: liboomguard.so, bin/oomguard, lib/ (what they link, bundled),
#            python/ (the adapters), include/ — pkg/bundle.sh; the container image copies it
#   wheel    dist/oomguard-<version>-py3-none-manylinux_2_<N>_<arch>.whl (pkg/setup.py says why
#            that tag), built offline with the python3 that has `build`, `wheel` and setuptools
#            (PKG_PYTHON; Debian: python3-build python3-wheel python3-setuptools)
#
# Both need patchelf (in DEB_DEPS).

PKG_DIR := $(B)/pkg
# the first of these interpreters that can build a wheel without the network
##= PKG_PYTHON=PY     interpreter that builds the wheel (default: the first python3 with build, wheel, setuptools)
##= WHEEL_DIST=DIR    where `make wheel` puts the wheel (default dist)
PKG_PYTHON ?= $(firstword $(foreach p,python3 /usr/bin/python3,$(if $(shell $(p) -c 'import build, wheel, setuptools' 2>/dev/null && echo y),$(p))))
WHEEL_DIST ?= dist

.PHONY: bundle wheel test-pkg

# The command again, with the C++ runtime's demangler linked in (a bundled libstdc++ would raise
# the glibc the wheel needs to the build host's).
$(PKG_DIR)/oomguard: $(TOOLS_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $(TOOLS_OBJ) $(filter-out -lstdc++,$(TOOLS_LIBS)) \
	    -static-libgcc -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic

$(PKG_DIR)/bundle.stamp: $(SHIM_LIB) $(PKG_DIR)/oomguard pkg/bundle.sh $(wildcard adapters/python/*.py) common/framework_code.def include/oomguard.h
	bash pkg/bundle.sh $(SHIM_LIB) $(PKG_DIR)/oomguard $(B)/bundle
	@touch $@

bundle: $(PKG_DIR)/bundle.stamp  ## B/bundle: library, command, adapters and what they link, relocatable (containers)

wheel: $(PKG_DIR)/bundle.stamp pkg/pyproject.toml pkg/setup.py $(wildcard pkg/oomguard/*.py)  ## dist/oomguard-*.whl for pip (docs/install.md)
	@test -n "$(PKG_PYTHON)" || { echo "make wheel: no python3 with build, wheel and setuptools (apt-get install python3-build python3-wheel)"; exit 1; }
	rm -rf $(PKG_DIR)/src && mkdir -p $(PKG_DIR)/src $(WHEEL_DIST)
	cp pkg/pyproject.toml pkg/setup.py README.md LICENSE $(PKG_DIR)/src/
	cp -r pkg/oomguard $(PKG_DIR)/src/oomguard
	cp -a $(B)/bundle/. $(PKG_DIR)/src/oomguard/
	rm -f $(WHEEL_DIST)/oomguard-*.whl
	cd $(PKG_DIR)/src && $(PKG_PYTHON) -m build --no-isolation --wheel --outdir $(abspath $(WHEEL_DIST)) . >build.log 2>&1 \
	    || { cat build.log; exit 1; }
	@ls $(WHEEL_DIST)/oomguard-*.whl

# tests/pkg: the wheel in a fresh venv, the Jupyter kernel spec, the Kubernetes layout (part of `make test`)
test-pkg: all  ## the wheel in a fresh venv, the Jupyter kernel spec, the Kubernetes layout
	@B=$(B) SANITIZE=$(SANITIZE) MAKE="$(MAKE)" bash tests/pkg/run_tests.sh
