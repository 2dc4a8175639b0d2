#!/usr/bin/env bash
# pkg/bundle.sh LIB CMD OUT — lays out oomguard as one relocatable directory that needs nothing
# on the host but the C library (and, to do anything useful, the NVIDIA driver):
#
#   OUT/liboomguard.so      the library to preload (run path $ORIGIN/lib)
#   OUT/bin/oomguard        the command (run path $ORIGIN/../lib; finds ../liboomguard.so)
#   OUT/lib/                the libraries both link that are not the C library's own
#                           (libunwind, liblzma for the library; cJSON, libdw, libelf, zlib,
#                           libstdc++ ... for the command), renamed lib<x>-oomguard.so.N
#   OUT/python/             the Python adapters: the library puts this directory on PYTHONPATH
#                           in a Python process (shim/init.c), as `oomguard run` does
#   OUT/include/oomguard.h  the API for frameworks (and the version)
#
# LIB and CMD are the built library and command (pkg/pkg.mk links the command with the C++
# runtime's demangler inside, so that it needs no libstdc++ newer than the host's).
#
# The Python wheel (`make wheel`) is this directory as the package `oomguard`; the container
# recipe (examples/kubernetes) copies it whole into the pod.  The bundled libraries get a name of
# their own so that a program that loads its own libunwind or liblzma keeps getting its own
# (a preloaded library's dependencies would otherwise stand in for them, by soname).
# Needs patchelf and ldd.
set -eu
LIB=${1:?usage: pkg/bundle.sh LIB CMD OUT}
CMD=${2:?usage: pkg/bundle.sh LIB CMD OUT}
OUT=${3:?usage: pkg/bundle.sh LIB CMD OUT}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
command -v patchelf >/dev/null || { echo "pkg/bundle.sh: patchelf is needed (apt-get install patchelf)" >&2; exit 1; }

# The C library's own objects are the host's: every Linux has them, and they must match its kernel.
host_lib() {
    case "$1" in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
    esac
    return 1
}
# libunwind.so.8 -> libunwind-oomguard.so.8
renamed() { local stem=${1%%.so*}; echo "$stem-oomguard.so${1#"$stem".so}"; }

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/python" "$OUT/include"
cp "$LIB" "$OUT/liboomguard.so"
cp "$CMD" "$OUT/bin/oomguard"
cp "$ROOT"/adapters/python/*.py "$ROOT/common/framework_code.def" "$OUT/python/"   # the adapters read the table
cp "$ROOT/include/oomguard.h" "$OUT/include/"
chmod 0644 "$OUT"/python/*.py "$OUT/python/framework_code.def" "$OUT/include/oomguard.h"
# debug info off (a fifth of the size; symbols stay): before patchelf, strip would undo its layout
strip --strip-debug "$OUT/liboomguard.so" "$OUT/bin/oomguard"

objs=("$OUT/liboomguard.so" "$OUT/bin/oomguard")
# every library either object loads (ldd: the whole closure), copied once under its new name
for src in "$LIB" "$CMD"; do
    while read -r name path; do
        host_lib "$name" && continue
        [ -n "$path" ] && [ -e "$path" ] || { echo "pkg/bundle.sh: $src: $name not found" >&2; exit 1; }
        new=$(renamed "$name")
        [ -e "$OUT/lib/$new" ] && continue
        cp -L "$path" "$OUT/lib/$new"
        chmod 0755 "$OUT/lib/$new"
        patchelf --set-soname "$new" "$OUT/lib/$new"
        objs+=("$OUT/lib/$new")
    done < <(env -u LD_LIBRARY_PATH -u LD_PRELOAD ldd "$src" | awk '$2 == "=>" {print $1, $3; next} NF == 2 && $1 !~ /^\// {print $1, ""}')
done
# each object asks for the new names and finds them through its own run path
for o in "${objs[@]}"; do
    for n in $(patchelf --print-needed "$o"); do      # one change per call: patchelf 0.14 mixes several up
        host_lib "$n" || patchelf --replace-needed "$n" "$(renamed "$n")" "$o"
    done
    case "$o" in
    */lib/*) rp='$ORIGIN' ;;
    */bin/*) rp='$ORIGIN/../lib' ;;
    *) rp='$ORIGIN/lib' ;;
    esac
    patchelf --set-rpath "$rp" "$o"
done
# nothing left to the host but the C library
bad=$(for o in "${objs[@]}"; do env -u LD_LIBRARY_PATH -u LD_PRELOAD ldd "$o"; done | awk '$2 == "=>" && $3 !~ /^\// {print}' || true)
[ -z "$bad" ] || { echo "pkg/bundle.sh: unresolved: $bad" >&2; exit 1; }
