"""stream_trainer.py -- a second-hand marketplace's retrieval model, trained online from the event stream by a
long-running trainer on an AWS g5.2xlarge (NVIDIA A10G, 24 GB, 23,028 MiB).  A two-tower model: user and item
ID embeddings (64 dims, float32, nn.Embedding(sparse=True) so that each step's gradient holds only the rows
of the batch), small MLP towers, in-batch softmax over 4,096 (user, clicked item) pairs.  The ID space is
open -- new users and listings arrive all day -- so the team wrote a table that maps raw IDs to rows with a
Python dict and grows like a std::vector, doubling when it is full, and carries the SparseAdam moments along:

    class DynamicEmbedding(nn.Module):
        def lookup(self, raw_ids):
            rows = [self.id2row.setdefault(i, len(self.id2row)) for i in raw_ids]
            if len(self.id2row) > self.capacity:
                self._grow()
            return F.embedding(torch.tensor(rows, device="cuda"), self.weight, sparse=True)

        def _grow(self):
            new_cap = 2 * self.capacity
            new_weight = torch.empty((new_cap, self.dim), device=self.weight.device)
            new_weight[: self.capacity] = self.weight.data
            nn.init.normal_(new_weight[self.capacity :], std=0.01)
            self.weight = nn.Parameter(new_weight)
            torch.cuda.empty_cache()                 # give the old copy back to the driver
            ...  # the same for SparseAdam's exp_avg and exp_avg_sq, one at a time
    opt_sparse = torch.optim.SparseAdam(list(user_emb.parameters()) + list(item_emb.parameters()), lr=1e-3)

It started on 2^21 user rows.  It doubled on days 2, 3 and 6 without anyone noticing; on day 11 the user table
passed 2^24 = 16.8M rows (4 GiB; SparseAdam's two dense moments 8 GiB more; the item table 2^22 rows, 1 GiB
plus 2 GiB of moments) and the next doubling asked for an 8 GiB table with 6.0 GiB free.  The log shows 3.1M
users active in the last 30 days: the rest are guest checkouts, crawlers and one-visit accounts that each
keep a row (and two rows of moments) for ever.

An expert: no model or batch that is too big, and nothing leaks in the usual sense: the table is sized by the
number of distinct IDs ever seen, which has no bound, and a doubling needs the old and the new table at once, so it
fails long before the card is full of useful rows.  Bound the table: hash IDs into a fixed number of rows, or give
it a fixed capacity with eviction of IDs unseen for N days (TorchRec's managed-collision / zero-collision hashing
with LRU or TTL eviction); new users then share or recycle rows.  Also worth it: SparseAdam keeps two dense moments
per row, twice the table; a row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD: one float per row) frees 8 GiB, but
it only buys one more doubling.  Wrong first: a smaller batch or gradient checkpointing (the step's activations are
a few hundred MiB; the failing request is the table), mixed precision (autocast does not change stored fp32
tables), expandable_segments or empty_cache (the loop already calls it; nothing is cached: 8 GiB requested, 6.0 GiB
free), copying in chunks (the new table is still 8 GiB beside the old), a bigger GPU (an 80 GB card takes two more
doublings), restarting (the table is the state).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F32 = torch.float32
DIM = 64
BATCH = 4096
GiB = float(1 << 30)

# ---- stand-in gap: torch.optim.SparseAdam (dense exp_avg / exp_avg_sq per parameter, made at the first
# step as PyTorch's is), compiled as part of torch's optimizer file.
_SPARSE_ADAM = """
class SparseAdam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, maximize=False):
        Optimizer.__init__(self, params, dict(lr=lr, betas=betas, eps=eps, maximize=maximize))

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                self.state[p] = {"step": 0,
                                 "exp_avg": torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device),
                                 "exp_avg_sq": torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device)}
            self.state[p]["step"] += 1
"""
if not hasattr(torch.optim, "SparseAdam"):
    import torch.optim.optimizer as _opt_mod
    _ns = {"torch": torch, "Optimizer": torch.optim.Optimizer}
    exec(compile(_SPARSE_ADAM, _opt_mod.__file__, "exec"), _ns)
    torch.optim.SparseAdam = _ns["SparseAdam"]
# ----


def sparse_grad(weight, nnz_rows):
    """What backward of F.embedding(..., sparse=True) leaves in weight.grad: a sparse COO tensor of the
    batch's rows (values [nnz, 64] float32 + int64 indices), not a dense copy of the table."""
    weight.grad = torch.empty(nnz_rows * (DIM * 4 + 8), device=weight.device)


