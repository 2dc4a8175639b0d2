"""Distilling a DCN-v2 ranking teacher into a two-tower retrieval student, on one NVIDIA L4 (22.5 GiB usable).

The real code (distill_retrieval.py):

    teacher = DCNv2(TEACHER_FEATURES, dim=64)                       # the production ranker, 39.8M embedding rows
    teacher.load_state_dict(torch.load(TEACHER_CKPT, map_location="cpu"))
    teacher.to("cuda").eval()                                       # "eval() freezes it"
    student = TwoTower(STUDENT_FEATURES, dim=64).cuda()
    optimizer = torch.optim.AdamW(student.parameters(), lr=2e-4)
    for batch in loader:                                            # 8192 impressions
        s_logit = student(batch)
        t_logit = teacher(batch)                                    # no torch.no_grad(), not detached
        loss = bce(s_logit, batch.click) + ALPHA * kd_loss(s_logit, t_logit, T)
        loss.backward()
        optimizer.step(); optimizer.zero_grad()

eval() only switches dropout/batch-norm behaviour; the teacher's parameters still require grad, its forward is
recorded, and kd_loss (a KL divergence whose target is the teacher's soft label) backpropagates into the
teacher.  The first backward therefore makes a dense gradient for every one of the teacher's embedding tables
(nn.EmbeddingBag, sparse=False): 39.8M rows x 64 x 4 B = 10.2 GB (9.5 GiB), for a model no optimizer trains.
Sizes: teacher weights 9.5 GiB + student weights (8M rows x 64) 1.91 GiB + context 0.5 GiB + activations
~0.2 GiB = 12.1 GiB; the student's gradients (1.91 GiB) fit; the teacher's gradients are made table by table
after them and run out with 8.2 GiB of them made (user_id, item_id, device_id, ip_prefix, query_hash,
seller_id): the failing request is the gradient of the teacher's 'geo_cell' table (2M x 64 x 4 B = 512 MB), with
21.7 GiB allocated and 174 MiB free.  With the teacher frozen the whole job needs ~17.8 GiB (AdamW state for
the student only: 3.8 GiB).
What an expert says first: freeze the teacher and run it without autograd: teacher.requires_grad_(False) and
`with torch.no_grad(): t_logit = teacher(batch)` (or t_logit.detach()).  Wrong advice: smaller batch or gradient
checkpointing (activations are ~0.2 GiB), mixed precision, an 8-bit optimizer (no optimizer step has run, and
the waste is the teacher's gradients), expandable_segments / empty_cache (nothing is cached), a bigger card.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

DIM = 64
BATCH_SIZE = 8192
ALPHA = 0.5
TEMPERATURE = 2.0
TEACHER_CKPT = "s3://ads-models/ranker/dcnv2-2024-10-01.pt"

# the production ranker's 26 sparse features: rows per table (hashed and capped)
TEACHER_FEATURES = dict(
    [("user_id", 12_000_000), ("item_id", 4_000_000), ("device_id", 6_000_000), ("ip_prefix", 3_000_000),
     ("query_hash", 8_000_000), ("seller_id", 1_500_000), ("geo_cell", 2_000_000)]
    + [("cat_%02d" % i, 175_000) for i in range(19)])
STUDENT_FEATURES = {"user": {"user_id": 4_000_000, "geo_cell": 1_000_000, "query_hash": 1_000_000},
                    "item": {"item_id": 2_000_000}}


class EmbeddingBag(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, mode="sum"):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32,
                                               device="cuda"))

    def forward(self, ids, batch_size):
        out = torch.empty(batch_size * self.embedding_dim, dtype=torch.float32, device="cuda")
        out._saved = ids
        return out


class EmbeddingBagCollection(nn.Module):
    """One EmbeddingBag per sparse feature (as torchrec's EmbeddingBagCollection or an nn.ModuleDict)."""

    def __init__(self, features, dim):
        super().__init__()
        self.feature_names = list(features)
        for name, rows in features.items():
            setattr(self, name, EmbeddingBag(rows, dim))

    def forward(self, ids, batch_size):
        pooled = [getattr(self, name)(ids, batch_size) for name in self.feature_names]
        out = torch.empty(batch_size * DIM * len(pooled), dtype=torch.float32, device="cuda")   # torch.cat
        out._saved = pooled[-1]
        return out


class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.sizes = sizes
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            setattr(self, "linear_%d" % i, nn.Parameter(torch.empty(a * b, dtype=torch.float32, device="cuda")))

    def forward(self, x, batch_size):
        for width in self.sizes[1:]:
            h = torch.empty(batch_size * width, dtype=torch.float32, device="cuda")
            h._saved = x
            x = h
        return x


class CrossNetV2(nn.Module):
    def __init__(self, width, n_layers=3):
        super().__init__()
        self.width = width
        self.n_layers = n_layers
        for i in range(n_layers):
            setattr(self, "W_%d" % i, nn.Parameter(torch.empty(width * width, dtype=torch.float32, device="cuda")))

    def forward(self, x0, batch_size):
        x = x0
        for i in range(self.n_layers):
            xw = torch.empty(batch_size * self.width, dtype=torch.float32, device="cuda")   # x0 * (W x + b) + x
            xw._saved = x
            x = xw
        return x


class DCNv2(nn.Module):
    def __init__(self, features, dim):
        super().__init__()
        width = dim * len(features)
        self.embeddings = EmbeddingBagCollection(features, dim)
        self.cross = CrossNetV2(width)
        self.deep = MLP([width, 1024, 1024, 512])
        self.head = nn.Parameter(torch.empty(width + 512, dtype=torch.float32, device="cuda"))

    def forward(self, ids, batch_size):
        x0 = self.embeddings(ids, batch_size)
        c = self.cross(x0, batch_size)
        d = self.deep(x0, batch_size)
        logit = torch.empty(batch_size, dtype=torch.float32, device="cuda")
        logit._saved = d
        return logit


class TwoTower(nn.Module):
    def __init__(self, features, dim):
        super().__init__()
        self.user_embeddings = EmbeddingBagCollection(features["user"], dim)
        self.item_embeddings = EmbeddingBagCollection(features["item"], dim)
        self.user_tower = MLP([dim * len(features["user"]), 512, 256, 128])
        self.item_tower = MLP([dim * len(features["item"]), 512, 256, 128])

    def forward(self, ids, batch_size):
        u = self.user_tower(self.user_embeddings(ids, batch_size), batch_size)
        v = self.item_tower(self.item_embeddings(ids, batch_size), batch_size)
        logit = torch.empty(batch_size, dtype=torch.float32, device="cuda")    # (u * v).sum(-1)
        logit._saved = v
        return logit


class DistillationLoss(nn.Module):
    """BCE on the clicks + ALPHA * T^2 * KL(teacher soft label || student), as in Hinton et al."""

    def forward(self, s_logit, t_logit, clicks):
        kl = torch.empty(s_logit.nbytes // 4, dtype=torch.float32, device="cuda")
        kl._saved = t_logit
        loss = torch.empty(1, dtype=torch.float32, device="cuda")
        loss._saved = kl
        return loss


def load_teacher():
    teacher = DCNv2(TEACHER_FEATURES, DIM)
    # teacher.load_state_dict(torch.load(TEACHER_CKPT, map_location="cpu")) -- restored into these tensors
    teacher.eval()
    return teacher


def impressions(n_batches):
    for _ in range(n_batches):
        ids = torch.empty(BATCH_SIZE * 32 * 8, device="cuda")        # 26 hashed ids + dense features
        clicks = torch.empty(BATCH_SIZE, dtype=torch.float32, device="cuda")
        yield ids, clicks


def main():
    teacher = load_teacher()
    student = TwoTower(STUDENT_FEATURES, DIM)
    criterion = DistillationLoss()
    optimizer = torch.optim.AdamW(student.parameters(), lr=2e-4)
    student.train()
    for step, (ids, clicks) in enumerate(impressions(50_000)):
        s_logit = student(ids, BATCH_SIZE)
        t_logit = teacher(ids, BATCH_SIZE)
        loss = criterion(s_logit, t_logit, clicks)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 500 == 0:
            print("step %d" % step)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
