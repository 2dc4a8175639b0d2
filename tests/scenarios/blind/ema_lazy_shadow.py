"""train.py -- training with an exponential moving average of the weights, created lazily at the
first update, on a 24 GiB card:

    ema = None
    for batch in loader:
        loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()
        with torch.no_grad():
            if ema is None:
                ema = copy.deepcopy(model)                 # a second copy of the weights on the GPU
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.999).add_(p, alpha=0.001)

Weights 5 GiB fp32, grads 5 GiB (kept: zero_grad comes later in this loop), AdamW state 10 GiB: the
EMA copy (5 GiB) is what does not fit, with autograd off.  This is training, not inference: not
inference_mode.  An expert: keep the EMA on the CPU (or update it every N steps from CPU), or
shrink the optimizer state (8-bit AdamW, ZeRO); nothing is cached, nothing leaks.
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
empty = scen_truth.torch_empty
try:
    params = alloc_n(32, 160 * MiB)       # 5 GiB
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    acts = alloc_n(8, 256 * MiB)         # forward, 2 GiB
    grads = alloc_n(32, 160 * MiB)        # backward
    del acts
    torch.cuda.empty_cache()                                            # (the script calls it every step)
    optimizer.step()                                                    # moments, 10 GiB
    with torch.no_grad():
        ema = alloc_n(32, 160 * MiB)     # deepcopy(model)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
