"""probe_dinov2.py -- a linear probe on DINOv2 ViT-g/14 (1.1B parameters, fp32 weights 4.0 GiB) for a
1000-class product-photo classifier, batch 128 images at 224 px, one 24 GiB card:

    backbone = load_dinov2_vitg14().cuda()
    backbone.eval()                                   # "frozen"
    head = nn.Linear(1536, 1000).cuda()
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)   # only the head is trained
    for images, labels in loader:
        feats = backbone(images)                      # autograd on, backbone.requires_grad still True
        loss = F.cross_entropy(head(feats), labels)
        loss.backward()                               # <- OOM in the first backward

The user believed eval() plus an optimizer over head.parameters() froze the backbone.  It does not:
eval() only switches dropout/norm behaviour, and every backbone parameter still requires grad.  So the
forward keeps every block's activations for backward (41 tensors, 17.2 GiB at batch 128), and backward
starts writing a gradient for each of the 1.1B backbone weights (4.0 GiB more) that no optimizer will
ever read.  The first backward runs out part way through the backbone's gradients.

An expert: freeze the backbone -- backbone.requires_grad_(False) and run it under torch.no_grad()
(or compute the features once and cache them): no saved activations, no backbone gradients; the
probe needs a few MiB.  Not a smaller batch, checkpointing or mixed precision of activations that need
not exist, nor an 8-bit optimizer, sharding or LoRA (the optimizer holds 6 MiB of parameters).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

DEPTH = 40
BLOCK_BYTES = 103 * MiB          # fp32 weights of one ViT-g block (27M parameters)
ACT_PER_BLOCK = 430 * MiB        # what one block saves for backward at batch 128 (257 tokens x 1536)
batch_size = 128


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(BLOCK_BYTES, device="cuda"))

    def forward(self, x):
        out = torch.empty(ACT_PER_BLOCK, device="cuda")
        out._saved = x
        return out


class PatchEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(10 * MiB, device="cuda"))

    def forward(self, images):
        out = torch.empty(ACT_PER_BLOCK, device="cuda")
        out._saved = images
        return out


class DinoVisionTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = PatchEmbed()
        self.blocks = [Block() for _ in range(DEPTH)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, images):
        x = self.patch_embed(images)
        for blk in self.blocks:
            x = blk(x)
        cls = torch.empty(batch_size * 1536 * 4, device="cuda")       # the CLS token, normed
        cls._saved = x
        return cls


class Linear(nn.Module):
    def __init__(self, inp, out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(inp * out * 4, device="cuda"))

    def forward(self, x):
        y = torch.empty(batch_size * 1000 * 4, device="cuda")
        y._saved = x
        return y


def load_dinov2_vitg14():
    return DinoVisionTransformer()          # torch.hub.load("facebookresearch/dinov2", "dinov2_vitg14")


def main():
    backbone = load_dinov2_vitg14().cuda()
    backbone.eval()
    head = Linear(1536, 1000).cuda()
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3)
    for epoch in range(10):
        for step in range(1000):
            images = torch.empty(batch_size * 3 * 224 * 224 * 4, device="cuda")
            labels = torch.empty(batch_size * 8, device="cuda")
            feats = backbone(images)
            loss = F.cross_entropy(head(feats), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del loss, feats


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
