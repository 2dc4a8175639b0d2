"""attr_patch.py -- a PhD student's interpretability experiment on a personal RTX 4090 (24 GB, 23.5 GiB
usable): attribution patching (the gradient approximation of activation patching, Nanda 2023; Syed et al.
2023) on Pythia-6.9B for the indirect-object-identification task, to find which heads and MLPs carry the
name-mover circuit, before confirming the top ones with real activation patching.  Written by hand with
Hugging Face and forward hooks (TransformerLens did not fit the card in fp32):

    model = GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-6.9b", torch_dtype=torch.bfloat16).cuda()
    model.eval()
    for each layer: hooks on layer.attention and layer.mlp store their outputs
    with torch.no_grad():
        model(clean_tokens)                         # clean activations, detached
    logits = model(corrupt_tokens).logits           # activations kept, act.retain_grad()
    metric = logit_diff(logits, answers)            # IO logit - S logit at the last position
    metric.backward()
    attribution[name] = ((clean[name] - corrupt[name]) * corrupt[name].grad).sum(-1)

The weights (12.8 GiB bf16), the clean cache and the activations of 32 prompts x 20 tokens kept for
backward (3.6 GiB) fit.  But from_pretrained leaves every parameter with requires_grad=True and eval() does not change that,
so metric.backward() computes and stores a gradient for each of the 6.9B weights: another 12.8 GiB that
the method never reads (it only needs d metric / d activation).  The first batch fails in backward with
~7 GiB of weight gradients made (a 128 MiB gradient of an MLP weight; 32 MiB free).  Even 8 prompts at
a time would not fit: weights + weight gradients alone are 25.6 GiB.

An expert: the job needs gradients with respect to the 64 hooked activations, not the weights.  Freeze
the weights (model.requires_grad_(False)) and let autograd reach the activations -- make the embedding
output require grad (a forward hook on embed_in returning out.requires_grad_()), or ask for exactly
those gradients: torch.autograd.grad(metric, list(acts.values())) / metric.backward(inputs=...).  Then
backward costs a few hundred MiB.  Wrong advice: torch.no_grad()/inference_mode (kills the backward the
method is made of), a smaller batch or shorter prompts, gradient checkpointing, flash attention (the
activations are 3.6 GiB; the 12.8 GiB are weight gradients), mixed precision (already bf16), an 8-bit
optimizer or ZeRO (there is no optimizer and nothing to train), 8-bit weights (changes the model under
study), expandable_segments/empty_cache.
"""
import sys

import torch
from torch import nn
from torch.autograd._graph import derive

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
D, FF, V, L = 4096, 16384, 50432, 32          # Pythia-6.9B: hidden, MLP, vocab, layers
BATCH, SEQ = 32, 20
T = BATCH * SEQ


def _param(n):
    return nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"))


