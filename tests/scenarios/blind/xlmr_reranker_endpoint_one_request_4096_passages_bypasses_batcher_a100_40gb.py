"""rerank_server.py -- the reranking stage of a search API: a cross-encoder (XLM-RoBERTa-large, 560M
parameters, fp16, 1.04 GiB) on one A100 40GB.  Small requests go through a dynamic batcher (up to 64 pairs,
5 ms window); a request that already has more pairs than that is run as it is, on the theory that it is a
batch already:

    MAX_BATCH = 64
    @torch.inference_mode()
    def score(self, query, passages):
        pairs = [(query, p) for p in passages]
        if len(pairs) > MAX_BATCH:
            return self._forward(pairs)                  # "already a batch"
        return self.batcher.submit(pairs)
    def _forward(self, pairs):
        enc = self.tok(pairs, padding=True, truncation=True, max_length=512, return_tensors="pt").to("cuda")
        return self.model(**enc).logits.squeeze(-1)

For months the retriever sent the top 100.  A new client (an offline evaluation job of another team) sends
the top 4,096 passages of each query, long enough to be truncated to 512 tokens: one request becomes one
forward pass over 4,096 x 512 tokens.  The embeddings alone are 4 GiB, Q/K/V of the first layer 12 GiB, and
the first layer's attention scores (eager attention: 4,096 x 16 heads x 512 x 512, fp16) ask for 32 GiB in one
block: CUDA out of memory on a card that runs the usual 100-pair requests with room to spare.

An expert: one request is the whole peak -- split large requests into chunks of MAX_BATCH pairs (loop
_forward over pairs[i:i+64] and concatenate the scores), or cap the passages a request may send.  Inference
mode and fp16 are already on; fused attention would remove the 32 GiB block but still leave a 4,096-pair
pass of ~30 GiB of hidden states and FFN activations; empty_cache, expandable segments, quantizing the 1 GiB
of weights or a bigger card are not the answer.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

MAX_BATCH = 64
HIDDEN, HEADS, MAX_LEN = 1024, 16, 512


class XLMRobertaSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float16, device="cuda"))
        self.key = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float16, device="cuda"))
        self.value = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float16, device="cuda"))

    def forward(self, hidden_states, n_pairs, seq_len):
        q = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        k = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        v = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        # attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = torch.empty(n_pairs * HEADS * seq_len * seq_len, dtype=torch.float16, device="cuda")
        probs = torch.empty(n_pairs * HEADS * seq_len * seq_len, dtype=torch.float16, device="cuda")
        del attention_scores
        ctx = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        del q, k, v, probs
        return ctx


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = XLMRobertaSelfAttention()
        self.attn_out = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float16, device="cuda"))
        self.intermediate = torch.nn.Parameter(torch.empty(HIDDEN * 4096, dtype=torch.float16, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty(4096 * HIDDEN, dtype=torch.float16, device="cuda"))

    def forward(self, hidden_states, n_pairs, seq_len):
        a = self.attention(hidden_states, n_pairs, seq_len)
        inter = torch.empty(n_pairs * seq_len * 4096, dtype=torch.float16, device="cuda")
        out = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")
        del a, inter
        return out


class XLMRobertaForSequenceClassification(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(torch.empty(250002 * HIDDEN, dtype=torch.float16, device="cuda"))
        self.n_layers = n_layers
        for i in range(n_layers):
            setattr(self, "layer_%d" % i, XLMRobertaLayer())
        self.classifier = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN + HIDDEN, dtype=torch.float16,
                                                         device="cuda"))

    def forward(self, input_ids, attention_mask, n_pairs, seq_len):
        h = torch.empty(n_pairs * seq_len * HIDDEN, dtype=torch.float16, device="cuda")   # embeddings
        for i in range(self.n_layers):
            h = getattr(self, "layer_%d" % i)(h, n_pairs, seq_len)
        logits = torch.empty(n_pairs * 2, dtype=torch.float16, device="cuda")
        return logits


class RerankServer(object):
    def __init__(self):
        self.model = XLMRobertaForSequenceClassification().cuda().eval()
        self.queue = []

    def _forward(self, pairs):
        seq_len = min(MAX_LEN, max(len(q.split()) + len(p.split()) for q, p in pairs))   # padding=True
        input_ids = torch.empty(len(pairs) * seq_len * 8, device="cuda")
        attention_mask = torch.empty(len(pairs) * seq_len * 8, device="cuda")
        return self.model(input_ids, attention_mask, len(pairs), seq_len)

    def score(self, query, passages):
        with torch.inference_mode():
            pairs = [(query, p) for p in passages]
            if len(pairs) > MAX_BATCH:
                return self._forward(pairs)              # "already a batch"
            return self._forward(pairs)                  # (the batcher pads a window of requests the same way)


def main():
    server = RerankServer()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    passage = " ".join(["word"] * 600)
    for i in range(40):                                  # the search API's traffic: top-100 of each query
        server.score("query %d" % i, [passage] * 100)
    server.score("eval query 1", [passage] * 4096)       # the evaluation job's first request


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
