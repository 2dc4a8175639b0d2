"""embed_episodes.py -- nightly job for a podcast-discovery team on one H100 SXM (80 GiB, cc 9.0):
embed each new episode's audio with a CLAP audio encoder (HTSAT, fp16, PyTorch), then cluster the
embeddings with a CuPy k-means (stage 2, never reached tonight).

    model = ClapModel.from_pretrained("laion/larger_clap_general").cuda().half().eval()
    for ep in episodes:                                      # one episode at a time, batch of 1
        wav = load_48k(ep.path)                              # whole episode, no cropping
        with torch.inference_mode():
            emb = model.get_audio_features(**fe(wav, sampling_rate=48000, truncation="fusion"))

The feature extractor was configured to "use the whole episode" (the team wanted one vector per
episode, not per 10 s window): the mel spectrogram and the encoder's activations grow with the
episode's length.  For 2,000 episodes of 20-90 minutes the run is flat at ~18 GiB peak.  Tonight's
batch contains a 9-hour Twitch livestream re-published as a podcast episode: its spectrogram is 6x
the longest seen, and the fusion path's global attention, quadratic in length, asks for ~300 GiB of
scores for it: 36x the longest episode's, on an 80 GiB card.

User: "it ran for months on an H100 and now OOMs on batch size 1?"
An expert, first: one input is far outside the distribution -- cap the input size: embed fixed windows
(e.g. 10 s or 60 s chunks) and mean-pool them, or crop/skip episodes over N hours.  Wrong advice: a
smaller batch (it is 1), empty_cache or expandable_segments (the request is one huge block), other
processes, a leak (memory was flat between episodes), a bigger GPU.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

SR, HOP, MELS = 48000, 480, 64          # 100 frames/s
PATCH, DIM, HEADS, WIN = 4, 128, 4, 256


class HTSATClap(torch.nn.Module):
    """CLAP's HTSAT-large audio tower (fp16, ~170M params incl. the text tower)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(24):
            setattr(self, "block%d" % i, torch.nn.Parameter(
                torch.empty(7 * MiB, dtype=torch.float16, device="cuda"), requires_grad=False))

    def get_audio_features(self, seconds):
        frames = int(seconds * SR / HOP)
        mel = torch.empty(frames * MELS * 4, device="cuda")                    # log-mel, fp32
        tokens = frames // PATCH * (MELS // PATCH)
        x = torch.empty(tokens * DIM, dtype=torch.float16, device="cuda")     # patch embeddings
        local = torch.empty(HEADS * tokens * WIN, dtype=torch.float16, device="cuda")   # windowed attention
        del local
        # the "whole episode" fusion path: global attention over the pooled sequence -- quadratic in length
        g = tokens // 64
        scores = torch.empty(HEADS * g * g, dtype=torch.float16, device="cuda")
        probs = torch.empty(HEADS * g * g, dtype=torch.float16, device="cuda")
        del scores
        h = torch.empty(tokens * DIM * 4, dtype=torch.float16, device="cuda")   # MLP
        del probs, h, mel
        return torch.empty(512, dtype=torch.float16, device="cuda"), x


def episodes():
    """Tonight's queue: durations in minutes (a 540-minute livestream in the middle)."""
    durs = [23, 47, 88, 61, 35, 72, 90, 54, 41, 66] * 6
    durs.insert(37, 540)
    return durs


def main():
    model = HTSATClap().eval()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    bank = []
    for i, minutes in enumerate(episodes()):
        with torch.inference_mode():
            emb, _ = model.get_audio_features(minutes * 60)
        bank.append(emb)
        if i % 10 == 0 or minutes > 120:
            print("episode %d (%d min): peak %.1f GiB" % (i, minutes, torch.cuda.max_memory_allocated() / GiB))
    print("embedded", len(bank))


main()
sys.exit(0)
