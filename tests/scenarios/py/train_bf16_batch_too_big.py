"""train.py -- fine-tuning a 0.8B-parameter model (fp32 weights, 3 GiB) with AdamW in bf16 autocast on a
24 GiB card, batch 24 x 2048 tokens, run with plain `LD_PRELOAD=liboomguard.so python train.py`:

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch).loss          # 8 layers keep 1.3 GiB of activations each; 6 GiB of logits
        loss.backward()                       # frees them, makes the gradients (3 GiB)
        optimizer.step()                      # the first step makes AdamW's state (6 GiB)
        optimizer.zero_grad()

The first step fits (weights + activations + logits: 19.5 GiB).  From its end on AdamW keeps its
state, and the second step's forward pass fails on its largest tensor, the 6 GiB of logits: the batch
is too large for this card once the optimizer holds its state.  Nothing leaks.  An expert's first
lines: a smaller batch with gradient accumulation, or activation checkpointing; not mixed precision
(bf16 autocast is already on) and not inference_mode (the job trains: optimizer steps ran).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 8


def forward(batch, acts):
    """The model's forward pass: every layer keeps its activations for the backward pass (its
    attention's, its MLP's input and intermediate: 1.3 GiB a layer in bf16), then the logits over
    the vocabulary, the largest tensor of the step (24 x 2048 tokens x 65536 x 2 bytes = 6 GiB)."""
    for layer in range(LAYERS):
        for size in (384, 448, 512):
            acts.append(scen_truth.torch_empty(size * MiB, device="cuda"))
    acts.append(scen_truth.torch_empty(6144 * MiB, device="cuda"))


def backward(acts, params):
    """Frees the activations (the logits first, then the last layer's) and makes one gradient per
    parameter."""
    grads = []
    while acts:
        acts.pop()
        if len(grads) < len(params) and len(acts) % 2 == 0:
            grads.append(scen_truth.torch_empty(params[len(grads)].nbytes, device="cuda"))
    return grads


acts = []                       # module level: still alive at the failure, as in a real forward pass
try:
    params = [scen_truth.torch_empty(256 * MiB, device="cuda") for _ in range(12)]                 # 0.8B fp32 parameters
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    for step in range(100):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            forward(step, acts)
        grads = backward(acts, params)
        optimizer.step()
        optimizer.zero_grad()
        del grads                                                  # zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
