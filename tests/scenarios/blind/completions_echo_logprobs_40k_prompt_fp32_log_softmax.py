"""score_api.py -- a small OpenAI-compatible /v1/completions endpoint we run for the evaluation team on
one L40S (48 GB; 44.99 GiB as torch reports it): Llama-3.1-8B-Instruct in bf16 (15 GiB) with plain
transformers.  The team uses it to score documents: echo=True, logprobs=1, max_tokens=0, i.e. the
log-probability of every prompt token.  The handler:

    @torch.inference_mode()
    def prompt_logprobs(input_ids):
        out = model(input_ids)                                         # logits for every position
        logprobs = F.log_softmax(out.logits, dim=-1, dtype=torch.float32)
        return logprobs.gather(-1, input_ids[:, 1:, None]), logprobs.topk(1)

For months the prompts were a few thousand tokens.  Then someone scored a whole contract: one request
of 40,448 tokens (Llama 3.1 takes 128k, so nothing refused it).  The forward pass goes through (SDPA
attention, the KV cache for 40k tokens is 5 GiB), the bf16 logits over the 128,256-token vocabulary
are 9.7 GiB, and the float32 log_softmax asks for 19.3 GiB more with 14.2 GiB free.  The same server
then answers the next normal request as before: this one request is the peak.

An expert: the job needs one number per token, yet materialises the full [40k x 128k] distribution
twice (bf16 logits, fp32 log-probs).  Compute it in chunks of positions -- take the hidden states
(or only the logits a chunk needs), and run lm_head + log_softmax + gather per 2k positions, i.e. a
chunked/fused cross-entropy -- and drop the KV cache the scoring pass never uses (use_cache=False).
Capping the prompt length for echo requests would also do, at a price.  Not a smaller batch (it is
one sequence), not gradient checkpointing or inference_mode (no autograd here), not quantizing the
weights (15 GiB of weights are not what overflows), not expandable_segments or empty_cache.
"""
import sys

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, VOCAB = 4096, 14336, 32, 128256
KV_PER_TOKEN = 8 * 128                      # per layer, K or V (8 KV heads x 128), bf16


def bf16_param(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = bf16_param(416 * MiB)

    def forward(self, hidden, tokens, past):
        past.key_cache.append(torch.empty(tokens * KV_PER_TOKEN, dtype=torch.bfloat16, device="cuda"))
        past.value_cache.append(torch.empty(tokens * KV_PER_TOKEN, dtype=torch.bfloat16, device="cuda"))
        gate = torch.empty(tokens * INTER, dtype=torch.bfloat16, device="cuda")
        up = torch.empty(tokens * INTER, dtype=torch.bfloat16, device="cuda")
        del gate, up
        return torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_param(VOCAB * HIDDEN * 2)
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, LlamaDecoderLayer())
        self.lm_head = bf16_param(VOCAB * HIDDEN * 2)

    def forward(self, input_ids, use_cache=True):
        tokens = input_ids
        past = DynamicCache()
        hidden = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self, "layer_%d" % i)(hidden, tokens, past)
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device="cuda")   # every position
        return CausalLMOutputWithPast(logits, past)


model = LlamaForCausalLM().eval()


def prompt_logprobs(input_ids):
    with torch.inference_mode():
        out = model(input_ids)
        logprobs = F.log_softmax(out.logits, dim=-1, dtype=torch.float32)
        return logprobs.nbytes


def main():
    # the day's scoring requests (prompt lengths in tokens); the contract is the fourth
    for n_tokens in (1830, 3120, 2480, 40448, 2950):
        prompt_logprobs(n_tokens)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
