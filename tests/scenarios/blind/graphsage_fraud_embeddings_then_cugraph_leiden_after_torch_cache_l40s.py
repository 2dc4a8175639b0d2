"""communities.py -- fraud-ring discovery on a payments graph (31M accounts and merchants, 410M
transactions), one notebook-turned-script on an L40S (48 GB):

    # 1. train a 3-layer GraphSAGE on the labelled subgraph (NeighborLoader, batch 4,096 seeds)
    # 2. embed every node, layer by layer, under torch.no_grad()           -> emb: 31M x 64 fp16 (3.7 GiB)
    # 3. build a k-NN similarity graph of the embeddings with cuML, then run cuGraph's Leiden on it
    del model, optimizer, loader                     # "free the GPU for RAPIDS"
    gc.collect()
    emb_cp = cupy.from_dlpack(emb)                   # zero-copy
    knn = NearestNeighbors(n_neighbors=16).fit(emb_cp).kneighbors(emb_cp, return_distance=True)
    G = cugraph.from_cudf_edgelist(...); parts, modularity = cugraph.leiden(G)

User's words: "I deleted the model and ran gc.collect(), nvidia-smi still says 42 GB used, and the first
RAPIDS call dies with cupy OutOfMemoryError.  torch.cuda.memory_allocated() is only 3.7 GB."

What fills the card: PyTorch's caching allocator.  The neighbour-sampled training batches and the
layer-wise inference (31M x 256 hidden states per layer, in 2 GiB slabs) left 39 GiB reserved, 35 GiB
of it unused; del and gc.collect() return tensors to PyTorch's cache, not to the driver.  The k-NN's
outputs come from CuPy's pool: the 31M x 16 int64 indices (3.7 GiB) still fit in what is left, the fp32
distances (1.8 GiB) do not.  CuPy cannot use PyTorch's cached memory.

An expert, first: torch.cuda.empty_cache() after the del (before handing the card to RAPIDS); the
cached ~35 GiB go back to the driver and the k-NN and Leiden fit.  Wrong advice: a smaller GraphSAGE batch
or fewer layers (training is over), a bigger GPU, expandable_segments (it does not hand PyTorch's cache to
another library), killing other processes (there are none).
"""
import gc
import sys

import cupy
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
N_NODES, HIDDEN, EMB = 31_000_000, 256, 64
BATCH_SIZE = 4096


class GraphSAGE(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.convs = torch.nn.Parameter(torch.empty(3 * 2 * HIDDEN * HIDDEN * 4, device="cuda"))

    def forward(self, x, hops):
        h = x
        for size in hops:                                   # messages of the sampled k-hop subgraph
            a = torch.empty(size, device="cuda")
            a._saved = h
            h = a
        return h


def train(model, optimizer, steps):
    for step in range(steps):
        x = torch.empty(BATCH_SIZE * 15 * 10 * 5 * 172 * 2, device="cuda")      # features of the sampled nodes
        out = model(x, [3000 * MiB, 1200 * MiB, 200 * MiB])
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = out, out._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del x, out, loss


def embed_all(model):
    """layer-wise full-graph inference under no_grad: each layer's 31M x 256 hidden states in 2 GiB slabs"""
    with torch.no_grad():
        return _embed_all(model)


def _embed_all(model):
    emb = torch.empty(N_NODES * EMB * 2, device="cuda")     # fp16 output
    prev = [torch.empty(2 * GiB, device="cuda") for _ in range(8)]
    for layer in range(3):
        nxt = [torch.empty(2 * GiB, device="cuda") for _ in range(8)]
        del prev
        prev = nxt
    del prev
    return emb


def knn_leiden(emb):
    emb_cp = emb                                            # cupy.from_dlpack(emb): no copy
    indices = cupy.empty((N_NODES, 16), dtype="int64")
    distances = cupy.empty((N_NODES, 16), dtype=cupy.float32)
    return indices, distances


def main():
    scen_truth.note_every_empty(torch)
    model = GraphSAGE()
    optimizer = torch.optim.AdamW([model.convs], lr=3e-3)
    train(model, optimizer, 50)
    emb = embed_all(model)
    del model, optimizer
    gc.collect()
    print("allocated %.1f GiB, reserved %.1f GiB" % (torch.cuda.memory_allocated() / GiB,
                                                       torch.cuda.memory_reserved() / GiB))
    try:
        knn_leiden(emb)
    except cupy.cuda.memory.OutOfMemoryError:
        scen_truth.mark("fail", 0, N_NODES * 16 * 4)   # the distances (float32) fail; the indices fit
        raise


main()
sys.exit(0)
