"""diffpool_reddit.py -- a master's student ports PyTorch Geometric's DiffPool example
(examples/proteins_diff_pool.py) from PROTEINS to REDDIT-BINARY (2,000 discussion threads, users as nodes:
429 nodes on average, the largest 3,782), on a free Colab T4 (16 GB, 15 GiB usable), PyG 2.5, PyTorch 2.3.

The example keeps the dense formulation: every graph becomes a dense adjacency matrix padded to a fixed
max_nodes by T.ToDense, and it drops every graph larger than that with a pre_filter (max_nodes = 150 for
PROTEINS).  The student did not want to lose any thread, so the filter went and max_nodes became the
dataset's largest graph; the batch size is the one that was best on PROTEINS:

    max_nodes = max(g.num_nodes for g in TUDataset(path, "REDDIT-BINARY"))          # 3782
    dataset = TUDataset(path, "REDDIT-BINARY", transform=T.Compose([T.Constant(), T.ToDense(max_nodes)]))
    train_loader = DenseDataLoader(train_dataset, batch_size=50, shuffle=True)

    class Net(torch.nn.Module):
        def __init__(self):
            num_nodes = ceil(0.25 * max_nodes)                                        # 946 clusters
            self.gnn1_pool = GNN(dataset.num_features, 64, num_nodes)
            self.gnn1_embed = GNN(dataset.num_features, 64, 64, lin=False)
            ...
        def forward(self, x, adj, mask=None):
            s = self.gnn1_pool(x, adj, mask)
            x = self.gnn1_embed(x, adj, mask)
            x, adj, l1, e1 = dense_diff_pool(x, adj, s, mask)
            ...

So EVERY graph of every batch is a 3,782 x 3,782 float32 matrix, and every per-node tensor has 3,782
rows: a batch's adjacency alone is 50 x 3782^2 x 4 B = 2.66 GiB, although the average thread would need
(429/3782)^2 = 1.3% of that.  The assignment matrix s is 50 x 3782 x 946 (0.85 GiB, and the pooling GNN
makes a dozen tensors that size), and dense_diff_pool's link loss (adj - s s^T) makes two more
batch-sized N x N matrices.  The first forward pass of the first batch fails in dense_diff_pool, at
s @ s^T (2.66 GiB asked, 2.35 GiB free, 12.1 GiB allocated by the forward pass); nothing has been
trained yet.

An expert: the memory is the padding -- B x max_nodes^2 for the adjacency and link loss, B x max_nodes x
(0.25 max_nodes) for the assignment, all sized by the ONE largest graph of the dataset.  First: stop
padding every graph to the dataset maximum: pad each batch only to its own largest graph
(to_dense_batch / to_dense_adj per batch) and batch threads of similar size together, or cap the graph
size (put a pre_filter / subgraph back: a few dozen threads above ~1,500 nodes hold almost all the
padding), or move to sparse message passing with a sparse pooling for these graphs.  A smaller batch
(the example's 20) also fits but keeps the 77x waste.  Wrong first advice: expandable_segments or
empty_cache (nothing is cached: one live forward pass), inference_mode (this is training), quantization
or flash attention (no weights to speak of -- the model has 0.4M parameters -- and no attention),
release_references, a bigger GPU.
"""
import math
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
F32 = 4


# ---- the few tensor operations the model uses, sized by shape (the stand-in torch computes nothing) ----
def _new(shape, *inputs):
    out = torch.empty(math.prod(shape) * F32, device="cuda")
    out.shape = tuple(shape)
    out._saved = inputs
    return torch._derive(out, *inputs)


def matmul(a, b):
    return _new(a.shape[:-1] + b.shape[-1:], a, b)


def transpose(a):                     # a view: no memory
    v = a.view()
    v.shape = a.shape[:-2] + (a.shape[-1], a.shape[-2])
    return v


def pointwise(a, *others):            # relu, softmax, a * mask, a - b, log, ...
    return _new(a.shape, a, *others)


def cat(ts):
    return _new(ts[0].shape[:-1] + (sum(t.shape[-1] for t in ts),), *ts)


def scalar(*inputs):
    return _new((1,), *inputs)


# ---- torch_geometric.nn.dense, as the example uses it ----
class Linear(nn.Module):
    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.c_out = c_out
        self.weight = nn.Parameter(torch.empty((c_in + 1) * c_out * F32, device="cuda"))

    def forward(self, x):
        return _new(x.shape[:-1] + (self.c_out,), x, self.weight)


