#!/usr/bin/env bash
# OOMGUARD_LIMIT, OOMGUARD_WARN_AT and OOMGUARD_SUMMARY end to end.  Ends with "N passed, N failed".
set -u
. "$(dirname "$0")/../lib/suite.sh"   # suite_init, result
suite_init limit
prog="$root/$B/tests/e2e_limit"
export LD_LIBRARY_PATH="$root/$B/sim:$root/$B/examples" SIMGPU_DEVICES=2 SIMGPU_MEM="0:24GiB,1:16GiB"
export OOMGUARD_DIR="$work" OOMGUARD_QUIET=1
run() { env LD_PRELOAD="$PRELOAD" "$@"; }

out=$(run env OOMGUARD_LIMIT=1:4GiB "$prog" limit 2>&1); rc=$?
result $rc "limit on device 1 of 2: every API family, frees, memory views (${out##*: })"
[ $rc = 0 ] || printf '%s\n' "$out" | grep FAIL | head -20 | sed 's/^/      | /'

for spec in 1:4096MiB 1:4294967296B "1:25%"; do
    out=$(run env OOMGUARD_LIMIT="$spec" "$prog" limit 2>&1); rc=$?
    result $rc "limit written as $spec"
done

out=$(run env OOMGUARD_LIMIT=1:256MiB "$prog" over 2>&1); rc=$?
result $rc "usage already above the limit: free 0, no error, no wrap"

for bad in banana -5GB 0: 150% 1:0 "1:2GiB,x" ""; do
    out=$(run env OOMGUARD_LIMIT="$bad" "$prog" plain 2>&1); rc=$?
    n=$(printf '%s\n' "$out" | grep -c "OOMGUARD_LIMIT=.* is not valid")
    want=1; [ -z "$bad" ] && want=0
    result $([ $rc = 0 ] && [ "$n" = $want ]; echo $?) "OOMGUARD_LIMIT='$bad': $n warning(s), no limit"
done

# a limit dump says limit; a PyTorch-like allocator under a limit gets the small card's diagnosis
d="$work/lim"; mkdir -p "$d"
env SIMGPU_DEVICES=1 SIMGPU_MEM=80GiB OOMGUARD_LIMIT=24GiB OOMGUARD_DIR="$d" OOMGUARD_FRAMEWORK=pytorch \
    OOMGUARD_FRAMEWORK_LIBS=libminitorch.so LD_PRELOAD="$PRELOAD" "$root/$B/examples/fragmentation" >/dev/null 2>&1
rc=$?
d2="$work/small"; mkdir -p "$d2"
env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_DIR="$d2" OOMGUARD_FRAMEWORK=pytorch \
    OOMGUARD_FRAMEWORK_LIBS=libminitorch.so LD_PRELOAD="$PRELOAD" "$root/$B/examples/fragmentation" >/dev/null 2>&1
python3 - "$d" "$d2" <<'PY'
import glob, json, sys
lim = json.load(open(glob.glob(sys.argv[1] + "/oomguard-*.json")[0]))
small = json.load(open(glob.glob(sys.argv[2] + "/oomguard-*.json")[0]))
causes = [c["id"] for c in lim["diagnosis"]["causes"]]
assert lim["event"]["caused_by_limit"] is True, "caused_by_limit"
assert lim["device"]["limit_bytes"] == 24 << 30, lim["device"]["limit_bytes"]
assert "limit" in causes, causes
# the same failure as on a real 24 GiB card, apart from the limit itself
rest = [c for c in causes if c != "limit"]
small_causes = [c["id"] for c in small["diagnosis"]["causes"]]
assert rest[:1] == small_causes[:1], (rest, small_causes)
assert lim["event"]["requested_bytes"] == small["event"]["requested_bytes"]
PY
py=$?
result $([ $rc = 3 ] && [ $py = 0 ]; echo $?) "80 GiB card limited to 24 GiB: dump says limit, same diagnosis as a 24 GiB card"

# warnings: once per crossing, again only after falling below and rising again
cat >"$work/warn.c" <<'C'
#include <cuda_runtime_api.h>
int main(void) {
    void *a, *b; cudaSetDevice(0);
    for (int i = 0; i < 2; i++) {
        cudaMalloc(&a, 10ull << 30); cudaMalloc(&b, 3ull << 30);   /* crosses 50% of 24 GiB */
        cudaFree(b); cudaMalloc(&b, 1536ull << 20); cudaFree(b);    /* 11.5 GiB: inside the 5% band, */
        cudaMalloc(&b, 2560ull << 20); cudaFree(b);                 /* so 12.5 GiB: no new warning */
        cudaFree(a);                                                /* falls well below */
    }
    return 0;
}
C
cc -I"${CUDA_HOME:-/usr/local/cuda}/include" "$work/warn.c" -o "$work/warn" -L"$root/$B/sim" -lcudart
out=$(env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_WARN_AT=50% OOMGUARD_WARN_DUMP=1 LD_PRELOAD="$PRELOAD" \
      "$work/warn" 2>&1); rc=$?
n=$(printf '%s\n' "$out" | grep -c "crossed OOMGUARD_WARN_AT")
result $([ $rc = 0 ] && [ "$n" = 2 ]; echo $?) "OOMGUARD_WARN_AT=50%: warned once per crossing ($n)"
grep -q '"status":"warning"' "$work"/oomguard-*.json 2>/dev/null
result $? "OOMGUARD_WARN_DUMP=1 wrote a warning dump"
for bad in banana 0% 120%; do
    out=$(env SIMGPU_DEVICES=1 OOMGUARD_WARN_AT=$bad LD_PRELOAD="$PRELOAD" "$work/warn" 2>&1)
    n=$(printf '%s\n' "$out" | grep -c "OOMGUARD_WARN_AT=$bad is not valid")
    result $([ "$n" = 1 ]; echo $?) "OOMGUARD_WARN_AT=$bad: one warning"
done

# summary: the peak equals the simulator's
rm -f "$work"/oomguard-*
out=$(env SIMGPU_DEVICES=1 SIMGPU_MEM=24GiB OOMGUARD_SUMMARY=1 SIMGPU_TRUTH_FILE="$work/truth.jsonl" \
      LD_PRELOAD="$PRELOAD" "$work/warn" 2>&1)
peak=$(python3 -c 'import json,sys; t=json.loads(open(sys.argv[1]).readline()); print(t["peak_used_bytes"]-t["context_bytes"])' "$work/truth.jsonl")
line=$(printf '%s\n' "$out" | grep "summary: device 0 peak")
python3 - "$work" "$peak" <<'PY'
import glob, json, sys
d = [json.load(open(f)) for f in glob.glob(sys.argv[1] + "/oomguard-*.json")]
ex = [x for x in d if x["status"] == "exit"]
assert ex, "no exit dump"
assert ex[0]["summary"]["devices"][0]["peak_bytes"] == int(sys.argv[2]), (ex[0]["summary"], sys.argv[2])
fits = {f["card_gb"]: f["fits"] for f in ex[0]["summary"]["devices"][0]["fits"]}
assert fits[16] is True and fits[141] is True
PY
py=$?
result $([ $py = 0 ] && echo "$line" | grep -q "fits on 16 GB cards and above"; echo $?) "OOMGUARD_SUMMARY=1: peak == simulator peak, exit dump ($line)"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
