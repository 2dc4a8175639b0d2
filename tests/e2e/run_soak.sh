#!/usr/bin/env bash
# make soak: 16 threads x 2 devices x SOAK_OPS (default 1M) random allocations and frees per
# thread, 1% of them failed by the simulated driver, under the ASan+UBSan build and under the
# ThreadSanitizer build.  Passes when the ledger equals the simulator's truth to the byte,
# every failure is counted, and neither sanitizer reports anything (a report stops the
# program with a non-zero status).  Takes minutes to tens of minutes; `make test` runs the
# same program at 8 x 100k.  Ends with "N passed, N failed".
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
    mkdir -p "$work/$name"
    env "$@" LD_LIBRARY_PATH="$root/$b/sim" SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB" \
        SIMGPU_FAIL_PROB=0.01 SIMGPU_SEED=2026 OOMGUARD_QUIET=1 OOMGUARD_DIR="$work/$name" \
        STRESS_THREADS="$THREADS" STRESS_OPS="$OPS" \
        LD_PRELOAD="$("${CC:-cc}" -print-file-name="$rt") $root/$b/liboomguard.so" \
        "$root/$b/tests/e2e_stress" >"$work/$name.log" 2>&1
    local rc=$?
    if [ $rc = 0 ] && ! grep -q "Sanitizer\|runtime error" "$work/$name.log"; then
        pass=$((pass + 1)); echo "PASS  $name: $THREADS threads x 2 devices x $OPS ops ($((SECONDS - start)) s)"
        grep -E "^dev |^ledger consistency" "$work/$name.log" | sed 's/^/      /'
    else
        fail=$((fail + 1)); echo "FAIL  $name (exit $rc)"; tail -n 40 "$work/$name.log" | sed 's/^/      | /'
    fi
}
soak "soak ASan+UBSan" "$ASAN_B" libasan.so \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
soak "soak TSan" "$TSAN_B" libtsan.so \
    TSAN_OPTIONS="halt_on_error=1:exitcode=66:report_signal_unsafe=0:suppressions=$root/tests/tsan.supp"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
