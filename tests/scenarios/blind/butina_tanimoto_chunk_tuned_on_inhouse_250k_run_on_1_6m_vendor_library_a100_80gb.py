"""butina_gpu.py -- a medicinal-chemistry group clusters compound libraries (Butina, Tanimoto on
2048-bit Morgan/ECFP4 fingerprints, similarity cutoff 0.65) to pick diverse screening subsets.  RDKit's
BulkTanimotoSimilarity took a night on the in-house 250k-compound library, so a postdoc moved the
neighbour search to the group's A100 80GB (79.6 GiB usable):

    fps = torch.from_numpy(fp_bits).cuda().float()          # N x 2048, 0/1; matmul needs float on CUDA
    counts = fps.sum(1)
    for start in range(0, N, CHUNK):                        # CHUNK = 8192
        inter = fps[start:start + CHUNK] @ fps.T            # CHUNK x N
        union = counts[start:start + CHUNK, None] + counts[None, :] - inter
        sim = inter / union
        rows, cols = torch.nonzero(sim >= CUTOFF, as_tuple=True)
        neighbours.append(...)

On the 250k library each CHUNK x N temporary is 7.6 GiB and the loop peaks near 25 GiB: CHUNK=8192
was "tuned" there.  This week the same script is run on a 1.6M-compound vendor library (merged
purchasable catalogues).  Every chunk's temporaries are CHUNK x N, so each is now 6.4x bigger:
48.8 GiB.  The fingerprints (12.2 GiB as float32) and the first chunk's intersection counts (48.8
GiB) fit; the first temporary of the union, another 48.8 GiB, does not -- in the first chunk.

An expert: one operation's output is larger than the card can hold: the chunk must be sized for
rows x N, not rows alone: 512-1024 rows per chunk (3-6 GiB per temporary) for N = 1.6M, computed in
place (inter.div_(...)) and reduced to the neighbour indices before the next chunk; the fingerprints
can also be kept as float16 (0/1 and counts up to 2048 are exact) to halve both.  Wrong first
advice: empty_cache or expandable_segments (nothing is cached: the request alone is 48.8 GiB),
inference_mode or no_grad (no autograd here), gradient checkpointing, a bigger GPU (no card holds
three 48.8 GiB temporaries), stopping other processes (there are none).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
N_BITS = 2048
CHUNK = 8192
CUTOFF = 0.65


def load_fingerprints(path):
    n = 1_600_000                           # np.load(path): packed 0/1 bits unpacked to uint8
    bits = torch.empty(n * N_BITS, dtype=torch.uint8, device="cuda")   # torch.from_numpy(...).cuda()
    fps = torch.empty(n * N_BITS, dtype=torch.float32, device="cuda")  # .float()
    del bits
    return n, fps


def butina_neighbours(n, fps):
    counts = torch.empty(n, dtype=torch.float32, device="cuda")        # fps.sum(1)
    neighbours = []
    for start in range(0, n, CHUNK):
        rows = min(CHUNK, n - start)
        inter = torch.empty(rows * n, dtype=torch.float32, device="cuda")    # fps[start:start+CHUNK] @ fps.T
        union = torch.empty(rows * n, dtype=torch.float32, device="cuda")    # counts[c, None] + counts[None, :]
        union2 = torch.empty(rows * n, dtype=torch.float32, device="cuda")   # ... - inter
        del union
        sim = torch.empty(rows * n, dtype=torch.float32, device="cuda")      # inter / union
        del inter, union2
        mask = torch.empty(rows * n, dtype=torch.uint8, device="cuda")       # sim >= CUTOFF
        del sim
        pairs = torch.empty(rows * 40 * 16, dtype=torch.uint8, device="cuda")  # nonzero: ~40 hits a row, 2 x int64
        del mask
        neighbours.append(pairs)
        print("chunk at %d: %.1f GiB allocated" % (start, torch.cuda.memory_allocated() / GiB))
    return neighbours


try:
    n, fps = load_fingerprints("vendor_1.6M_ecfp4_2048.npy")
    print("fingerprints on GPU: %d x %d float32, %.1f GiB" % (n, N_BITS, torch.cuda.memory_allocated() / GiB))
    nbrs = butina_neighbours(n, fps)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
