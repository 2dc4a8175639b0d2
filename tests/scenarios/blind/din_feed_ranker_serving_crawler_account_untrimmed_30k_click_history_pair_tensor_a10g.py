"""feed_ranker.py -- the ranking service of a content feed: a DIN-style model scores the 500 candidates of one
user per request, on one NVIDIA A10G (24 GB) per replica.  The model was trained with each user's click history
truncated to the last 200 events (max_len=200, done in the Spark job that builds training examples).  Online,
the history comes from the feature service, which reads the user's Redis list of recent clicks -- and the list is
trimmed only by the nightly compaction job, which skips accounts flagged as "internal".  A QA crawler account,
flagged internal, has clicked through 30,000 items since its list was last trimmed.

    item_emb = tables["item_id"](candidate_ids)                       # 500 x 64
    hist_emb = tables["item_id"](history_ids)                         # L x 64 -- L as the feature service gives it
    q = item_emb.unsqueeze(1).expand(-1, L, -1); k = hist_emb.expand(500, -1, -1)
    att_in = torch.cat([q, k, q - k, q * k], dim=-1)                  # 500 x L x 256 float32
    weights = attention_mlp(att_in)                                   # 256 -> 80 -> 40 -> 1

Embedding tables: user_id 30M x 64 (7.2 GiB), item_id 20M x 64 (4.8 GiB), author_id 5M x 64 (1.2 GiB), the rest
0.1 GiB: 13.3 GiB resident, ~8.7 GiB free beside the CUDA context.  A request with L=200 builds a 100 MiB pair
tensor; the crawler's request (L=30,000) builds q-k and q*k (3.6 GiB each), then asks for the 14.3 GiB
concatenation, under torch.inference_mode().  Hundreds of ordinary requests ran before it; nothing leaks and
nothing is fragmented: one request's input is 150 times longer than the model was built for.

What an expert says first: cap the behaviour sequence at serving time to what the model was trained on (keep the
last 200 events; trim the Redis list), so one account cannot make a request 150x the usual size.  Wrong
advice: empty_cache / expandable segments, inference_mode (on), mixed precision or gradient checkpointing (this
is serving), flash-attention (this is DIN's pairwise activation unit, no softmax attention matrix), quantizing
the tables, a bigger GPU (the crawler's list keeps growing), stopping other processes (there are none).
Splitting the candidates of one request into chunks would get this request through but leaves the model
scoring 30,000-event histories it never saw in training.
"""
import random
import sys
import time

import torch

import scen_truth

scen_truth.note_every_empty(torch)

EMB = 64
CANDIDATES = 500
TABLES = [("user_id", 30000000), ("item_id", 20000000), ("author_id", 5000000), ("topic", 200000),
          ("country", 250), ("device_type", 20), ("hour_of_week", 168), ("language", 200)]


class Embedding(torch.nn.Module):
    def __init__(self, rows):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(rows * EMB * 4, device="cuda"), requires_grad=False)

    def forward(self, n):
        return torch.empty(n * EMB * 4, device="cuda")


class TargetAttention(torch.nn.Module):
    """DIN's activation unit over (candidate, history item) pairs."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.mlp = torch.nn.Parameter(torch.empty((4 * EMB * 80 + 80 * 40 + 40) * 4, device="cuda"),
                                      requires_grad=False)

    def forward(self, item_emb, hist_emb, n_cand, hist_len):
        diff = torch.empty(n_cand * hist_len * EMB * 4, device="cuda")            # q - k
        prod = torch.empty(n_cand * hist_len * EMB * 4, device="cuda")            # q * k
        att_in = torch.empty(n_cand * hist_len * 4 * EMB * 4, device="cuda")      # cat([q, k, q-k, q*k], -1)
        del diff, prod
        hidden = torch.empty(n_cand * hist_len * 80 * 4, device="cuda")
        del att_in
        weights = torch.empty(n_cand * hist_len * 4, device="cuda")
        return torch.empty(n_cand * EMB * 4, device="cuda")


class DinFeedRanker(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.tables = torch.nn.Module()                   # nn.ModuleDict
        for name, rows in TABLES:
            setattr(self.tables, name, Embedding(rows))
        self.attention = TargetAttention()
        self.mlp = torch.nn.Parameter(torch.empty((12 * EMB * 512 + 512 * 256 + 256) * 4, device="cuda"),
                                      requires_grad=False)

    def forward(self, n_cand, history_ids):
        hist_len = len(history_ids)
        item_emb = self.tables.item_id(n_cand)
        author_emb = self.tables.author_id(n_cand)
        user_emb = self.tables.user_id(1)
        hist_emb = self.tables.item_id(hist_len)
        interest = self.attention(item_emb, hist_emb, n_cand, hist_len)
        x = torch.empty(n_cand * 12 * EMB * 4, device="cuda")
        return torch.empty(n_cand * 4, device="cuda")


def fetch_history(user):
    """The feature service: the user's Redis list of recent clicks, as stored (no max_len applied here)."""
    if user == "qa-crawler-07":
        return list(range(30000))
    return list(range(random.Random(user).randint(20, 200)))


model = DinFeedRanker().eval()
users = ["u%07d" % i for i in range(400)]
users.insert(357, "qa-crawler-07")
try:
    with torch.inference_mode():
        for user in users:
            history = fetch_history(user)
            scores = model(CANDIDATES, history)
            del scores
            time.sleep(0.0005)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
