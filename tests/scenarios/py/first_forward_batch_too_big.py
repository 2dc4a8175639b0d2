"""train.py -- fine-tuning a 0.8B-parameter model (fp32 weights, 3.2 GiB) with AdamW on a 24 GiB card,
batch 32 x 4096 tokens, run with plain `LD_PRELOAD=liboomguard.so python train.py`:

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in loader:
        loss = model(batch).loss              # 40 layers keep 672 MiB of activations each
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

The very first forward pass fails, in layer 31 of 40: every layer keeps its attention output and MLP
activation for the backward pass, so the process holds more after each layer, 40 x 672 MiB = 26 GiB
in all, more than the card has.  At the driver this looks like a leak (one "step" per layer, the low
point rises every step), but nothing was ever freed: it is one pass building up, and the batch is too
large.  An expert's first lines: a smaller batch (with gradient accumulation) or activation
checkpointing; not "stop keeping tensors across iterations" (there was no earlier iteration), not
empty_cache (nothing is cached), not quantization (the weights are 3.2 GiB of 24).
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 40
empty = scen_truth.torch_empty


acts = []                       # module level: still alive at the failure, as in a real forward pass
try:
    params = [empty(100 * MiB, device="cuda") for _ in range(32)]  # 0.8B fp32 parameters
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for step in range(100):
        for layer in range(LAYERS):
            acts.append(empty(320 * MiB, device="cuda"))           # attention output, kept for backward
            acts.append(empty(352 * MiB, device="cuda"))           # MLP activation, kept for backward
            time.sleep(0.002)                                      # the layer's compute
        del acts[:]                                                # (backward, optimizer.step: never reached)
        optimizer.step()
        optimizer.zero_grad()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
