"""train_pancreas.py -- a PhD student segments pancreas and pancreatic tumour in contrast CT with MONAI's
SwinUNETR (feature_size=48, 62M parameters) on the lab's RTX 3090 (24 GB).  The pipeline is copied from
MONAI's fast_training_tutorial, which on the Spleen task (41 volumes) caches the deterministic transforms
with CacheDataset and puts EnsureTyped(device="cuda") *before* the first random transform, "to avoid the
CPU -> GPU sync in every epoch":

    train_transforms = Compose([
        LoadImaged(keys=["image", "label"]), EnsureChannelFirstd(...), Orientationd(..., axcodes="RAS"),
        Spacingd(..., pixdim=(1.5, 1.5, 2.0)), ScaleIntensityRanged(..., a_min=-175, a_max=250),
        CropForegroundd(..., source_key="image"),
        EnsureTyped(keys=["image", "label"], device=device, track_meta=False),   # <- cached, on the GPU
        RandCropByPosNegLabeld(..., spatial_size=(96, 96, 96), num_samples=4), RandFlipd(...), ...])
    train_ds = CacheDataset(data=train_files, transform=train_transforms, cache_rate=1.0)
    train_loader = ThreadDataLoader(train_ds, num_workers=0, batch_size=1, shuffle=True)

With the tutorial's 41 spleen volumes that cache is 1.6 GB.  The student's training set is 340 portal-venous
CTs (the 281 of MSD Task07 plus 59 from the hospital), cropped to the body and resampled to 1.5x1.5x2.0 mm,
image and label both float32: about 41 MB a case, 13.9 GiB in all -- every cached volume is a CUDA tensor.
Caching goes through ("Loading dataset: 100%"), and the very first training iteration (4 patches of 96^3,
AMP) fails in SwinUNETR's forward pass, in the full-resolution decoder, with the 13.9 GiB of cached volumes
taking most of the card; the same model and batch train in about 11 GiB.

An expert: the dataset, not the model, fills the card -- the cache holds all 340 volumes on the GPU
(train_ds._cache, a Python list of dicts of CUDA tensors).  Keep the cache in host memory: move
EnsureTyped(device=...) after the random crops (or use ToDeviced in the loop), so that only the 4 patches of
a batch go to the GPU (or lower cache_rate / use PersistentDataset).  Wrong first advice: a smaller batch
(num_samples), gradient checkpointing (use_checkpoint=True) or AMP (already on) -- they shave the 11 GiB of
training while the 13.9 GiB of data stay and grow with the dataset; empty_cache or expandable_segments
(the volumes are live tensors, the cache holds no free memory worth speaking of); a bigger GPU.
"""
import random
import sys
from multiprocessing.pool import ThreadPool

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ------------------------------------------------------------------------------------------------
# The parts of MONAI this script uses, with MONAI's names and call shapes (the stand-in torch has no
# MONAI and no shapes: a host volume is a HostVolume, a CUDA tensor carries its shape as an attribute).
# ------------------------------------------------------------------------------------------------


class HostVolume(object):
    """A volume in host memory (numpy / MetaTensor on the CPU): shape (C, X, Y, Z), float32."""

    def __init__(self, shape):
        self.shape = tuple(shape)

    @property
    def nbytes(self):
        n = 4
        for d in self.shape:
            n *= d
        return n


class Transform(object):
    pass


class Randomizable(object):
    pass


class MapTransform(Transform):
    def __init__(self, keys, **kwargs):
        self.keys = list(keys)
        self.kwargs = kwargs


class LoadImaged(MapTransform):
    def __call__(self, d):
        d = dict(d)
        for k in self.keys:
            d[k] = HostVolume(d[k]["raw_shape"])            # nibabel reader, float32
            d[k].spacing = d["spacing"]
        return d


class EnsureChannelFirstd(MapTransform):
    def __call__(self, d):
        return d


class Orientationd(MapTransform):
    def __call__(self, d):
        return d


class Spacingd(MapTransform):
    def __call__(self, d):
        d = dict(d)
        px = self.kwargs["pixdim"]
        for k in self.keys:
            v = d[k]
            c, x, y, z = v.shape
            sx, sy, sz = v.spacing
            d[k] = HostVolume((c, int(x * sx / px[0]), int(y * sy / px[1]), int(z * sz / px[2])))
        return d


class ScaleIntensityRanged(MapTransform):
    def __call__(self, d):
        return d


class CropForegroundd(MapTransform):
    def __call__(self, d):
        d = dict(d)
        for k in self.keys:
            c, x, y, z = d[k].shape
            d[k] = HostVolume((c, int(x * 0.78), int(y * 0.62), z))     # the body, not the air around it
        return d


class EnsureTyped(MapTransform):
    """MONAI's EnsureTyped: converts to torch tensors, onto `device` when one is given."""

    def __call__(self, d):
        d = dict(d)
        device = self.kwargs.get("device")
        for k in self.keys:
            v = d[k]
            if device is not None and str(device).startswith("cuda"):
                t = torch.empty(v.nbytes, device=device)
                t.shape = v.shape
                d[k] = t
        return d


