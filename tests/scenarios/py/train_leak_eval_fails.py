"""train.py -- fine-tuning that keeps every step's loss tensor (and through it the step's graph), with
a validation pass under torch.no_grad() every 50 steps; run with plain `LD_PRELOAD=liboomguard.so`:

    for step, batch in enumerate(loader):
        loss = model(batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        losses.append(loss)                   # the leak: a tensor, not loss.item()
        if step % 50 == 49:
            with torch.no_grad():
                evaluate(model, val_loader)   # needs two 3 GiB buffers

The validation at step 150 is what fails, with autograd off and PyTorch's cache split into pieces
too small for 3 GiB; the cause is the 64 MiB kept per training step.  An expert leads with the leak
(not the cache, not a generation-style "KV cache" reading of the autograd-off failure).
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20


try:
    weights = [scen_truth.torch_empty(256 * MiB) for _ in range(16)]            # 4 GiB model
    losses = []
    for step in range(300):
        acts = [scen_truth.torch_empty(512 * MiB) for _ in range(8)]            # forward activations, freed after backward
        loss = scen_truth.torch_empty(64 * MiB)                                 # the loss and the graph it keeps
        losses.append(loss)
        del acts
        time.sleep(0.005)
        if step % 50 == 49:
            with torch.no_grad():
                out = [scen_truth.torch_empty(3072 * MiB) for _ in range(2)]    # validation buffers
                del out
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
