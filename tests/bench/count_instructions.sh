#!/usr/bin/env bash
# Instructions per alloc+free pair through the null driver, counted by callgrind: unlike time,
# not changed by what else the machine runs, so a change to the fast path can be judged on a
# busy machine.  Two runs (20,000 and 60,000 pairs per thread); their difference divided by
# 40,000 cancels start-up and exit.  The count includes the loop and the null driver (about
# 60 instructions a pair without the shim: NOSHIM=1).  The live page's publisher thread is off
# (OOMGUARD_LIVE=0 unless set): its rounds follow the clock, not the pairs, and under valgrind
# they add about 25 a pair that the allocation path does not run.
#   B=build-x bash tests/bench/count_instructions.sh [THREADS [STACK_DEPTH [FRAMES]]]
set -eu
B=${B:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${1:-1} depth=${2:-0} frames=${3:-}
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }
preload="$root/$B/liboomguard.so"
[ "${NOSHIM:-0}" = 1 ] && preload=
out=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-instr.XXXXXX")
trap 'rm -rf "$out"' EXIT
count() {
    env LD_LIBRARY_PATH="$root/$B/tests/bench/null" LD_PRELOAD="$preload" OOMGUARD_STACK_DEPTH="$depth" \
        OOMGUARD_LIVE="${OOMGUARD_LIVE:-0}" \
        OOMGUARD_QUIET=1 OOMGUARD_DIR="$out" \
        valgrind --tool=callgrind --callgrind-out-file=/dev/null "$root/$B/tests/bench/null_bench" "$threads" "$1" \
        $frames 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
a=$(count 20000)
b=$(count 60000)
[ -n "$a" ] && [ -n "$b" ] || { echo "callgrind gave no count" >&2; exit 1; }
echo $(( (b - a) / (40000 * threads) ))
