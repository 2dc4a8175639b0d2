"""train.py -- AdamW training at batch 32 runs fine for 40 steps; the validation loop was given
batch_size=512 ("no gradients, it will fit") and its first batch does not:

    for step, batch in enumerate(train_loader): ...; optimizer.step()
    with torch.no_grad():
        for batch in DataLoader(val_set, batch_size=512): model(batch)

Six 3 GiB output buffers arrive back to back and are all kept, the shape a weight load has; but
optimizer steps have run, so the weights came long ago.  An expert: a smaller validation batch first
(free, no accumulation), not quantization or offloading of a 2 GiB model, and no inference_mode
(it is already under no_grad).
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20


try:
    outs = []
    params = [scen_truth.torch_empty(256 * MiB) for _ in range(8)]                # 2 GiB model
    opt = torch.optim.AdamW(params, lr=1e-4)
    for step in range(40):
        acts = [scen_truth.torch_empty(768 * MiB) for _ in range(8)]              # 6 GiB of activations, freed after backward
        del acts
        opt.step()
        time.sleep(0.01)
    with torch.no_grad():
        outs = []                                                # (kept alive here for the truth mark)
        for _ in range(6):
            outs.append(scen_truth.torch_empty(3072 * MiB))                       # the validation batch: 18 GiB
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
