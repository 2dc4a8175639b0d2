"""fwi_line7.py -- a geophysics postdoc runs 2-D acoustic full-waveform inversion (Deepwave) of one North Sea
streamer line -- 17 km x 3.5 km, 120 shots, 400 receivers, 4 s records -- on the group's RTX A6000 (48 GB),
multi-scale as the textbooks say: invert the data low-passed at 5 Hz on a coarse grid, then 10 Hz, then 15 Hz.
Each stage resamples the velocity model so that the grid has enough points per shortest wavelength, and the
time step follows the grid (CFL):

    STAGES = [dict(fmax=5, dx=20.0, dt=0.004), dict(fmax=10, dx=10.0, dt=0.002), dict(fmax=15, dx=6.25, dt=0.001)]
    SHOTS_PER_BATCH = 24                        # tuned on stage 1: 20 GiB peak, "room to spare"
    for stage in STAGES:
        v = resample(v, stage["dx"]).requires_grad_()
        for epoch in range(...):
            for shots in batches(SHOTS_PER_BATCH):
                out = deepwave.scalar(v, dx, dt, source_amplitudes=..., receiver_locations=...)[-1]
                loss = mse(out, observed[shots]); loss.backward()
            optimizer.step()

Deepwave keeps, for the velocity gradient, one snapshot of the wavefield per time sample per shot.  Stage 1
(899 x 224 padded cells, 1,000 samples): 0.8 GB per shot, 19 GB for a batch of 24 -- fine, 10 epochs.  Stage 2
halves dx (4x the cells) and halves dt (2x the samples): 5.6 GB per shot, and the same 24 shots ask for one
125 GiB snapshot store on a 48 GB card -- the first forward propagation of stage 2 fails.

An expert: this is the size of the propagation's stored wavefields, per shot, times the shot batch: propagate
fewer shots per call and accumulate the gradient over the batches (4 shots/call = 22 GB here), and/or store
the wavefield less often for the gradient (model_gradient_sampling_interval: 10 Hz needs far fewer than 2,000
snapshots), keep the store in host memory (storage_mode="cpu"), or checkpoint the time loop.  Scale the batch
with the stage, not once.  Wrong advice: mixed precision or quantization (the wave equation in fp16 is not
accurate enough), inference_mode (it is an inversion: the gradient is the point), flash attention / shorter
sequences (there is no attention), expandable_segments / empty_cache (one 125 GiB request), LoRA / an 8-bit
optimizer (one 2.8 MB parameter).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

LINE_LENGTH_M, DEPTH_M, RECORD_S = 17000.0, 3500.0, 4.0
N_SHOTS, N_RECEIVERS = 120, 400
PML_WIDTH, ACCURACY = 20, 8
STAGES = [dict(fmax=5, dx=20.0, dt=0.004, epochs=10),
          dict(fmax=10, dx=10.0, dt=0.002, epochs=10),
          dict(fmax=15, dx=6.25, dt=0.001, epochs=6)]
SHOTS_PER_BATCH = 24
F32 = torch.float32


def grid(dx):
    return int(LINE_LENGTH_M / dx) + 1, int(DEPTH_M / dx) + 1


def padded_cells(nx, nz):
    pad = 2 * (PML_WIDTH + ACCURACY // 2)
    return (nx + pad) * (nz + pad)


class ScalarForwardFunc(object):
    """deepwave.scalar's autograd.Function, as far as memory goes: per shot, the padded wavefields of the
    time loop (wfc, wfp, psi, zeta) and, when the velocity model needs a gradient, one stored snapshot of
    the wavefield per time sample (model_gradient_sampling_interval=1), allocated for the whole batch."""

    @staticmethod
    def apply(v, n_cells, nt, n_shots, n_receivers, model_gradient_sampling_interval):
        needs_grad = v.requires_grad and torch.is_grad_enabled()
        wavefields = torch.empty(n_shots * 4 * n_cells, dtype=F32, device="cuda")
        store = None
        if needs_grad:
            n_snap = (nt + model_gradient_sampling_interval - 1) // model_gradient_sampling_interval
            store = torch.empty(n_shots * n_snap * n_cells, dtype=F32, device="cuda")
        receiver_amplitudes = torch.empty(n_shots * n_receivers * nt, dtype=F32, device="cuda")
        if needs_grad:
            receiver_amplitudes._params = (v,)
            receiver_amplitudes._saved = store
        del wavefields
        return receiver_amplitudes


def scalar(v, grid_spacing, dt, n_cells, nt, n_shots, n_receivers=N_RECEIVERS, accuracy=ACCURACY,
           pml_width=PML_WIDTH, model_gradient_sampling_interval=1):
    return ScalarForwardFunc.apply(v, n_cells, nt, n_shots, n_receivers, model_gradient_sampling_interval)


def mse(pred, target):
    loss = torch.empty(4, dtype=F32, device="cuda")
    loss._params = pred._params
    loss._saved = pred
    return loss


def backward(loss):
    """loss.backward(); then, as PyTorch does, the function's saved snapshots are released."""
    loss.backward()
    pred = loss._saved
    loss._saved = None
    if pred is not None:
        pred._saved = None


def resample(nx, nz):
    v = torch.empty(nx * nz, dtype=F32, device="cuda")
    return torch.nn.Parameter(v, requires_grad=True)


def lowpass(observed_nt, fmax):
    return torch.empty(N_SHOTS * N_RECEIVERS * observed_nt, dtype=F32, device="cuda")


def main():
    raw = torch.empty(N_SHOTS * N_RECEIVERS * int(RECORD_S / 0.001), dtype=F32, device="cuda")   # 1 ms field data
    for stage in STAGES:
        nx, nz = grid(stage["dx"])
        n_cells = padded_cells(nx, nz)
        nt = int(RECORD_S / stage["dt"])
        v = resample(nx, nz)
        observed = lowpass(nt, stage["fmax"])
        optimizer = torch.optim.SGD([v], lr=1e9, momentum=0.0)
        print("stage %d Hz: grid %d x %d (%d padded cells), nt %d" % (stage["fmax"], nx, nz, n_cells, nt))
        torch.cuda.reset_peak_memory_stats()
        for epoch in range(stage["epochs"]):
            optimizer.zero_grad()
            for first in range(0, N_SHOTS, SHOTS_PER_BATCH):
                n_shots = min(SHOTS_PER_BATCH, N_SHOTS - first)
                out = scalar(v, stage["dx"], stage["dt"], n_cells, nt, n_shots)
                loss = mse(out, observed)
                backward(loss)
                del out, loss
            optimizer.step()
            print("  epoch %d  peak %.1f GiB" % (epoch, torch.cuda.max_memory_allocated() / float(1 << 30)))
        del observed


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
