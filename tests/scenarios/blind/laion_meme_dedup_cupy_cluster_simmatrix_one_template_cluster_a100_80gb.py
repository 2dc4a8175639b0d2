"""dedup_shard.py -- near-duplicate removal before a CLIP pre-training run, on one A100 80GB (cc 8.0).
Per shard of 2M scraped meme images: CLIP ViT-L/14 image embeddings in PyTorch (fp16), k-means
cluster ids from a FAISS assignment computed earlier, then per cluster a full cosine-similarity
matrix in CuPy, whose upper triangle above 0.95 marks the duplicates (SemDeDup):

    emb = encode_images(clip, loader)                     # torch, fp16, 2M x 768
    E = cupy.from_dlpack(emb)                             # shares the memory
    for c in range(n_clusters):
        Xc = E[members[c]]                                # gather, fp16
        sim = Xc @ Xc.T                                   # |c| x |c| -- fails at the 'template' cluster
        dup = cupy.triu(sim > 0.95, k=1).any(axis=0)

Clusters hold 800 to 12k images and every one runs in well under a second.  Cluster 4117 is the
'Impact-font caption on a blank background' template: 214k near-identical images.  Its similarity
matrix alone is 214k^2 x 2 bytes = 85 GiB, more than the whole card, so CuPy's cudaMalloc fails
(after CuPy dropped its cached blocks and retried) whatever else the process holds.

User: "CUDA OOM in dedup on an 80 GB card -- torch is holding the CLIP cache, should I empty it?"
An expert, first: this one matrix cannot fit any card -- compute it in row blocks (sim of 16k rows
against the cluster at a time, keeping only the running max / the indices above threshold), or
re-split oversized clusters before dedup.  Wrong advice: torch.cuda.empty_cache or freeing CuPy's
pool (85 GiB > 80 GiB total), expandable_segments, killing other processes, a bigger card.
"""
import random
import sys

import cupy
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class CLIPVisionTower(torch.nn.Module):
    """openai/clip-vit-large-patch14, vision tower only, fp16: 304M parameters."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(24):
            setattr(self, "block%d" % i, torch.nn.Parameter(
                torch.empty(12 * MiB, dtype=torch.float16, device="cuda"), requires_grad=False))
        self.patch_embed = torch.nn.Parameter(torch.empty(int(0.6 * MiB), dtype=torch.float16, device="cuda"),
                                              requires_grad=False)

    def forward(self, batch):
        tokens = 257
        h = torch.empty(batch * tokens * 1024, dtype=torch.float16, device="cuda")
        attn = torch.empty(batch * 16 * tokens * tokens, dtype=torch.float16, device="cuda")
        mlp = torch.empty(batch * tokens * 4096, dtype=torch.float16, device="cuda")
        del attn, mlp, h
        return torch.empty(batch * 768, dtype=torch.float16, device="cuda")


def encode_images(clip, n_images, batch=1024):
    emb = torch.empty(n_images * 768, dtype=torch.float16, device="cuda")
    with torch.inference_mode():
        for start in range(0, n_images, batch * 50):          # every 50th batch shown
            out = clip(batch)
            del out
    return emb


def cluster_sizes(n_images, n_clusters, seed=7):
    rng = random.Random(seed)
    sizes = [rng.randint(800, 12000) for _ in range(n_clusters)]
    sizes[4117] = 214000                                        # the meme template
    return sizes


def semdedup_cluster(E, size, threshold=0.95):
    Xc = cupy.empty((size, 768), dtype=cupy.float16)            # E[members[c]]
    sim = cupy.empty((size, size), dtype=cupy.float16)          # Xc @ Xc.T
    mask = cupy.empty((size, size), dtype="uint8")               # cupy.triu(sim > threshold, k=1)
    dup = cupy.empty(size, dtype="uint8")                        # .any(axis=0)
    del mask, sim, Xc
    return dup


def main():
    n_images = 2000000
    clip = CLIPVisionTower()
    emb = encode_images(clip, n_images)
    E = emb                                                       # cupy.from_dlpack(emb): same memory
    keep = 0
    sizes = cluster_sizes(n_images, 6000)
    for c, size in enumerate(sizes):
        dup = semdedup_cluster(E, size)
        keep += size
        del dup
    print("kept", keep)


try:
    main()
except cupy.cuda.memory.OutOfMemoryError:
    scen_truth.mark("fail", 0, 214000 * 214000 * 2)
    raise
sys.exit(0)
