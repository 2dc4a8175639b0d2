"""quantify_nuclei.py -- a pathology core facility's nuclei census for a colorectal cancer cohort: for
each H&E whole-slide image (Aperio .svs, 40x), find the tissue pieces on a thumbnail, read each piece's
bounding box at level 0 with cuCIM straight into GPU memory, Macenko-normalize it on the GPU with
cuCIM's normalize_colors_pca (CuPy underneath), then run HoVer-Net (PanNuke weights, PyTorch, fp32,
batch 32 tiles of 256x256, inference_mode) over the normalized region and count nuclei per class.
One NVIDIA L4 (24 GB, 22.5 GiB usable) on the facility's analysis server; regions are capped at
20480 px a side "to stay within GPU memory".

    region = slide.read_region(location=(x0, y0), size=(w, h), level=0, device="cuda")
    norm = normalize_colors_pca(cp.asarray(region), channel_axis=2, image_type="intensity")
    for batch in tile_batches(norm, 256, 32):
        with torch.inference_mode():
            out = model(torch.as_tensor(batch, device="cuda").permute(0, 3, 1, 2).float() / 255)

A pilot on needle biopsies (pieces of a few thousand pixels) ran clean.  The production run starts
with the surgical resections, and the first one has a tissue piece that hits the 20480 x 20480 cap:
the Macenko step on it -- float32 optical densities, the tissue-pixel subset, stain concentrations,
the reconstruction -- takes the CuPy memory pool to 13.8 GiB.  Those arrays are all freed when
normalize_colors_pca returns, but freed CuPy memory goes back to CuPy's pool, not to the driver: the
pool keeps its 13.8 GiB reserved, of which only the normalized uint8 region (1.2 GiB) is in use.
HoVer-Net then gets the ~8.7 GiB left; its first batch needs 10.2 GiB at its peak, in the first
residual stage (256 channels at the full 256x256 resolution: 2 GiB a feature map for 32 tiles), and
fails there on a 2 GiB request.  PyTorch releases its own free segments and retries, to no avail: its
cache (1.5 GiB, in segments still partly in use) is not where the memory is.

An expert: another framework in the same process holds the memory -- CuPy's pool, 12.7 GiB of it
idle.  Give it back after the stain normalization (cp.get_default_memory_pool().free_all_blocks() once
normalize_colors_pca has returned), or cap the pool (set_limit), or better make CuPy allocate from
PyTorch's caching allocator so the two share one cache (freeing CuPy's pool alone fixes this slide;
on the next one PyTorch's 10 GiB cache squeezes the CuPy step in turn, unless torch.cuda.empty_cache()
runs at that hand-over too).  Normalizing the region in strips would also lower the pool's high-water
mark.  Wrong first advice: a smaller HoVer-Net batch or fp16 (the model's share is what it should be;
12.7 GiB sit idle in CuPy's pool), torch.cuda.empty_cache() or expandable_segments alone (PyTorch's
own cache is not the problem; they do not touch CuPy's pool), inference_mode (already on), looking
for other processes (there are none), a bigger GPU.
"""
import sys

import cupy as cp
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file:
# BatchNorm2d and ReLU, elementwise ops, torch.as_tensor of a CuPy array (zero-copy in PyTorch; the
# stand-in copies the 6 MB batch), and convolutions that save nothing while autograd is off.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _new(nbytes, like, *inputs):
    out = torch.empty(nbytes, device=like.device)
    if torch.is_grad_enabled():
        out._saved = tuple(inputs)
        return derive(out, *inputs)
    return out

def _conv2d_forward(self, input):
    out = self._conv_forward(input, self.weight, self.bias)
    if not torch.is_grad_enabled():
        out._saved = None
        out._params = ()
    return out

class BatchNorm2d(Module):
    def __init__(self, num_features, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))
    def forward(self, input):
        return _new(input.nbytes, input, input)

class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

def add(a, b):
    return _new(a.nbytes, a, a, b)

def as_tensor(array, device=None):
    return torch.empty(array.nbytes, device=device)

def to_float(t):
    return _new(t.nbytes * 4, t, t)

def upsample2x(t):
    return _new(t.nbytes * 4, t, t)
