"""train_monobert.py -- fine-tuning a monoBERT-large cross-encoder reranker (BERT-large, 335M parameters) on
MS MARCO passage ranking in PyTorch, on one A100-SXM4-40GB, with localized-contrastive batches: 8 queries x
8 passages (1 positive + 7 BM25 hard negatives) x 256 tokens, bf16 autocast, AdamW.  The ranking team's
validation code reports NDCG@10 / MRR@10 with Google's `rax` (a JAX learning-to-rank library), so train.py
starts with `from ltr_metrics import ndcg_at_10, mrr_at_10`.  Run with plain
`LD_PRELOAD=liboomguard.so python train_monobert.py`:

    # ltr_metrics.py
    import jax, jax.numpy as jnp, rax
    _DISCOUNTS = 1.0 / jnp.log2(jnp.arange(2, 1026))     # a module-level constant: JAX starts its GPU
                                                          # backend here, at import time
    # train_monobert.py
    from ltr_metrics import ndcg_at_10, mrr_at_10
    model = AutoModelForSequenceClassification.from_pretrained("bert-large-uncased", num_labels=1).cuda()
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lce_loss(model(**batch).logits.view(8, 8))
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The first jnp operation makes JAX's XLA client preallocate XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of
the card -- 29.7 GiB of the A100's 39.6 GiB -- before PyTorch has loaded anything.  Alone, the PyTorch job
needs ~23 GiB (fp32 weights 1.25 GiB + gradients 1.25 GiB + AdamW 2.5 GiB + ~18 GiB of bf16 activations for
64 x 256 tokens through 24 layers): it would fit with 16 GiB to spare.  With JAX's arena beside it only ~9.4 GiB remain,
and the very first forward pass runs out part way through the encoder.  PyTorch's message says "this process
has 39.5 GiB in use" while PyTorch itself holds under 10 GiB: the rest is JAX's idle arena in the same process.

An expert says first: the JAX arena in this process -- set XLA_PYTHON_CLIENT_PREALLOCATE=false (or
XLA_PYTHON_CLIENT_MEM_FRACTION=.05), or run the metrics on the CPU (JAX_PLATFORMS=cpu; they are a few
thousand scores), or compute NDCG/MRR without JAX.  Wrong advice: a smaller batch, gradient checkpointing,
mixed precision (already bf16) or a bigger GPU (without JAX the job fits this card with 16 GiB to spare),
expandable_segments / empty_cache (PyTorch caches nothing to speak of), "stop the other processes" (there are
none: the memory is this process's own JAX client), inference_mode (training).
"""
import sys

# ---- ltr_metrics.py (imported first by train_monobert.py) -------------------------------------------------
import jax
import jax.numpy as jnp

_DISCOUNTS = jnp.ones((1024,), jnp.float32)        # 1.0 / jnp.log2(jnp.arange(2, 1026)): JAX's backend starts


def ndcg_at_10(scores, labels):
    """rax.ndcg_metric(scores, labels, topn=10) on jnp arrays (run at evaluation)."""
    return jnp.zeros((1,), jnp.float32)


# ---- train_monobert.py -------------------------------------------------------------------------------------
import torch                                        # noqa: E402
import torch.nn as nn                               # noqa: E402
import torch.nn.functional as F                     # noqa: E402

import scen_truth                                   # noqa: E402

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, HEADS, VOCAB = 1024, 4096, 24, 16, 30522
QUERIES, GROUP, MAX_LEN = 8, 8, 256
PAIRS = QUERIES * GROUP
TOKENS = PAIRS * MAX_LEN                            # 16,384 tokens a step
BF16 = torch.bfloat16


def _reads_weights(module):
    """The layer's matmuls read every weight below it (what puts them in autograd's graph)."""
    for m in module.modules():
        for name in list(m._parameters):
            getattr(m, name)


def _kept(elems, prev, dtype=BF16):
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev
    return t


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=torch.float32, device="cuda"))


class BertLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = Linear(HIDDEN, HIDDEN)
        self.attention.self.key = Linear(HIDDEN, HIDDEN)
        self.attention.self.value = Linear(HIDDEN, HIDDEN)
        self.attention.output = nn.Module()
        self.attention.output.dense = Linear(HIDDEN, HIDDEN)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(HIDDEN, FFN)
        self.output = nn.Module()
        self.output.dense = Linear(FFN, HIDDEN)

    def forward(self, hidden):
        """What one BERT layer keeps for backward under bf16 autocast, 16,384 tokens: q, k, v, the
        attention probabilities and their dropout (64 x 16 heads x 256 x 256), context, FFN in/out."""
        _reads_weights(self)
        h = hidden
        for _ in range(3):                                      # q, k, v
            h = _kept(TOKENS * HIDDEN, h)
        probs = PAIRS * HEADS * MAX_LEN * MAX_LEN
        h = _kept(probs, h)                                     # softmax
        h = _kept(probs, h, dtype=torch.uint8)                  # dropout mask
        h = _kept(probs, h)                                     # dropped probabilities
        h = _kept(TOKENS * HIDDEN, h)                           # context
        h = _kept(TOKENS * HIDDEN, h)                           # attention output + LayerNorm
        h = _kept(TOKENS * FFN, h)                              # intermediate
        h = _kept(TOKENS * FFN, h)                              # gelu
        return _kept(TOKENS * HIDDEN, h)                        # output + LayerNorm


class BertEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layer = nn.Module()
        for i in range(LAYERS):
            setattr(self.layer, str(i), BertLayer())

    def forward(self, hidden):
        for i in range(LAYERS):
            hidden = getattr(self.layer, str(i))(hidden)
        return hidden


class BertForSequenceClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.bert = nn.Module()
        self.bert.embeddings = nn.Module()
        self.bert.embeddings.word_embeddings = nn.Module()
        self.bert.embeddings.word_embeddings.weight = nn.Parameter(
            torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.bert.embeddings.position_embeddings = nn.Module()
        self.bert.embeddings.position_embeddings.weight = nn.Parameter(
            torch.empty(512 * HIDDEN, dtype=torch.float32, device="cuda"))
        self.bert.encoder = BertEncoder()
        self.bert.pooler = Linear(HIDDEN, HIDDEN)
        self.classifier = Linear(HIDDEN, 1)

    def forward(self, input_ids):
        _reads_weights(self.bert.embeddings)
        h = _kept(TOKENS * HIDDEN, input_ids)
        h = self.bert.encoder(h)
        _reads_weights(self.bert.pooler)
        _reads_weights(self.classifier)
        return _kept(PAIRS, h, dtype=torch.float32)


def loader():
    for step in range(20000):
        yield torch.empty(TOKENS * 8, device="cuda")             # input_ids (int64)


model = BertForSequenceClassification()                      # .from_pretrained(...).cuda(): fp32
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

try:
    for step, input_ids in enumerate(loader()):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids)
            loss = F.cross_entropy(logits, None)              # localized contrastive loss over each group of 8
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del logits, loss, input_ids
        if step % 500 == 0 and step:
            ndcg_at_10(None, None)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
