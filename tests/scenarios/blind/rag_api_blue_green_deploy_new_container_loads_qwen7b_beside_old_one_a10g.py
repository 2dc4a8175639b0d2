"""serve.py -- the internal documentation assistant of a 40-person engineering company: a RAG API on Qwen2.5-7B-
Instruct (bf16, 14.2 GiB) with plain transformers + FastAPI, in a Docker container on a single-GPU cloud VM
(g5.2xlarge: one A10G, 24 GB, 22.5 GiB usable).  The model is loaded when the module is imported:

    model = AutoModelForCausalLM.from_pretrained("/models/qwen2.5-7b-instruct", torch_dtype=torch.bfloat16,
                                                 device_map="cuda")
    model.eval()
    app = FastAPI()

Deploys are "zero-downtime" by a blue/green script that CI runs on the VM:

    docker run -d --gpus all --name rag-api-$SHA -p 8001:8000 rag-api:$SHA      # green
    until curl -sf localhost:8001/healthz; do sleep 5; done                      # wait until it serves
    switch_nginx_upstream 8001 && docker stop rag-api-$OLD                       # then retire blue

It was written when the service ran Qwen2.5-3B (6.2 GB: two copies fit).  Since the switch to the 7B model the
next deploy fails: the green container's model load dies with CUDA out of memory at decoder layer 10 of 28,
the container exits 1, the health check never passes, CI times out and leaves blue serving.  Blue holds 16.8 GiB
(its weights, its CUDA context, and the PyTorch cache its requests left); the green process sees 5.2 GiB free
after its own context.  nvidia-smi inside the container shows the memory in use but no process: blue's
python runs in another container's pid namespace.

An expert: the memory belongs to another process -- the previous replica of this same service, still serving
-- and a second copy of a 14 GiB model cannot fit beside it on one 24 GB card.  Stop (or drain and stop) the
old container before starting the new one on this GPU (a recreate deploy with a short maintenance window, or
a rolling deploy across two GPU hosts / a second GPU); the new code is not at fault.  Wrong first advice:
quantizing or offloading the model so that two copies fit, a smaller batch or inference_mode (nothing runs yet:
this is the load), expandable_segments or empty_cache (nothing is cached in this process), set_device (the VM
has one GPU), restarting this process (the container is restarted in a loop already; blue is not a leftover),
a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 3584, 18944, 28, 28, 4, 128, 152064

# --------------------------------------------------------------------------------------------------------------
# What transformers does for from_pretrained(..., torch_dtype=torch.bfloat16, device_map="cuda"): the model is
# built on the meta device, then each checkpoint shard's tensors are materialized on the GPU one by one
# (accelerate's set_module_tensor_to_device).  Sized as Qwen2.5-7B-Instruct's checkpoint.


def _param(elements):
    return torch.nn.Parameter(torch.empty(elements, dtype=torch.bfloat16, device="cuda"))


class Qwen2Attention(torch.nn.Module):
    def load(self):
        self.q_proj = _param(HIDDEN * HEADS * HEAD_DIM + HEADS * HEAD_DIM)
        self.k_proj = _param(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.v_proj = _param(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.o_proj = _param(HEADS * HEAD_DIM * HIDDEN)


class Qwen2MLP(torch.nn.Module):
    def load(self):
        self.gate_proj = _param(HIDDEN * INTER)
        self.up_proj = _param(HIDDEN * INTER)
        self.down_proj = _param(INTER * HIDDEN)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention()
        self.mlp = Qwen2MLP()

    def load(self):
        self.input_layernorm = _param(HIDDEN)
        self.self_attn.load()
        self.post_attention_layernorm = _param(HIDDEN)
        self.mlp.load()


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        model = Qwen2ForCausalLM()                      # under init_empty_weights(): no memory yet
        model.embed_tokens = _param(VOCAB * HIDDEN)
        for i, layer in enumerate(model.layers):
            layer.load()
            sys.stdout.write("\rLoading checkpoint shards: layer %d/%d" % (i + 1, LAYERS))
            sys.stdout.flush()
        model.norm = _param(HIDDEN)
        model.lm_head = _param(VOCAB * HIDDEN)
        sys.stdout.write("\n")
        return model


# --------------------------------------------------------------------------------------------------------------
# serve.py (imported by `uvicorn serve:app` in the container)
MODEL_DIR = "/models/qwen2.5-7b-instruct"

try:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, torch_dtype=torch.bfloat16, device_map="cuda")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
model.eval()


class FastAPI(object):
    def get(self, path):
        return lambda f: f

    post = get


app = FastAPI()


@app.get("/healthz")
def healthz():
    return {"ok": True, "model": MODEL_DIR}


sys.exit(0)
