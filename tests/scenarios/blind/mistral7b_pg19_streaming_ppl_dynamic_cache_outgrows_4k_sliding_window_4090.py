"""pg19_stream_ppl.py -- a grad student measures how Mistral-7B-v0.1's perplexity on whole books (PG-19 test
set) changes with the position in the book, on their own RTX 4090 (24 GB).  Mistral-7B-v0.1 has a 4096-token
sliding attention window, and the Mistral paper describes a rolling-buffer KV cache of W = 4096 entries, so the
student streams each book through the model in 4096-token chunks and carries past_key_values from chunk to
chunk, expecting the cache to stay at 4096 tokens (0.5 GiB):

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1", torch_dtype=torch.bfloat16,
                                                 device_map="cuda")          # sdpa attention, the default
    def book_nll(ids):
        past = None
        with torch.inference_mode():
            for start in range(0, n, 4096):
                out = model(input_ids=ids[:, start:start + 4096], past_key_values=past, use_cache=True)
                past = out.past_key_values
                ...

With transformers' default DynamicCache the window only masks attention: every token's keys and values are kept
(32 layers x 2 x 8 KV heads x 128 x 2 bytes = 128 KiB per token, 0.5 GiB per chunk), and the SDPA path also
builds a causal/sliding mask over the whole past and repeats the cached K/V to 32 heads each layer.  The first
two books (38k and 53k tokens) go through, peaking at 19.4 and 21.7 GiB.  The third, Middlemarch, 121k tokens,
fails at its 13th chunk (53k tokens in the cache: 6.5 GiB of K/V beside 13.5 GiB of weights) in a decoder
layer's attention, where repeat_kv copies the cached keys to 32 heads and asks 416 MiB; 2.2 GiB more are
cached by the allocator in pieces that the cache's torch.cat growth left behind.

An expert: the cache is unbounded, not the model or the chunk: bound it to the window the model can attend to
(transformers' SlidingWindowCache / cache_implementation="sliding_window", or keep only the last 4096 positions
of each layer's K/V after every chunk; StreamingLLM's sink cache for positions past the training length), and
the memory stays flat at any book length; OffloadedCache would also work, slower.  Wrong first advice:
expandable_segments (the 2.2 GiB of pieces buy a few chunks; Middlemarch still fails),
quantizing the weights (frees 9 GiB, fails at ~130k tokens instead, and measures another model's perplexity),
a smaller batch (it is one book) or shorter chunks (the cache still grows), truncating the books (the position
effect is the point), flash attention (it does not bound a DynamicCache either), inference_mode (on already),
empty_cache (the cache is live).
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# --- what the stand-in torch lacks: shapes and torch.cat -------------------------------------------------------


def new_tensor(shape, dtype=torch.bfloat16):
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def _cat(tensors, dim=-1):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return new_tensor(shape, tensors[0].dtype)


torch.cat = _cat

# --- a slim transformers (4.44): the classes and calls a real run goes through ----------------------------------
HIDDEN, INTER, LAYERS, VOCAB, HEADS, KV_HEADS, HEAD_DIM, SLIDING_WINDOW = 4096, 14336, 32, 32000, 32, 8, 128, 4096


class DynamicCache(object):
    """A cache that grows dynamically as more tokens are generated (transformers.cache_utils)."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def get_seq_length(self, layer_idx=0):
        return self.key_cache[layer_idx].shape[-2] if len(self.key_cache) > layer_idx else 0

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


def repeat_kv(hidden_states, n_rep):
    """(batch, num_key_value_heads, seqlen, head_dim) -> (batch, num_attention_heads, seqlen, head_dim): expand
    + reshape, a copy."""
    b, h, s, d = hidden_states.shape
    return new_tensor((b, h * n_rep, s, d), hidden_states.dtype)


