"""evaluate.py -- validation of a vision model written without torch.no_grad(), run with
`oomguard run python evaluate.py` (which puts the PyTorch adapter on the path):

    model.eval()                            # eval() does not turn autograd off
    all_logits = []
    for images in val_loader:               # ~20 ms per batch
        logits = model(images)              # activations saved for a backward that never comes
        all_logits.append(logits)           # keeps the logits and, through grad_fn, the activations
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20


model = [torch.empty(512 * MiB) for _ in range(12)]          # 6 GiB of weights
all_logits = []
for batch in range(10000):
    try:
        tmp = scen_truth.torch_empty(256 * MiB)                               # attention scratch
        acts = []
        for blk in range(4):
            acts.append(scen_truth.torch_empty(256 * MiB))                    # saved for backward
        del tmp
        logits = scen_truth.torch_empty(64 * MiB)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    all_logits.append((logits, acts))
    time.sleep(0.02)
sys.exit(0)
