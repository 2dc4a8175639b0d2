"""scorer_daemon.py -- a card issuer's fraud scorer: one long-running process on an NVIDIA A100-SXM4-40GB
(40,960 MiB) that, every hour,
  1. recomputes the per-card "velocity" features (spend and count over 1 h / 24 h / 7 d / 30 d windows, time
     since the last transaction at this merchant, ...) with CuPy over every transaction of the last 30 days:
     sort by (card, time), segmented prefix sums, 12 float32 outputs per transaction;
  2. scores the live stream with a transaction-sequence transformer (6 layers, d=512, 256 past transactions
     per card; 35M parameters) -- PyTorch;
  3. refits that transformer on the hour's newly confirmed frauds and chargebacks plus sampled negatives
     (2 epochs, batch 512 sequences, eager attention: ~22 GiB of activations at the peak).

    while True:
        feats = velocity_features(txn_store.window(days=30))       # CuPy
        serve_until_next_hour(model, feats)
        del feats
        cp.get_default_memory_pool().free_all_blocks()             # give CuPy's blocks back each hour
        refit(model, optimizer, labels.confirmed_since(last_hour))  # PyTorch

The transaction store was created on the day of the launch, so the 30-day window fills up one day at a time:
6M transactions a day, ~168 bytes each on the GPU while the features are computed.  On day 19, at 06:00, the
feature step failed in CuPy: a 4.91 GiB request (the 12 feature outputs) with 4.88 GiB free, 12.3 GiB of
CuPy arrays live.  PyTorch, in the same process, had 22.4 GiB reserved and 0.4 GiB of it in use: the refit's
activations, freed after every refit and kept in PyTorch's cache ever since the first one, because nothing
ever asks PyTorch to give them back; CuPy cannot use them.

An expert: torch.cuda.empty_cache() at the end of every refit (or run the refit in a child process); with
the cache returned the feature step has ~39 GiB and the full 30-day window (~28 GiB) fits.  A longer-term
alternative: one allocator for both, e.g. RMM with PyTorch's allocator routed to it.  Wrong first: a smaller
refit batch or gradient checkpointing (the refit finished an hour ago; its activations are no longer live,
only cached), mixed precision, expandable_segments (the cache still keeps what it mapped), quantizing the
35M-parameter model, a bigger GPU, a shorter feature window (changes the product, and the memory was there),
stopping other processes (there are none: all of it is this process).
"""
import sys

import cupy as cp
import torch

import scen_truth

GiB = float(1 << 30)
F32 = torch.float32

TXN_PER_DAY = 6_000_000
# bytes per transaction on the GPU while the features are computed
COLS_BYTES = 48          # card id int64, time int64, merchant int64, amount f32, mcc i32, country i32, flags ...
PERM_BYTES = 8           # argsort permutation, int64
OUT_BYTES = 48           # 12 float32 features


def _cp_alloc(nbytes):
    """cp.empty((n,), dtype=cp.uint8) with the request remembered for the truth mark: the size CuPy's pool
    asks cudaMalloc for (rounded up to 512 bytes)."""
    _last_cp["n"] = (int(nbytes) + 511) // 512 * 512
    return cp.empty(int(nbytes), dtype="uint8")


_last_cp = {}


def velocity_features(n_txn):
    """The hour's feature recompute over the whole window (CuPy)."""
    cols = _cp_alloc(n_txn * COLS_BYTES)                 # the window's columns, uploaded from the store
    keys = _cp_alloc(n_txn * 16)                         # (card, time) packed sort key
    perm = _cp_alloc(n_txn * PERM_BYTES)                 # cp.argsort(keys)
    sorted_cols = _cp_alloc(n_txn * COLS_BYTES)          # cols[perm]
    feats = _cp_alloc(n_txn * OUT_BYTES)                 # segmented cumsums per card, 12 outputs
    del cols, keys, perm, sorted_cols
    return feats


class TxnTransformer(torch.nn.Module):
    LAYERS, D, HEADS, FF, SEQ = 6, 512, 8, 2048, 256

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.merchant_emb = torch.nn.Parameter(torch.empty(200_000 * 64 * 4, device="cuda"))   # float32
        self.misc_emb = torch.nn.Parameter(torch.empty(60_000 * 64 * 4, device="cuda"))
        for i in range(self.LAYERS):
            setattr(self, "layer%d" % i, torch.nn.Parameter(
                torch.empty((4 * self.D * self.D + 2 * self.D * self.FF) * 4, device="cuda")))
        self.head = torch.nn.Parameter(torch.empty(self.D * 4, device="cuda"))

    def forward(self, batch):
        b, s, h = batch, self.SEQ, self.HEADS
        x = torch.empty(b * s * self.D * 4, device="cuda")
        for i in range(self.LAYERS):
            getattr(self, "layer%d" % i)
            scores = torch.empty(b * h * s * s * 4, device="cuda")      # eager attention: [b, h, s, s]
            scores._saved = x
            probs = torch.empty(b * h * s * s * 4, device="cuda")       # softmax, saved
            probs._saved = scores
            ff = torch.empty(b * s * self.FF * 4, device="cuda")
            ff._saved = probs
            x = torch.empty(b * s * self.D * 4, device="cuda")
            x._saved = ff
        out = torch.empty(b * 4, device="cuda")
        out._saved = x
        return out


def refit(model, optimizer, n_batches):
    model.train()
    for _ in range(n_batches):
        logits = model(512)
        loss = torch.nn.functional.cross_entropy(logits, None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        del logits, loss


def serve_hour(model):
    model.eval()
    with torch.inference_mode():
        for _ in range(3):
            model(64)


def main():
    model = TxnTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    print("model: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4e6))
    pool = cp.get_default_memory_pool()
    for day in range(1, 31):
        for hour in range(24):
            window_days = min(30.0, day - 1 + (hour + 1) / 24.0)
            n_txn = int(window_days * TXN_PER_DAY)
            feats = velocity_features(n_txn)
            serve_hour(model)
            del feats
            pool.free_all_blocks()
            refit(model, optimizer, n_batches=2)
        free, total = torch.cuda.mem_get_info()
        print("day %2d: window %4.1f days (%3dM txn), torch allocated %.1f GiB reserved %.1f GiB, free %.1f GiB"
              % (day, window_days, n_txn // 1_000_000, torch.cuda.memory_allocated() / GiB,
                 torch.cuda.memory_reserved() / GiB, free / GiB))


try:
    main()
except cp.cuda.memory.OutOfMemoryError:
    # truth mark: a failure outside PyTorch (CuPy's pool), with PyTorch's books at that moment
    scen_truth.mark("fail", 0, _last_cp["n"], allocated=torch.cuda.memory_allocated(),
                    reserved=torch.cuda.memory_reserved(), query=1)
    raise
sys.exit(0)
