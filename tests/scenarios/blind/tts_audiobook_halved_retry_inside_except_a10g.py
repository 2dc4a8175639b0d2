"""synth_audiobook.py -- an audiobook job renders a novel with a StyleTTS2-like model (text encoder,
prosody predictor, acoustic decoder, HiFi-GAN vocoder; 1.8 GiB of fp32 weights) on one A10G (24 GB),
128 sentences at a time, under torch.inference_mode().  The author wrote a "safe" fallback:

    for chunk in chunks(sentences, batch_size):          # batch_size = 128
        try:
            wavs = synthesize(model, chunk)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            half = len(chunk) // 2
            wavs = synthesize(model, chunk[:half]) + synthesize(model, chunk[half:])   # retry, smaller

The first chapter's batch of 128 runs out of memory in the vocoder's second upsampling stage (4.4
GiB per activation at that rate for 128 padded sentences: the stage output and three resblock
outputs are alive when their sum is made).  The fallback then runs out too, on its first
half of 64 sentences, although 64 sentences alone need about half of what 128 did and fit easily:
the retry runs inside the except block, where the caught exception's traceback still holds the
frames of the failed attempt -- the vocoder's stage output and resblock outputs, ~17.5 GiB -- so
empty_cache() has nothing to give back and the halved batch lands on a full card.

An expert: leave the except block before retrying (set a flag, or `del` the exception / its
traceback, then retry outside the handler); then the halved batch fits.  Not a smaller batch from
the start (the fallback already halves it; the bug is where it runs), not empty_cache (it is already
called and can free nothing the traceback holds), not inference_mode (already on), not
quantization or a bigger card.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 128
MAX_FRAMES = 1120                  # 14 s at 80 frames/s: every sentence padded to the longest of its batch


class Block(nn.Module):
    def __init__(self, mib):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(mib * MiB, device="cuda"), requires_grad=False)


class TextEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = nn.Module()
        for i in range(6):
            setattr(self.layers, "l%d" % i, Block(50))

    def forward(self, tokens):
        return torch.empty(tokens.nbytes * 64, device="cuda")


class ProsodyPredictor(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.lstm = Block(200)
        self.style = Block(300)

    def forward(self, h, n):
        durations = torch.empty(n * 4096, device="cuda")
        frames = torch.empty(n * MAX_FRAMES * 512 * 4, device="cuda")    # length-regulated hidden states
        return durations, frames


class AcousticDecoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(7):
            setattr(self, "b%d" % i, Block(100))

    def forward(self, frames, n):
        return torch.empty(n * MAX_FRAMES * 80 * 4, device="cuda")        # mel


class HiFiGAN(nn.Module):
    """Upsampling 8x, 8x, 2x, 2x; channels 512 -> 256 -> 128 -> 64 -> 32; three parallel resblocks (MRF)
    per stage, summed."""
    RATES = (8, 8, 2, 2)

    def __init__(self):
        nn.Module.__init__(self)
        self.conv_pre = Block(20)
        for i in range(4):
            setattr(self, "up%d" % i, Block(40 // (i + 1)))
            setattr(self, "mrf%d" % i, Block(60 // (i + 1)))

    def forward(self, mel, n):
        t, ch = MAX_FRAMES, 512
        x = torch.empty(n * t * ch * 4, device="cuda")                   # conv_pre
        for rate in self.RATES:
            t, ch = t * rate, ch // 2
            x = torch.empty(n * t * ch * 4, device="cuda")               # transposed conv
            xs = [torch.empty(n * t * ch * 4, device="cuda") for _ in range(3)]   # resblocks
            x = torch.empty(n * t * ch * 4, device="cuda")               # sum of resblocks / 3
            del xs
        return torch.empty(n * t * 4, device="cuda")                      # waveform


class StyleTTS(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.text_encoder = TextEncoder()
        self.predictor = ProsodyPredictor()
        self.decoder = AcousticDecoder()
        self.vocoder = HiFiGAN()

    def forward(self, tokens, n):
        h = self.text_encoder(tokens)
        durations, frames = self.predictor(h, n)
        mel = self.decoder(frames, n)
        return self.vocoder(mel, n)


def from_pretrained(name):
    model = StyleTTS()
    model.eval()
    return model


def synthesize(model, chunk):
    with torch.inference_mode():
        tokens = torch.empty(len(chunk) * 512 * 8, device="cuda")
        wav = model(tokens, len(chunk))
        return [wav]


def main():
    model = from_pretrained("styletts2-libritts-en")
    sentences = ["sentence %d of chapter one" % i for i in range(1024)]
    out = []
    for s in range(0, len(sentences), batch_size):
        chunk = sentences[s:s + batch_size]
        try:
            wavs = synthesize(model, chunk)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            half = len(chunk) // 2
            wavs = synthesize(model, chunk[:half]) + synthesize(model, chunk[half:])
        out.extend(wavs)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
