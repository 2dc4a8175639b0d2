"""Jupyter: a cell that only displays `model(xb)` leaves the output in Out[5] with its autograd graph (a whole
batch-8 forward's activations, 13.1 GiB); the training cell's first forward then fails.  RTX 4090 24 GB.

The notebook (DeepGlobe land cover, 1024x1024 crops, 7 classes), with real libraries:

    [2]  train_dl = DataLoader(LandCoverDataset("train", crop=1024), batch_size=8, shuffle=True, num_workers=6)
    [3]  model = smp.Unet("resnet34", encoder_weights="imagenet", classes=7).cuda()
         optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    [4]  xb, yb = next(iter(train_dl)); xb, yb = xb.cuda(), yb.cuda()
    [5]  model(xb)                 # "does it run? what comes out?" -- the tensor is displayed,
                                   # tensor([[[...]]], device='cuda:0', grad_fn=<ConvolutionBackward0>)
    [6]  def train_one_epoch(...): for xb, yb in train_dl: loss = F.cross_entropy(model(xb), yb); loss.backward(); ...
    [7]  train_one_epoch(model, train_dl, optimizer)
         -> OutOfMemoryError in the decoder of the very first forward (its last upsample, 1 GiB)

What happens.  Cell [5] ends with an expression, so IPython's display hook stores its value in Out[5], `_5`
and `_`.  The model is in train mode and autograd is on, so that output holds its grad_fn, and the graph
holds every tensor the forward saved for backward: the encoder's and decoder's feature maps of 8 images at
1024x1024.  Nothing ever backpropagates through it, so nothing frees it; `xb` (a global) is only 96 MiB of it.

Sizes (fp32; UNet with ResNet-34 encoder, decoder channels 256/128/64/32/16; 24.4 M parameters = 93 MiB):
  saved activations of one batch-8 forward at 1024x1024: conv1 + bn/relu 2 x 512 MiB, maxpool 128 MiB,
  layer1 1.9 GiB, layer2 1.25 GiB, layer3 0.94 GiB, layer4 0.23 GiB, decoder 0.28 + 0.56 + 1.1 + 2.5 +
  3.0 GiB, head 224 MiB: 13.1 GiB.
  training on a clean kernel: peak 14.0 GiB allocated (activations, params, grads, AdamW) + 0.5 GiB
  context: fits 24 GiB with 9.5 GiB to spare.
  with Out[5]: 13.1 GiB held + 0.1 params + 0.5 context before training starts; the training forward gets
  10.3 GiB and fails in the last decoder stage, upsampling 512x512 -> 1024x1024 (a 1 GiB request), with
  23.4 GiB allocated.

What an expert says first: the memory is held by the notebook's output history, not by training.  `del
Out[5], _5; _ = None` (or `%reset -f out`), `gc.collect()`, `torch.cuda.empty_cache()` -- or restart the
kernel -- and batch 8 trains as it would in a script.  Inspect outputs under `torch.no_grad()` (or end the cell
with `;`, or print `.shape` only) so the history keeps no graph.
Wrong advice: a smaller batch, gradient checkpointing, autocast (all shrink the training pass while the stale
13.1 GiB stays), expandable_segments / empty_cache alone (the bytes are live, not cached), inference_mode for the
failing pass (it is training), a bigger GPU.
"""
import sys
import traceback

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

CROP, NUM_CLASSES, BATCH_SIZE = 1024, 7, 8
F32 = 4


def _act(nbytes, saved):
    """The output of an operation of the forward (the stand-in computes nothing): nbytes on the GPU, saving
    `saved` for backward."""
    out = torch.empty(int(nbytes))
    out._saved = saved
    return out


class BatchNorm2d(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(c, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(c, dtype=torch.float32))
        self.register_buffer("running_mean", torch.empty(c, dtype=torch.float32))
        self.register_buffer("running_var", torch.empty(c, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes, x)


class ConvBnReLU(nn.Module):
    def __init__(self, cin, cout, k=3, stride=1):
        nn.Module.__init__(self)
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, bias=False)
        self.bn = BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))          # bn output, ReLU(inplace=True) over it


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        nn.Module.__init__(self)
        self.conv1 = ConvBnReLU(cin, cout, 3, stride)
        self.conv2 = nn.Conv2d(cout, cout, 3, bias=False)
        self.bn2 = BatchNorm2d(cout)
        self.downsample = ConvBnReLU(cin, cout, 1, stride) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        identity = self.downsample(x) if self.downsample is not None else x
        out = self.bn2(self.conv2(self.conv1(x)))
        return _act(out.nbytes, out)          # relu(out + identity)


