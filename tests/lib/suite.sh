# Sourced by the shell suites that run programs under the shim (tests/e2e/run_*.sh, tests/regress/):
# where things are, a scratch directory, and one PASS/FAIL line per check.  Each suite exports its own
# simulator and OOMGUARD_* environment and prints its own closing "N passed, N failed" line.

# suite_init NAME: root (the checkout), B (build dir, default build), PRELOAD (the shim unless given),
# work (a scratch directory named after NAME, removed on exit), pass=0 fail=0 skip=0
suite_init() {
    B=${B:-build}
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    PRELOAD=${PRELOAD:-$root/$B/liboomguard.so}
    work=$(mktemp -d "${TMPDIR:-/tmp}/oomguard-$1.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    pass=0 fail=0 skip=0
}

# result STATUS NAME [DETAIL]: STATUS 0 passes; a failure shows the last 15 lines of DETAIL, if any
result() {
    if [ "$1" = 0 ]; then
        pass=$((pass + 1)); echo "PASS  $2"
    else
        fail=$((fail + 1)); echo "FAIL  $2"
        [ -n "${3:-}" ] && printf '%s\n' "$3" | tail -n 15 | sed 's/^/      | /'
    fi
    return 0
}
