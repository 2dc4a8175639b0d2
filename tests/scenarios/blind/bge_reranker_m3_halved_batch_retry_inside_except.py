"""rerank_eval.py -- offline reranking for our RAG evaluation set: 1.2M (query, passage) pairs scored
with BAAI/bge-reranker-v2-m3 (XLM-RoBERTa-large, 568M parameters, fp16: 1.06 GiB) on a g5.xlarge
(one A10G, 22.5 GiB), eager attention, max_length=1024 (the passages are long: most batches pad to
1024), under torch.inference_mode():

    def score(pairs, batch_size):
        try:
            return run_batches(model, pairs, batch_size)
        except torch.OutOfMemoryError:
            print(f"OOM at batch_size={batch_size}, retrying with {batch_size // 2}")
            torch.cuda.empty_cache()
            return run_batches(model, pairs, batch_size // 2)   # <- the retry runs inside the except

    scores = score(pairs, batch_size=384)

Batch 384 does not fit: in the first layer the attention scores alone are 16 heads x 384 x 1024^2 x 2
bytes = 12 GiB, and the softmax's 12 GiB more fails (about 5.9 GiB free).  The fallback halves the batch,
but it runs inside the except block: the exception's traceback still references the frames of the
failed forward, so its embeddings output, Q/K/V and the 12 GiB of scores (15 GiB with the weights) are
all still alive; empty_cache() frees nothing because none of it is cached.  Batch 192 then fails at its
own 6 GiB scores with 4.4 GiB free, although on its own its peak (about 15.5 GiB with the weights and
the context, in the attention) fits the card with 7 GiB to spare.  The user: "it fails even after halving the batch, and empty_cache does not help".

An expert: the fallback is right, its place is wrong -- leave the except block first (set a flag /
catch, break out, then retry; or `del` the exception and its traceback), then retry at 192.  Fused
(SDPA) attention or a smaller starting batch would also avoid the first failure.  Not empty_cache (the
memory is live), not expandable_segments (no fragmentation), not a bigger card or quantization (the
weights are 1 GiB), not inference_mode (already on).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
HIDDEN, HEADS, LAYERS, VOCAB, MAX_LEN = 1024, 16, 24, 250002, 1024
scen_truth.note_every_empty(torch)


def half(n):
    """a tensor of n fp16 elements"""
    return torch.empty(n, dtype=torch.float16, device="cuda")


class XLMRobertaEmbeddings(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(half(VOCAB * HIDDEN), requires_grad=False)
        self.position_embeddings = torch.nn.Parameter(half(8194 * HIDDEN), requires_grad=False)

    def forward(self, input_ids):
        batch, seq = input_ids
        embeddings = half(batch * seq * HIDDEN)
        return embeddings


class XLMRobertaSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(half(3 * HIDDEN * HIDDEN), requires_grad=False)
        self.out = torch.nn.Parameter(half(HIDDEN * HIDDEN), requires_grad=False)

    def forward(self, hidden_states, batch, seq):
        query_layer = half(batch * seq * HIDDEN)
        key_layer = half(batch * seq * HIDDEN)
        value_layer = half(batch * seq * HIDDEN)
        attention_scores = half(batch * HEADS * seq * seq)         # query @ key.T / sqrt(d)
        attention_probs = half(batch * HEADS * seq * seq)          # softmax(attention_scores)
        context_layer = half(batch * seq * HIDDEN)                 # attention_probs @ value
        return context_layer


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = XLMRobertaSelfAttention()
        self.intermediate = torch.nn.Parameter(half(2 * HIDDEN * 4 * HIDDEN), requires_grad=False)

    def forward(self, hidden_states, batch, seq):
        attention_output = self.attention(hidden_states, batch, seq)
        intermediate_output = half(batch * seq * 4 * HIDDEN)       # GELU(x W1)
        layer_output = half(batch * seq * HIDDEN)
        return layer_output


class XLMRobertaForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = XLMRobertaEmbeddings()
        self.layers = [XLMRobertaLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = torch.nn.Parameter(half(HIDDEN * HIDDEN + HIDDEN), requires_grad=False)

    def forward(self, input_ids):
        batch, seq = input_ids
        hidden_states = self.embeddings(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, batch, seq)
        logits = half(batch * 2)
        return logits


def run_batches(model, pairs, batch_size):
    scores = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        input_ids = (len(chunk), MAX_LEN)          # tokenizer(chunk, padding=True, truncation=True, max_length=1024)
        logits = model(input_ids)
        scores.append(logits)
    return scores


def score(model, pairs, batch_size):
    try:
        return run_batches(model, pairs, batch_size)
    except torch.OutOfMemoryError:
        print("OOM at batch_size=%d, retrying with %d" % (batch_size, batch_size // 2), file=sys.stderr)
        torch.cuda.empty_cache()
        return run_batches(model, pairs, batch_size // 2)


def main():
    model = XLMRobertaForSequenceClassification()       # from_pretrained(..., torch_dtype=torch.float16).cuda().eval()
    model.eval()
    pairs = [("query %d" % i, "passage %d" % i) for i in range(1536)]   # the first shard of 1.2M pairs
    with torch.inference_mode():
        scores = score(model, pairs, batch_size=384)
    return scores


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
