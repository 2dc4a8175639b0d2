#!/usr/bin/env bash
# Regression tests for bugs that once passed the whole suite: each test names the
# bug it catches; `make mutate` (tests/mutate/) checks that they still do.
# Needs B (build dir) and PRELOAD (the shim, or "sanitizer-runtime shim").  Ends with
# "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init regress
prog="$root/$B/tests/regress"
OG="$root/$B/oomguard"
export LD_LIBRARY_PATH="$root/$B/sim:$root/$B/examples" SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB"
unset OOMGUARD_DIR OOMGUARD_LIMIT OOMGUARD_WARN_AT OOMGUARD_MAX_DUMPS OOMGUARD_SUMMARY
show() { sed 's/^/      | /' "$1" | tail -n "${2:-15}"; }

# mode NAME [ENV...]: runs `regress NAME` under the shim in its own dump directory $work/NAME
mode() {
    local name=$1; shift
    local dir="$work/$name"; mkdir -p "$dir"
    env OOMGUARD_DIR="$dir" OOMGUARD_QUIET=1 "$@" LD_PRELOAD="$PRELOAD" "$prog" "$name" >"$dir/out.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || grep '^FAIL' "$dir/out.log" | head -n 5 | sed 's/^/      | /'
    return $rc
}
dump_of() { ls "$work/$1"/oomguard-*.json 2>/dev/null | head -n 1; }
py() { python3 - "$@" >"$work/py.log" 2>&1; local rc=$?; [ $rc = 0 ] || show "$work/py.log" 8; return $rc; }

# ---------------------------------------------------------------- ledger
mode reset
result $? "cudaDeviceReset on device 1 drops its plain AND managed blocks, keeps device 0's"

mode pool
result $? "a pool of device 1 used while device 0 is current: device 1 is charged, device 0 shows 0 pool bytes"
mode failed-free
result $? "a free the driver refuses: block kept, allocs +1, frees +0, then freed once"
mode cross-thread
result $? "blocks freed by another thread than the one that allocated them are found"
mode vmm-retain
result $? "VMM: a retained handle needs its own release; a failed cuMemCreate is its device's failure"
mode pitch-host
result $? "pitched blocks counted as pitch x height; pinned host memory counted and given back"

mode batch
rc=$?
py "$(dump_of batch)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
fails = [e for e in d["history"]["events"] if e["op"] == "fail"]
assert fails, "no fail event"
live, tracked = fails[-1]["live_bytes"], d["memory"]["process_tracked_bytes"]
# small changes are summed per thread and added in 4 MiB steps (shim/ledger.c): one thread's
# usage may trail by less than 4 MiB, never by what 64 frees add up to
assert abs(live - tracked) < 4 << 20, f"last fail event live_bytes {live} vs process_tracked_bytes {tracked}"
PY
pr=$?
result $([ $rc = 0 ] && [ $pr = 0 ]; echo $?) \
    "64 x 1 MiB allocated, then freed, then a failure: the fail event's live_bytes within 4 MiB of process_tracked_bytes (frees flush the batch)"

mode limit-exact OOMGUARD_LIMIT=1:4GiB
result $? "under OOMGUARD_LIMIT each 1 MiB allocation and free shows at once in cudaMemGetInfo (no batching)"

mode limit-pool OOMGUARD_LIMIT=1:4GiB
result $? "under OOMGUARD_LIMIT a pool allocation served from the pool's unused reservation is not refused"

mode invalid
rc=$?
n=$(ls "$work/invalid" | grep -c '^oomguard-')
result $([ $rc = 0 ] && [ "$n" = 0 ]; echo $?) "cuMemAlloc(0) is the program's error: no failure counted, no dump ($n files)"

# calls the driver refuses (a bogus handle, pointer, size 0): the driver's error, shim or not
mkdir -p "$work/release"
env OOMGUARD_DIR="$work/release" OOMGUARD_QUIET=1 LD_PRELOAD="$PRELOAD" "$prog" release 2>&1 | grep ' = ' >"$work/with.txt"
"$prog" release 2>&1 | grep ' = ' >"$work/without.txt"
rel=$(grep '^cuMemRelease' "$work/with.txt")
ok=$(grep -c ' = 0$' "$work/with.txt")
result $([ "$rel" = "cuMemRelease(bogus) = 1" ] && [ "$ok" = 0 ] && [ "$(wc -l <"$work/with.txt")" -ge 9 ] &&
         cmp -s "$work/with.txt" "$work/without.txt"; echo $?) \
    "cuMemRelease(bogus handle) and 8 more refused calls return the driver's error, shim or not ('$rel')"
