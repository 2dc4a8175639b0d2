"""scorer.py -- an online anomaly scorer for wind-turbine SCADA data, on a T4 (16 GB) in the operator's
on-prem inference box (PyTorch 1.13, the vendor's image).  Every 10 minutes it scores the last 1024
samples of 64 sensor channels of each of 600 turbines (4 farms x 150) with an LSTM autoencoder, under
torch.no_grad():

    class Scorer:
        def __init__(self, model):
            self.model = model.eval()
            self.err_history = collections.defaultdict(list)    # farm -> per-window error maps
        def tick(self, farm, windows):                         # windows: (150, 1024, 64) on the GPU
            with torch.no_grad():
                recon = self.model(windows)
                err = (recon - windows) ** 2                   # (150, 1024, 64), kept for thresholds
                self.err_history[farm].append(err)             # "the 30-day p99 needs the history"
                return err.mean(dim=(1, 2)) > self.threshold(farm)

Each tick keeps 4 x 37.5 MiB of per-sample, per-channel error maps on the GPU; nothing ever removes
them (the 30-day window was to be applied "when computing the quantile").  After ~90 ticks (15 hours)
the card is full and the next tick's forward fails.

An expert: memory that grows with every tick, held by one dict of lists of the scorer: keep only what
the threshold needs (a per-window scalar score, or a bounded deque / running quantile sketch), and keep
it on the CPU (err.mean(...).cpu()).  Not a smaller batch, not mixed precision or a bigger card (they
only postpone it), not empty_cache (the memory is live).
"""
import collections
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

TURBINES_PER_FARM = 150
WINDOW = 1024
CHANNELS = 64
HIDDEN = 256
batch_size = TURBINES_PER_FARM


class LSTM(torch.nn.Module):
    def __init__(self, cin, hidden):
        torch.nn.Module.__init__(self)
        self.weight_ih = torch.nn.Parameter(torch.empty(4 * hidden * cin * 4, device="cuda"))
        self.weight_hh = torch.nn.Parameter(torch.empty(4 * hidden * hidden * 4, device="cuda"))
        self.hidden = hidden

    def forward(self, x):
        gates = torch.empty(batch_size * WINDOW * 4 * self.hidden * 4 // 4, device="cuda")   # per step, reused
        out = torch.empty(batch_size * WINDOW * self.hidden * 4, device="cuda")
        del gates
        return out


class LSTMAutoencoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.enc1 = LSTM(CHANNELS, HIDDEN)
        self.enc2 = LSTM(HIDDEN, HIDDEN)
        self.dec1 = LSTM(HIDDEN, HIDDEN)
        self.dec2 = LSTM(HIDDEN, HIDDEN)
        self.head = torch.nn.Parameter(torch.empty(HIDDEN * CHANNELS * 4, device="cuda"))

    def forward(self, x):
        h = self.enc1(x)
        h = self.enc2(h)
        h = self.dec1(h)
        h = self.dec2(h)
        recon = torch.empty(batch_size * WINDOW * CHANNELS * 4, device="cuda")
        return recon


class Scorer(object):
    def __init__(self, model):
        self.model = model.eval()
        self.err_history = collections.defaultdict(list)

    def threshold(self, farm):
        return 0.05            # placeholder until a month of history exists

    def tick(self, farm, windows):
        with torch.no_grad():
            recon = self.model(windows)
            err = torch.empty(batch_size * WINDOW * CHANNELS * 4, device="cuda")    # (recon - windows) ** 2
            self.err_history[farm].append(err)
            score = torch.empty(batch_size * 4, device="cuda")                      # err.mean(dim=(1, 2))
            return score


def main():
    scorer = Scorer(LSTMAutoencoder())
    farms = ["north_sea_a", "north_sea_b", "baltic_1", "baltic_2"]
    for tick in range(100000):
        for farm in farms:
            windows = torch.empty(batch_size * WINDOW * CHANNELS * 4, device="cuda")   # from the feature store
            flags = scorer.tick(farm, windows)
            del windows, flags


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
