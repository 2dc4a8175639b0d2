"""A 760M BLOOM-style decoder with ALiBi, pretrained from scratch with DDP on one 8x A100 40GB node; the data
loader never truncates, and after ~19k steps one 47k-token document reaches the eager attention.

The real program: the team's own model (24 layers, d=1536, 16 heads, vocab 50432, tied embeddings, ALiBi instead
of position embeddings, attention written out as in BLOOM: scores = alibi.baddbmm(q, k^T, alpha=1/sqrt(d)),
masked_fill, softmax (fp32 under autocast), probs @ v), bf16 autocast, AdamW, DDP, micro-batch 1 document,
gradient accumulation 16 per GPU.  Documents are not packed: each micro-batch is one document, tokenized in the
loader with `tokenizer(text, truncation=True)` -- but without max_length, and the team's tokenizer has no
model_max_length in its tokenizer_config.json, so transformers uses VERY_LARGE_INTEGER and truncation=True
cuts nothing.  The corpus was pre-filtered by line count "to drop long pages", so 99.9% of documents are under
2,048 tokens and the run went fine for ~19k steps.  ALiBi has no position table and no max-length check, so
nothing complains about a longer input.

What happens: a scraped single-line minified JavaScript bundle (1 line, 47,361 tokens) arrives; the first
layer's baddbmm asks for the 16 x 47,368 x 47,368 bf16 score matrix, 66.9 GiB, on a 40 GiB card, and the job
dies with CUDA OOM with 23.5 GiB free.  Normal documents need ~27-30 GiB at the peak (weights, DDP buckets,
grads and AdamW 14.1 GiB, activations incl. the saved fp32 + bf16 attention probabilities ~11.5 GiB at 2,040
tokens, logits ~1 GiB).

What an expert says first: cap the sequence length -- pass max_length=2048 to the tokenizer (or set
model_max_length), or chunk/pack long documents into 2,048-token blocks; an eager attention is O(L^2) and one
outlier is 535x the score matrix of a 2,048-token document.  FlashAttention with ALiBi slopes would remove the
L^2 matrices, but the rest of a 47k-token pass (~65 GiB of other activations, 13 GiB of logits) still does not
fit, and it leaves the loader bug in place.  Wrong advice: smaller batch (already 1), gradient checkpointing,
empty_cache / expandable_segments, "a leak after 19k steps", a bigger card.
"""
import math
import random

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

scen_truth.note_every_empty(torch)

VERY_LARGE_INTEGER = int(1e30)


class ModelArgs:
    n_layer = 24
    d_model = 1536
    n_head = 16
    vocab_size = 50432
    train_seq_len = 2048           # what the run was designed for
    micro_batch_size = 1
    grad_accum = 16
    lr = 2e-4


args = ModelArgs()


def saved(out, inp):
    """Autograd keeps inp alive for backward while grad is enabled."""
    if torch.is_grad_enabled():
        out._saved = inp
    return out


class DocTokenizer(object):
    """The team's BPE tokenizer as AutoTokenizer loads it: tokenizer_config.json has no model_max_length."""
    model_max_length = VERY_LARGE_INTEGER
    pad_to_multiple_of = 8

    def __call__(self, n_tokens, truncation=False, max_length=None):
        if truncation:
            n_tokens = min(n_tokens, max_length if max_length is not None else self.model_max_length)
        return n_tokens


class DocumentLoader(object):
    """One document per micro-batch, dynamic length."""

    def __init__(self, doc_token_counts, tokenizer):
        self.docs = doc_token_counts
        self.tokenizer = tokenizer

    def __iter__(self):
        for n in self.docs:
            n = self.tokenizer(n, truncation=True)
            seq_len = -(-n // self.tokenizer.pad_to_multiple_of) * self.tokenizer.pad_to_multiple_of
            input_ids = torch.empty(8 * args.micro_batch_size * seq_len)      # int64, .cuda(non_blocking=True)
            yield input_ids, seq_len


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d_in * d_out, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d_out, dtype=torch.float32))
        self.d_out = d_out

    def forward(self, x, seq_len):
        return saved(torch.empty(args.micro_batch_size * seq_len * self.d_out, dtype=torch.bfloat16), x)


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.d = d

    def forward(self, x, seq_len):
        return saved(torch.empty(args.micro_batch_size * seq_len * self.d, dtype=torch.bfloat16), x)


