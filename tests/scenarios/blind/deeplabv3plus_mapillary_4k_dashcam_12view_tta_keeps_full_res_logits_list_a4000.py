"""Test-time augmentation for 4K dashcam segmentation: DeepLabV3+ (ResNet-101, Mapillary Vistas, 65 classes)
runs 6 scales x 2 flips per frame and the user's TTA code keeps every view's logits, upsampled to the full
3840x2160 frame, in a list to average at the end. Each view is 2 GiB; on a 16 GB RTX A4000 the 8th view fails
on the very first frame, inside the model's sliding-window forward, which is not where the memory went.

The real program (a road-asset survey script; mmseg-style sliding-window inference written by hand):

    model = DeepLabV3Plus(backbone="resnet101", num_classes=65).cuda().eval()
    model.load_state_dict(torch.load("dlv3p_r101_mapillary_65.pth", map_location="cpu"))
    SCALES = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]

    @torch.no_grad()
    def predict_tta(frame):                                  # frame: 1x3x2160x3840 float
        view_logits = []
        for s in SCALES:
            for flip in (False, True):
                img = F.interpolate(frame, scale_factor=s, mode="bilinear")
                if flip: img = img.flip(-1)
                logits = slide_inference(model, img, crop=1024, stride=768)   # OOM here, 8th view
                if flip: logits = logits.flip(-1)
                view_logits.append(F.interpolate(logits, size=(2160, 3840), mode="bilinear"))
        return torch.stack(view_logits).mean(0).argmax(1)

Sizes (fp32, batch 1):
  * one full-resolution view: 65 x 2160 x 3840 x 4 B = 2.16 GB (2.01 GiB); 12 views = 24.1 GiB, and the
    torch.stack at the end would want another 24.1 GiB;
  * model 59M parameters = 0.22 GiB; CUDA context 0.5 GiB; one 1024x1024 window's forward ~1.5 GiB, freed after
    each window; a scale's accumulation buffer at 1/4 resolution 32 MiB (0.5x) to 0.39 GiB (1.75x);
  * after 7 views (scales 0.5, 0.75, 1.0 with both flips, 1.25 unflipped) the list holds 14.1 GiB of upsampled
    logits (plus the low-resolution logits they were made from); the 8th view (1.25, flipped) starts its
    windows and a layer3 conv of ResNet-101 asks for 16 MiB with 15.4 GiB allocated and 8 MiB free. The
    traceback points into the backbone, so the natural (wrong) reaction is a smaller crop or a smaller model.
    The 16 GB card fails on the first frame of the first video.

What an expert says first: merge the views as they come -- a running sum of softmax probabilities (or logits)
in one 2 GiB buffer, divided at the end, instead of a list of 12 full-resolution maps and a stack of them; or
keep/merge the views on the CPU, or merge at 1/4 resolution and upsample the merged map once. With a running
sum the peak is ~2 x 2 GiB + one window's forward. Wrong advice: no_grad / inference_mode (already on), smaller
batch (one frame), gradient checkpointing (inference), expandable_segments / empty_cache (the 14 GiB are live
views in the list), quantization of the model (the weights are 0.2 GiB), another process (none).
Mixed precision halves each view but 12 x 1 GiB plus a stack still does not fit.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

NUM_CLASSES = 65
FRAME_H, FRAME_W = 2160, 3840
SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)
CROP, STRIDE = 1024, 768


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, bias=False)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)

    def forward(self, x):
        return self.conv3(self.conv2(self.conv1(x)))


class ResNet101(nn.Module):
    """Output stride 16: layer4 dilated instead of strided."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.maxpool = nn.Conv2d(64, 64, 3, stride=2, bias=False)   # stands for the 3x3/2 max pool
        self.layout = [(64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 1)]
        inplanes = 64
        for li, (planes, blocks, stride) in enumerate(self.layout):
            for b in range(blocks):
                setattr(self, "layer%d_%d" % (li + 1, b), Bottleneck(inplanes, planes, stride if b == 0 else 1))
                inplanes = planes * 4

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        low_level = None
        for li, (planes, blocks, stride) in enumerate(self.layout):
            for b in range(blocks):
                x = getattr(self, "layer%d_%d" % (li + 1, b))(x)
            if li == 0:
                low_level = x
        return low_level, x


