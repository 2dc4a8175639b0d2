"""An in-house continuous-batching server gives every request its own static KV cache (one K/V tensor per
layer, sized prompt + max_tokens) and frees it when the request ends; after the morning peak a 25k-token
document-QA request fails half-way through its cache although PyTorch holds 3.3 GiB cached and unused
(GeForce RTX 4090 24 GB, Llama-3.1-8B-Instruct bf16).

The real server (an asyncio front-end; the model loop below runs in one thread):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                 torch_dtype=torch.bfloat16).cuda().eval()
    free, _ = torch.cuda.mem_get_info()
    KV_BUDGET = int(free * 0.80)                    # bytes of KV the scheduler may hand out
    ...
    def admit(req):                                  # FIFO; byte budget; at most 32 running
        need = 32 * 2 * 8 * (req.prompt_len + req.max_tokens) * 128 * 2
        if kv_in_use + need > KV_BUDGET: return False
        req.kv = [torch.empty(2, 8, req.prompt_len + req.max_tokens, 128, dtype=torch.bfloat16,
                              device="cuda") for _ in range(32)]      # like a StaticCache per request
    ... each step (under torch.inference_mode): chunked prefill (4096 tokens) for new requests, one decode
    ... step for all; a finished request: del req.kv

Nothing is kept after a request: no leak.  But the chat turns' per-layer tensors (1.2k-2.5k tokens x
4 KiB = 5-10 MiB) are packed by PyTorch's caching allocator into shared 20 MiB segments (and into the
freed 112 MiB blocks of the prefill temporaries), requests end at random times, and after the morning
peak nearly every segment still holds a live slice of some request: the free memory is there, in holes
smaller than what a long request asks for.

Sizes (RTX 4090: 24564 MiB = 23.99 GiB; context ~0.5 GiB):
  weights bf16                                      14.96 GiB
  KV budget 0.80 x free after load                  6.7 GiB (55k tokens, 128 KiB a token)
  morning peak: 27 running + a queue of 70; PyTorch reserves 23.4 GiB, the device is full
  tick 230: a 24,000-token contract + max_tokens 1024 = 25,024 tokens = 3.05 GiB, 32 tensors of
    97.75 MiB; the budget says yes (3.4 GiB in use + 3.05 < 6.7); PyTorch's retry returns the few
    entirely free segments, ~18 layers get their tensor, the next 97.75 MiB fails with 28 MiB free on
    the device and 3.3 GiB reserved but unallocated, none of it a 98 MiB hole.

What an expert says first: fragmentation -- the cache holds 3.3 GiB free, more than the 1.3 GiB still
needed, but in holes smaller than 98 MiB; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets PyTorch
unmap the holes and map contiguous ranges; the durable fix is a paged KV cache (fixed-size blocks from
one preallocated pool, vLLM-style) instead of a static cache per request.  Wrong advice: a bigger GPU,
quantization or tensor parallelism (the bytes are there), smaller batches or shorter max_tokens as the
fix (they shrink the symptom, not the cause), empty_cache (PyTorch's own retry already returned every
entirely free segment; the holes sit in segments that hold live slices), inference_mode (the loop already
runs under it), killing other processes (there are none).
"""
import collections
import random
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

VOCAB = 128256
HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
KV_HEADS = 8
HEAD_DIM = 128
KV_BYTES_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2     # 128 KiB
MAX_RUNNING = 32
PREFILL_CHUNK = 4096
TOKENS_PER_TICK = 32          # the stand-in advances 32 decode steps per scheduler tick
PEAK_TICKS = 200
PEAK_ARRIVALS = (2, 3)
QUIET_ARRIVALS = (0, 1)
DOCQA_TICK = 230
DOCQA_PROMPT = 24000


