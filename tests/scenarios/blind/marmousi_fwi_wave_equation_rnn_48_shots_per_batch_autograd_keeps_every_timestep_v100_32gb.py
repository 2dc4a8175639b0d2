"""fwi_marmousi.py -- a geophysics PhD student's full-waveform inversion of the Marmousi-2 velocity model
with PyTorch's autograd: the 2-D acoustic wave equation written as a recurrent cell (4th-order
finite-difference Laplacian as a fixed 5x5 convolution, leapfrog time stepping, absorbing boundary),
the velocity model an nn.Parameter, Adam on it, the misfit an L2 loss on the receivers' traces; the
gradient is whatever backward() through the time loop gives (the adjoint-state method, for free).
One Tesla V100-SXM2 32 GB on the department's cluster.

The code grew out of a tutorial that inverted a small layered model with 20 shots fired in one batch.
On Marmousi (resampled to 16 m: 188 x 576 cells, 228 x 616 with the absorbing frame; 1500 steps of
2 ms = 3 s of recording; 96 shots, a receiver on every surface cell) the student fires the survey in
two batches of 48 shots "to halve the memory":

    for batch in range(n_shots // shots_per_batch):        # shots_per_batch = 48
        optimizer.zero_grad()
        pred = propagator(src_amp[batch], src_loc[batch])   # loops over 1500 time steps
        loss = mse(pred, observed[batch])
        loss.backward()
        optimizer.step()

Autograd keeps, for every time step, what backward needs: the wavefield the Laplacian convolution read
and the Laplacian that the velocity term multiplied -- two 228 x 616 float32 fields per shot per step,
1.1 MB; 1.68 GB per shot over the 1500 steps, 80 GB for a batch of 48.  The first forward pass of the
first batch dies at time step ~610 of 1500 (31 GiB of saved wavefields), in the leapfrog update of
that step.  Nothing leaks: this is one forward pass whose saved state grows with time.

An expert: fewer shots per batch -- the misfit is a sum over shots, so backward() per group of
(say) 12 shots and one optimizer step after all 96 gives exactly the same gradient, each group needing
~19 GiB; or checkpoint the time loop (torch.utils.checkpoint over blocks of ~40 steps: only the block
boundaries are kept, each block recomputed in backward), which keeps 48 shots a batch at about one
extra forward's cost.  Saved-tensor offload to host memory (torch.autograd.graph.save_on_cpu) works but
moves 80 GB per batch over PCIe.  Wrong first advice: mixed precision (fp16 wavefields over 1500 leapfrog
steps lose the accuracy FWI needs, and a V100 has no bf16), inference_mode/no_grad (the gradient is
the point), expandable_segments or empty_cache (nothing is cached; the saved fields are live),
quantization or LoRA-style tricks (the parameters are one 0.56 MB velocity grid).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file (its
# frames count as the framework's): elementwise arithmetic as autograd records it (a product with a tensor
# that requires grad saves the other operand; sums save nothing), indexing out the receivers' samples,
# torch.stack.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _new(nbytes, like, saved, *inputs):
    out = torch.empty(nbytes, device=like.device)
    if torch.is_grad_enabled():
        out._saved = tuple(saved)
        return derive(out, *inputs)
    return out

def square_scale(v, dt):
    """(v * dt) ** 2: saves v"""
    return _new(v.nbytes, v, (v,), v)

def leapfrog(u, u_prev, lap, c2, src):
    """2 * u - u_prev + c2 * lap + src: the product c2 * lap saves lap (c2 requires grad) and c2; the
    sums and the scalar multiple save nothing; the temporaries go"""
    tmp = torch.empty(u.nbytes, device=u.device)       # c2 * lap
    del tmp
    return _new(u.nbytes, u, (lap, c2, u, u_prev), u, u_prev, lap, c2)

def sample(u, nbytes):
    """u[:, rec_z, rec_x]: a small copy, in the graph"""
    return _new(nbytes, u, (u,), u)

def stack(tensors, dim=0):
    return _new(sum(t.nbytes for t in tensors), tensors[0], tuple(tensors), *tensors)

def mse_loss(pred, target):
    return _new(512, pred, (pred, target), pred)

_engine_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _engine_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        saved = t.__dict__.get("_saved")
        if saved is None:
            continue
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if isinstance(x, torch.Tensor))
'''
_ns = {"torch": torch}
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.stack = _ns["stack"]
torch.Tensor.backward = _ns["_backward"]
T_square_scale, T_leapfrog, T_sample, F_mse_loss = _ns["square_scale"], _ns["leapfrog"], _ns["sample"], _ns["mse_loss"]


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
NZ, NX, PML = 188, 576, 20                 # Marmousi-2 at 16 m, plus the absorbing frame
DT, NT = 0.002, 1500                       # 3 s of recording
N_SHOTS, SHOTS_PER_BATCH = 96, 48
FLOAT = 4


class WaveCell(nn.Module):
    """one leapfrog step of the 2-D acoustic wave equation for a batch of shots"""

    def __init__(self):
        nn.Module.__init__(self)
        self.laplacian = nn.Conv2d(1, 1, 5, padding=2, bias=False, device="cuda")   # 4th-order stencil / dx^2
        self.laplacian.weight.requires_grad_(False)

    def forward(self, u, u_prev, c2, src):
        lap = self.laplacian(u)
        return T_leapfrog(u, u_prev, lap, c2, src)


class Propagator(nn.Module):
    def __init__(self, vp_init):
        nn.Module.__init__(self)
        self.vp = nn.Parameter(vp_init)
        self.cell = WaveCell()

    def forward(self, src_amp, n_shots):
        nz, nx = NZ + 2 * PML, NX + 2 * PML
        c2 = T_square_scale(self.vp, DT)
        u_prev = torch.empty(n_shots * nz * nx * FLOAT, device="cuda")
        u = torch.empty(n_shots * nz * nx * FLOAT, device="cuda")
        traces = []
        for it in range(NT):
            u, u_prev = self.cell(u, u_prev, c2, src_amp), u
            traces.append(T_sample(u, n_shots * NX * FLOAT))
        return torch.stack(traces)


vp_init = torch.empty((NZ + 2 * PML) * (NX + 2 * PML) * FLOAT, device="cuda")   # smoothed Marmousi, 1.5-4.7 km/s
observed = torch.empty(N_SHOTS * NT * NX * FLOAT, device="cuda")                # the "field" data, 332 MB
src_amp = torch.empty(NT * FLOAT, device="cuda")                                # 7 Hz Ricker wavelet

propagator = Propagator(vp_init)
optimizer = torch.optim.AdamW([propagator.vp], lr=10.0, weight_decay=0.0)
n_epochs = 300

try:
    for epoch in range(n_epochs):
        epoch_loss = 0.0
        for batch in range(N_SHOTS // SHOTS_PER_BATCH):
            optimizer.zero_grad()
            pred = propagator(src_amp, SHOTS_PER_BATCH)
            loss = F_mse_loss(pred, observed)
            loss.backward()
            optimizer.step()
        print("epoch %d" % epoch)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