def build_alibi_tensor(n_head, seq_len):
    """BLOOM's build_alibi_tensor: slopes x positions, [batch * n_head, 1, seq_len] -- built for any length."""
    return torch.empty(args.micro_batch_size * n_head * seq_len, dtype=torch.bfloat16)


class AlibiSelfAttention(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.query_key_value = Linear(d, 3 * d)
        self.dense = Linear(d, d)
        self.n_head = n_head
        self.d = d

    def forward(self, x, alibi, seq_len):
        qkv = self.query_key_value(x, seq_len)
        bh = args.micro_batch_size * self.n_head
        # scores = alibi.baddbmm(batch1=q, batch2=k.transpose(-1, -2), beta=1.0, alpha=1 / sqrt(head_dim))
        scores = torch.empty(bh * seq_len * seq_len, dtype=torch.bfloat16)
        scores._saved = qkv
        # scores.masked_fill(causal_mask, min), then softmax in fp32 (autocast), cast back for probs @ v
        masked = torch.empty(bh * seq_len * seq_len, dtype=torch.bfloat16)
        probs = saved(torch.empty(bh * seq_len * seq_len, dtype=torch.float32), qkv)
        del scores, masked
        probs_bf16 = saved(torch.empty(bh * seq_len * seq_len, dtype=torch.bfloat16), probs)
        ctx = saved(torch.empty(args.micro_batch_size * seq_len * self.d, dtype=torch.bfloat16), probs_bf16)
        return self.dense(ctx, seq_len)


class BloomBlock(torch.nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.input_layernorm = LayerNorm(d)
        self.self_attention = AlibiSelfAttention(d, n_head)
        self.post_attention_layernorm = LayerNorm(d)
        self.dense_h_to_4h = Linear(d, 4 * d)
        self.dense_4h_to_h = Linear(4 * d, d)
        self.d = d

    def forward(self, x, alibi, seq_len):
        a = self.self_attention(self.input_layernorm(x, seq_len), alibi, seq_len)
        x = saved(torch.empty(args.micro_batch_size * seq_len * self.d, dtype=torch.float32), a)
        h = self.dense_h_to_4h(self.post_attention_layernorm(x, seq_len), seq_len)
        h = saved(torch.empty(args.micro_batch_size * seq_len * 4 * self.d, dtype=torch.bfloat16), h)  # gelu
        return saved(torch.empty(args.micro_batch_size * seq_len * self.d, dtype=torch.float32),
                     self.dense_4h_to_h(h, seq_len))


class AlibiLM(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.word_embeddings = torch.nn.Parameter(torch.empty(a.vocab_size * a.d_model, dtype=torch.float32))
        self.word_embeddings_layernorm = LayerNorm(a.d_model)
        self.h = [BloomBlock(a.d_model, a.n_head) for _ in range(a.n_layer)]
        for i, block in enumerate(self.h):
            setattr(self, "h_%d" % i, block)
        self.ln_f = LayerNorm(a.d_model)

    def forward(self, input_ids, seq_len):
        x = saved(torch.empty(self.a.micro_batch_size * seq_len * self.a.d_model, dtype=torch.float32), input_ids)
        x = self.word_embeddings_layernorm(x, seq_len)
        alibi = build_alibi_tensor(self.a.n_head, seq_len)
        for block in self.h:
            x = block(x, alibi, seq_len)
        x = self.ln_f(x, seq_len)
        logits = saved(torch.empty(self.a.micro_batch_size * seq_len * self.a.vocab_size, dtype=torch.bfloat16), x)
        return F.nll_loss(F.log_softmax(logits, -1, dtype=torch.float32), input_ids)


def corpus_shard(seed, n_docs, long_doc_at, long_doc_tokens):
    """Token counts of the shard's documents in loader order (web pages, line-count filtered)."""
    rng = random.Random(seed)
    docs = [min(2040, int(math.exp(rng.gauss(math.log(700), 0.7)))) for _ in range(n_docs)]
    docs[long_doc_at] = long_doc_tokens     # a one-line minified JS bundle scraped as text
    return docs


def main():
    torch.cuda.set_device(0)
    model = DDP(AlibiLM(args), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    tokenizer = DocTokenizer()
    loader = DocumentLoader(corpus_shard(seed=19, n_docs=4000, long_doc_at=36, long_doc_tokens=47361), tokenizer)

    step, micro = 0, 0
    for input_ids, seq_len in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, seq_len)
        scen_truth.backward(loss)
        micro += 1
        if micro % args.grad_accum == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
