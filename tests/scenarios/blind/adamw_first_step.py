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
empty = scen_truth.torch_empty
try:
    params = [empty(224 * MiB, device="cuda") for _ in range(32)]        # 7 GiB
    optimizer = torch.optim.AdamW(params, lr=2e-5)
    acts = [empty(256 * MiB, device="cuda") for _ in range(16)]         # forward
    grads = [empty(224 * MiB, device="cuda") for _ in range(32)]         # backward
    del acts
    with torch.no_grad():
        optimizer.step()                                                  # the moments, 14 GiB
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
