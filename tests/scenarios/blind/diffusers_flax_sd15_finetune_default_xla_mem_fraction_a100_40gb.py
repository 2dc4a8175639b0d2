"""train_text_to_image_flax.py -- a design studio fine-tunes Stable Diffusion 1.5 on its own product renders
(2,400 images with BLIP captions, 512x512) with the Flax training script of Hugging Face diffusers
(examples/text_to_image/train_text_to_image_flax.py), on one NVIDIA A100-SXM4-40GB of a cloud VM.  The
script ran for months on the team's 80 GB A100; the new VM has the 40 GB card.  The command line is the
one from their README, unchanged:

    python train_text_to_image_flax.py --pretrained_model_name_or_path=runwayml/stable-diffusion-v1-5
        --train_data_dir=renders/ --resolution=512 --train_batch_size=8 --learning_rate=1e-05
        --max_train_steps=15000 --output_dir=sd15-renders            # mixed_precision: "no" (fp32)

and the script, as the team adapted it to a single GPU (jax.jit instead of pmap, no replicate):

    unet, unet_params = FlaxUNet2DConditionModel.from_pretrained(args.pretrained_model_name_or_path,
                                                                 subfolder="unet", dtype=weight_dtype)
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adamw)
    state = train_state.TrainState.create(apply_fn=unet.__call__, params=unet_params, tx=optimizer)
    ...
    train_step = jax.jit(train_step, donate_argnums=(0,))
    for batch in train_dataloader:
        state, train_metric, train_rngs = train_step(state, text_encoder_params, vae_params, batch, train_rngs)

Nothing else runs on the card (nvidia-smi lists this one python process).  JAX's GPU client, as always,
took 75% of the card at its first array (XLA_PYTHON_CLIENT_PREALLOCATE defaults to true and
XLA_PYTHON_CLIENT_MEM_FRACTION to .75): a 30 GiB arena, which nvidia-smi shows as 30.5 GiB used.  The
weights load (UNet 859.5M parameters, 3.20 GiB in float32; CLIP text encoder 0.46 GiB; VAE 0.31 GiB, both
frozen), AdamW's mu and nu (6.40 GiB) are made in the arena: 10.4 GiB of 30.  The first step then asks XLA
for its temp buffer -- the UNet's activations for 8 images at 512 px (about 2.25 GiB each in float32) plus
the gradients (3.20 GiB): 21.2 GiB, where the arena has 19.6 GiB left -- and fails with
"RESOURCE_EXHAUSTED: Out of memory while trying to allocate 22765478400 bytes."  The card still has
9.5 GiB free outside the arena; the run needs about 31.6 GiB of a 40 GiB card.

An expert: JAX's own limit refused it, not the card: the default preallocation fraction leaves a quarter of
the A100 unused.  Start the job with XLA_PYTHON_CLIENT_MEM_FRACTION=.90 (set before jax is imported): a
36 GiB arena holds the step with room to spare, at no cost in speed or in the recipe.  On the 80 GB card the
same 75% was 60 GiB, which is why it never showed.
Wrong first advice: a smaller batch or gradient checkpointing (they change the recipe or cost 25-30% of the
speed, for memory the card has), stopping other processes (there are none: the 30.5 GiB is this process's
own arena), XLA_PYTHON_CLIENT_PREALLOCATE=false (the arena then grows on demand but stops at the same 75%),
PyTorch's knobs (empty_cache, expandable_segments: not this allocator), quantization (a training job), a
bigger card (this one holds the run once JAX may use it).
"""
import sys

import jax
import jax.numpy as jnp

import scen_truth

