"""Daily warm start of a two-tower candidate-retrieval model (user-id and item-id embedding towers, dense
AdamW) on one H100 80GB (79.6 GiB usable).  Every night the job loads yesterday's checkpoint, grows the
user-id table for the users who signed up that day, carries the AdamW moments over and trains on the
day's logs.  The user base crossed 58M this week and tonight's run dies before its first step.

The real code (warm_start.py; optimizer.load_state_dict refuses the grown shapes, hence the hand copy):

    ckpt = torch.load(f"ckpt/{yesterday}.pt")                 # saved from the GPU: restored onto the GPU
    model = TwoTower(num_users=n_users_today, num_items=N_ITEMS, dim=64).cuda()
    with torch.no_grad():
        model.user_tower.user_id_emb.weight[:n_old].copy_(ckpt["model"]["user_tower.user_id_emb.weight"])
        model.item_tower.item_id_emb.weight.copy_(ckpt["model"]["item_tower.item_id_emb.weight"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, p in enumerate(model.parameters()):
        st = ckpt["optimizer"]["state"][i]
        if p.shape[0] != st["exp_avg"].shape[0]:                 # the grown user table
            pad = torch.zeros(p.shape[0] - st["exp_avg"].shape[0], p.shape[1], device="cuda")
            st = {"step": st["step"], "exp_avg": torch.cat([st["exp_avg"], pad]),
                  "exp_avg_sq": torch.cat([st["exp_avg_sq"], pad])}        # <- OOM
        opt.state[p] = st
    del ckpt
    train(model, opt, todays_logs)

Sizes (fp32, dim 64): yesterday's user table 58M x 64 = 13.83 GiB, today's 60M = 14.31 GiB; the item
table 4M x 64 = 0.95 GiB (the catalog did not grow); MLPs ~20 MB.  The checkpoint holds weights and two
AdamW moments: 3 x (13.83 + 0.95) = 44.3 GiB, all restored onto the GPU because yesterday's job saved it
from there.  Then today's model 15.3 GiB, the 2M-row pad 0.48 GiB and the grown exp_avg 14.31 GiB: with
the context 0.5 GiB the card holds ~74.9 GiB, and the second torch.cat (exp_avg_sq, 14.31 GiB) fails
with ~4.7 GiB free.  Training itself would fit: weights 15.3 + gradients 15.3 + moments 30.5 = 61 GiB
(yesterday's run peaked just under that).  Memory rose only during this setup; nothing is cached.

What an expert says: two full copies of the embedding state are on the card at once, the old one only
as a source to copy from.  torch.load(..., map_location="cpu") and grow the tables / moments on the CPU,
moving only the final tensors (or free each old tensor right after it is copied: peak ~61 GiB).  Longer
term: prune users inactive for months / hash the user ids, since the table grows every day.  Wrong
advice: a smaller batch, gradient checkpointing, mixed precision, flash-attention (no step has run: the
failure is in setup), expandable_segments / empty_cache (a 14.3 GiB request against 4.7 GiB free, no
cache), another process (there is none).
"""
import os
import shutil
import tempfile

import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402

DIM = 64
N_USERS_YESTERDAY = 58_000_000
N_USERS_TODAY = 60_000_000
N_ITEMS = 4_000_000


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.num, self.dim = num, dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32, device="cuda"))


class Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(i * o, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(o, dtype=torch.float32, device="cuda"))


class Tower(nn.Module):
    def __init__(self, n_ids, id_name):
        super().__init__()
        setattr(self, id_name, Embedding(n_ids, DIM))
        self.fc1 = Linear(DIM + 256, 1024)
        self.fc2 = Linear(1024, 1024)
        self.fc3 = Linear(1024, DIM)


class TwoTower(nn.Module):
    def __init__(self, num_users, num_items):
        super().__init__()
        self.user_tower = Tower(num_users, "user_id_emb")
        self.item_tower = Tower(num_items, "item_id_emb")


class _Stored(object):
    """A tensor as yesterday's job wrote it into its checkpoint (size only)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def _yesterdays_checkpoint(directory):
    """Stands for ckpt/<yesterday>.pt as last night's run wrote it with torch.save from the GPU: the model's
    state dict and AdamW's state (exp_avg, exp_avg_sq per parameter), flattened by name."""
    sizes = {}
    for name, n in (("user_tower.user_id_emb.weight", N_USERS_YESTERDAY * DIM * 4),
                    ("item_tower.item_id_emb.weight", N_ITEMS * DIM * 4)):
        sizes[name] = n
    for tower in ("user_tower", "item_tower"):
        for fc, (i, o) in (("fc1", (DIM + 256, 1024)), ("fc2", (1024, 1024)), ("fc3", (1024, DIM))):
            sizes["%s.%s.weight" % (tower, fc)] = i * o * 4
            sizes["%s.%s.bias" % (tower, fc)] = o * 4
    order = ["user_tower.user_id_emb.weight", "user_tower.fc1.weight", "user_tower.fc1.bias",
             "user_tower.fc2.weight", "user_tower.fc2.bias", "user_tower.fc3.weight", "user_tower.fc3.bias",
             "item_tower.item_id_emb.weight", "item_tower.fc1.weight", "item_tower.fc1.bias",
             "item_tower.fc2.weight", "item_tower.fc2.bias", "item_tower.fc3.weight", "item_tower.fc3.bias"]
    flat = {}
    for name in order:
        flat["model/" + name] = _Stored(sizes[name])
    for i, name in enumerate(order):
        flat["optimizer/state/%d/exp_avg" % i] = _Stored(sizes[name])
        flat["optimizer/state/%d/exp_avg_sq" % i] = _Stored(sizes[name])
    path = os.path.join(directory, "2024-06-11.pt")
    torch.save(flat, path)
    return path


def load_warm_start(path):
    flat = torch.load(path)                       # no map_location: restored where it was saved, cuda:0
    ckpt = {"model": {}, "optimizer": {"state": {}}}
    for key, t in flat.items():
        if key.startswith("model/"):
            ckpt["model"][key[len("model/"):]] = t
        else:
            _, _, idx, what = key.split("/")
            ckpt["optimizer"]["state"].setdefault(int(idx), {"step": 41_210})[what] = t
    return ckpt


def grow_rows(old, n_rows_now):
    """torch.cat([old, torch.zeros(new_rows, DIM, device="cuda")]) for a table that gained rows."""
    pad = torch.empty((n_rows_now * DIM * 4) - old.nbytes, device="cuda")
    return torch.empty(n_rows_now * DIM * 4, device="cuda")       # torch.cat([old, pad])


def warm_start(ckpt_path):
    ckpt = load_warm_start(ckpt_path)
    model = TwoTower(num_users=N_USERS_TODAY, num_items=N_ITEMS)
    # weights: copied in place into today's (bigger) tables -- no new memory
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i, p in enumerate(model.parameters()):
        st = ckpt["optimizer"]["state"][i]
        if p.nbytes != st["exp_avg"].nbytes:                          # the grown user table
            n_rows = p.nbytes // (DIM * 4)
            st = {"step": st["step"],
                  "exp_avg": grow_rows(st["exp_avg"], n_rows),
                  "exp_avg_sq": grow_rows(st["exp_avg_sq"], n_rows)}
        opt.state[p] = st
    del ckpt
    return model, opt


def main():
    ckpt_dir = tempfile.mkdtemp(prefix="ckpt-")
    try:
        path = _yesterdays_checkpoint(ckpt_dir)
        model, opt = warm_start(path)
        print("warm start done; training on today's logs")
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
