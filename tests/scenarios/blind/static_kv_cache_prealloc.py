"""serve.py -- an inference server that preallocates a static KV cache for its maximum batch and
length at startup (max_batch=64, max_seq_len=4096, as vLLM's gpu_memory_utilization or HF's
StaticCache do):

    model = load("org/8b", torch_dtype=torch.bfloat16).cuda()        # 8 GiB
    cache = StaticCache(max_batch_size=64, max_cache_len=4096)          # 15 GiB, reserved up front
    serve(model, cache)

The first request's prefill needs 1.5 GiB of activations; 0.5 GiB is left.  An expert: make the
preallocated KV cache smaller (max batch, max length, or memory utilization setting), which the
traffic allows; not a leak, not a smaller model first, no other process.
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


try:
    with torch.inference_mode():
        weights = alloc_n(32, 256 * MiB)        # 8 GiB bf16
        kv = alloc_n(30, 512 * MiB)             # 15 GiB static cache
        acts = alloc_n(6, 256 * MiB)            # first prefill: 1.5 GiB
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
