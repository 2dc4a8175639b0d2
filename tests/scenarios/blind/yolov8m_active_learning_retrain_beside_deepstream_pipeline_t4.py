"""Nightly active-learning retrain of a YOLOv8m detector on the same Tesla T4 that runs the site's
DeepStream pipeline: deepstream-app holds 10.4 GiB of the 15 GiB card around the clock, and the
retrain (batch 16, 640 px, AMP), which needs ~5.5 GiB, runs out of memory in its first forward pass.

The real setup (a warehouse yard camera system, one T4 edge server): `deepstream-app -c yard.txt`
runs 12 RTSP streams through nvinfer (a TensorRT FP16 engine of the current detector, batch 12, and
two secondary classifiers), nvtracker (NvDCF with visual features) and the OSD/encoder, started by
systemd.  A cron job at 02:00 runs the retrain on the frames the operators corrected that day:

    from ultralytics import YOLO
    model = YOLO("runs/yard/weights/best.pt")          # yolov8m, 6 classes (forklift, pallet, person, ...)
    model.train(data="yard_al.yaml", epochs=30, imgsz=640, batch=16, device=0, workers=4,
                amp=True, optimizer="auto", cache=False, name="al_nightly")

ultralytics' trainer: the model in fp32 on the GPU, a ModelEMA copy of it on the GPU, AdamW (chosen
by optimizer="auto" for a short run), GradScaler + torch.cuda.amp.autocast around the forward pass.

Arithmetic (15 GiB T4, nvidia-smi: deepstream-app 10.4 GiB).  This process: CUDA context 0.5 GiB;
weights 25.9 M fp32 = 104 MB, the EMA copy 104 MB; the first forward at batch 16 x 3 x 640 x 640 under
autocast saves ~0.29 GiB per image of fp16 feature maps for backward (conv, BN and SiLU outputs of
every Conv; the stem's 48 x 320 x 320 and the 96 x 160 x 160 C2f maps dominate), ~4.7 GiB in all; the
gradients (104 MB) and AdamW's moments (208 MB) come after.  Alone on the card the job peaks at
~5.0 GiB allocated (~5.5 GiB with its context) and fits easily (it ran fine on the workstation where it was developed).  Beside
deepstream-app there is 15 - 10.4 - 0.5 = ~4.1 GiB, and the first forward fails in the PAN neck
(C2f n15, at 1/8 scale), at an 18.75 MiB fp16 feature map, with ~3.9 GiB allocated and ~0.15 GiB
cached.  At batch 8 the step peaks at ~2.6 GiB and fits beside the pipeline.

What an expert says first: the card is shared: another process (deepstream-app, 10.4 GiB) holds most
of it; either pause/stop the pipeline while retraining, or run the retrain on another GPU; if it must
run beside the pipeline, halve the batch (batch=8 needs ~2.6 GiB) and accept the slower epochs.
Wrong advice: mixed precision (AMP is on already), bf16 (a T4 has no bf16), expandable_segments or
empty_cache (nothing cached), restarting this process (the memory is the pipeline's, not a dead
context), gradient checkpointing, inference_mode (this is training).
"""
import copy

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

IMGSZ = 640
BATCH = 16
EPOCHS = 30
NC = 6


class _Autograd(object):
    """What autograd keeps for backward, linked as its graph links it (stand-in)."""
    last = None


def saved(t):
    t._saved = _Autograd.last
    _Autograd.last = t


def feature_map(b, c, h, w, dtype):
    t = torch.empty(b * c * h * w, dtype=dtype, device="cuda")
    t.bchw = (b, c, h, w)
    return t


