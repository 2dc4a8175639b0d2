"""eval_retriever.py -- evaluating a dense retriever on a 8.8M-passage corpus: encode the corpus once
(embeddings kept on the GPU, fp16), then score every query against every passage in one matmul:

    with torch.no_grad():
        doc_emb = encode(corpus)                        # 8.8M x 768 fp16 = 12.6 GiB on the GPU
        q_emb = encode(queries)                         # 50k x 768 fp16
        scores = q_emb @ doc_emb.T                      # 50k x 8.8M fp16 = 880 GB
        top = scores.topk(1000, dim=1)

The score matrix alone is 880 GB: more than any GPU has, whatever else is on this one.  An expert:
split the operation -- score the queries in chunks of a few hundred against the corpus (or the
corpus in shards) and keep a running top-k, or use a FAISS index; not a bigger GPU, not
quantization or offloading of the 110M-parameter encoder, nothing to do with gradients.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Encoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(36 * MiB, device="cuda")))

    def forward(self, n_texts):
        out = torch.empty(n_texts * 768 * 2, device="cuda")        # fp16 embeddings
        return out


def encode(model, n_texts, chunk=400000):
    """Encodes in chunks, concatenated into one tensor on the GPU."""
    emb = torch.empty(n_texts * 768 * 2, device="cuda")
    for start in range(0, n_texts, chunk):
        part = model(min(chunk, n_texts - start))
        del part                                                  # copied into emb
    return emb


def evaluate(model, n_queries=50000, n_passages=8800000):
    with torch.no_grad():
        doc_emb = encode(model, n_passages)
        q_emb = encode(model, n_queries)
        scores = torch.empty(n_queries * n_passages * 2, device="cuda")     # q_emb @ doc_emb.T
        return scores


try:
    model = Encoder().cuda().eval()
    evaluate(model)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
