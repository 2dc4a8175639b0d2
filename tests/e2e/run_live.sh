#!/usr/bin/env bash
# `oomguard top` and `oomguard snapshot` against three simulated jobs sharing one simulated GPU
# (one growing, one near its OOMGUARD_LIMIT, one plain) and a process without oomguard: the
# numbers are the simulator's truth within one refresh, in --once json/text/prometheus and in
# the live view (tmux: send-keys, capture-pane), a framework's library marked and the numbers
# its job reported shown, every kind of memory apart, rising and falling; a snapshot writes a dump that matches the truth and the job goes on
# unharmed; the pages are private (0700 directory, 0600 files, random names) and their directory
# and files cannot be spoofed; a killed job's page is removed.  Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init live
OG="$root/$B/oomguard"
JOB="$root/$B/tests/e2e_live_job"
ctl="$work/ctl" live="$work/live" dumps="$work/dumps"
mkdir -p "$ctl" "$live" "$dumps" "$work/state"
export LD_LIBRARY_PATH="$root/$B/sim" SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB SIMGPU_STATE_DIR="$work/state"
export OOMGUARD_LIVE_DIR="$live" OOMGUARD_DIR="$dumps" OOMGUARD_QUIET=1
unset SIMGPU_FAIL_PROB SIMGPU_FAIL_NTH

wait_for() {   # wait_for SECONDS CMD...: until CMD succeeds
    local end=$((SECONDS + $1)); shift
    until "$@"; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}
truth() { cat "$ctl/$1.truth" 2>/dev/null; }
field() { truth "$1" | awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }

# the growing job's own code stands for a framework's allocator (OOMGUARD_FRAMEWORK_LIBS), and it
# reports that framework's numbers as an adapter does; it is rank 1 of job42 (a launcher's variables)
env LD_PRELOAD="$PRELOAD" OOMGUARD_FRAMEWORK_LIBS=e2e_live_job LIVE_JOB_FRAMEWORK=simfw \
    RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=job42 "$JOB" grow "$ctl" >"$work/grow.log" 2>&1 &
gpid=$!
env LD_PRELOAD="$PRELOAD" OOMGUARD_LIMIT=3GiB OOMGUARD_WARN_AT=2GiB "$JOB" limit "$ctl" >"$work/limit.log" 2>&1 &
lpid=$!
env LD_PRELOAD="$PRELOAD" "$JOB" plain "$ctl" >"$work/plain.log" 2>&1 &
ppid_=$!
mkdir -p "$work/bare"
env -u LD_PRELOAD "$JOB" plain "$work/bare" >"$work/bare.log" 2>&1 &
bpid=$!
wait_for 20 test -s "$ctl/limit.truth" -a -s "$ctl/plain.truth" -a -s "$ctl/grow.truth" -a -s "$work/bare/plain.truth"
result $? "four jobs up (grow, limit, plain; one without oomguard)"

touch "$ctl/grow.go.1"
wait_for 10 grep -q "step 1" "$ctl/grow.truth"
sleep 0.6   # published at 256 MiB at least once: the next step is a rise
touch "$ctl/grow.go.2"
wait_for 10 grep -q "step 2" "$ctl/grow.truth"
sleep 1.3   # one refresh of the pages (250 ms) and of top (1 s) at most

