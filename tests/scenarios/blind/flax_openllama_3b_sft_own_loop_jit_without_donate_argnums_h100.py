"""sft_llama_jax.py -- an applied-research team full-fine-tunes OpenLLaMA 3B v2 (3.43B parameters) on its
support-chat transcripts, in JAX on one NVIDIA H100 80GB HBM3.  They took the model code of EasyLM
(FlaxLLaMAForCausalLM with remat_block="nothing_saveable": every decoder layer rematerialised) but not
its pjit training script, which shards over a mesh they do not have; instead they wrote the loop of the
Flax tutorials:

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate=lr_schedule, weight_decay=0.1))
    state = train_state.TrainState.create(apply_fn=model.__call__, params=params, tx=tx)

    @jax.jit
    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn(params=params, input_ids=batch["input_ids"], ...).logits
            return cross_entropy(logits, batch["target_tokens"], batch["loss_masks"])
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss}

    for step, batch in enumerate(loader):
        state, metrics = train_step(state, batch)

Parameters are kept in float32 (EasyLM's param_dtype), computation in bfloat16; batch 2 x 2048 tokens.
JAX preallocates its default 75% of the card: a 59.7 GiB arena.  The weights (12.76 GiB) and AdamW's mu and
nu (25.53 GiB) are in it before the first step: 38.3 GiB.  The first step then fails, in the middle of its
outputs: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 110592000 bytes" (one MLP kernel of
3200 x 8640 floats), with the arena full.  EasyLM's own script jits the same step with donate_argnums=(0, 1);
this @jax.jit donates nothing, so XLA must write the new params, mu and nu (38.3 GiB) into fresh buffers
while the old ones, still owned by `state` in the caller, stay alive until the step returns: the step needs
the state twice, 76.6 GiB, plus its temp buffer (the gradients, 12.76 GiB, and the rematerialised
activations, 3.8 GiB): 93.2 GiB, more than the card.  With the state donated the outputs reuse the input
buffers: 38.3 + 16.6 = 54.9 GiB, in the 59.7 GiB arena.

An expert: donate the train state -- jax.jit(train_step, donate_argnums=(0,)) -- (and never read the old
`state` after the call, which donation deletes).  It costs nothing and halves what the update needs.
Wrong first advice: raising XLA_PYTHON_CLIENT_MEM_FRACTION (the arena refused, but 93 GiB does not fit an
80 GB card at any fraction), a smaller batch or more rematerialisation (activations are 3.8 of the 93 GiB),
an 8-bit optimizer or LoRA (they change the training for memory that donation gives back for free), a bigger
card (an H200 would hold the waste), PyTorch's knobs (expandable_segments, empty_cache), other processes
(none), quantization or inference-only settings (this is training).
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

# ---- stand-in gaps: EasyLM's FlaxLLaMAForCausalLM (its parameters made on the device, as
# FlaxPreTrainedModel.from_pretrained / EasyLM's checkpointer load them), optax's adamw and chain, flax's TrainState.
GiB = 1 << 30


class LLaMAConfig(object):
    """EasyLM's LLaMAConfig for open_llama_3b_v2."""
    vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads = 32000, 3200, 8640, 26, 32
    remat_block = "nothing_saveable"


class _CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class FlaxLLaMAForCausalLM(object):
    def __init__(self, config, dtype=jnp.bfloat16, param_dtype=jnp.float32):
        self.config, self.dtype, self.param_dtype = config, dtype, param_dtype

    def load_params(self, path):
        """EasyLM's StreamingCheckpointer.load_trainstate_checkpoint("params::" + path): float32 on the GPU."""
        c, f = self.config, self.param_dtype
        layers = {}
        for i in range(c.num_hidden_layers):
            layers[str(i)] = {
                "attention": {n: jnp.zeros((c.hidden_size, c.hidden_size), f) for n in ("wq", "wk", "wv", "wo")},
                "feed_forward": {"w1": jnp.zeros((c.hidden_size, c.intermediate_size), f),
                                 "w2": jnp.zeros((c.intermediate_size, c.hidden_size), f),
                                 "w3": jnp.zeros((c.hidden_size, c.intermediate_size), f)},
                "attention_norm": {"kernel": jnp.zeros((c.hidden_size,), f)},
                "ffn_norm": {"kernel": jnp.zeros((c.hidden_size,), f)}}
        return {"transformer": {"wte": {"embedding": jnp.zeros((c.vocab_size, c.hidden_size), f)},
                                "h": layers, "ln_f": {"kernel": jnp.zeros((c.hidden_size,), f)}},
                "lm_head": {"kernel": jnp.zeros((c.hidden_size, c.vocab_size), f)}}

    def __call__(self, params=None, input_ids=None, attention_mask=None, deterministic=True):
        c = self.config
        b, s = input_ids.shape
        # traced forward + backward: each remat'd layer keeps only its input (bf16); one layer at a time is
        # recomputed in the backward pass (its attention scores and probabilities in float32); the logits and
        # their log-softmax in float32
        saved = c.num_hidden_layers * b * s * c.hidden_size * 2
        layer = 2 * b * c.num_attention_heads * s * s * 4 + 3 * b * s * c.intermediate_size * 2
        logits = 2 * b * s * c.vocab_size * 4
        _trace_keep(saved + layer + logits)
        return _CausalLMOutput(jax.ShapeDtypeStruct((b, s, c.vocab_size), jnp.float32))


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


def cross_entropy(logits, tokens, masks):
    return jax.ShapeDtypeStruct((), jnp.float32)


def loader(batch_size=2, seq_length=2048, steps=3000):
    """Tokenised transcripts packed to 2048 tokens (host numpy); each batch goes to the GPU."""
    for _ in range(steps):
        yield {"input_ids": jnp.zeros((batch_size, seq_length), jnp.int32),
               "target_tokens": jnp.zeros((batch_size, seq_length), jnp.int32),
               "loss_masks": jnp.zeros((batch_size, seq_length), jnp.float32)}


config = LLaMAConfig()
model = FlaxLLaMAForCausalLM(config, dtype=jnp.bfloat16, param_dtype=jnp.float32)
params = model.load_params("gs://team-ckpt/open_llama_3b_v2/easylm_params")
lr_schedule = 2e-5
tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate=lr_schedule, weight_decay=0.1))
state = TrainState.create(apply_fn=model.__call__, params=params, tx=tx)
del params
print("params %.2f GiB, optimizer state %.2f GiB" % (
    sum(p.nbytes for p in jax.tree_util.tree_leaves(state.params)) / GiB,
    sum(p.nbytes for p in jax.tree_util.tree_leaves(state.opt_state)) / GiB))


@jax.jit
def train_step(state, batch):
    def loss_fn(params):
        logits = state.apply_fn(params=params, input_ids=batch["input_ids"], deterministic=False).logits
        return cross_entropy(logits, batch["target_tokens"], batch["loss_masks"])
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


try:
    for step, batch in enumerate(loader()):
        state, metrics = train_step(state, batch)
        if step % 50 == 0:
            print("step %d loss %s" % (step, metrics["loss"]))
except jax.errors.JaxRuntimeError:
    truth_mark()
    raise
sys.exit(0)
