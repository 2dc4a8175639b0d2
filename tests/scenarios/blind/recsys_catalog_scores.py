"""score_catalog.py -- nightly candidate generation for a two-tower recommender: every active user
is scored against the whole item catalog (2M items) and the top 500 kept, on a 24 GiB card:

    model = TwoTower.from_checkpoint(ckpt).half().cuda().eval()           # 1 GiB
    with torch.inference_mode():
        item_emb = torch.cat([model.item_tower(b) for b in item_loader])   # 2M x 256 fp16: 1 GiB
        for users in user_loader:                                         # 8192 users per batch
            u = model.user_tower(users)                                   # 8192 x 256
            scores = u @ item_emb.T                                       # 8192 x 2M fp16: 30.5 GiB
            top = scores.topk(500, dim=1)

The item tower runs flat over the catalog in chunks; the first user batch's score matrix alone
(8192 x 2,000,000 x 2 bytes) is larger than the card.  Nothing grows, nothing is cached that
matters, autograd is off, no sequence is involved.  An expert: score the catalog in chunks of
items (or users) and merge the per-chunk top-k (or use a FAISS/ANN index); not shorter sequences,
not checkpointing, not quantization.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N_ITEMS = 2000000
DIM = 256
USER_BATCH = 8192


class Tower(torch.nn.Module):
    def __init__(self, n_layers):
        torch.nn.Module.__init__(self)
        for i in range(n_layers):
            setattr(self, "mlp%d" % i, torch.nn.Parameter(torch.empty(64 * MiB, device="cuda")))
        self.n_layers = n_layers

    def forward(self, feats, rows):
        h = feats
        for _ in range(self.n_layers):
            h = torch.empty(rows * 1024 * 2, device="cuda")      # hidden 1024 fp16
        return torch.empty(rows * DIM * 2, device="cuda")        # the embedding, fp16


class TwoTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.user_tower = Tower(8)                                # 512 MiB
        self.item_tower = Tower(8)                                # 512 MiB
        self.id_embed = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))


def main():
    model = TwoTower().eval()
    with torch.inference_mode():
        chunks = []
        for start in range(0, N_ITEMS, 65536):
            rows = min(65536, N_ITEMS - start)
            feats = torch.empty(rows * 64 * 2, device="cuda")
            chunks.append(model.item_tower(feats, rows))
            del feats
        item_emb = torch.empty(N_ITEMS * DIM * 2, device="cuda")  # torch.cat(chunks)
        del chunks
        for batch in range(100):
            users = torch.empty(USER_BATCH * 64 * 2, device="cuda")
            u = model.user_tower(users, USER_BATCH)
            scores = torch.empty(USER_BATCH * N_ITEMS * 2, device="cuda")    # u @ item_emb.T
            top = torch.empty(USER_BATCH * 500 * 8, device="cuda")          # scores.topk(500)
            del scores, u, users


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
