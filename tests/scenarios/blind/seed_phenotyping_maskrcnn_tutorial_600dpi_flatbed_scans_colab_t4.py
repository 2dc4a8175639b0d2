"""train_seeds.py -- a plant-science student's course project: instance segmentation of wheat kernels on
flatbed scans, following the torchvision "Object Detection Finetuning Tutorial" (PennFudanPed) step by step
on Colab (Pro, High-RAM runtime, a T4: 15 GB).  The tutorial's code, unchanged but for the paths:

    class SeedDataset(torch.utils.data.Dataset):           # the tutorial's PennFudanDataset
        def __getitem__(self, idx):
            img = read_image(img_path)                      # the scan as exported by the scanner
            mask = read_image(mask_path)                    # instance-id PNG exported from CVAT, same size
            obj_ids = torch.unique(mask)[1:]
            masks = (mask == obj_ids[:, None, None]).to(dtype=torch.uint8)
            ...
            target["masks"] = tv_tensors.Mask(masks)
            img, target = self.transforms(img, target)     # RandomHorizontalFlip, ToDtype(float, scale=True)

    model = maskrcnn_resnet50_fpn(weights="DEFAULT"); (heads replaced for 2 classes)
    data_loader = DataLoader(dataset, batch_size=2, shuffle=True, collate_fn=utils.collate_fn)
    optimizer = torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=0.0005)
    for epoch in range(num_epochs):
        train_one_epoch(model, optimizer, data_loader, device, epoch, print_freq=10)   # references/engine.py

PennFudan's images are ~500 x 350 px with 1-4 pedestrians.  The student's scans are A4 trays at 600 dpi,
4960 x 7016 px (34.8 MP), each with 90-130 kernels, so one scan's instance masks are 118 x 34.8 MP =
4.1 GB of uint8, moved to the GPU whole by engine.py's `targets = [{k: v.to(device) ...}]`.  Inside the
model, GeneralizedRCNNTransform resizes every image to 800 px on its short side, and its masks with it:
`interpolate(mask[:, None].float(), ...)` -- a float32 copy of all 118 full-resolution masks, 16.4 GB, on a
card that holds 14.5 GiB.  The very first iteration fails there, in the training forward (the transform),
before the backbone has seen a pixel.  With batch_size=1 it fails the same way: one scan's masks, as floats,
are larger than the card.

An expert: the input is far larger than anything the model uses -- the model itself shrinks the scan to
~800 x 1131 px (a 0.16 scale) before the backbone.  Cap the input size in the Dataset: tile each scan into
crops of about 1024-1333 px (the kernels stay ~90 px wide, which a global 0.16 downscale would shrink to 15),
or downscale image and masks on the CPU before they are stacked and sent to the GPU.  Wrong first advice:
a smaller batch (batch 1 fails too), mixed precision or gradient checkpointing (the float copy of the masks is
not an activation and autocast does not touch it), expandable_segments / empty_cache (nothing is cached: the
16.4 GB request is larger than the whole card), inference_mode (it is training).  A bigger GPU (A100 40GB)
would run it, wastefully; it is not the first fix.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


# ---------------------------------------------------------------------------------------------------------
# What the simulator's torch lacks, written in the shape of the real API and defined as if in the real
# libraries' files (so that a failing stack shows the frames it shows with PyTorch and torchvision): host
# (CPU) tensors with shapes, the Tensor methods torchvision's transform calls (.float(), .byte(),
# indexing), interpolate(size=...), and torchvision's Mask R-CNN (GeneralizedRCNNTransform,
# _resize_image_and_masks) as torchvision writes them.
# ---------------------------------------------------------------------------------------------------------
def _as_library(path, src):
    ns = {"torch": torch, "nn": nn, "F": F, "__name__": os.path.splitext(os.path.basename(path))[0]}
    exec(compile(src, path, "exec"), ns)
    return ns


_torch_side = _as_library(os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), r'''
_ITEM = {"uint8": 1, "float32": 4, "int64": 8}


class HostTensor(object):
    """A tensor in host memory (what the Dataset and the DataLoader hand over)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to(self, device):
        if self.dtype == "int64":       # the stand-in has no int64: the same bytes as uint8
            t = torch.empty(self.numel() * 8, dtype=torch.uint8, device=device)
        else:
            t = torch.empty(self.numel(), dtype=self.dtype, device=device)
        t.shape = self.shape
        t._dtype = self.dtype
        return t


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _tensor_float(self):
    """Tensor.float(): a float32 copy (a new tensor unless it already is float32)."""
    if self.dtype == "float32":
        return self
    out = torch.empty(_numel(self.shape), dtype=torch.float32, device=self.device)
    out.shape = self.shape
    return out


