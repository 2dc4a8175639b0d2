#!/usr/bin/env bash
# Real-driver robustness end to end on the simulated GPU:
# NVML process lists as each driver generation writes them, more processes than fit,
# pools that give memory back at synchronisation, unreadable pools, many pools, CUDA
# arrays, contexts that go away, a driver in another namespace, the exit summary while the
# driver still works, program errors that are not failures, huge requests, the history
# size.  Every check compares with the simulator's truth.  Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init drv
prog="$root/$B/tests/e2e_drv"
tool="$root/$B/oomguard"
export LD_LIBRARY_PATH="$root/$B/sim" SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB" OOMGUARD_QUIET=1
# scenario NAME MODE [VAR=VALUE...]: runs the program with the shim in its own dump dir
scenario() {
    local name=$1 mode=$2; shift 2
    local d="$work/$name"; mkdir -p "$d"
    out=$(env "$@" OOMGUARD_DIR="$d" LD_PRELOAD="$PRELOAD" "$prog" "$mode" 2>&1); rc=$?
    dir=$d
}
dump() { ls "$dir"/oomguard-*.json 2>/dev/null | head -n 1; }

# ---- the NVML process list, whatever the driver's entry size ----------------
others="0:4242:trainer:3GiB;0:777:notebook:1GiB"
for gen in r580 r535 r525 legacy16; do
    scenario "nvml-$gen" oom SIMGPU_NVML_GENERATION=$gen SIMGPU_OTHER_PROCS="$others"
    py=$(python3 - "$(dump)" "$gen" "$out" <<'PY' 2>&1
import json, re, sys
d = json.load(open(sys.argv[1])); gen = sys.argv[2]
used = int(re.search(r"truth dev=0 used=(\d+)", sys.argv[3]).group(1))
m = d["memory"]
assert m["process_used_bytes"] == used, ("process_used", m["process_used_bytes"], used)
assert m["other_processes_bytes"] == 4 << 30, m["other_processes_bytes"]
pids = sorted(o["pid"] for o in m["other_processes"])
assert pids == [777, 4242], pids
assert sorted(o["bytes"] for o in m["other_processes"]) == [1 << 30, 3 << 30]
q = m["nvml_process_query"]
want = {"r580": "nvmlDeviceGetRunningProcessDetailList", "r535": "32-byte", "r525": "24-byte",
        "legacy16": "16-byte"}[gen]
assert want in q, q
PY
)
    result $([ $rc = 0 ] && [ -z "$py" ]; echo $?) "NVML $gen: own and other processes read exactly ($gen)" "$out$py"
done

# ---- more processes than the first buffer holds ------------------------------
# their pids lie just under Linux's largest (PID_MAX_LIMIT, 4194304; the shim reads none above it as a pid), far
# from the machine's own: with a small pid_max (32768) pids wrap, and a listed pid that is this process's own, or
# its parent's, is rightly not counted as another process
many=""; sum=0
for i in $(seq 1 64); do many="$many${many:+;}0:$((4190000 + i)):p$i:10MiB"; sum=$((sum + 10485760)); done
# 64 other processes and this one: more than the first buffer of 64
sum=$((64 * 10485760))
for gen in r580 r535; do
    scenario "many-$gen" oom SIMGPU_NVML_GENERATION=$gen SIMGPU_OTHER_PROCS="$many"
    py=$(python3 - "$(dump)" "$sum" "$out" <<'PY' 2>&1
import json, re, sys
d = json.load(open(sys.argv[1])); m = d["memory"]
used = int(re.search(r"truth dev=0 used=(\d+)", sys.argv[3]).group(1))
assert m["other_processes_bytes"] == int(sys.argv[2]), (m["other_processes_bytes"], sys.argv[2])
assert m["process_used_bytes"] == used, (m["process_used_bytes"], used)
assert all(4190000 < o["pid"] <= 4190070 for o in m["other_processes"]), [o["pid"] for o in m["other_processes"]]
PY
)
    result $([ $rc = 0 ] && [ -z "$py" ]; echo $?) "NVML $gen: 65 processes, INSUFFICIENT_SIZE retried, no unfilled entry read" "$out$py"
done

# ---- pools ---------------------------------------------------------------------
scenario pools pools OOMGUARD_LIMIT=1:4GiB
result $rc "pools give memory back at stream/event/device synchronisation; a limit sees it" "$out"
scenario manypools manypools
result $rc "300 pools, all counted (no cap at 256)" "$out"
scenario unreadable unreadable SIMGPU_POOL_ATTRS=unreadable
py=$(python3 - "$(dump)" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
assert any("pool" in u and "handed out" in u for u in d["memory"]["unmeasured"]), d["memory"]["unmeasured"]
PY
)
result $([ $rc = 0 ] && [ -z "$py" ]; echo $?) "unreadable pool reservation: what it handed out is counted, and the dump says so" "$out$py"

