"""train_sbi_cnn.py -- a cosmology group's simulation-based inference: a particle-mesh N-body code
written in JAX (their own, in the style of JaxPM: 256^3 particles on a 256^3 mesh, FFT Poisson solver)
makes a batch of 8 late-time density fields per step for random (Omega_m, sigma_8), and a 3D ResNet in
PyTorch learns to regress the parameters from the log-density (bf16 autocast).  One A100 40GB (CC 8.0).

The student knew that JAX takes 75% of the card at its first use, so the training script sets the
fraction before building anything:

    import os, jax, jax.numpy as jnp, torch
    from pm import simulate_batch          # pm.py: K = fftk(MESH), a jnp array made at import time
    ...
    def main():
        os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.20"   # leave the card to PyTorch
        model = ResNet3D().cuda() ...

But the line runs after `import pm`, whose module-level wave-vector grid (`K = fftk(MESH)`, a jnp array)
already brought up XLA's GPU client: the client read its settings then, defaults and all, and took 30 GiB
(0.75 x 40 GiB) in one arena.  The variable is in the environment (a report would show it) but it had no
effect.  The simulations themselves need under 2 GiB of that arena (one PM sim at a time, lax.map over the
batch; the 8 fields, 512 MiB, are copied to the host and into a torch tensor).  PyTorch gets the 9.5 GiB
that is left; the 3D ResNet's activations for a batch of 8 fields at 256^3 (bf16) are about 16 GiB, and the
first training step's forward pass fails in layer1 (full 128^3 resolution, 32 channels: 1 GiB per
tensor) at a 1 GiB request.  No other process, no PyTorch cache
to speak of, nothing grows.

An expert: the other framework's arena holds three quarters of the card; the fraction was set too late to
matter.  Set XLA_PYTHON_CLIENT_MEM_FRACTION (or XLA_PYTHON_CLIENT_PREALLOCATE=false, or
XLA_PYTHON_CLIENT_ALLOCATOR=platform) in the shell / job script, or as the first lines before anything
imports or uses JAX; then JAX keeps 8 GiB and PyTorch gets 31 GiB, enough for the batch (16.5 GiB at its peak).  Wrong first
advice: a smaller batch, checkpointing or a smaller model (it trains fine once JAX is capped), empty_cache
or expandable_segments (PyTorch caches nothing), other processes (there are none), raising a PyTorch cap
(there is none), a bigger GPU.
"""
import os
import sys

