"""train_kits_dynunet.py -- a urology research group's first kidney/tumour segmentation model on KiTS19
(210 contrast CTs with labels; 5-fold split: 168 training, 42 validation cases), a MONAI DynUNet
(nnU-Net's 3d_fullres layout: filters 32..320, six stages, instance norm, deep supervision), trained on
one AWS g5.2xlarge (A10G, 24 GB, 22.5 GiB usable).

The data pipeline is copied from MONAI's "fast training" tutorial, which caches the deterministic part
of the transform chain *on the GPU* and runs the random crops there (ThreadDataLoader, no workers):

    train_transforms = Compose([
        LoadImaged(keys=["image", "label"]), EnsureChannelFirstd(...), Orientationd(..., axcodes="RAS"),
        Spacingd(..., pixdim=(1.2, 1.2, 2.0), mode=("bilinear", "nearest")),
        ScaleIntensityRanged("image", a_min=-79, a_max=304, b_min=0.0, b_max=1.0, clip=True),
        CropForegroundd(keys=["image", "label"], source_key="image"),
        EnsureTyped(keys=["image", "label"]),
        ToDeviced(keys=["image", "label"], device="cuda:0"),       # <- from the tutorial
        RandCropByPosNegLabeld(..., spatial_size=(128, 128, 128), num_samples=2),
        ...])
    train_ds = CacheDataset(data=train_files, transform=train_transforms, cache_rate=1.0, num_workers=8)
    val_ds = CacheDataset(data=val_files, transform=val_transforms, cache_rate=1.0, num_workers=4)

The tutorial's spleen task has 32 small training volumes; KiTS19 has 168 training and 42 validation
volumes, each (after spacing and the body crop, about 280 x 220 x 160 voxels) an image and a label,
both float32 as LoadImaged returns them: ~79 MB a case, 15.4 GiB for the two caches, all of it live on
the A10G for the whole run.  Building the caches works (15.4 of 22.5 GiB).  The first training step
then needs ~7.7 GiB at its peak (batch 2 x 2 crops of 128^3, fp16 autocast, deep supervision): it dies
in the first forward pass of the first iteration, in the first convolution of the decoder's
full-resolution stage (a 512 MiB fp16 feature map), with 15.4 GiB of the card held by the two
CacheDatasets.  Nothing is fragmented (0.3 GiB cached), nothing leaked: the datasets are live and the
forward pass is what the model needs.  Without ToDeviced the same run peaks at 7.7 GiB.

An expert: the datasets sit on the GPU -- the tutorial's ToDeviced-before-the-random-crop trick only
pays off when the whole cohort fits beside training.  Keep the cache in host memory (drop ToDeviced from
the cached part, or move it after RandCropByPosNegLabeld so only the crops go to the GPU; or move each
batch in the loop), or cache on the GPU only a bounded part (cache_rate, or keep the validation set
off the GPU).  That frees 15.4 GiB and the step needs 7.7.  Wrong first advice: a smaller batch or fewer
crops (it would squeeze this run in -- 7.7 GiB becomes ~4 -- at the price of the training recipe,
while 15.4 GiB of data stay pinned and the next, larger cohort fails again), gradient checkpointing
(the same trade), mixed precision (already fp16 autocast), expandable_segments or empty_cache (nothing
is cached-but-unused: the dataset tensors are referenced), a bigger GPU (the cohort grows with
KiTS21/23).
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file
# (so its frames count as the framework's, as the C++ kernels would): Tensor.to/.half under autocast,
# torch.cat, ConvTranspose3d, InstanceNorm3d, LeakyReLU, and a Tensor.backward that frees what the graph
# saved.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _half(t):
    if t.dtype == "float16":
        return t
    out = torch.empty(t.nbytes // 4, dtype="float16", device=t.device)     # elements of 2 bytes
    out._saved = t
    return derive(out, t)

def cat(tensors, dim=0):
    out = torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    out._dtype = tensors[0].dtype
    out._saved = tuple(tensors)
    return derive(out, *tensors)

def _conv3d_autocast(self, input):
    if torch.is_autocast_enabled():
        input = _half(input)
        out = self._conv_forward(input, self.weight, self.bias)
        out._dtype = "float16"
        return out
    return self._conv_forward(input, self.weight, self.bias)

class ConvTranspose3d(_ConvNd):
    _dims = 3
    def forward(self, input):
        if torch.is_autocast_enabled():
            input = _half(input)
        out = torch.empty(input.nbytes * self.out_channels // self.in_channels * self.stride ** 3,
                          device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return derive(out, input)

class InstanceNorm3d(Module):
    def __init__(self, num_features, affine=True, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))
    def forward(self, input):
        out = torch.empty(input.nbytes, device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return derive(out, input)

class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

_engine_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward; then, unless retain_graph, what autograd saved for it is released."""
    _engine_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        saved = t.__dict__.get("_saved")
        if saved is None:
            continue
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if isinstance(x, torch.Tensor))

