"""train_buildings.py -- a GIS group fine-tunes SegFormer-B5 (~85M parameters) for building-footprint
segmentation on 768x768 aerial tiles, batch 4, bf16 autocast, AdamW.  It was developed and measured on the
group's RTX 4090 (peak ~15 GB); it is now run on the shared workstation, which has two different cards:

    $ nvidia-smi                                   (PCI bus order)
    GPU 0  NVIDIA RTX A4000   16 GB   Xorg, gnome-shell, firefox, a colleague's notebook   ~6 GB used
    GPU 1  NVIDIA GeForce RTX 4090  24 GB                                               0 MB used

so the user starts the run on the idle one:

    CUDA_VISIBLE_DEVICES=1 python train_buildings.py --batch-size 4 --crop 768

CUDA does not number the cards as nvidia-smi does: without CUDA_DEVICE_ORDER=PCI_BUS_ID its default order
is FASTEST_FIRST, in which the 4090 is device 0 and the A4000 device 1.  CUDA_VISIBLE_DEVICES=1 therefore
hands the process the A4000 -- the display card, with the desktop and the colleague's kernel on it (5.8
GiB) -- and hides the idle 4090.  The first forward pass fails in stage 3 of the encoder: ~9 GiB were left
of the A4000's 15.7 GiB, and the step needs ~15 GB (it would not fit on the A4000 even if it were empty).

An expert: the job is on the wrong card.  Set CUDA_DEVICE_ORDER=PCI_BUS_ID (so that CUDA's indices match
nvidia-smi's) or pick the 4090 by CUDA's own index (CUDA_VISIBLE_DEVICES=0 here) -- the run fits on the idle
4090 as it did before.  Wrong first advice: stopping the other processes (the desktop, a colleague's work;
and even alone the step does not fit on 16 GB), a smaller batch / gradient checkpointing / mixed precision
(it already runs bf16; all would cut the model down to a card it was never meant to use), a bigger GPU (there
is one, idle, in the same box), expandable_segments / empty_cache.
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
BF16 = 2

# SegFormer-B5 (mit_b5): channels, depth, heads and spatial-reduction ratio per stage, output stride
STAGES = [(64, 3, 1, 8, 4), (128, 6, 2, 4, 8), (320, 40, 5, 2, 16), (512, 3, 8, 1, 32)]


def act(nbytes, prev):
    """a layer's output; with autograd on it keeps what it was made from for backward"""
    t = torch.empty(nbytes // BF16, dtype=torch.bfloat16, device="cuda")
    t._saved = prev if torch.is_grad_enabled() else None
    return t


class EfficientSelfAttention(torch.nn.Module):
    def __init__(self, c, heads, sr):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(torch.empty(c * c * 4, device="cuda"))
        self.kv_proj = torch.nn.Parameter(torch.empty(2 * c * c * 4, device="cuda"))
        self.sr = torch.nn.Parameter(torch.empty(c * c * sr * sr * 4, device="cuda"))
        self.proj = torch.nn.Parameter(torch.empty(c * c * 4, device="cuda"))
        self.c, self.heads, self.sr_ratio = c, heads, sr

    def forward(self, x, batch, n, m):
        q = act(batch * n * self.c * BF16, x)
        kv = act(batch * m * 2 * self.c * BF16, q)
        scores = act(batch * self.heads * n * m * BF16, kv)
        probs = act(batch * self.heads * n * m * BF16, scores)
        ctx = act(batch * n * self.c * BF16, probs)
        return act(batch * n * self.c * BF16, ctx)


class MixFFN(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.fc1 = torch.nn.Parameter(torch.empty(c * 4 * c * 4, device="cuda"))
        self.dwconv = torch.nn.Parameter(torch.empty(4 * c * 9 * 4, device="cuda"))
        self.fc2 = torch.nn.Parameter(torch.empty(4 * c * c * 4, device="cuda"))
        self.c = c

    def forward(self, x, batch, n):
        h = act(batch * n * 4 * self.c * BF16, x)
        h = act(batch * n * 4 * self.c * BF16, h)        # depthwise 3x3
        h = act(batch * n * 4 * self.c * BF16, h)        # GELU
        return act(batch * n * self.c * BF16, h)


class Block(torch.nn.Module):
    def __init__(self, c, heads, sr):
        torch.nn.Module.__init__(self)
        self.attn = EfficientSelfAttention(c, heads, sr)
        self.mlp = MixFFN(c)
        self.c = c

    def forward(self, x, batch, n, m):
        h = act(batch * n * self.c * BF16, x)             # norm1
        h = self.attn(h, batch, n, m)
        h = act(batch * n * self.c * BF16, h)             # residual + norm2
        h = self.mlp(h, batch, n)
        return act(batch * n * self.c * BF16, h)          # residual


class MixVisionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = []
        for s, (c, depth, heads, sr, stride) in enumerate(STAGES):
            for d in range(depth):
                blk = Block(c, heads, sr)
                setattr(self, "block%d_%d" % (s + 1, d), blk)
                self.blocks.append((blk, stride, sr))

    def forward(self, pixels, batch, size):
        x = pixels
        for blk, stride, sr in self.blocks:
            n = (size // stride) ** 2
            m = n // (sr * sr)
            x = blk(x, batch, n, m)
        return x


class SegformerHead(torch.nn.Module):
    """all-MLP decoder: the four stages projected to 768 channels, upsampled to 1/4, fused, classified"""

    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.linear_c = torch.nn.Parameter(torch.empty((64 + 128 + 320 + 512) * 768 * 4, device="cuda"))
        self.fuse = torch.nn.Parameter(torch.empty(4 * 768 * 768 * 4, device="cuda"))
        self.classifier = torch.nn.Parameter(torch.empty(768 * num_classes * 4, device="cuda"))

    def forward(self, x, batch, size):
        n = (size // 4) ** 2
        h = x
        for _ in range(4):
            h = act(batch * n * 768 * BF16, h)           # each stage upsampled to 1/4
        h = act(batch * n * 768 * BF16, h)                # fused
        return act(batch * n * 2 * 4, h)                  # logits (fp32)


class SegformerForSemanticSegmentation(torch.nn.Module):
    def __init__(self, num_classes=2):
        torch.nn.Module.__init__(self)
        self.encoder = MixVisionTransformer()
        self.decode_head = SegformerHead(num_classes)

    def forward(self, pixels, batch, size):
        feats = self.encoder(pixels, batch, size)
        return self.decode_head(feats, batch, size)


def main():
    batch_size, crop = 4, 768
    model = SegformerForSemanticSegmentation(num_classes=2).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5, weight_decay=0.01)
    model.train()
    for step in range(2000):
        pixels = torch.empty(batch_size * 3 * crop * crop * 4, device="cuda")      # the loader's batch
        masks = torch.empty(batch_size * crop * crop * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(pixels, batch_size, crop)
        loss = torch.nn.functional.cross_entropy(logits, masks)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print("step", step, flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
