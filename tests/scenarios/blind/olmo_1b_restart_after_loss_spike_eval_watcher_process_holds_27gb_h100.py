"""train.py -- a 1.2B model with OLMo-1B's configuration (16 layers, d=2048, SwiGLU 8192, non-parametric
LayerNorm, 50,304-token vocabulary, tied embeddings) pretrained from scratch on one H100 80GB: micro-batch
8 x 2,048, ACCUM 16, bf16 autocast over float32 weights, SDPA, no activation checkpointing; a checkpoint of
model and AdamW every 1,000 steps.  For three days it ran at a 60 GiB peak (59.5 GiB allocated, 61 GiB
reserved).

At step 41,2xx the loss spiked.  While deciding what to do, the researcher opened a second tmux pane and
started eval_watch.py, the lab's checkpoint watcher: it polls ckpt/, loads each new checkpoint onto cuda:0,
computes validation perplexity on four held-out domains with eval batch 32, and sleeps until the next one.
It scored steps 39,000-41,000 and now sleeps -- holding its model and the blocks PyTorch cached for its eval
batches: 27 GiB in nvidia-smi, as python, pid 48113.  Then the training was restarted the usual way after a
spike (rewind to the step-41,000 checkpoint, skip the next 200 steps' batches):

    model = OlmoForCausalLM(config).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.95), weight_decay=0.1)
    state = torch.load("ckpt/step41000/train_state.pt", map_location="cpu")
    model.load_state_dict(state["model"]); optimizer.load_state_dict(state["optimizer"])

The weights and AdamW's moments are back on the card (13.2 GiB) and the very first forward pass dies in the
loss, at the float32 copy of the logits (3.07 GiB) with 99 MiB free.  The researcher suspects the resume
path (the optimizer state loaded onto the GPU) and the skipped batches.

Expert reading: this process holds 52 GiB; the card's other 27 GiB belong to another process -- the watcher,
idle but holding its model and PyTorch's cache.  The run alone fits with 18 GiB to spare, as it did for three
days.  First: stop eval_watch.py (or make it release its memory between checkpoints: del the model,
torch.cuda.empty_cache(); or run it on another GPU or the CPU), then restart.
Wrong advice: a smaller batch, gradient checkpointing, shorter sequences, a fused cross-entropy (each would
squeeze the run into what another process left, slowing or changing a run that fits), mixed precision /
flash attention (on), an 8-bit optimizer / ZeRO / offload / quantization / LoRA, map_location="cpu" (the
checkpoint is already loaded to the CPU; the moments belong on the GPU), expandable_segments or empty_cache in
the training (its own cache holds 10 MiB), "restart the process" alone (the watcher is not a leftover of this
run and survives the restart), a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code (C++ in PyTorch): int64, Tensor.float, comparison and sum,
# torch.stack, F.silu, F.scaled_dot_product_attention, Tensor.__add__ / __mul__ / __truediv__, and
# Optimizer.load_state_dict (the saved moments cast to their parameters' device, as PyTorch does),
# torch.nn.utils.clip_grad_norm_.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
    torch._ITEMSIZE["bool"] = 1      # (torch.bool: not set here, it would shadow the builtin in the stand-in)
_GAPS = """
def float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)

def __ne__(self, other):
    return torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype="bool", device=self.device)

def sum(self, dim=None):
    out = torch.empty(1, dtype=torch.int64 if self.dtype in ("bool", "int64") else torch.float32, device=self.device)
    out._saved = self if self._params else None
    return torch._derive(out, self)

def stack(tensors, dim=0):
    out = torch.empty(len(tensors), dtype=torch.float32, device=tensors[0].device)
    out._saved = tuple(tensors)
    return torch._derive(out, *tensors)

def _binary(self, other):
    t = other if isinstance(other, torch.Tensor) and other.nbytes > self.nbytes else self
    out = torch.empty(t.nbytes // torch._ITEMSIZE[t.dtype], dtype=t.dtype, device=t.device)
    out._saved = (self, other)
    return torch._derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))

def _radd(self, other):
    return self if other == 0 else _binary(self, other)

