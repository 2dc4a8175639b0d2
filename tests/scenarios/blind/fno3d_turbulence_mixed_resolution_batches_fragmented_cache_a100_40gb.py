"""train_fno3d_multires.py -- a turbulence group trains a 3-D Fourier neural operator (Li et al.'s fourier_3d.py
layout: fc0 lift to width 32, four Fourier layers with 8 x 8 x 8 modes and a 1x1 Conv3d skip, fc1 to 128, GELU, fc2
to the output; a few thousand real parameters and 16 complex spectral weight tensors, 67 MB) as a
resolution-invariant surrogate for 3-D decaying turbulence. The DNS snapshots come at three resolutions, 64^3, 96^3
and 128^3; to make the operator discretisation-invariant, the group trains on all three at once, one resolution per
batch, batches drawn at random (50% / 30% / 20%), batch size 5, AdamW, one A100-SXM4-40GB, PyTorch 2.4, fp32 (FFT
sizes of 96 rule out cuFFT's half precision):

    sampler = ResolutionBucketSampler(datasets, weights={64: .5, 96: .3, 128: .2}, batch_size=5, seed=42)
    loader = DataLoader(multires_dataset, batch_sampler=sampler, num_workers=8, pin_memory=True)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        out = model(x)
        loss = myloss(out, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

A first run on 128^3 only, same batch size, trained for hours.  The mixed run dies at step 73, a 128^3 batch
that follows four 64^3 ones, in fc1: torch.OutOfMemoryError: "Tried to allocate 5.00 GiB.  GPU 0 has a total
capacity of 40.00 GiB of which 2.29 GiB is free.  Of the allocated memory 25.95 GiB is allocated by PyTorch, and
11.25 GiB is reserved by PyTorch but unallocated."

What happens: the activations change size from batch to batch (a 128^3 tensor is 8x a 64^3 one, 2.4x a 96^3
one), and PyTorch's caching allocator carves the smaller batches' tensors out of the large segments the 128^3
batches left in its cache, and the next 128^3 batch's out of whatever is left.  Tensors that live across steps
(the input and target copied in while the previous batch's are still referenced, AdamW's moments made after the
first backward) sit in the middle of such segments, so the segments can never be returned whole.  At the failure
11.25 GiB of the cache is free, but in pieces of at most 3.75 GiB, and the 5 GiB fc1 output does not fit any of
them nor the 2.29 GiB the driver has left.  The step itself peaks at about 31 GiB; a process that only ever sees
128^3 batches runs it every time.

An expert: fragmentation from mixed shapes: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before the
process starts) lets the allocator map memory into growing segments instead of fixed-size ones, and the holes
stop mattering; max_split_size_mb (e.g. 512) is the older knob with the same aim (large blocks are not split for
small requests).  Drawing the batches in resolution blocks (all 128^3 batches of an epoch together) also helps.
Wrong first advice: a smaller batch or gradient checkpointing (the step fits the card; throughput lost for
nothing), bf16/fp16 (cuFFT half precision only takes power-of-two sizes: 96^3 fails; and it is not the problem),
empty_cache() (the allocator already released every free segment before raising: the free memory is inside
partly used segments, which empty_cache cannot return), a bigger GPU, dropping the 128^3 data, treating it as a
leak (nothing grows: the 25.95 GiB allocated are one step's activations, the weights and the optimizer state).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20

# ---- stand-in gaps: nn.Linear over the channel (last) dim, torch.fft.rfftn/irfftn, torch.einsum for the mode
# product, F.gelu, and the DataLoader's host batches with .cuda() -- the real APIs of fourier_3d.py, each making
# the tensors PyTorch makes, sized in bytes (float32; the rfftn output complex64 [B, C, r, r, r//2+1]).  backward()
# runs as PyTorch's autograd does for this graph: the parameter gradients, then one gradient per saved activation,
# last first, each activation freed once its gradient is made.
BATCH = 5
WIDTH = 32
MODES = 8
FC1 = 128
C_IN = 13          # 10 input snapshots of the velocity magnitude + 3 grid coordinates
C_OUT = 1


class HostBatch(object):
    """A pinned host tensor from the DataLoader; .cuda() makes its copy on the GPU."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def cuda(self, non_blocking=False):
        return torch.empty(self.nbytes, device="cuda")


def _out(nbytes, *inputs, saved=None):
    t = torch.empty(int(nbytes), device="cuda")
    if saved is not None:
        saved.append(t)
    return torch._derive(t, *inputs)


