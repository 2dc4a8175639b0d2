"""train_vitdet.py -- fine-tuning a ViTDet-H Mask R-CNN (ViT-Huge backbone + simple FPN + heads, about
700M parameters, fp32: 2.6 GiB) on an in-house instance-segmentation set, on one 24 GiB RTX 3090, with a
model EMA and AdamW.  Large-scale jitter makes the loss spike now and then, so the user added a
"rollback on divergence" guard to the loop:

    model = build_vitdet_h().cuda(); ema = ModelEMA(model)            # deepcopy, 2.6 GiB each
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, batch in enumerate(loader):
        loss = sum(model(batch).values()); loss.backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if not torch.isfinite(total):                                  # diverged: go back to the last good state
            ckpt = torch.load(last_good)                               # no map_location
            model.load_state_dict(ckpt["model"]); ema.load_state_dict(ckpt["ema"])
            optimizer.load_state_dict(ckpt["optimizer"]); continue
        optimizer.step(); ema.update(model); optimizer.zero_grad(set_to_none=True)

Training itself fits: weights 2.6 + EMA 2.6 + gradients 2.6 + AdamW moments 5.3 GiB = 13.3 GiB, plus 5.3
GiB of activations that are freed after backward.  At step 40 the gradient norm is inf.  The job is
no longer in a training step: it is restoring a checkpoint, and torch.load without map_location
restores every tensor onto cuda:0 -- model, EMA and both AdamW moments, 10.6 GiB -- next to the live
copies of the same state (gradients still alive at the check).  The load runs out half way through the
optimizer's moments.

An expert: load the checkpoint into CPU memory (torch.load(last_good, map_location="cpu"));
load_state_dict then copies into the existing GPU tensors and nothing extra stays on the card.  Not a
smaller batch, checkpointing or mixed precision (activations are gone), not empty_cache or
expandable_segments, not inference mode; a bigger GPU would hide it.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(80 * MiB, device="cuda"))


class ViTDetH(torch.nn.Module):
    """32 transformer blocks + simple FPN + RPN/box/mask heads, 34 x 80 MiB fp32."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(34):
            setattr(self, "b%d" % i, Block())

    def forward(self, images):
        x = images
        outs = []
        for i in range(34):
            y = torch.empty(160 * MiB, device="cuda")      # activations saved for backward
            y._saved = x
            y._params = (getattr(self, "b%d" % i).weight,)
            x = y
            outs.append(y)
        loss = torch.empty(512, device="cuda")
        loss._saved = x
        loss._params = tuple(self.parameters())
        return {"loss_mask": loss}


class ModelEMA(object):
    def __init__(self, model):
        import copy
        self.ema = copy.deepcopy(model)
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        pass            # ema.lerp_(p, 1 - d) in place, under no_grad


def write_last_good(path, model):
    """What the job saved at the last good checkpoint (epoch 11): model, EMA and both AdamW moments."""
    sizes = {}
    names = ["b%d.weight" % i for i in range(34)]
    for prefix in ("model.", "ema."):
        for n in names:
            sizes[prefix + n] = 80 * MiB
    for i in range(34):
        sizes["optimizer.state.%d.exp_avg" % i] = 80 * MiB
        sizes["optimizer.state.%d.exp_avg_sq" % i] = 80 * MiB
    with open(path, "w") as f:
        json.dump(sizes, f)


def main():
    torch.cuda.set_device(0)
    model = ViTDetH()
    ema = ModelEMA(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    last_good = os.path.join(tempfile.mkdtemp(prefix="vitdet-"), "epoch_11.pth")
    write_last_good(last_good, model)
    for step in range(41):
        images = torch.empty(2 * 3 * 1024 * 1024 * 4, device="cuda")
        loss = model(images)["loss_mask"]
        scen_truth.backward(loss)
        del loss
        grad_norm_finite = step < 40
        if not grad_norm_finite:
            ckpt = torch.load(last_good)                     # restored onto cuda:0
            model.load_state_dict(ckpt)
            continue
        optimizer.step()
        ema.update(model)
        optimizer.zero_grad(set_to_none=True)
        del images


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
