"""train.py -- fine-tuning (fp32, AdamW) that sums its loss for the epoch's mean without .item(); the
running total keeps each step's loss graph (48 MiB of it here) alive; run with plain
`LD_PRELOAD=liboomguard.so`:

    total_loss = 0
    for step, batch in enumerate(loader):
        loss = model(batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        total_loss += loss                    # the leak: a tensor with its graph, not loss.item()

A step's activations (16 GiB) come and go from PyTorch's warm cache, so the driver sees the kept
48 MiB only as a new 256 MiB segment every few steps; 24 steps in, a forward pass fails on a 2 MiB
request.  An expert: the running total keeps every step's graph: total_loss += loss.item()
(release the references); not the cache, not the optimizer state.
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Net(torch.nn.Module):
    def __init__(self, n=12):
        torch.nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, x):
        h = x
        for _ in range(64):
            a = torch.empty(256 * MiB, device="cuda")    # saved for backward
            a._saved = h
            h = a
        return h


total_loss = 0


def train(model, opt, steps):
    global total_loss
    for step in range(steps):
        x = torch.empty(8 * MiB, device="cuda")
        h = model(x)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(model.parameters())
        scen_truth.backward(loss)
        kept = torch.empty(48 * MiB, device="cuda")       # the loss graph that the running total keeps
        kept._prev = total_loss
        total_loss = kept                                 # total_loss += loss
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x, h
        time.sleep(0.003)


try:
    model = Net()
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-5), 1000)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
