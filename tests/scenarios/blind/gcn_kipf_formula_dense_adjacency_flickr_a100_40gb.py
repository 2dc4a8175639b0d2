"""gcn_scratch.py -- a course project: a two-layer GCN written from Kipf & Welling's formula in plain PyTorch
(no PyG layers; PyG only loads the datasets), run on the department's A100 40GB.  The propagation matrix is
built exactly as in the paper, A_hat = D~^-1/2 (A + I) D~^-1/2, as a dense N x N tensor:

    def normalized_adjacency(edge_index, num_nodes, device):
        A = torch.zeros(num_nodes, num_nodes, device=device)
        A[edge_index[0], edge_index[1]] = 1.0
        A = A + torch.eye(num_nodes, device=device)          # self-loops
        deg = A.sum(dim=1)
        D_inv_sqrt = torch.diag(deg.pow(-0.5))
        return D_inv_sqrt @ A @ D_inv_sqrt

    class GCN(torch.nn.Module):
        def forward(self, x, A_hat):
            h = torch.relu(A_hat @ (x @ self.W1))
            return A_hat @ (F.dropout(h, 0.5, self.training) @ self.W2)

The report's table had Cora (2,708 nodes: a 28 MiB matrix), CiteSeer (3,327) and PubMed (19,717 nodes:
1.45 GiB) -- all fine, a few seconds each.  For the "larger graph" row the student adds Flickr (GraphSAINT's
dataset in torch_geometric.datasets.Flickr: 89,250 nodes, 899,756 edges, 500 features, 7 classes) with the
same script.  torch.zeros(89250, 89250) is 29.67 GiB and goes through on the 40 GB card; the self-loop line
then asks for torch.eye(89250), another 29.67 GiB, with 9.6 GiB free, and the run dies before the first
epoch.  (D~^-1/2 A D~^-1/2 as two dense matmuls with torch.diag would need two more N x N matrices.)

An expert: the adjacency has 899,756 + 89,250 non-zeros out of 7.97 billion entries (0.012%): keep it
sparse -- torch.sparse_coo_tensor / torch_sparse.SparseTensor with the same normalisation (PyG's gcn_norm,
or GCNConv itself), and torch.sparse.mm for A_hat @ XW.  The propagation matrix is then ~12 MB and Flickr
trains full-batch in well under a GiB; the dense matmul also costs O(N^2 h) FLOPs per layer for nothing.
(Partitioning the graph -- ClusterGCN / GraphSAINT subgraphs, dense per part -- would also run, but changes
the training for a graph that fits whole.)
Wrong first advice: mixed precision / bf16 (a 14.8 GiB dense matrix plus A + I plus the diag products
still does not fit, and fails on Reddit or ogbn-arxiv at once), a bigger GPU (an 80 GB card fits A and
A + I but not the normalisation's dense products; arxiv's matrix alone is 107 GiB), expandable_segments /
empty_cache (nothing is cached or fragmented: one 29.67 GiB request against 9.6 GiB free), a smaller batch
or gradient checkpointing (full-batch, no batch; this is before the first forward), splitting the op into
chunks (the chunks of a dense matrix add up to the same 30 GiB), quantization or CPU offload of a model of
130 thousand parameters.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.zeros / torch.eye / int64 and Tensor indexing (C functions in PyTorch, no Python
# frame of their own).  Compiled as part of torch's file so that the failing line stays the program's own.
_GAPS = '''
def _numel(size):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return n

def zeros(*size, dtype=None, device=None, requires_grad=False):
    return torch.empty(_numel(size), dtype=dtype or torch.get_default_dtype(), device=device)

def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    return torch.empty(int(n) * int(n if m is None else m), dtype=dtype or torch.get_default_dtype(),
                       device=device)

def _getitem(self, idx):
    # basic indexing (t[0], t[:k]) returns a view sharing the storage, as in PyTorch
    return self.view()

def _setitem(self, idx, value):
    # index_put_ in place: no new memory
    return None
'''
if not hasattr(torch, "eye"):
    _ns = {"torch": torch}
    exec(compile(_GAPS, torch.__file__, "exec"), _ns)
    torch.zeros, torch.eye = _ns["zeros"], _ns["eye"]
    torch.Tensor.__getitem__ = _ns["_getitem"]
    torch.Tensor.__setitem__ = _ns["_setitem"]
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
# ----

DATASETS = {  # torch_geometric.datasets: (num_nodes, num_edges, num_features, num_classes)
    "Cora": (2708, 10556, 1433, 7),
    "CiteSeer": (3327, 9104, 3703, 6),
    "PubMed": (19717, 88648, 500, 3),
    "Flickr": (89250, 899756, 500, 7),
}


class Data(object):
    """torch_geometric.data.Data as the dataset returns it (on the CPU until .to(device))."""

    def __init__(self, name):
        self.num_nodes, self.num_edges, self.num_features, self.num_classes = DATASETS[name]

    def to(self, device):
        self.x = torch.empty(self.num_nodes * self.num_features, dtype=torch.float32, device=device)
        self.edge_index = torch.empty(2 * self.num_edges, dtype=torch.int64, device=device)
        self.y = torch.empty(self.num_nodes, dtype=torch.int64, device=device)
        for m in ("train_mask", "val_mask", "test_mask"):
            setattr(self, m, torch.empty(self.num_nodes, dtype=torch.uint8, device=device))
        return self


def normalized_adjacency(edge_index, num_nodes, device):
    A = torch.zeros(num_nodes, num_nodes, device=device)
    A[edge_index[0], edge_index[1]] = 1.0
    A = A + torch.eye(num_nodes, device=device)          # self-loops
    deg = A.sum(dim=1)
    D_inv_sqrt = torch.diag(deg.pow(-0.5))
    return D_inv_sqrt @ A @ D_inv_sqrt


class GCN(torch.nn.Module):
    def __init__(self, in_dim, hidden, out_dim):
        torch.nn.Module.__init__(self)
        self.W1 = torch.nn.Parameter(torch.empty(in_dim * hidden, dtype=torch.float32, device="cuda"))
        self.W2 = torch.nn.Parameter(torch.empty(hidden * out_dim, dtype=torch.float32, device="cuda"))


def run(name, device="cuda"):
    data = Data(name).to(device)
    print("%s: %d nodes, %d edges, %d features" % (name, data.num_nodes, data.num_edges, data.num_features))
    model = GCN(data.num_features, 256, data.num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=5e-4)
    A_hat = normalized_adjacency(data.edge_index, data.num_nodes, device)
    # for epoch in range(200): out = model(data.x, A_hat); loss = F.cross_entropy(out[train_mask], ...); ...
    return A_hat


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "Flickr"
    run(name)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
