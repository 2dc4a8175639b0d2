"""train_brax_torch.py -- PPO in PyTorch on environments simulated by Brax (JAX), 8192 ant
environments, one 40 GB A100.  Having read that JAX takes 75% of the card at start, the user launches
with XLA_PYTHON_CLIENT_PREALLOCATE=false and believes JAX now holds only what it uses:

    env = brax.envs.create("ant", batch_size=8192)
    state = jax.jit(env.reset)(rng)                      # compile + reset: ~22 GiB of temporaries
    obs = torch.from_dlpack(state.obs)                   # zero-copy into PyTorch
    policy = ActorCritic().cuda(); opt = torch.optim.AdamW(policy.parameters())
    for it in range(iters):
        rollout = collect(env, policy)                   # 8 GiB rollout storage (PyTorch)
        ppo_update(policy, opt, rollout)                 # minibatch activations: up to 8 GiB

Without preallocation XLA's BFC allocator still grows its regions on demand and keeps them: the reset's
temporaries are freed inside JAX, but the 24 GiB of regions stay with JAX (bytes_in_use about 1 GiB),
and PyTorch's first PPO update fails.  PyTorch's own cache is nearly empty.

An expert: JAX still holds most of the card in freed regions: limit JAX
(XLA_PYTHON_CLIENT_MEM_FRACTION=.2, or XLA_PYTHON_CLIENT_ALLOCATOR=platform so that freed buffers go back
to the driver); not PyTorch's empty_cache or expandable_segments, not a smaller batch, not other
processes.
"""
import sys

import jax
import jax.numpy as jnp
import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def brax_reset(n_envs):
    """jit(env.reset): the compiled reset's buffers (contacts, pipeline state, temporaries), then the
    state it returns; the temporaries are freed when the computation ends."""
    temps = [jnp.zeros((256 * MiB,), jnp.float32) for _ in range(22)]      # 22 x 1 GiB
    state = [jnp.zeros((128 * MiB,), jnp.float32) for _ in range(2)]       # 1 GiB of env state
    for t in temps:
        t.delete()
    return state


class ActorCritic(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(512 * MiB, device="cuda"))

    def forward(self, obs):
        h = obs
        for _ in range(8):
            out = torch.empty(1024 * MiB, device="cuda") if torch.is_grad_enabled() else torch.empty(16 * MiB, device="cuda")
            if torch.is_grad_enabled():
                out._saved = h
            h = out
        return h


def main():
    state = brax_reset(8192)
    obs = torch.empty(2 * MiB, device="cuda")           # torch.from_dlpack(state.obs): a view in JAX's memory
    policy = ActorCritic()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    for it in range(1000):
        rollout = [torch.empty(512 * MiB, device="cuda") for _ in range(16)]
        with torch.no_grad():
            for t in range(16):
                policy(obs)
        for mb in range(4):
            out = policy(rollout[mb])
            loss = torch.empty(512, device="cuda")
            loss._saved = out
            loss._params = tuple(policy.parameters())
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out, loss
        del rollout
    del state


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
