"""GRPO on math with a handwritten loop and Hugging Face generate(): 8 prompts x 16 sampled completions per
step, max_new_tokens=16384 "so long chains of thought are not cut", and cache_implementation="static" (set
to make decoding torch.compile-friendly).  The static cache is allocated for the full 128 x 17,408 tokens
before the first token is sampled.  Qwen2.5-7B-Instruct + LoRA, one H100 80GB.

The real code (transformers 4.46, peft 0.13):

    policy = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16,
                                                  attn_implementation="sdpa").cuda()
    policy = get_peft_model(policy, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear"))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    gen_cfg = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=16384,
                               num_return_sequences=16, cache_implementation="static",
                               pad_token_id=tok.pad_token_id)
    for step, prompts in enumerate(prompt_loader):                          # 8 prompts a step
        enc = tok(prompts, padding="max_length", max_length=1024, padding_side="left",
                  return_tensors="pt").to("cuda")
        completions = policy.generate(**enc, generation_config=gen_cfg)    # @torch.no_grad inside
        rewards = torch.tensor([math_verify(c, a) for c, a in zip(decode(completions), answers)])
        advantages = (rewards - group_mean) / (group_std + 1e-4)
        ... per-token log-probs, clipped GRPO loss, backward, optimizer.step()

What happens: step 0 dies inside generate(), in StaticCache's constructor, on the 16th layer's key cache,
before any token is produced.  No optimizer step has run.

The arithmetic:
  * weights bf16: 7.62 G parameters (untied lm_head) = 14.19 GiB; LoRA r=32 on all linear layers, fp32,
    81 M parameters = 0.30 GiB.  CUDA context 0.5 GiB.
  * static cache: batch 8 x 16 = 128 sequences, max_cache_len = 1,024 prompt + 16,384 new = 17,408.
    Qwen2.5-7B has 28 layers, 4 KV heads of 128: one layer's K (or V) = 128 x 4 x 17,408 x 128 x 2 B =
    2.125 GiB; K and V for 28 layers = 119 GiB, allocated up front whatever the completions' real lengths
    (most GRPO math completions end after 1-3 k tokens).
  * 80 - 0.5 - 14.5 = 65 GiB free: 30 of the 56 cache tensors fit, the 31st (layer 15's key cache,
    2.125 GiB) does not.

What an expert says: the KV cache is sized for the worst case of the whole group at once.  Drop the static
cache (default dynamic cache grows with the tokens really produced), and above all generate the 128
completions in chunks (e.g. 16 or 32 sequences per generate call: 15-30 GiB of cache at the worst case) and/or
lower max_new_tokens -- or hand generation to vLLM, whose paged cache allocates per block of tokens.  Wrong
advice: gradient checkpointing or mixed precision (no backward runs here, the weights are already bf16),
inference_mode / no_grad (generate() already runs without autograd), flash-attention (does not shrink the
cache), empty_cache / expandable_segments (nothing is cached, the cache is live), quantizing the weights
(14 GiB of 135 GiB needed).
"""
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "Qwen/Qwen2.5-7B-Instruct"
PROMPTS_PER_STEP = 8
NUM_GENERATIONS = 16
MAX_PROMPT_LENGTH = 1024
MAX_NEW_TOKENS = 16384
LORA_R = 32


class Qwen2Config(object):
    hidden_size = 3584
    intermediate_size = 18944
    num_hidden_layers = 28
    num_attention_heads = 28
    num_key_value_heads = 4
    head_dim = 128
    vocab_size = 152064


class GenerationConfig(object):
    def __init__(self, **kw):
        self.do_sample = True
        self.temperature = 1.0
        self.max_new_tokens = 20
        self.num_return_sequences = 1
        self.cache_implementation = None
        self.__dict__.update(kw)


# ---------------------------------------------------------------- modeling (transformers + peft, as loaded)
class LoraLinear(nn.Module):
    """peft's lora.Linear: frozen bf16 base weight, trainable fp32 lora_A / lora_B."""

    def __init__(self, n_in, n_out, bias=False):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.base_layer = nn.Module()
        self.base_layer.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16), requires_grad=False)
        if bias:
            self.base_layer.bias = nn.Parameter(torch.empty(n_out, dtype=torch.bfloat16), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(n_in * LORA_R, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.empty(LORA_R * n_out, dtype=torch.float32))

    def forward(self, x):
        out = torch.empty(x.nbytes // (2 * self.n_in) * self.n_out, dtype=torch.bfloat16)
        out._saved = x
        return out


class Qwen2Attention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        kv = cfg.num_key_value_heads * cfg.head_dim
        self.layer_idx = layer_idx
        self.q_proj = LoraLinear(cfg.hidden_size, cfg.hidden_size, bias=True)
        self.k_proj = LoraLinear(cfg.hidden_size, kv, bias=True)
        self.v_proj = LoraLinear(cfg.hidden_size, kv, bias=True)
        self.o_proj = LoraLinear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden_states, past_key_value=None):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        attn = torch.empty_like(q)
        attn._saved = (q, k, v)
        return self.o_proj(attn)


class Qwen2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = LoraLinear(cfg.hidden_size, cfg.intermediate_size)
        self.up_proj = LoraLinear(cfg.hidden_size, cfg.intermediate_size)
        self.down_proj = LoraLinear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x):
        return self.down_proj(self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg, i):
        super().__init__()
        self.self_attn = Qwen2Attention(cfg, i)
        self.mlp = Qwen2MLP(cfg)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.empty(cfg.hidden_size, dtype=torch.bfloat16),
                                                   requires_grad=False)
        self.post_attention_layernorm = nn.Module()
        self.post_attention_layernorm.weight = nn.Parameter(torch.empty(cfg.hidden_size, dtype=torch.bfloat16),
                                                            requires_grad=False)

    def forward(self, hidden_states, past_key_value=None):
        return self.mlp(self.self_attn(hidden_states, past_key_value))


