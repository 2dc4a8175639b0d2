"""train_visdrone.py -- YOLOv8x (68M parameters) fine-tuned on drone footage (VisDrone: tiny pedestrians and
cars) on one 24 GB card, with a plain `LD_PRELOAD=liboomguard.so`.  The trainer is a trimmed copy of
Ultralytics' loop: mixed precision on (autocast fp16 + GradScaler, the default amp=True), AdamW, batch 16.
At imgsz=640 the step peaks at ~11 GiB and trained fine for a week.  For the small objects the user now
trains at imgsz=1280, batch still 16:

    model = DetectionModel("yolov8x.yaml").cuda(); model.load(weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=7.14e-4)
    for imgs, targets in train_loader:                      # imgsz=1280, batch=16
        with torch.autocast("cuda"):                         # amp=True
            preds = model(imgs.cuda().half() / 255)
            loss = criterion(preds, targets)
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()

Four times the pixels: every feature map of the backbone, neck and head is 4x larger (the activations go
from ~10 GiB to ~40 GiB; the weights are ~0.3 GiB).  The first forward pass fails in the backbone's third C2f
block (stride 16), inside a Conv's SiLU, 23.4 GiB in and asking for 62.5 MiB; AMP was already on, the
activations are already fp16.

An expert: the batch has to shrink with the resolution -- batch 4 at 1280 keeps the same activation memory
as batch 16 at 640 (Ultralytics accumulates gradients to a nominal batch of 64 anyway, so the training
recipe does not change) -- or train on 640 crops/tiles of the high-resolution frames (SAHI-style slicing)
and infer at full size; activation checkpointing of the backbone would also work at a cost in time.  Not
mixed precision (already on), not the optimizer state or the weights (tiny), not the cache, fragmentation or
inference.
"""
import sys

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

imgsz = 1280
batch_size = 16


class BatchNorm2d(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(c * 4, device="cuda"))
        self.bias = nn.Parameter(torch.empty(c * 4, device="cuda"))
        self.register_buffer("running_mean", torch.empty(c * 4, device="cuda"))
        self.register_buffer("running_var", torch.empty(c * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes, device="cuda")
        out._saved = x
        return out


def silu(x):
    out = torch.empty(x.nbytes, device="cuda")
    out._saved = x
    return torch._derive(out, x)


class Conv(nn.Module):
    """Ultralytics' Conv: Conv2d (no bias) + BatchNorm2d + SiLU."""

    def __init__(self, c1, c2, k=1, s=1):
        nn.Module.__init__(self)
        self.conv = nn.Conv2d(c1, c2, k, s, bias=False, device="cuda")
        self.bn = BatchNorm2d(c2)

    def forward(self, x):
        return silu(self.bn(self.conv(x)))


def cat(tensors):
    out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
    out._saved = tensors[-1]
    out._inputs = tensors
    return torch._derive(out, *tensors)


class Bottleneck(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.cv1 = Conv(c, c, 3)
        self.cv2 = Conv(c, c, 3)

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        out = torch.empty(y.nbytes, device="cuda")          # shortcut: x + cv2(cv1(x))
        out._saved = y
        return torch._derive(out, y, x)


class C2f(nn.Module):
    def __init__(self, c1, c2, n):
        nn.Module.__init__(self)
        self.c = c2 // 2
        self.cv1 = Conv(c1, c2)
        self.m = [Bottleneck(self.c) for _ in range(n)]
        for i, b in enumerate(self.m):
            setattr(self, "m%d" % i, b)
        self.cv2 = Conv((2 + n) * self.c, c2)

    def forward(self, x):
        y = self.cv1(x)
        halves = [y.view(), y.view()]            # chunk(2, 1): views of y
        halves[0].nbytes = halves[1].nbytes = y.nbytes // 2
        outs = list(halves)
        for b in self.m:
            outs.append(b(outs[-1]))
        return self.cv2(cat(outs))


class DetectionModel(nn.Module):
    """YOLOv8x: width 1.25, depth 1.0 (channels 80-160-320-640-640)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.b0 = Conv(3, 80, 3, 2)
        self.b1 = Conv(80, 160, 3, 2)
        self.b2 = C2f(160, 160, 3)
        self.b3 = Conv(160, 320, 3, 2)
        self.b4 = C2f(320, 320, 6)
        self.b5 = Conv(320, 640, 3, 2)
        self.b6 = C2f(640, 640, 6)
        self.b7 = Conv(640, 640, 3, 2)
        self.b8 = C2f(640, 640, 3)
        self.up_p4 = C2f(1280, 640, 3)                  # neck, top-down: P5 upsampled + P4
        self.up_p3 = C2f(960, 320, 3)                   # P4 upsampled + P3
        self.down_p4 = C2f(960, 640, 3)                 # bottom-up
        self.down_p5 = C2f(1280, 640, 3)
        self.down3 = Conv(320, 320, 3, 2)
        self.down4 = Conv(640, 640, 3, 2)
        self.detect3 = Conv(320, 144, 1)
        self.detect4 = Conv(640, 144, 1)
        self.detect5 = Conv(640, 144, 1)

    def forward(self, x):
        x = self.b1(self.b0(x))
        x = self.b2(x)
        p3 = self.b4(self.b3(x))
        p4 = self.b6(self.b5(p3))
        p5 = self.b8(self.b7(p4))
        t4 = self.up_p4(cat([F.interpolate(p5, 2.0), p4]))
        t3 = self.up_p3(cat([F.interpolate(t4, 2.0), p3]))
        d4 = self.down_p4(cat([self.down3(t3), t4]))
        d5 = self.down_p5(cat([self.down4(d4), p5]))
        return [self.detect3(t3), self.detect4(d4), self.detect5(d5)]


def main():
    model = DetectionModel()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=7.14e-4)
    for epoch in range(100):
        for i in range(400):
            imgs = torch.empty(batch_size * 3 * imgsz * imgsz * 2, device="cuda")         # uint8 -> half
            with torch.autocast("cuda"):
                preds = model(imgs)
                loss = torch.empty(512, device="cuda")
                loss._saved = preds[0]
                loss._params = preds[0]._params
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del imgs, preds, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
