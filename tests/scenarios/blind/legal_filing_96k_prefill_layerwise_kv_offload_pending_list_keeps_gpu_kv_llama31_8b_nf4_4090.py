"""96k-token legal filing QA on an RTX 4090 with a hand-written layer-wise KV offload: the GPU copies are never let go.

The real program (filing_qa.py; transformers 4.42, bitsandbytes) answers questions about one long court
filing (exhibits included: 98,304 tokens) with Llama-3.1-8B-Instruct in 4-bit nf4.  A 96k-token KV cache
is 12 GiB in bf16, too much beside the model on a 24 GB card, so the author wrote a Cache that sends
each layer's K/V to pinned CPU memory as soon as the layer has made it (the idea of transformers'
OffloadedCache):

    class LayerwiseOffloadedCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            k_cpu = torch.empty(key_states.shape, dtype=key_states.dtype, pin_memory=True)
            v_cpu = torch.empty(value_states.shape, dtype=value_states.dtype, pin_memory=True)
            k_cpu.copy_(key_states, non_blocking=True); v_cpu.copy_(value_states, non_blocking=True)
            ev = torch.cuda.Event(); ev.record()
            self._pending.append((key_states, value_states, ev))   # keep the GPU source alive until
            self.key_cache.append(k_cpu); self.value_cache.append(v_cpu)  #  the async copy is done
            return key_states, value_states
        def _drain(self):                           # called by prefetch_layer(), i.e. only when decoding
            for k, v, ev in self._pending: ev.synchronize()
            self._pending.clear()

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3.1-8B-Instruct",
                quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16), attn_implementation="sdpa", device_map="cuda:0")
    with torch.inference_mode():
        out = model(input_ids, past_key_values=LayerwiseOffloadedCache(), num_logits_to_keep=1)  # prefill
        ... greedy decode of the answer ...

Keeping the GPU tensors until the copy finishes is right; draining only at decode time is the bug: during
the prefill nothing is drained, so every layer's K/V stays on the GPU -- the offload saves nothing.

Sizes (98,304 tokens, hidden 4096, 8 kv heads x 128, MLP 14336, 32 layers):
  * weights: nf4 linears 3.35 GiB + bf16 embeddings 0.98 GiB + bf16 lm_head 0.98 GiB = 5.3 GiB; context 0.5 GiB;
  * per layer: K + V = 2 x 98,304 x 1024 x 2 B = 384 MiB (12 GiB for 32 layers);
  * prefill transients: hidden / residual / norm output / q / SDPA output 768 MiB each, MLP gate, up,
    SiLU(gate)*up 2.6 GiB each (98,304 x 14,336 x 2 B), bnb's dequantized weight up to 112 MiB: ~9.4 GiB
    at the MLP's peak, so the first layer already peaks at 15.8 GiB;
  * the pending list adds 384 MiB per layer, and each pinned K/V pair also strands the rest of the cached
    768 MiB block it was carved from; the prefill fails in the MLP of layer 15 (index 14) on a 2.6 GiB
    intermediate, with 5.6 GiB of K/V (15 layers) held by self._pending, ~2.6 GiB cached in segments
    split around it and 2.4 GiB free.  All 32 layers' K/V (12 GiB) plus the ~15 GiB the prefill needs
    anyway can never fit in 24 GiB, whatever the allocator does.
With the copies drained per layer (or transformers' OffloadedCache, which keeps one layer on the GPU and
prefetches the next) the prefill peaks at ~15.5 GiB; a chunked prefill would lower it further.

What an expert says first: the cache's _pending list keeps each layer's GPU K/V alive for the whole
prefill -- synchronize the copy's event and drop the GPU tensors after each layer (or use OffloadedCache).
Wrong advice: quantize (already nf4); expandable_segments / empty_cache (they could reclaim the ~2.6 GiB
stranded around the pinned tensors, a layer or two more; the 12 GiB of K/V the list holds still has to
go); inference_mode (already on); a smaller batch (one sequence); gradient checkpointing; CPU offload of
the model (the bug is the offload of the cache); a bigger GPU.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "meta-llama/Meta-Llama-3.1-8B-Instruct"
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
KV_DIM = 8 * 128
VOCAB = 128256
FILING_TOKENS = 98304
MiB = 1024 * 1024


class PinnedHostTensor(object):
    """torch.empty(shape, dtype, pin_memory=True): host memory, no device bytes (the stand-in torch has no
    CPU tensors)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def copy_(self, src, non_blocking=False):
        return self


