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
empty = scen_truth.torch_empty
try:
    model = [empty(192 * MiB, device="cuda") for _ in range(32)]        # 6 GiB, the built model
    ckpt_model = [empty(192 * MiB, device="cuda") for _ in range(32)]   # torch.load: the saved weights
    ckpt_opt = [empty(192 * MiB, device="cuda") for _ in range(64)]     # torch.load: exp_avg, exp_avg_sq
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
