"""js-mlp-groupkfold.ipynb -- a Kaggle notebook for Jane Street Real-Time Market Data Forecasting: an MLP on
the 79 anonymised features, 9 lagged responders and 42 rolling-window features, 5-fold GroupKFold by date_id
over the last 500 dates (18.9M rows), on the notebook's P100 (16 GB).  To skip DataLoader overhead (the
model is tiny, the rows many) each fold's arrays are put on the GPU once and batches are indexed there,
as a popular public notebook does:

    roll = df.groupby("symbol_id")[feats].rolling(w).mean()   # pandas window ops return float64
    X = df[FEATURES].to_numpy()                               # -> float64: the rolling columns upcast all
    ...
    X_tr = torch.tensor(X[tr_idx], device=device)
    ...
    model = MLP(len(FEATURES)).to(device)
    # RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float
    model = model.double()                                    # the first answer on Stack Overflow

On the 100-date debug subset everything ran.  On the full 500 dates, fold 0's training rows are 15.1M x 130
float64 = 15.7 GB (14.6 GiB) -- in float32 they would be 7.9 GB -- and the upload of the validation rows
(3.9 GB more) fails: nothing is cached, no batch has run yet; the data themselves, held by the notebook's
globals X_tr / y_tr / w_tr, fill the card.

An expert: the data are float64 by accident (pandas' rolling upcasts, and model.double() "fixed" the dtype
error the wrong way round): cast the feature matrix to float32 (X.astype(np.float32)) and drop .double() --
half the memory, and a P100 is also faster in float32. The fold's training and validation arrays then take 9.8
GB and fit; keeping the arrays in host memory and moving one batch at a time also works. Wrong first advice: a
smaller batch (no batch has run: the failure is the data upload), mixed precision (autocast does not change
the dtype of a stored float64 tensor; bf16 does not exist on a P100), gradient checkpointing,
expandable_segments or empty_cache (nothing cached), quantization, a bigger GPU (Kaggle's is fixed; the data
are twice the size they should be).
"""
import gc
import os
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# ---------------------------------------------------------------------------------------------------------
# What the simulator lacks, in the shape of the real API and defined as if in the real libraries' files (a
# failing stack then shows the frames it shows with PyTorch): float64 (torch.double, 8 bytes),
# torch.tensor(ndarray, device=...) (a copy of a host array onto the device, keeping its dtype), nn.Linear /
# nn.BatchNorm1d and Module.double(); numpy's arrays as shapes and dtypes; sklearn's GroupKFold as row
# counts.
# ---------------------------------------------------------------------------------------------------------
def _as_library(path, src):
    ns = {"torch": torch, "nn": nn, "__name__": os.path.splitext(os.path.basename(path))[0]}
    exec(compile(src, path, "exec"), ns)
    return ns


_as_library(os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), r'''
torch.float64 = torch.double = "float64"
torch._ITEMSIZE["float64"] = 8


def tensor(data, dtype=None, device=None):
    n = 1
    for d in data.shape:
        n *= d
    t = torch.empty(n, dtype=dtype or data.dtype, device=device)
    t.shape = data.shape
    return t


torch.tensor = tensor


class Linear(nn.Module):
    def __init__(self, fan_in, fan_out, dtype=None):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(fan_in * fan_out, dtype=dtype or torch.get_default_dtype(),
                                               device="cuda"))
        self.bias = nn.Parameter(torch.empty(fan_out, dtype=dtype or torch.get_default_dtype(), device="cuda"))


class BatchNorm1d(nn.Module):
    def __init__(self, n, dtype=None):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n, dtype=dtype or torch.get_default_dtype(), device="cuda"))
        self.bias = nn.Parameter(torch.empty(n, dtype=dtype or torch.get_default_dtype(), device="cuda"))


def _module_double(self):
    """Module.double(): every floating-point parameter cast to float64 (new storage, the old one freed)."""
    for m in self.modules():
        for k, p in list(m._parameters.items()):
            if p is not None and p.dtype != "float64":
                m._parameters[k] = nn.Parameter(torch.empty(p.nbytes // torch._ITEMSIZE[p.dtype],
                                                            dtype=torch.float64, device=p.device),
                                                p.requires_grad)
    return self


nn.Module.double = _module_double
nn.Linear, nn.BatchNorm1d = Linear, BatchNorm1d
''')
ndarray = _as_library("/opt/conda/lib/python3.10/site-packages/numpy/core/_asarray.py", r'''
class ndarray(object):
    """numpy.ndarray as far as this notebook needs: shape, dtype, fancy indexing by rows."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __getitem__(self, rows):
        return ndarray((len(rows),) + self.shape[1:], self.dtype)

    def astype(self, dtype):
        return ndarray(self.shape, dtype)
''')["ndarray"]
group_kfold = _as_library("/opt/conda/lib/python3.10/site-packages/sklearn/model_selection/_split.py", r'''
def group_kfold(dates, n_splits):
    """sklearn GroupKFold(n_splits).split(X, groups=date_id), as row counts: (train rows, valid rows)."""
    per_fold = len(dates) // n_splits
    for k in range(n_splits):
        va = [d for i, d in enumerate(dates) if i // per_fold == k]
        tr = [d for d in dates if d not in set(va)]
        yield tr, va
''')["group_kfold"]


