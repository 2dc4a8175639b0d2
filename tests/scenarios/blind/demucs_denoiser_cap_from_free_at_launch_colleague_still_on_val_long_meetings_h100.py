"""train_denoiser.py -- a speech group trains a waveform denoiser (Demucs, H=64, depth 5, resample x4, 33M
parameters, 16 kHz) on DNS-Challenge noisy speech, on the lab's shared H100 80GB.  The lab's etiquette
for the shared card is a helper every script calls first:

    def claim_gpu(share=0.9):
        # be polite: never take more than 90% of what is free when we start
        free, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction(share * free / total)

When the job started, a colleague's fine-tuning run held 60 GiB of the card; free was 19.1 GiB, so the cap
became 0.216 of the card: 17.2 GiB.  Training fits well under it (4-s segments, batch 48: 9.1 GiB at the
peak; fp32 weights and AdamW 0.4 GiB).  At the end of the first epoch (~50 minutes in) the validation runs
on the group's own meeting recordings, whole files of 60-120 s padded to the longest, 24 per batch, under
torch.no_grad(): the U-Net's skip connections and decoder outputs at 64 kHz (after the x4 upsampling) need
~10 MiB per second of audio, ~28 GiB for that batch.  PyTorch refuses the third encoder level's 2.7 GiB
itself, against the cap, with 17.0 GiB allocated; no cudaMalloc fails -- but the card beyond the cap has
only 1.9 GiB free: the colleague's run is still going.

An expert: the cap is what refused, but raising it is no fix: the colleague's 60 GiB leaves this process
19.1 GiB at most, and the validation batch needs ~28 GiB; the cap did what the lab wanted.  The fix is the
validation pass's size: validate 2-4 files per batch (4 files: ~4.6 GiB), or cut the recordings into
overlapping chunks of ~10 s and stitch them (as Demucs's own evaluation does).  Wrong first advice:
raise_framework_cap (1.9 GiB of a ~10 GiB shortfall), stopping the other process (a colleague's job, not
a leftover), gradient checkpointing (training is fine; validation runs without autograd), inference_mode
(it already runs under no_grad), release_references, expandable_segments or empty_cache (the cached
blocks were released against the cap before it refused), another GPU (there is none; this is an 80 GB
card).
"""
import math
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
SR, RESAMPLE, HIDDEN, DEPTH = 16000, 4, 64, 5


def claim_gpu(share=0.9):
    # be polite: never take more than 90% of what is free when we start
    free, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(share * free / total)
    return share * free / total


class Demucs(nn.Module):
    """facebookresearch/denoiser's Demucs: encoder of DEPTH strided convs (kernel 8, stride 4), a 2-layer
    LSTM, decoder of transposed convs with skip connections, on the input upsampled x4."""

    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = nn.Parameter(torch.empty(11_000_000 * 4, device="cuda"))
        self.lstm = nn.Parameter(torch.empty(8_400_000 * 4, device="cuda"))
        self.decoder = nn.Parameter(torch.empty(13_600_000 * 4, device="cuda"))

    def forward(self, wav, batch, seconds):
        grad = torch.is_grad_enabled()
        keep = 3 if grad else 1        # conv, ReLU and GLU inputs kept for backward; one tensor without autograd
        length = int(seconds * SR * RESAMPLE)
        x = torch.empty(batch * length * 4, device="cuda")            # upsampled input
        if grad:
            x._saved = wav
        skips = []
        for i in range(DEPTH):
            # Conv1d(k8, s4) -> ReLU -> Conv1d(1x1, 2*ch) -> GLU
            length = length // 4
            s = torch.empty(batch * HIDDEN * 2 ** i * length * 4 * keep, device="cuda")
            if grad:
                s._saved = x
            skips.append(s)
            x = s
        for i in reversed(range(DEPTH)):
            # x + skip -> Conv1d(1x1, 2*ch) -> GLU -> ConvTranspose1d(k8, s4)
            y = torch.empty(batch * HIDDEN * 2 ** i * length * 4 * keep, device="cuda")
            if grad:
                y._saved = x
            x = y
            skips.pop()
            length = length * 4
        out = torch.empty(batch * int(seconds * SR) * 4, device="cuda")   # back to 16 kHz
        if grad:
            out._saved = x
        return out


def l1_stft_loss(estimate, clean):
    """L1 on the waveform + multi-resolution STFT loss (stand-in: a scalar in the estimate's graph)."""
    from torch.autograd._graph import derive
    loss = torch.empty(512, device="cuda")
    loss._saved = estimate
    return derive(loss, estimate)


fraction = claim_gpu()
print("claimed %.3f of the card" % fraction)
model = Demucs().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999))
rng = random.Random(2024)
meetings = [rng.uniform(60, 120) for _ in range(320)]          # validation recordings, seconds
batch_size, val_batch_size, segment = 48, 24, 4.0


def validate():
    model.eval()
    scores = []
    with torch.no_grad():
        for b in range(0, len(meetings), val_batch_size):
            longest = max(meetings[b:b + val_batch_size])
            noisy = torch.empty(val_batch_size * int(longest * SR) * 4, device="cuda")
            estimate = model(noisy, val_batch_size, longest)
            scores.append(0.0)                              # PESQ / STOI on the CPU
            del noisy, estimate
    model.train()
    return sum(scores) / max(len(scores), 1)


try:
    for epoch in range(1, 101):
        for step in range(1, 601):
            noisy = torch.empty(batch_size * int(segment * SR) * 4, device="cuda")
            estimate = model(noisy, batch_size, segment)
            loss = l1_stft_loss(estimate, None)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del noisy, estimate, loss
        print("epoch %d: train done, peak %.2f GiB, reserved %.2f GiB" % (
            epoch, torch.cuda.max_memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
        print("epoch %d: val %.3f" % (epoch, validate()))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
