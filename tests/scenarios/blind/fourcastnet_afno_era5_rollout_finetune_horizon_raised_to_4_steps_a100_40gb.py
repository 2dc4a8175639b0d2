"""train_rollout.py -- a weather group fine-tunes FourCastNet (AFNO backbone, 0.25 deg ERA5: 20 variables on
the 720 x 1440 grid, patch 8 -> 90 x 180 = 16,200 tokens, embed 768, 12 AFNO blocks, 75M parameters) from the
released one-step checkpoint for better 3-5 day skill, with a multi-step rollout loss on one A100-SXM4-40GB of
the university cluster:

    rollout = {0: 2, 2: 4, 4: 6}              # epoch -> autoregressive steps in the loss (a curriculum)
    for epoch in range(cfg.max_epochs):
        n_steps = ...                         # 2, then 4 from epoch 2, then 6
        for inp, tars in loader:              # batch_size = 1: one 20 x 720 x 1440 state (83 MB)
            x, loss = inp, 0.
            for k in range(n_steps):
                x = model(x)                  # the next 6 h state, fed back in
                loss = loss + F.mse_loss(x, tars[k])
            (loss / n_steps).backward(); optimizer.step()

The paper's two-step fine-tune fits: one step of the model keeps ~10.8 GiB of activations for backward (each
AFNO block ~0.9 GiB at 16,200 x 768 tokens: layer norms, the FFT'd field and its block-diagonal MLP, the 4x MLP),
so two steps peak at ~24 GiB with the weights, gradients, AdamW state (1.2 GiB) and targets.  At epoch 2 the
curriculum asks for 4 steps: every unrolled step's activations stay alive until the single backward, and the
first iteration of epoch 2 fails in the 4th step's forward (block 5 of 12, 39 GiB allocated) -- with 83 MB of
input and a batch of 1.

An expert: memory is set by the unrolled horizon, not by the batch (already 1) or a leak.  Checkpoint each
rollout step (or each AFNO block) with torch.utils.checkpoint so only the step inputs stay alive (83 MB each),
or truncate backprop through the rollout (detach all but the last step or two, the "pushforward" trick).
bf16 autocast helps the MLPs but FourCastNet keeps its FFTs in float32 (the 90 x 180 token grid is not a power
of two), so it only postpones the failure to 6 steps.  Wrong first advice: a smaller batch (it is 1), inference
mode (this trains), empty_cache / expandable_segments (the cache holds 0.09 GiB in pieces of 39.5: the step needs
7 more blocks of 0.9 GiB), an 8-bit optimizer or ZeRO (the whole model state is 1.2 GiB), a coarser grid (a
different model).
"""
import os
import sys
import types

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code): torch.fft.rfft2/irfft2, F.layer_norm/gelu/mse_loss, tensor
# arithmetic, the freeing of the saved tensors after backward, which the stand-in torch lacks; each makes the tensors PyTorch's would (sizes in bytes,
# the output in the input's graph, what backward needs kept in `_saved`).  Compiled as torch's own files so
# that the failing frames are the framework's, as in PyTorch.
_TORCH_DIR = os.path.dirname(torch.__file__)
_FFT_SRC = '''
def rfft2(input, dim=(-2, -1), norm=None):
    out = torch.empty(input.nbytes // 720 * 728 // 2 * 2, device=input.device)   # 90 x 91 complex64 of 90 x 180 float32
    out._saved = input
    return torch._derive(out, input)


def irfft2(input, s=None, dim=(-2, -1), norm=None):
    out = torch.empty(input.nbytes * 720 // 728, device=input.device)
    out._saved = input
    return torch._derive(out, input)
'''
_F_SRC = '''
def _same(input, scale=1):
    out = torch.empty(int(input.nbytes * scale), device=input.device)
    out._saved = input
    return derive(out, input)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return _same(input)


def gelu(input, approximate="none"):
    return _same(input)


def relu(input, inplace=False):
    return _same(input)


def softshrink(input, lambd=0.5):
    return _same(input)


def linear(input, weight, bias=None, out_features=1, in_features=1):
    return _same(input, float(out_features) / in_features)


def mse_loss(input, target, reduction="mean"):
    out = torch.empty(512, device=input.device)
    out._saved = input
    return derive(out, input, target)
'''
_TENSOR_SRC = '''
def _binary(self, other):
    both = isinstance(other, Tensor)
    out = torch.empty(max(self.nbytes, other.nbytes if both else 0, 512), device=self.device)
    out._saved = (self, other) if both else self
    return torch._derive(out, self, *([other] if both else []))


Tensor.__add__ = Tensor.__radd__ = Tensor.__truediv__ = Tensor.__mul__ = _binary
_plain_backward = Tensor.backward


def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward, then what PyTorch does with the graph (retain_graph False): what it saved is freed."""
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))


Tensor.backward = backward
'''
_fft = types.ModuleType("torch.fft")
_fft.__file__ = os.path.join(_TORCH_DIR, "fft", "__init__.py")
_fft.torch = torch
exec(compile(_FFT_SRC, _fft.__file__, "exec"), _fft.__dict__)
torch.fft = sys.modules["torch.fft"] = _fft
exec(compile(_F_SRC, F.__file__, "exec"), F.__dict__)
_ns = {"torch": torch, "Tensor": torch.Tensor}
exec(compile(_TENSOR_SRC, os.path.join(_TORCH_DIR, "_tensor.py"), "exec"), _ns)
# ---- end of the supplement


