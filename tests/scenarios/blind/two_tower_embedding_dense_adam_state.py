"""train_retrieval.py -- a two-tower retrieval model for a marketplace (60M item ids, 30M user ids,
64-dim embeddings, small MLP towers) trained with in-batch negatives on one 80 GB A100, with plain
`LD_PRELOAD=liboomguard.so`:

    class TwoTower(nn.Module):
        def __init__(self):
            self.item_emb = nn.Embedding(60_000_000, 64)      # 14.3 GiB fp32; sparse=False (default)
            self.user_emb = nn.Embedding(30_000_000, 64)      #  7.2 GiB
            self.item_mlp, self.user_mlp = MLP(...), MLP(...)  # 40 MiB together
    model = TwoTower().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for users, items in loader:                               # batch 8192 pairs
        loss = in_batch_softmax(model.user(users), model.item(items))
        loss.backward(); optimizer.step(); optimizer.zero_grad()

A batch touches at most 16k of the 80M rows, yet with sparse=False each backward writes a dense
gradient as large as the tables (21.5 GiB), and AdamW keeps two dense moments for every row (43
GiB).  Weights and gradients fit; the first optimizer.step() runs out while creating the user
table's moments.  Activations are a few hundred MiB: the batch is not what fills the card.

An expert: do not materialise dense state for embedding tables -- sparse gradients
(nn.Embedding(sparse=True)) with SparseAdam / row-wise Adagrad, or TorchRec's fused embedding
optimizer (the update applied in backward, only the touched rows); or keep the tables in host/UVM
memory.  An 8-bit optimizer would also fit the state.  Not a smaller batch, checkpointing or mixed
precision of the activations (they are tiny), not inference, not a cache or fragmentation problem.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Embedding(torch.nn.Module):
    def __init__(self, rows, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(rows * dim * 4, device="cuda"))    # fp32 table


class MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(20 * MiB, device="cuda"))


class TwoTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.item_emb = Embedding(60000000, 64)
        self.user_emb = Embedding(30000000, 64)
        self.item_mlp = MLP()
        self.user_mlp = MLP()

    def forward(self, users, items):
        u = torch.empty(8192 * 64 * 4, device="cuda")           # looked-up rows
        u._saved = users
        i = torch.empty(8192 * 64 * 4, device="cuda")
        i._saved = items
        hu = torch.empty(8192 * 1024 * 4 * 6, device="cuda")    # tower activations
        hu._saved = u
        hi = torch.empty(8192 * 1024 * 4 * 6, device="cuda")
        hi._saved = i
        logits = torch.empty(8192 * 8192 * 4, device="cuda")    # in-batch scores
        logits._saved = hi
        return logits


def main():
    model = TwoTower()
    # truth mark at the failure itself (test scaffolding): AdamW's half-built state is gone by the except
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for step in range(200000):
        users = torch.empty(8192 * 8, device="cuda")
        items = torch.empty(8192 * 8, device="cuda")
        logits = model(users, items)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, users, items


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