def _weight(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        kv = KV_HEADS * HEAD_DIM
        self.q_proj = _weight(HIDDEN * HIDDEN)
        self.k_proj = _weight(HIDDEN * kv)
        self.v_proj = _weight(HIDDEN * kv)
        self.o_proj = _weight(HIDDEN * HIDDEN)
        self.gate_proj = _weight(HIDDEN * INTERMEDIATE)
        self.up_proj = _weight(HIDDEN * INTERMEDIATE)
        self.down_proj = _weight(INTERMEDIATE * HIDDEN)
        self.input_layernorm = _weight(HIDDEN)
        self.post_attention_layernorm = _weight(HIDDEN)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, LlamaDecoderLayer())
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(VOCAB * HIDDEN)

    def forward(self, num_tokens, num_seqs):
        """One engine step over num_tokens tokens of num_seqs sequences; the KV is written into the slots."""
        hidden = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        gate_up = torch.empty(num_tokens * 2 * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        act = torch.empty(num_tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        del gate_up, act
        logits = torch.empty(num_seqs * VOCAB, dtype=torch.float32, device="cuda")
        del hidden
        return logits


class Request(object):
    def __init__(self, rid, prompt_len, max_tokens, stop_after):
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.stop_after = stop_after          # where sampling hits EOS (unknown to the scheduler)
        self.prefilled = 0
        self.generated = 0
        self.kv = None

    def kv_bytes(self):
        return (self.prompt_len + self.max_tokens) * KV_BYTES_PER_TOKEN


class ContinuousBatcher(object):
    def __init__(self, model, kv_fraction=0.80):
        self.model = model
        free, total = torch.cuda.mem_get_info()
        self.kv_budget = int(free * kv_fraction)
        self.kv_in_use = 0
        self.waiting = collections.deque()
        self.running = []
        self.finished = 0
        print("KV budget %.1f GiB (%d tokens)" % (self.kv_budget / GiB, self.kv_budget // KV_BYTES_PER_TOKEN),
              flush=True)

    def submit(self, req):
        self.waiting.append(req)

    def admit(self):
        while self.waiting and len(self.running) < MAX_RUNNING:
            req = self.waiting[0]
            need = req.kv_bytes()
            if self.kv_in_use + need > self.kv_budget:
                break
            self.waiting.popleft()
            # the request's own static cache: per layer one [K/V, kv_heads, prompt + max_tokens, head_dim]
            req.kv = [torch.empty(2 * KV_HEADS * (req.prompt_len + req.max_tokens) * HEAD_DIM,
                                  dtype=torch.bfloat16, device="cuda") for _ in range(LAYERS)]
            self.kv_in_use += need
            self.running.append(req)

    def step(self):
        self.admit()
        with torch.inference_mode():
            prefill_tokens = 0
            for req in self.running:
                if req.prefilled < req.prompt_len and prefill_tokens < PREFILL_CHUNK:
                    n = min(PREFILL_CHUNK - prefill_tokens, req.prompt_len - req.prefilled)
                    req.prefilled += n
                    prefill_tokens += n
            decoding = [r for r in self.running if r.prefilled >= r.prompt_len]
            logits = self.model(prefill_tokens + len(decoding), max(1, len(decoding)))
            del logits
        for req in decoding:
            req.generated += TOKENS_PER_TICK
        for req in [r for r in decoding if r.generated >= r.stop_after]:
            self.running.remove(req)
            self.kv_in_use -= req.kv_bytes()
            req.kv = None                       # del req.kv: its tensors go back to PyTorch's cache
            self.finished += 1


def traffic(seed=2024):
    """The day's requests, compressed into scheduler ticks: the morning peak of chat and RAG turns from many
    tenants, then the quieter afternoon; at tick DOCQA_TICK the document-QA tenant sends a long contract."""
    rng = random.Random(seed)
    rid = 0
    tick = 0
    while True:
        arrivals = []
        for _ in range(rng.choice(PEAK_ARRIVALS if tick < PEAK_TICKS else QUIET_ARRIVALS)):
            rid += 1
            max_tokens = rng.choice((512, 1024))
            arrivals.append(Request("chat-%06d" % rid, rng.randint(700, 1500), max_tokens,
                                    rng.randint(32, max_tokens)))
        if tick == DOCQA_TICK:
            rid += 1
            arrivals.append(Request("docqa-%06d" % rid, DOCQA_PROMPT, 1024, 600))
        yield arrivals
        tick += 1


def serve_forever(batcher, source):
    for tick, arrivals in enumerate(source):
        for req in arrivals:
            batcher.submit(req)
        batcher.step()
        if tick % 50 == 0:
            print("tick %d: %d running, %d waiting, %d done, KV %.1f GiB"
                  % (tick, len(batcher.running), len(batcher.waiting), batcher.finished,
                     batcher.kv_in_use / GiB), flush=True)


def main():
    print("loading meta-llama/Llama-3.1-8B-Instruct (bf16) ...", flush=True)
    model = LlamaForCausalLM().cuda().eval()
    batcher = ContinuousBatcher(model, kv_fraction=0.80)
    serve_forever(batcher, traffic())


if __name__ == "__main__":
    main()
