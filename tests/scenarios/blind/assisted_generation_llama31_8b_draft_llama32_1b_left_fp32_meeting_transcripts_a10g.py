"""bench_assisted.py -- a platform team wants to know whether speculative decoding ("assisted generation" in
Hugging Face transformers 4.46.3, PyTorch 2.5.1) makes meeting-transcript summaries fast enough on the single
NVIDIA A10G (24 GB, 23028 MiB) of an AWS g5.2xlarge.  Target: meta-llama/Llama-3.1-8B-Instruct (8.03B
parameters, bf16 checkpoint); draft: meta-llama/Llama-3.2-1B-Instruct (1.24B parameters, bf16 checkpoint, the
same 128,256-token vocabulary: the canonical pairing).  The engineer copied the loading lines of the docs'
assisted-generation snippet, added torch_dtype to the target because the 8B model in float32 (32 GB) obviously
cannot fit, and left the draft's line as it was:

    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    model = AutoModelForCausalLM.from_pretrained(TARGET, torch_dtype=torch.bfloat16, device_map="cuda")
    assistant_model = AutoModelForCausalLM.from_pretrained(DRAFT).to("cuda")
    ...
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True).to("cuda")
    out = model.generate(**inputs, assistant_model=assistant_model, max_new_tokens=512, do_sample=False)

transformers 4.x loads a model in float32 unless torch_dtype is given, so the draft sits on the card as 4.60 GiB
of float32 weights instead of 2.30 GiB of bf16, and its KV cache (64 KiB per token over its 16 layers) and its
activations are float32 too.  The 8B target in bf16 holds 14.96 GiB; after loading, 19.56 GiB of the 22.49 GiB
are allocated.  The same script ran on ~800-token CNN/DailyMail articles without trouble, and the baseline
(`--mode baseline`: the target alone, no draft loaded) went through every transcript (peak 18.5 GiB reserved).
With the draft, the warm-up generation passes; the first real transcript (an 82-minute platform sync: 12,544
prompt tokens with the system prompt and the chat template) fails in the first candidate round, in the draft's
own prefill over the prompt: in layer 14 of its 16, the MLP's act(gate) * up product, [1, 12544, 8192] float32
= 392 MiB, does not fit: 206 MiB free, PyTorch has 21.39 GiB allocated and 0.40 GiB reserved but unallocated
(split blocks; its largest free block is 294 MiB).  The target has not even run on this prompt yet.  Measured on
a bigger card, this run needs 23.26 GiB allocated at its peak with the float32 draft: 1.3 GiB more than the
21.99 GiB this card has after the CUDA context, so no amount of cache handling gets it through.

An expert: the target and the long prompts are fine -- the baseline ran them; the draft is the problem, loaded in
float32 because its line has no torch_dtype.  Load it in its checkpoint's dtype:
AutoModelForCausalLM.from_pretrained(DRAFT, torch_dtype=torch.bfloat16, device_map="cuda").  That gives back
2.3 GiB of weights and halves the draft's KV cache and activations: this transcript then peaks at 20.58 GiB
allocated (21.36 GiB reserved), and all four transcripts go through with 512 new tokens each (peak 21.75 GiB
reserved of the 21.99).  It also makes the draft about twice as fast per token (decoding is memory-bound: half
the bytes read), which is the whole point of speculative decoding, and greedy assisted generation still returns
exactly the target's tokens, so the summaries do not change.
Wrong first advice: quantizing the target to 8/4 bit (changes the model being benchmarked and its outputs; the
memory is not the target's fault), CPU offload / device_map="auto" (makes a latency benchmark meaningless),
truncating the transcripts or a shorter max length (changes the task: the summary loses the end of the
meeting), inference_mode / no_grad (generate already runs under no_grad, the models are in eval mode), a smaller
batch (batch 1: assisted generation supports nothing else), gradient checkpointing (no training),
expandable_segments / empty_cache (0.40 GiB cached against a 1.3 GiB shortfall over the pass; at best it fails
one layer later), flash attention (SDPA already computes no S x S matrix; the failing tensor is the MLP's), a
smaller preallocated KV cache (transformers grows a DynamicCache; nothing is preallocated), running the draft
under no_grad as if it were a frozen teacher (it already is), loading one model at a time or dropping the draft
(speculative decoding needs both at once), mixed precision / autocast (the float32 weights stay float32), a
bigger GPU (works, but 2.3 GiB are simply wasted on float32 weights).
"""
import os
import sys
import sysconfig
import time
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# stand-in gaps, part 1: the torch API the stand-in lacks (shapes, torch.long, nn.Linear / nn.Embedding /
# nn.ModuleList, F.linear, F.silu, F.scaled_dot_product_attention, torch.cat, torch.repeat_interleave, the
# Tensor methods and operators HF's Llama code uses), compiled as part of torch's own files so that the
# failing Python line stays the program's.  Sizes are the real ones: every op makes the tensor PyTorch makes.
_TORCH_TENSOR_GAPS = '''
long = int64 = "int64"
_ITEMSIZE["int64"] = 8
_orig_view = Tensor.view


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _new(shape, dtype, device):
    t = empty(_numel(shape), dtype=dtype, device=device)
    t._shape = tuple(int(s) for s in shape)
    return t


def _resolve(shape, numel):
    shape = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else list(shape)
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = numel // known
    return tuple(shape)


def _shape_of(self):
    return self._root().__dict__.get("_shape") if "_shape" not in self.__dict__ else self.__dict__["_shape"]


def _t_view(self, *shape):
    v = _orig_view(self)
    v._shape = _resolve(shape, _numel(self.shape)) if shape else self.shape
    return v


def _t_transpose(self, d0, d1):
    s = list(self.shape)
    s[d0], s[d1] = s[d1], s[d0]
    v = _orig_view(self)
    v._shape = tuple(s)
    v._noncontig = True
    return v


def _t_contiguous(self):
    if not self.__dict__.get("_noncontig"):
        return self
    return _new(self.shape, self.dtype, self.device)


def _t_reshape(self, *shape):
    if self.__dict__.get("_noncontig"):
        out = _new(_resolve(shape, _numel(self.shape)), self.dtype, self.device)
        return out
    return _t_view(self, *shape)


def _t_narrow(self, dim, start, length):
    s = list(self.shape)
    s[dim] = int(length)
    v = _orig_view(self)
    v._shape = tuple(s)
    return v


def _t_to(self, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for a in args:
        if a in _ITEMSIZE:
            dtype = a
    if dtype is None or dtype == self.dtype:
        return self
    return _new(self.shape, dtype, self.device)


def _t_float(self):
    return _t_to(self, float32)


def _promote(a, b):
    da = a.dtype if isinstance(a, Tensor) else None
    db = b.dtype if isinstance(b, Tensor) else None
    if "float32" in (da, db):
        return "float32"
    return da or db


def _broadcast(a, b):
    a, b = list(a), list(b)
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    return tuple(max(x, y) for x, y in zip(a, b))


def _binary(self, other):
    shape = _broadcast(self.shape, other.shape) if isinstance(other, Tensor) else self.shape
    return _new(shape, _promote(self, other), self.device)


def _t_pow(self, exponent):
    return _new(self.shape, self.dtype, self.device)


def _t_mean(self, dim=-1, keepdim=False):
    s = list(self.shape)
    s[dim] = 1
    return _new(s, self.dtype, self.device)


def _t_argmax(self, dim=-1):
    s = list(self.shape)
    del s[dim]
    return _new(s, int64, self.device)


def rsqrt(input):
    return _new(input.shape, input.dtype, input.device)


def cat(tensors, dim=0):
    tensors = list(tensors)
    s = list(tensors[0].shape)
    s[dim] = sum(t.shape[dim] for t in tensors)
    return _new(s, tensors[0].dtype, tensors[0].device)


def stack(tensors, dim=0):
    tensors = list(tensors)
    s = list(tensors[0].shape)
    s.insert(dim, len(tensors))
    return _new(s, tensors[0].dtype, tensors[0].device)


def repeat_interleave(input, repeats, dim=0):
    s = list(input.shape)
    s[dim] *= int(repeats)
    return _new(s, input.dtype, input.device)


Tensor.shape = property(_shape_of)
Tensor.size = lambda self, d=None: self.shape if d is None else self.shape[d]
Tensor.view = _t_view
Tensor.transpose = _t_transpose
Tensor.contiguous = _t_contiguous
Tensor.reshape = _t_reshape
Tensor.narrow = _t_narrow
Tensor.to = _t_to
Tensor.float = _t_float
Tensor.pow = _t_pow
Tensor.mean = _t_mean
Tensor.argmax = _t_argmax
Tensor.__mul__ = Tensor.__rmul__ = _binary
Tensor.__add__ = Tensor.__radd__ = _binary
'''

