"""train_retrieval.py -- a two-tower retrieval model for a marketplace's "you may also like" (user tower:
history encoder; item tower: a 6-layer transformer over title tokens + categorical features, 58M
parameters), trained with sampled-softmax over in-batch negatives plus a cross-batch memory (XBM) of
recent item embeddings used for hard-negative mining.  One A40 (48 GB) of the team's node, bf16 autocast.

    bank = collections.deque(maxlen=64)                       # XBM: the last 64 refreshes x 8,192 items
    for step, (users, pos_items) in enumerate(loader):        # batch 2,048
        if step % 2 == 0:                                     # refresh the bank with random catalog items
            rand_items = catalog.sample(8192).cuda()
            bank.append(item_tower(rand_items))               # <- forward WITH autograd, never detached
        with torch.no_grad():
            hard = mine_hard_negatives(user_emb, bank)    # top-1 per user, entry by entry
        loss = sampled_softmax(user_tower(users), item_tower(pos_items), item_tower(hard))
        loss.backward(); opt.step(); opt.zero_grad()

User's words: "memory climbs every refresh, but the bank is bounded -- 64 x 8,192 x 256 floats is
0.5 GB -- and the training step itself is flat.  It dies around step 130, in a backward."

What fills the card: each bank entry is the output of an item-tower forward run with autograd on and
never used in a loss, so no backward ever frees its graph: every entry keeps the item tower's saved
activations for 8,192 items (~680 MiB), not just its 8 MiB of embeddings.  The deque's bound (64) is
beyond what fits (64 x 680 MiB = 42.5 GiB), so memory grows by one graph per refresh until, around step
130 (62 entries), the step's own backward no longer finds room for its gradients.  The training step is flat (~3 GiB).

An expert, first: the bank must hold plain embeddings -- compute the refresh under torch.no_grad() (or
store item_tower(...).detach()); memory then stays flat at ~4 GiB.  Wrong advice: a smaller batch or
gradient checkpointing (the step is not what grows), empty_cache or expandable_segments (the memory is
live), a bigger GPU (the growth would only fail later), shrinking the deque's maxlen (a workaround that
keeps 680 MiB per entry and loses the hard negatives).
"""
import collections
import sys

import torch

import scen_truth

MiB = 1 << 20
BATCH_SIZE, BANK_ITEMS, DIM = 2048, 8192, 256


class ItemTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.token_embed = torch.nn.Parameter(torch.empty(30000 * 512 * 4, device="cuda"))
        self.layers = torch.nn.Parameter(torch.empty(6 * 3 * MiB * 4, device="cuda"))
        self.proj = torch.nn.Parameter(torch.empty(512 * DIM * 4, device="cuda"))

    def forward(self, items):
        n = items.nbytes // 256                                 # items in this call
        acts = []
        for _ in range(6):                                      # per layer: attention + FFN inputs (bf16)
            a = torch.empty(n * 14 * 1024, device="cuda")      # 112 MiB for 8,192 items
            a._saved = acts[-1] if acts else items
            acts.append(a)
        emb = torch.empty(n * DIM * 4, device="cuda")
        emb._saved = acts[-1]
        return emb


class UserTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.history = torch.nn.Parameter(torch.empty(96 * MiB, device="cuda"))
        self.encoder = torch.nn.Parameter(torch.empty(96 * MiB, device="cuda"))

    def forward(self, users):
        h = users
        for _ in range(4):                                      # 4 blocks over 50 history items (bf16)
            a = torch.empty(BATCH_SIZE * 50 * 512 * 2, device="cuda")
            a._saved = h
            h = a
        out = torch.empty(BATCH_SIZE * DIM * 4, device="cuda")
        out._saved = h
        return out


def mine_hard_negatives(user_emb, bank):
    """the hardest bank item per user, scored one bank entry (8,192 items) at a time"""
    idx = torch.empty(BATCH_SIZE * 8, device="cuda")
    for emb in bank:
        scores = torch.empty(BATCH_SIZE * BANK_ITEMS * 2, device="cuda")      # bf16, 32 MiB
        del scores
    return idx


def main():
    scen_truth.note_every_empty(torch)
    item_tower, user_tower = ItemTower(), UserTower()
    params = item_tower.parameters() + user_tower.parameters()
    opt = torch.optim.AdamW(params, lr=1e-3)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    bank = collections.deque(maxlen=64)
    for step in range(100000):
        users = torch.empty(BATCH_SIZE * 50 * 8, device="cuda")
        pos_items = torch.empty(BATCH_SIZE * 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if step % 2 == 0:
                rand_items = torch.empty(BANK_ITEMS * 256, device="cuda")
                bank.append(item_tower(rand_items))
                del rand_items
            user_emb = user_tower(users)
            with torch.no_grad():
                hard = mine_hard_negatives(user_emb, bank)
            pos_emb = item_tower(pos_items)
            neg_emb = item_tower(torch.empty(BATCH_SIZE * 256, device="cuda"))     # one mined negative per user
            loss = torch.empty(512, device="cuda")
            loss._saved = (user_emb, pos_emb, neg_emb)
            loss._params = tuple(params)
        loss.backward()
        for t in (user_emb, pos_emb, neg_emb):                  # backward frees the step's saved tensors
            c = t
            while c is not None and not isinstance(c, tuple):
                nxt = getattr(c, "_saved", None)
                c._saved = None
                c = nxt
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, user_emb, pos_emb, neg_emb, hard, users, pos_items
        if step % 10 == 0:
            print("step %d  allocated %.1f GiB  bank %d" % (step, torch.cuda.memory_allocated() / 2.0 ** 30, len(bank)))


if __name__ == "__main__":
    main()
    sys.exit(0)