# --- the pages: one per process (from its first tracked call), private, under a name no other user can guess
udir="$live/oomguard-live-$(id -u)"
pages_ok() {
    [ "$(stat -c '%a %u %F' "$udir")" = "700 $(id -u) directory" ] || { echo "directory: $(stat -c '%a %u %F' "$udir")"; return 1; }
    local p names=""
    for p in $gpid $lpid $ppid_; do
        set -- "$udir"/$p-*.page
        [ $# = 1 ] && [ -f "$1" ] && [ ! -L "$1" ] || { echo "pid $p: pages $*"; return 1; }
        [ "$(stat -c '%a %u' "$1")" = "600 $(id -u)" ] || { echo "$1: $(stat -c '%a %u' "$1")"; return 1; }
        basename "$1" | grep -qE "^$p-[0-9a-f]{16}\.page\$" || { echo "name $1"; return 1; }
        names="$names ${1##*/$p-}"
    done
    ! ls "$udir"/$bpid-*.page >/dev/null 2>&1 || { echo "a page for the job without oomguard"; return 1; }
    # 64 random bits each: three alike would be a fixed name
    [ "$(printf '%s\n' $names | sort -u | wc -l)" = 3 ] || { echo "names:$names"; return 1; }
}
wait_for 5 pages_ok >/dev/null
pages_ok >"$work/pages.log" 2>&1
result $? "pages: directory 0700 of the user, one regular file per job, mode 0600, <pid>-<64 random bits>.page" \
    "$(cat "$work/pages.log"; ls -la "$udir")"

# --- --once --format json: every number against the truth -----------------------------------
"$OG" top --once --format json >"$work/top.json" 2>"$work/top.err"
result $? "top --once --format json exits 0" "$(cat "$work/top.err")"
python3 - "$work/top.json" "$ctl" "$work/bare" "$gpid" "$lpid" "$ppid_" "$bpid" <<'PY'
import json, sys
top = json.load(open(sys.argv[1]))
ctl, bare = sys.argv[2], sys.argv[3]
gpid, lpid, ppid, bpid = map(int, sys.argv[4:8])
def truth(d, m):
    w = open(f"{d}/{m}.truth").read().split()
    return {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
assert len(top["gpus"]) == 1, top["gpus"]
g = top["gpus"][0]
procs = {p["pid"]: p for p in g["processes"]}
for pid, mode, d in ((gpid, "grow", ctl), (lpid, "limit", ctl), (ppid, "plain", ctl)):
    t, p = truth(d, mode), procs[pid]
    assert p["source"] == "oomguard", p
    assert p["tracked_bytes"] == t["tracked"], (mode, p["tracked_bytes"], t)
    assert p["nvml_used_bytes"] == t["used"], (mode, p["nvml_used_bytes"], t)
    assert p["by_kind"]["plain"] == t["tracked"], (mode, p["by_kind"])
    assert sum(l["bytes"] for l in p["libraries"]) + p["other_library_bytes"] == t["tracked"], (mode, p["libraries"])
    assert p["libraries"][0]["library"] == "e2e_live_job", p["libraries"]
    assert p["peak_bytes"] >= t["tracked"] and p["peak_time"], p
    # the limit job's 512 MiB was refused by OOMGUARD_LIMIT: a failure the driver never saw
    assert p["failures"] == t["failed"] + (mode == "limit"), (mode, p["failures"], t)
t = truth(ctl, "grow")
assert t["step"] == 2 and t["tracked"] == 512 << 20, t
# the framework's own numbers, as the job last reported them; its library marked a framework's
fw = procs[gpid]["framework"]
assert fw and fw["name"] == "simfw" and fw["reported"] > 0, fw
assert fw["allocated_bytes"] == t["fw_allocated"] and fw["reserved_bytes"] == t["fw_reserved"], (fw, t)
assert procs[gpid]["libraries"][0]["framework"] is True, procs[gpid]["libraries"]
for pid in (lpid, ppid):
    assert procs[pid]["framework"] is None and procs[pid]["libraries"][0]["framework"] is False, procs[pid]
# who it is: rank and job from the launcher's variables, the command line
g_ = procs[gpid]
assert (g_["rank"], g_["job"]) == (1, "job42") and g_["command"].endswith("e2e_live_job grow " + ctl), g_
assert procs[ppid]["rank"] is None and procs[ppid]["job"] == "" and procs[ppid]["command"].endswith(" plain " + ctl), procs[ppid]
assert procs[gpid]["rate_bytes_per_s"] > 0, procs[gpid]        # rising
lim = procs[lpid]
assert lim["limit_bytes"] == 3 << 30 and lim["warn_at_bytes"] == 2 << 30, lim
assert lim["failures"] == 1 and lim["warnings"] == 1, lim      # the refused 512 MiB; 2 GiB crossed
assert lim["headroom_bytes"] == (3 << 30) - truth(ctl, "limit")["tracked"], lim
assert procs[ppid]["limit_bytes"] is None and procs[ppid]["headroom_bytes"] == g["free_bytes"], procs[ppid]
b = procs[bpid]
assert b["source"] == "nvml" and b["nvml_used_bytes"] == truth(bare, "plain")["used"], b
assert "tracked_bytes" not in b, b
assert g["used_bytes"] == sum(truth(d, m)["used"] for d, m in ((ctl, "grow"), (ctl, "limit"), (ctl, "plain"), (bare, "plain"))), g
print("top json ok")
PY
result $? "json: tracked, by kind, by library (framework marked), NVML used, limit, warning, failures, headroom, the framework's own numbers equal the truth; rank, job, command" "$(cat "$work/top.json")"

# the growing job grows: one more step shows within one refresh
touch "$ctl/grow.go.3"
wait_for 10 grep -q "step 3" "$ctl/grow.truth"
sleep 1.3
"$OG" top --once --format json --filter e2e_live_job >"$work/top2.json"
python3 -c '
import json, sys
p = {p["pid"]: p for p in json.load(open(sys.argv[1]))["gpus"][0]["processes"]}[int(sys.argv[2])]
assert p["tracked_bytes"] == 768 << 20 and p["peak_bytes"] == 768 << 20, p
assert p["rate_bytes_per_s"] > 0
assert p["framework"]["allocated_bytes"] == 384 << 20 and p["framework"]["reserved_bytes"] == 768 << 20, p
' "$work/top2.json" "$gpid"
result $? "a step of the growing job shows within one refresh (768 MiB, its framework's numbers too), rising"

# --- text, 80 columns ------------------------------------------------------------------------
"$OG" top --once >"$work/top.txt"
awk 'length($0) > 80 { bad = 1 } END { exit bad }' "$work/top.txt"
result $? "text: no line over 80 columns" "$(cat "$work/top.txt")"
grep -qE "^ +$gpid +1 job42 +768M " "$work/top.txt" && grep -qE "^~ +$bpid " "$work/top.txt" &&
    grep -qE "limit 3.00G +warn 2.00G" "$work/top.txt" && grep -q "e2e_live_job 1.19G" "$work/top.txt"
result $? "text: the jobs' rows (rank, job), the one without oomguard marked ~, limit and warning level, libraries" "$(cat "$work/top.txt")"
grep -qE "^ +e2e_live_job\* 768M" "$work/top.txt" && grep -qE "^ +simfw: allocated 384M reserved 768M \(" "$work/top.txt"
result $? "text: a framework's library marked *, the framework's own numbers and their age" "$(cat "$work/top.txt")"
"$OG" top --once --format text >"$work/top_fmt.txt" && [ "$(wc -l <"$work/top_fmt.txt")" = "$(wc -l <"$work/top.txt")" ] &&
    grep -qE "^ +$gpid .* 768M " "$work/top_fmt.txt"
result $? "--format text: the same view as the default --once" "$(cat "$work/top_fmt.txt")"

# --- prometheus ------------------------------------------------------------------------------
"$OG" top --once --format prometheus --top-libs 1 -o "$work/top.prom"
python3 "$root/tests/stats/check_prom.py" "$work/top.prom" >"$work/prom.log" 2>&1
result $? "prometheus: passes the exposition-format validator" "$(cat "$work/prom.log")"
python3 - "$work/top.prom" "$ctl" "$gpid" "$lpid" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def truth(m):
    w = open(f"{sys.argv[2]}/{m}.truth").read().split()
    return {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
gpid, lpid = sys.argv[3], sys.argv[4]
series = re.findall(r'^oomguard_device_bytes\{([^}]*)\} (\d+)$', text, re.M)
mine = [(l, int(v)) for l, v in series if f'pid="{gpid}"' in l]
assert len(mine) == 2 and any('library="other"' in l for l, _ in mine), mine       # top 1 + other
assert any('library="e2e_live_job"' in l and 'framework="1"' in l for l, _ in mine), mine
assert sum(v for _, v in mine) == truth("grow")["tracked"], mine
assert re.search(rf'^oomguard_device_tracked_bytes\{{[^}}]*pid="{lpid}"[^}}]*\}} {truth("limit")["tracked"]}$', text, re.M)
assert re.search(rf'^oomguard_device_limit_bytes\{{[^}}]*pid="{lpid}"[^}}]*\}} {3 << 30}$', text, re.M)
assert re.search(r'^oomguard_device_headroom_bytes\{', text, re.M) and re.search(r'^oomguard_gpu_free_bytes\{gpu="0"\} \d+$', text, re.M)
assert re.search(r'^oomguard_process_nvml_bytes\{', text, re.M)
print("prometheus ok")
PY
result $? "prometheus: per-process gauges by library (top N + other), tracked, limit, headroom, GPU totals"

# --- the live view in tmux -------------------------------------------------------------------
if command -v tmux >/dev/null; then
    sock="oomguard-live-$$"
    T() { tmux -L "$sock" "$@"; }
    T new-session -d -s top -x 80 -y 40 \
        "env LD_LIBRARY_PATH='$LD_LIBRARY_PATH' OOMGUARD_LIVE_DIR='$live' '$OG' top -d 0.5; echo TOP-EXIT=\$?; sleep 30"
    pane() { T capture-pane -p -t top; }
    wait_for 10 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -qE '^ +$gpid .* 768M '"
    result $? "tmux: the live view shows the growing job at the truth (768 MiB)" "$(pane)"
    touch "$ctl/grow.go.4"
    wait_for 10 grep -q "step 4" "$ctl/grow.truth"
    wait_for 2 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -qE '^ +$gpid .*1.00G '"
    result $? "tmux: its next step (1 GiB) within one refresh" "$(pane)"
    pane | awk 'length($0) > 80 { bad = 1 } END { exit bad }'
    result $? "tmux: fits 80 columns"
    pane | grep -qE "^ +$lpid .* 1/1 "
    result $? "tmux: the job at its limit shows its failure and its warning (F/W 1/1)" "$(pane)"
    # a job that starts and exits: shown, then gone within one refresh
    mkdir -p "$work/short"
    env LD_PRELOAD="$PRELOAD" "$JOB" plain "$work/short" >"$work/short.log" 2>&1 &
    spid=$!
    wait_for 10 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -qE '^ +$spid '"
    result $? "tmux: a job that starts appears" "$(pane)"
    touch "$work/short/stop"; wait $spid
    wait_for 2 sh -c "! tmux -L '$sock' capture-pane -p -t top | grep -qE '^[ ~]+$spid '"
    result $? "tmux: ... and is gone within one refresh after it exits" "$(pane)"
    T send-keys -t top s
    wait_for 3 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -q 'sort peak'"
    result $? "tmux: s changes the sort key" "$(pane)"
    T send-keys -t top / p l a i n Enter
    wait_for 3 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -q 'filter plain' && ! tmux -L '$sock' capture-pane -p -t top | grep -qE '^ +$gpid '"
    result $? "tmux: / filters (the growing job is hidden by 'plain')" "$(pane)"
    T send-keys -t top q
    wait_for 5 sh -c "tmux -L '$sock' capture-pane -p -t top | grep -q 'TOP-EXIT=0'"
    result $? "tmux: q quits, status 0, terminal restored" "$(pane)"
    T kill-server 2>/dev/null
else
    echo "SKIP  tmux not installed"; skip=$((skip + 1))
fi

# --- snapshot --------------------------------------------------------------------------------
"$OG" snapshot "$ppid_" >"$work/snap.out" 2>&1
rc=$?
result $rc "snapshot PID exits 0" "$(cat "$work/snap.out")"
snap=$(awk '{print $2}' "$work/snap.out")
python3 - "$snap" "$ctl" "$ppid_" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
w = open(f"{sys.argv[2]}/plain.truth").read().split()
t = {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
assert d["status"] == "snapshot" and d["pid"] == int(sys.argv[3]), (d["status"], d["pid"])
m = d["memory"]
assert m["process_tracked_bytes"] == t["tracked"], (m["process_tracked_bytes"], t)
assert m["process_used_bytes"] == t["used"], (m["process_used_bytes"], t)
assert sum(l["bytes"] for l in m["by_library"]) == t["tracked"], m["by_library"]
assert d["diagnosis"]["primary"] == "snapshot", d["diagnosis"]
assert d["diagnosis"]["causes"][0]["evidence"]["tracked_bytes"] == t["tracked"], d["diagnosis"]["causes"][0]
print("snapshot dump ok")
PY
result $? "snapshot: the dump's numbers are the truth; status and diagnosis 'snapshot'" "$(cat "$snap" 2>/dev/null | head -c 3000)"
"$OG" report "$snap" >"$work/snap.txt" 2>&1
result $? "snapshot: oomguard report reads it" "$(cat "$work/snap.txt")"
"$OG" snapshot "$bpid" >"$work/snap_bare.out" 2>&1
[ $? = 2 ] && grep -q "not running under oomguard" "$work/snap_bare.out"
result $? "snapshot of a process without oomguard: refused, exit 2" "$(cat "$work/snap_bare.out")"
"$OG" snapshot --all >"$work/snap_all.out" 2>&1
[ $? = 0 ] && [ "$(wc -l <"$work/snap_all.out")" = 3 ]
result $? "snapshot --all: one dump per job under oomguard" "$(cat "$work/snap_all.out")"
python3 - "$work/snap_all.out" "$ctl" "$gpid" "$lpid" "$ppid_" <<'PY'
import json, sys
ctl = sys.argv[2]
modes = dict(zip(map(int, sys.argv[3:6]), ("grow", "limit", "plain")))
seen = set()
for line in open(sys.argv[1]):
    pid, path = line.split()
    d = json.load(open(path))
    mode = modes[int(pid)]
    w = open(f"{ctl}/{mode}.truth").read().split()
    t = {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
    assert d["status"] == "snapshot" and d["pid"] == int(pid), (mode, d["status"], d["pid"])
    assert d["memory"]["process_tracked_bytes"] == t["tracked"], (mode, d["memory"]["process_tracked_bytes"], t)
    if mode == "grow":   # the framework's view, as the job last reported it
        fw = d["memory"]["framework"]
        assert fw["allocated_bytes"] == t["fw_allocated"] and fw["reserved_bytes"] == t["fw_reserved"], (fw, t)
    seen.add(mode)
assert seen == {"grow", "limit", "plain"}, seen
print("snapshot --all ok")
PY
result $? "snapshot --all: each dump is its job's, at the truth (the growing job's framework numbers too)" \
    "$(cat "$work/snap_all.out")"
# the jobs go on after their snapshots: the growing one takes one more step, seen at the truth
touch "$ctl/grow.go.5"
wait_for 10 grep -q "step 5" "$ctl/grow.truth"
sleep 1.3
"$OG" top --once --format json >"$work/top_after.json"
python3 -c '
import json, sys
p = {p["pid"]: p for p in json.load(open(sys.argv[1]))["gpus"][0]["processes"]}[int(sys.argv[2])]
w = open(sys.argv[3]).read().split()
t = {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
assert t["tracked"] == 1280 << 20 and p["tracked_bytes"] == t["tracked"] and p["failures"] == 0, (p, t)
' "$work/top_after.json" "$gpid" "$ctl/grow.truth"
result $? "after the snapshots the growing job allocates on, counted at the truth (1.25 GiB)" "$(cat "$work/top_after.json")"
# ... and frees: falling, in json and text (the trend is measured over the last ~4 s)
touch "$ctl/grow.shrink"
wait_for 10 grep -q "step 6" "$ctl/grow.truth"
sleep 1.3
"$OG" top --once --format json >"$work/top_fall.json"
"$OG" top --once >"$work/top_fall.txt"
python3 -c '
import json, sys
p = {p["pid"]: p for p in json.load(open(sys.argv[1]))["gpus"][0]["processes"]}[int(sys.argv[2])]
w = open(sys.argv[3]).read().split()
t = {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
assert t["tracked"] == 768 << 20 and p["tracked_bytes"] == t["tracked"], (p, t)
assert p["rate_bytes_per_s"] < 0 and p["peak_bytes"] == 1280 << 20, p
' "$work/top_fall.json" "$gpid" "$ctl/grow.truth" && grep -qE "^ +$gpid .* 768M +1.25G +-[0-9.]+[MG]/s " "$work/top_fall.txt"
result $? "a job that frees shows falling (negative trend), its peak kept" "$(cat "$work/top_fall.txt" "$work/top_fall.json")"

nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && nobody test -x "$OG" 2>/dev/null; then
    nobody env OOMGUARD_LIVE_DIR="$live" "$OG" snapshot "$ppid_" >"$work/snap_other.out" 2>&1
    [ $? = 2 ] && grep -q "another user's" "$work/snap_other.out"
    result $? "snapshot of another user's process: refused" "$(cat "$work/snap_other.out")"
    nobody env OOMGUARD_LIVE_DIR="$live" "$OG" top --once --format json >"$work/top_nobody.json" 2>/dev/null
    python3 -c '
import json, sys
procs = json.load(open(sys.argv[1]))["gpus"][0]["processes"]
assert all(p["source"] == "nvml" for p in procs), procs
' "$work/top_nobody.json"
    result $? "another user's top reads no page of ours (NVML totals only)" "$(cat "$work/top_nobody.json")"
    # a directory named for root but owned by nobody, holding a copy of a real page: ignored
    forged="$live/oomguard-live-0.forged"
    mkdir -m 0700 "$forged" && cp "$(ls "$live"/oomguard-live-0/*.page | head -n 1)" "$forged/$bpid-0000000000000000.page"
    chown -R 65534:65534 "$forged"
    # a page name that is a symlink to a real page: ignored
    ln -s "$(ls "$live"/oomguard-live-0/$ppid_-*.page)" "$live/oomguard-live-0/$bpid-1111111111111111.page"
    "$OG" top --once --format json >"$work/top_forged.json"
    python3 -c '
import json, sys
procs = {p["pid"]: p for p in json.load(open(sys.argv[1]))["gpus"][0]["processes"]}
assert procs[int(sys.argv[2])]["source"] == "nvml", procs[int(sys.argv[2])]
' "$work/top_forged.json" "$bpid"
    result $? "a page in a directory of another owner, or behind a symlink, is not read"
    rm -rf "$forged" "$live/oomguard-live-0/$bpid-1111111111111111.page"
    # another user took the predictable directory name first: the job publishes elsewhere, found
    live2="$work/live2"
    mkdir -p "$live2/oomguard-live-0" && chown 65534:65534 "$live2/oomguard-live-0" && chmod 0777 "$live2"
    env LD_PRELOAD="$PRELOAD" OOMGUARD_LIVE_DIR="$live2" "$JOB" plain "$work/bare" >"$work/pre.log" 2>&1 &
    xpid=$!
    # found from its page, not only from NVML's list (which has it as soon as it holds memory)
    wait_for 10 sh -c "OOMGUARD_LIVE_DIR='$live2' '$OG' top --once --format json | python3 -c '
import json, sys
sys.exit(not any(p[\"pid\"] == $xpid and p[\"source\"] == \"oomguard\" for g in json.load(sys.stdin)[\"gpus\"] for p in g[\"processes\"]))'"
    result $? "the per-user directory taken by another user: the job publishes in a private one, top finds it" \
        "$(ls -la "$live2")"
    ls -d "$live2"/oomguard-live-0.* >/dev/null 2>&1
    result $? "... named unpredictably (mkdtemp)"
else
    echo "SKIP  other-user cases (not root, or nobody cannot reach the build)"; skip=$((skip + 1))
fi

# --- a killed job's page is removed --------------------------------------------------------------
env LD_PRELOAD="$PRELOAD" "$JOB" plain "$work/bare" >"$work/killed.log" 2>&1 &
kpid=$!
wait_for 10 sh -c "ls '$live'/oomguard-live-0/$kpid-*.page >/dev/null 2>&1"
result $? "a fourth job publishes its page"
kill -9 $kpid; wait $kpid 2>/dev/null
"$OG" top --once --format json >"$work/top3.json"
! ls "$live"/oomguard-live-0/$kpid-*.page >/dev/null 2>&1 && ! grep -q "\"pid\":[[:space:]]*$kpid," "$work/top3.json"
result $? "after SIGKILL its page is stale: not shown, removed"

# --- every kind: plain, managed, a stream-ordered pool (with what it keeps), VMM physical ---------
mkdir -p "$work/kinds"
env LD_PRELOAD="$PRELOAD" "$JOB" kinds "$work/kinds" >"$work/kinds.log" 2>&1 &
kdpid=$!
wait_for 10 test -s "$work/kinds/kinds.truth"
sleep 1.3
"$OG" top --once --format json >"$work/top_kinds.json"
python3 - "$work/top_kinds.json" "$work/kinds/kinds.truth" "$kdpid" <<'PY'
import json, sys
p = {p["pid"]: p for p in json.load(open(sys.argv[1]))["gpus"][0]["processes"]}[int(sys.argv[3])]
w = open(sys.argv[2]).read().split()
t = {w[i]: int(w[i + 1]) for i in range(0, len(w) - 1, 2)}
assert t["plain"] and t["managed"] and t["vmm"] and t["pool"] > t["pool_used"] > 0, t
assert p["tracked_bytes"] == t["tracked"], (p["tracked_bytes"], t)
k = p["by_kind"]
assert (k["plain"], k["managed"], k["pool"], k["vmm"], k["graph"]) == (t["plain"], t["managed"], t["pool"], t["vmm"], 0), (k, t)
assert p["pool_used_bytes"] == t["pool_used"], (p["pool_used_bytes"], t)
libs = {l["library"]: l["bytes"] for l in p["libraries"]}
assert libs["(pool cache)"] == t["pool"] - t["pool_used"], libs
assert sum(libs.values()) + p["other_library_bytes"] == t["tracked"], (libs, p["other_library_bytes"])
print("kinds ok")
PY
result $? "by kind: plain, managed, pool reserved and used, VMM physical equal the truth; the pool's cache listed" \
    "$(cat "$work/top_kinds.json")"
touch "$work/kinds/stop"

# --- the jobs go on, unharmed, to completion -----------------------------------------------------
touch "$ctl/stop" "$work/bare/stop"
codes=""
for p in $gpid $lpid $ppid_ $bpid $kdpid ${xpid:-}; do wait "$p"; codes="$codes $?"; done
result $([ "$codes" = " 0 0 0 0 0${xpid:+ 0}" ]; echo $?) "every job ran to completion, exit 0, no signal of its own received ($codes)" \
    "$(cat "$work"/*.log)"
left=$(ls "$live"/oomguard-live-0/ 2>/dev/null | wc -l)
result $([ "$left" = 0 ]; echo $?) "each page removed at exit ($left left)" "$(ls -la "$live"/oomguard-live-0/)"
echo "$pass passed, $fail failed${skip:+, $skip skipped}"
[ $fail = 0 ]
