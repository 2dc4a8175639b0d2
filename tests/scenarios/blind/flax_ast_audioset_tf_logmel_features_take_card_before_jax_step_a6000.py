"""train_ast_flax.py -- an Audio Spectrogram Transformer (ViT-B/16 on 128-bin log-mel spectrograms of
10-second clips, 1,212 patches, 87M parameters) trained with Flax/Optax on AudioSet, on one RTX A6000
(48 GiB), batch 16, float32.  The features come from the team's older TensorFlow code, reused so that the
new model sees exactly the spectrograms the production tagger was trained on:

    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"      # the lab's habit on shared workstations
    import jax, optax, tensorflow as tf
    from features import logmel                                # tf.signal.stft, mel matrix, log, SpecAugment

    def batches():
        for wave, labels in tfds.load("audioset", split="balanced_train").batch(16).as_numpy_iterator():
            yield logmel(wave).numpy(), labels                     # runs eagerly, on GPU:0

    it = batches()
    sample, _ = next(it)
    params = model.init(jax.random.PRNGKey(0), sample)          # the first JAX call
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-4))
    for spec, labels in it:
        state, loss = train_step(state, spec, labels)          # @jax.jit

The first `logmel` call is TensorFlow's first GPU operation: TensorFlow initialises GPU:0 and its BFC
allocator takes, as it does unless told otherwise, ~90% of the free memory at once (42.7 GiB), of which
the spectrograms use a few MiB.  JAX, started after it, grows on demand (preallocation is off); the
parameters and AdamW state (1.0 GiB) fit in what TensorFlow left, then the first execution of the jitted
train step asks for its temp buffer, 23 GiB, and gets RESOURCE_EXHAUSTED with 3.75 GiB free.  Alone on
the card the run fits easily in JAX's own 36 GiB limit.

An expert: another framework in the same process holds the card: TensorFlow's arena, 42.7 GiB for a few
MiB of spectrograms.  Keep TensorFlow off the GPU (tf.config.set_visible_devices([], "GPU") before its
first use, as big_vision and scenic do; the features are cheap on the CPU) or at least let it grow
(tf.config.experimental.set_memory_growth / TF_FORCE_GPU_ALLOW_GROWTH=true).  Not JAX's own cap
(raising XLA_PYTHON_CLIENT_MEM_FRACTION changes nothing: the memory is TensorFlow's), not another
process, not a batch or sequence too big for the card (it fits without TensorFlow's arena).
"""
import os
import re
import sys

os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

import jax                                                     # noqa: E402
import jax.numpy as jnp                                        # noqa: E402
import tensorflow as tf                                        # noqa: E402

import scen_truth                                              # noqa: E402

BATCH = 16
N_MELS, FRAMES = 128, 1024
PATCHES = 12 * 101                                             # 16x16 patches, stride 10 in both axes
DIM, DEPTH, MLP = 768, 12, 3072
STEP_TEMP_BYTES = 23 * (1 << 30)                               # XLA's temp buffer of the compiled step


# ------------------------------------------------------------------ features.py (TensorFlow, eager)
def logmel(wave_shape):
    """The team's TensorFlow features: stft -> power -> mel -> log -> SpecAugment (time and frequency
    masks).  Each op's output lives in TensorFlow's GPU allocator until it is dropped."""
    batch, samples = wave_shape
    frames = samples // 160
    stft = tf.zeros((batch, frames, 257 * 2), tf.float32)      # tf.signal.stft(wave, 400, 160, 512)
    power = tf.zeros((batch, frames, 257), tf.float32)
    mel = tf.zeros((batch, frames, N_MELS), tf.float32)        # tf.tensordot(power, mel_matrix, 1)
    del stft, power
    return tf.zeros((batch, FRAMES, N_MELS), tf.float32)       # log, normalised, masked, padded to 1024


def batches():
    """tfds AudioSet balanced_train, 16 clips a batch, 10 s at 16 kHz."""
    for _ in range(20_000 // BATCH):
        spec = logmel((BATCH, 160_000))
        yield spec, None                                        # .numpy(): a host copy


# ------------------------------------------------------------------ what jax.jit does, as far as memory goes
def jit(fun):
    """jax.jit: the first call compiles the function; every execution allocates XLA's temp buffer for the
    whole program, then the outputs (no argument donated: new buffers for the new state)."""
    def executable(*args):
        temp = jnp.empty((fun.temp_bytes // 4,), jnp.float32)
        out = fun(*args)
        temp.delete()
        return out
    executable.__name__ = fun.__name__
    return executable


# ------------------------------------------------------------------ the model (flax.linen), the train state
def init_params(rng, sample):
    """model.init(rng, sample): the AST's parameters."""
    p = {"patch_embed": jnp.zeros((16 * 16, DIM)), "pos_embed": jnp.zeros((PATCHES + 2, DIM)),
         "head": jnp.zeros((DIM, 527))}
    for i in range(DEPTH):
        p["block%d" % i] = {"qkv": jnp.zeros((DIM, 3 * DIM)), "proj": jnp.zeros((DIM, DIM)),
                            "fc1": jnp.zeros((DIM, MLP)), "fc2": jnp.zeros((MLP, DIM))}
    return p


def zeros_like_tree(tree):
    if isinstance(tree, dict):
        return {k: zeros_like_tree(v) for k, v in tree.items()}
    return jnp.zeros(tree.shape, tree.dtype)


class TrainState(object):
    """flax.training.train_state.TrainState with optax.adamw: params, mu, nu."""

    def __init__(self, params, mu, nu, step=0):
        self.params, self.mu, self.nu, self.step = params, mu, nu, step

    @classmethod
    def create(cls, params):
        return cls(params, zeros_like_tree(params), zeros_like_tree(params))


def train_step_fn(state, spec, labels):
    """Forward (12 blocks over 1,212 patches, batch 16), backward, optax.adamw update."""
    return TrainState(zeros_like_tree(state.params), zeros_like_tree(state.mu), zeros_like_tree(state.nu),
                      state.step + 1), 0.0


train_step_fn.temp_bytes = STEP_TEMP_BYTES
train_step = jit(train_step_fn)


def main():
    it = batches()
    sample, _ = next(it)
    params = init_params(None, sample)                          # the first JAX call
    state = TrainState.create(params)
    print("params + AdamW state: %.2f GiB" % (jax.devices()[0].memory_stats()["bytes_in_use"] / 2 ** 30))
    for step, (spec, labels) in enumerate(it):
        state, loss = train_step(state, spec, labels)
        if step % 100 == 0:
            print("step %d" % step)


try:
    main()
except jax.errors.JaxRuntimeError as e:
    m = re.search(r"allocate (\d+) bytes", str(e))
    st = jax.devices()[0].memory_stats()
    scen_truth.mark("fail", 0, int(m.group(1)) if m else 0, fw=1, framework="jax",
                    allocated=st["bytes_in_use"], reserved=st["pool_bytes"])
    raise
sys.exit(0)
