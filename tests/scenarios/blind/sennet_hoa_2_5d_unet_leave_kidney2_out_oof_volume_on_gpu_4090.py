"""train_2p5d.py -- SenNet + HOA (Hacking the Human Vasculature in 3D) on a home RTX 4090 (24 GB): a 2.5D U-Net
(segmentation_models_pytorch Unet, seresnext50 encoder, 3 adjacent slices in, the middle slice's vessel mask
out), cross-validated leave-one-kidney-out.  The competition's metric is a 3D surface dice over the whole
volume, so after each fold's training the script predicts the held-out kidney slice by slice with 4-way
flip TTA and computes the metric on the GPU (a "fast surface dice in torch" notebook):

    def predict_volume(model, kidney):
        probs = []
        with torch.no_grad():
            for x in loader:                               # 8 slices a batch
                x = pad32(x.cuda())
                p = 0
                for f, inv in TTA:
                    p = p + inv(model(f(x))).sigmoid()
                probs.append((p[..., :H, :W] / len(TTA))[:, 0])
        return torch.cat(probs)                            # (D, H, W)

    vol = predict_volume(model, "kidney_2")
    score = surface_dice(vol > th, load_labels("kidney_2"))

Folds 0 and 1 held out kidney_3_sparse (1,035 slices of 1706 x 1510: 9.9 GiB of probabilities) and
kidney_1_dense (2,279 slices of 1303 x 912: 10.1 GiB), doubled by the cat: they fit, just. Fold 2 holds out
kidney_2: 2,217 slices of 1041 x 1511, float32: 13.0 GiB kept in the list `probs` on the GPU; the prediction
loop itself runs fine (the TTA batches are transient), then torch.cat asks for another 13.0 GiB for the
contiguous volume, on a card with 23.5 GiB usable.

An expert: the out-of-fold probabilities pile up on the GPU in float32 and are then copied once more.
Move each batch's probabilities off the GPU as they are produced (or write them into a preallocated
uint8/float16 volume, on the host), and run the metric on a volume that fits (or slab by slab).  Wrong first
advice: a smaller batch (the batch is transient; the list is what fills the card), inference_mode
(already under no_grad), gradient checkpointing or mixed precision for training (this is an evaluation
pass), expandable_segments or empty_cache (the 13 GiB are live, referenced by the list), a bigger GPU.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30

# ---------------------------------------------------------------------------------------------------------
# What the simulator's torch lacks, in the shape of the real API, defined as if in the real libraries' files
# (a failing stack then shows the frames it shows with PyTorch): host tensors (.cuda()), shapes, indexing (a
# view), elementwise ops, sigmoid, F.pad, torch.flip (a new tensor of the result's size), torch.cat; and
# segmentation_models_pytorch's Unet, whose forward makes its encoder and decoder features.
# ---------------------------------------------------------------------------------------------------------
def _as_library(path, src):
    ns = {"torch": torch, "nn": nn, "F": F, "__name__": os.path.splitext(os.path.basename(path))[0]}
    exec(compile(src, path, "exec"), ns)
    return ns


_t = _as_library(os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), r'''
def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _make(shape, dtype="float32", device="cuda"):
    t = torch.empty(_numel(shape), dtype=dtype, device=device)
    t.shape = tuple(shape)
    return t


class HostTensor(object):
    """A batch in host memory, as the DataLoader yields it."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype

    def cuda(self):
        return _make(self.shape, self.dtype)


def _getitem(self, idx):
    """x[..., :H, :W] / x[:, 0]: a view (same storage) with the indexed shape."""
    shape = list(self.shape)
    if not isinstance(idx, tuple):
        idx = (idx,)
    if idx and idx[0] is Ellipsis:
        rest = idx[1:]
        lead = shape[:len(shape) - len(rest)]
        tail = shape[len(shape) - len(rest):]
        new = lead + [k.stop if isinstance(k, slice) and k.stop is not None else d for k, d in zip(rest, tail)]
    else:
        new, i = [], 0
        for k in idx:
            if not isinstance(k, int):
                new.append(shape[i])
            i += 1
        new += shape[i:]
    v = self.view()
    v.shape = tuple(new)
    return v


def _result(a):
    """A new tensor of a's (possibly cropped-view) size: what an elementwise op returns."""
    return _make(a.shape)


