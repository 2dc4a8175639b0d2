#!/usr/bin/env bash
# make soak: 16 threads x 2 devices x SOAK_OPS (default 1M) random allocations and frees per
# thread, 1% of them failed by the simulated driver, under the ASan+UBSan build and under the
# ThreadSanitizer build.  Passes when the ledger equals the simulator's truth to the byte,
# every failure is counted, and neither sanitizer reports anything (a report stops the
# program with a non-zero status).  While it runs, `oomguard snapshot` (the same build) asks it
# for a dump every few seconds (5 at most): each one must be written (the last may meet the
# program's exit) and be a snapshot dump, and the run must pass as without them.  Takes minutes to tens of minutes; `make test` runs the same
# program at 8 x 100k.  Ends with "N passed, N failed".
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
ASAN_B=${ASAN_B:-build-soak-asan}
TSAN_B=${TSAN_B:-build-soak-tsan}
OPS=${SOAK_OPS:-1000000}
THREADS=${SOAK_THREADS:-16}
work=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-soak.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
soak() {   # soak NAME BUILD RUNTIME_LIB [VAR=VALUE...]
    local name=$1 b=$2 rt=$3; shift 3
    local start=$SECONDS
    mkdir -p "$work/$name" "$work/$name/live"
    env "$@" LD_LIBRARY_PATH="$root/$b/sim" SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB" \
        SIMGPU_FAIL_PROB=0.01 SIMGPU_SEED=2026 OOMGUARD_QUIET=1 OOMGUARD_DIR="$work/$name" \
        OOMGUARD_LIVE_DIR="$work/$name/live" STRESS_THREADS="$THREADS" STRESS_OPS="$OPS" \
        LD_PRELOAD="$("${CC:-cc}" -print-file-name="$rt") $root/$b/liboomguard.so" \
        "$root/$b/tests/e2e_stress" >"$work/$name.log" 2>&1 &
    local pid=$! asked=0
    # snapshots on request while every thread allocates: at most 5, one every 3 s
    while sleep 3 && kill -0 $pid 2>/dev/null; do
        [ $asked -lt 5 ] || continue
        asked=$((asked + 1))
        env "$@" OOMGUARD_LIVE_DIR="$work/$name/live" "$root/$b/oomguard" snapshot $pid --timeout 300 \
            >>"$work/$name.snap" 2>>"$work/$name.snaplog"
    done
    wait $pid
    local rc=$?
    local snaps
    snaps=$(python3 - "$work/$name.snap" "$pid" 2>>"$work/$name.snaplog" <<'PY'
import json, os, sys
n = 0
for line in (open(sys.argv[1]) if os.path.exists(sys.argv[1]) else []):
    pid, path = line.rstrip("\n").split(" ", 1)   # the path may hold spaces
    d = json.load(open(path))
    assert d["status"] == "snapshot" and d["pid"] == int(sys.argv[2]) == int(pid), (d["status"], d["pid"])
    assert d["diagnosis"]["primary"] == "snapshot" and d["memory"]["process_tracked_bytes"] >= 0, d["diagnosis"]
    n += 1
print(n)
PY
)
    # every snapshot asked is written, but the last may have met the program's exit
    if [ $rc = 0 ] && [ -n "$snaps" ] && [ "$snaps" -ge $((asked - 1)) ] && ! grep -q "Sanitizer\|runtime error" "$work/$name.log" "$work/$name.snaplog" 2>/dev/null; then
        pass=$((pass + 1)); echo "PASS  $name: $THREADS threads x 2 devices x $OPS ops ($((SECONDS - start)) s)"
        grep -E "^dev |^ledger consistency" "$work/$name.log" | sed 's/^/      /'
        echo "      snapshots: $snaps of $asked asked written while it ran"
    else
        fail=$((fail + 1)); echo "FAIL  $name (exit $rc, ${snaps:-0} snapshot(s) of $asked asked)"
        tail -n 40 "$work/$name.log" "$work/$name.snaplog" 2>/dev/null | sed 's/^/      | /'
    fi
}
soak "soak ASan+UBSan" "$ASAN_B" libasan.so \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
soak "soak TSan" "$TSAN_B" libtsan.so \
    TSAN_OPTIONS="halt_on_error=1:exitcode=66:report_signal_unsafe=0:suppressions=$root/tests/tsan.supp"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