_TORCH_NN_GAPS = '''
class CPUTensor(object):
    """A tensor in host memory (what from_pretrained builds when no device_map is given)."""
    is_cuda = False

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype
        self.nbytes = torch._numel(shape) * torch._ITEMSIZE[dtype]


def _weight(shape, dtype, device):
    if device is None or str(device) == "cpu":
        return CPUTensor(shape, dtype)
    return Parameter(torch._new(shape, dtype, device))


class Linear(Module):
    def __init__(self, in_features, out_features, bias=False, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _weight((out_features, in_features), dtype or torch.get_default_dtype(), device)

    def forward(self, input):
        return functional.linear(input, self.weight)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = _weight((num_embeddings, embedding_dim), dtype or torch.get_default_dtype(), device)

    def forward(self, input):
        return torch._new(tuple(input.shape) + (self.embedding_dim,), self.weight.dtype, input.device)


class ModuleList(Module):
    def __init__(self, modules=()):
        Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return list(self._modules.values())[i]


def _move_to_device(module, device):
    """Module._apply(lambda t: t.to(device)): every host tensor becomes a parameter on the device, one copy each."""
    for m in module.modules():
        for k, v in list(m.__dict__.items()):
            if isinstance(v, CPUTensor):
                del m.__dict__[k]
                setattr(m, k, Parameter(torch._new(v.shape, v.dtype, device)))
    return module
'''

