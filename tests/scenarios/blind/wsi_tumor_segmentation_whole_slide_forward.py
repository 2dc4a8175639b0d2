"""segment_slide.py -- tumour segmentation of whole-slide images (digital pathology), inference only,
on a 24 GiB card, with plain `LD_PRELOAD=liboomguard.so`:

    model = UNet(in_ch=3, base=32).half().cuda().eval()          # 60M parameters, 120 MiB in fp16
    slide = openslide.OpenSlide(path)
    region = slide.read_region((0, 0), level=1, size=slide.level_dimensions[1])   # 24576 x 24576 px
    x = torch.from_numpy(np.asarray(region)[..., :3]).cuda()    # uint8, 1.7 GiB
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        x = normalize(x.permute(2, 0, 1)[None].half())         # fp16, 3.4 GiB
        mask = model(x).argmax(1)                                 # the whole slide in ONE forward pass

The network was trained on 512 x 512 patches and validated on them; the inference script then feeds
the whole level-1 image (600 megapixels) as one tensor.  The very first convolution's output, 32
channels of 24576 x 24576 in fp16, is one 36 GiB tensor: more than the whole card, whatever else is
on it.  It is already fp16, already inference_mode, batch 1.

An expert: tile the slide -- sliding-window inference over 1024-2048 px tiles with an overlap (MONAI's
sliding_window_inference, or a loop over tissue tiles from the thumbnail's tissue mask) and stitch
the masks; this is how the model was trained anyway.  Not a bigger GPU (an 80 GB card does not hold a
level-0 slide either), not a smaller batch (it is 1), not mixed precision or no_grad (both already on),
not a cache or fragmentation problem, not quantization (the weights are 120 MiB).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
SIDE = 24576                     # level-1 region, pixels per side
scen_truth.note_every_empty(torch)


class ConvBlock(torch.nn.Module):
    def __init__(self, cin, cout, nbytes):
        torch.nn.Module.__init__(self)
        self.cin, self.cout = cin, cout
        self.weight = torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)

    def forward(self, x, pixels):
        # conv3x3 -> BN -> ReLU at full resolution: cout channels of pixels, fp16 under autocast
        out = torch.empty(self.cout * pixels * 2, device="cuda")
        return out


class UNet(torch.nn.Module):
    def __init__(self, base=32):
        torch.nn.Module.__init__(self)
        chans = [base, base * 2, base * 4, base * 8, base * 16]
        cin = 3
        for i, c in enumerate(chans):
            setattr(self, "enc%d" % i, ConvBlock(cin, c, (4 + 8 * i) * MiB))
            cin = c
        for i, c in enumerate(reversed(chans[:-1])):
            setattr(self, "dec%d" % i, ConvBlock(cin, c, (12 - 2 * i) * MiB))
            cin = c
        self.head = ConvBlock(cin, 3, 1 * MiB)

    def forward(self, x):
        pixels = SIDE * SIDE
        skips = []
        h = x
        for i in range(5):
            h = getattr(self, "enc%d" % i)(h, pixels)
            skips.append(h)
            pixels //= 4
        for i in range(4):
            pixels *= 4
            h = getattr(self, "dec%d" % i)(h, pixels)
        return self.head(h, pixels)


def read_region(side):
    """openslide's read_region at level 1, RGB uint8, copied to the GPU (np.asarray -> .cuda())."""
    return torch.empty(side * side * 3, dtype=torch.uint8, device="cuda")


def main():
    model = UNet().eval()
    for path in ["TCGA-A2-A0T2-01Z-00-DX1.svs", "TCGA-BH-A0BZ-01Z-00-DX1.svs"]:
        region = read_region(SIDE)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            x = torch.empty(region.nbytes * 2, device="cuda")        # .half() and normalize: fp16 copy
            del region
            mask = model(x)
        print("%s: mask of %d bytes" % (path, mask.nbytes))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
