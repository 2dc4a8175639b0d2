"""run_md.py -- NVT molecular dynamics of a 48,000-atom LiPF6/EC electrolyte box with the MACE-MP-0 "medium"
foundation potential (4.7M parameters), in a plain PyTorch loop (TorchSim-style, everything stays on the
GPU) on one RTX 4090 (24 GB).  Forces come from autograd on the positions, so the loop runs with autograd on:

    model = mace_mp(model="medium", default_dtype="float32").eval()
    frames = []
    for step in range(100_000):                                 # 50 ps at 0.5 fs
        pos.requires_grad_(True)
        out = model(graph(pos))                                 # energy + per-atom descriptors
        forces = -torch.autograd.grad(out["energy"], pos)[0]
        pos, vel = langevin_step(pos.detach(), vel, forces)
        if step % 5 == 0:                                       # for the active-learning uncertainty later
            frames.append({"pos": pos.clone(), "forces": forces.detach(),
                           "desc": out["node_feats"].detach()})

One step's forward/backward needs ~6 GiB (1.9M edges within the 6 A cutoff) and is freed each step.  Each
saved frame is ~48 MiB (the 48,000 x 256 float32 descriptors, the rest is small), so frames grows by
~9.6 GiB per 1,000 steps; at about step 1,800 (~365 frames, 17 GiB) the next step's forward cannot get its
activations and the run dies with CUDA out of memory, 15 minutes in, on a step exactly like the
thousand before it.

An expert: the list `frames` keeps every saved frame on the GPU -- move each frame to host memory when it is
saved (.cpu(), or write them to disk in chunks), or keep only a bounded window on the device.  Not
torch.no_grad / inference_mode (the forces ARE the gradient: that breaks the simulation), not a smaller
batch (there is none), not mixed precision or quantization (MD wants fp32 forces, and the model is 19 MB),
not expandable_segments or empty_cache (the memory is live, not cached).
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
N_ATOMS = 48000
scen_truth.note_every_empty(torch)


class InteractionBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    def forward(self, h):
        edge_feats = torch.empty(1536 * MiB, device="cuda")      # 1.9M edges x tensor-product features
        edge_feats._saved = h
        msg = torch.empty(1280 * MiB, device="cuda")             # messages before aggregation
        msg._saved = edge_feats
        node = torch.empty(N_ATOMS * 256 * 4, device="cuda")     # node features after this interaction
        node._saved = msg
        return node


class MACE(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))
        self.interaction0 = InteractionBlock()
        self.interaction1 = InteractionBlock()
        self.readout = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))

    def forward(self, pos):
        h = torch.empty(N_ATOMS * 256 * 4, device="cuda")
        h._saved = pos
        h = self.interaction0(h)
        node_feats = self.interaction1(h)
        energy = torch.empty(512, device="cuda")
        energy._saved = node_feats
        return {"energy": energy, "node_feats": node_feats}


def langevin_step(pos, vel, forces):
    new_pos = torch.empty(N_ATOMS * 3 * 4, device="cuda")
    new_vel = torch.empty(N_ATOMS * 3 * 4, device="cuda")
    return new_pos, new_vel


def main():
    model = MACE().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    pos = torch.empty(N_ATOMS * 3 * 4, device="cuda")
    vel = torch.empty(N_ATOMS * 3 * 4, device="cuda")
    frames = []
    for step in range(100000):
        pos.requires_grad_(True)
        out = model(pos)
        energy = out["energy"]
        energy._params = (pos,)
        scen_truth.backward(energy)                              # torch.autograd.grad(energy, pos)
        forces = pos.grad
        pos.grad = None
        pos, vel = langevin_step(pos.detach(), vel, forces)
        if step % 5 == 0:
            frames.append({"pos": pos.clone(), "forces": forces.detach(),
                           "desc": out["node_feats"].detach()})
        del out, energy, forces


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
