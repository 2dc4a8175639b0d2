"""resume.py -- resuming fine-tuning of a 1.6B-parameter model (fp32, 6 GiB) on a 24 GiB card:

    model = build_model().cuda()                       # 6 GiB of weights on the GPU
    ckpt = torch.load("last.pt")                       # saved from GPU tensors: no map_location
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])       # AdamW moments: 12 GiB

torch.load puts every tensor back on the device it was saved from, so the checkpoint's own copy of
the weights (6 GiB) and of the AdamW state (12 GiB) land on the GPU next to the model: 24 GiB and
the load fails two thirds of the way through the optimizer state.  The run fitted before (weights,
grads on the fly, moments = 18 GiB).  An expert: torch.load(..., map_location="cpu").
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
    model = alloc_n(32, 192 * MiB)        # 6 GiB, the built model
    ckpt_model = alloc_n(32, 192 * MiB)   # torch.load: the saved weights
    ckpt_opt = alloc_n(64, 192 * MiB)     # torch.load: exp_avg, exp_avg_sq
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
