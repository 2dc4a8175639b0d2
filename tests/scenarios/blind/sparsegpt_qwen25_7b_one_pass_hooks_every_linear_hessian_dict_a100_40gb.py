"""prune_qwen.py -- 50% unstructured pruning of Qwen2.5-7B-Instruct (bf16, 14.2 GiB) for the on-prem
assistant, SparseGPT-style, on one A100 40GB.  The author found the reference code's layer-by-layer
"catch the inputs of block i, prune it, feed block i+1" dance awkward and wrote a one-pass version: the
whole model sits on the GPU (it fits, 14.2 of 40 GiB), every nn.Linear gets a forward hook that
accumulates its input's Gram matrix H = 2/n * X^T X in float32, the 128 C4 calibration samples (2048
tokens each) go through model(...) under torch.no_grad(), and only then is each layer pruned with its H:

    H, nsamples = {}, {}
    def accumulate(name):
        def hook(module, inp, out):
            x = inp[0].detach(); x = x.reshape(-1, x.shape[-1]).float()
            if name not in H:
                H[name] = torch.zeros(x.shape[1], x.shape[1], device=x.device); nsamples[name] = 0
            ...
            H[name] += x.t() @ x
        return hook
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            mod.register_forward_hook(accumulate(name))

A Hessian is in_features^2 float32, whatever the number of samples: q/k/v/o/gate/up take 49 MiB each
(3584^2), down_proj 1.34 GiB (18944^2); 1.62 GiB per decoder layer, 45 GiB for 28 layers.  The dict
fills during the very first calibration sample's forward pass, layer after layer; in the 14th layer the
x.t() @ x update of down_proj's Hessian (1.34 GiB) no longer fits: 14.2 GiB of weights + 22.7 GiB of H
(the 1.3 GiB cached in pieces then would not hold the next layer's 1.6 GiB either).

An expert: the dict H (global, one float32 Hessian per Linear of every layer) holds the memory, not the
activations or the model: 45 GiB of statistics that are each needed only while their own layer is pruned.
Calibrate and prune one decoder layer at a time, as SparseGPT/GPTQ do (run the calibration inputs through
layer i, accumulate its seven Hessians, prune it, free them, pass its outputs on), i.e. keep at most one
layer's Hessians alive; q/k/v (and gate/up) share an input and can share one H.  Wrong first advice:
fewer or shorter calibration samples or a smaller batch (H does not depend on them; the batch is 1
already), no_grad/inference_mode (already under no_grad), gradient checkpointing, mixed precision or bf16
Hessians (the inversion needs float32 and it would still not fit), quantizing the model,
expandable_segments or empty_cache (every byte is live), a bigger GPU first (80 GB would hold it, but the
method does not need it).
"""
import collections
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --------------------------------------------------------------------------------------------------
# stand-in gap: the stand-in torch has no shapes, no nn.Linear/ModuleList/Embedding, no forward hooks,
# no torch.zeros or arithmetic.  What follows mirrors the real API's shape and allocates what PyTorch's
# operations allocate (a new tensor of the result's size; in-place ops nothing).
_ISZ = {"float32": 4, "bfloat16": 2, "float16": 2}


def _new(shape, dtype="float32", device="cuda"):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype, device=device)
    t.shape = tuple(shape)
    return t


def _zeros(*shape, device="cuda", dtype="float32"):
    return _new(shape, dtype, device)


torch.zeros = _zeros


def _reshape(self, *shape):
    n = 1
    for d in self.shape:
        n *= d
    shape = list(shape)
    if -1 in shape:
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        shape[shape.index(-1)] = n // known
    v = self.view()
    v.shape = tuple(shape)
    return v


def _float(self):
    if self.dtype == "float32":
        return self
    return _new(self.shape, "float32")


def _t(self):
    v = self.view()
    v.shape = tuple(reversed(self.shape))
    return v


def _matmul(self, other):
    return _new((self.shape[0], other.shape[-1]), self.dtype)


def _scale(self, k):
    return _new(self.shape, self.dtype)


def _inplace(self, other):
    return self


def _detach(self):
    v = self.view()
    v.shape = self.shape
    v._params = ()
    return v


torch.Tensor.reshape = _reshape
torch.Tensor.float = _float
torch.Tensor.t = _t
torch.Tensor.__matmul__ = _matmul
torch.Tensor.__rmul__ = _scale
torch.Tensor.__mul__ = _scale
torch.Tensor.__imul__ = _inplace
torch.Tensor.__iadd__ = _inplace
torch.Tensor.detach = _detach

_plain_call = torch.nn.Module._call_impl


def _call_impl(self, *args, **kwargs):
    out = _plain_call(self, *args, **kwargs)
    for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
        r = hook(self, args, out)
        if r is not None:
            out = r
    return out


