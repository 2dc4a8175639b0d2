#!/usr/bin/env bash
# tests/reader: a real dump with requests of 2^53+1 and SIZE_MAX bytes read
# exactly by every reader of the `oomguard` command (report in each format, merge, stats), the
# shim's own evidence for it exact, and CUDA arrays leaving the ledger with their context.
# Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init reader
ROOT=$root T=$work
cd "$ROOT"
OG="$ROOT/$B/oomguard"
PROG="$ROOT/$B/tests/reader_bignum"
export LD_LIBRARY_PATH="$ROOT/$B/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB"
unset OOMGUARD_DIR OOMGUARD_LIMIT OOMGUARD_MAX_DUMPS
check() { result "$@"; }
# py NAME SCRIPT ARGS...: a Python check that prints nothing when it holds
py() {
    local name=$1 script=$2; shift 2
    local o; o=$(python3 -c "$script" "$@" 2>&1)
    check $([ -z "$o" ]; echo $?) "$name" "$o"
}
BIG=18446744073709551615 MID=9007199254740993   # SIZE_MAX, 2^53+1

# ---- a real dump: the program asks for 2^53+1 and SIZE_MAX bytes under the shim ----------
mkdir -p "$T/huge"
out=$(env OOMGUARD_DIR="$T/huge" OOMGUARD_QUIET=1 OOMGUARD_MAX_DUMPS=10 LD_PRELOAD="$PRELOAD" "$PROG" huge 2>&1)
check $? "the program: requests of 2^53+1 and SIZE_MAX fail as out of memory, the ledger matches" "$out"
D=$(ls "$T"/huge/oomguard-*.json 2>/dev/null | head -n 1)
if [ -z "$D" ]; then
    result 1 "a dump was written" "$(ls -la "$T/huge")"
    echo "$pass passed, $fail failed"
    exit 1
fi

# the shim wrote them as exact integers, evidence included (a double made SIZE_MAX 2^64)
py "dump: requested_bytes, history and evidence are exact integers" '
import json, sys
d = json.load(open(sys.argv[1]))
big, mid = 2**64 - 1, 2**53 + 1
assert d["event"]["requested_bytes"] == big, d["event"]["requested_bytes"]
ev = [e["bytes"] for e in d["history"]["events"] if e["op"] == "fail"]
assert mid in ev and big in ev, ev
for c in d["diagnosis"]["causes"]:
    for k, v in c["evidence"].items():
        if k.endswith("_bytes"):
            assert isinstance(v, int) and 0 <= v <= big, (c["id"], k, v)
        if k == "requested_bytes":
            assert v == big, (c["id"], k, v)
        if k == "missing_bytes" and d["diagnosis"]["shortfall_bytes"] is not None:
            assert v == d["diagnosis"]["shortfall_bytes"], (k, v, d["diagnosis"]["shortfall_bytes"])
' "$D"

# every integer of the dump past 2^53, by path: what a reader must give back exactly
python3 - "$D" >"$T/bigpaths" <<'PY'
import json, sys
def walk(x, p):
    if isinstance(x, dict):
        for k, v in x.items(): walk(v, p + [k])
    elif isinstance(x, list):
        for i, v in enumerate(x): walk(v, p + [i])
    elif isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 2**53:
        print(json.dumps([p, x]))
walk(json.load(open(sys.argv[1])), [])
PY
n=$(wc -l <"$T/bigpaths")
check $([ "$n" -ge 5 ]; echo $?) "dump: $n integers of 2^53 or more to read back" "$(cat "$T/bigpaths")"

# ---- oomguard report, every format ------------------------------------------------------------
"$OG" report "$D" --color never >"$T/r.txt" 2>"$T/err"
check $? "report text: exit 0" "$(cat "$T/err")"
check $(grep -qF "16.00 EiB (18,446,744,073,709,551,615 bytes)" "$T/r.txt"; echo $?) \
    "report text: the request's exact size" "$(head -5 "$T/r.txt")"
check $(! grep -qE "(^| )0 B requested|of 0 B|Requested +0 B" "$T/r.txt"; echo $?) "report text: never \"0 B requested\"" \
    "$(grep -nE "0 B" "$T/r.txt")"
