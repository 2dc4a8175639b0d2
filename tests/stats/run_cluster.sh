#!/usr/bin/env bash
# tests/stats/run_cluster.sh — the recipes of docs/clusters.md on the simulated GPU:
# two jobs, each over two simulated hosts (own hostname via a UTS namespace, own GPUs,
# own GPU model) with two ranks per host, all writing into one dump directory per job
# on "shared storage"; then `oomguard merge` per job and `oomguard stats` across jobs.
#   job tr-7f3e, torchrun-style, ranks under `oomguard run`: rank 0 recovers, rank 3 fails
#   job 4242, srun-style, plain LD_PRELOAD + OOMGUARD_DIR: ranks 1 and 2 fail
# Ends with "N passed, N failed[, N skipped]".
set -u
B=${B:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
case $B in /*) BD=$B ;; *) BD=$root/$B ;; esac
OG=$BD/oomguard
PROG=$BD/tests/stats_rank_job
SHIM=$BD/liboomguard.so
PRELOAD=$SHIM
[ "${SANITIZE:-}" = 1 ] && PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $SHIM"
# TSan's runtime must be the first library too (docs/testing.md)
[ "${SANITIZE:-}" = thread ] && PRELOAD="$(${CC:-cc} -print-file-name=libtsan.so) $SHIM"
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
work=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-cluster.XXXXXX")
trap 'rm -rf "$work"' EXIT
shared=$work/shared/oom
mkdir -p "$shared" "$work/state-a" "$work/state-b"
export LD_LIBRARY_PATH="$BD/sim" SIMGPU_DEVICES=2 SIMGPU_MEM=8GiB OOMGUARD_SUMMARY=1 OOMGUARD_QUIET=1
unset OOMGUARD_DIR LD_PRELOAD RANK LOCAL_RANK WORLD_SIZE TORCHELASTIC_RUN_ID SLURM_PROCID SLURM_LOCALID SLURM_NTASKS SLURM_JOB_ID
MODEL_A="NVIDIA A100-SXM4-80GB" MODEL_B="NVIDIA H100 80GB HBM3"
pass=0 fail=0 skip=0
result() { if [ "$1" = 0 ]; then pass=$((pass + 1)); echo "PASS  $2"; else fail=$((fail + 1)); echo "FAIL  $2"; fi; }

if ! bash "$root/tests/stats/launch.sh" torchrun --host og-probe --nproc 1 -- true 2>"$work/probe.err"; then
    echo "SKIP  cluster recipes: $(cat "$work/probe.err")"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi

# node HOST STATE MODEL STYLE NODE_RANK JOB -- CMD...: one node of a two-node job, in the background
node() {
    local host=$1 state=$2 model=$3 style=$4 nr=$5 job=$6
    shift 7
    SIMGPU_STATE_DIR=$state SIMGPU_NAME=$model bash "$root/tests/stats/launch.sh" "$style" --host "$host" \
        --node-rank "$nr" --nnodes 2 --nproc 2 --job "$job" -- "$@" >"$work/$job-$host.log" 2>&1
}

# torchrun --nnodes 2 --nproc-per-node 2 oomguard run --dir $SHARED/$JOB -- train
jobdir=$shared/tr-7f3e
node simhost-a "$work/state-a" "$MODEL_A" torchrun 0 tr-7f3e -- "$OG" run --dir "$jobdir" -- "$PROG" 3 0 &
a=$!
node simhost-b "$work/state-b" "$MODEL_B" torchrun 1 tr-7f3e -- "$OG" run --dir "$jobdir" -- "$PROG" 3 0 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
result $([ "$ra $rb" = "0 1" ]; echo $?) "torchrun-style job: node exit statuses ($ra $rb, want 0 1)"

# srun --export=ALL,LD_PRELOAD=...,OOMGUARD_DIR=$SHARED/$SLURM_JOB_ID train
jobdir2=$shared/4242
mkdir -p "$jobdir2"
node simhost-a "$work/state-a" "$MODEL_A" srun 0 4242 -- env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$jobdir2" "$PROG" 1,2 - &
a=$!
node simhost-b "$work/state-b" "$MODEL_B" srun 1 4242 -- env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$jobdir2" "$PROG" 1,2 - &
b=$!
wait $a; ra=$?
wait $b; rb=$?
result $([ "$ra $rb" = "1 1" ]; echo $?) "srun-style job: node exit statuses ($ra $rb, want 1 1)"

for j in tr-7f3e 4242; do
    n=$(ls "$shared/$j"/oomguard-*-rank*.json 2>/dev/null | wc -l)
    result $([ "$n" = 4 ]; echo $?) "job $j: one dump per rank in the shared directory ($n of 4)"
    na=$(ls "$shared/$j"/oomguard-simhost-a-*.json 2>/dev/null | wc -l)
    nb=$(ls "$shared/$j"/oomguard-simhost-b-*.json 2>/dev/null | wc -l)
    result $([ "$na $nb" = "2 2" ]; echo $?) "job $j: dumps named by host, two per host ($na $nb)"
done

# oomguard merge per job
for j in tr-7f3e 4242; do
    "$OG" merge "$shared/$j" --format json -o "$work/merge-$j.json" >"$work/merge-$j.err" 2>&1
    result $? "oomguard merge $j exits 0"
done
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
want = {"tr-7f3e": ["recovered", "exit", "exit", "oom"], "4242": ["exit", "oom", "oom", "exit"]}
for job, statuses in want.items():
    m = json.load(open("%s/merge-%s.json" % (w, job)))
    assert len(m["jobs"]) == 1, (job, len(m["jobs"]))
    j = m["jobs"][0]
    assert j["job_id"] == job, j["job_id"]
    ranks = {r["rank"]: r for r in j["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3], (job, sorted(ranks))
    assert [ranks[r]["status"] for r in range(4)] == statuses, (job, [ranks[r]["status"] for r in range(4)])
    assert [ranks[r]["host"] for r in range(4)] == ["simhost-a"] * 2 + ["simhost-b"] * 2, job
    assert [ranks[r]["device"] for r in range(4)] == [0, 1, 0, 1], job
    if job == "tr-7f3e":
        assert j["first_failure"]["rank"] == 3 and j["first_failure"]["host"] == "simhost-b", j["first_failure"]
    else:
        assert j["first_failure"]["rank"] in (1, 2), j["first_failure"]
print("merge per job ok")
PY
result $? "merge per job: ranks, statuses, hosts, GPUs and the first failure"

# oomguard stats across jobs
"$OG" stats "$shared" --format json -o "$work/stats.json" 2>"$work/stats.err"
result $? "oomguard stats over the shared directory exits 0"
python3 - "$work/stats.json" "$MODEL_A" "$MODEL_B" <<'PY'
import json, sys
s, ma, mb = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
def sub(d, keys):
    return {k: d.get(k) for k in keys}
K = ["dumps", "oom", "recovered", "warning", "exit"]
assert s["dumps"] == 8 and s["skipped"] == 0, (s["dumps"], s["skipped"])
assert sub(s["by_status"], K[1:]) == {"oom": 3, "recovered": 1, "warning": 0, "exit": 4}, s["by_status"]
assert sum(s["by_cause"].values()) == 3, s["by_cause"]
assert set(s["by_job"]) == {"tr-7f3e", "4242"}, list(s["by_job"])
assert sub(s["by_job"]["tr-7f3e"], K + ["hosts"]) == dict(dumps=4, oom=1, recovered=1, warning=0, exit=2, hosts=2), s["by_job"]["tr-7f3e"]
assert sub(s["by_job"]["4242"], K + ["hosts"]) == dict(dumps=4, oom=2, recovered=0, warning=0, exit=2, hosts=2), s["by_job"]["4242"]
assert set(s["by_host"]) == {"simhost-a", "simhost-b"}, list(s["by_host"])
assert sub(s["by_host"]["simhost-a"], K + ["jobs"]) == dict(dumps=4, oom=1, recovered=1, warning=0, exit=2, jobs=2), s["by_host"]["simhost-a"]
assert sub(s["by_host"]["simhost-b"], K + ["jobs"]) == dict(dumps=4, oom=2, recovered=0, warning=0, exit=2, jobs=2), s["by_host"]["simhost-b"]
assert set(s["by_gpu_model"]) == {ma, mb}, list(s["by_gpu_model"])
assert sub(s["by_gpu_model"][ma], K) == dict(dumps=4, oom=1, recovered=1, warning=0, exit=2), s["by_gpu_model"][ma]
assert sub(s["by_gpu_model"][mb], K) == dict(dumps=4, oom=2, recovered=0, warning=0, exit=2), s["by_gpu_model"][mb]
print("stats across jobs ok")
PY
result $? "stats across jobs: exact counts by status, job, host and GPU model"
python3 "$root/tests/stats/oracle.py" "$work/stats.json" "$shared" >"$work/oracle.log" 2>&1
result $? "stats across jobs: causes and first remedies agree with the dumps themselves"
"$OG" stats "$shared" --format prometheus -o "$work/oom.prom" && python3 "$root/tests/stats/check_prom.py" "$work/oom.prom" >"$work/prom.log" 2>&1
result $? "prometheus output of the cluster passes the format check"
oom_b=$(awk '/^oomguard_dumps_total\{status="oom",.*host="simhost-b"/ {s += $NF} END {print s + 0}' "$work/oom.prom")
result $([ "$oom_b" = 2 ]; echo $?) "prometheus: oomguard_dumps_total for oom on simhost-b sums to 2 ($oom_b)"
python3 - "$shared/4242" <<'PY'
import glob, json, sys
nodes = {json.load(open(f))["node"] for f in glob.glob(sys.argv[1] + "/oomguard-*.json")}
assert nodes == {"simhost-a", "simhost-b"}, nodes
PY
result $? "srun-style job: each dump records its node (SLURMD_NODENAME)"

# Kubernetes: pods are hosts that come and go, nodes stay.  Three pods of one job (host name = pod
# name, NODE_NAME from the downward API) on two nodes, each failing, one after the other.
k8s=$work/k8s/oom
mkdir -p "$k8s"
for pod in "llama-ft-0 node-a" "llama-ft-1 node-b" "llama-ft-2 node-a"; do
    set -- $pod
    SIMGPU_STATE_DIR=$work/state-a bash "$root/tests/stats/launch.sh" torchrun --host "$1" --nproc 1 --job llama-ft -- \
        env NODE_NAME="$2" LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$k8s" "$PROG" 0 - >"$work/pod-$1.log" 2>&1
    sleep 0.05
done
"$OG" stats "$k8s" --format json -o "$work/k8s.json" 2>"$work/k8s-stats.err" &&
    "$OG" stats "$k8s" --format prometheus -o "$work/k8s.prom" 2>>"$work/k8s-stats.err"
result $? "kubernetes pods: oomguard stats exits 0"
python3 - "$k8s" "$work/k8s.json" "$work/k8s.prom" <<'PY'
import glob, json, re, sys
dumps = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/oomguard-*.json")]
assert sorted((d["host"], d["node"]) for d in dumps) == [("llama-ft-0", "node-a"), ("llama-ft-1", "node-b"),
                                                         ("llama-ft-2", "node-a")], [(d["host"], d["node"]) for d in dumps]
s, prom = json.load(open(sys.argv[2])), open(sys.argv[3]).read()
assert set(s["by_host"]) == {"node-a", "node-b"}, list(s["by_host"])
assert s["by_host"]["node-a"]["oom"] == 2 and s["by_host"]["node-b"]["oom"] == 1, s["by_host"]
assert s["by_host"]["node-a"]["last_failure_pod"] == "llama-ft-2", s["by_host"]["node-a"]
counters = re.findall(r"^oomguard_dumps_total\{(.*)\} \d+$", prom, re.M)
assert counters and all("llama" not in c for c in counters), counters
assert {re.search(r'host="([^"]*)"', c).group(1) for c in counters} == {"node-a", "node-b"}, counters
info = re.findall(r"^oomguard_last_failure_pod_info\{(.*)\} 1$", prom, re.M)
assert sorted(info) == ['host="node-a",pod="llama-ft-2"', 'host="node-b",pod="llama-ft-1"'], info
print("pods ok")
PY
result $? "kubernetes pods: the node is the host label, the latest pod one series per node"
python3 "$root/tests/stats/check_prom.py" "$work/k8s.prom" >"$work/k8s-prom.log" 2>&1
result $? "kubernetes pods: prometheus output passes the format check"

if [ $fail != 0 ]; then
    for f in "$work"/*.log "$work"/*.err; do echo "--- $f"; tail -5 "$f"; done
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
