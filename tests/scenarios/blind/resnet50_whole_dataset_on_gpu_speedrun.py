"""train_fast.py -- a "speedrun" training script adapted from a CIFAR-10 one (the whole dataset lives on
the GPU as uint8, batches are sliced and augmented there, no DataLoader) and pointed at a bigger
dataset: 80,000 food photos at 224 x 224 for train and 10,000 for validation, ResNet-50, channels
last, bf16 autocast, batch 256, SGD with momentum, on a 24 GiB card:

    train_images = torch.from_numpy(np.load("train_224.npy")).cuda()    # 80000 x 3 x 224 x 224 uint8, 11.2 GiB
    val_images   = torch.from_numpy(np.load("val_224.npy")).cuda()      # 1.4 GiB
    ...
    for epoch in range(epochs):
        for idx in torch.randperm(n, device="cuda").split(batch_size):
            x = augment(train_images[idx]).float().div_(255)           # one batch, on the GPU
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), train_labels[idx])

On CIFAR-10 the dataset was 150 MB; here 12.6 GiB of the card hold images before the model starts.
The first training batch's forward pass (bf16 activations of 256 images, ~11 GiB) fails near its end.

An expert: half the card holds the dataset; keep the images in CPU memory (pinned, or a DataLoader
with workers and pin_memory=True) and move one batch at a time: the model and a batch of 256 fit with
room to spare.  Not mixed precision (already on), not the allocator's settings, not other processes;
a smaller batch or checkpointing would only work around it.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def to_cuda(nbytes):
    """np.load(...) -> torch.from_numpy(...).cuda(): the array copied to the GPU in one tensor."""
    return torch.empty(nbytes, device="cuda")


class Bottleneck(torch.nn.Module):
    def __init__(self, params_mib, act_mib, n_acts=7):
        torch.nn.Module.__init__(self)
        self.conv = torch.nn.Parameter(torch.empty(int(params_mib * MiB), device="cuda"))
        self.act_mib, self.n_acts = act_mib, n_acts

    def forward(self, x):
        h = x
        for _ in range(self.n_acts):                      # conv/bn/relu outputs kept for backward (bf16)
            a = torch.empty(int(self.act_mib * MiB), device="cuda")
            a._saved = h
            h = a
        return h


class ResNet50(torch.nn.Module):
    # (blocks, parameter MiB per block, activation MiB per saved tensor at batch 256, 224 px, bf16)
    STAGES = ((3, 0.3, 196), (4, 1.1, 98), (6, 4.3, 49), (3, 15.0, 49))

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.stem = torch.nn.Parameter(torch.empty(36 * 1024, device="cuda"))
        self.blocks = torch.nn.Module()
        k = 0
        for n, p, a in self.STAGES:
            for _ in range(n):
                setattr(self.blocks, "b%d" % k, Bottleneck(p, a))
                k += 1
        self.nblocks = k
        self.fc = torch.nn.Parameter(torch.empty(8 * MiB, device="cuda"))

    def forward(self, x):
        h = torch.empty(1274 * MiB, device="cuda")         # stem conv/bn/relu/pool, 256 x 64 x 112 x 112 bf16
        h._saved = x
        for i in range(self.nblocks):
            h = getattr(self.blocks, "b%d" % i)(h)
        out = torch.empty(256 * 101 * 4, device="cuda")
        out._saved = h
        out._params = tuple(self.parameters())
        return out


batch_size = 256
epochs = 16


def train(model, optimizer, train_images, train_labels):
    n = 80000
    for epoch in range(epochs):
        for start in range(0, n, batch_size):
            idx = torch.empty(batch_size * 8, device="cuda")
            x = torch.empty(batch_size * 3 * 224 * 224 * 4, device="cuda")     # augment(...).float().div_(255)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            loss = torch.empty(512, device="cuda")
            loss._saved, loss._params = logits, logits._params
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del x, logits, loss, idx


try:
    model = ResNet50()
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9, nesterov=True)
    train_images = to_cuda(80000 * 3 * 224 * 224)
    train_labels = to_cuda(80000 * 8)
    val_images = to_cuda(10000 * 3 * 224 * 224)
    val_labels = to_cuda(10000 * 8)
    train(model, optimizer, train_images, train_labels)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
