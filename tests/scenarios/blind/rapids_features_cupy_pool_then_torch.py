"""train_two_tower.py -- one process builds features with RAPIDS (cuDF joins and group-bys on 40M
interactions; cuDF and CuPy draw from CuPy's default memory pool) and then trains a PyTorch two-tower
retrieval model on them, on one 24 GiB card:

    import cudf, cupy
    inter = cudf.read_parquet("interactions/")                       # 40M rows
    feats = build_features(inter)                                     # joins, group-bys, one-hots
    X = cupy.ascontiguousarray(feats[cols].to_cupy(dtype="float32"))  # 1.5 GiB, kept
    del inter, feats                                                  # back to CuPy's pool, not the driver
    model = TwoTower(n_users=6_000_000, n_items=1_500_000, dim=64).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for idx in batches:
        loss = model(torch.from_dlpack(X[idx]), ...); loss.backward(); optimizer.step()

The feature engineering's intermediates (15 GiB) are freed into CuPy's pool, which keeps them
cached for CuPy's next allocation and never returns them to the driver by itself; PyTorch sees 15
GiB less than the card has free and the two-tower model fails at its first optimizer.step().
PyTorch alone needs ~8 GiB.  An expert: after the feature step, give CuPy's cached blocks back
(cupy.get_default_memory_pool().free_all_blocks()), or cap CuPy's pool (set_limit), or route CuPy
through PyTorch's allocator; torch.cuda.empty_cache() would free nothing (PyTorch caches nothing).
"""
import sys
import cupy
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


# optimizer.step() makes exp_avg and exp_avg_sq of a parameter in one expression: when the second
# fails, the first is dropped as the exception unwinds, before the truth mark in the except block.
# While a step runs, torch.empty (AdamW's) also keeps what it made in _made, so the mark sees the
# memory as it was at the failure.  Compiled as part of torch's own file (as scen_truth does): the
# dump's failing Python line stays the program's.
_KEEP = """
def kept(nbytes, *args, **kw):
    t = noted(nbytes, *args, **kw)
    made.append(t)
    return t
"""
_made = []
_ns = {"noted": torch.empty, "made": _made}
exec(compile(_KEEP, torch.__file__, "exec"), _ns)
_noted, _kept = torch.empty, _ns["kept"]


def build_features(n_rows):
    """cuDF's joins and group-bys: large temporaries from CuPy's pool, freed as they go out of scope."""
    temps = []
    for i in range(24):
        temps.append(cupy.empty(160 * MiB, dtype=cupy.float32))          # 640 MiB each
    feats = cupy.empty(384 * MiB, dtype=cupy.float32)                     # 1.5 GiB feature matrix
    del temps
    return feats


class TwoTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.user_emb = torch.nn.Parameter(torch.empty(1464 * MiB, device="cuda"))     # 6M x 64 fp32
        self.item_emb = torch.nn.Parameter(torch.empty(366 * MiB, device="cuda"))      # 1.5M x 64 fp32
        self.user_mlp = torch.nn.Parameter(torch.empty(24 * MiB, device="cuda"))
        self.item_mlp = torch.nn.Parameter(torch.empty(24 * MiB, device="cuda"))

    def forward(self, x):
        h = torch.empty(256 * MiB, device="cuda")        # towers' activations, in-batch negatives logits
        h._saved = x
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    X = build_features(40000000)
    model = TwoTower().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(100000):
        xb = torch.empty(8192 * 1024, device="cuda")     # torch.from_dlpack(X[idx]) gathered
        loss = model(xb)
        scen_truth.backward(loss)
        torch.empty = _kept
        optimizer.step()
        torch.empty = _noted
        del _made[:]
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        del loss, xb


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
