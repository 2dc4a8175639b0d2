"""chat_service.py -- a multi-tenant "assistant builder" API: Llama-2-13B-chat in bf16 (24.2 GiB) on one
A100 40GB (39.4 GiB as torch reports it), plain Hugging Face transformers behind FastAPI.  Each tenant
has its own long system prompt with few-shot examples (1,100-2,400 tokens).  To skip that prefill on every request we cache each
tenant's past_key_values after its first request:

    class ChatService:
        def __init__(self):
            self.prefix_cache = {}                       # tenant_id -> DynamicCache of the system prompt
        @torch.inference_mode()
        def reply(self, tenant, messages):
            if tenant not in self.prefix_cache:
                out = self.model(prefix_ids[tenant], use_cache=True)
                self.prefix_cache[tenant] = out.past_key_values
            past = copy.deepcopy(self.prefix_cache[tenant])   # generate() extends it in place
            return self.model.generate(..., past_key_values=past, max_new_tokens=256)
            # (then del past; torch.cuda.empty_cache() after every request)

Llama-2-13B has no grouped-query attention: 40 layers x 40 heads x 128 x 2 (K and V) x 2 bytes = 800
KiB per token, so one tenant's prefix is 0.9-1.9 GiB.  In staging (three tenants) it ran for weeks.  In
production tenants keep arriving and the dict is never trimmed: after eleven tenants 13.4 GiB of the
14.6 GiB left beside the weights are cached prefixes, and the prefill of the twelfth tenant's system
prompt (2,400 tokens) fails.  Every request alone needs at most 4 GiB.

An expert: the cache of tensors on the GPU has no bound -- give it one (an LRU of a few entries, a byte
budget, evict or move cold prefixes to CPU; or a serving engine's paged prefix caching, which evicts).
Not a smaller batch (one request at a time), not quantizing the weights or a bigger card first (the
cache would fill any card), not empty_cache or expandable_segments (the memory is live, not cached
or fragmented), not inference_mode (already on).
"""
import copy
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, LAYERS, VOCAB = 5120, 40, 32000
KV_ELEMS_PER_TOKEN = 40 * 128              # per layer, K or V (bf16)


def bf16_param(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class DynamicCache(object):
    """transformers' DynamicCache: a key and a value tensor per layer."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def update(self, k, v, layer_idx):
        self.key_cache.append(k)
        self.value_cache.append(v)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = bf16_param(605 * MiB)

    def forward(self, hidden, past, layer_idx, tokens):
        k = torch.empty(tokens * KV_ELEMS_PER_TOKEN, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(tokens * KV_ELEMS_PER_TOKEN, dtype=torch.bfloat16, device="cuda")
        past.update(k, v, layer_idx)
        return torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_param(VOCAB * HIDDEN * 2)
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = bf16_param(VOCAB * HIDDEN * 2)

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        tokens = input_ids
        past = past_key_values if past_key_values is not None else DynamicCache()
        hidden = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, past, i, tokens)
        logits = torch.empty(VOCAB * 4, device="cuda")                              # last position only
        return CausalLMOutputWithPast(logits, past)

    def generate(self, input_ids, past_key_values=None, max_new_tokens=256):
        for step in range(4):                                                      # (a few decode steps)
            logits = torch.empty(VOCAB * 4, device="cuda")
        return [0] * max_new_tokens


class ChatService(object):
    def __init__(self):
        self.model = LlamaForCausalLM().eval()
        self.prefix_cache = {}                        # tenant_id -> DynamicCache of its system prompt
        self.prefix_ids = {}

    def reply(self, tenant, user_tokens):
        with torch.inference_mode():
            if tenant not in self.prefix_cache:
                self.prefix_cache[tenant] = self.model(self.prefix_ids[tenant], use_cache=True).past_key_values
            past = copy.deepcopy(self.prefix_cache[tenant])
            text = self.model.generate(user_tokens, past_key_values=past, max_new_tokens=256)
        del past
        torch.cuda.empty_cache()                      # "keep memory tidy between requests"
        return text


def main():
    svc = ChatService()
    lengths = [1536, 1180, 1990, 1340, 1741, 1946, 1843, 1420, 1638, 1228, 1127, 2400, 1380]
    for i, n in enumerate(lengths):
        svc.prefix_ids["tenant-%03d" % i] = n
    # the morning's traffic: known tenants come back, new ones sign up
    traffic = [0, 1, 0, 2, 1, 3, 0, 2, 4, 5, 3, 1, 6, 0, 7, 2, 8, 5, 9, 4, 1, 10, 1, 9, 11, 12]
    for t in traffic:
        svc.reply("tenant-%03d" % t, 64)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