check $(grep -qF "requested_bytes                  16.00 EiB (18,446,744,073,709,551,615 bytes)" "$T/r.txt"; echo $?) \
    "report text: the evidence's exact size" "$(grep -n requested_bytes "$T/r.txt")"

"$OG" report "$D" --format json -o "$T/r.json" 2>"$T/err"
check $? "report json: exit 0" "$(cat "$T/err")"
py "report json: every integer past 2^53 as in the dump, exactly" '
import json, sys
r = json.load(open(sys.argv[1]))
for line in open(sys.argv[2]):
    p, want = json.loads(line)
    x = r
    for k in p: x = x[k]
    assert x == want and isinstance(x, int), (p, x, want)
' "$T/r.json" "$T/bigpaths"

"$OG" report "$D" --format html -o "$T/r.html" 2>"$T/err"
check $? "report html: exit 0" "$(cat "$T/err")"
check $(grep -qF "16.00 EiB (18,446,744,073,709,551,615 bytes)" "$T/r.html"; echo $?) "report html: the request's exact size"
check $(grep -qF 'Requested</div><div class="v">16.00 EiB<' "$T/r.html" &&
        grep -qF 'Failed request<span class="n">16.00 EiB<' "$T/r.html"; echo $?) "report html: the request in the figures, not 0 B"

"$OG" report "$D" --format memory-viz -o "$T/r.pickle" 2>"$T/err"
check $? "report memory-viz: exit 0" "$(cat "$T/err")"
py "memory-viz: the oom trace entries carry 2^53+1 and SIZE_MAX exactly" '
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
sizes = [e["size"] for tr in s["device_traces"] for e in tr if e["action"] == "oom"]
assert 2**53 + 1 in sizes and 2**64 - 1 in sizes, sizes
' "$T/r.pickle"

# ---- merge and stats ---------------------------------------------------------------------------
"$OG" merge "$T/huge" --color never >"$T/m.txt" 2>"$T/err"
check $? "merge text: exit 0" "$(cat "$T/err")"
check $(grep -qF "16.00 EiB" "$T/m.txt" && ! grep -q "skipped" "$T/m.txt"; echo $?) "merge text: the request, nothing skipped" \
    "$(cat "$T/m.txt")"
"$OG" merge "$T/huge" --format json -o "$T/m.json" 2>"$T/err"
check $? "merge json: exit 0" "$(cat "$T/err")"
py "merge json: requested_bytes exact" '
import json, sys
m = json.load(open(sys.argv[1]))
reqs = [r["requested_bytes"] for j in m["jobs"] for r in j["ranks"]]
assert reqs == [2**64 - 1], reqs
' "$T/m.json"
"$OG" stats "$T/huge" --format json -o "$T/s.json" 2>"$T/err"
check $? "stats json: exit 0" "$(cat "$T/err")"
py "stats: the dump counted, not skipped" '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["dumps"] == 1 and s["skipped"] == 0, (s["dumps"], s["skipped"])
' "$T/s.json"

# ---- what does not fit 64 bits is refused, with the exact text in the message -------------------
sed "s/\"requested_bytes\":$BIG/\"requested_bytes\":18446744073709551616/" "$D" >"$T/over.json"
"$OG" report "$T/over.json" >/dev/null 2>"$T/err"
rc=$?
check $([ $rc = 2 ] && grep -qF "event.requested_bytes: expected a non-negative integer below 2^64, found 18446744073709551616" "$T/err"; echo $?) \
    "2^64: refused (exit $rc), the number quoted as written" "$(cat "$T/err")"
sed "s/\"requested_bytes\":$BIG/\"requested_bytes\":1.8446744073709552e19/" "$D" >"$T/float.json"
"$OG" report "$T/float.json" >/dev/null 2>"$T/err"
check $([ $? = 2 ] && grep -qF "below 2^64" "$T/err"; echo $?) "a size past 2^53 written as a float: refused, never rounded" "$(cat "$T/err")"
sed "s/\"requested_bytes\":$BIG/\"requested_bytes\":$MID/" "$D" >"$T/mid.json"
"$OG" report "$T/mid.json" --format json 2>"$T/err" | grep -q "\"requested_bytes\":.$MID,"
check $? "2^53+1 read back as 2^53+1, not 2^53" "$(cat "$T/err")"

