"""Jupyter: a Grad-CAM cell wraps model.layer4 in a recorder that appends every forward's feature map to a list
(detached, but on the GPU); the wrapper stays on the model, and the training cell that follows adds 36.75 MiB
per step until the card is full, 57 steps into epoch 1.  ResNet-50 on PlantVillage, RTX 3060 12 GB.

The notebook, with real libraries:

    [3]  model = torchvision.models.resnet50(weights="IMAGENET1K_V2")
         model.fc = nn.Linear(2048, 38); model = model.cuda()
         optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    [4]  class CamRecorder(nn.Module):                 # "Grad-CAM from scratch" blog recipe
             def __init__(self, module):
                 super().__init__(); self.module = module; self.activations = []
             def forward(self, x):
                 out = self.module(x)
                 self.activations.append(out.detach())   # detach: "so it doesn't keep the graph"
                 return out
         model.layer4 = CamRecorder(model.layer4)
         cams = gradcam(model, probe_images)          # 8 leaves, before fine-tuning; show_cam_grid(cams)
    [5]  # "see how the CAMs change while it learns": plot model.layer4.activations after training
    [6]  for epoch in range(3):
             for images, labels in train_dl:          # batch 96, 224x224
                 loss = F.cross_entropy(model(images), labels)
                 loss.backward(); optimizer.step(); optimizer.zero_grad()
         -> OutOfMemoryError in the forward of step 57 of epoch 1

What happens.  The recorder is meant for the probe images, but it is a module of the model now: every
training forward appends its layer4 output, 96 x 2048 x 7 x 7 fp32 = 36.75 MiB.  `.detach()` drops the graph
but not the memory: the list keeps each storage on the GPU.  Nothing in the loop is wrong by itself; memory
after each optimizer step rises by 36.75 MiB, step after step, until a forward cannot get its activations.

Sizes (fp32, no autocast):
  ResNet-50 with a 38-class head: 23.6 M parameters = 90 MiB; grads 90 MiB; AdamW state 180 MiB.
  saved activations of a batch-96 forward at 224x224: ~9.0 GiB, 96 MiB per image (conv1 + bn 588 MiB,
  layer1 3.5 GiB, layer2 2.5 GiB, layer3 1.9 GiB, layer4 0.5 GiB).
  one training step without the recorder: peak 9.36 GiB allocated + 0.5 GiB context: fits 12 GiB with
  2.1 GiB to spare, every step alike (allocated after each step: 332 MiB, flat).
  with the recorder: +36.75 MiB kept per step; after 56 steps (2.0 GiB kept) the forward of step 57 fails
  in layer4, asking for 36.75 MiB with 11.2 GiB allocated.

What an expert says first: a leak across iterations -- the feature-map list on model.layer4 grows every
step.  Remove the recorder (`model.layer4 = model.layer4.module`) or clear it, record only the probe batch,
and keep what is kept for plotting on the CPU (`out.detach().cpu()`, or a downsampled CAM).  `del` the list,
`gc.collect()`, `torch.cuda.empty_cache()` gets the memory back without a restart.
Wrong advice: a smaller batch, autocast or gradient checkpointing (each only delays the same OOM by a few
dozen steps), expandable_segments or empty_cache (the blocks are live), a bigger GPU.
"""
import sys
import traceback

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

IMG, NUM_CLASSES, BATCH_SIZE = 224, 38, 96
TRAIN_IMAGES = 54305                       # PlantVillage, 38 classes
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


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x):
        return _act(max(x.nbytes // self.in_features * self.out_features, 512), x)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride=1):
        nn.Module.__init__(self)
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, bias=False)
        self.bn2 = BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), BatchNorm2d(cout))

    def forward(self, x):
        identity = self.downsample(x) if self.downsample is not None else x
        out = self.bn1(self.conv1(x))          # + relu(inplace)
        out = self.bn2(self.conv2(out))
        out = self.bn3(self.conv3(out))
        return _act(out.nbytes, out)           # relu(out + identity)


class Sequential(nn.Module):
    def __init__(self, *mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


def _make_layer(cin, width, blocks, stride):
    return Sequential(Bottleneck(cin, width, stride), *[Bottleneck(width * 4, width) for _ in range(blocks - 1)])


class ResNet(nn.Module):
    """torchvision.models.resnet50 with model.fc replaced by a 38-class head."""

    def __init__(self, num_classes=1000):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.bn1 = BatchNorm2d(64)
        self.layer1 = _make_layer(64, 64, 3, 1)
        self.layer2 = _make_layer(256, 128, 4, 2)
        self.layer3 = _make_layer(512, 256, 6, 2)
        self.layer4 = _make_layer(1024, 512, 3, 2)
        self.fc = Linear(2048, num_classes)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x = _act(x.nbytes // 4, x)             # maxpool
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = _act(x.nbytes // 49, x)            # avgpool + flatten
        return self.fc(x)


class CamRecorder(nn.Module):
    """The notebook's Grad-CAM helper: wraps a layer and keeps its feature maps for the CAM plots."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module = module
        self.activations = []

    def forward(self, x):
        out = self.module(x)
        self.activations.append(out.detach())   # detached -- still on the GPU
        return out


class NotebookShell(object):
    """What IPython's InteractiveShell does around each cell: the last expression's value goes to Out[n] and
    _; an exception is shown and kept in sys.last_*.  stop=True: the error ends the run (nbconvert --execute)."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})

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
            self.user_ns["Out"][n] = result
            self.user_ns["_"] = result
        return result


def train_batches(batch_size, n):
    """DataLoader(plantvillage_train, batch_size=64, shuffle=True, num_workers=4): images and labels to the GPU."""
    for _ in range(n):
        images = torch.empty(batch_size * 3 * IMG * IMG * F32)
        labels = torch.empty(batch_size * 8)
        yield images, labels


# ---- the notebook's cells --------------------------------------------------------------------------
model = optimizer = cams = None


def cell_3_model():
    global model, optimizer
    model = ResNet()
    model.fc = Linear(2048, NUM_CLASSES)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def gradcam(model, probe_images):
    """Grad-CAM for each probe image: forward, backward of the top class score, weight the recorded maps."""
    model.eval()
    out = []
    for img in probe_images:
        score = model(img)
        scen_truth.backward(score)               # score[0, score.argmax()].backward()
        acts = model.layer4.activations[-1]
        out.append(_act(IMG * IMG * F32, acts).detach())   # upsampled heat map of the image
    model.zero_grad()
    return out


def cell_4_gradcam():
    global cams
    model.layer4 = CamRecorder(model.layer4)
    probe_images = [torch.empty(3 * IMG * IMG * F32) for _ in range(8)]
    cams = gradcam(model, probe_images)
    # show_cam_grid(probe_images, cams)


def cell_6_train():
    model.train()
    steps_per_epoch = TRAIN_IMAGES // BATCH_SIZE
    for epoch in range(3):
        for step, (images, labels) in enumerate(train_batches(BATCH_SIZE, steps_per_epoch)):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            scen_truth.backward(loss)            # loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 50 == 0:
                print("epoch %d step %d" % (epoch, step))


def main():
    shell = NotebookShell(globals())
    shell.run_cell(lambda: None)                 # [1] imports, [2] data
    shell.run_cell(lambda: None)
    shell.run_cell(cell_3_model)
    shell.run_cell(cell_4_gradcam)
    shell.run_cell(lambda: None)                 # [5] markdown-ish comment cell
    shell.run_cell(cell_6_train, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
