"""train_layerskip.py -- an inference team wants a Llama-3.2-1B that can exit early for self-speculative
decoding, and fine-tunes it on its own chat logs with a LayerSkip-style recipe: an early-exit loss at
every layer through the shared LM head.  Full fine-tune, fp32 master weights (4.6 GiB), bf16 autocast,
HF gradient checkpointing on, micro-batch 4 x 2048 tokens with 8 accumulation steps, one L40S (48 GB):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=torch.float32).cuda()
    model.gradient_checkpointing_enable()
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch["input_ids"], output_hidden_states=True)
            loss = 0.0
            for l, h in enumerate(out.hidden_states[1:]):          # an exit after each of the 16 layers
                logits = model.lm_head(model.model.norm(h))
                loss = loss + exit_scale[l] * F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        (loss / ACCUM).backward()

LayerSkip's paper samples which exits are active (the "rotational" / "gradual" early-exit curriculum);
this config has the curriculum off: all 16 exits every step.  Checkpointing covers the decoder layers, so
the trunk keeps only each layer's input (64 MiB); but the exits run outside any checkpoint, and each one
keeps, until the backward at the end, its full-vocabulary logits and their log-softmax: 8192 tokens x
128,256 = 4 GiB per exit (on top of the model's own 2 GiB of final logits).  The first forward of the
first micro-batch dies making exit 10's logits (2 GiB in bf16), 43.5 GiB in: nine exits hold 36 GiB.

An expert: checkpointing is placed where the memory is not.  Compute the exit losses without keeping
full logits: a chunked / fused linear cross-entropy for the shared head (Liger's
LigerFusedLinearCrossEntropyLoss, or chunks of tokens with the head and loss inside a checkpoint), which
keeps ~one chunk instead of 4 GiB per exit; and/or turn the early-exit curriculum back on (a few exits per
step, as LayerSkip does) and drop the model's own unused logits.  Wrong first advice: "enable gradient
checkpointing" (it is on; the exits are outside it), flash attention (attention is not the problem),
calling backward per micro-batch (there is one micro-batch; the exits share one trunk), expandable_segments
/ empty_cache, quantization / LoRA (the logits stay), inference_mode, a bigger GPU.
"""
import sys
import types

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 2048
INTER = 8192
LAYERS = 16
VOCAB = 128_256
KV = 512                                      # 8 KV heads x 64
MICRO_BATCH = 4
SEQ_LEN = 2048
ACCUM = 8
TOKENS = MICRO_BATCH * SEQ_LEN


# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
def _records(*inputs):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and (t._params or t.requires_grad)
                                           for t in inputs)


def _op(out, *inputs):
    """out = op(inputs) for an op whose node holds its inputs' nodes (and what they saved)."""
    if _records(*inputs):
        torch._derive(out, *[t for t in inputs if isinstance(t, torch.Tensor)])
        out._saved = tuple(t for t in inputs if isinstance(t, torch.Tensor))
    return out


def _add(a, b):
    t = a if isinstance(a, torch.Tensor) else b
    return _op(torch.empty_like(t), a, b)


def _scale(self, s):
    return _op(torch.empty_like(self), self)


torch.Tensor.__add__ = _add
torch.Tensor.__radd__ = _add
torch.Tensor.__mul__ = _scale
torch.Tensor.__rmul__ = _scale
torch.Tensor.__truediv__ = _scale

_autograd_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """loss.backward(): PyTorch frees each saved tensor as it passes it; the stand-in frees them first."""
    todo = [self._saved]
    self._saved = None
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor) and t.__dict__.get("_saved") is not None:
            todo.append(t._saved)
            t._saved = None
    _autograd_backward(self, gradient, retain_graph, create_graph, inputs)


torch.Tensor.backward = _backward


def checkpoint(function, *args, use_reentrant=False, **kwargs):
    """torch.utils.checkpoint.checkpoint: runs function without keeping its activations; only the inputs
    are saved (the forward is recomputed in backward)."""
    with torch.no_grad():
        out = function(*args, **kwargs)
    out._params = ()
    module = getattr(function, "__self__", None)
    leaves = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    if torch.is_grad_enabled():
        torch._derive(out, *args)
        out._params = tuple(out._params) + tuple(leaves)
        out._saved = tuple(a for a in args if isinstance(a, torch.Tensor))
    return out