_TORCH_F_GAPS = '''
def linear(input, weight, bias=None):
    return torch._new(tuple(input.shape[:-1]) + (weight.shape[0],), input.dtype, input.device)


def silu(input, inplace=False):
    return torch._new(input.shape, input.dtype, input.device)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """Flash / memory-efficient kernels (no S x S matrix): the output, of the query's shape."""
    return torch._new(query.shape, query.dtype, query.device)
'''

_TORCH_CONTEXTLIB_GAPS = '''
import functools


def _no_grad_call(self, func):
    """torch.no_grad() used as a decorator (torch.utils._contextlib.context_decorator)."""
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        with self.__class__():
            return func(*args, **kwargs)
    return decorate_context
'''


def _gap(src, filename, ns):
    exec(compile(src, filename, "exec"), ns)
    return ns


_ns = _gap(_TORCH_TENSOR_GAPS, os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), vars(torch))
_nn_ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter,
          "functional": torch.nn.functional}
_gap(_TORCH_NN_GAPS, os.path.join(os.path.dirname(torch.nn.modules.module.__file__), "linear.py"), _nn_ns)
for _k in ("Linear", "Embedding", "ModuleList"):
    setattr(torch.nn, _k, _nn_ns[_k])
_gap(_TORCH_F_GAPS, torch.nn.functional.__file__, vars(torch.nn.functional))
torch.no_grad.__call__ = _gap(_TORCH_CONTEXTLIB_GAPS, os.path.join(os.path.dirname(torch.__file__), "utils",
                                                                   "_contextlib.py"), {})["_no_grad_call"]

# ---------------------------------------------------------------------------------------------------------
# stand-in gaps, part 2: the parts of transformers 4.46.3 this script runs (from_pretrained, LlamaForCausalLM
# with SDPA attention and a DynamicCache, generate with assisted decoding: AssistedCandidateGenerator and
# _assisted_decoding), compiled under transformers' own file names in site-packages.
_HF = os.path.join(sysconfig.get_paths()["purelib"], "transformers")

