"""cluster_stories.py -- daily news-story clustering on a research workstation with one RTX 6000 Ada
(48 GiB, cc 8.9): 6M article embeddings (gte-small, 384-d float32, made by an earlier job) are
clustered with cuML's HDBSCAN; if that fails, the script falls back to a PyTorch k-means:

    X = cupy.load("emb_2026-12-03.npy")                                   # 8.6 GiB, CuPy's pool
    try:
        labels = cuml.cluster.HDBSCAN(min_cluster_size=50).fit_predict(X)
    except MemoryError:                                                   # cupy OutOfMemoryError
        log.warning("HDBSCAN OOM, falling back to k-means")
        Xt = torch.from_numpy(cupy.asnumpy(X)).cuda()                     # fails here
        labels = torch_kmeans(Xt, k=8192, batch_rows=750_000)

HDBSCAN builds a 64-NN graph, core distances and the mutual-reachability graph (~21 GiB with X) and
then asks for its MST / condensed-tree workspace: that request fails (the corpus doubled after a
partner feed was added).  The fallback runs INSIDE the except block: the exception's traceback
still references HDBSCAN's frames, so every buffer it made stays alive in CuPy's pool -- and even
once freed, CuPy's pool keeps the blocks cached.  PyTorch then asks for a copy of X (8.6 GiB) and its
distance tiles with only ~26 GiB of the card free: the k-means (copy 8.6 GiB + a 22.9 GiB distance tile) runs out.

User: "even the k-means fallback OOMs, and it ran fine on its own yesterday"
An expert, first: leave the except block before falling back (set a flag, let the exception and its
traceback go), then release CuPy's pool (del the arrays, cupy.get_default_memory_pool().free_all_blocks())
before PyTorch allocates.  Wrong advice: torch.cuda.empty_cache (PyTorch holds next to nothing),
expandable_segments, smaller k-means tiles alone, other processes, a bigger GPU.
"""
import sys

import cupy
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N, D, NN = 6 * 1000 * 1000, 384, 64


def hdbscan_fit_predict(X, n):
    """cuML's HDBSCAN (brute-force kNN, mutual reachability, MST, condensed tree), from CuPy's pool."""
    knn_idx = cupy.empty((n, NN), dtype="int64")
    knn_dist = cupy.empty((n, NN), dtype=cupy.float32)
    core = cupy.empty(n, dtype=cupy.float32)
    mr_src = cupy.empty(n * NN * 2, dtype=cupy.int32)           # mutual-reachability graph, symmetrised
    mr_dst = cupy.empty(n * NN * 2, dtype=cupy.int32)
    mr_w = cupy.empty(n * NN * 2, dtype=cupy.float32)
    mst_work = cupy.empty((n * NN * 2, 6), dtype="int64")      # Boruvka MST workspace: fails here
    return mst_work, (knn_idx, knn_dist, core, mr_src, mr_dst, mr_w)


def torch_kmeans(Xt, k=8192, batch_rows=750000, iters=20):
    cent = torch.empty(k * D * 4, device="cuda")
    for _ in range(iters):
        d = torch.empty(batch_rows * k * 4, device="cuda")      # distance tile
        a = torch.empty(batch_rows * 8, device="cuda")          # argmin
        del d, a
    return torch.empty(N * 8, device="cuda")


def main():
    torch.empty(1, device="cuda")                               # the embedding job's leftovers: none
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    X = cupy.empty((N, D), dtype=cupy.float32)                  # cupy.load(...)
    try:
        labels, _ = hdbscan_fit_predict(X, N)
    except cupy.cuda.memory.OutOfMemoryError:
        print("HDBSCAN OOM, falling back to k-means", file=sys.stderr)
        Xt = torch.empty(N * D * 4, device="cuda")             # torch.from_numpy(cupy.asnumpy(X)).cuda()
        labels = torch_kmeans(Xt)
    print("clusters", labels.nbytes)


main()
sys.exit(0)
