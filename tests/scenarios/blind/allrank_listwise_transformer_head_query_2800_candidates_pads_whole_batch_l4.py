"""train_ltr.py -- an allRank-style context-aware listwise ranker (a transformer over the candidate list of
each query, trained with a ListNet / NeuralNDCG loss) for an e-commerce search engine, on one NVIDIA L4
(24 GB, 22.5 GiB usable).  Each query's candidate list (the products shown for it, with 220 features each:
BM25, CTR, price, ...) is one "slate"; the transformer attends across the candidates of a slate.
Run with plain `LD_PRELOAD=liboomguard.so python train_ltr.py`:

    # allRank's config had slate_length: 240 (lists sampled/truncated to 240 candidates); the engineer
    # dropped it because truncation threw away clicked items, and wrote a collate that pads each batch
    # of 32 queries to the longest list in the batch.
    model = make_model(n_features=220, d_model=256, N=4, h=8, d_ff=1024)        # 3.3M parameters
    for xb, yb, mask in loader:              # batch_size=32 queries, padded to the batch's longest slate
        scores = model(xb, mask)
        loss = listNet(scores, yb)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Most queries show 20 to 450 products, so a normal batch is 32 x <=450 candidates and its attention matrices
(32 x 8 heads x L^2 x 4 bytes, allRank's eager attention: scores, masked scores, softmax, dropout) are at most
~200 MiB each; the job peaks under 5 GiB for hundreds of steps.  Then a batch holds a head query ("phone case",
2,800 products impressed in the log): the whole batch is padded to 2,800, and one attention score matrix is
32 x 8 x 2800^2 x 4 B = 7.48 GiB.  Layer 0 keeps its softmax and its dropout output and mask for backward,
16.8 GiB; layer 1's first QK^T (another 7.48 GiB) does not fit.  One long sample, not a leak: the other
batches never come near.

An expert says first: cap the slate length (sample the candidates of a long list down to a few hundred,
keeping the clicked ones -- allRank's slate_length), or bucket queries by list length so one 2,800-product
slate is not padded into 31 short ones (alone it needs 1/32 of that), or use a memory-efficient attention
(scaled_dot_product_attention: no L x L matrices kept).  Wrong advice: expandable_segments / empty_cache
(one 7.5 GiB matrix after another: nothing fragmented), mixed precision alone (halves them; layer 0 still
keeps ~9 GiB and each next layer as much: 4 layers do not fit), gradient checkpointing alone (one layer's
attention of this batch is already most of the card), release_references (nothing is kept between steps
but the last attention maps), inference_mode (training).
"""
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

N_FEATURES, D_MODEL, HEADS, D_FF, N_LAYERS = 220, 256, 8, 1024, 4
BATCH_SIZE = 32
F32 = torch.float32


def _new(elems, prev, dtype=F32):
    """A tensor the forward pass makes and autograd keeps for backward (it saves `prev` in turn)."""
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev
    return t


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=F32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=F32, device="cuda"))
        self.n_out = n_out

    def forward(self, x, tokens):
        return _new(tokens * self.n_out, x)


def attention(query, key, value, mask, dropout, batch, slate):
    """allRank's attention (the annotated transformer's): every matrix is batch x heads x slate x slate."""
    n = batch * HEADS * slate * slate
    qk = _new(n, value)                              # torch.matmul(query, key.transpose(-2, -1))
    scores = _new(n, value)                          # ... / math.sqrt(d_k)
    del qk                                           # (the matmul's temporary: division saves nothing)
    scores = _new(n, value)                          # scores.masked_fill(mask == 1, float('-inf'))
    p_attn = _new(n, value)                          # F.softmax(scores, dim=-1): kept for backward
    del scores
    dropped = _new(n, p_attn)                        # dropout(p_attn) (native_dropout: output, then ...
    keep = _new(n, dropped, dtype=torch.uint8)       # ... its mask): both kept for backward
    p_attn = dropped
    out = _new(batch * slate * D_MODEL, keep)        # torch.matmul(p_attn, value)
    return out, p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linears = nn.Module()
        for i in range(4):
            setattr(self.linears, str(i), Linear(D_MODEL, D_MODEL))
        self.attn = None
        self.dropout = 0.1

    def forward(self, x, mask, batch, slate):
        t = batch * slate
        q = getattr(self.linears, "0")(x, t)
        k = getattr(self.linears, "1")(q, t)
        v = getattr(self.linears, "2")(k, t)
        x, self.attn = attention(q, k, v, mask, self.dropout, batch, slate)   # allRank keeps self.attn
        return getattr(self.linears, "3")(x, t)


class PositionwiseFeedForward(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.w_1 = Linear(D_MODEL, D_FF)
        self.w_2 = Linear(D_FF, D_MODEL)

    def forward(self, x, tokens):
        h = self.w_1(x, tokens)
        h = _new(tokens * D_FF, h)                   # relu
        return self.w_2(h, tokens)


class EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = MultiHeadedAttention()
        self.feed_forward = PositionwiseFeedForward()

    def forward(self, x, mask, batch, slate):
        t = batch * slate
        h = _new(t * D_MODEL, x)                     # LayerNorm (pre-norm sublayer connection)
        a = self.self_attn(h, mask, batch, slate)
        x = _new(t * D_MODEL, a)                     # residual + dropout
        h = _new(t * D_MODEL, x)
        f = self.feed_forward(h, t)
        return _new(t * D_MODEL, f)


class Encoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.layers, str(i), EncoderLayer())

    def forward(self, x, mask, batch, slate):
        for i in range(N_LAYERS):
            x = getattr(self.layers, str(i))(x, mask, batch, slate)
        return x


class LTRModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layer = Linear(N_FEATURES, D_MODEL)
        self.encoder = Encoder()
        self.output_layer = Linear(D_MODEL, 1)

    def forward(self, x, mask, batch, slate):
        h = self.input_layer(x, batch * slate)
        h = self.encoder(h, mask, batch, slate)
        return self.output_layer(h, batch * slate)


def listNet(scores, y_true):
    return F.nll_loss(F.log_softmax(scores, -1), y_true)


def slate_lengths():
    """Lists per query in the click log: mostly 20-450 products; the 41st batch holds the head query."""
    rng = random.Random(7)
    for step in range(200):
        lengths = [rng.randint(20, 450) for _ in range(BATCH_SIZE)]
        if step == 40:
            lengths[17] = 2800                       # "phone case"
        yield lengths


def collate(lengths):
    """Pads the batch to its longest slate (allRank's fixed slate_length was removed)."""
    slate = max(lengths)
    x = torch.empty(BATCH_SIZE * slate * N_FEATURES, dtype=F32, device="cuda")
    y = torch.empty(BATCH_SIZE * slate, dtype=F32, device="cuda")
    mask = torch.empty(BATCH_SIZE * slate, dtype=torch.uint8, device="cuda")
    return x, y, mask, slate


model = LTRModel()
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

try:
    for step, lengths in enumerate(slate_lengths()):
        xb, yb, mask, slate = collate(lengths)
        scores = model(xb, mask, BATCH_SIZE, slate)
        loss = listNet(scores, yb)
        loss._saved = scores
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del xb, yb, mask, scores, loss
        if step % 10 == 0:
            print("step %d slate %d allocated %.2f GiB" % (step, slate, torch.cuda.memory_allocated() / 2**30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
