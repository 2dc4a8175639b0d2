"""Two-tower retrieval training for a video feed, in-batch sampled softmax with logQ correction, on a single
A100 40GB.  The recipe the user reproduces trained on 8 GPUs with 8,192 queries per GPU and all_gather'd
item embeddings, so each GPU's logits were 8,192 x 65,536.  Wanting "the same 65,536 negatives" on one
card, the user set batch_size: 65536.  The real code:

    class InBatchSoftmax(nn.Module):
        def forward(self, user_vecs, item_vecs, item_ids):
            logits = user_vecs @ item_vecs.T / self.temperature           # [B, B] fp32
            logits = logits - self.log_q[item_ids].unsqueeze(0)            # logQ (sampling-bias) correction
            hits = item_ids.unsqueeze(1) == item_ids.unsqueeze(0)          # same item twice in the batch
            hits.fill_diagonal_(False)
            logits = logits.masked_fill(hits, float("-inf"))               # <- OOM
            return F.cross_entropy(logits, torch.arange(B, device=logits.device))

    for batch in loader:                                # batch_size=65536
        u = model.user_tower(batch["user"]); v = model.item_tower(batch["item"])
        loss = criterion(u, v, batch["item_id"]); loss.backward(); opt.step(); opt.zero_grad()

Sizes.  Weights: user-id table 8M x 128 fp32 = 3.81 GiB, item-id table 3M x 128 = 1.43 GiB, side
features and the two MLP towers ~0.1 GiB; CUDA context 0.5 GiB.  Tower outputs are 65,536 x 128 fp32 =
32 MiB each: nothing.  The loss is quadratic in the batch: every [B, B] fp32 tensor is 65,536^2 x 4 =
16 GiB (the bool mask 4 GiB).  The matmul and the division are alive together (32 GiB: total ~38 GiB of
40, it just fits), then the logQ subtraction reuses the matmul's freed block, the mask (4 GiB, kept for
masked_fill's backward) lands in the block the division's output freed, and masked_fill asks for another
16 GiB: 25.4 GiB allocated (weights 5.4, logits 16, mask 4), and PyTorch reports 12 GiB reserved but
unallocated (the rest of the mask's block) and 2 GiB free on the device.  Even as one block those 14 GiB
are short of the 16 GiB request: the first training step fails in the loss's forward.  With 8,192
queries per step the same logits are 8,192 x 65,536 = 2 GiB (or 8,192 x 8,192 = 256 MiB with plain
in-batch negatives).

What an expert says: this is the B x B logits, not the model: go back to 8,192 (or 16,384) queries per
step and, if 65k negatives are wanted, take the extra item embeddings from a cross-batch memory /
negative cache (detached) or compute the softmax in query chunks (GradCache-style), i.e. split the loss.
Autocast helps only a little (softmax/log_softmax stay fp32).  Wrong advice: gradient checkpointing of the
towers (their activations are megabytes), flash-attention or shorter sequences (no attention, no
sequence), 8-bit optimizers or ZeRO (no optimizer state exists yet: step 1), inference_mode,
expandable_segments / empty_cache (12 GiB cached + 2 GiB free < 16 GiB asked, and the cached part is
the live mask's segment), smaller embedding tables (5.4 GiB of the 40).
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

CONFIG = {
    "batch_size": 65536,      # paper: 8 GPUs x 8192 per GPU, negatives all_gather'd = 65536
    "emb_dim": 128,
    "num_users": 8_000_000,
    "num_items": 3_000_000,
    "temperature": 0.05,
    "lr": 1e-3,
    "steps": 20_000,
}


def _op_output(n_elems, dtype=torch.float32):
    """What one tensor operation writes (the stand-in computes nothing, it allocates)."""
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.num, self.dim = num, dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32, device="cuda"))

    def forward(self, n_ids):
        return _op_output(n_ids * self.dim)


class Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.o = o
        self.weight = nn.Parameter(torch.empty(i * o, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(o, dtype=torch.float32, device="cuda"))

    def forward(self, x, rows):
        out = _op_output(rows * self.o)
        out._saved = x
        return out


class Tower(nn.Module):
    def __init__(self, num_ids, side_vocab, dim):
        super().__init__()
        self.id_emb = Embedding(num_ids, dim)
        self.side_emb = Embedding(side_vocab, dim)
        self.fc1 = Linear(2 * dim, 512)
        self.fc2 = Linear(512, 256)
        self.fc3 = Linear(256, dim)

    def forward(self, rows):
        x = self.id_emb(rows)
        s = self.side_emb(rows)
        h = _op_output(rows * 2 * CONFIG["emb_dim"])     # torch.cat([x, s], -1)
        h = self.fc1(h, rows)
        h = self.fc2(h, rows)
        out = self.fc3(h, rows)
        return _op_output(rows * CONFIG["emb_dim"])      # F.normalize(out, dim=-1)


class TwoTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.user_tower = Tower(cfg["num_users"], 200_000, cfg["emb_dim"])
        self.item_tower = Tower(cfg["num_items"], 50_000, cfg["emb_dim"])


class InBatchSoftmax(nn.Module):
    def __init__(self, num_items, temperature):
        super().__init__()
        self.temperature = temperature
        self.register_buffer("log_q", torch.empty(num_items, dtype=torch.float32, device="cuda"))

    def forward(self, user_vecs, item_vecs, item_ids, batch):
        logits = _op_output(batch * batch)                 # user_vecs @ item_vecs.T
        logits = _divide(logits, self.temperature, batch)  # ... / self.temperature
        logits = _subtract_log_q(logits, batch)            # logits - self.log_q[item_ids].unsqueeze(0)
        hits = _op_output(batch * batch, torch.uint8)      # item_ids[:, None] == item_ids[None, :]
        logits = _masked_fill(logits, hits, batch)         # logits.masked_fill(hits, -inf)
        return F.cross_entropy(logits, None)


def _divide(logits, t, batch):
    return _op_output(batch * batch)


def _subtract_log_q(logits, batch):
    return _op_output(batch * batch)


def _masked_fill(logits, mask, batch):
    out = _op_output(batch * batch)
    out._saved = mask
    return out


def train(model, criterion, opt, cfg):
    batch = cfg["batch_size"]
    for step in range(cfg["steps"]):
        item_ids = torch.empty(batch * 8, device="cuda")          # int64 ids of this batch
        u = model.user_tower(batch)
        v = model.item_tower(batch)
        loss = criterion(u, v, item_ids, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 100 == 0:
            print("step", step)


def main():
    model = TwoTower(CONFIG)
    criterion = InBatchSoftmax(CONFIG["num_items"], CONFIG["temperature"])
    opt = torch.optim.AdamW(model.parameters(), lr=CONFIG["lr"])
    train(model, criterion, opt, CONFIG)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
