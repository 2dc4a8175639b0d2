"""finetune_aurora.py -- fine-tuning a 1.3B-parameter atmospheric foundation model (Aurora-like: a
3D Swin backbone between a Perceiver encoder and decoder, fp32 weights, 5 GiB) on 0.25 degree ERA5
with 2-step rollouts, on one L40S (48 GB: 45 GiB usable), batch_size 1 (one global state per
step).  Following the paper's recipe the user keeps an exponential moving average of the weights
for evaluation, made the usual way and kept next to the model:

    model = AuroraLike().cuda()
    ema_model = copy.deepcopy(model).requires_grad_(False)      # 5 GiB more, fp32, on the GPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for batch in loader:
        loss = rollout_loss(model, batch, steps=2); loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        ema_update(ema_model, model, decay=0.999)               # in place: lerp_

The first step fits (weights 5 + EMA 5 + activations 27 + gradients 5 GiB = 42 GiB).  After it
AdamW's moments (10 GiB) stay, and the second step's rollout no longer fits: it dies in the
forward pass of step 2, ~2.5 GiB short.

An expert: the EMA copy is the cheapest thing to move -- keep it in CPU memory (update it there,
every step or every few steps); that frees 5 GiB and changes nothing in training.  An 8-bit AdamW
or checkpointing the backbone would also fit it but change the numerics or cost time; a smaller
batch is impossible (1); the EMA update is already in place; not empty_cache, expandable_segments,
inference mode or quantization.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class SwinStage(torch.nn.Module):
    def __init__(self, n_params):
        torch.nn.Module.__init__(self)
        for i in range(n_params):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(256 * MiB, device="cuda")))

    def forward(self, x, n_act):
        for _ in range(n_act):
            y = torch.empty(1 * GiB, device="cuda")          # window attention + MLP activations
            y._saved = x
            x = y
        return x


class AuroraLike(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = SwinStage(2)
        self.backbone = SwinStage(16)
        self.decoder = SwinStage(2)

    def forward(self, state):
        x = self.encoder(state, 1)
        x = self.backbone(x, 11)
        x = self.decoder(x, 1)
        return x


def rollout_loss(model, state, steps):
    x = state
    for _ in range(steps):
        x = model(x)                                          # 13 GiB of activations per rollout step
    loss = torch.empty(512, device="cuda")
    loss._saved = x
    loss._params = tuple(model.parameters())
    return loss


def ema_update(ema_model, model, decay):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            pass                                              # e.lerp_(p, 1 - decay): in place


def main():
    model = AuroraLike()
    model.train()
    ema_model = copy.deepcopy(model)
    for p in ema_model.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    batch_size = 1
    for step in range(1000):
        state = torch.empty(batch_size * 1 * GiB, device="cuda")     # 0.25 deg surface + 13 levels
        loss = rollout_loss(model, state, steps=2)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema_update(ema_model, model, decay=0.999)
        del loss, state


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
