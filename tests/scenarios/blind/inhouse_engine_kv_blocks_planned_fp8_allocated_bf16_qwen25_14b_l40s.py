"""A team's in-house serving engine (a trimmed fork of an old vLLM worker: paged KV pool, continuous batching)
serves Qwen2.5-14B-Instruct in bf16 on one NVIDIA L40S (48 GB, 44.99 GiB usable) for a RAG product.  Long
retrieved contexts made them short of KV space, so they turned on the fp8 KV cache that their sizing code had
learned to count:

    # engine/cache_engine.py (the fork)
    @staticmethod
    def get_cache_block_size(cache_config, model_config):
        elem = 1 if cache_config.cache_dtype.startswith("fp8") else model_config.dtype.itemsize
        return cache_config.block_size * model_config.num_kv_heads * model_config.head_dim * 2 * elem * num_layers

    def _allocate_kv_cache(self, num_blocks):
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        return [torch.empty(shape, dtype=self.model_config.dtype, device="cuda")   # <- not the cache dtype
                for _ in range(self.num_layers)]

The worker profiles a dummy 8192-token batch, takes gpu_memory_utilization x total minus the peak as the KV
budget, divides it by the fp8 block size and allocates the pool -- in bf16, two bytes per element.

Sizes: weights 14.77 B params x 2 B = 27.5 GiB, context ~0.5 GiB, profiled activation peak ~1.1 GiB above the
weights.  Budget: 0.90 x 44.99 - 28.0 - 1.1 = ~11.6 GiB.  fp8 block: 16 tokens x 8 KV heads x 128 x 2 (K, V)
x 1 B x 48 layers = 1.5 MiB -> ~7,950 blocks (127k tokens).  Allocated in bf16 each layer's tensor is
7,950 x 64 KiB = 497 MiB, 23.3 GiB for the 48 layers: twice the budget, with ~16.6 GiB free.  The engine dies at
startup part way through the layers (layer 35 of 48) with "Tried to allocate 496.62 MiB".

What an expert says first: the KV pool is a fixed allocation twice the size it was planned at: allocate it in
the cache dtype (torch.float8_e4m3fn) so it matches the plan, or size it for what it allocates -- a smaller KV
cache (lower gpu_memory_utilization / num_gpu_blocks_override, or kv_cache_dtype auto with half the blocks).
Wrong advice: empty_cache or expandable_segments (nothing cached, nothing fragmented: the profile's cache was
emptied), a smaller batch or shorter sequences (the pool's size does not depend on them), inference_mode,
gradient checkpointing or mixed precision (no training), quantizing the weights or a bigger card (they would
hide a pool that is still twice its plan).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1024 ** 3


class ModelConfig(object):
    """Qwen/Qwen2.5-14B-Instruct config.json, as the engine reads it."""
    dtype = BF16
    dtype_itemsize = 2
    hidden_size = 5120
    intermediate_size = 13824
    num_layers = 48
    num_heads = 40
    num_kv_heads = 8
    head_dim = 128
    vocab_size = 152064


class CacheConfig(object):
    block_size = 16
    gpu_memory_utilization = 0.90
    cache_dtype = "fp8_e4m3"        # was "auto" until the long-context RAG tenants came


class SchedulerConfig(object):
    max_num_batched_tokens = 8192
    max_num_seqs = 128


def linear(x, out_features, num_tokens):
    return torch.empty(num_tokens * out_features, dtype=BF16)


class Qwen2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Parameter(torch.empty(cfg.hidden_size * cfg.num_heads * cfg.head_dim + cfg.num_heads * cfg.head_dim, dtype=BF16), requires_grad=False)
        self.k_proj = nn.Parameter(torch.empty(cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim + cfg.num_kv_heads * cfg.head_dim, dtype=BF16), requires_grad=False)
        self.v_proj = nn.Parameter(torch.empty(cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim + cfg.num_kv_heads * cfg.head_dim, dtype=BF16), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(cfg.num_heads * cfg.head_dim * cfg.hidden_size, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, num_tokens, kv_cache):
        c = self.cfg
        qkv = linear(hidden_states, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, num_tokens)
        out = torch.empty(num_tokens * c.num_heads * c.head_dim, dtype=BF16)    # paged attention
        del qkv
        return linear(out, c.hidden_size, num_tokens)


class Qwen2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gate_up_proj = nn.Parameter(torch.empty(cfg.hidden_size * 2 * cfg.intermediate_size, dtype=BF16), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(cfg.intermediate_size * cfg.hidden_size, dtype=BF16), requires_grad=False)

    def forward(self, x, num_tokens):
        gate_up = linear(x, 2 * self.cfg.intermediate_size, num_tokens)
        h = torch.empty(num_tokens * self.cfg.intermediate_size, dtype=BF16)   # SiluAndMul
        del gate_up
        return linear(h, self.cfg.hidden_size, num_tokens)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Qwen2Attention(cfg)
        self.mlp = Qwen2MLP(cfg)
        self.input_layernorm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=BF16), requires_grad=False)
        self.post_attention_layernorm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, num_tokens, kv_cache):
        h = self.self_attn(hidden_states, num_tokens, kv_cache)
        return self.mlp(h, num_tokens)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size * cfg.hidden_size, dtype=BF16), requires_grad=False)
        self.layers = nn.Module()
        for i in range(cfg.num_layers):
            setattr(self.layers, str(i), Qwen2DecoderLayer(cfg))
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size, dtype=BF16), requires_grad=False)
        self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size * cfg.hidden_size, dtype=BF16), requires_grad=False)

    def forward(self, num_tokens, num_seqs, kv_caches):
        hidden_states = torch.empty(num_tokens * self.cfg.hidden_size, dtype=BF16)
        for i in range(self.cfg.num_layers):
            hidden_states = getattr(self.layers, str(i))(hidden_states, num_tokens, kv_caches[i])
        logits = torch.empty(num_seqs * self.cfg.vocab_size * 4)     # sampler: float32 logits of the last tokens
        probs = torch.empty(num_seqs * self.cfg.vocab_size * 4)
        del hidden_states
        return logits, probs


class CacheEngine(object):
    def __init__(self, cache_config, model_config, num_gpu_blocks):
        self.block_size = cache_config.block_size
        self.num_kv_heads = model_config.num_kv_heads
        self.head_dim = model_config.head_dim
        self.num_layers = model_config.num_layers
        self.model_config = model_config
        self.cache_dtype = cache_config.cache_dtype
        self.num_gpu_blocks = num_gpu_blocks
        self.gpu_cache = self._allocate_kv_cache(num_gpu_blocks)

    def _allocate_kv_cache(self, num_blocks):
        numel = 2 * num_blocks * self.block_size * self.num_kv_heads * self.head_dim
        kv_cache = []
        for _ in range(self.num_layers):
            kv_cache.append(torch.empty(numel, dtype=self.model_config.dtype, device="cuda"))
        return kv_cache

    @staticmethod
    def get_cache_block_size(cache_config, model_config):
        elem = 1 if cache_config.cache_dtype.startswith("fp8") else model_config.dtype_itemsize
        per_layer = cache_config.block_size * model_config.num_kv_heads * model_config.head_dim * 2 * elem
        return per_layer * model_config.num_layers


class Worker(object):
    def __init__(self, model_config, cache_config, scheduler_config):
        self.model_config, self.cache_config, self.scheduler_config = model_config, cache_config, scheduler_config
        self.model = None
        self.cache_engine = None

    def load_model(self):
        self.model = Qwen2ForCausalLM(self.model_config)
        self.model.eval()

    def determine_num_available_blocks(self):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            self.model(self.scheduler_config.max_num_batched_tokens, self.scheduler_config.max_num_seqs,
                       [None] * self.model_config.num_layers)
        free, total = torch.cuda.mem_get_info()
        peak = torch.cuda.max_memory_allocated()
        non_torch = (total - free) - torch.cuda.memory_reserved()
        available = int(total * self.cache_config.gpu_memory_utilization) - peak - non_torch
        block_bytes = CacheEngine.get_cache_block_size(self.cache_config, self.model_config)
        torch.cuda.empty_cache()
        return max(available // block_bytes, 0)

    def initialize_cache(self, num_gpu_blocks):
        self.cache_engine = CacheEngine(self.cache_config, self.model_config, num_gpu_blocks)


class LLMEngine(object):
    def __init__(self):
        self.worker = Worker(ModelConfig(), CacheConfig(), SchedulerConfig())
        self.worker.load_model()
        num_gpu_blocks = self.worker.determine_num_available_blocks()
        print("# GPU blocks: %d (%d tokens of KV, %s)" % (num_gpu_blocks, num_gpu_blocks * CacheConfig.block_size,
                                                         CacheConfig.cache_dtype))
        self.worker.initialize_cache(num_gpu_blocks)


def main():
    engine = LLMEngine()
    return engine


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
