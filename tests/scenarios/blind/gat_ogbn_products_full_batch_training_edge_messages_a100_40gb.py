"""Full-batch GAT on ogbn-products: the per-edge message tensor of the first layer does not fit (A100 40GB).

The real program (train_gat_products.py), as its author wrote it with PyG 2.5 and OGB:

    dataset = PygNodePropPredDataset("ogbn-products", root="/data/ogb")
    data = dataset[0]                         # 2,449,029 nodes, 123,718,280 directed edges, 100 features
    split_idx = dataset.get_idx_split()
    data = data.to(device)                    # the whole graph on the GPU
    model = GAT(100, 64, 47, heads=4, num_layers=3, dropout=0.5).to(device)   # GATConv layers, concat heads
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for epoch in range(1, 501):
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)  # every node, every edge, every step
        loss = F.cross_entropy(out[train_idx], data.y[train_idx].squeeze(1))
        loss.backward()
        optimizer.step()

The author had trained exactly this script full-batch on ogbn-arxiv (169k nodes, 1.2M edges) on the same
A100 40GB, and swapped the dataset name, dropping the NeighborLoader the PyG products example uses because
"full-batch is simpler and the A100 has 40 GB".  GATConv (PyG) computes, per layer:
  x_proj = lin(x)                         N x H x C        2,449,029 x 4 x 64 x 4 B  = 2.51 GB
  alpha_src, alpha_dst                    N x H                                       = 39 MB each
  add_self_loops(edge_index)              2 x E' int64     E' = 123,718,280 + 2,449,029 = 126,167,309 -> 2.02 GB
  alpha_j, alpha_i, alpha, leaky_relu,
  softmax, dropout (+ bool mask)          E' x H fp32      2.02 GB each (0.5 GB for the mask)
  x_j = x_proj.index_select(0, src)       E' x H x C fp32  126,167,309 x 256 x 4 B  = 129.2 GB (120.3 GiB)
The graph itself is ~3 GB on the card (x 0.98 GB, edge_index 1.98 GB, labels), the model is 0.4 MB.  The first
forward holds ~15 GiB (graph, x_proj, the self-looped index and the per-edge attention tensors autograd keeps)
and then asks for 120.3 GiB at once ("Tried to allocate 123210.26 MiB" on a 40 GiB card): three times the
whole card, in the first of three layers.

What an expert says: this is not a cache or a setting problem, and not a model-size problem (0.4 MB of
weights): full-batch attention message passing materialises E x heads x channels, and ogbn-products has 126M
edges.  Train on sampled subgraphs (NeighborLoader with fanouts like [15, 10, 5], or ClusterGCN / GraphSAINT),
i.e. shrink what one step processes; full-graph inference layer-wise under no_grad afterwards.
Wrong advice: empty_cache / expandable_segments (the request is 3x the card), mixed precision (64 GB is still
more than 40), gradient checkpointing (the single gather in one layer's forward is the problem), a bigger GPU
(no 130+ GB card), flash attention (GAT's edge softmax is no SDPA), quantisation/ZeRO (0.4 MB of weights).
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn
import torch.nn.functional as F

device = "cuda"

NUM_NODES = 2_449_029
NUM_EDGES = 123_718_280            # directed (ogbn-products' 61,859,140 undirected edges, both ways)
NUM_FEATURES = 100
NUM_CLASSES = 47
NUM_TRAIN = 196_615

HIDDEN = 64
HEADS = 4
NUM_LAYERS = 3
DROPOUT = 0.5
LR = 5e-3
EPOCHS = 500


# --- what torch / torch_scatter give the real program (the stand-in torch has no tensor math) -------------
def long_tensor(numel):
    """an int64 tensor of numel elements on the GPU"""
    return torch.empty(numel * 8, device=device)


def float_tensor(numel):
    return torch.empty(numel, dtype=torch.float32, device=device)


def _keep_for_backward(out, *saved):
    if torch.is_grad_enabled():
        out._saved = saved if len(saved) > 1 else saved[0]
    return out


def backward(loss):
    """loss.backward(), then what autograd does with the graph afterwards (retain_graph=False): the tensors
    saved for backward are freed; outputs stay as long as the program references them."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(s for s in (saved if isinstance(saved, (tuple, list)) else (saved,)) if s is not None)


def index_select(src, num_index, row_elems):
    """src.index_select(0, index): num_index rows of row_elems floats"""
    return _keep_for_backward(float_tensor(num_index * row_elems), src)


