"""A data scientist fine-tunes the production CTR model (DLRM, Criteo-style: 13 dense + 26 hashed categorical
features) on last week's logs, on the team's g5.2xlarge "GPU dev box" (one A10G, 24 GB: 22.5 GiB usable).
The same script ran there two weeks ago.  Since then the platform team deployed the *staging* Triton
ranking endpoint on that box: tritonserver (pid 2417) serves the same DLRM through the HugeCTR
Hierarchical Parameter Server, whose GPU embedding cache (gpucacheper 0.5) plus TensorRT engines and
Triton's CUDA memory pool hold 9 GiB of the card around the clock (nvidia-smi lists it).

The real code:

    model = DLRM(table_sizes=TABLE_SIZES, emb_dim=64, bottom=[512, 256, 64],
                 top=[1024, 1024, 512, 256, 1]).cuda()                    # nn.EmbeddingBag(sparse=False)
    model.load_state_dict(torch.load("prod/dlrm_2024w23.pt", map_location="cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for dense, sparse, label in loader:                                   # batch 16,384
        loss = F.binary_cross_entropy_with_logits(model(dense.cuda(), sparse.cuda()), label.cuda())
        loss.backward(); opt.step(); opt.zero_grad()

Sizes: 26 tables, 16.2M rows in all (seven hashed to 2M rows, one to 1M, 18 small ones) x 64 x fp32 =
3.86 GiB of weights; the MLPs ~10 MB.  Dense gradients of the tables 3.86 GiB, AdamW's exp_avg and
exp_avg_sq 7.72 GiB, a step's activations ~0.4 GiB, CUDA context 0.5 GiB: the job peaks at ~16.3 GiB
and fits the empty card with ~6 GiB to spare (as it did two weeks ago).  With tritonserver's 9 GiB,
13 GiB are left for the whole process: the first forward and backward go through (weights + gradients
7.7 GiB) and the first opt.step() fails part way through making AdamW's state: a 488 MiB moment of a 2M-row
table, with ~4.7 GiB of state made and 0.4 GiB free.

What an expert says: the card is shared -- another process (tritonserver, not this job's) holds 9 GiB.
Run the fine-tune on a free GPU, or stop / move the staging endpoint (or shrink its HPS cache) while
training.  Only if the card must stay shared: make the job smaller (sparse/row-wise optimizer for the
tables, bf16 state).  Wrong advice: empty_cache / expandable_segments (the process caches nothing;
the memory is in another process), restarting this process (Triton stays), a smaller batch or
gradient checkpointing (activations are 0.4 GiB), inference_mode, flash-attention, quantization.
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402

EMB_DIM = 64
BATCH_SIZE = 16384
NUM_DENSE = 13
# 26 categorical features, hashed: seven capped at 2M rows, one at 1M, the rest small (16.2M rows in all)
TABLE_SIZES = [2_000_000] * 7 + [1_000_000] + [150_000, 120_000, 100_000, 100_000, 90_000, 80_000, 80_000,
                                                   70_000, 70_000, 60_000, 60_000, 50_000, 40_000, 40_000,
                                                   30_000, 30_000, 20_000, 10_000]


def _op_output(n_elems, dtype=torch.float32):
    """What one tensor operation writes (the stand-in computes nothing, it allocates)."""
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class EmbeddingBag(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32, device="cuda"))

    def forward(self, batch):
        return _op_output(batch * self.dim)


class Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.o = o
        self.weight = nn.Parameter(torch.empty(i * o, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(o, dtype=torch.float32, device="cuda"))

    def forward(self, x, batch):
        out = _op_output(batch * self.o)
        out._saved = x
        return out


class MLP(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.n = len(dims) - 1
        for i in range(self.n):
            setattr(self, "layer%d" % i, Linear(dims[i], dims[i + 1]))

    def forward(self, x, batch):
        for i in range(self.n):
            x = getattr(self, "layer%d" % i)(x, batch)
        return x


class DLRM(nn.Module):
    def __init__(self, table_sizes, emb_dim):
        super().__init__()
        self.n_tables = len(table_sizes)
        for i, n in enumerate(table_sizes):
            setattr(self, "emb_%d" % i, EmbeddingBag(n, emb_dim))
        self.bottom_mlp = MLP([NUM_DENSE, 512, 256, emb_dim])
        n_int = (self.n_tables + 1) * self.n_tables // 2 + emb_dim
        self.top_mlp = MLP([n_int, 1024, 1024, 512, 256, 1])

    def forward(self, dense, batch):
        d = self.bottom_mlp(dense, batch)
        embs = [getattr(self, "emb_%d" % i)(batch) for i in range(self.n_tables)]
        t = _op_output(batch * (self.n_tables + 1) * EMB_DIM)       # torch.stack([d] + embs, 1)
        inter = _op_output(batch * (self.n_tables + 1) ** 2)         # torch.bmm(t, t.transpose(1, 2))
        inter._saved = t
        z = _op_output(batch * ((self.n_tables + 1) * self.n_tables // 2 + EMB_DIM))
        z._saved = inter
        return self.top_mlp(z, batch)


class BCEWithLogits(nn.Module):
    def forward(self, logits):
        loss = _op_output(1)
        loss._saved = logits
        return loss


def load_checkpoint(model, path):
    """torch.load(path, map_location="cpu") then load_state_dict: copied into the parameters in place."""
    return model


def finetune(model, opt, steps):
    criterion = BCEWithLogits()
    for step in range(steps):
        dense = torch.empty(BATCH_SIZE * NUM_DENSE, dtype=torch.float32, device="cuda")   # dense.cuda()
        logits = model(dense, BATCH_SIZE)
        loss = criterion(logits)
        scen_truth.backward(loss)          # loss.backward(): frees what the graph saved
        opt.step()
        opt.zero_grad()
        if step % 200 == 0:
            print("step", step)


def main():
    model = DLRM(TABLE_SIZES, EMB_DIM)
    load_checkpoint(model, "prod/dlrm_2024w23.pt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    finetune(model, opt, steps=30_000)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
