"""GCN auto-encoder link prediction on a co-authorship graph, negative_sampling(method="dense"), A100 40GB.

The real code: PyTorch Geometric's examples/link_pred.py adapted by a PhD student.  The prototype
ran on Cora (2,708 nodes), where the student benchmarked negative_sampling and kept
method="dense" because it was ~3x faster there.  The full run uses a 235,868-author collaboration
graph (ogbl-collab-sized: 128-d features, 1,179,052 training collaborations, both directions +
self-loops), full-graph, on a cluster node with one A100-SXM4-40GB:

    model = Net(dataset.num_features, 256, 256).to(device)          # 2-layer GCN encoder
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.01)
    def train():
        model.train()
        optimizer.zero_grad()
        z = model.encode(train_data.x, train_data.edge_index)
        neg_edge_index = negative_sampling(
            edge_index=train_data.edge_index, num_nodes=train_data.num_nodes,
            num_neg_samples=train_data.edge_label_index.size(1), method="dense")   # <- here
        ...
        loss.backward()
        optimizer.step()

In torch_geometric.utils.negative_sampling, method="dense" builds a boolean mask over the whole
population of possible edges, idx.new_ones(population, dtype=torch.bool) with population =
N*N - N (self-loops removed), marks the existing edges False and samples against it.  On Cora that
is 7.3 MB.  Here it is 235,868^2 - 235,868 = 55,633,477,556 bytes (51.8 GiB): one request larger
than the card.

Sizes before it: context 0.5 GiB, features 235,868 x 128 x 4 B = 121 MB, edge_index (2,358,104
directed edges) 37.7 MB, the encoder's saved activations for backward: per GCN layer the linear
output, the gathered messages x_j (2.59M edges with self-loops x 256 x 4 B = 2.66 GB) and the
aggregate (2 x 241 MB), plus the ReLU between them: ~6.5 GB; 6.3 GiB allocated, 6.8 GiB used with
the context, 32.8 GiB free.  The mask asks for 51.8 GiB
in the first epoch, between the encoder's forward and the first backward.

What an expert says first: the dense method's mask grows with N squared; use method="sparse"
(PyG's default), or draw corrupted tails uniformly per positive edge (and accept the rare false
negative).  Wrong advice: a smaller batch (there is none: the mask does not depend on it), autocast
or checkpointing (the encoder's 7 GiB are not the problem), a bigger card (80 GB would hold this
graph's mask and not the next one's), empty_cache / expandable_segments (nothing is cached).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda"
FLOAT = 4
INDEX = 8
NUM_NODES = 235_868
NUM_FEATURES = 128
NUM_TRAIN_EDGES = 1_179_052              # undirected collaborations in the training split


class GCNConv(nn.Module):
    """torch_geometric.nn.GCNConv: x @ W, then the normalised sum over neighbours (edge_index form)."""

    def __init__(self, in_channels, out_channels):
        nn.Module.__init__(self)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin = nn.Parameter(torch.empty(in_channels * out_channels * FLOAT, device=device))
        self.bias = nn.Parameter(torch.empty(out_channels * FLOAT, device=device))

    def forward(self, x, edge_index):
        num_nodes = x.nbytes // (self.in_channels * FLOAT)
        num_edges = edge_index.nbytes // (2 * INDEX) + num_nodes               # add_self_loops
        edge_weight = torch.empty(num_edges * FLOAT, device=device)            # gcn_norm
        h = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)  # self.lin(x)
        h._saved = x
        x_j = torch.empty(num_edges * self.out_channels * FLOAT, device=device)   # h[edge_index[0]] * norm
        x_j._saved = (h, edge_weight, edge_index)
        out = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)   # scatter-add to edge_index[1]
        out._saved = x_j
        return out


class Net(nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        nn.Module.__init__(self)
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def encode(self, x, edge_index):
        h = self.conv1(x, edge_index)
        relu = torch.empty(h.nbytes, device=device)
        relu._saved = h
        return self.conv2(relu, edge_index)

    def decode(self, z, edge_label_index):
        num_pairs = edge_label_index.nbytes // (2 * INDEX)
        out = torch.empty(num_pairs * FLOAT, device=device)       # (z[src] * z[dst]).sum(dim=-1)
        out._saved = z
        return out


def edge_index_to_vector(edge_index, num_nodes):
    """Flat ids row * (N - 1) + col of the existing edges, self-loops removed; the population N*N - N."""
    num_edges = edge_index.nbytes // (2 * INDEX)
    idx = torch.empty(num_edges * INDEX, device=device)
    return idx, num_nodes * num_nodes - num_nodes


def negative_sampling(edge_index, num_nodes, num_neg_samples, method="sparse"):
    """torch_geometric.utils.negative_sampling."""
    idx, population = edge_index_to_vector(edge_index, num_nodes)
    sample_size = int(1.1 * num_neg_samples)
    if method == "dense":
        # The dense version creates a mask of shape `population` to check for invalid samples.
        mask = torch.empty(population, dtype=torch.uint8, device=device)      # idx.new_ones(population, dtype=torch.bool)
        rnd = torch.empty(sample_size * INDEX, device=device)
        neg_idx = rnd
    else:
        rnd = torch.empty(sample_size * INDEX, device=device)
        neg_idx = rnd
    return torch.empty(2 * num_neg_samples * INDEX, device=device)


class SplitData(object):
    """RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True, add_negative_train_samples=False)
    output for training, .to(device)."""

    def __init__(self):
        self.num_nodes = NUM_NODES
        self.x = torch.empty(NUM_NODES * NUM_FEATURES * FLOAT, device=device)
        self.edge_index = torch.empty(2 * 2 * NUM_TRAIN_EDGES * INDEX, device=device)
        self.edge_label_index = torch.empty(2 * NUM_TRAIN_EDGES * INDEX, device=device)
        self.edge_label = torch.empty(NUM_TRAIN_EDGES * FLOAT, device=device)


def train(model, optimizer, train_data):
    model.train()
    optimizer.zero_grad()
    z = model.encode(train_data.x, train_data.edge_index)
    # We perform a new round of negative sampling for every training epoch:
    neg_edge_index = negative_sampling(
        edge_index=train_data.edge_index, num_nodes=train_data.num_nodes,
        num_neg_samples=train_data.edge_label_index.nbytes // (2 * INDEX), method="dense")
    out = model.decode(z, neg_edge_index)
    loss = torch.nn.functional.nll_loss(out, train_data.edge_label)   # binary_cross_entropy_with_logits
    loss.backward()
    optimizer.step()


def main():
    train_data = SplitData()
    model = Net(NUM_FEATURES, 256, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    for epoch in range(1, 101):
        train(model, optimizer, train_data)
        print("Epoch: %03d" % epoch, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
