"""summarize_reports.py -- batch summarization of long reports with a 13B model (fp16, 24.6 GiB) split
over a workstation's two 24 GB cards by `device_map="auto"`, with plain `LD_PRELOAD=liboomguard.so`:

    model = AutoModelForCausalLM.from_pretrained("/models/13b-chat", torch_dtype=torch.float16,
                                                 device_map="auto")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=1024, num_beams=1,
                             cache_implementation="static")     # batch 4, up to 4096 tokens

device_map="auto" fills the first card (up to its total less a 2 GiB margin) before it uses the
second: the embeddings and 36 of the 40 decoder layers go to cuda:0 (21.9 GiB), the last 4 layers
and the head to cuda:1 (2.7 GiB).  The static KV cache is allocated by generate() beside each layer,
320 MiB per layer for 4 x 4096 tokens: 11.25 GiB on cuda:0 where 1.5 GiB are free, 1.25 GiB on
cuda:1 where 20.8 GiB are free.  It runs out on cuda:0 while laying out the cache of the 5th layer.

An expert: the model and its cache fit the two cards together (24.6 + 12.5 GiB of 47 GiB); the split
is lopsided.  Balance it: device_map="balanced" (or max_memory={0: "12GiB", 1: "14GiB"} to leave
room for the cache on the first card), 20 layers per card: 12.3 GiB of weights and 6.25 GiB of cache
each.  Not a bigger card, not quantization or CPU offload (slow and unneeded), not inference_mode (already on),
expandable segments or empty_cache (nothing is cached), and no other process is involved.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

CONFIG = {"num_hidden_layers": 40, "hidden_size": 5120, "vocab_size": 32000, "layer_bytes": 615 * MiB}
batch_size = 4
max_length = 4096


class DecoderLayer(torch.nn.Module):
    def __init__(self, nbytes, device):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(nbytes // 3 // 2, dtype=torch.float16, device=device))
        self.mlp = torch.nn.Parameter(torch.empty((nbytes - nbytes // 3) // 2, dtype=torch.float16, device=device))
        self.device = device


class StaticCache(object):
    """transformers' StaticCache: key and value tensors of (batch, heads, max_cache_len, head_dim) for
    every layer, on that layer's device, made before the first token."""

    def __init__(self, config, max_batch_size, max_cache_len, devices):
        self.key_cache, self.value_cache = [], []
        per = max_batch_size * max_cache_len * config["hidden_size"]        # fp16 elements, K or V
        for layer_device in devices:
            self.key_cache.append(torch.empty(per, dtype=torch.float16, device=layer_device))
            self.value_cache.append(torch.empty(per, dtype=torch.float16, device=layer_device))


def infer_auto_device_map(config, n_devices, budget_bytes):
    """accelerate's "auto": fill device 0 up to its budget, then the next."""
    device_map, dev, used = [], 0, config["vocab_size"] * config["hidden_size"] * 2   # embeddings, cuda:0
    for _ in range(config["num_hidden_layers"]):
        if used + config["layer_bytes"] > budget_bytes and dev + 1 < n_devices:
            dev, used = dev + 1, 0
        device_map.append(dev)
        used += config["layer_bytes"]
    return device_map


class CausalLM(torch.nn.Module):
    def __init__(self, config, device_map):
        torch.nn.Module.__init__(self)
        self.config = config
        emb = config["vocab_size"] * config["hidden_size"]
        self.embed_tokens = torch.nn.Parameter(torch.empty(emb, dtype=torch.float16, device=device_map[0]))
        self.layers = []
        for i, dev in enumerate(device_map):
            layer = DecoderLayer(config["layer_bytes"], dev)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(emb, dtype=torch.float16, device=device_map[-1]))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        n = torch.cuda.device_count()
        budget = torch.cuda.get_device_properties(0).total_memory - 2 * GiB   # accelerate keeps a margin
        return cls(CONFIG, infer_auto_device_map(CONFIG, n, budget))

    def generate(self, input_ids, max_new_tokens=1024, num_beams=1, cache_implementation="static"):
        past_key_values = StaticCache(self.config, batch_size, max_length,
                                      [layer.device for layer in self.layers])
        out = torch.empty(batch_size * max_new_tokens * 8, device=self.layers[-1].device)
        return out, past_key_values


def main():
    model = CausalLM.from_pretrained("/models/13b-chat", torch_dtype=torch.float16, device_map="auto")
    model.eval()
    for doc in range(3):
        input_ids = torch.empty(batch_size * 3072 * 8, device=0)
        with torch.inference_mode():
            summary = model.generate(input_ids, max_new_tokens=1024, num_beams=1, cache_implementation="static")
        del summary


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
