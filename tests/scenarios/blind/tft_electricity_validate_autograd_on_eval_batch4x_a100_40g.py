"""train_tft.py -- a Temporal Fusion Transformer-style forecaster for 370 electricity meters
(encoder 336 steps, horizon 96, d_model 1024, 8 fused blocks, ~190M parameters, fp32) trained with
AdamW on one A100 40 GB, PyTorch 2.1:

    for epoch in range(EPOCHS):
        model.train()
        for x in train_loader:                          # batch 64 windows
            loss = quantile_loss(model(x), y); loss.backward()
            optimizer.step(); optimizer.zero_grad(set_to_none=True)
        model.eval()
        for x in val_loader:                            # eval batch 256: "eval needs no gradients,
            preds = model(x)                            #  so it can take 4x the batch"
            val_loss += quantile_loss(preds, y).item()

Training fits: weights 0.7 GiB, AdamW state 1.4 GiB, gradients 0.7 GiB, and 8 x 1.5 GiB of saved
activations at batch 64, freed by backward.  Validation calls model.eval() but forgets
torch.no_grad(): autograd still records the graph, so every block's output is kept for a backward
that never comes -- at 4x the batch that is 8 x 6 GiB.  The sixth block of the first validation batch
fails.  With no_grad each block's input is dropped as soon as the next one is computed (two blocks'
worth, 12 GiB, live at once).

An expert: run validation under torch.no_grad() / torch.inference_mode() -- the training run itself
fits, only the eval pass keeps a graph.  Not gradient checkpointing, not an 8-bit optimizer or
sharding (optimizer state is 1.4 GiB), not empty_cache or expandable segments (live tensors fill the
card).  A smaller eval batch would also fit, but keeps paying for a graph nobody uses.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

TRAIN_BATCH = 64
EVAL_BATCH = 256
N_BLOCKS = 8


class GatedResidualBlock(torch.nn.Module):
    """Variable selection + gated residual network + interpretable multi-head attention, fused."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(88 * MiB, device="cuda"))

    def forward(self, x, batch):
        h = torch.empty(batch * 24 * MiB, device="cuda")      # 336+96 steps x 370 meters x d_model
        if torch.is_grad_enabled():
            h._saved = x                                     # kept for backward
        return h


class TemporalFusionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(40 * MiB, device="cuda"))
        for i in range(N_BLOCKS):
            setattr(self, "block%d" % i, GatedResidualBlock())
        self.head = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))

    def forward(self, x, batch):
        h = x
        for i in range(N_BLOCKS):
            h = getattr(self, "block%d" % i)(h, batch)
        out = torch.empty(batch * 370 * 96 * 3 * 4, device="cuda")   # 3 quantiles
        if torch.is_grad_enabled():
            out._saved = h
        return out


def quantile_loss(preds, model):
    loss = torch.empty(512, device="cuda")
    loss._saved = preds
    loss._params = tuple(model.parameters())
    return loss


def main():
    model = TemporalFusionTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(30):
        model.train()
        for step in range(6):
            x = torch.empty(TRAIN_BATCH * 432 * 370 * 8 * 4, device="cuda")
            preds = model(x, TRAIN_BATCH)
            loss = quantile_loss(preds, model)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del x, preds, loss
        model.eval()
        val_loss = 0.0
        for step in range(20):
            x = torch.empty(EVAL_BATCH * 432 * 370 * 8 * 4, device="cuda")
            preds = model(x, EVAL_BATCH)
            val_loss += 0.0
            del x, preds
        print("epoch", epoch, "val", val_loss)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