_MODELING_LLAMA = '''
import torch
from torch import nn
from torch.nn import functional as F

LLAMA_CONFIGS = {
    "meta-llama/Llama-3.1-8B-Instruct": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                             tie_word_embeddings=False, torch_dtype="bfloat16"),
    "meta-llama/Llama-3.2-1B-Instruct": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                             tie_word_embeddings=True, torch_dtype="bfloat16"),
}


class LlamaConfig(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.head_dim = self.hidden_size // self.num_attention_heads


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def get_seq_length(self, layer_idx=0):
        return self.key_cache[layer_idx].shape[-2] if len(self.key_cache) > layer_idx else 0

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def crop(self, max_length):
        if self.get_seq_length() <= max_length:
            return
        for idx in range(len(self.key_cache)):
            self.key_cache[idx] = self.key_cache[idx].narrow(-2, 0, max_length)
            self.value_cache[idx] = self.value_cache[idx].narrow(-2, 0, max_length)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, device=None, dtype=None):
        nn.Module.__init__(self)
        self.weight = nn.linear_gaps._weight((hidden_size,), dtype, device)
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.dim = config.head_dim

    def forward(self, x, position_ids):
        seq = position_ids.shape[-1]
        freqs = torch._new((1, seq, self.dim // 2), torch.float32, x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.pow(1), emb.pow(1)
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x.narrow(-1, 0, x.shape[-1] // 2)
    x2 = x.narrow(-1, x.shape[-1] // 2, x.shape[-1] // 2)
    return torch.cat((x2 * -1, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def repeat_kv(hidden_states, n_rep):
    if n_rep == 1:
        return hidden_states
    return torch.repeat_interleave(hidden_states, n_rep, dim=1)


class LlamaSdpaAttention(nn.Module):
    def __init__(self, config, layer_idx, device, dtype):
        nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, device=device, dtype=dtype)
        self.k_proj = nn.Linear(h, self.num_key_value_heads * self.head_dim, device=device, dtype=dtype)
        self.v_proj = nn.Linear(h, self.num_key_value_heads * self.head_dim, device=device, dtype=dtype)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, device=device, dtype=dtype)

    def forward(self, hidden_states, position_embeddings, past_key_value):
        bsz, q_len, _ = hidden_states.shape
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        query_states = query_states.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = key_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        value_states = value_states.view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx)
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states, attn_mask=None,
                                                     is_causal=q_len > 1)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.view(bsz, q_len, -1)
        return self.o_proj(attn_output)


class LlamaMLP(nn.Module):
    def __init__(self, config, device, dtype):
        nn.Module.__init__(self)
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, device=device, dtype=dtype)
        self.up_proj = nn.Linear(h, i, device=device, dtype=dtype)
        self.down_proj = nn.Linear(i, h, device=device, dtype=dtype)

    def forward(self, x):
        down_proj = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return down_proj


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx, device, dtype):
        nn.Module.__init__(self)
        self.self_attn = LlamaSdpaAttention(config, layer_idx, device, dtype)
        self.mlp = LlamaMLP(config, device, dtype)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, device=device, dtype=dtype)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, device=device, dtype=dtype)

    def forward(self, hidden_states, position_embeddings, past_key_value):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = self.self_attn(hidden_states, position_embeddings, past_key_value)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self, config, device, dtype):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config, i, device, dtype)
                                     for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, device=device, dtype=dtype)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def forward(self, input_ids, position_ids, past_key_values):
        inputs_embeds = self.embed_tokens(input_ids)
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, position_embeddings, past_key_values)
        hidden_states = self.norm(hidden_states)
        return hidden_states


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class LlamaForCausalLM(PreTrainedModel):
    def __init__(self, config, device=None, dtype=None):
        PreTrainedModel.__init__(self, config)
        self.model = LlamaModel(config, device, dtype)
        if config.tie_word_embeddings:
            self.lm_head = nn.Module()          # tied: lm_head.weight is embed_tokens.weight (no memory of its own)
            self._tied = True
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, device=device, dtype=dtype)
            self._tied = False

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=True, num_logits_to_keep=0, **kwargs):
        hidden_states = self.model(input_ids, position_ids, past_key_values)
        if num_logits_to_keep:
            hidden_states = hidden_states.narrow(1, hidden_states.shape[1] - num_logits_to_keep, num_logits_to_keep)
        weight = self.model.embed_tokens.weight if self._tied else self.lm_head.weight
        logits = F.linear(hidden_states, weight)
        logits = logits.float()
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values)
'''

