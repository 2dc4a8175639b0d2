"""What OOMGUARD_PYTHON_STACKS=1 costs per allocation.

    python3 bench_python_stacks.py [N] [DEPTH]

Allocates and frees a 1 MiB tensor N times (served from the caching allocator after the first:
the path a training step takes), at a Python stack DEPTH frames deep, first as the adapter leaves
PyTorch by default (no history), then with the allocation history the adapter turns on for
OOMGUARD_PYTHON_STACKS=1 (oomguard_torch._record_history: enabled="all", context="alloc",
stacks="python", bounded ring), and prints the time per allocation (alloc + free) of both and
the difference.  It checks that the history did record (a live block carries its Python frames)
and that without it nothing is recorded.

Only PyTorch's public names are used (torch.empty(n, dtype=torch.uint8, device=0),
torch.cuda.memory._snapshot, torch.cuda.synchronize if present), so the same script measures the
stand-in torch of tests/adapter/fake_torch on the simulated GPU and real PyTorch on a real GPU:
    PYTHONPATH=adapters/python python3 tests/adapter/bench_python_stacks.py
"""
import os
import sys
import time

os.environ["OOMGUARD_PYTHON_STACKS"] = "1"     # read by oomguard_torch._record_history only
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters", "python"))
import oomguard_torch  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
DEPTH = int(sys.argv[2]) if len(sys.argv) > 2 else 20
MiB = 1 << 20


def loop(n):
    sync = getattr(torch.cuda, "synchronize", None)
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.empty(MiB, dtype=torch.uint8, device=0)
        del x
    if sync is not None:
        sync()
    return (time.perf_counter() - t0) / n


def at_depth(d, fn, *a):
    return fn(*a) if d <= 0 else at_depth(d - 1, fn, *a)


def best_of(k, n):
    return min(at_depth(DEPTH, loop, n) for _ in range(k))


def live_frames():
    keep = torch.empty(MiB, dtype=torch.uint8, device=0)
    snap = torch.cuda.memory._snapshot()
    n = 0
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated" and b.get("frames"):
                n += 1
    del keep
    return n


torch.cuda.init()
loop(200)                                      # warm: the cache holds a segment
off = best_of(3, N)
frames_off = live_frames()
oomguard_torch._record_history(torch)
on = best_of(3, N)
frames_on = live_frames()
if frames_off != 0 or frames_on == 0:
    print("history did not behave: live blocks with frames %d without, %d with" % (frames_off, frames_on))
    sys.exit(1)
print("torch %s, %d allocations at stack depth %d" % (torch.__version__, N, DEPTH))
print("python_stacks off: %.2f us per allocation" % (off * 1e6))
print("python_stacks on:  %.2f us per allocation" % (on * 1e6))
print("python_stacks cost: %.2f us per allocation (x%.1f)" % ((on - off) * 1e6, on / off if off else 0))
