#!/usr/bin/env bash
# The role and phase code on the real PyTorch API (Debian's python3-torch, a CPU build, for the
# system interpreter) and, with the same checks, on the stand-in torch the adapter tests use (on the
# simulated GPU).  Ends with one line "N passed, N failed[, N skipped]".
#   B  build directory (default: build): $B/sim holds the simulated GPU
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
B=${B:-build}
case "$B" in /*) BDIR=$B ;; *) BDIR=$ROOT/$B ;; esac
REAL_PY=${REAL_PYTHON:-/usr/bin/python3}
T=tests/adapter/real_torch/test_roles_phase.py
unset PYTHONPATH LD_PRELOAD OOMGUARD_ROLES_BUDGET_MS
pass=0 fail=0 skip=0
count() { # count LOG: adds the log's summary line
    local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -n 1)
    [ -n "$line" ] || { fail=$((fail + 1)); echo "FAIL  no summary line"; return; }
    pass=$((pass + $(echo "$line" | grep -oE '^[0-9]+')))
    fail=$((fail + $(echo "$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')))
    skip=$((skip + $(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)))
}
log=$(mktemp); trap 'rm -f "$log"' EXIT
echo "== the real torch ($REAL_PY)"
if [ -x "$REAL_PY" ]; then
    PYTHONDONTWRITEBYTECODE=1 "$REAL_PY" "$T" > "$log" 2>&1; cat "$log"; count "$log"
else
    echo "SKIP  no $REAL_PY"; skip=$((skip + 1))
fi
echo "== the stand-in torch, the same shared checks"
if [ "${SANITIZE:-}" = thread ]; then
    # no LD_PRELOAD here: the TSan-built simulated GPU cannot load into a Python without the TSan
    # runtime (static TLS block, docs/testing.md)
    echo "SKIP  the stand-in torch: not under TSan (the simulated GPU is TSan-built, the runtime not loaded)"
    skip=$((skip + 1))
else
    LD_LIBRARY_PATH="$BDIR/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SIMGPU_DEVICES=1 SIMGPU_MEM=2560MiB \
        FAKE_TORCH_LIBC10="$BDIR/tests/adapter/libc10_cuda.so" \
        PYTHONDONTWRITEBYTECODE=1 "${PYTHON:-python3}" "$T" --stand-in > "$log" 2>&1
    cat "$log"; count "$log"
fi
echo "$pass passed, $fail failed$([ $skip != 0 ] && echo ", $skip skipped")"
[ $fail = 0 ]
