"""MinkUNet34C on ScanNet: scene sizes that change every batch fragment the caching allocator (V100 32GB).

The real program (train_scannet_minkunet.py) trains MinkowskiEngine's MinkUNet34C for ScanNet v2 semantic
segmentation (20 classes) at 2 cm voxels, batch 8 scenes, as in MinkowskiEngine's examples:

    model = MinkUNet34C(in_channels=3, out_channels=20, D=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    loader = DataLoader(ScanNetVoxels("train", voxel_size=0.02), batch_size=8, shuffle=True,
                        collate_fn=ME.utils.batch_sparse_collate, num_workers=8)
    for epoch in range(120):
        for coords, feats, labels in loader:
            x = ME.SparseTensor(feats.cuda(), coords.cuda())
            out = model(x)
            loss = criterion(out.F, labels.cuda())
            optimizer.zero_grad(); loss.backward(); optimizer.step()

ScanNet rooms at 2 cm have from ~25k to ~600k occupied voxels (median ~100k), so a batch of 8 scenes is
0.4M to 2.5M voxels, a different number every step, and every tensor of the sparse UNet (features of each
level, MinkowskiEngine's kernel maps and gather buffers, BatchNorm/ReLU outputs, the decoder's
concatenations) changes size with it.  The caching allocator keeps the segments it made for earlier batches
and best-fits new blocks into them, splitting them; after a couple of hundred steps its cache is a patchwork
of partly used segments.

Sizes: weights ~0.15 GB fp32, AdamW state 2x that.  A batch of N voxels keeps ~12 KB per voxel for backward
(the stride-1 decoder, 96-128 channels, dominates; coarser levels add ~20%): the step with 2.19M voxels
peaks at 25.9 GiB of live tensors, and run alone in a fresh process it reserves 28.2 GiB: it fits the
31.5 GiB the V100 leaves after the context.  At step 199 of the first epoch (2.19M voxels, the largest batch
so far) it fails in the forward, in the last decoder stage (block8, stride 1), asking for 803 MiB with
24.2 GiB allocated and 7.2 GiB reserved by PyTorch but unallocated: the holes are there, none of them is
803 MiB long, and every segment holds some live block, so the allocator's release-and-retry finds nothing
to give back.

What an expert says: the request is small next to the reserved-but-unallocated memory; this is
fragmentation from variable-size sparse inputs, not a model that does not fit.  Set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:512), or, as MinkowskiEngine's own
docs suggest for changing input sizes, call torch.cuda.empty_cache() every few iterations; capping the
voxels per batch helps too.  Wrong advice: a bigger GPU, gradient checkpointing, mixed precision (V100: fp16
only, and it is not the cause), quantisation, inference mode, stopping other processes (there are none).
"""
import collections
import random

import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn

device = "cuda"

BATCH_SIZE = 8
NUM_CLASSES = 20
EPOCHS = 120
ITERS_PER_EPOCH = 1201 // BATCH_SIZE * 8    # 1,201 training rooms, rotated/scaled crops
# occupied voxels per level, relative to stride 1 (surfaces: each stride-2 step keeps ~1/3.3 ... 1/3.9)
LEVEL_RATIO = (1.0, 3.3, 3.3 * 3.6, 3.3 * 3.6 * 3.8, 3.3 * 3.6 * 3.8 * 3.9)


# --- autograd and MinkowskiEngine's kernels, as far as memory goes (the stand-in torch computes nothing) ----
def saving(out, *inputs):
    """out, made from inputs: under autograd its graph keeps what the operation saved for backward"""
    if torch.is_grad_enabled():
        out._saved = tuple(t for t in inputs if t is not None)
    return out


def backward(loss):
    """loss.backward() as PyTorch runs it, memory-wise: from the loss back to the inputs, each saved
    activation's gradient is made and the saved tensor released; then the parameters' .grad"""
    order, seen, queue = [], set(), collections.deque([loss])
    while queue:
        t = queue.popleft()
        saved, t._saved = getattr(t, "_saved", None), None
        if saved is None:
            continue
        for s in (saved if isinstance(saved, tuple) else (saved,)):
            if id(s) not in seen:
                seen.add(id(s))
                order.append(s)
                queue.append(s)
    grads = []
    for i in range(len(order)):
        grads.append(torch.empty_like(order[i]))
        order[i] = None
        if len(grads) > 2:
            grads.pop(0)
    del grads, order
    loss.backward()


def features(num_voxels, channels):
    return torch.empty(int(num_voxels) * channels, dtype=torch.float32, device=device)


