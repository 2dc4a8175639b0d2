"""ranker_server.py -- the ranking stage of an ads system: a DIN-style model (26 sparse features, a target-
attention pooling over the user's last 100 clicked items, a DCNv2 cross network and an MLP) served by one Python
process per node on a g4dn.12xlarge (4x Tesla T4, 15 GiB each), model-parallel over the four GPUs because the
embedding tables (13.9 GiB fp32) are too big for one T4.  The placement is the team's own code:

    per_gpu = math.ceil(len(FEATURES) / torch.cuda.device_count())          # 26 tables / 4 GPUs -> 7
    for i, (name, rows, dim) in enumerate(FEATURES):
        device = f"cuda:{i // per_gpu}"
        tables[name] = EmbeddingBag(rows, dim).to(device)
    dense.to("cuda:0")                                                       # attention unit, cross net, MLP

It splits the tables by count, not by bytes, and FEATURES lists the big id features first, so cuda:0 gets
user_id (10M rows), item_id (8M), advertiser_id, campaign_id, creative_id, query_hash and page_url_hash:
13.1 GiB of its 15 GiB, plus the dense part (0.15 GiB) and the CUDA context.  cuda:1 holds 0.8 GiB of mid-sized
tables; cuda:2 and cuda:3 hold a few MiB each.  Requests are batched dynamically (up to 16 page views x 512
candidate ads); every batch's pooled embeddings are gathered to cuda:0, where the attention unit builds
[query, key, query-key, query*key] for every (candidate, clicked item) pair: 8192 x 100 x 512 float32 = 1.56 GiB
for a full batch.  Quiet-hour batches (1-4 page views) fitted in the 1.2 GiB left on cuda:0; the first full
batch of the evening peak fails there, with three GPUs of the same process nearly empty.

What an expert says first: the placement is lopsided -- cuda:0 is full of tables while cuda:1-3 are almost
empty; place the tables by size (greedy bin packing over bytes, or a sharding planner), which leaves every T4
~3.5 GiB of tables and ample room for the peak batch.  Wrong advice first: a bigger GPU, empty_cache or
expandable segments (nothing is cached or fragmented), inference_mode (already on), gradient checkpointing or
mixed-precision training (this is serving), stopping other processes (there are none).  A smaller maximum
batch or int8 tables would also get under the limit, but they treat the symptom of the placement.
"""
import math
import sys
import time

import torch

import scen_truth

scen_truth.note_every_empty(torch)

FEATURES = [                                       # (name, rows, dim), in the feature config's order
    ("user_id", 10000000, 128), ("item_id", 8000000, 128), ("advertiser_id", 2500000, 128),
    ("campaign_id", 2200000, 128), ("creative_id", 2000000, 128), ("query_hash", 1600000, 128),
    ("page_url_hash", 1200000, 128),
    ("publisher_id", 1500000, 64), ("app_bundle", 900000, 64), ("brand", 400000, 64), ("placement_id", 300000, 64),
    ("ad_category", 50000, 64), ("geo_city", 80000, 32), ("device_model", 60000, 32),
    ("os_version", 2000, 16), ("carrier", 3000, 16), ("language", 300, 16), ("site_category", 2000, 32),
    ("item_category_l1", 200, 32), ("item_category_l2", 3000, 32), ("item_category_l3", 40000, 32),
    ("user_age_bucket", 10, 16), ("gender", 4, 16), ("user_segment", 20000, 32), ("hour_of_week", 168, 16),
    ("ad_format", 12, 16),
]
HISTORY_LEN = 100
ITEM_DIM = 128
CANDIDATES_PER_REQUEST = 512


class EmbeddingBag(torch.nn.Module):
    def __init__(self, rows, dim, device):
        torch.nn.Module.__init__(self)
        self.rows, self.dim = rows, dim
        self.weight = torch.nn.Parameter(torch.empty(rows * dim * 4, device=device), requires_grad=False)

    def forward(self, n):
        """The pooled lookups of n rows, on this table's GPU."""
        return torch.empty(n * self.dim * 4, device=self.weight.device)


class LocalActivationUnit(torch.nn.Module):
    """DIN's activation unit (DeepCTR's naming): an MLP over [q, k, q-k, q*k] for every (candidate, history item)
    pair, then a weighted sum of the history."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.fc1 = torch.nn.Parameter(torch.empty(4 * ITEM_DIM * 80 * 4, device="cuda:0"), requires_grad=False)
        self.fc2 = torch.nn.Parameter(torch.empty(80 * 40 * 4, device="cuda:0"), requires_grad=False)

    def forward(self, queries, history, n):
        pair_input = torch.empty(n * HISTORY_LEN * 4 * ITEM_DIM * 4, device="cuda:0")   # cat([q, k, q-k, q*k])
        hidden = torch.empty(n * HISTORY_LEN * 80 * 4, device="cuda:0")
        scores = torch.empty(n * HISTORY_LEN * 4, device="cuda:0")
        return torch.empty(n * ITEM_DIM * 4, device="cuda:0")


class AttentionSequencePoolingLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.local_att = LocalActivationUnit()

    def forward(self, queries, history, n):
        return self.local_att(queries, history, n)


class DinRanker(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Module()                       # nn.ModuleDict of EmbeddingBags
        per_gpu = math.ceil(len(FEATURES) / torch.cuda.device_count())
        for i, (name, rows, dim) in enumerate(FEATURES):
            setattr(self.embeddings, name, EmbeddingBag(rows, dim, "cuda:%d" % (i // per_gpu)))
        self.attention = AttentionSequencePoolingLayer()
        in_dim = sum(d for _, _, d in FEATURES) + ITEM_DIM
        self.cross = torch.nn.Parameter(torch.empty(3 * in_dim * in_dim * 4, device="cuda:0"), requires_grad=False)
        self.mlp = torch.nn.Parameter(torch.empty((in_dim * 1024 + 1024 * 512 + 512 * 256) * 4, device="cuda:0"),
                                      requires_grad=False)

    def forward(self, n_rows, n_users):
        pooled = []
        for name, rows, dim in FEATURES:
            table = getattr(self.embeddings, name)
            out = table(n_rows)
            if out.device != 0:
                out = torch.empty(out.nbytes, device="cuda:0")          # .to("cuda:0")
            pooled.append(out)
        history = torch.empty(n_users * HISTORY_LEN * ITEM_DIM * 4, device="cuda:0")   # item_id lookups
        interest = self.attention(pooled[1], history, n_rows)
        x = torch.empty(n_rows * (sum(d for _, _, d in FEATURES) + ITEM_DIM) * 4, device="cuda:0")
        cross = torch.empty(3 * x.nbytes, device="cuda:0")
        return torch.empty(n_rows * 4, device="cuda:0")


def serve(model, batches):
    for page_views in batches:
        n = page_views * CANDIDATES_PER_REQUEST
        with torch.inference_mode():
            ctr = model(n, page_views)
        del ctr
        time.sleep(0.001)


model = DinRanker()
model.eval()
quiet_hours = [1, 2, 1, 3, 2, 4, 1, 2, 3, 2, 1, 4, 2, 3, 1, 2] * 8          # page views per dynamic batch
evening_peak = [16, 16, 16]
try:
    serve(model, quiet_hours + evening_peak)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(device=0)
    raise
sys.exit(0)
