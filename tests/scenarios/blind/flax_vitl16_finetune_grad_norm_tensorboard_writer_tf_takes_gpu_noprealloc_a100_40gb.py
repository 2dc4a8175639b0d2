"""train.py -- fine-tuning ViT-L/16 (304M parameters, float32 params, AdamW) in JAX/Flax on one A100-SXM4-40GB,
batch 64 at 224x224, on a 1000-class product-image dataset.  The step is one jitted function; its compiled
executable needs a 16.4 GiB temporary buffer (compiled.memory_analysis().temp_size_in_bytes), plus the 3.4 GiB
of parameters and optimizer state: 20 GiB of the card, well under JAX's default 75% bound.

Two changes went in this week, both for debugging a divergence at ~12k steps:
 * XLA_PYTHON_CLIENT_PREALLOCATE=false in the job's env file, "so nvidia-smi shows what the job really uses"
   while they compared runs;
 * per-layer gradient norms and an update/parameter-ratio histogram logged to TensorBoard every 50 steps,
   with Flax's writer:

    from flax.metrics import tensorboard
    ...
    state = create_train_state(rng, config)                   # params + optax.adamw state on the GPU
    writer = tensorboard.SummaryWriter(config.workdir)       # <- new
    for step, batch in zip(range(config.num_steps), train_iter):
        state, metrics = train_step(state, batch)
        if step % 50 == 0:
            for name, gn in metrics["grad_norms"].items():
                writer.scalar(f"grad_norm/{name}", gn, step)
            writer.histogram("update_ratio", metrics["update_ratio"], step)

flax.metrics.tensorboard is TensorFlow's tf.summary underneath: creating the file writer initialises TF's eager
context, which creates TF's GPU device and its BFC allocator -- and TF, unlike JAX here, takes nearly all the
free GPU memory at once ("Created device /job:localhost/replica:0/task:0/device:GPU:0 with 32713 MB memory").
TF never uses it; it only writes event files from the host.  The first train_step then needs its 16.4 GiB
temp buffer, JAX's allocator (4.0 GiB of regions so far) asks the driver for it, and the driver has 3.5 GiB
left: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17607234560 bytes."  Before the env change JAX had
preallocated its 30 GiB first, and TF's grab took 90% of what was left (8.5 GiB) without hurting the job.

An expert: a second framework in the process holds the card.  Hide the GPU from TensorFlow before anything
touches it -- `tf.config.experimental.set_visible_devices([], "GPU")` right after `import tensorflow` (Flax's
examples do exactly this, "otherwise TF might reserve memory and make it unavailable to JAX"), or at least
TF_FORCE_GPU_ALLOW_GROWTH=true; or log with a writer that needs no TensorFlow (tensorboardX).  Then the job is
back to 20 GiB.
Wrong advice: a smaller batch or gradient checkpointing (jax.checkpoint / remat), bf16 parameters, an 8-bit
optimizer (the job needs 20 of 40 GB; TF sits on 32 GiB it does not use), a larger XLA_PYTHON_CLIENT_MEM_FRACTION
(JAX's bound is not what refused: the driver has no memory left), turning preallocation back on as "the fix"
(it hides the problem by winning the race; TF still holds a useless 8.5 GiB), a bigger GPU, looking for other
processes (there are none).
"""
import os
import sys

import jax
import jax.numpy as jnp

import scen_truth

# ---- test scaffolding: the size of each region JAX's allocator asks the driver for (for the truth mark),
# compiled as part of the stand-in's allocator so that the failing line stays the program's own.
from jax._src import bfc as _bfc  # noqa: E402

_REQ = {}
_NOTE = """
def cuda_malloc(device, size):
    _REQ["last"] = int(size)
    return _plain(device, size)
"""
_ns = {"_REQ": _REQ, "_plain": _bfc.cuda_malloc}
exec(compile(_NOTE, _bfc.__file__, "exec"), _ns)
_bfc.cuda_malloc = _ns["cuda_malloc"]

# ---- stand-in gaps: jax.jit, jax.random, optax.adamw, flax.metrics.tensorboard.SummaryWriter and TensorFlow's
# tf.summary (C++ / other packages in production), named as their real APIs.
import tensorflow as tf  # noqa: E402  (flax.metrics.tensorboard does `import tensorflow as tf`)


class _TFSummary(object):
    """tf.summary as far as Flax's writer uses it: creating a file writer runs an eager op, which initialises
    TF's eager context and with it every visible GPU (its BFC arena)."""

    class _Writer(object):
        def __init__(self, logdir):
            from tensorflow.python.eager import context
            context.ensure_initialized()
            self.logdir = logdir

        def as_default(self, step=None):
            return self

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def flush(self):
            pass

    @staticmethod
    def create_file_writer(logdir, max_queue=None, flush_millis=None):
        return _TFSummary._Writer(logdir)

    @staticmethod
    def scalar(name, data, step=None):
        return True

    @staticmethod
    def histogram(name, data, step=None, buckets=None):
        return True


if not hasattr(tf, "summary"):
    tf.summary = _TFSummary


class tensorboard(object):
    """flax.metrics.tensorboard"""

    class SummaryWriter(object):
        def __init__(self, log_dir, auto_flush=True):
            log_dir = os.fspath(log_dir)
            self._event_writer = tf.summary.create_file_writer(log_dir)
            self._closed = False

        def scalar(self, tag, value, step):
            with self._event_writer.as_default():
                tf.summary.scalar(name=tag, data=value, step=step)

        def histogram(self, tag, values, step, bins=None):
            with self._event_writer.as_default():
                tf.summary.histogram(name=tag, data=values, buckets=bins, step=step)