class RandCropByPosNegLabeld(Randomizable, MapTransform):
    def __call__(self, d):
        sx, sy, sz = self.kwargs["spatial_size"]
        out = []
        for _ in range(self.kwargs["num_samples"]):
            s = {}
            for k in self.keys:
                src = d[k]
                t = torch.empty(sx * sy * sz * 4, device=src.device)      # a crop of the cached volume, same device
                t.shape = (1, sx, sy, sz)
                s[k] = t
            out.append(s)
        return out


class RandFlipd(Randomizable, MapTransform):
    def __call__(self, d):
        return d


class RandRotate90d(Randomizable, MapTransform):
    def __call__(self, d):
        return d


class RandShiftIntensityd(Randomizable, MapTransform):
    def __call__(self, d):
        return d


class Compose(Transform):
    def __init__(self, transforms):
        self.transforms = list(transforms)


class CacheDataset(object):
    """MONAI's CacheDataset: the transforms up to the first Randomizable one run once, at construction,
    in a thread pool, and their results are kept in self._cache for the whole run."""

    def __init__(self, data, transform, cache_rate=1.0, num_workers=1):
        self.data = data
        self.transform = transform
        self.num_workers = num_workers
        n = int(len(data) * cache_rate)
        self._cache = self._fill_cache(list(range(n)))

    def _load_cache_item(self, idx):
        item = self.data[idx]
        for _xform in self.transform.transforms:
            if isinstance(_xform, Randomizable) or not isinstance(_xform, Transform):
                break
            item = _xform(item)
        return item

    def _fill_cache(self, indices):
        out = []
        with ThreadPool(self.num_workers) as p:
            for i, item in enumerate(p.imap(self._load_cache_item, indices)):
                out.append(item)
                if (i + 1) % 85 == 0 or i + 1 == len(indices):
                    print("Loading dataset: %3d%% %d/%d" % (100 * (i + 1) // len(indices), i + 1, len(indices)))
        return out

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        item = self._cache[i]
        start = False
        for _xform in self.transform.transforms:
            if not start and not isinstance(_xform, Randomizable):
                continue
            start = True
            item = _xform(item)
        return item


class ThreadDataLoader(object):
    def __init__(self, dataset, num_workers=0, batch_size=1, shuffle=True):
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle

    def __iter__(self):
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(0).shuffle(order)
        for i in order:
            samples = self.dataset[i]                      # num_samples crops of one volume
            batch = {}
            for k in ("image", "label"):
                t = torch.empty(sum(s[k].nbytes for s in samples))  # list_data_collate: torch.stack
                t.shape = (len(samples),) + samples[0][k].shape
                batch[k] = t
            del samples
            yield batch


# ---- the model and the loss (the stand-in computes nothing: each stage makes the tensors it would) ----

def _saved(out, tensors):
    """What autograd keeps for backward: only with autograd on, as PyTorch records a graph."""
    if torch.is_grad_enabled():
        out._saved = tuple(tensors)
    return out


class _Block(torch.nn.Module):
    """A stage of SwinUNETR: its weights, and the activations its forward keeps (count x bytes each at
    batch 4 x 96^3 under autocast)."""

    def __init__(self, param_bytes, acts):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(param_bytes, device="cuda"))
        self.acts = acts

    def forward(self, x):
        kept = []
        for count, nbytes in self.acts:
            for _ in range(count):
                kept.append(torch.empty(nbytes, device="cuda"))
        out = kept[-1]
        return _saved(out, kept[:-1] + [x])


class SwinUNETR(torch.nn.Module):
    def __init__(self, img_size, in_channels, out_channels, feature_size=48, use_checkpoint=False):
        torch.nn.Module.__init__(self)
        full = 4 * feature_size * 96 ** 3 * 2          # one fp16 tensor at 96^3, 48 channels, 4 patches: 340 MB
        half, quarter = full // 8 * 2, full // 64 * 4   # 48^3 (x2 channels), 24^3 (x4 channels)
        self.swinViT = _Block(27_000_000 * 4, [(40, half // 2), (28, quarter // 2), (20, quarter // 8)])
        self.encoder1 = _Block(250_000 * 4, [(6, full)])
        self.encoder2 = _Block(250_000 * 4, [(6, half // 2)])
        self.encoder3 = _Block(1_000_000 * 4, [(6, quarter // 2)])
        self.encoder4 = _Block(4_000_000 * 4, [(6, quarter // 8)])
        self.encoder10 = _Block(14_000_000 * 4, [(6, quarter // 32)])
        self.decoder5 = _Block(9_000_000 * 4, [(8, quarter // 8)])
        self.decoder4 = _Block(3_500_000 * 4, [(8, quarter // 2)])
        self.decoder3 = _Block(1_500_000 * 4, [(8, half)])
        self.decoder2 = _Block(600_000 * 4, [(8, half // 2), (2, full // 2)])
        self.decoder1 = _Block(300_000 * 4, [(4, full * 2), (6, full)])
        self.out = _Block(150 * 4, [(1, full // 16)])

    def forward(self, x_in):
        hidden = self.swinViT(x_in)
        enc0 = self.encoder1(x_in)
        enc1 = self.encoder2(hidden)
        enc2 = self.encoder3(hidden)
        enc3 = self.encoder4(hidden)
        dec4 = self.encoder10(hidden)
        dec3 = self.decoder5(dec4)
        dec2 = self.decoder4(dec3)
        dec1 = self.decoder3(dec2)
        dec0 = self.decoder2(dec1)
        out = self.decoder1(dec0)
        logits = self.out(out)
        return _saved(logits, [enc0, enc1, enc2, enc3, hidden, dec4, dec3, dec2, dec1, dec0, out])


class DiceCELoss(object):
    def __init__(self, to_onehot_y=True, softmax=True):
        pass

    def __call__(self, outputs, labels):
        probs = torch.empty(outputs.nbytes * 2, device="cuda")       # softmax and one-hot target, fp32
        loss = torch.empty(512, device="cuda")
        return _saved(torch._derive(loss, outputs), [probs, outputs])


# PyTorch frees the tensors a graph saved once backward has run through it (retain_graph=False); the
# stand-in's backward makes the gradients only, so this does the rest.
_plain_backward = torch.Tensor.backward


def _release_graph(t):
    todo = [t]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, torch.Tensor):
            s = x.__dict__.pop("_saved", None)
            if s is not None:
                todo.append(s)


def _backward(self, *args, **kwargs):
    _plain_backward(self, *args, **kwargs)
    _release_graph(self)


torch.Tensor.backward = _backward


# ------------------------------------------------------------------------------------------------
# train_pancreas.py
# ------------------------------------------------------------------------------------------------

def list_training_cases():
    """dataset_0.json's "training" list: 281 MSD Task07 cases and 59 from the hospital's PACS export."""
    rng = random.Random(7)
    files = []
    for i in range(340):
        inplane = rng.choice([0.68, 0.74, 0.78, 0.82, 0.88, 0.94])
        thick = rng.choice([2.5] * 5 + [1.25, 1.0, 3.0])
        slices = max(40, int(rng.gauss(300, 90) / thick))
        raw = {"raw_shape": (1, 512, 512, slices)}
        files.append({"image": raw, "label": raw, "spacing": (inplane, inplane, thick),
                      "name": "pancreas_%03d.nii.gz" % i})
    return files


device = "cuda:0"

train_transforms = Compose([
    LoadImaged(keys=["image", "label"]),
    EnsureChannelFirstd(keys=["image", "label"]),
    Orientationd(keys=["image", "label"], axcodes="RAS"),
    Spacingd(keys=["image", "label"], pixdim=(1.5, 1.5, 2.0), mode=("bilinear", "nearest")),
    ScaleIntensityRanged(keys=["image"], a_min=-175, a_max=250, b_min=0.0, b_max=1.0, clip=True),
    CropForegroundd(keys=["image", "label"], source_key="image"),
    # move the data to GPU and cache to avoid CPU -> GPU sync in every epoch
    EnsureTyped(keys=["image", "label"], device=device, track_meta=False),
    RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=(96, 96, 96), pos=1,
                           neg=1, num_samples=4, image_key="image", image_threshold=0),
    RandFlipd(keys=["image", "label"], spatial_axis=[0], prob=0.10),
    RandRotate90d(keys=["image", "label"], prob=0.10, max_k=3),
    RandShiftIntensityd(keys=["image"], offsets=0.10, prob=0.50),
])

try:
    train_ds = CacheDataset(data=list_training_cases(), transform=train_transforms, cache_rate=1.0)
    print("cached %d volumes, %.1f GiB allocated on cuda:0" % (len(train_ds), torch.cuda.memory_allocated() / 2 ** 30))
    train_loader = ThreadDataLoader(train_ds, num_workers=0, batch_size=1, shuffle=True)

    model = SwinUNETR(img_size=(96, 96, 96), in_channels=1, out_channels=3, feature_size=48).cuda()
    loss_function = DiceCELoss(to_onehot_y=True, softmax=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    scaler = torch.cuda.amp.GradScaler()

    max_epochs = 600
    for epoch in range(max_epochs):
        model.train()
        epoch_loss = 0
        for step, batch_data in enumerate(train_loader):
            inputs, labels = batch_data["image"], batch_data["label"]
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                outputs = model(inputs)
                loss = loss_function(outputs, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            epoch_loss += 0.5
            if step % 50 == 0:
                print("epoch %d step %d" % (epoch, step))
        print("epoch %d average loss %.4f" % (epoch, epoch_loss / (step + 1)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