class ASPP(nn.Module):
    def __init__(self, in_ch=2048, out_ch=256):
        super().__init__()
        for i in range(4):
            setattr(self, "branch%d" % i, nn.Conv2d(in_ch, out_ch, 1 if i == 0 else 3, bias=False))
        self.project = nn.Conv2d(out_ch * 5, out_ch, 1, bias=False)

    def forward(self, x):
        branches = [getattr(self, "branch%d" % i)(x) for i in range(4)]
        cat = torch.empty(branches[0].nbytes * 5)      # torch.cat(branches + [image_pool(x)], dim=1)
        cat._saved = tuple(branches)
        return self.project(cat)


class DeepLabV3Plus(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.backbone = ResNet101()
        self.aspp = ASPP()
        self.low_level_proj = nn.Conv2d(256, 48, 1, bias=False)
        self.decoder = nn.Conv2d(304, 256, 3, bias=False)
        self.classifier = nn.Conv2d(256, num_classes, 1)

    def forward(self, x):
        low, high = self.backbone(x)
        aspp = F.interpolate(self.aspp(high), scale_factor=4.0, mode="bilinear")
        low = self.low_level_proj(low)
        fused = torch.empty(aspp.nbytes + low.nbytes)  # torch.cat([aspp, low], dim=1)
        fused._saved = (aspp, low)
        return self.classifier(self.decoder(fused))     # 1/4 of the input resolution


def crop_window(img_hw, y1, y2, x1, x2):
    """img[:, :, y1:y2, x1:x2] made contiguous for the model (F.pad at the border)."""
    return torch.empty(3 * CROP * CROP * 4)


def slide_inference(model, img_hw, scale):
    h, w = img_hw
    preds = torch.empty(NUM_CLASSES * (h // 4) * (w // 4) * 4)      # logits accumulated at 1/4 resolution
    count = torch.empty((h // 4) * (w // 4) * 4)
    h_grids = max(h - CROP + STRIDE - 1, 0) // STRIDE + 1
    w_grids = max(w - CROP + STRIDE - 1, 0) // STRIDE + 1
    for hi in range(h_grids):
        for wi in range(w_grids):
            y1 = min(hi * STRIDE, max(h - CROP, 0))
            x1 = min(wi * STRIDE, max(w - CROP, 0))
            crop = crop_window(img_hw, y1, y1 + CROP, x1, x1 + CROP)
            crop_logits = model(crop)
            # preds[:, :, y1 // 4:(y1 + CROP) // 4, x1 // 4:(x1 + CROP) // 4] += crop_logits; count[...] += 1
            del crop_logits, crop
    del count
    return preds                                                     # preds / count


def predict_tta(model, frame):
    view_logits = []
    with torch.no_grad():
        for s in SCALES:
            for flip in (False, True):
                img = F.interpolate(frame, scale_factor=s, mode="bilinear")
                if flip:
                    img = img.clone()                                # img.flip(-1)
                logits = slide_inference(model, (int(FRAME_H * s), int(FRAME_W * s)), s)
                if flip:
                    logits = logits.clone()                          # logits.flip(-1)
                view_logits.append(F.interpolate(logits, scale_factor=4.0 / s, mode="bilinear"))
                del img
        merged = torch.empty(len(view_logits) * view_logits[0].nbytes)  # torch.stack(view_logits)
        mean = torch.empty(view_logits[0].nbytes)                       # .mean(0)
        del merged
        return torch.empty(FRAME_H * FRAME_W * 8)                       # .argmax(1)


def read_frames(path, n=5400):
    for i in range(n):
        yield torch.empty(3 * FRAME_H * FRAME_W, dtype=torch.float32)   # decoded RGB frame, normalised, .cuda()


def main():
    model = DeepLabV3Plus(NUM_CLASSES).cuda()
    model.eval()
    for idx, frame in enumerate(read_frames("survey/2024-05-14/cam_front_0007.mp4")):
        label_map = predict_tta(model, frame)
        print("frame %d done" % idx)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
