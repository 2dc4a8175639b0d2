#!/usr/bin/env bash
# Tests of the PyTorch adapter (adapters/python) on the simulated GPU, with a stand-in torch
# (tests/adapter/fake_torch) whose caching allocator reaches liboomguard's hooks through the CUDA
# runtime.  Ends with one line "N passed, N failed[, N skipped]"; exit status 1 on a failure.
#
#   B        build directory (default: build)          -> $B/sim holds the simulated GPU
#   PRELOAD  what goes into LD_PRELOAD (default: $B/liboomguard.so; may list several libraries)
#   PYTHON   the interpreter (default: python3)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${B:-build}
case "$B" in /*) BDIR=$B ;; *) BDIR=$ROOT/$B ;; esac
PRELOAD=${PRELOAD:-$BDIR/liboomguard.so}
abs_preload=""
for p in $PRELOAD; do
    case "$p" in /*) ;; *) [ -e "$ROOT/$p" ] && p=$ROOT/$p ;; esac
    abs_preload="$abs_preload${abs_preload:+ }$p"
done
PRELOAD=$abs_preload
# what stays preloaded "without the shim" (a sanitizer runtime the simulated GPU may need)
NOSHIM_PRELOAD=""
for p in $PRELOAD; do
    case "$(basename "$p")" in liboomguard*) ;; *) NOSHIM_PRELOAD="$NOSHIM_PRELOAD${NOSHIM_PRELOAD:+ }$p" ;; esac
done
PYTHON=${PYTHON:-python3}
AD=$ROOT/adapters/python
FT=$ROOT/tests/adapter/fake_torch
SC=$ROOT/tests/adapter/scenarios
JOB=$SC/job.py
CHECK=$SC/check_dump.py

# the stand-in torch calls the runtime from its libc10_cuda.so, as PyTorch does (tests/adapter/adapter.mk)
export FAKE_TORCH_LIBC10=$BDIR/tests/adapter/libc10_cuda.so
# and the stand-in JAX, CuPy and TensorFlow from xla_extension.so, cupy/cuda/memory.so, libtensorflow_framework.so.2
export FAKE_JAX_XLA_EXTENSION=$BDIR/tests/adapter/jaxlib/xla_extension.so
export FAKE_CUPY_MEMORY=$BDIR/tests/adapter/cupy/cuda/memory.so
export FAKE_TF_FRAMEWORK=$BDIR/tests/adapter/tensorflow/libtensorflow_framework.so.2
for f in $PRELOAD "$BDIR/sim/libcudart.so.13" "$FAKE_TORCH_LIBC10" "$FAKE_JAX_XLA_EXTENSION" "$FAKE_CUPY_MEMORY" \
    "$FAKE_TF_FRAMEWORK"; do
    if [ ! -e "$f" ]; then echo "missing $f: run 'make all' first"; echo "0 passed, 1 failed"; exit 1; fi
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-adapter-tests.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# A clean, reproducible environment for every job.
unset PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONVERBOSE OOMGUARD_VERBOSE OOMGUARD_PYTHON_ADAPTER OOMGUARD_PYTHON_STACKS \
      XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR CUPY_GPU_MEMORY_LIMIT \
      PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF FAKE_TORCH_BROKEN FAKE_TORCH_VERSION FAKE_TF_VERSION \
      OOMGUARD_LIMIT OOMGUARD_WARN_AT OOMGUARD_SUMMARY LD_PRELOAD
export LD_LIBRARY_PATH="$BDIR/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SIMGPU_DEVICES=1 SIMGPU_MEM=2560MiB SIMGPU_CTX_OVERHEAD=512MiB
export PYTHONDONTWRITEBYTECODE=1 PYTHONNOUSERSITE=1 OOMGUARD_FRAMEWORK=pytorch OOMGUARD_QUIET=1

pass=0 fail=0 skip=0
failed=()
N=0
# t NAME FUNCTION: runs the test function in its own directory $W with its output kept in $W/log
t() {
    local name=$1; shift
    N=$((N + 1))
    W=$TMP/t$N; mkdir -p "$W/dumps"
    local rc=0
    ( set -u; cd "$W" && "$@" ) >"$W/log" 2>&1 || rc=$?
    if [ $rc = 0 ]; then
        pass=$((pass + 1)); echo "PASS  $name"
    elif [ $rc = 77 ]; then
        skip=$((skip + 1)); echo "SKIP  $name: $(tail -n 1 "$W/log")"
    else
        fail=$((fail + 1)); failed+=("$name"); echo "FAIL  $name"
        tail -n 40 "$W/log" | sed 's/^/      | /'
    fi
}

# shim / noshim / adapter / noadapter: prefixes for a job's environment
# (bash exports a VAR=value placed before a function call to what that function runs)
shim() { LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$W/dumps" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" "$@"; }
adapter() { PYTHONPATH="$AD:$FT" "$@"; }
# without the adapter: the shim itself would put it on PYTHONPATH in a Python process
noadapter() { OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FT" "$@"; }
noshim() { LD_PRELOAD="$NOSHIM_PRELOAD" "$@"; }
# needs_no_tsan WHY: a test that cannot run in the TSan build (docs/testing.md) is skipped there
needs_no_tsan() {
    if [ "${SANITIZE:-}" = thread ]; then echo "not under TSan: $1"; exit 77; fi
}
fail_if() { if eval "$1"; then echo "failed: $2"; return 1; fi; }
# field FILE EXPR: a value from a JSON file (EXPR indexes d)
field() { "$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
expect() { # expect FILE EXPR VALUE
    local v; v=$(field "$1" "$2") || { echo "cannot read $2 from $1"; return 1; }
    if [ "$v" != "$3" ]; then echo "$2 = $v, want $3"; return 1; fi
}
no_oomguard_lines() { grep -v '^oomguard' "$1" > "$1.clean" || true; echo "$1.clean"; }

# Which library the shim names as the caller of cudaMalloc from the stand-in (its libc10_cuda.so, as in a
# real PyTorch process; through ctypes alone it would be libffi): it becomes OOMGUARD_FRAMEWORK_LIBS.
probe_dir=$TMP/probe; mkdir -p "$probe_dir"
env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$probe_dir" OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FT" "$PYTHON" "$JOB" oom-caught >/dev/null 2>&1
FWLIB=$("$PYTHON" -c "
import glob, json, sys
f = glob.glob(sys.argv[1] + '/oomguard-*.json')
d = json.load(open(f[0])) if f else {}
libs = d.get('memory', {}).get('by_library', [])
print(d.get('event', {}).get('library') or (libs[0]['library'] if libs else ''))" "$probe_dir" 2>/dev/null)
FWLIB=${FWLIB:-libffi.so.8}
echo "== calls from the stand-in are attributed to $FWLIB"
t_attributed_c10() { # every block of the stand-in's allocator is libc10_cuda.so's, PyTorch's by the library alone
    env -u OOMGUARD_FRAMEWORK LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$W/dumps" OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FT" \
        "$PYTHON" "$JOB" oom-caught
    local d; d=$(ls dumps/oomguard-*.json | head -n 1)
    expect "$d" 'd["event"]["library"]' libc10_cuda.so &&
        expect "$d" '[(l["library"], l["framework_name"]) for l in d["memory"]["by_library"]]' "[('libc10_cuda.so', 'pytorch')]" &&
        expect "$d" 'd["framework"]["name"]' pytorch
}
t "the stand-in's blocks come from its libc10_cuda.so (framework pytorch by the library), as a real PyTorch process's" \
    t_attributed_c10

# ---------------------------------------------------------------------------------------------

t_syntax() {
    local files=("$AD"/*.py "$SC"/*.py)
    while IFS= read -r f; do files+=("$f"); done < <(find "$FT" "$ROOT/tests/adapter/fake_jax" "$ROOT/tests/adapter/fake_cupy" "$ROOT/tests/adapter/fake_tf" "$ROOT/tests/adapter/fake_common" -name '*.py' | sort)
    for f in "${files[@]}"; do
        "$PYTHON" -c "import py_compile,sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], doraise=True)" "$f" "$W/c.pyc" \
            || { echo "py_compile failed: $f"; return 1; }
    done
    "$PYTHON" "$SC/check_py39.py" "${files[@]}"
}
t "python 3.9 syntax (py_compile + 3.9 grammar, no 3.10+ constructs)" t_syntax

t_frag() {
    shim adapter "$PYTHON" "$JOB" frag exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --primary fragmentation --settings backend:native || return 1
    # the job freed tensors to make the holes: the allocator's freed total counts them
    expect exp.json 'd["expected"]["freed"] > 0' True || return 1
    # nothing left behind that costs per allocation or per import
    expect exp.json 'd["state"]["attached"]' observer &&
    expect exp.json 'd["state"]["observers"]' 1 &&
    expect exp.json 'd["state"]["import_hooks"]' 0 &&
    expect exp.json 'd["state"]["queued_calls"]' 0 &&
    expect exp.json 'd["state"]["profile_or_trace"]' False &&
    expect exp.json 'd["state"]["excepthook_replaced"]' False &&
    expect exp.json 'd["state"]["torch_loader"]' SourceFileLoader &&
    expect exp.json 'd["state"]["torch_spec_loader"]' SourceFileLoader
}
t "fragmentation via sitecustomize: memory.framework = the allocator's numbers, primary fragmentation" t_frag

t_snapshot() {
    shim adapter "$PYTHON" "$JOB" frag exp.json || return 1
    local dump snap
    dump=$(ls "$W"/dumps/oomguard-*.json | head -n 1)
    snap=$(field "$dump" 'd["memory"]["framework"]["snapshot_file"]') || return 1
    [ -f "$snap" ] || { echo "no snapshot file $snap"; return 1; }
    "$ROOT/$B/oomguard" report "$dump" --format memory-viz -o "$W/snap.pickle" || return 1
    # the pickle memory_viz loads is the allocator's own snapshot (same segments as the JSON)
    "$PYTHON" - "$W/snap.pickle" "$snap" <<'PY'
import json, pickle, sys
p = pickle.load(open(sys.argv[1], "rb"))
j = json.load(open(sys.argv[2]))
assert isinstance(p, dict) and "segments" in p, type(p)
assert len(p["segments"]) == len(j["segments"]) > 0, (len(p["segments"]), len(j["segments"]))
assert [s["total_size"] for s in p["segments"]] == [s["total_size"] for s in j["segments"]]
PY
    [ $? = 0 ] || return 1
    # the adapter's own pickle, next to the JSON, is the same snapshot; PyTorch's _memory_viz
    # functions and the page's replay accept both (77: no _memory_viz module here)
    [ -f "$snap.pickle" ] || { echo "no $snap.pickle"; return 1; }
    "$PYTHON" - "$snap.pickle" "$snap" <<'PY' || return 1
import json, pickle, sys
p = pickle.load(open(sys.argv[1], "rb"))
j = json.load(open(sys.argv[2]))
assert [s["total_size"] for s in p["segments"]] == [s["total_size"] for s in j["segments"]]
PY
    python3 "$ROOT/tests/cli/check_memviz.py" "$W/snap.pickle" "$snap.pickle"
    local rc=$?
    [ $rc = 0 ] || [ $rc = 77 ]
}
t "the allocator snapshot is saved next to the dump and becomes the memory_viz pickle" t_snapshot

t_frag_without() {
    shim noadapter "$PYTHON" "$JOB" frag exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --no-framework --not-primary fragmentation || return 1
    # without the adapter: the export built from the ledger loads in _memory_viz and replays
    # within the device
    local dump total
    dump=$(ls "$W"/dumps/oomguard-*.json | head -n 1)
    total=$(field "$dump" 'd["device"]["total_bytes"]') || return 1
    "$ROOT/$B/oomguard" report "$dump" --format memory-viz -o "$W/noadapter.pickle" || return 1
    python3 "$ROOT/tests/cli/check_memviz.py" --total "$total" "$W/noadapter.pickle"
    local rc=$?
    [ $rc = 0 ] || [ $rc = 77 ]
}
t "the same job without the adapter: no memory.framework, fragmentation not diagnosed" t_frag_without

t_toobig() {
    shim adapter "$PYTHON" "$JOB" toobig exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --primary does_not_fit
}
t "a request larger than the device: memory.framework filled, primary does_not_fit" t_toobig

t_goes_on() { # PyTorch raised: a larger allocation right after, once caught, is no recovery of that failure
    shim adapter env OOMGUARD_QUIET=0 "$PYTHON" "$JOB" oom-goes-on > a.out 2> a.err || { cat a.err; return 1; }
    local dump; dump=$(ls dumps/oomguard-*.json)
    expect "$dump" 'd["status"], d["event"]["requested_bytes"] == 3 << 30' "oom True" &&
    [ "$(grep -c '^oomguard: .* failed: ' a.err)" = 1 ] || { echo "stderr summaries:"; cat a.err; return 1; }
}
t "a caught OOM, then a larger success at once: the dump and stderr keep the failure (not recovered)" t_goes_on

t_multidev() {
    SIMGPU_DEVICES=2 shim adapter "$PYTHON" "$JOB" multidev exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --primary does_not_fit && expect exp.json 'd["expected"]["device"]' 1
}
t "out of memory on device 1 of 2: the numbers are device 1's" t_multidev

t_contexts_lazy() { # MODE: where the stand-in torch makes CUDA contexts, as PyTorch 2.x on CUDA 12+ does
    SIMGPU_DEVICES=2 shim adapter "$PYTHON" - "$1" "$ROOT/tests/scenarios/py" <<'PY'
import ctypes, sys
sys.path.insert(0, sys.argv[2])
import scen_truth
import torch
lib = ctypes.CDLL("libcuda.so.1")
def ctx():
    out = []
    for d in range(2):
        t = scen_truth._Truth()
        assert lib.simgpu_truth(d, ctypes.byref(t)) == 0
        out.append(t.contexts)
    return out
mode = sys.argv[1]
if mode == "set_device":        # set_device(1), then tensors on the current device: device 1 only
    torch.cuda.set_device(1)
    assert ctx() == [0, 1], ctx()
    x = torch.empty(1 << 20)
    assert (x.device, torch.cuda.current_device(), ctx()) == (1, 1, [0, 1]), (x.device, ctx())
elif mode == "tensor":          # a first tensor on cuda:1; queries make no context on device 0
    x = torch.empty(1 << 20, device="cuda:1")
    assert ctx() == [0, 1], ctx()
    assert torch.cuda.current_device() == 0 and torch.cuda.get_device_properties(0).total_memory > 0
    assert torch.cuda.is_initialized() and ctx() == [0, 1], ctx()
    y = torch.empty(1 << 20)    # the current device is used: now it has its context
    assert (y.device, ctx()) == (0, [1, 1]), (y.device, ctx())
elif mode == "init":            # initialisation and set_device(0) in a fresh process make no context
    torch.cuda.init()
    torch.cuda.set_device(0)
    assert torch.cuda.is_initialized() and ctx() == [0, 0], ctx()
PY
}
t "contexts: set_device(1) makes device 1's context only, none on device 0" t_contexts_lazy set_device
t "contexts: a first tensor on cuda:1 makes device 1's; current_device and get_device_properties make none" \
    t_contexts_lazy tensor
t "contexts: torch.cuda.init() and set_device(0) make no context until a device is used" t_contexts_lazy init

t_autograd_nested() { shim adapter "$PYTHON" "$SC/job_autograd.py"; }
t "autograd: a nested model's backward gives every parameter used a gradient of its size and dtype; zero_grad drops them" \
    t_autograd_nested

t_state_before() {
    shim adapter "$PYTHON" "$JOB" state-before st.json || return 1
    # torch imported, CUDA not initialised: the observer waits in torch.cuda's queue
    expect st.json 'd["state"]["observers"]' 0 && expect st.json 'd["state"]["queued_calls"]' 1 &&
    expect st.json 'd["state"]["import_hooks"]' 0 && expect st.json 'd["state"]["attached"]' None
}
t "before the first CUDA use nothing is attached (queued with torch.cuda._lazy_call)" t_state_before

t_manual() { # t_manual MODE STEPS: PYTHONPATH without the adapter; the job imports oomguard_torch itself
    shim env OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FT" ADAPTER_DIR="$AD" "$PYTHON" "$JOB" "$1" exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --primary fragmentation || return 1
    # optimizer steps: a measured 0 when the adapter watched from torch's import, unknown when it came later
    expect "$(ls dumps/*.json | head -1)" 'd["memory"]["framework"]["roles"]["optimizer_steps"]' "$2"
}
t "manual enable: import oomguard_torch before torch (no optimizer step: a measured 0)" t_manual manual-before 0
t "manual enable: import oomguard_torch after torch (steps before it unknown)" t_manual manual-after None
t "manual enable: import oomguard_torch after CUDA initialisation" t_manual manual-afterinit None

t_idempotent() {
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" idempotent exp.json || return 1
    expect exp.json 'd["state"]["observers"]' 1 && expect exp.json 'd["state"]["step_hooks"]' 1 &&
    "$PYTHON" "$CHECK" dumps exp.json --primary does_not_fit
}
t "sitecustomize + import twice + activate() + install(): one observer" t_idempotent

t_noshim() {
    needs_no_tsan "this Python crashes with the TSan runtime preloaded alone (python3 -c 'print(1)': SIGSEGV)"
    # no LD_PRELOAD: the adapter must not say or change anything, even with OOMGUARD_VERBOSE=1
    OOMGUARD_VERBOSE=1 noshim adapter "$PYTHON" "$JOB" oom-uncaught > a.out 2> a.err; local ra=$?
    OOMGUARD_VERBOSE=1 noshim noadapter "$PYTHON" "$JOB" oom-uncaught > b.out 2> b.err; local rb=$?
    [ $ra = $rb ] || { echo "exit $ra with the adapter, $rb without"; return 1; }
    cmp a.out b.out && cmp a.err b.err || { echo "output differs"; diff a.err b.err | head; return 1; }
    OOMGUARD_VERBOSE=1 noshim adapter "$PYTHON" "$JOB" state st.json 2> c.err || return 1
    [ ! -s c.err ] || { echo "stderr:"; cat c.err; return 1; }
    expect st.json 'd["state"]["adapter_loaded"]' True && expect st.json 'd["state"]["attached"]' None &&
    expect st.json 'd["state"]["observers"]' 0 && expect st.json 'd["state"]["queued_calls"]' 0 &&
    expect st.json 'd["state"]["import_hooks"]' 0 && expect st.json 'd["state"]["excepthook_replaced"]' False &&
    expect st.json 'd["state"]["step_hooks"]' 0
}
t "without the shim the adapter is a silent no-op" t_noshim

t_uncaught() {
    shim adapter "$PYTHON" "$JOB" oom-uncaught > a.out 2> a.err; local ra=$?
    mv dumps/oomguard-*.json a.json 2>/dev/null; rm -f dumps/*
    shim noadapter "$PYTHON" "$JOB" oom-uncaught > b.out 2> b.err; local rb=$?
    [ $ra = 1 ] && [ $rb = 1 ] || { echo "exit status $ra / $rb, want 1"; return 1; }
    cmp a.out b.out && cmp "$(no_oomguard_lines a.err)" "$(no_oomguard_lines b.err)" \
        || { echo "output differs"; diff a.err b.err | head; return 1; }
    expect a.json 'd["memory"]["framework"] is not None' True
}
t "an uncaught OOM: same traceback and exit status with and without the adapter" t_uncaught

# --- a user's sitecustomize keeps working

mk_user_sc() { # mk_user_sc DIR: a sitecustomize that leaves a mark
    mkdir -p "$1"
    cat > "$1/sitecustomize.py" <<'EOF'
import os
USER_SITECUSTOMIZE = True
with open(os.environ["MARK"], "w") as f:
    f.write("%s %s" % (__name__, __file__))
EOF
}
t_user_sc() {
    mk_user_sc "$W/user"
    shim env PYTHONPATH="$AD:$FT:$W/user" MARK="$W/mark" "$PYTHON" -c '
import sys, sitecustomize
print(sitecustomize.__file__)
print(sitecustomize.USER_SITECUSTOMIZE)
print("oomguard_torch" in sys.modules)
print(sum(1 for f in sys.meta_path if type(f).__name__ == "_OomguardImportHook" and f.name == "torch"))' > out || return 1
    printf '%s\n' "$W/user/sitecustomize.py" True True 1 > want
    diff want out || return 1
    [ "$(cat mark)" = "sitecustomize $W/user/sitecustomize.py" ] || { echo "mark: $(cat mark)"; return 1; }
}
t "a user's sitecustomize later on PYTHONPATH still runs, as module sitecustomize" t_user_sc

t_user_sc_off() {
    mk_user_sc "$W/user"
    shim env OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$AD:$FT:$W/user" MARK="$W/mark" "$PYTHON" -c '
import sys, sitecustomize
print(sitecustomize.USER_SITECUSTOMIZE, "oomguard_torch" in sys.modules)' > out || return 1
    [ "$(cat out)" = "True False" ] || { cat out; return 1; }
    [ -s mark ]
}
t "OOMGUARD_PYTHON_ADAPTER=0: adapter off, the user's sitecustomize still runs" t_user_sc_off

t_user_sc_broken() {
    mkdir -p user
    printf 'import os\nprint("user sitecustomize started")\nraise ValueError("the user sitecustomize is broken")\n' > user/sitecustomize.py
    shim env PYTHONPATH="$AD:$FT:$W/user" "$PYTHON" -c 'import sys; print("main ran", "sitecustomize" in sys.modules); sys.exit(5)' > a.out 2> a.err; local ra=$?
    shim env OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FT:$W/user" "$PYTHON" -c 'import sys; print("main ran", "sitecustomize" in sys.modules); sys.exit(5)' > b.out 2> b.err; local rb=$?
    [ $ra = 5 ] && [ $rb = 5 ] || { echo "exit $ra / $rb"; return 1; }
    cmp a.out b.out && cmp a.err b.err || { diff a.out b.out; diff a.err b.err; return 1; }
    grep -q 'Error in sitecustomize' a.err || { echo "no 'Error in sitecustomize'"; cat a.err; return 1; }
}
t "a broken user sitecustomize is reported exactly as Python does, and the program goes on" t_user_sc_broken

t_distro_sc() {
    local sys_py=/usr/bin/python3
    [ -x "$sys_py" ] || { echo "no $sys_py"; return 77; }
    local f
    f=$(env -u PYTHONPATH "$sys_py" -c 'import sitecustomize; print(sitecustomize.__file__)' 2>/dev/null) \
        || { echo "$sys_py has no sitecustomize of its own"; return 77; }
    local g
    g=$(shim env PYTHONPATH="$AD" "$sys_py" -c 'import sys, sitecustomize; print(sitecustomize.__file__, "oomguard_torch" in sys.modules)') || return 1
    [ "$g" = "$f True" ] || { echo "got '$g', want '$f True'"; return 1; }
}
t "the distribution's own sitecustomize (system python) is chained" t_distro_sc

# --- a broken torch never breaks the job

t_broken_import() {
    shim adapter env FAKE_TORCH_BROKEN=import "$PYTHON" "$JOB" import-torch > a.out 2> a.err; local ra=$?
    shim noadapter env FAKE_TORCH_BROKEN=import "$PYTHON" "$JOB" import-torch > b.out 2> b.err; local rb=$?
    [ $ra = 1 ] && [ $rb = 1 ] || { echo "exit $ra / $rb"; return 1; }
    [ "$(tail -n 1 a.err)" = "$(tail -n 1 b.err)" ] || { echo "last line differs:"; tail -n 1 a.err b.err; return 1; }
    # the import can be retried (the hook stays until torch has loaded)
    shim adapter "$PYTHON" -c '
import os, sys
os.environ["FAKE_TORCH_BROKEN"] = "import"
try:
    import torch
except RuntimeError:
    pass
os.environ["FAKE_TORCH_BROKEN"] = ""
import torch, oomguard_torch
torch.cuda.init()
print(oomguard_torch.is_attached())' > c.out || return 1
    [ "$(cat c.out)" = observer ] || { cat c.out; return 1; }
}
t "broken torch (import raises): same exception and exit status; a retried import attaches" t_broken_import

t_broken_stats() {
    shim adapter env FAKE_TORCH_BROKEN=stats "$PYTHON" "$JOB" oom-caught exp.json > a.out 2> a.err; local ra=$?
    [ $ra = 3 ] || { echo "exit $ra, want 3"; cat a.err; return 1; }
    [ -z "$(grep 'pytorch adapter' a.err)" ] || { echo "adapter spoke without OOMGUARD_VERBOSE"; return 1; }
    "$PYTHON" "$CHECK" dumps exp.json --no-framework || return 1
    rm -f dumps/*
    shim adapter env FAKE_TORCH_BROKEN=stats OOMGUARD_VERBOSE=1 "$PYTHON" "$JOB" oom-caught exp.json > v.out 2> v.err
    [ $? = 3 ] || return 1
    local n; n=$(grep -c 'pytorch adapter: .*failed' v.err)
    [ "$n" = 1 ] || { echo "$n error lines with OOMGUARD_VERBOSE=1, want 1"; grep 'pytorch adapter' v.err; return 1; }
}
t "broken torch (memory_stats raises): the job's OOM and exit status unchanged, one line when verbose" t_broken_stats

t_broken_snapshot() {
    shim adapter env FAKE_TORCH_BROKEN=snapshot "$PYTHON" "$JOB" frag exp.json || return 1
    "$PYTHON" "$CHECK" dumps exp.json --no-snapshot
}
t "broken torch (_snapshot raises): the stats are still reported, largest free block unknown" t_broken_snapshot

t_broken_attach() {
    shim adapter env FAKE_TORCH_BROKEN=attach "$PYTHON" "$JOB" oom-caught exp.json > a.out 2> a.err; local ra=$?
    shim noadapter env FAKE_TORCH_BROKEN=attach "$PYTHON" "$JOB" oom-caught > b.out 2> b.err; local rb=$?
    [ $ra = 3 ] && [ $rb = 3 ] || { echo "exit $ra / $rb"; cat a.err; return 1; }
    cmp a.out b.out || return 1
    ! grep -q DeferredCudaCallError a.err || { echo "DeferredCudaCallError"; return 1; }
}
t "broken torch (attaching raises): no DeferredCudaCallError, the job runs as without the adapter" t_broken_attach

# --- backends and versions

t_async() {
    export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    shim adapter "$PYTHON" "$JOB" async exp.json > a.out 2> a.err; local ra=$?
    mv dumps/oomguard-*.json a.json; rm -f dumps/*
    shim noadapter "$PYTHON" "$JOB" async > b.out 2> b.err; local rb=$?
    [ $ra = 1 ] && [ $rb = 1 ] || { echo "exit $ra / $rb"; cat a.err; return 1; }
    [ "$(tail -n 1 a.err)" = "$(tail -n 1 b.err)" ] || { tail -n 1 a.err b.err; return 1; }
    # the program's own hook gets the traceback whole, as without the adapter
    [ "$(sed -n '/^Traceback/,$p' a.err | grep -v '^oomguard')" = \
      "$(sed -n '/^Traceback/,$p' b.err | grep -v '^oomguard')" ] && grep -q "in sweep" a.err ||
        { echo "traceback differs"; cat a.err; return 1; }
    rm -f dumps/*; mv a.json dumps/oomguard-with-adapter.json
    "$PYTHON" "$CHECK" dumps exp.json --settings backend:cudaMallocAsync &&
    expect exp.json 'd["state"]["attached"]' excepthook && expect exp.json 'd["state"]["observers"]' 0 &&
    expect exp.json 'd["expected"]["reserved"] > d["expected"]["allocated"]' True &&
    # reported after the error left every `with` block: the thread's modes are not the failure's
    expect dumps/oomguard-with-adapter.json \
        '[d["memory"]["framework"][k] for k in ("grad_enabled", "autocast")]' '[None, None]' &&
    # the unwound stack's locals, alive in the traceback, are read as the running stack's would be
    expect dumps/oomguard-with-adapter.json \
        '[(h["name"], h["where"].split(" (")[0], h["bytes"]) for h in d["memory"]["framework"]["roles"]["holders"]
          if h["name"] == "endpoints"]' "[('endpoints', 'local in sweep', $((20 << 20)))]"
}
t "backend:cudaMallocAsync: no observer; an uncaught OOM reports memory_stats from sys.excepthook" t_async

t_old_torch() {
    SIMGPU_DEVICES=2 shim adapter env FAKE_TORCH_VERSION=2.1.2 "$PYTHON" "$JOB" state st.json || return 1
    expect st.json 'd["state"]["attached"]' excepthook && expect st.json 'd["state"]["observers"]' 0 || return 1
    SIMGPU_DEVICES=1 shim adapter env FAKE_TORCH_VERSION=2.1.2 "$PYTHON" "$JOB" state st1.json || return 1
    expect st1.json 'd["state"]["attached"]' observer
}
t "torch < 2.2 with several devices: no observer (PyTorch's per-device registration was unsafe)" t_old_torch

# --- the plain preload, framework-internal failures, Python lines, JAX and CuPy

FJ=$ROOT/tests/adapter/fake_jax
FC=$ROOT/tests/adapter/fake_cupy
CHECKFW=$SC/check_fw.py
OOMGUARD_BIN=$BDIR/oomguard

t_three_usages() {
    # the same fragmentation job: `oomguard run`, the plain preload, the plain preload with a
    # sitecustomize of the user's own on PYTHONPATH
    mk_user_sc "$W/user"
    mkdir -p run plain user_sc
    env LD_PRELOAD="$NOSHIM_PRELOAD" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" PYTHONPATH="$FT" \
        "$OOMGUARD_BIN" run --quiet --dir "$W/run" -- "$PYTHON" "$JOB" frag run.json > run.out 2>&1 \
        || { cat run.out; return 1; }
    env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$W/plain" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" PYTHONPATH="$FT" \
        "$PYTHON" "$JOB" frag plain.json || return 1
    env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$W/user_sc" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" \
        PYTHONPATH="$FT:$W/user" MARK="$W/mark" "$PYTHON" "$JOB" frag user.json || return 1
    [ "$(cat mark 2>/dev/null)" = "sitecustomize $W/user/sitecustomize.py" ] \
        || { echo "the user's sitecustomize did not run: '$(cat mark 2>/dev/null)'"; return 1; }
    local u prim=""
    for u in run plain user_sc; do
        local exp=$u.json; [ $u = user_sc ] && exp=user.json
        "$PYTHON" "$CHECK" "$u" "$exp" --primary fragmentation || { echo "($u)"; return 1; }
        local p; p=$(field "$(ls $u/oomguard-*.json)" 'd["diagnosis"]["primary"], [c["id"] for c in d["diagnosis"]["causes"]], [r["id"] for r in d["remedies"]]')
        if [ -z "$prim" ]; then prim=$p; elif [ "$p" != "$prim" ]; then echo "$u: $p, run: $prim"; return 1; fi
    done
}
t "same fragmentation job: oomguard run / plain LD_PRELOAD / plain + user sitecustomize give the same dump" t_three_usages

t_plain_off() {
    OOMGUARD_PYTHON_ADAPTER=0 shim env PYTHONPATH="$FT" "$PYTHON" -c '
import os, sys
print(os.environ.get("PYTHONPATH"), any(p.endswith("adapters/python") for p in sys.path), "oomguard_torch" in sys.modules)' > out || return 1
    [ "$(cat out)" = "$FT False False" ] || { cat out; return 1; }
    # and on: first on the path, once, also when the parent already put it there
    shim env PYTHONPATH="$FT" "$PYTHON" -c '
import os, subprocess, sys
print(os.environ["PYTHONPATH"])
sys.stdout.flush()
subprocess.run([sys.executable, "-c", "import os; print(os.environ[\"PYTHONPATH\"])"])' > on || return 1
    local want; want=$(cd "$AD" && pwd -P):$FT
    [ "$(sed -n 1p on)" = "$want" ] && [ "$(sed -n 2p on)" = "$want" ] || { echo "want $want"; cat on; return 1; }
}
t "OOMGUARD_PYTHON_ADAPTER=0 leaves PYTHONPATH alone; otherwise the adapter goes first, once (children too)" t_plain_off

t_children() {
    # a shell that starts Python, and a Python that starts Python: each child loads the adapter
    shim env PYTHONPATH="$FT" bash -c "cd '$W' && '$PYTHON' '$JOB' frag a.json" || return 1
    "$PYTHON" "$CHECK" dumps a.json --primary fragmentation || return 1
    rm -f dumps/*
    shim env PYTHONPATH="$FT" "$PYTHON" -c 'import subprocess, sys; sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))' \
        "$JOB" frag b.json || return 1
    "$PYTHON" "$CHECK" dumps b.json --primary fragmentation
}
t "child processes (bash -> python, python -> python) load the adapter under the plain preload" t_children

t_installed() {
    # the installed layout: <prefix>/lib/oomguard/{liboomguard.so,python/}
    mkdir -p inst/lib/oomguard/python
    cp "$(echo $PRELOAD | tr ' ' '\n' | grep liboomguard)" inst/lib/oomguard/liboomguard.so
    cp "$AD"/*.py inst/lib/oomguard/python/
    local pre=""; [ -n "$NOSHIM_PRELOAD" ] && pre="$NOSHIM_PRELOAD "
    env LD_PRELOAD="${pre}$W/inst/lib/oomguard/liboomguard.so" OOMGUARD_DIR="$W/dumps" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" \
        PYTHONPATH="$FT" "$PYTHON" -c 'import sys, runpy; print(sys.path[1]); sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")' \
        "$JOB" frag exp.json > out || return 1
    [ "$(head -n 1 out)" = "$W/inst/lib/oomguard/python" ] || { echo "sys.path[1] = $(head -n 1 out)"; return 1; }
    "$PYTHON" "$CHECK" dumps exp.json --primary fragmentation
}
t "installed layout: lib/oomguard/python is found next to the library" t_installed

t_fraction() {
    shim adapter "$PYTHON" "$JOB" fraction exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework pytorch --internal --api torch.cuda.caching_allocator \
        --request exp --cap exp --cap-source 'set_per_process_memory_fraction(0.5)' --numbers torch --line failing \
        --primary framework_cap --remedy-mentions set_per_process_memory_fraction || return 1
    # the driver had room: the allocator's own cap refused it
    expect exp.json 'd["expected"]["driver_free"] > d["expected"]["request"]' True
}
t "torch set_per_process_memory_fraction: dump without a driver failure, request and cap" t_fraction

t_fraction_uncaught() {
    shim adapter "$PYTHON" "$JOB" fraction-uncaught > a.out 2> a.err; local ra=$?
    [ $ra = 1 ] || { echo "exit $ra"; cat a.err; return 1; }
    local n; n=$(ls dumps/oomguard-*.json 2>/dev/null | wc -l)
    [ "$n" = 1 ] || { echo "$n dumps"; return 1; }
    expect "$(ls dumps/oomguard-*.json)" 'd["status"], d["event"]["framework_internal"], d["memory"]["framework"]["cap_bytes"] > 0' "oom True True" &&
    # what the allocator released in its own retry before refusing was told to no one: unknown, not 0
    expect "$(ls dumps/oomguard-*.json)" 'd["event"]["attempts"], d["event"]["released_between_attempts_bytes"]' "1 None"
}
t "torch memory fraction, OOM not caught: one dump, status oom" t_fraction_uncaught

t_python_stack() {
    shim adapter "$PYTHON" "$JOB" frag exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --line failing || return 1
    # innermost first: the allocator's frame comes before the script's line
    expect "$(ls dumps/oomguard-*.json)" '[f["file"].endswith("job.py") for f in d["event"]["python_stack"]].index(True) > 0' True &&
    expect "$(ls dumps/oomguard-*.json)" 'd["python_sites"]' '[]' &&
    grep -q "Python stack (innermost first)" dumps/oomguard-*.txt
}
t "event.python_stack names the failing script line (innermost first); no python_sites by default" t_python_stack

t_python_sites() {
    OOMGUARD_PYTHON_STACKS=1 shim adapter "$PYTHON" "$JOB" frag exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --line failing --site most || return 1
    grep -q "Python lines holding the most live memory" dumps/oomguard-*.txt || return 1
    # `oomguard report` shows them too
    local most; most=$(field exp.json 'd["lines"]["most"]')
    "$OOMGUARD_BIN" report dumps/oomguard-*.json > report.txt || return 1
    grep -A3 "Python lines holding the most live memory" report.txt | grep -q "job.py:$most in <module>" \
        || { echo "oomguard report:"; grep -A3 "Python lines" report.txt; return 1; }
}
t "OOMGUARD_PYTHON_STACKS=1: python_sites[0] is the line that allocated most" t_python_sites

# Python first: the failing line on stderr and at the top of the reports; interpreter-only
# native stacks folded into one line; how to get python_sites when they are off
t_python_first() {
    OOMGUARD_QUIET=0 shim adapter "$PYTHON" "$JOB" frag exp.json 2>err.txt || return 1
    local fail; fail=$(field exp.json 'd["lines"]["failing"]')
    grep -q "^oomguard: failing Python line: .*job.py:$fail in <module>$" err.txt || { echo "stderr:"; cat err.txt; return 1; }
    "$OOMGUARD_BIN" report dumps >report.txt 2>/dev/null || return 1
    head -n 20 report.txt >first.txt
    grep -q "=> at <module>  .*job.py:$fail  (Python)  <- the failing line" first.txt &&
        grep -q "run with OOMGUARD_PYTHON_STACKS=1 to list them" first.txt ||
        { echo "first screen:"; cat first.txt; return 1; }
    grep -q "cudaMalloc       Python code" report.txt && grep -q "Python code — see the Python lines" report.txt &&
        ! grep -q "__libc_start_call_main\|ffi_call" report.txt || { echo "report:"; sed -n '/Top allocation/,$p' report.txt; return 1; }
    "$OOMGUARD_BIN" report dumps -fhtml -o r.html 2>/dev/null || return 1
    "$PYTHON" - r.html "$fail" <<'PY' || return 1
import sys
h = open(sys.argv[1]).read()
py, chart, sites = h.index('id="python"'), h.index('id="chart"'), h.index('id="sites"')
assert py < chart < sites, (py, chart, sites)
assert 'job.py:%s in &lt;module&gt;</div>' % sys.argv[2] in h, "failing line"
assert 'id="python-hint"' in h and "OOMGUARD_PYTHON_STACKS=1" in h
assert "Python code \u2014 see the Python lines" in h and "__libc_start_call_main" not in h
PY
    # with the history on: the lines holding memory on the first screen, no hint
    rm -rf dumps && mkdir dumps
    OOMGUARD_PYTHON_STACKS=1 shim adapter "$PYTHON" "$JOB" frag exp.json 2>/dev/null || return 1
    local most; most=$(field exp.json 'd["lines"]["most"]')
    "$OOMGUARD_BIN" report dumps 2>/dev/null | head -n 20 >first.txt
    grep -A2 "Python lines holding the most live memory" first.txt | grep -q "job.py:$most in <module>" &&
        ! grep -q "OOMGUARD_PYTHON_STACKS" first.txt || { echo "first screen:"; cat first.txt; return 1; }
    "$OOMGUARD_BIN" report dumps -fhtml 2>/dev/null | grep -q '<table id="python-sites">' || { echo "no python-sites table"; return 1; }
}
t "Python first: failing line on stderr and on the first screen, interpreter stacks folded, the history hint" t_python_first
t_deepcopy_line() { # a failure inside copy.deepcopy: the program's line is the deepcopy call, not copy.py's
    OOMGUARD_QUIET=0 shim adapter "$PYTHON" "$JOB" deepcopy exp.json 2>err.txt || return 1
    local fail d; fail=$(field exp.json 'd["lines"]["failing"]'); d=$(ls dumps/oomguard-*.json | head -n 1)
    grep -q "^oomguard: failing Python line: .*job.py:$fail in <module>$" err.txt || { echo "stderr:"; cat err.txt; return 1; }
    expect "$d" 'any(f["file"].endswith("/copy.py") for f in d["event"]["python_stack"])' True &&
        expect "$d" 'd["memory"]["framework"]["roles"]["operation"]["name"]' copy || return 1
    "$OOMGUARD_BIN" report --color never "$d" > report.txt 2>/dev/null || return 1
    grep -q "=> at <module>  .*job.py:$fail  (Python)  <- the failing line" report.txt || { cat report.txt; return 1; }
}
t "a failure inside copy.deepcopy: the failing line on stderr and in the report is the program's deepcopy call" \
    t_deepcopy_line

t_jax_prealloc() {
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_jax.py" prealloc exp.json || return 1
    expect exp.json 'd["attached"]' exception || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework jax --internal --api xla.bfc_allocator --request exp --cap exp \
        --cap-source XLA_PYTHON_CLIENT_MEM_FRACTION --numbers jax --line failing \
        --primary framework_cap --remedy-mentions XLA_PYTHON_CLIENT_MEM_FRACTION
}
t "jax: RESOURCE_EXHAUSTED inside the preallocated arena: dump with request, bytes_limit, memory_stats" t_jax_prealloc

t_jax_units() {
    # jax 0.5 and later say the request in XLA's units (read on jax 0.11: "allocate 256.00MiB with allocator
    # GPU_0_bfc"): the dump carries that size, within the half percent its two decimals allow, and the cap is named
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto FAKE_JAX_VERSION=0.11.2 timeout 120 "$PYTHON" "$SC/job_jax.py" \
        prealloc exp.json > job.out 2>&1 || { cat job.out; return 1; }
    local dump want; dump=$(ls dumps/oomguard-*.json); want=$(field exp.json 'd["expected"]["request"]')
    grep -q "allocate [0-9.]*[KMG]iB with allocator" job.out || { echo "not the units text"; cat job.out; return 1; }
    expect "$dump" 'abs(d["event"]["requested_bytes"] - '"$want"') <= 0.005 * '"$want" True &&
    expect "$dump" 'd["diagnosis"]["primary"]' framework_cap
}
t "jax 0.11's text: the request from XLA's units (256.00MiB), the cap named" t_jax_units

t_jax_uncaught() {
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_jax.py" uncaught > a.out 2> a.err; local ra=$?
    shim env OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto OOMGUARD_DIR="$W/b" timeout 120 "$PYTHON" "$SC/job_jax.py" uncaught > b.out 2> b.err; local rb=$?
    [ $ra = 1 ] && [ $rb = 1 ] || { echo "exit $ra / $rb"; return 1; }
    [ "$(tail -n 1 a.err)" = "$(tail -n 1 b.err)" ] || { tail -n 1 a.err b.err; return 1; }
    [ -z "$(ls b/oomguard-*.json 2>/dev/null)" ] || { echo "a dump without the adapter?"; return 1; }
    expect "$(ls dumps/oomguard-*.json)" 'd["status"], d["memory"]["framework"]["framework"]' "oom jax"
}
t "jax: uncaught RESOURCE_EXHAUSTED: same traceback and exit status; the dump only with the adapter" t_jax_uncaught

t_jax_roles() {
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_jax.py" prealloc exp.json || return 1
    local dump; dump=$(ls dumps/oomguard-*.json)
    local live; live=$(field exp.json 'd["expected"]["live_bytes"]')
    # the live arrays are held by Python (the list keep names them); what they are for is unknown
    expect "$dump" '[d["memory"]["framework"]["roles"][k + "_bytes"] for k in ("parameters", "buffers", "gradients", "optimizer_state", "graph_pools")]' \
        '[None, None, None, None, None]' &&
    expect "$dump" 'd["memory"]["framework"]["roles"]["held_by_python_bytes"]' "$live" &&
    expect "$dump" '[(h["label"], h["bytes"]) for h in d["memory"]["framework"]["roles"]["holders"]]' \
        "[('keep (list, global in job_jax.py)', $live)]" &&
    expect "$dump" 'd["memory"]["framework"]["roles"]["activations_bytes"] == d["memory"]["framework"]["allocated_bytes"] - '"$live" True
}
t "jax: roles from jax.live_arrays(): held by Python = the live arrays, named; parameters and state unknown (null)" t_jax_roles

t_jax_frag() {
    # the arena in xla_extension.so, as in production: the failure the adapter reports through ctypes
    # (libffi, which holds nothing) is xla_extension.so's, the library that holds JAX's blocks
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_jax.py" frag \
        exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework jax --internal --request exp --numbers jax --line failing \
        --primary fragmentation --remedy-mentions XLA_PYTHON_CLIENT_ALLOCATOR=platform || return 1
    expect "$(ls dumps/oomguard-*.json)" 'd["event"]["library"]' xla_extension.so
}
t "jax: half the arena free in pieces smaller than the request: fragmentation from memory_stats" t_jax_frag

t_jax_platform() {
    shim env PYTHONPATH="$FJ" OOMGUARD_FRAMEWORK=auto XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 120 \
        "$PYTHON" "$SC/job_jax.py" platform exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework jax --driver --cap 0 --line failing --primary does_not_fit
}
t "jax: XLA_PYTHON_CLIENT_ALLOCATOR=platform: the driver failure's dump gets XLA's numbers, no cap" t_jax_platform

t_cupy_limit() {
    shim env PYTHONPATH="$FC" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_cupy.py" limit exp.json || return 1
    expect exp.json 'd["attached"]' exception || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework cupy --internal --api cupy.cuda.MemoryPool --request exp --cap exp \
        --cap-source 'set_limit(size=268435456)' --numbers cupy --line failing \
        --primary framework_cap --remedy-mentions set_limit || return 1
    # reported through ctypes (libffi, which holds nothing): the failing library is CuPy's pool's own
    expect "$(ls dumps/oomguard-*.json)" 'd["event"]["library"]' memory.so
}
t "cupy: pool limit (set_limit): dump with request and limit; the adapter never waits on the pool's lock" t_cupy_limit

t_cupy_env_limit() {
    shim env PYTHONPATH="$FC" OOMGUARD_FRAMEWORK=auto CUPY_GPU_MEMORY_LIMIT=200000000 timeout 120 \
        "$PYTHON" "$SC/job_cupy.py" uncaught > a.out 2> a.err; local ra=$?
    [ $ra = 1 ] || { echo "exit $ra"; cat a.err; return 1; }
    grep -q 'OutOfMemoryError' a.err || { cat a.err; return 1; }
    expect "$(ls dumps/oomguard-*.json)" 'd["memory"]["framework"]["cap_bytes"], d["memory"]["framework"]["cap_source"]' \
        "200000000 CUPY_GPU_MEMORY_LIMIT=200000000"
}
t "cupy: CUPY_GPU_MEMORY_LIMIT, error not caught: the dump is still written before exit" t_cupy_env_limit

t_cupy_driver() {
    shim env PYTHONPATH="$FC" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_cupy.py" driver exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework cupy --driver --cap 0 --numbers cupy --line failing
}
t "cupy: cudaMalloc fails after the pool freed its blocks: the driver failure's dump gets the pool's numbers" t_cupy_driver

t_tf_limit() {
    shim env PYTHONPATH="$ROOT/tests/adapter/fake_tf" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_tf.py" limit exp.json \
        || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --framework tensorflow --internal --api tensorflow.bfc_allocator --request exp \
        --cap exp --cap-source 'memory_limit=512' --line failing --primary framework_cap --remedy-mentions memory_limit || return 1
    expect "$(ls dumps/oomguard-*.json)" 'd["memory"]["framework"]["allocated_bytes"]' "$(field exp.json 'd["expected"]["current"]')" \
        || return 1
    # the adapter's report came through ctypes (libffi, which holds nothing): the failing library is TF's own
    expect "$(ls dumps/oomguard-*.json)" 'd["event"]["library"]' libtensorflow_framework.so.2 || return 1
    # TensorFlow publishes no arena size: the ledger counts the limit it took at its first use
    expect "$(ls dumps/oomguard-*.json)" '(d["memory"]["framework"]["reserved_bytes"], d["memory"]["framework"]["reserved_source"])' \
        "($(field exp.json 'd["expected"]["arena"]'), 'ledger')"
}
t "tensorflow: ResourceExhaustedError under a logical device's memory_limit: dump with request and cap" t_tf_limit

t_tf_arena() { # $1: arena (mapped whole at the first use) or growth (taken in regions)
    shim env PYTHONPATH="$ROOT/tests/adapter/fake_tf" OOMGUARD_FRAMEWORK=auto timeout 120 "$PYTHON" "$SC/job_tf.py" "$1" exp.json \
        || return 1
    local f; f=$(ls dumps/oomguard-*.json)
    # the arena as the ledger counted it, not the bytes in use TensorFlow's get_memory_info() tells; the rest of it
    # is the framework's cache
    expect "$f" '(d["memory"]["framework"]["reserved_bytes"], d["memory"]["framework"]["reserved_source"], d["memory"]["framework_cached_bytes"])' \
        "($(field exp.json 'd["expected"]["arena"]'), 'ledger', $(field exp.json 'd["expected"]["arena"] - d["expected"]["in_use"]'))" || return 1
    expect "$f" 'd["memory"]["framework"]["allocated_bytes"]' "$(field exp.json 'd["expected"]["in_use"]')" || return 1
    OOMGUARD_SYMBOLIZE=0 "$BDIR/oomguard" report "$f" --color never > rep.txt || return 1
    grep -q "TensorFlow publishes no reservation: oomguard counted it at the driver" rep.txt
}
t "tensorflow: the arena mapped at the first use is the reservation the ledger counts, its unused part the cache" t_tf_arena arena
t "tensorflow: with memory growth, the regions taken so far are the reservation the ledger counts" t_tf_arena growth

t_attributed_standins() { # the stand-in JAX, CuPy, TensorFlow allocate from their real counterparts' libraries,
    # by the entry points those call: XLA and TensorFlow the driver API (cuMemAlloc_v2), CuPy the runtime
    local d=$W/dumps; mkdir -p "$d/jax" "$d/cupy" "$d/tf"
    env -u OOMGUARD_FRAMEWORK LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$d/jax" OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FJ" \
        XLA_PYTHON_CLIENT_ALLOCATOR=platform timeout 120 "$PYTHON" "$SC/job_jax.py" platform j.json || return 1
    env -u OOMGUARD_FRAMEWORK LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$d/cupy" OOMGUARD_PYTHON_ADAPTER=0 PYTHONPATH="$FC" \
        timeout 120 "$PYTHON" "$SC/job_cupy.py" driver c.json || return 1
    # TensorFlow's arena refuses the request itself: the dump comes from the adapter's report
    env -u OOMGUARD_FRAMEWORK LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$d/tf" PYTHONPATH="$AD:$ROOT/tests/adapter/fake_tf" \
        timeout 120 "$PYTHON" "$SC/job_tf.py" limit t.json || return 1
    local libs='[(l["library"], l["framework_name"]) for l in d["memory"]["by_library"]]'
    expect "$(ls "$d"/jax/oomguard-*.json)" '[d["event"]["library"], d["framework"]["name"]]' "['xla_extension.so', 'jax']" &&
        expect "$(ls "$d"/jax/oomguard-*.json)" "$libs" "[('xla_extension.so', 'jax')]" &&
        expect "$(ls "$d"/cupy/oomguard-*.json)" '[d["event"]["library"], d["framework"]["name"]]' "['memory.so', 'cupy']" &&
        expect "$(ls "$d"/cupy/oomguard-*.json)" "$libs" "[('memory.so', 'cupy')]" &&
        expect "$(ls "$d"/tf/oomguard-*.json)" "$libs" "[('libtensorflow_framework.so.2', 'tensorflow')]" || return 1
    local apis='[d["event"]["api"], sorted(set(s["api"] for s in d["top_sites"]))]'
    expect "$(ls "$d"/jax/oomguard-*.json)" "$apis" "['cuMemAlloc_v2', ['cuMemAlloc_v2']]" &&
        expect "$(ls "$d"/cupy/oomguard-*.json)" "$apis" "['cudaMalloc', ['cudaMalloc']]" &&
        expect "$(ls "$d"/tf/oomguard-*.json)" "$apis" "['tensorflow.bfc_allocator', ['cuMemAlloc_v2']]"
}
t "the stand-in JAX, CuPy, TensorFlow allocate from xla_extension.so, cupy/cuda/memory.so, libtensorflow_framework.so.2" \
    t_attributed_standins

t_query_held() {
    shim "$PYTHON" "$SC/job_query.py" held exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --driver --line failing
}
t "query: a failing cudaMalloc on a thread holding the GIL gets the Python stack from the adapter's query" t_query_held

t_query_released() {
    shim timeout 60 "$PYTHON" "$SC/job_query.py" released exp.json || return 1
    "$PYTHON" "$CHECKFW" dumps exp.json --driver --unmeasured 'does not hold the Python GIL' || return 1
    expect "$(ls dumps/oomguard-*.json)" 'd["event"]["python_stack"]' '[]'
}
t "query: the GIL released around cudaMalloc (ctypes.CDLL): not asked, and the dump says why" t_query_released

t_named_in_process() {
    # a Python job's frames are named by the process itself, after the dump is on disk; the
    # interpreter's libraries have no debug files here, and the search for them stays on this
    # disk: libdw comes in, never the debuginfod client with its network and TLS libraries
    cat >job_named.py <<'PY'
import ctypes, glob, json, sys, time
lib = ctypes.PyDLL("libcudart.so.13")
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p(0)
assert lib.cudaMalloc(ctypes.byref(p), 64 << 30) == 2
for _ in range(200):
    d = json.load(open(glob.glob("dumps/oomguard-*.json")[0]))
    if any("function" in f for f in d["event"]["stack"]):
        break
    time.sleep(0.05)
f = d["event"]["stack"][0]
assert f["function"] == "cudaMalloc" and f["file"].endswith("runtime.c") and f["line"] > 0, f
maps = {l.split()[-1].rsplit("/", 1)[-1] for l in open("/proc/self/maps").read().splitlines()}
assert any(m.startswith("libdw") for m in maps), sorted(maps)
bad = sorted(m for m in maps if m.startswith(("libdebuginfod", "libcurl", "libssl", "libcrypto", "libgnutls")))
assert not bad, bad
PY
    shim "$PYTHON" job_named.py || return 1
    grep -q 'cudaMalloc  runtime.c:[0-9]* in libcudart' dumps/oomguard-*.txt || { echo "no name in the .txt twin"; return 1; }
}
t "named where written: a Python job's frames get function, file, line in the process; no debuginfod client loaded" t_named_in_process

# snap_job MODE STAND-INS: the snapshot job (scenarios/job_snapshot.py) with the stand-ins'
# directories on PYTHONPATH, in the background ($jp, its process $pid), its live page in
# $W/live, OUT.json written
FTF=$ROOT/tests/adapter/fake_tf
snap_job() {
    mkdir -p "$W/live"
    OOMGUARD_LIVE_DIR="$W/live" shim env PYTHONPATH="$AD:$2" OOMGUARD_FRAMEWORK=auto \
        "$PYTHON" "$SC/job_snapshot.py" "$1" exp.json &
    jp=$!
    local i
    for i in $(seq 300); do
        pid=$(field exp.json 'd["pid"]' 2>/dev/null) && ls "$W"/live/*/"$pid"-*.page >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "the job did not start"; kill "$jp" 2>/dev/null; return 1
}
snapshot() { OOMGUARD_LIVE_DIR="$W/live" "$ROOT/$B/oomguard" snapshot "$pid" >snap.out 2>&1 || { cat snap.out; kill "$jp"; return 1; }; }
# snap_numbers DUMP WHEN FRAMEWORK: memory.framework of the dump is FRAMEWORK's, with exactly the
# numbers the stand-in's own books gave at WHEN (exp.json: "now", or "reported": its last report)
snap_numbers() {
    "$PYTHON" - "$1" exp.json "$2" "$3" <<'PY'
import json, sys
fw = json.load(open(sys.argv[1]))["memory"]["framework"] or {}
want = json.load(open(sys.argv[2]))[sys.argv[3]]
keys = {"allocated": "allocated_bytes", "reserved": "reserved_bytes", "peak": "peak_bytes",
        "largest_free": "largest_free_block_bytes"}
got = {k: fw.get(keys[k]) for k in want}
if fw.get("framework") != sys.argv[4] or got != want:
    raise SystemExit("memory.framework: %s %s, want %s %s (%s)" % (fw.get("framework"), got, sys.argv[4], want, sys.argv[3]))
PY
}
# failure_kept FRAMEWORK: the failure that made the last report (none for PyTorch's) keeps its
# own dump, with its own numbers, whatever the snapshot asked since
failure_kept() {
    [ "$1" = pytorch ] && return 0
    local fail; fail=$(ls dumps/oomguard-*.json | grep -v -- -snapshot) || return 1
    expect "$fail" 'd["status"]' oom && snap_numbers "$fail" reported "$1"
}
t_snapshot_fresh() { # MODE STAND-IN FRAMEWORK
    # numbers that changed after the adapter's last report: the snapshot asks the interpreter
    # (a pending call, no signal) and carries the new ones
    snap_job "$1" "$2" || return 1
    snapshot || return 1
    touch exp.json.stop; wait "$jp" || return 1
    local dump; dump=$(ls dumps/*-snapshot.json) || return 1
    expect exp.json 'd["now"] != d["reported"]' True || return 1
    snap_numbers "$dump" now "$3" || return 1
    expect "$dump" '"framework_stale" in d["memory"]["unmeasured_ids"]' False || return 1
    failure_kept "$3"
}
t "snapshot: PyTorch's numbers asked afresh on the interpreter, not the last report's" t_snapshot_fresh fresh "$FT" pytorch
t "snapshot: JAX's memory_stats() asked afresh, not the last failure's" t_snapshot_fresh jax-fresh "$FJ" jax
t "snapshot: CuPy's pool asked afresh (from a helper thread), not the last failure's" t_snapshot_fresh cupy-fresh "$FC" cupy
t "snapshot: CuPy after cudaMalloc failed (still open): asked afresh; the failure's dump keeps its numbers" t_snapshot_fresh cupydriver-fresh "$FC" cupy
t "snapshot: TensorFlow's get_memory_info() asked afresh, not the last failure's" t_snapshot_fresh tf-fresh "$FTF" tensorflow
t_snapshot_old_tf() {
    FAKE_TF_VERSION=2.4.1 t_snapshot_fresh tf-fresh "$FTF" tensorflow || return 1
    expect "$(ls dumps/*-snapshot.json)" 'd["memory"]["framework"]["source"], d["memory"]["framework"]["peak_bytes"]' \
        "tensorflow 2.4.1 None"
}
t "snapshot: TensorFlow 2.4 (no get_memory_info): get_memory_usage() asked afresh" t_snapshot_old_tf

t_snapshot_blocked() { # MODE STAND-IN FRAMEWORK
    # the main thread in one long C call: the snapshot is still written, soon, with the last
    # report's numbers, and says how old they are and why
    snap_job "$1" "$2" || return 1
    local t0=$SECONDS
    snapshot || return 1
    local took=$((SECONDS - t0))
    wait "$jp" || return 1
    [ "$took" -le 4 ] || { echo "the snapshot took $took s"; return 1; }
    local dump; dump=$(ls dumps/*-snapshot.json) || return 1
    snap_numbers "$dump" reported "$3" || return 1
    expect "$dump" 'd["memory"]["unmeasured_ids"].count("framework_stale")' 1 || return 1
    expect "$dump" 'any(u.startswith("framework numbers: the adapter\x27s last report, ") and " s old: " in u for u in d["memory"]["unmeasured"])' True || return 1
    failure_kept "$3"
}
t "snapshot: the main thread blocked in C: written anyway with the last report's numbers, their age and why" t_snapshot_blocked blocked "$FT" pytorch
t "snapshot: JAX's job blocked in C: the last failure's numbers, their age and why" t_snapshot_blocked jax-blocked "$FJ" jax
t "snapshot: CuPy's job blocked in C: the last failure's numbers, their age and why" t_snapshot_blocked cupy-blocked "$FC" cupy
t "snapshot: TensorFlow's job blocked in C: the last failure's numbers, their age and why" t_snapshot_blocked tf-blocked "$FTF" tensorflow

t_snapshot_unused() {
    # JAX, CuPy and TensorFlow imported, never used: their refreshers are registered at the
    # import (not before) and asked, and none brings its framework's backend up or reports
    snap_job unused "$FJ:$FC:$FTF" || return 1
    snapshot || return 1
    touch exp.json.stop; wait "$jp" || return 1
    expect exp.json 'd["refreshers"], d["asked"]' '[0, 3] [0]' || return 1
    expect exp.json 'sorted(d["up"].items())' "[('cupy', False), ('jax', False), ('tensorflow', False)]" || return 1
    expect "$(ls dumps/*-snapshot.json)" 'd["memory"]["framework"]' None
}
t "snapshot: JAX, CuPy, TensorFlow imported but unused: refreshers asked, no backend brought up, nothing reported" t_snapshot_unused

t_standins_alone() {
    needs_no_tsan "loads the TSan-built simulated GPU into a Python without the TSan runtime (static TLS block)"
    # each stand-in imports with only its own directory on sys.path, also through a relative,
    # unnormalised path (as tests/scenarios' cases give it), and reaches the simulated GPU through
    # the shared helpers (fake_common), which are no top-level module of their own
    local pkg dir
    for pkg in torch jax cupy tensorflow; do
        case $pkg in tensorflow) dir=fake_tf ;; *) dir=fake_$pkg ;; esac
        for p in "$ROOT/tests/adapter/$dir" "$ROOT/tests/scenarios/../adapter/$dir"; do
            env -u PYTHONPATH PYTHONPATH="$p" "$PYTHON" -c '
import importlib, sys
pkg = importlib.import_module(sys.argv[1])
h = importlib.import_module(sys.argv[1] + "._fake_cuda")
assert h.device_count() == 1, h.device_count()
assert h.mem_get_info(0)[1] == 2560 << 20, h.mem_get_info(0)
assert "_fake_cuda" not in sys.modules
try:
    import _fake_cuda  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("_fake_cuda is importable on its own")
' $pkg || { echo "stand-in $pkg from $p"; return 1; }
        done
    done
}
t "the stand-ins import from their own directory alone; their shared helpers are not a top-level module" t_standins_alone

# --- the settings in force at the failure: training (an optimizer step ran), autocast

FW_MODES='[d["memory"]["framework"][k] for k in ("grad_enabled", "training", "autocast")]'
REMEDY_IDS='[r["id"] for r in d["remedies"]]'

t_train_before() {
    shim adapter "$PYTHON" "$JOB" train-before-step exp.json || return 1
    local dump; dump=$(ls dumps/oomguard-*.json)
    expect exp.json 'd["state"]["step_hooks"]' 1 &&
    expect "$dump" "$FW_MODES" '[True, None, False]' &&
    expect "$dump" "\"mixed_precision\" in $REMEDY_IDS" True
}
t "no optimizer step yet, autocast left again: training null, autocast false, mixed_precision offered" t_train_before

t_train_after() {
    shim adapter "$PYTHON" "$JOB" train-after-step exp.json || return 1
    local dump; dump=$(ls dumps/oomguard-*.json)
    expect "$dump" "$FW_MODES" '[True, True, True]' &&
    expect "$dump" "[i for i in $REMEDY_IDS if i in (\"mixed_precision\", \"inference_mode\")]" '[]' &&
    expect "$dump" "\"smaller_batch\" in $REMEDY_IDS" True || return 1
    "$OOMGUARD_BIN" report "$dump" > report.txt || return 1
    grep -q "at the failure: autograd on, training (optimizer steps ran), autocast (mixed precision) on" report.txt \
        || { echo "oomguard report:"; grep -A3 "allocator:" report.txt; return 1; }
}
t "after an AdamW step, inside torch.autocast(bf16): training and autocast true; no mixed_precision, no inference_mode" t_train_after

t_train_old_torch() {
    # torch 1.13: no global optimizer hook (training stays unknown), is_autocast_enabled() without
    # a device type (still read)
    shim adapter env FAKE_TORCH_VERSION=1.13.1 "$PYTHON" "$JOB" train-after-step exp.json || return 1
    expect exp.json 'd["state"]["step_hooks"]' 0 &&
    expect "$(ls dumps/oomguard-*.json)" "$FW_MODES" '[True, None, True]'
}
t "torch < 2.0 (no optimizer step hook, is_autocast_enabled() without device): training null, autocast read" t_train_old_torch

t_struct_sizes() {
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" struct-old old.json || return 1
    expect old.json 'd["struct_size"] < d["full_size"]' True || return 1
    mv dumps/oomguard-*.json old-dump.json; rm -f dumps/*
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" struct-new new.json || return 1
    # the old size: autocast is past its end and not read; the fields before it are
    expect old-dump.json "$FW_MODES" '[False, True, None]' &&
    expect "$(ls dumps/oomguard-*.json)" "$FW_MODES" '[False, True, True]' || return 1
    # freed_bytes_total: past the old struct's end, not read; covered and marked, read
    expect old-dump.json 'd["memory"]["framework"]["freed_bytes_total"]' None &&
    expect "$(ls dumps/oomguard-*.json)" 'd["memory"]["framework"]["freed_bytes_total"]' $((12345 << 20)) || return 1
    rm -f dumps/*
    # covered but not marked measured (a zeroed field of an adapter that cannot tell): unknown, not 0
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" struct-noflag nf.json || return 1
    expect "$(ls dumps/oomguard-*.json)" 'd["memory"]["framework"]["freed_bytes_total"]' None
}
t "a struct of the size before autocast was added is accepted; autocast only read when it is covered" t_struct_sizes

t_struct_request() {
    # a failure the framework's allocator refused, handed in without its size: the request is null (the
    # event's and the framework view's), no shortfall; the same 0 marked given is a request of 0 bytes
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" struct-norequest nr.json || return 1
    local D
    D=$(ls dumps/oomguard-*.json)
    expect "$D" '[d["event"]["framework_internal"], d["event"]["requested_bytes"], d["memory"]["framework"]["requested_bytes"], d["diagnosis"]["shortfall_bytes"]]' '[True, None, None, None]' || return 1
    rm -f dumps/*
    shim adapter env ADAPTER_DIR="$AD" "$PYTHON" "$JOB" struct-zero-request zr.json || return 1
    D=$(ls dumps/oomguard-*.json)
    expect "$D" '[d["event"]["requested_bytes"], d["memory"]["framework"]["requested_bytes"], d["diagnosis"]["shortfall_bytes"]]' '[0, 0, 0]'
}
t "an adapter's failure without its size has a null request; a 0 marked given is a request of 0 bytes" t_struct_request

t_bench_stacks() {
    needs_no_tsan "loads the TSan-built simulated GPU into a Python without the TSan runtime (static TLS block)"
    # the per-allocation cost of OOMGUARD_PYTHON_STACKS (docs/python-adapters.md): it runs, the
    # history records frames only when on, and it prints both figures
    PYTHONPATH="$FT" "$PYTHON" "$ROOT/tests/adapter/bench_python_stacks.py" 2000 20 > out || { cat out; return 1; }
    cat out
    grep -qE '^python_stacks off: [0-9.]+ us per allocation$' out &&
    grep -qE '^python_stacks cost: -?[0-9.]+ us per allocation' out
}
t "bench: OOMGUARD_PYTHON_STACKS cost per allocation is measured" t_bench_stacks

t_utf8_stack() {
    # the job in a directory named café: the Python stack's file names stay café, not cafÃ©
    mkdir -p "$W/café" && cp "$JOB" "$SC/jobkit.py" "$W/café/" || return 1
    shim adapter "$PYTHON" "$W/café/job.py" toobig exp.json || return 1
    local dump; dump=$(ls dumps/oomguard-*.json | head -n 1)
    expect "$dump" '[f["file"] for f in d["event"]["python_stack"] if f["file"].endswith("/café/job.py")] != []' True &&
    grep -q "café/job.py:" "${dump%.json}.txt" || { echo "the .txt lacks café/job.py:"; grep -n "job.py" "${dump%.json}.txt"; return 1; }
}
t "a Python stack in a directory named café: café in the JSON and the .txt" t_utf8_stack

# ---- the adapter could not load: the dump and one stderr line say so and why ------------------------
# missing_view WANT [STDERR_LINES]: the dump's memory.unmeasured names WANT; stderr has STDERR_LINES lines about it
missing_view() {
    local dump n
    dump=$(ls dumps/oomguard-*.json 2>/dev/null | head -n 1)
    [ -n "$dump" ] || { echo "no dump"; cat err; return 1; }
    expect "$dump" "[u for u in d['memory']['unmeasured'] if '$1' in u] != []" True || { cat err; return 1; }
    n=$(grep -c "python adapter" err)
    [ "$n" = "${2:-1}" ] || { echo "$n stderr lines about the adapter, want ${2:-1}:"; cat err; return 1; }
}
t_flag() { # t_flag FLAG WHY: the stand-in torch is put on sys.path by the program (-I and -E ignore PYTHONPATH)
    shim env -u OOMGUARD_QUIET PYTHONPATH="$FT" "$PYTHON" $1 -c 'import runpy, sys; sys.path[:0] = [sys.argv[1]]
sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name="__main__")' "$FT" "$JOB" oom-caught exp.json \
        >out 2>err; local rc=$?
    [ $rc = 3 ] || { echo "exit $rc, want 3"; cat err; return 1; }
    missing_view "python adapter: not loaded: $2"
}
t "python -I: the dump's memory.unmeasured and one stderr line say the adapter did not load, and why" t_flag -I "python -I"
t "python -E: the same, naming -E" t_flag -E "python -E"
t "python -S: the same, naming -S (no site, no sitecustomize)" t_flag -S "python -S"
t "python -sIB: flags grouped in one word are read" t_flag -sIB "python -I"
t_flag_control() {
    shim adapter env -u OOMGUARD_QUIET "$PYTHON" "$JOB" oom-caught exp.json >out 2>err; local rc=$?
    [ $rc = 3 ] || { echo "exit $rc"; cat err; return 1; }
    local dump; dump=$(ls dumps/oomguard-*.json | head -n 1)
    expect "$dump" '[u for u in d["memory"]["unmeasured"] if "python adapter" in u]' '[]' &&
    fail_if 'grep -q "python adapter" err' "a stderr line about the adapter: $(cat err)" &&
    expect "$dump" 'd["memory"].get("framework") is not None' True
}
t "the adapter loaded: no such entry and no such line" t_flag_control
t_layout() {
    # liboomguard.so alone in a directory: no python/ next to it, no ../adapters/python
    local pre="" p
    mkdir -p lone/lib
    for p in $PRELOAD; do
        case "$(basename "$p")" in liboomguard*) cp "$p" lone/lib/ && p=$W/lone/lib/$(basename "$p") ;; esac
        pre="$pre${pre:+ }$p"
    done
    LD_PRELOAD="$pre" OOMGUARD_DIR="$W/dumps" OOMGUARD_FRAMEWORK_LIBS="$FWLIB" env -u OOMGUARD_QUIET \
        PYTHONPATH="$FT" "$PYTHON" "$JOB" oom-caught exp.json >out 2>err
    [ $? = 3 ] || { echo "exit status"; cat err; return 1; }
    missing_view "no adapters directory next to liboomguard.so in $W/lone/lib"
}
t "a layout without the adapters directory: the dump and one stderr line say where it looked" t_layout
t_off() {
    shim noadapter env -u OOMGUARD_QUIET "$PYTHON" "$JOB" oom-caught exp.json >out 2>err
    [ $? = 3 ] || { echo "exit status"; cat err; return 1; }
    missing_view "OOMGUARD_PYTHON_ADAPTER=0" 0
}
t "OOMGUARD_PYTHON_ADAPTER=0: the dump says the view is off, stderr says nothing (it was asked for)" t_off

# --- what the memory is for (memory.framework.roles) and what the job was doing (event.phase)

ROLES_JOB=$SC/job_roles.py
CHECK_ROLES=$SC/check_roles.py
t_roles() { # t_roles MODE [check options]: the dump's roles and phase equal job_roles.py's truth
    local m=$1; shift
    shim adapter "$PYTHON" "$ROLES_JOB" "$m" truth.json || return 1
    "$PYTHON" "$CHECK_ROLES" dumps truth.json "$@"
}
t "roles: parameters, buffers, gradients, AdamW state, graph pool, held by Python (named), activations = the stand-in's blocks, to the byte; phase forward" \
    t_roles roles
t "roles: what the holders' names say (self.cache a cache), no copies, the model once, the statement key, allocated after the optimizer step" \
    t_roles roles --evidence
t_roles_site() { OOMGUARD_PYTHON_STACKS=1 t_roles roles --site "losses (list, global in job_roles.py)"; }
t "roles: the holder names the line that created its tensors (OOMGUARD_PYTHON_STACKS=1)" t_roles_site
t "phase forward: the innermost forward() frame decides; no optimizer step made yet is a measured 0" t_roles forward --steps 0
t_roles_placement() { SIMGPU_DEVICES=2 t_roles placement --placement; }
t "roles: a statement reading a model on cuda:1 fails on cuda:0: the model's GPU and name (statement_model_device)" \
    t_roles_placement
t "roles: what torch.load restored onto the GPU of a holder (no map_location), from its line; a load to the host adds nothing" \
    t_roles restored --restored
t "phase backward: the engine thread has no frame of the program; the thread that called backward() decides" t_roles backward
t_backward_line() { # the failing thread ran only the stand-in torch's engine: the failing line is the program's backward() call
    t_roles backward || return 1
    local line; line=$(field truth.json 'd["truth"]["site_line"]')
    "$BDIR/oomguard" report --color never dumps/oomguard-*.json > report.txt || return 1
    grep -E "=> at main .*job_roles.py:$line .*<- the failing line" report.txt || { cat report.txt; return 1; }
    grep -E "^Phase: backward \(job_roles.py:$line in main; decided in __init__.py:[0-9]+ in backward\)" report.txt ||
        { grep Phase report.txt; return 1; }
    "$BDIR/oomguard" report --format html dumps/oomguard-*.json > report.html || return 1
    grep -q "job_roles.py:$line</code> in <code>main</code> decided in <code>" report.html
}
t "phase backward: the report's failing line and phase line are the program's backward() call, the framework's frame as evidence" \
    t_backward_line
t_backward_summary() { # the stderr summary says the same when the error ends the job
    printf '%s\n' 'import torch' 'w = torch.nn.Parameter(torch.empty(1100 << 20))' 'out = torch.empty(1 << 20)' \
        'out._params = (w,)' 'out.backward()' > bw.py
    OOMGUARD_QUIET=0 shim adapter "$PYTHON" bw.py 2> err.txt && return 1
    grep -E "^oomguard: failing Python line: .*/bw.py:5 in <module>$" err.txt &&
        grep -E "^oomguard: phase: backward \(bw.py:5 in <module>\)$" err.txt || { cat err.txt; return 1; }
}
t "phase backward: the stderr summary's failing line and phase line are the program's backward() call" t_backward_summary
t_failing_layer() { # the pass fails in the fourth of six like blocks a model keeps under keys 0..5 (a ModuleList)
    cat > layers.py <<'PY'
import sys
import torch


class Block(torch.nn.Module):
    def __init__(self, i, grow):
        torch.nn.Module.__init__(self)
        self.i = i
        self.weight = torch.nn.Parameter(torch.empty((1 << 20) << (i if grow else 0)))

    def forward(self, x):
        return torch.empty((2000 << 20) if self.i == 3 else (1 << 20))


class Model(torch.nn.Module):
    def __init__(self, grow):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Module()
        for i in range(6):
            setattr(self.blocks, str(i), Block(i, grow))

    def forward(self, x):
        for i in range(6):
            x = getattr(self.blocks, str(i))(x)
        return x


keep = torch.empty(100 << 20)
Model(sys.argv[1] == "grow")(keep)
PY
    shim adapter "$PYTHON" layers.py same 2>/dev/null && return 1
    local d; d=$(ls dumps/oomguard-*.json) || return 1
    expect "$d" 'd["memory"]["framework"]["roles"]["failing_layer"]' "{'run': 'blocks', 'index': 3, 'count': 6, 'alike': True}" &&
        "$BDIR/oomguard" report --color never "$d" | grep -q "failing layer: layer 4 of 6 in blocks$" || return 1
    rm -f dumps/oomguard-*.json
    # blocks whose weights double with depth (a U-Net's encoder): the run is not of one size
    shim adapter "$PYTHON" layers.py grow 2>/dev/null && return 1
    d=$(ls dumps/oomguard-*.json) || return 1
    expect "$d" 'd["memory"]["framework"]["roles"]["failing_layer"]["alike"]' "False" &&
        "$BDIR/oomguard" report --color never "$d" | grep -q "failing layer: layer 4 of 6 in blocks (its layers differ in size"
}
t "roles: the layer the pass failed in, the fourth of six like blocks under keys 0..5, in the dump and the report; blocks of growing size are not alike" \
    t_failing_layer
t_output_history() { # a cell displayed a training-mode output: IPython's Out keeps it and its graph alive
    cat > history.py <<'PY'
import torch


class Net(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(1 << 20))

    def forward(self, n, more=0):
        act = torch.empty(n)
        act._params = (self.weight,)
        if more:
            torch.empty(more)              # the next layer's input, beside what this one saved
        out = torch.empty(8 << 20)
        out._params = (self.weight,)
        out._saved = act
        return out


model = Net()
torch.optim.AdamW(model.parameters())
Out = {5: model(600 << 20)}          # the display hook's history: cell [5] ended with model(xb)
_5 = None
model(300 << 20, 1400 << 20)         # the training cell's forward
PY
    shim adapter "$PYTHON" history.py 2>/dev/null && return 1
    local d; d=$(ls dumps/oomguard-*.json) || return 1
    expect "$d" '[h["purpose"] for h in d["memory"]["framework"]["roles"]["holders"] if h["name"] == "Out"]' \
        "['output_history']" &&
        expect "$d" 'd["remedies"][0]["id"]' "release_references" &&
        expect "$d" '"kept_graphs_lead" in d["remedies"][0]["ranking"]["rows"]' "True"
}
t "roles: IPython's output history (Out) keeping a cell's output and its graph is the holder to release" t_output_history
t_own_child_run() { # a child this process started through multiprocessing, named by its starter, holds the card
    cat > child.py <<'PY'
import json, multiprocessing, os, time
import torch


def work(ready):
    kept = torch.empty(1200 << 20)      # what a dask worker's RMM pool takes on the card
    ready.put(1)
    time.sleep(60)


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Queue()
    w = ctx.Process(target=work, args=(ready,), name=os.environ.get("CHILD_NAME", "Dask Worker process (from Nanny)"),
                    daemon=True)
    w.start()
    ready.get(timeout=60)
    json.dump({"pid": w.pid}, open("child.json", "w"))
    try:
        torch.empty(600 << 20)
    except torch.OutOfMemoryError:
        pass
    w.terminate()
    w.join()
PY
    SIMGPU_STATE_DIR="$W/simgpu" shim adapter "$PYTHON" child.py
}
t_own_child() {
    t_own_child_run || return 1
    local pid; pid=$(field child.json 'd["pid"]') || return 1
    local f; f=$(ls dumps/oomguard-*.json | head -n 1)
    expect "$f" 'd["memory"]["framework"]["roles"]["child_processes"]' \
        "[{'pid': $pid, 'name': 'Dask Worker process (from Nanny)'}]" &&
        expect "$f" 'd["diagnosis"]["causes"][0]["id"]' peer_ranks &&
        expect "$f" 'd["diagnosis"]["causes"][0]["evidence"]["own_children"]' 1 &&
        expect "$f" 'd["remedies"][0]["id"]' foreign_processes &&
        expect "$f" '[r["id"] for r in d["remedies"] if r["id"] in ("cuda_out_of_workers", "restart_process")]' '[]' &&
        expect "$f" 'any("kill" in h for r in d["remedies"] for h in r.get("how", []))' False
}
t "a child this process started through multiprocessing under its starter's name (a dask worker): listed, the job's own work to close, no DataLoader advice, no kill line" \
    t_own_child
t_own_child_secret() { # a name the program chose is shown as the credential forms allow (redaction_forms.tsv)
    CHILD_NAME="upload hf_Ab3dEf6hIj9kLm2nOp5qRs8tUv" t_own_child_run || return 1
    local f; f=$(ls dumps/oomguard-*.json | head -n 1)
    expect "$f" 'd["memory"]["framework"]["roles"]["child_processes"][0]["name"]' "upload <redacted>" &&
        fail_if "grep -q Ab3dEf6hIj9kLm2nOp5qRs8tUv dumps/*" "the token is in a dump"
}
t "a child's name that holds a credential's shape is redacted in the dump" t_own_child_secret
t_backward_code() { # what the program's code says is read on the thread that called backward(), not the engine's
    printf '%s\n' 'import torch' 'w = torch.nn.Parameter(torch.empty(1100 << 20))' 'def step(batch_size):' \
        '    with torch.autocast("cuda", dtype=torch.float16):' '        out = torch.empty(1 << 20)' \
        '    out._params = (w,)' '    out.backward()' 'step(6)' > bwc.py
    shim adapter "$PYTHON" bwc.py 2> err.txt && return 1
    local d; d=$(ls dumps/oomguard-*.json | head -1)
    expect "$d" 'd["event"]["phase"]' backward &&
        expect "$d" 'd["memory"]["framework"]["roles"]["autocast_in_code"]' True &&
        expect "$d" 'd["memory"]["framework"]["roles"]["batch_size"]' 6 &&
        expect "$d" 'd["memory"]["framework"]["autocast"]' False
}
t "phase backward: autocast around the program's forward and its batch are read on the thread that called backward()" \
    t_backward_code
t_scaler_code() { # a GradScaler and no autocast anywhere in the program: not mixed precision entered
    printf '%s\n' 'import torch' 'w = torch.nn.Parameter(torch.empty(1100 << 20))' 'def step():' \
        '    scaler = torch.cuda.amp.GradScaler()' '    out = torch.empty(1 << 20)' \
        '    out._params = (w,)' '    scaler.scale(out).backward()' 'step()' > sc.py
    shim adapter "$PYTHON" sc.py 2> err.txt && return 1
    local d; d=$(ls dumps/oomguard-*.json | head -1)
    expect "$d" 'd["memory"]["framework"]["roles"]["scaler_without_autocast"]' True &&
        expect "$d" 'd["memory"]["framework"]["roles"]["autocast_in_code"]' None
}
t "mixed precision half applied: a GradScaler, autocast named nowhere in the program (roles.scaler_without_autocast)" \
    t_scaler_code
t "phase optimizer_step: AdamW making its state at the first step (a bare frozen parameter counted as a parameter); steps 0" \
    t_roles step --steps 0
t "phase loading: torch.load restoring onto the GPU" t_roles load
t "phase oom_handler: a retry inside the except block of an earlier OOM; phase_frame is the handler's line" t_roles handler
t_locals_drop() { # a local the roles scan read is freed when the function deletes it
    shim adapter "$PYTHON" "$SC/job_locals.py" drop out.json || return 1
    expect "$(ls dumps/oomguard-*.json | head -n 1)" 'd["memory"]["framework"]["roles"]["complete"]' True &&
    expect out.json 'd["held"] - d["base"]' $((256 << 20)) &&
    expect out.json 'd["after"] == d["base"]' True
}
t "roles: a local the scan read is not kept alive by it once the function deletes it (256 MiB freed)" t_locals_drop
t_pass_freed() { # the failed pass's frames (and tensors) go with the except block: no cycle left by the scan
    shim adapter "$PYTHON" "$SC/job_locals.py" pass out.json || return 1
    expect "$(ls dumps/oomguard-*.json | head -n 1)" 'd["memory"]["framework"]["roles"]["complete"]' True &&
    expect out.json 'd["after"] == d["base"]' True
}
t "roles: a failed pass's tensors are freed when its except block ends, the collector off (no cycle through the frames)" \
    t_pass_freed
t_locals_own() { # the program's own locals() dict is left whole
    shim adapter "$PYTHON" "$SC/job_locals.py" own out.json || return 1
    expect out.json 'd["own_kept"]' True
}
t "roles: the program's own locals() dict is left as it was" t_locals_own
t_roles_pre21() { FAKE_TORCH_SNAPSHOT=1.13 OOMGUARD_PYTHON_STACKS=1 t_roles roles --site "losses (list, global in job_roles.py)"; }
t "roles and the holder's line from a PyTorch 1.13-2.0 snapshot (blocks without address or frames)" t_roles_pre21
t_roles_off() { OOMGUARD_ROLES_BUDGET_MS=0 t_roles roles --no-roles; }
t "roles off with OOMGUARD_ROLES_BUDGET_MS=0 (null), phase still there" t_roles_off
t_roles_budget() { JOB_BALLAST=1500000 OOMGUARD_ROLES_BUDGET_MS=1 t_roles roles --incomplete; }
t "roles past their time budget (1 ms, 1.5M objects): complete false, activations unknown (null), why given" t_roles_budget

t_roles_render() {
    # the text and HTML reports and the stderr summary lead with the phase and the roles table
    OOMGUARD_QUIET=0 shim adapter "$PYTHON" "$ROLES_JOB" roles-uncaught truth.json > out 2> err
    local dump; dump=$(ls dumps/oomguard-*.json | head -n 1)
    [ -n "$dump" ] || { echo "no dump"; cat err; return 1; }
    grep '^oomguard' err | sed -n 2p | grep -q '^oomguard: phase: forward (job_roles.py:[0-9]* in forward)$' &&
    grep '^oomguard' err | sed -n 3p | grep -q '^oomguard: memory by role: parameters 64.00 MiB, buffers 2.00 MiB, gradients 64.00 MiB, optimizer state 128.00 MiB, CUDA-graph pools 6.00 MiB, held by Python objects 22.00 MiB (self.cache (dict on Trainer) 16.00 MiB), activations and temporaries' \
        || { echo "stderr:"; cat err; return 1; }
    "$ROOT/$B/oomguard" report "$dump" > report.txt || return 1
    local roles where
    roles=$(grep -n '^What the allocated memory is for (' report.txt | cut -d: -f1)
    where=$(grep -n '^Where the memory is' report.txt | cut -d: -f1)
    [ -n "$roles" ] && [ -n "$where" ] && [ "$roles" -lt "$where" ] || { echo "roles at '$roles', where at '$where'"; cat report.txt; return 1; }
    grep -qE '^  optimizer state +128.00 MiB' report.txt && grep -qE '^    AdamW 128.00 MiB' report.txt &&
    grep -qE '^ +16.00 MiB  self.cache \(dict on Trainer\)' report.txt || { cat report.txt; return 1; }
    "$ROOT/$B/oomguard" report "$dump" --format html -o report.html || return 1
    "$PYTHON" - report.html <<'PY'
import sys
h = open(sys.argv[1]).read()
r, k = h.find('id="roles"'), h.find('class="kpis"')
assert 0 < r < k, (r, k)
assert "self.cache (dict on Trainer)" in h and "Phase: forward" in h
PY
}
t "roles and phase lead the text and HTML reports and the stderr summary" t_roles_render

t_phase_c() {
    # a C program has no Python stack: the phase is unknown, never guessed from block sizes
    shim "$ROOT/$B/examples/too_big" > /dev/null 2>&1
    local dump; dump=$(ls dumps/oomguard-*.json | head -n 1)
    [ -n "$dump" ] || { echo "no dump"; return 1; }
    expect "$dump" '[d["event"]["phase"], d["event"]["phase_frame"], d["event"]["phase_source"]]' "[None, None, 'no Python stack']"
}
t "phase of a C program: null, phase_source 'no Python stack'" t_phase_c

echo "${pass} passed, ${fail} failed$([ $skip != 0 ] && echo ", ${skip} skipped")"
[ $fail = 0 ]
