"""dpo_train.py -- a support-automation team aligns Qwen2.5-3B-Instruct to its house tone with a
hand-written DPO loop (no TRL: "it is 60 lines") on one RTX A6000 (48 GB, 47.5 GiB usable).  Full fine-
tuning in bf16 (weights 5.8 GiB, grads 5.8, AdamW state 11.5 in bf16), gradient checkpointing on the
policy, 4 preference pairs per step (8 sequences x 768 tokens), a reference model loaded as a second copy:

    policy = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()
    policy.gradient_checkpointing_enable()
    ref_model = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()
    ref_model.eval()                                        # "frozen"

    def sequence_logps(model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = F.log_softmax(logits, dim=-1)
        return (torch.gather(logps, 2, batch["labels"].unsqueeze(-1)).squeeze(-1) * batch["mask"]).sum(-1)

    ref_chosen, ref_rejected = sequence_logps(ref_model, batch).chunk(2)
    pol_chosen, pol_rejected = sequence_logps(policy, batch).chunk(2)
    loss = -F.logsigmoid(beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))).mean()

eval() changes dropout, not autograd: the reference's parameters still require grad and its forward runs
with autograd on, so it records a whole graph -- and in eval mode Hugging Face's gradient checkpointing
does not apply to it: every layer's activations for 6144 tokens (~26 GiB) plus its fp32 logits and
log-softmax (7 GiB) stay alive through ref_chosen/ref_rejected, waiting for a backward that would also
give the reference 5.8 GiB of gradients it never uses.  The first step's policy forward then fails at
its lm_head (1.7 GiB of bf16 logits, before `logits.float()`): 11.5 GiB of weights + 33 GiB of reference
graph + the policy's own checkpointed pass.  With the reference under no_grad the loop runs, peaking near
37 GiB with AdamW's state (plus the backward's temporaries).

An expert: compute the reference log-probs under torch.no_grad() (and ref_model.requires_grad_(False)), or
precompute them for the whole dataset before training and drop the reference. Wrong first advice: a
smaller batch (2 pairs fail too, at the second step: the reference's graph plus the gradients its first
backward left on it), gradient checkpointing (it is on; on the reference, in eval mode, it does nothing),
an 8-bit optimizer or ZeRO (the failure comes before AdamW has any state), a fused cross-entropy (saves
the policy's logits but the reference's graph and gradients still do not fit), LoRA with an adapter-
disabled reference (a change of method for what is a missing no_grad), expandable_segments/empty_cache, a
bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# transformers' Qwen2 and the few tensor operations the loss uses, as far as memory goes (the stand-in torch
# has no transformers and its Tensor no arithmetic): bf16 parameters on the GPU; a forward with autograd on
# keeps every layer's saved activations unless gradient checkpointing runs (training mode only, as in
# Hugging Face); the model returns float32 logits (`logits = logits.float()`, transformers 4.44).
# ---------------------------------------------------------------------------------------------------------
BF16 = torch.bfloat16
HIDDEN, INTER, KV, LAYERS, VOCAB = 2048, 11008, 256, 36, 151936


def _graph(t):
    return isinstance(t, torch.Tensor) and bool(t._params or t.requires_grad)


def _op(a, b=None, nbytes=None):
    out = torch.empty(a.nbytes if nbytes is None else nbytes, device="cuda")
    out._dtype = a.dtype
    if torch.is_grad_enabled() and (_graph(a) or _graph(b)):
        out._saved = a if _graph(a) else b
    return torch._derive(out, *[t for t in (a, b) if isinstance(t, torch.Tensor)])


def _gather(input, dim, index):
    return _op(input, nbytes=index.nbytes // 2)            # one float32 per token


def _chunk(self, n, dim=0):
    return [self.view() for _ in range(n)]


torch.gather = getattr(torch, "gather", _gather)
torch.Tensor.chunk = _chunk
torch.Tensor.unsqueeze = lambda a, dim: a
torch.Tensor.squeeze = lambda a, dim: a
torch.Tensor.sum = lambda a, dim=None: _op(a, nbytes=4096)
torch.Tensor.mean = lambda a: _op(a, nbytes=512)
for _name in ("__add__", "__sub__", "__mul__", "__rmul__"):
    setattr(torch.Tensor, _name, _op)
torch.Tensor.__neg__ = lambda a: _op(a)
F.logsigmoid = lambda x: _op(x)


class SavedTensors(object):
    def __init__(self, first):
        self.last = first

    def append(self, t):
        t._saved = self.last
        self.last = t


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV, dtype=BF16, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * INTER, dtype=BF16, device="cuda"))

    def forward(self, hidden, tokens, keep):
        _ = (self.self_attn, self.mlp)
        # input norm, q, k, v, rotary q/k, SDPA out, o_proj in, residual, post norm; gate, up, act, act*up
        for width in [HIDDEN] * 8 + [KV] * 4 + [INTER] * 4:
            t = torch.empty(tokens * width, dtype=BF16, device="cuda")
            if keep is not None:
                keep.append(t)
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        if keep is not None:
            keep.append(out)
        return out


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16, device="cuda"))  # tied head
        self.layers = [Qwen2DecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layers_%d" % i, l)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        checkpointing = self.gradient_checkpointing and self.training
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        chain = SavedTensors(hidden) if grad else None
        for layer in self.layers:
            if checkpointing and grad:
                chain.append(hidden)                   # the layer's input; the rest is recomputed in backward
                hidden = layer(hidden, tokens, None)
            else:
                hidden = layer(hidden, tokens, chain)
        _ = self.embed_tokens
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")       # lm_head(hidden_states)
        logits = self._upcast(logits, chain)
        return CausalLMOutputWithPast(logits)

    def _upcast(self, logits, chain):
        out = torch.empty(logits.nbytes // 2, dtype=torch.float32, device="cuda")   # logits = logits.float()
        out._saved = chain.last if chain is not None else None
        return out


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None):
        return Qwen2ForCausalLM()


def preference_batches(pairs, max_length):
    while True:
        n = 2 * pairs * max_length                   # chosen and rejected, concatenated
        yield {"input_ids": torch.empty(n * 8, device="cuda"), "attention_mask": torch.empty(n * 8, device="cuda"),
               "labels": torch.empty(n * 8, device="cuda"), "mask": torch.empty(n * 4, device="cuda")}


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
BASE = "Qwen/Qwen2.5-3B-Instruct"
beta = 0.1
pairs_per_step = 4
max_length = 768

policy = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()
policy.gradient_checkpointing_enable()
policy.train()
ref_model = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()
ref_model.eval()                                    # frozen reference

optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-7, weight_decay=0.0)


def sequence_logps(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = F.log_softmax(logits, dim=-1)
    token_logps = torch.gather(logps, 2, batch["labels"].unsqueeze(-1)).squeeze(-1)
    return (token_logps * batch["mask"]).sum(-1)


try:
    for step, batch in enumerate(preference_batches(pairs_per_step, max_length)):
        ref_chosen, ref_rejected = sequence_logps(ref_model, batch).chunk(2)
        pol_chosen, pol_rejected = sequence_logps(policy, batch).chunk(2)
        logits = beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))
        loss = -F.logsigmoid(logits).mean()
        scen_truth.backward(loss)                   # loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            print("step", step, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / (1 << 30)))
        if step == 2000:
            break
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
