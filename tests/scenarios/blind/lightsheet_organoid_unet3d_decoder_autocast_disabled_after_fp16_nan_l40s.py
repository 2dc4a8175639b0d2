"""train_organoid_seg.py -- an imaging lab's own 3D U-Net (nnU-Net's 3d_fullres layout: features 32..320,
six stages, instance norm, leaky ReLU, deep supervision) segmenting nuclei and cell boundaries in
two-channel light-sheet volumes of intestinal organoids, on one L40S (48 GB, 45 GiB usable).  Patches
are 192x320x320 voxels, batch 2, as nnU-Net planned them.  The loop copies nnU-Net's recipe: fp16
autocast + GradScaler + SGD with Nesterov momentum.

The first runs diverged: the loss went to NaN after a few hundred iterations, traced to the decoder's
full-resolution stage overflowing in fp16.  The fix that went in, from a forum answer, was to take the
decoder out of autocast:

    class UNetDecoder(nn.Module):
        @torch.autocast("cuda", enabled=False)        # fp16 overflow in the full-res stage -> NaN
        def forward(self, skips):
            skips = [s.float() for s in skips]        # the encoder's features come out fp16
            ...

    with torch.autocast("cuda", dtype=torch.float16):
        outputs = model(images)
        loss = ds_loss(outputs, targets)
    scaler.scale(loss).backward()

Since then the first iteration dies.  The encoder still runs in fp16 (12.5 GiB of activations), but the
decoder -- which in a U-Net holds more activations than the encoder (the transposed-conv upsample, the
concatenation with the skip, two conv/norm blocks per stage, at full resolution in the top stage) --
now keeps every one of them in fp32, after an fp32 copy of each skip (6 GiB): 30 GiB are in use when the
top stage starts, its upsample (4.7 GiB) and concatenation (9.4 GiB) take the rest, and its first conv's
4.7 GiB output does not fit.  OOM in the first forward pass, in the first conv of the decoder's
full-resolution stage, autocast off at that line (on in the caller).  Nothing is cached, nothing grows,
no optimizer state (SGD has not stepped; it would be one momentum buffer of 120 MB anyway).

An expert: mixed precision is half applied -- the decoder, where most of a U-Net's activations are, was
taken out of it.  On an Ada card the answer to the fp16 overflow is bf16 autocast over the whole model
(fp32's exponent range, no overflow, no GradScaler needed), and the decorator and the .float() go:
the whole forward then needs about 35 GiB and fits.  Smaller patches or batch 1, or checkpointing the
decoder, would also fit but trade away what the fp16->bf16 switch gives for free; empty_cache or
expandable_segments change nothing (nothing is cached, the requests are single 4.7 GiB tensors beyond
the free memory); an 8-bit optimizer or quantization target memory that is not there.
"""
import sys
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, mirrored in plain Python (compiled as torch's
# own files, so that frames in them count as the framework's, as the C++ kernels would):
# Tensor.float(), torch.cat, autocast's casting of a conv's input, ConvTranspose3d, InstanceNorm3d,
# LeakyReLU, GradScaler.
_TENSOR_OPS = r'''
from torch.autograd._graph import derive
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}

def _convert(t, dtype):
    out = torch.empty(t.nbytes // _ITEM[t.dtype], dtype=dtype, device=t.device)
    out._saved = t
    return derive(out, t)

def _float(self):
    return self if self.dtype == "float32" else _convert(self, "float32")

def _scalar_op(self, other):            # arithmetic on losses (scalars)
    out = torch.empty(512, device=self.device)
    return derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))

_plain_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward, then what PyTorch does with the graph unless retain_graph: frees what it saved."""
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))

def cat(tensors, dim=0):
    out = torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    out._dtype = tensors[0].dtype
    out._saved = tuple(tensors)
    return derive(out, *tensors)
'''
_ns = {"torch": torch}
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["_backward"]
torch.Tensor.float = _ns["_float"]
torch.cat = _ns["cat"]
torch.Tensor.__add__ = torch.Tensor.__radd__ = torch.Tensor.__mul__ = torch.Tensor.__rmul__ = _ns["_scalar_op"]

_NN_OPS = r'''
from torch.autograd._graph import derive
from torch.nn.modules.conv import _ConvNd, Conv3d
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _conv3d_forward(self, input):
    if torch.is_autocast_enabled():
        if input.dtype == "float32":
            input = _convert(input, "float16")              # autocast casts the input of a conv to fp16
        out = self._conv_forward(input, self.weight, self.bias)
        out._dtype = "float16"
        return out
    if input.dtype != "float32":
        raise RuntimeError("Input type (c10::Half) and weight type (float) should be the same")
    return self._conv_forward(input, self.weight, self.bias)

class ConvTranspose3d(_ConvNd):
    _dims = 3
    def forward(self, input):
        half = torch.is_autocast_enabled()
        if half and input.dtype == "float32":
            input = _convert(input, "float16")
        n = input.nbytes * self.out_channels // self.in_channels * self.stride ** 3
        out = torch.empty(n, device=input.device)
        out._dtype = "float16" if half else input.dtype
        out._saved = input
        return derive(out, input)

class InstanceNorm3d(Module):
    def __init__(self, num_features, eps=1e-5, affine=True, device=None):
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
        self.inplace = inplace
    def forward(self, input):
        return input

class GradScaler(object):
    def __init__(self, device="cuda", init_scale=65536.0, enabled=True):
        self._scale = init_scale
    def scale(self, outputs):
        return outputs
    def unscale_(self, optimizer):
        pass
    def step(self, optimizer):
        return optimizer.step()
    def update(self):
        pass
'''
_ns.update(_convert=_ns["_convert"])
exec(compile(_NN_OPS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv3d.forward = _ns["_conv3d_forward"]
nn.ConvTranspose3d, nn.InstanceNorm3d, nn.LeakyReLU = _ns["ConvTranspose3d"], _ns["InstanceNorm3d"], _ns["LeakyReLU"]
if not hasattr(torch, "amp"):
    torch.amp = types.ModuleType("torch.amp")
torch.amp.GradScaler = _ns["GradScaler"]
# --- end of the stand-in additions; the user's program follows


plans = {
    "patch_size": (192, 320, 320),
    "batch_size": 2,
    "features_per_stage": (32, 64, 128, 256, 320, 320),
    "strides": (1, 2, 2, 2, 2, 2),
    "num_input_channels": 2,           # nuclear stain, membrane stain
    "num_classes": 3,                  # background, nucleus, boundary
}


class ConvNormAct(nn.Module):
    def __init__(self, cin, cout, stride=1):
        nn.Module.__init__(self)
        self.conv = nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.norm = nn.InstanceNorm3d(cout, affine=True, device="cuda")
        self.act = nn.LeakyReLU(0.01, inplace=True)

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class EncoderStage(nn.Module):
    def __init__(self, cin, cout, stride):
        nn.Module.__init__(self)
        self.conv1 = ConvNormAct(cin, cout, stride)
        self.conv2 = ConvNormAct(cout, cout)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class UNetEncoder(nn.Module):
    def __init__(self, cin, features, strides):
        nn.Module.__init__(self)
        self.n = len(features)
        for i, (f, s) in enumerate(zip(features, strides)):
            setattr(self, "stage%d" % i, EncoderStage(cin, f, s))
            cin = f

    def forward(self, x):
        skips = []
        for i in range(self.n):
            x = getattr(self, "stage%d" % i)(x)
            skips.append(x)
        return skips


class DecoderStage(nn.Module):
    def __init__(self, c_below, c_skip, num_classes):
        nn.Module.__init__(self)
        self.transpconv = nn.ConvTranspose3d(c_below, c_skip, 2, stride=2, device="cuda")
        self.conv1 = ConvNormAct(2 * c_skip, c_skip)
        self.conv2 = ConvNormAct(c_skip, c_skip)
        self.seg = nn.Conv3d(c_skip, num_classes, 1, device="cuda")

    def forward(self, below, skip):
        x = torch.cat([self.transpconv(below), skip], dim=1)
        x = self.conv2(self.conv1(x))
        return x, self.seg(x)


class UNetDecoder(nn.Module):
    def __init__(self, features, num_classes):
        nn.Module.__init__(self)
        self.n = len(features) - 1
        for i in range(self.n):
            # stage i upsamples from features[i+1] to features[i]; built deepest first
            setattr(self, "stage%d" % i, DecoderStage(features[i + 1], features[i], num_classes))

    @torch.autocast("cuda", enabled=False)        # fp16 overflowed in the full-res stage (NaN loss); keep fp32
    def forward(self, skips):
        skips = [s.float() for s in skips]        # the encoder's features come out of autocast as fp16
        x = skips[-1]
        seg_outputs = []
        for i in reversed(range(self.n)):
            x, seg = getattr(self, "stage%d" % i)(x, skips[i])
            seg_outputs.append(seg)
        return seg_outputs[::-1]                  # full resolution first, for deep supervision


class OrganoidUNet(nn.Module):
    def __init__(self, p):
        nn.Module.__init__(self)
        self.encoder = UNetEncoder(p["num_input_channels"], p["features_per_stage"], p["strides"])
        self.decoder = UNetDecoder(p["features_per_stage"], p["num_classes"])

    def forward(self, x):
        return self.decoder(self.encoder(x))


def ds_loss(outputs, target):
    """CE over the deep-supervision outputs, weights halving per scale (as nnU-Net; Dice term left out here)."""
    loss = 0.0
    for i, out in enumerate(outputs[:4]):
        loss = loss + F.cross_entropy(out, target) * (0.5 ** i)
    return loss


def load_batch(p):
    """A batch of random crops from the training volumes (the DataLoader's pinned CPU tensors, to GPU)."""
    d, h, w = p["patch_size"]
    images = torch.empty(p["batch_size"] * p["num_input_channels"] * d * h * w, dtype=torch.float32, device="cuda")
    target = torch.empty(p["batch_size"] * d * h * w, dtype=torch.uint8, device="cuda")
    return images, target


def main():
    model = OrganoidUNet(plans)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
    scaler = torch.amp.GradScaler("cuda")
    batch_size = plans["batch_size"]
    for iteration in range(250):
        images, target = load_batch(plans)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            outputs = model(images)
            loss = ds_loss(outputs, target)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        del images, target, outputs, loss
        if iteration % 50 == 0:
            print("iter", iteration, "batch", batch_size, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
