"""train_sasrec.py -- next-item recommendation for a streaming catalogue (3M items), a SASRec
transformer (2 layers, 2 heads, 64-dim) trained with sampled negatives on one A100 40GB, with
plain `LD_PRELOAD=liboomguard.so`:

    def collate(users):                       # pad every history to the longest one in the batch
        L = max(len(u.history) for u in users)
        return pad([u.history for u in users], L)           # max_len=None: "our histories are short"
    loader = DataLoader(train_users, batch_size=128, shuffle=True, collate_fn=collate)
    for seqs, pos, neg in loader:
        logits = model(seqs)                  # eager attention: scores are B x H x L x L
        loss = bce(logits, pos, neg); loss.backward(); opt.step(); opt.zero_grad()

Histories are 20-200 events; the first epoch runs for hours at a few hundred MiB of activations.
One account is a crawler with 8,192 play events: its batch is padded to L=8192 and the first
layer's attention scores alone are 128 x 2 x 8192^2 x 4 B = 64 GiB, more than the card.  No
smaller batch fits it either without making every other batch tiny.

An expert: truncate each history to the most recent max_len (SASRec uses 200) events -- the model
learns from the recent context anyway -- (or drop such accounts); a memory-efficient attention
kernel would also avoid the L x L matrix.  Not a smaller batch or accumulation, not checkpointing,
not mixed precision (still quadratic), not a cache or fragmentation problem, not inference.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
ITEMS = 3000000
DIM = 64
HEADS = 2
scen_truth.note_every_empty(torch)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.in_proj = torch.nn.Parameter(torch.empty(3 * DIM * DIM * 4, device="cuda"))
        self.out_proj = torch.nn.Parameter(torch.empty(DIM * DIM * 4, device="cuda"))

    def _attn(self, q, k, v, batch, seq_len):
        scores = torch.empty(batch * HEADS * seq_len * seq_len * 4, device="cuda")     # q @ k^T
        scores._saved = q
        probs = torch.empty(batch * HEADS * seq_len * seq_len * 4, device="cuda")      # softmax, saved
        probs._saved = scores
        out = torch.empty(batch * seq_len * DIM * 4, device="cuda")
        out._saved = probs
        return out

    def forward(self, x, batch, seq_len):
        qkv = torch.empty(3 * batch * seq_len * DIM * 4, device="cuda")
        qkv._saved = x
        return self._attn(qkv, qkv, qkv, batch, seq_len)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = CausalSelfAttention()
        self.ffn = torch.nn.Parameter(torch.empty(2 * DIM * DIM * 4, device="cuda"))

    def forward(self, x, batch, seq_len):
        a = self.attn(x, batch, seq_len)
        h = torch.empty(batch * seq_len * DIM * 4, device="cuda")
        h._saved = a
        return h


class SASRec(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.item_emb = torch.nn.Parameter(torch.empty(ITEMS * DIM * 4, device="cuda"))    # 732 MiB
        self.pos_emb = torch.nn.Parameter(torch.empty(16384 * DIM * 4, device="cuda"))
        self.block0 = Block()
        self.block1 = Block()

    def forward(self, seqs, batch, seq_len):
        x = torch.empty(batch * seq_len * DIM * 4, device="cuda")     # item + position embeddings
        x._saved = seqs
        x = self.block0(x, batch, seq_len)
        x = self.block1(x, batch, seq_len)
        return x


def history_lengths(n_batches):
    """The longest history of each shuffled batch: ordinary accounts, then the crawler's batch."""
    for i in range(n_batches):
        yield 60 + (i * 37) % 141
    yield 8192


def main():
    model = SASRec()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch_size = 128
    for seq_len in history_lengths(40):
        seqs = torch.empty(batch_size * seq_len * 8, device="cuda")
        logits = model(seqs, batch_size, seq_len)
        pos_neg = torch.empty(2 * batch_size * seq_len * 4, device="cuda")
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, seqs, pos_neg


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
