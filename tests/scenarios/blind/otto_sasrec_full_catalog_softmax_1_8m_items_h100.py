"""otto_sasrec.py -- a Kaggle OTTO (session-based e-commerce recommendation) notebook-turned-script: a SASRec
transformer (2 blocks, 64 dims) over sessions truncated to their last 50 events, trained with the full
softmax over the whole catalog of 1,855,603 item ids (next-item cross-entropy at every position, the
output layer tied to the item embedding), bf16 autocast, batch 256 sessions, on a rented H100 80GB:

    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model(seqs)                                    # 256 x 50 x 64
        logits = h @ model.item_emb.weight.T               # 256 x 50 x 1,855,603 in bf16: 44 GiB
        loss = F.cross_entropy(logits.view(-1, n_items), targets.view(-1), ignore_index=0)
    scaler.scale(loss).backward()

The model is 0.45 GiB (AdamW's state will add 0.9 GiB); the transformer's activations are a few MiB.
The logits over the catalog take 44 GiB, and cross_entropy's log_softmax wants another tensor of their
size: the first training step fails inside F.cross_entropy.  The user has already turned on autocast.

An expert: the full-catalog softmax is the problem, not the network -- use a sampled softmax (a few
hundred to a few thousand sampled or in-batch negatives per position, with a logQ correction; gSASRec /
the OTTO top solutions did) or a cut/chunked cross-entropy that never materialises the full logits.
Halving the batch only halves a 88 GiB loss.  Not gradient checkpointing or flash attention
(sequences of 50 and two blocks: the activations are tiny), not mixed precision (already on), not
quantization or LoRA, not inference.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_ITEMS = 1855603
DIM = 64
MAX_LEN = 50


class TransformerBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn = nn.Parameter(torch.empty(4 * DIM * DIM * 4, device="cuda"))
        self.ffn = nn.Parameter(torch.empty(2 * DIM * DIM * 4 * 4, device="cuda"))

    def forward(self, h, positions):
        a = torch.empty(positions * DIM * 2 * 6, device="cuda")           # q, k, v, scores, out (bf16)
        a._saved = h
        out = torch.empty(positions * DIM * 2, device="cuda")
        out._saved = a
        return out


class SASRec(nn.Module):
    def __init__(self, n_items):
        nn.Module.__init__(self)
        self.item_emb = nn.Parameter(torch.empty(n_items * DIM * 4, device="cuda"))   # 453 MiB, tied output
        self.pos_emb = nn.Parameter(torch.empty(MAX_LEN * DIM * 4, device="cuda"))
        self.block_0 = TransformerBlock()
        self.block_1 = TransformerBlock()

    def forward(self, seqs, positions):
        h = torch.empty(positions * DIM * 2, device="cuda")                # item_emb[seqs] + pos_emb
        h._saved = seqs
        h = self.block_0(h, positions)
        h = self.block_1(h, positions)
        return h


def session_batches(batch_size):
    for _ in range(100000):
        seqs = torch.empty(batch_size * MAX_LEN * 8, device="cuda")          # int64 item ids
        targets = torch.empty(batch_size * MAX_LEN * 8, device="cuda")       # next item at every position
        yield seqs, targets


def main():
    batch_size = 256
    model = SASRec(N_ITEMS)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step, (seqs, targets) in enumerate(session_batches(batch_size)):
        positions = batch_size * MAX_LEN
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model(seqs, positions)
            logits = torch.empty(positions * N_ITEMS, dtype=torch.bfloat16, device="cuda")   # h @ item_emb.T
            logits._saved = h
            logits._params = h._params + (model.item_emb,)
            loss = F.cross_entropy(logits, targets)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, h
        if step % 100 == 0:
            print("step %d" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
