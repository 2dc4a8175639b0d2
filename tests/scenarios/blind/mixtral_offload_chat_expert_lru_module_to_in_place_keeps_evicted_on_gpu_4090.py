"""serve_mixtral.py -- a two-person team's internal "ask the codebase" assistant: Mixtral-8x7B-Instruct on
one RTX 4090 (24 GB) in a workstation with 128 GB of RAM, with its own MoE offloading written after the
mixtral-offloading paper.  Everything that is not an expert (attention, norms, routers, embeddings, lm_head:
1.6B parameters) lives on the GPU in fp16 (3.2 GB); the 256 experts (32 layers x 8) are kept 4-bit (bnb nf4,
~91 MB each, 23 GB in all) in pinned host memory, and a per-process LRU of 128 experts on the GPU (11.6 GB)
is meant to serve the hot ones:

    class ExpertLRU:
        def fetch(self, layer, e):
            ...
            gpu = self.cpu_experts[(layer, e)].to("cuda", non_blocking=True)
            self.lru[(layer, e)] = gpu
            if len(self.lru) > self.capacity:
                self.lru.popitem(last=False)          # evict the least recently used expert
            return gpu

The offloader was written and tested on the team's A100 80GB dev box, where all 256 quantized experts fit
anyway.  nn.Module.to() is not Tensor.to(): it moves the module's parameters IN PLACE and returns the same
module.  So `gpu` is the very object kept in self.cpu_experts; popping it from the LRU drops one of two
references and frees nothing: every expert ever fetched stays on the GPU, held by the dict of "CPU" experts.
On the 4090 the first real question (a 1,900-token prompt of pasted code) is prefilled layer by layer, each
layer routes its tokens to all 8 of its experts, the LRU says 128 entries while memory_allocated() keeps
climbing, and in layer 28 (the 29th of 32) the fetch of the next expert's 28 MiB of nf4 weights fails:
227 experts on the GPU (19.2 GiB, 99 more than the LRU's 128) + 3 GiB of dense weights + the 1 GiB KV cache.

An expert: the eviction does not release anything because Module.to moved the host copy to the GPU in place
and the host dict still refers to it.  Make the GPU copy a separate object (copy the expert's tensors into
GPU buffers, or deep-copy before .to) and let eviction drop the only reference -- or move the evicted module
back with .to("cpu") -- so the cache is really bounded at 128.  Wrong first advice: quantize further (the
experts are already 4-bit; the cache would still grow without bound), a smaller KV cache or batch (1 GB,
not the problem), inference_mode (already on), "offload to CPU" (that is what it tries to do),
expandable_segments / empty_cache (every byte is live), a bigger GPU (only the dev box hid the bug).
"""
import collections
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
HIDDEN, FFN, LAYERS, N_EXPERTS, VOCAB = 4096, 14336, 32, 8, 32000
KV_HEADS, HEAD_DIM = 8, 128


class HostTensor(object):
    """A tensor in pinned host memory (the stand-in torch has only device tensors): its bytes, no more."""
    is_cuda = False

    def __init__(self, nbytes):
        self.nbytes = nbytes


