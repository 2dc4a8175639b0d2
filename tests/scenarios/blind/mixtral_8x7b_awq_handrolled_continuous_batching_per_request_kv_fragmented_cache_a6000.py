"""A hand-rolled continuous-batching server for Mixtral-8x7B-Instruct AWQ on one RTX A6000 48GB, killed by a
fragmented cache after hours of traffic.

The real service (FastAPI + a scheduler thread), kept because "vLLM did not support our custom sampler":

    model = AutoAWQForCausalLM.from_quantized("TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ", fuse_layers=True)
    active = {}                                   # request id -> Request (its own KV slot, its tokens)
    while True:                                   # every tick, under torch.inference_mode()
        batch = admit(waiting, room=20 - len(active))
        enc = tok([r.prompt for r in batch], padding=True, return_tensors="pt").to("cuda")
        logits = model(**enc, past_key_values=scratch_cache)          # prefill, padded to the longest
        for r in batch:                                                # move each one's K/V into its slot
            r.kv = torch.empty(32, 2, r.prompt_len + r.max_new_tokens, 8, 128, dtype=torch.float16, device="cuda")
        decode(active, steps=25); retire(active)  # a finished request's slot goes back to PyTorch's cache

Sizes: AWQ weights (4-bit experts and projections, fp16 embeddings) 22.8 GiB; 48 GiB card, 0.5 GiB CUDA context.
KV: 32 layers x 2 x 8 heads x 128 x 2 B = 128 KiB per token, a slot is 0.1-1.0 GiB.  A prefill of T padded
token positions makes a scratch cache (T x 128 KiB), the fused MoE kernel's intermediate caches of every
layer ([T, 2, 2 x 14336] fp16 = T x 112 KiB, then T x 56 and T x 16 KiB) and the fp32 logits (T x 125 KiB).
Every tick admits a different mix, so these buffers come in every size; each new KV slot is carved out of
whichever cached block fits it best -- usually a hole a larger prefill left -- and slots are freed in
whatever order their requests finish.  After ~640 requests (~360 prefills) 20 slots live in segments that
are mostly holes: allocated 34.8 GiB (22.8 weights, ~9 GiB of slots, the running prefill's 3.2 GiB scratch
cache), reserved 45.1 GiB.  The next prefill, 4 RAG prompts padded to 6,466 tokens (25,864 positions; a
26,020-position one had gone through an hour earlier), needs its fused-MoE intermediate cache in one piece:
2.76 GiB.  10.3 GiB are reserved but unallocated and 2.4 GiB are free at the driver, yet no cached hole is
2.76 GiB, cudaMalloc cannot have it, and the release-and-retry finds no segment with nothing live in it.

What an expert says first: fragmentation -- 12.7 GiB free in pieces against a 2.76 GiB request.  Set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or take KV from one preallocated pool of fixed-size pages,
what vLLM's paged attention does).  Wrong advice: a smaller or more quantized model, a bigger GPU, empty_cache
(no segment is entirely free), inference_mode / no_grad (already on), gradient checkpointing, autocast, ZeRO.
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ"
MAX_ACTIVE = 20
KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2


class MixtralConfig(object):
    vocab_size = 32000
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_local_experts = 8
    num_experts_per_tok = 2
    num_key_value_heads = 8
    head_dim = 128


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


def packed4(n_weights):
    """AWQ's packed 4-bit weights (8 per int32 word), as bytes."""
    return nn.Parameter(torch.empty(n_weights // 2, dtype=torch.uint8, device="cuda"), requires_grad=False)


def fp16(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float16, device="cuda"), requires_grad=False)


class WQLinear_GEMM(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.qweight = packed4(in_features * out_features)
        self.scales = fp16(in_features // 128 * out_features)
        self.qzeros = packed4(in_features // 128 * out_features)

    def forward(self, x):
        tokens = x.nbytes // 2 // self.in_features
        return torch.empty(tokens * self.out_features, dtype=torch.float16, device="cuda")


class QuantAttentionFused(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
        self.qkv_proj = WQLinear_GEMM(h, h + 2 * kv)
        self.o_proj = WQLinear_GEMM(h, h)

    def forward(self, x, kv_cache):
        qkv = self.qkv_proj(x)                       # k and v are written into the scratch cache
        attn = torch.empty(x.nbytes // 2, dtype=torch.float16, device="cuda")
        del qkv
        return self.o_proj(attn)


class FusedSparseMoeBlock(nn.Module):
    """AutoAWQ's fused Mixtral MoE: the 8 experts' w1|w3 stacked in `ws`, their w2 in `w2s`, run by the fused_moe
    kernel, which makes its three intermediate caches for the call: [tokens, top_k, 2 x ffn],
    [tokens x top_k, ffn] and [tokens, top_k, hidden]."""

    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.cfg = cfg
        e, h, f = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        self.gate = fp16(e * h)
        self.ws = packed4(e * 2 * f * h)
        self.ws_scales = fp16(e * 2 * f * h // 128)
        self.w2s = packed4(e * f * h)
        self.w2s_scales = fp16(e * f * h // 128)

    def forward(self, x):
        h, f, k = self.cfg.hidden_size, self.cfg.intermediate_size, self.cfg.num_experts_per_tok
        tokens = x.nbytes // 2 // h
        intermediate_cache1 = torch.empty(tokens * k * 2 * f, dtype=torch.float16, device="cuda")
        intermediate_cache2 = torch.empty(tokens * k * f, dtype=torch.float16, device="cuda")
        del intermediate_cache1
        intermediate_cache3 = torch.empty(tokens * k * h, dtype=torch.float16, device="cuda")
        del intermediate_cache2
        out = torch.empty(tokens * h, dtype=torch.float16, device="cuda")      # sum over the top-2
        return out


class MixtralDecoderLayer(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.input_layernorm = fp16(cfg.hidden_size)
        self.self_attn = QuantAttentionFused(cfg)
        self.post_attention_layernorm = fp16(cfg.hidden_size)
        self.block_sparse_moe = FusedSparseMoeBlock(cfg)

    def forward(self, x, kv_cache):
        return self.block_sparse_moe(self.self_attn(x, kv_cache))


class MixtralAWQForCausalLM(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.embed_tokens = fp16(cfg.vocab_size * cfg.hidden_size)
        self.layers = ModuleList(MixtralDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = fp16(cfg.hidden_size)
        self.lm_head = fp16(cfg.vocab_size * cfg.hidden_size)

    @classmethod
    def from_quantized(cls, model_id, fuse_layers=True):
        return cls(MixtralConfig()).eval()

    def forward(self, n_tokens, cache):
        h = torch.empty(n_tokens * self.cfg.hidden_size, dtype=torch.float16, device="cuda")
        for layer in self.layers:
            h = layer(h, cache)
        # the whole prompt's logits, upcast to float32 (.float()) before sampling the last position
        return torch.empty(n_tokens * self.cfg.vocab_size, dtype=torch.float32, device="cuda")


class Request(object):
    def __init__(self, rid, prompt_len, max_new_tokens, will_generate):
        self.rid, self.prompt_len, self.max_new_tokens = rid, prompt_len, max_new_tokens
        self.will_generate = will_generate
        self.generated = 0
        self.kv = None


def arrivals(rng):
    """The access log of the morning it died, replayed tick by tick (one scheduler tick = 25 decode steps):
    chat turns and RAG prompts with retrieved passages."""
    rid = 0
    while True:
        batch = []
        for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4])):
            rid += 1
            if rng.random() < 0.4:
                prompt, max_new = rng.randint(2500, 7000), 1024
            else:
                prompt, max_new = rng.randint(150, 1800), 512
            batch.append(Request("req-%06d" % rid, prompt, max_new, rng.randint(40, max_new)))
        yield batch


class Server(object):
    def __init__(self, model):
        self.model = model
        self.active = {}
        self.waiting = []

    def prefill(self, batch):
        """One forward over the admitted prompts, right-padded to the longest (tokenizer(padding=True))."""
        longest = max(r.prompt_len for r in batch)
        tokens = len(batch) * longest
        # the prompts' K/V go to a scratch cache; once the first tokens are sampled each request's part is
        # moved into its own slot, sized for prompt + max_new_tokens so decode never reallocates
        prefill_kv = torch.empty(tokens * KV_BYTES_PER_TOKEN // 2, dtype=torch.float16, device="cuda")
        logits = self.model(tokens, prefill_kv)
        del logits                                       # sample(logits[:, -1]) with the custom sampler
        for req in batch:
            req.kv = torch.empty((req.prompt_len + req.max_new_tokens) * KV_BYTES_PER_TOKEN // 2,
                                 dtype=torch.float16, device="cuda")
            req.generated = 1
            self.active[req.rid] = req
        del prefill_kv

    def decode_steps(self, n):
        # one token per step for every active request (a few MiB of small blocks; each KV slot written in place)
        for req in self.active.values():
            req.generated += n

    def retire_finished(self):
        for rid in [rid for rid, r in self.active.items() if r.generated >= r.will_generate]:
            del self.active[rid]                         # its KV slot goes back to PyTorch's cache

    def serve(self, ticks):
        for new in ticks:
            self.waiting.extend(new)
            room = MAX_ACTIVE - len(self.active)
            batch, self.waiting = self.waiting[:room], self.waiting[room:]
            if batch:
                self.prefill(batch)
            self.decode_steps(25)
            self.retire_finished()


def main():
    model = MixtralAWQForCausalLM.from_quantized(MODEL_ID, fuse_layers=True)
    server = Server(model)
    with torch.inference_mode():
        server.serve(arrivals(random.Random(2026)))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