def _tensor_byte(self):
    out = torch.empty(_numel(self.shape), dtype=torch.uint8, device=self.device)
    out.shape = self.shape
    return out


def _tensor_getitem(self, idx):
    """mask[:, None] / x[0] / x[:, 0]: a view of the same storage with the shape indexed."""
    v = self.view()
    shape = list(self.shape)
    if not isinstance(idx, tuple):
        idx = (idx,)
    out, i = [], 0
    for k in idx:
        if k is None:
            out.append(1)
        elif isinstance(k, int):
            i += 1
        else:
            out.append(shape[i])
            i += 1
    v.shape = tuple(out + shape[i:])
    return v


torch.Tensor.numel_ = lambda self: _numel(self.shape)
torch.Tensor.float = _tensor_float
torch.Tensor.byte = _tensor_byte
torch.Tensor.__getitem__ = _tensor_getitem


_plain_interpolate = F.interpolate


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None):
    """torch.nn.functional.interpolate with size=(h, w): a new tensor of the input's leading dims at (h, w)."""
    scale2 = float(size[0] * size[1]) / (input.shape[-2] * input.shape[-1])
    out = _plain_interpolate(input, scale_factor=scale2 ** 0.5)
    out.shape = tuple(input.shape[:-2]) + tuple(size)
    out._dtype = input.dtype
    return out


F.interpolate = interpolate
''')
HostTensor = _torch_side["HostTensor"]

_tv = _as_library("/usr/local/lib/python3.10/dist-packages/torchvision/models/detection/mask_rcnn.py", r'''
def _normalize_like(image):
    out = torch.empty(image.numel_(), dtype=torch.float32, device=image.device)
    out.shape = image.shape
    return out


def _resize_image_and_masks(image, self_min_size, self_max_size, target=None):
    im_shape = image.shape[-2:]
    min_size = float(min(im_shape))
    max_size = float(max(im_shape))
    scale = min(self_min_size / min_size, self_max_size / max_size)
    size = (int(im_shape[0] * scale), int(im_shape[1] * scale))
    image = torch.nn.functional.interpolate(image[None], size=size, mode="bilinear", align_corners=False)[0]
    if target is None:
        return image, target
    if "masks" in target:
        mask = target["masks"]
        mask = torch.nn.functional.interpolate(mask[:, None].float(), size=size)[:, 0].byte()
        target["masks"] = mask
    return image, target


class GeneralizedRCNNTransform(nn.Module):
    def __init__(self, min_size=800, max_size=1333):
        nn.Module.__init__(self)
        self.min_size, self.max_size = min_size, max_size

    def normalize(self, image):
        return _normalize_like(image)            # (image - mean[:, None, None]) / std[:, None, None]

    def resize(self, image, target=None):
        return _resize_image_and_masks(image, float(self.min_size), float(self.max_size), target)

    def forward(self, images, targets=None):
        images = [img for img in images]
        if targets is not None:
            targets = [dict((k, v) for k, v in t.items()) for t in targets]
        for i in range(len(images)):
            image = images[i]
            target_index = targets[i] if targets is not None else None
            image = self.normalize(image)
            image, target_index = self.resize(image, target_index)
            images[i] = image
            if targets is not None and target_index is not None:
                targets[i] = target_index
        batched = torch.empty(sum(im.numel_() for im in images), dtype=torch.float32, device=images[0].device)
        return batched, targets


def _params(module, name, numel, trainable=True):
    setattr(module, name, nn.Parameter(torch.empty(numel, dtype=torch.float32, device="cuda"), trainable))


