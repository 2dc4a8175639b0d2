"""train_sage.py -- GraphSAGE (3 layers, hidden 1024) on ogbn-papers100M with neighbour sampling (1024 seed
nodes per batch, fan-out [15, 10, 5]), features kept in pinned host memory and gathered per batch, on one
16 GB V100, with a plain `LD_PRELOAD=liboomguard.so`.  To hide the host-to-device copy the user's loop
moves the NEXT sampled subgraph to the GPU while the current one is still being trained on:

    batch = next(it).to(device, non_blocking=True)
    for step in range(steps):
        out = model(batch.x, batch.adjs)                     # sizes differ every batch
        nxt = next(it).to(device, non_blocking=True)         # prefetch: lands between live activations
        loss = F.cross_entropy(out[:batch.batch_size], batch.y); loss.backward(); optimizer.step()
        batch = nxt

Every sampled subgraph has a different size (1.0-2.4 GiB of features, activations to match), so PyTorch's
caching allocator carves its segments into blocks of odd sizes; the prefetched batch, allocated while the
activations live, stays when they are freed and splits the cached segments further.  At step 98,
right after the forward pass (its activations, 8 GiB, still live), the prefetch of the next subgraph asks
for 2.35 GiB for its features (4.9M nodes) while the allocator holds 3.7 GiB reserved but unallocated in
blocks too small for it (the largest 2.1 GiB) and the driver has 1.06 GiB free; the step would need ~13 GiB
of the card's 15.5 usable, as the largest steps before it did.

An expert: fragmentation of the caching allocator by many odd-sized, overlapping allocations.  Set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) before start; the memory is there.
Not a leak (allocated memory after each step is flat), not a model or batch that does not fit, not
another process; empty_cache() does not help (the allocator already gave back every whole free segment
before failing), a smaller fan-out or a bigger GPU only postpone it.
"""
import random
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 1024
FEAT = 128
HIDDEN = 1024


class SampledBatch(object):
    def __init__(self, num_nodes, num_edges):
        self.num_nodes, self.num_edges = num_nodes, num_edges
        self.x = torch.empty(num_nodes * FEAT * 4, device="cuda")
        self.edge_index = torch.empty(2 * num_edges * 8, device="cuda")
        self.y = torch.empty(batch_size * 8, device="cuda")


class SAGEConv(nn.Module):
    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.c_in, self.c_out = c_in, c_out
        self.lin_l = nn.Parameter(torch.empty(c_in * c_out * 4, device="cuda"))
        self.lin_r = nn.Parameter(torch.empty(c_in * c_out * 4, device="cuda"))

    def forward(self, x, num_targets):
        agg = torch.empty(num_targets * self.c_in * 4, device="cuda")       # mean of the neighbours
        agg._saved = x
        out = torch.empty(num_targets * self.c_out * 4, device="cuda")
        out._saved = agg
        return out


class GraphSAGE(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = SAGEConv(FEAT, HIDDEN)
        self.conv2 = SAGEConv(HIDDEN, HIDDEN)
        self.conv3 = SAGEConv(HIDDEN, 172)

    def forward(self, batch):
        n1 = batch.num_nodes // 6                 # nodes within two hops of the seeds
        n2 = batch.num_nodes // 40                # within one hop
        h = self.conv1(batch.x, n1)
        h2 = torch.empty(h.nbytes, device="cuda")                           # ReLU + dropout
        h2._saved = h
        h = self.conv2(h2, n2)
        h3 = torch.empty(h.nbytes, device="cuda")
        h3._saved = h
        return self.conv3(h3, batch_size)


def neighbor_loader(rng):
    """Sampled subgraphs: between 2M and 5M nodes (1.0-2.4 GiB of features) after de-duplication."""
    while True:
        nodes = rng.randint(2000000, 5000000)
        yield nodes, nodes * 3


def main():
    rng = random.Random(100)
    model = GraphSAGE()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    it = neighbor_loader(rng)
    batch = SampledBatch(*next(it))
    for step in range(100000):
        out = model(batch)
        nxt = SampledBatch(*next(it))                  # prefetch the next subgraph while this one trains
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = out._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del out, loss
        batch = nxt


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
