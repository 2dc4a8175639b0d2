# Sourced by the command-line suites (tests/cli/run_tests.sh, tests/stats/run_tests.sh): one "ok"/"FAIL"/"SKIP"
# line per check and the closing "N passed, N failed[, N skipped]" line.  Uses $T (the suite's scratch
# directory: expect leaves the command's output in $T/out and $T/err); CHECK_DETAIL_LINES (lines of a
# failure's detail shown, 15) and EXPECT_TIMEOUT (seconds a command may take under expect; unset: no limit).
passed=0 failed=0 skipped=0
ok() { passed=$((passed + 1)); printf 'ok    %s\n' "$1"; }
bad() {
    failed=$((failed + 1))
    printf 'FAIL  %s\n' "$1"
    [ $# -gt 1 ] && printf '%s\n' "$2" | head -"${CHECK_DETAIL_LINES:-15}" | sed 's/^/      /'
    return 0
}
skip() { skipped=$((skipped + 1)); printf 'SKIP  %s (%s)\n' "$1" "$2"; }
# expect NAME WANT_RC CMD... : runs CMD, output in $T/out, $T/err
expect() {
    local name=$1 want=$2
    shift 2
    if [ -n "${EXPECT_TIMEOUT:-}" ]; then
        timeout "$EXPECT_TIMEOUT" "$@" >"$T/out" 2>"$T/err"
    else
        "$@" >"$T/out" 2>"$T/err"
    fi
    local rc=$?
    if [ "$rc" = "$want" ]; then ok "$name"; else bad "$name" "exit $rc, wanted $want; stderr: $(head -c 600 "$T/err")"; fi
}
# has NAME FILE PATTERN : FILE contains the fixed string PATTERN (hasnt: does not)
has() { if grep -qF -- "$3" "$2"; then ok "$1"; else bad "$1" "no '$3' in $(head -c 800 "$2")"; fi; }
hasnt() { if grep -qF -- "$3" "$2"; then bad "$1" "found '$3'"; else ok "$1"; fi; }
# checks_end: the summary line; the suite's exit status (0 when nothing failed)
checks_end() {
    if [ "$skipped" -gt 0 ]; then
        echo "$passed passed, $failed failed, $skipped skipped"
    else
        echo "$passed passed, $failed failed"
    fi
    [ "$failed" = 0 ]
}
