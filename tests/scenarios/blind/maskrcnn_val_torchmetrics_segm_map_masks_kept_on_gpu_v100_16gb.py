"""train_defects.py -- fine-tuning torchvision's Mask R-CNN (ResNet-50 FPN v2, 46M params) on a factory
defect data set of 1280x960 photos, on an AWS p3.2xlarge (one V100 16 GB), AMP fp16, AdamW, batch 4.
Every epoch ends with a validation that computes COCO mask mAP with torchmetrics:

    metric = MeanAveragePrecision(iou_type="segm").to(device)
    model.eval()
    with torch.no_grad():
        for images, targets in val_loader:                 # batch 2, 250 images
            images = [im.to(device) for im in images]
            targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
            preds = model(images)                          # masks: 100 x 1 x 960 x 1280 float each
            for p in preds:
                p["masks"] = p["masks"].squeeze(1) > 0.5
            metric.update(preds, targets)
    print(metric.compute())

The user: "training runs at a flat ~6 GB for the whole epoch, then validation dies a hundred images in.
Validation is under no_grad, batch 2 -- how can evaluation need more than training?"

What fills the memory: torchmetrics' MeanAveragePrecision keeps its state as Python lists on the metric
module (detection_mask, groundtruth_mask, detection_box, ...), and with iou_type="segm" it appends every
image's full-resolution boolean masks: 100 detections x 960 x 1280 bytes = 117 MiB per image, plus the
ground-truth masks, on the GPU because the metric was moved there and the predictions live there.  It
never frees them before compute(): ~131 MiB per image, so on the 16 GB card the list outgrows what is
left after about 110 of the 250 validation images, and the next image's float masks (469 MiB) fail.

An expert says first: the metric is holding every prediction's masks on the GPU -- keep the metric state
off the GPU (move the predictions and targets to the CPU before metric.update, or construct the metric
with compute_on_cpu / on the CPU, or RLE-encode masks for pycocotools), i.e. stop keeping each batch's
tensors alive across iterations.  New remedy id for that fix: `metric_state_on_cpu` (the listed
`release_references` is an honest alternative).  Wrong advice: a smaller validation batch (the state grows
with the number of images, not the batch), inference_mode (already no_grad), gradient checkpointing or
mixed precision (training fits), empty_cache or expandable_segments (the memory is live, not cached), a
bigger GPU (the full val set would need ~33 GiB and grows with the data set).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

H, W = 960, 1280
DETECTIONS_PER_IMG = 100
train_batch_size = 4
val_batch_size = 2


def act(nbytes, src, dtype=torch.float16):
    """an activation made from src; autograd keeps src for backward while it records."""
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        t._saved = src
    return torch.autograd._graph.derive(t, src)


class Stage(nn.Module):
    def __init__(self, nbytes, n):
        nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "w%d" % i, nn.Parameter(torch.empty(nbytes // n // 4, dtype=torch.float32, device="cuda")))

    def forward(self, x, act_bytes, layers):
        h = x
        for i in range(layers):
            h = act(act_bytes, h)
        for p in self._parameters.values():
            h = torch.autograd._graph.derive(h, p)
        return h


class MaskRCNN(nn.Module):
    """maskrcnn_resnet50_fpn_v2: backbone, FPN, RPN, box and mask heads (46M params, fp32)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.backbone = Stage(95 * MiB, 8)
        self.fpn = Stage(13 * MiB, 4)
        self.rpn = Stage(3 * MiB, 2)
        self.roi_heads = Stage(74 * MiB, 6)

    def forward(self, images, targets=None):
        n = len(images)
        x = act(n * 3 * H * W * 2, images[0])                       # GeneralizedRCNNTransform, fp16 under AMP
        if self.training:
            h = self.backbone(x, n * 64 * MiB, 14)
            h = self.fpn(h, n * 48 * MiB, 4)
            h = self.rpn(h, n * 16 * MiB, 3)
            h = self.roi_heads(h, n * 40 * MiB, 6)
            loss = act(512, h, torch.float32)
            return {"loss_total": loss}
        # inference: features are freed as the pass goes on; each image gets 100 detections with
        # masks pasted back at the original resolution as float (paste_masks_in_image)
        feats = self.backbone(x, n * 64 * MiB, 2)
        feats = self.fpn(feats, n * 48 * MiB, 2)
        out = []
        for i in range(n):
            out.append({"boxes": torch.empty(DETECTIONS_PER_IMG * 4, dtype=torch.float32, device="cuda"),
                        "scores": torch.empty(DETECTIONS_PER_IMG, dtype=torch.float32, device="cuda"),
                        "labels": torch.empty(DETECTIONS_PER_IMG * 2, dtype=torch.float32, device="cuda"),
                        "masks": torch.empty(DETECTIONS_PER_IMG * H * W, dtype=torch.float32, device="cuda")})
        del feats, x
        return out


class MeanAveragePrecision(nn.Module):
    """torchmetrics.detection.MeanAveragePrecision as it keeps its state: lists, one entry per image,
    added with add_state(..., default=[]) and appended to by update(); emptied only by reset()."""

    def __init__(self, iou_type="bbox"):
        nn.Module.__init__(self)
        self.iou_type = iou_type
        for name in ("detection_box", "detection_scores", "detection_labels", "detection_mask",
                     "groundtruth_box", "groundtruth_labels", "groundtruth_mask"):
            setattr(self, name, [])

    def update(self, preds, target):
        for p, t in zip(preds, target):
            self.detection_box.append(p["boxes"])
            self.detection_scores.append(p["scores"])
            self.detection_labels.append(p["labels"])
            self.groundtruth_box.append(t["boxes"])
            self.groundtruth_labels.append(t["labels"])
            if self.iou_type == "segm":
                self.detection_mask.append(p["masks"])
                self.groundtruth_mask.append(t["masks"])

    def reset(self):
        for name in ("detection_box", "detection_scores", "detection_labels", "detection_mask",
                     "groundtruth_box", "groundtruth_labels", "groundtruth_mask"):
            setattr(self, name, [])


def val_loader(n_images):
    for i in range(0, n_images, val_batch_size):
        images = [torch.empty(3 * H * W * 4, dtype=torch.uint8, device="cuda") for _ in range(val_batch_size)]
        n_obj = 9 + (i % 7)
        targets = [{"boxes": torch.empty(n_obj * 16, dtype=torch.uint8, device="cuda"),
                    "labels": torch.empty(n_obj * 8, dtype=torch.uint8, device="cuda"),
                    "masks": torch.empty(n_obj * H * W, dtype=torch.uint8, device="cuda")}
                   for _ in range(val_batch_size)]
        yield images, targets


def evaluate(model, metric):
    model.eval()
    metric.reset()
    with torch.no_grad():
        for images, targets in val_loader(250):
            preds = model(images)
            for p in preds:
                p["masks"] = torch.empty(DETECTIONS_PER_IMG * H * W, dtype=torch.uint8, device="cuda")  # squeeze(1) > 0.5
            metric.update(preds, targets)
            del images, targets, preds
    model.train()


def main():
    model = MaskRCNN().cuda()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    metric = MeanAveragePrecision(iou_type="segm").to("cuda")
    for epoch in range(24):
        for step in range(60):
            images = [torch.empty(3 * H * W * 4, dtype=torch.uint8, device="cuda") for _ in range(train_batch_size)]
            with torch.autocast("cuda", dtype=torch.float16):
                loss_dict = model(images)
                loss = loss_dict["loss_total"]
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, loss_dict, loss
        evaluate(model, metric)
        print("epoch", epoch, "segm mAP computed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
