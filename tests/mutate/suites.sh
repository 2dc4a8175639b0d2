#!/usr/bin/env bash
# One named test suite of oomguard, in the environment tests/run_tests.sh gives it, for the
# mutation harness (tests/mutate/mutate.py) and anyone who wants to run a single suite:
#
#   B=build-x bash tests/mutate/suites.sh SUITE
#
# Exits non-zero when the suite fails.  Suites: unit regress e2e drivers limit stacks scenarios
# dumps launcher corpus adapter real_torch cli stats (the same as tests/run_tests.sh runs, less the
# simulator's self-test and the runs without the shim).  `cli` leaves out what only measures the machine (the performance limits, the
# fuzzer, headless Chromium): under a mutation campaign the machine is busy by design.
set -u
B=${B:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export LD_LIBRARY_PATH="$ROOT/$B/sim"
export SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB"
SHIM="$ROOT/$B/liboomguard.so"
work=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-suite.XXXXXX")
trap 'rm -rf "$work"' EXIT
with_shim() { env LD_PRELOAD="$SHIM" OOMGUARD_DIR="$work" "$@"; }

case ${1:-} in
unit)
    rc=0 n=0
    for t in "$B"/tests/unit_*; do
        [ -x "$t" ] || continue
        n=$((n + 1))
        # cmocka names each failing test ("[  FAILED  ] name"); a crash names the program
        env CMOCKA_MESSAGE_OUTPUT=stdout "$t" >"$work/unit.log" 2>&1
        r=$?
        cat "$work/unit.log"
        if [ $r != 0 ]; then
            rc=1
            grep -q '^\[  FAILED  \] [^0-9]' "$work/unit.log" || echo "FAIL  $(basename "$t") (exit $r)"
        fi
    done
    [ $n -gt 0 ] || { echo "FAIL  no unit test in $B/tests"; rc=1; }
    exit $rc ;;
regress)
    exec env B="$B" PRELOAD="$SHIM" bash tests/regress/run_regressions.sh ;;
e2e)
    rc=0
    for p in $(grep -v '^#' tests/e2e/ledger_programs.txt); do
        with_shim "$B/tests/e2e_$p" || { echo "FAIL  e2e $p"; rc=1; }
    done
    with_shim env SIMGPU_FAIL_PROB=0.01 SIMGPU_SEED=7 OOMGUARD_QUIET=1 STRESS_OPS=20000 "$B/tests/e2e_stress" ||
        { echo "FAIL  e2e stress"; rc=1; }
    exit $rc ;;
limit)
    exec env B="$B" PRELOAD="$SHIM" bash tests/e2e/run_limit.sh ;;
drivers)
    exec env B="$B" PRELOAD="$SHIM" bash tests/e2e/run_drv.sh ;;
stacks)
    exec env B="$B" PRELOAD="$SHIM" bash tests/stacks/run_tests.sh ;;
dumps)
    exec env B="$B" PRELOAD="$SHIM" bash tests/e2e/run_dumps.sh ;;
corpus)
    exec env B="$B" PRELOAD="$SHIM" python3 tests/scenarios/run_scenarios.py ;;
stats)
    exec make -s --no-print-directory B="$B" test-stats ;;
scenarios)
    exec env B="$B" PRELOAD="$SHIM" bash tests/e2e/run_scenarios.sh ;;
launcher)
    exec env B="$B" bash tests/e2e/run_launcher.sh ;;
adapter)
    exec env B="$B" PRELOAD="$SHIM" bash tests/adapter/run_tests.sh ;;
real_torch)
    exec env B="$B" bash tests/adapter/real_torch/run_tests.sh ;;
cli)
    # FUZZ_CC that does not exist: the fuzz smoke is skipped; the performance and browser
    # checks still run but their FAIL lines are ignored by the harness (see mutate.py)
    exec env B="$B" FUZZ_CC=/nonexistent/clang bash tests/cli/run_tests.sh ;;
*)
    echo "usage: B=build-dir $0 unit|regress|e2e|drivers|limit|stacks|scenarios|dumps|launcher|corpus|adapter|cli|stats" >&2
    exit 2 ;;
esac
