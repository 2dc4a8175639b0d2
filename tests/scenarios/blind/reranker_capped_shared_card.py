"""rerank_server.py -- a cross-encoder reranking service (560M parameters, fp16, eager attention)
that shares one 24 GiB card with the team's embedding service.  The two were sized to split the
card: the embedding service runs with set_per_process_memory_fraction(0.5) and holds its ~12 GiB,
the reranker with 0.45:

    torch.cuda.set_per_process_memory_fraction(0.45)          # 10.8 GiB: the rest is the embedder's
    model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=torch.float16).cuda()
    @app.post("/rerank")
    def rerank(query, candidates):                              # usually 32 candidates
        batch = tok([query] * len(candidates), candidates, truncation=True, max_length=512,
                    padding="max_length", return_tensors="pt").to("cuda")
        with torch.inference_mode():
            return model(**batch).logits[:, 0].tolist()

Requests of 32 candidates run at ~2 GiB.  A new client sends 1024 candidates in one call: one
layer's attention scores (1024 x 16 x 512 x 512 x 2 bytes = 8 GiB) do not fit under the cap, and
the card has only ~6 GiB free beyond what the reranker holds (the embedding service's share is
in use).  Raising the cap cannot help and would starve the embedder.  An expert: score the
candidates in micro-batches (e.g. 64 at a time), or cap the number of candidates per request.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
HEADS, HIDDEN, SEQ = 16, 1024, 512


class CrossEncoder(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        for i in range(n_layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(44 * MiB, device="cuda")))
        self.embeddings = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.n_layers = n_layers

    def forward(self, input_ids, bsz):
        h = torch.empty(bsz * SEQ * HIDDEN * 2, device="cuda")
        for _ in range(self.n_layers):
            qkv = torch.empty(bsz * SEQ * HIDDEN * 3 * 2, device="cuda")
            scores = torch.empty(bsz * HEADS * SEQ * SEQ * 2, device="cuda")
            ctx = torch.empty(bsz * SEQ * HIDDEN * 2, device="cuda")
            del scores, qkv
            h = ctx
        return torch.empty(bsz * 2 * 2, device="cuda")


def main():
    torch.cuda.set_per_process_memory_fraction(0.45)
    model = CrossEncoder().eval()
    for req in range(400):
        n = 1024 if req == 300 else 32
        with torch.inference_mode():
            input_ids = torch.empty(n * SEQ * 8, device="cuda")
            logits = model(input_ids, n)
            del logits, input_ids
        time.sleep(0.001)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