_MODELING_UTILS = '''
import torch
from torch import nn


class PreTrainedModel(nn.Module, GenerationMixin):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.generation_config = GenerationConfig()

    @property
    def dtype(self):
        return self.model.embed_tokens.weight.dtype

    def num_parameters(self):
        return sum(p.nbytes // torch._ITEMSIZE[p.dtype] for p in self.parameters())

    def get_memory_footprint(self):
        return sum(p.nbytes for p in self.parameters())

    def to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        return nn.linear_gaps._move_to_device(self, device)

    def cuda(self, device=None):
        return self.to("cuda")


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, torch_dtype=None, device_map=None, **kwargs):
        """As transformers 4.x: without torch_dtype the weights are loaded in float32 (the default dtype),
        whatever the checkpoint holds; torch_dtype="auto" takes the checkpoint's.  With device_map each
        tensor is read straight onto its device; without, the model is built in host memory."""
        config = LlamaConfig(**LLAMA_CONFIGS[pretrained_model_name_or_path])
        if torch_dtype == "auto":
            torch_dtype = config.torch_dtype
        dtype = torch_dtype or torch.get_default_dtype()
        device = device_map if device_map not in (None, "auto") else ("cuda" if device_map == "auto" else "cpu")
        model = LlamaForCausalLM(config, device=device, dtype=dtype)
        model.name_or_path = pretrained_model_name_or_path
        return model.eval()
'''

_GENERATION_UTILS = '''
import torch


class GenerationConfig(object):
    def __init__(self):
        self.num_assistant_tokens = 20
        self.num_assistant_tokens_schedule = "constant"
        self.assistant_confidence_threshold = 0.4
        self.max_new_tokens = 20


class GenerateDecoderOnlyOutput(object):
    def __init__(self, sequences, scores, past_key_values):
        self.sequences, self.scores, self.past_key_values = sequences, scores, past_key_values


def _positions(input_ids, past_length):
    return torch._new((1, input_ids.shape[-1]), torch.int64, input_ids.device)


class GenerationMixin(object):
    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, **kwargs):
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        new = input_ids.narrow(1, cached, input_ids.shape[1] - cached)
        return {"input_ids": new, "position_ids": _positions(new, cached), "past_key_values": past_key_values,
                "attention_mask": attention_mask, "use_cache": True}

    def _update_attention_mask(self, attention_mask, n):
        return torch.cat([attention_mask, torch._new((1, n), torch.int64, attention_mask.device)], dim=-1)

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, assistant_model=None, max_new_tokens=None,
                 do_sample=False, past_key_values=None, output_scores=False, return_dict_in_generate=False,
                 _candidate_lengths=None, **kwargs):
        max_new_tokens = max_new_tokens or self.generation_config.max_new_tokens
        if past_key_values is None:
            past_key_values = DynamicCache()
        if assistant_model is not None:
            candidate_generator = AssistedCandidateGenerator(assistant_model, attention_mask,
                                                             _candidate_lengths or ())
            return self._assisted_decoding(input_ids, attention_mask, candidate_generator, max_new_tokens,
                                           past_key_values)
        return self._sample(input_ids, attention_mask, max_new_tokens, past_key_values, output_scores,
                            return_dict_in_generate)

    def _sample(self, input_ids, attention_mask, max_new_tokens, past_key_values, output_scores,
                return_dict_in_generate):
        scores = []
        for _ in range(max_new_tokens):
            model_inputs = self.prepare_inputs_for_generation(input_ids, past_key_values, attention_mask)
            outputs = self(**model_inputs, num_logits_to_keep=1)
            next_token_logits = outputs.logits.narrow(1, 0, 1).float()
            if output_scores:
                scores.append(next_token_logits)
            next_tokens = next_token_logits.argmax(dim=-1)
            input_ids = torch.cat([input_ids, next_tokens], dim=-1)
            attention_mask = self._update_attention_mask(attention_mask, 1)
            del outputs
        if return_dict_in_generate:
            return GenerateDecoderOnlyOutput(input_ids, tuple(scores), past_key_values)
        return input_ids

    def _assisted_decoding(self, input_ids, attention_mask, candidate_generator, max_new_tokens, past_key_values):
        prompt_len = input_ids.shape[-1]
        while input_ids.shape[-1] - prompt_len < max_new_tokens:
            cur_len = input_ids.shape[-1]
            candidate_input_ids, candidate_logits = candidate_generator.get_candidates(input_ids)
            candidate_length = candidate_input_ids.shape[1] - cur_len
            candidate_kwargs_mask = self._update_attention_mask(attention_mask, candidate_length)
            model_inputs = self.prepare_inputs_for_generation(candidate_input_ids, past_key_values,
                                                              candidate_kwargs_mask)
            model_inputs["num_logits_to_keep"] = candidate_length + 1
            outputs = self(**model_inputs)
            new_logits = outputs.logits.narrow(1, 0, candidate_length + 1)
            selected_tokens = new_logits.argmax(dim=-1)
            n_matches = candidate_generator.n_matches(candidate_length)
            valid_tokens = selected_tokens.narrow(1, 0, n_matches + 1)
            input_ids = torch.cat((input_ids, valid_tokens), dim=-1)
            attention_mask = self._update_attention_mask(attention_mask, n_matches + 1)
            new_cur_len = input_ids.shape[-1]
            outputs.past_key_values.crop(new_cur_len - 1)
            del outputs, new_logits, candidate_logits
        return input_ids
'''

