#!/usr/bin/env bash
# Runs one example under liboomguard.so on the simulated GPU and shows the report.
#   examples/run_example.sh BUILD_DIR NAME
# The settings of each scenario (device size, other processes...) are below.
set -u
B=${1:-build}
name=${2:-fragmentation}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OOMGUARD_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/oomguard-demo.XXXXXX")}
mkdir -p "$out"

export LD_LIBRARY_PATH="$root/$B/sim:$root/$B/examples${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SIMGPU_DEVICES=${SIMGPU_DEVICES:-1} SIMGPU_MEM=${SIMGPU_MEM:-24GiB}
export SIMGPU_NAME=${SIMGPU_NAME:-"NVIDIA A10G (simulated)"} SIMGPU_CC=${SIMGPU_CC:-8.6}
export OOMGUARD_FRAMEWORK=pytorch OOMGUARD_FRAMEWORK_LIBS=libminitorch.so
case "$name" in
    other_processes) export SIMGPU_OTHER_PROCS=${SIMGPU_OTHER_PROCS:-"0:4242:Xorg:3GiB;0:4343:jupyter-kernel:9GiB"} ;;
    non_framework)   export SIMGPU_CTX_OVERHEAD=${SIMGPU_CTX_OVERHEAD:-2GiB} ;;
esac

echo "== running examples/$name.c under liboomguard.so (simulated $SIMGPU_MEM GPU); dumps go to $out"
if [ -x "$root/$B/oomguard" ]; then
    "$root/$B/oomguard" run --dir "$out" -- "$root/$B/examples/$name"
else
    OOMGUARD_DIR="$out" LD_PRELOAD="$root/$B/liboomguard.so" "$root/$B/examples/$name"
fi
rc=$?
echo "== exit status $rc"
dump=$(ls -t "$out"/oomguard-*.json 2>/dev/null | head -n 1)
if [ -z "$dump" ]; then
    echo "no dump was written"; exit 1
fi
echo "== report of $dump"
if [ -x "$root/$B/oomguard" ]; then
    "$root/$B/oomguard" report "$dump"
else
    cat "${dump%.json}.txt"
fi
