"""serve_adapters.py -- our "bring your own fine-tune" API: one Llama-3.1-8B-Instruct base (bf16, 15
GiB) on an A10G (24 GB), and each customer's LoRA adapter (r=64 on all seven projections, trained with
our notebook) loaded with PEFT the first time that customer calls; a static KV cache of 2048 tokens
per request (we compile the decode step):

    def handle(req):
        if req.customer not in model.peft_config:
            model.load_adapter(f"s3cache/{req.customer}", adapter_name=req.customer)
        model.set_adapter(req.customer)
        return model.generate(**enc, max_new_tokens=300, cache_implementation="static")

Fine in staging with three test customers.  In production it dies within the first hour, in the
middle of a request, after about a dozen customers have called.  Nothing is ever unloaded: every
adapter is upcast to float32 by PEFT (autocast_adapter_dtype) and stays on the GPU, 640 MiB each, so
memory steps up with every new customer until a request's cache no longer fits.

An expert: bound the adapters kept on the GPU -- an LRU of a few (model.delete_adapter on eviction,
the rest kept on CPU or disk and reloaded), or serve with an engine made for many LoRAs (vLLM/LoRAX
with max_loras and a CPU adapter cache: the adapters are swapped in per batch).  Loading them in bf16
halves each one but only delays it.  Not a smaller batch (requests are single), not quantizing or
offloading the base, not LoRA (they are LoRAs), not autograd (generate runs under no_grad), not the
allocator, and restarting the service only resets the clock.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN = 4096
LAYERS = 32
VOCAB = 128256
PROJ = {"q_proj": (4096, 4096), "k_proj": (4096, 1024), "v_proj": (4096, 1024), "o_proj": (4096, 4096),
        "gate_proj": (4096, 14336), "up_proj": (4096, 14336), "down_proj": (14336, 4096)}


def frozen_bf16(nbytes):
    return torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LoraWeights(torch.nn.Module):
    """One adapter's lora_A and lora_B of one projection (float32, frozen for inference)."""

    def __init__(self, in_f, out_f, r):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty((in_f + out_f) * r, dtype=torch.float32, device="cuda"),
                                         requires_grad=False)


class Adapters(torch.nn.Module):
    """peft's lora_A / lora_B ModuleDicts: one entry per adapter name."""


class LoraLinear(torch.nn.Module):
    def __init__(self, in_f, out_f):
        torch.nn.Module.__init__(self)
        self.in_f, self.out_f = in_f, out_f
        self.base_layer = frozen_bf16(in_f * out_f * 2)
        self.lora = Adapters()

    def update_layer(self, adapter_name, r):
        setattr(self.lora, adapter_name, LoraWeights(self.in_f, self.out_f, r))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, (i, o) in PROJ.items():
            setattr(self, name, LoraLinear(i, o))

    def projections(self):
        return [getattr(self, name) for name in PROJ]


class StaticCache(object):
    def __init__(self, max_cache_len, batch):
        self.key_value = [torch.empty(max_cache_len * batch * 2 * 8 * 128 * 2, dtype=torch.uint8, device="cuda")
                          for _ in range(LAYERS)]


class PeftLlama(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen_bf16(VOCAB * HIDDEN * 2)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = frozen_bf16(VOCAB * HIDDEN * 2)
        self.peft_config = {}
        self.active_adapter = None

    def load_adapter(self, path, adapter_name, r=64):
        for layer in self.layers:
            for proj in layer.projections():
                proj.update_layer(adapter_name, r)
        self.peft_config[adapter_name] = {"r": r, "path": path}

    def set_adapter(self, adapter_name):
        self.active_adapter = adapter_name

    def generate(self, prompt_len, max_new_tokens=300, cache_implementation="static", num_beams=1):
        with torch.no_grad():
            past_key_values = StaticCache(2048, 1)
            hidden = torch.empty(prompt_len * HIDDEN * 2, dtype=torch.uint8, device="cuda")
            mlp = torch.empty(prompt_len * 14336 * 2 * 2, dtype=torch.uint8, device="cuda")   # prefill gate/up
            del mlp
            for step in range(0, max_new_tokens, 50):
                logits = torch.empty(VOCAB * 4, dtype=torch.uint8, device="cuda")
                del logits
            del hidden
            return past_key_values is not None


def requests():
    """Production traffic: returning customers and, every few calls, a new one."""
    seen = []
    n = 0
    while True:
        n += 1
        if n % 3 == 1:
            seen.append("cust_%04d" % (1000 + 37 * len(seen)))
        yield {"customer": seen[(n * 7) % len(seen)] if n % 3 != 1 else seen[-1], "prompt_len": 900 + (n * 53) % 400}


def handle(model, req):
    if req["customer"] not in model.peft_config:
        model.load_adapter("s3cache/%s" % req["customer"], adapter_name=req["customer"])
    model.set_adapter(req["customer"])
    return model.generate(req["prompt_len"], max_new_tokens=300, cache_implementation="static")


def main():
    model = PeftLlama()
    model.eval()
    for i, req in enumerate(requests()):
        handle(model, req)
        if i > 10000:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