def _register_forward_hook(self, hook):
    hooks = self.__dict__.setdefault("_forward_hooks", collections.OrderedDict())
    hooks[len(hooks)] = hook
    return hook


def _named_modules(self, prefix=""):
    yield prefix, self
    for name, m in self._modules.items():
        for sub in m.named_modules(prefix + ("." if prefix else "") + name):
            yield sub


torch.nn.Module._call_impl = _call_impl
torch.nn.Module.register_forward_hook = _register_forward_hook
torch.nn.Module.named_modules = _named_modules


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=False, dtype="bfloat16"):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(_new((out_features, in_features), dtype), requires_grad=False)
        if bias:
            self.bias = torch.nn.Parameter(_new((out_features,), dtype), requires_grad=False)

    def forward(self, x):
        return _new(x.shape[:-1] + (self.out_features,), x.dtype)


class Embedding(torch.nn.Module):
    def __init__(self, num, dim, dtype="bfloat16"):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weight = torch.nn.Parameter(_new((num, dim), dtype), requires_grad=False)

    def forward(self, ids):
        return _new(ids.shape + (self.dim,), "bfloat16")


class ModuleList(torch.nn.Module):
    def __init__(self, mods):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


torch.nn.Linear = Linear
# --------------------------------------------------------------------------------------------------

HIDDEN, INTER, KV, LAYERS, VOCAB = 3584, 18944, 512, 28, 152064


class Qwen2RMSNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_new((dim,), "bfloat16"), requires_grad=False)

    def forward(self, x):
        return _new(x.shape, x.dtype)


class Qwen2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN, bias=True)
        self.k_proj = Linear(HIDDEN, KV, bias=True)
        self.v_proj = Linear(HIDDEN, KV, bias=True)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = _new(q.shape, q.dtype)                 # scaled_dot_product_attention (flash)
        del q, k, v
        return self.o_proj(attn)


class Qwen2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, x):
        g = self.gate_proj(x)
        u = self.up_proj(x)
        h = _new(g.shape, g.dtype)                    # act_fn(gate) * up
        del g, u
        return self.down_proj(h)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention()
        self.mlp = Qwen2MLP()
        self.input_layernorm = Qwen2RMSNorm(HIDDEN)
        self.post_attention_layernorm = Qwen2RMSNorm(HIDDEN)

    def forward(self, hidden):
        a = self.self_attn(self.input_layernorm(hidden))
        h = _new(hidden.shape, hidden.dtype)          # hidden + a
        del a
        m = self.mlp(self.post_attention_layernorm(h))
        out = _new(h.shape, h.dtype)                  # h + m
        return out


class Qwen2Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, HIDDEN)
        self.layers = ModuleList([Qwen2DecoderLayer() for _ in range(LAYERS)])
        self.norm = Qwen2RMSNorm(HIDDEN)

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model()
        self.lm_head = Linear(HIDDEN, VOCAB)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        return cls()

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def get_c4_calibration(n=128, seqlen=2048):
    for _ in range(n):
        ids = torch.empty(seqlen * 8, device="cuda")       # int64 token ids
        ids.shape = (1, seqlen)
        yield ids


def sparsegpt_prune(layer, H, sparsity=0.5, blocksize=128):
    """OBS pruning of layer.weight with its Hessian (Frantar & Alistarh, 2023)."""
    Hinv = _new(H.shape, "float32")                  # cholesky_inverse(cholesky(H + damp*I))
    W = layer.weight.float()
    del Hinv, W


model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16,
                                         device_map="cuda")
model.eval()
print("model loaded: %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))

H, nsamples = {}, {}


def accumulate(name):
    def hook(module, inp, out):
        x = inp[0].detach()
        x = x.reshape(-1, x.shape[-1]).float()
        n = x.shape[0]
        if name not in H:
            H[name] = torch.zeros(x.shape[1], x.shape[1], device=x.device)
            nsamples[name] = 0
        H[name] *= nsamples[name] / (nsamples[name] + n)
        nsamples[name] += n
        x = math.sqrt(2 / nsamples[name]) * x
        H[name] += x.t() @ x
    return hook


for name, mod in model.named_modules():
    if isinstance(mod, torch.nn.Linear) and name != "lm_head":
        mod.register_forward_hook(accumulate(name))

try:
    with torch.no_grad():
        for i, ids in enumerate(get_c4_calibration()):
            model(ids)
            if i % 16 == 0:
                print("calibration sample", i, "H entries", len(H),
                      "allocated %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))
        for name, mod in model.named_modules():
            if name in H:
                sparsegpt_prune(mod, H[name], sparsity=0.5)
except torch.OutOfMemoryError:
    print("OOM with", len(H), "Hessians kept (%.1f GiB)" % (sum(h.nbytes for h in H.values()) / 2**30))
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
