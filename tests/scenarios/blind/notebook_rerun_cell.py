"""A Jupyter notebook: cell 2 builds and trains; the user edits the model code and re-runs cell 2:

    [2]: model = build().cuda()                           # 5 GiB fp32
         optimizer = torch.optim.AdamW(model.parameters())
         train_one_step(model, optimizer)                 # grads 5 GiB, moments 10 GiB
    [2]: model = build().cuda()                           # re-run: the old model is still alive

The old optimizer still holds the old parameters (and with them their grads and moments): 20 GiB
stay alive and the new model's 5 GiB do not fit.  An expert: free the previous run first (del
optimizer, model; gc.collect(); torch.cuda.empty_cache()) or restart the kernel; nothing about the
model is too big for the card.
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


try:
    model = alloc_n(32, 160 * MiB)              # 5 GiB
    optimizer = torch.optim.AdamW(model, lr=1e-4)
    grads = alloc_n(32, 160 * MiB)              # backward
    moments = alloc_n(64, 160 * MiB)            # optimizer.step (exp_avg, exp_avg_sq)
    old = (model, optimizer)                    # the notebook still references both
    model = alloc_n(32, 160 * MiB)              # the re-run cell
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
