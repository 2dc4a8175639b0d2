"""train_amos.py -- a radiology PhD student trains an nnU-Net-style 3D segmentation network (MONAI DynUNet,
filters 32-64-128-256-320-320, instance norm, deep supervision on two decoder levels, 31M parameters, float32,
SGD) for the 15 AMOS22 abdominal organs on CT, on the lab's RTX 3090 (24 GB).  MONAI 1.0.1, PyTorch 1.13.1.
The training transforms, as the student wrote them ("random 96^3 patches"):

    LoadImaged, EnsureChannelFirstd, Orientationd("RAS"), Spacingd(pixdim=(1.5, 1.5, 2.0)),
    ScaleIntensityRanged(-175, 250), CropForegroundd(source_key="image"),
    RandSpatialCropd(keys=["image", "label"], roi_size=(96, 96, 96)),
    DivisiblePadd(keys=["image", "label"], k=32),          # DynUNet wants sizes divisible by 32
    RandFlipd(...), RandScaleIntensityd(...)
    loader = DataLoader(train_ds, batch_size=1, shuffle=True, num_workers=8)

RandSpatialCropd's random_size defaults to True before MONAI 1.3 (1.1 and 1.2 only warn): roi_size is the
*minimum*, and each axis is drawn between 96 and the whole (foreground-cropped) volume.  The student first ran
batch_size=2, got "stack expects each tensor to be equal size" from the collate, and set batch_size=1 (then
DivisiblePadd after a skip-connection size mismatch) -- never noticing the crops vary.  After an earlier OOM the
loop also got `del outputs, onehot, loss; torch.cuda.empty_cache()` at the end of each step, and the next runs
happened to survive longer.  At ~3.4 KB per voxel (full-resolution encoder and decoder stages, the two
deep-supervision heads upsampled to full size and stacked with the main output, DiceCE over 16 classes) a 96^3
patch needs 2.8 GiB, the typical crop here 6-15 GiB, a crop of nearly the whole abdomen more than the card.
Iteration 39 draws 192 x 192 x 192 voxels after padding (7.1M, 8x a 96^3 patch): the forward fits with 22.6 GiB
allocated, and loss.backward() fails at its first node, on the gradient of the 3 x 16-class full-resolution
outputs (1.27 GiB requested, 0.9 GiB free, nothing cached).

An expert: the input, not the batch, decides the memory here, and its size is random and unbounded: make the crop
fixed (random_size=False, or RandCropByPosNegLabeld with spatial_size=(128,128,128) as the MONAI recipes do) or
bound it (max_roi_size) -- then batch 2 fits again and collates.  Wrong advice: a smaller batch (it is 1),
empty_cache / expandable_segments (variable sizes can fragment a cache, but this crop needs more than the card
holds, and the loop already empties the cache every step), gradient checkpointing or AMP first (they raise the
ceiling, but the crop can still be the whole volume: 10M+ voxels), inference mode (it trains),
release_references (nothing is kept across iterations).
"""
import os
import random
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code).  The stand-in torch lacks ConvTranspose3d, InstanceNorm3d,
# LeakyReLU, torch.cat/stack, F.softmax and 3D interpolation; and its autograd makes only the parameters'
# gradients, where PyTorch's also makes the gradient of every activation it walks back through (the largest
# first: the network's output end), then frees what the graph saved.  Each makes the tensors PyTorch's would
# (sizes in bytes), compiled as torch's own files so that the failing frames are the framework's.
_TORCH_DIR = os.path.dirname(torch.__file__)
_NN_SRC = '''
class ConvTranspose3d(_ConvNd):
    _dims = 3

    def forward(self, input):
        s = self.stride ** 3
        out = torch.empty(input.nbytes * self.out_channels // self.in_channels * s, device=input.device)
        out._saved = input
        return torch._derive(out, input)


class InstanceNorm3d(Module):
    def __init__(self, num_features, affine=True, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))

    def forward(self, input):
        out = torch.empty(input.nbytes, device=input.device)
        out._saved = input
        return torch._derive(out, input)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        Module.__init__(self)

    def forward(self, input):
        out = torch.empty(input.nbytes, device=input.device)
        out._saved = input
        return torch._derive(out, input)
'''
_TORCH_SRC = '''
def cat(tensors, dim=0):
    out = empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    out._saved = tuple(tensors)
    return _derive(out, *tensors)


stack = cat
'''
_F_SRC = '''
def softmax(input, dim=None):
    out = torch.empty(input.nbytes, device=input.device)
    out._saved = input
    return derive(out, input)


_interpolate_2d = interpolate


def interpolate(input, size=None, scale_factor=2.0, mode="nearest", align_corners=None):
    if mode != "trilinear":
        return _interpolate_2d(input, scale_factor, mode)
    out = torch.empty(int(input.nbytes * float(scale_factor) ** 3), device=input.device)
    out._saved = input
    return derive(out, input)
'''
_AUTOGRAD_SRC = '''
def _graph_of(roots):
    """The activations of the roots' graph, from the roots back towards the leaves (breadth first)."""
    out, todo, seen = [], list(roots), set()
    while todo:
        t = todo.pop(0)
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t._base is not None:
            todo.append(t._base)
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        out.append(t)
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for i, r in enumerate(roots):
        if not r.requires_grad and r.grad_fn is None:
            raise RuntimeError("element %d of tensors does not require grad and does not have a grad_fn" % i)
    params = []
    for r in roots:
        for p in (inputs or r._params):
            if all(p is not q for q in params):
                params.append(p)
    graph = _graph_of(roots)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_engine.run_walk, (graph, params, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]
    if not retain_graph:
        for t in graph:
            t._saved = None
'''
_ENGINE_SRC = '''
def run_walk(graph, params, box, done):
    """The engine walks the graph from the loss back: the gradient of each activation is made when its node
    runs and dropped once the node before it has used it; then the parameters' gradients are accumulated."""
    _tls.engine = True
    try:
        live = []
        for t in graph:
            if t.nbytes < (1 << 20):
                continue
            live.append(torch.empty_like(t))
            if len(live) > 2:
                live.pop(0)
        del live[:]
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
'''
import _thread  # noqa: E402
import torch.nn.modules.conv as _conv  # noqa: E402
from torch.autograd import _engine  # noqa: E402

