"""train_cc.py -- unsupervised person re-identification with Cluster Contrast (ResNet-50-IBN, fp32,
Adam, batch 256 = 16 pseudo-identities x 16 crops at 256x128) on MSMT17's 32,621 training crops, on
one A10G (24 GB, 22.5 GiB usable).  Every epoch starts by pseudo-labelling: extract features,
k-reciprocal re-ranking with a FAISS GPU k-NN search, DBSCAN, then a cluster memory; then one
epoch of contrastive training.  The batch size was raised until the training just fit:

    for epoch in range(epochs):
        features = extract_features(model, cluster_loader)       # eval + no_grad; kept on the CPU
        rerank_dist = compute_jaccard_distance(features, k1=30, k2=6)
        pseudo_labels = DBSCAN(eps=0.6, min_samples=4, metric="precomputed").fit_predict(rerank_dist)
        memory.features = F.normalize(cluster_centroids(pseudo_labels, features), dim=1).cuda()
        trainer.train(epoch, train_loader, optimizer)             # ~20 GiB of activations

    def compute_jaccard_distance(features, k1, k2):
        res = faiss.StandardGpuResources()
        index = faiss.GpuIndexFlatIP(res, features.size(-1))     # FAISS reserves its scratch memory
        index.add(features.numpy())
        _, initial_rank = index.search(features.numpy(), k1 + 1)
        ...                                                       # k-reciprocal sets on the CPU

Epoch 0's pseudo-labelling runs before any training: FAISS takes its 1.5 GiB scratch space and the
features (255 MiB) and frees them when the function returns.  Then the first training epoch makes
PyTorch's caching allocator reserve ~20.7 GiB; after the last step those blocks are free but stay
cached by PyTorch.  At epoch 1's pseudo-labelling FAISS allocates with its own cudaMalloc, outside
PyTorch: with ~1.3 GiB free on the card its 1.5 GiB scratch allocation fails (GpuIndexFlatIP's
constructor), while PyTorch holds ~20 GiB it is not using.

An expert: this is the pseudo-labelling phase, not training, and the training fits: release
PyTorch's cache before handing the GPU to FAISS (torch.cuda.empty_cache() at the start of
compute_jaccard_distance, after extract_features), or do the k-NN search on the CPU / with a smaller
FAISS scratch (res.setTempMemory).  Wrong first advice: a smaller batch, checkpointing or mixed
precision (the training is not what fails), expandable_segments (PyTorch still would not hand its
cache to another library), hunting for leaks or other processes, a bigger GPU.
"""
import ctypes
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
N_TRAIN, FEAT_DIM = 32_621, 2048
BATCH = 256


# ---- faiss (GPU), as far as this script uses it: the stand-in torch has no faiss, so its classes
# ---- are written here with faiss's names; like libfaiss, they allocate with cudaMalloc themselves ----
class _Cuda(object):
    rt = None

    @classmethod
    def runtime(cls):
        if cls.rt is None:
            cls.rt = ctypes.CDLL("libcudart.so.13")
            cls.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            cls.rt.cudaFree.argtypes = [ctypes.c_void_p]
        return cls.rt


def _faiss_alloc(nbytes, what):
    rt = _Cuda.runtime()
    p = ctypes.c_void_p(0)
    err = rt.cudaMalloc(ctypes.byref(p), nbytes)
    if err != 0:
        rt.cudaGetLastError()
        st = torch.cuda.memory_stats()         # (test scaffolding: the simulator's books at the failure)
        scen_truth.mark("fail", 0, nbytes, allocated=st["allocated_bytes.all.current"],
                        reserved=st["reserved_bytes.all.current"])
        raise RuntimeError(
            "Error in virtual void* faiss::gpu::StandardGpuResourcesImpl::allocMemory(const "
            "faiss::gpu::AllocRequest&) at /project/faiss/faiss/gpu/StandardGpuResources.cpp:530: Error: "
            "'err == cudaSuccess' failed: StandardGpuResources: alloc fail type %s dev 0 space Device "
            "stream 0x0 size %d bytes (cudaMalloc error out of memory [2])" % (what, nbytes))
    return p.value


class StandardGpuResources(object):
    """Scratch ("temporary") memory per device, reserved the first time an index uses the device:
    1.5 GiB on cards with more than 8 GiB (getDefaultTempMemForGPU)."""

    def __init__(self):
        self._temp = None
        self._temp_size = 1536 * MiB

    def setTempMemory(self, size):
        self._temp_size = size

    def setDefaultNullStreamAllDevices(self):
        pass

    def initializeForDevice(self, device):
        if self._temp is None and self._temp_size:
            self._temp = _faiss_alloc(self._temp_size, "TemporaryMemoryBuffer")

    def __del__(self):
        if self._temp is not None:
            _Cuda.runtime().cudaFree(self._temp)


