"""rag_app.py -- an internal RAG assistant on one RTX A6000 (48 GiB).  The answer generator is
Qwen2.5-14B-Instruct in bf16 (28.2 GiB) in a transformers text-generation pipeline; retrieval uses a
bge-base embedder and a bge-reranker-base (0.4 + 0.5 GiB).  A teammate added query rewriting (turn
the user's follow-up into a standalone search query) with the same model and wrote it as its own
pipeline:

    answerer = pipeline("text-generation", model="Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16, device=0)
    rewriter = pipeline("text-generation", model="Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16, device=0)

The second pipeline loads a second, identical copy of the 14B weights; it fails about two thirds of the
way through its shards, at start-up (loading).  One copy would leave ~18 GiB for KV cache.

An expert: build the rewriter from the answerer's model and tokenizer
(pipeline("text-generation", model=answerer.model, tokenizer=answerer.tokenizer)) -- or just call
the answerer with the rewrite prompt: one set of weights.  Quantizing both copies, CPU offload or a
bigger GPU would pay for a copy that has no reason to exist; batch size and cache settings do not
matter at loading.
"""
import sys

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, layers, layer_bytes, embed_bytes):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(embed_bytes // 2, dtype=torch.bfloat16), requires_grad=False)
        for i in range(layers):
            setattr(self, "layers_%d" % i, nn.Parameter(torch.empty(layer_bytes // 2, dtype=torch.bfloat16), requires_grad=False))
        self.lm_head = nn.Parameter(torch.empty(embed_bytes // 2, dtype=torch.bfloat16), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls(48, 540 * MiB, 1480 * MiB)       # Qwen2.5-14B: 48 layers, 152k x 5120 embeddings and head


class BertModel(nn.Module):
    def __init__(self, nbytes):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nbytes // 4, dtype=torch.float32), requires_grad=False)


class TextGenerationPipeline(object):
    def __init__(self, model, tokenizer=None, device=0):
        self.model, self.tokenizer, self.device = model, tokenizer, device


def pipeline(task, model=None, tokenizer=None, torch_dtype=None, device=0):
    if isinstance(model, str):
        model = Qwen2ForCausalLM.from_pretrained(model, torch_dtype=torch_dtype)
    return TextGenerationPipeline(model, tokenizer or "Qwen2TokenizerFast", device)


def main():
    embedder = BertModel(418 * MiB)                 # bge-base-en-v1.5
    reranker = BertModel(530 * MiB)                 # bge-reranker-base
    answerer = pipeline("text-generation", model="Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16, device=0)
    rewriter = pipeline("text-generation", model="Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16, device=0)
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
