#!/usr/bin/env bash
# e2e_pair.sh PROGRAM: one end-to-end program run without the shim and with it (PRELOAD,
# OOMGUARD_DIR from the caller).  Passes when both runs pass, the run without the shim really
# ran without it, the run with it compared the ledger, and both made the same checks of the
# program's own calls ("api checks: N", or "N checks" for programs that count their own):
# the shim changed no result the program looks at.
set -u
prog=$1
without=$(env -u LD_PRELOAD "$prog" 2>&1); rc0=$?
with=$(env LD_PRELOAD="$PRELOAD" "$prog" 2>&1); rc1=$?
count() {   # the program's own checks
    local n
    n=$(printf '%s\n' "$1" | grep -oE '^api checks: [0-9]+' | grep -oE '[0-9]+$' | tail -n 1)
    [ -n "$n" ] || n=$(printf '%s\n' "$1" | grep -oE '[0-9]+ checks' | head -n 1 | grep -oE '^[0-9]+')
    echo "${n:-none}"
}
n0=$(count "$without") n1=$(count "$with")
ok=1
[ $rc0 = 0 ] || { echo "without the shim: exit $rc0"; printf '%s\n' "$without" | grep FAIL | head; ok=0; }
[ $rc1 = 0 ] || { echo "with the shim: exit $rc1"; printf '%s\n' "$with" | grep FAIL | head; ok=0; }
if printf '%s\n' "$without" | grep -q "ledger comparison skipped"; then :; elif printf '%s\n' "$without" | grep -q "api checks"; then
    echo "the run without the shim found a shim"; ok=0
fi
if printf '%s\n' "$with" | grep -q "ledger comparison skipped"; then echo "the run with the shim did not find it"; ok=0; fi
[ "$n0" != none ] && [ "$n0" = "$n1" ] || { echo "checks of the program's own calls: $n0 without the shim, $n1 with it"; ok=0; }
[ $ok = 1 ] && echo "$prog: $n0 checks of its own calls, the same with and without the shim"