torch.utils = types.ModuleType("torch.utils")
torch.utils.checkpoint = types.ModuleType("torch.utils.checkpoint")
torch.utils.checkpoint.checkpoint = checkpoint
sys.modules["torch.utils"] = torch.utils
sys.modules["torch.utils.checkpoint"] = torch.utils.checkpoint


class Linear(torch.nn.Module):
    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.out_features = fout
        self.weight = torch.nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty(TOKENS * self.out_features * 2, device="cuda")          # bf16 under autocast
        if torch.is_grad_enabled():
            out._saved = x
        return out


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(HIDDEN * 4, device="cuda"))

    def forward(self, h):
        out = torch.empty(TOKENS * HIDDEN * 4, device="cuda")                      # fp32, as the weight
        if torch.is_grad_enabled():
            out._saved = h
        return out


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm()
        self.self_attn = torch.nn.Module()
        for name, fout in (("q_proj", HIDDEN), ("k_proj", KV), ("v_proj", KV), ("o_proj", HIDDEN)):
            setattr(self.self_attn, name, Linear(HIDDEN, fout))
        self.post_attention_layernorm = LlamaRMSNorm()
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj = Linear(HIDDEN, INTER)
        self.mlp.up_proj = Linear(HIDDEN, INTER)
        self.mlp.down_proj = Linear(INTER, HIDDEN)

    def forward(self, h):
        a = self.self_attn
        x = self.input_layernorm(h)
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        attn = a.o_proj(_op(torch.empty(q.nbytes, device="cuda"), q, k, v))     # SDPA (flash) output
        h2 = _op(torch.empty(h.nbytes, device="cuda"), h, attn)
        x2 = self.post_attention_layernorm(h2)
        m = self.mlp
        act = _op(torch.empty(TOKENS * INTER * 2, device="cuda"), m.gate_proj(x2), m.up_proj(x2))
        return _op(torch.empty(h.nbytes, device="cuda"), h2, m.down_proj(act))


class LlamaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN * 4, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = LlamaRMSNorm()
        self.gradient_checkpointing = False

    def forward(self, input_ids, output_hidden_states=False):
        h = _op(torch.empty(TOKENS * HIDDEN * 4, device="cuda"), input_ids, self.embed_tokens)
        hidden_states = [h]
        for i in range(LAYERS):
            layer = getattr(self.layers, str(i))
            if self.gradient_checkpointing and self.training:
                h = torch.utils.checkpoint.checkpoint(layer.__call__, h, use_reentrant=False)
            else:
                h = layer(h)
            hidden_states.append(h)
        return self.norm(h), (tuple(hidden_states) if output_hidden_states else None)


class CausalLMOutputWithPast(object):
    def __init__(self, logits, hidden_states):
        self.logits, self.hidden_states = logits, hidden_states


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Linear(HIDDEN, VOCAB)
        self.lm_head.weight = self.model.embed_tokens            # tied embeddings

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, output_hidden_states=False):
        h, hidden_states = self.model(input_ids, output_hidden_states=output_hidden_states)
        return CausalLMOutputWithPast(self.lm_head(h), hidden_states)


def chat_log_batches(n):
    for _ in range(n):
        ids = torch.empty(MICRO_BATCH * SEQ_LEN * 8, device="cuda")
        yield {"input_ids": ids, "labels": torch.empty(MICRO_BATCH * SEQ_LEN * 8, device="cuda")}


cfg = {"micro_batch_size": MICRO_BATCH, "grad_accum": ACCUM, "seq_len": SEQ_LEN,
       "early_exit_curriculum": None, "early_exit_scale": "l/L"}


def main():
    model = LlamaForCausalLM().cuda()
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    exit_scale = [(l + 1) / LAYERS for l in range(LAYERS)]
    for step, batch in enumerate(chat_log_batches(100_000)):
        labels = batch["labels"]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch["input_ids"], output_hidden_states=True)
            loss = 0.0
            for l, h in enumerate(out.hidden_states[1:]):
                logits = model.lm_head(model.model.norm(h))
                loss = loss + exit_scale[l] * F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))
        (loss / ACCUM).backward()
        if (step + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