# ---- stand-in gaps: what jax.jit does with device memory, which the stand-in jax lacks.  Tracing runs the
# function once per input signature on ShapeDtypeStructs (no device memory, as JAX's tracers); what the traced
# computation keeps alive at its peak (activations saved for backward, gradients, intermediates) is added up as
# XLA's buffer assignment would size its one temp allocation.  Executing allocates every output leaf that no
# donated input of the same shape and dtype can take (XLA's input/output aliasing), then the temp buffer, runs,
# frees the temp and deletes the donated inputs.  Compiled as part of jax's own file, so that the failing
# Python line of a dump is the program's call of the jitted function, as with jaxlib's C++ dispatch.
_JAX_JIT = '''
import threading as _threading
_tls = _threading.local()
_last = {}


class ShapeDtypeStruct(object):
    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = numpy.dtype(dtype)
        n = 1
        for s in self.shape:
            n *= s
        self.size = n
        self.nbytes = n * self.dtype.itemsize

    def __repr__(self):
        return "ShapeDtypeStruct(shape=%r, dtype=%s)" % (self.shape, self.dtype.name)


def _flatten(tree):
    """(leaves, rebuild) of a pytree: dicts (sorted keys), lists, tuples, None, and classes with
    tree_flatten()/tree_unflatten() (flax.struct dataclasses, optax states)."""
    if tree is None:
        return [], lambda it: None
    if isinstance(tree, dict):
        keys = sorted(tree)
        parts = [_flatten(tree[k]) for k in keys]
        def rebuild(it, keys=keys, parts=parts, cls=type(tree)):
            return cls((k, p[1](it)) for k, p in zip(keys, parts))
        return [l for p in parts for l in p[0]], rebuild
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "tree_flatten"):
        parts = [_flatten(x) for x in tree]
        def rebuild(it, parts=parts, cls=type(tree)):
            vals = [p[1](it) for p in parts]
            return cls(*vals) if hasattr(cls, "_fields") else cls(vals)
        return [l for p in parts for l in p[0]], rebuild
    if hasattr(tree, "tree_flatten"):
        children, aux = tree.tree_flatten()
        inner, rb = _flatten(list(children))
        return inner, lambda it, aux=aux, rb=rb, cls=type(tree): cls.tree_unflatten(aux, rb(it))
    return [tree], lambda it: next(it)


def tree_leaves(tree):
    return _flatten(tree)[0]


def tree_map(f, tree, *rest):
    leaves, rebuild = _flatten(tree)
    others = [_flatten(r)[0] for r in rest]
    return rebuild(iter([f(*xs) for xs in zip(leaves, *others)]))


def _abstract(x):
    if isinstance(x, (Array, ShapeDtypeStruct)):
        return ShapeDtypeStruct(x.shape, x.dtype)
    return x


def _trace_keep(nbytes):
    """Bytes the traced computation holds at its peak beside its inputs and outputs (XLA's temp buffer)."""
    if getattr(_tls, "tracing", False):
        _tls.temp += int(nbytes)


def _signature(args):
    return tuple((l.shape, l.dtype.name) if hasattr(l, "shape") else repr(l) for l in tree_leaves(args))


def _device_buffer(shape, dtype):
    _last["n"] = ShapeDtypeStruct(shape, dtype).nbytes
    return numpy.empty(shape, dtype)


class _Executable(object):
    def __init__(self, fun, args):
        _tls.tracing, _tls.temp = True, 0
        try:
            self.out = fun(*tree_map(_abstract, args))
        finally:
            _tls.tracing = False
        self.temp_bytes = _tls.temp

    def execute(self, args, donate_argnums):
        donated = [l for i, a in enumerate(args) if i in donate_argnums for l in tree_leaves(a) if isinstance(l, Array)]
        out_leaves, rebuild = _flatten(self.out)
        made = []
        for leaf in out_leaves:
            if not isinstance(leaf, ShapeDtypeStruct):
                made.append(leaf)
                continue
            alias = None
            for d in donated:
                if d.shape == leaf.shape and d.dtype == leaf.dtype:
                    alias = d
                    break
            if alias is not None:
                donated.remove(alias)
                a = Array.__new__(Array)
                a.__dict__.update(alias.__dict__)
                alias._buf = None
                _live.add(a)
                made.append(a)
            else:
                made.append(_device_buffer(leaf.shape, leaf.dtype))
        temp = _device_buffer((self.temp_bytes,), "uint8") if self.temp_bytes else None
        if temp is not None:
            temp.delete()
        for i, a in enumerate(args):
            if i in donate_argnums:
                for l in tree_leaves(a):
                    if isinstance(l, Array):
                        l.delete()
        return rebuild(iter(made))


def jit(fun, static_argnums=(), donate_argnums=(), **kwargs):
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    cache = {}

    def cache_miss(*args):
        key = _signature(args)
        exe = cache.get(key)
        if exe is None:
            exe = cache[key] = _Executable(fun, args)
        return exe.execute(args, donate)

    cache_miss.__wrapped__ = fun
    cache_miss._cache_size = lambda: len(cache)
    return cache_miss


def value_and_grad(fun, argnums=0, has_aux=False):
    """Tracing the backward pass: the gradients (one per parameter leaf) live beside the forward's
    saved activations until the optimizer update consumes them."""
    def value_and_grad_f(*args):
        out = fun(*args)
        grads = tree_map(_abstract, args[argnums])
        _trace_keep(sum(l.nbytes for l in tree_leaves(grads)))
        return out, grads
    return value_and_grad_f


def device_get(x):
    return tree_map(lambda a: ShapeDtypeStruct(a.shape, a.dtype) if isinstance(a, Array) else a, x)
'''
_ns = {"Array": jax.Array, "numpy": jax.numpy, "_live": jax._live}
exec(compile(_JAX_JIT, jax.__file__, "exec"), _ns)
for _name in ("jit", "ShapeDtypeStruct", "device_get", "value_and_grad"):
    setattr(jax, _name, _ns[_name])