# ---------------------------------------------------------------------------------------------------------
# The notebook
# ---------------------------------------------------------------------------------------------------------
ROWS_PER_DATE = 39 * 968           # symbols x time_ids
FEATURES = (["feature_%02d" % i for i in range(79)] + ["responder_%d_lag_1" % i for i in range(9)]
            + ["%s_roll%d" % (f, w) for f in ("feature_06", "feature_07", "feature_36", "feature_60",
                                             "feature_61", "feature_68", "feature_04")
               for w in (5, 20, 60, 120, 240, 480)])
DATES = list(range(1199, 1699))    # the last 500 dates
CFG = {"batch_size": 8192, "lr": 1e-3, "epochs": 20, "n_splits": 5}

device = "cuda"


class MLP(nn.Module):
    def __init__(self, n_in, hidden=(512, 256, 128)):
        nn.Module.__init__(self)
        self.bn_in = nn.BatchNorm1d(n_in)
        dims = (n_in,) + tuple(hidden)
        for i in range(len(hidden)):
            setattr(self, "fc%d" % i, nn.Linear(dims[i], dims[i + 1]))
            setattr(self, "bn%d" % i, nn.BatchNorm1d(dims[i + 1]))
        self.head = nn.Linear(dims[-1], 1)


def load_frame(dates):
    """polars -> pandas, lags joined, rolling features added; X = df[FEATURES].to_numpy() is float64."""
    n = len(dates) * ROWS_PER_DATE
    return ndarray((n, len(FEATURES)), "float64"), ndarray((n,), "float64"), ndarray((n,), "float64")


print("features:", len(FEATURES), " dates:", len(DATES), " rows:", len(DATES) * ROWS_PER_DATE)
try:
    for fold, (tr_dates, va_dates) in enumerate(group_kfold(DATES, CFG["n_splits"])):
        X_tr_np, y_tr_np, w_tr_np = load_frame(tr_dates)
        X_va_np, y_va_np, w_va_np = load_frame(va_dates)
        X_tr = torch.tensor(X_tr_np, device=device)
        y_tr = torch.tensor(y_tr_np, device=device)
        w_tr = torch.tensor(w_tr_np, device=device)
        print("fold %d: train %s on GPU (%.2f GiB allocated)" % (fold, X_tr.shape,
                                                               torch.cuda.memory_allocated() / GiB))
        X_va = torch.tensor(X_va_np, device=device)
        y_va = torch.tensor(y_va_np, device=device)
        w_va = torch.tensor(w_va_np, device=device)

        model = MLP(len(FEATURES)).to(device)
        model = model.double()
        optimizer = torch.optim.AdamW(model.parameters(), lr=CFG["lr"], weight_decay=1e-5)
        for epoch in range(CFG["epochs"]):
            pass   # batches indexed out of X_tr with torch.randperm; weighted zero-mean R2 on X_va

        torch.save(model.state_dict(), "mlp_fold%d.pt" % fold)
        del X_tr, y_tr, w_tr, X_va, y_va, w_va, model, optimizer
        gc.collect()
        torch.cuda.empty_cache()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
