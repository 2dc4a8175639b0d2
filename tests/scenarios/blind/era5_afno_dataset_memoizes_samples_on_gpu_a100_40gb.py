"""train_afno.py -- a FourCastNet-style AFNO weather model (about 75M parameters) trained on ERA5 at 0.25
degrees (20 variables x 720 x 1440) on one A100 40GB, PyTorch with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
(set by the lab's cluster profile).  Reading the zarr store over the network is slow, so the student
memoised every sample on the GPU in the Dataset:

    class ERA5Dataset(Dataset):
        def __init__(self, store, years):
            self._cache = {}                          # idx -> (x, y) on the GPU, "epoch 2 will be free"
        def __getitem__(self, idx):
            if idx not in self._cache:
                x, y = self._read(idx), self._read(idx + 1)       # 2 x 79 MiB of float32
                self._cache[idx] = (x.cuda(), y.cuda())
            return self._cache[idx]

    loader = DataLoader(ds, batch_size=2, shuffle=True, num_workers=0)   # CUDA in the dataset: no workers
    for x, y in loader:
        loss = F.mse_loss(model(x), y); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

The model, AdamW and a step's activations (about 12 GiB, freed after each step) fit easily; but every
new sample adds 160 MiB that stays, 320 MiB a step.  About 75 steps into the first epoch (of 21,900)
the forward pass cannot get its 160 MiB output (the prediction, at the end of the network): the
dataset's dict holds about 24 GiB by then.

An expert: the dict on the Dataset holds the memory, growing every step -- keep the cache in host
memory (pinned, or a local NVMe copy of the zarr store) and move one batch at a time to the GPU, or
bound the cache; the model and its batch are small.  Not a smaller batch, checkpointing, mixed
precision or a bigger card (the whole years of data would not fit any card).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

SAMPLE_BYTES = 80 * MiB          # 20 x 720 x 1440 float32 (79.1 MiB), as the cudaMallocAsync pool rounds it
N_SAMPLES = 43800                # 1979-2016, 6-hourly


class ERA5Dataset(object):
    """torch.utils.data.Dataset over the zarr store."""

    def __init__(self, store, years):
        self.store, self.years = store, years
        self._cache = {}

    def __len__(self):
        return N_SAMPLES - 1

    def _read(self, idx):
        return "zarr chunk %d" % idx        # a host array read from the network file system

    def __getitem__(self, idx):
        if idx not in self._cache:
            x, y = self._read(idx), self._read(idx + 1)
            self._cache[idx] = (torch.empty(SAMPLE_BYTES, device="cuda"), torch.empty(SAMPLE_BYTES, device="cuda"))
        return self._cache[idx]


def loader(ds, batch_size):
    """DataLoader(ds, batch_size=2, shuffle=True, num_workers=0): the default collate stacks the cached
    samples into a new batch tensor on the GPU."""
    order = [(i * 7919) % len(ds) for i in range(len(ds))]          # a shuffled epoch
    for b in range(0, len(order), batch_size):
        items = [ds[i] for i in order[b:b + batch_size]]
        x = torch.empty(batch_size * SAMPLE_BYTES, device="cuda")    # torch.stack([x for x, _ in items])
        y = torch.empty(batch_size * SAMPLE_BYTES, device="cuda")
        yield x, y


class AFNOBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.filter = nn.Parameter(torch.empty(6 * MiB, device="cuda"))
        self.mlp = nn.Parameter(torch.empty(18 * MiB, device="cuda"))

    def forward(self, h):
        f = torch.empty(h.nbytes * 2, device="cuda")            # rfft2 of the tokens (complex)
        f._saved = h
        m = torch.empty(h.nbytes * 4, device="cuda")            # the MLP's hidden
        m._saved = f
        out = torch.empty(h.nbytes, device="cuda")
        out._saved = m
        return out


class AFNONet(nn.Module):
    def __init__(self, depth=12):
        nn.Module.__init__(self)
        self.patch_embed = nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.blocks = [AFNOBlock() for _ in range(depth)]
        for i, blk in enumerate(self.blocks):
            setattr(self, "block_%d" % i, blk)
        self.head = nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    def forward(self, x):
        h = torch.empty(144 * MiB, device="cuda")                # 2 x 8,100 tokens x 768 x fp32... per batch
        h._saved = x
        for blk in self.blocks:
            h = blk(h)
        out = torch.empty(x.nbytes, device="cuda")
        out._saved = h
        return out


def mse_loss(pred, target):
    loss = torch.empty(512, device="cuda")
    loss._saved = pred
    loss._params = pred._params
    return loss


def main():
    batch_size = 2
    train_ds = ERA5Dataset("gs://era5/0.25deg.zarr", years=range(1979, 2017))
    model = AFNONet()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for epoch in range(80):
        for step, (x, y) in enumerate(loader(train_ds, batch_size)):
            pred = model(x)
            loss = mse_loss(pred, y)
            scen_truth.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            del pred, loss, x, y
            if step % 50 == 0:
                print("epoch %d step %d cached samples %d" % (epoch, step, len(train_ds._cache)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