class Linear(torch.nn.Module):
    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.fin, self.fout = fin, fout
        self.weight = torch.nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(fout * 4, device="cuda"))

    def forward(self, x, saved):
        return _out(x.nbytes * self.fout // self.fin, x, saved=saved)


class SpectralConv3d(torch.nn.Module):
    def __init__(self, cin, cout, m1, m2, m3):
        torch.nn.Module.__init__(self)
        for i in range(1, 5):
            # torch.rand(in, out, m1, m2, m3, dtype=torch.cfloat)
            setattr(self, "weights%d" % i, torch.nn.Parameter(torch.empty(cin * cout * m1 * m2 * m3 * 8, device="cuda")))

    def forward(self, x, r, saved):
        # x_ft = torch.fft.rfftn(x, dim=[-3, -2, -1]); the einsum over its corner slices keeps x_ft alive
        x_ft = _out(x.nbytes * (r // 2 + 1) / r * 2, x, saved=saved)
        # out_ft = torch.zeros(B, C, r, r, r//2+1, dtype=torch.cfloat); four corners filled by compl_mul3d
        out_ft = _out(x.nbytes * (r // 2 + 1) / r * 2, x_ft)
        x1 = _out(x.nbytes, out_ft)                     # torch.fft.irfftn(out_ft, s=(r, r, r))
        del out_ft
        return x1


class FNO3d(torch.nn.Module):
    def __init__(self, modes1, modes2, modes3, width):
        torch.nn.Module.__init__(self)
        self.width = width
        self.fc0 = Linear(C_IN, width)
        for i in range(4):
            setattr(self, "conv%d" % i, SpectralConv3d(width, width, modes1, modes2, modes3))
        for i in range(4):
            setattr(self, "w%d" % i, torch.nn.Conv3d(width, width, 1, device="cuda"))
        self.fc1 = Linear(width, FC1)
        self.fc2 = Linear(FC1, C_OUT)

    def forward(self, x, r):
        saved = []
        h = self.fc0(x, saved)                                          # [B, r, r, r, 32]
        for i in range(4):
            x1 = getattr(self, "conv%d" % i)(h, r, saved)
            x2 = getattr(self, "w%d" % i)(h)                            # 1x1 Conv3d
            s = _out(h.nbytes, x1, x2, saved=saved)                     # x1 + x2
            del x1, x2
            h = _out(h.nbytes, s, saved=saved) if i < 3 else s          # F.gelu
        h = self.fc1(h, saved)                                          # [B, r, r, r, 128]
        h = _out(h.nbytes, h, saved=saved)                              # F.gelu
        out = self.fc2(h, saved)
        out._saved_list = saved
        return out


def _backward(model, out):
    """loss.backward() for this graph."""
    g = torch.empty(out.nbytes, device="cuda")                          # d loss / d out
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.empty_like(p)
    saved = out._saved_list
    out._saved_list = None
    while saved:
        t = saved.pop()
        g2 = torch.empty(t.nbytes, device="cuda")
        del g
        g = g2
        del t
    del g


class ResolutionBucketSampler(object):
    """One resolution per batch, drawn with the given weights from a seeded generator."""

    def __init__(self, weights, batch_size, seed):
        self.weights, self.batch_size = weights, batch_size
        self.rng = random.Random(seed)

    def __iter__(self):
        while True:
            u, acc = self.rng.random(), 0.0
            for r, w in self.weights:
                acc += w
                if u < acc:
                    break
            yield r


def loader(sampler, steps):
    for step, r in zip(range(steps), sampler):
        n = BATCH * r ** 3 * 4
        yield r, HostBatch(n * C_IN), HostBatch(n * C_OUT)
# ----


def main():
    model = FNO3d(MODES, MODES, MODES, WIDTH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    print("FNO3d: width %d, modes %d, %.1f MB of parameters" % (WIDTH, MODES,
                                                               sum(p.nbytes for p in model.parameters()) / 1e6))
    sampler = ResolutionBucketSampler([(64, 0.5), (96, 0.3), (128, 0.2)], batch_size=BATCH, seed=42)
    x = y = None
    for step, (r, xb, yb) in enumerate(loader(sampler, 240)):
        x, y = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
        out = model(x, r)
        loss = _out(512, out)                                           # relative L2 loss
        _backward(model, out)
        del out, loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print("epoch done")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
