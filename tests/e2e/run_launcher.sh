#!/usr/bin/env bash
# A 4-rank job over 2 simulated GPUs under `oomguard run`, like torchrun would start it:
# rank 2 fails first; `oomguard merge` must name it and show every rank.
# Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init job
mkdir -p "$work/dumps" "$work/state"
export LD_LIBRARY_PATH="$root/$B/sim" SIMGPU_DEVICES=2 SIMGPU_MEM=8GiB SIMGPU_STATE_DIR="$work/state"
export WORLD_SIZE=4 TORCHELASTIC_RUN_ID=job42 OOMGUARD_SUMMARY=1 OOMGUARD_QUIET=1

pids=()
for r in 0 1 2 3; do
    RANK=$r LOCAL_RANK=$r "$root/$B/oomguard" run --dir "$work/dumps" -- "$root/$B/tests/e2e_rank" \
        >"$work/rank$r.log" 2>&1 &
    pids+=($!)
done
codes=()
for p in "${pids[@]}"; do wait "$p"; codes+=($?); done
result $([ "${codes[*]}" = "3 0 3 0" ]; echo $?) "exit statuses passed through by oomguard run (${codes[*]})"
n=$(ls "$work"/dumps/oomguard-*-rank*.json 2>/dev/null | wc -l)
result $([ "$n" = 4 ]; echo $?) "one dump per rank, named with the rank ($n)"

"$root/$B/oomguard" merge "$work/dumps" >"$work/merge.txt" 2>&1
rc=$?
result $rc "oomguard merge exits 0"
grep -q "Failed first: rank 2" "$work/merge.txt"
result $? "merge names rank 2 as the first failure"
"$root/$B/oomguard" merge "$work/dumps" --format json -o "$work/merge.json" >/dev/null 2>&1
python3 - "$work/merge.json" "$work/dumps" <<'PY'
import glob, json, sys
m = json.load(open(sys.argv[1]))["jobs"][0]
dumps = {json.load(open(f))["rank"]: json.load(open(f)) for f in glob.glob(sys.argv[2] + "/*.json")}
assert m["first_failure"]["rank"] == 2, m["first_failure"]
ranks = {r["rank"]: r for r in m["ranks"]}
assert sorted(ranks) == [0, 1, 2, 3], sorted(ranks)
assert [ranks[r]["status"] for r in range(4)] == ["oom", "exit", "oom", "exit"], [ranks[r]["status"] for r in range(4)]
for r in range(4):
    d = dumps[r]
    assert d["job_id"] == "job42" and d["world_size"] == 4
    assert d["device"]["index"] == r % 2, (r, d["device"]["index"])
# rank 2's GPU (device 0) also holds rank 0's context: the other ranks on a GPU are found
# each rank printed its own pid: the dumps carry those pids, and rank 0's is among the others
import os, re
logs = os.path.dirname(sys.argv[2])
pid = {r: int(re.search(r"pid (\d+)", open(f"{logs}/rank{r}.log").read()).group(1)) for r in range(4)}
assert all(dumps[r]["pid"] == pid[r] for r in range(4)), ({r: dumps[r]["pid"] for r in range(4)}, pid)
others = [p["pid"] for p in dumps[2]["memory"]["other_processes"]]
assert pid[0] in others and pid[2] not in others, (others, pid)
assert any(c["rank"] == 2 for c in m["foreign_contexts"]), m["foreign_contexts"]
print("merge table and contexts ok")
PY
result $? "merge JSON: the table per rank, statuses, device, job id, other ranks' contexts"

# The same ranks started by the program's own spawn (multiprocessing: one parent, each child with arguments of its
# own, only RANK, WORLD_SIZE and MASTER_* set, no launcher's run id): the other ranks are still this job
mkdir -p "$work/spawn" "$work/spawn_state"
pids=()
for r in 0 1 2 3; do
    env -u TORCHELASTIC_RUN_ID RANK=$r LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
        SIMGPU_STATE_DIR="$work/spawn_state" OOMGUARD_DIR="$work/spawn" LD_PRELOAD="$root/$B/liboomguard.so" \
        "$root/$B/tests/e2e_rank" --multiprocessing-fork "pipe_handle=$((10 + r))" >"$work/spawn$r.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
python3 - "$work" <<'PY'
import glob, json, re, sys
w = sys.argv[1]
pid = {r: int(re.search(r"pid (\d+)", open(f"{w}/spawn{r}.log").read()).group(1)) for r in range(4)}
d = [json.load(open(f)) for f in glob.glob(w + "/spawn/*.json") if json.load(open(f))["rank"] == 2][0]
o = {p["pid"]: p for p in d["memory"]["other_processes"]}
assert pid[0] in o and o[pid[0]]["rank"] == 0 and o[pid[0]]["same_job"], o
assert d["diagnosis"]["primary"] != "foreign_memory", d["diagnosis"]["primary"]
print("spawned ranks ok")
PY
result $? "ranks a program spawns itself (arguments of their own, one parent): the others are this job"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
