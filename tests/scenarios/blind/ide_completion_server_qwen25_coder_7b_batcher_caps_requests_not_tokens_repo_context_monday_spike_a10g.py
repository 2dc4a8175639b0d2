"""completion_server.py -- the in-house code-completion backend of a 300-developer company: one
A10G (24 GB, g5.xlarge), Qwen2.5-Coder-7B-Instruct in bf16 (7.6B parameters: 14.2 GiB), plain
transformers behind a small asyncio server.  To get throughput out of HF generate, the platform team
wrote a batcher: requests wait in a queue, a loop takes whatever is there (up to 32, or after 25 ms),
left-pads the FIM prompts to the longest and runs one generate:

    MAX_BATCH = 32                      # the load test's best: 32 x 1,024-token prompts, 20 GiB peak
    batch = [await queue.get()] + drain(queue, MAX_BATCH - 1, timeout=0.025)
    enc = tokenizer([r.prompt for r in batch], padding=True, return_tensors="pt").to("cuda")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=48, do_sample=False)

The IDE plugin used to send at most 1,024 tokens (prefix + suffix of the open file) and the batcher
has run for months.  Version 2.3 of the plugin, rolled out on Friday, adds "repository context":
snippets of related files, up to 4,096 more tokens.  On Monday at 9:00 everyone opens their IDE; the
queue holds 41 requests of 4.5-5.1k tokens each, the batcher takes 32 (it counts requests), and the
prefill of 32 x 5,116 = 163,712 tokens needs 1.1 GiB per hidden-state tensor and 5.8 GiB per MLP
intermediate, on top of the KV cache it writes.  It fails in the first decoder layer's MLP (Tried to
allocate 5.78 GiB) with 17.8 GiB allocated -- the 14.2 GiB of weights, the batch's hidden states and
layer 0's keys and values -- and 3.8 GiB free.  The load test's batch was 32,768 tokens; this one is
five times that: six such requests (31k tokens) are what this card holds.

An expert: the batch must be bounded by tokens, not by requests -- admit requests until the padded
batch reaches a token budget (~32k tokens: what the load test proved), and prefill long prompts in
chunks; a lower MAX_BATCH is the blunt version.  Secondary: group requests of similar length (left
padding to the longest wastes the rest), and cap the repository context.  Wrong first advice:
4-bit quantization (frees ~9 GiB of weights; this batch needs ~30 GiB for its KV cache and layer
transients) or a bigger GPU (an 80 GB card would take it, until the batcher meets longer prompts
again), expandable_segments / empty_cache (nothing is cached: the request is bigger than what is
free), inference_mode (already on), gradient checkpointing (no training), flash attention (SDPA
already; the hidden states and MLP intermediates are what fail).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

bf16 = torch.bfloat16
HIDDEN, INTER, LAYERS, KV_DIM, VOCAB = 3584, 18_944, 28, 4 * 128, 152_064


# ----------------------------------------------------------------------------------------------
# transformers' Qwen2ForCausalLM.generate with its DynamicCache, as far as memory goes (the stand-in
# computes no values; every tensor is the size PyTorch's would be).  Prefill computes the last
# position's logits only (num_logits_to_keep=1, transformers >= 4.45).
class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, layer_idx, batch, new_len):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:                                                        # torch.cat([old, new], dim=-2)
            old = self.key_cache[layer_idx].nbytes // 2
            self.key_cache[layer_idx] = torch.empty(old + batch * new_len * KV_DIM, dtype=bf16, device="cuda")
            old = self.value_cache[layer_idx].nbytes // 2
            self.value_cache[layer_idx] = torch.empty(old + batch * new_len * KV_DIM, dtype=bf16, device="cuda")


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.idx = idx
        self.q_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=bf16, device="cuda"))
        self.k_proj = torch.nn.Parameter(torch.empty(HIDDEN * KV_DIM, dtype=bf16, device="cuda"))
        self.v_proj = torch.nn.Parameter(torch.empty(HIDDEN * KV_DIM, dtype=bf16, device="cuda"))
        self.o_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=bf16, device="cuda"))
        self.gate_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=bf16, device="cuda"))
        self.up_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=bf16, device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(INTER * HIDDEN, dtype=bf16, device="cuda"))

    def forward(self, hidden, batch, new_len, cache):
        n = batch * new_len
        normed = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")          # input_layernorm
        q = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")               # q_proj + rotary
        k = torch.empty(n * KV_DIM, dtype=bf16, device="cuda")
        v = torch.empty(n * KV_DIM, dtype=bf16, device="cuda")
        cache.update(k, v, self.idx, batch, new_len)
        del k, v, normed
        attn = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")            # sdpa over the cache
        del q
        hidden = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")          # o_proj + residual
        del attn
        normed = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")          # post_attention_layernorm
        gate = torch.empty(n * INTER, dtype=bf16, device="cuda")
        up = torch.empty(n * INTER, dtype=bf16, device="cuda")
        act = torch.empty(n * INTER, dtype=bf16, device="cuda")              # silu(gate) * up
        del gate, up, normed
        out = torch.empty(n * HIDDEN, dtype=bf16, device="cuda")             # down_proj + residual
        del act
        return out


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=bf16, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(i))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=bf16, device="cuda"))

    def forward(self, batch, new_len, cache):
        hidden = torch.empty(batch * new_len * HIDDEN, dtype=bf16, device="cuda")   # embed_tokens
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, batch, new_len, cache)
        return torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")     # last position's logits

    def generate(self, input_ids=None, attention_mask=None, max_new_tokens=48, do_sample=False):
        batch, length = input_ids["batch"], input_ids["length"]
        cache = DynamicCache()
        logits = self(batch, length, cache)                          # prefill
        for step in range(max_new_tokens - 1):                       # decode, one token per step
            del logits
            logits = self(batch, 1, cache)
        del logits, cache
        return torch.empty(batch * (length + max_new_tokens) * 2, dtype=torch.uint8, device="cuda")


# ----------------------------------------------------------------------------------------------
# completion_server.py
MAX_BATCH = 32
model = Qwen2ForCausalLM().to("cuda").eval()


def tokenize(prompts):
    """tokenizer(prompts, padding=True) with padding_side="left": every row padded to the longest."""
    return {"batch": len(prompts), "length": max(prompts)}


def run_batch(batch):
    enc = tokenize([r["prompt_tokens"] for r in batch])
    with torch.inference_mode():
        out = model.generate(input_ids=enc, attention_mask=None, max_new_tokens=48, do_sample=False)
    texts = ["<completion>"] * len(batch)                            # tokenizer.batch_decode(out[:, length:])
    del out
    return texts


def drain(queue, limit):
    """What the batcher's loop takes: whatever is waiting, up to `limit` requests."""
    taken = queue[:limit]
    del queue[:limit]
    return taken


def traffic():
    """Friday afternoon (plugin 2.2: <= 1,024 tokens), then Monday 9:00 (plugin 2.3: + repository context)."""
    for i in range(6):
        n = (5, 11, 32, 17, 8, 24)[i]
        yield "fri 16:%02d" % (10 + i), [{"prompt_tokens": 380 + (97 * j + 31 * i) % 640} for j in range(n)]
    yield "mon 09:00", [{"prompt_tokens": 4480 + (53 * j) % 640} for j in range(41)]


try:
    for when, arrived in traffic():
        queue = list(arrived)
        while queue:
            batch = drain(queue, MAX_BATCH)
            run_batch(batch)
            print("%s  batch of %2d requests, longest %5d tokens: ok (peak %.1f GiB)" % (
                when, len(batch), max(r["prompt_tokens"] for r in batch), torch.cuda.max_memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
