"""Semi-supervised detection (Unbiased Teacher recipe, re-implemented on torchvision's Faster R-CNN R50-FPN) on a
12 GB RTX 3060: the burn-in runs fine for 2,000 iterations, then the first teacher-student iteration fails.
The EMA teacher is a deepcopy of the student whose parameters still require grad, and its pseudo-labelling
forward runs without torch.no_grad(): it records a full autograd graph of the 4 unlabeled images, kept alive by
the pseudo boxes until the student's losses are done -- and the student's forward on 8 images does not fit next
to it.

The real program (train_ubteacher.py, written from the paper and detectron2's ubteacher code):

    student = fasterrcnn_resnet50_fpn(num_classes=11).cuda()      # VisDrone-style classes
    opt = torch.optim.SGD(student.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    for it in range(MAX_ITER):
        if it < BURN_IN:                                          # supervised burn-in: 4 labeled images
            loss = sum(student(labeled, targets).values())
        else:
            if it == BURN_IN:
                teacher = copy.deepcopy(student)                  # requires_grad stays True on every parameter
            teacher.eval()
            pseudo = teacher(unlabeled_weak)                      # <- no torch.no_grad(): boxes carry grad_fn
            pseudo = [threshold(p, 0.7) for p in pseudo]
            sup = student(labeled, targets)                       # <- OOM here, first semi-supervised iteration
            unsup = student(unlabeled_strong, pseudo)
            loss = sum(sup.values()) + 4.0 * (unsup["loss_classifier"] + unsup["loss_objectness"])
        loss.backward(); opt.step(); opt.zero_grad()
        if it >= BURN_IN: update_ema(teacher, student, 0.9996)

(The stand-in's student takes the 4 labeled and 4 strong-augmented images as one batch of 8, as ubteacher's
concatenated batch does.)

Sizes (fp32, 800x1333 images, 4 labeled + 4 unlabeled per iteration):
  * weights ~0.2 GiB (41M parameters), twice (student, teacher); SGD momentum 0.16 GiB in PyTorch (none in the stand-in); context 0.5 GiB;
  * one image through R50-FPN + RPN + RoI head in training keeps ~1.0 GiB of feature maps;
  * burn-in: 4 labeled images, ~4.7 GiB peak: fine for 2,000 iterations;
  * iteration 2,000: the teacher's forward on the 4 weak views keeps ~4.5 GiB of graph (its outputs are
    functions of every feature map: box deltas decoded against the proposals), then the student's forward on
    8 images needs ~8.7 GiB more: the 12 GiB card fails in the student's FPN, asking for the 521 MiB P2 map of
    the 8-image batch, with 11.3 GiB allocated. With the teacher under no_grad its forward is transient and the
    step peaks at ~9.6 GiB.
  * The program resumes from the iteration-1899 checkpoint (as the user did while debugging): 100 burn-in
    iterations, then the failing step.

What an expert says first: the teacher does not need a graph -- wrap the pseudo-labelling in torch.no_grad()
(or inference_mode), freeze the teacher (requires_grad_(False) after the deepcopy), and detach the pseudo boxes;
the EMA update is also done under no_grad. Wrong advice: smaller batch (changes the labeled/unlabeled recipe
and is not needed), expandable_segments / empty_cache (the memory is live graph), a bigger card, ZeRO/FSDP
(one small model), quantization.
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

IMG_H, IMG_W = 800, 1333
LABELED_PER_BATCH = 4
UNLABELED_PER_BATCH = 4
NUM_CLASSES = 11
BURN_IN = 2000
START_ITER = 1900          # resumed from output/model_0001899.pth (checkpoint period 100 while debugging)
MAX_ITER = 180000
EMA_KEEP_RATE = 0.9996
THRESHOLD = 0.7


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, bias=False)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)

    def forward(self, x):
        return self.conv3(self.conv2(self.conv1(x)))


class ResNet50Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.maxpool = nn.Conv2d(64, 64, 3, stride=2, bias=False)   # stands for the 3x3/2 max pool
        self.layout = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]
        inplanes = 64
        for li, (planes, blocks, stride) in enumerate(self.layout):
            for b in range(blocks):
                setattr(self, "layer%d_%d" % (li + 1, b), Bottleneck(inplanes, planes, stride if b == 0 else 1))
                inplanes = planes * 4

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        feats = []
        for li, (planes, blocks, stride) in enumerate(self.layout):
            for b in range(blocks):
                x = getattr(self, "layer%d_%d" % (li + 1, b))(x)
            feats.append(x)
        return feats


class FPN(nn.Module):
    def __init__(self):
        super().__init__()
        for i, c in enumerate((256, 512, 1024, 2048)):
            setattr(self, "inner%d" % i, nn.Conv2d(c, 256, 1))
            setattr(self, "layer%d" % i, nn.Conv2d(256, 256, 3))

    def forward(self, feats):
        return [getattr(self, "layer%d" % i)(getattr(self, "inner%d" % i)(f)) for i, f in enumerate(feats)]


class RPN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(256, 256, 3)
        self.cls_logits = nn.Conv2d(256, 3, 1)
        self.bbox_pred = nn.Conv2d(256, 12, 1)

    def forward(self, features):
        outs = []
        for f in features:
            t = self.conv(f)
            outs.append((self.cls_logits(t), self.bbox_pred(t)))
        proposals = torch.empty(len(features) * 2000 * 4 * 4)      # decode + NMS, 2000 per image
        proposals._saved = tuple(o for pair in outs for o in pair)
        return proposals


class RoIHeads(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.box_head_fc6 = nn.Conv1d(256 * 7 * 7, 1024, 1)
        self.box_head_fc7 = nn.Conv1d(1024, 1024, 1)
        self.cls_score = nn.Conv1d(1024, num_classes, 1)
        self.bbox_pred = nn.Conv1d(1024, num_classes * 4, 1)

    def forward(self, features, proposals, n_images, training):
        n_rois = n_images * (512 if training else 1000)
        box_features = torch.empty(n_rois * 256 * 7 * 7 * 4)       # MultiScaleRoIAlign
        box_features._saved = (proposals,) + tuple(features)
        x = self.box_head_fc7(self.box_head_fc6(box_features))
        return self.cls_score(x), self.bbox_pred(x)


class FasterRCNN(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = ResNet50Body()
        self.fpn = FPN()
        self.rpn = RPN()
        self.roi_heads = RoIHeads(num_classes)

    def forward(self, images, targets=None):
        n = images.nbytes // (3 * IMG_H * IMG_W * 4)
        features = self.fpn(self.body(images))
        proposals = self.rpn(features)
        class_logits, box_regression = self.roi_heads(features, proposals, n, self.training)
        if self.training:
            return {"loss_classifier": F.cross_entropy(class_logits, targets),
                    "loss_box_reg": F.cross_entropy(box_regression, targets),   # smooth_l1 on the deltas
                    "loss_objectness": F.cross_entropy(proposals, targets),
                    "loss_rpn_box_reg": F.cross_entropy(proposals, targets)}
        # postprocess_detections: softmax scores, box_coder.decode(box_regression, proposals), NMS
        boxes = torch.empty(n * 100 * 4 * 4)
        boxes._saved = (box_regression, proposals)
        scores = F.log_softmax(class_logits)
        return [{"boxes": boxes, "scores": scores, "labels": None} for _ in range(n)]


class SemiSupervisedLoader(object):
    def __iter__(self):
        while True:
            labeled = torch.empty(LABELED_PER_BATCH * 3 * IMG_H * IMG_W, dtype=torch.float32)
            targets = torch.empty(LABELED_PER_BATCH * 256, dtype=torch.int8)
            weak = torch.empty(UNLABELED_PER_BATCH * 3 * IMG_H * IMG_W, dtype=torch.float32)
            yield labeled, targets, weak


def strong_augment(weak):
    """ColorJitter, grayscale, Gaussian blur and cutout of the weak views (a new tensor, same size)."""
    return torch.empty(weak.nbytes)


def threshold(pred, thresh):
    return pred


def update_ema(teacher, student, keep_rate):
    for t, s in zip(teacher.parameters(), student.parameters()):
        pass                                                      # t.mul_(keep_rate).add_(s, alpha=1 - keep_rate)


def train():
    torch.cuda.set_device(0)
    student = FasterRCNN(NUM_CLASSES).cuda()
    student.train()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    teacher = None
    # student.load_state_dict(torch.load("output/model_0001899.pth", map_location="cpu")["model"])
    for it, (labeled, targets, weak) in enumerate(SemiSupervisedLoader(), start=START_ITER):
        if it >= MAX_ITER:
            break
        if it < BURN_IN:
            loss_dict = student(labeled, targets)
        else:
            if it == BURN_IN:
                teacher = copy.deepcopy(student)
            teacher.eval()
            pseudo = teacher(weak)
            pseudo = [threshold(p, THRESHOLD) for p in pseudo]
            pseudo_targets = torch.empty(UNLABELED_PER_BATCH * 256, dtype=torch.int8)
            strong = strong_augment(weak)
            batch = torch.empty(labeled.nbytes + strong.nbytes)   # torch.cat([labeled, strong]) for one pass
            loss_dict = student(batch, targets)
            del pseudo_targets
        optimizer.zero_grad()
        torch.autograd.backward(list(loss_dict.values()))        # sum(loss_dict.values()).backward()
        optimizer.step()
        del loss_dict
        if teacher is not None:
            update_ema(teacher, student, EMA_KEEP_RATE)
        if it % 500 == 0:
            print("iter %d" % it)


def main():
    train()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