_nn_ns = {"torch": torch, "_ConvNd": _conv._ConvNd, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
exec(compile(_NN_SRC, _conv.__file__, "exec"), _nn_ns)
for _name in ("ConvTranspose3d", "InstanceNorm3d", "LeakyReLU"):
    setattr(torch.nn, _name, _nn_ns[_name])
exec(compile(_TORCH_SRC, torch.__file__, "exec"), torch.__dict__)
exec(compile(_F_SRC, F.__file__, "exec"), F.__dict__)
_engine.__dict__["torch"] = torch
exec(compile(_ENGINE_SRC, _engine.__file__, "exec"), _engine.__dict__)
torch.autograd.__dict__.update(_thread=_thread, _engine=_engine, torch=torch)
exec(compile(_AUTOGRAD_SRC, torch.autograd.__file__, "exec"), torch.autograd.__dict__)
# ---- end of the supplement

# ------------------------------------------------------------------------------------------------------------
# the user's program (MONAI's DynUNet and DiceCELoss as their code lays them out)
# ------------------------------------------------------------------------------------------------------------
FILTERS = [32, 64, 128, 256, 320, 320]
N_CLASSES = 16


class UnetBasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.norm1 = torch.nn.InstanceNorm3d(cout, device="cuda")
        self.conv2 = torch.nn.Conv3d(cout, cout, 3, stride=1, device="cuda")
        self.norm2 = torch.nn.InstanceNorm3d(cout, device="cuda")
        self.lrelu = torch.nn.LeakyReLU(negative_slope=0.01)

    def forward(self, inp):
        out = self.lrelu(self.norm1(self.conv1(inp)))
        return self.lrelu(self.norm2(self.conv2(out)))


class UnetUpBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        torch.nn.Module.__init__(self)
        self.transp_conv = torch.nn.ConvTranspose3d(cin, cout, stride, stride=stride, bias=False, device="cuda")
        self.conv_block = UnetBasicBlock(cout * 2, cout, 1)

    def forward(self, inp, skip):
        out = self.transp_conv(inp)
        out = torch.cat((out, skip), dim=1)
        return self.conv_block(out)


class UnetOutBlock(torch.nn.Module):
    def __init__(self, cin, cout):
        torch.nn.Module.__init__(self)
        self.conv = torch.nn.Conv3d(cin, cout, 1, stride=1, device="cuda")

    def forward(self, inp):
        return self.conv(inp)


class DynUNet(torch.nn.Module):
    def __init__(self, in_channels, out_channels, filters, deep_supr_num=2):
        torch.nn.Module.__init__(self)
        self.input_block = UnetBasicBlock(in_channels, filters[0], 1)
        for i in range(1, len(filters) - 1):
            setattr(self, "downsamples_%d" % i, UnetBasicBlock(filters[i - 1], filters[i], 2))
        self.bottleneck = UnetBasicBlock(filters[-2], filters[-1], 2)
        self.n_up = len(filters) - 1
        for i in range(self.n_up):
            setattr(self, "upsamples_%d" % i, UnetUpBlock(filters[-1 - i], filters[-2 - i], 2))
        self.output_block = UnetOutBlock(filters[0], out_channels)
        self.deep_supr_num = deep_supr_num
        for k in range(deep_supr_num):
            setattr(self, "deep_supervision_heads_%d" % k, UnetOutBlock(filters[k + 1], out_channels))

    def forward(self, x):
        skips = [self.input_block(x)]
        for i in range(1, len(FILTERS) - 1):
            skips.append(getattr(self, "downsamples_%d" % i)(skips[-1]))
        out = self.bottleneck(skips[-1])
        ups = []
        for i in range(self.n_up):
            out = getattr(self, "upsamples_%d" % i)(out, skips[-1 - i])
            ups.append(out)
        main = self.output_block(out)
        if not self.training:
            return main
        heads = [main]
        for k in range(self.deep_supr_num):
            feat = ups[-2 - k]                                  # 1/2 and 1/4 resolution decoder outputs
            h = getattr(self, "deep_supervision_heads_%d" % k)(feat)
            heads.append(F.interpolate(h, scale_factor=2 ** (k + 1), mode="trilinear"))
        return torch.stack(heads, dim=1)


class DiceCELoss(object):
    def __call__(self, logits, label_onehot):
        probs = F.softmax(logits, dim=1)                        # dice term
        logp = F.log_softmax(logits, dim=1)                     # cross-entropy term
        loss = torch.empty(512, device=logits.device)
        loss._saved = (probs, logp, label_onehot)
        return torch._derive(loss, probs, logp)


class AMOSTrain(object):
    """LoadImaged ... CropForegroundd, RandSpatialCropd(roi_size=(96, 96, 96)), DivisiblePadd(k=32): each
    item is an (image, label) crop; here its spatial size (the transforms run in the loader's workers)."""

    def __init__(self, shapes, seed):
        self.shapes, self.rng = shapes, random.Random(seed)

    def __len__(self):
        return len(self.shapes)

    def crop(self, shape, roi_size=(96, 96, 96), random_size=True):
        if random_size:         # RandSpatialCrop: randint(roi_size, max_roi_size or image size) per axis
            size = [self.rng.randint(r, s) for r, s in zip(roi_size, shape)]
        else:
            size = list(roi_size)
        return [-(-s // 32) * 32 for s in size]                 # DivisiblePadd(k=32)


def main():
    rng = random.Random(7)
    shapes = [(rng.randint(190, 236), rng.randint(150, 196), rng.randint(96, 230)) for _ in range(200)]
    train_ds = AMOSTrain(shapes, seed=42)
    model = DynUNet(1, N_CLASSES, FILTERS, deep_supr_num=2)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
    loss_fn = DiceCELoss()
    batch_size = 1
    order = list(range(len(train_ds)))
    for epoch in range(1000):
        rng.shuffle(order)
        for step, idx in enumerate(order):
            d, h, w = train_ds.crop(shapes[idx])
            voxels = d * h * w * batch_size
            image = torch.empty(voxels * 4, device="cuda")                 # batch["image"].cuda()
            label = torch.empty(voxels * 4, device="cuda")                 # batch["label"].cuda()
            optimizer.zero_grad(set_to_none=True)
            outputs = model(image)
            onehot = torch.empty(voxels * N_CLASSES * 4, device="cuda")    # one_hot(label, 16) in DiceCELoss
            loss = loss_fn(outputs, onehot)
            loss.backward()
            optimizer.step()
            del outputs, onehot, loss
            torch.cuda.empty_cache()
            if step % 10 == 0:
                print("epoch %d step %d  crop %dx%dx%d" % (epoch, step, d, h, w), flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
