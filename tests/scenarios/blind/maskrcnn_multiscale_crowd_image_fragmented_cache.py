"""train_parking.py -- instance segmentation of cars in aerial images (a Mask R-CNN R50-FPN,
AdamW, batch 2) with multi-scale training (short side drawn from 800-1024) on a T4 (15 GiB), with
plain `LD_PRELOAD=liboomguard.so` and no PYTORCH_CUDA_ALLOC_CONF:

    cfg.INPUT.MIN_SIZE_TRAIN = (800, 832, ..., 1024); cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING = "choice"
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 2048; cfg.MODEL.ROI_HEADS.POSITIVE_FRACTION = 0.75
    for images, targets in loader:
        losses = model(images, targets); sum(losses.values()).backward(); opt.step(); opt.zero_grad()

A 1024-scale batch makes PyTorch's allocator reserve one ~500 MiB segment per saved backbone/FPN
activation (12.7 GiB of them); the card is then nearly all reserved.  The next batches reuse those
segments.  Then an 800-scale batch of the crowded parking-lot images (1,300 cars each) comes: each
of its 305 MiB activations is served from one of the 500 MiB segments, which the allocator splits,
leaving free tails of 195 MiB (~5 GiB cached in all) that no segment can give back while its head
is in use.  The mask head's activations for ~2,600 positive RoIs are 497 MiB each: the first two
find room (the one wholly free segment, then the driver's last free memory), the third fits no
tail, the allocator frees the few small wholly free segments, retries and fails with 0.2 GiB free
on the device.  The batch needs ~11 GiB of the 15 GiB card in all.

An expert: this is fragmentation -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or
max_split_size_mb) lets the allocator reuse the tails; fixed-size inputs would avoid it too.  Not
empty_cache (the allocator already released what was wholly free; the tails sit in segments in
use), not a smaller batch or checkpointing first (the batch fits the card), not a bigger card.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def act_bytes(scale):
    """One saved backbone/FPN activation of the batch at this short side, rounded to 1 MiB."""
    return (500 * MiB * scale * scale // (1024 * 1024)) // MiB * MiB


class Stage(torch.nn.Module):
    def __init__(self, nbytes, layers):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))
        self.layers = layers

    def forward(self, x, scale):
        for _ in range(self.layers):
            h = torch.empty(act_bytes(scale), device="cuda")     # conv + BN + ReLU output, saved for backward
            h._saved = x
            x = h
        return x


class MaskHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.convs = torch.nn.Parameter(torch.empty(10 * MiB, device="cuda"))

    def forward(self, feats, n_pos):
        h = feats
        for _ in range(4):                                        # 4 convs on 14 x 14 RoI features
            h2 = torch.empty(n_pos * 256 * 14 * 14 * 4 // MiB * MiB, device="cuda")
            h2._saved = h
            h = h2
        return h


class MaskRCNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.stages = [Stage(n, layers) for n, layers in ((22 * MiB, 6), (22 * MiB, 6), (44 * MiB, 8), (44 * MiB, 6))]
        for i, s in enumerate(self.stages):
            setattr(self, "res%d" % (i + 2), s)
        self.roi_heads = MaskHead()
        self.rpn = torch.nn.Parameter(torch.empty(34 * MiB, device="cuda"))

    def forward(self, images, scale, n_pos):
        x = images
        for s in self.stages:
            x = s(x, scale)
        return self.roi_heads(x, n_pos)


def batches():
    """(short side, positive RoIs) of each batch; the crowd subset's images come at 800."""
    for scale in (1024, 896, 1024, 960, 928, 1024, 864):
        yield scale, 40
    yield 800, 2600


def main():
    model = MaskRCNN()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    for scale, n_pos in batches():
        images = torch.empty(2 * 3 * scale * scale * 5 // 3 * 4 // MiB * MiB, device="cuda")
        losses = model(images, scale, n_pos)
        loss = torch.empty(512, device="cuda")
        loss._saved = losses
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, losses, images


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
