#!/usr/bin/env bash
# Runs every test suite of oomguard and ends with one line "N passed, N failed".
# Called by `make test` (B = build dir, SANITIZE=1 for the ASan+UBSan build).
set -u
B=${B:-build}
MAKE=${MAKE:-make}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

pass=0 fail=0 skip=0
failed_names=()
LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-tests.XXXXXX")
trap 'rm -rf "$LOG_DIR"' EXIT

SHIM="$ROOT/$B/liboomguard.so"
PRELOAD="$SHIM"
if [ "${SANITIZE:-}" = 1 ]; then
    # The sanitizer runtime must come first in the initial library list.
    PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $SHIM"
    # `oomguard run` puts the shim first in LD_PRELOAD, ahead of the sanitizer runtime that the
    # programs themselves link: allow that order (the runtime is still loaded, from the program)
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:verify_asan_link_order=0}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
elif [ "${SANITIZE:-}" = thread ]; then
    # ThreadSanitizer's runtime must be loaded first, before the shim (see docs/testing.md).
    PRELOAD="$(${CC:-cc} -print-file-name=libtsan.so) $SHIM"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:report_signal_unsafe=0:suppressions=$ROOT/tests/tsan.supp}
fi
export LD_LIBRARY_PATH="$ROOT/$B/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB"

# run NAME CMD...: one test; output kept and shown only on failure
run() {
    local name=$1; shift
    local log="$LOG_DIR/$(echo "$name" | tr ' /' '__').log"
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1)); echo "PASS  $name"
    else
        fail=$((fail + 1)); failed_names+=("$name"); echo "FAIL  $name"
        sed 's/^/      | /' "$log" | tail -n 40
    fi
}

# suite NAME CMD...: a suite that prints its own "N passed, N failed" line; counts are added
suite() {
    local name=$1; shift
    local log="$LOG_DIR/$(echo "$name" | tr ' /' '__').log"
    "$@" >"$log" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^([A-Za-z]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ] && grep -q '^\[==========\] .* test(s) run' "$log"; then
        # cmocka's own summary: [  PASSED  ] N test(s).  /  [  FAILED  ] N test(s)
        local cp cf
        cp=$(grep -E '^\[  PASSED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -n 1)
        cf=$(grep -E '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | head -n 1)
        line="${cp:-0} passed, ${cf:-0} failed"
    fi
    if [ -z "$line" ]; then
        fail=$((fail + 1)); failed_names+=("$name (no summary, exit $rc)")
        echo "FAIL  $name (no summary line, exit $rc)"; tail -n 40 "$log" | sed 's/^/      | /'
        return
    fi
    local p f s
    p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')
    f=$(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || true)
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + ${s:-0}))
    if [ "$f" != 0 ] || [ $rc != 0 ]; then
        [ "$f" = 0 ] && fail=$((fail + 1))
        failed_names+=("$name")
        echo "FAIL  $name: $line (exit $rc)"; grep -E 'FAIL|Error|error' "$log" | head -n 30 | sed 's/^/      | /'
    else
        echo "PASS  $name: $line"
    fi
}

with_shim() { env LD_PRELOAD="$PRELOAD" OOMGUARD_DIR="$LOG_DIR" "$@"; }

echo "== house rules (make help, no numbered work items)"
suite "lint" bash tests/lint/run_lint.sh

echo "== unit tests"
for t in "$B"/tests/unit_*; do
    [ -x "$t" ] || continue
    suite "unit $(basename "$t")" env CMOCKA_MESSAGE_OUTPUT=stdout "$t"
done

echo "== simulated GPU self-test"
if grep -q '^sim-selftest:' sim/sim.mk 2>/dev/null; then
    suite "sim selftest" $MAKE -s --no-print-directory B="$B" SANITIZE="${SANITIZE:-}" sim-selftest
fi

echo "== end-to-end under LD_PRELOAD (ledger == simulated driver, to the byte)"
for p in $(grep -v '^#' tests/e2e/ledger_programs.txt); do
    # one test: without the shim, with it, the same checks of the program's own calls
    run "e2e $p (same results without the shim)" env PRELOAD="$PRELOAD" OOMGUARD_DIR="$LOG_DIR" \
        bash tests/regress/e2e_pair.sh "$B/tests/e2e_$p"
