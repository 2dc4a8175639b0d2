"""hybrid_search.py -- the reranking stage of a legal-document search API: BGE-M3 (568M parameters, fp16, 1.1 GiB)
on one 24 GB A10G scores the top 40 candidates of each query with its multi-vector (ColBERT) output.  Documents
recur across queries, so the author memoised the per-document encoding:

    @functools.lru_cache(maxsize=None)
    def doc_colbert_vecs(doc_id):
        enc = tokenizer(store[doc_id], truncation=True, max_length=8192, return_tensors="pt").to("cuda")
        out = model(**enc, return_colbert_vecs=True)
        return out["colbert_vecs"].float()          # [n_tokens, 1024] on the GPU

    with torch.inference_mode():
        for query in queries:
            q = query_colbert_vecs(query)
            scores = [maxsim(q, doc_colbert_vecs(d)) for d in candidates(query)]

Contracts and rulings are long (4-8k tokens), so one document's vectors are 16-32 MiB of float32, and the cache
has no bound: each query adds ~30 new documents (~0.7 GiB).  It served the first two dozen queries; then,
with ~20 GiB of cached document vectors on the card (and ~2.6 GiB of cache holes where freed FFN blocks were
split for them), encoding the next document runs out at a 60 MiB FFN intermediate.

An expert: memory grew query after query and the lru_cache is what keeps it -- give the cache a bound
(maxsize, an LRU by bytes), or cache on the CPU / store the vectors in fp16 on the host (or precompute them into
an index off the GPU).  Not a smaller batch, shorter documents, quantization or a bigger card (any card fills
up), not inference_mode (on already), not the allocator's cache.
"""
import functools
import random
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, VOCAB = 1024, 4096, 24, 250002


def fp16(n_elems):
    return torch.empty(n_elems, dtype=torch.float16, device="cuda")


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.n_out = n_out
        self.weight = torch.nn.Parameter(fp16(n_in * n_out))

    def forward(self, x, tokens):
        return fp16(tokens * self.n_out)


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = Linear(HIDDEN, 3 * HIDDEN)
        self.attn_out = Linear(HIDDEN, HIDDEN)
        self.intermediate = Linear(HIDDEN, FFN)
        self.output = Linear(FFN, HIDDEN)

    def forward(self, hidden, tokens):
        inter = self.intermediate(hidden, tokens)      # attention (SDPA) elided: smaller than the FFN
        out = self.output(inter, tokens)
        del inter
        return out


class BGEM3Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(fp16(VOCAB * HIDDEN))
        self.layers = []
        for i in range(LAYERS):
            layer = XLMRobertaLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.colbert_linear = Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids, tokens, return_colbert_vecs=True):
        hidden = fp16(tokens * HIDDEN)
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        colbert = self.colbert_linear(hidden, tokens)
        dense = fp16(HIDDEN)
        return {"dense_vecs": dense, "colbert_vecs": colbert}


model = None
doc_lengths = {}


def tokenize(n_tokens):
    return torch.empty(n_tokens * 8, dtype=torch.uint8, device="cuda")


@functools.lru_cache(maxsize=None)
def doc_colbert_vecs(doc_id):
    n_tokens = doc_lengths[doc_id]
    out = model(tokenize(n_tokens), n_tokens, return_colbert_vecs=True)
    return torch.empty(n_tokens * HIDDEN, dtype=torch.float32, device="cuda")   # out["colbert_vecs"].float()


def query_colbert_vecs(n_tokens):
    out = model(tokenize(n_tokens), n_tokens, return_colbert_vecs=True)
    return out["colbert_vecs"]


def maxsim(q, d):
    return 0.0


def main():
    global model
    rng = random.Random(20261203)
    corpus = ["doc-%06d" % i for i in range(200000)]
    for d in corpus[:4000]:
        doc_lengths[d] = rng.randint(4096, 8192)
    with torch.inference_mode():
        model = BGEM3Model()
        model.eval()
        torch._C._cuda_attach_out_of_memory_observer(
            lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))   # truth mark (test scaffolding)
        for qn in range(500):
            q = query_colbert_vecs(rng.randint(12, 64))
            hot = [corpus[rng.randint(0, 299)] for _ in range(10)]            # popular documents recur
            fresh = [corpus[rng.randint(300, 3999)] for _ in range(30)]
            scores = [maxsim(q, doc_colbert_vecs(d)) for d in hot + fresh]
            if qn % 10 == 0:
                info = doc_colbert_vecs.cache_info()
                print("query", qn, "cached documents", info.currsize, "scores", len(scores))


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer, at the failure
sys.exit(0)
