#!/usr/bin/env bash
# tests/stacks: cached unwinding is exact, and reports name frames from the recorded
# library path + build-id + offset (demangled, file:line with -g, .symtab without,
# library+offset when stripped or when the binary is gone).  Ends with "N passed, N failed".
set -u
B=${B:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PRELOAD=${PRELOAD:-$ROOT/$B/liboomguard.so}
OG="$ROOT/$B/oomguard"
S="$ROOT/$B/tests/stacks"
export LD_LIBRARY_PATH="$ROOT/$B/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SIMGPU_DEVICES=1 SIMGPU_MEM=8GiB
T=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-stacks.XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0 fail=0

ok() { pass=$((pass + 1)); echo "PASS  $1"; }
no() { fail=$((fail + 1)); echo "FAIL  $1"; shift; for l in "$@"; do echo "      | $l"; done; }
# has FILE TEXT DESC / lacks FILE TEXT DESC
has() { if grep -qF -- "$2" "$1"; then ok "$3"; else no "$3" "'$2' not in $1:" "$(sed -n '/Stack of the failed/,/^$/p' "$1" | head -12)"; fi; }
lacks() { if ! grep -qF -- "$2" "$1"; then ok "$3"; else no "$3" "'$2' unexpectedly in $1"; fi; }

# 1. unwinding: cached chains give the frames of a full unwind
out=$("$S/test_unwind" 2>&1)
echo "$out" | grep -E '^(PASS|FAIL)'
line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | grep -oE '^[0-9]+'))); fail=$((fail + $(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')))
else
    no "test_unwind ran" "$out"
fi

# run PROG DIR [VAR=VALUE...]: the failing program under the shim; its dump's JSON path on stdout.
# Names resolved in the process are off here (OOMGUARD_SYMBOLIZE_MS=0): these cases test what
# `oomguard report` finds by itself; the in-process names have their own cases below.
run() {
    mkdir -p "$2"
    env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$2" OOMGUARD_QUIET=1 OOMGUARD_SYMBOLIZE_MS=0 "${@:3}" "$1" >/dev/null 2>&1
    ls "$2"/*.json 2>/dev/null | head -n 1
}
# report DUMP NAME: text and HTML reports, both must succeed
report() {
    local rc=0
    "$OG" report "$1" >"$T/$2.txt" 2>"$T/$2.err" || rc=$?
    "$OG" report --format html "$1" -o "$T/$2.html" 2>>"$T/$2.err" || rc=$?
    if [ $rc = 0 ]; then ok "$2: text and HTML reports render"; else no "$2: reports render (exit $rc)" "$(cat "$T/$2.err")"; fi
}
src_line() { grep -n "$1" tests/stacks/symprog.cc | cut -d: -f1; }
L_MALLOC=$(src_line SYMPROG_LINE_MALLOC)
L_GRAB=$(src_line SYMPROG_LINE_GRAB)

# 2. built with -g: demangled names, file:line, the inlined function, the caller marked
d=$(run "$S/symprog-g" "$T/g")
[ -n "$d" ] && ok "-g: dump written" || no "-g: dump written"
report "$d" g
has "$T/g.txt" "og_test::Pool<float>::grab(unsigned long)  symprog.cc:$L_GRAB" "-g text: namespaced template demangled, with file:line"
has "$T/g.txt" "=> at inline_step (inlined into static_helper)  symprog.cc:$L_MALLOC" "-g text: inlined static function, its line, marked as the caller"
has "$T/g.html" "og_test::Pool&lt;float&gt;::grab(unsigned long)</span> <span class=\"src\"" "-g HTML: demangled name"
has "$T/g.html" ">symprog.cc:$L_MALLOC</span>" "-g HTML: file:line"
has "$T/g.html" "<span class=\"tag\">caller</span>" "-g HTML: the caller marked"
# the recorded build-id is the file's
want=$(readelf -n "$S/symprog-g" | sed -n 's/.*Build ID: *//p' | head -n 1)
python3 - "$d" "$S/symprog-g" "$want" <<'PY' && ok "-g dump: frames carry the file's path and build-id ($want)" || no "-g dump: path and build-id recorded"
import json, os, sys
d = json.load(open(sys.argv[1]))
fr = [f for f in d["event"]["stack"] if f.get("library") == "symprog-g"]
assert fr and all(f["path"] == os.path.realpath(sys.argv[2]) and f["build_id"] == sys.argv[3] for f in fr), fr
for k in ("ip", "symbol", "library", "offset"):
    assert all(k in f for f in d["event"]["stack"]), k
PY

# the C program's memory_viz export: PyTorch's _memory_viz functions accept it, the page's
# replay stays within the device (77: no _memory_viz module here)
"$OG" report "$d" --format memory-viz -o "$T/g.pickle" 2>"$T/g.err"
python3 tests/cli/check_memviz.py --total "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["device"]["total_bytes"])' "$d")" "$T/g.pickle" >"$T/g.mv" 2>&1
case $? in
0 | 77) ok "C program: memory_viz export accepted by _memory_viz, replayed within the device" ;;
*) no "C program: memory_viz export" "$(cat "$T/g.mv" "$T/g.err")" ;;
esac

# 3. without -g: names from .symtab (a static function has no other), no lines
d=$(run "$S/symprog-nog" "$T/nog")
report "$d" nog
has "$T/nog.txt" "=> at static_helper(unsigned long)  symprog-nog" "no -g: static function named from .symtab"
has "$T/nog.txt" "at og_test::Pool<float>::grab(unsigned long)  symprog-nog" "no -g: template demangled from .symtab"
lacks "$T/nog.txt" "symprog.cc:" "no -g: no file:line claimed"

# 4. stripped: library+offset, still renders
d=$(run "$S/symprog-stripped" "$T/stripped")
report "$d" stripped
has "$T/stripped.txt" "=> at symprog-stripped+0x" "stripped: library+offset, the caller marked"
lacks "$T/stripped.txt" "static_helper" "stripped: no invented names"
has "$T/stripped.txt" "at cudaMalloc  runtime.c:" "stripped: other libraries still symbolized"

# 5. debug information in a separate file (.gnu_debuglink)
d=$(run "$S/symprog-debuglink" "$T/debuglink")
report "$d" debuglink
has "$T/debuglink.txt" "og_test::Pool<float>::grab(unsigned long)  symprog.cc:$L_GRAB" "separate debug file: names and lines"

# 6. the dump moved to a machine without the binary
mkdir -p "$T/bin" && cp "$S/symprog-g" "$T/bin/prog"
d=$(run "$T/bin/prog" "$T/moved")
"$OG" report --format json "$d" >"$T/moved-symbolized.json" 2>/dev/null
rm -rf "$T/bin"
report "$d" moved
has "$T/moved.txt" "=> at prog+0x" "binary gone: library+offset"
has "$T/moved.txt" "at cudaMalloc" "binary gone: the dump's own symbol names stay"
lacks "$T/moved.txt" "symprog.cc" "binary gone: nothing made up"
#    ... with its debug file under a build-id tree (OOMGUARD_DEBUG_DIR, like /usr/lib/debug)
id=$(readelf -n "$S/symprog-g" | sed -n 's/.*Build ID: *//p' | head -n 1)
mkdir -p "$T/dbg/.build-id/${id:0:2}" && cp "$S/symprog-debuglink.debug" "$T/dbg/.build-id/${id:0:2}/${id:2}.debug"
OOMGUARD_DEBUG_DIR="$T/dbg" "$OG" report "$d" >"$T/moved-dbg.txt" 2>&1
has "$T/moved-dbg.txt" "og_test::Pool<float>::grab(unsigned long)  symprog.cc:$L_GRAB" "binary gone, debug file by build-id: names and lines"
#    ... symbolized before it moved (report --format json adds function/file/line/inlined)
report "$T/moved-symbolized.json" moved-symbolized
has "$T/moved-symbolized.txt" "=> at inline_step (inlined into static_helper)  symprog.cc:$L_MALLOC" "symbolized JSON: names travel with the dump"

#    ... named in the process that wrote it (the default): the binary deleted before the report,
#    the dump and its .txt twin still name the function, the inlined one and their lines
mkdir -p "$T/bin" && cp "$S/symprog-g" "$T/bin/prog"
d=$(run "$T/bin/prog" "$T/inproc" OOMGUARD_SYMBOLIZE_MS=3000)
rm -rf "$T/bin"
report "$d" inproc
has "$T/inproc.txt" "og_test::Pool<float>::grab(unsigned long)  symprog.cc:$L_GRAB" "binary gone, named in the process: function and file:line"
has "$T/inproc.txt" "=> at inline_step (inlined into static_helper)  symprog.cc:$L_MALLOC" "binary gone, named in the process: inlined function, the caller"
has "${d%.json}.txt" "og_test::Pool<float>::grab(unsigned long)  symprog.cc:$L_GRAB in prog+0x" "named in the process: the .txt twin too"
python3 - "$d" "$L_GRAB" <<'PY' && ok "named in the process: JSON frames carry function, file, line, inlined" || no "named in the process: JSON frames"
import json, sys
d = json.load(open(sys.argv[1]))
fr = {f["function"]: f for f in d["event"]["stack"] if "function" in f}
g = fr["og_test::Pool<float>::grab(unsigned long)"]
assert g["file"].endswith("symprog.cc") and g["line"] == int(sys.argv[2]) and g["inlined"] is False, g
assert fr["inline_step"]["inlined"] is True and fr["inline_step"]["inlined_into"] == "static_helper", fr
assert all("function" in f for s in d["top_sites"] for f in s["frames"] if f["library"] == "prog"), d["top_sites"]
PY
#    ... and off: OOMGUARD_SYMBOLIZE_MS=0 leaves the dump as the shim wrote it
mkdir -p "$T/bin" && cp "$S/symprog-g" "$T/bin/prog"
d=$(run "$T/bin/prog" "$T/inproc-off")
lacks "$d" '"function"' "OOMGUARD_SYMBOLIZE_MS=0: no names in the dump"
rm -rf "$T/bin"

#    ... exit while the helper still works (OG_TEST_SYMFILL_STALL holds it in a phase): the program
#    ends soon after the helper's bound with its own status, never waits for the stall, and the
#    dump on disk is whole: as first written when the helper was resolving (it is stopped before
#    it writes), named when it was writing (a write under way is finished); no hidden file left
exit_case() { # exit_case NAME STALL: prints the JSON path, the exit status and the wall time (ms)
    local dir="$T/$1" t0 t1 rc=0
    mkdir -p "$dir"
    t0=$(date +%s%N)
    env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$dir" OOMGUARD_QUIET=1 OOMGUARD_SYMBOLIZE_MS=300 \
        OG_TEST_SYMFILL_STALL="$2" "$S/symprog-g" >/dev/null 2>&1 || rc=$?
    t1=$(date +%s%N)
    echo "$(ls "$dir"/*.json 2>/dev/null | head -n 1) $rc $(((t1 - t0) / 1000000))"
}
whole() { # whole JSON WANT_NAMES DESC
    if python3 - "$1" "$2" <<'PY'; then ok "$3"; else no "$3"; fi
import glob, json, os, sys
d = json.load(open(sys.argv[1]))
named = any("function" in f for f in d["event"]["stack"])
assert named == (sys.argv[2] == "1"), ("named", named)
left = [f for f in os.listdir(os.path.dirname(sys.argv[1])) if f.startswith(".")]
assert not left, left
PY
}
for phase in resolve write; do
    read -r d rc ms <<<"$(exit_case "exit-$phase" "$phase:20000")"
    if [ "$rc" = 0 ] && [ "$ms" -lt 6000 ]; then ok "exit meets the helper ${phase}ing: status 0, ended in $ms ms (bound 300 ms, stall 20 s)"
    else no "exit meets the helper ${phase}ing: status $rc, $ms ms"; fi
    whole "$d" "$([ $phase = write ] && echo 1 || echo 0)" "exit meets the helper ${phase}ing: the dump on disk is whole$([ $phase = write ] && echo ', named' || echo ', as first written')"
done

# 7. a different binary at the recorded path (rebuilt since): its build-id differs, not used
mkdir -p "$T/bin" && cp "$S/symprog-g" "$T/bin/prog2"
d=$(run "$T/bin/prog2" "$T/rebuilt")
cp "$S/symprog-nog" "$T/bin/prog2"
report "$d" rebuilt
has "$T/rebuilt.txt" "=> at prog2+0x" "rebuilt binary: build-id mismatch, library+offset"
lacks "$T/rebuilt.txt" "static_helper" "rebuilt binary: no names from the wrong build"

# 8. a dump from before build_id/path existed still loads
python3 - "$T/g"/*.json "$T/old.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for f in d["event"]["stack"] + [f for s in d.get("top_sites", []) for f in s.get("frames", [])]:
    f.pop("path", None); f.pop("build_id", None)
json.dump(d, open(sys.argv[2], "w"))
PY
report "$T/old.json" old
has "$T/old.txt" "at cudaMalloc" "old dump: the dump's symbol names"

# 9. a PyTorch-like stack: Python lines first, interpreter glue folded, the caller is the
#    first frame outside the CUDA libraries and the framework's allocator
python3 - "$T/g"/*.json "$T/py.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
def fr(sym, lib, off):
    return {"ip": "0x7f0000%04x" % off, "symbol": sym, "library": lib, "offset": "0x%x" % off}
d["event"]["stack"] = [
    fr("cudaMalloc", "libcudart.so.12", 0x11),
    fr("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEimP11CUstream_st", "libc10_cuda.so", 0x22),
    fr("_ZN2at6native10empty_cudaEN3c108ArrayRefIlEE", "libtorch_cuda.so", 0x33),
    fr("_ZN8pybind1112cpp_function10dispatcherEP7_objectS2_S2_", "libtorch_python.so", 0x44),
    fr("cfunction_call", "python3.11", 0x55),
    fr("_PyEval_EvalFrameDefault", "python3.11", 0x66),
    fr("_PyEval_EvalFrameDefault", "python3.11", 0x77),
    fr("PyEval_EvalCode", "python3.11", 0x88),
    fr("", "libdataloader.so", 0x99),
]
d["event"]["python_stack"] = [{"file": "train.py", "line": 42, "function": "train_step"},
                              {"file": "train.py", "line": 90, "function": "<module>"}]
json.dump(d, open(sys.argv[2], "w"))
PY
report "$T/py.json" py
has "$T/py.txt" "=> at at::native::empty_cuda(c10::ArrayRef<long>)" "PyTorch-like: caller past the runtime and the caching allocator, demangled"
has "$T/py.txt" "at c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)" "PyTorch-like: dump's mangled symbols demangled"
has "$T/py.txt" "... 5 interpreter frames (pybind11::cpp_function::dispatcher" "PyTorch-like: pybind11 and CPython eval frames folded into one line"
has "$T/py.txt" "at libdataloader.so+0x99" "PyTorch-like: frames after the fold still shown"
pyl=$(grep -n "train_step  train.py:42" "$T/py.txt" | head -n 1 | cut -d: -f1)
natl=$(grep -n "=> at at::native::empty_cuda" "$T/py.txt" | head -n 1 | cut -d: -f1)
if [ -n "$pyl" ] && [ -n "$natl" ] && [ "$pyl" -lt "$natl" ]; then ok "PyTorch-like: Python frames before native ones (text)"
else no "PyTorch-like: Python frames before native ones (text)" "$(sed -n '/Stack of the failed/,/^$/p' "$T/py.txt")"; fi
has "$T/py.html" "Python stack</div><ol class=\"frames mono\"><li><span class=\"fn\">train_step</span> <span class=\"src\">train.py:42" "PyTorch-like: Python stack in HTML"
has "$T/py.html" "5 interpreter frames (pybind11::cpp_function::dispatcher" "PyTorch-like: folded in HTML"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
