"""cpt_soap.py -- continued pretraining of Qwen2.5-1.5B (1.54B parameters, fp32 master weights 5.7 GiB,
tied embeddings) on a Tagalog web corpus, one RTX A6000 (48 GB, 47.5 GiB usable), bf16 autocast,
micro-batch 1 x 2048 tokens, 32 accumulation steps.  The same script with torch.optim.AdamW ran for a
week at 32 GiB peak.  After reading that SOAP (Shampoo with Adam in the preconditioner's eigenbasis)
beats AdamW per token, the student vendored soap.py from its repository and swapped the optimizer:

    from soap import SOAP
    optimizer = SOAP(model.parameters(), lr=3e-3, betas=(.95, .95), weight_decay=.01,
                     precondition_frequency=10)            # max_precond_dim=10000 (the default)

The 32 forward/backward passes go through as before (activations ~9 GiB, freed after each backward;
fp32 gradients 5.7 GiB).  The first optimizer.step() then builds SOAP's state: Adam's two moments (11.5
GiB, as AdamW's) plus, for every dimension of every matrix up to max_precond_dim, a d x d statistics
matrix GG and its eigenbasis Q (fp32).  The MLP's 8960-wide side is under the default cap of 10000, so
gate/up/down_proj each get two 8960 x 8960 matrices (2 x 306 MiB) on top of the 1536 x 1536 ones: about
2 GiB of preconditioners per layer, 56 GiB for the 28 layers -- SOAP's state would be 67 GiB where
AdamW's is 11.5.  The step fails part way, in the 14th of the 28 layers (its down_proj), making the
eigenbasis of a 8960 x 8960 matrix (a 306 MiB request) -- with autograd off, no activations alive, the
micro-batch irrelevant.

An expert: this is the optimizer's state, made at its first step; the phase decides the fix.  Cap the
dimensions SOAP preconditions: max_precond_dim=2048 keeps every 1536-wide side preconditioned and leaves
the 8960-wide MLP side to Adam's diagonal -- the preconditioners drop from 56 GiB to 4.5 GiB and the run
peaks at 36.5 GiB (1024 would precondition almost nothing).  A smaller micro-batch, gradient
checkpointing, shorter sequences or flash attention change nothing (the activations are gone when the
step runs); empty_cache / expandable_segments neither (1.3 GiB is cached; the whole step needs ~79 GiB,
31 GiB more than the card).  An 8-bit AdamW, or going back to AdamW, would fit but abandons the
experiment; ZeRO/FSDP needs GPUs this job does not have.
"""
import functools
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, mirrored in plain Python (compiled as torch's
# own files, so that frames in them count as the framework's, as the C++ kernels would): tensor shapes,
# torch.zeros/zeros_like/eye/flip/tensordot/linalg.eigh, lerp_, elementwise arithmetic, the no_grad
# decorator, clip_grad_norm_, Embedding/Linear/RMSNorm/SiLU layers, F.cross_entropy on bf16 logits (HF
# upcasts them), and Optimizer subclasses' step() wrapped as PyTorch's _patch_step_function does.
_TENSOR_OPS = r'''
import functools
from torch.autograd._graph import derive
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}
_plain_empty_like = torch.empty_like

def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n

def _new(shape, dtype="float32", device="cuda", like=None):
    t = torch.empty(_numel(shape), dtype=dtype, device=device)
    t.shape = tuple(shape)
    return t

def empty_like(t, dtype=None, device=None):
    e = _plain_empty_like(t, dtype=dtype, device=device)
    if "shape" in t.__dict__:
        e.shape = t.shape
    return e

def zeros(*size, dtype=None, device=None):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    return _new(shape, dtype or "float32", device)

def zeros_like(t):
    return empty_like(t)

def eye(n, device=None, dtype=None):
    return _new((n, n), dtype or "float32", device)

def flip(t, dims):
    return _new(t.shape, t.dtype, t.device)

def tensordot(a, b, dims):
    keep = [s for i, s in enumerate(a.shape) if i not in dims[0]]
    return _new(tuple(keep) + tuple(keep), a.dtype, a.device)

class linalg(object):
    @staticmethod
    def eigh(m):
        n = m.shape[0]
        work = _new((n, n), m.dtype, m.device)          # cusolver's syevd workspace, about n^2
        q = _new((n, n), m.dtype, m.device)
        w = _new((n,), m.dtype, m.device)
        del work
        return w, q

def _dim(self):
    return len(self.shape)

def _lerp_(self, end, weight):
    return self

def _binary(self, other):
    n = max(self.nbytes, other.nbytes if isinstance(other, torch.Tensor) else 0)
    out = torch.empty(n, device=self.device)
    out._dtype = self.dtype
    if "shape" in self.__dict__:
        out.shape = self.shape
    out._saved = (self, other) if isinstance(other, torch.Tensor) else self
    return derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))

def _data(self):
    return self

def _float(self):
    return self if self.dtype == "float32" else _new(self.shape, "float32", self.device)

def _no_grad_call(self, func):
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        with type(self)():
            return func(*args, **kwargs)
    return decorate_context

_plain_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))

def clip_grad_norm_(parameters, max_norm):
    return torch.empty(512, device="cuda")
'''
_ns = {"torch": torch}
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
for _name in ("empty_like", "zeros", "zeros_like", "eye", "flip", "tensordot", "linalg"):
    setattr(torch, _name, _ns[_name])
torch.Tensor.dim, torch.Tensor.lerp_, torch.Tensor.float = _ns["_dim"], _ns["_lerp_"], _ns["_float"]
torch.Tensor.data = property(_ns["_data"])
torch.Tensor.__add__ = torch.Tensor.__radd__ = torch.Tensor.__mul__ = torch.Tensor.__rmul__ = _ns["_binary"]
torch.Tensor.__truediv__ = _ns["_binary"]
torch.Tensor.backward = _ns["_backward"]
torch.no_grad.__call__ = _ns["_no_grad_call"]
nn.utils = type(sys)("torch.nn.utils")
nn.utils.clip_grad_norm_ = _ns["clip_grad_norm_"]

_NN_OPS = r'''
from torch.autograd._graph import derive
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _act(x, n, dtype):
    out = torch.empty(n, dtype=dtype, device=x.device)
    out._saved = x
    return derive(out, x)

class Embedding(Module):
    def __init__(self, num, dim, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num * dim, dtype="float32", device=device))
        self.weight.shape = (num, dim)
        self.embedding_dim = dim
    def forward(self, ids):
        return _act(ids, ids.tokens * self.embedding_dim, "float32")

class Linear(Module):
    def __init__(self, fin, fout, bias=True, device=None):
        Module.__init__(self)
        self.in_features, self.out_features = fin, fout
        self.weight = Parameter(torch.empty(fout * fin, dtype="float32", device=device))
        self.weight.shape = (fout, fin)
        if bias:
            self.bias = Parameter(torch.empty(fout, dtype="float32", device=device))
            self.bias.shape = (fout,)
    def forward(self, x):
        tokens = x.nbytes // _ITEM[x.dtype] // self.in_features
        return _act(x, tokens * self.out_features, "bfloat16" if torch.is_autocast_enabled() else "float32")

class Qwen2RMSNorm(Module):
    def __init__(self, dim, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(dim, dtype="float32", device=device))
        self.weight.shape = (dim,)
    def forward(self, x):
        return _act(x, x.nbytes // _ITEM[x.dtype], "float32")

class SiLU(Module):
    def forward(self, x):
        return _act(x, x.nbytes // _ITEM[x.dtype], x.dtype)

def cross_entropy(input, target, reduction="mean"):
    up = _act(input, input.nbytes // _ITEM[input.dtype], "float32")      # logits.float()
    logp = _act(up, up.nbytes // 4, "float32")                           # log_softmax
    loss = torch.empty(512, device=input.device)
    loss._saved = logp
    return derive(loss, logp)
'''
_ns.update(_ITEM=_ns["_ITEM"])
exec(compile(_NN_OPS, torch.nn.modules.module.__file__, "exec"), _ns)
nn.Embedding, nn.Linear, nn.SiLU = _ns["Embedding"], _ns["Linear"], _ns["SiLU"]
Qwen2RMSNorm = _ns["Qwen2RMSNorm"]
nn.functional.cross_entropy = _ns["cross_entropy"]

_OPTIM = r'''
import functools

def _patch_step_function(cls):
    step = cls.__dict__["step"]
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        for hook in _global_optimizer_post_hooks.values():
            hook(self, args, kwargs)
        return out
    cls.step = wrapper

def __init_subclass__(cls, **kwargs):
    if "step" in cls.__dict__:
        _patch_step_function(cls)
'''
_ons = dict(vars(sys.modules["torch.optim.optimizer"]))
exec(compile(_OPTIM, sys.modules["torch.optim.optimizer"].__file__, "exec"), _ons)
torch.optim.Optimizer.__init_subclass__ = classmethod(_ons["__init_subclass__"])
# --- end of the stand-in additions; the user's program follows (soap.py as vendored, then cpt_soap.py)


# ======================= soap.py (vendored from the SOAP repository, trimmed to what runs) ===========
class SOAP(torch.optim.Optimizer):
    """Implements SOAP algorithm (https://arxiv.org/abs/2409.11321)."""

    def __init__(self, params, lr=3e-3, betas=(0.95, 0.95), shampoo_beta=-1, eps=1e-8, weight_decay=0.01,
                 precondition_frequency=10, max_precond_dim=10000, merge_dims=False, precondition_1d=False,
                 normalize_grads=False, data_format="channels_first", correct_bias=True):
        defaults = {"lr": lr, "betas": betas, "shampoo_beta": shampoo_beta, "eps": eps,
                    "weight_decay": weight_decay, "precondition_frequency": precondition_frequency,
                    "max_precond_dim": max_precond_dim, "merge_dims": merge_dims,
                    "precondition_1d": precondition_1d, "normalize_grads": normalize_grads,
                    "correct_bias": correct_bias}
        super().__init__(params, defaults)
        self._data_format = data_format

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state.setdefault(p, {})
                if "step" not in state:
                    state["step"] = 0
                # State initialization
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                if "Q" not in state:
                    self.init_preconditioner(grad, state, precondition_frequency=group["precondition_frequency"],
                                             precondition_1d=group["precondition_1d"],
                                             shampoo_beta=(group["shampoo_beta"] if group["shampoo_beta"] >= 0
                                                           else group["betas"][1]),
                                             max_precond_dim=group["max_precond_dim"],
                                             merge_dims=group["merge_dims"])
                    self.update_preconditioner(grad, state, max_precond_dim=group["max_precond_dim"],
                                               merge_dims=group["merge_dims"],
                                               precondition_1d=group["precondition_1d"])
                    continue  # first step is skipped so that we never use the current gradients in the projection
                state["step"] += 1
                # (projected Adam update, project back, decoupled weight decay, periodic update_preconditioner)
        return loss

    def init_preconditioner(self, grad, state, precondition_frequency=10, shampoo_beta=0.95, max_precond_dim=10000,
                            precondition_1d=False, merge_dims=False):
        state["GG"] = []  # Will hold all the preconditioner matrices (L and R in the paper).
        if grad.dim() == 1:
            if not precondition_1d or grad.shape[0] > max_precond_dim:
                state["GG"].append([])
            else:
                state["GG"].append(torch.zeros(grad.shape[0], grad.shape[0], device=grad.device))
        else:
            for sh in grad.shape:
                if sh > max_precond_dim:
                    state["GG"].append([])
                else:
                    state["GG"].append(torch.zeros(sh, sh, device=grad.device))
        state["Q"] = None  # Will hold all the eigenbases of the preconditioner.
        state["precondition_frequency"] = precondition_frequency
        state["shampoo_beta"] = shampoo_beta

    def update_preconditioner(self, grad, state, max_precond_dim=10000, merge_dims=False, precondition_1d=False):
        if grad.dim() == 1:
            if precondition_1d and grad.shape[0] <= max_precond_dim:
                state["GG"][0].lerp_(torch.tensordot(grad, grad, dims=[[], []]), 1 - state["shampoo_beta"])
        else:
            for idx, sh in enumerate(grad.shape):
                if sh <= max_precond_dim:
                    others = [i for i in range(len(grad.shape)) if i != idx]
                    outer_product = torch.tensordot(grad, grad, dims=[others, others])
                    state["GG"][idx].lerp_(outer_product, 1 - state["shampoo_beta"])
        if state["Q"] is None:
            state["Q"] = self.get_orthogonal_matrix(state["GG"])

    def get_orthogonal_matrix(self, mat):
        """Computes the eigenbases of the preconditioner using torch.linalg.eigh decomposition."""
        matrix = []
        for m in mat:
            if isinstance(m, list):                       # a dimension left unpreconditioned
                matrix.append([])
                continue
            matrix.append(m.data.float())
        final = []
        for m in matrix:
            if isinstance(m, list):
                final.append([])
                continue
            _, Q = torch.linalg.eigh(m + 1e-30 * torch.eye(m.shape[0], device=m.device))
            Q = torch.flip(Q, [1])
            final.append(Q)
        return final
# ======================= end of soap.py =======================


# ======================= cpt_soap.py =======================
config = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
          "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True}
train = {"micro_batch_size": 1, "seq_len": 2048, "grad_accum": 32, "lr": 3e-3}


class Qwen2Attention(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        h, kv = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"] * c["num_key_value_heads"]
        self.q_proj = nn.Linear(h, h, bias=True, device="cuda")
        self.k_proj = nn.Linear(h, kv, bias=True, device="cuda")
        self.v_proj = nn.Linear(h, kv, bias=True, device="cuda")
        self.o_proj = nn.Linear(h, h, bias=False, device="cuda")

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = q * k * v                                  # sdpa (flash): output of q's size, logsumexp
        return self.o_proj(attn)


class Qwen2MLP(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False, device="cuda")
        self.up_proj = nn.Linear(h, i, bias=False, device="cuda")
        self.down_proj = nn.Linear(i, h, bias=False, device="cuda")
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.self_attn = Qwen2Attention(c)
        self.mlp = Qwen2MLP(c)
        self.input_layernorm = Qwen2RMSNorm(c["hidden_size"], device="cuda")
        self.post_attention_layernorm = Qwen2RMSNorm(c["hidden_size"], device="cuda")

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class Qwen2Model(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"], device="cuda")
        for i in range(c["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(c))
        self.norm = Qwen2RMSNorm(c["hidden_size"], device="cuda")
        self.n = c["num_hidden_layers"]

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        for i in range(self.n):
            h = getattr(self, "layers_%d" % i)(h)
        return self.norm(h)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.model = Qwen2Model(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False, device="cuda")
        if c["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, labels=None):
        logits = self.lm_head(self.model(input_ids))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return CausalLMOutput(loss, logits)


class TokenBatch(object):
    """input_ids of one micro-batch on the GPU (int64)."""

    def __init__(self, b, s):
        self.tokens = b * s
        self.t = torch.empty(b * s * 8, device="cuda")
        self.device = self.t.device

    @property
    def nbytes(self):
        return self.t.nbytes


def main():
    model = Qwen2ForCausalLM(config)              # from_pretrained("Qwen/Qwen2.5-1.5B"), fp32 master weights
    model.train()
    optimizer = SOAP(model.parameters(), lr=train["lr"], betas=(.95, .95), weight_decay=.01,
                     precondition_frequency=10)
    micro_batch_size = train["micro_batch_size"]
    for step in range(10000):
        for micro in range(train["grad_accum"]):
            batch = TokenBatch(micro_batch_size, train["seq_len"])
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(batch, labels=batch)
            loss = out.loss / train["grad_accum"]
            loss.backward()
            del out, loss, batch
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print("step", step, "allocated %.1f GiB" % (torch.cuda.memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
