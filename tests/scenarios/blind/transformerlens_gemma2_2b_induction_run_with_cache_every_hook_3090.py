"""An interpretability researcher's IPython session (terminal `ipython`, in tmux, on the lab's RTX 3090, 24 GiB)
-- this program replays the session's inputs in one namespace, each compiled under its <ipython-input-N-...>
name as IPython does.  They worked through the ARENA induction-heads exercises with gpt2-small and now
want to know whether Gemma-2's induction heads look the same:

    In [1]: import torch as t; from transformer_lens import HookedTransformer; t.set_grad_enabled(False)
    In [2]: model = HookedTransformer.from_pretrained("gemma-2-2b", device="cuda")
    In [3]: logits, cache = model.run_with_cache(model.to_tokens("The Eiffel Tower is in the city of"))
    ...     (a look at a few attention patterns: fine)
    In [6]: rep_tokens = generate_repeated_tokens(model, seq_len=128, batch=16)    # 16 x 257 tokens
    In [7]: rep_logits, rep_cache = model.run_with_cache(rep_tokens)               # -> CUDA out of memory

TransformerLens loads in float32 by default and keeps a separate unembedding (W_U is not tied to W_E): 3.2B
parameters, 11.9 GiB.  run_with_cache() without names_filter puts a forward hook on every one of the
model's ~600 hook points and stores each activation in the ActivationCache: per token and layer 6
d_model vectors, q/k/v and their rotary versions, z, the gated MLP's three 9216-wide vectors and two
8 x 257 attention rows -- ~220 KB a token a layer in fp32, 0.84 GiB a layer for 4,112 tokens, 22 GiB for
the 26 layers, plus 3.9 GiB of full-vocabulary logits.  The pass fails half way through the layers (in
blocks.12, the 13th of 26, at its post-MLP RMSNorm, a 36 MiB request with 23.0 GiB allocated), although
every single activation is small and autograd is off.  The induction score needs only the 26 blocks'
hook_pattern (0.8 GiB): with names_filter the same call peaks near 21 GiB and fits.

An expert: this is one forward pass whose hooks keep every intermediate activation; ask only for what
the analysis uses -- run_with_cache(rep_tokens, names_filter=lambda n: n.endswith("pattern")) (or
return_type="loss"/None when the logits are not needed), or run the 16 sequences in chunks of 4 and reduce
each chunk's patterns to the induction score; device="cpu" for the cache or dtype="bfloat16" for the model
are second choices.  Wrong first advice: inference_mode / no_grad (autograd is already off), gradient
checkpointing, 8-bit optimizers or LoRA (nothing trains), quantizing the model (TransformerLens does not
take bitsandbytes weights, and it changes the activations studied), empty_cache / expandable_segments
(every cached activation is live), a bigger GPU (the cache grows with batch x length x hook points).
"""
import collections
import hashlib
import linecache
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks, as PyTorch has it -------------------------------------------------
# Module forward hooks (register_forward_hook; Module._call_impl runs them after forward), compiled as
# torch/nn/modules/module.py's own code, as they are in PyTorch.
_HOOKS = '''
class RemovableHandle(object):
    def __init__(self, hooks, key):
        self.hooks_dict_ref, self.id = hooks, key

    def remove(self):
        self.hooks_dict_ref.pop(self.id, None)


def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
    hooks = self.__dict__.get("_forward_hooks")
    if hooks is None:
        hooks = collections.OrderedDict()
        object.__setattr__(self, "_forward_hooks", hooks)
    _next_id[0] += 1
    hooks[_next_id[0]] = hook
    return RemovableHandle(hooks, _next_id[0])


def _call_impl(self, *args, **kwargs):
    _graph.begin_forward()
    result = None
    try:
        result = self.forward(*args, **kwargs)
    finally:
        _graph.end_forward(self, args, kwargs, result)
    for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
        hook_result = hook(self, args, result)
        if hook_result is not None:
            result = hook_result
    return result
'''
_mod = sys.modules["torch.nn.modules.module"]
_ns = {"collections": collections, "_graph": torch.autograd._graph, "_next_id": [0]}
exec(compile(_HOOKS, _mod.__file__, "exec"), _ns)
torch.nn.Module.register_forward_hook = _ns["register_forward_hook"]
torch.nn.Module._call_impl = _ns["_call_impl"]


