"""embed_api.py -- a small embedding service for our search team: e5-mistral-7b-instruct (7.1B
parameters, published as bf16 safetensors, 13.2 GiB) behind FastAPI on one NVIDIA L4 (24 GB, 22.5 GiB
usable).  The startup hook:

    model = AutoModel.from_pretrained("intfloat/e5-mistral-7b-instruct", device_map="cuda")
    model.eval()

No torch_dtype: transformers builds the model in torch's default dtype, float32, and upcasts every
bf16 tensor of the checkpoint while it loads.  The weights become 26.5 GiB; the service dies at
startup around layer 26 of 32, before it has embedded a single query.  (On the A100 we prototyped
on, the fp32 model fit and nobody noticed.)

An expert: pass `torch_dtype=torch.bfloat16` (or "auto"): the checkpoint's own dtype, 13.2 GiB,
leaves 9 GiB for batches of queries on the L4.  Quantization or a bigger card would also do, but
are not needed.  Not autocast (it does not shrink the stored weights), not a smaller batch (nothing
ran yet), not a cache or fragmentation problem.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# config.json of intfloat/e5-mistral-7b-instruct
CONFIG = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8, torch_dtype="bfloat16")


# --- the part of transformers this service goes through (modeling_utils.from_pretrained) ---------
class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out, dtype, device):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=dtype, device=device))


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype, device):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["hidden_size"] // 4, cfg["intermediate_size"]
        self.q_proj = Linear(h, h, dtype, device)
        self.k_proj = Linear(h, kv, dtype, device)
        self.v_proj = Linear(h, kv, dtype, device)
        self.o_proj = Linear(h, h, dtype, device)
        self.gate_proj = Linear(h, ff, dtype, device)
        self.up_proj = Linear(h, ff, dtype, device)
        self.down_proj = Linear(ff, h, dtype, device)


class MistralModel(torch.nn.Module):
    def __init__(self, cfg, dtype, device):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(cfg["vocab_size"], cfg["hidden_size"], dtype, device)
        for i in range(cfg["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, MistralDecoderLayer(cfg, dtype, device))

    def forward(self, input_ids):
        return torch.empty(len(input_ids) * 512 * 4096 * 2, device="cuda")


class AutoModel(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, device_map=None):
        # no torch_dtype: the model is built in torch.get_default_dtype() (float32) and each tensor
        # of the bf16 safetensors shards is upcast as it is loaded into it, layer by layer
        dtype = torch_dtype or torch.get_default_dtype()
        return _load_pretrained_model(CONFIG, dtype, device_map or "cpu")


def _load_pretrained_model(cfg, dtype, device):
    return MistralModel(cfg, dtype, device)
# ------------------------------------------------------------------------------------------------


app_state = {}


def startup():
    model = AutoModel.from_pretrained("intfloat/e5-mistral-7b-instruct", device_map="cuda")
    model.eval()
    app_state["model"] = model


def embed(texts):
    with torch.inference_mode():
        return app_state["model"](texts)


try:
    startup()
    embed(["query: how do I rotate an API key"] * 32)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