'''
_ns = {"torch": torch}
exec("from torch.nn.modules.module import Module\nfrom torch.nn.parameter import Parameter", _ns)
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv2d.forward = _ns["_conv2d_forward"]
nn.BatchNorm2d, nn.ReLU = _ns["BatchNorm2d"], _ns["ReLU"]
torch.as_tensor = _ns["as_tensor"]
T_add, T_float, T_up2 = _ns["add"], _ns["to_float"], _ns["upsample2x"]

# --- stand-ins for cuCIM (same names and call shapes as cucim's), on the stand-in CuPy: every array is
# memory from CuPy's default pool, freed back to the pool when it goes away.
_CUCIM = r'''
class CuImage(object):
    """cucim.CuImage: a whole-slide image; read_region(..., device="cuda") decodes into GPU memory."""
    def __init__(self, path):
        self.path = path
    def read_region(self, location=(0, 0), size=(256, 256), level=0, device="cpu"):
        return cp.empty((size[1], size[0], 3), dtype="uint8")


def normalize_colors_pca(image, source_intensity=240.0, alpha=1.0, beta=0.345,
                         ref_stain_coeff=((0.5626, 0.2159), (0.7201, 0.8012), (0.4062, 0.5581)),
                         ref_max_conc=(1.9705, 1.0308), image_type="intensity", channel_axis=0):
    """cucim.core.operations.color.normalize_colors_pca (Macenko): the arrays its steps make, float32."""
    h, w = image.shape[0], image.shape[1]
    n = h * w
    img = cp.empty((n, 3), dtype="float32")                  # image.astype(float32)
    od = cp.empty((n, 3), dtype="float32")                   # -log((img + 1) / source_intensity)
    del img
    tissue = cp.empty((n,), dtype="uint8")                   # any(od > beta, axis=1)
    od_hat = cp.empty((n * 7 // 10, 3), dtype="float32")     # od[tissue]: ~70 % tissue in a resection box
    del tissue
    that = cp.empty((n * 7 // 10, 2), dtype="float32")       # od_hat @ eigvecs[:, 1:3]
    phi = cp.empty((n * 7 // 10,), dtype="float32")          # arctan2(that[:, 1], that[:, 0])
    del that, phi, od_hat
    conc = cp.empty((2, n), dtype="float32")                 # lstsq(stain_coeff, od.T)
    del od
    max_conc = cp.empty((2, n), dtype="float32")             # percentile(conc, 99, axis=1): a sorted copy
    del max_conc
    conc2 = cp.empty((2, n), dtype="float32")                # conc / max_conc * ref_max_conc
    del conc
    recon = cp.empty((n, 3), dtype="float32")                # ref_stain_coeff @ conc2
    del conc2
    out_f = cp.empty((n, 3), dtype="float32")                # source_intensity * exp(-recon)
    del recon
    out = cp.empty((h, w, 3), dtype="uint8")                 # clip(0, 255).astype(uint8)
    del out_f
    return out
'''
_cp_ns = {}
exec(compile("def asarray(a, dtype=None):\n    return a\n", cp.__file__, "exec"), _cp_ns)
cp.asarray = _cp_ns["asarray"]          # cupy.asarray of a CuPy-compatible device array: no copy
_cucim_ns = {"cp": cp}
exec(compile(_CUCIM, "/usr/local/lib/python3.10/dist-packages/cucim/core/operations/color/stain_normalizer.py",
             "exec"), _cucim_ns)
CuImage, normalize_colors_pca = _cucim_ns["CuImage"], _cucim_ns["normalize_colors_pca"]


# --- HoVer-Net (Graham et al. 2019, the PanNuke "fast" model): a pre-activated ResNet-50 encoder whose
# first stage runs at the input's full resolution, and three decoder branches (NP, HV, TP).
class ResidualUnit(nn.Module):
    def __init__(self, cin, cmid, cout, stride=1):
        nn.Module.__init__(self)
        self.preact_bn = nn.BatchNorm2d(cin, device="cuda")
        self.conv1 = nn.Conv2d(cin, cmid, 1, device="cuda")
        self.conv1_bn = nn.BatchNorm2d(cmid, device="cuda")
        self.conv2 = nn.Conv2d(cmid, cmid, 3, stride=stride, device="cuda")
        self.conv2_bn = nn.BatchNorm2d(cmid, device="cuda")
        self.conv3 = nn.Conv2d(cmid, cout, 1, device="cuda")
        self.shortcut = nn.Conv2d(cin, cout, 1, stride=stride, device="cuda") if (cin != cout or stride != 1) else None
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        pre = self.relu(self.preact_bn(x))
        y = self.conv3(self.relu(self.conv2_bn(self.conv2(self.relu(self.conv1_bn(self.conv1(pre)))))))
        short = self.shortcut(pre) if self.shortcut is not None else x
        return T_add(y, short)


class ResidualBlock(nn.Module):
    def __init__(self, cin, cmid, cout, count, stride):
        nn.Module.__init__(self)
        self.units = [ResidualUnit(cin if i == 0 else cout, cmid, cout, stride if i == 0 else 1) for i in range(count)]
        for i, u in enumerate(self.units):
            setattr(self, "unit_%d" % i, u)

    def forward(self, x):
        for u in self.units:
            x = u(x)
        return x


class DecoderBranch(nn.Module):
    def __init__(self, out_ch):
        nn.Module.__init__(self)
        self.u3 = nn.Conv2d(1024, 256, 5, device="cuda")
        self.u2 = nn.Conv2d(512, 128, 5, device="cuda")
        self.u1 = nn.Conv2d(256, 64, 5, device="cuda")
        self.u0 = nn.Conv2d(64, out_ch, 1, device="cuda")

    def forward(self, feats):
        d0, d1, d2, d3 = feats
        x = T_add(self.u3(T_up2(d3)), d2)
        x = T_add(self.u2(T_up2(x)), d1)
        x = T_add(self.u1(T_up2(x)), d0)
        return self.u0(x)


class HoVerNet(nn.Module):
    def __init__(self, nr_types=6):
        nn.Module.__init__(self)
        self.conv0 = nn.Conv2d(3, 64, 7, device="cuda")
        self.conv0_bn = nn.BatchNorm2d(64, device="cuda")
        self.d0 = ResidualBlock(64, 64, 256, 3, 1)
        self.d1 = ResidualBlock(256, 128, 512, 4, 2)
        self.d2 = ResidualBlock(512, 256, 1024, 6, 2)
        self.d3 = ResidualBlock(1024, 512, 2048, 3, 2)
        self.conv_bot = nn.Conv2d(2048, 1024, 1, device="cuda")
        self.np_branch, self.hv_branch, self.tp_branch = DecoderBranch(2), DecoderBranch(2), DecoderBranch(nr_types)

    def forward(self, imgs):
        d0 = self.d0(self.conv0_bn(self.conv0(imgs)))
        d1 = self.d1(d0)
        d2 = self.d2(d1)
        d3 = self.conv_bot(self.d3(d2))
        feats = (d0, d1, d2, d3)
        return {"np": self.np_branch(feats), "hv": self.hv_branch(feats), "tp": self.tp_branch(feats)}


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
TILE, BATCH, MAX_REGION = 256, 32, 20480


def tissue_pieces(slide_id):
    """bounding boxes of the tissue pieces at level 0 (from an Otsu mask of the thumbnail)"""
    if slide_id.startswith("BX"):                     # needle biopsies: thin cores
        return [(0, 0, 2600, 11800), (4000, 0, 2400, 9800)]
    return [(0, 0, 38000, 29500)]                      # a resection: one large piece


def tile_batches(region, tile, batch):
    h, w = region.shape[0], region.shape[1]
    n_tiles = (h // tile) * (w // tile)
    for start in range(0, n_tiles, batch):
        yield cp.empty((min(batch, n_tiles - start), tile, tile, 3), dtype="uint8")


model = HoVerNet(nr_types=6)
model.eval()
counts = {}

slides = ["RS-0107", "RS-0111", "BX-0412", "BX-0413", "RS-0118", "BX-0419"]
try:
    for slide_id in slides:
        slide = CuImage("/data/crc_cohort/%s.svs" % slide_id)
        n_nuclei = 0
        for (x0, y0, w, h) in tissue_pieces(slide_id):
            w, h = min(w, MAX_REGION), min(h, MAX_REGION)
            region = slide.read_region(location=(x0, y0), size=(w, h), level=0, device="cuda")
            norm = normalize_colors_pca(cp.asarray(region), channel_axis=2, image_type="intensity")
            del region
            for batch in tile_batches(norm, TILE, BATCH):
                with torch.inference_mode():
                    imgs = T_float(torch.as_tensor(batch, device="cuda"))    # .permute(0, 3, 1, 2).float() / 255
                    out = model(imgs)
                    n_nuclei += 1                      # instance post-processing on out["np"], out["hv"]
                del batch, imgs, out
            del norm
        counts[slide_id] = n_nuclei
        print("%s: pool %.1f GiB (used %.1f GiB), torch reserved %.1f GiB" % (
            slide_id, cp.get_default_memory_pool().total_bytes() / 2 ** 30,
            cp.get_default_memory_pool().used_bytes() / 2 ** 30, torch.cuda.memory_reserved() / 2 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
