"""train_potential.py -- a PaiNN-style equivariant interatomic potential (3 interaction layers, 128 features,
5 A cutoff, radial basis precomputed in the collate; 1.2M parameters) trained on energies and forces of a
SPICE-like set that mixes small drug-like molecules (10-60 atoms) with solvated protein fragments (400-3,000
atoms), on a V100 32GB with PyTorch 2.0.  Batches are a fixed number of structures (batch_size=24), so a
batch has anywhere from 17k to 1.3M edges; forces come from autograd (create_graph=True); a CUDA
prefetcher copies the next batch to the GPU while the current one trains, and every third batch is kept
in a bounded hard-example replay buffer (a deque of 48 batches, on the GPU: 6.8 GiB when full):

    prefetcher = CUDAPrefetcher(DataLoader(ds, batch_size=24, shuffle=True, collate_fn=collate_radius))
    hard = collections.deque(maxlen=48)
    for step, batch in enumerate(prefetcher):
        if step % 3 == 0: hard.append(batch)
        energy = model(batch)
        forces = -torch.autograd.grad(energy.sum(), batch.pos, create_graph=True)[0]
        loss = mse(energy, batch.y) + 100 * mse(forces, batch.f)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

Step 257 (1.33M edges, 23 GiB of edge activations, the buffer full) went through.  Every step frees blocks of new sizes, the
caching allocator splits its cached segments to serve the next ones, and the prefetched and replayed
batches' tensors, which live for many steps, land inside those segments and pin them.  At step 504 a
batch of 861k edges -- about half the biggest one so far -- asks for a 1.2 GiB edge tensor: PyTorch has
about 10.5 GiB reserved but unallocated, in pieces none of which is large enough, and releasing the
entirely free segments frees nothing.

An expert: fragmentation of the caching allocator by sizes that change every step -- set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first; then batch by a budget of edges (dynamic batching,
as MACE / fairchem samplers do) so sizes stay steady, and keep the replay buffer in host memory.  Not
gradient checkpointing and not a bigger card (twice this batch already fit), not a smaller batch as the
first answer; bf16 autocast is not an option for the forces of an interatomic potential, and a V100 has no
bf16.  Nothing grows: the buffer is bounded and full since step 141.
"""
import collections
import random
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

FEAT = 128
LAYERS = 3


def batch_stream(n_batches, seed=7):
    """(atoms, edges) of each shuffled batch of 24 structures: mostly small molecules, sometimes a batch
    with several protein fragments (edges ~ atoms x neighbours within 5 A)."""
    rng = random.Random(seed)
    for _ in range(n_batches):
        atoms = edges = 0
        for _ in range(24):
            if rng.random() < 0.15:
                n = rng.randint(400, 3000)
                atoms, edges = atoms + n, edges + n * rng.randint(60, 90)
            else:
                n = rng.randint(10, 60)
                atoms, edges = atoms + n, edges + n * min(n - 1, rng.randint(15, 40))
        yield atoms, edges


class Batch(object):
    def __init__(self, atoms, edges):
        self.n_atoms, self.n_edges = atoms, edges
        self.z = torch.empty(atoms * 8, device="cuda")
        self.pos = torch.empty(atoms * 3 * 4, device="cuda")
        self.pos.requires_grad_(True)
        self.edge_index = torch.empty(edges * 2 * 8, device="cuda")
        self.edge_attr = torch.empty(edges * 64 * 4, device="cuda")       # radial basis, precomputed in collate
        self.edge_vec = torch.empty(edges * 4 * 4, device="cuda")         # r_ij and |r_ij|
        self.y = torch.empty(24 * 4, device="cuda")
        self.f = torch.empty(atoms * 3 * 4, device="cuda")


class CUDAPrefetcher(object):
    """Copies the next batch to the GPU while the current one trains (side stream in the real thing)."""

    def __init__(self, sizes):
        self.sizes = iter(sizes)
        self.next = None

    def preload(self):
        s = next(self.sizes, None)
        self.next = Batch(*s) if s is not None else None

    def __iter__(self):
        self.preload()
        while self.next is not None:
            cur = self.next
            self.preload()
            yield cur


class PaiNNInteraction(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.filter_net = nn.Parameter(torch.empty(20 * FEAT * 3 * FEAT * 4, device="cuda"))
        self.phi = nn.Parameter(torch.empty(2 * FEAT * 3 * FEAT * 4, device="cuda"))

    def forward(self, s, v, n_atoms, n_edges):
        rbf_w = torch.empty(n_edges * 3 * FEAT * 4, device="cuda")        # filter from the radial basis
        rbf_w._saved = s
        x_j = torch.empty(n_edges * 3 * FEAT * 4, device="cuda")          # phi(s)[edge_index[1]]
        x_j._saved = rbf_w
        v_j = torch.empty(n_edges * 3 * FEAT * 4, device="cuda")          # vector messages
        v_j._saved = x_j
        ds = torch.empty(n_atoms * FEAT * 4, device="cuda")               # scatter_add over edges
        ds._saved = v_j
        dv = torch.empty(n_atoms * 3 * FEAT * 4, device="cuda")
        dv._saved = ds
        return ds, dv


class PaiNN(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embedding = nn.Parameter(torch.empty(100 * FEAT * 4, device="cuda"))
        self.layers = [PaiNNInteraction() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "interaction_%d" % i, layer)
        self.readout = nn.Parameter(torch.empty(FEAT * FEAT * 4, device="cuda"))

    def forward(self, batch):
        s = torch.empty(batch.n_atoms * FEAT * 4, device="cuda")
        s._saved = batch.pos
        v = torch.empty(batch.n_atoms * 3 * FEAT * 4, device="cuda")
        for layer in self.layers:
            s, v = layer(s, v, batch.n_atoms, batch.n_edges)
        energy = torch.empty(24 * 4, device="cuda")
        energy._saved = s
        return energy


def forces_and_loss(model, batch, energy):
    """forces = -autograd.grad(energy.sum(), pos, create_graph=True): the backward through every
    interaction, kept as a graph for the second backward of the loss."""
    grads = []
    for _ in range(LAYERS):
        g = torch.empty(batch.n_edges * 3 * FEAT * 4, device="cuda")     # d(messages)/d(r_ij), kept
        g._saved = energy
        grads.append(g)
    forces = torch.empty(batch.n_atoms * 3 * 4, device="cuda")
    forces._saved = grads[-1]
    forces._keep = grads
    loss = torch.empty(512, device="cuda")
    loss._saved = forces
    loss._params = energy._params
    return loss


def main():
    batch_size = 24
    model = PaiNN()
    # truth mark at the failure itself (test scaffolding): unwinding the loop closes the prefetcher's
    # generator and frees the next batch before the except block runs
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    hard = collections.deque(maxlen=48)     # hard-example replay (re-trained every 10th step in the real code)
    for step, batch in enumerate(CUDAPrefetcher(batch_stream(20000))):
        if step % 3 == 0:
            hard.append(batch)
        energy = model(batch)
        loss = forces_and_loss(model, batch, energy)
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, energy, batch
        if step % 100 == 0:
            print("step %d allocated %.2f GiB reserved %.2f GiB" % (
                step, torch.cuda.memory_allocated() / 2.0 ** 30, torch.cuda.memory_reserved() / 2.0 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
