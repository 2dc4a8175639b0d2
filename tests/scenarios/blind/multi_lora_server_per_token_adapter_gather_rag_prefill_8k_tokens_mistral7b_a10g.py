"""A multi-tenant LoRA inference server that a platform team wrote themselves (before vLLM's --enable-lora
covered their adapter layout): one Mistral-7B-Instruct-v0.3 base in bf16 on an A10G (24 GB, 22.49 GiB usable),
up to 8 tenant adapters (rank 64 on q/k/v/o) resident at once, continuous batching with a paged KV pool,
max_num_batched_tokens=8192 per step.  The real code (lora_server/layers.py):

    class LoRALinear(nn.Module):
        def forward(self, x, mapping):                       # x: (T, in), one row per token of the step
            out = F.linear(x, self.weight)
            a = self.lora_a_stacked.index_select(0, mapping.token_lora_indices)   # (T, in, r)
            b = self.lora_b_stacked.index_select(0, mapping.token_lora_indices)   # (T, r, out)
            out += torch.bmm(torch.bmm(x.unsqueeze(1), a), b).squeeze(1) * self.scaling
            return out

It mixes tenants in one batch by giving each token its own copy of its adapter's matrices.  In decode steps
(a few dozen tokens) the copies are small: 64 tokens x 4096 x 64 x 2 B = 32 MiB, and it passed every load test.
The engine's startup profile ran a dummy 8192-token batch with no adapter (index -1: the base path only), so
the activation headroom it kept (~0.9 GiB) never saw the LoRA path.

Sizes: weights 7.25 B params x 2 B = 13.5 GiB; adapter stacks 8 slots x 104 MiB = 0.81 GiB; KV pool from
gpu_memory_utilization=0.92: 0.92 x 22.49 - context - weights - adapters - profiled peak ~= 5 GiB
(Mistral: 32 layers x 8 KV heads x 128 x 2 x 2 B = 128 KiB per token: ~40k tokens).  About 2.4 GiB stays
free.  Then RAG traffic arrives: three tenants' requests with ~2.7k-token retrieved contexts are packed into
one 8192-token prefill step, and layer 0's q_proj asks for a = (8192, 4096, 64) bf16 = 4 GiB.  OOM.

What an expert says first: the LoRA path materialises a per-token copy of the adapter weights; 4 GiB for one
projection is the implementation, not the card.  Group the tokens by adapter (segmented gather-matmul:
punica's SGMV/BGMV kernels, vLLM's or LoRAX's LoRA layers, or at least a loop over the adapters present
doing x[idx] @ A_i @ B_i), which needs only (T, r) intermediates.  Until then, cap the prefill token budget
(max_num_batched_tokens / chunked prefill at 1024) so the copy is 512 MiB.  Wrong advice: empty_cache or
expandable_segments (nothing is cached or fragmented), inference_mode (already on), gradient checkpointing or
mixed precision (inference, already bf16), flash-attention (the failure is not attention), quantizing the
base (the request would still be 4 GiB per projection and 8 GiB at 16k tokens), LoRA (it is LoRA already).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1024 ** 3

# Mistral-7B-Instruct-v0.3 (config.json)
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
VOCAB = 32768

# server config (lora_server/config.yaml)
MAX_LORAS = 8
MAX_LORA_RANK = 64
GPU_MEMORY_UTILIZATION = 0.92
MAX_NUM_BATCHED_TOKENS = 8192
BLOCK_SIZE = 16
PROFILED_ACTIVATION_BYTES = int(0.9 * GiB)    # the startup profile's peak (base path, no adapter)


def linear(x, weight, num_tokens, out_features):
    """F.linear(x, weight): (T, out) in the weight's dtype (stand-in: sizes only)."""
    return torch.empty(num_tokens * out_features, dtype=BF16, device=weight.device)


def index_select(stacked, num_rows, row_numel):
    """stacked.index_select(0, token_lora_indices): one (in, r) or (r, out) slice per token."""
    return torch.empty(num_rows * row_numel, dtype=BF16, device=stacked.device)


class LoRAMapping(object):
    """Which adapter slot each token of the step uses (punica's token_lora_indices)."""

    def __init__(self, token_counts_by_slot):
        self.num_tokens = sum(token_counts_by_slot.values())
        self.token_lora_indices = torch.empty(self.num_tokens * 8)     # int64 per token
        self.active_slots = sorted(token_counts_by_slot)


class LoRALinear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features * in_features, dtype=BF16), requires_grad=False)
        # every resident adapter's matrices, stacked by slot
        self.lora_a_stacked = torch.empty(MAX_LORAS * in_features * MAX_LORA_RANK, dtype=BF16)
        self.lora_b_stacked = torch.empty(MAX_LORAS * MAX_LORA_RANK * out_features, dtype=BF16)
        self.scaling = 2.0

    def forward(self, x, mapping):
        T = mapping.num_tokens
        out = linear(x, self.weight, T, self.out_features)
        if mapping.active_slots == [-1]:
            return out                       # no adapter in this batch (the startup profile)
        a = index_select(self.lora_a_stacked, T, self.in_features * MAX_LORA_RANK)     # (T, in, r)
        b = index_select(self.lora_b_stacked, T, MAX_LORA_RANK * self.out_features)    # (T, r, out)
        xa = torch.empty(T * MAX_LORA_RANK, dtype=BF16)                                # bmm(x, a)
        delta = torch.empty(T * self.out_features, dtype=BF16)                         # bmm(xa, b)
        del a, b, xa, delta                  # out += delta * scaling
        return out


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features * in_features, dtype=BF16), requires_grad=False)

    def forward(self, x, num_tokens):
        return linear(x, self.weight, num_tokens, self.out_features)


class MistralAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = LoRALinear(HIDDEN, HIDDEN)
        self.k_proj = LoRALinear(HIDDEN, NUM_KV_HEADS * HEAD_DIM)
        self.v_proj = LoRALinear(HIDDEN, NUM_KV_HEADS * HEAD_DIM)
        self.o_proj = LoRALinear(HIDDEN, HIDDEN)

    def forward(self, hidden_states, mapping, kv_cache):
        q = self.q_proj(hidden_states, mapping)
        k = self.k_proj(hidden_states, mapping)
        v = self.v_proj(hidden_states, mapping)
        # paged attention writes k, v into kv_cache's blocks and reads the sequences' blocks
        attn_out = torch.empty(mapping.num_tokens * HIDDEN, dtype=BF16)
        del q, k, v
        return self.o_proj(attn_out, mapping)


class MistralMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x, num_tokens):
        gate = self.gate_proj(x, num_tokens)
        up = self.up_proj(x, num_tokens)
        act = torch.empty(num_tokens * INTERMEDIATE, dtype=BF16)     # silu(gate) * up
        del gate, up
        return self.down_proj(act, num_tokens)


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = MistralAttention()
        self.mlp = MistralMLP()
        self.input_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)
        self.post_attention_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, mapping, kv_cache):
        h = self.self_attn(hidden_states, mapping, kv_cache)
        return self.mlp(h, mapping.num_tokens)


class MistralForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16), requires_grad=False)
        self.layers = nn.Module()
        for i in range(NUM_LAYERS):
            setattr(self.layers, str(i), MistralDecoderLayer())
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16), requires_grad=False)
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, mapping, kv_caches, last_token_count):
        hidden_states = torch.empty(mapping.num_tokens * HIDDEN, dtype=BF16)      # embed_tokens(input_ids)
        for i in range(NUM_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states, mapping, kv_caches[i])
        return self.lm_head(hidden_states, last_token_count)     # logits of each sequence's last token


class Request(object):
    def __init__(self, request_id, tenant, prompt_tokens):
        self.request_id, self.tenant, self.prompt_tokens = request_id, tenant, prompt_tokens


class MultiLoRAEngine(object):
    def __init__(self):
        self.model = MistralForCausalLM()
        self.model.eval()
        self.adapter_slots = {}              # tenant -> slot in the stacks
        self.kv_caches = []
        self.profile_and_allocate_kv()

    def load_adapter(self, tenant):
        """Copies the tenant's adapter into a free slot of every layer's stacks (in place: no new memory)."""
        if tenant not in self.adapter_slots:
            self.adapter_slots[tenant] = len(self.adapter_slots) % MAX_LORAS
        return self.adapter_slots[tenant]

    def profile_and_allocate_kv(self):
        with torch.inference_mode():
            mapping = LoRAMapping({-1: MAX_NUM_BATCHED_TOKENS})
            self.model(mapping, [None] * NUM_LAYERS, 1)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        used = total - free
        budget = int(GPU_MEMORY_UTILIZATION * total) - used - PROFILED_ACTIVATION_BYTES
        block_bytes = BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * 2 * 2          # K and V, bf16, per layer
        self.num_gpu_blocks = budget // (block_bytes * NUM_LAYERS)
        for _ in range(NUM_LAYERS):
            self.kv_caches.append(torch.empty(self.num_gpu_blocks * block_bytes // 2, dtype=BF16))

    def step(self, batch):
        counts = {}
        for req in batch:
            slot = self.load_adapter(req.tenant)
            counts[slot] = counts.get(slot, 0) + req.prompt_tokens
        mapping = LoRAMapping(counts)
        with torch.inference_mode():
            logits = self.model(mapping, self.kv_caches, len(batch))
        return logits


def schedule(waiting):
    """Continuous batching: take waiting prefills in order while they fit the step's token budget."""
    batch, tokens = [], 0
    while waiting and tokens + waiting[0].prompt_tokens <= MAX_NUM_BATCHED_TOKENS:
        req = waiting.pop(0)
        batch.append(req)
        tokens += req.prompt_tokens
    return batch


def main():
    engine = MultiLoRAEngine()
    # smoke test after deploy: short chat prompts from two tenants
    waiting = [Request("warm-%d" % i, "tenant-%d" % (i % 2), 180) for i in range(4)]
    while waiting:
        engine.step(schedule(waiting))
    # RAG traffic: retrieved contexts of ~2.7k tokens, three tenants in one prefill step
    waiting = [Request("rag-acme-17", "acme", 2731), Request("rag-globex-4", "globex", 2698),
               Request("rag-initech-9", "initech", 2763), Request("rag-acme-18", "acme", 2204)]
    while waiting:
        engine.step(schedule(waiting))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
