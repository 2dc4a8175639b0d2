"""serve.py -- a chat endpoint serving a 7B model in bf16 (14 GiB) with eager attention; requests are
usually under 2k tokens, the server sets no max input length:

    @app.post("/generate")
    def generate(req):
        with torch.inference_mode():
            ids = tok(req.prompt).input_ids.cuda()
            return model.generate(ids, max_new_tokens=256)

Hundreds of requests go through at 16-17 GiB (cache warm).  Then a user pastes a 32k-token
document: the prefill's attention scores for one layer (32 heads x 32k x 32k x 2 bytes... even per
chunk) need far more than the card has.  An expert: reject/truncate long prompts (max input
length), or flash/SDPA attention, or chunked prefill; this job is inference; not a leak.
"""
import sys
import time
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
empty = scen_truth.torch_empty
try:
    with torch.inference_mode():
        weights = alloc_n(32, 448 * MiB)     # 14 GiB
        for req in range(300):
            n = 32768 if req == 250 else 1024 + (req * 37) % 1024
            kv = empty(n * 128 * 1024, device="cuda")                     # KV cache: 128 KiB/token
            scores = empty(n * n * 64, device="cuda")   # one layer's scores
            del scores
            del kv
            time.sleep(0.002)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