cmp -s "$work/with.txt" "$work/without.txt" || diff "$work/without.txt" "$work/with.txt" | sed 's/^/      | /'

# ---------------------------------------------------------------- failure episodes
mode episode
rc=$?
py "$(dump_of episode)" <<'PY'
import json, sys
GiB = 1 << 30
d = json.load(open(sys.argv[1]))
e = d["event"]
assert d["status"] == "recovered", d["status"]
assert e["recovered_by"] and e["recovered_by"]["requested_bytes"] == 20 * GiB, e["recovered_by"]
assert e["attempts"] == 2, e["attempts"]
assert e["released_between_attempts_bytes"] == 4 * GiB, e["released_between_attempts_bytes"]
# a recovered dump keeps the record of the episode's first failed attempt (shim/capture.c)
assert e["requested_bytes"] == 30 * GiB, e["requested_bytes"]
assert d["memory"]["framework_cached_bytes"] == 4 * GiB, d["memory"]["framework_cached_bytes"]
PY
pr=$?
result $([ $rc = 0 ] && [ $pr = 0 ]; echo $?) \
    "4 GiB held, 30 GiB fails, 4 GiB freed, 29 GiB fails, 1 MiB, 20 GiB succeeds: recovered_by 20 GiB, attempts 2, released 4 GiB"

rm -rf "$work/episode"
mode episode REGRESS_NO_RECOVERY=1
rc=$?
py "$(dump_of episode)" <<'PY'
import json, sys
GiB = 1 << 30
d = json.load(open(sys.argv[1]))
e = d["event"]
assert d["status"] == "oom", d["status"]
assert e["requested_bytes"] == 29 * GiB, f"requested {e['requested_bytes']}: the latest attempt, 29 GiB"
assert e["attempts"] == 2, e["attempts"]
assert e["released_between_attempts_bytes"] == 4 * GiB, e["released_between_attempts_bytes"]
assert e.get("recovered_by") is None, e.get("recovered_by")
# what the framework freed between its attempts is memory it held but did not use
m = d["memory"]
assert m["framework_cached_bytes"] == 4 * GiB and m["framework_cached_source"] == "retry_release", \
    (m["framework_cached_bytes"], m.get("framework_cached_source"))
PY
pr=$?
result $([ $rc = 0 ] && [ $pr = 0 ]; echo $?) \
    "the same job dying after the second attempt: status oom, requested 29 GiB (the latest), attempts 2, released 4 GiB = framework cache"

for how in pool vmm; do
    mode episode-$how
    rc=$?
    py "$(dump_of episode-$how)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
e = d["event"]
assert e["attempts"] == 2 and e["requested_bytes"] == 29 << 30, (e["attempts"], e["requested_bytes"])
assert e["released_between_attempts_bytes"] == 4 << 30, e["released_between_attempts_bytes"]
PY
    pr=$?
    result $([ $rc = 0 ] && [ $pr = 0 ]; echo $?) \
        "released between attempts through a $([ $how = pool ] && echo "pool trim" || echo "VMM release"): 4 GiB"
done

# ---------------------------------------------------------------- warnings and budget
mode warn-band OOMGUARD_WARN_AT=50% OOMGUARD_QUIET=0
n=$(grep -c "crossed OOMGUARD_WARN_AT" "$work/warn-band/out.log")
result $([ "$n" = 2 ]; echo $?) \
    "WARN_AT=50% of 24 GiB: 13 GiB warns, 10 -> 11.5 -> 12.5 GiB stays in the 5% band (no warning), 0 -> 12.5 warns again ($n, want 2)"

