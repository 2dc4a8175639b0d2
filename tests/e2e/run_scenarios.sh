#!/usr/bin/env bash
# Runs every example under the shim and checks its dump (tests/e2e/check_scenario.py).
# Also: bad OOMGUARD_DIR, a symlink planted where the dump goes, a bad threshold value.
# Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init scen
export LD_LIBRARY_PATH="$root/$B/sim:$root/$B/examples"
export OOMGUARD_FRAMEWORK=pytorch OOMGUARD_FRAMEWORK_LIBS=libminitorch.so OOMGUARD_QUIET=1

scenario() {   # scenario NAME PROGRAM EXPECTED_EXIT [ENV...]
    local name=$1 prog=$2 want=$3; shift 3
    local dir="$work/$name"; mkdir -p "$dir"
    env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB SIMGPU_CC=8.6 SIMGPU_TRUTH_FILE="$dir/truth.jsonl" \
        OOMGUARD_DIR="$dir" LD_PRELOAD="$PRELOAD" "$@" "$root/$B/examples/$prog" >"$dir/out.log" 2>&1
    local rc=$?
    local dump; dump=$(ls "$dir"/oomguard-*.json 2>/dev/null | head -n 1)
    if [ "$rc" != "$want" ] || [ -z "$dump" ]; then
        result 1 "$name: exit $rc (want $want), dump '${dump}'"; sed 's/^/      | /' "$dir/out.log" | tail -20; return
    fi
    if python3 "$root/tests/e2e/check_scenario.py" "$name" "$dump" "$dir/truth.jsonl" >"$dir/check.log" 2>&1; then
        result 0 "$name ($(grep -c '^ok' "$dir/check.log") checks)"
    else
        result 1 "$name"; grep -v '^ok' "$dir/check.log" | sed 's/^/      | /'
    fi
    # the real dump renders in every format
    local bad=""
    for fmt in text json html memory-viz; do
        "$root/$B/oomguard" report "$dump" --format "$fmt" -o "$dir/report.$fmt" >/dev/null 2>"$dir/report.err" &&
            [ -s "$dir/report.$fmt" ] || bad="$bad $fmt"
    done
    python3 -c 'import pickle,sys; d=pickle.load(open(sys.argv[1],"rb")); assert "segments" in d and "device_traces" in d' \
        "$dir/report.memory-viz" 2>/dev/null || bad="$bad memory-viz(load)"
    result $([ -z "$bad" ]; echo $?) "$name: oomguard report renders the dump as text, json, html, memory-viz${bad:+ (failed:$bad)}"
    # and the same program under `oomguard run`: status passed through, dump listed
    local rdir="$dir/run"; mkdir -p "$rdir"
    env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB SIMGPU_CC=8.6 "$@" "$root/$B/oomguard" run --dir "$rdir" -- \
        "$root/$B/examples/$prog" >"$dir/run.log" 2>&1
    local rrc=$?
    result $([ "$rrc" = "$want" ] && grep -q "dump written\|dumps written" "$dir/run.log"; echo $?) \
        "$name under oomguard run: exit $rrc (want $want), dump listed"
}

scenario too_big too_big 3
scenario fragmentation fragmentation 3
scenario fragmentation_expandable_set fragmentation 3 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
scenario other_processes other_processes 3 SIMGPU_OTHER_PROCS="0:4242:Xorg:3GiB;0:4343:jupyter-kernel:9GiB"
scenario non_framework non_framework 3 SIMGPU_CTX_OVERHEAD=2GiB
scenario growth growth 3
scenario cache_held cache_held 3
scenario recovered recovered 0

# --- hostile places to write: the program carries on, the user is told once
d="$work/unwritable"; mkdir -p "$d"; chmod 555 "$d"
out=$(env SIMGPU_MEM=24GiB OOMGUARD_DIR="$d" TMPDIR="$work/tmpfallback" LD_PRELOAD="$PRELOAD" \
      "$root/$B/examples/too_big" 2>&1); rc=$?
mkdir -p "$work/tmpfallback"
if [ "$(id -u)" = 0 ]; then
    # root ignores mode bits: use a path below a regular file instead
    out=$(env SIMGPU_MEM=24GiB OOMGUARD_DIR="/dev/null/nope" TMPDIR="$work/tmpfallback" LD_PRELOAD="$PRELOAD" \
          "$root/$B/examples/too_big" 2>&1); rc=$?
fi
n=$(printf '%s\n' "$out" | grep -c "cannot write a dump in")
result $([ $rc = 3 ] && [ "$n" = 1 ] && ls "$work"/tmpfallback/oomguard-*.json >/dev/null 2>&1; echo $?) \
    "unwritable OOMGUARD_DIR: one warning ($n), dump falls back to TMPDIR, exit $rc"

d="$work/symlink"; mkdir -p "$d"; target="$work/victim"; echo "precious" >"$target"
host=$(hostname)
# the dump is named after the pid: the shell plants the symlinks, then exec keeps its pid
bash -c 'ln -s "$1" "$2/oomguard-$3-$$.json"; ln -s "$1" "$2/oomguard-$3-$$.txt"; shift 3; exec env "$@"' _ \
    "$target" "$d" "$host" SIMGPU_MEM=24GiB OOMGUARD_DIR="$d" LD_PRELOAD="$PRELOAD" "$root/$B/examples/too_big" \
    >/dev/null 2>&1
rc=$?
result $([ $rc = 3 ] && [ "$(cat "$target")" = precious ] && [ -n "$(find "$d" -name 'oomguard-*.json' -type f)" ]; echo $?) \
    "symlink planted at the dump path: nothing written through it, dump written as a file"
perm=$(stat -c %a "$(find "$d" -name 'oomguard-*.json' -type f | head -n 1)" 2>/dev/null)
result $([ "$perm" = 600 ]; echo $?) "dump mode 0600 ($perm)"

# a full disk: every write fails (a file-size limit of 4 KiB, SIGXFSZ ignored as a disk
# does not send it): the program goes on, the user is told, no half-written file is left
d="$work/full"; mkdir -p "$d/a" "$d/b"
out=$(bash -c 'trap "" XFSZ; ulimit -f 4; exec env "$@"' _ SIMGPU_MEM=24GiB OOMGUARD_DIR="$d/a" TMPDIR="$d/b" \
      OOMGUARD_QUIET=0 LD_PRELOAD="$PRELOAD" "$root/$B/examples/too_big" 2>&1); rc=$?
left=$(find "$d" -type f | wc -l)
n=$(printf '%s\n' "$out" | grep -c "cannot write a dump in")
printf '%s\n' "$out" | grep -q "oomguard report\|no writable directory"
told=$?
result $([ $rc = 3 ] && [ "$left" = 0 ] && [ "$n" -ge 1 ] && [ $told = 0 ]; echo $?) \
    "full disk: exit $rc, $left files left behind, user told ($n warning(s)), report on stderr"

out=$(env SIMGPU_MEM=24GiB OOMGUARD_DIR="$work" OOMGUARD_FRAG_SHARE=banana OOMGUARD_STACK_DEPTH=-3 \
      LD_PRELOAD="$PRELOAD" "$root/$B/examples/too_big" 2>&1); rc=$?
n1=$(printf '%s\n' "$out" | grep -c "OOMGUARD_FRAG_SHARE=banana is not valid")
n2=$(printf '%s\n' "$out" | grep -c "OOMGUARD_STACK_DEPTH=-3 is not valid")
result $([ $rc = 3 ] && [ "$n1" = 1 ] && [ "$n2" = 1 ]; echo $?) "bad threshold values: one warning each, defaults used"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
