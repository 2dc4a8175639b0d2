"""train.py -- full fine-tuning of a 1.9B-parameter model (fp32, 7 GiB) with AdamW on a 24 GiB card:

    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for batch in loader:
        loss = model(**batch).loss; loss.backward()
        optimizer.step()                  # torch.optim runs step() with autograd off
        optimizer.zero_grad(set_to_none=True)

Forward and backward of the first batch go through (weights 7 GiB + grads 7 GiB + 4 GiB of
activations, freed after backward).  The first optimizer.step() creates exp_avg and exp_avg_sq, 14
GiB more, and fails half way.  This is training, not inference, although autograd is off at the
failure.  An expert: an 8-bit/paged optimizer, or LoRA, or ZeRO/FSDP sharding / CPU offload of the
optimizer state; a smaller batch changes nothing (activations are gone by then).
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


_orig_empty = torch.empty
_made = []


def _empty_traced(nbytes, *args, **kw):
    """torch.empty as optimizer.step calls it, noted for the truth mark like scen_truth.torch_empty;
    the tensors stay referenced until the mark (the job dies right after, as it does with PyTorch)."""
    scen_truth._last.update(n=nbytes, reserved=torch.cuda.memory_reserved())
    t = _orig_empty(nbytes, *args, **kw)
    _made.append(t)
    return t


torch.empty = _empty_traced
empty = scen_truth.torch_empty
try:
    params = alloc_n(32, 224 * MiB)        # 7 GiB
    optimizer = torch.optim.AdamW(params, lr=2e-5)
    acts = alloc_n(16, 256 * MiB)         # forward
    grads = alloc_n(32, 224 * MiB)         # backward
    del acts
    with torch.no_grad():
        optimizer.step()                                                  # the moments, 14 GiB
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
