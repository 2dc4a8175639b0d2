"""SASRec next-item model for a fashion shop's clickstream, trained on one RTX 4090 (24 GiB).

The real code: a SASRec in the style of RecBole's (item embedding 1.2M x 128, learned positions, 2 blocks of
2-head self-attention, hidden 128, BCE with one sampled negative per position), AdamW, fp32, trained from a
parquet of sessions with the team's own collate_fn.  The collate_fn pads every batch of 128 sessions to the
LONGEST session in the batch (no truncation); the model's max_seq_length was raised to 8192 a month ago "so long
sessions don't crash the position embedding".  SASRec.forward builds RecBole's extended attention mask:

    attention_mask = item_seq != 0                                   # (B, L)
    extended = attention_mask.unsqueeze(1).unsqueeze(2)              # (B, 1, 1, L)
    extended = torch.tril(extended.expand((-1, -1, L, -1)))          # (B, 1, L, L) bool
    extended = torch.where(extended, 0.0, -10000.0)                  # (B, 1, L, L) float32

Real sessions are short (median 11 views, p99.9 ~180), so batches are L <= 200 and the job runs at ~4 GiB.
Step 41 draws a session of 6,000 product views: a price-scraping bot that the bot filter did not catch.  The whole
batch is padded to L = 6000:
  * item_seq            128 x 6000 int64                     =   6 MB
  * embeddings, LN, dropout (4 tensors of 128 x 6000 x 128 x 4 B)   = 4 x 393 MB
  * tril(expand(...))   128 x 6000 x 6000 bool               = 4.61 GB (4.29 GiB)
  * torch.where(...)    128 x 6000 x 6000 float32            = 18.43 GB (17.17 GiB)  <- fails here
  while weights 614 MB + grads 614 MB + AdamW state 1.23 GB + context are held.  And that would only be the mask:
  each attention layer's scores would be 128 x 2 x 6000 x 6000 x 4 B = 36.9 GB more.
What an expert says first: a sequence-length outlier, not a model or batch that is too big.  Cap the sequence:
keep the most recent max_len=200 items of each session in the collate_fn (SASRec's usual max_len) and filter
bot sessions.  Wrong advice: expandable_segments / empty_cache (nothing is cached or fragmented), gradient
checkpointing or FSDP (the weights are 2.5 GB), a smaller batch for every step (batch 128 -> 16 to survive one bot
session, and the next bot with 20k views fails anyway), a bigger card.
"""
import math
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

NUM_ITEMS = 1_200_000
HIDDEN_SIZE = 128
N_HEADS = 2
N_LAYERS = 2
MAX_SEQ_LENGTH = 8192          # raised from 50: "long sessions crashed the position embedding"
BATCH_SIZE = 128
LR = 1e-3
INT64 = 8                      # bytes of an item id


# --- the few layers torch.nn gives the real code (Embedding, Linear, LayerNorm, Dropout) ------------------
class Embedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32, device="cuda"))

    def forward(self, ids, n_tokens):
        out = torch.empty(n_tokens * self.embedding_dim, dtype=torch.float32, device="cuda")
        out._saved = ids
        return out


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))

    def forward(self, x, n_tokens):
        out = torch.empty(n_tokens * self.out_features, dtype=torch.float32, device="cuda")
        out._saved = x
        return out


