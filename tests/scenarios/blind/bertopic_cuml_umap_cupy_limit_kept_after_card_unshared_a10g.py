"""nightly_topics.py -- a nightly BERTopic job on one AWS g5 instance (A10G, 22.5 GiB, cc 8.6):
embed 2.4M support tickets with a sentence-transformer in PyTorch (fp16), hand the embeddings to
cuML (UMAP to 5 dims, then HDBSCAN), all in one process:

    import cupy, torch
    # added in March, when this job shared the A10G with the ticket-router fine-tune:
    # "keep RAPIDS from starving torch" -- the fine-tune has since moved to its own instance
    cupy.get_default_memory_pool().set_limit(fraction=0.35)
    model = SentenceTransformer("all-MiniLM-L12-v2", device="cuda").half()
    emb = model.encode(tickets, batch_size=1024, convert_to_tensor=True)     # 2.4M x 384
    del model; torch.cuda.empty_cache()
    X = cupy.asarray(emb.float())                                             # 3.4 GiB, CuPy's pool
    reduced = cuml.UMAP(n_neighbors=30, n_components=5).fit_transform(X)      # fails here
    labels = cuml.cluster.HDBSCAN(min_cluster_size=200).fit_predict(reduced)

The ticket volume doubled since March.  UMAP's kNN graph (2.4M x 30 indices and distances), its
fuzzy simplicial set (COO, symmetrised) and the optimizer's buffers now need ~6 GiB on top of the
3.4 GiB input, but CuPy's pool may hold only 35% of the card (7.9 GiB): CuPy refuses the request
itself, with 15 GiB of the card free.  PyTorch holds next to nothing by then (the encoder was
deleted and its cache emptied).

User: "cupy OutOfMemoryError on a 24 GB card, nvidia-smi shows half the card free?"
An expert, first: the pool limit is CuPy's own cap, left over from the shared-card days -- raise or
remove it (set_limit(size=0) / drop CUPY_GPU_MEMORY_LIMIT).  Wrong advice: torch.cuda.empty_cache
(PyTorch caches nothing), smaller encode batches, expandable_segments (a PyTorch setting), hunting
other processes, or a bigger GPU -- the card has the room.
"""
import sys

import cupy
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class MiniLMEncoder(torch.nn.Module):
    """all-MiniLM-L12-v2 in fp16: 33M parameters."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(24 * MiB, dtype=torch.float16, device="cuda"),
                                             requires_grad=False)
        for i in range(12):
            setattr(self, "layer%d" % i, torch.nn.Parameter(
                torch.empty(int(1.8 * MiB), dtype=torch.float16, device="cuda"), requires_grad=False))

    def forward(self, n_texts, seq=128):
        h = torch.empty(n_texts * seq * 384, dtype=torch.float16, device="cuda")      # hidden states
        attn = torch.empty(n_texts * 12 * seq * seq, dtype=torch.float16, device="cuda")
        del attn
        pooled = torch.empty(n_texts * 384, dtype=torch.float16, device="cuda")
        del h
        return pooled


def encode(model, n_tickets, batch_size=1024):
    out = torch.empty(n_tickets * 384, dtype=torch.float16, device="cuda")   # convert_to_tensor=True
    with torch.inference_mode():
        for start in range(0, n_tickets, batch_size * 64):                   # (every 64th batch shown)
            model(batch_size)
    return out


def umap_fit_transform(X, n, n_neighbors=30, n_components=5):
    """cuML's UMAP: every buffer from CuPy's default pool (RAPIDS set up on CuPy's allocator)."""
    knn_idx = cupy.empty((n, n_neighbors), dtype="int64")            # brute-force kNN, batched
    knn_dist = cupy.empty((n, n_neighbors), dtype=cupy.float32)
    tile = cupy.empty((8192, 32768), dtype=cupy.float32)              # one tile of distances
    del tile
    rows = cupy.empty(n * n_neighbors * 2, dtype=cupy.int32)           # fuzzy simplicial set, COO,
    cols = cupy.empty(n * n_neighbors * 2, dtype=cupy.int32)           # symmetrised (A + A.T)
    vals = cupy.empty(n * n_neighbors * 2, dtype=cupy.float32)
    sort_tmp = cupy.empty(n * n_neighbors * 2 * 3, dtype="int64")    # coo sort / dedup workspace
    emb = cupy.empty((n, n_components), dtype=cupy.float32)
    epochs_per_sample = cupy.empty(n * n_neighbors * 2, dtype=cupy.float64)
    return emb, (knn_idx, knn_dist, rows, cols, vals, sort_tmp, epochs_per_sample)


def main():
    pool = cupy.get_default_memory_pool()
    pool.set_limit(fraction=0.35)                       # left from when the card was shared
    n = 2400000
    model = MiniLMEncoder()
    emb = encode(model, n)
    del model
    torch.cuda.empty_cache()
    X = cupy.empty((n, 384), dtype=cupy.float32)        # cupy.asarray(emb.float())
    del emb
    torch.cuda.empty_cache()
    reduced, _ = umap_fit_transform(X, n)
    print("reduced", reduced.shape)


try:
    main()
except cupy.cuda.memory.OutOfMemoryError:
    scen_truth.mark("fail", 0, 2400000 * 30 * 2 * 3 * 8)
    raise
sys.exit(0)
