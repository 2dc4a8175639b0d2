"""train_completion.py -- a point-cloud completion network (a PoinTr-like encoder/decoder, 38M
parameters) first developed on ShapeNet-style objects of 2,048 points, now trained on full LiDAR
sweeps downsampled to 65,536 points, batch_size = 8, on one 24 GB card.  The Chamfer loss is the
repo's own helper, written for 2k-point objects, which builds every pairwise difference by
broadcasting:

    def chamfer_distance(pred, gt):                      # (B, N, 3), (B, M, 3)
        diff = pred[:, :, None, :] - gt[:, None, :, :]   # (B, N, M, 3)
        dist = (diff ** 2).sum(-1)                       # (B, N, M)
        return dist.min(2)[0].mean() + dist.min(1)[0].mean()

With N = M = 65,536 the first training step's forward pass goes through (about 6 GiB of per-point
features) and the loss asks for 8 x 65536 x 65536 x 3 fp32 = 384 GiB in one request.  One sample
alone would still need 48 GiB for `diff`.

An expert: never materialise the N x M matrix -- a nearest-neighbour Chamfer (pytorch3d's
chamfer_distance / knn_points, or a chunked loop over blocks of pred points, keeping only each
block's minima).  Not a smaller batch (one sample does not fit either), not bf16 (half of 48 GiB,
and distances lose precision), not gradient checkpointing, flash attention, an 8-bit optimizer, LoRA
or ZeRO, not inference mode, not the cache or fragmentation.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
NUM_POINTS = 65536
batch_size = 8


def param(nbytes):
    return nn.Parameter(torch.empty(nbytes, device="cuda"))


class PointMLP(nn.Module):
    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.c_out = c_out
        self.weight = param(c_in * c_out * 4)

    def forward(self, x, points):
        h = torch.empty(batch_size * points * self.c_out * 4, device="cuda")
        h._saved = x
        act = torch.empty(h.nbytes, device="cuda")
        act._saved = h
        return act


class CompletionNet(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.enc1 = PointMLP(3, 256)
        self.enc2 = PointMLP(256, 512)
        self.transformer = param(36 * MiB * 4)
        self.dec1 = PointMLP(512, 512)
        self.dec2 = PointMLP(512, 256)
        self.head = PointMLP(256, 3)

    def forward(self, partial):
        points = NUM_POINTS
        h = self.enc1(partial, points)
        h = self.enc2(h, points)
        h = self.dec1(h, points)
        h = self.dec2(h, points)
        pred = self.head(h, points)
        return pred


def chamfer_distance(pred, gt):
    b, n, m = batch_size, NUM_POINTS, NUM_POINTS
    diff = torch.empty(b * n * m * 3 * 4, device="cuda")         # pred[:, :, None, :] - gt[:, None, :, :]
    diff._saved = pred
    dist = torch.empty(b * n * m * 4, device="cuda")             # (diff ** 2).sum(-1)
    dist._saved = diff
    loss = torch.empty(512, device="cuda")
    loss._saved = dist
    loss._params = pred._params
    return loss


def sweeps(n):
    for _ in range(n):
        partial = torch.empty(batch_size * NUM_POINTS // 2 * 3 * 4, device="cuda")
        gt = torch.empty(batch_size * NUM_POINTS * 3 * 4, device="cuda")
        yield partial, gt


def main():
    model = CompletionNet()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(100):
        for partial, gt in sweeps(500):
            pred = model(partial)
            loss = chamfer_distance(pred, gt)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, pred


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
