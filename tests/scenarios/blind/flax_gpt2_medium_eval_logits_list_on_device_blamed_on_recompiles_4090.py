"""eval_calibration.py -- a master's student evaluates a Flax GPT-2 medium (355M parameters, fine-tuned on
legal opinions) on 4,000 held-out documents: perplexity, next-token accuracy and a calibration curve
(expected calibration error needs the predicted distribution), on an NVIDIA GeForce RTX 4090 (24 GB).
Batches of 8 are padded to their longest document rounded up to a multiple of 128 tokens (512 to 1024), so
that jit compiles a handful of shapes instead of one per length:

    jax.config.update("jax_log_compiles", True)

    @jax.jit
    def eval_step(params, batch):
        return model(batch["input_ids"], attention_mask=batch["attention_mask"], params=params, train=False).logits

    all_logits, all_labels = [], []
    for step, batch in enumerate(eval_loader):
        logits = eval_step(params, batch)
        all_logits.append(logits)                             # concatenated after the loop for the metrics
        all_labels.append(batch["labels"])
        if step % 10 == 9:
            jax.clear_caches()                                # "free the compiled programs"
        print(..., jax.devices()[0].memory_stats()["bytes_in_use"])

The first run died at batch 16 of 500 ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate
823410688 bytes.").  Printing memory_stats() after each batch, they saw bytes_in_use climb, and with
jax_log_compiles on a "Compiling eval_step" line at each new padded length; they concluded that the compiled
programs keep GPU memory and added jax.clear_caches() every 10 batches.  It dies again, at the same batch:
JAX's arena (its default 75% of the card, 17.99 GiB, preallocated; nvidia-smi shows 18.5 GiB from the start)
is full.  What fills it: the list all_logits.  Each batch's logits are [8, L, 50257] float32 on the GPU --
0.77 GiB at 512 tokens, 1.53 GiB at 1024 -- and the list keeps every one of them alive: 15 batches of them are
16.3 GiB beside the 1.3 GiB of weights, and the 16th (0.77 GiB) does not fit in the 0.37 GiB left.  The
compiled executables hold no arrays; clearing them only makes jit compile again.

An expert: the memory is the results the loop keeps, not the compilations.  Reduce inside eval_step and
return only what the metrics need -- each token's log-probability of its label, the argmax, the top
probability (for the calibration curve): a few MB per batch -- and keep those (on the host if you like).
Then 500 batches fit with the default settings.  Moving the full logits to the host instead would need
564 GiB of RAM for the 500 batches.
Wrong first advice: fewer compiled shapes or clearing the jit caches (the executables are not the memory),
raising XLA_PYTHON_CLIENT_MEM_FRACTION (the card's other 5.5 GiB hold a few batches more), a smaller batch or
bf16 logits (each only moves the failure some batches later: the 500 batches' logits are 564 GiB), a bigger
card, quantizing the 1.3 GiB of weights, inference_mode / no_grad, gradient checkpointing or flash attention
(nothing is trained; attention is not what is kept), PyTorch's knobs (empty_cache, expandable_segments),
other processes (none).
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


class _Config(object):
    """jax.config: update() of the flags the programs set (jax_log_compiles)."""
    def __init__(self):
        self.values = {}

    def update(self, name, value):
        self.values[name] = value


config = _Config()
_caches = []


def clear_caches():
    """jax.clear_caches(): every jitted function's compiled executables are dropped (compiled again at their
    next call); arrays are not touched."""
    for c in _caches:
        c.clear()


class _Executable(object):
    def __init__(self, fun, args):
        if config.values.get("jax_log_compiles"):
            import sys as _sys
            _sys.stderr.write("Compiling %s with global shapes and types %s.\\n" % (
                getattr(fun, "__name__", "fun"), [l.shape for l in tree_leaves(args) if hasattr(l, "shape")][-1:]))
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
    _caches.append(cache)

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
for _name in ("jit", "ShapeDtypeStruct", "device_get", "value_and_grad", "config", "clear_caches"):
    setattr(jax, _name, _ns[_name])
jax.tree_util = type(sys)("jax.tree_util")
jax.tree_util.tree_map, jax.tree_util.tree_leaves = _ns["tree_map"], _ns["tree_leaves"]
jax.tree_map = _ns["tree_map"]
_trace_keep, _jit_last = _ns["_trace_keep"], _ns["_last"]
# ----

# ---- stand-in gaps: transformers' FlaxGPT2LMHeadModel for gpt2-medium (weights on the device, as
# FlaxPreTrainedModel.from_pretrained puts them), and a dataset of tokenised documents (host numpy).
GiB = 1 << 30


class _Output(object):
    def __init__(self, logits):
        self.logits = logits


class FlaxGPT2LMHeadModel(object):
    vocab_size, n_embd, n_layer, n_head, n_positions = 50257, 1024, 24, 16, 1024

    @classmethod
    def from_pretrained(cls, path, dtype=jnp.float32):
        m = cls()
        d, f = m.n_embd, jnp.float32
        h = {}
        for i in range(m.n_layer):
            h[str(i)] = {"attn": {"c_attn": {"kernel": jnp.zeros((d, 3 * d), f), "bias": jnp.zeros((3 * d,), f)},
                                  "c_proj": {"kernel": jnp.zeros((d, d), f), "bias": jnp.zeros((d,), f)}},
                         "mlp": {"c_fc": {"kernel": jnp.zeros((d, 4 * d), f), "bias": jnp.zeros((4 * d,), f)},
                                 "c_proj": {"kernel": jnp.zeros((4 * d, d), f), "bias": jnp.zeros((d,), f)}},
                         "ln_1": {"scale": jnp.zeros((d,), f), "bias": jnp.zeros((d,), f)},
                         "ln_2": {"scale": jnp.zeros((d,), f), "bias": jnp.zeros((d,), f)}}
        m.params = {"transformer": {"wte": {"embedding": jnp.zeros((m.vocab_size, d), f)},
                                    "wpe": {"embedding": jnp.zeros((m.n_positions, d), f)},
                                    "h": h, "ln_f": {"scale": jnp.zeros((d,), f), "bias": jnp.zeros((d,), f)}}}
        return m

    def __call__(self, input_ids, attention_mask=None, params=None, train=False):
        b, s = input_ids.shape
        # traced forward, no gradients: one layer's attention scores and probabilities (float32) and MLP at a time
        _trace_keep(2 * b * self.n_head * s * s * 4 + b * s * 4 * self.n_embd * 4)
        return _Output(jax.ShapeDtypeStruct((b, s, self.vocab_size), jnp.float32))


def eval_loader(n_docs=4000, batch_size=8):
    """Held-out opinions, tokenised; each batch padded to its longest document rounded up to 128 tokens."""
    import random
    rng = random.Random(7)
    for _ in range(n_docs // batch_size):
        longest = min(1024, int(max(rng.lognormvariate(5.9, 0.45) for _ in range(batch_size))))
        length = (longest + 127) // 128 * 128
        yield {"input_ids": jnp.zeros((batch_size, length), jnp.int32),
               "attention_mask": jnp.zeros((batch_size, length), jnp.int32),
               "labels": jnp.zeros((batch_size, length), jnp.int32)}
# ----


def truth_mark():
    """The simulator's books at the failure, with XLA's allocator's own numbers (scen_truth)."""
    st = jax.devices()[0].memory_stats()
    scen_truth.mark("fail", 0, (_jit_last["n"] + 255) // 256 * 256, allocated=st["bytes_in_use"],
                    reserved=st["pool_bytes"], released=0, fw=1)


jax.config.update("jax_log_compiles", True)
model = FlaxGPT2LMHeadModel.from_pretrained("checkpoints/gpt2-medium-legal/final")
params = model.params


@jax.jit
def eval_step(params, batch):
    return model(batch["input_ids"], attention_mask=batch["attention_mask"], params=params, train=False).logits


def evaluate():
    all_logits, all_labels = [], []
    for step, batch in enumerate(eval_loader()):
        logits = eval_step(params, batch)
        all_logits.append(logits)
        all_labels.append(batch["labels"])
        if step % 10 == 9:
            jax.clear_caches()
        print("batch %d/500 length %d, arena %.2f GiB in use" % (
            step + 1, batch["input_ids"].shape[1], jax.devices()[0].memory_stats()["bytes_in_use"] / GiB))
    return all_logits, all_labels


try:
    all_logits, all_labels = evaluate()
except jax.errors.JaxRuntimeError:
    truth_mark()
    raise
sys.exit(0)
