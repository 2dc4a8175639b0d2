"""FNO on 256 x 256 Navier-Stokes trained in float64 because of a leftover set_default_dtype (RTX 3090 24GB).

The real program (train_fno_kolmogorov.py) began life as the author's PINN script for the same flow, whose
L-BFGS stage needed double precision, so its first lines are still:

    import torch
    torch.set_default_dtype(torch.float64)      # "L-BFGS is unstable in float32"

and it now trains a neuraloperator FNO as a surrogate of 2D Kolmogorov flow (Re = 1000) on 256 x 256 snapshots
generated with jax-cfd and stored as float64 .npy (numpy's default):

    model = FNO(n_modes=(32, 32), hidden_channels=64, in_channels=12, out_channels=1,
                lifting_channels=256, projection_channels=256, n_layers=4).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    loader = DataLoader(SnapshotPairs("kolmogorov_re1000_256.npy", history=10), batch_size=32, shuffle=True)
    for epoch in range(500):
        for x, y in loader:                     # x: 32 x 12 x 256 x 256 (10 past vorticity fields + grid)
            x, y = x.cuda(), y.cuda()           # float64: from_numpy keeps numpy's dtype
            loss = LpLoss(d=2)(model(x), y)
            optimizer.zero_grad(); loss.backward(); optimizer.step()

With the default dtype float64 every parameter is float64 (the spectral weights complex128), every activation
float64 and every FFT complex128: twice what the same model needs in float32.
Sizes (batch 32, 256 x 256, float64): a 64-channel map is 32 x 64 x 65,536 x 8 B = 1.07 GB, a 256-channel map
4.3 GB, a 64-channel rfft2 spectrum (256 x 129, complex128) 1.08 GB.
  weights: 4 spectral convs of 2 x 64 x 64 x 32 x 32 complex128 = 134 MB each -> ~0.54 GB
  lifting 12 -> 256 -> 64 (GELU): ~9.7 GB kept for backward
  each FNO block: x_ft (kept by the spectral product), the irfft2 and skip outputs, their sum and the GELU:
  ~5.4 GB
  projection 64 -> 256 -> 1: ~8.6 GB more
The forward alone needs ~39 GB (36.8 GiB) in float64; the first step fails in the third FNO block (index 2),
at x1 + x2, asking for 1 GiB with 22.7 GiB allocated.  In float32 the same pass is 18.4 GiB and, with 0.75 GiB
of gradients and AdamW state and the context, fits the 24 GB card.

What an expert says: nothing here needs double precision; the global default dtype doubled every tensor.
Remove set_default_dtype(torch.float64) (and cast the float64 numpy data with .float()): the pass halves and
fits.  Wrong advice: autocast/AMP (autocast does not touch float64 ops; and FFTs in half need care),
expandable_segments/empty_cache (the pass does not fit), quantisation, inference mode, a bigger card before
the dtype is fixed.
"""
import torch

torch.set_default_dtype(torch.float64)      # from the PINN script: L-BFGS is unstable in float32

import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn

device = "cuda"

RES = 256
HISTORY = 10
BATCH_SIZE = 32
MODES = 32
HIDDEN = 64
LIFTING = 256
PROJECTION = 256
N_LAYERS = 4
EPOCHS = 500
NUM_TRAIN_PAIRS = 9_000


def tensor(numel, dtype=None):
    """torch.empty(..., device="cuda") in the default dtype, as the real code's ops produce it"""
    return torch.empty(numel, dtype=dtype or torch.get_default_dtype(), device=device)


def complex_tensor(numel):
    """a complex tensor in the default dtype's complex type (complex128 under float64): two reals per element"""
    return torch.empty(2 * numel, dtype=torch.get_default_dtype(), device=device)


def elems(x):
    return x.nbytes // torch._ITEMSIZE[x.dtype]


def keep_for_backward(out, *saved):
    if torch.is_grad_enabled():
        out._saved = saved
    return out


def gelu(x):
    return keep_for_backward(tensor(elems(x)), x)


# --- neuraloperator's FNO, as far as memory goes ------------------------------------------------------------
class Conv1x1(nn.Module):
    """a pointwise channel mixer (nn.Conv2d(cin, cout, 1) / neuraloperator's MLP layers)"""

    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.cin, self.cout = cin, cout
        self.weight = nn.Parameter(tensor(cin * cout))
        self.bias = nn.Parameter(tensor(cout))

    def forward(self, x):
        pixels = elems(x) // self.cin
        return keep_for_backward(tensor(pixels * self.cout), x)


