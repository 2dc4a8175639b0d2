"""Faster R-CNN (torchvision, ResNet-50-FPN) trained on high-resolution PCB inspection images; the
per-epoch *validation loss* is computed with the model in train mode (torchvision's detection models
only return losses in train mode) and without torch.no_grad(), at a validation batch of 8: the first
validation batch records a full autograd graph for 8 images and runs out of memory in the backbone.

The real program follows the torchvision object-detection tutorial (engine.train_one_epoch), with a
validation loop the user added from a forum answer:

    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(
        weights="DEFAULT", min_size=1344, max_size=2240)        # solder bridges are ~12 px: keep the resolution
    model.roi_heads.box_predictor = FastRCNNPredictor(1024, num_classes=7)
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    train_loader = DataLoader(train_ds, batch_size=2, shuffle=True, collate_fn=collate_fn)
    val_loader = DataLoader(val_ds, batch_size=8, collate_fn=collate_fn)   # "no backward, so 4x fits"

    def validate(model, val_loader):
        model.train()                          # eval() would return detections, not losses
        total = 0.0
        for images, targets in val_loader:
            loss_dict = model(images, targets)  # <-- no torch.no_grad()
            total += sum(loss for loss in loss_dict.values()).item()
        return total / len(val_loader)

Arithmetic (fp32, images resized to 1344 x 2240, conv1 and layer1 frozen as torchvision does with
trainable_backbone_layers=3, FrozenBatchNorm2d).  What autograd saves per image: layer2 ~1.3 GiB
(512 ch at 168x280 and its 128-ch convs, plus layer1's 184 MiB output that layer2's first convs keep),
layer3 ~0.9 GiB, layer4 ~0.26 GiB, FPN ~0.67 GiB (256 ch at 336x560 ...), RPN head ~0.5 GiB, ROI
heads a few MiB: ~3.65 GiB per image.  Training at batch 2 peaks at 8.2 GiB of the 24 GiB RTX 3090
(~41 M params, ~166 MB, and their gradients, alive from the last training step).  The validation
pass at batch 8 with autograd on would keep ~29 GiB: the backbone alone holds ~22.5 GiB for 8 images,
and the FPN's first lateral 1x1 conv output at P2 (8 x 256 x 336 x 560 fp32 = 1470 MiB) fails.
Under torch.no_grad() the same pass keeps nothing for backward and peaks at a few GiB (the feature
maps of one layer at a time plus the FPN outputs), batch 8 included.

What an expert says first: wrap the validation-loss loop in torch.no_grad() (keep model.train() if
you want torchvision's losses; FrozenBatchNorm2d means train mode changes no statistics).  Nothing
leaks across steps and the training itself fits.  Wrong advice: gradient checkpointing, mixed
precision or a bigger card for a pass that needs no graph at all; expandable_segments/empty_cache
(nothing is fragmented or cached: the graph is live); ZeRO/FSDP (the weights are 166 MB).
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

NUM_CLASSES = 7            # background + open, short, mousebite, spur, spurious copper, pin-hole
MIN_SIZE, MAX_SIZE = 1344, 2240
TRAIN_BATCH = 2
VAL_BATCH = 8
EPOCHS = 12


class _Autograd(object):
    """Stand-in for what PyTorch's autograd keeps for backward: each saved tensor links to the one
    saved before it (the graph), from the first layer whose weights require grad."""
    last = None


def saved_for_backward(t):
    t._saved = _Autograd.last
    _Autograd.last = t
    t._on_graph = True


def feature_map(b, c, h, w):
    t = torch.empty(b * c * h * w, dtype=torch.float32, device="cuda")
    t.shape = (b, c, h, w)
    return t


class ConvBN(nn.Module):
    """Conv2d + FrozenBatchNorm2d (+ ReLU), as torchvision's Bottleneck and FPN blocks apply them."""

    def __init__(self, cin, cout, k, stride=1, frozen=False, bn=True):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(cout * cin * k * k, dtype=torch.float32, device="cuda"),
                                   requires_grad=not frozen)
        self.cout, self.stride, self.bn = cout, stride, bn

    def forward(self, x):
        b, _, h, w = x.shape
        records = torch.is_grad_enabled() and (self.weight.requires_grad or getattr(x, "_on_graph", False))
        if records and not getattr(x, "_on_graph", False):
            saved_for_backward(x)                   # the conv keeps its input for the weight gradient
        out = feature_map(b, self.cout, h // self.stride, w // self.stride)
        if records:
            saved_for_backward(out)
        if self.bn:
            y = feature_map(b, self.cout, h // self.stride, w // self.stride)   # frozen BN, then ReLU
            if records:
                saved_for_backward(y)
            out = y
        return out


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride=1, frozen=False):
        nn.Module.__init__(self)
        self.conv1 = ConvBN(cin, mid, 1, 1, frozen)
        self.conv2 = ConvBN(mid, mid, 3, stride, frozen)
        self.conv3 = ConvBN(mid, cout, 1, 1, frozen, bn=False)
        self.downsample = ConvBN(cin, cout, 1, stride, frozen, bn=False) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        identity = self.downsample(x) if self.downsample is not None else x
        out = self.conv3(self.conv2(self.conv1(x)))
        b, c, h, w = out.shape
        y = feature_map(b, c, h, w)                 # relu(out + identity)
        if getattr(out, "_on_graph", False):
            saved_for_backward(y)
        del identity
        return y


class ResNetLayer(nn.Module):
    def __init__(self, cin, mid, cout, blocks, stride, frozen=False):
        nn.Module.__init__(self)
        self.n = blocks
        for i in range(blocks):
            setattr(self, "b%d" % i, Bottleneck(cin if i == 0 else cout, mid, cout, stride if i == 0 else 1, frozen))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, "b%d" % i)(x)
        return x


