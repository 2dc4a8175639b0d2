"""train.py -- fine-tuning a 1.6B model with a long-context batch; the forward pass runs layer by
layer (each ~2 ms of host time: kernels are launched asynchronously) and keeps every layer's
activations for backward, then the 12 GiB fp32 logits (batch x sequence x vocabulary) do not fit:

    out = model(input_ids)          # 32 layers x (320 + 352) MiB of saved activations
    logits = out.logits.float()     # 12 GiB

The layers arrive one by one with time between them, like the pieces of a slow weight load, but the
failing request is nothing like a piece: an expert shrinks the activations and the logits (batch,
sequence length, mixed precision, checkpointing), and does not quantize or offload 3 GiB of weights.
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20


try:
    weights = [scen_truth.torch_empty(100 * MiB) for _ in range(32)]          # 3.2 GiB of weights
    saved = []
    for layer in range(16):
        saved.append(scen_truth.torch_empty(320 * MiB))                       # attention output, saved for backward
        saved.append(scen_truth.torch_empty(352 * MiB))                       # MLP activation, saved for backward
        time.sleep(0.002)
    logits = scen_truth.torch_empty(12288 * MiB)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
