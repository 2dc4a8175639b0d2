"""train_vit.py -- supervised training of a 1B-parameter ViT-g/14 (fp32, no autocast) at batch 96 on
a 40 GiB A100.  The job ran for weeks with `optimizer: sgd` (momentum 0.9: one buffer the size of
the weights) in its config; for a new experiment the config now says `optimizer: adamw`, nothing
else changed:

    cfg = OmegaConf.load("configs/vitg14.yaml")                  # optimizer: adamw   (was: sgd)
    model = vit_giant_patch14_224().cuda()
    if cfg.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.05)
    for images, labels in loader:
        loss = criterion(model(images), labels); loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Weights 3.75 GiB, gradients 3.75 GiB, activations 26 GiB at batch 96.  With SGD the state was
3.75 GiB and the step peaked at 37.6 GiB of the 39.5 usable.  AdamW keeps two moments, 7.5 GiB:
the first step goes through (the moments are made after backward, in the activations' cached
blocks), but the second step's backward, making the gradients while the activations are held,
fails with 1.8 GiB missing.  Training, one optimizer step done; nothing leaks (memory rose once, at
the first step, by the size of the moments), no other process.  An expert: the new optimizer's
state is what tipped it: an 8-bit AdamW (bitsandbytes, 1.9 GiB of state) restores the budget; or a
smaller per-step batch with gradient accumulation, bf16 autocast or activation checkpointing to
make room; sharding the state (ZeRO/FSDP) with more GPUs.  Not a leak, not the cache.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
cfg = {"model": "vit_giant_patch14_224", "batch_size": 96, "optimizer": "adamw", "lr": 1e-3,
       "weight_decay": 0.05}
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv_proj = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.mlp_fc = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))

    def forward(self, h):
        for _ in range(14):                   # attention and MLP tensors saved for backward
            a = torch.empty(64 * MiB, device="cuda")
            a._saved = h
            h = a
        return h


class VisionTransformer(torch.nn.Module):
    def __init__(self, depth=30):
        torch.nn.Module.__init__(self)
        self.depth = depth
        for i in range(depth):
            setattr(self, "blocks_%d" % i, Block())

    def forward(self, images):
        h = images
        for i in range(self.depth):
            h = getattr(self, "blocks_%d" % i)(h)
        logits = torch.empty(96 * 1000 * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def criterion(logits, labels):
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = logits, logits._params
    return loss


def main():
    model = VisionTransformer().cuda()
    model.train()
    if cfg["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    for step in range(100000):
        images = torch.empty(96 * 3 * 224 * 224 * 4, device="cuda")
        labels = torch.empty(96 * 8, device="cuda")
        loss = criterion(model(images), labels)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)          # what optimizer.zero_grad(set_to_none=True) does
        del loss, images, labels
        time.sleep(0.01)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
