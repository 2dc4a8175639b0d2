"""train_fno.py -- a 3D Fourier neural operator for forced isotropic turbulence (128^3 grid, 4
spectral layers, width 32, AdamW) on a 48 GB L40S, with plain `LD_PRELOAD=liboomguard.so`.  The
author wants an animation of how the predictions sharpen over training:

    frames = []                                   # for the GIF made after training
    for step, (x, y) in enumerate(loader):        # batch 2: x 4 x 128^3 fields, y the velocity at t+dt
        pred = model(x.cuda()); y = y.cuda()
        loss = relative_l2(pred, y); loss.backward(); opt.step(); opt.zero_grad()
        if step % 2 == 0:
            frames.append((pred.detach(), y))     # prediction and truth, side by side
    make_gif(frames)

Training itself needs about 16 GiB (weights, AdamW state, ~12 GiB of saved spectral activations)
and stays flat.  Each logged step keeps its prediction (48 MiB) and its target batch (48 MiB) on
the GPU -- detached, so no graph, but the tensors themselves never leave the card.  The frames are
carved out of the blocks the step's activations free, so they end up scattered through the cache:
after about 470 steps they hold ~27 GiB and a backward pass fails to allocate a spectral layer's
128 MiB gradient with ~9 GiB cached in holes between frames.  The holes are a symptom: the frames
are what fills the card.

An expert: the list of frames holds the memory; move each frame to the CPU (`.cpu()`), keep one
sample at reduced resolution, write it to disk, or keep only the last N.  Not a smaller batch,
checkpointing or mixed precision (the step's own working set is constant and fits with room to
spare), not empty_cache (the memory is live), not expandable_segments or a bigger card first (each
would only postpone the failure by some dozens of frames).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
FIELD = 2 * 32 * 128 ** 3 * 4           # one width-32 activation of the batch, 512 MiB
VEL = 2 * 3 * 128 ** 3 * 4              # the batch's velocity field, 48 MiB
scen_truth.note_every_empty(torch)


class SpectralConv3d(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weights = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))    # complex modes, 4 corners

    def forward(self, x):
        x_ft = torch.empty(FIELD, device="cuda")              # rfftn (half spectrum, complex)
        x_ft._saved = x
        out_ft = torch.empty(FIELD // 4, device="cuda")      # kept modes times weights
        out_ft._saved = x_ft
        y = torch.empty(FIELD, device="cuda")                 # irfftn
        y._saved = out_ft
        return y


class FNOLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.spectral = SpectralConv3d()
        self.w = torch.nn.Parameter(torch.empty(32 * 32 * 4, device="cuda"))

    def forward(self, x):
        s = self.spectral(x)
        h = torch.empty(FIELD, device="cuda")                 # spectral + pointwise, GELU
        h._saved = s
        return h


class FNO3d(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.lift = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))
        self.layers = [FNOLayer() for _ in range(4)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.proj = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))

    def forward(self, x):
        h = torch.empty(FIELD, device="cuda")                 # lifting to width 32
        h._saved = x
        for l in self.layers:
            h = l(h)
        q = torch.empty(4 * FIELD, device="cuda")             # projection MLP hidden (128)
        q._saved = h
        out = torch.empty(VEL, device="cuda")
        out._saved = q
        return out


frames = []


def main():
    model = FNO3d()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    for step in range(20000):
        x = torch.empty(2 * 4 * 128 ** 3 * 4, device="cuda")
        y = torch.empty(VEL, device="cuda")
        pred = model(x)
        loss = torch.empty(512, device="cuda")
        loss._saved = pred
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 2 == 0:
            frames.append((pred.detach(), y))
        del loss, pred, x, y


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