import jax
import jax.numpy as jnp
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the real frameworks have and the stand-ins lack, mirrored in plain Python (compiled as their own
# files, so that frames in them count as the frameworks'): jax.device_get (to a host array),
# jnp.complex64, torch.as_tensor (host -> device copy), autocast's cast of a conv's input, BatchNorm3d, ReLU,
# AdaptiveAvgPool3d, Linear, elementwise addition.
_JAX_OPS = r'''
import jax.numpy as jnp
jnp._SIZES["complex64"] = 8
jnp.complex64 = jnp.dtype("complex64")

class _HostArray(object):
    """numpy.ndarray as jax.device_get returns it: host memory only."""
    def __init__(self, shape, dtype, nbytes):
        self.shape, self.dtype, self.nbytes = shape, dtype, nbytes

def device_get(x):
    return _HostArray(x.shape, x.dtype, x.nbytes)
'''
_jns = {}
exec(compile(_JAX_OPS, jax.__file__, "exec"), _jns)
jax.device_get = _jns["device_get"]

_TORCH_OPS = r'''
from torch.autograd._graph import derive
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}

def as_tensor(data, dtype=None, device=None):
    out = torch.empty(data.nbytes, device=device)
    out._dtype = "float32"
    return out

def _convert(t, dtype):
    out = torch.empty(t.nbytes // _ITEM[t.dtype], dtype=dtype, device=t.device)
    out._saved = t
    return derive(out, t)

_plain_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward, then what PyTorch does with the graph unless retain_graph: frees what it saved."""
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
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))

def _binary(self, other):                      # elementwise, broadcasting: the larger operand's size
    n = max(self.nbytes, other.nbytes if isinstance(other, torch.Tensor) else 0)
    out = torch.empty(n, device=self.device)
    out._dtype = self.dtype
    out._saved = (self, other) if isinstance(other, torch.Tensor) else self
    return derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))
'''
_ns = {"torch": torch}
exec(compile(_TORCH_OPS, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["_backward"]
torch.as_tensor = _ns["as_tensor"]
torch.Tensor.__add__ = torch.Tensor.__radd__ = torch.Tensor.__mul__ = torch.Tensor.__rmul__ = _ns["_binary"]

_NN_OPS = r'''
from torch.autograd._graph import derive
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _conv3d_forward(self, input):
    half = torch.is_autocast_enabled()
    if half and input.dtype == "float32":
        input = _convert(input, "bfloat16")            # autocast casts a conv's input
    out = self._conv_forward(input, self.weight, self.bias)
    out._dtype = "bfloat16" if half else input.dtype
    return out

class BatchNorm3d(Module):
    def __init__(self, num_features, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))
        self.register_buffer("running_mean", torch.empty(num_features * 4, device=device))
        self.register_buffer("running_var", torch.empty(num_features * 4, device=device))
    def forward(self, input):
        out = torch.empty(input.nbytes, device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return derive(out, input)

class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

class AdaptiveAvgPool3d(Module):
    def __init__(self, output_size):
        Module.__init__(self)
    def forward(self, input):
        out = torch.empty(64 * 1024, device=input.device)
        out._saved = input
        return derive(out, input)

class Linear(Module):
    def __init__(self, fin, fout, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(fin * fout * 4, device=device))
        self.bias = Parameter(torch.empty(fout * 4, device=device))
    def forward(self, input):
        out = torch.empty(4096, device=input.device)
        out._saved = input
        return derive(out, input)

def mse_loss(input, target):
    out = torch.empty(512, device=input.device)
    out._saved = input
    return derive(out, input)
'''
_ns.update(_convert=_ns["_convert"])
exec(compile(_NN_OPS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv3d.forward = _ns["_conv3d_forward"]
nn.BatchNorm3d, nn.ReLU, nn.AdaptiveAvgPool3d, nn.Linear = (_ns["BatchNorm3d"], _ns["ReLU"], _ns["AdaptiveAvgPool3d"],
                                                            _ns["Linear"])
F.mse_loss = _ns["mse_loss"]
# --- end of the stand-in additions; the user's program follows (pm.py first, then train_sbi_cnn.py)


# ======================= pm.py (imported by the training script) =======================
MESH = (256, 256, 256)
BOX = 512.0                  # Mpc/h


def fftk(shape):
    """The wave vectors of the mesh's real FFT, kx, ky, kz (float32)."""
    return jnp.zeros((3, shape[0], shape[1], shape[2] // 2 + 1), jnp.float32)


K = fftk(MESH)               # built once at import


def linear_field(seed, omega_m, sigma_8):
    return jnp.zeros((MESH[0], MESH[1], MESH[2] // 2 + 1), jnp.complex64)


def simulate(seed, omega_m, sigma_8, steps=10):
    """2LPT initial conditions, then `steps` kick-drift-kick PM steps; returns the density contrast."""
    field = linear_field(seed, omega_m, sigma_8)
    pos = jnp.zeros((MESH[0] * MESH[1] * MESH[2], 3), jnp.float32)
    vel = jnp.zeros((MESH[0] * MESH[1] * MESH[2], 3), jnp.float32)
    for _ in range(steps):
        rho = jnp.zeros(MESH, jnp.float32)                     # cic paint
        phi_k = jnp.zeros((MESH[0], MESH[1], MESH[2] // 2 + 1, 2), jnp.float32)
        forces = jnp.zeros((MESH[0] * MESH[1] * MESH[2], 3), jnp.float32)
        del rho, phi_k, forces
    del field, pos, vel
    return jnp.zeros(MESH, jnp.float32)


def simulate_batch(seeds, params):
    """lax.map over the batch: one simulation at a time; the fields stacked."""
    out = jnp.zeros((len(seeds),) + MESH, jnp.float32)
    for s, (om, s8) in zip(seeds, params):
        delta = simulate(s, om, s8)
        del delta
    return out
# ======================= end of pm.py =======================


# ======================= train_sbi_cnn.py =======================
cfg = {"batch_size": 8, "lr": 3e-4, "steps": 20000, "width": 32}


def conv3x3(cin, cout, stride=1):
    return nn.Conv3d(cin, cout, 3, stride=stride, bias=False, device="cuda")


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        nn.Module.__init__(self)
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = nn.BatchNorm3d(cout, device="cuda")
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm3d(cout, device="cuda")
        self.relu = nn.ReLU(inplace=True)
        self.project = stride != 1 or cin != cout
        if self.project:
            self.down = nn.Conv3d(cin, cout, 1, stride=stride, bias=False, device="cuda")

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.down(x) if self.project else x
        return self.relu(out + identity)


class ResNet3D(nn.Module):
    """ResNet-18 layout in 3D: stem (stride 2), four stages of two blocks, widths w, 2w, 4w, 8w."""

    def __init__(self, w=32, n_params=2):
        nn.Module.__init__(self)
        self.stem = nn.Conv3d(1, w, 5, stride=2, bias=False, device="cuda")
        self.bn = nn.BatchNorm3d(w, device="cuda")
        self.relu = nn.ReLU(inplace=True)
        cin = w
        for i, (cout, stride) in enumerate(((w, 1), (2 * w, 2), (4 * w, 2), (8 * w, 2))):
            setattr(self, "layer%d" % (i + 1), nn.Module())
            layer = getattr(self, "layer%d" % (i + 1))
            layer.block0 = BasicBlock(cin, cout, stride)
            layer.block1 = BasicBlock(cout, cout)
            cin = cout
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(cin, 2 * n_params, device="cuda")    # mean and log-variance per parameter

    def forward(self, x):
        x = self.relu(self.bn(self.stem(x)))
        for i in range(1, 5):
            layer = getattr(self, "layer%d" % i)
            x = layer.block1(layer.block0(x))
        return self.head(self.pool(x))


def prior_sample(n, step):
    return [(0.1 + 0.4 * ((step * 7 + i) % 10) / 10.0, 0.6 + 0.4 * ((step * 3 + i) % 10) / 10.0) for i in range(n)]


def main():
    os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.20"      # PM sims need ~2 GiB: leave the card to PyTorch
    print("jax devices:", jax.devices())
    model = ResNet3D(cfg["width"])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=1e-4)
    batch_size = cfg["batch_size"]
    for step in range(cfg["steps"]):
        params = prior_sample(batch_size, step)
        seeds = [step * batch_size + i for i in range(batch_size)]
        deltas = simulate_batch(seeds, params)                  # (8, 256, 256, 256) float32 in JAX
        x = torch.as_tensor(jax.device_get(deltas), device="cuda")
        del deltas
        theta = torch.empty(batch_size * 2 * 4, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = F.mse_loss(out, theta)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print("step", step, "torch peak %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
