"""train_kpconv.py -- KPConv (deformable, 15 kernel points, ~14M parameters) semantic segmentation
of terrestrial laser scans of building facades, on one L4 (22.5 GiB usable of its 24 GB), with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True already set.  Training samples input spheres
(in_radius 2 m) one at a time (batch_size 1) after a 2 cm grid subsampling; a sphere has 0.8-1.5M
points and trains at ~8 GiB.

The sampler then lands in front of a balcony railing scanned from 1.5 m away: after subsampling the
sphere still holds 6.2M points (the config sets no max_in_points).  The first block at full
resolution builds its neighbourhoods (K=35: 1.6 GiB of int64 indices), the kernel-point
correlations it keeps for backward (N x K x 15 fp32: 12.1 GiB) and 64 output channels (1.5 GiB);
the second block's correlations (another 12.1 GiB) do not fit.  Every other sphere fits.

An expert: this one input is the peak -- cap the points per input sphere (max_in_points, or
shrink the sphere / subsample harder where it is dense), or split that sphere into pieces; the
model, batch and card are fine.  A smaller batch is impossible (it is 1); not expandable_segments
(already on) or empty_cache; mixed precision or checkpointing the blocks might squeeze this sphere
through at a cost, but the next denser one fails again; not inference, quantization or sharding.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

K = 35                  # neighbours per point
KP = 15                 # kernel points


class KPConvBlock(torch.nn.Module):
    def __init__(self, c_in, c_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(KP * c_in * c_out * 4, device="cuda"))
        self.c_out = c_out

    def forward(self, x, neighbors, n_points):
        corr = torch.empty(n_points * K * KP * 4, device="cuda")       # kernel-point correlations
        corr._saved = neighbors
        out = torch.empty(n_points * self.c_out * 4, device="cuda")
        out._saved = corr
        out._x = x
        return out


class KPFCNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.block0 = KPConvBlock(1, 64)
        self.block1 = KPConvBlock(64, 64)
        self.block2 = KPConvBlock(64, 128)
        self.block3 = KPConvBlock(128, 256)
        self.decoder = torch.nn.Parameter(torch.empty(40 * MiB, device="cuda"))

    def forward(self, points, features, n_points):
        neighbors = torch.empty(n_points * K * 8, device="cuda")       # radius neighbourhoods, int64
        neighbors._saved = points
        x = self.block0(features, neighbors, n_points)
        x = self.block1(x, neighbors, n_points)
        pooled = torch.empty(n_points // 4 * K * 8, device="cuda")     # strided neighbourhoods
        pooled._saved = x
        x = self.block2(x, pooled, n_points // 4)
        x = self.block3(x, pooled, n_points // 4)
        logits = torch.empty(n_points * 12 * 4, device="cuda")
        logits._saved = x
        return logits


def sphere_sizes():
    """Points per input sphere after the 2 cm grid subsampling, as the sampler draws them."""
    for n in (1100000, 870000, 1420000, 960000, 6200000, 1250000):
        yield n


def main():
    model = KPFCNN()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.98)
    batch_size = 1
    for n_points in sphere_sizes():
        points = torch.empty(n_points * 3 * 4 * batch_size, device="cuda")
        features = torch.empty(n_points * 4 * batch_size, device="cuda")
        logits = model(points, features, n_points)
        loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, points, features


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