class HostArray(object):
    """A float32 array read from the HDF5 files (numpy), moved to the GPU by .to(device)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def to(self, device, non_blocking=False):
        return torch.empty(self.nbytes, device=device)


# ------------------------------------------------------------------------------------------------------------
# the user's program
# ------------------------------------------------------------------------------------------------------------
cfg = types.SimpleNamespace(
    img_size=(720, 1440), patch_size=8, in_chans=20, out_chans=20, embed_dim=768, depth=12, num_blocks=8,
    mlp_ratio=4, sparsity_threshold=0.01, hard_thresholding_fraction=1.0,
    batch_size=1, lr=5e-5, max_epochs=6, rollout={0: 2, 2: 4, 4: 6},
    train_years=[2016], pretrained="/scratch/fcn/backbone.ckpt",
)
H, W = cfg.img_size[0] // cfg.patch_size, cfg.img_size[1] // cfg.patch_size        # 90 x 180 tokens
FIELD = cfg.in_chans * cfg.img_size[0] * cfg.img_size[1] * 4                       # one state, float32


class PatchEmbed(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.proj = torch.nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size,
                                    device="cuda")

    def forward(self, x):
        return self.proj(x)                                          # B x 768 x 90 x 180


class AFNO2D(torch.nn.Module):
    """Adaptive Fourier neural operator mixing: rfft2 over the token grid, a block-diagonal complex MLP per
    frequency, soft-shrink, irfft2."""

    def __init__(self, hidden_size, num_blocks):
        torch.nn.Module.__init__(self)
        bs = hidden_size // num_blocks
        self.w1 = torch.nn.Parameter(torch.empty(2 * num_blocks * bs * bs * 4, device="cuda"))
        self.b1 = torch.nn.Parameter(torch.empty(2 * num_blocks * bs * 4, device="cuda"))
        self.w2 = torch.nn.Parameter(torch.empty(2 * num_blocks * bs * bs * 4, device="cuda"))
        self.b2 = torch.nn.Parameter(torch.empty(2 * num_blocks * bs * 4, device="cuda"))

    def forward(self, x):
        bias = x
        x = torch.fft.rfft2(x, dim=(1, 2), norm="ortho")              # 90 x 91 x 768 complex64
        o1 = F.relu(x)                                               # o1_real, o1_imag (pre- and post-ReLU)
        o1 = F.relu(o1)
        o2 = F.softshrink(o1, lambd=cfg.sparsity_threshold)          # o2_real, o2_imag -> stack -> shrink
        x = F.softshrink(o2, lambd=cfg.sparsity_threshold)
        x = torch.fft.irfft2(x, s=(H, W), dim=(1, 2), norm="ortho")
        return x + bias


class Mlp(torch.nn.Module):
    def __init__(self, dim, hidden):
        torch.nn.Module.__init__(self)
        self.fc1_weight = torch.nn.Parameter(torch.empty((dim * hidden + hidden) * 4, device="cuda"))
        self.fc2_weight = torch.nn.Parameter(torch.empty((hidden * dim + dim) * 4, device="cuda"))
        self.dim, self.hidden = dim, hidden

    def forward(self, x):
        x = F.linear(x, self.fc1_weight, out_features=self.hidden, in_features=self.dim)
        x = F.gelu(x)
        return F.linear(x, self.fc2_weight, out_features=self.dim, in_features=self.hidden)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        d = cfg.embed_dim
        self.norm1_weight = torch.nn.Parameter(torch.empty(2 * d * 4, device="cuda"))
        self.filter = AFNO2D(d, cfg.num_blocks)
        self.norm2_weight = torch.nn.Parameter(torch.empty(2 * d * 4, device="cuda"))
        self.mlp = Mlp(d, d * cfg.mlp_ratio)

    def forward(self, x):
        residual = x
        x = F.layer_norm(x, (cfg.embed_dim,), self.norm1_weight)
        x = self.filter(x)
        x = x + residual                                             # double skip
        residual = x
        x = F.layer_norm(x, (cfg.embed_dim,), self.norm2_weight)
        x = self.mlp(x)
        return x + residual


class AFNONet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = PatchEmbed()
        self.pos_embed = torch.nn.Parameter(torch.empty(H * W * cfg.embed_dim * 4, device="cuda"))
        for i in range(cfg.depth):
            setattr(self, "blocks_%d" % i, Block())
        self.head_weight = torch.nn.Parameter(
            torch.empty(cfg.embed_dim * cfg.out_chans * cfg.patch_size ** 2 * 4, device="cuda"))

    def forward(self, x):
        x = self.patch_embed(x)
        x = x + self.pos_embed
        for i in range(cfg.depth):
            x = getattr(self, "blocks_%d" % i)(x)
        return F.linear(x, self.head_weight, out_features=cfg.out_chans * cfg.patch_size ** 2,
                        in_features=cfg.embed_dim)                   # -> B x 20 x 720 x 1440


class ERA5Rollout(object):
    """(input state, the next n_future states) pairs from the yearly HDF5 files, 6-hourly."""

    def __init__(self, years, n_future):
        self.years, self.n_future = years, n_future

    def __len__(self):
        return 3                # the program runs 3 samples per epoch (1,460 in the real run): same memory

    def __getitem__(self, i):
        return HostArray(FIELD), [HostArray(FIELD) for _ in range(self.n_future)]


def steps_for(epoch):
    return max(n for e, n in cfg.rollout.items() if e <= epoch)


def train():
    device = "cuda:0"
    model = AFNONet()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    dataset = ERA5Rollout(cfg.train_years, steps_for(0))
    for epoch in range(cfg.max_epochs):
        n_steps = steps_for(epoch)
        dataset.n_future = n_steps
        for i in range(len(dataset)):
            inp, tars = dataset[i]
            inp = inp.to(device, non_blocking=True)
            tars = [t.to(device, non_blocking=True) for t in tars]
            optimizer.zero_grad(set_to_none=True)
            x, loss = inp, 0.
            for k in range(n_steps):
                x = model(x)
                loss = loss + F.mse_loss(x, tars[k])
            loss = loss / n_steps
            loss.backward()
            optimizer.step()
        print("epoch %d  rollout %d  allocated %.1f GiB  peak %.1f GiB" % (
            epoch, n_steps, torch.cuda.memory_allocated() / 2 ** 30, torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
