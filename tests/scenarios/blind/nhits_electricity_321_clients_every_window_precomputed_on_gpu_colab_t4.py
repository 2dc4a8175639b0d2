"""nhits_ecl.ipynb (exported) -- a utility analyst's Colab notebook: a hand-written N-HiTS forecasting the
hourly load of 321 clients (the ECL / "electricity" benchmark: 26,304 hours) 96 hours ahead from a 512-hour
lookback, on Colab's T4 (15 GB).  A first version used a torch DataLoader that sliced windows from a NumPy
array in __getitem__; the GPU sat at 8% utilisation ("the model is tiny, the loader is the bottleneck"), so
the analyst moved the data to the GPU and precomputed every window once:

    class WindowDataset(Dataset):
        def __init__(self, series, start, end):
            seg = series[:, max(0, start - LOOKBACK):end]
            self.windows = seg.unfold(1, LOOKBACK + HORIZON, 1).reshape(-1, LOOKBACK + HORIZON)

The series are 34 MB.  unfold() is a view, but reshape() of it must copy: every window becomes its own
row, each hour stored 608 times over.  The training split alone (70%: 17,805 windows x 321 clients x 608
floats) is 12.95 GiB, held by train_ds for the whole run.  The validation split's windows (1.84 GiB) no
longer fit on the 14.5 GiB the T4 leaves: the notebook fails in the second WindowDataset(...) cell, before the
model is even built.

An expert: the memory is the overlapping windows, materialised: keep the 34 MB series (on the GPU is fine)
and cut each batch's windows when it is drawn -- index the unfold() view with the batch's (series, start)
pairs, or gather start + arange(L + H) -- so no window is stored; or at least keep the dataset off the GPU
and move one batch at a time (on Colab's 12.7 GB of host RAM the materialised windows would not fit either,
so lazy windows are the real fix).  Wrong first advice: a smaller batch (training has not started), mixed
precision, gradient checkpointing, no_grad, empty_cache/expandable_segments (the windows are live tensors), a
bigger GPU (the test split adds 3.7 GiB more, and a longer history more still), a shorter lookback (it
changes the model to fix a data-layout mistake).
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator, autograd's bookkeeping and AdamW, but no
# pandas and few ops.  The ops below give a tensor a .shape and make its output's memory (nothing is
# computed); they are compiled into torch's own file, as PyTorch's ops are C++ with no Python frame.
# -----------------------------------------------------------------------------------------------------------
_OPS = r'''
_plain_view = Tensor.view


def _result(shape, dtype, device, inputs=(), saves=()):
    n = 1
    for d in shape:
        n *= int(d)
    t = empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(d) for d in shape)
    if is_grad_enabled() and saves:
        t._saved = tuple(saves)
    return _derive(t, *inputs)


def tensor(data, dtype=None, device=None):
    return _result(data.shape, dtype or "float32", device)


def _getitem(self, key):
    """Basic slicing (a view).  Only the slices this script uses: [:, a:b] and [a:b]."""
    shape = list(self.shape)
    keys = key if isinstance(key, tuple) else (key,)
    for dim, k in enumerate(keys):
        if isinstance(k, slice):
            start, stop, _ = k.indices(shape[dim])
            shape[dim] = max(0, stop - start)
    v = _plain_view(self)
    v.shape = tuple(shape)
    v._contiguous = getattr(self, "_contiguous", True) and all(k == slice(None) for k in keys[1:])
    return v


def _unfold(self, dimension, size, step):
    shape = list(self.shape)
    shape[dimension] = (shape[dimension] - size) // step + 1
    v = _plain_view(self)
    v.shape = tuple(shape) + (size,)
    v._contiguous = False                     # windows overlap: strides, not storage
    return v


def _reshape(self, *shape):
    n = 1
    for d in self.shape:
        n *= d
    known = 1
    for d in shape:
        known *= d if d != -1 else 1
    shape = tuple(n // known if d == -1 else d for d in shape)
    if getattr(self, "_contiguous", True):
        v = _plain_view(self)
        v.shape = shape
        return v
    return _result(shape, self.dtype, self.device, (self,))     # not viewable: a copy, as torch.reshape makes


Tensor.__getitem__ = _getitem
Tensor.unfold = _unfold
Tensor.reshape = _reshape
Tensor.size = lambda self, dim=None: self.shape if dim is None else self.shape[dim]
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)


class _Frame(object):
    """pandas.DataFrame, as far as .drop(...).values.T goes."""

    def __init__(self, rows, cols):
        self.shape = (rows, cols)

    def drop(self, columns):
        return _Frame(self.shape[0], self.shape[1] - 1)

    @property
    def values(self):
        return self

    @property
    def T(self):
        return _Frame(self.shape[1], self.shape[0])


pd = types.ModuleType("pandas")
pd.read_csv = lambda path, parse_dates=None: _Frame(26304, 322)          # date + 321 clients, hourly
sys.modules["pandas"] = pd


class Dataset(object):
    pass


# ===========================================================================================================
# the notebook's cells
# ===========================================================================================================
import pandas as pd  # noqa: E402,F811

device = "cuda"
LOOKBACK, HORIZON = 512, 96

try:
    df = pd.read_csv("/content/drive/MyDrive/data/electricity.csv", parse_dates=["date"])
    series = torch.tensor(df.drop(columns="date").values.T, dtype=torch.float32, device=device)   # (321, 26304)
    n_series, n_steps = series.size()
    n_train, n_val = int(0.7 * n_steps), int(0.1 * n_steps)
    print("series", tuple(series.shape), "train/val/test steps", n_train, n_val, n_steps - n_train - n_val)

    class WindowDataset(Dataset):
        """Every (lookback, horizon) window of every client, precomputed on the GPU once."""

        def __init__(self, series, start, end):
            seg = series[:, max(0, start - LOOKBACK):end]
            self.windows = seg.unfold(1, LOOKBACK + HORIZON, 1).reshape(-1, LOOKBACK + HORIZON)

        def __len__(self):
            return self.windows.shape[0]

        def __getitem__(self, idx):
            w = self.windows[idx]
            return w[..., :LOOKBACK], w[..., LOOKBACK:]

    train_ds = WindowDataset(series, 0, n_train)
    print("train windows", len(train_ds), "%.2f GiB" % (torch.cuda.memory_allocated() / 2 ** 30))
    val_ds = WindowDataset(series, n_train, n_train + n_val)
    test_ds = WindowDataset(series, n_train + n_val, n_steps)
    print("val windows", len(val_ds), "test windows", len(test_ds))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