jax.tree_util = type(sys)("jax.tree_util")
jax.tree_util.tree_map, jax.tree_util.tree_leaves = _ns["tree_map"], _ns["tree_leaves"]
jax.tree_map = _ns["tree_map"]
_trace_keep, _jit_last = _ns["_trace_keep"], _ns["_last"]
# ----

# ---- stand-in gaps: the parts of flax, optax and diffusers the script uses, as far as device memory goes.
# from_pretrained puts the weights on the default device (jax arrays), as diffusers' Flax models do; optax's
# adamw makes mu and nu like the parameters at init; TrainState is flax.training.train_state.TrainState.
GiB = 1 << 30


def _leaves(n_params, width):
    """A block's parameters as kernels of `width` columns (the last one shorter), float32 on the device."""
    out, rows = [], n_params // width
    while rows > 0:
        r = min(rows, 4 * width)
        out.append(jnp.zeros((r, width), jnp.float32))
        rows -= r
    if n_params % width:
        out.append(jnp.zeros((n_params % width,), jnp.float32))
    return out


class _Output(object):
    def __init__(self, sample):
        self.sample = sample


class FlaxUNet2DConditionModel(object):
    BLOCKS = (("conv_in", 12_160, 320), ("time_embedding", 2_050_560, 1280),
              ("down_blocks_0", 9_757_760, 320), ("down_blocks_1", 35_251_200, 640),
              ("down_blocks_2", 141_013_760, 1280), ("down_blocks_3", 62_277_120, 1280),
              ("mid_block", 97_038_720, 1280), ("up_blocks_0", 162_611_200, 1280),
              ("up_blocks_1", 258_429_440, 1280), ("up_blocks_2", 69_228_160, 640),
              ("up_blocks_3", 21_849_124, 320), ("conv_norm_out", 640, 320), ("conv_out", 11_520, 320))
    ACT_PER_IMAGE_512 = 2.25 * GiB      # saved for backward at 64x64 latents, float32

    def __init__(self, dtype):
        self.dtype = dtype

    @classmethod
    def from_pretrained(cls, name, subfolder=None, dtype=jnp.float32, revision=None):
        params = dict((b, _leaves(n, w)) for b, n, w in cls.BLOCKS)
        return cls(dtype), params

    def apply(self, variables, sample, timesteps, encoder_hidden_states, train=False):
        h, w = sample.shape[2] * 8, sample.shape[3] * 8
        _trace_keep(sample.shape[0] * self.ACT_PER_IMAGE_512 * (h * w) / (512 * 512))
        return _Output(jax.ShapeDtypeStruct(sample.shape, jnp.float32))

    __call__ = apply