def pad(input, pad, mode="constant", value=0.0):
    shape = list(input.shape)
    for i in range(len(pad) // 2):
        shape[-1 - i] += pad[2 * i] + pad[2 * i + 1]
    return _make(shape)


def cat(tensors, dim=0):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _make(shape)


torch.Tensor.__getitem__ = _getitem
torch.Tensor.__add__ = lambda a, b: _result(a)
torch.Tensor.__radd__ = lambda a, b: _result(a)
torch.Tensor.__truediv__ = lambda a, b: _result(a)
torch.Tensor.__gt__ = lambda a, b: _make(a.shape, "uint8")
torch.Tensor.sigmoid = lambda a: _result(a)
torch.Tensor.cuda = lambda a: a
torch.flip = lambda x, dims: _result(x)
torch.cat = cat
F.pad = pad
''')
HostTensor = _t["HostTensor"]

_smp = _as_library("/home/kaggler/miniconda3/envs/sennet/lib/python3.10/site-packages/segmentation_models_pytorch/"
                   "decoders/unet/model.py", r'''
_make = None


class Unet(nn.Module):
    """segmentation_models_pytorch.Unet(encoder_name="tu-seresnext50_32x4d", in_channels=3, classes=1)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = nn.Module()
        self.encoder.weight = nn.Parameter(torch.empty(25_510_896, dtype=torch.float32, device="cuda"))
        self.decoder = nn.Module()
        self.decoder.weight = nn.Parameter(torch.empty(9_137_264, dtype=torch.float32, device="cuda"))
        self.segmentation_head = nn.Module()
        self.segmentation_head.weight = nn.Parameter(torch.empty(145, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        b, c, h, w = x.shape
        self.encoder.weight, self.decoder.weight, self.segmentation_head.weight      # (autograd records them)
        feats = [_make((b, ch, h // s, w // s)) for ch, s in ((64, 2), (256, 4), (512, 8), (1024, 16), (2048, 32))]
        d = None
        for ch, s in ((256, 16), (128, 8), (64, 4), (32, 2), (16, 1)):
            d = _make((b, ch, h // s, w // s))
            if not torch.is_grad_enabled():
                feats.pop()
        out = _make((b, 1, h, w))
        out._saved = d
        return out
''')
_smp["_make"] = _t["_make"]
Unet = _smp["Unet"]


# ---------------------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------------------
KIDNEYS = {  # name: (slices, height, width)
    "kidney_1_dense": (2279, 1303, 912),
    "kidney_3_sparse": (1035, 1706, 1510),
    "kidney_2": (2217, 1041, 1511),
}
FOLDS = [("kidney_3_sparse", ["kidney_1_dense", "kidney_2"]), ("kidney_1_dense", ["kidney_2", "kidney_3_sparse"]),
         ("kidney_2", ["kidney_1_dense", "kidney_3_sparse"])]
BATCH = 8
TTA = [(lambda x: x, lambda y: y),
       (lambda x: torch.flip(x, dims=[-1]), lambda y: torch.flip(y, dims=[-1])),
       (lambda x: torch.flip(x, dims=[-2]), lambda y: torch.flip(y, dims=[-2])),
       (lambda x: torch.flip(x, dims=[-2, -1]), lambda y: torch.flip(y, dims=[-2, -1]))]


def slice_loader(kidney):
    d, h, w = KIDNEYS[kidney]
    for i in range(0, d, BATCH):
        yield HostTensor((min(BATCH, d - i), 3, h, w))     # 2.5D stacks, already normalised


def pad32(x):
    h, w = x.shape[-2:]
    return F.pad(x, (0, (w + 31) // 32 * 32 - w, 0, (h + 31) // 32 * 32 - h))


def predict_volume(model, kidney):
    _, H, W = KIDNEYS[kidney]
    model.eval()
    probs = []
    with torch.no_grad():
        for x in slice_loader(kidney):
            x = pad32(x.cuda())
            p = 0
            for f, inv in TTA:
                p = p + inv(model(f(x))).sigmoid()
            probs.append((p[..., :H, :W] / len(TTA))[:, 0])
    return torch.cat(probs)


def load_labels(kidney):
    return HostTensor(KIDNEYS[kidney], "uint8").cuda()          # the stacked label PNGs


def surface_dice(pred, label):
    return 0.0


def train_one_fold(model, optimizer, train_kidneys, steps=3):
    model.train()
    for step in range(steps):
        x = HostTensor((8, 3, 1024, 1024)).cuda()          # random 1024 crops, batch 8
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model(x)
        scen_truth.backward(y)
        optimizer.step()
        optimizer.zero_grad()


try:
    for fold, (valid_kidney, train_kidneys) in enumerate(FOLDS):
        model = Unet().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        train_one_fold(model, optimizer, train_kidneys)
        vol = predict_volume(model, valid_kidney)
        score = surface_dice(vol > 0.5, load_labels(valid_kidney))
        print("fold %d (%s): surface dice %.4f, %.1f GiB allocated" % (fold, valid_kidney, score,
                                                                      torch.cuda.memory_allocated() / GiB))
        del vol, model, optimizer
        torch.cuda.empty_cache()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