class BackboneWithFPN(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.body = nn.Module()
        _params(self.body, "conv1_layer1", 225_344, trainable=False)     # trainable_backbone_layers=3
        _params(self.body, "layer2", 1_219_584)
        _params(self.body, "layer3", 7_098_368)
        _params(self.body, "layer4", 14_964_736)
        self.fpn = nn.Module()
        _params(self.fpn, "inner_and_layer_blocks", 3_344_384)

    def forward(self, x):
        feats = []
        for frac in (1 / 16., 1 / 64., 1 / 256., 1 / 1024.):           # P2..P5, 256 channels
            feats.append(torch.empty(int(x.nbytes * frac * 256 / 3 / 4), dtype=torch.float32, device="cuda"))
        return feats


class MaskRCNN(nn.Module):
    def __init__(self, num_classes):
        nn.Module.__init__(self)
        self.transform = GeneralizedRCNNTransform(800, 1333)
        self.backbone = BackboneWithFPN()
        self.rpn = nn.Module()
        _params(self.rpn, "head", 593_935)
        self.roi_heads = nn.Module()
        _params(self.roi_heads, "box_head", 13_895_680)
        _params(self.roi_heads, "box_predictor", 1024 * num_classes * 5 + num_classes * 5)
        _params(self.roi_heads, "mask_head", 2_360_320)
        _params(self.roi_heads, "mask_predictor", 256 * 256 * 4 + 256 + 256 * num_classes + num_classes)

    def forward(self, images, targets=None):
        images, targets = self.transform(images, targets)
        features = self.backbone(images)
        losses = {}
        for k in ("loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"):
            losses[k] = torch.empty(4, dtype=torch.float32, device="cuda")
            losses[k]._saved = features
        return losses


def maskrcnn_resnet50_fpn(num_classes=2):
    return MaskRCNN(num_classes)
''')
maskrcnn_resnet50_fpn = _tv["maskrcnn_resnet50_fpn"]      # torchvision.models.detection.maskrcnn_resnet50_fpn


# ---------------------------------------------------------------------------------------------------------
# The student's project (the tutorial's code)
# ---------------------------------------------------------------------------------------------------------
SCANS = [  # (scan file, kernels annotated) -- A4 trays, 600 dpi, 4960 x 7016 px
    ("tray_031.png", 118), ("tray_007.png", 96), ("tray_044.png", 127), ("tray_012.png", 104),
    ("tray_020.png", 91), ("tray_039.png", 112),
]
H, W = 7016, 4960


class SeedDataset(object):
    def __init__(self, root, transforms):
        self.root, self.transforms = root, transforms
        self.imgs = [s for s, _ in SCANS]

    def __getitem__(self, idx):
        num_objs = SCANS[idx][1]
        img = HostTensor((3, H, W), "float32")                          # ToDtype(torch.float, scale=True)
        masks = HostTensor((num_objs, H, W), "uint8")                   # (mask == obj_ids[:, None, None])
        boxes = HostTensor((num_objs, 4), "float32")
        target = {"boxes": boxes, "masks": masks, "labels": HostTensor((num_objs,), "int64"),
                  "image_id": idx, "area": HostTensor((num_objs,), "float32"),
                  "iscrowd": HostTensor((num_objs,), "int64")}
        return img, target

    def __len__(self):
        return len(self.imgs)


def collate_fn(batch):
    return tuple(zip(*batch))


def data_loader(dataset, batch_size):
    order = list(range(len(dataset)))          # shuffle=True; this epoch's order as it came
    for i in range(0, len(order), batch_size):
        yield collate_fn([dataset[j] for j in order[i:i + batch_size]])


def train_one_epoch(model, optimizer, data_loader, device, epoch, print_freq, scaler=None):
    model.train()
    for i, (images, targets) in enumerate(data_loader):
        images = list(image.to(device) for image in images)
        targets = [{k: v.to(device) if hasattr(v, "to") else v for k, v in t.items()} for t in targets]
        with torch.autocast("cuda", enabled=scaler is not None):
            loss_dict = model(images, targets)
            losses = sum(loss.nbytes for loss in loss_dict.values())
        optimizer.zero_grad()
        scen_truth.backward(loss_dict["loss_mask"])
        optimizer.step()
        if i % print_freq == 0:
            print("Epoch: [%d] [%d] loss %s" % (epoch, i, losses))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dataset = SeedDataset("data/wheat_scans", transforms=None)
    model = maskrcnn_resnet50_fpn(num_classes=2)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=0.0005)
    print("model on GPU: %.0f MiB" % (torch.cuda.memory_allocated() / MiB))
    num_epochs = 10
    for epoch in range(num_epochs):
        train_one_epoch(model, optimizer, data_loader(dataset, batch_size=2), device, epoch, print_freq=10)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
