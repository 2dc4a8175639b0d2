"""Node2Vec embeddings for a 48M-account follow graph (1.2B edges) on one A100 80GB, with dense
gradients and AdamW.

The real code (PyTorch Geometric, run as `python train_n2v.py` on an 8-GPU box where the job got one
A100-SXM4-80GB):

    data = torch.load("follows_2024q4.pt")            # edge_index 2 x 1.2B, kept on the CPU
    model = Node2Vec(data.edge_index, embedding_dim=128, walk_length=20, context_size=10,
                     walks_per_node=10, num_negative_samples=1, p=1.0, q=1.0,
                     sparse=False).to(device)          # was sparse=True in the PyG example
    loader = model.loader(batch_size=128, shuffle=True, num_workers=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=1e-4)
    for epoch in range(1, 6):
        for pos_rw, neg_rw in loader:
            optimizer.zero_grad()
            loss = model.loss(pos_rw.to(device), neg_rw.to(device))
            loss.backward()
            optimizer.step()

PyG's example trains Node2Vec with sparse=True and torch.optim.SparseAdam.  The user wanted weight
decay: SparseAdam has no weight_decay, and AdamW refuses sparse gradients ("AdamW does not support
sparse gradients"), so they set sparse=False and switched to AdamW.  The walks are sampled on the
CPU by the loader's workers; the only big thing on the GPU is the embedding table.

Sizes: 48,000,000 nodes x 128 x 4 B = 24.58 GB (22.89 GiB) of weights.  sparse=False makes the
embedding's backward produce a dense gradient of the whole table: another 22.89 GiB.  AdamW's first
step then makes exp_avg (22.89 GiB) and exp_avg_sq (22.89 GiB).  Context 0.5 GiB + 3 x 22.89 GiB +
one walk batch (128 seeds x 10 walks x 11 windows = 14,080 windows of 10 ids: ~0.15 GB of ids and
embeddings) = ~69.3 GiB when exp_avg_sq asks for 22.89 GiB with ~10.7 GiB free on a 80 GiB card:
the job dies at step 1 of epoch 1, inside optimizer.step().

What an expert says first: the table, a dense gradient and two dense Adam moments are four copies
of a 23 GiB table; go back to sparse=True + SparseAdam (the gradient is only the rows a batch
touches: 22.9 + 45.8 GiB fits in 80 GiB) and put weight decay elsewhere, or use an 8-bit / row-wise
optimizer (Adagrad row-wise, 8-bit Adam: 45.8 GiB of moments -> ~11 GiB), or embedding_dim 64, or
keep the table in pinned CPU memory and move only the batch's rows.  Wrong advice: a smaller walk
batch (the batch is ~0.15 GB), gradient checkpointing (no activations worth speaking of), autocast
(the weights, gradient and moments stay fp32), empty_cache / expandable_segments (nothing is
cached or fragmented: this is the first step).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda:0"
NUM_NODES = 48_000_000          # accounts in the follow graph (1.2B directed follow edges, on the CPU)
EMBEDDING_DIM = 128
WALK_LENGTH = 20
CONTEXT_SIZE = 10
WALKS_PER_NODE = 10
NUM_NEGATIVE_SAMPLES = 1
BATCH_SIZE = 128
INDEX_BYTES = 8                 # int64 node ids


class Embedding(nn.Module):
    """torch.nn.Embedding(num_embeddings, embedding_dim, sparse=...): a float32 table; a lookup of
    n ids gives n x embedding_dim floats."""

    def __init__(self, num_embeddings, embedding_dim, sparse=False, device=None):
        nn.Module.__init__(self)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.sparse = sparse
        self.weight = nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32, device=device))

    def forward(self, index):
        out = torch.empty(index.num_ids * self.embedding_dim, dtype=torch.float32, device=index.device)
        out._saved = index                       # the ids, for the (dense) embedding backward
        return out


class SkipGramLoss(nn.Module):
    """-log(sigmoid(<h_start, h_rest>)) over the positive windows plus -log(1 - sigmoid(...)) over
    the negative ones, as Node2Vec.loss computes it."""

    def forward(self, h_start, h_rest, h_neg_start, h_neg_rest, num_windows):
        pos_out = torch.empty(num_windows * (CONTEXT_SIZE - 1), dtype=torch.float32, device=h_start.device)
        pos_out._saved = (h_start, h_rest)
        neg_out = torch.empty(num_windows * (CONTEXT_SIZE - 1), dtype=torch.float32, device=h_start.device)
        neg_out._saved = (h_neg_start, h_neg_rest)
        loss = torch.empty(1, dtype=torch.float32, device=h_start.device)
        loss._saved = (pos_out, neg_out)
        return loss


class Node2Vec(nn.Module):
    def __init__(self, num_nodes, embedding_dim, walk_length, context_size, walks_per_node=1,
                 num_negative_samples=1, sparse=False, device=None):
        nn.Module.__init__(self)
        self.num_nodes = num_nodes
        self.embedding_dim = embedding_dim
        self.walk_length = walk_length
        self.context_size = context_size
        self.walks_per_node = walks_per_node
        self.num_negative_samples = num_negative_samples
        self.embedding = Embedding(num_nodes, embedding_dim, sparse=sparse, device=device)
        self.skipgram = SkipGramLoss()

    def loss(self, pos_rw, neg_rw):
        start, rest = pos_rw.start(), pos_rw.rest()
        h_start = self.embedding(start)
        h_rest = self.embedding(rest)
        h_neg_start = self.embedding(neg_rw.start())
        h_neg_rest = self.embedding(neg_rw.rest())
        return self.skipgram(h_start, h_rest, h_neg_start, h_neg_rest, pos_rw.num_windows)


class WalkIds(object):
    """A slice of a walk batch (its start column or the rest), as a tensor of int64 ids."""

    def __init__(self, tensor, num_ids):
        self.tensor = tensor
        self.num_ids = num_ids
        self.device = tensor.device


class RandomWalks(object):
    """pos_rw / neg_rw as the loader yields them: num_windows x context_size int64 ids, on the CPU
    until .to(device)."""

    def __init__(self, num_windows, context_size, device=None):
        self.num_windows = num_windows
        self.context_size = context_size
        self.device = device
        self.ids = None

    def to(self, device):
        moved = RandomWalks(self.num_windows, self.context_size, device)
        moved.ids = torch.empty(self.num_windows * self.context_size * INDEX_BYTES, device=device)
        return moved

    def start(self):
        return WalkIds(self.ids.view(), self.num_windows)

    def rest(self):
        t = torch.empty(self.num_windows * (self.context_size - 1) * INDEX_BYTES, device=self.device)  # .contiguous()
        return WalkIds(t, self.num_windows * (self.context_size - 1))


def walk_loader(num_nodes, batch_size):
    """model.loader(batch_size=128, shuffle=True, num_workers=8): random walks sampled on the CPU."""
    windows = batch_size * WALKS_PER_NODE * (WALK_LENGTH - CONTEXT_SIZE + 1)
    for _ in range(num_nodes // batch_size):
        yield (RandomWalks(windows, CONTEXT_SIZE),
               RandomWalks(windows * NUM_NEGATIVE_SAMPLES, CONTEXT_SIZE))


def train(model, loader, optimizer, epoch):
    model.train()
    steps = 0
    for pos_rw, neg_rw in loader:
        optimizer.zero_grad()
        loss = model.loss(pos_rw.to(device), neg_rw.to(device))
        loss.backward()
        optimizer.step()
        steps += 1
        if steps % 1000 == 0:
            print("epoch %d step %d" % (epoch, steps), flush=True)
    return steps


def main():
    model = Node2Vec(NUM_NODES, embedding_dim=EMBEDDING_DIM, walk_length=WALK_LENGTH, context_size=CONTEXT_SIZE,
                     walks_per_node=WALKS_PER_NODE, num_negative_samples=NUM_NEGATIVE_SAMPLES, sparse=False,
                     device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=1e-4)
    for epoch in range(1, 6):
        loader = walk_loader(NUM_NODES, BATCH_SIZE)
        train(model, loader, optimizer, epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