class SpectralConv(nn.Module):
    def __init__(self, cin, cout, modes):
        nn.Module.__init__(self)
        self.cin, self.cout, self.modes = cin, cout, modes
        # weights1 / weights2: the two retained corners of the spectrum, cfloat in the default dtype
        self.weight = nn.Parameter(complex_tensor(2 * cin * cout * modes * modes))

    def forward(self, x):
        batch = elems(x) // (self.cin * RES * RES)
        x_ft = complex_tensor(batch * self.cin * RES * (RES // 2 + 1))            # torch.fft.rfft2(x)
        out_ft = complex_tensor(batch * self.cout * RES * (RES // 2 + 1))         # torch.zeros(..., cfloat)
        corner1 = complex_tensor(batch * self.cout * self.modes * self.modes)     # einsum("bixy,ioxy->boxy")
        corner2 = complex_tensor(batch * self.cout * self.modes * self.modes)
        del corner1, corner2, out_ft                                              # written into out_ft
        out = tensor(batch * self.cout * RES * RES)                               # torch.fft.irfft2(out_ft)
        return keep_for_backward(out, x_ft)                                       # the einsum saved x_ft


class FNOBlock(nn.Module):
    def __init__(self, channels, modes):
        nn.Module.__init__(self)
        self.spectral = SpectralConv(channels, channels, modes)
        self.skip = Conv1x1(channels, channels)

    def forward(self, x, last=False):
        x1 = self.spectral(x)
        x2 = self.skip(x)
        x = keep_for_backward(tensor(elems(x1)), x1, x2)                          # x1 + x2
        return x if last else gelu(x)


class MLP(nn.Module):
    def __init__(self, cin, hidden, cout):
        nn.Module.__init__(self)
        self.fc1 = Conv1x1(cin, hidden)
        self.fc2 = Conv1x1(hidden, cout)

    def forward(self, x):
        return self.fc2(gelu(self.fc1(x)))


class FNO(nn.Module):
    def __init__(self, n_modes, hidden_channels, in_channels, out_channels, lifting_channels,
                 projection_channels, n_layers):
        nn.Module.__init__(self)
        self.lifting = MLP(in_channels, lifting_channels, hidden_channels)
        self.fno_blocks = nn.Module()
        for i in range(n_layers):
            setattr(self.fno_blocks, str(i), FNOBlock(hidden_channels, n_modes[0]))
        self.n_layers = n_layers
        self.projection = MLP(hidden_channels, projection_channels, out_channels)

    def forward(self, x):
        x = self.lifting(x)
        for i, block in enumerate(self.fno_blocks._modules.values()):
            x = block(x, last=(i == self.n_layers - 1))
        return self.projection(x)


# --- data and training ---------------------------------------------------------------------------------------
class SnapshotPairs(object):
    """(10 past vorticity fields + 2 grid channels, next field) pairs from a float64 .npy"""

    def __init__(self, path, history):
        self.history = history

    def __len__(self):
        return NUM_TRAIN_PAIRS


def loader(dataset, batch_size):
    for _ in range(len(dataset) // batch_size):
        # x, y = x.cuda(), y.cuda(): torch.from_numpy kept numpy's float64
        x = tensor(batch_size * (dataset.history + 2) * RES * RES, dtype=torch.float64)
        y = tensor(batch_size * RES * RES, dtype=torch.float64)
        yield x, y


def lp_loss(pred, y):
    """neuraloperator's LpLoss(d=2, p=2): ||pred - y|| / ||y|| per sample, averaged: a scalar in pred's graph"""
    return torch.nn.functional.nll_loss(pred, y)


def main():
    model = FNO(n_modes=(MODES, MODES), hidden_channels=HIDDEN, in_channels=HISTORY + 2, out_channels=1,
                lifting_channels=LIFTING, projection_channels=PROJECTION, n_layers=N_LAYERS).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    dataset = SnapshotPairs("kolmogorov_re1000_256.npy", history=HISTORY)
    for epoch in range(EPOCHS):
        model.train()
        for x, y in loader(dataset, BATCH_SIZE):
            out = model(x)
            loss = lp_loss(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del out, loss
        print("epoch %d done" % epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
