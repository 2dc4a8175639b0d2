"""pinn_ns3d.py -- a physics-informed network for 3D incompressible Navier-Stokes (the Beltrami-flow
benchmark): an MLP (x, y, z, t) -> (u, v, w, p), 8 tanh layers of 256, trained in fp32 on a V100 32GB
with 50,000 random collocation points per step (the PDE residual needs second derivatives through
torch.autograd.grad(..., create_graph=True)).  Training takes ~1.5 GiB.  Every 500 iterations the script
writes a VTK file for ParaView: the velocity, the pressure and the momentum residual on a 128^3 grid at
t = 1, in one call:

    def export_vtk(model, it):
        xyzt = grid_128().cuda().requires_grad_(True)            # 2,097,152 points
        uvwp = model(xyzt)                                       # autograd on: the residual needs it
        res = momentum_residual(uvwp, xyzt)                      # autograd.grad, create_graph=True
        write_vtk(f"fields_{it:06d}.vtu", uvwp.detach().cpu(), res.detach().cpu())

At iteration 500 the export's forward alone keeps every layer's pre-activation and tanh output of 2.1M
points for the derivatives (2 x 2 GiB per layer) and fails in the eighth (last) hidden layer, with
30 GiB allocated, before the derivatives.  Training itself never came close.

An expert: the evaluation grid is a single oversized pass: evaluate it in chunks (64k points at a
time, derivatives per chunk, each chunk's results detached and moved to the CPU), or on a coarser or
sub-sampled grid.  Not torch.no_grad()/inference_mode for this pass (the residual's derivatives need
autograd; only u, v, w, p could be computed without it), not mixed precision (PINN second derivatives in
fp16 are noise, and a V100 has no bf16), not checkpointing, not a bigger card.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

WIDTH = 256
DEPTH = 8
batch_size = 50000            # collocation points per training step
EXPORT_EVERY = 500


class Dense(torch.nn.Module):
    def __init__(self, cin, cout):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(cin * cout * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(cout * 4, device="cuda"))
        self.cout = cout

    def forward(self, x, n):
        pre = torch.empty(n * self.cout * 4, device="cuda")        # x @ W^T + b
        pre._saved = x
        act = torch.empty(n * self.cout * 4, device="cuda")        # tanh, saved for the derivatives
        act._saved = pre
        return act


class PINN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.inp = Dense(4, WIDTH)
        for i in range(DEPTH - 1):
            setattr(self, "hidden%d" % i, Dense(WIDTH, WIDTH))
        self.out = torch.nn.Parameter(torch.empty(WIDTH * 4 * 4, device="cuda"))

    def forward(self, xyzt):
        n = xyzt.nbytes // 16
        h = self.inp(xyzt, n)
        for i in range(DEPTH - 1):
            h = getattr(self, "hidden%d" % i)(h, n)
        uvwp = torch.empty(n * 4 * 4, device="cuda")
        uvwp._saved = h
        return uvwp


def momentum_residual(uvwp, xyzt):
    """du/dt + (u . grad) u + grad p - nu lap u, through torch.autograd.grad(create_graph=True): first and
    second derivatives, each a pass back through the network that keeps its own graph."""
    n = xyzt.nbytes // 16
    d1 = torch.empty(n * WIDTH * 4 * 4, device="cuda")
    d1._saved = uvwp
    d2 = torch.empty(n * WIDTH * 4 * 4, device="cuda")
    d2._saved = d1
    res = torch.empty(n * 4 * 4, device="cuda")
    res._saved = d2
    return res


def export_vtk(model, it):
    n_points = 128 ** 3
    xyzt = torch.empty(n_points * 4 * 4, device="cuda").requires_grad_(True)
    uvwp = model(xyzt)
    res = momentum_residual(uvwp, xyzt)
    # write_vtk("fields_%06d.vtu" % it, uvwp.detach().cpu(), res.detach().cpu())
    del uvwp, res, xyzt


def main():
    model = PINN().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for it in range(1, 200001):
        xyzt = torch.empty(batch_size * 4 * 4, device="cuda").requires_grad_(True)
        uvwp = model(xyzt)
        res = momentum_residual(uvwp, xyzt)
        loss = torch.empty(512, device="cuda")
        loss._saved = res
        loss._params = uvwp._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, res, uvwp, xyzt
        if it % EXPORT_EVERY == 0:
            export_vtk(model, it)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
