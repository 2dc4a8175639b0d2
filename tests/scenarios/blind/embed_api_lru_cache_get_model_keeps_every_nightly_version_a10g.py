"""embed_api.py -- the search team's embedding service on one A10G (24 GB, 22.5 GiB usable): a fine-tuned
multilingual-e5-large-instruct (560M params, served in float32 as exported: 2.1 GiB), FastAPI, one
uvicorn worker.  A retraining pipeline publishes a new version every night; clients name the version
they want (`model_version` in the request) so that an index is always queried with the model that built
it, and a rollback is a config change.  The loader is memoized:

    @functools.lru_cache(maxsize=None)
    def get_model(version):
        return AutoModel.from_pretrained(f"/models/e5-ft/{version}").cuda().eval()

    @app.post("/v1/embeddings")
    def embed(req):
        model = get_model(req.model_version)
        with torch.inference_mode():
            ...

maxsize=None keeps every version ever asked for, forever, on the GPU: each nightly rollout adds 2.1 GiB
and nothing is ever released (the old versions are still asked for during the hour the indexes are
rebuilt, then never again).  The pod has been up 10 days; the usage grew a step per night; after the
10th rollout the first request for the new version fails in its forward pass: 10 versions = 20.8 GiB
resident leave no room for a batch's 0.5 GiB of activations (the 1 GiB the cache holds is in pieces).

An expert: the cache that holds the models is unbounded: bound it (lru_cache(maxsize=2): the current
version and the previous one) or evict old versions explicitly (del + gc.collect + empty_cache), or
keep the non-current versions on the CPU.  Wrong first advice: a smaller batch (requests are small),
quantization or loading in bf16 (halves the step, fails on day 17), expandable_segments or
empty_cache alone (the models are live, referenced by the lru_cache), a bigger GPU (it only delays
the same failure).
"""
import functools
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12_600_000 * 4, device="cuda"), requires_grad=False)


class E5Model(torch.nn.Module):
    def __init__(self, version):
        torch.nn.Module.__init__(self)
        self.version = version
        self.embeddings = torch.nn.Module()
        self.embeddings.word_embeddings = torch.nn.Parameter(torch.empty(250_002 * 1024 * 4, device="cuda"),
                                                             requires_grad=False)
        for i in range(24):
            setattr(self, "layer_%d" % i, XLMRobertaLayer())

    def forward(self, batch, seq_len):
        tokens = batch * seq_len
        hidden = torch.empty(tokens * 1024 * 4, device="cuda")
        for i in range(24):
            inter = torch.empty(tokens * 4096 * 4, device="cuda")
            nxt = torch.empty(tokens * 1024 * 4, device="cuda")
            del inter
            hidden = nxt
        pooled = torch.empty(batch * 1024 * 4, device="cuda")
        del hidden
        return pooled


@functools.lru_cache(maxsize=None)
def get_model(version):
    return E5Model(version).cuda().eval()


def embed(req):
    model = get_model(req["model_version"])
    with torch.inference_mode():
        vecs = model(req["batch"], req["seq_len"])
    return vecs.nbytes


def nightly_versions():
    for day in range(1, 13):
        yield "2026-11-%02d" % (20 + day) if day <= 10 else "2026-12-%02d" % (day - 10)


try:
    previous = None
    for version in nightly_versions():
        # the hour after a rollout: the old version still serves queries while indexes are rebuilt
        for i in range(3):
            if previous is not None:
                embed({"model_version": previous, "batch": 32, "seq_len": 512})
            embed({"model_version": version, "batch": 64, "seq_len": 512})
        print("rollout", version, "resident %.1f GiB" % (torch.cuda.memory_allocated() / (1 << 30)),
              "cached versions", get_model.cache_info().currsize)
        previous = version
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
