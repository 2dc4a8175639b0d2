"""train_lvis.py -- Mask R-CNN (torchvision maskrcnn_resnet50_fpn_v2, 46M parameters) on LVIS v1, the
torchvision detection reference loop (train_one_epoch), one Tesla V100-SXM2-32GB, batch 8, SGD with
momentum, AMP (torch.cuda.amp.autocast + GradScaler).  For the long tail the user added a copy-paste
augmentation that runs on the GPU after the batch is moved there: every object of a rare or common
class (798 of LVIS's 1,203 classes) is put in a bank, and up to three banked objects of those classes
are pasted into each image:

    class RareClassPaste:
        def __init__(self, classes, per_class=50, max_paste=3):
            self.bank = defaultdict(list)          # class -> [RGBA frame]
        def __call__(self, images, targets):
            for img, t in zip(images, targets):
                for m, c in zip(t["masks"], t["labels"].tolist()):
                    if c in self.classes and len(self.bank[c]) < self.per_class:
                        m = m[None].float()
                        self.bank[c].append(torch.cat([img * m, m]))   # the object, where it was
                ... paste: pick, F.interpolate to this image's size, alpha-blend, add the mask and box ...

    paster = RareClassPaste(rare_and_common)
    for images, targets in data_loader:
        images = [i.to(device) for i in images]; targets = [...]
        images, targets = paster(images, targets)
        with torch.cuda.amp.autocast():
            loss_dict = model(images, targets); losses = sum(loss_dict.values())
        optimizer.zero_grad(); scaler.scale(losses).backward(); scaler.step(optimizer); scaler.update()

Each banked object is a whole frame (4 x 480 x 640 float32 = 4.7 MiB), not a crop of its box, kept on
the GPU, and the cap is per class: 50 x 798 classes = 39,900 frames, 183 GiB.  About 14 objects of
those classes arrive per batch, so the bank grows ~64 MiB an iteration; the training step itself needs
~6.5 GiB of activations.  The job fails at iteration ~390 of the first epoch, in the mask head's forward
pass, with the bank holding ~5,300 frames, 24 GiB.  (With batch 4 it failed at iteration ~780: after
the same number of images.)

An expert: the memory is the Python bank of pasted objects, growing every iteration and never shrinking
before it is full; keep it in CPU memory (pinned) and move only the few objects pasted into a batch,
crop each object to its box (a few KiB instead of 4.7 MiB), and bound the bank's total, not per class.
Wrong first advice: a smaller batch (it fails after the same number of images), mixed precision (on
already), gradient checkpointing, expandable_segments or empty_cache (the frames are referenced), a
bigger card (183 GiB is the bound).
"""
import random
import sys
from collections import defaultdict

import torch
from torch import nn

import scen_truth
from torch.autograd._graph import derive      # the stand-in's record of what an operation's output depends on

scen_truth.note_every_empty(torch)

BATCH_SIZE = 8
ITERS_PER_EPOCH = 12_500


def new(*shape, dtype=torch.float32):
    """A tensor of that shape on the GPU (the stand-in tensor is its bytes; its shape is noted)."""
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=dtype, device="cuda")
    t.shape = tuple(int(s) for s in shape)
    return t


def op(*shape, saved=(), dtype=None):
    """An operation's output under autocast (float16), keeping what autograd saves for backward."""
    t = new(*shape, dtype=dtype or (torch.float16 if torch.is_autocast_enabled() else torch.float32))
    if torch.is_grad_enabled():
        t._saved = tuple(saved)
        derive(t, *saved)
    return t


