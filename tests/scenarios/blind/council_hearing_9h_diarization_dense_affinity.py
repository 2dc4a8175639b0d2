"""diarize_batch.py -- nightly speaker diarization of city-council meeting recordings for our
transcript search, on one T4 (15 GiB usable).  Speaker embeddings from SpeechBrain's ECAPA-TDNN
(spkrec-ecapa-voxceleb, 20.8M parameters, fp32) on 1.5 s windows every 0.25 s, then spectral
clustering on the GPU over the cosine affinity of every pair of windows:

    @torch.inference_mode()
    def diarize(wav):
        windows = sliding_windows(wav, win=1.5, step=0.25)          # 4 windows per second of audio
        emb = torch.cat([ecapa(fbank(b)) for b in batched(windows, batch_size=256)])   # N x 192
        emb = torch.nn.functional.normalize(emb, dim=-1)
        affinity = emb @ emb.T                                       # N x N float32
        labels = spectral_cluster(affinity, max_speakers=20)
        ...
    for path in tonight_s_recordings:
        diarize(load(path))

It has run for months (meetings are 1-3 hours: a 3-hour one is 43,200 windows, a 7 GiB affinity).
Last night's batch had the 9-hour budget hearing: 129,600 windows, and `emb @ emb.T` asks for
129,600^2 x 4 bytes = 62.6 GiB at once -- four times the card.  Everything else of that file (the
model, 95 MiB of embeddings, the embedding batches) is small; the files before it went through (PyTorch
still caches 7 GiB of the 3-hour meeting's matrices, in a segment the new embeddings landed in).

An expert: this one input's pairwise matrix is the problem, and it grows with the square of the
recording's length.  Compute the affinity in blocks of rows (or only each window's k nearest
neighbours, a sparse affinity), cluster per hour-long chunk and then link the chunks' centroids, or
pool the windows into longer segments before clustering.  Not a smaller embedding batch (256 windows
are 150 MiB), not fp16 (31 GiB still does not fit; the next 12-hour hearing needs 111 GiB), not
quantization or offloading of a 83 MB model, not empty_cache or expandable_segments (nothing near 62
GiB is free or cached), not inference_mode (already on), not a bigger card first.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def f32(n):
    return torch.empty(n, dtype=torch.float32, device="cuda")


class ECAPA_TDNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Module()
        for i in range(5):
            setattr(self.blocks, "w%d" % i, torch.nn.Parameter(f32(20800000 // 5), requires_grad=False))

    def forward(self, feats, batch_size):
        x = f32(batch_size * 1024 * 150)             # TDNN block outputs: 1024 channels x 150 frames
        x2 = f32(batch_size * 1024 * 150)
        mfa = f32(batch_size * 3072 * 150)           # multi-layer feature aggregation
        emb = f32(batch_size * 192)
        return emb


def fbank(batch_size):
    return f32(batch_size * 150 * 80)


def spectral_cluster(affinity, n):
    laplacian = f32(n * n)
    return f32(n)


def diarize(ecapa, duration_s, batch_size=256):
    n_windows = int(duration_s * 4)                  # 1.5 s windows, 0.25 s step
    chunks = []
    for start in range(0, n_windows, batch_size):
        b = min(batch_size, n_windows - start)
        chunks.append(ecapa(fbank(b), b))
    emb = f32(n_windows * 192)                       # torch.cat(chunks)
    del chunks
    emb = f32(n_windows * 192)                       # F.normalize(emb, dim=-1)
    affinity = f32(n_windows * n_windows)            # emb @ emb.T
    labels = spectral_cluster(affinity, n_windows)
    return labels


def main():
    ecapa = ECAPA_TDNN()
    ecapa.eval()
    recordings = [("2026-11-30_planning_commission.wav", 2.1 * 3600), ("2026-12-01_council_regular.wav", 3.0 * 3600),
                  ("2026-12-01_parks_board.wav", 1.2 * 3600), ("2026-12-02_budget_hearing.wav", 9.0 * 3600),
                  ("2026-12-02_transit_committee.wav", 1.5 * 3600)]
    with torch.inference_mode():
        for path, duration_s in recordings:
            print("diarizing %s (%.1f h)" % (path, duration_s / 3600.0), file=sys.stderr)
            diarize(ecapa, duration_s)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
