"""search_service.py -- a marketplace's listing search: one process per L40S (48 GB, 44.5 GiB usable)
holds a multilingual-e5-base query encoder and a bge-reranker-v2-m3 cross-encoder (PyTorch, fp16,
1.6 GiB together) and the listing index in FAISS GPU: one IVF65536,PQ64 shard per month of listings
(25M listings a month; 1.9 GiB per shard on the GPU: codes, ids, coarse centroids), searched with
nprobe 64, top 200 of all shards merged, then reranked in one cross-encoder batch.  The loader:

    def load_shard(path):
        res = faiss.StandardGpuResources()
        index = faiss.read_index(path)
        index.nprobe = 64
        return faiss.index_cpu_to_gpu(res, 0, index)

    shards = [load_shard(p) for p in sorted(glob("/indexes/listings-*.ivfpq"))]

Each shard gets its own StandardGpuResources, and the GPU index keeps it alive (the Python wrapper
holds a reference to it).  Each StandardGpuResources reserves its own temporary-memory stack on the
device when first used (1.5 GiB on any card over 8 GiB), with its own streams and cuBLAS handle:
12 shards hold 18 GiB of FAISS scratch space, of which one search uses a few hundred MiB, one shard
at a time.  Last month, with 11 shards, the service started with 4.5 GiB free and its requests
peaked at 3.6 GiB.  This month's rollout adds the 12th shard (3.4 GiB more, 1.5 of it scratch); the
service starts with 1.1 GiB free, and the warm-up query fails in the reranker's first attention
layer (200 candidate pairs x 512 tokens: the softmax of the attention scores, 1.6 GiB).

An expert: PyTorch holds 1.8 GiB; the rest of the card, 41 GiB, was allocated outside PyTorch, by
FAISS: 23 GiB of index data and 18 GiB of twelve 1.5 GiB temporary-memory stacks.  Share one
StandardGpuResources for all shards (or index_cpu_to_gpu_multiple / IndexShards over one res; or
res.setTempMemory(256-512 MiB) per shard): 16.5 GiB back, room for a year of shards more.  Moving
the older shards to CPU memory (or merging them) is the next step as the index keeps growing.
Wrong first advice: a smaller reranker batch (the next shard fails batch 1 too), empty_cache or
expandable_segments (PyTorch caches almost nothing), mixed precision or quantization of the
reranker (it is 1 GiB of the 44), stopping other processes (there are none: it is all this process).
"""
import ctypes
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30


# --- a stand-in for faiss (the GPU part the service uses), mirroring its Python API ---------------------
_cudart = ctypes.CDLL("libcudart.so.13")
_cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_cudart.cudaSetDevice.argtypes = [ctypes.c_int]


def _device_alloc(device, nbytes):
    """faiss::gpu::allocMemorySpace: a plain cudaMalloc from libfaiss."""
    _cudart.cudaSetDevice(device)
    p = ctypes.c_void_p(0)
    if _cudart.cudaMalloc(ctypes.byref(p), nbytes) != 0:
        _cudart.cudaGetLastError()
        raise RuntimeError("Error: 'err == cudaSuccess' failed: failed to cudaMalloc %d bytes on device %d "
                           "(error 2 out of memory)" % (nbytes, device))
    return p.value


class StandardGpuResources(object):
    """faiss.StandardGpuResources: per device, at first use, a temporary-memory stack of 1.5 GiB
    (kMaxTempMem on a card over 8 GiB: StackDeviceMemory cudaMallocs it whole), streams, a cuBLAS handle."""

    def __init__(self):
        self._temp = {}
        self._temp_size = 1536 * MiB

    def setTempMemory(self, size):
        self._temp_size = int(size)

    def noTempMemory(self):
        self._temp_size = 0

    def initializeForDevice(self, device):
        if device not in self._temp:
            self._temp[device] = _device_alloc(device, self._temp_size) if self._temp_size else None
            self._cublas_workspace = _device_alloc(device, 4 * MiB)


class IndexIVFPQ(object):
    def __init__(self, d, nlist, m, ntotal):
        self.d, self.nlist, self.m, self.ntotal, self.nprobe = d, nlist, m, ntotal, 1