class Sequential(nn.Module):
    def __init__(self, *mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


def _layer(cin, cout, blocks, stride):
    return Sequential(BasicBlock(cin, cout, stride), *[BasicBlock(cout, cout) for _ in range(blocks - 1)])


class ResNetEncoder(nn.Module):
    """segmentation_models_pytorch's resnet34 encoder: returns the features of every stage."""

    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.bn1 = BatchNorm2d(64)
        self.layer1 = _layer(64, 64, 3, 1)
        self.layer2 = _layer(64, 128, 4, 2)
        self.layer3 = _layer(128, 256, 6, 2)
        self.layer4 = _layer(256, 512, 3, 2)

    def forward(self, x):
        f1 = self.bn1(self.conv1(x))                   # 1/2, 64 ch
        p = _act(f1.nbytes // 4, f1)                   # maxpool 3x3 s2
        f2 = self.layer1(p)                            # 1/4, 64
        f3 = self.layer2(f2)                           # 1/8, 128
        f4 = self.layer3(f3)                           # 1/16, 256
        f5 = self.layer4(f4)                           # 1/32, 512
        return [x, f1, f2, f3, f4, f5]


class DecoderBlock(nn.Module):
    def __init__(self, cin, cskip, cout):
        nn.Module.__init__(self)
        self.cin, self.cskip = cin, cskip
        self.conv1 = ConvBnReLU(cin + cskip, cout)
        self.conv2 = ConvBnReLU(cout, cout)

    def forward(self, x, skip=None):
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        if skip is not None:
            x = _act(x.nbytes + skip.nbytes, x)        # torch.cat([x, skip], dim=1)
        return self.conv2(self.conv1(x))


class UnetDecoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.blocks = Sequential(DecoderBlock(512, 256, 256), DecoderBlock(256, 128, 128),
                                 DecoderBlock(128, 64, 64), DecoderBlock(64, 64, 32), DecoderBlock(32, 0, 16))

    def forward(self, *features):
        skips = [features[4], features[3], features[2], features[1], None]
        x = features[5]
        for i, block in enumerate(self.blocks._modules.values()):
            x = block(x, skips[i])
        return x


class Unet(nn.Module):
    """smp.Unet("resnet34", classes=7)."""

    def __init__(self, classes):
        nn.Module.__init__(self)
        self.encoder = ResNetEncoder()
        self.decoder = UnetDecoder()
        self.segmentation_head = nn.Conv2d(16, classes, 3)

    def forward(self, x):
        features = self.encoder(x)
        decoder_output = self.decoder(*features)
        return self.segmentation_head(decoder_output)


class NotebookShell(object):
    """What IPython's InteractiveShell does around each cell: the value of the cell's last expression is
    displayed and kept by the display hook in Out[n], _n and _ (DisplayHook.update_user_ns); an exception is
    shown and kept in sys.last_*.  stop=True: the error ends the run (`jupyter nbconvert --execute`)."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})
        user_ns["_oh"] = user_ns["Out"]

    def run_cell(self, cell, stop=False):
        self.execution_count += 1
        try:
            result = cell()
        except Exception:
            etype, value, tb = sys.exc_info()
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            traceback.print_exception(etype, value, tb, limit=3, file=sys.stderr)
            if stop:
                raise
            return None
        if result is not None:
            n = self.execution_count
            ns = self.user_ns
            print("Out[%d]: %s" % (n, "tensor([[[...]]], device='cuda:0', grad_fn=<ConvolutionBackward0>)"
                                   if isinstance(result, torch.Tensor) else repr(result)))
            ns["Out"][n] = result
            ns["___"], ns["__"], ns["_"] = ns.get("__"), ns.get("_"), result
            ns["_%d" % n] = result
        return result


class LandCoverLoader(object):
    """DataLoader(LandCoverDataset("train", crop=1024), batch_size=8): each batch copied to the GPU."""

    def __init__(self, batch_size, n_batches):
        self.batch_size, self.n_batches = batch_size, n_batches

    def __iter__(self):
        for _ in range(self.n_batches):
            xb = torch.empty(self.batch_size * 3 * CROP * CROP * F32)          # xb.cuda()
            yb = torch.empty(self.batch_size * CROP * CROP * 8)                # int64 masks, yb.cuda()
            yield xb, yb


# ---- the notebook's cells --------------------------------------------------------------------------
train_dl = model = optimizer = xb = yb = None


def cell_2_data():
    global train_dl
    train_dl = LandCoverLoader(BATCH_SIZE, n_batches=803 // BATCH_SIZE)


def cell_3_model():
    global model, optimizer
    model = Unet(NUM_CLASSES)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def cell_4_one_batch():
    global xb, yb
    xb, yb = next(iter(train_dl))


def cell_5_look_at_output():
    return model(xb)


def train_one_epoch(model, train_dl, optimizer):
    model.train()
    for step, (xb, yb) in enumerate(train_dl):
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        scen_truth.backward(loss)                  # loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            print("step %d" % step)


def cell_7_train():
    train_one_epoch(model, train_dl, optimizer)


def main():
    shell = NotebookShell(globals())
    shell.run_cell(lambda: None)                   # [1] imports
    shell.run_cell(cell_2_data)
    shell.run_cell(cell_3_model)
    shell.run_cell(cell_4_one_batch)
    shell.run_cell(cell_5_look_at_output)
    shell.run_cell(lambda: None)                   # [6] def train_one_epoch
    shell.run_cell(cell_7_train, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