mode warn-limit OOMGUARD_LIMIT=0:8GiB OOMGUARD_WARN_AT=50% OOMGUARD_QUIET=0
n=$(grep -c "crossed OOMGUARD_WARN_AT" "$work/warn-limit/out.log")
result $([ "$n" = 1 ]; echo $?) "WARN_AT=50% with OOMGUARD_LIMIT=8GiB: the threshold is half the limit, 5 GiB warns ($n)"

mode two-devices OOMGUARD_MAX_DUMPS=1 OOMGUARD_QUIET=0
n=$(grep -c "dumps written (OOMGUARD_MAX_DUMPS)" "$work/two-devices/out.log")
files=$(ls "$work/two-devices" | grep -c '^oomguard-.*\.json$')
py "$(dump_of two-devices)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["event"]["device"] == 0 and d["event"]["requested_bytes"] == 30 << 30, d["event"]
PY
pr=$?
result $([ "$n" = 1 ] && [ "$files" = 1 ] && [ $pr = 0 ]; echo $?) \
    "OOMGUARD_MAX_DUMPS=1, three failures: one budget warning ($n), one dump ($files), the first failure's"

# ---------------------------------------------------------------- secrets never reach a dump
d="$work/secrets"; mkdir -p "$d"
env OOMGUARD_DIR="$d" OOMGUARD_QUIET=1 CUDA_AUTH_TOKEN=og-marker-1 NCCL_IB_PASSWORD=og-marker-2 \
    XLA_FLAGS_API_KEY=og-marker-3 TF_DB_PASS=og-marker-4 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 \
    LD_PRELOAD="$PRELOAD" "$prog" two-devices --token og-marker-5 https://user:og-marker-6@example.com/x \
    --api-key=og-marker-7 >/dev/null 2>&1
leaks=$(cat "$d"/oomguard-* 2>/dev/null | grep -o 'og-marker-[0-9]' | sort -u | tr '\n' ' ')
py "$(ls "$d"/oomguard-*.json | head -n 1)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
env = d["process"]["env"] if "env" in d.get("process", {}) else d.get("env")
text = json.dumps(env)
for name in ("CUDA_AUTH_TOKEN", "NCCL_IB_PASSWORD"):
    assert name in text, f"{name} should be listed (value redacted): {text[:300]}"
assert "max_split_size_mb:128" in text, "PYTORCH_CUDA_ALLOC_CONF shapes memory use: it must be in the dump"
PY
pr=$?
result $([ -f "$(dump_of secrets)" ] && [ -z "$leaks" ] && [ $pr = 0 ]; echo $?) \
    "credentials in CUDA_AUTH_TOKEN, NCCL_IB_PASSWORD, ..._API_KEY, ..._PASS, --token X, URL password, --api-key=X: none in the dump (${leaks:-none leaked})"

# ---------------------------------------------------------------- file safety, unprivileged
# Root ignores mode bits, so these run as an ordinary user: `nobody` via setpriv when the
# suite runs as root (as in CI), else as the user running it.
as_user=()
if [ "$(id -u)" = 0 ]; then
    if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
        as_user=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
    else
        as_user=(false)
    fi
fi
if [ "${as_user[*]}" = false ]; then
    result 1 "file safety as an unprivileged user: running as root without setpriv or user nobody"