class CopyDoneEvent(object):
    """torch.cuda.Event() recorded after the non-blocking copies."""

    def record(self):
        return self

    def synchronize(self):
        return None


class LayerwiseOffloadedCache(object):
    """Each layer's K/V goes to pinned CPU memory as soon as the layer made it; the GPU tensors wait in
    _pending until the asynchronous copies are known to be done."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []
        self._pending = []

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        k_cpu = PinnedHostTensor(key_states.nbytes).copy_(key_states, non_blocking=True)
        v_cpu = PinnedHostTensor(value_states.nbytes).copy_(value_states, non_blocking=True)
        ev = CopyDoneEvent().record()
        self._pending.append((key_states, value_states, ev))
        self.key_cache.append(k_cpu)
        self.value_cache.append(v_cpu)
        return key_states, value_states

    def _drain(self):
        for _k, _v, ev in self._pending:
            ev.synchronize()
        del self._pending[:]

    def prefetch_layer(self, layer_idx):
        self._drain()

    def get_seq_length(self, layer_idx=0):
        return self.key_cache[layer_idx].nbytes // (KV_DIM * 2) if self.key_cache else 0


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in torch has none)."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Linear4bit(nn.Module):
    """bitsandbytes' Linear4bit (nf4): uint8 weight packing two values a byte plus absmax; forward
    dequantizes the weight to bf16 for the matmul, then drops it."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features // 2, dtype=torch.uint8), requires_grad=False)
        self.absmax = nn.Parameter(torch.empty(in_features * out_features // 64, dtype=torch.uint8), requires_grad=False)

    def forward(self, x):
        w = torch.empty(self.in_features * self.out_features, dtype=torch.bfloat16)     # dequantize_4bit
        tokens = x.nbytes // (2 * self.in_features)
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16)
        del w
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self, layer_idx):
        nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.q_proj = Linear4bit(HIDDEN, HIDDEN)
        self.k_proj = Linear4bit(HIDDEN, KV_DIM)
        self.v_proj = Linear4bit(HIDDEN, KV_DIM)
        self.o_proj = Linear4bit(HIDDEN, HIDDEN)
        self.gate_proj = Linear4bit(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear4bit(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear4bit(INTERMEDIATE, HIDDEN)

    def forward(self, hidden_states, past_key_value):
        residual = hidden_states
        x = torch.empty(hidden_states.nbytes // 2, dtype=torch.bfloat16)        # input_layernorm
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        del x
        k, v = past_key_value.update(k, v, self.layer_idx)
        attn = torch.empty(q.nbytes // 2, dtype=torch.bfloat16)                  # F.scaled_dot_product_attention
        del q, k, v
        h = self.o_proj(attn)
        del attn
        hidden_states = torch.empty(h.nbytes // 2, dtype=torch.bfloat16)        # residual + h
        del h, residual
        residual = hidden_states
        x = torch.empty(hidden_states.nbytes // 2, dtype=torch.bfloat16)        # post_attention_layernorm
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        act = torch.empty(gate.nbytes // 2, dtype=torch.bfloat16)               # act_fn(gate) * up
        del gate, up, x
        down = self.down_proj(act)
        del act
        hidden_states = torch.empty(down.nbytes // 2, dtype=torch.bfloat16)     # residual + down
        return hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.layers = ModuleList([LlamaDecoderLayer(i) for i in range(NUM_LAYERS)])
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * VOCAB, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, input_ids, past_key_values=None, num_logits_to_keep=1):
        tokens = input_ids.nbytes // 8
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)      # embed_tokens(input_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, past_key_values)
        logits = torch.empty(num_logits_to_keep * VOCAB, dtype=torch.float32)
        return logits


def answer(model, input_ids, max_new_tokens=300):
    cache = LayerwiseOffloadedCache()
    with torch.inference_mode():
        logits = model(input_ids, past_key_values=cache, num_logits_to_keep=1)      # prefill
        for _ in range(max_new_tokens):
            cache.prefetch_layer(0)
            token = torch.empty(8)
            logits = model(token, past_key_values=cache)
    return logits


def main():
    model = LlamaForCausalLM()
    input_ids = torch.empty(FILING_TOKENS * 8)          # int64 ids of the filing + question, .to("cuda:0")
    return answer(model, input_ids)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
