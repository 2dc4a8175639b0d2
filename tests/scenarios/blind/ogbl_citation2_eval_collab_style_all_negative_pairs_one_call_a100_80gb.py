"""main.py -- a lab's link-prediction codebase (GraphSAGE encoder + OGB's 3-layer MLP LinkPredictor on the
Hadamard product h_i * h_j), grown on ogbl-collab, where the whole evaluation is one vectorised call per
split (collab's test split: 46,329 positive edges and 100,000 global negative edges):

    @torch.no_grad()
    def test(model, predictor, data, split_edge, evaluator):
        h = model(data.x, data.adj_t)
        pos = split_edge["test"]["edge"].to(h.device).t()
        neg = split_edge["test"]["edge_neg"].to(h.device).t()
        pos_pred = predictor(h[pos[0]], h[pos[1]]).squeeze()
        neg_pred = predictor(h[neg[0]], h[neg[1]]).squeeze()
        ...

A student ports it to ogbl-citation2 (2,927,963 papers, 30.6M citations) for the paper's second table and
adapts only the split format: citation2 evaluates every test source node against its 1 true target and
1,000 sampled negative targets (MRR), 86,596 source nodes per split:

        source = split_edge["test"]["source_node"].to(h.device)
        target = split_edge["test"]["target_node"].to(h.device)
        target_neg = split_edge["test"]["target_node_neg"].to(h.device)          # [86596, 1000]
        pos_pred = predictor(h[source], h[target]).squeeze()
        source_rep = source.view(-1, 1).repeat(1, 1000).view(-1)                  # 86,596,000 pairs
        neg_pred = predictor(h[source_rep], h[target_neg.view(-1)]).view(-1, 1000)

Training runs on the lab's A100 80GB (full-graph propagation per step, 64k-edge batches, ~29 GiB peak).  After
the first epoch the evaluation gathers h[source_rep]: 86,596,000 rows of 256 float32 = 82.6 GiB in one
request, more than the whole card, and the run dies with the epoch's training lost.  (h[target_neg] would be
as big again, and the product and the MLP's hidden layer two more of that size.)

An expert: the evaluation of 86.6 million candidate pairs has to be chunked -- exactly what OGB's own
citation2 example does: `for perm in DataLoader(range(source.size(0)), batch_size)` over the flattened pairs
(or over source nodes, 1,000 candidates each), predictor on each chunk, .cpu() or keep the small scores, cat
the scores.  A chunk of 64k pairs is 64 MB per gathered tensor; the scores of all 86.6M pairs are 346 MB.
Wrong first advice: a smaller (training) batch with accumulation (training fitted; the eval has no batch),
inference_mode (test is already under no_grad; one request is 82.6 GiB), mixed precision (41 GiB per gather,
two gathers and the MLP's intermediates still do not fit), a bigger GPU or multi-GPU (no single card takes it;
chunking costs nothing), expandable_segments / empty_cache (the request alone exceeds the card), fewer
negatives per source (changes the official MRR protocol: results no longer comparable), quantization, CPU
offload, gradient checkpointing.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: int64, Tensor.to/view/repeat/squeeze, advanced indexing h[idx] (a gather), the sparse
# matmul of torch_sparse (C functions in PyTorch, no Python frame of their own).  Compiled as part of
# torch's file so that the failing line stays the program's own.
_GAPS = '''
def _getitem(self, idx):
    # h[index_tensor] (advanced indexing): a new tensor of len(index) rows of h's width
    if isinstance(idx, torch.Tensor) and getattr(idx, "_rows", None) is not None:
        out = torch.empty(idx._rows * self._width, dtype=self.dtype, device=self.device)
        out._rows, out._width = idx._rows, self._width
        return out
    return self.view()

def repeat(self, *sizes):
    n = 1
    for s in sizes:
        n *= int(s)
    out = torch.empty(self._rows * n, dtype=self.dtype, device=self.device)
    out._rows, out._width = self._rows * n, 1
    return out

def view(self, *shape):
    v = _plain_view(self)
    v._rows, v._width = getattr(self, "_rows", None), getattr(self, "_width", None)
    if shape and shape[0] == -1 and v._rows is not None and v._width is not None and len(shape) == 1:
        v._rows, v._width = v._rows * v._width, 1
    return v

def squeeze(self, dim=None):
    return view(self)

def _no_grad_call(self, func):
    def decorate_context(*args, **kwargs):
        with type(self)():
            return func(*args, **kwargs)
    return decorate_context
'''
_ns = {"torch": torch, "_plain_view": torch.Tensor.view}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.__getitem__ = _ns["_getitem"]
torch.Tensor.repeat = _ns["repeat"]
torch.Tensor.view = _ns["view"]
torch.Tensor.squeeze = _ns["squeeze"]
if "__call__" not in vars(torch.no_grad):
    torch.no_grad.__call__ = _ns["_no_grad_call"]
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
# ----

device = "cuda:0"
NUM_NODES = 2_927_963
NUM_EDGES_SYM = 2 * 30_387_995          # adj_t.to_symmetric()
NUM_FEATURES = 128
HIDDEN = 256
NUM_TEST_SOURCES = 86_596
NUM_NEG_PER_SOURCE = 1000


def rows(n, width, dtype):
    t = torch.empty(n * width, dtype=dtype, device=device)
    t._rows, t._width = n, width
    return t


class SparseTensor(object):
    """torch_sparse.SparseTensor adj_t (CSR: rowptr, col), on the GPU."""

    def __init__(self, n, nnz):
        self.rowptr = rows(n + 1, 1, torch.int64)
        self.col = rows(nnz, 1, torch.int64)

    def matmul(self, x, width):
        # adj_t.matmul(x, reduce="mean"): a new [N, width] tensor
        return rows(NUM_NODES, width, torch.float32)


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = torch.nn.Parameter(torch.empty(i * o + o, dtype=torch.float32, device=device))

    def forward(self, x):
        return rows(x._rows, self.out_features, torch.float32)


class SAGEConv(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.in_channels = i
        self.lin_l = Linear(i, o)
        self.lin_r = Linear(i, o)

    def forward(self, x, adj_t):
        aggr = adj_t.matmul(x, self.in_channels)
        out = self.lin_l(aggr)
        out_r = self.lin_r(x)
        out = rows(NUM_NODES, self.lin_l.out_features, torch.float32)     # out + out_r
        if torch.is_grad_enabled():
            out._saved = [aggr, out_r]                                     # saved for backward
        return out


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.0):
        torch.nn.Module.__init__(self)
        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.num_layers = num_layers
        for i in range(num_layers):
            setattr(self, "conv%d" % i, SAGEConv(dims[i], dims[i + 1]))

    def forward(self, x, adj_t):
        saved = []
        for i in range(self.num_layers):
            x = getattr(self, "conv%d" % i)(x, adj_t)
            if torch.is_grad_enabled():
                saved.append(x)
        if saved:
            x = rows(NUM_NODES, x._width, torch.float32)      # the last layer's output, kept by autograd
            x._saved = saved
        return x


class LinkPredictor(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, dropout=0.0):
        torch.nn.Module.__init__(self)
        self.lin0 = Linear(in_channels, hidden_channels)
        self.lin1 = Linear(hidden_channels, hidden_channels)
        self.lin2 = Linear(hidden_channels, out_channels)

    def forward(self, x_i, x_j):
        x = rows(x_i._rows, x_i._width, torch.float32)                    # x_i * x_j
        x = self.lin0(x)
        x = self.lin1(x)
        return self.lin2(x)


class Data(object):
    def __init__(self):
        self.x = rows(NUM_NODES, NUM_FEATURES, torch.float32)
        self.adj_t = SparseTensor(NUM_NODES, NUM_EDGES_SYM)


def split_to_device(n, width=1):
    """split_edge["test"][...].to(device): int64 node ids"""
    return rows(n, width, torch.int64)


def backward(loss):
    """loss.backward() (retain_graph=False): afterwards autograd frees what the graph saved."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(saved if isinstance(saved, (list, tuple)) else [saved])


