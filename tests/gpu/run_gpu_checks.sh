#!/usr/bin/env bash
# Real-GPU checks (issue acceptance on hardware).  Skips cleanly without a GPU.
#   bash tests/gpu/run_gpu_checks.sh
# Builds the shim against the real CUDA headers, then:
#  1. a PyTorch allocation loop under the shim: the ledger sees PyTorch's segments
#     (tracked bytes on device 0 == torch.cuda.memory_reserved()).
#  2. a PyTorch OOM by size and one by fragmentation: the dump's numbers agree with
#     PyTorch's own message; the primary diagnosis is right.
#  3. OOMGUARD_LIMIT=8GiB: torch.OutOfMemoryError at the right size, mem_get_info shows it.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
make -C "$root" -s build/liboomguard.so || exit 1
shim="$root/build/liboomguard.so"
out=$(mktemp -d); pass=0; fail=0
res() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "PASS $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

cat >"$out/loop.py" <<'PY'
import ctypes, torch
lib = ctypes.CDLL(None)
class S(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("plain_bytes","plain_blocks","managed_bytes","managed_blocks",
        "pool_used_bytes","pool_blocks","pool_reserved_bytes","vmm_physical_bytes","vmm_handles",
        "vmm_mapped_bytes","tracked_bytes","peak_tracked_bytes","host_pinned_bytes","host_pinned_blocks",
        "allocs","frees","failures","unknown_frees")]
xs = [torch.empty(int(n) * 1024 * 1024, dtype=torch.uint8, device="cuda") for n in range(1, 200, 7)]
del xs[::2]
torch.cuda.synchronize()
s = S(); lib.oomguard_device_stats(0, ctypes.byref(s))
print("tracked", s.tracked_bytes, "reserved", torch.cuda.memory_reserved())
assert s.tracked_bytes == torch.cuda.memory_reserved(), "ledger != memory_reserved"
PY
OOMGUARD_DIR="$out" LD_PRELOAD="$shim" python3 "$out/loop.py"; res $? "ledger sees PyTorch's segments"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OOMGUARD_DIR="$out" LD_PRELOAD="$shim" python3 "$out/loop.py"
res $? "ledger sees expandable segments (VMM via cudaGetDriverEntryPoint)"

cat >"$out/oom.py" <<'PY'
import json, glob, os, re, sys, torch
try:
    x = torch.empty(int(1e15), dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as e:
    msg = str(e)
d = json.load(open(glob.glob(os.environ["OOMGUARD_DIR"] + "/oomguard-*.json")[0]))
req = float(re.search(r"Tried to allocate ([\d.]+) (\w+)", msg).group(1))
print(msg.splitlines()[0]); print(d["diagnosis"]["primary"], d["event"]["requested_bytes"], d["device"]["free_bytes"])
unit = {"GiB": 2**30, "MiB": 2**20, "TiB": 2**40}[re.search(r"Tried to allocate [\d.]+ (\w+)", msg).group(1)]
assert abs(d["event"]["requested_bytes"] / unit - req) < 0.01
assert d["diagnosis"]["primary"] == "does_not_fit"
PY
rm -f "$out"/oomguard-*; OOMGUARD_DIR="$out" LD_PRELOAD="$shim" python3 "$out/oom.py"; res $? "OOM by size matches PyTorch's message"

cat >"$out/limit.py" <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
assert total == 8 * 2**30, total
try:
    torch.empty(9 * 2**30, dtype=torch.uint8, device="cuda"); raise SystemExit("no OOM")
except torch.OutOfMemoryError:
    print("OutOfMemoryError under the limit")
PY
rm -f "$out"/oomguard-*; OOMGUARD_LIMIT=8GiB OOMGUARD_DIR="$out" LD_PRELOAD="$shim" python3 "$out/limit.py"
res $? "OOMGUARD_LIMIT=8GiB: torch sees 8 GiB and raises OutOfMemoryError"
grep -q '"caused_by_limit":true' "$out"/oomguard-*.json; res $? "dump says limit"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
