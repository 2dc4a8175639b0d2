"""BERT4Rec over a 500k-item marketplace catalog, full softmax at the masked positions, one A100 40GB.

The real code (train_bert4rec.py): 2 bidirectional transformer blocks (hidden 128, 2 heads, max_len 200), item
embedding 500,000 x 128 tied with the output layer, Cloze masking with p=0.2 of the non-padding items, AdamW,
fp32.  Batches of 256 sessions padded to 200.  The loss is the full softmax over the catalog at the masked
positions only:

    h = model(item_seq)[mask_pos]                          # (M, 128)
    logits = h @ model.item_embedding.weight.T + bias      # (M, 500000)
    loss = F.cross_entropy(logits, labels[mask_pos])
    ...
    epoch_topk.append(logits.topk(50, dim=-1).indices)     # for the epoch's Recall@50 / NDCG@50
    epoch_labels.append(labels[mask_pos])

M, the number of masked items, depends on how long the sessions of the batch are (the sampler draws each batch
from one day's sessions): 1,550 to 4,150 per batch in this epoch.  So each step asks for a logits tensor and
cross_entropy's log_softmax tensor of M x 500,000 x 4 B = 3.1 to 8.3 GB each, a different size every step;
with the encoder's activations (~0.9 GB), the weights, gradients and AdamW state (~1.0 GB) and the context a
step needs at most ~19 GB of the 40 GiB.  Nothing grows: at the failure PyTorch holds ~8.9 GiB allocated.
But every step also leaves a small tensor behind on the GPU: the top-50 indices (M x 50 x 8 B = 0.6 to 1.7 MB)
and the labels, kept for the whole epoch.  The caching allocator serves each from whatever free block fits best,
which, once the first 20 MiB segment is full, is a tail of one of the big logits segments freed the step
before.  That segment then holds a ~1.5 MB tensor for the rest of the epoch and can never be given back; the
next step whose M is larger than every free tail asks the driver for a new segment, so the reservation climbs
(6.9 -> 12.9 -> 24.8 -> 31.0 -> 37.8 GiB in nine steps) until the card is full.  At the failure (epoch 0, step 18,
M = 3,810: a 7.6 GB logits) cross_entropy's log_softmax asks for 7.1 GiB with 6.4 GiB free at the driver,
while PyTorch holds ~24 GiB reserved but unallocated, in tails each smaller than the request; its retry frees
nothing because every big segment is pinned.  (The same program without the kept top-k runs 30 epochs.)
What an expert says first: fragmentation.  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow and
shrink in place, the tails are not stranded); keep the epoch's top-k on the CPU (.cpu() them) so no small
tensor pins a big segment; or pad M to a fixed count per batch / use sampled softmax so the sizes repeat.
Wrong advice: a smaller batch or gradient checkpointing (the step's own need is ~19 GB of 40), empty_cache
(PyTorch already released what it could before raising: the segments are pinned), a bigger GPU.
"""
import random

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

NUM_ITEMS = 500_000
HIDDEN = 128
N_LAYERS = 2
N_HEADS = 2
MAX_LEN = 200
BATCH_SIZE = 256
MASK_PROB = 0.2
TOPK = 50
INT64 = 8
SEED = 10


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


class TransformerBlock(nn.Module):
    """Bidirectional self-attention + position-wise feed-forward (BERT4Rec's block)."""

    def __init__(self):
        super().__init__()
        self.query = Linear(HIDDEN, HIDDEN)
        self.key = Linear(HIDDEN, HIDDEN)
        self.value = Linear(HIDDEN, HIDDEN)
        self.output = Linear(HIDDEN, HIDDEN)
        self.ffn_in = Linear(HIDDEN, 4 * HIDDEN)
        self.ffn_out = Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x, batch_size):
        n = batch_size * MAX_LEN
        q = self.query(x, n)
        k = self.key(q, n)
        v = self.value(k, n)
        scores = torch.empty(batch_size * N_HEADS * MAX_LEN * MAX_LEN, dtype=torch.float32, device="cuda")
        scores._saved = v
        probs = torch.empty_like(scores)               # softmax(scores), kept for backward
        probs._saved = scores
        ctx = torch.empty(n * HIDDEN, dtype=torch.float32, device="cuda")
        ctx._saved = probs
        h = self.output(ctx, n)
        return self.ffn_out(self.ffn_in(h, n), n)


class BERT4Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.item_embedding = nn.Parameter(torch.empty(NUM_ITEMS * HIDDEN, dtype=torch.float32, device="cuda"))
        self.position_embedding = nn.Parameter(torch.empty(MAX_LEN * HIDDEN, dtype=torch.float32, device="cuda"))
        self.output_bias = nn.Parameter(torch.empty(NUM_ITEMS, dtype=torch.float32, device="cuda"))
        self.block_0 = TransformerBlock()
        self.block_1 = TransformerBlock()

    def forward(self, item_seq, batch_size, n_masked):
        x = torch.empty(batch_size * MAX_LEN * HIDDEN, dtype=torch.float32, device="cuda")   # item + position emb
        x._saved = item_seq
        x = self.block_1(self.block_0(x, batch_size), batch_size)
        h = torch.empty(n_masked * HIDDEN, dtype=torch.float32, device="cuda")             # x[mask_pos]
        h._saved = x
        # logits over the whole catalog at the masked positions: h @ item_embedding.T + output_bias
        logits = torch.empty(n_masked * NUM_ITEMS, dtype=torch.float32, device="cuda")
        logits._saved = h
        return logits


def masked_batches(n_steps, seed):
    """(item_seq, labels, M) per batch: the Cloze mask hides 20% of the non-padding items.  The sampler
    takes each batch from one day's sessions (weekends and sale days have longer sessions)."""
    rng = random.Random(seed)
    for step in range(n_steps):
        mean_len = rng.uniform(30.0, 80.0)
        n_items = sum(min(MAX_LEN, 3 + int(rng.expovariate(1 / mean_len))) for _ in range(BATCH_SIZE))
        n_masked = int(n_items * MASK_PROB)
        item_seq = torch.empty(BATCH_SIZE * MAX_LEN * INT64, device="cuda")
        labels = torch.empty(n_masked * INT64, device="cuda")
        yield item_seq, labels, n_masked


def train_one_epoch(model, optimizer, n_steps, seed):
    epoch_topk, epoch_labels = [], []
    for step, (item_seq, labels, n_masked) in enumerate(masked_batches(n_steps, seed)):
        logits = model(item_seq, BATCH_SIZE, n_masked)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        scen_truth.backward(loss)
        optimizer.step()
        epoch_topk.append(torch.empty(n_masked * TOPK * INT64, device="cuda"))   # logits.topk(50).indices
        epoch_labels.append(labels)
        del logits, loss
        if step % 10 == 0:
            print("step %d  masked=%d" % (step, n_masked))
    return epoch_topk, epoch_labels


def main():
    model = BERT4Rec()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    model.train()
    for epoch in range(30):
        topk, labels = train_one_epoch(model, optimizer, n_steps=400, seed=SEED + epoch)
        print("epoch %d: recall@50 computed over %d batches" % (epoch, len(topk)))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
