"""train_pinsage.py -- a GraphSAGE/PinSage-style item recommender on a user-item interaction graph
(120M nodes, 2.1B edges; node features: 768-d text embeddings kept in a host feature store) trained
on one RTX 4090 (24 GB), PyTorch 2.2 + a PyG-style NeighborLoader:

    loader = NeighborLoader(graph, num_neighbors=[-1, -1],   # "all neighbours: sampling hurt recall"
                            batch_size=1024, shuffle=True)
    for batch in loader:
        x = feature_store.gather(batch.n_id).to("cuda")      # features of every node of the subgraph
        out = model(x, batch.edge_index.cuda())[:batch.batch_size]
        loss = bpr_loss(out, ...); loss.backward(); optimizer.step(); optimizer.zero_grad()

For 300 steps a 2-hop subgraph of 1024 seeds has ~400k nodes (1.2 GiB of features, ~3 GiB of
activations).  Step 311 draws a seed next to the catalogue's hub items (a phone charger with 2.5M
buyers): with full fan-out its 2-hop subgraph is 9M nodes, and gathering their features asks for
25.7 GiB at once -- more than the whole card.  The model (3 SAGE layers, 16 MiB) and its optimizer
state are nothing.

An expert: cap the input -- a bounded fan-out (num_neighbors=[25, 10]) or importance sampling of
neighbours (PinSage's random-walk top-k), or cap/partition hub nodes; one subgraph is the peak.  A
smaller batch does not help (one hub seed alone pulls millions of nodes), neither do empty_cache,
expandable segments, gradient checkpointing, an 8-bit optimizer or sharding; there is no attention
to shorten or fuse.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

FEAT_DIM = 768
BATCH_SIZE = 1024


class SAGEConv(torch.nn.Module):
    def __init__(self, din, dout):
        torch.nn.Module.__init__(self)
        self.lin_l = torch.nn.Parameter(torch.empty(din * dout * 4, device="cuda"))
        self.lin_r = torch.nn.Parameter(torch.empty(din * dout * 4, device="cuda"))
        self.dout = dout

    def forward(self, x, n_nodes):
        agg = torch.empty(n_nodes * x_dim(x, n_nodes) * 4, device="cuda")   # mean of neighbours
        h = torch.empty(n_nodes * self.dout * 4, device="cuda")
        h._saved = agg
        agg._saved = x
        return h


def x_dim(x, n_nodes):
    return max(x.nbytes // (4 * n_nodes), 1)


class PinSAGE(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv1 = SAGEConv(FEAT_DIM, 1024)
        self.conv2 = SAGEConv(1024, 1024)
        self.conv3 = SAGEConv(1024, 256)

    def forward(self, x, n_nodes):
        h = self.conv1(x, n_nodes)
        h = self.conv2(h, n_nodes // 3)
        return self.conv3(h, n_nodes // 40)


class FeatureStore(object):
    """Host-side node features (memory-mapped); gather returns a host tensor."""

    def gather(self, n_id):
        return _HostFeatures(n_id * FEAT_DIM * 4)


class _HostFeatures(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes

    def to(self, device):
        return torch.empty(self.nbytes, device=device)


def neighbor_loader():
    """Subgraph sizes (nodes) of 1024 seeds with full 2-hop fan-out: ~400k, then a hub."""
    step = 0
    while True:
        step += 1
        yield 9000000 if step == 311 else 380000 + (step * 7919) % 60000


def main():
    model = PinSAGE()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fs = FeatureStore()
    for n_id in neighbor_loader():
        x = fs.gather(n_id).to("cuda")
        out = model(x, n_id)
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del x, out, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
