"""Speculative decoding bolted onto an in-house paged-KV engine: the target's KV pool is sized for the whole
card before the draft model exists, then the draft's own KV cache does not fit (NVIDIA L40S 48 GB).

The team serves Llama-3.1-8B-Instruct behind an in-house engine (written before vLLM had speculative
decoding).  To cut latency someone adds a Llama-3.2-1B-Instruct draft model.  The real code:

    target = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                  torch_dtype=torch.bfloat16).cuda().eval()
    engine = LLMEngine(target, gpu_memory_utilization=0.95, block_size=16, max_num_batched_tokens=8192)
        # __init__: profile_run() with 8192 dummy tokens, peak = total - free at the peak,
        #           torch.cuda.empty_cache(), num_blocks = (0.95 * total - peak) // block_bytes,
        #           self.kv_cache = [(torch.empty(num_blocks, 16, 8, 128, dtype=bf16, device="cuda"),
        #                             torch.empty(...)) for _ in range(32)]
    draft = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B-Instruct",
                                                 torch_dtype=torch.bfloat16).cuda().eval()
    engine.enable_speculative(draft, num_speculative_tokens=5)
        # the draft gets a block table that mirrors the target's, so the same num_blocks:
        # self.draft_kv_cache = [(torch.empty(num_blocks, 16, 8, 64, ...), ...) for _ in range(16)]

Sizes (L40S: 46068 MiB = 44.99 GiB; CUDA context ~0.5 GiB):
  target weights  bf16 8.03 B params                         = 14.96 GiB
  profile peak    0.5 + 14.96 + ~0.97 GiB of 8192-token prefill activations = 16.43 GiB
                  (activations freed and the cache emptied afterwards)
  KV pool         0.95 * 44.99 - 16.43                       = 26.31 GiB = 13,471 blocks of 2 MiB
                  (16 tokens x 32 layers x K,V x 8 heads x 128 x 2 B), 64 tensors of 842 MiB
  left on card after the pool                                ~  3.0 GiB
  draft weights   bf16 1.24 B params                         =  2.30 GiB  -> ~0.7 GiB left
  draft KV        the same 13,471 blocks x 256 KiB (16 layers x K,V x 8 x 64 x 2 B) = 3.29 GiB, 32 tensors
                  of 210 MiB: the 4th one fails with 108 MiB free; ~2.9 GiB of it is still to come.
Everything on the card is live (weights, the target's preallocated KV pool, the draft's KV so far);
PyTorch's cache holds only ~0.2 GiB of slack inside partly used segments (the 8 MiB k/v projections
packed two to a 20 MiB segment), which empty_cache cannot return.

What an expert says first: the engine gave 95 % of the card to the target's KV pool before the draft
was loaded; size the pool with the draft in the budget (lower gpu_memory_utilization to ~0.88, or
compute num_blocks once for target + draft, bytes per block = 2 MiB + 256 KiB: ~11,970 blocks), i.e. a
smaller KV cache: ~3 GiB fewer target blocks still leaves ~190k tokens of KV.  Wrong advice:
expandable_segments or empty_cache (0.2 GiB of slack against ~2.9 GiB still needed), inference_mode,
autocast or checkpointing (a no-grad bf16 server already), killing other processes (there are none), a
smaller batch (nothing batch-sized fails).
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20


def _report_oom_truth(tp, value, tb):
    if issubclass(tp, torch.cuda.OutOfMemoryError):
        scen_truth.torch_oom_mark()
    sys.__excepthook__(tp, value, tb)


sys.excepthook = _report_oom_truth


class LlamaConfig(object):
    def __init__(self, name, vocab_size, hidden_size, intermediate_size, num_hidden_layers,
                 num_key_value_heads, head_dim, tie_word_embeddings):
        self.name_or_path = name
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.tie_word_embeddings = tie_word_embeddings


LLAMA_31_8B = LlamaConfig("meta-llama/Llama-3.1-8B-Instruct", 128256, 4096, 14336, 32, 8, 128, False)
LLAMA_32_1B = LlamaConfig("meta-llama/Llama-3.2-1B-Instruct", 128256, 2048, 8192, 16, 8, 64, True)


def _weight(numel):
    # from_pretrained(..., torch_dtype=torch.bfloat16).cuda(); frozen for serving
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LlamaAttention(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = _weight(h * h)
        self.k_proj = _weight(h * kv)
        self.v_proj = _weight(h * kv)
        self.o_proj = _weight(h * h)


class LlamaMLP(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _weight(h * i)
        self.up_proj = _weight(h * i)
        self.down_proj = _weight(i * h)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = _weight(cfg.hidden_size)
        self.post_attention_layernorm = _weight(cfg.hidden_size)

    def forward(self, hidden, num_tokens, cfg):
        # one layer's activations under inference_mode: freed as soon as the next op no longer needs them
        normed = torch.empty(num_tokens * cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
        qkv = torch.empty(num_tokens * (cfg.hidden_size + 2 * cfg.num_key_value_heads * cfg.head_dim),
                          dtype=torch.bfloat16, device="cuda")
        attn = torch.empty(num_tokens * cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
        del qkv
        gate_up = torch.empty(num_tokens * 2 * cfg.intermediate_size, dtype=torch.bfloat16, device="cuda")
        act = torch.empty(num_tokens * cfg.intermediate_size, dtype=torch.bfloat16, device="cuda")
        del gate_up, normed
        out = torch.empty(num_tokens * cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
        del act, attn, hidden
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        self.embed_tokens = _weight(cfg.vocab_size * cfg.hidden_size)
        self.layers = [LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.norm = _weight(cfg.hidden_size)
        if not cfg.tie_word_embeddings:
            self.lm_head = _weight(cfg.vocab_size * cfg.hidden_size)

    @classmethod
    def from_pretrained(cls, cfg):
        print("loading %s (bf16) ..." % cfg.name_or_path, flush=True)
        return cls(cfg).cuda().eval()

    def forward(self, num_tokens):
        cfg = self.config
        hidden = torch.empty(num_tokens * cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, num_tokens, cfg)
        # the sampler's logits: one row per sequence of the dummy batch (max_num_seqs=256), fp32
        logits = torch.empty(256 * cfg.vocab_size, dtype=torch.float32, device="cuda")
        return logits


class LLMEngine(object):
    """The in-house engine: paged KV cache, continuous batching (scheduler not shown)."""

    def __init__(self, model, gpu_memory_utilization=0.90, block_size=16, max_num_batched_tokens=8192):
        self.model = model
        self.block_size = block_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_num_batched_tokens = max_num_batched_tokens
        self.num_blocks = self.determine_num_blocks()
        self.kv_cache = self.allocate_kv_cache(model.config, self.num_blocks)
        self.draft = None
        self.draft_kv_cache = None

    def block_bytes(self, cfg):
        return self.block_size * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2

    def profile_run(self):
        """A dummy prefill of max_num_batched_tokens; returns the device memory in use at its peak."""
        free, total = torch.cuda.mem_get_info()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        with torch.inference_mode():
            logits = self.model(self.max_num_batched_tokens)
            del logits
        activation_peak = torch.cuda.max_memory_allocated() - before
        return (total - free) + activation_peak, total

    def determine_num_blocks(self):
        peak, total = self.profile_run()
        torch.cuda.empty_cache()
        available = int(total * self.gpu_memory_utilization) - peak
        num_blocks = available // self.block_bytes(self.model.config)
        print("profile: peak %.2f GiB of %.2f GiB; KV cache %.2f GiB = %d blocks (%d tokens)"
              % (peak / GiB, total / GiB, available / GiB, num_blocks, num_blocks * self.block_size), flush=True)
        return num_blocks

    def allocate_kv_cache(self, cfg, num_blocks):
        per_layer = num_blocks * self.block_size * cfg.num_key_value_heads * cfg.head_dim
        cache = []
        for _ in range(cfg.num_hidden_layers):
            k = torch.empty(per_layer, dtype=torch.bfloat16, device="cuda")
            v = torch.empty(per_layer, dtype=torch.bfloat16, device="cuda")
            cache.append((k, v))
        return cache

    def enable_speculative(self, draft, num_speculative_tokens=5):
        """Draft-then-verify: the draft proposes num_speculative_tokens per step; its block table mirrors the
        target's, so its KV cache has the same number of blocks."""
        self.draft = draft
        self.num_speculative_tokens = num_speculative_tokens
        self.draft_kv_cache = self.allocate_kv_cache(draft.config, self.num_blocks)
        print("speculative decoding on: %s drafts %d tokens" % (draft.config.name_or_path, num_speculative_tokens))


def build_engine():
    target = LlamaForCausalLM.from_pretrained(LLAMA_31_8B)
    engine = LLMEngine(target, gpu_memory_utilization=0.95, block_size=16, max_num_batched_tokens=8192)
    draft = LlamaForCausalLM.from_pretrained(LLAMA_32_1B)
    engine.enable_speculative(draft, num_speculative_tokens=5)
    return engine


def main():
    engine = build_engine()
    print("engine ready: %d KV blocks" % engine.num_blocks)


if __name__ == "__main__":
    main()
