"""train_heads.py -- a head detector for crowd analytics (RetinaNet, ResNet-50-FPN, torchvision-style
code, 1024x1024 crops, batch 4, SGD, fp32) on one RTX A5000 24GB.  The training set mixes street
cameras (20-300 heads an image) with a few stadium and concert photos annotated head by head.  Anchors
are matched to ground truth the usual way:

    def assign(anchors, gt_boxes):               # anchors: [196416, 4], gt_boxes: [M, 4]
        iou = box_iou(anchors, gt_boxes)         # torchvision.ops.box_iou -> [N, M]
        max_iou, matched = iou.max(dim=1)
        ...
    # torchvision.ops.box_iou:
    #   lt = torch.max(boxes1[:, None, :2], boxes2[:, :2])    # [N, M, 2]
    #   rb = torch.min(boxes1[:, None, 2:], boxes2[:, 2:])    # [N, M, 2]
    #   wh = (rb - lt).clamp(min=0)                           # [N, M, 2]

The user: "epoch 1 runs at ~11 GB for 36 iterations, then CUDA OOM in box_iou.  Memory is flat
before that; it is always the same batch.  Lowering the batch size to 1 does not help."

What happens: that batch holds a stadium photo with 6,000 annotated heads.  box_iou builds [N, M, 2]
fp32 intermediates for 196,416 anchors x 6,000 boxes: 9.4 GB each (lt, rb, wh), 28 GB for the three,
more than the whole card, whatever the batch.  The failure is at rb, with the batch's ~10 GB of
activations alive.

An expert: split the matching: compute the IoU in chunks of ground-truth boxes (or of anchors) and
keep only the running max per anchor, or assign on the CPU for images with more than N boxes
(MMDetection's gpu_assign_thr); tiling such photos into crops with fewer boxes also works.  Not a
smaller batch (one image alone needs 28 GB), not mixed precision or checkpointing (the activations
are not the problem; fp16 IoU would still be 14 GB), not expandable segments or empty_cache, not a
leak (memory is flat until this image), not a bigger GPU.
"""
import sys

import torch
import torch.nn as nn
from torch.autograd._graph import derive

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

IMAGE = 1024
ANCHORS = 9 * sum((IMAGE // s) ** 2 for s in (8, 16, 32, 64, 128))       # 196,416
BATCH_SIZE = 4


class ResNet50FPN(nn.Module):
    STAGES = ((256, 4), (512, 8), (1024, 16), (2048, 32))             # channels, stride

    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(26500000 * 4, device="cuda"))

    def forward(self, images, batch):
        feats, x = [], images
        for ch, stride in self.STAGES:
            # the stage's saved activations (conv outputs, batch-norm and ReLU inputs), fp32
            a = torch.empty(batch * ch * (IMAGE // stride) ** 2 * 4 * 16, device="cuda")
            a._saved = x
            x = derive(a, x)
            feats.append(x)
        return feats


class RetinaNetHead(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(8000000 * 4, device="cuda"))

    def forward(self, feats, batch):
        outs = []
        for level, stride in enumerate((8, 16, 32, 64, 128)):
            # 2 x 4 convs of 256 channels (cls and box towers), saved for backward
            a = torch.empty(batch * 256 * (IMAGE // stride) ** 2 * 4 * 20, device="cuda")
            a._saved = feats[min(level, len(feats) - 1)]
            outs.append(derive(a, a._saved))
        return outs


def box_area(boxes, n):
    return torch.empty(n * 4, device="cuda")


def box_iou(boxes1, boxes2, n, m):
    """torchvision.ops.box_iou, with the sizes of its intermediates"""
    area1 = box_area(boxes1, n)
    area2 = box_area(boxes2, m)
    lt = torch.empty(n * m * 2 * 4, device="cuda")        # torch.max(boxes1[:, None, :2], boxes2[:, :2])
    rb = torch.empty(n * m * 2 * 4, device="cuda")        # torch.min(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = torch.empty(n * m * 2 * 4, device="cuda")        # (rb - lt).clamp(min=0)
    del lt, rb
    inter = torch.empty(n * m * 4, device="cuda")         # wh[:, :, 0] * wh[:, :, 1]
    del wh
    iou = torch.empty(n * m * 4, device="cuda")           # inter / union
    del inter, area1, area2
    return iou


def assign(anchors, gt_boxes, num_gt):
    iou = box_iou(anchors, gt_boxes, ANCHORS, num_gt)
    matched = torch.empty(ANCHORS * 8, device="cuda")       # iou.max(dim=1)
    del iou
    return matched


class RetinaNet(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.backbone = ResNet50FPN()
        self.head = RetinaNetHead()
        self.anchors = torch.empty(ANCHORS * 4 * 4, device="cuda")

    def forward(self, images, targets):
        batch = len(targets)
        outs = self.head(self.backbone(images, batch), batch)
        return self.compute_loss(outs, targets)

    def compute_loss(self, outs, targets):
        matched = [assign(self.anchors, t["boxes"], t["num_boxes"]) for t in targets]
        loss = torch.empty(512, device="cuda")
        loss._saved = outs
        loss._matched = matched
        return derive(loss, *outs)


def data_loader(num_boxes_per_image, batch_size):
    for i in range(0, len(num_boxes_per_image), batch_size):
        counts = num_boxes_per_image[i:i + batch_size]
        images = torch.empty(len(counts) * 3 * IMAGE * IMAGE * 4, device="cuda")
        targets = [{"boxes": torch.empty(m * 16, device="cuda"), "num_boxes": m} for m in counts]
        yield images, targets


def main():
    # test scaffolding: the truth mark at the failing allocation itself
    torch.cuda.init()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model = RetinaNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    # street-camera crops, then (in the 37th batch) a stadium photo with 6,000 annotated heads
    counts = [(37 * i) % 280 + 20 for i in range(144)] + [140, 85, 6000, 210]
    for step, (images, targets) in enumerate(data_loader(counts, BATCH_SIZE)):
        loss = model(images, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del images, targets, loss


try:
    main()
except torch.OutOfMemoryError:
    raise                            # marked by the observer above
sys.exit(0)
