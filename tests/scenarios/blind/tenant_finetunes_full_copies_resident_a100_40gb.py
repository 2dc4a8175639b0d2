"""tenant_server.py -- a B2B writing assistant: every customer (tenant) gets its own full fine-tune of
Llama-3.2-3B-Instruct (bf16, 6.0 GiB each; all of its weights were trained, no adapters).  One
A100 40GB serves them all.  The server keeps the tenants' models resident in an LRU registry so that
the next request of a tenant does not reload 6 GiB from disk:

    class ModelRegistry:
        def __init__(self, max_resident=8):            # "8 x 3B, that is only 24B parameters"
            self.resident = OrderedDict()
        def get(self, tenant):
            if tenant not in self.resident:
                if len(self.resident) >= self.max_resident:
                    self.resident.popitem(last=False)  # evict the least recently used
                self.resident[tenant] = load_tenant_model(tenant)   # from_pretrained(..., bf16, cuda)
            self.resident.move_to_end(tenant)
            return self.resident[tenant]

Monday morning, tenants log in one after the other.  Six models fit (36 GiB); the seventh tenant's
load fails long before the eviction at eight can trigger.  Each request's own memory (prompt, KV
cache of ~250 MiB) is freed after the request.

An expert: bound the registry by the memory it may use, not by a count picked by hand: at most
five resident on this card (evict to host RAM, which reloads in a second, not from disk); or
serve the tenants as LoRA adapters over one shared base (S-LoRA / vLLM multi-LoRA) and retrain
them that way.  Not a smaller batch, not shorter prompts, not load_in_bf16 (they are bf16), not
empty_cache (nothing is cached: every byte is a live model).
"""
import collections
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

CONFIG = dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, kv_dim=1024)


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["kv_dim"], cfg["intermediate_size"]
        self.q_proj = Linear(h, h)
        self.k_proj = Linear(h, kv)
        self.v_proj = Linear(h, kv)
        self.o_proj = Linear(h, h)
        self.gate_proj = Linear(h, ff)
        self.up_proj = Linear(h, ff)
        self.down_proj = Linear(ff, h)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(cfg["vocab_size"], cfg["hidden_size"])      # tied with the head
        for i in range(cfg["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(cfg))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        return cls(CONFIG)

    def generate(self, prompt, max_new_tokens=512):
        past_key_values = []
        for _ in range(max_new_tokens // 64):
            past_key_values.append(torch.empty(28 * 2 * 64 * 1024 * 2 * 4, device="cuda"))
        out = torch.empty(max_new_tokens * 8, device="cuda")
        return out


def load_tenant_model(tenant):
    return LlamaForCausalLM.from_pretrained("/models/tenants/%s/llama-3.2-3b-ft" % tenant,
                                            torch_dtype=torch.bfloat16, device_map="cuda")


class ModelRegistry(object):
    def __init__(self, max_resident=8):
        self.max_resident = max_resident
        self.resident = collections.OrderedDict()

    def get(self, tenant):
        if tenant not in self.resident:
            if len(self.resident) >= self.max_resident:
                self.resident.popitem(last=False)
            self.resident[tenant] = load_tenant_model(tenant)
        self.resident.move_to_end(tenant)
        return self.resident[tenant]


registry = ModelRegistry(max_resident=8)


def handle(tenant, prompt_tokens):
    model = registry.get(tenant)
    with torch.inference_mode():
        prompt = torch.empty(prompt_tokens * 8, device="cuda")
        out = model.generate(prompt, max_new_tokens=512)
    return out.nbytes


MONDAY = ["acme", "acme", "globex", "initech", "acme", "umbrella", "hooli", "globex", "stark", "wayne",
          "hooli", "acme", "tyrell"]

try:
    for tenant in MONDAY:
        handle(tenant, 900)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
