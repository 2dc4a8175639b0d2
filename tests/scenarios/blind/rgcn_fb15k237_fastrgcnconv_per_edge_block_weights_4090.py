"""R-GCN + DistMult link prediction on FB15k-237, with RGCNConv swapped for FastRGCNConv, on an RTX 4090.

The real code is PyTorch Geometric's examples/rgcn_link_pred.py (the Schlichtkrull et al. model),
run on a 24 GB RTX 4090, with one change the user made because an epoch took ~40 s:

    from torch_geometric.nn import FastRGCNConv as RGCNConv     # "same API, faster"
    dataset = RelLinkPredDataset(path, "FB15k-237")
    data = dataset[0].to(device)
    class RGCNEncoder(torch.nn.Module):
        def __init__(self, num_nodes, hidden_channels, num_relations):
            self.node_emb = Parameter(torch.empty(num_nodes, hidden_channels))
            self.conv1 = RGCNConv(hidden_channels, hidden_channels, num_relations, num_blocks=5)
            self.conv2 = RGCNConv(hidden_channels, hidden_channels, num_relations, num_blocks=5)
    model = GAE(RGCNEncoder(data.num_nodes, 500, dataset.num_relations),
                DistMultDecoder(dataset.num_relations // 2, 500))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    def train():
        z = model.encode(data.edge_index, data.edge_type)       # <- dies here, first epoch
        ...

What happens: RGCNConv loops (or segment-matmuls) over the 474 relation types, multiplying the
nodes' features by each relation's weight.  FastRGCNConv instead gathers the weight of every edge's
relation in one tensor and runs one batched matmul: message() does weight[edge_type], a tensor of
E x num_blocks x (500/5) x (500/5) floats.  The docs call it the faster, more memory-hungry variant;
on FB15k-237 that is not a little more.

Sizes: FB15k-237's training graph has 272,115 triples, 544,230 directed edges with the inverse
relations (474 relation types).  node_emb 14,541 x 500 x 4 B = 29 MB; each conv's block weights
474 x 5 x 100 x 100 x 4 B = 95 MB plus a 1 MB root; the edge index and types 13 MB.  In conv1's
message, x_j = x[edge_index[0]] is 544,230 x 500 x 4 B = 1.09 GB, then weight[edge_type] is
544,230 x 5 x 100 x 100 x 4 B = 108.8 GB (101.4 GiB) in a single request on a card with ~22 GiB
free.  (Its backward would need as much again for the gathered weights' gradient.)

What an expert says first: this is FastRGCNConv's per-edge weight materialisation, not the model
or the data; go back to RGCNConv (per-relation, ~1-2 GB here), or, as the R-GCN paper trains it,
message-pass over a sampled subset of ~30,000 edges per step (30k x 200 kB = 6 GB).  Splitting the
edge set into chunks inside the conv is the same idea.  Wrong advice: a bigger card (no single GPU
holds 2 x 109 GB), autocast (54 GB is still more than the card), gradient checkpointing (one
forward temporary is the problem), empty_cache / expandable_segments (nothing is cached), a
smaller batch (there is no batch: the encoder runs on the whole training graph).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda"
FLOAT = 4
INDEX = 8   # int64


class FastRGCNConv(nn.Module):
    """torch_geometric.nn.FastRGCNConv(in_channels, out_channels, num_relations, num_blocks=...)."""

    def __init__(self, in_channels, out_channels, num_relations, num_blocks=None):
        nn.Module.__init__(self)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_relations = num_relations
        self.num_blocks = num_blocks
        bi, bo = in_channels // num_blocks, out_channels // num_blocks
        self.weight = nn.Parameter(torch.empty(num_relations * num_blocks * bi * bo * FLOAT, device=device))
        self.root = nn.Parameter(torch.empty(in_channels * out_channels * FLOAT, device=device))
        self.bias = nn.Parameter(torch.empty(out_channels * FLOAT, device=device))

    def forward(self, x, edge_index, edge_type):
        num_edges = edge_index.nbytes // (2 * INDEX)
        num_nodes = x.nbytes // (self.in_channels * FLOAT)
        return self.propagate(edge_index, x=x, edge_type=edge_type, num_edges=num_edges, num_nodes=num_nodes)

    def propagate(self, edge_index, x, edge_type, num_edges, num_nodes):
        x_j = torch.empty(num_edges * self.in_channels * FLOAT, device=device)      # x.index_select(0, edge_index[0])
        x_j._saved = (x, edge_index)
        msg = self.message(x_j, edge_type, num_edges)
        aggr = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)    # scatter mean over (dst, relation)
        aggr._saved = (msg, edge_index)
        out = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)     # + x @ root + bias
        out._saved = (aggr, x)
        return out

    def message(self, x_j, edge_type, num_edges):
        bi, bo = self.in_channels // self.num_blocks, self.out_channels // self.num_blocks
        weight = torch.empty(num_edges * self.num_blocks * bi * bo * FLOAT, device=device)   # self.weight[edge_type]
        weight._saved = edge_type
        out = torch.empty(num_edges * self.out_channels * FLOAT, device=device)            # torch.bmm(x_j, weight)
        out._saved = (x_j, weight)
        return out


class RGCNEncoder(nn.Module):
    def __init__(self, num_nodes, hidden_channels, num_relations):
        nn.Module.__init__(self)
        self.node_emb = nn.Parameter(torch.empty(num_nodes * hidden_channels * FLOAT, device=device))
        self.conv1 = FastRGCNConv(hidden_channels, hidden_channels, num_relations, num_blocks=5)
        self.conv2 = FastRGCNConv(hidden_channels, hidden_channels, num_relations, num_blocks=5)

    def forward(self, edge_index, edge_type):
        x = self.node_emb
        x = self.conv1(x, edge_index, edge_type)
        x = self.conv2(x, edge_index, edge_type)
        return x


class DistMultDecoder(nn.Module):
    def __init__(self, num_relations, hidden_channels):
        nn.Module.__init__(self)
        self.rel_emb = nn.Parameter(torch.empty(num_relations * hidden_channels * FLOAT, device=device))

    def forward(self, z, edge_index, edge_type):
        num_edges = edge_index.nbytes // (2 * INDEX)
        out = torch.empty(num_edges * FLOAT, device=device)
        out._saved = z
        return out


class GAE(nn.Module):
    def __init__(self, encoder, decoder):
        nn.Module.__init__(self)
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, *args):
        return self.encoder(*args)

    def decode(self, *args):
        return self.decoder(*args)


class RelLinkPredData(object):
    """RelLinkPredDataset("FB15k-237")[0].to(device): the training graph with inverse edges."""
    num_nodes = 14_541
    num_relations = 474            # 237 relations and their inverses
    num_train_triples = 272_115

    def __init__(self):
        n_edges = 2 * self.num_train_triples
        self.edge_index = torch.empty(2 * n_edges * INDEX, device=device)
        self.edge_type = torch.empty(n_edges * INDEX, device=device)
        self.train_edge_index = torch.empty(2 * self.num_train_triples * INDEX, device=device)
        self.train_edge_type = torch.empty(self.num_train_triples * INDEX, device=device)


def negative_sampling(edge_index, num_nodes):
    """The example's corruption of heads or tails: as many negatives as positives."""
    return torch.empty(edge_index.nbytes, device=device)


def train(model, optimizer, data):
    model.train()
    optimizer.zero_grad()
    z = model.encode(data.edge_index, data.edge_type)
    pos_out = model.decode(z, data.train_edge_index, data.train_edge_type)
    neg_edge_index = negative_sampling(data.train_edge_index, data.num_nodes)
    neg_out = model.decode(z, neg_edge_index, data.train_edge_type)
    loss = torch.nn.functional.nll_loss(pos_out, neg_out)   # BCE over pos/neg scores + 0.01 * regularizer
    loss.backward()
    optimizer.step()


def main():
    data = RelLinkPredData()
    model = GAE(RGCNEncoder(data.num_nodes, hidden_channels=500, num_relations=data.num_relations),
                DistMultDecoder(data.num_relations // 2, hidden_channels=500))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    for epoch in range(1, 10001):
        train(model, optimizer, data)
        if epoch % 500 == 0:
            print("epoch %05d" % epoch, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
