"""Kaggle notebook -- a tabular competition (insurance claims: 700k train + 300k test rows, 220 columns after
encoding), the classic "Porto Seguro" recipe: a swap-noise denoising autoencoder trained in PyTorch on
train+test, its hidden activations (3 x 1000) as features, then gradient-boosted trees on them.  One
Kaggle P100 (16 GB), PyTorch 2.1, XGBoost 2.0, all in one notebook kernel:

    X_gpu = torch.tensor(X_all, device="cuda")                         # 1M x 220 float32, 0.9 GB
    dae = DAE(220, [1000, 1000, 1000]).cuda()
    ... 20 epochs of swap-noise training, batch 4096 ...
    dae.eval()
    feats = []
    with torch.no_grad():
        for chunk in X_gpu.split(500_000):                             # "two chunks fit"
            feats.append(torch.cat(dae.hidden(chunk), dim=1).cpu().numpy())
    X_dae = np.concatenate(feats)                                      # 1M x 3000, in host RAM
    del dae, X_gpu, feats
    gc.collect()

    dtrain = xgb.QuantileDMatrix(np.hstack([X_tr, X_dae[:700_000]]), y, max_bin=256)
    bst = xgb.train({"device": "cuda", "tree_method": "hist", "max_depth": 8, "eta": 0.02, ...},
                    dtrain, num_boost_round=4000)

xgb.train dies at once: "XGBoostError: ... Memory allocation error on worker 0: std::bad_alloc:
cudaErrorMemoryAllocation: out of memory - Free memory: 3.4 GiB - Requested memory: 5.2 GiB".
torch.cuda.memory_allocated() says 0.0 GB.

What holds the card: PyTorch's caching allocator.  The chunked feature extraction peaked at 12.1 GiB (the
0.8 GiB input, a 500k-row chunk's three 1.9 GiB hidden layers and their 5.6 GiB concatenation) and
PyTorch kept those segments reserved after del and gc.collect() -- they are free for PyTorch, not for
XGBoost, which asks the driver (cudaMalloc) for its ELLPACK matrix (700k rows x 3,220 features, 256 bins:
5.2 GiB) and finds 3.4 GiB.

An expert, first: torch.cuda.empty_cache() after the del/gc.collect() (before XGBoost): the 12.1 GiB go
back to the driver and XGBoost gets its 5.2 GiB.  (Or run the DAE and the trees in separate processes /
notebooks, or have both libraries share RMM.)  Wrong first advice: a smaller batch or mixed precision (the
DAE is done, nothing of PyTorch is live), expandable_segments (it lets PyTorch reuse its own segments; it
does not give them to XGBoost), release_references (everything was deleted), killing other processes
(there are none), a bigger GPU.
"""
import ctypes
import gc
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

F32 = 4
MiB, GiB = 1 << 20, 1 << 30
N_TRAIN, N_TEST, N_COLS, HIDDEN, BATCH, CHUNK = 700_000, 300_000, 220, 1000, 4096, 500_000


class DAE(nn.Module):
    def __init__(self, n_in, hidden):
        nn.Module.__init__(self)
        sizes = [n_in] + hidden
        for i in range(len(hidden)):
            setattr(self, "enc%d" % i, nn.Parameter(torch.empty((sizes[i] + 1) * sizes[i + 1] * F32, device="cuda")))
        self.dec = nn.Parameter(torch.empty((hidden[-1] + 1) * n_in * F32, device="cuda"))

    def hidden(self, rows):
        out, prev = [], None
        for i in range(3):
            h = torch.empty(rows * HIDDEN * F32, device="cuda")
            if torch.is_grad_enabled():
                h._saved = prev
            out.append(h)
            prev = h
        return out

    def forward(self, rows):
        hs = self.hidden(rows)
        recon = torch.empty(rows * N_COLS * F32, device="cuda")
        recon._saved = hs[-1]
        return recon


class HostArray(object):
    """a numpy array in host RAM (tensor.cpu().numpy())"""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def cat_to_host(ts):
    cat = torch.empty(sum(t.nbytes for t in ts), device="cuda")           # torch.cat(..., dim=1)
    host = HostArray(cat.nbytes)                                          # .cpu().numpy()
    del cat
    return host


# ---- xgboost, as far as the memory goes (plain-Python mirror: its device memory comes from cudaMalloc) ----
class XGBoostError(ValueError):
    pass


class QuantileDMatrix(object):
    def __init__(self, data_nbytes, rows, cols, max_bin=256):
        self.rows, self.cols, self.max_bin = rows, cols, max_bin          # quantile cuts, GHistIndex on the host


def _cuda_malloc(nbytes):
    rt = ctypes.CDLL("libcudart.so.13")
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    p = ctypes.c_void_p(0)
    if rt.cudaMalloc(ctypes.byref(p), nbytes) != 0:
        rt.cudaGetLastError()
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
        scen_truth.mark("fail", 0, nbytes)
        raise XGBoostError("[10:42:17] ../src/common/device_helpers.cuh:431: Memory allocation error on worker 0: "
                           "std::bad_alloc: cudaErrorMemoryAllocation: out of memory\n- Free memory: %.1f GiB\n"
                           "- Requested memory: %.1f GiB" % (free.value / GiB, nbytes / GiB))
    return p.value


class xgb(object):
    QuantileDMatrix = QuantileDMatrix
    XGBoostError = XGBoostError

    @staticmethod
    def train(params, dtrain, num_boost_round=10):
        # ELLPACK page on the device: every row's bin index per feature, bit-packed (20 bits for 3220 x 256 bins)
        ellpack = (dtrain.rows * dtrain.cols * 20 // 8 + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        page = _cuda_malloc(ellpack)
        gpair = _cuda_malloc(dtrain.rows * 8)
        return page, gpair


# ---- the notebook ----
X_gpu = torch.empty((N_TRAIN + N_TEST) * N_COLS * F32, device="cuda")
dae = DAE(N_COLS, [HIDDEN, HIDDEN, HIDDEN])
optimizer = torch.optim.AdamW(dae.parameters(), lr=3e-4)
for step in range(50):                                    # 20 epochs x 244 steps; every step allocates alike
    noisy = torch.empty(BATCH * N_COLS * F32, device="cuda")
    recon = dae(BATCH)
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = recon, recon._params
    scen_truth.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del noisy, recon, loss

dae.eval()
feats = []
with torch.no_grad():
    for start in range(0, N_TRAIN + N_TEST, CHUNK):
        rows = min(CHUNK, N_TRAIN + N_TEST - start)
        feats.append(cat_to_host(dae.hidden(rows)))
X_dae = HostArray(sum(f.nbytes for f in feats))
del dae, optimizer, X_gpu, feats
gc.collect()
print("torch allocated %.2f GiB, reserved %.2f GiB" % (torch.cuda.memory_allocated() / GiB,
                                                       torch.cuda.memory_reserved() / GiB))

dtrain = xgb.QuantileDMatrix(N_TRAIN * (N_COLS + 3 * HIDDEN) * F32, N_TRAIN, N_COLS + 3 * HIDDEN, max_bin=256)
bst = xgb.train({"device": "cuda", "tree_method": "hist", "max_depth": 8, "eta": 0.02}, dtrain,
                num_boost_round=4000)
sys.exit(0)
