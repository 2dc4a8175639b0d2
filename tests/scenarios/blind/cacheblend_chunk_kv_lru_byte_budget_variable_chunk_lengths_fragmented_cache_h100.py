"""A RAG answering service with CacheBlend-style KV reuse, written in-house on plain PyTorch + transformers
modelling code: Llama-3.1-8B-Instruct in bf16 on one H100 80GB HBM3 (79.65 GiB usable).  Each retrieved chunk's
KV cache is computed once (the chunk prefilled alone), kept on the GPU and reused by every later question that
retrieves the chunk; a question's context is the concatenation of its chunks' KV plus a selective recompute of
~15% of the tokens.  The chunk store (kvstore.py):

    class ChunkKVStore:                                  # chunk id -> KV of all layers, ONE tensor per chunk
        def put(self, chunk_id, kv):                     # kv: (layers, 2, tokens, kv_heads, head_dim) bf16
            self.entries[chunk_id] = kv
            self.bytes += kv.nbytes
            while self.bytes > self.budget_bytes:        # LRU by bytes, budget 46 GiB
                _, old = self.entries.popitem(last=False)
                self.bytes -= old.nbytes

    blended = torch.cat([store.get(c) for c in chunk_ids], dim=2)     # the question's context KV, contiguous

Chunks are document sections, not fixed windows: 96 to 2,048 tokens (12 to 256 MiB of KV at 128 KiB per token:
32 layers x 8 KV heads x 128 x 2 x 2 B).  A question's blended KV is 12 chunks plus room for the answer:
~0.6-2 GiB, and up to 6 questions are in flight at once (continuous batching; each drops its blended KV when its
answer ends).  Weights 14.96 GiB + context 0.5 GiB + store 46 GiB + a 224 MiB activation workspace leaves ~18 GiB
of headroom, and for the first hour that is plenty.  But every tensor is a different size: a freed 180 MiB
chunk's block is reused by a 100 MiB one and the 80 MiB left over waits for something small enough; a freed
1.4 GiB blended KV is carved into chunk entries and smaller blends.  The caching allocator's segments end up
holding live chunks with holes between them.  The live bytes never pass the budget, but ~770 questions in (the
store full for an hour or so), 14 GiB is reserved but unallocated in pieces, the driver has 185 MiB left, and a
question's torch.cat of 1.2 GiB finds no hole big enough: OOM in blend_context, with the store at 45.9 GiB of
its 46.

What an expert says first: fragmentation, not capacity -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
lets the allocator map the freed pieces into one range; the lasting fix is to store chunk KV in fixed-size
pages (a paged pool of 16-token blocks, as vLLM/LMCache do) and give the attention a block table instead of a
contiguous cat.  A smaller store budget also leaves more slack.  Wrong advice: fewer questions in flight (six
blends are ~7 GiB; the 14 GiB of holes are the problem), quantizing the weights, inference_mode (on), training
knobs, a bigger GPU as the fix (the holes grow with it), empty_cache (the allocator already released every
entirely free segment before failing).
"""
import collections
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = 1024 ** 3

# Llama-3.1-8B-Instruct
HIDDEN, INTERMEDIATE, NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256
KV_BYTES_PER_TOKEN = NUM_LAYERS * 2 * NUM_KV_HEADS * HEAD_DIM * 2          # 128 KiB

CHUNK_STORE_BUDGET = 46 * GiB
TOP_K = 12
MAX_NEW_TOKENS = 512
RECOMPUTE_RATIO = 0.15
MAX_PREFILL_TOKENS = 4096


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Parameter(torch.empty(HIDDEN * 6144, dtype=BF16), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=BF16), requires_grad=False)
        self.gate_up_proj = nn.Parameter(torch.empty(HIDDEN * 2 * INTERMEDIATE, dtype=BF16), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(INTERMEDIATE * HIDDEN, dtype=BF16), requires_grad=False)

    def forward(self, hidden_states, num_tokens, workspace):
        # qkv, attention, gate_up, down: written into the server's preallocated activation workspace
        return hidden_states


class LlamaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16), requires_grad=False)
        self.layers = nn.Module()
        for i in range(NUM_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * VOCAB, dtype=BF16), requires_grad=False)

    def forward(self, num_tokens, kv_out, workspace):
        """Prefill num_tokens; each layer writes its K and V into kv_out (the chunk's or the question's tensor)."""
        hidden_states = torch.empty(num_tokens * HIDDEN, dtype=BF16)
        for i in range(NUM_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states, num_tokens, workspace)
        return hidden_states


