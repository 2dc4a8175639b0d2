"""train.py -- gradient accumulation written the wrong way round: the losses of the 16 micro-batches
are summed and backward is called once at the end:

    total = 0
    for micro in split(batch, 16):
        total = total + model(micro).loss / 16      # every micro-batch's graph stays alive
    total.backward(); optimizer.step(); optimizer.zero_grad()

Each micro-batch's forward keeps 1.25 GiB of activations until the single backward; by micro-batch
13 of the first step the card is full.  It looks like a build-up, but it is one step: the fix is to
call backward per micro-batch (loss / 16).backward() inside the loop, so each graph is freed; a
smaller micro-batch is what accumulation already did, and gradient checkpointing would hide it.
"""
import sys
import time
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
graphs = []
try:
    state = alloc_n(16, 256 * MiB)       # weights, grads, moments: 4 GiB
    for micro in range(16):
        for layer in range(10):
            graphs.append(empty(128 * MiB, device="cuda"))             # kept until total.backward()
        time.sleep(0.003)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