def jit(fun, donate_argnums=()):
    """jax.jit: the compiled executable allocates its outputs and one temporary buffer of the size XLA's buffer
    assignment planned (memory_analysis().temp_size_in_bytes), for the duration of the call."""
    def compiled(*args):
        return fun(*args)
    compiled.__wrapped__ = fun
    return compiled


class optax(object):
    class _AdamW(object):
        def __init__(self, learning_rate, weight_decay):
            self.lr, self.wd = learning_rate, weight_decay

        def init(self, params):
            mu = dict((k, jnp.zeros(v.shape, v.dtype)) for k, v in params.items())
            nu = dict((k, jnp.zeros(v.shape, v.dtype)) for k, v in params.items())
            return {"count": 0, "mu": mu, "nu": nu}

    @staticmethod
    def adamw(learning_rate, weight_decay=1e-4):
        return optax._AdamW(learning_rate, weight_decay)
# ----

GiB = 1 << 30


class Config(object):
    model = "ViT-L/16"
    hidden = 1024
    mlp_dim = 4096
    layers = 24
    patches = 196
    num_classes = 1000
    batch_size = 64
    image_size = 224
    learning_rate = 1e-4
    num_steps = 20000
    log_every = 50
    workdir = "/checkpoints/vitl16_products/run_042"
    step_temp_bytes = 17607234560          # compiled train_step: memory_analysis().temp_size_in_bytes (16.4 GiB)


def init_params(config):
    """ViT-L/16 (flax.linen, as big_vision lays it out): float32 parameters on the default device."""
    h, m = config.hidden, config.mlp_dim
    p = {"embedding/kernel": jnp.zeros((16, 16, 3, h)), "embedding/bias": jnp.zeros((h,)),
         "cls": jnp.zeros((1, 1, h)), "pos_embedding": jnp.zeros((1, config.patches + 1, h))}
    for i in range(config.layers):
        b = "Transformer/encoderblock_%d/" % i
        p[b + "LayerNorm_0/scale"] = jnp.zeros((h,))
        p[b + "LayerNorm_0/bias"] = jnp.zeros((h,))
        p[b + "MultiHeadDotProductAttention_0/qkv/kernel"] = jnp.zeros((h, 3 * h))
        p[b + "MultiHeadDotProductAttention_0/qkv/bias"] = jnp.zeros((3 * h,))
        p[b + "MultiHeadDotProductAttention_0/out/kernel"] = jnp.zeros((h, h))
        p[b + "MultiHeadDotProductAttention_0/out/bias"] = jnp.zeros((h,))
        p[b + "LayerNorm_2/scale"] = jnp.zeros((h,))
        p[b + "LayerNorm_2/bias"] = jnp.zeros((h,))
        p[b + "MlpBlock_0/Dense_0/kernel"] = jnp.zeros((h, m))
        p[b + "MlpBlock_0/Dense_0/bias"] = jnp.zeros((m,))
        p[b + "MlpBlock_0/Dense_1/kernel"] = jnp.zeros((m, h))
        p[b + "MlpBlock_0/Dense_1/bias"] = jnp.zeros((h,))
    p["Transformer/encoder_norm/scale"] = jnp.zeros((h,))
    p["Transformer/encoder_norm/bias"] = jnp.zeros((h,))
    p["head/kernel"] = jnp.zeros((h, config.num_classes))
    p["head/bias"] = jnp.zeros((config.num_classes,))
    return p


def create_train_state(config):
    params = init_params(config)                 # model.init(rng, dummy)["params"], restored from the checkpoint
    tx = optax.adamw(config.learning_rate, weight_decay=0.05)
    return {"step": 0, "params": params, "opt_state": tx.init(params)}


def make_train_step(config):
    def train_step(state, batch):
        # loss_fn, jax.value_and_grad, tx.update, optax.apply_updates, per-layer grad norms: one XLA program
        temp = jnp.empty((config.step_temp_bytes,), jnp.int8)
        grad_norms = dict(("block_%d" % i, 0.0) for i in range(config.layers))
        update_ratio = jnp.zeros((config.layers,))
        del temp
        return state, {"loss": 0.0, "grad_norms": grad_norms, "update_ratio": update_ratio}
    return jit(train_step, donate_argnums=(0,))


def train_iter(config):
    while True:
        images = jnp.zeros((config.batch_size, config.image_size, config.image_size, 3))
        labels = jnp.zeros((config.batch_size,), jnp.int32)
        yield {"image": images, "label": labels}


def main():
    config = Config()
    print("JAX %s, devices %s, XLA_PYTHON_CLIENT_PREALLOCATE=%s" % (
        jax.__version__, jax.devices(), os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")))
    state = create_train_state(config)
    nparams = sum(v.nbytes for v in state["params"].values()) // 4
    print("%s: %.1fM parameters; JAX holds %.2f GiB" % (config.model, nparams / 1e6,
                                                       jax.devices()[0].memory_stats()["bytes_in_use"] / GiB))
    writer = tensorboard.SummaryWriter(config.workdir)
    train_step = make_train_step(config)
    for step, batch in zip(range(config.num_steps), train_iter(config)):
        state, metrics = train_step(state, batch)
        if step % config.log_every == 0:
            for name, gn in metrics["grad_norms"].items():
                writer.scalar("grad_norm/%s" % name, gn, step)
            writer.histogram("update_ratio", metrics["update_ratio"], step)
        print("step %d" % step)


try:
    main()
except jax.errors.JaxRuntimeError:
    if "last" in _REQ:
        scen_truth.mark("fail", 0, _REQ["last"])
    raise
sys.exit(0)
