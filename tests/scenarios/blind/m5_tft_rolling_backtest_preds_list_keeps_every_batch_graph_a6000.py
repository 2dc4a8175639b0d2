"""Rolling-origin backtest of a Temporal Fusion Transformer on the M5 sales panel, one RTX A6000 (48 GiB).

The real code (backtest.py), run after training with the best checkpoint:

    model = TemporalFusionTransformer.load_from_checkpoint(best_ckpt).cuda()
    model.eval()
    forecasts = {}
    for cutoff in CUTOFFS:                                   # 8 folds, 28-day horizon each
        loader = make_loader(panel, cutoff, batch_size=2048) # 30,490 series -> 15 batches
        preds = []
        for x in loader:
            out = model(x)
            preds.append(out["prediction"])                  # (2048, 28, 7 quantiles)
        forecasts[cutoff] = torch.cat(preds)
    score_wrmsse(forecasts)

The loop was written by hand instead of trainer.predict(), and without torch.no_grad() / inference_mode: the
parameters from load_from_checkpoint still require grad, so every forward records its graph, and
preds.append(out["prediction"]) keeps that graph, with every activation it saved for a backward that never
comes, alive until the fold ends.  The prediction itself is 2048 x 28 x 7 x 4 B = 1.6 MB; what it holds is ~4.6
GiB per batch (batch 2048, 112 encoder + 28 decoder days, hidden 160, 12 encoder / 6 decoder variables):
  * encoder variable selection: 12 per-variable GRN outputs, 2048 x 112 x 12 x 160 x 4 B = 1.76 GB
  * encoder LSTM gates 2048 x 112 x 640 x 4 B = 587 MB, decoder gates 147 MB, LSTM outputs, gate/add/norm
  * static enrichment GRNs, q/k/v over 140 days (3 x 184 MB), attention scores and probabilities over
    4 heads x 28 queries x 140 keys (2 x 128 MB), post-attention GRN and position-wise feed-forward
Memory climbs by ~4.6 GiB per batch; the model itself is 3.1M parameters (13 MB).  The 11th batch of the first
fold fails (its variable selection asks for 1.76 GB with ~1.15 GiB free, 46.3 GiB held by ten earlier
batches' graphs).  Training (batch 128) never came near this.
What an expert says first: run the backtest under torch.inference_mode() (or no_grad), and move each batch's
prediction to the CPU (.cpu()) before keeping it: the backtest then needs ~5 GiB at any time.  Wrong advice: a
smaller batch (it only postpones the failure to a later batch), expandable_segments / empty_cache (nothing is
cached; the memory is referenced), gradient checkpointing or mixed precision, a bigger card.
"""
import datetime

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

N_SERIES = 30_490
ENCODER_LENGTH = 112
DECODER_LENGTH = 28
HIDDEN = 160
N_HEADS = 4
N_ENCODER_VARS = 12
N_DECODER_VARS = 6
QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)
BATCH_SIZE = 2048
CUTOFFS = [datetime.date(2016, 1, 3) + datetime.timedelta(days=28 * k) for k in range(8)]
F32 = torch.float32


def _act(n, saved):
    t = torch.empty(n, dtype=F32, device="cuda")
    t._saved = saved
    return t


class GatedResidualNetwork(nn.Module):
    def __init__(self, d_in, d_hidden, d_out):
        super().__init__()
        self.d_out = d_out
        self.fc1 = nn.Parameter(torch.empty(d_in * d_hidden, dtype=F32, device="cuda"))
        self.fc2 = nn.Parameter(torch.empty(d_hidden * d_hidden, dtype=F32, device="cuda"))
        self.gate = nn.Parameter(torch.empty(d_hidden * 2 * d_out, dtype=F32, device="cuda"))

    def forward(self, x, n_rows):
        h = _act(n_rows * self.d_out, x)          # elu(fc1(x)), fc2
        return _act(n_rows * self.d_out, h)       # GLU gate + skip + LayerNorm


class VariableSelectionNetwork(nn.Module):
    def __init__(self, n_vars):
        super().__init__()
        self.n_vars = n_vars
        for i in range(n_vars):
            setattr(self, "single_variable_grn_%d" % i, GatedResidualNetwork(HIDDEN, HIDDEN, HIDDEN))
        self.flattened_grn = GatedResidualNetwork(n_vars * HIDDEN, HIDDEN, n_vars)

    def forward(self, x, batch_size, length):
        rows = batch_size * length
        var_outputs = _act(rows * self.n_vars * HIDDEN, x)                # stack of the per-variable GRNs
        weights = self.flattened_grn(var_outputs, rows)                    # softmax over the variables
        return _act(rows * HIDDEN, weights)                                # weighted sum


