"""couple_timepoints.py -- a developmental-biology lab infers cell fates in its mouse gastrulation atlas
Waddington-OT style: an entropic optimal-transport coupling between consecutive embryonic stages, computed
with GeomLoss on the first 30 principal components (float32).  The script was developed on a laptop on
10,000-cell subsamples; on the lab's workstation (RTX A6000, 48 GB) KeOps would not compile inside the
container (no nvcc), so the student switched GeomLoss to its pure-PyTorch backend, checked it on the
10k subsample (a few seconds), and launched it on the full stages:

    X = torch.from_numpy(adata[adata.obs.stage == "E8.5"].obsm["X_pca"][:, :30]).float().cuda()    # 58,214 cells
    Y = torch.from_numpy(adata[adata.obs.stage == "E8.75"].obsm["X_pca"][:, :30]).float().cuda()   # 64,880 cells
    ot = SamplesLoss("sinkhorn", p=2, blur=0.05, scaling=0.9, debias=True, potentials=True,
                     backend="tensorized")
    F, G = ot(X, Y)                  # dual potentials; the coupling is read off them block by block later

backend="tensorized" materialises every cost matrix: C_xy = |x_i - y_j|^2 / 2 (58,214 x 64,880 float32 =
14.1 GiB), its transpose C_yx (another 14.1 GiB), and, for the debiased divergence, C_xx (12.6 GiB) and C_yy
(15.7 GiB); building each one makes two or three temporaries of its own size (geomloss' squared_distances:
D_xx - 2 * D_xy + D_yy, then / 2).  C_xy is built (peak 42 GiB, 14.1 GiB kept); building C_yx beside it
fails at `D_xx - 2 * D_xy`, a 14.1 GiB request with 42 GiB allocated.  The laptop runs used the online
(KeOps) backend, which never stores an N x M matrix; the 10k test allocated 0.4 GiB per matrix.

An expert: do not materialise N x M matrices -- get KeOps working (install the CUDA compiler in the
environment, `pip install pykeops` then pykeops.test_torch_bindings()) and use backend="online" (or
"multiscale", which also prunes far-apart clusters); or, without KeOps, run the log-domain Sinkhorn
iterations over row blocks of C (a few thousand rows at a time); or work on metacells (k-means to ~20k
centroids per stage).  Wrong first advice: empty_cache / expandable_segments (the matrices are live),
no_grad or inference_mode (nothing requires grad: the memory is the matrices, not a graph), half
precision (log-domain Sinkhorn with blur 0.05 loses accuracy in fp16 and only halves a 56 GiB need), a
smaller batch (there is none), an 80 GB card (still short once C_xx and C_yy and the iteration's
temporaries come).
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---- a shaped float32 tensor over the stand-in's sized tensors (the stand-in has no shapes or ops) ----
class T(object):
    def __init__(self, shape, data=None):
        self.shape = tuple(shape)
        self.data = data if data is not None else torch.empty(4 * math.prod(self.shape), device="cuda")

    def dim(self):
        return len(self.shape)

    def _bcast(self, other):
        if not isinstance(other, T):
            return self.shape
        a, b = self.shape, other.shape
        n = max(len(a), len(b))
        a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
        return tuple(max(x, y) for x, y in zip(a, b))

    def __add__(self, other):
        return T(self._bcast(other))

    def __sub__(self, other):
        return T(self._bcast(other))

    def __rsub__(self, other):
        return T(self._bcast(other))

    def __mul__(self, other):
        return T(self._bcast(other))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return T(self._bcast(other))

    def __neg__(self):
        return T(self.shape)

    def sum(self, dim):
        return T(self.shape[:dim] + self.shape[dim + 1:] if dim >= 0 else self.shape[:dim])

    def unsqueeze(self, dim):
        s = list(self.shape)
        s.insert(dim if dim >= 0 else len(s) + 1 + dim, 1)
        return T(s, self.data)

    def view(self, *shape):
        total = math.prod(self.shape)
        known = math.prod(d for d in shape if d != -1)
        return T([total // known if d == -1 else d for d in shape], self.data)

    def permute(self, *dims):
        return T([self.shape[d] for d in dims], self.data)

    def detach(self):
        return self

    def logsumexp(self, dim):
        return T(self.shape[:dim] + self.shape[dim + 1:] if dim >= 0 else self.shape[:dim])


def matmul(a, b):
    return T(a.shape[:-1] + b.shape[-1:])


# ---- geomloss (0.2.6), as far as this job reaches it: geomloss/utils.py, sinkhorn_samples.py ---------
def squared_distances(x, y, use_keops=False):
    if x.dim() == 2:
        D_xx = (x * x).sum(-1).unsqueeze(1)  # (N,1)
        D_xy = matmul(x, y.permute(1, 0))  # (N,D) @ (D,M) = (N,M)
        D_yy = (y * y).sum(-1).unsqueeze(0)  # (1,M)
    elif x.dim() == 3:  # Batch computation
        D_xx = (x * x).sum(-1).unsqueeze(2)  # (B,N,1)
        D_xy = matmul(x, y.permute(0, 2, 1))  # (B,N,D) @ (B,D,M) = (B,N,M)
        D_yy = (y * y).sum(-1).unsqueeze(1)  # (B,1,M)
    return D_xx - 2 * D_xy + D_yy


cost_routines = {2: (lambda x, y: squared_distances(x, y) / 2)}


def log_weights(a):
    return T(a.shape)


def softmin_tensorized(eps, C_xy, h_y):
    B = C_xy.shape[0]
    return -eps * (h_y.view(B, 1, -1) - C_xy / eps).logsumexp(2).view(B, -1)


def sinkhorn_loop(softmin, a_logs, b_logs, C_xxs, C_yys, C_xys, C_yxs, eps_list, rho, debias=True):
    eps = eps_list[0]
    g_ab = softmin(eps, C_yxs, a_logs)
    f_ba = softmin(eps, C_xys, b_logs)
    for eps in eps_list:
        ft_ba = softmin(eps, C_xys, b_logs + g_ab / eps)
        gt_ab = softmin(eps, C_yxs, a_logs + f_ba / eps)
        f_ba, g_ab = ft_ba, gt_ab
    return None, None, g_ab, f_ba


def sinkhorn_tensorized(a, x, b, y, p=2, blur=0.05, reach=None, diameter=None, scaling=0.5, cost=None,
                        debias=True, potentials=False, **kwargs):
    B, N, D = x.shape
    _, M, _ = y.shape
    if cost is None:
        cost = cost_routines[p]
    C_xy = cost(x, y.detach())  # (B,N,M) torch Tensor
    C_yx = cost(y, x.detach())  # (B,M,N) torch Tensor
    C_xx = cost(x, x.detach()) if debias else None  # (B,N,N) torch Tensor
    C_yy = cost(y, y.detach()) if debias else None  # (B,M,M) torch Tensor
    eps_list = [blur ** p * (1.0 / scaling) ** (40 - k) for k in range(40)]
    f_aa, g_bb, g_ab, f_ba = sinkhorn_loop(softmin_tensorized, log_weights(a), log_weights(b), C_xx, C_yy,
                                           C_xy, C_yx, eps_list, None, debias=debias)
    return f_ba, g_ab


class SamplesLoss(object):
    def __init__(self, loss="sinkhorn", p=2, blur=0.05, reach=None, diameter=None, scaling=0.5, cost=None,
                 kernel=None, cluster_scale=None, debias=True, potentials=False, verbose=False, backend="auto"):
        self.loss, self.p, self.blur, self.scaling = loss, p, blur, scaling
        self.debias, self.potentials, self.backend = debias, potentials, backend

    def __call__(self, x, y):
        N, M = x.shape[0], y.shape[0]
        a, b = T((1, N)), T((1, M))                        # uniform weights, batched as (1, N)
        x, y = x.view(1, N, -1), y.view(1, M, -1)
        backend = self.backend
        if backend == "auto":
            backend = "tensorized" if N * M <= 5000 ** 2 else "online"
        assert backend == "tensorized", "pykeops is not available in this environment"
        return sinkhorn_tensorized(a, x, b, y, p=self.p, blur=self.blur, scaling=self.scaling,
                                   debias=self.debias, potentials=self.potentials)


# ---- the lab's script -----------------------------------------------------------------------------------
N_PCS = 30
stages = {"E8.5": 58_214, "E8.75": 64_880}

try:
    X = T((stages["E8.5"], N_PCS))          # torch.from_numpy(...X_pca[:, :30]).float().cuda()
    Y = T((stages["E8.75"], N_PCS))
    print("E8.5 -> E8.75: %d x %d cells" % (X.shape[0], Y.shape[0]))
    ot = SamplesLoss("sinkhorn", p=2, blur=0.05, scaling=0.9, debias=True, potentials=True,
                     backend="tensorized")
    F, G = ot(X, Y)
    print("potentials", F.shape, G.shape)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
