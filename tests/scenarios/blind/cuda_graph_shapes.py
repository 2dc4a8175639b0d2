"""serve.py -- an LLM server that captures a CUDA graph per decode batch size (torch.compile
mode="reduce-overhead" style), each graph with its own private memory pool, on a 24 GiB card:

    model = load().cuda().eval()                       # 8 GiB bf16
    kv_cache = allocate_kv_cache()                     # 6 GiB
    for bs in range(1, 65):                            # 64 captured shapes
        graphs[bs] = capture(model, bs)                # private pool: the shape's activations

Each captured shape keeps ~(64 + 4*bs) MiB in its private pool for the life of the graph; by batch
size ~55 the pools hold 8 GiB and the next capture fails.  empty_cache does not free a live graph's
pool.  An expert: capture fewer shapes (pad to 1, 2, 4, 8, 16, 32, 64) or share one pool across
captures; not a leak (a capture is a one-time cost), not other processes.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20


def alloc_n(n, nbytes):
    """n tensors of nbytes; a list local to this frame, so a failure's traceback keeps the partial
    list alive in the except block, as the tensors of a real forward pass are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(scen_truth.torch_empty(nbytes, device="cuda"))
    return got
graphs = []
try:
    with torch.inference_mode():
        weights = alloc_n(32, 256 * MiB)   # 8 GiB
        kv = alloc_n(16, 384 * MiB)        # 6 GiB
        for bs in range(1, 65):
            scen_truth._last["n"] = (64 + 4 * bs) * MiB
            scen_truth._last["reserved"] = torch.cuda.memory_reserved()
            graphs.append(torch.empty((64 + 4 * bs) * MiB, device="cuda", pool_id=(1, bs)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
