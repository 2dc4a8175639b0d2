"""train_croptype.py -- an agritech start-up's crop-type segmentation on Sentinel-2 L2A, trained on a rented
Hetzner GEX44 (one NVIDIA RTX 4000 SFF Ada Generation, 20 GB).  Chips are 512 x 512 px (5.12 km at 10 m) with
the 12 L2A bands (B01-B12 without B10, the 20 m / 60 m bands resampled to 10 m), exported from the SAFE
products as uint16 GeoTIFFs (surface reflectance x 10000); labels are rasterised IACS parcel declarations, 10
classes (background + 9 crops).  The model is segmentation_models_pytorch's Unet with a ResNet-50 encoder
(ImageNet weights, conv1 adapted to 12 input bands: 32.6M parameters), AdamW, batch 16:

    class S2Chips(Dataset):
        def __getitem__(self, i):
            with rasterio.open(self.img_paths[i]) as src:
                img = src.read()                              # (12, 512, 512) uint16
            img = img / 10000.0                               # reflectance 0..1
            img = (img - self.band_mean[:, None, None]) / self.band_std[:, None, None]
            with rasterio.open(self.lbl_paths[i]) as src:
                mask = src.read(1)                            # (512, 512) uint8
            return torch.from_numpy(img), torch.from_numpy(mask)

    model = smp.Unet("resnet50", encoder_weights="imagenet", in_channels=12, classes=10).to(device)
    model = model.double()   # "Input type (torch.cuda.DoubleTensor) and weight type (torch.cuda.FloatTensor)
                             #  should be the same" -- this made the error go away
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4)
    for images, masks in train_loader:
        images, masks = images.to(device), masks.to(device)
        logits = model(images)
        loss = criterion(logits, masks.long()); loss.backward(); optimizer.step()

`img / 10000.0` is numpy true division of a uint16 array: the result is float64, and so is everything the
band_mean / band_std arrays (np.array of Python floats: float64) touch.  The first run stopped at the encoder's
first convolution with the dtype-mismatch RuntimeError; the answer they found online was `model.double()`, and
it "worked": the 256 x 256 prototype chips trained at batch 16 (about 5.5 GiB, and 2-3 s per step, which they
put down to 12-band imagery being heavy).  Moving to the 512 x 512 chips (the parcels need the context) the first
batch dies inside the forward pass, in the last decoder block, where F.interpolate upsamples to full resolution:
"Tried to allocate 1.00 GiB" = 16 x 32 x 512 x 512 x 8 bytes, with 505 MiB free.  By then the activations the
forward keeps for backward hold about 18.4 GiB of the 20 GB card (the float64 input batch 0.38 GiB more); the
weights are 0.24 GiB, and weights, gradients and AdamW state together would be about 1 GiB.

An expert reads the 8 in that product first: every weight and activation is float64.  The fix is the data's
dtype, not the model's: cast the chip to float32 in the dataset (`img.astype(np.float32)` and float32 band
statistics, or `.float()` before the model), and delete `model.double()`.  Activations halve (in float32 the
same batch and chip size peak near 11.7 GiB allocated, room to spare on 20 GB), and each step runs on the FP32
units instead of the FP64 ones, which on an Ada card run at 1/64 of the rate: the "slow imagery" was this too.
Afterwards, bf16 autocast (compute capability 8.9) halves the activations again if they want batch 32.
Wrong first advice: a smaller batch with gradient accumulation (batch 8 would fit, still at twice the memory
and at float64 speed, hiding the bug), mixed precision / autocast (CUDA autocast leaves ops that run in float64
in float64: with float64 inputs and weights nothing is cast, the same OOM), gradient checkpointing (fits by
recomputing float64 convolutions: slower still), smaller chips (gives up the parcel context the 512 chips were
made for), expandable_segments or empty_cache (nothing is fragmented or cached: the cache is in use, the one
request is twice what is free), a bigger GPU, quantization, CPU offload, ZeRO/FSDP or an 8-bit optimizer (a
32.6M-parameter model whose optimizer state does not exist yet), inference_mode (this is training).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: the parts of PyTorch this program calls that the stand-in lacks, as PyTorch has them
# (sizes in elements with shapes; every output keeps its input's dtype; what a real op saves for backward is
# what its output keeps in `_saved`).  Compiled as part of torch's own file: the failing line the dump quotes
# stays the program's.
_GAPS = '''
from torch.autograd._graph import derive as _derive
import torch.nn.functional as F

_TYPE = {"float32": "FloatTensor", "float64": "DoubleTensor", "float16": "HalfTensor", "bfloat16": "BFloat16Tensor",
         "uint8": "ByteTensor"}


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _new(shape, dtype, device=0):
    t = torch.empty(_numel(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def _anchor(t):
    s = getattr(t, "_saved", None)
    return s if isinstance(s, torch.Tensor) else t


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if input.dtype != weight.dtype:
        raise RuntimeError("Input type (torch.cuda.%s) and weight type (torch.cuda.%s) should be the same"
                           % (_TYPE[input.dtype], _TYPE[weight.dtype]))
    n, c, h, w = input.shape
    k = weight.shape[2]
    ho = (h + 2 * padding - k) // stride + 1
    wo = (w + 2 * padding - k) // stride + 1
    out = _new((n, weight.shape[0], ho, wo), input.dtype)
    out._saved = input                      # ConvolutionBackward saves its input (and the weight)
    return _derive(out, input)


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    out = _new(input.shape, input.dtype)
    out._saved = input                      # NativeBatchNormBackward saves its input
    return _derive(out, input)


def relu(input, inplace=False):
    if inplace:
        return input                        # ReluBackward saves its result: the same tensor
    out = _new(input.shape, input.dtype)
    out._saved = input
    return _derive(out, input)


def max_pool2d(input, kernel_size, stride=None, padding=0):
    n, c, h, w = input.shape
    s = stride or kernel_size
    out = _new((n, c, (h + 2 * padding - kernel_size) // s + 1, (w + 2 * padding - kernel_size) // s + 1),
               input.dtype)
    out._saved = input                      # MaxPool2DWithIndicesBackward saves its input
    return _derive(out, input)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    n, c, h, w = input.shape
    f = int(scale_factor)
    out = _new((n, c, h * f, w * f), input.dtype)
    out._saved = input                      # (nearest saves no tensor; its input stays in the graph)
    return _derive(out, input)


def cat(tensors, dim=0):
    tensors = list(tensors)
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = _new(shape, tensors[0].dtype)
    out._saved = tuple(_anchor(t) for t in tensors)   # CatBackward saves no input
    return _derive(out, *tensors)


def _iadd(self, other):
    """out += identity (the residual): in place, no new memory; the identity stays in the graph."""
    self._saved = (_anchor(self), other)
    return _derive(self, other)


def _module_double(self):
    """Module.double(): every floating-point parameter and buffer cast to float64 (a new tensor on the same
    device; the float32 one is freed), as Module._apply(lambda t: t.double() if t.is_floating_point() else t)."""
    for m in self.modules():
        for name, p in list(m._parameters.items()):
            if p is None or p.dtype == torch.float64:
                continue
            q = torch.nn.Parameter(_new(p.shape, torch.float64), p.requires_grad)
            q.shape = p.shape
            m._parameters[name] = q
        for name, b in list(m._buffers.items()):
            if b is None or b.dtype != torch.float32:
                continue
            m._buffers[name] = _new(b.shape, torch.float64)
    return self


def _tensor_to(self, device=None, dtype=None, non_blocking=False):
    return self


_plain_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward(); then, retain_graph=False, the graph frees what it saved (the activations)."""
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = getattr(t, "_saved", None)
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, tuple) else (s,)) if isinstance(x, torch.Tensor))
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
F = torch.nn.functional
for _name in ("conv2d", "batch_norm", "relu", "max_pool2d", "interpolate"):
    setattr(F, _name, _ns[_name])