def elementwise(a, b=None):
    return float_tensor(a.nbytes // 4)


def leaky_relu(x, negative_slope=0.2):
    return _keep_for_backward(float_tensor(x.nbytes // 4), x)


def edge_softmax(alpha, index, num_nodes, heads):
    """torch_geometric.utils.softmax: segment max, exp, segment sum, divide (the graph keeps the input's
    producers alive: leaky_relu saved its input)"""
    seg_max = float_tensor(num_nodes * heads)
    out = float_tensor(alpha.nbytes // 4)
    del seg_max
    return _keep_for_backward(out, alpha)


def dropout(x, p, training):
    if not training:
        return x
    mask = torch.empty(x.nbytes // 4, dtype=torch.uint8, device=device)
    return _keep_for_backward(float_tensor(x.nbytes // 4), mask, x)


def scatter_add(src, num_nodes, row_elems):
    return float_tensor(num_nodes * row_elems)


# --- the data --------------------------------------------------------------------------------------------
class Data(object):
    """torch_geometric.data.Data as the program uses it"""

    def __init__(self, num_nodes, num_edges, num_features):
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.num_features = num_features
        self.x = self.edge_index = self.y = None

    def to(self, dev):
        self.x = torch.empty(self.num_nodes * self.num_features, dtype=torch.float32, device=dev)
        self.edge_index = long_tensor(2 * self.num_edges)
        self.y = long_tensor(self.num_nodes)
        return self


def load_products(root):
    # PygNodePropPredDataset("ogbn-products", root=root)[0] and get_idx_split(): read from disk to host memory
    data = Data(NUM_NODES, NUM_EDGES, NUM_FEATURES)
    return data, {"train": NUM_TRAIN}


# --- the model --------------------------------------------------------------------------------------------
class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(float_tensor(in_features * out_features))
        self.bias = nn.Parameter(float_tensor(out_features)) if bias else None

    def forward(self, x):
        rows = x.nbytes // 4 // self.in_features
        return _keep_for_backward(float_tensor(rows * self.out_features), x)


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class GATConv(nn.Module):
    """torch_geometric.nn.GATConv(in_channels, out_channels, heads, concat, dropout), add_self_loops=True"""

    def __init__(self, in_channels, out_channels, heads=1, concat=True, dropout=0.0):
        nn.Module.__init__(self)
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, concat
        self.dropout = dropout
        self.lin = Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(float_tensor(heads * out_channels))
        self.att_dst = nn.Parameter(float_tensor(heads * out_channels))
        self.bias = nn.Parameter(float_tensor(heads * out_channels if concat else out_channels))

    def forward(self, x, edge_index, num_nodes):
        H, C = self.heads, self.out_channels
        x_proj = self.lin(x)                                            # N x H x C
        alpha_src = _keep_for_backward(float_tensor(num_nodes * H), x_proj)   # (x_proj * att_src).sum(-1)
        alpha_dst = _keep_for_backward(float_tensor(num_nodes * H), x_proj)
        # add_self_loops(remove_self_loops(edge_index)): a new 2 x E' index
        num_edges = edge_index.nbytes // 16 + num_nodes
        edge_index = long_tensor(2 * num_edges)
        alpha = elementwise(index_select(alpha_src, num_edges, H), index_select(alpha_dst, num_edges, H))
        alpha = leaky_relu(alpha, 0.2)
        alpha = edge_softmax(alpha, edge_index, num_nodes, H)
        alpha = dropout(alpha, self.dropout, self.training)
        x_j = index_select(x_proj, num_edges, H * C)                    # E' x H x C: the message of every edge
        msg = _keep_for_backward(elementwise(x_j), x_j, alpha)
        out = scatter_add(msg, num_nodes, H * C)
        if not self.concat:
            out = float_tensor(num_nodes * C)
        return out


class GAT(nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, heads, num_layers, dropout):
        nn.Module.__init__(self)
        self.dropout = dropout
        convs = [GATConv(in_channels, hidden_channels, heads, dropout=dropout)]
        for _ in range(num_layers - 2):
            convs.append(GATConv(heads * hidden_channels, hidden_channels, heads, dropout=dropout))
        convs.append(GATConv(heads * hidden_channels, out_channels, heads, concat=False, dropout=dropout))
        self.convs = ModuleList(convs)

    def forward(self, x, edge_index, num_nodes):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, num_nodes)
            if i < len(self.convs) - 1:
                x = dropout(_keep_for_backward(elementwise(x), x), self.dropout, self.training)   # elu, dropout
        return x


def train(model, data, train_idx, optimizer):
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index, data.num_nodes)
    loss = F.cross_entropy(out, data.y)
    backward(loss)
    optimizer.step()
    return 0.0


def main():
    data, split_idx = load_products("/data/ogb")
    data = data.to(device)
    train_idx = split_idx["train"]
    model = GAT(NUM_FEATURES, HIDDEN, NUM_CLASSES, heads=HEADS, num_layers=NUM_LAYERS, dropout=DROPOUT)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for epoch in range(1, EPOCHS + 1):
        loss = train(model, data, train_idx, optimizer)
        print("epoch %03d  loss %.4f" % (epoch, loss))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