class ChunkKVStore(object):
    def __init__(self, budget_bytes):
        self.budget_bytes = budget_bytes
        self.entries = collections.OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0

    def get(self, chunk_id):
        kv = self.entries.get(chunk_id)
        if kv is not None:
            self.entries.move_to_end(chunk_id)
            self.hits += 1
        return kv

    def put(self, chunk_id, kv):
        self.misses += 1
        self.entries[chunk_id] = kv
        self.bytes += kv.nbytes
        while self.bytes > self.budget_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.nbytes


class Corpus(object):
    """The indexed handbook/contract sections: chunk id -> token count (the vector index itself is on the CPU)."""

    def __init__(self, n, seed=3):
        rng = random.Random(seed)
        self.lengths = []
        for _ in range(n):
            r = rng.random()
            if r < 0.55:
                self.lengths.append(rng.randint(96, 480))
            elif r < 0.9:
                self.lengths.append(rng.randint(480, 1200))
            else:
                self.lengths.append(rng.randint(1200, 2048))
        self._rng = rng

    def search(self, question, k):
        """Top-k chunk ids: popular sections come back often (a Zipf-like mix), the rest is long tail."""
        ids = set()
        while len(ids) < k:
            ids.add(min(int(self._rng.paretovariate(0.6)) - 1, len(self.lengths) - 1))
        return sorted(ids)


class BlendServer(object):
    def __init__(self, corpus):
        self.model = LlamaModel()
        self.model.eval()
        self.corpus = corpus
        self.store = ChunkKVStore(CHUNK_STORE_BUDGET)
        self.answer_lengths = random.Random(11)
        # activations of one prefill of up to MAX_PREFILL_TOKENS, allocated once (gate_up is the largest)
        self.workspace = torch.empty(MAX_PREFILL_TOKENS * 2 * INTERMEDIATE, dtype=BF16)

    def chunk_kv(self, chunk_id):
        kv = self.store.get(chunk_id)
        if kv is None:
            n = self.corpus.lengths[chunk_id]
            kv = torch.empty(n * KV_BYTES_PER_TOKEN // 2, dtype=BF16)     # (layers, 2, n, kv_heads, head_dim)
            self.model(n, kv, self.workspace)                             # the chunk prefilled alone
            self.store.put(chunk_id, kv)
        return kv

    def blend_context(self, chunk_ids, question_tokens):
        chunks = [self.chunk_kv(c) for c in chunk_ids]
        tokens = sum(self.corpus.lengths[c] for c in chunk_ids) + question_tokens
        # torch.cat(chunks, dim=2), with the answer's room after it
        blended = torch.empty((tokens + MAX_NEW_TOKENS) * KV_BYTES_PER_TOKEN // 2, dtype=BF16)
        del chunks
        self.model(int(tokens * RECOMPUTE_RATIO), blended, self.workspace)   # selective recompute
        return blended, tokens

    def admit(self, question):
        """A new question: retrieve, fetch or compute its chunks' KV, blend."""
        chunk_ids = self.corpus.search(question, TOP_K)
        blended, tokens = self.blend_context(chunk_ids, 64)
        return {"question": question, "kv": blended, "tokens": tokens,
                "steps_left": self.answer_lengths.randint(2, 12)}   # replayed: the answer's length in 64-token steps

    def decode_step(self, batch):
        """64 decode steps of the in-flight questions (continuous batching); their KV is written in place."""
        logits = torch.empty(len(batch) * VOCAB * 4)
        for q in batch:
            q["steps_left"] -= 1


def serve(server, questions, max_concurrent=6):
    """The API's worker: up to 6 questions in flight; a new one is admitted as soon as there is room."""
    inflight = []
    with torch.inference_mode():
        for n, question in enumerate(questions):
            inflight.append(server.admit(question))
            while len(inflight) >= max_concurrent or (n == len(questions) - 1 and inflight):
                server.decode_step(inflight)
                inflight = [q for q in inflight if q["steps_left"] > 0]     # finished answers drop their KV


def main():
    server = BlendServer(Corpus(30000))
    serve(server, ["q-%05d" % i for i in range(5000)])


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
