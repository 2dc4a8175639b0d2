"""train_saint.py -- card-fraud model on tabular data: SAINT (self-attention over the 412 features of each
row and intersample attention across the rows of the batch, 6 layers, embedding 32), fp32, AdamW, on an
A100 80 GB.  The user raised the batch from 2048 to 8192 ("intersample attention sees more fraud
examples per batch") and, to be safe, wrapped the step in an "OOM-proof" helper found in a forum post:

    def train_step(xb, yb):
        try:
            loss = F.binary_cross_entropy_with_logits(model(xb), yb)
            loss.backward(); opt.step(); opt.zero_grad()
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            if len(xb) <= 256: raise
            half = len(xb) // 2
            train_step(xb[:half], yb[:half])            # retried INSIDE the except block
            train_step(xb[half:], yb[half:])

At batch 8192 each layer keeps ~14 GiB (the per-row feature attention, plus 8192^2 attention weights per
head across rows); the first forward fails in its 6th layer with ~70 GiB of the first five layers'
activations alive.  The retry with 4096 rows runs inside the except block: the exception's traceback
still references the failed forward's frames, so those 70 GiB stay, and the half batch fails in its
first layers; so does every nested retry, down to the floor, and the last error escapes.

What the user says: "even 256 rows run out of memory on an 80 GB card?"  What an expert says first: the
retry runs inside `except`, where the traceback keeps the failed attempt's tensors alive: leave the
except block first (set a flag, or catch, `del` what it held, and retry after it), then pick a batch
that fits (4096 fits with room; 8192 never did).  Wrong advice: empty_cache (the memory is live, held
by the traceback), expandable_segments, a bigger GPU, quantization.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
batch_size = 8192
N_FEATURES = 412


class Rows(object):
    """xb[:half] -- a view of a batch: its rows and the tensor behind them."""

    def __init__(self, t, n):
        self.t, self.n = t, n

    def __len__(self):
        return self.n

    def __getitem__(self, s):
        return Rows(self.t.view(), len(range(*s.indices(self.n))))


class SAINTLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.col_attn = nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.row_attn = nn.Parameter(torch.empty(N_FEATURES * 32 * N_FEATURES * 32 * 4 // 64, device="cuda"))
        self.ffn = nn.Parameter(torch.empty(8 * MiB, device="cuda"))

    def forward(self, h, rows):
        col = torch.empty(rows * 3 * MiB // 2, device="cuda")           # attention over each row's 412 features
        col._saved = h
        row = torch.empty(rows * rows * 8 * 4, device="cuda")          # intersample attention weights, 8 heads
        row._saved = col
        return row


class SAINT(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed = nn.Parameter(torch.empty(N_FEATURES * 32 * 4 * 64, device="cuda"))
        self.layers = nn.Module()
        for i in range(6):
            setattr(self.layers, str(i), SAINTLayer())
        self.head = nn.Parameter(torch.empty(N_FEATURES * 32 * 4, device="cuda"))

    def forward(self, xb):
        h = torch.empty(len(xb) * N_FEATURES * 32 * 4, device="cuda")
        h._saved = xb.t
        for i in range(6):
            h = getattr(self.layers, str(i))(h, len(xb))
        logits = torch.empty(len(xb) * 4, device="cuda")
        logits._saved = h
        return logits


def train_step(model, optimizer, xb, yb):
    try:
        logits = model(xb)
        loss = torch.nn.functional.nll_loss(logits, yb)               # binary_cross_entropy_with_logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        if len(xb) <= 256:
            raise
        half = len(xb) // 2
        print("OOM at %d rows, retrying with %d" % (len(xb), half))
        train_step(model, optimizer, xb[:half], yb)
        train_step(model, optimizer, xb[half:], yb)


try:
    model = SAINT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(10000):
        xb = Rows(torch.empty(batch_size * N_FEATURES * 4, device="cuda"), batch_size)
        yb = torch.empty(batch_size * 4, device="cuda")
        train_step(model, optimizer, xb, yb)
        del xb, yb
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