def backward(loss):
    """loss.backward() as PyTorch runs it: gradients made, then every tensor the graph saved is freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        s = t.__dict__.pop("_saved", None)
        if isinstance(s, (tuple, list)):
            todo.extend(x for x in s if isinstance(x, torch.Tensor))


def total(losses):
    """sum() of loss tensors: a scalar in their graph."""
    return op(1, saved=tuple(losses), dtype=torch.float32)


def param(n, trainable=True):
    return nn.Parameter(torch.empty(int(n), dtype=torch.float32, device="cuda"), requires_grad=trainable)


# ---------------------------------------------------------------- torchvision's Mask R-CNN, as far as memory goes
class Stage(nn.Module):
    def __init__(self, cin, width, cout, blocks, stride, trainable):
        nn.Module.__init__(self)
        self.weight = param((cin * width + width * width * 9 + width * cout) * blocks + cin * cout, trainable)
        self.width, self.cout, self.blocks, self.stride = width, cout, blocks, stride

    def forward(self, x):
        B, _, h, w = x.shape
        h, w = -(-h // self.stride), -(-w // self.stride)
        for _ in range(self.blocks):
            a = op(B, 3 * self.width, h, w, saved=(x,))          # conv1/conv2 + BN + ReLU
            x = op(B, 2 * self.cout, h, w, saved=(a, x))         # conv3 + BN, add + ReLU
        return x


class MaskRCNN(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.stem = param(3 * 64 * 49 + 64 * 64 * 13, trainable=False)
        self.layer1 = Stage(64, 64, 256, 3, 1, trainable=False)
        self.layer2 = Stage(256, 128, 512, 4, 2, trainable=True)
        self.layer3 = Stage(512, 256, 1024, 6, 2, trainable=True)
        self.layer4 = Stage(1024, 512, 2048, 3, 2, trainable=True)
        self.fpn = param((256 + 512 + 1024 + 2048) * 256 + 4 * 256 * 256 * 9)
        self.rpn = param(256 * 256 * 9 * 4 + 256 * 15)
        self.roi_heads = param(256 * 49 * 1024 + 1024 * 1024 + 1024 * 1204 * 5 + 4 * 256 * 256 * 9 * 4 + 256 * 1203)

    def forward(self, images, targets):
        B = len(images)
        H, W = 800, 1088                                         # GeneralizedRCNNTransform: 800 short side, padded /32
        x = op(B, 3, H, W, dtype=torch.float32)
        with torch.no_grad():
            x = self.layer1(op(B, 64, H // 4, W // 4))
        c = [x]
        for layer in (self.layer2, self.layer3, self.layer4):
            c.append(layer(c[-1]))
        p = [op(B, 256, H // s, W // s, saved=(f,)) for s, f in zip((4, 8, 16, 32), c)]
        p = [op(B, 512, H // s, W // s, saved=(f,)) for s, f in zip((4, 8, 16, 32), p)]
        obj = [op(B, 256 + 15, H // s, W // s, saved=(f,)) for s, f in zip((4, 8, 16, 32), p)]
        rois = op(B * 512, 256, 7, 7, saved=tuple(p))            # MultiScaleRoIAlign, 512 sampled per image
        box = op(B * 512, 1024 * 3, saved=(rois,))
        mrois = op(B * 128, 256, 14, 14, saved=tuple(p))         # positive RoIs for the mask head
        m = mrois
        for _ in range(4):
            m = op(B * 128, 512, 14, 14, saved=(m,))
        m = op(B * 128, 256 * 3, 28, 28, saved=(m,))
        loss = op(1, saved=tuple(obj) + (box, m), dtype=torch.float32)
        return {"loss_objectness": loss}


# ---------------------------------------------------------------- the augmentation
class RareClassPaste:
    """Copy-paste for LVIS's rare and common classes, on the GPU."""

    def __init__(self, classes, per_class=50, max_paste=3, seed=0):
        self.classes = set(classes)
        self.per_class = per_class
        self.max_paste = max_paste
        self.bank = defaultdict(list)
        self.rng = random.Random(seed)

    def __call__(self, images, targets):
        for img, t in zip(images, targets):
            _, h, w = img.shape
            for c in t["labels"]:
                if c in self.classes and len(self.bank[c]) < self.per_class:
                    self.bank[c].append(new(4, h, w))            # torch.cat([img * m, m]): the object, in place
            full = [c for c in self.bank if self.bank[c]]
            for _ in range(min(self.max_paste, len(full))):
                src = self.rng.choice(self.bank[self.rng.choice(full)])
                obj = new(4, h, w)                               # F.interpolate(src[None], size=(h, w))
                del obj                                          # blended into img in place, box and mask added
        return images, targets


def lvis_batches(rng, rare_and_common):
    """The loader: LVIS images (COCO's, 640 x 480 mostly), their classes; ~1.7 objects of a rare or
    common class per image among ~12 objects."""
    frequent = [c for c in range(1, 1204) if c not in rare_and_common]
    tail = sorted(rare_and_common)
    while True:
        images, targets = [], []
        for _ in range(BATCH_SIZE):
            labels = [rng.choice(frequent) for _ in range(10)]
            labels += [rng.choice(tail) for _ in range(1 if rng.random() < 0.3 else 2)]
            img = new(3, 480, 640)                               # image.to(device)
            images.append(img)
            targets.append({"labels": labels})
        yield images, targets


def train_one_epoch(model, optimizer, data_loader, scaler, paster, epoch):
    model.train()
    for it, (images, targets) in enumerate(data_loader):
        images, targets = paster(images, targets)
        with torch.cuda.amp.autocast():
            loss_dict = model(images, targets)
            losses = total(loss_dict.values())                   # sum(loss_dict.values())
        optimizer.zero_grad()
        backward(scaler.scale(losses))                           # scaler.scale(losses).backward()
        scaler.step(optimizer)
        scaler.update()
        if it % 20 == 0:
            banked = sum(len(v) for v in paster.bank.values())
            print("epoch %d iter %d/%d  banked objects %d  allocated %.1f GiB  reserved %.1f GiB" % (
                epoch, it, ITERS_PER_EPOCH, banked, torch.cuda.memory_allocated() / 2 ** 30,
                torch.cuda.memory_reserved() / 2 ** 30))
            sys.stdout.flush()
        if it + 1 == ITERS_PER_EPOCH:
            break


def main():
    rng = random.Random(1203)
    rare_and_common = set(rng.sample(range(1, 1204), 798))
    model = MaskRCNN().cuda()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler()
    paster = RareClassPaste(rare_and_common)
    for epoch in range(24):
        train_one_epoch(model, optimizer, lvis_batches(rng, rare_and_common), scaler, paster, epoch)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
