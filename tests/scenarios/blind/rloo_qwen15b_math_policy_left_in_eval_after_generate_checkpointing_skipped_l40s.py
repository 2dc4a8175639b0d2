"""rloo_math.py -- an applied-research engineer writes a compact RLOO loop (REINFORCE leave-one-out, 8
samples per prompt, rule-based reward for GSM8K/MATH answers, KL to a frozen reference) for
Qwen2.5-1.5B-Instruct, full fine-tuning in bf16 on one L40S (48 GB, 44.5 GiB usable).  She enabled
gradient checkpointing, as in her SFT warm-up script, which ran the same 16 x 1024-token micro-batches at
a peak of 27 GiB.  One iteration: generate 64 completions (8 prompts x 8), score them, reference
log-probs, then a policy-gradient update over 4 micro-batches of 16 sequences:

    policy = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda()
    policy.gradient_checkpointing_enable()
    ref = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda().eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    for it in range(n_iters):
        policy.eval()                                   # deterministic sampling, no dropout
        with torch.no_grad():
            seqs = policy.generate(**prompts, do_sample=True, num_return_sequences=8, max_new_tokens=768)
            ref_logp = token_logprobs(ref, seqs)
        rewards = score(seqs)
        for mb in minibatches(seqs, 16):
            logp = token_logprobs(policy, mb.seqs)      # <- CUDA out of memory, first iteration
            loss = rloo_loss(logp, mb.ref_logp, mb.rewards)
            loss.backward()
        optimizer.step(); optimizer.zero_grad()

policy.train() is never called again after the rollout.  Hugging Face's decoder runs a layer under
checkpoint only `if self.gradient_checkpointing and self.training`: with the policy in eval mode the
flag is set but ignored, and the update's forward pass keeps every layer's activations for backward,
1.6 GiB per decoder layer for 16,384 tokens.  Weights (policy and reference, 5.75 GiB) leave 38.7 GiB:
the forward fails in decoder layer 24 of 28 of the first micro-batch, before any optimizer state exists.

An expert: this is the training forward of the policy update, not an evaluation: autograd is on and a
backward pass follows.  Gradient checkpointing is switched on but not in force because the model is
still in eval mode from the rollout: call policy.train() before the update (Qwen2 has no dropout to
disable; for a model that has, set its dropout probabilities to 0 instead of using eval()).  With
checkpointing in force the update peaks near 27 GiB.  Wrong first advice: inference_mode / no_grad
(the update needs the graph), freeing the "training state" before an "evaluation", running the reference
under no_grad (it already is), quantization, empty_cache or expandable_segments (the activations are
live), a bigger GPU.  (A smaller micro-batch would also fit, at 4x the steps, but leaves the cause.)
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = float(1 << 30)
VOCAB, HIDDEN, INTER, KV, LAYERS = 151_936, 1536, 8960, 256, 28
bf16 = torch.bfloat16


def checkpoint(function, *args, use_reentrant=False):
    """torch.utils.checkpoint.checkpoint: runs the layer without keeping its activations; only its input
    is saved, and the layer is run again in backward."""
    with torch.no_grad():
        out = function(*args)
    kept = torch.empty(out.nbytes, device="cuda")
    kept._saved = args[0]
    return kept


class Qwen2RMSNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(HIDDEN, dtype=bf16, device="cuda"))


class Qwen2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=bf16, device="cuda"))
        self.k_proj = torch.nn.Parameter(torch.empty(HIDDEN * KV, dtype=bf16, device="cuda"))
        self.v_proj = torch.nn.Parameter(torch.empty(HIDDEN * KV, dtype=bf16, device="cuda"))
        self.o_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=bf16, device="cuda"))


class Qwen2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=bf16, device="cuda"))
        self.up_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=bf16, device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(INTER * HIDDEN, dtype=bf16, device="cuda"))


def _keep(prev, nbytes):
    """A tensor the layer makes; with autograd on, saved for backward (chained to the last)."""
    t = torch.empty(nbytes, device="cuda")
    if torch.is_grad_enabled():
        t._saved = prev
    return t


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_layernorm = Qwen2RMSNorm()
        self.self_attn = Qwen2Attention()
        self.post_attention_layernorm = Qwen2RMSNorm()
        self.mlp = Qwen2MLP()

    def forward(self, hidden):
        T = hidden.nbytes // (HIDDEN * 2)
        x = _keep(hidden, T * HIDDEN * 4)              # RMSNorm's float32 input
        x = _keep(x, T * HIDDEN * 2)                   # normed
        x = _keep(x, T * (HIDDEN + 2 * KV) * 2)        # q, k, v
        x = _keep(x, T * (HIDDEN + KV) * 2)            # rotary q, k
        x = _keep(x, T * HIDDEN * 2 + T * 12 * 4)      # SDPA output + logsumexp
        x = _keep(x, T * HIDDEN * 2)                   # o_proj + residual
        x = _keep(x, T * HIDDEN * 4)                   # RMSNorm's float32 input
        x = _keep(x, T * HIDDEN * 2)                   # normed
        x = _keep(x, T * INTER * 2 * 2)                # gate, up
        x = _keep(x, T * INTER * 2 * 2)                # silu(gate), silu(gate) * up
        out = _keep(x, T * HIDDEN * 2)                 # down_proj + residual
        return out


class Qwen2Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=bf16, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer())
        self.norm = Qwen2RMSNorm()
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        T = input_ids.nbytes // 8
        hidden = torch.empty(T * HIDDEN * 2, device="cuda")
        for i in range(LAYERS):
            layer = getattr(self, "layers_%d" % i)
            if self.gradient_checkpointing and self.training:
                hidden = checkpoint(layer.__call__, hidden)
            else:
                hidden = layer(hidden)
        return hidden


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model()          # lm_head tied to embed_tokens

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def forward(self, input_ids):
        hidden = self.model(input_ids)
        T = input_ids.nbytes // 8
        logits = torch.empty(T * VOCAB, dtype=bf16, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = hidden
        return logits

    def generate(self, input_ids, num_return_sequences=1, max_new_tokens=20, do_sample=False):
        """Sampling with a KV cache of (prompts x num_return_sequences) x (prompt + new tokens)."""
        n = input_ids.nbytes // 8 // 256 * num_return_sequences
        total = 256 + max_new_tokens
        kv = [torch.empty(n * total * KV * 2 * 2, device="cuda") for _ in range(LAYERS)]
        step_logits = torch.empty(n * VOCAB * 4, device="cuda")
        del kv, step_logits
        return torch.empty(n * total * 8, device="cuda")


def token_logprobs(model, seqs):
    """log p(token_t | tokens_<t): logits, then a per-row logsumexp (selective log-softmax) and a gather."""
    logits = model(seqs)
    logp = torch.empty(seqs.nbytes // 8 * 4, device="cuda")
    if torch.is_grad_enabled():
        logp._saved = logits
    return logp


def minibatches(seqs, n, size):
    for i in range(0, n, size):
        yield torch.empty(size * 1024 * 8, device="cuda")


try:
    policy = Qwen2ForCausalLM().cuda()
    policy.gradient_checkpointing_enable()
    ref = Qwen2ForCausalLM().cuda().eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
    n_prompts, k_samples, micro_batch_size = 8, 8, 16
    for it in range(200):
        prompts = torch.empty(n_prompts * 256 * 8, device="cuda")
        policy.eval()
        with torch.no_grad():
            seqs = policy.generate(prompts, do_sample=True, num_return_sequences=k_samples, max_new_tokens=768)
            ref_logp = [token_logprobs(ref, mb) for mb in minibatches(seqs, n_prompts * k_samples, micro_batch_size)]
        print("iteration %d: rollout done, allocated %.2f GiB" % (it, torch.cuda.memory_allocated() / GiB))
        for mb in minibatches(seqs, n_prompts * k_samples, micro_batch_size):
            logp = token_logprobs(policy, mb)
            loss = logp                                  # rloo_loss(logp, ref_logp, rewards)
            scen_truth.backward(loss)
            del logp, loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