class Conv(nn.Module):
    """ultralytics.nn.modules.Conv: Conv2d + BatchNorm2d + SiLU."""

    def __init__(self, c1, c2, k=3, s=1):
        nn.Module.__init__(self)
        self.conv = nn.Parameter(torch.empty(c2 * c1 * k * k, dtype=torch.float32, device="cuda"))
        self.bn = nn.Parameter(torch.empty(2 * c2, dtype=torch.float32, device="cuda"))
        self.c2, self.s = c2, s

    def forward(self, x):
        b, _, h, w = x.bchw
        dtype = torch.float16 if torch.is_autocast_enabled() else torch.float32
        y = feature_map(b, self.c2, h // self.s, w // self.s, dtype)      # conv (autocast: fp16)
        z = feature_map(b, self.c2, h // self.s, w // self.s, dtype)      # bn (saved: silu's input)
        a = feature_map(b, self.c2, h // self.s, w // self.s, dtype)      # silu
        if torch.is_grad_enabled():
            saved(y)
            saved(z)
            saved(a)
        return a


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        nn.Module.__init__(self)
        self.cv1 = Conv(c, c, 3)
        self.cv2 = Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        if self.add:
            b, c, h, w = y.bchw
            y = feature_map(b, c, h, w, y.dtype)                            # x + cv2(cv1(x))
        return y


class C2f(nn.Module):
    def __init__(self, c1, c2, n, shortcut=False):
        nn.Module.__init__(self)
        self.cv1 = Conv(c1, c2, 1)
        self.n = n
        for i in range(n):
            setattr(self, "m%d" % i, Bottleneck(c2 // 2, shortcut))
        self.cv2 = Conv((2 + n) * c2 // 2, c2, 1)

    def forward(self, x):
        y = self.cv1(x)
        b, c, h, w = y.bchw
        parts = [y]
        for i in range(self.n):
            half = feature_map(b, c // 2, h, w, y.dtype)                   # chunk(2, 1)[-1]
            parts.append(getattr(self, "m%d" % i)(half))
        cat = feature_map(b, c // 2 * (2 + self.n), h, w, y.dtype)         # torch.cat(parts, 1)
        if torch.is_grad_enabled():
            saved(cat)
        return self.cv2(cat)


class HeadBranch(nn.Module):
    """Detect.cv2[i] / cv3[i]: Conv, Conv, then a 1x1 Conv2d to the box (4 x 16 DFL bins) or class outputs."""

    def __init__(self, c1, c2):
        nn.Module.__init__(self)
        self.c0 = Conv(c1, c2)
        self.c1 = Conv(c2, c2)

    def forward(self, x):
        return self.c1(self.c0(x))


class DetectionModel(nn.Module):
    """yolov8m.yaml: backbone (Conv, C2f x4, SPPF), PAN neck, Detect head for 6 classes."""

    def __init__(self):
        nn.Module.__init__(self)
        self.b0 = Conv(3, 48, 3, 2)
        self.b1 = Conv(48, 96, 3, 2)
        self.b2 = C2f(96, 96, 2, True)
        self.b3 = Conv(96, 192, 3, 2)
        self.b4 = C2f(192, 192, 4, True)
        self.b5 = Conv(192, 384, 3, 2)
        self.b6 = C2f(384, 384, 4, True)
        self.b7 = Conv(384, 576, 3, 2)
        self.b8 = C2f(576, 576, 2, True)
        self.n12 = C2f(960, 384, 2)
        self.n15 = C2f(576, 192, 2)
        self.n16 = Conv(192, 192, 3, 2)
        self.n18 = C2f(576, 384, 2)
        self.n19 = Conv(384, 384, 3, 2)
        self.n21 = C2f(960, 576, 2)
        for i, c in enumerate((192, 384, 576)):      # Detect: cv2 (box, 64 ch) and cv3 (cls, 192 ch) per level
            setattr(self, "cv2_%d" % i, HeadBranch(c, 64))
            setattr(self, "cv3_%d" % i, HeadBranch(c, 192))

    def _up_cat(self, a, b_):
        b, c, h, w = b_.bchw
        t = feature_map(b, a.bchw[1] + c, h, w, a.dtype)                   # cat(upsample(a), b)
        t.bchw = (b, a.bchw[1] + c, h, w)
        return t

    def forward(self, imgs):
        x = self.b1(self.b0(imgs))
        p3 = self.b4(self.b3(self.b2(x)))
        p4 = self.b6(self.b5(p3))
        p5 = self.b8(self.b7(p4))
        h4 = self.n12(self._up_cat(p5, p4))
        h3 = self.n15(self._up_cat(h4, p3))
        d4 = self.n18(self._up_cat(self.n16(h3), h4))
        d5 = self.n21(self._up_cat(self.n19(d4), p5))
        return [(getattr(self, "cv2_%d" % i)(p), getattr(self, "cv3_%d" % i)(p)) for i, p in enumerate((h3, d4, d5))]


class ModelEMA(object):
    """ultralytics.utils.torch_utils.ModelEMA: a deep copy of the model, on the same device."""

    def __init__(self, model, decay=0.9999):
        self.ema = copy.deepcopy(model).eval()
        self.decay = decay


class v8DetectionLoss(object):
    def __call__(self, preds, batch):
        loss = torch.empty(3, dtype=torch.float32, device="cuda")
        loss._saved = _Autograd.last
        return torch._derive(loss, *[t for level in preds for t in level])


class DetectionTrainer(object):
    def __init__(self, model, batch, imgsz):
        self.model = model
        self.ema = ModelEMA(model)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=0.001, betas=(0.9, 0.999), weight_decay=0.0)
        self.scaler = torch.cuda.amp.GradScaler(enabled=True)
        self.criterion = v8DetectionLoss()
        self.batch_size, self.imgsz = batch, imgsz

    def preprocess_batch(self):
        imgs = feature_map(self.batch_size, 3, self.imgsz, self.imgsz, torch.float32)   # uint8 -> float / 255
        return {"img": imgs}

    def _do_train(self, epochs):
        self.model.train()
        for epoch in range(epochs):
            for i in range(2):
                batch = self.preprocess_batch()
                _Autograd.last = None
                with torch.cuda.amp.autocast(True):
                    preds = self.model(batch["img"])
                    loss = self.criterion(preds, batch)
                self.scaler.scale(loss)
                scen_truth.backward(loss)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad()
                del preds, loss, batch


def main():
    model = DetectionModel()            # YOLO("runs/yard/weights/best.pt").model, moved to cuda:0
    trainer = DetectionTrainer(model, BATCH, IMGSZ)
    trainer._do_train(EPOCHS)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
