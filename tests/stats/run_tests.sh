#!/usr/bin/env bash
# tests/stats/run_tests.sh — tests of `oomguard stats` (run with `make test-stats`):
# exact counts over the fixtures and over generated trees, hostile files, the
# Prometheus output against a validator of the format, the HTML page, 10,000 dumps
# within the time limit, and the cluster recipes (run_cluster.sh).
# Ends with one line "N passed, N failed[, N skipped]".
set -u
cd "$(dirname "$0")/../.."
B=${B:-build}
case $B in /*) BD=$B ;; *) BD=$PWD/$B ;; esac
OG=$BD/oomguard
MEASURE=$BD/cli-test/og-measure
FIX=tests/fixtures
T=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-stats.XXXXXX")
trap 'rm -rf "$T"' EXIT
unset NO_COLOR LD_PRELOAD OOMGUARD_DIR
# `oomguard run` puts the shim ahead of the sanitizer runtime the test program links (as in tests/cli).
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

# ok, bad, skip, expect, has, hasnt, checks_end; a command under expect gets 120 s
CHECK_DETAIL_LINES=20 EXPECT_TIMEOUT=120
. tests/lib/checks.sh
# py NAME SCRIPT ARGS...: a Python check; its output is shown on failure
py() {
    local name=$1 script=$2
    shift 2
    if python3 -c "$script" "$@" >"$T/py.out" 2>&1; then ok "$name"; else bad "$name" "$(tail -15 "$T/py.out")"; fi
}
if ! command -v python3 >/dev/null; then
    echo "python3 is needed"; echo "0 passed, 1 failed"; exit 1
fi

# ---------------------------------------------------------------- command line
expect "stats --help exits 0" 0 "$OG" stats --help
has "stats --help shows usage" "$T/out" "usage: oomguard stats DIR..."
expect "help stats exits 0" 0 "$OG" help stats
expect "stats without DIR is a usage error" 1 "$OG" stats
expect "unknown format is a usage error" 1 "$OG" stats "$FIX" --format xml
expect "unknown option is a usage error" 1 "$OG" stats "$FIX" --frobnicate
expect "missing directory: exit 2" 2 "$OG" stats "$T/nope"
has "missing directory: named" "$T/err" "$T/nope"
mkdir -p "$T/empty"
expect "empty directory: exit 0" 0 "$OG" stats "$T/empty" --format json
py "empty directory: zero counts" 'import json,sys; s=json.load(open(sys.argv[1])); assert s["dumps"]==0 and s["skipped"]==0 and s["by_status"]["oom"]==0, s' "$T/out"

# ---------------------------------------------------------------- exact counts: fixtures
# The fixtures' facts (tests/fixtures/README.md): job4 is one job (tr-5f2a9c) on gpu-node-03
# with ranks 0 and 2 out of memory (foreign_memory) and 1 and 3 exit summaries.
S=$T/fix
mkdir -p "$S/job4" "$S/a/b/c" "$S/misc"
cp "$FIX"/job4/*.json "$S/job4/"
cp "$FIX/does_not_fit.json" "$S/a/oomguard-gpu-ws-07-48213.json"
cp "$FIX/limit.json" "$S/a/b/oomguard-gpu-ws-07-48214.json"
cp "$FIX/warning.json" "$S/a/b/c/oomguard-gpu-ws-07-48215.json"
cp "$FIX/fragmentation.json" "$S/misc/oomguard-inference-a100-2-7001.json"
cp "$FIX/recovered.json" "$S/misc/oomguard-lab-l4-01-9.json"
cp "$FIX/exit_summary.json" "$S/oomguard-h100-pod-4-77.json"
cp "$FIX/does_not_fit.json" "$S/misc/not-a-dump-name.json"   # not named oomguard-*.json: not read
echo "text report" >"$S/misc/oomguard-gpu-ws-07-48213.txt"
expect "fixtures: exit 0" 0 "$OG" stats "$S" --format json -o "$T/fix.json"
py "fixtures: exact counts by status, cause, job, host, GPU model, framework, first remedy" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["dumps"] == 10 and s["skipped"] == 0, (s["dumps"], s["skipped"])
assert s["by_status"] == {"oom": 5, "recovered": 1, "warning": 1, "exit": 3}, s["by_status"]
assert s["by_cause"] == {"foreign_memory": 2, "does_not_fit": 1, "fragmentation": 1, "limit": 1}, s["by_cause"]
assert s["recovered_by_cause"] == {"cache_held": 1}, s["recovered_by_cause"]
c = lambda g: {k: (v["dumps"], v["oom"], v["recovered"], v["warning"], v["exit"]) for k, v in g.items()}
assert c(s["by_job"]) == {"tr-5f2a9c": (4, 2, 0, 0, 2), "none": (4, 3, 0, 1, 0), "sim-sweep-1182": (1, 0, 1, 0, 0),
                          "8831042": (1, 0, 0, 0, 1)}, c(s["by_job"])
assert c(s["by_host"]) == {"gpu-node-03": (4, 2, 0, 0, 2), "gpu-ws-07": (3, 2, 0, 1, 0), "inference-a100-2": (1, 1, 0, 0, 0),
                           "lab-l4-01": (1, 0, 1, 0, 0), "h100-pod-4": (1, 0, 0, 0, 1)}, c(s["by_host"])
assert s["by_job"]["tr-5f2a9c"]["hosts"] == 1 and s["by_host"]["gpu-ws-07"]["jobs"] == 1, s["by_job"]
assert c(s["by_framework"]) == {"pytorch": (8, 5, 0, 1, 2), "cupy": (1, 0, 1, 0, 0), "jax": (1, 0, 0, 0, 1)}, c(s["by_framework"])
assert sum(v["dumps"] for v in s["by_gpu_model"].values()) == 10
assert s["by_gpu_model"]["NVIDIA GeForce RTX 4090"]["dumps"] == 3, s["by_gpu_model"]
fr = {r["id"]: r["failures"] for r in s["first_remedies"]}
assert sum(fr.values()) == 5 and fr.get("raise_limit") == 1 and fr.get("expandable_segments") == 1, fr
assert s["trend"]["points"] and sum(p["oom"] for p in s["trend"]["points"]) == 5, s["trend"]
assert s["last_failure"] and s["last_failure"] > 1.7e9
' "$T/fix.json"
python3 tests/stats/oracle.py "$T/fix.json" "$S" >"$T/oracle.log" 2>&1 && ok "fixtures: agree with an independent count" || bad "fixtures: independent count" "$(cat "$T/oracle.log")"
expect "fixtures: text exits 0" 0 "$OG" stats "$S"
has "text: totals" "$T/out" "10 dumps in $S; 0 files skipped"
has "text: oom apart from recovered and warnings" "$T/out" "5 out of memory (crashed), 1 recovered"
has "text: cause table" "$T/out" "Out-of-memory failures by cause"
has "text: remedies" "$T/out" "Most frequent first remedies"
has "text: by GPU model" "$T/out" "NVIDIA GeForce RTX 4090"
has "text: trend" "$T/out" "Trend (per"
expect "a single file as argument" 0 "$OG" stats "$FIX/recovered.json" --format json
py "a single file is counted" 'import json,sys; s=json.load(open(sys.argv[1])); assert s["dumps"]==1 and s["by_status"]["recovered"]==1, s' "$T/out"
expect "several directories" 0 "$OG" stats "$S/job4" "$S/misc" --format json
py "several directories are added up" 'import json,sys; s=json.load(open(sys.argv[1])); assert s["dumps"]==6 and s["by_status"]["oom"]==3, s["by_status"]' "$T/out"

# ---------------------------------------------------------------- one id per remedy, old dumps too
# Dumps written before "non_framework_memory" had its own id named it "foreign_processes" (with its own
# title); stats counts it as what it was, and "Stop other processes" stays foreign_processes.  Likewise
# "Keep CUDA out of the DataLoader workers", once "set_device" with its own title: cuda_out_of_workers.
O=$T/oldid
mkdir -p "$O"
python3 - "$FIX/does_not_fit.json" "$O" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for n, rid, title in ((1, "foreign_processes", "Find the memory held outside the framework"),
                      (2, "foreign_processes", "Stop other processes that hold GPU memory"),
                      (3, "set_device", "Keep CUDA out of the DataLoader workers"),
                      (4, "set_device", "Select each rank's own GPU before touching CUDA (set_device)")):
    d["pid"] = 1000 + n
    d["remedies"] = [{"id": rid, "rank": 1, "title": title, "why": "", "how": [], "saving": "", "cost": ""}]
    json.dump(d, open("%s/oomguard-old-%d.json" % (sys.argv[2], n), "w"))
PYEOF
expect "old remedy id: exit 0" 0 "$OG" stats "$O" --format json -o "$T/oldid.json"
py "old remedy id: counted as non_framework_memory" '
import json, sys
s = json.load(open(sys.argv[1]))
fr = {r["id"]: r["failures"] for r in s["first_remedies"]}
assert fr == {"non_framework_memory": 1, "foreign_processes": 1, "cuda_out_of_workers": 1, "set_device": 1}, fr' "$T/oldid.json"

# ---------------------------------------------------------------- exact counts: generated
python3 tests/stats/gen_dumps.py "$T/gen" 400 7
expect "generated: 400 dumps over many jobs and hosts" 0 "$OG" stats "$T/gen" --format json -o "$T/gen.json"
python3 tests/stats/oracle.py "$T/gen.json" "$T/gen" >"$T/oracle.log" 2>&1 && ok "generated: every count agrees with an independent count ($(tail -1 "$T/oracle.log"))" \
    || bad "generated: independent count" "$(cat "$T/oracle.log")"
py "generated: undated dumps are counted apart from the trend" '
import json, sys
s = json.load(open(sys.argv[1]))
tr = s["trend"]
assert tr["bucket"] == "day" and tr["undated"] > 0, tr["bucket"]
n = sum(p["oom"] + p["recovered"] + p["warning"] + p["exit"] for p in tr["points"])
assert n + tr["undated"] == s["dumps"], (n, tr["undated"], s["dumps"])
' "$T/gen.json"

# ---------------------------------------------------------------- hostile files
H=$T/hostile
mkdir -p "$H/sub"
cp "$FIX/does_not_fit.json" "$H/oomguard-good-1.json"
cp "$FIX/hostile_strings.json" "$H/sub/oomguard-hostile-2.json"
nbad=0
for f in "$FIX"/bad/*.json; do cp "$f" "$H/sub/oomguard-bad-$(basename "$f")"; nbad=$((nbad + 1)); done
mkfifo "$H/oomguard-fifo.json" && nbad=$((nbad + 1))                  # would block a plain open()
ln -s /dev/zero "$H/oomguard-zero.json" && nbad=$((nbad + 1))          # endless
ln -s "$H/nowhere" "$H/oomguard-dangling.json" && nbad=$((nbad + 1))   # dangling link
truncate -s 600M "$H/oomguard-huge.json" && nbad=$((nbad + 1))         # over the reader's limit (sparse)
truncate -s 80M "$H/oomguard-zeros.json" && nbad=$((nbad + 1))         # streamed, not JSON
mkdir -p "$H/oomguard-dir.json"                                        # a directory named like a dump: walked
cp "$FIX/recovered.json" "$H/oomguard-dir.json/oomguard-in-dir-3.json"
ln -s .. "$H/sub/loop"                                                 # a directory loop: not followed
d="$H/deep"; for i in $(seq 1 70); do d="$d/d"; done; mkdir -p "$d" && cp "$FIX/warning.json" "$d/oomguard-deep-4.json"
nbad=$((nbad + 1))                                                     # the directory at depth 65
printf '{"schema":"oomguard.dump/1","status":"oom","pid":1,"host":"h","event":{"requested_bytes":"x"}}' >"$H/oomguard-types.json"
nbad=$((nbad + 1))
expect "hostile files do not stop it (exit 0, no hang)" 0 "$OG" stats "$H" --format json -o "$T/hostile.json"
py "hostile files: the valid dumps counted, every bad one skipped with a reason" '
import json, sys
s = json.load(open(sys.argv[1])); nbad = int(sys.argv[2])
assert s["dumps"] == 3, s["dumps"]
assert s["skipped"] == nbad, (s["skipped"], nbad, s["skipped_files"])
txt = "\n".join(s["skipped_files"])
for why in ("not a regular file", "too large", "truncated", "nested too deep", "schema oomguard.dump/2", "empty file"):
    assert why in txt, (why, txt)
' "$T/hostile.json" "$nbad"
for fmt in text html prometheus; do
    expect "hostile files: --format $fmt exits 0" 0 "$OG" stats "$H" --format $fmt -o "$T/hostile.$fmt"
done
hasnt "html: the hostile script is escaped" "$T/hostile.html" "<script>alert"
py "text: no terminal escapes from the dumps" 'import sys; t=open(sys.argv[1],"rb").read(); assert b"\x1b" not in t and b"\xe2\x80\xae" not in t' "$T/hostile.text"

# ---------------------------------------------------------------- prometheus
python3 tests/stats/check_prom.py --self-test >"$T/self.log" 2>&1 && ok "format validator rejects $(grep -c '^ok' "$T/self.log") kinds of broken input" \
    || bad "format validator self-test" "$(cat "$T/self.log")"
# Label values that must be escaped: backslash, double quote, line feed; and a tab, UTF-8.
python3 - "$FIX/does_not_fit.json" "$T/esc" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
os.makedirs(sys.argv[2], exist_ok=True)
for i, host in enumerate(['rack\\1 "a"\nnode', "t\tab", "n\u00f6de-\u00e9", "plain"]):
    d["host"] = host
    d["device"]["name"] = 'GPU "x" \\ y' if i % 2 else "NVIDIA A100"
    json.dump(d, open(os.path.join(sys.argv[2], "oomguard-x-%d.json" % i), "w"))
PY
cp "$FIX/warning.json" "$T/esc/oomguard-w-1.json"
for src in esc gen fix hostile; do
    dir=$T/$src; [ $src = fix ] && dir=$S; [ $src = hostile ] && dir=$H
    "$OG" stats "$dir" --format prometheus -o "$T/$src.prom" 2>"$T/err"
    if python3 tests/stats/check_prom.py "$T/$src.prom" >"$T/prom.log" 2>&1; then ok "prometheus ($src): passes the format validator"
    else bad "prometheus ($src): format" "$(cat "$T/prom.log")"; fi
done
has "prometheus: backslash, quote and line feed escaped" "$T/esc.prom" 'host="rack\\1 \"a\"\nnode"'
has "prometheus: escaped in gpu_model too" "$T/esc.prom" 'gpu_model="GPU \"x\" \\ y"'
has "prometheus: UTF-8 passes through" "$T/esc.prom" 'host="nöde-é"'
has "prometheus: counter TYPE" "$T/esc.prom" "# TYPE oomguard_dumps_total counter"
has "prometheus: last failure gauge" "$T/esc.prom" "# TYPE oomguard_last_failure_timestamp_seconds gauge"
py "prometheus: the counters add up to the JSON counts" '
import json, re, sys
prom, js = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
tot = {}
for m in re.finditer(r"^oomguard_dumps_total\{status=\"([^\"]*)\",cause=\"([^\"]*)\".*\} (\d+)$", prom, re.M):
    tot[m.group(1)] = tot.get(m.group(1), 0) + int(m.group(3))
want = {k: v for k, v in js["by_status"].items() if v}
assert tot == want, (tot, want)
oom = {}
for m in re.finditer(r"^oomguard_dumps_total\{status=\"oom\",cause=\"([^\"]*)\".*\} (\d+)$", prom, re.M):
    oom[m.group(1)] = oom.get(m.group(1), 0) + int(m.group(2))
assert oom == js["by_cause"], (oom, js["by_cause"])
last = max(float(x) for x in re.findall(r"^oomguard_last_failure_timestamp_seconds\{.*\} (\S+)$", prom, re.M))
assert abs(last - js["last_failure"]) < 0.01, (last, js["last_failure"])
' "$T/gen.prom" "$T/gen.json"

# ---------------------------------------------------------------- html and -o
expect "html: exit 0" 0 "$OG" stats "$T/gen" --format html -o "$T/gen.html"
for id in 'id="trend"' 'id="causes"' 'id="hosts"' 'id="gpus"' 'id="frameworks"' "Most frequent first remedies" "By job"; do
    has "html: has $id" "$T/gen.html" "$id"
done
py "html: one self-contained page (nothing fetched, one inline script)" '
import re, sys
h = open(sys.argv[1]).read()
assert h.startswith("<!DOCTYPE html>") and h.rstrip().endswith("</html>")
assert not re.search(r"(src|href)\s*=\s*\"(?!#|data:)", h), re.search(r"(src|href)\s*=\s*\"(?!#|data:)", h)
assert "http://" not in h and "https://" not in h
assert h.count("<script") == 1 and "default-src" in h
' "$T/gen.html"
browser=
for b in chromium chromium-browser google-chrome; do command -v "$b" >/dev/null 2>&1 && browser=$b && break; done
if [ -n "$browser" ]; then
    prof=$(mktemp -d "${TMPDIR:-/tmp}/og-chromium.XXXXXX")
    timeout 90 "$browser" --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
        --user-data-dir="$prof" --dump-dom "file://$T/gen.html" >"$T/dom.html" 2>/dev/null
    rm -rf "$prof"
    if grep -q 'data-ok="1"' "$T/dom.html" && [ "$(grep -o '<svg' "$T/dom.html" | wc -l)" -ge 5 ]; then
        ok "html: renders in headless Chromium (the page's script ran under its CSP; $(grep -o '<svg' "$T/dom.html" | wc -l) charts)"
    else bad "html in headless Chromium" "$(head -c 400 "$T/dom.html")"; fi
else
    skip "html in headless Chromium" "chromium not installed"
fi
ls -a "$T" | grep -q '^\.gen\.html\.' && bad "-o leaves no temporary file" || ok "-o leaves no temporary file"
chmod 0555 "$T/empty" 2>/dev/null
if [ "$(id -u)" != 0 ]; then
    expect "-o into an unwritable directory: exit 3" 3 "$OG" stats "$S" -o "$T/empty/x.prom"
fi
expect "-o to a missing directory: exit 3" 3 "$OG" stats "$S" -o "$T/nodir/x.prom"

# ---------------------------------------------------------------- kubernetes example
python3 tests/stats/check_k8s.py examples/kubernetes >"$T/k8s.log" 2>&1
case $? in
0) ok "kubernetes example: init container, LD_PRELOAD and OOMGUARD_DIR wired together" ;;
77) skip "kubernetes example" "$(tail -1 "$T/k8s.log")" ;;
*) bad "kubernetes example" "$(tail -5 "$T/k8s.log")" ;;
esac

# ---------------------------------------------------------------- 10,000 dumps
python3 tests/stats/gen_dumps.py "$T/big" 10000 3
best_c=999 best_w=999 s=0
for _ in 1 2 3; do
    echo "wall_s=999 cpu_s=999 maxrss_kb=0 status=measure-failed" >"$T/m"
    "$MEASURE" "$T/m" "$OG" stats "$T/big" --format json -o "$T/big.json"
    read -r w c k s <"$T/m"
    w=${w#wall_s=} c=${c#cpu_s=} k=${k#maxrss_kb=} s=${s#status=}
    [ "$s" = 0 ] || break
    awk "BEGIN{exit !($c < $best_c)}" && best_c=$c
    awk "BEGIN{exit !($w < $best_w)}" && best_w=$w
done
what="perf: 10,000 dumps ($(du -sm "$T/big" | cut -f1) MB)"
if [ "$s" != 0 ]; then bad "$what" "exit $s"
elif [ -n "${SANITIZE:-}" ]; then ok "$what read (cpu ${best_c}s, wall ${best_w}s; limit not checked under sanitizers)"
elif awk "BEGIN{exit !($best_c < 5.0)}"; then ok "$what read in cpu ${best_c}s (limit 5 s; wall ${best_w}s), ${k} KiB"
else bad "$what" "cpu ${best_c}s, best of three (limit 5 s)"; fi
py "perf: all 10,000 counted" 'import json,sys; s=json.load(open(sys.argv[1])); assert s["dumps"]==10000 and s["skipped"]==0, (s["dumps"], s["skipped"])' "$T/big.json"
rm -rf "$T/big"

# ---------------------------------------------------------------- cluster recipes
B="$B" SANITIZE="${SANITIZE:-}" bash tests/stats/run_cluster.sh >"$T/cluster.log" 2>&1
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$T/cluster.log" | tail -1)
cp_=$(echo "$line" | grep -oE '^[0-9]+'); cf=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
cs=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+')
sed 's/^/  cluster: /' "$T/cluster.log" | grep -E 'PASS|FAIL|SKIP'
passed=$((passed + ${cp_:-0})); failed=$((failed + ${cf:-1})); skipped=$((skipped + ${cs:-0}))
[ -z "$line" ] && tail -20 "$T/cluster.log"

checks_end
