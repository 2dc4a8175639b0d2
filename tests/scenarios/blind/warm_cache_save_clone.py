"""train.py -- a long fine-tuning run (steady for hours: weights, grads and AdamW state 15 GiB, 6 GiB
of activations per step, cached) that saves a checkpoint every 500 steps:

    if step % 500 == 499:
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}   # snapshot on the GPU
        torch.save(sd, path)

Memory is flat across steps (no leak); the first save clones the 3 GiB of weights on the GPU while
the allocator still caches the step's activation blocks in pieces that the clone's 96 MiB tensors
do reuse, but the clone plus the cached pieces and the next step's peak do not fit.  An expert:
the snapshot belongs on the CPU (v.to("cpu") / state_dict then save directly); not a leak, nothing
to restart, no other process to kill.
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
try:
    state = alloc_n(32, 480 * MiB)        # weights + grads + moments: 15 GiB
    for step in range(600):
        acts = alloc_n(16, 384 * MiB)     # 6 GiB per step
        del acts
        time.sleep(0.002)
        if step % 500 == 499:
            snapshot = alloc_n(32, 96 * MiB)   # 3 GiB: the GPU clone
            acts = alloc_n(16, 384 * MiB)     # (the save is async: next step runs)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
