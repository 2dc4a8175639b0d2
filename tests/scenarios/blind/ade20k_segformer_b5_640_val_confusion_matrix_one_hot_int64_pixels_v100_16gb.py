"""evaluate_seg.py -- a student's semantic-segmentation project: SegFormer-B5 (Hugging Face, 85M parameters,
fp32) fine-tuned on ADE20K (150 classes, 640x640 as in the SegFormer paper) on a university V100 16GB
(15.3 GiB usable).  Training ran at batch 4.  The evaluation script computes mIoU, per-class IoU and a
normalised confusion matrix for the report, with a helper the student wrote earlier for an image-
classification project (1,000 classes, a batch of 256 labels -- a few MB there):

    def confusion_matrix(pred, target, num_classes):
        pred_oh = F.one_hot(pred, num_classes)               # (N, C) int64
        tgt_oh = F.one_hot(target, num_classes)
        return tgt_oh.T.float() @ pred_oh.float()             # (C, C)

    model.eval(); conf = torch.zeros(150, 150, device="cuda")
    with torch.no_grad():
        for batch in val_loader:                              # batch 16: "no gradients, so a bigger batch"
            logits = model(pixel_values=batch["pixel_values"].cuda()).logits            # 1/4 resolution
            upsampled = F.interpolate(logits, size=(640, 640), mode="bilinear")
            pred = upsampled.argmax(dim=1)
            valid = labels != 255
            conf += confusion_matrix(pred[valid], labels[valid], 150)

Here N is every valid pixel of the batch: 16 x 640 x 640 x ~92% = 6.0M pixels.  F.one_hot returns int64,
so each one-hot is 6.0M x 150 x 8 bytes = 6.7 GiB (the float copies for the matmul would be 3.4 GiB
each).  The forward pass fits (weights 0.3 GiB, the upsampled logits 3.7 GiB kept by their name); the
metric fails on the first batch at the second F.one_hot, a 6.7 GiB request with 3.0 GiB free and 1.1 GiB cached: 2.6 GiB
short even if every cached byte were usable.
Autograd is off.

An expert: the memory is in the metric, not the model: a one-hot confusion matrix over millions of
pixels.  Count it instead: torch.bincount(target * 150 + pred, minlength=150 * 150).view(150, 150) --
180 KB, what mmseg and torchmetrics do (or, keeping the helper, chunk the pixels).  Wrong advice: fp16
autocast (the one-hots are int64 and the copies float32 whatever autocast says), inference_mode
(autograd is already off), gradient checkpointing, expandable_segments/empty_cache (the shortfall is
real, not cached memory), a bigger GPU; a smaller eval batch only shrinks the waste (batch 4 still builds
~8 GiB of one-hots and copies per step).
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
NUM_CLASSES = 150
BATCH, H, W = 16, 640, 640


class Tensor64(object):
    """an int64 / float32 tensor of `numel` elements and its storage (the stand-in torch sizes memory in
    bytes and has no int64 dtype or shapes)"""

    def __init__(self, numel, itemsize, cols=1):
        self.numel, self.itemsize, self.cols = numel, itemsize, cols
        self.storage = torch.empty(numel * itemsize, device="cuda")

    @property
    def T(self):                             # a view
        v = Tensor64.__new__(Tensor64)
        v.numel, v.itemsize, v.cols, v.storage = self.numel, self.itemsize, self.cols, self.storage
        return v

    def float(self):
        return Tensor64(self.numel, 4, self.cols)

    def __matmul__(self, other):
        return Tensor64(self.cols * other.cols, 4, other.cols)

    def __getitem__(self, mask):             # boolean indexing: the valid pixels
        return Tensor64(int(self.numel * 0.92), self.itemsize)


def one_hot(t, num_classes):
    """torch.nn.functional.one_hot: (N,) -> (N, num_classes), always int64"""
    return Tensor64(t.numel * num_classes, 8, num_classes)


class F(object):
    one_hot = staticmethod(one_hot)

    @staticmethod
    def interpolate(logits, size, mode="bilinear"):
        return torch.empty(BATCH * NUM_CLASSES * size[0] * size[1] * 4, device="cuda")


# ---- the model, as far as memory goes: SegFormer-B5 weights (85M fp32), a forward under no_grad
class SegformerForSemanticSegmentation(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        stage_params = (3_300_000, 12_100_000, 43_600_000, 22_600_000)        # MiT-B5 stages 1-4
        for i, n in enumerate(stage_params):
            setattr(self, "encoder_block_%d" % i, nn.Parameter(torch.empty(n * 4, device="cuda")))
        self.decode_head = nn.Parameter(torch.empty(3_100_000 * 4, device="cuda"))

    def forward(self, pixel_values):
        stage1 = torch.empty(BATCH * 64 * (H // 4) * (W // 4) * 4 * 4, device="cuda")   # stage-1 blocks, transient
        del stage1
        head = torch.empty(BATCH * 3072 * (H // 4) * (W // 4) * 4, device="cuda")     # all-MLP head: concat at 1/4
        fused = torch.empty(BATCH * 768 * (H // 4) * (W // 4) * 4, device="cuda")
        del head
        logits = torch.empty(BATCH * NUM_CLASSES * (H // 4) * (W // 4) * 4, device="cuda")
        del fused
        return logits


class Output(object):
    def __init__(self, logits):
        self.logits = logits


def confusion_matrix(pred, target, num_classes):
    pred_oh = F.one_hot(pred, num_classes)                 # (N, C) int64
    tgt_oh = F.one_hot(target, num_classes)
    return tgt_oh.T.float() @ pred_oh.float()              # (C, C)


model = SegformerForSemanticSegmentation()
model.cuda().eval()
conf = torch.empty(NUM_CLASSES * NUM_CLASSES * 4, device="cuda")
print("weights %.2f GiB" % (torch.cuda.memory_allocated() / GiB))
try:
    with torch.no_grad():
        for step in range(2000 // BATCH):
            pixel_values = torch.empty(BATCH * 3 * H * W * 4, device="cuda")
            labels = Tensor64(BATCH * H * W, 8)                                     # int64, 255 = ignore
            logits = Output(model(pixel_values)).logits
            upsampled = F.interpolate(logits, size=(H, W), mode="bilinear")
            pred = Tensor64(BATCH * H * W, 8)                                       # upsampled.argmax(dim=1)
            valid = Tensor64(BATCH * H * W, 1)                                      # labels != 255
            print("batch %d forward done, allocated %.2f GiB" % (step, torch.cuda.memory_allocated() / GiB))
            cm = confusion_matrix(pred[valid], labels[valid], NUM_CLASSES)
            del cm
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
