"""denoise_tomo.py -- I trained a small 3-D U-Net (Noise2Noise on even/odd frame halves, cryoCARE-style)
on 72^3 sub-volumes, and it works fine in training.  For inference I thought I could just push the whole
tomogram through at once, since it is "only" 1.3 GB on disk.  RTX 3090 (24 GB), nothing else running:

    vol = mrcfile.read("TS_026_bin4.mrc")              # 400 x 960 x 928 voxels, float32 after normalising
    model = UNet3D(base=16).cuda().eval()              # ~1.4M params, checkpoint from training
    model.load_state_dict(torch.load("n2n_best.pt", map_location="cpu"))
    x = torch.from_numpy(vol)[None, None].cuda()       # batch_size = 1
    with torch.no_grad():
        den = model(x)                                  # <- CUDA out of memory

The traceback points at the second convolution of the first encoder block.

What an expert sees: a volume passed whole through a 3-D network.  The input is 1.33 GiB, but the first
level keeps 16 channels at full resolution: every feature map there is 16 x 1.33 = 21.2 GiB, and the
second convolution of the block needs a second one while the first is alive.  Autograd is already off and
the batch is 1; the weights are 6 MB.  The fix is tiled (sliding-window) inference: overlapping
patches of, say, 128^3 to 192^3 voxels, stitched with a blend (MONAI's sliding_window_inference, or
cryoCARE's own n_tiles), which is how the network was trained anyway.  fp16 autocast halves the maps but
still needs ~21 GiB at the first level for two maps, with the decoder's skip connections on top: not a fix
by itself.  Not a smaller batch (it is 1), not inference_mode (no_grad is on), not checkpointing (no
backward), not the cache or fragmentation, not other processes.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class DoubleConv(nn.Module):
    """conv3x3x3 -> GroupNorm -> ReLU, twice (norms and ReLUs in place, no extra maps kept under no_grad)."""

    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, device="cuda")
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, device="cuda")

    def forward(self, x):
        h = self.conv1(x)
        return self.conv2(h)


class Down(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.pool = nn.Conv3d(cin, cin, 2, stride=2, bias=False, device="cuda")   # strided conv, as trained
        self.block = DoubleConv(cin, cout)

    def forward(self, x):
        return self.block(self.pool(x))


class Up(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.up = nn.Conv3d(cin, cout * 8, 1, device="cuda")       # transposed conv weights, same count
        self.block = DoubleConv(cout * 2, cout)

    def forward(self, x, skip):
        return self.block(self.up(x))


class UNet3D(nn.Module):
    def __init__(self, base=16):
        nn.Module.__init__(self)
        self.enc1 = DoubleConv(1, base)
        self.enc2 = Down(base, base * 2)
        self.enc3 = Down(base * 2, base * 4)
        self.enc4 = Down(base * 4, base * 8)
        self.up3 = Up(base * 8, base * 4)
        self.up2 = Up(base * 4, base * 2)
        self.up1 = Up(base * 2, base)
        self.head = nn.Conv3d(base, 1, 1, device="cuda")

    def forward(self, x):
        s1 = self.enc1(x)
        s2 = self.enc2(s1)
        s3 = self.enc3(s2)
        h = self.enc4(s3)
        h = self.up3(h, s3)
        h = self.up2(h, s2)
        h = self.up1(h, s1)
        return self.head(h)


def main():
    batch_size = 1
    depth, height, width = 400, 960, 928
    model = UNet3D(base=16).cuda().eval()
    vol_bytes = batch_size * depth * height * width * 4              # float32 tomogram, 1.33 GiB
    x = torch.empty(vol_bytes, device="cuda")                        # torch.from_numpy(vol)[None, None].cuda()
    with torch.no_grad():
        den = model(x)
    return den


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
