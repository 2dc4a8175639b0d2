"""grpo_math.py -- GRPO on Qwen2.5-3B (full fine-tuning, bf16 weights, AdamW) for GSM8K-style math, one
H100 80GB, written by hand instead of TRL because the user wanted the old policy's log-probabilities
"for free" while sampling, without a second forward pass:

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-3B", torch_dtype=torch.bfloat16).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)       # beta = 0: no reference model
    for prompts in loader:                                            # 8 prompts x 8 completions
        ids = prompts.repeat_interleave(8, 0)                         # 64 x 256 prompt tokens
        completions, old_logps = generate_with_logprobs(model, ids, max_new_tokens=512)
        rewards = score(completions); adv = group_normalise(rewards)
        for mb in minibatches(...):  loss = grpo_loss(model, mb, old_logps.detach(), adv); loss.backward() ...

    def generate_with_logprobs(model, ids, max_new_tokens):           # no torch.no_grad() here
        logits, past = model(ids, past_key_values=None)               # prefill, 64 x 256 tokens
        for t in range(max_new_tokens):
            logp = F.log_softmax(logits[:, -1].float(), -1)
            tok = torch.multinomial(logp.exp(), 1); logps.append(logp.gather(1, tok))
            logits, past = model(tok, past_key_values=past)           # one token, KV cache grows

The first rollout of the first batch dies about 35 tokens into the 512 new ones; no optimizer step has
run.  Autograd is on for the whole sampling loop: the prefill keeps every layer's activations for
a backward that never comes (44 GiB), and each decode step adds its own graph -- the KV cache tensors
are outputs of k_proj/v_proj with autograd on, and the kept log-probabilities are in the graph too --
about 0.75 GiB more per token.  The request that fails is small (a 9 MiB slice of the cache); the
allocator's cache holds only half a GiB it is not using.  With transformers' generate() (decorated
with torch.no_grad) the same rollout needs a few GiB of KV cache.

An expert: sample under torch.no_grad() / torch.inference_mode() -- the old policy's log-probabilities
are detached in the loss anyway, so nothing here needs a graph; recompute the new log-probabilities with
grad in the training micro-batches.  Not gradient checkpointing (there is no backward of this pass), not
an 8-bit optimizer or sharding (no state exists yet), not fragmentation.  Fewer completions per step
would only postpone it.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, LAYERS, KV_DIM, INTER, VOCAB = 2048, 36, 256, 11008, 151936
BF16 = 2


def weight(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems, dtype=torch.bfloat16, device="cuda"))


def act(nbytes, saved=None, dtype=torch.bfloat16):
    """an activation of nbytes; `saved` is what autograd keeps for it (the stand-in's graph)."""
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved
    return t


class Linear(torch.nn.Module):
    def __init__(self, fan_in, fan_out):
        torch.nn.Module.__init__(self)
        self.weight = weight(fan_in * fan_out)


class Qwen2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, h, tokens, batch, past_len, past_kv):
        qkv = act(tokens * (HIDDEN + 2 * KV_DIM) * BF16, h)
        # torch.cat((past_k, k), dim=2): a new cache tensor each step, in the graph of k_proj
        k = act(batch * (past_len + tokens // batch) * KV_DIM * BF16, qkv)
        v = act(batch * (past_len + tokens // batch) * KV_DIM * BF16, qkv)
        k._prev = past_kv
        out = act(tokens * HIDDEN * BF16, k)
        out._v = v
        return out, (k, v)


class Qwen2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, h, tokens):
        gate_up = act(tokens * 2 * INTER * BF16, h)
        hidden = act(tokens * INTER * BF16, gate_up)          # silu(gate) * up
        return act(tokens * HIDDEN * BF16, hidden)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention()
        self.mlp = Qwen2MLP()

    def forward(self, h, tokens, batch, past_len, past_kv):
        a, kv = self.self_attn(h, tokens, batch, past_len, past_kv)
        return self.mlp(a, tokens), kv


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * HIDDEN)            # tied with lm_head
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)

    def forward(self, input_ids, batch, new_tokens, past_key_values=None):
        past_len = 0 if past_key_values is None else past_key_values[0][0]._len
        tokens = batch * new_tokens
        h = act(tokens * HIDDEN * BF16, input_ids)
        new_past = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, tokens, batch, past_len, None if past_key_values is None else past_key_values[i])
            kv[0]._len = past_len + new_tokens
            new_past.append(kv)
        logits = act(batch * VOCAB * BF16, h)                  # last position only (num_logits_to_keep=1)
        return logits, new_past


def generate_with_logprobs(model, ids, batch, prompt_len, max_new_tokens):
    logps = []
    completion = []
    logits, past = model(ids, batch, prompt_len)
    for t in range(max_new_tokens):
        logp = F.log_softmax(logits, -1, dtype=torch.float32)
        tok = act(batch * 8, None, torch.uint8)                 # torch.multinomial(logp.exp(), 1)
        tok_logp = act(batch * 4, logp, torch.float32)          # logp.gather(1, tok)
        logps.append(tok_logp)
        completion.append(tok)
        logits, past = model(tok, batch, 1, past_key_values=past)
    return completion, logps


def main():
    model = Qwen2ForCausalLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    prompts_per_step, group_size, prompt_len = 8, 8, 256
    batch = prompts_per_step * group_size
    for step in range(1000):
        ids = act(batch * prompt_len * 8, None, torch.uint8)  # prompts.repeat_interleave(group_size, 0)
        completions, old_logps = generate_with_logprobs(model, ids, batch, prompt_len, max_new_tokens=512)
        optimizer.zero_grad(set_to_none=True)                   # (the GRPO update; never reached)
        optimizer.step()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
