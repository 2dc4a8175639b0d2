"""dub_video.ipynb (as a script) -- I dub my cooking videos from English into Spanish at home on an RTX
3060 12GB (11.76 GiB as torch reports it), with three models in a row:

    asr = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3", torch_dtype=fp16).cuda()
    mt = AutoModelForSeq2SeqLM.from_pretrained("facebook/nllb-200-3.3B", torch_dtype=fp16).cuda()
    tts = Xtts.init_from_config(config); tts.load_checkpoint(config, checkpoint_dir="xtts_v2").cuda()  # fp32
    segments = [transcribe(asr, s) for s in audio_segments]        # step 1, whole video
    spanish = [translate(mt, s) for s in segments]                 # step 2
    wavs = [synthesize(tts, s, speaker_wav) for s in spanish]      # step 3  <- OOM at the first segment

The first cell loads all three (Whisper 2.9 GiB, NLLB-3.3B 6.1 GiB in fp16, XTTS-v2 1.7 GiB in fp32):
10.8 GiB of weights, half a GiB of CUDA context, and 0.5 GiB left on the card.  Steps 1 and 2 get
through in that room (small batches, short sequences).  Step 3 runs out in XTTS's HiFi-GAN decoder at
the first 28-second segment (the residual blocks' activations at audio rate, about 0.5 GiB), while
Whisper and NLLB -- finished and never used again -- still hold 9 GiB of the card.

An expert: the pipeline's stages run one after the other, so the models need not be resident together:
run each stage over the whole video, then `del` that model (gc.collect(); torch.cuda.empty_cache())
before loading the next.  Then every stage has the card nearly to itself.  Not a smaller batch (one
segment), not gradient checkpointing or inference_mode (already inference_mode), not empty_cache alone
(the models are live), not expandable_segments.  Quantizing NLLB or a bigger card would also work but
are not where to start.
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def param(nbytes, dtype=None):
    n = nbytes // (2 if dtype == torch.float16 else 4)
    return nn.Parameter(torch.empty(n, dtype=dtype or torch.float32, device="cuda"), requires_grad=False)


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = param(1300 * MiB, torch.float16)
        self.decoder = param(1657 * MiB, torch.float16)

    def generate(self, features):
        hidden = torch.empty(1500 * 1280, dtype=torch.float16, device="cuda")
        scores = torch.empty(20 * 1500 * 1500, dtype=torch.float16, device="cuda")
        return "..."


class M2M100ForConditionalGeneration(nn.Module):
    """NLLB-200 3.3B."""

    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = param(3000 * MiB, torch.float16)
        self.decoder = param(3294 * MiB, torch.float16)

    def generate(self, text, num_beams=4):
        kv = [torch.empty(4 * 96 * 2048, dtype=torch.float16, device="cuda") for _ in range(48)]
        return "..."


class ResBlock(nn.Module):
    def __init__(self, channels):
        nn.Module.__init__(self)
        self.convs1 = nn.Conv1d(channels, channels, 3)
        self.convs2 = nn.Conv1d(channels, channels, 3)

    def forward(self, x):
        xt = self.convs1(x)
        xt = self.convs2(xt)
        return xt


class HifiganGenerator(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv_pre = nn.Conv1d(1024, 512, 7)
        # the upsampling layers are ConvTranspose1d in HiFi-GAN; the stand-in has Conv1d only, so each is a
        # Conv1d whose channel ratio gives its output's size (time x8 with half the channels: x4 the bytes)
        self.ups_0 = nn.Conv1d(128, 512, 16)
        self.ups_1 = nn.Conv1d(64, 256, 16)
        self.ups_2 = nn.Conv1d(64, 64, 4)
        self.ups_3 = nn.Conv1d(32, 32, 4)
        self.resblocks = [[ResBlock(c) for _ in range(3)] for c in (256, 128, 64, 32)]
        for i, group in enumerate(self.resblocks):
            for j, rb in enumerate(group):
                setattr(self, "resblock_%d_%d" % (i, j), rb)
        self.conv_post = nn.Conv1d(32, 1, 7)

    def forward(self, latents):
        x = self.conv_pre(latents)
        for i in range(4):
            x = getattr(self, "ups_%d" % i)(x)
            xs = None
            for rb in self.resblocks[i]:
                out = rb(x)
                xs = out if xs is None else torch.empty_like(out)      # xs + rb(x)
            x = xs
        return self.conv_post(x)


class Xtts(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gpt = param(1700 * MiB)
        self.hifigan_decoder = HifiganGenerator()

    def inference(self, text, speaker_wav, seconds):
        frames = int(seconds * 24000 / 256)
        latents = torch.empty(1024 * frames * 4, device="cuda")          # GPT latents, fp32
        return self.hifigan_decoder(latents)


def transcribe(asr, segment):
    with torch.inference_mode():
        return asr.generate(segment)


def translate(mt, text):
    with torch.inference_mode():
        return mt.generate(text, num_beams=4)


def synthesize(tts, text, speaker_wav, seconds):
    with torch.inference_mode():
        return tts.inference(text, speaker_wav, seconds)


asr = WhisperForConditionalGeneration().eval()
mt = M2M100ForConditionalGeneration().eval()
tts = Xtts().eval()


def main():
    audio_segments = [28.0, 12.5, 22.0, 9.0, 26.5, 17.0]           # seconds each, as Whisper split the video
    segments = [transcribe(asr, s) for s in audio_segments]
    spanish = [translate(mt, s) for s in segments]
    wavs = [synthesize(tts, s, "me.wav", secs) for s, secs in zip(spanish, audio_segments)]
    return wavs


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
