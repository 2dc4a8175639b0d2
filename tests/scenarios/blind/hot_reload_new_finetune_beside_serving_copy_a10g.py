"""chat_server.py -- a support chatbot on one A10G (24 GB, 22.5 GiB usable): Llama-3.1-8B-Instruct
fine-tuned on our tickets, bf16 (15.0 GiB), served by a small hand-written server.  The training team
publishes a new fine-tune every night; the server hot-swaps it without a restart:

    def reload(self, path):
        new_model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="cuda")
        new_model.eval()
        self.model = new_model              # the old one is freed here

The new model is built while `self.model` (the old one) still serves: two copies, 30 GiB, on a
22.5 GiB card.  The first nightly reload fails about a third of the way through the new model's layers; the
requests in flight at that moment hold 1.4 GiB of KV cache.  (It was tested on an 80 GB card, where
both copies fit.)

An expert: never hold two copies: load the new weights into the serving model's own parameters
(read the new state dict onto the CPU and copy_ it in place, tensor by tensor, under a lock), or
drain, drop the old model (`del self.model; gc.collect(); torch.cuda.empty_cache()`) and then load the
new one.  Not load_in_bf16 (it is bf16), not a smaller batch or KV cache (1.4 GiB of requests is not
the problem), not quantization of a model that fits, not a cache or fragmentation problem.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

CONFIG = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, kv_dim=1024)


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
        self.embed_tokens = Linear(cfg["vocab_size"], cfg["hidden_size"])
        for i in range(cfg["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(cfg))
        self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"])

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        return cls(CONFIG)


class Request(object):
    def __init__(self, prompt_tokens):
        # this request's KV cache: 32 layers x (k, v) x tokens x 1024 x bf16
        self.kv = torch.empty(32 * 2 * (prompt_tokens + 1024) * 1024 * 2, device="cuda")


class ChatServer(object):
    def __init__(self, path):
        self.model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="cuda")
        self.model.eval()
        self.in_flight = []

    def reload(self, path):
        new_model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="cuda")
        new_model.eval()
        self.model = new_model

    def serve(self, prompts):
        with torch.inference_mode():
            self.in_flight = [Request(n) for n in prompts]


server = ChatServer("/models/support-llama-8b/2026-12-01")
try:
    server.serve([1500, 2200, 800, 3100])
    server.reload("/models/support-llama-8b/2026-12-02")      # the nightly hot swap
    server.serve([1200, 900])
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