torch.cat = _ns["cat"]
torch.Tensor.__iadd__ = _ns["_iadd"]
torch.Tensor.to = _ns["_tensor_to"]
torch.Tensor.backward = _ns["_backward"]
torch.nn.Module.double = _ns["_module_double"]
_new = _ns["_new"]
# ----


class HostTensor(object):
    """A CPU tensor from the DataLoader's default_collate (host memory: the stand-in has none); .to("cuda")
    copies it to the device in its own dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def to(self, device, non_blocking=False):
        return _new(self.shape, self.dtype)


# ---- torch.nn modules (stand-in gap: the stand-in's nn has Module, Parameter and a bytes-only Conv2d)
class Conv2d(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        torch.nn.Module.__init__(self)
        self.stride, self.padding = stride, padding
        self.weight = torch.nn.Parameter(_new((out_channels, in_channels, kernel_size, kernel_size), torch.float32))
        self.weight.shape = (out_channels, in_channels, kernel_size, kernel_size)
        if bias:
            self.bias = torch.nn.Parameter(_new((out_channels,), torch.float32))
            self.bias.shape = (out_channels,)
        else:
            self.bias = None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)


class BatchNorm2d(torch.nn.Module):
    def __init__(self, num_features):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_new((num_features,), torch.float32))
        self.weight.shape = (num_features,)
        self.bias = torch.nn.Parameter(_new((num_features,), torch.float32))
        self.bias.shape = (num_features,)
        self.register_buffer("running_mean", _new((num_features,), torch.float32))
        self.register_buffer("running_var", _new((num_features,), torch.float32))

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training)


class ReLU(torch.nn.Module):
    def __init__(self, inplace=False):
        torch.nn.Module.__init__(self)
        self.inplace = inplace

    def forward(self, x):
        return F.relu(x, inplace=self.inplace)


class MaxPool2d(torch.nn.Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        torch.nn.Module.__init__(self)
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class Identity(torch.nn.Module):
    def forward(self, x, *args):
        return x


class Sequential(torch.nn.Module):
    def __init__(self, *mods):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


# ---- torchvision.models.resnet (Bottleneck, ResNet-50), as segmentation_models_pytorch's ResNetEncoder uses it
class Bottleneck(torch.nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        torch.nn.Module.__init__(self)
        self.conv1 = Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = BatchNorm2d(planes)
        self.conv2 = Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = BatchNorm2d(planes)
        self.conv3 = Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = BatchNorm2d(planes * 4)
        self.relu = ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNetEncoder(torch.nn.Module):
    """segmentation_models_pytorch.encoders.resnet.ResNetEncoder (resnet50), depth 5, in_channels=12: smp
    patches conv1 to 12 input channels (the pretrained RGB kernels repeated and rescaled)."""

    def __init__(self, in_channels=12, layers=(3, 4, 6, 3)):
        torch.nn.Module.__init__(self)
        self.inplanes = 64
        self.conv1 = Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = BatchNorm2d(64)
        self.relu = ReLU(inplace=True)
        self.maxpool = MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.out_channels = (in_channels, 64, 256, 512, 1024, 2048)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = Sequential(Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                    BatchNorm2d(planes * 4))
        mods = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        for _ in range(1, blocks):
            mods.append(Bottleneck(self.inplanes, planes))
        return Sequential(*mods)

    def forward(self, x):
        features = [x]
        x = self.relu(self.bn1(self.conv1(x)))
        features.append(x)
        x = self.layer1(self.maxpool(x))
        features.append(x)
        x = self.layer2(x)
        features.append(x)
        x = self.layer3(x)
        features.append(x)
        x = self.layer4(x)
        features.append(x)
        return features


# ---- segmentation_models_pytorch.decoders.unet (UnetDecoder, DecoderBlock), base (Conv2dReLU, SegmentationHead)
class Conv2dReLU(Sequential):
    def __init__(self, in_channels, out_channels, kernel_size, padding=0):
        Sequential.__init__(self, Conv2d(in_channels, out_channels, kernel_size, padding=padding, bias=False),
                            BatchNorm2d(out_channels), ReLU(inplace=True))


class DecoderBlock(torch.nn.Module):
    def __init__(self, in_channels, skip_channels, out_channels):
        torch.nn.Module.__init__(self)
        self.conv1 = Conv2dReLU(in_channels + skip_channels, out_channels, 3, padding=1)
        self.attention1 = Identity()
        self.conv2 = Conv2dReLU(out_channels, out_channels, 3, padding=1)
        self.attention2 = Identity()

    def forward(self, x, skip=None):
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
            x = self.attention1(x)
        x = self.conv1(x)
        x = self.conv2(x)
        x = self.attention2(x)
        return x


class UnetDecoder(torch.nn.Module):
    def __init__(self, encoder_channels, decoder_channels=(256, 128, 64, 32, 16)):
        torch.nn.Module.__init__(self)
        encoder_channels = encoder_channels[1:][::-1]
        head_channels = encoder_channels[0]
        in_channels = [head_channels] + list(decoder_channels[:-1])
        skip_channels = list(encoder_channels[1:]) + [0]
        self.center = Identity()
        for i, (ic, sc, oc) in enumerate(zip(in_channels, skip_channels, decoder_channels)):
            setattr(self, "block%d" % i, DecoderBlock(ic, sc, oc))
        self.n_blocks = len(decoder_channels)

    def forward(self, *features):
        features = features[1:]
        features = features[::-1]
        head = features[0]
        skips = features[1:]
        x = self.center(head)
        for i in range(self.n_blocks):
            skip = skips[i] if i < len(skips) else None
            x = getattr(self, "block%d" % i)(x, skip)
        return x


class SegmentationHead(Sequential):
    def __init__(self, in_channels, out_channels, kernel_size=3):
        Sequential.__init__(self, Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
                            Identity(), Identity())


class Unet(torch.nn.Module):
    """segmentation_models_pytorch.Unet(encoder_name, encoder_weights, in_channels, classes)."""

    def __init__(self, encoder_name="resnet50", encoder_weights="imagenet", in_channels=12, classes=10):
        torch.nn.Module.__init__(self)
        assert encoder_name == "resnet50"
        self.encoder = ResNetEncoder(in_channels)
        self.decoder = UnetDecoder(self.encoder.out_channels)
        self.segmentation_head = SegmentationHead(16, classes)

    def forward(self, x):
        features = self.encoder(x)
        decoder_output = self.decoder(*features)
        masks = self.segmentation_head(decoder_output)
        return masks


# ---- the training script
BANDS = ["B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B11", "B12"]
CLASSES = ["background", "winter_wheat", "winter_barley", "winter_rapeseed", "maize", "sugar_beet",
           "potato", "grassland", "spring_barley", "other"]
CFG = {"chip_size": 512, "batch_size": 16, "epochs": 60, "lr": 3e-4, "num_workers": 8,
       "train_dir": "/data/s2_iacs_nds_2023/chips512/train"}


def train_loader(n_batches=2868):
    """DataLoader(S2Chips(...), batch_size=16, shuffle=True, num_workers=8, pin_memory=True): each chip is
    rasterio's uint16 read divided by 10000.0 and normalised with float64 band statistics -> float64."""
    b, s = CFG["batch_size"], CFG["chip_size"]
    for _ in range(n_batches):
        yield HostTensor((b, len(BANDS), s, s), torch.float64), HostTensor((b, s, s), torch.uint8)


def main():
    device = "cuda"
    model = Unet("resnet50", encoder_weights="imagenet", in_channels=len(BANDS), classes=len(CLASSES))
    model.to(device)
    model = model.double()
    n_params = sum(p.nbytes // {"float32": 4, "float64": 8}[p.dtype] for p in model.parameters())
    print("smp.Unet(resnet50), %d bands, %d classes: %.1fM parameters" % (len(BANDS), len(CLASSES), n_params / 1e6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=CFG["lr"], weight_decay=1e-4)

    for epoch in range(CFG["epochs"]):
        model.train()
        for step, (images, masks) in enumerate(train_loader()):
            images = images.to(device, non_blocking=True)
            masks = masks.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            logits = model(images)
            loss = F.cross_entropy(logits, masks)
            loss.backward()
            optimizer.step()
            if step % 50 == 0:
                print("epoch %d step %d" % (epoch, step))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
