"""train_rooftops.py -- fine-tuning a ViT-L/16 encoder (304M parameters, fp32 weights, AdamW) with a
light segmentation head on aerial orthophotos, one 24 GB card, bf16 autocast, batch_size = 1.
Warm-up epochs at 512 x 512 crops (1,024 tokens) ran fine.  To see roof edges the schedule then
switches to the full 2048 x 2048 tiles: 16,384 tokens per image.  Earlier the user had switched
timm's fused attention off to plot attention maps (timm.layers.set_fused_attn(False)) and left it,
so every block computes attention eagerly:

    attn = (q * self.scale) @ k.transpose(-2, -1)      # bf16: 16 heads x 16384 x 16384 = 8 GiB
    attn = attn.softmax(dim=-1)                        # autocast runs softmax in fp32: 16 GiB

The first 2048-px step fails in the first block's softmax (a 16 GiB request with about 12 GiB free,
after the allocator gave back its cache).  Weights and AdamW state are 3.6 GiB; the batch is
already 1 and autocast is already on.

An expert: turn fused attention back on (F.scaled_dot_product_attention: flash / memory-efficient
kernels never materialise the 16k x 16k scores), or chunk / window the attention; training on
1024-px crops is the fallback.  Not a smaller batch (it is 1), not mixed precision (on already; the
fp32 softmax is autocast's own), not gradient checkpointing (one layer's attention alone does not
fit), not an 8-bit optimizer, LoRA or ZeRO, not inference mode, not the cache or fragmentation.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
EMBED, HEADS, DEPTH, MLP = 1024, 16, 24, 4096
batch_size = 1


def set_fused_attn(enable=True):
    Attention.fused_attn = bool(enable)


def param(nbytes):
    return nn.Parameter(torch.empty(nbytes, device="cuda"))


class Attention(nn.Module):
    fused_attn = True

    def __init__(self):
        nn.Module.__init__(self)
        self.qkv = param(EMBED * 3 * EMBED * 4)
        self.proj = param(EMBED * EMBED * 4)

    def forward(self, x):
        tokens = x.nbytes // (EMBED * 4)        # the fp32 output of norm1
        qkv = torch.empty(tokens * 3 * EMBED, dtype=torch.bfloat16, device="cuda")
        qkv._saved = x
        if self.fused_attn:
            out = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")   # F.scaled_dot_product_attention
            out._saved = qkv
        else:
            attn = torch.empty(batch_size * HEADS * tokens * tokens, dtype=torch.bfloat16, device="cuda")   # q @ k^T
            attn._saved = qkv
            probs = torch.empty(batch_size * HEADS * tokens * tokens, dtype=torch.float32, device="cuda")   # softmax
            probs._saved = attn
            ctx = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")                # attn @ v
            ctx._saved = probs
            out = ctx
        proj = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")
        proj._saved = out
        return proj


class Mlp(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc1 = param(EMBED * MLP * 4)
        self.fc2 = param(MLP * EMBED * 4)

    def forward(self, x):
        tokens = x.nbytes // (EMBED * 4)        # the fp32 output of norm2
        h = torch.empty(tokens * MLP, dtype=torch.bfloat16, device="cuda")
        h._saved = x
        g = torch.empty(tokens * MLP, dtype=torch.bfloat16, device="cuda")
        g._saved = h
        out = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")
        out._saved = g
        return out


class Block(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.norm1 = param(EMBED * 2 * 4)
        self.attn = Attention()
        self.norm2 = param(EMBED * 2 * 4)
        self.mlp = Mlp()

    def forward(self, x):
        tokens = x.nbytes // (EMBED * 2)
        n1 = torch.empty(tokens * EMBED, dtype=torch.float32, device="cuda")     # layer_norm: fp32 under autocast
        n1._saved = x
        a = self.attn(n1)
        x = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")
        x._saved = a
        n2 = torch.empty(tokens * EMBED, dtype=torch.float32, device="cuda")
        n2._saved = x
        m = self.mlp(n2)
        out = torch.empty(tokens * EMBED, dtype=torch.bfloat16, device="cuda")
        out._saved = m
        return out


class RooftopSegmenter(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embed = param(16 * 16 * 3 * EMBED * 4)
        self.pos_embed = param(128 * 128 * EMBED * 4)
        self.blocks = [Block() for _ in range(DEPTH)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block_%d" % i, b)
        self.head = param(20 * MiB)

    def forward(self, images, side):
        tokens = (side // 16) ** 2
        x = torch.empty(batch_size * tokens * EMBED, dtype=torch.bfloat16, device="cuda")
        x._saved = images
        for blk in self.blocks:
            x = blk(x)
        mask_logits = torch.empty(batch_size * side * side * 4, device="cuda")
        mask_logits._saved = x
        return mask_logits


def loader(side, steps):
    for _ in range(steps):
        yield torch.empty(batch_size * 3 * side * side * 4, device="cuda"), side


def main():
    model = RooftopSegmenter()
    model.train()
    set_fused_attn(False)         # to plot attention maps (notebook cell, never undone)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    for epoch, side in ((0, 512), (1, 512), (2, 2048)):
        for images, side in loader(side, 3):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(images, side)
                loss = torch.empty(512, device="cuda")
                loss._saved = logits
                loss._params = logits._params
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, logits, images


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
