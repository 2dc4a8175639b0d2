"""train_deepfm.py -- an ad-tech team's click-through-rate model, retrained daily on one AWS g5.xlarge
(A10G, 24 GB, 22.5 GiB usable).  DeepFM in plain PyTorch: one nn.Embedding per categorical field of the
impression log (26 fields, hashed, 7.9M rows in all, dim 64, fp32: 1.9 GiB), a 3-layer MLP, Adam-style
optimizer, batch 8192 read from parquet.  It has trained every day for months at ~3 GiB.

This week a data scientist added three hashed feature crosses that won offline (user x ad,
user x publisher, ad x hour-of-week), each hashed into 2**24 buckets "to keep collisions low":

    self.crosses = nn.ModuleList([nn.Embedding(1 << 24, 64) for _ in CROSSES])   # 4 GiB each, fp32
    ...
    loss = F.binary_cross_entropy_with_logits(model(batch), batch.label)
    loss.backward()
    optimizer.step()

The model now holds 13.9 GiB of embedding tables and the first forward pass fits (the batch's
activations are ~0.2 GiB).  The first loss.backward() fails: nn.Embedding defaults to sparse=False,
so autograd writes each table's gradient as a DENSE tensor of the whole table's size (embedding
dense backward zero-fills num_embeddings x dim), although a batch touches at most 8192 rows of it.
The 26 small tables' gradients (1.9 GiB) and the first cross's (4 GiB) fit; the second cross's
4 GiB gradient does not.  Had backward gone through, the optimizer's first step would have made two
dense moments per table (27.8 GiB) and failed there.

An expert: the failure is in backward and the request is the size of one parameter: it is a
gradient, and it is the size of the table, not of the batch.  Embedding tables of this size are
trained with sparse updates: sparse gradients and a row-wise optimizer fused into the backward
(TorchRec/FBGEMM EmbeddingBagCollection with EXACT_ROWWISE_ADAGRAD: no dense gradient, one float of
state per row), or nn.Embedding(sparse=True) with an optimizer whose state is not dense; or the big
cross tables kept in host memory (UVM caching); or much smaller cross tables (2**20-2**21 buckets,
dim 16).  Wrong first advice: a smaller batch or gradient accumulation (the gradient is the table's
size whatever the batch), gradient checkpointing (activations are 0.2 GiB), expandable_segments or
empty_cache (nothing is cached: the memory is parameters and gradients), inference_mode (this is
training), restarting.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
EMB_DIM = 64
BATCH = 8192

FIELDS = [  # hashed categorical fields of the impression log: buckets
    ("user_id", 3_500_000), ("device_id", 1_600_000), ("ip_prefix", 800_000), ("creative_id", 600_000),
    ("ad_id", 450_000), ("site_domain", 250_000), ("app_bundle", 220_000), ("publisher_id", 120_000),
    ("campaign_id", 90_000), ("advertiser_id", 40_000), ("geo_zip", 42_000), ("geo_city", 18_000),
    ("keyword_hash", 60_000), ("placement_id", 30_000), ("device_model", 12_000), ("os_version", 600),
    ("browser", 300), ("carrier", 900), ("language", 200), ("geo_region", 1_200), ("ad_size", 80),
    ("hour_of_week", 168), ("day_of_month", 31), ("connection_type", 8), ("gender_bucket", 4),
    ("age_bucket", 12),
]
CROSSES = [("user_x_ad", 1 << 24), ("user_x_publisher", 1 << 24), ("ad_x_hour", 1 << 24)]


class Embedding(torch.nn.Module):
    """torch.nn.Embedding(num_embeddings, embedding_dim, sparse=False) (the stand-in has none)."""

    def __init__(self, num_embeddings, embedding_dim, sparse=False):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim, self.sparse = num_embeddings, embedding_dim, sparse
        self.weight = torch.nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32,
                                                     device="cuda"))

    def forward(self, idx):
        out = torch.empty(BATCH * self.embedding_dim, dtype=torch.float32, device="cuda")
        out._saved = idx
        return out


class Linear(torch.nn.Module):
    """torch.nn.Linear(in_features, out_features)."""

    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = torch.nn.Parameter(torch.empty(i * o, dtype=torch.float32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(o, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        out = torch.empty(BATCH * self.out_features, dtype=torch.float32, device="cuda")
        out._saved = x
        return out


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList."""

    def __init__(self, mods):
        torch.nn.Module.__init__(self)
        self._n = 0
        for m in mods:
            setattr(self, str(self._n), m)
            self._n += 1

    def __iter__(self):
        return iter([self._modules[str(i)] for i in range(self._n)])


class DeepFM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.fields = ModuleList([Embedding(n, EMB_DIM) for _, n in FIELDS])
        self.crosses = ModuleList([Embedding(n, EMB_DIM) for _, n in CROSSES])
        n_in = (len(FIELDS) + len(CROSSES)) * EMB_DIM
        self.fc1, self.fc2, self.fc3, self.out = Linear(n_in, 1024), Linear(1024, 512), Linear(512, 256), Linear(256, 1)

    def forward(self, cat_idx, cross_idx):
        embs = [emb(cat_idx) for emb in self.fields] + [emb(cross_idx) for emb in self.crosses]
        x = torch.empty(BATCH * len(embs) * EMB_DIM, dtype=torch.float32, device="cuda")   # torch.cat(embs, 1)
        x._saved = embs[-1]
        fm = torch.empty(BATCH * EMB_DIM, dtype=torch.float32, device="cuda")   # FM second-order term
        fm._saved = x
        h = self.fc3(self.fc2(self.fc1(x)))
        return self.out(h)


def batches():
    for step in range(3):
        cat_idx = torch.empty(BATCH * len(FIELDS) * 8, dtype=torch.uint8, device="cuda")     # int64 ids
        cross_idx = torch.empty(BATCH * len(CROSSES) * 8, dtype=torch.uint8, device="cuda")  # int64 ids
        label = torch.empty(BATCH, dtype=torch.float32, device="cuda")
        yield cat_idx, cross_idx, label


try:
    model = DeepFM().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    print("model on GPU: %.1f GiB of parameters" % (torch.cuda.memory_allocated() / (1 << 30)))
    for step, (cat_idx, cross_idx, label) in enumerate(batches()):
        logits = model(cat_idx, cross_idx)
        loss = torch.nn.functional.nll_loss(logits, label)      # F.binary_cross_entropy_with_logits
        print("step %d forward ok, allocated %.1f GiB" % (step, torch.cuda.memory_allocated() / (1 << 30)))
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print("step", step, "loss ok")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