class StaticCache(object):
    """transformers.StaticCache: one K and one V tensor per layer of shape
    (max_batch_size, num_key_value_heads, max_cache_len, head_dim), allocated (zeroed) up front."""

    def __init__(self, config, max_batch_size, max_cache_len, device="cuda", dtype=torch.bfloat16):
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        cache_numel = max_batch_size * config.num_key_value_heads * max_cache_len * config.head_dim
        self.key_cache = []
        self.value_cache = []
        for idx in range(config.num_hidden_layers):
            new_layer_key_cache = torch.empty(cache_numel, dtype=dtype, device=device)     # torch.zeros(cache_shape)
            new_layer_value_cache = torch.empty(cache_numel, dtype=dtype, device=device)
            self.key_cache.append(new_layer_key_cache)
            self.value_cache.append(new_layer_value_cache)


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.generation_config = GenerationConfig()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.empty(cfg.vocab_size * cfg.hidden_size,
                                                                  dtype=torch.bfloat16), requires_grad=False)
        self.model.layers = [Qwen2DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)]
        for i, layer in enumerate(self.model.layers):
            setattr(self.model, "layer_%d" % i, layer)
        self.lm_head = nn.Module()
        self.lm_head.weight = nn.Parameter(torch.empty(cfg.vocab_size * cfg.hidden_size, dtype=torch.bfloat16),
                                           requires_grad=False)

    def forward(self, input_ids, attention_mask=None, past_key_values=None):
        tokens = input_ids.nbytes // 8
        h = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16)
        for layer in self.model.layers:
            h = layer(h, past_key_values)
        rows = input_ids.shape[0]
        logits = torch.empty(rows * self.config.vocab_size, dtype=torch.float32)   # last position only
        logits._saved = h
        return {"logits": logits, "past_key_values": past_key_values}

    def _prepare_cache_for_generation(self, generation_config, batch_size, max_cache_len):
        if generation_config.cache_implementation == "static":
            return StaticCache(self.config, max_batch_size=batch_size, max_cache_len=max_cache_len,
                               device="cuda", dtype=torch.bfloat16)
        return DynamicCache()

    def generate(self, input_ids, attention_mask=None, generation_config=None):
        """GenerationMixin.generate (decorated with @torch.no_grad() in transformers)."""
        with torch.no_grad():
            generation_config = generation_config or self.generation_config
            num_return_sequences = generation_config.num_return_sequences
            prompts, prompt_len = input_ids.shape
            batch_size = prompts * num_return_sequences
            # _expand_inputs_for_generation: every prompt repeated num_return_sequences times
            input_ids = torch.empty(batch_size * prompt_len * 8)
            input_ids.shape = (batch_size, prompt_len)
            attention_mask = torch.empty(batch_size * prompt_len * 8)
            max_cache_len = prompt_len + generation_config.max_new_tokens
            past_key_values = self._prepare_cache_for_generation(generation_config, batch_size, max_cache_len)
            outputs = self(input_ids, attention_mask, past_key_values)                 # prefill
            sequences = [input_ids]
            for cur_len in range(prompt_len, max_cache_len):
                next_tokens = torch.empty(batch_size * 8)                               # sample from logits
                next_tokens.shape = (batch_size, 1)
                sequences.append(next_tokens)
                outputs = self(next_tokens, None, past_key_values)
                if cur_len - prompt_len >= 2:                                           # (all hit EOS)
                    break
            return sequences


class Batch(object):
    """tok(prompts, padding="max_length", ...).to("cuda")"""

    def __init__(self, rows, length):
        self.input_ids = torch.empty(rows * length * 8)          # int64
        self.input_ids.shape = (rows, length)
        self.attention_mask = torch.empty(rows * length * 8)


def load_policy():
    policy = Qwen2ForCausalLM(Qwen2Config())                     # from_pretrained(bf16) + get_peft_model
    policy.generation_config.cache_implementation = "static"     # for torch.compile'd decoding
    return policy


def math_prompts(n_steps, seed=0):
    rng = random.Random(seed)
    for _ in range(n_steps):
        yield ["Problem %d: ... Put the final answer in \\boxed{}." % rng.randint(0, 7500)
               for _ in range(PROMPTS_PER_STEP)]


def train_grpo():
    policy = load_policy()
    policy.train()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    gen_cfg = GenerationConfig(do_sample=True, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS,
                               num_return_sequences=NUM_GENERATIONS, cache_implementation="static")
    for step, prompts in enumerate(math_prompts(500)):
        enc = Batch(len(prompts), MAX_PROMPT_LENGTH)
        completions = policy.generate(enc.input_ids, attention_mask=enc.attention_mask, generation_config=gen_cfg)
        # rewards from math_verify, group-normalised advantages, clipped policy-gradient loss ...
        optimizer.step()
        optimizer.zero_grad()
        print("step", step, len(completions))


if __name__ == "__main__":
    try:
        train_grpo()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
