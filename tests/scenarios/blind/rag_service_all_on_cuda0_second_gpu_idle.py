"""rag_server.py -- a retrieval-augmented QA service on a box with two 24 GiB GPUs (2 x A10G).  The
config names a device for the embedding model only; everything else says "cuda", which is GPU 0:

    embedder = SentenceTransformer("BAAI/bge-m3", device="cuda:1")                         # GPU 1
    index = torch.load("passages_pq.pt").to("cuda")                  # 12M passages, PQ codes: 5.1 GiB
    reranker = AutoModelForSequenceClassification.from_pretrained(
        "BAAI/bge-reranker-large", torch_dtype=torch.float16).to("cuda")               # 1.1 GiB
    generator = AutoModelForCausalLM.from_pretrained(
        "meta-llama/Meta-Llama-3-8B-Instruct", torch_dtype=torch.bfloat16).to("cuda")   # 15 GiB
    generator.generation_config.cache_implementation = "static"      # for torch.compile's decode
    ...
    with torch.inference_mode():
        out = generator.generate(**tok(prompts, return_tensors="pt", padding=True).to("cuda"),
                                 max_new_tokens=512)          # 8 questions x ~3.5k tokens of passages

Everything loads: GPU 0 holds 21.2 GiB (the index, product-quantised to 5.1 GiB, the reranker and
the generator), GPU 1 only the 1.1 GiB embedder.  The first batch of 8 questions generates with
~3.5k tokens of retrieved passages each: the KV cache (128 KiB a token, 4 GiB) and the prefill's
activations need ~5.5 GiB more on GPU 0: the static cache is allocated layer by layer before the
prefill and fails at layer 18 of 32, while GPU 1 has 22 GiB free.
Nothing leaks, nothing else runs on the box.  An expert: place the work on both GPUs -- the index
(or the reranker) on cuda:1 next to the embedder, or the generator split with device_map="auto";
quantization or a smaller model are not needed, a bigger GPU neither.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Weights(torch.nn.Module):
    def __init__(self, n, mib, device):
        torch.nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(mib * MiB, device=device), requires_grad=False))


def generate(generator, prompt_tokens, max_new_tokens, batch=8, layers=32):
    """model.generate with the static cache: the keys and values of every layer for the whole batch and
    length are allocated first (128 KiB a token over 32 layers, bf16), then the prefill runs."""
    kv = []
    for layer in range(layers):
        kv.append(torch.empty(batch * (prompt_tokens + max_new_tokens) * 4 * KiB, device="cuda"))
    for layer in range(layers):
        act = torch.empty(batch * prompt_tokens * 14336 * 2 * 2, device="cuda")     # MLP intermediate
        del act
    return kv


KiB = 1 << 10


def main():
    embedder = Weights(8, 136, "cuda:1")                              # bge-m3, fp16
    index = torch.empty(5220 * MiB, device="cuda")                    # passage vectors, fp16
    reranker = Weights(8, 136, "cuda")                                # bge-reranker-large, fp16
    generator = Weights(30, 512, "cuda")                              # Llama-3-8B, bf16
    for batch in range(1000):
        with torch.inference_mode():
            q = torch.empty(8 * 1024 * 2, device="cuda:1")            # question embeddings
            scores = torch.empty(8 * 12 * MiB, device="cuda")         # index @ q
            out = generate(generator, 3584, 512)
            del q, scores, out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