def _loss_like(*inputs):
    out = torch.empty(512, device=inputs[0].device)
    out._saved = tuple(inputs)
    return derive(out, *inputs)
'''
_ns = {"torch": torch}
exec("from torch.nn.modules.conv import _ConvNd\nfrom torch.nn.modules.module import Module\n"
     "from torch.nn.parameter import Parameter", _ns)
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.cat = _ns["cat"]
torch.Tensor.backward = _ns["_backward"]
torch.nn.Conv3d.forward = _ns["_conv3d_autocast"]
nn.ConvTranspose3d, nn.InstanceNorm3d, nn.LeakyReLU = _ns["ConvTranspose3d"], _ns["InstanceNorm3d"], _ns["LeakyReLU"]


# --- stand-ins for the MONAI classes the script uses (same names and call shapes as MONAI's), as far as
# memory goes: a volume is a byte count; host arrays are plain objects, device ones torch tensors.
class HostArray(object):
    """A numpy array / MetaTensor on the CPU: only its size."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


class LoadImaged(object):
    def __init__(self, keys):
        self.keys = keys

    def __call__(self, d):
        # the sizes after Orientationd/Spacingd/CropForegroundd, float32 for image and label alike
        return {k: HostArray(d["voxels"] * 4) for k in self.keys}


class ToDeviced(object):
    def __init__(self, keys, device):
        self.keys, self.device = keys, device

    def __call__(self, d):
        return {k: torch.empty(v.nbytes, device=self.device) if isinstance(v, HostArray) else v
                for k, v in d.items()}


class RandCropByPosNegLabeld(object):
    is_random = True

    def __init__(self, keys, label_key, spatial_size, pos=1, neg=1, num_samples=1):
        self.keys, self.spatial_size, self.num_samples = keys, spatial_size, num_samples

    def __call__(self, d):
        vox = self.spatial_size[0] * self.spatial_size[1] * self.spatial_size[2]
        out = []
        for _ in range(self.num_samples):
            out.append({k: (torch.empty(vox * 4, device=d[k].device) if isinstance(d[k], torch.Tensor)
                            else HostArray(vox * 4)) for k in self.keys})
        return out


class Compose(object):
    def __init__(self, transforms):
        self.transforms = transforms

    def deterministic(self, d):
        for t in self.transforms:
            if getattr(t, "is_random", False):
                break
            d = t(d)
        return d

    def random_part(self, d):
        started = False
        for t in self.transforms:
            started = started or getattr(t, "is_random", False)
            if started:
                d = t(d)
        return d


class CacheDataset(object):
    """monai.data.CacheDataset: runs the transforms up to the first random one once per item at
    construction and keeps the results in self._cache; __getitem__ runs the random rest on them."""

    def __init__(self, data, transform, cache_rate=1.0, num_workers=1):
        self.data, self.transform = data, transform
        n = int(len(data) * cache_rate)
        self._cache = self._fill_cache(n)

    def _fill_cache(self, n):
        cache = []
        for i in range(n):
            cache.append(self.transform.deterministic(dict(self.data[i])))
        return cache

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        item = self._cache[i] if i < len(self._cache) else self.transform.deterministic(dict(self.data[i]))
        return self.transform.random_part(dict(item))


class ThreadDataLoader(object):
    def __init__(self, dataset, batch_size=1, shuffle=False, num_workers=0):
        self.ds, self.bs, self.shuffle = dataset, batch_size, shuffle

    def __iter__(self):
        order = list(range(len(self.ds)))
        if self.shuffle:
            random.Random(0).shuffle(order)
        for s in range(0, len(order) - self.bs + 1, self.bs):
            samples = []
            for i in order[s:s + self.bs]:
                samples.extend(self.ds[i])
            # list_data_collate: the crops stacked into one batch tensor per key, on their device
            yield {k: torch.empty(sum(x[k].nbytes for x in samples), device="cuda") for k in ("image", "label")}


class UnetBasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.norm1 = nn.InstanceNorm3d(cout, device="cuda")
        self.conv2 = nn.Conv3d(cout, cout, 3, device="cuda")
        self.norm2 = nn.InstanceNorm3d(cout, device="cuda")
        self.lrelu = nn.LeakyReLU(0.01, inplace=True)

    def forward(self, x):
        x = self.lrelu(self.norm1(self.conv1(x)))
        return self.lrelu(self.norm2(self.conv2(x)))


class UnetUpBlock(nn.Module):
    def __init__(self, cin, cout, up):
        nn.Module.__init__(self)
        self.transp_conv = nn.ConvTranspose3d(cin, cout, up, stride=up, device="cuda")
        self.conv_block = UnetBasicBlock(cout * 2, cout)

    def forward(self, x, skip):
        up = self.transp_conv(x)
        return self.conv_block(torch.cat((up, skip), dim=1))


class DynUNet(nn.Module):
    """monai.networks.nets.DynUNet(spatial_dims=3, in_channels=1, out_channels=3, kernel_size, strides,
    upsample_kernel_size, filters, norm_name="instance", deep_supervision=True, deep_supr_num=2)."""

    def __init__(self, in_channels, out_channels, strides, filters, deep_supr_num=2):
        nn.Module.__init__(self)
        self.input_block = UnetBasicBlock(in_channels, filters[0], strides[0])
        self.downsamples = [UnetBasicBlock(filters[i - 1], filters[i], strides[i]) for i in range(1, len(filters) - 1)]
        for i, m in enumerate(self.downsamples):
            setattr(self, "down_%d" % i, m)
        self.bottleneck = UnetBasicBlock(filters[-2], filters[-1], strides[-1])
        self.upsamples = [UnetUpBlock(filters[i + 1], filters[i], strides[i + 1]) for i in reversed(range(len(filters) - 1))]
        for i, m in enumerate(self.upsamples):
            setattr(self, "up_%d" % i, m)
        self.output_block = nn.Conv3d(filters[0], out_channels, 1, device="cuda")
        self.deep_supervision_heads = [nn.Conv3d(filters[i], out_channels, 1, device="cuda") for i in (1, 2)][:deep_supr_num]
        for i, m in enumerate(self.deep_supervision_heads):
            setattr(self, "ds_head_%d" % i, m)

    def forward(self, x):
        skips = [self.input_block(x)]
        for down in self.downsamples:
            skips.append(down(skips[-1]))
        out = self.bottleneck(skips[-1])
        feats = []
        for up, skip in zip(self.upsamples, reversed(skips)):
            out = up(out, skip)
            feats.append(out)
        heads = [self.output_block(feats[-1])] + [h(f) for h, f in zip(self.deep_supervision_heads, (feats[-2], feats[-3]))]
        return heads


class DeepSupervisionLoss(object):
    """monai.losses.DeepSupervisionLoss(DiceCELoss(to_onehot_y=True, softmax=True))."""

    def __call__(self, outputs, target):
        return _ns["_loss_like"](*outputs)


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
def kits19_files(fold=0):
    rng = random.Random(19)
    cases = []
    for i in range(210):
        # after Spacingd(1.2, 1.2, 2.0) and CropForegroundd: about 280 x 220 x 160 voxels, by patient
        x, y = rng.randint(250, 310), rng.randint(190, 250)
        z = rng.randint(120, 200)
        cases.append({"image": "kits19/case_%05d/imaging.nii.gz" % i,
                      "label": "kits19/case_%05d/segmentation.nii.gz" % i, "voxels": x * y * z})
    val = cases[fold::5]
    train = [c for c in cases if c not in val]
    return train, val


train_files, val_files = kits19_files(fold=0)

deterministic = [LoadImaged(keys=["image", "label"]),
                 # EnsureChannelFirstd, Orientationd, Spacingd, ScaleIntensityRanged, CropForegroundd, EnsureTyped
                 ToDeviced(keys=["image", "label"], device="cuda:0")]
train_transforms = Compose(deterministic + [
    RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=(128, 128, 128),
                           pos=1, neg=1, num_samples=2),
    # RandFlipd, RandRotate90d, RandScaleIntensityd, RandShiftIntensityd: in place, on the GPU
])
val_transforms = Compose(list(deterministic))

train_ds = CacheDataset(data=train_files, transform=train_transforms, cache_rate=1.0, num_workers=8)
val_ds = CacheDataset(data=val_files, transform=val_transforms, cache_rate=1.0, num_workers=4)
train_loader = ThreadDataLoader(train_ds, batch_size=2, shuffle=True, num_workers=0)
print("cached %d + %d volumes; allocated %.1f GiB" % (len(train_ds._cache), len(val_ds._cache),
                                                     torch.cuda.memory_allocated() / 2 ** 30))

model = DynUNet(in_channels=1, out_channels=3, strides=(1, 2, 2, 2, 2, 2), filters=(32, 64, 128, 256, 320, 320))
loss_function = DeepSupervisionLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
scaler = torch.cuda.amp.GradScaler()

max_epochs = 600
try:
    for epoch in range(max_epochs):
        model.train()
        for step, batch_data in enumerate(train_loader):
            inputs, labels = batch_data["image"], batch_data["label"]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda"):
                outputs = model(inputs)
                loss = loss_function(outputs, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            print("epoch %d step %d" % (epoch, step))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
