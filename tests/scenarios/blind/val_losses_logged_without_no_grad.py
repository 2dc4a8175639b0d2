"""train_seg.py -- a U-Net for semantic segmentation (21 classes, 512 x 512 crops, 31M parameters) trained
with AdamW on one 24 GiB card, batch 16.  Every 200 steps the trainer runs a validation pass and keeps
the losses in its history to log their mean:

    def validate(self):
        self.model.eval()                                  # ...but no torch.no_grad()
        for images, masks in self.val_loader:              # 60 batches of 4
            logits = self.model(images.cuda())
            loss = self.criterion(logits, masks.cuda())
            self.history["val_loss"].append(loss)          # the tensor, not loss.item()
        self.log(torch.stack(self.history["val_loss"][-60:]).mean())
        self.model.train()

Training steps fit (about 12.6 GiB reserved at the peak, batch 16), for 200 steps.  In validation
autograd is still on, so every val loss is the root of its batch's whole graph -- every convolution's
and upsampling's output saved for a backward that never comes, about 3 GiB per batch of 4 -- and the
list keeps all of them alive.  The cached training activations absorb the first four batches; after
seven the decoder's upsampling of the eighth no longer fits.

An expert: log loss.item() (or loss.detach()) so that each batch's graph is freed, and run validation
under torch.no_grad() / inference_mode, which keeps no graph at all.  Not a smaller batch or
checkpointing (a single batch's graph is small), not mixed precision, not fragmentation or the cache,
not splitting the upsampling or the convolutions: the memory is the list's.
"""
import collections
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
torch.Tensor.item = lambda self: 0.0          # stand-in scaffolding: the fake torch holds no values


class DoubleConv(torch.nn.Module):
    def __init__(self, cin, cout, stride=1):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride=stride, device="cuda")
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, device="cuda")

    def forward(self, x):
        return self.conv2(self.conv1(x))


class UNet(torch.nn.Module):
    def __init__(self, n_classes=21):
        torch.nn.Module.__init__(self)
        self.inc = DoubleConv(3, 64)
        self.down1 = DoubleConv(64, 128, stride=2)
        self.down2 = DoubleConv(128, 256, stride=2)
        self.down3 = DoubleConv(256, 512, stride=2)
        self.down4 = DoubleConv(512, 1024, stride=2)
        self.up1 = DoubleConv(1024, 512)
        self.up2 = DoubleConv(512, 256)
        self.up3 = DoubleConv(256, 128)
        self.up4 = DoubleConv(128, 64)
        self.outc = torch.nn.Conv2d(64, n_classes, 1, device="cuda")

    def forward(self, x):
        x = self.down4(self.down3(self.down2(self.down1(self.inc(x)))))
        for up in (self.up1, self.up2, self.up3, self.up4):
            x = up(F.interpolate(x, scale_factor=2.0))
        return self.outc(x)


class Trainer(object):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer
        self.criterion = F.cross_entropy
        self.history = collections.defaultdict(list)

    def train_step(self, batch_size=16):
        images = torch.empty(batch_size * 3 * 512 * 512 * 4, device="cuda")
        logits = self.model(images)
        loss = self.criterion(logits, None)
        scen_truth.backward(loss)                   # loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.history["train_loss"].append(loss.item())

    def validate(self, batch_size=4, n_batches=60):
        self.model.eval()
        for _ in range(n_batches):
            images = torch.empty(batch_size * 3 * 512 * 512 * 4, device="cuda")
            logits = self.model(images)
            loss = self.criterion(logits, None)
            self.history["val_loss"].append(loss)
        self.model.train()

    def fit(self, steps):
        for step in range(steps):
            self.train_step()
            if (step + 1) % 200 == 0:
                self.validate()


def main():
    model = UNet()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    Trainer(model, optimizer).fit(400)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
