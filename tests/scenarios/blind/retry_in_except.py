"""train.py -- an "auto batch size" loop that halves the batch when it runs out of memory, retrying
from inside the except block:

    def step(batch):
        try:
            return train_step(batch)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return step(batch[: len(batch) // 2])      # still inside the handler

The exception keeps the traceback, and the traceback keeps the frames of the failed forward with
all its activations (12 GiB) alive while the half batch runs: the half batch (8 GiB) fails too,
though alone it fits.  An expert: leave the except block first (set a flag, retry after it), so
the failed attempt's tensors are freed; a smaller batch is what the code already did.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20


def alloc_n(n, nbytes):
    """n tensors of nbytes; a list local to this frame, so a failure's traceback keeps the partial
    list alive in the except block, as the tensors of a real forward pass are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(scen_truth.torch_empty(nbytes, device="cuda"))
    return got
empty = scen_truth.torch_empty
weights = alloc_n(16, 256 * MiB)          # 4 GiB model


def forward(n_layers, per_layer):
    acts = []                                                            # alive in the frame
    for _ in range(n_layers):
        acts.append(empty(per_layer, device="cuda"))
    return acts


def step(per_layer, retry=True):
    try:
        return forward(24, per_layer)
    except torch.OutOfMemoryError:
        if not retry:
            raise
        torch.cuda.empty_cache()
        return step(per_layer // 2, retry=False)


try:
    step(1024 * MiB)                                                     # 24 GiB of activations at full batch
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