class CoordinateManager(object):
    """ME.CoordinateManager: the coordinate maps and kernel maps of one batch, kept until the batch is done
    (a C++ object in MinkowskiEngine: no Python attributes)"""
    __slots__ = ("num_voxels", "kernel_maps")

    def __init__(self, num_voxels):
        self.num_voxels = [num_voxels / r for r in LEVEL_RATIO]
        self.kernel_maps = {}

    def kernel_map(self, in_level, out_level):
        key = (in_level, out_level)
        if key not in self.kernel_maps:
            n = self.num_voxels[out_level]
            pairs = n * 11 if in_level == out_level else self.num_voxels[in_level]   # in/out int32 indices
            self.kernel_maps[key] = torch.empty(int(pairs * 8), device=device)
        return self.kernel_maps[key]


class SparseTensor(object):
    """ME.SparseTensor: features F (N x C) at a tensor stride, coordinates in the manager"""

    def __init__(self, F, level, channels, manager):
        self.F, self.level, self.channels, self.coordinate_manager = F, level, channels, manager

    @property
    def num_voxels(self):
        return self.coordinate_manager.num_voxels[self.level]


def sparse_input(coords, feats, num_voxels):
    manager = CoordinateManager(num_voxels)
    return SparseTensor(feats, 0, 3, manager)


class MinkowskiConvolution(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, transpose=False):
        nn.Module.__init__(self)
        self.in_channels, self.out_channels, self.stride, self.transpose = in_channels, out_channels, stride, transpose
        self.kernel = nn.Parameter(torch.empty(kernel_size ** 3 * in_channels * out_channels, dtype=torch.float32,
                                               device=device))

    def forward(self, x):
        level = x.level + (1 if self.stride == 2 and not self.transpose else 0) - (1 if self.transpose else 0)
        m = x.coordinate_manager
        kernel_map = m.kernel_map(x.level, level)
        n_out = m.num_voxels[level]
        gather = features(n_out * 1.5, self.in_channels)        # in_feat[in_map] for the kernel offsets
        out = saving(features(n_out, self.out_channels), x.F, kernel_map)
        del gather
        return SparseTensor(out, level, self.out_channels, m)


class MinkowskiBatchNorm(nn.Module):
    def __init__(self, channels):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(channels, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(channels, dtype=torch.float32, device=device))

    def forward(self, x):
        out = saving(features(x.num_voxels, x.channels), x.F)
        return SparseTensor(out, x.level, x.channels, x.coordinate_manager)


def relu(x, residual=None):
    """MinkowskiReLU (of x + residual in a block)"""
    out = saving(features(x.num_voxels, x.channels), x.F, residual.F if residual is not None else None)
    return SparseTensor(out, x.level, x.channels, x.coordinate_manager)


def cat(a, b):
    """ME.cat(out, skip): the channels of both"""
    out = saving(features(a.num_voxels, a.channels + b.channels), a.F, b.F)
    return SparseTensor(out, a.level, a.channels + b.channels, a.coordinate_manager)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, downsample=False):
        nn.Module.__init__(self)
        self.conv1 = MinkowskiConvolution(inplanes, planes)
        self.norm1 = MinkowskiBatchNorm(planes)
        self.conv2 = MinkowskiConvolution(planes, planes)
        self.norm2 = MinkowskiBatchNorm(planes)
        if downsample:
            self.downsample = MinkowskiConvolution(inplanes, planes, kernel_size=1)

    def forward(self, x):
        out = relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        residual = self.downsample(x) if "downsample" in self._modules else x
        return relu(out, residual)                              # out + residual, ReLU


class Stage(nn.Module):
    def __init__(self, inplanes, planes, blocks):
        nn.Module.__init__(self)
        for i in range(blocks):
            setattr(self, str(i), BasicBlock(inplanes if i == 0 else planes, planes,
                                             downsample=(i == 0 and inplanes != planes)))

    def forward(self, x):
        for block in self._modules.values():
            x = block(x)
        return x


