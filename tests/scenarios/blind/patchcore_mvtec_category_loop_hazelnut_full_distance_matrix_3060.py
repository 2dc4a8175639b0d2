"""bench_mvtec.py -- a quality-inspection engineer benchmarks their own PatchCore implementation (a port of
a popular GitHub re-implementation) on all 15 MVTec AD categories before trying it on the factory's parts,
on the workstation's RTX 3060 (12 GB).  One process, one category after another, a fresh model each:

    for category in CATEGORIES:                     # alphabetical
        model = PatchCore(backbone="wide_resnet50_2", layers=("layer2", "layer3"),
                          image_size=320, coreset_ratio=0.1).cuda()
        model.fit(train_loader(category))            # frozen backbone, torch.no_grad(), empty_cache() after
        results[category] = model.evaluate(test_loader(category), batch_size=16)
        del model; gc.collect(); torch.cuda.empty_cache()

Images are 320x320 (for the small scratches), so layer2's map is 40x40: 1600 patches of 1536 features per
image.  fit() collects every training patch and keeps a 10% greedy coreset as the memory bank (hazelnut:
391 train images -> 62,560 x 1536 float32, 367 MiB).  evaluate() embeds the test split (hazelnut: 1 GiB),
then scores 16 images at a time:

    def euclidean_dist(x, y):                        # x: 25,600 test patches, y: the memory bank
        x_norm = x.pow(2).sum(dim=-1, keepdim=True)
        y_norm = y.pow(2).sum(dim=-1, keepdim=True)
        res = x_norm - 2 * torch.matmul(x, y.transpose(-2, -1)) + y_norm.transpose(-2, -1)
        return res.clamp_min_(0).sqrt_()

The distance matrix is 25,600 x bank rows in float32, and the expression holds two of them at once.
bottle, cable, capsule, carpet and grid pass (carpet, 280 train images, peaks at 10.0 GiB); hazelnut has the
most training images of all (391), so its bank is the biggest and its first test batch needs 2 x 6.0 GiB:
`2 * torch.matmul(...)` asks for 6.0 GiB with 4.1 GiB free and nothing cached.  The earlier categories'
models are gone (each is deleted and the cache emptied; only the AUROC floats are kept): it is not a leak
of the loop, and nothing is fragmented.

An expert: one operation too large for the card, whose size is the test batch times the memory bank:
compute the nearest-neighbour distances in chunks of test patches (or of the bank) and keep only the
running minimum / top-k, or use faiss (as the original PatchCore does), which tiles the search; a smaller
test batch (8 or 4) is the quick fix, but the next larger training set (the factory's parts have 900
good images) brings it back.  Wrong first advice: freeing references or empty_cache between categories
(already done, nothing is left over), expandable_segments (there is no 6 GiB anywhere), inference mode
(already under no_grad), gradient checkpointing, a bigger GPU.
"""
import gc
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
CATEGORIES = ["bottle", "cable", "capsule", "carpet", "grid", "hazelnut", "leather", "metal_nut", "pill",
              "screw", "tile", "toothbrush", "transistor", "wood", "zipper"]
TRAIN_IMAGES = {"bottle": 209, "cable": 224, "capsule": 219, "carpet": 280, "grid": 264, "hazelnut": 391,
                "leather": 245, "metal_nut": 220, "pill": 267, "screw": 320, "tile": 230, "toothbrush": 60,
                "transistor": 213, "wood": 247, "zipper": 240}
TEST_IMAGES = {"bottle": 83, "cable": 150, "capsule": 132, "carpet": 117, "grid": 78, "hazelnut": 110,
               "leather": 124, "metal_nut": 115, "pill": 167, "screw": 160, "tile": 117, "toothbrush": 42,
               "transistor": 100, "wood": 79, "zipper": 151}
