"""train_brats.py -- a 3D U-Net for brain-tumour segmentation (BraTS 2021: 4 MRI modalities, 240 x 240 x 155
voxels) written by a student who found nnU-Net's patches "lose the global context" and feeds whole volumes
instead, on a 24 GB RTX A5000, with a plain `LD_PRELOAD=liboomguard.so`.  The network is nnU-Net's plan
(5 stages, 32-64-128-256-320 channels, two 3x3x3 convolutions + InstanceNorm + LeakyReLU per stage, strided
convolutions down, transposed convolutions up, skip concatenations), fp32, SGD with Nesterov momentum,
batch 2:

    model = UNet3D(in_channels=4, num_classes=4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True)
    for image, seg in loader:                     # image: 2 x 4 x 240 x 240 x 155 float32, no cropping
        loss = dice_ce(model(image.cuda()), seg.cuda())
        loss.backward(); optimizer.step(); optimizer.zero_grad()

At full resolution every 32-channel feature map of the first stage is 2 x 32 x 8.9M voxels x 4 B = 2.2 GiB,
and the first stage keeps six of them for backward (13 GiB); the encoder holds ~19 GiB before the decoder
starts, and the decoder's full-resolution stage would add as much again (~45 GiB for the pass, the weights
are 120 MiB).  The first forward pass runs out in the decoder's half-resolution stage (64 channels, a LeakyReLU
asking for 545 MiB with 324 MiB free), before the full-resolution stage is even reached.

An expert: whole 3D volumes do not train on a 24 GB card with this network.  Train on random patches (nnU-Net's
128 x 128 x 128 crops are 4x fewer voxels, with foreground oversampling) and predict whole volumes with a
sliding window; add mixed precision (nnU-Net's default), which halves every activation; batch 1 or activation
checkpointing are further levers.  Not the optimizer or the weights (tiny), not the cache, fragmentation,
foreign processes or inference.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

batch_size = 2
VOLUME = 240 * 240 * 155
IN_CHANNELS = 4


class InstanceNorm3d(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(c * 4, device="cuda"))
        self.bias = nn.Parameter(torch.empty(c * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes, device="cuda")
        out._saved = x
        return out


def leaky_relu(x):
    out = torch.empty(x.nbytes, device="cuda")
    out._saved = x
    return torch._derive(out, x)


class ConvDropoutNormReLU(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        nn.Module.__init__(self)
        self.conv = nn.Conv3d(c_in, c_out, 3, stride, device="cuda")
        self.norm = InstanceNorm3d(c_out)

    def forward(self, x):
        return leaky_relu(self.norm(self.conv(x)))


class StackedConvBlocks(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        nn.Module.__init__(self)
        self.first = ConvDropoutNormReLU(c_in, c_out, stride)
        self.second = ConvDropoutNormReLU(c_out, c_out)

    def forward(self, x):
        return self.second(self.first(x))


class TransposedConv3d(nn.Module):
    """ConvTranspose3d(kernel 2, stride 2): 8x the voxels."""

    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.c_in, self.c_out = c_in, c_out
        self.weight = nn.Parameter(torch.empty(c_in * c_out * 8 * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes * self.c_out // self.c_in * 8, device="cuda")
        out._saved = x
        return out


def cat(a, b):
    out = torch.empty(a.nbytes + b.nbytes, device="cuda")
    out._saved = a
    out._skip = b
    return torch._derive(out, a, b)


class UNet3D(nn.Module):
    def __init__(self, in_channels=4, num_classes=4, features=(32, 64, 128, 256, 320)):
        nn.Module.__init__(self)
        self.encoder = []
        c_prev = in_channels
        for i, c in enumerate(features):
            block = StackedConvBlocks(c_prev, c, 1 if i == 0 else 2)
            setattr(self, "encoder_%d" % i, block)
            self.encoder.append(block)
            c_prev = c
        self.decoder = []
        for i in range(len(features) - 1, 0, -1):
            up = TransposedConv3d(features[i], features[i - 1])
            block = StackedConvBlocks(2 * features[i - 1], features[i - 1])
            setattr(self, "up_%d" % i, up)
            setattr(self, "decoder_%d" % i, block)
            self.decoder.append((up, block))
        self.seg_output = nn.Conv3d(features[0], num_classes, 1, device="cuda")

    def forward(self, x):
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
        skips.pop()
        for up, block in self.decoder:
            x = block(cat(up(x), skips.pop()))
        return self.seg_output(x)


def main():
    model = UNet3D(in_channels=IN_CHANNELS)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.99, nesterov=True)
    for epoch in range(1000):
        for it in range(250):
            image = torch.empty(batch_size * IN_CHANNELS * VOLUME * 4, device="cuda")
            seg = torch.empty(batch_size * VOLUME, device="cuda")
            logits = model(image)
            loss = torch.empty(512, device="cuda")
            loss._saved = logits
            loss._params = logits._params
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            del image, seg, logits, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
