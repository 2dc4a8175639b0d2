"""train_lobes.py -- a pulmonology group's lung-lobe segmentation (5 lobes + background) for a COPD
cohort: 160 inspiratory chest CTs with lobe masks, a MONAI BasicUNet (features 32-32-64-128-256-32,
5.8 M parameters), trained on the whole lung at once -- the fissures that separate the lobes need the
whole lung's context, so the group dropped patch sampling:

    LoadImaged(["image", "label", "lung"]), Spacingd(pixdim=(1.25, 1.25, 1.25)),
    CropForegroundd(keys=[...], source_key="lung", margin=8),     # the lungs' bounding box
    DivisiblePadd(keys=[...], k=16),                               # shapes divisible by 2^4
    ...
    train_loader = DataLoader(train_ds, batch_size=1, shuffle=True, num_workers=6)

so every iteration sees a different shape (208-288 x 144-208 x 160-256 voxels).  fp16 autocast,
AdamW, on the group's workstation with one RTX A4000 (16 GB, 15.5 GiB usable).  The largest lung in the
set (288 x 208 x 256, a hyperinflated COPD patient) needs 12.2 GiB at its peak, and the run's peak is
12.2 GiB every epoch; five epochs (800 iterations) go through, each volume seen five times.

In the sixth epoch, iteration 862, the largest volume comes again -- after a different predecessor than
before -- and its forward pass fails in the decoder's full-resolution stage (upcat_1) on a 936 MiB
feature map, with 3.8 GiB reserved by PyTorch but unallocated and 0.6 GiB free: the cache is full of
segments made for earlier shapes, each holding part of this iteration's feature maps and a free
remainder too small for the next one.  PyTorch's retry releases only segments that are entirely free;
none of the large ones is.  Nothing grows (the reserve has been 14.9 GiB since the first epoch),
nothing leaks, and in a fresh process this volume peaks at 12.2 GiB.

An expert: fragmentation of the caching allocator by variable input shapes.  First
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) at the start of the process, so
freed space is reused whatever the next shape; releasing the cache between iterations
(torch.cuda.empty_cache()) also works, at some speed; padding the crops to a few fixed sizes would make
the shapes repeat.  Wrong first advice: a smaller batch (it is 1), gradient checkpointing or mixed
precision (the peak fits; fp16 is already on), patches instead of whole lungs (changes the method
for an allocator problem), a bigger GPU.
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file
# (its frames count as the framework's): autocast's fp16 convolution, ConvTranspose3d, InstanceNorm3d,
# LeakyReLU, MaxPool3d, torch.cat, and a Tensor.backward that releases what the graph saved.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _new(nbytes, dtype, like, *inputs):
    out = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device=like.device)
    if torch.is_grad_enabled():
        out._saved = tuple(inputs)
        return derive(out, *inputs)
    return out

def _half(t):
    return t if t.dtype == "float16" else _new(t.nbytes // 2, "float16", t, t)

def _conv3d_forward(self, input):
    if torch.is_autocast_enabled():
        input = _half(input)
    out = self._conv_forward(input, self.weight, self.bias)
    out._dtype = input.dtype
    if not torch.is_grad_enabled():
        out._saved = None
        out._params = ()
    return out

class ConvTranspose3d(_ConvNd):
    _dims = 3
    def forward(self, input):
        if torch.is_autocast_enabled():
            input = _half(input)
        return _new(input.nbytes * self.out_channels // self.in_channels * self.stride ** 3, input.dtype, input, input)

class InstanceNorm3d(Module):
    def __init__(self, num_features, affine=True, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))
    def forward(self, input):
        return _new(input.nbytes, input.dtype, input, input)

class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

class MaxPool3d(Module):
    def __init__(self, kernel_size=2):
        Module.__init__(self)
    def forward(self, input):
        return _new(input.nbytes // 8, input.dtype, input, input)

def cat(tensors, dim=0):
    return _new(sum(t.nbytes for t in tensors), tensors[0].dtype, tensors[0], *tensors)

def loss_like(*inputs):
    return _new(512, "float32", inputs[0], *inputs)

_engine_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
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
'''
_ns = {"torch": torch}
exec("from torch.nn.modules.conv import _ConvNd\nfrom torch.nn.modules.module import Module\n"
     "from torch.nn.parameter import Parameter", _ns)
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv3d.forward = _ns["_conv3d_forward"]
nn.ConvTranspose3d, nn.InstanceNorm3d, nn.LeakyReLU, nn.MaxPool3d = (_ns["ConvTranspose3d"], _ns["InstanceNorm3d"],
                                                                     _ns["LeakyReLU"], _ns["MaxPool3d"])
torch.cat = _ns["cat"]
torch.Tensor.backward = _ns["_backward"]


# --- stand-ins for MONAI's BasicUNet (same layout and names), as far as memory goes
class TwoConv(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.conv_0 = nn.Conv3d(cin, cout, 3, device="cuda")
        self.norm_0 = nn.InstanceNorm3d(cout, device="cuda")
        self.conv_1 = nn.Conv3d(cout, cout, 3, device="cuda")
        self.norm_1 = nn.InstanceNorm3d(cout, device="cuda")
        self.act = nn.LeakyReLU(0.1, inplace=True)

    def forward(self, x):
        x = self.act(self.norm_0(self.conv_0(x)))
        return self.act(self.norm_1(self.conv_1(x)))


class Down(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.max_pooling = nn.MaxPool3d(2)
        self.convs = TwoConv(cin, cout)

    def forward(self, x):
        return self.convs(self.max_pooling(x))


class UpCat(nn.Module):
    def __init__(self, cin, ccat, cout, halves=True):
        nn.Module.__init__(self)
        up = cin // 2 if halves else cin
        self.upsample = nn.ConvTranspose3d(cin, up, 2, stride=2, device="cuda")
        self.convs = TwoConv(ccat + up, cout)

    def forward(self, x, x_e):
        x_0 = self.upsample(x)
        return self.convs(torch.cat([x_e, x_0], dim=1))


class BasicUNet(nn.Module):
    """monai.networks.nets.BasicUNet(spatial_dims=3, in_channels=1, out_channels=6,
    features=(32, 32, 64, 128, 256, 32), norm="instance", act="LeakyReLU")."""

    def __init__(self, in_channels=1, out_channels=6, features=(32, 32, 64, 128, 256, 32)):
        nn.Module.__init__(self)
        f = features
        self.conv_0 = TwoConv(in_channels, f[0])
        self.down_1 = Down(f[0], f[1])
        self.down_2 = Down(f[1], f[2])
        self.down_3 = Down(f[2], f[3])
        self.down_4 = Down(f[3], f[4])
        self.upcat_4 = UpCat(f[4], f[3], f[3])
        self.upcat_3 = UpCat(f[3], f[2], f[2])
        self.upcat_2 = UpCat(f[2], f[1], f[1])
        self.upcat_1 = UpCat(f[1], f[0], f[5], halves=False)
        self.final_conv = nn.Conv3d(f[5], out_channels, 1, device="cuda")

    def forward(self, x):
        x0 = self.conv_0(x)
        x1 = self.down_1(x0)
        x2 = self.down_2(x1)
        x3 = self.down_3(x2)
        x4 = self.down_4(x3)
        u4 = self.upcat_4(x4, x3)
        u3 = self.upcat_3(u4, x2)
        u2 = self.upcat_2(u3, x1)
        u1 = self.upcat_1(u2, x0)
        return self.final_conv(u1)


class DiceCELoss(object):
    """monai.losses.DiceCELoss(to_onehot_y=True, softmax=True), as far as memory goes."""

    def __call__(self, outputs, target):
        return _ns["loss_like"](outputs, target)


class LobeCase(object):
    """one preprocessed case as the DataLoader yields it (batch 1): image float32, label uint8."""

    def __init__(self, name, shape):
        self.name, self.shape = name, shape

    def to_device(self):
        vox = self.shape[0] * self.shape[1] * self.shape[2]
        return torch.empty(vox * 4, device="cuda"), torch.empty(vox, device="cuda")


def copd_cohort():
    """the 160 cases' shapes after Spacingd(1.25 mm), CropForegroundd(lung, margin 8), DivisiblePadd(16)"""
    rng = random.Random(15)
    cases = []
    for i in range(160):
        shape = (rng.randint(13, 18) * 16, rng.randint(9, 13) * 16, rng.randint(10, 16) * 16)
        cases.append(LobeCase("COPD-%04d" % (i + 1), shape))
    return cases


def train_loader(cases, epoch):
    order = list(range(len(cases)))
    random.Random(epoch).shuffle(order)        # DataLoader(shuffle=True) with a seeded generator
    for i in order:
        yield cases[i]


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
train_ds = copd_cohort()
model = BasicUNet(in_channels=1, out_channels=6, features=(32, 32, 64, 128, 256, 32))
loss_function = DiceCELoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-5)
scaler = torch.cuda.amp.GradScaler()
max_epochs = 200

try:
    step = 0
    for epoch in range(max_epochs):
        model.train()
        for case in train_loader(train_ds, epoch):
            inputs, labels = case.to_device()
            optimizer.zero_grad()
            with torch.autocast("cuda"):
                outputs = model(inputs)
                loss = loss_function(outputs, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            del inputs, labels, outputs, loss
        print("epoch %d: %d steps, peak %.1f GiB, reserved %.1f GiB" % (
            epoch + 1, step, torch.cuda.max_memory_allocated() / 2 ** 30, torch.cuda.memory_reserved() / 2 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
