"""train_wide_deep.py -- an ads team ports its TensorFlow Estimator DNNLinearCombinedClassifier (Wide & Deep)
for click-through-rate prediction to PyTorch.  The data is Criteo-style: 13 integer features, 26 hashed
categorical ones (C1..C26).  The deep part is as usual: one nn.Embedding per categorical column (dim 16, columns
hashed to at most 1M rows: 5.57M rows, 356 MB), concatenated with the dense features into an MLP 1024-512-256.
The wide part is a linear model over three crossed columns, as the TF version had them
(tf.feature_column.crossed_column([...], hash_bucket_size=1_000_000)): C1 x C2, C3 x C4 x C5 and C14 x C17.
In TF the wide part was a sparse linear model; the port writes it the way it reads on paper, a Linear layer over
the one-hot encoding of each cross:

    class WideAndDeep(nn.Module):
        def __init__(...):
            ...
            self.wide = nn.Linear(sum(CROSS_BUCKETS), 1)            # 3M weights, 12 MB
        def forward(self, dense, cats, crosses):
            wide_in = torch.cat([F.one_hot(crosses[:, i], num_classes=n)
                                 for i, n in enumerate(CROSS_BUCKETS)], dim=1).float()
            wide_logit = self.wide(wide_in)
            ...

    BATCH_SIZE = 4096
    for dense, cats, crosses, y in loader:
        loss = F.binary_cross_entropy_with_logits(model(dense.cuda(), cats.cuda(), crosses.cuda()), y.cuda())
        ...

The whole model is 93M parameters (373 MB; 1.1 GB with the AdamW state to come).  The first training batch dies
in the forward pass, in the wide part: F.one_hot of the first cross is a [4096, 1,000,000] int64 tensor (one_hot
always returns int64), 30.5 GiB, which an A100 40GB just holds; the second cross asks for another 30.5 GiB with
8.6 GiB free.  The .float() copy (15.3 GiB per cross) and the Linear's saved input would come next.

An expert: the wide part is tiny (3M weights); the memory is the dense one-hot encoding of 3M hashed buckets per
example, 99.9999% zeros.  A Linear over a one-hot vector is a row lookup: make the wide part an
nn.EmbeddingBag(sum(CROSS_BUCKETS), 1, mode="sum") (or one dim-1 nn.Embedding per cross, offsets added to the
hashed ids) and sum the looked-up weights; that is what TF's sparse linear model did, and it needs O(batch)
memory (and sparse=True gradients if they like).
Wrong advice: a smaller batch (the one-hots, their concatenation and its float copy take about 60 MB per
example: a batch of a few hundred would fit, which is useless for CTR training and still makes gigabytes of zeros
per step), mixed precision (one_hot is int64 whatever autocast
says; the Linear's input would still be 8 GB per cross in bf16), gradient checkpointing or inference_mode (the
peak is one operation's output in the forward pass), expandable_segments / empty_cache (nothing is cached or
fragmented: one request is three quarters of the card), a bigger GPU (80 GB fails at the third cross), fewer hash
buckets (hashing the crosses into 10k buckets would fit but throws away what the crosses are for), CPU offload,
quantization or LoRA (the weights are 373 MB).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: int64 tensors, nn.Linear, nn.Embedding and F.one_hot (a C function
# in PyTorch, no Python frame of its own: compiled as part of torch's functional.py so that the failing line of
# the program stays the program's own).
if "int64" not in torch._ITEMSIZE:
    torch._ITEMSIZE["int64"] = 8
torch.int64 = torch.long = "int64"


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True, device=None):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=device))

    def forward(self, x):
        rows = x.nbytes // max(1, self.in_features * torch._ITEMSIZE[x.dtype])
        out = torch.empty(max(1, rows) * self.out_features, dtype=torch.float32, device=x.device)
        out._saved = x
        return out


class Embedding(torch.nn.Module):
    def __init__(self, num_embeddings, embedding_dim, device=None):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = torch.nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32,
                                                     device=device))

    def forward(self, idx):
        rows = idx.nbytes // 8
        return torch.empty(rows * self.embedding_dim, dtype=torch.float32, device=idx.device)


torch.nn.Linear, torch.nn.Embedding = Linear, Embedding

_ONE_HOT = """
def one_hot(tensor, num_classes=-1):
    rows = tensor.nbytes // 8
    return torch.empty(rows * int(num_classes), dtype=torch.int64, device=tensor.device)
