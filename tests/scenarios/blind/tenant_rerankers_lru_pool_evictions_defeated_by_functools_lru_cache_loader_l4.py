"""Multi-tenant reranking service on one L4: every tenant has its own fine-tuned Qwen2.5-1.5B cross-encoder, and
the server keeps at most 4 of them on the GPU, evicting the least recently used -- but a colleague later put
@functools.lru_cache on the loader "so a returning tenant does not reload from disk", and that cache keeps every
model it ever returned.  Evictions free nothing; the 8th distinct tenant of the morning cannot be loaded.

The real code (rerank_server.py, FastAPI, one uvicorn worker, one L4):

    @functools.lru_cache(maxsize=None)                  # added in a "tenant switches are slow" PR
    def load_tenant_model(tenant_id):
        return AutoModelForSequenceClassification.from_pretrained(
            f"/models/rerankers/{tenant_id}", torch_dtype=torch.bfloat16).to("cuda").eval()

    class ModelPool:                                    # at most MAX_LOADED models on the GPU
        def get(self, tenant_id):
            if tenant_id in self.loaded:
                self.loaded.move_to_end(tenant_id); return self.loaded[tenant_id]
            if len(self.loaded) >= MAX_LOADED:
                old_id, old_model = self.loaded.popitem(last=False)
                del old_model; gc.collect(); torch.cuda.empty_cache()
                log.info("evicted %s", old_id)
            self.loaded[tenant_id] = load_tenant_model(tenant_id)
            return self.loaded[tenant_id]

    @torch.inference_mode()
    def rerank(tenant_id, query, passages):             # 32 passages x 384 tokens
        model = pool.get(tenant_id)
        return model(**tok([query] * len(passages), passages, ...).to("cuda")).logits.float().cpu()

The arithmetic (L4, 23034 MiB):
  one reranker: Qwen2.5-1.5B, 1.54B params in bf16 = 2.87 GiB
  designed: context 0.5 + 4 x 2.87 + ~1 GiB of cached activations = ~13 GiB
  actual: the lru_cache holds every model loaded since start; after 7 distinct tenants, 7 x 2.87 = 20.1 GiB of
  weights are live while the pool believes it holds 4 (its log shows an eviction before each load, and
  "loaded ...: 20.1 GiB allocated" for tenants that come back: the cache hands back the old object); the 8th
  distinct tenant (cyberdyne) fails part way through its load, on a 26 MiB weight with 16 MiB free.  ~1.2 GiB
  sits in cached blocks split by weights loaded among earlier activations, but 2.3 GiB of the model are still
  to load: even a perfectly packed cache would not hold an 8th model (0.5 + 8 x 2.87 = 23.5 GiB > 22.5).

What an expert says first: the evicted models are still referenced -- by the lru_cache on load_tenant_model --
so memory grows by one model per new tenant.  Remove the cache (or bound it to the pool's size, or
load_tenant_model.cache_clear()/a cache of CPU state dicts), so eviction really drops the last reference.
Wrong advice: empty_cache (the server calls it; the weights are live tensors), expandable_segments, a smaller
batch, mixed precision / gradient checkpointing (bf16 inference already), another process, a bigger GPU
first (any card fills up, one tenant at a time).
"""
import collections
import functools
import gc
import logging

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

log = logging.getLogger("rerank_server")
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

MAX_LOADED = 4
HIDDEN, INTERMEDIATE, N_LAYERS, KV_DIM, VOCAB = 1536, 8960, 28, 256, 151936
PASSAGES, PASSAGE_TOKENS = 32, 384


def _bf16_param(n):
    return nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = _bf16_param(HIDDEN * HIDDEN + HIDDEN)
        self.k_proj = _bf16_param(HIDDEN * KV_DIM + KV_DIM)
        self.v_proj = _bf16_param(HIDDEN * KV_DIM + KV_DIM)
        self.o_proj = _bf16_param(HIDDEN * HIDDEN)
        self.gate_proj = _bf16_param(HIDDEN * INTERMEDIATE)
        self.up_proj = _bf16_param(HIDDEN * INTERMEDIATE)
        self.down_proj = _bf16_param(INTERMEDIATE * HIDDEN)
        self.input_layernorm = _bf16_param(HIDDEN)
        self.post_attention_layernorm = _bf16_param(HIDDEN)

    def forward(self, hidden_states):
        tokens = hidden_states.nbytes // (2 * HIDDEN)
        qkv = torch.empty(tokens * (HIDDEN + 2 * KV_DIM), dtype=torch.bfloat16, device="cuda")
        attn = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")      # SDPA output
        del qkv
        gate_up = torch.empty(tokens * INTERMEDIATE * 2, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del gate_up, attn
        return out


class Layers(nn.Module):
    def __init__(self, n):
        nn.Module.__init__(self)
        for i in range(n):
            setattr(self, str(i), Qwen2DecoderLayer())


class Qwen2ForSequenceClassification(nn.Module):
    def __init__(self, name):
        nn.Module.__init__(self)
        self.name_or_path = name
        self.embed_tokens = _bf16_param(VOCAB * HIDDEN)
        self.layers = Layers(N_LAYERS)
        self.norm = _bf16_param(HIDDEN)
        self.score = _bf16_param(HIDDEN)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls(path)

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for layer in self.layers._modules.values():
            h = layer(h)
        return torch.empty(PASSAGES * 4, device="cuda")     # one score per passage, .float()


@functools.lru_cache(maxsize=None)
def load_tenant_model(tenant_id):
    return Qwen2ForSequenceClassification.from_pretrained(
        "/models/rerankers/%s" % tenant_id, torch_dtype=torch.bfloat16).to("cuda").eval()


class ModelPool(object):
    def __init__(self, max_loaded=MAX_LOADED):
        self.max_loaded = max_loaded
        self.loaded = collections.OrderedDict()

    def get(self, tenant_id):
        if tenant_id in self.loaded:
            self.loaded.move_to_end(tenant_id)
            return self.loaded[tenant_id]
        if len(self.loaded) >= self.max_loaded:
            old_id, old_model = self.loaded.popitem(last=False)
            del old_model
            gc.collect()
            torch.cuda.empty_cache()
            log.info("evicted %s (%d models in the pool)", old_id, len(self.loaded))
        self.loaded[tenant_id] = load_tenant_model(tenant_id)
        log.info("loaded %s: %.1f GiB allocated", tenant_id, torch.cuda.memory_allocated() / 2**30)
        return self.loaded[tenant_id]


pool = ModelPool()


def rerank(tenant_id, query, passages):
    model = pool.get(tenant_id)
    with torch.inference_mode():
        input_ids = torch.empty(len(passages) * PASSAGE_TOKENS * 8, device="cuda")
        scores = model(input_ids)
    return scores.nbytes


def morning_traffic():
    """The request log replayed by the load balancer: (tenant, query, passages), tenants arriving as their
    business day starts."""
    order = ["acme", "globex", "acme", "initech", "umbrella", "globex", "acme", "hooli", "initech",
             "stark", "acme", "umbrella", "wayne", "globex", "hooli", "acme", "cyberdyne", "stark",
             "wonka", "acme", "tyrell"]
    for i, tenant in enumerate(order):
        for r in range(5):
            yield tenant, "query %d" % i, ["passage"] * PASSAGES


def main():
    for n, (tenant, query, passages) in enumerate(morning_traffic()):
        rerank(tenant, query, passages)
    log.info("served %d requests", n + 1)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
