"""separate_concert.py -- a sound engineer separates a full-length live concert recording (2 h 50 min,
stereo, 44.1 kHz) into drums/bass/other/vocals with a Demucs-like waveform U-Net on an L4 (24 GB, 22.5
GiB usable).  The separation tool normally cuts the track into overlapping segments, but the author
turned that off after hearing artefacts at the segment seams:

    wav = load_track("concert_2024-06-14.flac")               # (2, 449,820,000) float32, 3.35 GiB
    with torch.no_grad():
        sources = apply_model(model, wav[None].cuda(), split=False)   # one pass over the whole track

The model is small (170 MiB of weights).  The track is moved to the GPU and normalised (two 3.35 GiB
copies), and the first encoder layer (Conv1d 2 -> 48 channels, stride 4) asks for 20 GiB for its
output alone.  One input -- one batch of one track -- is the whole peak; half precision would not save
it either (the next layer doubles the channels).

An expert: process the track in chunks (split=True with a longer segment and more overlap, or
overlap-add over windows of a few seconds to minutes); every chunk then needs a few hundred MiB.
Not a smaller batch (it is one track), not inference_mode or no_grad (autograd is already off), not
gradient checkpointing, not quantizing or offloading the weights (170 MiB), not expandable_segments
or empty_cache.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

SAMPLE_RATE = 44100
SECONDS = 170 * 60


class EncoderLayer(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.conv = nn.Conv1d(cin, cout, 8, stride=4, device="cuda")
        self.rewrite = nn.Conv1d(cout, 2 * cout, 1, device="cuda")       # 1x1 conv before the GLU

    def forward(self, x):
        x = self.conv(x)
        return self.rewrite(x)


class DemucsLike(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        chans = [2, 48, 96, 192, 384]
        self.encoder = nn.Module()
        for i in range(4):
            setattr(self.encoder, "e%d" % i, EncoderLayer(chans[i], chans[i + 1]))
        self.transformer = nn.Parameter(torch.empty(160 * MiB, device="cuda"), requires_grad=False)   # cross-domain transformer
        self.decoder = nn.Parameter(torch.empty(8 * MiB, device="cuda"), requires_grad=False)

    def forward(self, mix):
        mean = torch.empty(512, device="cuda")
        x = torch.empty(mix.nbytes, device="cuda")          # (mix - mean) / std
        skips = []
        for i in range(4):
            x = getattr(self.encoder, "e%d" % i)(x)
            skips.append(x)
        return x


def load_track(path):
    return SAMPLE_RATE * SECONDS * 2 * 4                   # bytes of the decoded float32 stereo track


def apply_model(model, nbytes, split=True, segment=7.8, overlap=0.25):
    batch_size = 1
    mix = torch.empty(nbytes * batch_size, device="cuda")   # wav[None].cuda()
    if split:
        raise NotImplementedError
    return model(mix)


def main():
    model = DemucsLike()
    model.eval()
    wav = load_track("concert_2024-06-14.flac")
    with torch.no_grad():
        sources = apply_model(model, wav, split=False)
    return sources


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
