"""rlhf.py -- another framework and a policy trained with PyTorch in one process on a 24 GiB card;
argv[1] names the other one (default jax):

    jax:        import jax; reward_params = load_reward_model()   # XLA's client: 75% of the card, 18 GiB
    cupy:       feats = rapids_features(df); del feats           # CuPy's pool keeps its 18 GiB cached
    tensorflow: tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(18432)])
                embed = tf.zeros(...)                              # the BFC arena takes its whole limit
    policy = Policy().cuda(); opt = torch.optim.AdamW(policy.parameters())
    for batch in loader:                                  # 2 GiB of weights + 4 GiB of state: fine
        loss = policy(batch).mean(); loss.backward(); opt.step()   # activations: refused

Every stand-in reaches the driver through ctypes, as one library: only their adapters can tell
whose bytes are whose.  An expert: the other framework's 18 GiB is the memory; release or cap it
(XLA_PYTHON_CLIENT_PREALLOCATE=false, CuPy's free_all_blocks()/set_limit, TensorFlow's memory
growth or a smaller memory_limit); not other processes (there are none), not a leak, not a smaller
policy.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
empty = scen_truth.torch_empty
scen_truth.note_every_empty(torch)


def jax_arena():
    import jax.numpy as jnp
    return jnp.zeros((512 * MiB // 4,), jnp.float32)            # the arena: 18 GiB


def cupy_pool():
    import cupy
    feats = [cupy.empty((256 * MiB // 4,), cupy.float32) for _ in range(72)]
    del feats                                                    # freed into the pool, kept: 18 GiB
    return None


def tensorflow_arena():
    import tensorflow as tf
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=18432)])
    return tf.zeros((512 * MiB // 4,), tf.float32)               # the BFC arena takes 18 GiB


held = {"jax": jax_arena, "cupy": cupy_pool, "tensorflow": tensorflow_arena}[sys.argv[1] if len(sys.argv) > 1 else "jax"]()
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
