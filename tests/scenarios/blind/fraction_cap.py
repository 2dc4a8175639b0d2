"""train.py -- a job on a shared 24 GiB card whose site-wide launcher wrapper caps every process:

    torch.cuda.set_per_process_memory_fraction(0.5)    # in sitecustomize.py, set by the admins
    ...
    model = build_model().cuda()                          # 4 GiB
    for batch in loader: ...                              # 10 GiB of activations

The job needs 14 GiB; PyTorch refuses past 12 GiB itself, while the card has ~11 GiB free beyond
that (nothing else runs on it).  An expert: the cap is the cause: raise the fraction (or ask for
it); not a bigger GPU, not killing other processes.
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
torch.cuda.set_per_process_memory_fraction(0.5)
try:
    weights = alloc_n(16, 256 * MiB)        # 4 GiB
    acts = alloc_n(20, 512 * MiB)           # 10 GiB of activations
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
