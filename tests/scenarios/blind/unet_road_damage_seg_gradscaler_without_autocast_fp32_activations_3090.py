"""train_roads.py -- semantic segmentation of road damage (cracks, potholes, patches) in 1024x1024
dash-cam frames: a U-Net with a ResNet-50 encoder (segmentation_models_pytorch, 32.5M parameters),
batch 12, AdamW, on the user's own RTX 3090 (24 GiB).  The user "turned on AMP" by following half of
the recipe: the GradScaler is there, the autocast context is not:

    scaler = torch.cuda.amp.GradScaler()
    for images, masks in loader:
        optimizer.zero_grad()
        logits = model(images)                       # <- no `with torch.autocast("cuda"):` around this
        loss = dice_ce(logits, masks)
        scaler.scale(loss).backward()
        scaler.step(optimizer); scaler.update()

So every activation is float32.  At 1024 px the decoder's last stages (256 and 128 channels at
512x512 and 1024x1024, batch 12) save 2-4.5 GiB each for backward; the forward of step 0 needs
about 25 GiB of saved activations and dies in the decoder's final upsampling block, with 130 MiB of
weights, no gradients or optimizer state yet, and nothing cached.  Under autocast (bf16 on this
Ampere card, or fp16 with the scaler the user already has) the same forward saves about half:
~12.5 GiB, and the job fits with room.

What the user says: "I already use mixed precision, so it must be the batch -- but batch 12 is what
the paper used."  What an expert says first: you are not running in mixed precision: the scaler
only scales the loss; wrap the forward and the loss in torch.autocast("cuda", dtype=torch.bfloat16)
(the failure report says autocast was off).  Then, if still short: a smaller batch with
accumulation, or gradient checkpointing of the encoder.  Wrong advice: empty_cache or the
allocator's settings (nothing is cached: it is one forward's live activations), a leak (step 0),
other processes, quantization or inference mode (it is training), a bigger card.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
BATCH, H, W = 12, 1024, 1024


class GradScaler(object):
    """torch.cuda.amp.GradScaler as far as memory goes: scale() multiplies the loss, nothing more."""

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass


class Stage(nn.Module):
    """A conv stage: `pbytes` of weights; saves `channels` x (h x w) x batch activations, `k` of them."""

    def __init__(self, pbytes, channels, hw, k):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(pbytes, device="cuda"))
        self.channels, self.hw, self.k = channels, hw, k

    def forward(self, h):
        itemsize = 2 if torch.is_autocast_enabled() else 4
        out = torch.empty(BATCH * self.channels * self.hw * self.hw * itemsize * self.k, device="cuda")
        out._saved = h
        return out


class Unet(nn.Module):
    """smp.Unet("resnet50", classes=4): encoder stages at /2../32, decoder back up to full size."""

    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = nn.Module()
        self.decoder = nn.Module()
        enc = [(1 * MiB, 64, 512, 6), (1 * MiB, 256, 256, 8), (5 * MiB, 512, 128, 8),
               (27 * MiB, 1024, 64, 8), (58 * MiB, 2048, 32, 6)]
        dec = [(32 * MiB, 256, 64, 6), (5 * MiB, 128, 128, 6), (1 * MiB, 64, 256, 6),
               (512 * 1024, 32, 512, 6), (128 * 1024, 16, 1024, 6)]
        for i, a in enumerate(enc):
            setattr(self.encoder, "layer%d" % i, Stage(*a))
        for i, a in enumerate(dec):
            setattr(self.decoder, "block%d" % i, Stage(*a))
        self.segmentation_head = Stage(8 * 1024, 4, 1024, 3)

    def forward(self, x):
        h = x
        for i in range(5):
            h = getattr(self.encoder, "layer%d" % i)(h)
        for i in range(5):
            h = getattr(self.decoder, "block%d" % i)(h)
        return self.segmentation_head(h)


def dice_ce(logits, masks):
    loss = torch.empty(4, device="cuda")
    loss._saved = logits
    return torch._derive(loss, logits)


def main():
    model = Unet().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4)
    scaler = GradScaler()
    for epoch in range(60):
        for it in range(500):
            images = torch.empty(BATCH * 3 * H * W * 4, device="cuda")
            masks = torch.empty(BATCH * H * W * 8, device="cuda")
            optimizer.zero_grad()
            logits = model(images)
            loss = dice_ce(logits, masks)
            scen_truth.backward(scaler.scale(loss))
            scaler.step(optimizer)
            scaler.update()
            del images, masks, logits, loss
        print("epoch %d" % epoch)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
