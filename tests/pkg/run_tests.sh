#!/usr/bin/env bash
# tests/pkg/run_tests.sh — oomguard as users install it (pkg/): `make wheel`; the wheel's contents
# and what it needs from the host; the wheel in a fresh virtual environment (pip install --no-index)
# running the stand-in PyTorch job (tests/adapter) on the simulated GPU through its `oomguard run`,
# `python -m oomguard run`, a plain LD_PRELOAD of the installed library and a Jupyter kernel spec;
# the Kubernetes example's init-container layout; a copy of the library without its adapters.
# Every dump is compared with the source build's (same cause, numbers, stacks: same_dump.py).
# Ends with "N passed, N failed[, N skipped]".
#
#   B       build directory (default build)      PYTHON  interpreter for the venv (default python3)
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
B=${B:-build}
case $B in /*) BD=$B ;; *) BD=$ROOT/$B ;; esac
MAKE=${MAKE:-make}
PYTHON=${PYTHON:-python3}
T=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-pkg.XXXXXX")
trap 'rm -rf "$T"' EXIT
CHECK_DETAIL_LINES=20
. tests/lib/checks.sh

if [ -n "${SANITIZE:-}" ]; then
    skip "packaged oomguard" "built from the plain build, not under sanitizers"
    checks_end; exit
fi

unset PYTHONPATH PYTHONHOME PYTHONSTARTUP LD_PRELOAD OOMGUARD_DIR OOMGUARD_VERBOSE OOMGUARD_PYTHON_ADAPTER \
      OOMGUARD_PYTHON_STACKS OOMGUARD_LIMIT OOMGUARD_WARN_AT OOMGUARD_SUMMARY OOMGUARD_LIB NODE_NAME SLURMD_NODENAME \
      PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF JUPYTER_DATA_DIR VIRTUAL_ENV
export LD_LIBRARY_PATH=$BD/sim SIMGPU_DEVICES=1 SIMGPU_MEM=2560MiB SIMGPU_CTX_OVERHEAD=512MiB
export PYTHONDONTWRITEBYTECODE=1 PYTHONNOUSERSITE=1 OOMGUARD_FRAMEWORK=pytorch OOMGUARD_QUIET=1
FT=$ROOT/tests/adapter/fake_torch
JOB=$ROOT/tests/adapter/scenarios/job.py
SAME="$PYTHON tests/pkg/same_dump.py"

# the_dump DIR: the one dump in DIR (fails if there is not exactly one)
the_dump() {
    local f n
    n=$(ls "$1"/oomguard-*.json 2>/dev/null | wc -l)
    [ "$n" = 1 ] || { echo "$n dumps in $1" >&2; return 1; }
    f=$(ls "$1"/oomguard-*.json)
    echo "$f"
}
# same NAME DIR: DIR's dump says what the source build's said
same() {
    local d
    if d=$(the_dump "$2" 2>"$T/same.err") && $SAME "$SRC" "$d" >"$T/same.out" 2>&1; then ok "$1: $(tail -1 "$T/same.out")"
    else bad "$1" "$(cat "$T/same.err" "$T/same.out" "$2.log" 2>/dev/null | tail -20)"; fi
}

# ---------------------------------------------------------------- the wheel
start=$(date +%s)
$MAKE -s --no-print-directory B="$B" WHEEL_DIST="$T/dist" wheel >"$T/make.log" 2>&1
WHL=$(ls "$T"/dist/oomguard-*.whl 2>/dev/null | head -1)
if [ -z "$WHL" ]; then
    bad "make wheel" "$(tail -20 "$T/make.log")"
    checks_end; exit
fi
ok "make wheel: $(basename "$WHL") ($(($(stat -c %s "$WHL") / 1024)) KiB)"
"$PYTHON" tests/pkg/check_wheel.py "$WHL" adapters/python >"$T/wheel.log" 2>&1
while read -r st line; do
    case $st in ok) ok "wheel: $line" ;; *) bad "wheel: $line" "$(cat "$T/wheel.log")" ;; esac
done < <(grep -E '^(ok|FAIL)' "$T/wheel.log")
grep -qE '^(ok|FAIL)' "$T/wheel.log" || bad "wheel checks" "$(tail -20 "$T/wheel.log")"

# ---------------------------------------------------------------- a fresh venv, pip install --no-index
# A venv without its own pip, filled by this interpreter's pip (--python: pip 22.3+) takes a second;
# ensurepip's copy of pip takes 10-20 s on a loaded machine.  Either is a fresh environment.
V=$T/venv
VPY=$V/bin/python
if "$PYTHON" -m venv --without-pip "$V" >"$T/venv.log" 2>&1 && "$PYTHON" -m pip --python "$VPY" --version >/dev/null 2>&1; then
    PIP=("$PYTHON" -m pip --python "$VPY")
elif rm -rf "$V" && "$PYTHON" -m venv "$V" >"$T/venv.log" 2>&1; then
    PIP=("$V/bin/pip")
else
    skip "the wheel in a fresh venv" "$PYTHON -m venv failed (python3-venv missing?): $(tail -1 "$T/venv.log")"
    checks_end; exit
fi
expect "pip install --no-index the wheel into a fresh venv" 0 \
    "${PIP[@]}" install --no-index --disable-pip-version-check -q "$WHL"
LIB=$("$VPY" -m oomguard --library 2>"$T/err")
case $LIB in
"$V"/lib/python3*/site-packages/oomguard/liboomguard.so) ok "python -m oomguard --library: in the venv's site-packages" ;;
*) bad "python -m oomguard --library" "got '$LIB' $(cat "$T/err")" ;;
esac
expect "the venv's oomguard --version" 0 "$V/bin/oomguard" --version
want=$("$BD/oomguard" --version)
has "the venv's oomguard is this build's ($want)" "$T/out" "$want"