class set_grad_enabled(object):
    """torch.set_grad_enabled: a function (sets the mode now) and a context manager."""

    def __init__(self, mode):
        self.prev = torch.is_grad_enabled()
        torch._grad.enabled = bool(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        torch._grad.enabled = self.prev
        return False


def _shaped(nbytes, shape):
    t = torch.empty(nbytes, device="cuda")
    t.shape = tuple(shape)
    return t


def randint(low, high, size, device=None):
    return _shaped(size[0] * size[1] * 8, size)


def cat(tensors, dim=-1):
    rows = tensors[0].shape[0]
    cols = sum(x.shape[1] for x in tensors)
    return _shaped(rows * cols * 8, (rows, cols))


def full(size, fill_value, dtype=None, device=None):
    return _shaped(size[0] * size[1] * 8, size)


torch.set_grad_enabled, torch.randint, torch.cat, torch.full = set_grad_enabled, randint, cat, full
torch.long = "int64"

# --- transformer_lens 2.4 (as far as the session uses it) ----------------------------------------------
F32 = 4


class HookedTransformerConfig(object):
    def __init__(self):
        self.model_name = "gemma-2-2b"
        self.n_layers, self.d_model, self.n_heads, self.d_head = 26, 2304, 8, 256
        self.n_key_value_heads, self.d_mlp, self.d_vocab = 4, 9216, 256000
        self.n_ctx, self.dtype, self.device = 8192, "float32", "cuda"
        self.attn_scores_soft_cap, self.output_logits_soft_cap = 50.0, 30.0
        self.default_prepend_bos = True


class HookPoint(torch.nn.Module):
    """An identity module: the place a hook reads or edits an activation."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.name = None
        self.fwd_hooks = []

    def add_hook(self, hook, dir="fwd", level=None, prepend=False):
        def full_hook(module, module_input, module_output):
            return hook(module_output, hook=self)
        handle = self.register_forward_hook(full_hook)
        self.fwd_hooks.append(handle)

    def remove_hooks(self, dir="fwd", including_permanent=False, level=None):
        for handle in self.fwd_hooks:
            handle.remove()
        self.fwd_hooks = []

    def forward(self, x):
        return x


def _act(n_tokens, width):
    """A new [batch, pos, width] fp32 activation (autograd is off in this session: nothing else keeps it)."""
    return torch.empty(n_tokens * width * F32, device="cuda")


class RMSNorm(torch.nn.Module):
    def __init__(self, cfg, length):
        torch.nn.Module.__init__(self)
        self.length = length
        self.w = torch.nn.Parameter(torch.empty(length * F32, device="cuda"))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x, n_tokens):
        scale = self.hook_scale(_act(n_tokens, 1))
        x = _act(n_tokens, self.length)                             # x / scale
        return self.hook_normalized(_act(n_tokens, self.length))   # * w


class GroupedQueryAttention(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        d, h, kv, dh = cfg.d_model, cfg.n_heads, cfg.n_key_value_heads, cfg.d_head
        self.W_Q = torch.nn.Parameter(torch.empty(h * d * dh * F32, device="cuda"))
        self._W_K = torch.nn.Parameter(torch.empty(kv * d * dh * F32, device="cuda"))
        self._W_V = torch.nn.Parameter(torch.empty(kv * d * dh * F32, device="cuda"))
        self.W_O = torch.nn.Parameter(torch.empty(h * dh * d * F32, device="cuda"))
        for name in ("hook_k", "hook_q", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern", "hook_result",
                     "hook_rot_k", "hook_rot_q"):
            setattr(self, name, HookPoint())

    def forward(self, x, batch, pos):
        cfg, n = self.cfg, batch * pos
        q = self.hook_q(_act(n, cfg.n_heads * cfg.d_head))
        k = self.hook_k(_act(n, cfg.n_key_value_heads * cfg.d_head))
        v = self.hook_v(_act(n, cfg.n_key_value_heads * cfg.d_head))
        q = self.hook_rot_q(_act(n, cfg.n_heads * cfg.d_head))
        k = self.hook_rot_k(_act(n, cfg.n_key_value_heads * cfg.d_head))
        scores = _act(n, cfg.n_heads * pos)                                      # q @ k^T / sqrt(d_head)
        scores = _act(n, cfg.n_heads * pos)                                      # tanh soft cap (50)
        attn_scores = self.hook_attn_scores(_act(n, cfg.n_heads * pos))         # causal mask applied
        del scores
        pattern = self.hook_pattern(_act(n, cfg.n_heads * pos))                 # softmax
        del attn_scores
        z = self.hook_z(_act(n, cfg.n_heads * cfg.d_head))                      # pattern @ v
        del pattern, q, k, v
        return _act(n, cfg.d_model)                                              # z @ W_O


class GatedMLP(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.W_in = torch.nn.Parameter(torch.empty(cfg.d_model * cfg.d_mlp * F32, device="cuda"))
        self.W_gate = torch.nn.Parameter(torch.empty(cfg.d_model * cfg.d_mlp * F32, device="cuda"))
        self.W_out = torch.nn.Parameter(torch.empty(cfg.d_mlp * cfg.d_model * F32, device="cuda"))
        self.hook_pre = HookPoint()
        self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x, n_tokens):
        pre_act = self.hook_pre(_act(n_tokens, self.cfg.d_mlp))              # x @ W_gate
        pre_linear = self.hook_pre_linear(_act(n_tokens, self.cfg.d_mlp))   # x @ W_in
        post_act = self.hook_post(_act(n_tokens, self.cfg.d_mlp))            # gelu(pre_act) * pre_linear
        del pre_act, pre_linear
        return _act(n_tokens, self.cfg.d_model)                              # post_act @ W_out


class TransformerBlock(torch.nn.Module):
    def __init__(self, cfg, block_index):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.ln1 = RMSNorm(cfg, cfg.d_model)
        self.ln1_post = RMSNorm(cfg, cfg.d_model)
        self.ln2 = RMSNorm(cfg, cfg.d_model)
        self.ln2_post = RMSNorm(cfg, cfg.d_model)
        self.attn = GroupedQueryAttention(cfg)
        self.mlp = GatedMLP(cfg)
        for name in ("hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "hook_mlp_in",
                     "hook_attn_out", "hook_mlp_out", "hook_resid_pre", "hook_resid_mid", "hook_resid_post"):
            setattr(self, name, HookPoint())

    def forward(self, resid_pre, batch, pos):
        n = batch * pos
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_in = self.ln1(resid_pre, n)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(attn_in, batch, pos), n))
        del attn_in
        resid_mid = self.hook_resid_mid(_act(n, self.cfg.d_model))             # resid_pre + attn_out
        mlp_in = self.ln2(resid_mid, n)
        mlp_out = self.hook_mlp_out(self.ln2_post(self.mlp(mlp_in, n), n))
        del mlp_in
        return self.hook_resid_post(_act(n, self.cfg.d_model))                 # resid_mid + mlp_out


class Embed(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.W_E = torch.nn.Parameter(torch.empty(cfg.d_vocab * cfg.d_model * F32, device="cuda"))


class Unembed(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.W_U = torch.nn.Parameter(torch.empty(cfg.d_model * cfg.d_vocab * F32, device="cuda"))
        self.b_U = torch.nn.Parameter(torch.empty(cfg.d_vocab * F32, device="cuda"))


class ActivationCache(object):
    def __init__(self, cache_dict, model, has_batch_dim=True):
        self.cache_dict = cache_dict
        self.model = model
        self.has_batch_dim = has_batch_dim

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key = "blocks.%d.attn.hook_%s" % (key[1], key[0])
        return self.cache_dict[key]

    def __len__(self):
        return len(self.cache_dict)


class HookedTransformer(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.tokenizer = types.SimpleNamespace(bos_token_id=2, pad_token_id=0, eos_token_id=1)
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.blocks = [TransformerBlock(cfg, i) for i in range(cfg.n_layers)]
        for i, block in enumerate(self.blocks):
            self._modules["blocks.%d" % i] = block
        self.ln_final = RMSNorm(cfg, cfg.d_model)
        self.unembed = Unembed(cfg)
        self.setup()

    def setup(self):
        """Names every HookPoint by its path (hook_dict), as TransformerLens does."""
        self.hook_dict = collections.OrderedDict()

        def walk(module, prefix):
            for name, child in module._modules.items():
                path = prefix + name
                if isinstance(child, HookPoint):
                    child.name = path
                    self.hook_dict[path] = child
                walk(child, path + ".")
        walk(self, "")

    @classmethod
    def from_pretrained(cls, model_name, device=None, dtype="float32", fold_ln=True, center_writing_weights=True,
                        **kwargs):
        print("Loaded pretrained model %s into HookedTransformer" % model_name)
        return cls(HookedTransformerConfig())

    def to_tokens(self, text, prepend_bos=True):
        return torch.full((1, len(text.split()) + 1), 2, dtype=torch.long, device=self.cfg.device)

    def forward(self, tokens, return_type="logits"):
        batch, pos = tokens.shape
        n = batch * pos
        residual = self.hook_embed(_act(n, self.cfg.d_model))                  # W_E[tokens] * sqrt(d_model)
        for block in self.blocks:
            residual = block(residual, batch, pos)
        residual = self.ln_final(residual, n)
        if return_type is None:
            return None
        logits = _act(n, self.cfg.d_vocab)                                     # residual @ W_U + b_U
        logits = _act(n, self.cfg.d_vocab)                                     # 30 * tanh(logits / 30)
        return logits

    def get_caching_hooks(self, names_filter=None, incl_bwd=False, device=None, remove_batch_dim=False, cache=None):
        if cache is None:
            cache = {}
        if names_filter is None:
            names_filter = lambda name: True          # noqa: E731
        elif isinstance(names_filter, str):
            filter_str = names_filter
            names_filter = lambda name: name == filter_str     # noqa: E731

        def save_hook(tensor, hook):
            cache[hook.name] = tensor.detach()        # .to(device): device None keeps it where it is

        fwd_hooks = [(name, save_hook) for name in self.hook_dict if names_filter(name)]
        return cache, fwd_hooks, []

    def run_with_cache(self, *model_args, return_cache_object=True, remove_batch_dim=False, names_filter=None,
                       device=None, **model_kwargs):
        cache_dict, fwd, bwd = self.get_caching_hooks(names_filter, False, device, remove_batch_dim)
        for name, hook in fwd:
            self.hook_dict[name].add_hook(hook, dir="fwd")
        try:
            model_out = self(*model_args, **model_kwargs)
        finally:
            for hp in self.hook_dict.values():
                hp.remove_hooks("fwd")
        if return_cache_object:
            return model_out, ActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)
        return model_out, cache_dict


_tl = types.ModuleType("transformer_lens")
_tl.HookedTransformer, _tl.ActivationCache = HookedTransformer, ActivationCache
sys.modules["transformer_lens"] = _tl

# --- the session -------------------------------------------------------------------------------------
INPUTS = [
    '''import torch as t
from transformer_lens import HookedTransformer
t.set_grad_enabled(False)
''',
    '''model = HookedTransformer.from_pretrained("gemma-2-2b", device="cuda")''',
    '''logits, cache = model.run_with_cache(model.to_tokens("The Eiffel Tower is in the city of"))''',
    '''print(len(cache), cache["pattern", 3].nbytes, t.cuda.memory_allocated() / 2**30)''',
    '''def generate_repeated_tokens(model, seq_len, batch=1):
    prefix = t.full((batch, 1), model.tokenizer.bos_token_id, dtype=t.long, device="cuda")
    rep_tokens_half = t.randint(0, model.cfg.d_vocab, (batch, seq_len), device="cuda")
    return t.cat([prefix, rep_tokens_half, rep_tokens_half], dim=-1)
''',
    '''rep_tokens = generate_repeated_tokens(model, seq_len=128, batch=16)''',
    '''rep_logits, rep_cache = model.run_with_cache(rep_tokens)''',
]

user_ns = {"__name__": "__main__", "__builtins__": __builtins__, "In": [""], "Out": {}}


def run_cell(source):
    """What IPython does with an input: compiled under <ipython-input-N-HASH>, its source kept in linecache
    (tracebacks show its lines), run in the user namespace."""
    n = len(user_ns["In"])
    user_ns["In"].append(source)
    filename = "<ipython-input-%d-%s>" % (n, hashlib.sha1(source.encode()).hexdigest()[:12])
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    print("In [%d]: %s" % (n, source.splitlines()[0]))
    exec(compile(source, filename, "exec"), user_ns)


try:
    for source in INPUTS:
        run_cell(source)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
