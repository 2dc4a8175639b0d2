"""rerank_server.py -- a RAG service's reranking endpoint serves a fine-tuned 7B LLM reranker (bf16,
13.5 GiB) on a 24 GiB L4.  A background thread watches the training bucket and hot-swaps the weights
when a new fine-tune lands:

    model = LlmReranker.from_pretrained(path, torch_dtype=torch.bfloat16).cuda().eval()
    ...
    def reload(ckpt):
        state = torch.load(ckpt)                  # no map_location: restored onto cuda:0, where it was saved
        model.load_state_dict(state)

Serving holds the weights (13.5 GiB) and its request buffers (2 GiB); torch.load restores the new
state dict straight onto the GPU, a second full copy of the weights next to the one being served,
and fails about half way through the shards.  The job was loading, not serving, when it failed.

An expert: load the checkpoint into host memory (torch.load(ckpt, map_location="cpu")) and let
load_state_dict copy it into the parameters already on the GPU (one copy); quantizing or a smaller
batch is not the fix, nor is a bigger GPU for what is a 13.5 GiB model.
"""
import json
import os
import sys
import tempfile

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

SHARDS = ["model.embed_tokens.weight"] + ["model.layers.%d.weight" % i for i in range(32)] + ["score.weight"]
SIZES = {"model.embed_tokens.weight": 500 * MiB, "score.weight": 8 * MiB}


class LlmReranker(nn.Module):
    def __init__(self):
        super().__init__()
        for name in SHARDS:
            n = SIZES.get(name, 416 * MiB) // 2
            setattr(self, name.replace(".", "_"), nn.Parameter(torch.empty(n, dtype=torch.bfloat16), requires_grad=False))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def forward(self, pairs):
        return torch.empty(len(pairs) * 4096 * 2)


def reload(model, ckpt):
    state = torch.load(ckpt)                      # restored onto the GPU it was saved from
    model.load_state_dict(state)


def main():
    work = tempfile.mkdtemp()
    ckpt = os.path.join(work, "reranker-ft-0412.pt")
    with open(ckpt, "w") as f:                    # the fine-tune's checkpoint (tensor sizes in bytes)
        json.dump(dict((name.replace(".", "_"), SIZES.get(name, 416 * MiB)) for name in SHARDS), f)
    model = LlmReranker.from_pretrained("/models/reranker-7b", torch_dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        request_buffers = [torch.empty(256 * MiB) for _ in range(8)]      # the serving batch's buffers
        scores = model(["q/d pair"] * 64)
    reload(model, ckpt)
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