# ---------------------------------------------------------------- the same job, the same dump
# the stand-in torch job's fragmentation failure; the interpreter is the venv's in every run
mkdir -p "$T/src" "$T/cmd" "$T/pym" "$T/pre" "$T/kernel-dumps"
PYTHONPATH=$FT "$BD/oomguard" run --dir "$T/src" -- "$VPY" "$JOB" frag "$T/src.exp" >"$T/src.log" 2>&1
SRC=$(the_dump "$T/src" 2>/dev/null)
if [ -n "$SRC" ] && "$PYTHON" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["diagnosis"]["primary"] == "fragmentation", d["diagnosis"]["primary"]
assert d["memory"]["framework"]["reserved_bytes"] > 0 and d["event"]["python_stack"], "no adapter numbers"' "$SRC" 2>"$T/err"
then ok "source build: oomguard run gives fragmentation with the adapter's numbers"
else bad "source build: the reference dump" "$(cat "$T/err" "$T/src.log" | tail -15)"; SRC=/nonexistent; fi

PYTHONPATH=$FT "$V/bin/oomguard" run --dir "$T/cmd" -- "$VPY" "$JOB" frag "$T/cmd.exp" >"$T/cmd.log" 2>&1
same "venv: oomguard run -- python job.py" "$T/cmd"
PYTHONPATH=$FT "$VPY" -m oomguard run --dir "$T/pym" -- "$VPY" "$JOB" frag "$T/pym.exp" >"$T/pym.log" 2>&1
same "venv: python -m oomguard run -- python job.py" "$T/pym"
PYTHONPATH=$FT LD_PRELOAD=$LIB OOMGUARD_DIR=$T/pre "$VPY" "$JOB" frag "$T/pre.exp" >"$T/pre.log" 2>&1
same "venv: LD_PRELOAD=<site-packages>/oomguard/liboomguard.so python job.py" "$T/pre"
expect "venv: oomguard run passes the exit status through" 3 \
    env PYTHONPATH="$FT" "$V/bin/oomguard" run --dir "$T/pym" --quiet -- "$VPY" "$JOB" oom-caught

# ---------------------------------------------------------------- Jupyter: a kernel whose env preloads the library
expect "kernelspec --dir writes kernel.json" 0 "$VPY" -m oomguard kernelspec --dir "$T/kernel" \
    --env OOMGUARD_DIR="$T/kernel-dumps"
has "kernelspec prints the file it wrote" "$T/out" "$T/kernel/kernel.json"
if "$PYTHON" - "$T/kernel/kernel.json" "$VPY" "$LIB" >"$T/k.log" 2>&1 <<'PY'
import json, sys
k, py, lib = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
assert k["argv"] == [py, "-m", "ipykernel_launcher", "-f", "{connection_file}"], k["argv"]
assert k["env"]["LD_PRELOAD"] == lib and k["language"] == "python", k
PY
then ok "kernel.json: this venv's python under ipykernel, LD_PRELOAD = the wheel's library"
else bad "kernel.json" "$(cat "$T/k.log")"; fi
# start the kernel's interpreter as Jupyter would (its argv[0], the spec's env over ours) on the job
"$PYTHON" - "$T/kernel/kernel.json" "$JOB" "$T/kernel.exp" >"$T/kernel-dumps.log" 2>&1 <<PY
import json, os, subprocess, sys
k = json.load(open(sys.argv[1]))
env = dict(os.environ, PYTHONPATH="$FT", **k["env"])
subprocess.run([k["argv"][0], sys.argv[2], "frag", sys.argv[3]], env=env, check=True)
PY
same "kernel spec: its python with its env gives the same dump" "$T/kernel-dumps"
JUPYTER_DATA_DIR=$T/jd "$VPY" -m oomguard kernelspec >/dev/null 2>&1
[ -f "$T/jd/kernels/oomguard/kernel.json" ] && ok "kernelspec (--user): \$JUPYTER_DATA_DIR/kernels/oomguard/kernel.json" \
    || bad "kernelspec --user" "no $T/jd/kernels/oomguard/kernel.json"
