"""rag_api.py -- our internal RAG answer service: Llama-3.1-8B-Instruct in bf16 (15 GiB) behind FastAPI,
Hugging Face generate(), a small micro-batcher that groups up to 8 concurrent requests, one H100 80GB
per pod.  Last spring the plan was two uvicorn replicas per card, so the start-up code got

    torch.cuda.set_per_process_memory_fraction(0.40)     # two replicas + headroom on one H100

The plan changed (one replica per card, one pod per GPU in Kubernetes), the line stayed.  Since the
retriever started returning 24 chunks instead of 8, prompts are ~12k tokens; when the batcher fills
with 8 of them the prefill dies half way through the layers:

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.62 GiB. GPU 0 has a total capacity
    of 80.00 GiB of which 49.54 GiB is free. 32.00 GiB allowed; ...

The user: "nvidia-smi says the card has 49 GB free and nothing else runs on it. Do we need to
quantize to 4-bit, or shard across two H100s?"

What fills the memory: weights 15 GiB, the KV cache of 8 x 12,288 tokens (384 MiB per layer, 12 GiB
for all 32 layers) and the prefill's MLP temporaries (gate/up/act of 98k tokens x 14,336, 2.6 GiB
each).  The whole prefill peaks near 34 GiB; at the 23rd layer the reservation is already 30 GiB and the
next 2.6 GiB would pass the 32 GiB (0.40 x 80) the allocator is allowed to reserve, while the card
itself still has 49.5 GiB free.

An expert: the refusal is PyTorch's own cap, not the card -- remove the
set_per_process_memory_fraction line (or raise it to ~0.9 now that the pod owns the card); the
batch then fits with 40 GB to spare.  Wrong first answers: quantization, tensor parallelism over two
GPUs or a bigger GPU (the card is half empty), smaller batches or shorter prompts (they hide the cap
and cost throughput/answer quality), empty_cache or expandable_segments (nothing is cached or
fragmented; the cap counts reserved bytes), "other processes" (there are none).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, KV_DIM, LAYERS, VOCAB = 4096, 14336, 1024, 32, 128256
LAYER_BYTES = 416 * MiB                 # q/k/v/o + gate/up/down of one Llama-3.1-8B layer, bf16


def frozen_bf16(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=BF16, device="cuda"), requires_grad=False)


class DynamicCache(object):
    """transformers.DynamicCache: one key and one value tensor per layer."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, layer_idx):
        self.key_cache.append(k)
        self.value_cache.append(v)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, idx):
        nn.Module.__init__(self)
        self.idx = idx
        self.weight = frozen_bf16(LAYER_BYTES)

    def forward(self, hidden, tokens, past_key_values):
        normed = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        k = torch.empty(tokens * KV_DIM, dtype=BF16, device="cuda")          # kept in the cache
        v = torch.empty(tokens * KV_DIM, dtype=BF16, device="cuda")
        past_key_values.update(k, v, self.idx)
        attn_out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")  # sdpa: no score matrix
        del normed
        gate = torch.empty(tokens * INTER, dtype=BF16, device="cuda")
        up = torch.empty(tokens * INTER, dtype=BF16, device="cuda")
        act = torch.empty(tokens * INTER, dtype=BF16, device="cuda")        # silu(gate) * up
        del gate, up
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        del act, attn_out
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = frozen_bf16(VOCAB * HIDDEN * 2)
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer(i))
        self.norm = frozen_bf16(HIDDEN * 2)
        self.lm_head = frozen_bf16(VOCAB * HIDDEN * 2)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation="sdpa"):
        return cls().eval()

    def forward(self, input_ids, past_key_values):
        tokens = input_ids.nbytes // 8
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens, past_key_values)
        rows = tokens // PROMPT_LEN
        return torch.empty(rows * VOCAB * 4, device="cuda")      # logits of the last position, float32

    def generate(self, input_ids, attention_mask=None, max_new_tokens=512, do_sample=False):
        cache = DynamicCache()
        logits = self(input_ids, past_key_values=cache)             # prefill
        for step in range(max_new_tokens):                          # decode (never reached here)
            logits = self(torch.empty(input_ids.nbytes // PROMPT_LEN, device="cuda"), past_key_values=cache)
        return logits


PROMPT_LEN = 12288            # system prompt + 24 retrieved chunks + question, left-padded to the longest
MAX_BATCH = 8

torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))

# --- start-up (app.on_event("startup")) ---
torch.cuda.set_per_process_memory_fraction(0.40)      # two replicas + headroom on one H100
model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=BF16)


def answer_batch(requests):
    """The micro-batcher's flush: one generate() for up to MAX_BATCH queued requests."""
    batch_size = len(requests)
    enc = {"input_ids": torch.empty(batch_size * PROMPT_LEN * 8, device="cuda"),      # int64
           "attention_mask": torch.empty(batch_size * PROMPT_LEN * 8, device="cuda")}
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=512, do_sample=False)
    return ["..." for _ in requests]


# --- a busy minute: the batcher fills with 8 long RAG prompts ---
queued = ["question %d + 24 chunks" % i for i in range(MAX_BATCH)]
try:
    answer_batch(queued)
except torch.OutOfMemoryError:
    raise
sys.exit(0)