class LSTM(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight_ih = nn.Parameter(torch.empty(hidden * 4 * hidden, dtype=F32, device="cuda"))
        self.weight_hh = nn.Parameter(torch.empty(hidden * 4 * hidden, dtype=F32, device="cuda"))

    def forward(self, x, batch_size, length):
        gates = _act(batch_size * length * 4 * HIDDEN, x)
        return _act(batch_size * length * HIDDEN, gates)


class InterpretableMultiHeadAttention(nn.Module):
    def __init__(self, n_heads, d_model):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Parameter(torch.empty(d_model * d_model, dtype=F32, device="cuda"))
        self.k_proj = nn.Parameter(torch.empty(d_model * d_model, dtype=F32, device="cuda"))
        self.v_proj = nn.Parameter(torch.empty(d_model * d_model // n_heads, dtype=F32, device="cuda"))
        self.out_proj = nn.Parameter(torch.empty(d_model // n_heads * d_model, dtype=F32, device="cuda"))

    def forward(self, x, batch_size):
        total = ENCODER_LENGTH + DECODER_LENGTH
        q = _act(batch_size * total * HIDDEN, x)
        k = _act(batch_size * total * HIDDEN, q)
        v = _act(batch_size * total * HIDDEN, k)
        scores = _act(batch_size * self.n_heads * DECODER_LENGTH * total, v)
        probs = _act(batch_size * self.n_heads * DECODER_LENGTH * total, scores)
        return _act(batch_size * DECODER_LENGTH * HIDDEN, probs)


class TemporalFusionTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder_variable_selection = VariableSelectionNetwork(N_ENCODER_VARS)
        self.decoder_variable_selection = VariableSelectionNetwork(N_DECODER_VARS)
        self.lstm_encoder = LSTM(HIDDEN)
        self.lstm_decoder = LSTM(HIDDEN)
        self.post_lstm_gate_add_norm = GatedResidualNetwork(HIDDEN, HIDDEN, HIDDEN)
        self.static_enrichment = GatedResidualNetwork(HIDDEN, HIDDEN, HIDDEN)
        self.multihead_attn = InterpretableMultiHeadAttention(N_HEADS, HIDDEN)
        self.pos_wise_ff = GatedResidualNetwork(HIDDEN, HIDDEN, HIDDEN)
        self.output_layer = nn.Parameter(torch.empty(HIDDEN * len(QUANTILES), dtype=F32, device="cuda"))

    @classmethod
    def load_from_checkpoint(cls, path):
        return cls()

    def forward(self, x):
        b = x["batch_size"]
        enc = self.encoder_variable_selection(x["encoder_cont"], b, ENCODER_LENGTH)
        dec = self.decoder_variable_selection(x["decoder_cont"], b, DECODER_LENGTH)
        enc = self.lstm_encoder(enc, b, ENCODER_LENGTH)
        dec = self.lstm_decoder(dec, b, DECODER_LENGTH)
        lstm_out = _act(b * (ENCODER_LENGTH + DECODER_LENGTH) * HIDDEN, (enc, dec))  # torch.cat([enc, dec], 1)
        h = self.post_lstm_gate_add_norm(lstm_out, b * (ENCODER_LENGTH + DECODER_LENGTH))
        h = self.static_enrichment(h, b * (ENCODER_LENGTH + DECODER_LENGTH))
        h = self.multihead_attn(h, b)
        h = self.pos_wise_ff(h, b * DECODER_LENGTH)
        prediction = _act(b * DECODER_LENGTH * len(QUANTILES), h)
        return {"prediction": prediction}


def make_loader(cutoff, batch_size):
    """The TimeSeriesDataSet of the 30,490 item-store series, windows ending at `cutoff`."""
    for start in range(0, N_SERIES, batch_size):
        b = min(batch_size, N_SERIES - start)
        yield {"batch_size": b,
               "encoder_cont": torch.empty(b * ENCODER_LENGTH * N_ENCODER_VARS, dtype=F32, device="cuda"),
               "decoder_cont": torch.empty(b * DECODER_LENGTH * N_DECODER_VARS, dtype=F32, device="cuda")}


def backtest(model):
    model.eval()
    forecasts = {}
    for cutoff in CUTOFFS:
        preds = []
        for x in make_loader(cutoff, batch_size=BATCH_SIZE):
            out = model(x)
            preds.append(out["prediction"])
        forecasts[cutoff] = preds        # torch.cat(preds)
        print("fold %s: %d batches" % (cutoff, len(preds)))
    return forecasts


def main():
    model = TemporalFusionTransformer.load_from_checkpoint("lightning_logs/version_41/checkpoints/best.ckpt")
    forecasts = backtest(model)
    print("WRMSSE over %d folds" % len(forecasts))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