_CANDIDATE_GENERATOR = '''
import torch


class AssistedCandidateGenerator(object):
    """Runs the assistant's own generate for up to num_assistant_tokens tokens (stopping early when its
    confidence drops under assistant_confidence_threshold); the assistant keeps its KV cache across rounds."""

    def __init__(self, assistant_model, attention_mask, candidate_lengths):
        self.assistant_model = assistant_model
        self.num_assistant_tokens = assistant_model.generation_config.num_assistant_tokens
        self.assistant_kwargs = {"attention_mask": attention_mask}
        self._plan = list(candidate_lengths)   # (candidates proposed, candidates accepted) per round
        self._round = 0

    def get_candidates(self, input_ids):
        new_cur_len = input_ids.shape[-1]
        if self.assistant_kwargs.get("past_key_values") is not None:
            self.assistant_kwargs["past_key_values"].crop(new_cur_len - 1)
            grown = new_cur_len - self.assistant_kwargs["attention_mask"].shape[-1]
            if grown > 0:
                self.assistant_kwargs["attention_mask"] = self.assistant_model._update_attention_mask(
                    self.assistant_kwargs["attention_mask"], grown)
        proposed, _ = self._plan[self._round % len(self._plan)]
        assistant_output = self.assistant_model.generate(input_ids=input_ids, max_new_tokens=proposed,
                                                         output_scores=True, return_dict_in_generate=True,
                                                         **self.assistant_kwargs)
        self.assistant_kwargs["past_key_values"] = assistant_output.past_key_values
        candidate_logits = torch.stack(assistant_output.scores, dim=1)
        candidate_ids = assistant_output.sequences
        return candidate_ids, candidate_logits

    def n_matches(self, candidate_length):
        _, accepted = self._plan[self._round % len(self._plan)]
        self._round += 1
        return min(accepted, candidate_length)
'''

_TOKENIZATION = '''
import torch


class BatchEncoding(dict):
    def __init__(self, input_ids, attention_mask):
        dict.__init__(self, input_ids=input_ids, attention_mask=attention_mask)

    def to(self, device):
        return BatchEncoding(*[torch._new(v.shape, torch.int64, device) for v in self.values()])


class PreTrainedTokenizerFast(object):
    def __init__(self, name):
        self.name_or_path = name

    def apply_chat_template(self, conversation, add_generation_prompt=False, return_tensors=None,
                            return_dict=False, **kw):
        # Llama 3 chat template: header tokens per message, then the content
        n = sum(5 + m["n_tokens"] for m in conversation) + (4 if add_generation_prompt else 0) + 1
        ids = torch.nn.linear_gaps.CPUTensor((1, n), torch.int64)
        mask = torch.nn.linear_gaps.CPUTensor((1, n), torch.int64)
        return BatchEncoding(ids, mask)

    def decode(self, ids, skip_special_tokens=False):
        return "<summary>"


class AutoTokenizer(object):
    @classmethod
    def from_pretrained(cls, name, **kw):
        return PreTrainedTokenizerFast(name)
'''


