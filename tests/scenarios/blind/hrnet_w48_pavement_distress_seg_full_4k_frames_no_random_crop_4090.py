"""HRNet-W48 pavement-distress segmentation trained on whole 4K survey frames (no RandomCrop), batch 2, fp32,
on one RTX 4090 (24 GB): the first forward pass does not fit.

The real program (mmsegmentation-style training of HRNetV2-W48 + FCN head, written as a plain PyTorch loop):

    cfg.train_pipeline = [LoadImageFromFile(), LoadAnnotations(),
                          # RandomCrop(crop_size=(1024, 1024), cat_max_ratio=0.75),   <- commented out "to see
                          RandomFlip(prob=0.5), PhotoMetricDistortion(), ...]          #    the whole road"
    model = HRNetW48Seg(num_classes=7).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    for images, masks in DataLoader(PavementFrames(...), batch_size=2, shuffle=True, num_workers=8):
        logits = model(images.cuda())                      # OOM here, in stage 3, iteration 0
        loss = F.cross_entropy(F.interpolate(logits, size=masks.shape[-2:]), masks.cuda())
        ...

The survey van's line-scan camera gives 3840x2160 frames; the tutorial config the user started from cropped
1024x1024 windows out of them (the crop was commented out while debugging the label overlay and never put back).

Sizes (fp32, batch 2, 3840x2160):
  * input 2 x 3 x 2160 x 3840 x 4 B = 199 MB; stem conv (64 ch, /2) 1.06 GB, second stem conv (/4) 265 MB;
  * layer1: 4 bottlenecks at 1/4 resolution, 256-channel outputs of 1.06 GB each: ~7.4 GB of saved maps;
  * the high-resolution branch (48 ch at 960x540) costs 199 MB per saved map, and HRNet never drops it: stage 2
    (1 module), stage 3 (4 modules) and stage 4 (3 modules) each run 8 convs per branch plus fuse layers:
    ~3.3 GB per stage-3 module counting only conv outputs (BN and ReLU outputs roughly triple that in PyTorch).
  * mmseg's own table gives ~7.2 GB for fcn_hr48 at 512x1024, batch 2: 8.3 MP frames are 16x that area, so the
    real pass wants on the order of 100 GB. The program keeps only the conv outputs and fails in stage 3's
    fourth module, ~23 GB allocated, asking for one more 190 MiB high-resolution map.

What an expert says first: this is not a batch-size or a cache problem, it is the input size. Train on random
crops (1024x1024 keeps the 1/4-resolution branch at 256x256 and the whole pass around 14 GB at batch 2) and run
full 4K frames only at inference, with sliding-window or whole-image no_grad inference. Mixed precision and
gradient checkpointing help but are not enough alone (100 GB -> ~50 GB / ~40 GB); batch 1 halves it and still
does not fit, and BatchNorm with one image is bad. Wrong advice: empty_cache / expandable_segments (nothing is
cached or fragmented: every byte is a live activation), inference_mode (this is training), quantization, another
process (there is none).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

BATCH_SIZE = 2
FRAME_H, FRAME_W = 2160, 3840
CROP_SIZE = None          # was (1024, 1024): RandomCrop commented out in train_pipeline
NUM_CLASSES = 7           # background, longitudinal, transverse, alligator crack, pothole, patch, marking wear
MAX_ITERS = 80000


class PavementFrames(object):
    """The survey frames with their masks; with CROP_SIZE None every sample is the whole 4K frame."""

    def __init__(self, n_frames=21344):
        self.n_frames = n_frames

    def __len__(self):
        return self.n_frames

    def batch(self, index):
        h, w = CROP_SIZE if CROP_SIZE else (FRAME_H, FRAME_W)
        images = torch.empty(BATCH_SIZE * 3 * h * w, dtype=torch.float32)       # images.cuda(non_blocking=True)
        masks = torch.empty(BATCH_SIZE * h * w, dtype=torch.uint8)              # masks.cuda() (class ids)
        return images, masks


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, downsample=False):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, bias=False)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.downsample = nn.Conv2d(inplanes, planes * 4, 1, bias=False) if downsample else None

    def forward(self, x):
        out = self.conv3(self.conv2(self.conv1(x)))
        if self.downsample is not None:
            identity = self.downsample(x)
            out._saved = (out._saved, identity)          # out + identity keeps both for backward
        return out


class BasicBlock(nn.Module):
    def __init__(self, planes):
        super().__init__()
        self.conv1 = nn.Conv2d(planes, planes, 3, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, bias=False)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class Branch(nn.Module):
    """num_blocks BasicBlocks at one resolution (HRNet's nn.Sequential per branch)."""

    def __init__(self, channels, num_blocks=4):
        super().__init__()
        self.num_blocks = num_blocks
        for i in range(num_blocks):
            setattr(self, "block%d" % i, BasicBlock(channels))

    def forward(self, x):
        for i in range(self.num_blocks):
            x = getattr(self, "block%d" % i)(x)
        return x


class HighResolutionModule(nn.Module):
    """Parallel branches, then every output is the sum of all branches brought to its resolution."""

    def __init__(self, channels):
        super().__init__()
        self.channels = channels
        for i, c in enumerate(channels):
            setattr(self, "branch%d" % i, Branch(c))
        # fuse: lower resolutions -> 1x1 conv to c_i, nearest upsample; higher -> strided 3x3 conv
        for i, ci in enumerate(channels):
            for j, cj in enumerate(channels):
                if j > i:
                    setattr(self, "fuse_%d_%d" % (i, j), nn.Conv2d(cj, ci, 1, bias=False))
                elif j < i:
                    setattr(self, "fuse_%d_%d" % (i, j), nn.Conv2d(cj, ci, 3, stride=2 ** (i - j), bias=False))

    def forward(self, xs):
        xs = [getattr(self, "branch%d" % i)(x) for i, x in enumerate(xs)]
        outs = []
        for i in range(len(xs)):
            parts = [xs[i]]
            for j in range(len(xs)):
                if j > i:
                    parts.append(F.interpolate(getattr(self, "fuse_%d_%d" % (i, j))(xs[j]),
                                               scale_factor=2 ** (j - i), mode="bilinear"))
                elif j < i:
                    parts.append(getattr(self, "fuse_%d_%d" % (i, j))(xs[j]))
            y = torch.empty_like(parts[0])        # y = sum(parts), out of place, then ReLU
            y._saved = tuple(parts)
            outs.append(y)
        return outs


class Stage(nn.Module):
    def __init__(self, channels, num_modules):
        super().__init__()
        self.num_modules = num_modules
        for m in range(num_modules):
            setattr(self, "module%d" % m, HighResolutionModule(channels))

    def forward(self, xs):
        for m in range(self.num_modules):
            xs = getattr(self, "module%d" % m)(xs)
        return xs


class HRNetW48Seg(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, stride=2, bias=False)
        self.conv2 = nn.Conv2d(64, 64, 3, stride=2, bias=False)
        self.layer1_0 = Bottleneck(64, 64, downsample=True)
        self.layer1_1 = Bottleneck(256, 64)
        self.layer1_2 = Bottleneck(256, 64)
        self.layer1_3 = Bottleneck(256, 64)
        self.transition1_0 = nn.Conv2d(256, 48, 3, bias=False)
        self.transition1_1 = nn.Conv2d(256, 96, 3, stride=2, bias=False)
        self.stage2 = Stage([48, 96], 1)
        self.transition2_2 = nn.Conv2d(96, 192, 3, stride=2, bias=False)
        self.stage3 = Stage([48, 96, 192], 4)
        self.transition3_3 = nn.Conv2d(192, 384, 3, stride=2, bias=False)
        self.stage4 = Stage([48, 96, 192, 384], 3)
        self.head = nn.Conv2d(720, num_classes, 1)

    def forward(self, x):
        x = self.conv2(self.conv1(x))
        x = self.layer1_3(self.layer1_2(self.layer1_1(self.layer1_0(x))))
        xs = self.stage2([self.transition1_0(x), self.transition1_1(x)])
        xs = self.stage3(xs + [self.transition2_2(xs[-1])])
        xs = self.stage4(xs + [self.transition3_3(xs[-1])])
        return self.head(xs[0])


def poly_lr(base_lr, it, max_iters, power=0.9):
    return base_lr * (1 - it / max_iters) ** power


def train():
    torch.cuda.set_device(0)
    model = HRNetW48Seg(NUM_CLASSES).cuda()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    dataset = PavementFrames()
    for it in range(MAX_ITERS):
        for g in optimizer.param_groups:
            g["lr"] = poly_lr(0.01, it, MAX_ITERS)
        images, masks = dataset.batch(it)
        logits = model(images)
        loss = F.cross_entropy(F.interpolate(logits, scale_factor=4.0, mode="bilinear"), masks)
        optimizer.zero_grad()
        scen_truth.backward(loss)
        optimizer.step()
        if it % 50 == 0:
            print("iter %d lr %.5f" % (it, optimizer.param_groups[0]["lr"]))


def main():
    train()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