IMAGE_SIZE = 320
PATCHES = (IMAGE_SIZE // 8) ** 2          # layer2 stride 8: 40 x 40
FEAT = 512 + 1024                          # layer2 + upsampled layer3


class WideResNet50Features(torch.nn.Module):
    """timm.create_model("wide_resnet50_2", features_only=True, out_indices=(2, 3)): stem, layer1-3, frozen."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(24_900_000 * 4, device="cuda"), requires_grad=False)

    def forward(self, images, batch):
        hw = IMAGE_SIZE * IMAGE_SIZE
        stem = torch.empty(batch * 64 * hw // 4 * 4, dtype=torch.uint8, device="cuda")
        layer1 = torch.empty(batch * 256 * hw // 16 * 4, dtype=torch.uint8, device="cuda")
        del stem
        layer2 = torch.empty(batch * 512 * hw // 64 * 4, dtype=torch.uint8, device="cuda")
        del layer1
        layer3 = torch.empty(batch * 1024 * hw // 256 * 4, dtype=torch.uint8, device="cuda")
        return layer2, layer3


class PatchCore(torch.nn.Module):
    def __init__(self, coreset_ratio=0.1):
        torch.nn.Module.__init__(self)
        self.feature_extractor = WideResNet50Features()
        self.coreset_ratio = coreset_ratio
        self.register_buffer("memory_bank", None)

    def embed(self, images, batch):
        layer2, layer3 = self.feature_extractor(images, batch)
        up3 = torch.empty(batch * 1024 * PATCHES * 4, dtype=torch.uint8, device="cuda")   # interpolate to 40x40
        emb = torch.empty(batch * FEAT * PATCHES * 4, dtype=torch.uint8, device="cuda")   # avgpool 3x3 + cat
        del layer2, layer3, up3
        return emb                                                   # (batch * 1600, 1536)

    def fit(self, loader):
        with torch.no_grad():
            return self._fit(loader)

    def _fit(self, loader):
        feats = [self.embed(images, b) for images, b in loader]
        embedding = torch.empty(sum(f.nbytes for f in feats), dtype=torch.uint8, device="cuda")   # torch.cat
        del feats
        n = embedding.nbytes // (FEAT * 4)
        projected = torch.empty(n * 128 * 4, dtype=torch.uint8, device="cuda")    # sparse random projection
        min_dist = torch.empty(n * 4, dtype=torch.uint8, device="cuda")           # k-center greedy
        keep = int(n * self.coreset_ratio)
        self.memory_bank = torch.empty(keep * FEAT * 4, dtype=torch.uint8, device="cuda")   # embedding[idxs]
        del projected, min_dist, embedding
        torch.cuda.empty_cache()
        return keep

    def euclidean_dist(self, x, y, n):
        m = y.nbytes // (FEAT * 4)
        x_norm = torch.empty(n * 4, dtype=torch.uint8, device="cuda")
        y_norm = torch.empty(m * 4, dtype=torch.uint8, device="cuda")
        res = x_norm - 2 * matmul(x, y, n, m) + y_norm
        return res

    def evaluate(self, loader, batch_size=16):
        with torch.no_grad():
            return self._evaluate(loader, batch_size)

    def _evaluate(self, loader, batch_size):
        batches = list(loader)
        n_images = sum(b for _, b in batches)
        test_emb = torch.empty(n_images * PATCHES * FEAT * 4, dtype=torch.uint8, device="cuda")   # torch.cat
        for images, b in batches:
            emb = self.embed(images, b)
            del emb                                   # copied into test_emb
        del batches
        image_scores = []
        for start in range(0, n_images, batch_size):
            b = min(batch_size, n_images - start)
            emb = test_emb.view()                     # test_emb[start * 1600:(start + b) * 1600]
            dist = self.euclidean_dist(emb, self.memory_bank, b * PATCHES)
            patch_scores = torch.empty(b * PATCHES * 4, dtype=torch.uint8, device="cuda")   # dist.topk(1, largest=False)
            del dist
            image_scores.append(torch.empty(b * 4, dtype=torch.uint8, device="cuda"))      # amax over patches
        return 0.98


class _DistMatrix(object):
    """What `torch.matmul(x, y.T)` and the elementwise ops after it make: N x M float32 matrices, each a new
    tensor (the previous one is freed once the next exists)."""

    def __init__(self, n, m):
        self.n, self.m = n, m
        self.t = torch.empty(n * m * 4, dtype=torch.uint8, device="cuda")

    def _new(self):
        out = _DistMatrix.__new__(_DistMatrix)
        out.n, out.m = self.n, self.m
        out.t = torch.empty(self.n * self.m * 4, dtype=torch.uint8, device="cuda")
        return out

    def __rmul__(self, k):
        return self._new()

    def __rsub__(self, other):
        return self._new()

    def __add__(self, other):
        return self._new()

    @property
    def nbytes(self):
        return self.t.nbytes


def matmul(x, y, n, m):
    return _DistMatrix(n, m)


def loader(n_images, batch_size):
    for start in range(0, n_images, batch_size):
        b = min(batch_size, n_images - start)
        yield torch.empty(b * 3 * IMAGE_SIZE * IMAGE_SIZE * 4, dtype=torch.uint8, device="cuda"), b


try:
    results = {}
    for category in CATEGORIES:
        model = PatchCore(coreset_ratio=0.1).cuda().eval()
        bank = model.fit(loader(TRAIN_IMAGES[category], 32))
        torch.cuda.reset_peak_memory_stats()
        results[category] = model.evaluate(loader(TEST_IMAGES[category], 32), batch_size=16)
        print("%-10s bank %6d x %d  test peak %.2f GiB  allocated after %.2f GiB" % (
            category, bank, FEAT, torch.cuda.max_memory_allocated() / GiB, torch.cuda.memory_allocated() / GiB))
        del model
        gc.collect()
        torch.cuda.empty_cache()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
