"""train_el.py -- a PV inspection start-up segments cracks and inactive cell areas in electroluminescence
(EL) images of solar modules: a U-Net with an EfficientNet-B4 encoder (segmentation_models_pytorch, 20M
parameters), 1024 x 1024 EL crops, batch 8, fp16 autocast, on one RTX A5000 (24 GB) in the office.
Cracks are rare and thin, so the engineer added a "hard example replay" curriculum: after each step
the two samples with the highest loss go into a pool (capacity 512, the easiest dropped when full), and
every 4th batch two of its eight samples are replaced by hard ones from the pool:

    class HardExampleMiner:
        def add(self, images, masks, per_sample_loss):
            scores = per_sample_loss.tolist()
            for i in sorted(range(len(scores)), key=scores.__getitem__)[-self.per_batch:]:
                self.pool.append((scores[i], images[i], masks[i]))
            self.pool.sort(key=lambda e: -e[0]); del self.pool[self.capacity:]

    loss_map = F.binary_cross_entropy_with_logits(logits, masks, reduction="none")
    per_sample = loss_map.mean(dim=(1, 2, 3)); loss = per_sample.mean() + dice(logits, masks)
    ...
    miner.add(images, masks, per_sample.detach())

`images` and `masks` are the batch already on the GPU, and `images[i]` is a view: each pool entry keeps
its whole batch's storage alive (8 x 12 MiB of fp32 images + 8 x 4 MiB of masks = 128 MiB), not the
16 MiB of the one sample.  The pool is bounded in entries, but with two entries per batch it keeps a new
batch every step until it holds 512 entries -- 32 GiB, more than the card.  Training fits with ~7.5 GiB
to spare (the U-Net keeps ~15.5 GiB of activations at this size); the pool eats that at 128 MiB a step,
and at step 57 (pool of 114 entries, 7.3 GiB) the forward fails in the decoder's full-resolution block.

An expert: the memory is the replay pool (a Python list on the miner): views of GPU batches.  Keep the
samples' dataset indices (and reload them through the loader), or `.cpu()` copies of the single sample
(`images[i].clone()` on the GPU would at least cut it to 16 MiB an entry, 8 GiB at capacity, still too
much for this card).  Wrong first advice: a smaller batch, gradient checkpointing or more mixed precision
(the activations fit; the pool grows until it eats any saving), expandable_segments / empty_cache (the
pool's tensors are live), a bigger GPU (the pool would reach 32 GiB).
"""
import random
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
BATCH_SIZE = 8
SIZE = 1024
PX = BATCH_SIZE * SIZE * SIZE                      # pixels of a batch, one channel
_rng = random.Random(7)


# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
def _getitem(self, idx):
    """t[i] / t[a:b]: a view of those rows sharing t's storage (and keeping it alive), as in PyTorch."""
    rows = self.__dict__.get("_rows") or self._root().__dict__.get("_rows", 1)
    n = len(range(*idx.indices(rows))) if isinstance(idx, slice) else 1
    v = self.view()
    v.nbytes = self._root().nbytes // rows * n
    v._rows = n
    return v


def _cat(tensors, dim=0):
    """torch.cat / torch.stack along the batch: a new tensor of their total size."""
    out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
    out._rows = sum(t.__dict__.get("_rows", 1) for t in tensors)
    return torch._derive(out, *tensors)


def _mean(self, dim=None):
    """A reduction: a small new tensor, in the graph of its input (mean saves no tensor)."""
    out = torch.empty((self.__dict__.get("_rows", 1) if dim is not None else 1) * 4, device="cuda")
    out._rows = self.__dict__.get("_rows", 1) if dim is not None else 1
    out = torch._derive(out, self)
    if out._params:
        out._saved = self._saved if self.__dict__.get("_saved") is not None else self
    return out


def _tolist(self):
    """Tensor.tolist(): the values (the stand-in computes none; a seeded generator gives the losses)."""
    rows = self.__dict__.get("_rows") or self._root().__dict__.get("_rows", 1)
    return [_rng.random() for _ in range(rows)]


def _add(a, b):
    out = torch._derive(torch.empty_like(a), a, b)
    if out._params:
        out._saved = (a, b)
    return out


def binary_cross_entropy_with_logits(input, target, reduction="mean"):
    """A per-pixel loss map in fp32 (reduction="none"), saving the logits."""
    out = torch.empty(PX * 4, device="cuda")
    out._rows = BATCH_SIZE
    out._saved = input
    return torch._derive(out, input)


torch.Tensor.__getitem__ = _getitem
torch.Tensor.mean = _mean
torch.Tensor.tolist = _tolist
torch.Tensor.__add__ = _add
torch.cat = torch.stack = _cat
F.binary_cross_entropy_with_logits = binary_cross_entropy_with_logits
_autograd_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """loss.backward(): PyTorch frees each saved tensor as it passes it; the stand-in frees them first."""
    todo = [self._saved]
    self._saved = None
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor) and t.__dict__.get("_saved") is not None:
            todo.append(t._saved)
            t._saved = None
    _autograd_backward(self, gradient, retain_graph, create_graph, inputs)


torch.Tensor.backward = _backward