class LayerNorm(nn.Module):
    def __init__(self, hidden, eps=1e-12):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(hidden, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        out = torch.empty_like(x)
        out._saved = x
        return out


class Dropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        out = torch.empty_like(x)
        out._saved = x
        return out


# --- RecBole-style SASRec ---------------------------------------------------------------------------------
class MultiHeadAttention(nn.Module):
    def __init__(self, n_heads, hidden_size, dropout):
        super().__init__()
        self.num_attention_heads = n_heads
        self.sqrt_attention_head_size = math.sqrt(hidden_size // n_heads)
        self.query = Linear(hidden_size, hidden_size)
        self.key = Linear(hidden_size, hidden_size)
        self.value = Linear(hidden_size, hidden_size)
        self.dense = Linear(hidden_size, hidden_size)
        self.attn_dropout = Dropout(dropout)
        self.LayerNorm = LayerNorm(hidden_size)

    def forward(self, input_tensor, attention_mask, batch_size, seq_len):
        n = batch_size * seq_len
        query_layer = self.query(input_tensor, n)
        key_layer = self.key(query_layer, n)
        value_layer = self.value(key_layer, n)
        attention_scores = torch.empty(batch_size * self.num_attention_heads * seq_len * seq_len,
                                       dtype=torch.float32, device="cuda")           # q @ k^T
        attention_scores._saved = value_layer
        attention_probs = torch.empty_like(attention_scores)                          # softmax(scores + mask)
        attention_probs._saved = attention_scores
        attention_probs = self.attn_dropout(attention_probs)
        context_layer = torch.empty(n * HIDDEN_SIZE, dtype=torch.float32, device="cuda")
        context_layer._saved = attention_probs
        hidden_states = self.dense(context_layer, n)
        return self.LayerNorm(hidden_states)


class FeedForward(nn.Module):
    def __init__(self, hidden_size, inner_size):
        super().__init__()
        self.dense_1 = Linear(hidden_size, inner_size)
        self.dense_2 = Linear(inner_size, hidden_size)
        self.LayerNorm = LayerNorm(hidden_size)

    def forward(self, x, n_tokens):
        return self.LayerNorm(self.dense_2(self.dense_1(x, n_tokens), n_tokens))


class TransformerLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.multi_head_attention = MultiHeadAttention(N_HEADS, HIDDEN_SIZE, 0.2)
        self.feed_forward = FeedForward(HIDDEN_SIZE, 4 * HIDDEN_SIZE)

    def forward(self, hidden_states, attention_mask, batch_size, seq_len):
        h = self.multi_head_attention(hidden_states, attention_mask, batch_size, seq_len)
        return self.feed_forward(h, batch_size * seq_len)


class SASRec(nn.Module):
    def __init__(self):
        super().__init__()
        self.item_embedding = Embedding(NUM_ITEMS, HIDDEN_SIZE, padding_idx=0)
        self.position_embedding = Embedding(MAX_SEQ_LENGTH, HIDDEN_SIZE)
        self.layer_0 = TransformerLayer()
        self.layer_1 = TransformerLayer()
        self.LayerNorm = LayerNorm(HIDDEN_SIZE)
        self.dropout = Dropout(0.2)

    def get_attention_mask(self, item_seq, batch_size, seq_len):
        """RecBole's SASRec mask: causal and padding, (B, 1, L, L), added to the scores."""
        attention_mask = torch.empty(batch_size * seq_len, dtype=torch.uint8, device="cuda")     # item_seq != 0
        extended_attention_mask = torch.empty(batch_size * seq_len * seq_len, dtype=torch.uint8,
                                              device="cuda")           # torch.tril(mask.expand((-1, -1, L, -1)))
        extended_attention_mask = torch.empty(batch_size * seq_len * seq_len, dtype=torch.float32,
                                              device="cuda")           # torch.where(mask, 0.0, -10000.0)
        return extended_attention_mask

    def forward(self, item_seq, batch_size, seq_len):
        n = batch_size * seq_len
        item_emb = self.item_embedding(item_seq, n)
        position_embedding = self.position_embedding(item_seq, n)
        input_emb = torch.empty_like(item_emb)                     # item_emb + position_embedding
        input_emb._saved = position_embedding
        input_emb = self.dropout(self.LayerNorm(input_emb))
        extended_attention_mask = self.get_attention_mask(item_seq, batch_size, seq_len)
        h = self.layer_0(input_emb, extended_attention_mask, batch_size, seq_len)
        h = self.layer_1(h, extended_attention_mask, batch_size, seq_len)
        return h


def session_batches(num_steps):
    """What the DataLoader yields: (padded item_seq, its length).  The collate_fn pads to the longest
    session of the batch and truncates nothing."""
    rng = random.Random(7)
    for step in range(num_steps):
        longest = max(int(rng.lognormvariate(2.4, 0.9)) for _ in range(BATCH_SIZE))
        seq_len = min(longest, 200)
        if step == 41:
            seq_len = 6000          # session 'c8f1..': 6,000 product views in 9 hours (a price scraper)
        item_seq = torch.empty(BATCH_SIZE * seq_len * INT64, device="cuda")
        yield item_seq, seq_len


class SampledBCELoss(nn.Module):
    """pos/neg logits (dot products with the target item and one sampled negative per position), then BCE."""

    def forward(self, seq_output, batch_size, seq_len):
        pos_logits = torch.empty(batch_size * seq_len, dtype=torch.float32, device="cuda")
        pos_logits._saved = seq_output
        neg_logits = torch.empty(batch_size * seq_len, dtype=torch.float32, device="cuda")
        neg_logits._saved = pos_logits
        loss = torch.empty(1, dtype=torch.float32, device="cuda")
        loss._saved = neg_logits
        return loss


def train():
    model = SASRec()
    loss_fct = SampledBCELoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model.train()
    for step, (item_seq, seq_len) in enumerate(session_batches(200)):
        seq_output = model(item_seq, BATCH_SIZE, seq_len)
        loss = loss_fct(seq_output, BATCH_SIZE, seq_len)
        optimizer.zero_grad()
        scen_truth.backward(loss)
        optimizer.step()
        del seq_output, loss
        if step % 20 == 0:
            print("step %d  L=%d" % (step, seq_len))


if __name__ == "__main__":
    try:
        train()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