class MinkUNet34C(nn.Module):
    PLANES = (32, 64, 128, 256, 256, 128, 96, 96)
    LAYERS = (2, 3, 4, 6, 2, 2, 2, 2)
    INIT_DIM = 32

    def __init__(self, in_channels, out_channels, D=3):
        nn.Module.__init__(self)
        P, L = self.PLANES, self.LAYERS
        self.conv0p1s1 = MinkowskiConvolution(in_channels, self.INIT_DIM, kernel_size=5)
        self.bn0 = MinkowskiBatchNorm(self.INIT_DIM)
        self.conv1p1s2 = MinkowskiConvolution(32, 32, kernel_size=2, stride=2)
        self.bn1 = MinkowskiBatchNorm(32)
        self.block1 = Stage(32, P[0], L[0])
        self.conv2p2s2 = MinkowskiConvolution(P[0], P[0], kernel_size=2, stride=2)
        self.bn2 = MinkowskiBatchNorm(P[0])
        self.block2 = Stage(P[0], P[1], L[1])
        self.conv3p4s2 = MinkowskiConvolution(P[1], P[1], kernel_size=2, stride=2)
        self.bn3 = MinkowskiBatchNorm(P[1])
        self.block3 = Stage(P[1], P[2], L[2])
        self.conv4p8s2 = MinkowskiConvolution(P[2], P[2], kernel_size=2, stride=2)
        self.bn4 = MinkowskiBatchNorm(P[2])
        self.block4 = Stage(P[2], P[3], L[3])
        self.convtr4p16s2 = MinkowskiConvolution(P[3], P[4], kernel_size=2, stride=2, transpose=True)
        self.bntr4 = MinkowskiBatchNorm(P[4])
        self.block5 = Stage(P[4] + P[2], P[4], L[4])
        self.convtr5p8s2 = MinkowskiConvolution(P[4], P[5], kernel_size=2, stride=2, transpose=True)
        self.bntr5 = MinkowskiBatchNorm(P[5])
        self.block6 = Stage(P[5] + P[1], P[5], L[5])
        self.convtr6p4s2 = MinkowskiConvolution(P[5], P[6], kernel_size=2, stride=2, transpose=True)
        self.bntr6 = MinkowskiBatchNorm(P[6])
        self.block7 = Stage(P[6] + P[0], P[6], L[6])
        self.convtr7p2s2 = MinkowskiConvolution(P[6], P[7], kernel_size=2, stride=2, transpose=True)
        self.bntr7 = MinkowskiBatchNorm(P[7])
        self.block8 = Stage(P[7] + self.INIT_DIM, P[7], L[7])
        self.final = MinkowskiConvolution(P[7], out_channels, kernel_size=1)

    def forward(self, x):
        out_p1 = relu(self.bn0(self.conv0p1s1(x)))
        out = relu(self.bn1(self.conv1p1s2(out_p1)))
        out_b1p2 = self.block1(out)
        out = relu(self.bn2(self.conv2p2s2(out_b1p2)))
        out_b2p4 = self.block2(out)
        out = relu(self.bn3(self.conv3p4s2(out_b2p4)))
        out_b3p8 = self.block3(out)
        out = relu(self.bn4(self.conv4p8s2(out_b3p8)))
        out = self.block4(out)
        out = relu(self.bntr4(self.convtr4p16s2(out)))
        out = self.block5(cat(out, out_b3p8))
        out = relu(self.bntr5(self.convtr5p8s2(out)))
        out = self.block6(cat(out, out_b2p4))
        out = relu(self.bntr6(self.convtr6p4s2(out)))
        out = self.block7(cat(out, out_b1p2))
        out = relu(self.bntr7(self.convtr7p2s2(out)))
        out = self.block8(cat(out, out_p1))
        return self.final(out)


# --- data and training --------------------------------------------------------------------------------------
class ScanNetVoxels(object):
    """rooms voxelised at 2 cm: occupied voxels per room (a shuffled epoch of random crops)"""

    def __init__(self, split, voxel_size=0.02, seed=1):
        self.rng = random.Random(seed)

    def batches(self, batch_size):
        for _ in range(ITERS_PER_EPOCH):
            rooms = [min(max(self.rng.lognormvariate(11.5, 0.9), 25e3), 600e3) for _ in range(batch_size)]
            n = int(sum(rooms))
            coords = torch.empty(n * 16, device=device)          # N x 4 int32 (batch index, x, y, z)
            feats = features(n, 3)                               # RGB
            labels = torch.empty(n * 8, device=device)           # int64
            yield n, coords, feats, labels


def criterion(logits, labels):
    """nn.CrossEntropyLoss(ignore_index=-100) on out.F"""
    return torch.nn.functional.cross_entropy(logits.F, labels)


def train_one_epoch(model, optimizer, dataset, epoch):
    for it, (n, coords, feats, labels) in enumerate(dataset.batches(BATCH_SIZE)):
        x = sparse_input(coords, feats, n)
        out = model(x)
        loss = criterion(out, labels)
        optimizer.zero_grad()
        backward(loss)
        optimizer.step()
        del x, out, loss, coords, feats, labels
        if it % 50 == 0:
            print("epoch %d iter %d  voxels %.2fM" % (epoch, it, n / 1e6))


def main():
    model = MinkUNet34C(in_channels=3, out_channels=NUM_CLASSES, D=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    dataset = ScanNetVoxels("train", voxel_size=0.02)
    for epoch in range(EPOCHS):
        model.train()
        train_one_epoch(model, optimizer, dataset, epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