class DenseSAGEConv(nn.Module):
    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.lin_rel = Linear(c_in, c_out)
        self.lin_root = Linear(c_in, c_out)

    def forward(self, x, adj, mask=None):
        out = matmul(adj, x)                                      # sum over neighbours
        out = pointwise(out, adj)                                 # / adj.sum(-1).clamp(min=1)
        out = self.lin_rel(out)
        root = self.lin_root(x)
        return pointwise(out, root)


class BatchNorm1d(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(4 * c * F32, device="cuda"))

    def forward(self, x):
        return pointwise(x, self.weight)


class GNN(nn.Module):
    def __init__(self, c_in, hidden, c_out, lin=True):
        nn.Module.__init__(self)
        self.conv1, self.bn1 = DenseSAGEConv(c_in, hidden), BatchNorm1d(hidden)
        self.conv2, self.bn2 = DenseSAGEConv(hidden, hidden), BatchNorm1d(hidden)
        self.conv3, self.bn3 = DenseSAGEConv(hidden, c_out), BatchNorm1d(c_out)
        self.lin = Linear(2 * hidden + c_out, c_out) if lin else None

    def forward(self, x0, adj, mask=None):
        x1 = self.bn1(pointwise(self.conv1(x0, adj, mask)))      # .relu()
        x2 = self.bn2(pointwise(self.conv2(x1, adj, mask)))
        x3 = self.bn3(pointwise(self.conv3(x2, adj, mask)))
        x = cat([x1, x2, x3])
        if self.lin is not None:
            x = pointwise(self.lin(x))                            # .relu()
        return x


def dense_diff_pool(x, adj, s, mask=None):
    """torch_geometric.nn.dense.diff_pool.dense_diff_pool"""
    s = pointwise(s)                                              # torch.softmax(s, dim=-1)
    if mask is not None:
        x, s = pointwise(x, mask), pointwise(s, mask)
    out = matmul(transpose(s), x)
    out_adj = matmul(matmul(transpose(s), adj), s)
    link_loss = pointwise(adj, matmul(s, transpose(s)))          # adj - s @ s^T
    link_loss = scalar(link_loss)                                 # torch.norm(link_loss, p=2) / adj.numel()
    ent_loss = scalar(pointwise(pointwise(s)))                    # (-s * torch.log(s + EPS)).sum(-1).mean()
    return out, out_adj, link_loss, ent_loss


max_nodes = 3782                  # the largest thread of REDDIT-BINARY
num_features = 1                  # T.Constant()
batch_size = 50


class Net(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        num_nodes = math.ceil(0.25 * max_nodes)
        self.gnn1_pool = GNN(num_features, 64, num_nodes)
        self.gnn1_embed = GNN(num_features, 64, 64, lin=False)
        num_nodes = math.ceil(0.25 * num_nodes)
        self.gnn2_pool = GNN(3 * 64, 64, num_nodes)
        self.gnn2_embed = GNN(3 * 64, 64, 64, lin=False)
        self.gnn3_embed = GNN(3 * 64, 64, 64, lin=False)
        self.lin1 = Linear(3 * 64, 64)
        self.lin2 = Linear(64, 2)

    def forward(self, x, adj, mask=None):
        s = self.gnn1_pool(x, adj, mask)
        x = self.gnn1_embed(x, adj, mask)
        x, adj, l1, e1 = dense_diff_pool(x, adj, s, mask)
        s = self.gnn2_pool(x, adj)
        x = self.gnn2_embed(x, adj)
        x, adj, l2, e2 = dense_diff_pool(x, adj, s)
        x = self.gnn3_embed(x, adj)
        x = self.lin2(pointwise(self.lin1(x)))
        return x, scalar(l1, l2), scalar(e1, e2)


class DenseBatch(object):
    """what DenseDataLoader yields after T.ToDense(max_nodes): x, adj, mask and y, padded to max_nodes"""

    def __init__(self, n):
        self.n = n

    def to(self, device):
        self.x = _new((batch_size, max_nodes, num_features))
        self.adj = _new((batch_size, max_nodes, max_nodes))
        self.mask = _new((batch_size, max_nodes, 1))
        self.y = _new((batch_size,))
        return self


def train_loader():
    for i in range(1600 // batch_size):
        yield DenseBatch(i)


model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

try:
    for epoch in range(1, 151):
        model.train()
        loss_all = 0.0
        for data in train_loader():
            data = data.to("cuda")
            optimizer.zero_grad()
            output, link_loss, ent_loss = model(data.x, data.adj, data.mask)
            loss = scalar(output, data.y)                            # F.nll_loss(output, data.y.view(-1))
            loss = scalar(loss, link_loss, ent_loss)
            scen_truth.backward(loss)
            optimizer.step()
            loss_all += 0.69 * batch_size
        print("Epoch %03d, loss %.4f" % (epoch, loss_all / 1600))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