# strings full of digits, quotes and backslashes next to the numbers do not put the reader out of step
python3 - "$D" "$T/strings.json" <<'PY'
import sys
t = open(sys.argv[1]).read()
t = t.replace('"op":"fail"', '"op":"fail \\"12345678901234567890\\", -7, 3.5e70 \\\\", "x12345678901234567":-12345678901234567', 1)
open(sys.argv[2], "w").write(t)
PY
"$OG" report "$T/strings.json" --format json -o "$T/strings.out.json" 2>"$T/err"
check $? "digits inside strings: exit 0" "$(cat "$T/err")"
py "digits inside strings: every integer past 2^53 still exact" '
import json, sys
r = json.load(open(sys.argv[1]))
for line in open(sys.argv[2]):
    p, want = json.loads(line)
    x = r
    for k in p: x = x[k]
    assert x == want, (p, x, want)
assert r["history"]["events"][0]["x12345678901234567"] == -12345678901234567, r["history"]["events"][0]
' "$T/strings.out.json" "$T/bigpaths"

# ---- what a JSON parser may read silently, a reader of evidence refuses -----------------------
# a key given twice (readers disagree on which counts), "\u0000" (cut strings), numbers that underflow
python3 - "$D" "$T" <<'PY'
import sys
t, T = open(sys.argv[1]).read(), sys.argv[2]
def case(name, old, new):
    assert old in t, old
    open(f"{T}/refuse-{name}.json", "w").write(t.replace(old, new, 1))
case("dup-top", '"status":"oom",', '"status":"oom","status":"recovered",')
case("dup-event", '"event":{', '"event":{"device":1,')
case("dup-history", '"history":{', '"history":{"peak_bytes":1,')
case("dup-deep", '"event":{', '"event":{"x":{"a":1,"b":2,"a":3},')
case("nul-value", '"cmdline":"', '"cmdline":"./x\\u0000 --token=hidden ')
case("nul-key", '"event":{', '"event":{"a\\u0000b":1,')
case("underflow-bytes", '"requested_bytes":18446744073709551615', '"requested_bytes":1e-400')
case("underflow-float", '"time":', '"time":0.' + "0" * 400 + '1,"x":')
case("underflow-neg", '"time":', '"time":-2.5E-330,"x":')
# look-alikes that stay readable: an escaped backslash before u0000, zeros, a small normal number
open(f"{T}/accept-lookalikes.json", "w").write(t.replace('"cmdline":"', '"cmdline":"\\\\u0000 ', 1)
    .replace('"time":', '"t0":0,"t1":0e-400,"t2":-0.0,"t3":2.3e-308,"time":', 1))
PY
for f in "$T"/refuse-*.json; do
    name=$(basename "$f" .json)
    "$OG" report "$f" >/dev/null 2>"$T/err"; rc=$?
    case $name in
        refuse-dup*) want="given twice" ;;
        refuse-nul*) want='\u0000' ;;
        *) want="too small" ;;
    esac
    check $([ $rc = 2 ] && grep -qF "$want" "$T/err"; echo $?) "$name: refused (exit $rc): $(head -c 160 "$T/err")"
done
"$OG" report "$T/accept-lookalikes.json" >"$T/look.txt" 2>"$T/err"
check $? "an escaped backslash before u0000, 0e-400, -0.0 and 2.3e-308 are read" "$(cat "$T/err")"
check $(grep -qF '\u0000' "$T/look.txt"; echo $?) "the escaped backslash is shown as text" "$(grep -n command "$T/look.txt")"

# ---- CUDA arrays leave the ledger with their context ------------------------------------------
out=$(env OOMGUARD_QUIET=1 OOMGUARD_DIR="$T" LD_PRELOAD="$PRELOAD" "$PROG" ctxarrays 2>&1)
check $? "arrays: cuCtxDestroy and a primary context released to zero drop their blocks (ledger == driver)" "$out"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
