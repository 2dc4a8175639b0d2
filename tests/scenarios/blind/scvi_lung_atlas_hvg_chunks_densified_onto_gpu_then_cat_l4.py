"""train_atlas_vae.py -- a computational biologist trains an scVI-style VAE (her own PyTorch code, ~2M
parameters: encoder 3000 -> 128 -> 30, decoder back to 3000 with a negative-binomial likelihood) to
integrate a lung atlas: 1,218,000 cells from 41 donors, 3,000 highly variable genes, on a GCP g2-standard-8
(one NVIDIA L4, 24 GB, 22.0 GiB usable; 32 GB of host RAM).  The model is tiny, so she keeps the whole
expression matrix on the GPU and draws mini-batches by indexing it (no DataLoader, 10x faster per epoch
than scvi-tools' loader on this VM).  The counts come as a scipy CSR matrix; densifying all of it on the
host at once (14.6 GB, plus the sparse copy) got the VM OOM-killed, so she densifies it chunk by chunk
straight onto the GPU:

    adata = ad.read_h5ad("lung_atlas_hvg3000.h5ad")
    chunks = []
    for start in range(0, adata.n_obs, 50_000):
        block = adata.X[start:start + 50_000].toarray()          # 600 MB dense float32 on the host
        chunks.append(torch.from_numpy(block).cuda())
    X = torch.cat(chunks)                                        # <- CUDA out of memory
    del chunks
    library = X.sum(1, keepdim=True).log()
    model = AtlasVAE(n_genes=3000, n_batch=41).cuda()

The loop goes through: 25 chunks, 13.6 GiB on the GPU.  torch.cat then asks for a second 13.6 GiB for the
concatenated copy while the list still holds the chunks (only 8.3 GiB free): it fails before any
training starts.  The dense matrix itself fits, with 8 GiB to spare for a model this small and batches
of 1024 cells; it is the moment where two copies of it exist that does not.

An expert: the bytes are the dataset, put on the GPU on purpose and sized right, and the failure is the
transient second copy at the concatenation.  Preallocate X = torch.empty(n_cells, n_genes, device="cuda")
and copy each densified chunk into its rows (X[start:stop].copy_(...)), so only one copy ever exists; or
keep the matrix in host memory (pinned, or sparse) and move one mini-batch at a time, as scvi-tools does.
(Keeping the matrix sparse on the GPU, or counts in float16, would also shrink it.)  Wrong first advice:
a smaller batch (no batch is running; the model is not even built), gradient checkpointing or mixed
precision (no forward pass), empty_cache or expandable_segments (nothing is cached: every byte is a live
chunk), "release references" (the list cannot be dropped before cat has read it), a bigger GPU (works,
but 13.6 GiB of data on a 22 GiB card is fine once there is one copy).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# torch.from_numpy(...).cuda() and torch.cat, which the stand-in torch lacks: written as PyTorch's are
# (C++ in PyTorch, so no frame of theirs is the program's; compiled under a torch file name for that)
_TORCH_OPS = '''
class _HostTensor(object):
    """torch.from_numpy(a): a CPU tensor over the array's memory."""
    is_cuda = False

    def __init__(self, numel, dtype):
        self.numel_, self.dtype = numel, dtype

    def cuda(self, device=None, non_blocking=False):
        return empty(self.numel_, dtype=self.dtype, device="cuda")


def from_numpy(a):
    return _HostTensor(a.size, a.dtype)


def cat(tensors, dim=0):
    """One new tensor holding all of them, as torch.cat makes it (the inputs stay alive)."""
    n = sum(t.nbytes for t in tensors) // _ITEMSIZE[tensors[0].dtype]
    return empty(n, dtype=tensors[0].dtype, device=tensors[0].device)
'''
exec(compile(_TORCH_OPS, os.path.join(os.path.dirname(torch.__file__), "functional.py"), "exec"), torch.__dict__)


class ndarray(object):
    """numpy.ndarray in host memory (what .toarray() returns)."""

    def __init__(self, rows, cols, dtype="float32"):
        self.shape, self.dtype = (rows, cols), dtype
        self.size = rows * cols


class csr_matrix(object):
    """scipy.sparse.csr_matrix of raw counts, held in host memory by anndata."""

    def __init__(self, rows, cols):
        self.shape = (rows, cols)

    def __getitem__(self, sl):
        stop = min(sl.stop, self.shape[0])
        return csr_matrix(stop - sl.start, self.shape[1])

    def toarray(self):
        return ndarray(self.shape[0], self.shape[1])


class AnnData(object):
    def __init__(self, n_obs, n_vars):
        self.n_obs, self.n_vars = n_obs, n_vars
        self.X = csr_matrix(n_obs, n_vars)
        self.obs = {"donor_id": None}


def read_h5ad(path):
    return AnnData(1_218_000, 3_000)


class AtlasVAE(torch.nn.Module):
    def __init__(self, n_genes, n_batch, n_hidden=128, n_latent=30):
        torch.nn.Module.__init__(self)
        self.enc = torch.nn.Parameter(torch.empty((n_genes + n_batch) * n_hidden, dtype=torch.float32, device="cuda"))
        self.mu = torch.nn.Parameter(torch.empty(n_hidden * n_latent * 2, dtype=torch.float32, device="cuda"))
        self.dec = torch.nn.Parameter(torch.empty((n_latent + n_batch) * n_hidden + n_hidden * n_genes * 2,
                                                  dtype=torch.float32, device="cuda"))


CHUNK = 50_000
GiB = float(1 << 30)

try:
    adata = read_h5ad("/data/lung_atlas_hvg3000.h5ad")
    chunks = []
    for start in range(0, adata.n_obs, CHUNK):
        block = adata.X[start:start + CHUNK].toarray()
        chunks.append(torch.from_numpy(block).cuda())
        if len(chunks) % 5 == 0 or start + CHUNK >= adata.n_obs:
            print("densified %d/%d cells, %.1f GiB on the GPU" % (min(start + CHUNK, adata.n_obs), adata.n_obs,
                                                                   torch.cuda.memory_allocated() / GiB))
    X = torch.cat(chunks)
    del chunks
    model = AtlasVAE(n_genes=adata.n_vars, n_batch=41)
    print("matrix on the GPU: %.1f GiB" % (X.nbytes / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
