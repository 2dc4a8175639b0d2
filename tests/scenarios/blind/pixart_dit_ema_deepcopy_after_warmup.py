"""train_t2i.py -- training a 1.3B-parameter text-to-image diffusion transformer (PixArt-style DiT, 28
blocks, fp32 weights 4.9 GiB) with AdamW on one 24 GiB card, latents precomputed, batch 32 at 512 px:

    optimizer = torch.optim.AdamW(dit.parameters(), lr=2e-5)
    for step, (latents, text_emb) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        loss = diffusion_loss(dit, latents, text_emb)
        scen_truth.backward(loss)       # loss.backward(): the saved activations are freed afterwards
        optimizer.step()
        if step == cfg.ema_start:                     # EMA after warm-up, as the config says
            ema = copy.deepcopy(dit).requires_grad_(False)      # <- OOM at step 200
        elif step > cfg.ema_start:
            ema_update(ema, dit, decay=0.9999)

200 steps run at about 23 of 24 GiB (weights 4.9 + AdamW moments 9.8 + activations 3.0 + gradients
4.9 GiB).  At step 200 the EMA copy is made right after optimizer.step(): this step's gradients are
still alive (zero_grad runs at the top of the loop), the activations sit freed in PyTorch's cache, and
copy.deepcopy needs another 4.9 GiB of weights on the GPU.  It runs out part way through the copy
(after one flush of the cache and a successful retry).

An expert: keep the EMA weights in CPU memory (deepcopy to the CPU / AveragedModel on device="cpu",
updated every few steps; diffusers' EMAModel offload) -- or make room for it with an 8-bit optimizer.
Not a smaller batch or checkpointing (the activations are already freed), not an in-place EMA update
(the failure is the copy itself, not the update's temporaries), not empty_cache.
"""
import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

DEPTH = 28
BLOCK_BYTES = 176 * MiB          # fp32 weights of one DiT block (self-attn, cross-attn, MLP, adaLN)
ACT_PER_BLOCK = 110 * MiB        # saved for backward at batch 32 x 1024 latent tokens
batch_size = 32


class cfg:
    ema_start = 200
    ema_decay = 0.9999


class DiTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(BLOCK_BYTES, device="cuda"))

    def forward(self, x, c):
        out = torch.empty(ACT_PER_BLOCK, device="cuda")
        out._saved = x                  # (and the caption embedding c, which the loop keeps anyway)
        return out


class Embedders(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(64 * MiB, device="cuda"))     # patch, timestep, caption projections

    def forward(self, latents, t, text_emb):
        x = torch.empty(ACT_PER_BLOCK, device="cuda")
        x._saved = latents
        return x


class PixArtDiT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embedders()
        self.blocks = [DiTBlock() for _ in range(DEPTH)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, latents, t, text_emb):
        x = self.embed(latents, t, text_emb)
        for blk in self.blocks:
            x = blk(x, text_emb)
        out = torch.empty(batch_size * 4 * 64 * 64 * 4 * 2, device="cuda")      # predicted noise and variance
        out._saved = x
        return out

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad_(flag)
        return self


def diffusion_loss(dit, latents, text_emb):
    t = torch.empty(batch_size * 8, device="cuda")
    noisy = torch.empty(latents.nbytes, device="cuda")
    pred = dit(noisy, t, text_emb)
    return mse_loss(pred, latents)


def mse_loss(pred, target):
    """F.mse_loss (the stand-in's functional has none): a scalar in pred's graph."""
    return F.nll_loss(pred, target)


def ema_update(ema, model, decay):
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            pass                                                # e.lerp_(p, 1 - decay): in place


def main():
    dit = PixArtDiT().cuda()
    dit.train()
    optimizer = torch.optim.AdamW(dit.parameters(), lr=2e-5, weight_decay=0.03)
    ema = None
    for step in range(100000):
        latents = torch.empty(batch_size * 4 * 64 * 64 * 4, device="cuda")
        text_emb = torch.empty(batch_size * 120 * 4096 * 4, device="cuda")
        optimizer.zero_grad(set_to_none=True)
        loss = diffusion_loss(dit, latents, text_emb)
        scen_truth.backward(loss)       # loss.backward(): the saved activations are freed afterwards
        optimizer.step()
        if step == cfg.ema_start:
            ema = copy.deepcopy(dit).requires_grad_(False)
        elif step > cfg.ema_start:
            ema_update(ema, dit, cfg.ema_decay)
        del loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
