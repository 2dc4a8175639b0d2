"""A DIN (Deep Interest Network) ranking service for an e-commerce app's category pages, one L4 (24 GB,
22.5 GiB usable), fp16 weights, torch.inference_mode.  It ran for weeks; on the evening of a flash sale it
starts answering 500s with torch.cuda.OutOfMemoryError, while nvidia-smi shows the card "full" and
torch.cuda.memory_allocated() is well below it.

The real code (FastAPI + cachetools):

    model = DINRanker.from_checkpoint(CKPT).half().cuda().eval()
    candidate_cache = LRUCache(maxsize=settings.CANDIDATE_CACHE_SIZE)      # 220 categories, by count

    @app.post("/rank/category")
    @torch.inference_mode()
    def rank_category(req):
        cands = catalog.candidates(req.category)
        if req.category in FLASH_SALE_PAGES:                  # candidates change every minute: not cached
            feats = model.item_tower(cands)
        else:
            feats = candidate_cache.get(req.category)
            if feats is None:
                feats = model.item_tower(cands)                # [C, 4096] fp16, 8 KB per candidate
                candidate_cache[req.category] = feats          # stays on the GPU
        return model(feats, user_history(req.user_id)[-100:]).topk(50)

DIN's activation unit scores every (candidate, behavior) pair: its input cat([q, k, q-k, q*k]) is
C x 100 x 256 fp16 = C x 51 KB, then an 80-wide and a 40-wide layer.  Sizes: weights 1.6 GiB (item, shop
and behavior embedding tables in fp16); cache entries from 1.6 MB (200-item category) to 490 MB (60k
items), 220 of them: ~10 GiB once full (bounded by count, not bytes); a typical page (3.6k candidates)
makes a 186 MB attention input.  From request 6,000 on, a fifth of the traffic goes to the flash sale's
"all deals" pages: 100k-103k candidates, not cached: 0.77 GiB of features, a 4.8 GiB attention input and
a 1.5 GiB hidden layer.  Thousands of those went through.

At request ~24,000 one fails asking for the 80-wide layer's 1,541 MiB: 17.3 GiB allocated (weights 1.6,
cache 10.0, this page's features 0.77 and attention input 4.8 GiB), 4.17 GiB reserved by PyTorch but
unallocated and 0.56 GiB free on the device -- 4.7 GiB not in use for a 1.5 GiB request.  The allocator
already gave back every segment that was entirely free in its retry: the 26 segments left all hold at
least one long-lived cache entry, placed by best fit into the tail of a segment an earlier page's
attention tensors had used; the 4.17 GiB are 68 holes, the largest 782 MiB.

What an expert says: fragmentation -- long-lived, variously sized cache entries pin the segments that
big, variable transient tensors need.  Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and score
big pages in fixed-size candidate chunks (e.g. 8,192) so the transients stay small and uniform; bound the
cache by bytes, or keep it in one preallocated slab / in pinned host memory.  Wrong advice: a bigger
card (the same pattern fills it later), empty_cache (nothing entirely free is left to return),
inference_mode or fp16 (both already in force), quantization, gradient checkpointing (no training),
looking for other processes (there are none).
"""
import collections
import random

import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402

EMB = 64                        # item/category embedding width of the ranker
ITEM_FEAT = 4096                # item-side features per candidate, fp16: 8 KB a candidate
ATT_HIST = 100                  # the ranker attends over the latest 100 behaviors
CACHE_CATEGORIES = 220          # settings.CANDIDATE_CACHE_SIZE (entries, not bytes)
FLASH_SALE_AT = 6000            # request index at which the evening flash sale starts
MEGA_PAGE_ITEMS = 100_000       # "all deals" pages: 100k-103k candidates
N_CATEGORIES = 12_000


def _op_output(n_elems, dtype=torch.float16):
    """What one tensor operation writes (the stand-in computes nothing, it allocates)."""
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float16, device="cuda"), requires_grad=False)

    def forward(self, n):
        return _op_output(n * self.dim)


class Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(i * o, dtype=torch.float16, device="cuda"), requires_grad=False)