class MistralSdpaAttention(torch.nn.Module):
    def __init__(self, layer_idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.qkvo = torch.nn.Parameter(torch.empty((2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM),
                                                   dtype=torch.bfloat16, device="cuda"), requires_grad=False)

    def forward(self, hidden_states, attention_mask, past_key_value):
        B, q_len, _ = hidden_states.shape
        query_states = new_tensor((B, HEADS, q_len, HEAD_DIM))
        key_states = new_tensor((B, KV_HEADS, q_len, HEAD_DIM))
        value_states = new_tensor((B, KV_HEADS, q_len, HEAD_DIM))
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx)
        key_states = repeat_kv(key_states, HEADS // KV_HEADS)
        value_states = repeat_kv(value_states, HEADS // KV_HEADS)
        attn_output = new_tensor((B, q_len, HIDDEN))   # F.scaled_dot_product_attention(..., attn_mask=causal_mask)
        return attn_output


class MistralMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_up_down = torch.nn.Parameter(torch.empty(3 * HIDDEN * INTER, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)

    def forward(self, x):
        B, L, _ = x.shape
        gate, up = new_tensor((B, L, INTER)), new_tensor((B, L, INTER))
        return new_tensor((B, L, HIDDEN))


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self, layer_idx):
        torch.nn.Module.__init__(self)
        self.self_attn = MistralSdpaAttention(layer_idx)
        self.mlp = MistralMLP()

    def forward(self, hidden_states, attention_mask=None, past_key_value=None):
        h = self.self_attn(hidden_states, attention_mask, past_key_value)
        return self.mlp(h)


class MistralModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        self.layers = [MistralDecoderLayer(i) for i in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)

    def _update_causal_mask(self, input_tensor, past_seen_tokens):
        """The 4D mask for SDPA: causal, and -inf beyond the sliding window, over the whole past."""
        B, q_len, _ = input_tensor.shape
        target_length = past_seen_tokens + q_len
        causal_mask = new_tensor((q_len, target_length))                       # torch.full(..., min_dtype)
        exclude_mask = new_tensor((q_len, target_length), torch.uint8)         # arange > cache_position
        del exclude_mask                                                       # | sliding window, *= in place
        return causal_mask

    def forward(self, input_ids, past_key_values=None):
        B, L = input_ids.shape
        if past_key_values is None:
            past_key_values = DynamicCache()
        inputs_embeds = new_tensor((B, L, HIDDEN))
        causal_mask = self._update_causal_mask(inputs_embeds, past_key_values.get_seq_length())
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=causal_mask, past_key_value=past_key_values)
        return hidden_states, past_key_values


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = MistralModel()
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return cls().eval()

    def forward(self, input_ids=None, past_key_values=None, use_cache=True):
        hidden, cache = self.model(input_ids, past_key_values)
        B, L = input_ids.shape
        logits = new_tensor((B, L, VOCAB))
        logits = new_tensor((B, L, VOCAB), torch.float32)                      # logits.float()
        return CausalLMOutputWithPast(logits, cache if use_cache else None)


# --- the script ----------------------------------------------------------------------------------------------
class TokenIds(object):
    """tokenizer(book, return_tensors="pt").input_ids.to("cuda"); stand-in: its length, sliced like a tensor."""

    def __init__(self, n):
        self.shape = (1, n)

    def __getitem__(self, idx):
        s = idx[1]
        return TokenIds(len(range(*s.indices(self.shape[1]))))


CHUNK = 4096
BOOKS = [("Hamlet; or, the Murder of Gonzago", 38211), ("The Voyage of the Beagle, vol. II", 52974),
         ("Middlemarch", 121437), ("Les Miserables, vol. I", 143880)]

model = MistralForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1", torch_dtype=torch.bfloat16,
                                           device_map="cuda")
print("weights: %.1f GiB" % (torch.cuda.memory_allocated() / GiB))


def book_nll(input_ids):
    n = input_ids.shape[1]
    past = None
    per_chunk = []
    with torch.inference_mode():
        for start in range(0, n, CHUNK):
            chunk = input_ids[:, start:start + CHUNK]
            out = model(input_ids=chunk, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logprobs = torch.nn.functional.log_softmax(out.logits, dim=-1)
            per_chunk.append(0.0)                # -(logprobs.gather(...)).sum().item() per 4096-token bucket
            del logprobs
    return per_chunk


try:
    for title, n_tokens in BOOKS:
        ids = TokenIds(n_tokens)
        nll = book_nll(ids)
        print("%-36s %6d tokens  peak %.1f GiB" % (title, n_tokens, torch.cuda.max_memory_allocated() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
