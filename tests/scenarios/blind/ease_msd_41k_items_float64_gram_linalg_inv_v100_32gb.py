"""ease_msd.py -- a recommender-systems researcher reproduces EASE^R (Steck, "Embarrassingly Shallow Autoencoders
for Sparse Data", WWW 2019) on the Million Song Dataset split of Liang et al. (Mult-VAE): 571,355 users x
41,140 songs (songs played by >= 200 users), 33.6M plays, 50,000 users held out each for validation and test,
so 471,355 training users.  EASE is one very wide linear layer: an item-item weight matrix B (41,140 x 41,140)
in closed form.  The paper's NumPy code spends most of its time in the inverse on the lab's shared CPU node, so
the researcher ports the three lines to the GPU node (Tesla V100-SXM2-32GB, chosen for its float64
throughput) with PyTorch:

    X = scipy.sparse.load_npz("msd_train.npz")                  # csr, float64 ones
    G = torch.from_numpy((X.T @ X).toarray()).cuda()           # Gram matrix, float64 (NumPy's default)
    G.diagonal().add_(LAMBDA)                                  # lambda = 200
    P = torch.linalg.inv(G)
    B = P / (-torch.diag(P))
    B.fill_diagonal_(0.0)

G is 41,140^2 float64 = 12.6 GiB and arrives on the card fine.  torch.linalg.inv then needs two more n x n
matrices: the result (filled with the identity, which linalg_solve overwrites) and the LU factorisation's
copy of G; the LU copy is the third 12.6 GiB request, with 6.0 GiB free.  Nothing here is a neural network:
no batch, no autograd, no optimizer; three dense n x n float64 matrices are the whole job, and the float64
came silently from scipy/NumPy through torch.from_numpy.

An expert: compute in float32.  EASE's Gram matrix is regularised on the diagonal (lambda = 200..500), which
keeps it well conditioned; GPU ports of EASE commonly run in float32 with no change in Recall@20 / NDCG@100
(the scores are only ranked).  float32 halves every matrix: 3 x 6.3 GiB fits on the 32 GB card with room to
score the held-out users.  (A Cholesky inverse -- torch.linalg.cholesky then torch.cholesky_inverse, freeing G
-- also saves one copy; computing in float64 on an 80 GB card also works but buys nothing.)
Wrong first advice: fp16/bf16 "mixed precision" (a 41k x 41k inverse in half precision is numerically
meaningless: harmful), quantization, a smaller batch / gradient checkpointing / inference_mode (there is no
batch and no autograd), expandable_segments / empty_cache (a fresh process, one request larger than free),
splitting the operation (the inverse's output is n x n whatever the blocking), ZeRO / LoRA / 8-bit optimizers.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

N_USERS = 471355          # training users (571,355 minus 2 x 50,000 held out)
N_ITEMS = 41140
LAMBDA = 200.0


class _HostArray(object):
    """A NumPy array (host memory) of n elements of dtype."""

    def __init__(self, n, dtype):
        self.size, self.dtype = n, dtype


# ---- stand-in gaps: torch.from_numpy(...).cuda(), Tensor.diagonal/add_, torch.linalg.inv, torch.diag,
# division and fill_diagonal_ (C functions in PyTorch), compiled as part of torch's own file so that the
# failing line stays the program's.
_GAPS = '''
class _CPUTensor(object):
    """torch.from_numpy(a): shares a's host memory; keeps its dtype (float64 from NumPy)."""
    def __init__(self, a):
        self._n, self.dtype = a.size, a.dtype

    def cuda(self, device=None, non_blocking=False):
        out = torch.empty(self._n, dtype=self.dtype, device="cuda")
        out._n = self._n
        return out


def from_numpy(a):
    return _CPUTensor(a)


def _diagonal(self, offset=0, dim1=0, dim2=1):
    return self.view()


def _add_(self, other, alpha=1):
    return self


class linalg(object):
    @staticmethod
    def inv(A):
        """torch.linalg.inv -> linalg_inv_ex: the result starts as the identity, then linalg_solve_ex(A, result)
        factors a copy of A (linalg_lu_factor_ex) and solves in place."""
        result = torch.empty(A._n, dtype=A.dtype, device=A.device)          # identity
        result._n = A._n
        LU = torch.empty(A._n, dtype=A.dtype, device=A.device)              # LU factors of A
        pivots = torch.empty(int(A._n ** 0.5), dtype=torch.float32, device=A.device)
        del LU, pivots
        return result


def diag(input):
    n = int(input._n ** 0.5)
    return torch.empty(n, dtype=input.dtype, device=input.device)


def _div(self, other):
    out = torch.empty(self._n, dtype=self.dtype, device=self.device)
    out._n = self._n
    return out


def _neg(self):
    return torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)


def _fill_diagonal_(self, value, wrap=False):
    return self
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.from_numpy = _ns["from_numpy"]
torch.linalg = _ns["linalg"]
torch.diag = _ns["diag"]
torch.Tensor.diagonal = _ns["_diagonal"]
torch.Tensor.add_ = _ns["_add_"]
torch.Tensor.__truediv__ = _ns["_div"]
torch.Tensor.__neg__ = _ns["_neg"]
torch.Tensor.fill_diagonal_ = _ns["_fill_diagonal_"]
# ----


def load_gram():
    """X = scipy.sparse.load_npz("msd_train.npz"); (X.T @ X).toarray(): a dense float64 NumPy array."""
    print("X: %d training users x %d items (csr, float64)" % (N_USERS, N_ITEMS))
    return _HostArray(N_ITEMS * N_ITEMS, torch.float64)


def main():
    gram = load_gram()
    G = torch.from_numpy(gram).cuda()
    print("G on cuda:0: %s, %.1f GiB" % (G.dtype, G.nbytes / 2.0 ** 30))
    G.diagonal().add_(LAMBDA)
    P = torch.linalg.inv(G)
    B = P / (-torch.diag(P))
    B.fill_diagonal_(0.0)
    print("B ready")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