done
run "e2e stress 2 dev x 8 threads x 100k, injected failures" \
    with_shim env SIMGPU_FAIL_PROB=0.01 SIMGPU_SEED=7 OOMGUARD_QUIET=1 "$B/tests/e2e_stress"
run "e2e stress, stacks off" \
    with_shim env SIMGPU_FAIL_PROB=0.02 SIMGPU_SEED=11 OOMGUARD_QUIET=1 OOMGUARD_STACK_DEPTH=0 STRESS_OPS=20000 "$B/tests/e2e_stress"

echo "== real drivers: NVML generations, pools, arrays, contexts, exit, namespaces"
suite "drivers" env B="$B" PRELOAD="$PRELOAD" bash tests/e2e/run_drv.sh

echo "== OOMGUARD_LIMIT, WARN_AT, SUMMARY"
suite "limit" env B="$B" PRELOAD="$PRELOAD" bash tests/e2e/run_limit.sh
suite "stacks" env B="$B" PRELOAD="$PRELOAD" bash tests/stacks/run_tests.sh
suite "reader" env B="$B" PRELOAD="$PRELOAD" bash tests/reader/run_tests.sh

if [ -f tests/e2e/run_scenarios.sh ]; then
    echo "== OOM scenarios (dumps checked against the simulator)"
    suite "scenarios" env B="$B" PRELOAD="$PRELOAD" bash tests/e2e/run_scenarios.sh
fi

suite "dumps" env B="$B" PRELOAD="$PRELOAD" bash tests/e2e/run_dumps.sh
echo "== a hostile process: host malloc failing inside the shim"
suite "hostile" env B="$B" PRELOAD="$PRELOAD" bash tests/hostile/run_hostile.sh
echo "== regressions (bugs that once passed the whole suite)"
suite "regressions" env B="$B" PRELOAD="$PRELOAD" bash tests/regress/run_regressions.sh
echo "== oomguard top and snapshot: three simulated jobs and one without oomguard, against the simulator"
suite "live" env B="$B" PRELOAD="$PRELOAD" bash tests/e2e/run_live.sh
echo "== a 4-rank job under oomguard run, then oomguard merge"
suite "launcher" env B="$B" bash tests/e2e/run_launcher.sh

echo "== PyTorch adapter (stand-in torch on the simulated GPU)"
suite "python adapter" env B="$B" PRELOAD="$PRELOAD" bash tests/adapter/run_tests.sh

echo "== roles and phase on the real PyTorch API (python3-torch, CPU) and on the stand-in"
suite "real torch" env B="$B" bash tests/adapter/real_torch/run_tests.sh

echo "== packaged: make wheel, pip install --no-index into a fresh venv, Jupyter kernel, Kubernetes layout"
suite "packaging" env B="$B" SANITIZE="${SANITIZE:-}" MAKE="$MAKE" bash tests/pkg/run_tests.sh

echo "== README's sample outputs (tools/readme_samples.py makes them by running them)"
if [ -z "${SANITIZE:-}" ]; then
    run "README's sample outputs are what the runs give" python3 tools/readme_samples.py --check --build "$B"
fi

echo "== scenario corpus (realistic failures, an expert's expectations, numbers vs the simulator)"
suite "scenario corpus" env B="$B" PRELOAD="$PRELOAD" SANITIZE="${SANITIZE:-}" python3 tests/scenarios/run_scenarios.py

if grep -q '^test-cli:' tools/tools.mk 2>/dev/null; then
    echo "== oomguard command"
    suite "cli" $MAKE -s --no-print-directory B="$B" SANITIZE="${SANITIZE:-}" test-cli
fi

echo "== oomguard stats, Prometheus format, cluster recipes (stand-in torchrun/srun, two simulated hosts)"
suite "stats" $MAKE -s --no-print-directory B="$B" SANITIZE="${SANITIZE:-}" test-stats

echo
if [ ${#failed_names[@]} -gt 0 ]; then
    echo "failed:"; printf '  %s\n' "${failed_names[@]}"
fi
if [ "$skip" -gt 0 ]; then
    echo "$pass passed, $fail failed, $skip skipped"
else
    echo "$pass passed, $fail failed"
fi
[ "$fail" = 0 ]
