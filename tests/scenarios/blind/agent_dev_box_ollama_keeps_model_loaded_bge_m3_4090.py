"""agent.py -- a developer's tool-calling agent on a workstation with one RTX 4090 (24 GiB).  The
agent's LLM runs in Ollama (a separate server process, `ollama serve`, started at login; it keeps
the last model loaded -- a 32B model in Q4, ~19 GiB -- for its keep_alive).  The agent's retrieval
tool runs in this Python process: bge-m3 (568M, fp32, 2.2 GiB) for the query and passage embeddings
and a bge-reranker-v2-m3 (568M, fp16, 1.1 GiB):

    embedder = BGEM3FlagModel("BAAI/bge-m3", use_fp16=False)       # .cuda()
    reranker = FlagReranker("BAAI/bge-reranker-v2-m3", use_fp16=True)
    with torch.inference_mode():
        vecs = embedder.encode(passages, batch_size=32, max_length=1024)

The embedder fits; the reranker's weights fit; the first encode batch's attention fails: this process
holds 3.9 GiB in all (its context included), the other 19 GiB are Ollama's (NVML lists it; this process's allocator has
nothing cached).

An expert: the memory is held by another process -- unload the Ollama model (keep_alive=0 /
`ollama stop`, OLLAMA_KEEP_ALIVE) or stop the server while indexing, or run the retrieval models on
the CPU; a smaller batch only postpones it, empty_cache/expandable_segments change nothing, and
quantizing this process's 3 GiB of models does not address the 19 GiB.
"""
import sys

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class XLMRobertaLarge(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.embeddings = nn.Parameter(torch.empty(250 * MiB, dtype=dtype), requires_grad=False)   # 250M x 1024
        for i in range(24):
            setattr(self, "layer%d" % i, nn.Parameter(torch.empty(25 * MiB // 2, dtype=dtype), requires_grad=False))

    def forward(self, batch_size, max_length):
        hidden = torch.empty(batch_size * max_length * 1024 * 4)
        scores = torch.empty(batch_size * 16 * max_length * max_length * 4)     # attention probabilities, fp32
        return hidden, scores


def encode(model, passages, batch_size=32, max_length=1024):
    out = []
    for i in range(0, len(passages), batch_size):
        hidden, scores = model(batch_size, max_length)
        out.append(torch.empty(batch_size * 1024 * 4))
        del hidden, scores
    return out


def main():
    embedder = XLMRobertaLarge(torch.float32)       # BGEM3FlagModel(use_fp16=False)
    reranker = XLMRobertaLarge(torch.float16)       # FlagReranker(use_fp16=True)
    passages = ["passage %d" % i for i in range(4096)]
    with torch.inference_mode():
        vecs = encode(embedder, passages, batch_size=32, max_length=1024)
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