class ItemTower(nn.Module):
    """Item-side features of a candidate set: id/shop/category embeddings + static features -> 1024."""

    def __init__(self):
        super().__init__()
        self.item_emb = Embedding(6_000_000, EMB)
        self.shop_emb = Embedding(1_500_000, EMB)
        self.proj = Linear(3 * EMB + 256, ITEM_FEAT)

    def forward(self, n_items):
        x = _op_output(n_items * (3 * EMB + 256))
        return _op_output(n_items * ITEM_FEAT)


class TargetAttention(nn.Module):
    """DIN's activation unit: for every (candidate, behavior) pair, MLP([q, k, q-k, q*k])."""

    def __init__(self):
        super().__init__()
        self.q_proj = Linear(ITEM_FEAT, EMB)
        self.fc1 = Linear(4 * EMB, 80)
        self.fc2 = Linear(80, 40)
        self.fc3 = Linear(40, 1)

    def forward(self, item_feats, keys, n_cand, n_hist):
        q = _op_output(n_cand * EMB)                              # q_proj(item_feats)
        att_in = _op_output(n_cand * n_hist * 4 * EMB)            # cat([q, k, q - k, q * k], -1), broadcast
        h1 = _op_output(n_cand * n_hist * 80)
        del att_in
        h2 = _op_output(n_cand * n_hist * 40)
        del h1
        scores = _op_output(n_cand * n_hist)
        del h2
        return _op_output(n_cand * EMB)                           # softmax(scores) @ keys


class DINRanker(nn.Module):
    def __init__(self):
        super().__init__()
        self.item_tower = ItemTower()
        self.behavior_emb = Embedding(6_000_000, EMB)
        self.attention = TargetAttention()
        self.mlp1 = Linear(ITEM_FEAT + 2 * EMB, 512)
        self.mlp2 = Linear(512, 128)
        self.out = Linear(128, 1)

    def forward(self, item_feats, n_cand, hist_len):
        n_hist = min(hist_len, ATT_HIST)
        keys = self.behavior_emb(n_hist)
        interest = self.attention(item_feats, keys, n_cand, n_hist)
        x = _op_output(n_cand * (ITEM_FEAT + 2 * EMB))            # cat([item_feats, interest, user], -1)
        h = _op_output(n_cand * 512)
        return _op_output(n_cand, torch.float32)


class CandidateFeatureCache(object):
    """LRU of the item-side features of each category's candidate set, kept on the GPU so that a
    category page does not rerun the item tower."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.entries = collections.OrderedDict()

    def get(self, key):
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
        return e

    def put(self, key, feats):
        self.entries[key] = feats
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)


class RankingService(object):
    def __init__(self, category_sizes):
        self.model = DINRanker().eval()
        self.category_sizes = category_sizes
        self.candidate_cache = CandidateFeatureCache(CACHE_CATEGORIES)

    def rank_category_page(self, user_hist_len, category):
        n_cand = self.category_sizes[category]
        with torch.inference_mode():
            if category >= N_CATEGORIES:                     # flash-sale pages: candidates change every minute
                feats = self.model.item_tower(n_cand)
            else:
                feats = self.candidate_cache.get(category)
                if feats is None:
                    feats = self.model.item_tower(n_cand)
                    self.candidate_cache.put(category, feats)
            return self.model(feats, n_cand, user_hist_len)


def category_catalog(seed=11):
    rng = random.Random(seed)
    return [max(200, min(60_000, int(rng.lognormvariate(8.2, 1.0)))) for _ in range(N_CATEGORIES)] + \
        [MEGA_PAGE_ITEMS + 1000 * k for k in range(4)]


def replay_traffic(seed=6):
    """The day's category-page requests: category popularity is Zipf-like; from FLASH_SALE_AT on, the
    evening flash sale sends a share of the traffic to the "all deals" mega-pages."""
    rng = random.Random(seed)
    i = 0
    while True:
        category = int(rng.paretovariate(0.8) * 3) % N_CATEGORIES
        hist_len = int(rng.lognormvariate(5.5, 1.0))
        if i >= FLASH_SALE_AT and rng.random() < 0.2:
            category = N_CATEGORIES + rng.randrange(4)
        i += 1
        yield hist_len, category


def serve():
    sizes = category_catalog()
    service = RankingService(sizes)
    for hist_len, category in replay_traffic():
        service.rank_category_page(hist_len, category)


if __name__ == "__main__":
    try:
        serve()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
