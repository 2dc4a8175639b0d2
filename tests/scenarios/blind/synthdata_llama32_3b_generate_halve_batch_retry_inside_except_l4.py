"""gen_synth.py -- synthetic instruction data: Llama-3.2-3B-Instruct (bf16, 6 GiB) writes answers for
4,096 seed prompts (~900 tokens each with the few-shot preamble), sampling up to 2,048 new tokens
(chain-of-thought answers), on a GCP g2-standard-8 (one L4, 22.5 GiB).  Hugging Face generate() in
batches; to "find the largest batch that fits automatically" the script halves the batch when it
runs out of memory:

    def safe_generate(prompts, batch_size):
        try:
            return generate_all(prompts, batch_size)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            print(f"OOM at batch {batch_size}, retrying with {batch_size // 2}")
            return safe_generate(prompts, batch_size // 2)        # <- still inside the except

The log: "OOM at batch 64 ... 32 ... 16 ... 8 ... 4 ... 2 ... 1", then a final CUDA out of memory at
batch size 1 ("Tried to allocate 28.00 MiB ... 8.00 MiB is free") -- "batch 1 of a 3B model does not
fit a 24 GB card?!"

What fills the memory: batch 64 decodes for a while, its KV cache (112 KiB per token; 64 rows x 2,944
tokens would be 20 GiB) growing until the card is full with ~16 GiB of it beside the 6 GiB of
weights.  The handler's retry runs while that exception is being handled: the traceback keeps
generate()'s frames and with them the whole half-built KV cache alive, so batch 32 starts with
<1 GiB free, fails, and nests one level deeper with its own partial cache held too ... down to
batch 1.  empty_cache() in the handler returns
nothing: the blocks are in use, held by the traceback.

An expert: retry after leaving the except block (set a flag / return a sentinel, then halve the
batch outside the handler): batch 32 (KV 10 GiB at full length, ~17 GiB peak) runs the whole set on
this card.  Wrong first answers: a smaller batch (it already halves down to 1; the halving is
right, its place is wrong), empty_cache (already called, frees nothing held), 4-bit quantization or
a bigger GPU (batch 32 fits this card), expandable_segments (the memory is live, not fragmented).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, KV_DIM, LAYERS, VOCAB = 3072, 8192, 1024, 28, 128256
LAYER_BYTES = 192 * MiB                 # one Llama-3.2-3B decoder layer, bf16
CHUNK = 64                              # decode steps per KV block (DynamicCache grows by cat; blocks here)


def frozen_bf16(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=BF16, device="cuda"), requires_grad=False)


class DynamicCache(object):
    def __init__(self):
        self.key_cache = [[] for _ in range(LAYERS)]
        self.value_cache = [[] for _ in range(LAYERS)]

    def update(self, k, v, layer_idx):
        self.key_cache[layer_idx].append(k)
        self.value_cache[layer_idx].append(v)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, idx):
        nn.Module.__init__(self)
        self.idx = idx
        self.weight = frozen_bf16(LAYER_BYTES)

    def forward(self, hidden, rows, new_tokens, past_key_values):
        tokens = rows * new_tokens
        k = torch.empty(tokens * KV_DIM, dtype=BF16, device="cuda")
        v = torch.empty(tokens * KV_DIM, dtype=BF16, device="cuda")
        past_key_values.update(k, v, self.idx)
        mlp = torch.empty(tokens * INTER * 2, dtype=BF16, device="cuda")    # gate/up of this pass
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        del mlp
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = frozen_bf16(VOCAB * HIDDEN * 2)     # tied with the lm_head
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer(i))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls().eval()

    def forward(self, rows, new_tokens, past_key_values):
        hidden = torch.empty(rows * new_tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, rows, new_tokens, past_key_values)
        return torch.empty(rows * VOCAB * 4, device="cuda")         # last position's logits, float32

    def generate(self, input_ids, attention_mask=None, max_new_tokens=2048, do_sample=True, temperature=0.8):
        rows = attention_mask.nbytes // (PROMPT_LEN * 8)
        past_key_values = DynamicCache()
        logits = self(rows, PROMPT_LEN, past_key_values)               # prefill
        for step in range(0, max_new_tokens, CHUNK):                   # decode
            logits = self(rows, CHUNK, past_key_values)
        return torch.empty(rows * (PROMPT_LEN + max_new_tokens) * 8, device="cuda")


PROMPT_LEN = 896

torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))

model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.2-3B-Instruct", torch_dtype=BF16)


def generate_all(prompts, batch_size):
    out = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        enc = {"input_ids": torch.empty(len(chunk) * PROMPT_LEN * 8, device="cuda"),
               "attention_mask": torch.empty(len(chunk) * PROMPT_LEN * 8, device="cuda")}
        with torch.inference_mode():
            ids = model.generate(**enc, max_new_tokens=2048, do_sample=True, temperature=0.8)
        out.extend("sample" for _ in chunk)
        del ids, enc
    return out


def safe_generate(prompts, batch_size):
    try:
        return generate_all(prompts, batch_size)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        if batch_size == 1:
            raise
        print("OOM at batch %d, retrying with %d" % (batch_size, batch_size // 2), file=sys.stderr)
        return safe_generate(prompts, batch_size // 2)


seed_prompts = ["seed %d" % i for i in range(4096)]
data = safe_generate(seed_prompts, batch_size=64)
print("wrote %d samples" % len(data))
sys.exit(0)
