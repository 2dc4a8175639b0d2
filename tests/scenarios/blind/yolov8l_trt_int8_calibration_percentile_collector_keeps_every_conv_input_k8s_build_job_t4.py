"""calibrate_int8.py -- the INT8 post-training quantization step of a model-build pipeline: a Kubernetes Job on a
Tesla T4 node (the deployment target) takes the trained YOLOv8-L detector (43.7M parameters, fp32), inserts
fake-quant input quantizers in front of every convolution (pytorch-quantization style), calibrates them on 512
validation images at 640x640, then exports to ONNX with Q/DQ nodes for `trtexec --int8`.

pytorch-quantization's own HistogramCalibrator keeps a 2048-bin histogram per quantizer.  After it lost mAP on
small objects, the team replaced it with an "exact" percentile calibrator of their own:

    class PercentileCollector:
        def __init__(self):
            self.samples = collections.defaultdict(list)
        def collect(self, name, x):
            self.samples[name].append(x.detach())         # the whole activation, kept for torch.quantile later
    ...
    with torch.no_grad():
        for images in calib_loader:                          # 128 batches of 4 images
            model(images.cuda())
    amax = {name: torch.quantile(torch.cat(v).abs().flatten(), 0.9999) for name, v in collector.samples.items()}

detach() drops autograd (there is none under no_grad) but keeps the storage: every convolution's input of every
calibration batch stays on the GPU.  At batch 4 x 3 x 640 x 640 the activations of one forward pass are ~0.8 GiB
(64 channels at 320x320 alone: 100 MiB; 128 at 160x160: 50 MiB per layer; ...), so memory rises by ~0.8 GiB per
batch and the T4 (15 GiB) is full during batch 17 of 128 -- in a convolution's output, the usual place.  The
model (~0.2 GiB as drawn here) and one forward pass alone need under 1.5 GiB.

What an expert says first: the collector keeps every activation tensor; reduce them as they come (running
histogram or a running top-k / amax per quantizer on the GPU, or move each sample to the CPU, or subsample a
few thousand values per batch) and drop the tensor.  Wrong advice: a smaller calibration batch (the total kept
is the same), empty_cache or expandable segments (nothing is cached, everything is referenced), inference_mode
or mixed precision or gradient checkpointing (no graph is kept; this is not training), a bigger GPU (the set of
512 images would need ~100 GiB), quantization (it is the job being done).
"""
import collections
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

BATCH, IMG = 4, 640
CALIB_IMAGES = 512


class PercentileCollector(object):
    """The team's replacement for HistogramCalibrator: keeps every input a quantizer sees."""

    def __init__(self):
        self.samples = collections.defaultdict(list)

    def collect(self, name, x):
        self.samples[name].append(x.detach())


collector = PercentileCollector()


class TensorQuantizer(torch.nn.Module):
    def __init__(self, name):
        torch.nn.Module.__init__(self)
        self.name = name
        self.calibrating = True

    def forward(self, x):
        if self.calibrating:
            collector.collect(self.name, x)
        return x


class QuantConv2d(torch.nn.Module):
    def __init__(self, name, cin, cout, k=3, stride=1):
        torch.nn.Module.__init__(self)
        self.input_quantizer = TensorQuantizer(name + ".input_quantizer")
        self.conv = torch.nn.Conv2d(cin, cout, k, stride=stride, device="cuda")

    def forward(self, x):
        return self.conv(self.input_quantizer(x))


class Upsample(torch.nn.Module):
    def forward(self, x):
        return F.interpolate(x, scale_factor=2.0, mode="nearest")


# (kind, in, out, kernel, stride): backbone, neck (FPN/PAN), head -- YOLOv8-L's widths, its C2f blocks drawn as
# their convolutions in sequence
PLAN = ([("conv", 3, 64, 3, 2), ("conv", 64, 128, 3, 2)] + [("conv", 128, 128, 3, 1)] * 3 +
        [("conv", 128, 256, 3, 2)] + [("conv", 256, 256, 3, 1)] * 6 +
        [("conv", 256, 512, 3, 2)] + [("conv", 512, 512, 3, 1)] * 6 +
        [("conv", 512, 512, 3, 2)] + [("conv", 512, 512, 3, 1)] * 3 + [("conv", 512, 512, 1, 1)] +   # SPPF
        [("up",)] + [("conv", 512, 512, 3, 1)] * 3 +
        [("up",)] + [("conv", 512, 256, 1, 1)] + [("conv", 256, 256, 3, 1)] * 3 +
        [("conv", 256, 256, 3, 2)] + [("conv", 256, 512, 1, 1)] + [("conv", 512, 512, 3, 1)] * 2 +
        [("conv", 512, 512, 3, 2)] + [("conv", 512, 512, 3, 1)] * 2 +
        [("conv", 512, 64, 3, 1), ("conv", 64, 64, 3, 1), ("conv", 64, 144, 1, 1)])                 # Detect head


class YOLOv8L(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = torch.nn.Module()                   # nn.Sequential: children "0", "1", ...
        for i, p in enumerate(PLAN):
            layer = Upsample() if p[0] == "up" else QuantConv2d("model.%d" % i, p[1], p[2], p[3], p[4])
            setattr(self.model, str(i), layer)

    def forward(self, x):
        for i in range(len(PLAN)):
            x = getattr(self.model, str(i))(x)
        return x


def calib_loader():
    for _ in range(CALIB_IMAGES // BATCH):
        yield BATCH * 3 * IMG * IMG                       # a letterboxed batch, float32 in [0, 1] (host)


model = YOLOv8L().cuda().eval()
try:
    with torch.no_grad():
        for step, nbytes in enumerate(calib_loader()):
            images = torch.empty(nbytes * 4, device="cuda")          # images.cuda(non_blocking=True)
            preds = model(images)
            del preds, images
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
amax = {name: len(v) for name, v in collector.samples.items()}     # torch.quantile(...) over each list
sys.exit(0)
