"""rlhf.py -- a reward model in JAX and a policy trained with PyTorch in one process on a 24 GiB card:

    import jax; reward_params = load_reward_model()      # XLA's client starts: 75% of the card, 18 GiB
    policy = Policy().cuda(); opt = torch.optim.AdamW(policy.parameters())
    for batch in loader:                                  # 2 GiB of weights + 4 GiB of state: fine
        loss = policy(batch).mean(); loss.backward(); opt.step()   # activations: refused

Both stand-ins reach the driver through ctypes, as one library: only their adapters can tell whose
bytes are whose.  An expert: JAX's preallocated arena is the memory; set
XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_MEM_FRACTION (the reward model needs 512 MiB);
not other processes (there are none), not a leak, not a smaller policy.
"""
import sys

import jax
import jax.numpy as jnp
import torch

import scen_truth

MiB = 1 << 20
empty = scen_truth.torch_empty
scen_truth.note_every_empty(torch)

reward_params = jnp.zeros((512 * MiB // 4,), jnp.float32)            # the arena: 18 GiB
policy = [torch.nn.Parameter(empty(256 * MiB, device="cuda")) for _ in range(8)]
opt = torch.optim.AdamW(policy, lr=1e-5)
try:
    for step in range(2):
        acts = [empty(256 * MiB, device="cuda") for _ in range(6)]
        for p in policy:
            p.grad = empty(256 * MiB, device="cuda")
        del acts
        opt.step()
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