"$VPY" -m oomguard kernelspec --sys-prefix --name og2 >/dev/null 2>&1
[ -f "$V/share/jupyter/kernels/og2/kernel.json" ] && ok "kernelspec --sys-prefix --name: the venv's share/jupyter" \
    || bad "kernelspec --sys-prefix" "no $V/share/jupyter/kernels/og2/kernel.json"

# ---------------------------------------------------------------- the Kubernetes init-container layout
# What the image holds (the Dockerfile copies `make bundle`'s directory to /opt/oomguard), copied by
# the init container's own command into a "shared volume", preloaded from there as the training
# container does.
if "$PYTHON" tests/pkg/k8s_init.py examples/kubernetes "$BD/bundle" "$T/vol" >"$T/k8s.cmd" 2>"$T/k8s.err"; then
    mkdir -p "$T/vol"
    (export OOMGUARD_DIR=$T/k8s-oom; sh -c "$(sed -n 1p "$T/k8s.cmd")") >"$T/k8s.log" 2>&1
    PRE=$(sed -n 2p "$T/k8s.cmd")
    [ -f "$PRE" ] && [ -f "$T/vol/python/sitecustomize.py" ] && [ -d "$T/k8s-oom" ] \
        && ok "init container: copies the library, lib/ and the adapters; creates OOMGUARD_DIR" \
        || bad "init container layout" "$(ls -R "$T/vol" | head; cat "$T/k8s.log")"
    PYTHONPATH=$FT LD_PRELOAD=$PRE OOMGUARD_DIR=$T/k8s-oom "$PYTHON" "$JOB" frag "$T/k8s.exp" >"$T/k8s-oom.log" 2>&1
    same "init-container layout: a Python job loads the adapters" "$T/k8s-oom"
    mkdir -p "$T/k8s-loud"
    PYTHONPATH=$FT LD_PRELOAD=$PRE OOMGUARD_QUIET=0 OOMGUARD_DIR=$T/k8s-loud "$PYTHON" "$JOB" frag "$T/k8s-loud.exp" \
        >"$T/out" 2>"$T/err"
    hasnt "init-container layout: no word of missing adapters" "$T/err" "not loaded"
else
    if grep -q "No module named 'yaml'" "$T/k8s.err"; then skip "Kubernetes layout" "PyYAML not installed"
    else bad "Kubernetes example: the init container" "$(cat "$T/k8s.err")"; fi
fi

# ---------------------------------------------------------------- a library copied without its adapters
# (what the init container did before it copied python/): the dump and one stderr line say so
mkdir -p "$T/bare" "$T/bare-oom" "$T/bare-pp"
cp "$BD/bundle/liboomguard.so" "$T/bare/" && cp -r "$BD/bundle/lib" "$T/bare/"
WHY="python adapter: not loaded: no adapters directory next to liboomguard.so in $T/bare"
PYTHONPATH=$FT LD_PRELOAD=$T/bare/liboomguard.so OOMGUARD_QUIET=0 OOMGUARD_DIR=$T/bare-oom \
    "$PYTHON" "$JOB" frag "$T/bare.exp" >"$T/out" 2>"$T/err"
n=$(grep -cF "$WHY" "$T/err")
[ "$n" = 1 ] && ok "no adapters next to the library: said once on stderr" || bad "no adapters: stderr" "$n lines; $(head -5 "$T/err")"
d=$(the_dump "$T/bare-oom" 2>/dev/null)
if [ -n "$d" ] && "$PYTHON" -c '
import json, sys
u = json.load(open(sys.argv[1]))["memory"]["unmeasured"]
assert sys.argv[2] in u, u' "$d" "$WHY" 2>"$T/err2"
then ok "no adapters next to the library: memory.unmeasured says so"
else bad "no adapters: memory.unmeasured" "$(cat "$T/err2")"; fi
PYTHONPATH=$ROOT/adapters/python:$FT LD_PRELOAD=$T/bare/liboomguard.so OOMGUARD_QUIET=0 OOMGUARD_DIR=$T/bare-pp \
    "$PYTHON" "$JOB" frag "$T/bare-pp.exp" >"$T/out" 2>"$T/err"
hasnt "no adapters next to it, but on PYTHONPATH: nothing said" "$T/err" "not loaded"
LD_PRELOAD=$T/bare/liboomguard.so OOMGUARD_QUIET=0 OOMGUARD_DIR=$T/bare-oom sh -c 'true' >"$T/out" 2>"$T/err"
hasnt "no adapters, not a Python process: nothing said" "$T/err" "not loaded"

echo "(the suite took $(($(date +%s) - start)) s)"
checks_end
