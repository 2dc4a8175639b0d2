"""score_candidates.py -- nightly offline scoring of a DCN-v2 ranking model for a retail app on one
L4 (24 GB), PyTorch 2.4.  Each job shard is
4096 users x 500 candidates; a user's last 200 events come from the feature store as a 64-dim
sequence, and the scorer memoises them on the GPU because "the same shards come back for the
re-ranking pass":

    class RankingScorer:
        def __init__(self, model, feature_store):
            self.history_cache = {}                 # shard id -> GPU tensor, never evicted
        def history(self, shard):
            if shard not in self.history_cache:
                self.history_cache[shard] = self.fs.get_history(shard).to("cuda", non_blocking=True)
            return self.history_cache[shard]
        @torch.inference_mode()
        def score(self, shard, candidates):
            return self.model(self.history(shard), candidates)

The model is 4.9 GiB (fp32 embedding tables for 20M items), each shard's history 200 MiB, and the
night's shards never repeat before the re-ranking pass.  The dict grows by 200 MiB a shard and the
scorer dies at shard ~90 on the scoring pass's 94 MiB cross features; the pass needs ~300 MiB.

An expert: bound the cache (an LRU of a few shards, or keep it in pinned host memory and move
one shard at a time), i.e. stop keeping every shard's tensor alive.  Not a smaller batch, not
quantizing the model, not empty_cache or expandable segments (the memory is live, not cached),
not inference_mode (already on).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

USERS_PER_SHARD = 4096
CANDIDATES = 500


class DCNv2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(10):
            setattr(self, "table%d" % i, torch.nn.Parameter(torch.empty(480 * MiB, device="cuda")))
        self.cross = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.deep = torch.nn.Parameter(torch.empty(160 * MiB, device="cuda"))

    def forward(self, history, candidates):
        seq = torch.empty(USERS_PER_SHARD * 200 * 64 * 4, device="cuda")     # target attention over history
        crossed = torch.empty(USERS_PER_SHARD * CANDIDATES * 12 * 4, device="cuda")
        del seq
        scores = torch.empty(USERS_PER_SHARD * CANDIDATES * 4, device="cuda")
        del crossed
        return scores


class FeatureStore(object):
    """The online store's client (host side): returns a CPU tensor per shard."""

    def get_history(self, shard):
        return _HostHistory(USERS_PER_SHARD * 200 * 64 * 4)


class _HostHistory(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes

    def to(self, device, non_blocking=False):
        return torch.empty(self.nbytes, device=device)


class RankingScorer(object):
    def __init__(self, model, feature_store):
        self.model = model.eval()
        self.fs = feature_store
        self.history_cache = {}

    def history(self, shard):
        if shard not in self.history_cache:
            self.history_cache[shard] = self.fs.get_history(shard).to("cuda", non_blocking=True)
        return self.history_cache[shard]

    def score(self, shard, candidates):
        with torch.inference_mode():
            return self.model(self.history(shard), candidates)


def main():
    scorer = RankingScorer(DCNv2(), FeatureStore())
    out = []
    for shard in range(2400):
        candidates = torch.empty(USERS_PER_SHARD * CANDIDATES * 4, device="cuda")
        scores = scorer.score(shard, candidates)
        out.append(shard)                  # written to the warehouse (host) by the real job
        del scores, candidates


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
