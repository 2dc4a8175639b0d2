#!/usr/bin/env python3
"""check_wheel.py WHEEL ADAPTERS_DIR: what the wheel holds and what it needs from the host.

  * its name's tag is py3-none-manylinux_2_<N>_x86_64, and <N> is the newest GLIBC_2.<N> that
    any shipped ELF object asks for (readelf's version needs), as auditwheel would compute it;
  * every shipped ELF object needs only the C library's own libraries or ones shipped beside it
    (found through its run path), none of the CUDA toolkit's (libcudart, libcuda, NVML: the
    library finds the driver the program loads), and is stripped of debug info;
  * the library, the command (executable), the adapters (the same files as ADAPTERS_DIR), the
    header and the console script `oomguard` are there.
Prints one line per check; exit 1 on the first failure."""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

HOST = re.compile(r"^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1)$")
CUDA = re.compile(r"^lib(cuda|cudart|nvidia-ml|nvrtc|cublas)")


def readelf(*args):
    return subprocess.run(["readelf", "-W"] + list(args), check=True, stdout=subprocess.PIPE,
                          universal_newlines=True).stdout


def main():
    whl, adapters = sys.argv[1], sys.argv[2]
    m = re.match(r"^oomguard-([^-]+)-py3-none-manylinux_(\d+)_(\d+)_x86_64\.whl$", os.path.basename(whl))
    assert m, "wheel name %s: not py3-none-manylinux_X_Y_x86_64" % whl
    z = zipfile.ZipFile(whl)
    names = set(z.namelist())
    for need in ("oomguard/__init__.py", "oomguard/__main__.py", "oomguard/kernelspec.py", "oomguard/liboomguard.so",
                 "oomguard/bin/oomguard", "oomguard/include/oomguard.h"):
        assert need in names, "%s not in the wheel" % need
    mode = z.getinfo("oomguard/bin/oomguard").external_attr >> 16
    assert mode & 0o111, "bin/oomguard is not executable in the wheel (mode %o)" % mode
    shipped = sorted(f for f in os.listdir(adapters) if f.endswith(".py"))
    for f in shipped:
        assert z.read("oomguard/python/" + f) == open(os.path.join(adapters, f), "rb").read(), \
            "oomguard/python/%s differs from %s" % (f, adapters)
    # the one table of the frameworks' packages the adapters read (common/framework_code.def) goes with them
    table = os.path.join(adapters, os.pardir, os.pardir, "common", "framework_code.def")
    assert z.read("oomguard/python/framework_code.def") == open(table, "rb").read(), "framework_code.def differs"
    extra = sorted(n[len("oomguard/python/"):] for n in names if n.startswith("oomguard/python/"))
    assert extra == sorted(shipped + ["framework_code.def"]), (extra, shipped)
    ep = z.read("oomguard-%s.dist-info/entry_points.txt" % m.group(1)).decode()
    assert re.search(r"^oomguard = oomguard\.__main__:main$", ep, re.M), ep
    print("ok    contents: library, executable command, %d adapters, header, console script" % len(shipped))

    floor, objects = (2, 17), 0
    with tempfile.TemporaryDirectory() as tmp:
        z.extractall(tmp)
        bundled = set(os.listdir(os.path.join(tmp, "oomguard", "lib")))
        for n in sorted(names):
            path = os.path.join(tmp, n)
            with open(path, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            objects += 1
            dyn = readelf("-d", path)
            for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn):
                assert not CUDA.match(needed), "%s needs %s (the CUDA toolkit)" % (n, needed)
                assert HOST.match(needed) or needed in bundled, "%s needs %s: neither glibc's nor shipped" % (n, needed)
            assert re.search(r"\((RUNPATH|RPATH)\)\s+Library r\w*path: \[\$ORIGIN", dyn) or \
                not re.search(r"\(NEEDED\)\s+Shared library: \[lib\w+-oomguard", dyn), "%s: no $ORIGIN run path" % n
            assert ".debug_info" not in readelf("-S", path), "%s carries debug info" % n
            needs = readelf("-V", path).partition("Version needs section")[2]
            for major, minor in re.findall(r"Name: GLIBC_(\d+)\.(\d+)", needs):
                floor = max(floor, (int(major), int(minor)))
    tag = (int(m.group(2)), int(m.group(3)))
    assert tag == floor, "tag says glibc %d.%d, the objects need %d.%d" % (tag + floor)
    print("ok    %d ELF objects need glibc %d.%d and only glibc's libraries or shipped ones; no CUDA toolkit; "
          "tag manylinux_%d_%d_x86_64" % ((objects,) + floor + floor))
    print("ok    size %d bytes (%d files)" % (os.path.getsize(whl), len(names)))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print("FAIL  %s" % e)
        sys.exit(1)