"""
if not hasattr(F, "one_hot"):
    _ns = {"torch": torch}
    exec(compile(_ONE_HOT, F.__file__, "exec"), _ns)
    F.one_hot = _ns["one_hot"]
# ----

nn = torch.nn

BATCH_SIZE = 4096
EMBED_DIM = 16
# Criteo Kaggle cardinalities of C1..C26, hashed to at most 1M rows (the TF pipeline's hash_bucket_size)
CAT_CARDINALITIES = [1460, 583, 1000000, 1000000, 305, 24, 12517, 633, 3, 93145, 5683, 1000000, 3194, 27, 14992,
                     1000000, 10, 5652, 2173, 4, 1000000, 18, 15, 286181, 105, 142572]
# the wide part: crossed_column([...], hash_bucket_size=1_000_000) of the TF model
CROSSES = [("C1", "C2"), ("C3", "C4", "C5"), ("C14", "C17")]
CROSS_BUCKETS = [1000000, 1000000, 1000000]


class WideAndDeep(nn.Module):
    def __init__(self, device="cuda"):
        nn.Module.__init__(self)
        for i, n in enumerate(CAT_CARDINALITIES):
            setattr(self, "emb_C%d" % (i + 1), nn.Embedding(n, EMBED_DIM, device=device))
        d_in = 13 + 26 * EMBED_DIM
        self.mlp0 = nn.Linear(d_in, 1024, device=device)
        self.mlp1 = nn.Linear(1024, 512, device=device)
        self.mlp2 = nn.Linear(512, 256, device=device)
        self.deep_head = nn.Linear(256, 1, device=device)
        self.wide = nn.Linear(sum(CROSS_BUCKETS), 1, device=device)          # 3M weights, 12 MB

    def forward(self, dense, cats, crosses):
        # wide part: linear model over the one-hot crossed columns
        wide_in = torch.cat([F.one_hot(crosses[i], num_classes=n)
                             for i, n in enumerate(CROSS_BUCKETS)], dim=1).float()
        wide_logit = self.wide(wide_in)
        # deep part
        embs = [getattr(self, "emb_C%d" % (i + 1))(cats[i]) for i in range(26)]
        h = self.mlp2(self.mlp1(self.mlp0(torch.cat([dense] + embs, dim=1))))
        return wide_logit + self.deep_head(h)


# torch.cat: never reached in this run (the list comprehension fails first); named for the reader
def _cat(tensors, dim=0):
    return torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)


if not hasattr(torch, "cat"):
    torch.cat = _cat


def loader():
    """Criteo day_0..day_22 parquet shards, hashed on the CPU; each batch: dense [B, 13] float32, 26 categorical
    id columns [B] int64, the three hashed cross ids [B] int64, labels [B]."""
    while True:
        dense = torch.empty(BATCH_SIZE * 13, dtype=torch.float32, device="cuda")
        cats = [torch.empty(BATCH_SIZE, dtype=torch.int64, device="cuda") for _ in range(26)]
        crosses = [torch.empty(BATCH_SIZE, dtype=torch.int64, device="cuda") for _ in CROSSES]
        y = torch.empty(BATCH_SIZE, dtype=torch.float32, device="cuda")
        yield dense, cats, crosses, y


def main():
    model = WideAndDeep().cuda()
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("WideAndDeep: %.1fM parameters, wide part %d crosses x %d buckets" % (n_params / 1e6, len(CROSSES),
                                                                               CROSS_BUCKETS[0]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step, (dense, cats, crosses, y) in enumerate(loader()):
        logits = model(dense, cats, crosses)
        # loss = F.binary_cross_entropy_with_logits(logits, y); loss.backward(); optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 10:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