# ---- arrays, contexts ----------------------------------------------------------
scenario arrays arrays
result $rc "CUDA arrays (driver and runtime, 2D/3D/mipmapped) in the ledger, exactly" "$out"
scenario ctx ctx
result $rc "cuCtxDestroy and a primary context released to zero drop their blocks" "$out"
scenario graph graph SIMGPU_GRAPH_MEM=0:1GiB
result $rc "graph memory (cuDeviceGetGraphMemAttribute) counted, and released by cuDeviceGraphMemTrim" "$out"
scenario ipc ipc
py=$(python3 - "$(dump)" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1])); m = d["memory"]
assert m["ipc_mapped_bytes"] == 256 << 20, m["ipc_mapped_bytes"]
assert m["process_tracked_bytes"] == 0, m["process_tracked_bytes"]
assert all(l["bytes"] == 0 or "e2e_drv" not in l["library"] for l in m["by_library"]), m["by_library"]
PY
)
result $([ $rc = 0 ] && [ -z "$py" ]; echo $?) "IPC-imported memory: mapped, not allocated by the importing process" "$out$py"

# ---- look-ups, namespaces, exit --------------------------------------------------
scenario lookups lookups OOMGUARD_LIMIT=0:8GiB
result $rc "no dlopen or driver look-up inside an allocation (limit, failure and dump included)" "$out"
scenario dlmopen dlmopen
if printf '%s\n' "$out" | grep -q "^skipped:"; then
    skip=$((skip + 1)); echo "SKIP  a driver dlmopen'ed in another namespace ($(printf '%s\n' "$out" | grep '^skipped:'))"
else
    result $rc "a driver dlmopen'ed in another namespace is not redirected" "$out"
fi
# NVIDIA's runtime (and the simulated one) dlopen()s the driver: loaded after the shim, its
# destructor runs before the shim's, so the summary must be taken earlier, at exit()
cat >"$work/summary.c" <<'C'
#include <cuda_runtime_api.h>
int main(void) {
    void *p; cudaSetDevice(0);
    cudaMalloc(&p, 2ull << 30); cudaFree(p); cudaMalloc(&p, 1ull << 30);
    return 0;
}
C
cc -I"${CUDA_HOME:-/usr/local/cuda}/include" "$work/summary.c" -o "$work/summary_prog" -L"$root/$B/sim" -lcudart
mkdir -p "$work/summary"; dir="$work/summary"
out=$(env OOMGUARD_SUMMARY=1 OOMGUARD_DIR="$dir" LD_PRELOAD="$PRELOAD" "$work/summary_prog" 2>&1); rc=$?
py=$(python3 - "$(dump)" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["status"] == "exit", d["status"]
assert d["device"]["name"], "device name missing: the driver was not asked"
assert d["device"]["total_bytes"] == 24 << 30, d["device"]["total_bytes"]
PY
)
bad=$(printf '%s\n' "$out" | grep -c "after libcuda's exit teardown")
result $([ $rc = 0 ] && [ -z "$py" ] && [ "$bad" = 0 ] && printf '%s\n' "$out" | grep -q "summary: device 0 peak"; echo $?) \
    "exit summary and dump from atexit: no driver call after the driver's exit teardown" "$out$py"

# ---- only out-of-memory is a failure -------------------------------------------
scenario inval inval
n=$(ls "$dir" | grep -c json)
result $([ $rc = 0 ] && [ "$n" = 0 ]; echo $?) "CUDA_ERROR_INVALID_VALUE is not a failure: no dump, no count" "$out"

# ---- requests of 2^53 bytes and more --------------------------------------------
scenario huge huge OOMGUARD_MAX_DUMPS=10
py=$(python3 - "$dir" <<'PY' 2>&1
import glob, json, re, sys
reqs = set()
for f in glob.glob(sys.argv[1] + "/oomguard-*.json"):
    reqs.add(int(re.search(r'"requested_bytes":(\d+)', open(f).read()).group(1)))
assert reqs & {2**53, 2**64 - 1}, reqs
PY
)
txt=$(cat "$dir"/oomguard-*.txt 2>/dev/null)
zero=$(printf '%s\n' "$txt" | grep -c " 0 B requested\|of 0 B ")
result $([ $rc = 0 ] && [ -z "$py" ] && [ "$zero" = 0 ] && printf '%s\n' "$txt" | grep -q "18446744073709551615 bytes"; echo $?) \
    "requests of 2^53 and SIZE_MAX: exact integers in the dump's JSON and text" "$out$py$(printf '%s\n' "$txt" | head -5)"

# ---- OOMGUARD_HISTORY events per process ------------------------------------------
scenario history history OOMGUARD_HISTORY=100
py=$(python3 - "$(dump)" <<'PY' 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["history"]["events"]
assert len(ev) == 100, len(ev)
assert ev[-1]["op"] == "fail", ev[-1]
PY
)
result $([ $rc = 0 ] && [ -z "$py" ]; echo $?) "OOMGUARD_HISTORY=100 keeps 100 events for a single thread" "$out$py"

echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
