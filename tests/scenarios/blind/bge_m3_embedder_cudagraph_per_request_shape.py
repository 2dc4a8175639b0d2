"""embed_server.py -- a semantic-search embedding service on BGE-M3 (568M parameters, fp16: 1.1 GiB)
on one 24 GB card.  To cut latency the team wrapped the model in torch.compile(mode="reduce-overhead"),
which records a CUDA graph per input shape; the tokenizer pads each request only to its own longest
text, so batch sizes 1-64 and lengths 8-512 (any multiple of 8) all occur:

    model = torch.compile(AutoModel.from_pretrained("BAAI/bge-m3", torch_dtype=torch.float16).cuda().eval(),
                          mode="reduce-overhead")
    @app.post("/embed")
    def embed(texts):
        batch = tokenizer(texts, padding=True, truncation=True, max_length=512, return_tensors="pt").to("cuda")
        with torch.inference_mode():
            return model(**batch).last_hidden_state[:, 0].float().cpu()

Each new (batch, length) shape captures a graph with its own private memory pool: the static
output and the pool's workspace (sized for that shape's activations) stay reserved as long as the
graph lives, which is for the life of the process.  After about a hundred distinct shapes the pools
hold ~20 GiB, and capturing the next shape fails.  A restart helps only for a few hours.

An expert: too many captured shapes -- pad requests to a few fixed buckets of batch and length (or
mark the dims dynamic / cap the number of graphs, or compile without cudagraphs).  It is already
fp16 inference under inference_mode; empty_cache cannot free graph pools of live graphs;
expandable segments, a smaller batch, quantization or a bigger card only postpone it.
"""
import random
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(24 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class BGEM3Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(245 * MiB, dtype=torch.float16, device="cuda"),
                                             requires_grad=False)
        for i in range(24):
            setattr(self, "layer%d" % i, XLMRobertaLayer())


class CUDAGraphRecord(object):
    """What cudagraph trees keep per captured shape: the graph, its private pool, its static output."""

    def __init__(self, pool, static_output):
        self.pool = pool
        self.static_output = static_output


class CompiledEmbedder(object):
    """torch.compile(model, mode="reduce-overhead"): a graph recorded per input shape."""

    def __init__(self, model):
        self.model = model
        self.graphs = {}

    def record(self, batch, length):
        pool = (1, len(self.graphs) + 1)
        tokens = batch * length
        # capture: the forward's activations are allocated in the graph's private pool (workspace),
        # then the static output; the pool keeps its segment for replays
        workspace = torch.empty(tokens * 48 * 1024, device="cuda", pool_id=pool)
        del workspace
        static_output = torch.empty(tokens * 1024 * 2, device="cuda", pool_id=pool)
        return CUDAGraphRecord(pool, static_output)

    def __call__(self, batch, length):
        key = (batch, length)
        if key not in self.graphs:
            self.graphs[key] = self.record(batch, length)
        return self.graphs[key].static_output


def main():
    model = BGEM3Model().eval()
    compiled = CompiledEmbedder(model)
    rng = random.Random(2026)
    for request in range(100000):
        batch = rng.choice([1, 1, 2, 4, 8, 16, 24, 32, 48, 64])
        length = 8 * rng.randint(1, 64)
        with torch.inference_mode():
            out = compiled(batch, length)
            cls = torch.empty(batch * 1024 * 4, device="cuda")
        del out, cls


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