class GpuIndexIVFPQ(object):
    def __init__(self, res, device, cpu_index):
        res.initializeForDevice(device)
        self.referenced_objects = [res]          # faiss's Python wrapper keeps the resources alive
        self.nprobe = cpu_index.nprobe
        self._mem = [_device_alloc(device, cpu_index.nlist * cpu_index.d * 4)]   # coarse centroids
        self._mem.append(_device_alloc(device, 256 * cpu_index.d * 4))           # PQ centroids
        per = cpu_index.ntotal // 64
        for _ in range(64):                                                      # inverted lists: codes, ids
            self._mem.append(_device_alloc(device, per * cpu_index.m))
            self._mem.append(_device_alloc(device, per * 8))
        self.ntotal = cpu_index.ntotal

    def search(self, xq, k):
        # scratch from the resources' temporary stack; results written into torch tensors (torch_utils)
        D = torch.empty(k * 4, dtype=torch.uint8, device="cuda")
        I = torch.empty(k * 8, dtype=torch.uint8, device="cuda")
        return D, I


faiss = types.ModuleType("faiss")
faiss.StandardGpuResources = StandardGpuResources
faiss.read_index = lambda path: IndexIVFPQ(768, 65536, 64, 25_000_000)
faiss.index_cpu_to_gpu = lambda res, device, index: GpuIndexIVFPQ(res, device, index)
sys.modules["faiss"] = faiss
# ---------------------------------------------------------------------------------------------------------

import faiss  # noqa: E402


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self, d, inter):
        torch.nn.Module.__init__(self)
        self.d, self.inter = d, inter
        self.weight = torch.nn.Parameter(torch.empty(4 * d * d + 2 * d * inter, dtype=torch.float16,
                                                     device="cuda"), requires_grad=False)

    def forward(self, hidden, batch, seq, heads):
        scores = torch.empty(batch * heads * seq * seq, dtype=torch.float16, device="cuda")   # q @ k.T
        probs = torch.empty(batch * heads * seq * seq, dtype=torch.float16, device="cuda")    # softmax
        del scores
        ctx = torch.empty(batch * seq * self.d, dtype=torch.float16, device="cuda")
        del probs
        ffn = torch.empty(batch * seq * self.inter, dtype=torch.float16, device="cuda")
        out = torch.empty(batch * seq * self.d, dtype=torch.float16, device="cuda")
        del ffn, ctx
        return out


class XLMRobertaModel(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads):
        torch.nn.Module.__init__(self)
        self.d, self.heads, self.n = d, heads, layers
        self.embeddings = torch.nn.Parameter(torch.empty(vocab * d, dtype=torch.float16, device="cuda"),
                                             requires_grad=False)
        for i in range(layers):
            setattr(self, "layer_%d" % i, XLMRobertaLayer(d, 4 * d))

    def forward(self, batch, seq):
        hidden = torch.empty(batch * seq * self.d, dtype=torch.float16, device="cuda")
        for i in range(self.n):
            hidden = getattr(self, "layer_%d" % i)(hidden, batch, seq, self.heads)
        return torch.empty(batch * self.d * 2, dtype=torch.uint8, device="cuda")   # pooled / score


def load_shard(path):
    res = faiss.StandardGpuResources()
    index = faiss.read_index(path)
    index.nprobe = 64
    return faiss.index_cpu_to_gpu(res, 0, index)


def handle(query, shards, encoder, reranker, k=200):
    with torch.inference_mode():
        q = encoder(1, 64)
        hits = [s.search(q, k) for s in shards]
        scores = reranker(k, 512)               # (query, listing) pairs, one batch
    return scores


try:
    encoder = XLMRobertaModel(250_002, 768, 12, 12).cuda().eval()        # multilingual-e5-base
    reranker = XLMRobertaModel(250_002, 1024, 24, 16).cuda().eval()      # bge-reranker-v2-m3
    months = ["2025-%02d" % m for m in range(1, 13)]
    shards = [load_shard("/indexes/listings-%s.ivfpq" % m) for m in months]
    free, total = torch.cuda.mem_get_info()
    print("%d shards loaded; PyTorch %.1f GiB; free %.1f GiB of %.1f" % (
        len(shards), torch.cuda.memory_allocated() / GiB, free / GiB, total / GiB))
    handle("warm-up: vintage leather jacket", shards, encoder, reranker)
    print("warm-up ok")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
