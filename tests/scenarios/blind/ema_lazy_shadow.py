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
empty = scen_truth.torch_empty
try:
    params = [empty(160 * MiB, device="cuda") for _ in range(32)]       # 5 GiB
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    acts = [empty(256 * MiB, device="cuda") for _ in range(8)]         # forward, 2 GiB
    grads = [empty(160 * MiB, device="cuda") for _ in range(32)]        # backward
    del acts
    torch.cuda.empty_cache()                                            # (the script calls it every step)
    optimizer.step()                                                    # moments, 10 GiB
    with torch.no_grad():
        ema = [empty(160 * MiB, device="cuda") for _ in range(32)]     # deepcopy(model)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