elif [ ${#as_user[@]} -gt 0 ] && ! "${as_user[@]}" test -x "$root/$B/examples/too_big" -a -r "${PRELOAD##* }" 2>/dev/null; then
    # a checkout below a private directory (mktemp -d is 0700): nobody cannot reach the build
    skip=$((skip + 1))
    echo "SKIP  file safety as an unprivileged user: the build is not reachable by nobody (a private parent directory)"
else
    u="$work/user"; mkdir -p "$u/ro" "$u/tmp" "$u/link"
    chmod 755 "$work" "$u"; chmod 555 "$u/ro"; chmod 777 "$u/tmp" "$u/link"
    # an unwritable OOMGUARD_DIR: the program carries on, one warning, the dump goes to TMPDIR
    out=$("${as_user[@]}" env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_DIR="$u/ro" TMPDIR="$u/tmp" \
          LD_PRELOAD="$PRELOAD" "$root/$B/examples/too_big" 2>&1); rc=$?
    n=$(printf '%s\n' "$out" | grep -c "cannot write a dump in")
    fb=$(ls "$u"/tmp/oomguard-*.json 2>/dev/null | wc -l)
    result $([ $rc = 3 ] && [ "$n" = 1 ] && [ "$fb" = 1 ] && [ -z "$(ls -A "$u/ro")" ]; echo $?) \
        "as $("${as_user[@]}" id -un): unwritable OOMGUARD_DIR: exit $rc, one warning ($n), dump in TMPDIR ($fb)"
    # symlinks planted at both dump paths, pointing at a file the user may write
    echo precious >"$u/victim"; chmod 666 "$u/victim"
    "${as_user[@]}" bash -c 'ln -s "$1" "$2/oomguard-$3-$$.json"; ln -s "$1" "$2/oomguard-$3-$$.txt"; shift 3; exec env "$@"' _ \
        "$u/victim" "$u/link" "$(hostname)" SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_DIR="$u/link" OOMGUARD_QUIET=1 \
        LD_PRELOAD="$PRELOAD" "$root/$B/examples/too_big" >/dev/null 2>&1
    rc=$?
    f=$(find "$u/link" -name 'oomguard-*.json' -type f | head -n 1)
    perm=$(stat -c %a "$f" 2>/dev/null)
    result $([ $rc = 3 ] && [ "$(cat "$u/victim")" = precious ] && [ -n "$f" ] && [ "$perm" = 600 ]; echo $?) \
        "as an unprivileged user: nothing written through a planted symlink, dump written as a file, mode $perm"
fi

# ---------------------------------------------------------------- the oomguard command
FIX="$root/tests/fixtures"
"$OG" report "$FIX/hostile_strings.json" --format html -o "$work/h.html" >/dev/null 2>&1
grep -qF 'GPU &lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;' "$work/h.html"
q=$?
grep -qF "alert(&#39;host&#39;)" "$work/h.html"
a=$?
result $([ $q = 0 ] && [ $a = 0 ]; echo $?) "html: \" becomes &quot; and ' becomes &#39; (hostile-strings fixture)"

# sizes just under a unit boundary switch unit before rounding: never "1024.00 MiB"
py "$FIX/does_not_fit.json" "$work/edge.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["event"]["requested_bytes"] = (1 << 30) - 1          # 1023.999999 MiB
json.dump(d, open(sys.argv[2], "w"))
PY
"$OG" report "$work/edge.json" --color never >"$work/edge.txt" 2>&1
r1=$?
grep -q "1\.00 GiB" "$work/edge.txt"
r2=$?
result $([ $r1 = 0 ] && [ $r2 = 0 ] && ! grep -q "1024\.00" "$work/edge.txt"; echo $?) \
    "report: 2^30 - 1 bytes print as 1.00 GiB, never 1024.00 MiB"

# merge: the earlier failure is first even when its dump was written later
mkdir -p "$work/job"
py "$FIX/job4" "$work/job" <<'PY'
import glob, json, os, sys
src, dst = sys.argv[1:3]
for f in sorted(glob.glob(src + "/*.json")):
    d = json.load(open(f))
    if d["rank"] == 2:            # failed first, but its dump is written last
        d["time"] = d["event"]["t"] + 30
    json.dump(d, open(os.path.join(dst, os.path.basename(f)), "w"))
PY
"$OG" merge "$work/job" --format json -o "$work/merge.json" >/dev/null 2>&1
"$OG" merge "$work/job" >"$work/merge.txt" 2>&1
py "$work/merge.json" "$work/job" <<'PY'
import glob, json, sys
m = json.load(open(sys.argv[1]))["jobs"][0]
dumps = [json.load(open(f)) for f in glob.glob(sys.argv[2] + "/*.json")]
assert m["first_failure"]["rank"] == 2, m["first_failure"]
assert [r["rank"] for r in m["ranks"]] == sorted(d["rank"] for d in dumps), [r["rank"] for r in m["ranks"]]
hosts = {d["host"] for d in dumps}
PY
r1=$?
grep -q "Failed first: rank 2" "$work/merge.txt" && grep -q "4 dumps from 1 host," "$work/merge.txt"
r2=$?
result $([ $r1 = 0 ] && [ $r2 = 0 ]; echo $?) "merge: the earlier failure (rank 2) is named first though its dump was written last; ranks in order; 1 host"

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