class ResNet50Body(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = ConvBN(3, 64, 7, 2, frozen=True)
        self.layer1 = ResNetLayer(64, 64, 256, 3, 1, frozen=True)
        self.layer2 = ResNetLayer(256, 128, 512, 4, 2)
        self.layer3 = ResNetLayer(512, 256, 1024, 6, 2)
        self.layer4 = ResNetLayer(1024, 512, 2048, 3, 2)

    def forward(self, x):
        x = self.conv1(x)
        b, c, h, w = x.shape
        x = feature_map(b, c, h // 2, w // 2)       # maxpool
        c2 = self.layer1(x)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c2, c3, c4, c5]


class FeaturePyramidNetwork(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.inner = [ConvBN(c, 256, 1, bn=False) for c in (256, 512, 1024, 2048)]
        self.layer = [ConvBN(256, 256, 3, bn=False) for _ in range(4)]
        for i in range(4):
            setattr(self, "inner_blocks%d" % i, self.inner[i])
            setattr(self, "layer_blocks%d" % i, self.layer[i])

    def forward(self, feats):
        results = []
        last_inner = self.inner[3](feats[3])
        results.append(self.layer[3](last_inner))
        for i in (2, 1, 0):
            lateral = self.inner[i](feats[i])
            b, c, h, w = lateral.shape
            last_inner = feature_map(b, c, h, w)    # lateral + F.interpolate(last_inner, size=...)
            saved_for_backward(last_inner)
            results.insert(0, self.layer[i](last_inner))
        b, c, h, w = results[-1].shape
        results.append(feature_map(b, c, h // 2, w // 2))   # LastLevelMaxPool
        return results


class RPNHead(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv = ConvBN(256, 256, 3)
        self.cls_logits = ConvBN(256, 3, 1, bn=False)
        self.bbox_pred = ConvBN(256, 12, 1, bn=False)

    def forward(self, features):
        objectness, deltas = [], []
        for f in features:
            t = self.conv(f)
            objectness.append(self.cls_logits(t))
            deltas.append(self.bbox_pred(t))
        return objectness, deltas


class RoIHeads(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc6 = nn.Parameter(torch.empty(256 * 7 * 7 * 1024, dtype=torch.float32, device="cuda"))
        self.fc7 = nn.Parameter(torch.empty(1024 * 1024, dtype=torch.float32, device="cuda"))
        self.cls_score = nn.Parameter(torch.empty(1024 * NUM_CLASSES, dtype=torch.float32, device="cuda"))
        self.bbox_pred = nn.Parameter(torch.empty(1024 * NUM_CLASSES * 4, dtype=torch.float32, device="cuda"))

    def forward(self, features, proposals, targets):
        b = features[0].shape[0]
        box_features = feature_map(b * 512, 256, 7, 7)      # MultiScaleRoIAlign of 512 sampled RoIs/image
        saved_for_backward(box_features)
        x = feature_map(b * 512, 1024, 1, 1)                # TwoMLPHead
        saved_for_backward(x)
        loss_classifier = feature_map(1, 1, 1, 1)
        loss_box_reg = feature_map(1, 1, 1, 1)
        loss_classifier._saved = loss_box_reg._saved = x
        return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}


class FasterRCNN(nn.Module):
    """torchvision.models.detection.FasterRCNN (GeneralizedRCNN): train mode returns the loss dict."""

    def __init__(self):
        nn.Module.__init__(self)
        self.body = ResNet50Body()
        self.fpn = FeaturePyramidNetwork()
        self.rpn_head = RPNHead()
        self.roi_heads = RoIHeads()

    def transform(self, images):
        # GeneralizedRCNNTransform: normalize + resize each image, then batch_images() pads them into one tensor
        batched = feature_map(len(images), 3, MIN_SIZE, MAX_SIZE)
        return batched

    def forward(self, images, targets=None):
        _Autograd.last = None
        x = self.transform(images)
        features = self.fpn(self.body(x))
        objectness, deltas = self.rpn_head(features)
        proposals = feature_map(len(images), 2000, 4, 1)
        if self.training:
            loss_objectness = feature_map(1, 1, 1, 1)
            loss_rpn_box_reg = feature_map(1, 1, 1, 1)
            loss_objectness._saved = loss_rpn_box_reg._saved = _Autograd.last
            losses = {"loss_objectness": loss_objectness, "loss_rpn_box_reg": loss_rpn_box_reg}
            losses.update(self.roi_heads(features, proposals, targets))
            return losses
        return [{"boxes": proposals}]


def fasterrcnn_resnet50_fpn(min_size, max_size):
    return FasterRCNN()


class PCBDefects(object):
    """Images of 4096 x 2160 AOI captures (uint8 in host memory), targets moved to the GPU by the loop."""

    def __init__(self, n, seed):
        self.n, self.rng = n, random.Random(seed)

    def batches(self, batch_size, steps):
        for _ in range(steps):
            images = ["img"] * batch_size
            targets = [{"boxes": feature_map(1, 1, self.rng.randint(3, 40), 4),
                        "labels": feature_map(1, 1, 1, self.rng.randint(3, 40))} for _ in range(batch_size)]
            yield images, targets


def item(t):
    """t.item(): the loss as a Python float (copies one value to the host)."""
    return 0.0


def train_one_epoch(model, optimizer, data_loader, epoch):
    model.train()
    for images, targets in data_loader:
        loss_dict = model(images, targets)
        losses = feature_map(1, 1, 1, 1)            # sum(loss for loss in loss_dict.values())
        losses._saved = loss_dict["loss_classifier"]
        torch._derive(losses, *loss_dict.values())
        optimizer.zero_grad()
        scen_truth.backward(losses)
        optimizer.step()
    print("epoch %d: train peak %.1f GiB" % (epoch, torch.cuda.max_memory_allocated() / 2 ** 30))


def validate(model, data_loader):
    model.train()                                   # eval() would return detections, not losses
    total, n = 0.0, 0
    for images, targets in data_loader:
        loss_dict = model(images, targets)
        total += sum(item(v) for v in loss_dict.values())
        n += 1
    return total / max(n, 1)


def main():
    model = fasterrcnn_resnet50_fpn(min_size=MIN_SIZE, max_size=MAX_SIZE)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)
    train_ds, val_ds = PCBDefects(1840, seed=1), PCBDefects(230, seed=2)
    for epoch in range(EPOCHS):
        train_one_epoch(model, optimizer, train_ds.batches(TRAIN_BATCH, 3), epoch)
        val_loss = validate(model, val_ds.batches(VAL_BATCH, 2))
        print("epoch %d: val loss %.4f" % (epoch, val_loss))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
