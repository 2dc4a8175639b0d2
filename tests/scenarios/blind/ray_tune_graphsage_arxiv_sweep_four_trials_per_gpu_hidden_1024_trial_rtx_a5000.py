"""One trial of a Ray Tune sweep that packs four trials on one 24 GB GPU: the hidden=1024 trial OOMs (RTX A5000).

The real program (tune_sage_arxiv.py) sweeps full-batch GraphSAGE on ogbn-arxiv with Ray Tune on a
workstation with one RTX A5000 (24 GB):

    search_space = {"hidden_channels": tune.choice([128, 256, 512, 1024]),
                    "num_layers": tune.choice([2, 3]), "dropout": tune.uniform(0.2, 0.6),
                    "lr": tune.loguniform(1e-3, 1e-2)}
    trainable = tune.with_resources(train_sage, {"cpu": 4, "gpu": 0.25})      # "4 trials per GPU"
    tuner = tune.Tuner(trainable, param_space=search_space,
                       tune_config=tune.TuneConfig(num_samples=48, metric="val_acc", mode="max",
                                                   scheduler=ASHAScheduler(max_t=500)))
    tuner.fit()

Ray runs train_sage in four trial actors at once, each its own process with its own CUDA context and caching
allocator on the same GPU.  gpu=0.25 is only a scheduling label: nothing stops a trial from using more than a
quarter of the card.  The author picked 0.25 after watching a hidden=256 trial take ~5 GB in nvidia-smi.

This program is one trial actor's process (what Ray runs in the worker): config hidden_channels=1024,
num_layers=3.  At that moment the three sibling trials (hidden 256 / 512 / 512, epochs into their runs) hold
4.7 + 6.7 + 5.2 = ~16.6 GiB of the card (the SIMGPU_OTHER_PROCS "python" processes).

Sizes (ogbn-arxiv: N = 169,343 nodes, 2,315,598 edges after to_symmetric, 128 features, 40 classes):
  graph on the GPU: x 86.7 MB, adj_t SparseTensor (rowptr + col int64) ~20 MB, y 1.4 MB; model ~10 MB
  per hidden layer, full batch, autograd on, one N x 1024 fp32 map = 693.6 MB:
    adj_t.matmul(x, reduce="mean"), lin_l(agg), lin_r(x), their sum, BatchNorm, ReLU, dropout (+ mask)
    ~ 6 maps + mask = ~4.3 GB kept for backward
  two hidden layers ~7.9 GB, backward transients ~1.5 GB: the trial peaks near 9.5 GiB (~10 GiB with its
  context).  Alone on the 24 GB card it fits with 14 GB to spare.  Here it has 24 - 16.6 - 0.5 = ~6.9 GiB, and
  its first forward fails in the second SAGE layer asking for another 694 MB.

What an expert says: this process holds ~7 GiB (6.8 allocated, and its context); the card is full of the
sweep's other trials (three python processes, ~16.6 GiB).  The trial's own need (~10 GiB) is fine for the card; the packing is wrong: run fewer
trials per GPU (resources gpu=0.5, or max_concurrent_trials=2, or size the fraction for the largest config in
the search space), or schedule big-hidden trials separately.  Wrong advice: shrinking the model that is being
swept, mixed precision/checkpointing for a job that fits the card, empty_cache (the memory is in other processes),
a bigger GPU.
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn
import torch.nn.functional as F

NUM_NODES = 169_343
NUM_EDGES = 2_315_598
NUM_FEATURES = 128
NUM_CLASSES = 40
NUM_TRAIN = 90_941

search_space = {"hidden_channels": [128, 256, 512, 1024], "num_layers": [2, 3], "dropout": (0.2, 0.6),
                "lr": (1e-3, 1e-2)}

device = "cuda"


# --- what torch / torch_sparse give the real program (the stand-in torch has no tensor math) -------------
def _keep_for_backward(out, *saved):
    if torch.is_grad_enabled():
        out._saved = saved
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


def float_tensor(numel):
    return torch.empty(numel, dtype=torch.float32, device=device)


def cols_of(x):
    return x.nbytes // 4 // NUM_NODES


class SparseTensor(object):
    """torch_sparse.SparseTensor adj_t (CSR: rowptr, col)"""

    def __init__(self, num_nodes, nnz):
        self.num_nodes, self.nnz = num_nodes, nnz
        self.rowptr = torch.empty((num_nodes + 1) * 8, device=device)
        self.col = torch.empty(nnz * 8, device=device)

    def matmul(self, x, reduce="mean"):
        out = float_tensor(self.num_nodes * cols_of(x))
        return _keep_for_backward(out, x)


class Data(object):
    pass


def load_arxiv(root):
    # PygNodePropPredDataset("ogbn-arxiv", transform=T.ToSparseTensor())[0], adj_t.to_symmetric(), .to(device)
    data = Data()
    data.x = float_tensor(NUM_NODES * NUM_FEATURES)
    data.adj_t = SparseTensor(NUM_NODES, NUM_EDGES)
    data.y = torch.empty(NUM_NODES * 8, device=device)
    return data, {"train": NUM_TRAIN}


# --- the model --------------------------------------------------------------------------------------------
class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(float_tensor(in_features * out_features))
        self.bias = nn.Parameter(float_tensor(out_features)) if bias else None

    def forward(self, x):
        return _keep_for_backward(float_tensor(NUM_NODES * self.out_features), x)


class BatchNorm1d(nn.Module):
    def __init__(self, num_features):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(float_tensor(num_features))
        self.bias = nn.Parameter(float_tensor(num_features))
        self.register_buffer("running_mean", float_tensor(num_features))
        self.register_buffer("running_var", float_tensor(num_features))

    def forward(self, x):
        return _keep_for_backward(float_tensor(x.nbytes // 4), x)


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return self._modules[str(i)]

    def __len__(self):
        return len(self._modules)


class SAGEConv(nn.Module):
    """torch_geometric.nn.SAGEConv(in, out), mean aggregation over adj_t"""

    def __init__(self, in_channels, out_channels):
        nn.Module.__init__(self)
        self.lin_l = Linear(in_channels, out_channels)
        self.lin_r = Linear(in_channels, out_channels, bias=False)

    def forward(self, x, adj_t):
        agg = adj_t.matmul(x, reduce="mean")
        out_l = self.lin_l(agg)
        out_r = self.lin_r(x)
        return _keep_for_backward(float_tensor(out_l.nbytes // 4), out_l, out_r)


def relu(x):
    return _keep_for_backward(float_tensor(x.nbytes // 4), x)


def dropout(x, p, training):
    if not training:
        return x
    mask = torch.empty(x.nbytes // 4, dtype=torch.uint8, device=device)
    return _keep_for_backward(float_tensor(x.nbytes // 4), x, mask)


class SAGE(nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers, dropout):
        nn.Module.__init__(self)
        self.dropout = dropout
        convs = [SAGEConv(in_channels, hidden_channels)]
        bns = [BatchNorm1d(hidden_channels)]
        for _ in range(num_layers - 2):
            convs.append(SAGEConv(hidden_channels, hidden_channels))
            bns.append(BatchNorm1d(hidden_channels))
        convs.append(SAGEConv(hidden_channels, out_channels))
        self.convs = ModuleList(convs)
        self.bns = ModuleList(bns)

    def forward(self, x, adj_t):
        for i in range(len(self.convs) - 1):
            x = self.convs[i](x, adj_t)
            x = self.bns[i](x)
            x = relu(x)
            x = dropout(x, self.dropout, self.training)
        x = self.convs[len(self.convs) - 1](x, adj_t)
        return _keep_for_backward(float_tensor(x.nbytes // 4), x)        # log_softmax


class Session(object):
    """ray.train's report(), as the trial calls it"""

    def report(self, metrics):
        print("trial report", metrics)


session = Session()


def train_sage(config):
    data, split_idx = load_arxiv("/data/ogb")
    model = SAGE(NUM_FEATURES, config["hidden_channels"], NUM_CLASSES, config["num_layers"], config["dropout"])
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    for epoch in range(1, 501):
        model.train()
        optimizer.zero_grad()
        out = model(data.x, data.adj_t)
        loss = F.nll_loss(out, data.y)
        backward(loss)
        optimizer.step()
        del out, loss
        session.report({"epoch": epoch, "val_acc": 0.0})


def main():
    # tune.Tuner(tune.with_resources(train_sage, {"cpu": 4, "gpu": 0.25}), param_space=search_space, ...).fit():
    # this process is the trial actor Ray started for this sample of the search space
    config = {"hidden_channels": 1024, "num_layers": 3, "dropout": 0.47, "lr": 0.0031}
    train_sage(config)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
