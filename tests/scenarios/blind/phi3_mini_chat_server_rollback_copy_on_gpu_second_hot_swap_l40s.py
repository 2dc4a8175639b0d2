"""chat_server.py -- a support-chat model server (Phi-3-mini, 3.8B parameters, bf16, 7.1 GiB) on one L40S
(48 GB), with its own paged KV cache preallocated at start (28 GiB: 32 layers x 14 GiB of K and V blocks)
and an admin endpoint that hot-swaps the weights when the fine-tuning pipeline publishes a new version.  So
that a bad version can be rolled back at once, the swap keeps the previous model warm on the GPU:

    class ChatServer:
        def __init__(self, path):
            self.model = from_pretrained(path)                   # torch_dtype=bf16, straight to cuda
            self.kv_cache = PagedKVCache(num_blocks=..., layers=32)
            self.previous_model = None
        def reload(self, path):                                  # POST /admin/reload
            new_model = from_pretrained(path)
            self.previous_model, self.model = self.model, new_model   # rollback = swap back

The first reload (v1) went fine: v0 + v1 + KV cache = 42.7 GiB.  At the second reload (v2) the server holds
v0 (the rollback copy), v1 (serving) and the KV cache, and building v2 runs out of memory three quarters of the
way through its layers.  The checkpoint is already read with map_location="cpu" and loaded in bf16; serving
runs under inference_mode; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set in the deployment.

An expert: the rollback copy is the extra 7 GiB -- keep the previous version's weights in host memory (a CPU
state_dict, or just the path to reload it from disk) and move them back on rollback; only one model then lives
on the GPU beside the new one during a swap.  Not empty_cache or fragmentation settings, not smaller batches,
not quantizing the serving model; shrinking the KV cache would make room but cuts serving capacity for a copy
that is idle.
"""
import os
import sys
import tempfile

import torch
from torch.serialization import _HostTensor

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, VOCAB, N_LAYERS = 3072, 32064, 32
SHAPES = {"self_attn.qkv_proj.weight": HIDDEN * 3 * HIDDEN, "self_attn.o_proj.weight": HIDDEN * HIDDEN,
          "mlp.gate_up_proj.weight": HIDDEN * 2 * 8192, "mlp.down_proj.weight": 8192 * HIDDEN}


class Phi3DecoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.qkv_proj = torch.nn.Parameter(torch.empty(SHAPES["self_attn.qkv_proj.weight"], dtype=dtype, device="cuda"))
        self.o_proj = torch.nn.Parameter(torch.empty(SHAPES["self_attn.o_proj.weight"], dtype=dtype, device="cuda"))
        self.gate_up_proj = torch.nn.Parameter(torch.empty(SHAPES["mlp.gate_up_proj.weight"], dtype=dtype,
                                                           device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(SHAPES["mlp.down_proj.weight"], dtype=dtype, device="cuda"))


class Phi3ForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))
        for i in range(N_LAYERS):
            setattr(self, "layers_%d" % i, Phi3DecoderLayer(dtype))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))

    def forward(self, input_ids, kv_cache):
        return torch.empty(input_ids.nbytes // 8 * VOCAB * 2, device="cuda")     # last-token logits


def from_pretrained(path, torch_dtype=torch.bfloat16):
    """transformers-style load: the state dict read on the CPU, the model built on the GPU in bf16, the
    weights copied in."""
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    model = Phi3ForCausalLM(torch_dtype)
    model.load_state_dict(state_dict)
    return model.eval()


class PagedKVCache(object):
    def __init__(self, gib, layers):
        per_layer = int(gib * (1 << 30)) // layers // 2
        self.k_blocks = [torch.empty(per_layer, dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
        self.v_blocks = [torch.empty(per_layer, dtype=torch.bfloat16, device="cuda") for _ in range(layers)]


class ChatServer(object):
    def __init__(self, path):
        self.model = from_pretrained(path)
        self.kv_cache = PagedKVCache(gib=14, layers=N_LAYERS)       # 14 Gi bf16 elements: 28 GiB
        self.previous_model = None

    def chat(self, n_tokens):
        with torch.inference_mode():
            input_ids = torch.empty(n_tokens * 8, device="cuda")
            logits = self.model(input_ids, self.kv_cache)
            return logits.nbytes

    def reload(self, path):
        new_model = from_pretrained(path)
        self.previous_model, self.model = self.model, new_model


def publish(dirname, version):
    """The fine-tuning pipeline's export (test scaffolding: the stand-in's checkpoint format)."""
    sd = {"model.embed_tokens.weight": _HostTensor(VOCAB * HIDDEN * 2), "lm_head.weight": _HostTensor(VOCAB * HIDDEN * 2)}
    for i in range(N_LAYERS):
        for k, n in SHAPES.items():
            sd["model.layers.%d.%s" % (i, k)] = _HostTensor(n * 2)
    path = os.path.join(dirname, "phi3-support-%s.pt" % version)
    torch.save(sd, path)
    return path


def main():
    with tempfile.TemporaryDirectory() as ckpt_dir:
        server = ChatServer(publish(ckpt_dir, "v0"))
        # truth mark at the failure itself (test scaffolding)
        torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
        for version in ("v1", "v2"):
            for i in range(50):
                server.chat(n_tokens=600)
            server.reload(publish(ckpt_dir, version))


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