def _install_transformers():
    torch.nn.linear_gaps = types.SimpleNamespace(**_nn_ns)
    tf = types.ModuleType("transformers")
    tf.__file__ = os.path.join(_HF, "__init__.py")
    tf.__version__ = "4.46.3"
    ns = {}
    for src, rel in ((_GENERATION_UTILS, "generation/utils.py"),
                     (_CANDIDATE_GENERATOR, "generation/candidate_generator.py"),
                     (_MODELING_UTILS, "modeling_utils.py"),
                     (_MODELING_LLAMA, "models/llama/modeling_llama.py"),
                     (_TOKENIZATION, "tokenization_utils_fast.py")):
        exec(compile(src, os.path.join(_HF, rel), "exec"), ns)
        for k, v in ns.items():
            if not k.startswith("__"):
                setattr(tf, k, v)
    sys.modules["transformers"] = tf


_install_transformers()
# ---------------------------------------------------------------------------------------------------------
# bench_assisted.py, as the user wrote it

import argparse  # noqa: E402
import json  # noqa: E402

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
SYSTEM = ("You are a meeting assistant for the platform team. Summarize the transcript below in three "
          "sections: decisions (with owners), open questions, deadlines. Use bullet points, keep the "
          "speakers' names as diarized, and do not invent names or dates.")

# data/transcripts.jsonl: exported from the meeting recorder (Whisper large-v3 + diarization); token counts
# with the Llama 3 tokenizer.  The CNN/DailyMail articles of the first benchmark were ~800 tokens each.
TRANSCRIPTS = [
    {"id": "2024-09-12_platform-sync", "minutes": 82, "n_tokens": 12473},
    {"id": "2024-09-13_incident-review-db-failover", "minutes": 55, "n_tokens": 8464},
    {"id": "2024-09-16_quarterly-planning", "minutes": 95, "n_tokens": 13380},
    {"id": "2024-09-17_design-review-billing", "minutes": 45, "n_tokens": 6930},
]
WARMUP = {"id": "warmup", "minutes": 0, "n_tokens": 160}

# assisted generation's rounds, as they went in the runs so far: (candidates the draft proposed before its
# confidence fell under 0.4, candidates the target accepted)
ROUNDS = [(6, 5), (9, 9), (4, 2), (7, 6), (12, 10), (5, 3)]


def summarize(model, assistant_model, tokenizer, doc, max_new_tokens, mode):
    messages = [{"role": "system", "content": SYSTEM, "n_tokens": 56},
                {"role": "user", "content": "transcript %s" % doc["id"], "n_tokens": doc["n_tokens"]}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True).to("cuda")
    prompt_len = inputs["input_ids"].shape[-1]
    t0 = time.perf_counter()
    if mode == "assisted":
        out = model.generate(**inputs, assistant_model=assistant_model, max_new_tokens=max_new_tokens,
                             do_sample=False, _candidate_lengths=ROUNDS)
    else:
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    dt = time.perf_counter() - t0
    new_tokens = out.shape[-1] - prompt_len
    return {"id": doc["id"], "prompt_tokens": prompt_len, "new_tokens": new_tokens, "seconds": dt}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["assisted", "baseline"], default="assisted")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--out", default="results/assisted_a10g.jsonl")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    model = AutoModelForCausalLM.from_pretrained(TARGET, torch_dtype=torch.bfloat16, device_map="cuda")
    assistant_model = None
    if args.mode == "assisted":
        assistant_model = AutoModelForCausalLM.from_pretrained(DRAFT).to("cuda")
    print("target %s: %.2f GiB" % (TARGET, model.get_memory_footprint() / 2 ** 30))
    if assistant_model is not None:
        print("draft  %s: %.2f GiB" % (DRAFT, assistant_model.get_memory_footprint() / 2 ** 30))
    print("allocated after loading: %.2f GiB of %.2f GiB" % (
        torch.cuda.memory_allocated() / 2 ** 30, torch.cuda.mem_get_info()[1] / 2 ** 30))

    # warm-up: first generate pays for cuBLAS handles and kernel selection; not timed
    summarize(model, assistant_model, tokenizer, WARMUP, 32, args.mode)

    results = []
    for doc in TRANSCRIPTS:
        print("%s (%d min, %d tokens) ..." % (doc["id"], doc["minutes"], doc["n_tokens"]))
        sys.stdout.flush()
        r = summarize(model, assistant_model, tokenizer, doc, args.max_new_tokens, args.mode)
        results.append(r)
        print("  %d new tokens in %.1f s" % (r["new_tokens"], r["seconds"]))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