class GpuIndexFlatIP(object):
    def __init__(self, res, d):
        self.res, self.d, self._data = res, d, []
        res.initializeForDevice(0)

    def add(self, x):
        self._data.append(_faiss_alloc(x.n * self.d * 4, "FlatData"))

    def search(self, x, k):
        out = _faiss_alloc(x.n * k * 12, "Other")              # distances (float32) + labels (int64)
        _Cuda.runtime().cudaFree(out)                            # copied back to numpy
        return None, None

    def __del__(self):
        for p in self._data:
            _Cuda.runtime().cudaFree(p)


class HostFeatures(object):
    """A CPU tensor of n features (torch.cat of the extracted features, as numpy for faiss)."""

    def __init__(self, n):
        self.n = n

    def numpy(self):
        return self

    def size(self, dim):
        return FEAT_DIM


faiss = type(sys)("faiss")
faiss.StandardGpuResources, faiss.GpuIndexFlatIP = StandardGpuResources, GpuIndexFlatIP


# ---- the model: ResNet-50-IBN-a + BN neck, memory as what autograd keeps per crop (fp32) ----
STAGES = (("conv1", 9_400, 14_000_000), ("layer1", 215_800, 31_000_000), ("layer2", 1_219_000, 20_000_000),
          ("layer3", 7_098_000, 14_000_000), ("layer4", 14_964_000, 5_000_000), ("neck", 4_096, 16_384))


class Stage(torch.nn.Module):
    def __init__(self, n_params, saved_per_crop):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_params * 4, dtype=torch.uint8, device="cuda"))
        self.saved_per_crop = saved_per_crop

    def forward(self, x, batch):
        w = self.weight
        h = x
        parts = 4 if self.saved_per_crop > 1_000_000 else 1
        for _ in range(parts):
            out = torch.empty(self.saved_per_crop * batch // parts, dtype=torch.uint8, device="cuda")
            if torch.is_grad_enabled():
                out._saved = h
            h = out
        del w
        return h


class ResNetIBN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, n_params, saved in STAGES:
            setattr(self, name, Stage(n_params, saved))

    def forward(self, images, batch):
        h = images
        for name, _, _ in STAGES:
            h = getattr(self, name)(h, batch)
        return h


def extract_features(model, n):
    model.eval()
    with torch.no_grad():
        for start in range(0, n, BATCH * 32):                   # (the stand-in runs 1 batch in 32)
            imgs = torch.empty(BATCH * 3 * 256 * 128 * 4, dtype=torch.uint8, device="cuda")
            f = model(imgs, BATCH)
            del imgs, f                                          # outputs.data.cpu()
    return HostFeatures(n)


def compute_jaccard_distance(features, k1=30, k2=6):
    res = faiss.StandardGpuResources()
    res.setDefaultNullStreamAllDevices()
    index = faiss.GpuIndexFlatIP(res, features.size(-1))
    index.add(features.numpy())
    _, initial_rank = index.search(features.numpy(), k1 + 1)
    return None                                                  # k-reciprocal encoding: numpy on the CPU


def train_epoch(model, optimizer, epoch, iters):
    model.train()
    for i in range(iters):
        imgs = torch.empty(BATCH * 3 * 256 * 128 * 4, dtype=torch.uint8, device="cuda")
        f = model(imgs, BATCH)
        loss = torch.empty(512, device="cuda")                   # ClusterMemory contrastive loss
        loss._saved = f
        loss._params = f._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del imgs, f, loss
    print("epoch %d trained: PyTorch allocated %.2f GiB, reserved %.2f GiB"
          % (epoch, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
    sys.stdout.flush()


def main():
    model = ResNetIBN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3.5e-4, weight_decay=5e-4)   # Adam
    memory_features = None
    for epoch in range(50):
        features = extract_features(model, N_TRAIN)
        rerank_dist = compute_jaccard_distance(features, k1=30, k2=6)
        print("epoch %d: pseudo-labels done" % epoch)
        # DBSCAN on the CPU -> ~2,600 clusters; their centroids become the cluster memory
        memory_features = torch.empty(2600 * FEAT_DIM * 4, dtype=torch.uint8, device="cuda")
        train_epoch(model, optimizer, epoch, iters=4)


main()
sys.exit(0)
