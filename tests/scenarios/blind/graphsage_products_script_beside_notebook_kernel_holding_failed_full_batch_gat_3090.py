"""GraphSAGE NeighborLoader training on ogbn-products, started beside a Jupyter kernel that still
holds 16.3 GiB, on an RTX 3090.

The real story: a student's workstation with one RTX 3090.  In the afternoon they explored
ogbn-products in JupyterLab: data = dataset[0].to("cuda") (features 2.45M x 100, 123.7M directed
edges), then a full-batch GATConv(100, 64, heads=4) cell, which died with CUDA out of memory.
Jupyter keeps the failed cell's exception (sys.last_traceback and the cell's outputs), so the
kernel, a `python -m ipykernel_launcher` process, still holds the graph, the GAT's projections and
attention coefficients and its CUDA context: 16.3 GiB in nvidia-smi.  The tab was closed; the
kernel was not shut down.  In the evening they run the mini-batch script they had used the week
before, unchanged, from a terminal:

    train_loader = NeighborLoader(data, num_neighbors=[15, 10, 5], batch_size=1024, shuffle=True,
                                  input_nodes=split_idx["train"], num_workers=6)
    model = SAGE(dataset.num_features, 256, dataset.num_classes, num_layers=3).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    for batch in train_loader:
        batch = batch.to(device)
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        loss = F.cross_entropy(out, batch.y[:batch.batch_size])
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Last week it peaked at 11.8 GiB (12.6 GB) on the same card.  Tonight it dies in the forward pass of its very
first batch.

Sizes of one batch: 1,024 seed products, fan-out 15/10/5: 936,960 sampled edges over ~718,000
unique nodes (PyG's NeighborLoader runs every layer on the whole sampled subgraph).  Features
718k x 100 x 4 B = 287 MB.  Layer 1 keeps the gathered x_j (375 MB), the mean aggregate (287 MB),
lin_l, lin_r, their sum, ReLU and dropout outputs (5 x 718k x 256 x 4 B = 3.7 GB) and a dropout
mask: 4.3 GB.  Layer 2 starts with x_j of 937k x 256 x 4 B = 960 MB, the aggregate and lin_l
(735 MB each)...  With the notebook's 16.3 GiB and this process's 0.5 GiB context, 7.2 GiB are
free; layer 2's lin_r output (701 MiB) fails with 6.8 GiB allocated and 0.4 GiB free.  On an empty
3090 the same step peaks at 11.8 GiB allocated with its backward.

What an expert says first: another process holds two thirds of the card: nvidia-smi lists the
kernel's PID; shut the kernel down (or restart it) and rerun the script unchanged.  Wrong advice: a
smaller batch, fewer neighbours, autocast or checkpointing (they would let it squeeze into what the
notebook left, but the script is fine), empty_cache / expandable_segments (this process caches
nothing: it is in its first forward pass), a bigger GPU.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda"
FLOAT = 4
INDEX = 8
NUM_FEATURES = 100
NUM_CLASSES = 47
HIDDEN = 256
NUM_TRAIN = 196_615
BATCH_SIZE = 1024
FANOUT = [15, 10, 5]
UNIQUE_NODES_PER_BATCH = 718_000    # after de-duplication on ogbn-products


class ModuleList(nn.Module):
    """torch.nn.ModuleList: the layers kept under "0".."n-1"."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class SAGEConv(nn.Module):
    """torch_geometric.nn.SAGEConv(in, out): lin_l(mean_j x_j) + lin_r(x)."""

    def __init__(self, in_channels, out_channels):
        nn.Module.__init__(self)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin_l = nn.Parameter(torch.empty(in_channels * out_channels * FLOAT, device=device))
        self.lin_l_bias = nn.Parameter(torch.empty(out_channels * FLOAT, device=device))
        self.lin_r = nn.Parameter(torch.empty(in_channels * out_channels * FLOAT, device=device))

    def forward(self, x, edge_index):
        num_nodes = x.nbytes // (self.in_channels * FLOAT)
        num_edges = edge_index.nbytes // (2 * INDEX)
        # what autograd keeps for backward, one chain per layer (x and edge_index stay with the batch)
        x_j = torch.empty(num_edges * self.in_channels * FLOAT, device=device)       # x.index_select(0, edge_index[0])
        x_j._saved = x
        aggr = torch.empty(num_nodes * self.in_channels * FLOAT, device=device)      # scatter mean to edge_index[1]
        aggr._saved = x_j
        out_l = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)    # self.lin_l(aggr)
        out_l._saved = aggr
        out_r = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)    # self.lin_r(x)
        out_r._saved = out_l
        out = torch.empty(num_nodes * self.out_channels * FLOAT, device=device)      # out_l + out_r
        out._saved = out_r
        return out


class SAGE(nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.5):
        nn.Module.__init__(self)
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = ModuleList([SAGEConv(dims[i], dims[i + 1]) for i in range(num_layers)])
        self.dropout = dropout

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                h = torch.empty(x.nbytes, device=device)                 # x.relu()
                h._saved = x
                mask = torch.empty(x.nbytes // FLOAT, device=device)     # F.dropout(p=0.5) mask
                mask._saved = h
                x = torch.empty(x.nbytes, device=device)                 # F.dropout(h, training=True)
                x._saved = mask
        return x


class SampledBatch(object):
    """One NeighborLoader mini-batch (sampled on the CPU workers), before .to(device)."""

    def __init__(self, batch_size, num_nodes, num_edges):
        self.batch_size = batch_size
        self.num_nodes = num_nodes
        self.num_edges = num_edges

    def to(self, dev):
        self.x = torch.empty(self.num_nodes * NUM_FEATURES * FLOAT, device=dev)
        self.edge_index = torch.empty(2 * self.num_edges * INDEX, device=dev)
        self.y = torch.empty(self.num_nodes * INDEX, device=dev)
        self.n_id = torch.empty(self.num_nodes * INDEX, device=dev)
        return self


def neighbor_loader(num_train, batch_size, fanout):
    frontier, edges = batch_size, 0
    for k in fanout:
        edges += frontier * k
        frontier *= k
    for _ in range((num_train + batch_size - 1) // batch_size):
        yield SampledBatch(batch_size, UNIQUE_NODES_PER_BATCH, edges)


def train(model, optimizer, epoch):
    model.train()
    for step, batch in enumerate(neighbor_loader(NUM_TRAIN, BATCH_SIZE, FANOUT)):
        batch = batch.to(device)
        optimizer.zero_grad()
        out = model(batch.x, batch.edge_index)
        loss = F.cross_entropy(out, batch.y)          # out[:batch.batch_size], batch.y[:batch.batch_size]
        scen_truth.backward(loss)
        optimizer.step()
        if step % 50 == 0:
            print("epoch %d step %d" % (epoch, step), flush=True)


def main():
    model = SAGE(NUM_FEATURES, HIDDEN, NUM_CLASSES, num_layers=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.0)
    for epoch in range(1, 21):
        train(model, optimizer, epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
