"""serve_rag.py -- a single-process RAG API on one L40S (48 GiB): an in-process LLM engine (vLLM's
LLM class) serving Qwen2.5-32B-Instruct-AWQ (4-bit, 18.4 GiB of weights), plus, in the same
process, the retrieval models, created after the engine:

    llm = LLM(model="Qwen/Qwen2.5-32B-Instruct-AWQ", quantization="awq", gpu_memory_utilization=0.92,
              max_model_len=32768)
    embedder = SentenceTransformer("BAAI/bge-m3", device="cuda")                             # fp32, 2.2 GiB
    reranker = FlagLLMReranker("BAAI/bge-reranker-v2-gemma", use_fp16=True)   # 2.5B, fp16, 4.7 GiB

The engine profiles a forward pass (and empties the cache), then preallocates its paged KV cache so that the process uses
92% of the card: 48 x 0.92 - 0.5 GiB context - 18.4 GiB of weights - 2 GiB of activation reserve
= ~23.2 GiB of KV blocks, all allocated (not cached).  The remaining ~5.8 GiB is all the embedder and
reranker get (6.9 GiB): the embedder loads, and the reranker fails while loading.  The engine itself never
failed.

An expert: the engine's KV preallocation took the card -- lower gpu_memory_utilization (e.g.
0.75) or max_model_len / max_num_seqs so that the retrieval models fit; the model is already 4-bit,
a smaller batch is meaningless at loading, and empty_cache/expandable_segments cannot touch
allocated KV blocks.
"""
import sys

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Qwen2AWQ(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(64):
            setattr(self, "layers_%d_qweight" % i, nn.Parameter(torch.empty(272 * MiB, dtype=torch.uint8), requires_grad=False))
        self.embed_tokens = nn.Parameter(torch.empty(740 * MiB, dtype=torch.uint8), requires_grad=False)
        self.lm_head = nn.Parameter(torch.empty(740 * MiB, dtype=torch.uint8), requires_grad=False)


class LLM(object):
    def __init__(self, model, quantization=None, gpu_memory_utilization=0.9, max_model_len=32768):
        self.model = Qwen2AWQ()
        profile = [torch.empty(2 * GiB)]                     # the profiling run's activations
        del profile
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        budget = int(total * gpu_memory_utilization) - (total - free) - 2 * GiB
        block_bytes = 64 * MiB                               # 16 tokens x 64 layers x 2 x 8 heads x 128 x fp16, x 256 per tensor
        self.kv_cache = [torch.empty(block_bytes) for _ in range(budget // block_bytes)]


class BertEncoder(nn.Module):
    def __init__(self, nbytes):
        super().__init__()
        for i in range(24):
            setattr(self, "layer_%d" % i, nn.Parameter(torch.empty(nbytes // 24 // 4, dtype=torch.float32), requires_grad=False))


def SentenceTransformer(name, device="cuda"):
    return BertEncoder(2200 * MiB).eval()


class GemmaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(470 * MiB, dtype=torch.float16), requires_grad=False)
        for i in range(18):
            setattr(self, "layer_%d" % i, nn.Parameter(torch.empty(108 * MiB, dtype=torch.float16), requires_grad=False))


def FlagLLMReranker(name, use_fp16=True):
    return GemmaModel().eval()


def main():
    llm = LLM(model="Qwen/Qwen2.5-32B-Instruct-AWQ", quantization="awq", gpu_memory_utilization=0.92,
              max_model_len=32768)
    embedder = SentenceTransformer("BAAI/bge-m3", device="cuda")
    reranker = FlagLLMReranker("BAAI/bge-reranker-v2-gemma", use_fp16=True)
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