def train(model, predictor, data, optimizer, steps):
    model.train()
    predictor.train()
    for _ in range(steps):                       # stands for the epoch's 475 steps of 64k edges
        h = model(data.x, data.adj_t)
        src, dst = split_to_device(65536), split_to_device(65536)
        pos_out = predictor(h[src], h[dst])
        dst_neg = split_to_device(65536)
        neg_out = predictor(h[src], h[dst_neg])
        loss = torch.nn.functional.nll_loss(pos_out, None)
        loss._saved = [pos_out, neg_out]
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del h, pos_out, neg_out, loss, src, dst, dst_neg


@torch.no_grad()
def test(model, predictor, data):
    model.eval()
    predictor.eval()
    h = model(data.x, data.adj_t)
    source = split_to_device(NUM_TEST_SOURCES)
    target = split_to_device(NUM_TEST_SOURCES)
    target_neg = split_to_device(NUM_TEST_SOURCES, NUM_NEG_PER_SOURCE)    # [86596, 1000]
    pos_pred = predictor(h[source], h[target]).squeeze()
    source_rep = source.view(-1, 1).repeat(1, 1000).view(-1)              # 86,596,000 pairs
    neg_pred = predictor(h[source_rep], h[target_neg.view(-1)]).view(-1, 1000)
    return pos_pred, neg_pred


def main():
    data = Data()
    model = SAGE(NUM_FEATURES, HIDDEN, HIDDEN, num_layers=3)
    predictor = LinkPredictor(HIDDEN, HIDDEN, 1, num_layers=3)
    params = list(model.parameters()) + list(predictor.parameters())
    optimizer = torch.optim.AdamW(params, lr=0.0005)
    for epoch in range(1, 51):
        train(model, predictor, data, optimizer, steps=3)
        print("Epoch %02d trained; evaluating on %d test sources x (1 + %d) candidates"
              % (epoch, NUM_TEST_SOURCES, NUM_NEG_PER_SOURCE))
        test(model, predictor, data)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
