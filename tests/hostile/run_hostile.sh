#!/usr/bin/env bash
# The shim must never be the reason a program exits or hangs: with every host malloc made
# from inside the shim failing (tests/hostile/failmalloc.c), a multi-threaded allocating
# program exits as it does without the shim, within a timeout, also with OOMGUARD_SUMMARY=1
# (the exit summary reads every shard), and the dump of its final failure is written and
# names what the shim could not keep in memory.unmeasured.  And what the shim costs: a thread
# that allocates once (<= 32 KiB, 2,000 threads), OOMGUARD_HISTORY as a total for the process
# (not per thread), a dump's history bounded by size.  Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"
suite_init hostile
fm="$root/$B/tests/hostile/failmalloc.so" prog="$root/$B/tests/hostile/hostile_malloc"
export SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_QUIET=1

# A sanitizer replaces malloc itself, so a malloc interposer cannot stand in front of it: the
# failing-malloc cases run in the plain build only (CI runs both builds).
if [ -n "${SANITIZE:-}" ]; then
    for c in "without the shim" "1 in 1, SUMMARY=0" "1 in 1, SUMMARY=1" "1 in 3, SUMMARY=0" "1 in 3, SUMMARY=1"; do
        skip=$((skip + 1)); echo "SKIP  shim mallocs failing ($c): the sanitizer owns malloc in this build"
    done
else
    base=$(env LD_PRELOAD="$fm" timeout 120 "$prog" 2>&1); base_rc=$?
    result $([ $base_rc = 0 ]; echo $?) "without the shim: exit 0 ($base_rc)" "$base"

    for every in 1 3; do
        for summary in 0 1; do
            d="$work/every$every-summary$summary"; mkdir -p "$d"
            out=$(env LD_PRELOAD="$fm $PRELOAD" FAILMALLOC_EVERY=$every OOMGUARD_SUMMARY=$summary OOMGUARD_DIR="$d" \
                  timeout 120 "$prog" 2>&1); rc=$?
            name="shim mallocs failing (1 in $every), OOMGUARD_SUMMARY=$summary"
            result $([ $rc = $base_rc ]; echo $?) "$name: same exit status ($rc), no hang" "$out"
            printf '%s\n' "$out" | grep -q "shim mallocs failed: [1-9]"
            result $? "$name: the shim's mallocs did fail" "$out"
            json=$(ls "$d"/oomguard-*.json 2>/dev/null | head -n 1)
            python3 - "$json" "$every" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
unm = d["memory"]["unmeasured"]
assert d["status"] in ("oom", "exit"), d["status"]
# every shim malloc failing: the first tables cannot grow, rings get no buffer, no site can be kept
need = ["ledger:", "history:", "sites:"] if sys.argv[2] == "1" else []
missing = [k for k in need if not any(u.startswith(k) for u in unm)]
assert not missing, (missing, unm)
# each sentence with its id, at the same index
ids = d["memory"]["unmeasured_ids"]
assert len(ids) == len(unm), (ids, unm)
for k, i in (("ledger:", "ledger_blocks"), ("history:", "history"), ("sites:", "sites")):
    assert all(ids[n] == i for n, u in enumerate(unm) if u.startswith(k)), (k, ids, unm)
PY
            result $? "$name: dump written, memory.unmeasured names what is missing" "$(ls "$d")"
        done
    done
fi

# ---- what a thread costs, what the history costs --------------------------------------------
rss="$root/$B/tests/hostile/thread_rss"
# ThreadSanitizer's shadow memory (several bytes for each byte written) and its per-thread state are
# counted in the process's RSS: what the shim itself costs is measured in the plain and ASan builds.
if [ "${SANITIZE:-}" = thread ]; then
    skip=$((skip + 2))
    echo "SKIP  2,000 threads allocating once (<= 32 KiB a thread): TSan's shadow and thread state are in the RSS"
    echo "SKIP  OOMGUARD_HISTORY as a process total (RSS): TSan's shadow of the rings is in the RSS"
else
    field() { printf '%s\n' "$1" | sed -n "s/.* $2 \([0-9.]*\).*/\1/p"; }
    plain=$(THREADS=2000 "$rss" 2>&1); shim=$(THREADS=2000 LD_PRELOAD="$PRELOAD" "$rss" 2>&1)
    a=$(field "$plain" per_thread_kib) b=$(field "$shim" per_thread_kib)
    python3 -c "import sys; sys.exit(not (float('$b') - float('$a') <= 32))" 2>/dev/null
    result $? "2,000 threads allocating once: the shim adds <= 32 KiB a thread (${a:-?} -> ${b:-?} KiB)" "$plain
    $shim"
    small=$(THREADS=8 ALLOCS=60000 OOMGUARD_HISTORY=16 LD_PRELOAD="$PRELOAD" "$rss" 2>&1)
    big=$(THREADS=8 ALLOCS=60000 OOMGUARD_HISTORY=100000 LD_PRELOAD="$PRELOAD" "$rss" 2>&1)
    a=$(field "$small" total_kib) b=$(field "$big" total_kib)
    # the whole process's rings: at most 2 x 100,000 + 1,040 events of 40 bytes (7.7 MiB)
    result $([ -n "$a" ] && [ -n "$b" ] && [ $((b - a)) -le 7900 ]; echo $?) \
        "OOMGUARD_HISTORY=100000, 8 threads x 120,000 events: the history is a process total (+$((${b:-0} - ${a:-0})) KiB)" "$small
    $big"
fi
d="$work/history"; mkdir -p "$d"
out=$(THREADS=2 ALLOCS=50000 OOM_AT_END=1 OOMGUARD_HISTORY=1000000 OOMGUARD_DIR="$d" LD_PRELOAD="$PRELOAD" "$rss" 2>&1)
python3 - "$(ls "$d"/oomguard-*.json 2>/dev/null | head -n 1)" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
n = len(d["history"]["events"])
assert n == 65536, n
assert any(u.startswith("history: the dump shows the newest 65536") for u in d["memory"]["unmeasured"]), d["memory"]["unmeasured"]
PY
result $? "OOMGUARD_HISTORY=1000000: the dump's history is bounded (65,536 events) and says so" "$out"
echo "$pass passed, $fail failed, $skip skipped"
