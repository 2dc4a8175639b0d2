"""train_ddp.py -- one rank of a DistributedDataParallel job (one 24 GiB GPU per rank) fine-tuning a
1B-parameter model in fp32 with AdamW; the per-rank batch was raised, run with plain
`LD_PRELOAD=liboomguard.so`:

    model = DDP(Model().cuda(), device_ids=[local_rank])     # gradient_as_bucket_view left False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in loader:
        loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

DDP's reducer allocates, when DDP is built, flat buckets holding a copy of every gradient (4 GiB here,
as large as the weights); the first forward pass keeps 640 MiB of activations per layer and fails in
its last layers.  An expert: gradient_as_bucket_view=True (the gradients become views of the buckets:
the 4 GiB copy goes), or a smaller per-rank batch with accumulation, or activation checkpointing;
not a leak, not empty_cache (nothing is cached), not another process.
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 24
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(160 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(320 * MiB, device="cuda")       # attention output, kept for backward
        a._saved = h
        m = torch.empty(320 * MiB, device="cuda")       # MLP activation, kept for backward
        m._saved = a
        time.sleep(0.002)
        return m


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, Layer())

    def forward(self, x):
        h = x
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        return h


def main():
    model = torch.nn.parallel.DistributedDataParallel(Model(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1000):
        x = torch.empty(16 * MiB, device="cuda")
        loss = model(x)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, x


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
