#!/usr/bin/env bash
# House rules a reviewer would otherwise check by hand, checked on every `make test`:
#  - every phony target of the makefiles is described in `make help` (its line carries a `## ` comment);
#  - every mutant of tests/mutate/mutants.txt still finds its snippet;
#  - the pure layers (analysis/, common/) include nothing of the shim and keep no writable state;
#  - docs/dump-format.md names every id of memory.unmeasured_ids, every remedy id and every cause id;
#  - every C source is laid out as .clang-format says (`make format` fixes it);
#  - code, makefiles, tests and docs name what a thing is ("the scenario corpus"), never a numbered work item
#    that a newcomer cannot look up.
# Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"
suite_init lint
cd "$root"

mk_files=$(ls Makefile ./*/*.mk ./*/*/*.mk 2>/dev/null)

# 1. make help lists every phony target
help=$(make -s --no-print-directory help 2>&1)
missing=""
for t in $(sed -n 's/^\.PHONY:[[:space:]]*//p' $mk_files | tr ' ' '\n' | sort -u); do
    printf '%s\n' "$help" | grep -qE "^  $t( |$)" || missing="$missing $t"
done
[ -z "$missing" ]; result $? "make help describes every phony target" "undescribed:$missing"

# 2. no numbered work items in what is shipped or run
refs=$(git ls-files -- ':!*.png' ':!*.pkl' ':!tests/lint/run_lint.sh' 2>/dev/null |
       xargs grep -nIE '\b[Ii]ssues? ?#?[0-9]+\b|\b[Ii]tems? [0-9]+(-[0-9]+)?\b|\bsession [0-9]+\b' 2>/dev/null)
[ -z "$refs" ]; result $? "no numbered work items in code, makefiles, tests or docs" "$refs"

# 3. every mutant of `make mutate` still applies to the code it stands for (a stale snippet tests nothing)
stale=$(python3 tests/mutate/mutate.py --check 2>&1 | grep '^stale')
[ -z "$stale" ]; result $? "every mutant of make mutate applies to today's code" "$stale"

# 4. one layout: every C source as .clang-format says
if command -v clang-format >/dev/null; then
    fmt=$(git ls-files '*.c' '*.h' | xargs clang-format --dry-run --style=file 2>&1 | grep -o '^[^:]*:[0-9]*' | sort -u | head -20)
    [ -z "$fmt" ]; result $? "every C source follows .clang-format (make format)" "$fmt"
else
    skip=$((skip + 1)); echo "SKIP  every C source follows .clang-format (clang-format is not installed: make deps)"
fi

# 5. the dump format documents every id of memory.unmeasured_ids (common/unmeasured.def)
undoc=$(python3 - <<'PY'
import re
ids = re.findall(r'^X\(\w+, "(\w+)"', open("common/unmeasured.def").read(), re.M)
row = [l for l in open("docs/dump-format.md") if l.startswith("| `unmeasured_ids` |")]
print(" ".join(i for i in ids if not row or "`%s`" % i not in row[0]) if ids else "no ids read")
PY
)
[ -z "$undoc" ]; result $? "docs/dump-format.md names every id of common/unmeasured.def" "missing: $undoc"

# 5b. ... and every remedy id of analysis/remedies.def and cause id of common/causes.def: users (and the writers of
#     the blind scenarios, who read only the docs) learn the ids there
undoc=$(python3 - <<'PY'
import re
doc = open("docs/dump-format.md").read()
ids = [i for f in ("analysis/remedies.def", "common/causes.def")
       for i in re.findall(r'^X\(\w+,\s*"(\w+)"', open(f).read(), re.M)]
print(" ".join(i for i in ids if "`%s`" % i not in doc) if ids else "no ids read")
PY
)
[ -z "$undoc" ]; result $? "docs/dump-format.md names every remedy and cause id" "missing: $undoc"

# 6. the analysis is pure: a record in, a diagnosis out. Nothing of the recorder's headers (CUDA, og.h) is
#    included, and its objects and common/'s have no writable data (.data/.bss): tables are const.
deps=$(grep -nE '#include *"(\.\./)?(shim/)?(og|og_test|ledger_int|live|dump_render)\.h"|#include *<cuda' analysis/*.[ch] common/*.[ch] 2>/dev/null)
[ -z "$deps" ]; result $? "analysis/ and common/ include nothing of the shim" "$deps"
B=${B:-build}
writable=""
# (a sanitizer's instrumented globals live in writable sections whatever the source says: the plain build checks)
[ -n "${SANITIZE:-}" ] || for o in "$B"/analysis/*.o "$B"/common/*.o; do
    [ -f "$o" ] || continue
    n=$(size -A "$o" | awk '$1 ~ /^\.(data|bss)($|\.)/ && $1 !~ /rel\.ro/ && $2 > 0 {print $1}')
    [ -z "$n" ] || writable="$writable ${o#"$B"/}:$n"
done
[ -z "$writable" ]; result $? "analysis/ and common/ keep no writable state" "$writable"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
