"""depth_batch.py -- a nightly batch job for a real-estate site: Depth-Anything-V2-Large (335M params, fp16,
0.67 GiB) predicts a depth map for every new listing photo, for the "measure the room" feature, on one
L4 (24 GB, 22.5 GiB usable) of a GKE node pool.  The photos are run one at a time (their sizes differ)
and, because resizing to 518 px blurred the walls the feature measures, at NATIVE resolution rounded to
a multiple of 14:

    model = DepthAnythingV2(encoder="vitl").half().cuda().eval()
    for path in new_photos():
        img = load(path)                                  # HxWx3, native size
        with torch.inference_mode():
            depth = model.infer_image(img, input_size=None)   # None = keep the native size

A 12 MP phone photo (4032x3024) peaks at about 4.3 GiB (SDPA attention keeps the encoder O(tokens); the
DPT head's last upsample to full size is 2.9 GiB).  It ran for months.  Last night an agent uploaded a
360-degree equirectangular panorama, 16384x8192 (134 MP, 11x a phone photo): the encoder still fits
(684k tokens, ~13 GiB), then the DPT head asks for ONE 32 GiB tensor: the 128-channel fp16 feature map
upsampled to the full 16380x8190 size (`F.interpolate(out, (patch_h*14, patch_w*14))`).  A single
request larger than the whole card.

An expert: the input, not the model, is the problem: cap the input size (resize panoramas to at most
~4k on the long side, or run them as overlapping tiles / split the head's upsample into strips) --
and route equirectangular images to a tiling path.  Wrong advice: a smaller batch (it is one image),
mixed precision / inference_mode (already fp16 under inference_mode), empty_cache or
expandable_segments (no cache or fragmentation can make 32 GiB appear on a 22.5 GiB card),
quantizing a 0.67 GiB model, or a bigger GPU (an 80 GB card would do this one and fail on the next
larger pano).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
PATCH = 14
FEATURES = 256          # DPT head width for vitl


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # attn qkv+proj and mlp of a ViT-L block: 12.6M params, fp16
        self.weight = torch.nn.Parameter(torch.empty(12_600_000, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)

    def forward(self, x):
        tokens = x.nbytes // (1024 * 2)
        qkv = torch.empty(tokens * 3 * 1024 * 2, device="cuda")          # SDPA (mem-efficient): O(tokens)
        attn = torch.empty(tokens * 1024 * 2, device="cuda")
        del qkv
        hidden = torch.empty(tokens * 4096 * 2, device="cuda")            # MLP fc1
        out = torch.empty(tokens * 1024 * 2, device="cuda")
        del hidden, attn
        return out


class DINOv2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(24):
            setattr(self, "blocks_%d" % i, Block())

    def get_intermediate_layers(self, x, n=(4, 11, 17, 23)):
        keep = []
        for i in range(24):
            x = getattr(self, "blocks_%d" % i)(x)
            if i in n:
                keep.append(x)
        return keep


class DPTHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(31_000_000, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)

    def forward(self, feats, patch_h, patch_w):
        # reassemble + refinenet fusion: path_1 at 4x the patch grid, 256 channels, fp16
        grid = patch_h * patch_w
        path_1 = torch.empty(grid * 16 * FEATURES * 2, device="cuda")
        del feats[:]
        out = F.conv2d(path_1, self.weight, out_channels=FEATURES // 2, in_channels=FEATURES)  # output_conv1
        # upsample to the input's full size: (patch_h*14, patch_w*14) = 3.5x each side of path_1
        out = F.interpolate(out, scale_factor=PATCH / 4.0, mode="bilinear")
        depth = F.conv2d(out, self.weight, out_channels=1, in_channels=FEATURES // 2)  # output_conv2/3
        return depth


class DepthAnythingV2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.pretrained = DINOv2()
        self.depth_head = DPTHead()

    def infer_image(self, hw, input_size=None):
        h, w = hw
        patch_h, patch_w = h // PATCH, w // PATCH
        x = torch.empty(patch_h * patch_w * 1024 * 2, device="cuda")      # patch embeddings
        feats = self.pretrained.get_intermediate_layers(x)
        del x
        return self.depth_head(feats, patch_h, patch_w)


def new_photos():
    yield "listing-88213/kitchen.jpg", (3024, 4032)
    yield "listing-88213/living.jpg", (3024, 4032)
    yield "listing-88214/facade.jpg", (3000, 4000)
    yield "listing-88214/bedroom.heic", (4284, 5712)
    yield "listing-88215/living-360.jpg", (8192, 16384)     # equirectangular panorama from a 360 camera
    yield "listing-88215/bath.jpg", (3024, 4032)


model = DepthAnythingV2().eval()
try:
    for path, hw in new_photos():
        with torch.inference_mode():
            depth = model.infer_image(hw, input_size=None)
        del depth
        print("depth ok", path, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
