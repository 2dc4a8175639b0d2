"""The wheel's version and platform tag (the rest is pyproject.toml).

Version: OOMGUARD_VERSION of include/oomguard.h, staged in the package.

Tag: py3-none-manylinux_2_<N>_<arch>.  The package holds native code (a library that is
preloaded into any program and a command), not a CPython extension: any Python 3 can run it,
so the Python and ABI tags are py3/none.  The platform tag follows the manylinux rule (PEP 600),
checked here as auditwheel would: every ELF object in the package needs only the C library's own
libraries (everything else is bundled by pkg/bundle.sh, under names of its own), and <N> is the
newest GLIBC_2.<N> symbol version that any of them asks for (readelf's version needs).  A host
with that glibc or newer installs it; the shim needs no CUDA toolkit, only the NVIDIA driver that
the program itself loads.
"""
import os
import platform
import re
import subprocess

from setuptools import Distribution, setup

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:                     # newer setuptools carry it themselves
    from setuptools.command.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "oomguard")
HOST_LIBS = re.compile(r"^(ld-linux[^ ]*|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|"
                       r"libresolv\.so\.2|libutil\.so\.1)$")


def version():
    with open(os.path.join(PKG, "include", "oomguard.h")) as f:
        return re.search(r'#define\s+OOMGUARD_VERSION\s+"([^"]+)"', f.read()).group(1)


def elf_objects():
    for d, _, files in os.walk(PKG):
        for name in sorted(files):
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def readelf(*args):
    return subprocess.run(["readelf", "-W"] + list(args), check=True, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout


def glibc_floor():
    """(2, N): the newest glibc symbol version the package's objects need; checks what they link."""
    bundled = set(os.listdir(os.path.join(PKG, "lib")))
    floor = (2, 17)
    for path in elf_objects():
        for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf("-d", path)):
            if not HOST_LIBS.match(needed) and needed not in bundled:
                raise SystemExit("%s needs %s, which is neither the C library's nor bundled" % (path, needed))
        needs = readelf("-V", path).partition("Version needs section")[2]
        for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", needs):
            floor = max(floor, (int(major), int(minor)))
    return floor


class NativeDistribution(Distribution):
    """Native code inside: the files go to platlib (the wheel's root is not 'pure')."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    def get_tag(self):
        major, minor = glibc_floor()
        return "py3", "none", "manylinux_%d_%d_%s" % (major, minor, platform.machine())


setup(version=version(), distclass=NativeDistribution, cmdclass={"bdist_wheel": BdistWheel})