def _act(n, *inputs, dtype=torch.bfloat16):
    """an activation of n elements made from inputs (kept for backward while autograd is on)"""
    out = torch.empty(n, dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        out._saved = inputs if inputs else None
    return derive(out, *inputs)


# ---- transformers' GPTNeoX, as far as memory goes; the stand-in torch's Module has no forward hooks,
#      so the module class adds PyTorch's register_forward_hook(hook(module, args, output))
class HookedModule(nn.Module):
    def register_forward_hook(self, hook):
        hooks = self.__dict__.setdefault("_forward_hooks", [])
        hooks.append(hook)
        return hook

    def _call_impl(self, *args, **kwargs):
        out = nn.Module._call_impl(self, *args, **kwargs)
        for hook in self.__dict__.get("_forward_hooks", ()):
            r = hook(self, args, out)
            if r is not None:
                out = r
        return out


class LayerNorm(HookedModule):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight, self.bias = _param(D), _param(D)

    def forward(self, x):
        return _act(T * D, x)


class Linear(HookedModule):
    def __init__(self, i, o):
        nn.Module.__init__(self)
        self.weight, self.bias = _param(i * o), _param(o)
        self.o = o

    def forward(self, x):
        return _act(T * self.o, x)


class GPTNeoXAttention(HookedModule):
    def __init__(self):
        nn.Module.__init__(self)
        self.query_key_value = Linear(D, 3 * D)
        self.dense = Linear(D, D)

    def forward(self, hidden_states):
        qkv = self.query_key_value(hidden_states)
        rotary = _act(T * 3 * D, qkv)                                     # q, k with rotary applied
        scores = _act(BATCH * 32 * SEQ * SEQ, rotary, dtype=torch.float32)
        probs = _act(BATCH * 32 * SEQ * SEQ, scores, dtype=torch.float32)
        context = _act(T * D, probs, rotary)
        return (self.dense(context),)


class GPTNeoXMLP(HookedModule):
    def __init__(self):
        nn.Module.__init__(self)
        self.dense_h_to_4h = Linear(D, FF)
        self.dense_4h_to_h = Linear(FF, D)

    def forward(self, hidden_states):
        h = self.dense_h_to_4h(hidden_states)
        g = _act(T * FF, h)                                                # gelu
        return self.dense_4h_to_h(g)


class GPTNeoXLayer(HookedModule):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = LayerNorm()
        self.post_attention_layernorm = LayerNorm()
        self.attention = GPTNeoXAttention()
        self.mlp = GPTNeoXMLP()

    def forward(self, hidden_states):
        attn_output = self.attention(self.input_layernorm(hidden_states))[0]
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))   # parallel residual
        return (_act(T * D, attn_output, mlp_output, hidden_states),)


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.loss, self.logits, self.past_key_values = None, logits, None


class GPTNeoXForCausalLM(HookedModule):
    def __init__(self):
        nn.Module.__init__(self)
        self.gpt_neox = nn.Module()
        self.gpt_neox.embed_in = _param(V * D)
        layers = nn.Module()
        for i in range(L):
            setattr(layers, str(i), GPTNeoXLayer())
        self.gpt_neox.layers = layers
        self.gpt_neox.final_layer_norm = LayerNorm()
        self.embed_out = _param(D * V)

    def forward(self, input_ids):
        h = _act(T * D, self.gpt_neox.embed_in)
        for i in range(L):
            h = getattr(self.gpt_neox.layers, str(i))(h)[0]
        h = self.gpt_neox.final_layer_norm(h)
        return CausalLMOutputWithPast(_act(T * V, h, self.embed_out))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()


if not hasattr(torch.Tensor, "retain_grad"):
    torch.Tensor.retain_grad = lambda self: None         # PyTorch's: keep .grad of a non-leaf after backward


# ---- the experiment
model = GPTNeoXForCausalLM.from_pretrained("EleutherAI/pythia-6.9b", torch_dtype=torch.bfloat16).cuda()
model.eval()
print("weights %.1f GiB" % (torch.cuda.memory_allocated() / GiB))

clean_cache, corrupt_acts = {}, {}


def save_hook(name):
    def hook(module, args, output):
        act = output[0] if isinstance(output, tuple) else output
        if torch.is_grad_enabled():
            act.retain_grad()
            corrupt_acts[name] = act
        else:
            clean_cache[name] = act.detach()
    return hook


for i in range(L):
    layer = getattr(model.gpt_neox.layers, str(i))
    layer.attention.register_forward_hook(save_hook("blocks.%d.attn" % i))
    layer.mlp.register_forward_hook(save_hook("blocks.%d.mlp" % i))


def logit_diff(logits, answers):
    io = _act(BATCH, logits)                # logits[arange(B), -1, io_token]
    s = _act(BATCH, logits)                 # logits[arange(B), -1, s_token]
    return _act(1, io, s, dtype=torch.float32)


attribution = {}
try:
    for batch_idx in range(8):                             # 256 IOI prompt pairs, 32 at a time
        clean_tokens = torch.empty(T * 8, device="cuda")    # int64 token ids
        corrupt_tokens = torch.empty(T * 8, device="cuda")
        with torch.no_grad():
            model(clean_tokens)
        logits = model(corrupt_tokens).logits
        metric = logit_diff(logits, None)
        print("forward done: allocated %.1f GiB" % (torch.cuda.memory_allocated() / GiB))
        metric.backward()
        for name, act in corrupt_acts.items():
            attribution.setdefault(name, []).append(_act(BATCH * SEQ, act))
        corrupt_acts.clear()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