class Linear4bit(torch.nn.Module):
    """bitsandbytes.nn.Linear4bit as far as memory goes: nf4 weight bytes (0.5 B/param) and the quant state
    (absmax, double-quantized: ~0.13 B per 64-value block of fp32 scales).  .to() mirrors nn.Module.to:
    the parameters are replaced by device copies IN PLACE and the module itself is returned."""

    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        n = in_features * out_features
        self.weight = HostTensor(n // 2)
        self.absmax = HostTensor(n // 64 + n // (64 * 256) * 4)

    def to(self, device=None, non_blocking=False):
        if device is not None and str(device).startswith("cuda"):
            host = self.__dict__.pop("weight", None)
            if host is not None:
                self.weight = torch.nn.Parameter(torch.empty(host.nbytes, dtype=torch.uint8, device="cuda"),
                                                 requires_grad=False)
            host = self.__dict__.pop("absmax", None)
            if host is not None:
                self.register_buffer("absmax", torch.empty(host.nbytes, dtype=torch.uint8, device="cuda"))
        return self


class MixtralBlockSparseTop2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w1 = Linear4bit(HIDDEN, FFN)
        self.w2 = Linear4bit(FFN, HIDDEN)
        self.w3 = Linear4bit(HIDDEN, FFN)

    def to(self, device=None, non_blocking=False):      # nn.Module.to: in place, returns self
        for m in (self.w1, self.w3, self.w2):
            m.to(device, non_blocking=non_blocking)
        return self

    def forward(self, n_tokens):
        h1 = torch.empty(n_tokens * FFN, dtype=torch.float16, device="cuda")
        h3 = torch.empty(n_tokens * FFN, dtype=torch.float16, device="cuda")
        del h1
        out = torch.empty(n_tokens * HIDDEN, dtype=torch.float16, device="cuda")
        del h3
        return out


class ExpertLRU(object):
    """GPU cache of experts, least recently used evicted first."""

    def __init__(self, cpu_experts, capacity):
        self.cpu_experts = cpu_experts
        self.capacity = capacity
        self.lru = collections.OrderedDict()
        self.hits = self.misses = 0

    def fetch(self, layer, e):
        key = (layer, e)
        if key in self.lru:
            self.lru.move_to_end(key)
            self.hits += 1
            return self.lru[key]
        self.misses += 1
        gpu = self.cpu_experts[key].to("cuda", non_blocking=True)
        self.lru[key] = gpu
        if len(self.lru) > self.capacity:
            self.lru.popitem(last=False)
        return gpu


def fp16(n_params):
    return torch.nn.Parameter(torch.empty(n_params, dtype=torch.float16, device="cuda"), requires_grad=False)


class MixtralAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = fp16(HIDDEN * HIDDEN)
        self.k_proj = fp16(HIDDEN * KV_HEADS * HEAD_DIM)
        self.v_proj = fp16(HIDDEN * KV_HEADS * HEAD_DIM)
        self.o_proj = fp16(HIDDEN * HIDDEN)

    def forward(self, n_tokens):
        qkv = torch.empty(n_tokens * (HIDDEN + 2 * KV_HEADS * HEAD_DIM), dtype=torch.float16, device="cuda")
        out = torch.empty(n_tokens * HIDDEN, dtype=torch.float16, device="cuda")
        del qkv
        return out


class OffloadedSparseMoeBlock(torch.nn.Module):
    def __init__(self, layer, cache):
        torch.nn.Module.__init__(self)
        self.layer = layer
        self.gate = fp16(HIDDEN * N_EXPERTS)
        self.cache = cache

    def forward(self, n_tokens, routing):
        out = torch.empty(n_tokens * HIDDEN, dtype=torch.float16, device="cuda")
        for e, n_e in enumerate(routing):
            if n_e == 0:
                continue
            expert = self.cache.fetch(self.layer, e)
            y = expert(n_e)
            del y
        return out


class DecoderLayer(torch.nn.Module):
    def __init__(self, layer, cache):
        torch.nn.Module.__init__(self)
        self.input_layernorm = fp16(HIDDEN)
        self.self_attn = MixtralAttention()
        self.post_attention_layernorm = fp16(HIDDEN)
        self.block_sparse_moe = OffloadedSparseMoeBlock(layer, cache)

    def forward(self, n_tokens, routing):
        a = self.self_attn(n_tokens)
        m = self.block_sparse_moe(n_tokens, routing)
        del a
        return m


class OffloadedMixtral(torch.nn.Module):
    def __init__(self, cache, max_cache_len):
        torch.nn.Module.__init__(self)
        self.embed_tokens = fp16(VOCAB * HIDDEN)
        self.layers = [DecoderLayer(i, cache) for i in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer_%d" % i, l)
        self.norm = fp16(HIDDEN)
        self.lm_head = fp16(VOCAB * HIDDEN)
        # static KV cache, preallocated for one conversation of up to max_cache_len tokens
        self.kv = torch.empty(LAYERS * 2 * max_cache_len * KV_HEADS * HEAD_DIM, dtype=torch.float16, device="cuda")

    def forward(self, n_tokens, routings):
        h = torch.empty(n_tokens * HIDDEN, dtype=torch.float16, device="cuda")
        for layer, routing in zip(self.layers, routings):
            h = layer(n_tokens, routing)
        logits = torch.empty(VOCAB * 2, dtype=torch.float16, device="cuda")    # last position only
        return logits


def route(n_tokens, layer, step):
    """Token counts per expert for one layer (top-2 of 8).  Mixtral spreads its tokens: with more than a
    handful of tokens every expert of a layer is chosen (the stand-in computes no router)."""
    picks = 2 * n_tokens
    weights = [((layer * 7 + e * 13 + step * 3) % 11) + 4 for e in range(N_EXPERTS)]
    total = float(sum(weights))
    counts = [int(picks * w / total) for w in weights]
    counts[0] += picks - sum(counts)
    if n_tokens == 1:       # a decode step: two experts
        top = sorted(range(N_EXPERTS), key=lambda e: -weights[e])[:2]
        counts = [1 if e in top else 0 for e in range(N_EXPERTS)]
    return counts


class Assistant(object):
    def __init__(self):
        cpu_experts = {}
        for layer in range(LAYERS):
            for e in range(N_EXPERTS):
                cpu_experts[(layer, e)] = MixtralBlockSparseTop2MLP()
        self.cache = ExpertLRU(cpu_experts, capacity=128)
        self.model = OffloadedMixtral(self.cache, max_cache_len=8192)
        print("dense weights + KV cache on GPU: %.2f GiB" % (torch.cuda.memory_allocated() / float(1 << 30)))

    def generate(self, prompt_tokens, max_new_tokens):
        with torch.inference_mode():
            logits = self.model(prompt_tokens, [route(prompt_tokens, l, 0) for l in range(LAYERS)])
            for step in range(1, max_new_tokens + 1):
                logits = self.model(1, [route(1, l, step) for l in range(LAYERS)])
        return max_new_tokens


def main():
    bot = Assistant()
    # the first real questions of the morning: pasted code + a question
    for prompt_tokens, max_new in ((1900, 400), (2600, 600), (1200, 300)):
        n = bot.generate(prompt_tokens, max_new)
        print("answered %d tokens; LRU holds %d experts (hits %d, misses %d); allocated %.2f GiB"
              % (n, len(bot.cache.lru), bot.cache.hits, bot.cache.misses,
                 torch.cuda.memory_allocated() / float(1 << 30)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