class DynamicEmbedding(torch.nn.Module):
    def __init__(self, name, capacity, dim=DIM):
        torch.nn.Module.__init__(self)
        self.name = name
        self.capacity = capacity
        self.dim = dim
        self.id2row = 0          # len(self.id2row): the dict itself lives in host memory
        self.weight = torch.nn.Parameter(torch.empty(capacity * dim, dtype=F32, device="cuda"))
        self.opt = None          # the SparseAdam that holds this table's moments

    def lookup(self, n_new_ids):
        self.id2row += n_new_ids
        while self.id2row > self.capacity:
            self._grow()

    def _grow(self):
        new_cap = 2 * self.capacity
        print("%s: %d ids > capacity %d, growing to %d rows (%.1f GiB)" % (
            self.name, self.id2row, self.capacity, new_cap, new_cap * self.dim * 4 / GiB))
        new_weight = torch.empty(new_cap * self.dim, dtype=F32, device=self.weight.device)
        # new_weight[: self.capacity] = self.weight.data ; nn.init.normal_(new_weight[self.capacity:], std=0.01)
        old = self.weight
        self.weight = torch.nn.Parameter(new_weight)
        st = self.opt.state.pop(old, None) if self.opt is not None else None
        if self.opt is not None:
            group = self.opt.param_groups[0]["params"]
            group[[i for i, p in enumerate(group) if p is old][0]] = self.weight
        del old
        torch.cuda.empty_cache()             # give the old copy back to the driver before the next one
        if st is not None:
            for k in ("exp_avg", "exp_avg_sq"):
                grown = torch.empty(new_cap * self.dim, dtype=F32, device=self.weight.device)
                # grown[: self.capacity] = st[k]
                st[k] = grown
                del grown
                torch.cuda.empty_cache()
            self.opt.state[self.weight] = st
        self.capacity = new_cap


class Tower(torch.nn.Module):
    def __init__(self, fan_in, widths):
        torch.nn.Module.__init__(self)
        dims = [fan_in] + widths
        for i in range(len(widths)):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(dims[i] * dims[i + 1] + dims[i + 1],
                                                                    dtype=F32, device="cuda")))
        self.widths = widths

    def forward(self, x):
        saved = x
        for w in self.widths:
            y = torch.empty(BATCH * w, dtype=F32, device="cuda")
            y._saved = saved
            saved = y
        return saved


class TwoTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.user_emb = DynamicEmbedding("user_emb", 1 << 21)
        self.item_emb = DynamicEmbedding("item_emb", 1 << 22)
        # user: own id + 50 recently viewed items (mean-pooled) + 300 context features (hashed, one-hot dense)
        self.user_tower = Tower(DIM * 2 + 4096, [4096, 2048, 256])
        self.item_tower = Tower(DIM + 2048, [2048, 1024, 256])

    def forward(self, batch):
        u_in = torch.empty(BATCH * (DIM * 2 + 4096), dtype=F32, device="cuda")
        i_in = torch.empty(BATCH * (DIM + 2048), dtype=F32, device="cuda")
        u = self.user_tower(u_in)
        v = self.item_tower(i_in)
        logits = torch.empty(BATCH * BATCH, dtype=F32, device="cuda")     # u @ v.T, in-batch negatives
        logits._saved = (u, v)
        return logits


def train_step(model, opt_dense, stream_hour):
    batch = None
    logits = model(batch)
    loss = torch.nn.functional.cross_entropy(logits, None)
    loss.backward()
    # F.embedding(..., sparse=True): the two tables' gradients are the batch's rows only
    sparse_grad(model.user_emb.weight, BATCH)
    sparse_grad(model.item_emb.weight, BATCH * 51)
    opt_dense.step()
    model.user_emb.opt.step()
    opt_dense.zero_grad()
    model.user_emb.opt.zero_grad()
    del logits, loss


def main():
    model = TwoTower()
    # the embedding tables are updated by SparseAdam, the towers by AdamW
    tables = [model.user_emb.weight, model.item_emb.weight]
    opt_sparse = torch.optim.SparseAdam(tables, lr=1e-3)
    model.user_emb.opt = model.item_emb.opt = opt_sparse
    dense = model.user_tower.parameters() + model.item_tower.parameters()
    opt_dense = torch.optim.AdamW(dense, lr=1e-4)
    print("towers: %.1fM parameters; tables: user %d rows, item %d rows" % (
        sum(p.nbytes for p in dense) / 4e6, model.user_emb.capacity, model.item_emb.capacity))

    rng = random.Random(11)
    # new distinct user ids per day (guest checkouts, crawlers and one-visit accounts included), growing
    # with the marketplace; the listing catalogue stays around 3-4M
    new_users_per_day = [1_900_000, 1_500_000, 1_400_000, 1_450_000, 1_500_000, 1_550_000, 1_600_000,
                         1_650_000, 1_700_000, 1_750_000, 1_900_000, 2_000_000]
    model.item_emb.lookup(3_300_000)
    for day, n in enumerate(new_users_per_day, 1):
        for hour in range(24):
            model.user_emb.lookup(n // 24)
            model.item_emb.lookup(rng.randint(0, 2_000))
            train_step(model, opt_dense, hour)
        print("day %d: user ids %d (capacity %d), GPU allocated %.2f GiB, free %.2f GiB" % (
            day, model.user_emb.id2row, model.user_emb.capacity, torch.cuda.memory_allocated() / GiB,
            torch.cuda.mem_get_info()[0] / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