class FlaxAutoencoderKL(object):
    scaling_factor = 0.18215

    @classmethod
    def from_pretrained(cls, name, subfolder=None, dtype=jnp.float32, revision=None):
        return cls(), dict(encoder=_leaves(34_163_592, 512), decoder=_leaves(49_490_199, 512), quant=_leaves(72, 8))

    def encode_latents(self, variables, pixel_values):
        b, _, h, w = pixel_values.shape
        return jax.ShapeDtypeStruct((b, 4, h // 8, w // 8), jnp.float32)


class FlaxCLIPTextModel(object):
    @classmethod
    def from_pretrained(cls, name, subfolder=None, dtype=jnp.float32, revision=None):
        m = cls()
        m.params = dict(embeddings=_leaves(37_996_800, 768), encoder=_leaves(85_062_144, 768),
                        final_layer_norm=_leaves(1_536, 768))
        return m

    def __call__(self, input_ids, params=None, train=False):
        return (jax.ShapeDtypeStruct((input_ids.shape[0], 77, 768), jnp.float32),)


class _AdamState(object):
    def __init__(self, count, mu, nu):
        self.count, self.mu, self.nu = count, mu, nu

    def tree_flatten(self):
        return (self.count, self.mu, self.nu), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


class _GradientTransformation(object):
    def __init__(self, init, update):
        self.init, self.update = init, update


class optax(object):
    """optax.adamw / optax.chain(clip_by_global_norm, adamw): mu and nu like the parameters."""

    @staticmethod
    def adamw(learning_rate, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-2):
        def init(params):
            zeros = lambda p: jnp.zeros(p.shape, p.dtype)   # noqa: E731
            return _AdamState(jnp.zeros((), jnp.int32), jax.tree_map(zeros, params), jax.tree_map(zeros, params))

        def update(grads, state, params=None):
            new = jax.tree_map(lambda x: x, state)     # traced: new mu, nu and count like the old ones
            return grads, new
        return _GradientTransformation(init, update)

    @staticmethod
    def clip_by_global_norm(max_norm):
        return _GradientTransformation(lambda p: (), lambda g, s, p=None: (g, s))

    @staticmethod
    def chain(*txs):
        def init(params):
            return tuple(t.init(params) for t in txs)

        def update(grads, state, params=None):
            new = []
            for t, s in zip(txs, state):
                grads, s = t.update(grads, s, params)
                new.append(s)
            return grads, tuple(new)
        return _GradientTransformation(init, update)


class TrainState(object):
    """flax.training.train_state.TrainState: step, params, opt_state are its pytree; apply_fn and tx are static."""

    def __init__(self, step, apply_fn, params, tx, opt_state):
        self.step, self.apply_fn, self.params, self.tx, self.opt_state = step, apply_fn, params, tx, opt_state

    @classmethod
    def create(cls, apply_fn, params, tx):
        return cls(jnp.zeros((), jnp.int32), apply_fn, params, tx, tx.init(params))

    def apply_gradients(self, grads):
        updates, new_opt_state = self.tx.update(grads, self.opt_state, self.params)
        new_params = jax.tree_map(lambda p: p, self.params)     # optax.apply_updates: new arrays like params
        return TrainState(self.step, self.apply_fn, new_params, self.tx, new_opt_state)

    def tree_flatten(self):
        return (self.step, self.params, self.opt_state), (self.apply_fn, self.tx)

    @classmethod
    def tree_unflatten(cls, aux, children):
        step, params, opt_state = children
        return cls(step, aux[0], params, aux[1], opt_state)


class _Random(object):
    """jax.random, as far as the script's keys go: a key is 2 x uint32 (int32 here); traced, shapes only."""

    @staticmethod
    def PRNGKey(seed):
        return jnp.zeros((2,), jnp.int32)

    @staticmethod
    def split(key, num=2):
        return tuple(jax.ShapeDtypeStruct((2,), jnp.int32) for _ in range(num))

    @staticmethod
    def normal(key, shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    @staticmethod
    def randint(key, shape, minval, maxval):
        return jax.ShapeDtypeStruct(shape, jnp.int32)


jax.random = _Random
# ----


def truth_mark():
    """The simulator's books at the failure, with XLA's allocator's own numbers (scen_truth)."""
    st = jax.devices()[0].memory_stats()
    scen_truth.mark("fail", 0, (_jit_last["n"] + 255) // 256 * 256, allocated=st["bytes_in_use"],
                    reserved=st["pool_bytes"], released=0, fw=1)


def parse_args():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--pretrained_model_name_or_path", default="runwayml/stable-diffusion-v1-5")
    p.add_argument("--train_data_dir", default="renders/")
    p.add_argument("--resolution", type=int, default=512)
    p.add_argument("--train_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=1e-5)
    p.add_argument("--max_train_steps", type=int, default=15000)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    p.add_argument("--output_dir", default="sd15-renders")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def train_dataloader(args, n_images=2400):
    """The renders, resized to 512, as numpy batches on the host; each step's batch goes to the GPU."""
    for _ in range(n_images // args.train_batch_size):
        yield {"pixel_values": jnp.zeros((args.train_batch_size, 3, args.resolution, args.resolution), jnp.float32),
               "input_ids": jnp.zeros((args.train_batch_size, 77), jnp.int32)}


def main():
    args = parse_args()
    weight_dtype = jnp.float32
    if args.mixed_precision == "fp16":
        weight_dtype = jnp.float16
    elif args.mixed_precision == "bf16":
        weight_dtype = jnp.bfloat16

    text_encoder = FlaxCLIPTextModel.from_pretrained(args.pretrained_model_name_or_path, subfolder="text_encoder",
                                                     dtype=weight_dtype)
    vae, vae_params = FlaxAutoencoderKL.from_pretrained(args.pretrained_model_name_or_path, subfolder="vae",
                                                        dtype=weight_dtype)
    unet, unet_params = FlaxUNet2DConditionModel.from_pretrained(args.pretrained_model_name_or_path, subfolder="unet",
                                                                 dtype=weight_dtype)
    adamw = optax.adamw(learning_rate=args.learning_rate, b1=0.9, b2=0.999, eps=1e-08, weight_decay=1e-2)
    optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adamw)
    state = TrainState.create(apply_fn=unet.__call__, params=unet_params, tx=optimizer)
    del unet_params
    text_encoder_params = text_encoder.params
    rng = jax.random.PRNGKey(args.seed)
    train_rngs = rng

    def train_step(state, text_encoder_params, vae_params, batch, train_rng):
        dropout_rng, sample_rng, new_train_rng = jax.random.split(train_rng, 3)

        def compute_loss(params):
            latents = vae.encode_latents({"params": vae_params}, batch["pixel_values"])
            noise = jax.random.normal(sample_rng, latents.shape)
            timesteps = jax.random.randint(sample_rng, (latents.shape[0],), 0, 1000)
            encoder_hidden_states = text_encoder(batch["input_ids"], params=text_encoder_params, train=False)[0]
            model_pred = unet.apply({"params": params}, noise, timesteps, encoder_hidden_states, train=True).sample
            return jax.ShapeDtypeStruct((), jnp.float32)       # ((noise - model_pred) ** 2).mean()

        grad_fn = jax.value_and_grad(compute_loss)
        loss, grad = grad_fn(state.params)
        new_state = state.apply_gradients(grads=grad)
        metrics = {"loss": loss}
        return new_state, metrics, new_train_rng

    train_step = jax.jit(train_step, donate_argnums=(0,))

    print("***** Running training *****")
    print("  Instantaneous batch size per device = %d, total optimization steps = %d"
          % (args.train_batch_size, args.max_train_steps))
    global_step = 0
    for batch in train_dataloader(args):
        state, train_metric, train_rngs = train_step(state, text_encoder_params, vae_params, batch, train_rngs)
        global_step += 1
        if global_step >= args.max_train_steps:
            break


try:
    main()
except jax.errors.JaxRuntimeError:
    truth_mark()
    raise
sys.exit(0)