# -- segmentation_models_pytorch's Unet("efficientnet-b4"), as far as memory goes -------------------------
class MBConvBlock(torch.nn.Module):
    """Inverted residual: expand 1x1, BN, SiLU, depthwise, BN, SiLU, SE, project 1x1, BN; fp16 activations
    kept for backward: the block's input, five expanded tensors, two projected ones."""

    def __init__(self, cin, cout, expand, res):
        torch.nn.Module.__init__(self)
        mid = cin * expand
        self.weight = torch.nn.Parameter(torch.empty((cin * mid + mid * 9 + mid * cout) * 4, device="cuda"))
        self.mid, self.cout, self.res, self.expand = mid, cout, res, expand

    def forward(self, x):
        per_ch = BATCH_SIZE * self.res * self.res * 2
        h = x
        for ch in [self.mid] * (5 if self.expand > 1 else 2) + [self.cout, self.cout]:
            a = torch.empty(ch * per_ch, device="cuda")
            a._saved = h
            h = a
        return h


# (in channels, out channels, expansion, repeats, resolution): EfficientNet-B4 at 1024 x 1024
STAGES = [(48, 24, 1, 2, 512), (24, 32, 6, 4, 256), (32, 56, 6, 4, 128), (56, 112, 6, 6, 64),
          (112, 160, 6, 6, 64), (160, 272, 6, 8, 32), (272, 448, 6, 2, 32)]
DECODER = [(448 + 160, 256, 64), (256 + 56, 128, 128), (128 + 32, 64, 256), (64 + 48, 32, 512), (32, 16, 1024)]


class EfficientNetEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv_stem = torch.nn.Conv2d(3, 48, 3, stride=2, device="cuda")
        self.blocks = torch.nn.Module()
        n = 0
        for cin, cout, e, reps, res in STAGES:
            for r in range(reps):
                setattr(self.blocks, str(n), MBConvBlock(cin if r == 0 else cout, cout, e, res))
                n += 1
        self.n = n

    def forward(self, images):
        x = self.conv_stem(images)
        feats = [x]
        for i in range(self.n):
            x = getattr(self.blocks, str(i))(x)
            feats.append(x)
        return feats


class DecoderBlock(torch.nn.Module):
    """Upsample, concatenate the skip, (conv 3x3, BN, ReLU) x 2: fp16 activations kept."""

    def __init__(self, cin, cout, res):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty((cin * cout * 9 + cout * cout * 9) * 4, device="cuda"))
        self.cin, self.cout, self.res = cin, cout, res

    def forward(self, x, skip):
        per_ch = BATCH_SIZE * self.res * self.res * 2
        h = torch.empty(self.cin * per_ch, device="cuda")
        h._saved = (x, skip)
        for ch in (self.cout,) * 6:
            a = torch.empty(ch * per_ch, device="cuda")
            a._saved = h
            h = a
        return h


class Unet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = EfficientNetEncoder()
        self.decoder = torch.nn.Module()
        for i, (cin, cout, res) in enumerate(DECODER):
            setattr(self.decoder, "block%d" % i, DecoderBlock(cin, cout, res))
        self.segmentation_head = torch.nn.Conv2d(16, 1, 3, device="cuda")

    def forward(self, images):
        feats = self.encoder(images)
        x = feats[-1]
        skips = [feats[-11], feats[-23], feats[-27], feats[0], None]
        for i in range(len(DECODER)):
            x = getattr(self.decoder, "block%d" % i)(x, skips[i])
        return self.segmentation_head(x)


def dice(logits, masks):
    d = torch.empty(512, device="cuda")
    d._saved = logits
    return torch._derive(d, logits)


class HardExampleMiner:
    def __init__(self, capacity=512, per_batch=2):
        self.capacity, self.per_batch = capacity, per_batch
        self.pool = []

    def add(self, images, masks, per_sample_loss):
        scores = per_sample_loss.tolist()
        for i in sorted(range(len(scores)), key=scores.__getitem__)[-self.per_batch:]:
            self.pool.append((scores[i], images[i], masks[i]))
        self.pool.sort(key=lambda e: -e[0])
        del self.pool[self.capacity:]

    def sample(self, k):
        picks = random.sample(self.pool, k)
        return torch.stack([p[1] for p in picks]), torch.stack([p[2] for p in picks])


def el_loader(n):
    for _ in range(n):
        images = torch.empty(PX * 3, dtype=torch.float32, device="cuda")    # normalised, 3 channels
        masks = torch.empty(PX, dtype=torch.float32, device="cuda")
        images._rows = masks._rows = BATCH_SIZE
        yield images, masks


def main():
    model = Unet().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler()
    miner = HardExampleMiner(capacity=512, per_batch=2)
    for epoch in range(60):
        model.train()
        for step, (images, masks) in enumerate(el_loader(900)):
            if step % 4 == 3 and len(miner.pool) >= 16:
                hard_images, hard_masks = miner.sample(2)
                images = torch.cat([images[:6], hard_images])
                masks = torch.cat([masks[:6], hard_masks])
                del hard_images, hard_masks
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(images)
                loss_map = F.binary_cross_entropy_with_logits(logits, masks, reduction="none")
                per_sample = loss_map.mean(dim=(1, 2, 3))
                loss = per_sample.mean() + dice(logits, masks)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            miner.add(images, masks, per_sample.detach())
            del logits, loss_map, per_sample, loss
            if step % 10 == 0:
                print("epoch %d step %d pool %d allocated %.1f GiB" % (
                    epoch, step, len(miner.pool), torch.cuda.memory_allocated() / 2**30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