def silu(input, inplace=False):
    out = torch.empty(input.nbytes // 2, dtype=torch.bfloat16, device=input.device)
    out._saved = input
    return torch._derive(out, input)

def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    out = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(q.nbytes // 2 // 64, dtype=torch.float32, device=q.device)
    out._saved = (q, k, v, lse)
    return torch._derive(out, q, k, v)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["float"]
torch.Tensor.__ne__ = _ns["__ne__"]
torch.Tensor.sum = _ns["sum"]
torch.Tensor.__add__ = torch.Tensor.__mul__ = torch.Tensor.__truediv__ = _ns["_binary"]
torch.Tensor.__radd__ = _ns["_radd"]
torch.stack = _ns["stack"]
_nsf = {"torch": torch}
exec(compile(_GAPS, F.__file__, "exec"), _nsf)
F.silu, F.scaled_dot_product_attention = _nsf["silu"], _nsf["scaled_dot_product_attention"]
_OPT = """
def load_state_dict(self, state_dict):
    params = [p for g in self.param_groups for p in g["params"]]
    for i, s in state_dict["state"].items():
        p = params[int(i)]
        self.state[p] = {k: (torch.empty(v.nbytes // 4, dtype=torch.float32, device=p.device)
                             if hasattr(v, "nbytes") else v) for k, v in s.items()}
"""
_nso = {"torch": torch}
exec(compile(_OPT, sys.modules["torch.optim.optimizer"].__file__, "exec"), _nso)
torch.optim.Optimizer.load_state_dict = _nso["load_state_dict"]
_CLIP = """
def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    norms = [torch.empty(1, dtype=torch.float32, device=p.device) for p in parameters if p.grad is not None]
    return torch.empty(1, dtype=torch.float32, device="cuda")
"""
import os
import types
_nsc = {"torch": torch}
exec(compile(_CLIP, os.path.join(os.path.dirname(F.__file__), "utils", "clip_grad.py"), "exec"), _nsc)
torch.nn.utils = types.SimpleNamespace(clip_grad_norm_=_nsc["clip_grad_norm_"])
# ----

GiB = 1 << 30


class OlmoConfig(object):      # allenai/OLMo-1B-0724-hf's config.json
    vocab_size = 50304
    hidden_size = 2048
    intermediate_size = 8192
    num_hidden_layers = 16
    num_attention_heads = 16
    max_position_embeddings = 4096
    tie_word_embeddings = True


def _p(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = _p(i * o)

    def forward(self, x):
        out = torch.empty(x.tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        out.tokens = x.tokens
        return out


class OlmoLayerNorm(torch.nn.Module):
    """OLMo's non-parametric LayerNorm: no weights; computed in float32 under autocast."""

    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.d = d

    def forward(self, x):
        out = torch.empty(x.tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = x
        out.tokens = x.tokens
        return out


class OlmoAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        h = c.hidden_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = Linear(h, h), Linear(h, h), Linear(h, h), Linear(h, h)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q * 1.0          # apply_rotary_pos_emb: new q and k
        k = k * 1.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.tokens = x.tokens
        return self.o_proj(y)


class OlmoMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        h.tokens = x.tokens
        return self.down_proj(h)


class OlmoDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = OlmoAttention(c)
        self.mlp = OlmoMLP(c)
        self.input_layernorm = OlmoLayerNorm(c.hidden_size)
        self.post_attention_layernorm = OlmoLayerNorm(c.hidden_size)

    def forward(self, hidden_states):
        t = hidden_states.tokens
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states.float()
        hidden_states.tokens = t
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = residual + hidden_states.float()
        hidden_states.tokens = t
        return hidden_states


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(n * d)
        self.d = d

    def forward(self, ids):
        out = torch.empty(ids.tokens * self.d, dtype=torch.float32, device="cuda")
        out.tokens = ids.tokens
        return out


class OlmoForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = OlmoDecoderLayer(c)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = OlmoLayerNorm(c.hidden_size)
        self.lm_head = Linear(c.hidden_size, c.vocab_size)
        self.lm_head.weight = self.embed_tokens.weight          # weight tying

    def forward(self, input_ids, labels):
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        logits = self.lm_head(self.norm(hidden_states))
        return F.cross_entropy(logits.view(-1, self.config.vocab_size).float(), labels.view(-1))


class _Host(object):
    """A tensor of a checkpoint loaded with map_location="cpu" (host memory)."""
    is_cuda = False

    def __init__(self, nbytes):
        self.nbytes = nbytes


def load_checkpoint(path, model, optimizer):
    """torch.load(path, map_location="cpu") of {"model", "optimizer", "step"}; then the load_state_dicts."""
    params = model.parameters()
    state = {"model": dict((name, _Host(p.nbytes)) for name, p in model.named_parameters()),
             "optimizer": {"state": dict((i, {"step": 41000, "exp_avg": _Host(p.nbytes), "exp_avg_sq": _Host(p.nbytes)})
                                         for i, p in enumerate(params)),
                           "param_groups": [{"params": list(range(len(params)))}]},
             "step": 41000}
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def token_batch(rows, seqlen):
    ids = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    ids.tokens = rows * seqlen
    labels = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    labels.tokens = rows * seqlen
    return ids, labels


MICRO_BATCH = 8
SEQ_LEN = 2048
ACCUM = 16
MAX_STEPS = 100000
SAVE_EVERY = 1000


def main():
    model = OlmoForCausalLM(OlmoConfig())
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.95), weight_decay=0.1)
    start = load_checkpoint("ckpt/step41000/train_state.pt", model, optimizer)
    print("resumed at step %d, skipping the batches of steps %d-%d; %.1f GiB allocated"
          % (start, start, start + 200, torch.cuda.memory_allocated() / GiB))
    for step in range(start, MAX_STEPS):
        for micro in range(ACCUM):
            ids, labels = token_batch(MICRO_BATCH, SEQ_LEN)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels)
            (loss / ACCUM).backward()
            del loss, ids, labels
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % SAVE_EVERY == 0:
            print("saved ckpt/step%d" % (step + 1))     # torch.save(...) of model and optimizer, from host copies


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
