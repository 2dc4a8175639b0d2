"""render_chapters.py -- a tenant's nightly audiobook render on a shared inference node: one NVIDIA L4
(22.5 GiB) is cut into four tenant slots by the platform, each slot a process started with
TENANT_GPU_FRACTION=0.24 (the Helm chart's `gpuSlots: 4`), which the platform's wrapper applies as

    torch.cuda.set_per_process_memory_fraction(float(os.environ["TENANT_GPU_FRACTION"]))   # 5.40 GiB

The other three slots are live: three other customers' TTS servers, ~5.3-5.6 GiB each (16.3 GiB).
This tenant renders with Parler-TTS Mini v1 (~880M parameters with its DAC 44.1 kHz codec, all in
bf16: 1.7 GiB), with a static KV cache (the team compiled the decoder), eight chapter sentences per
pass:

    model = ParlerTTSForConditionalGeneration.from_pretrained(name, torch_dtype=torch.bfloat16).to("cuda")
    model.generation_config.cache_implementation = "static"
    for batch in batched(sentences, batch_size=8):
        codes = model.generate(**inputs, max_length=2584)              # up to 30 s of audio each
        audio = model.audio_encoder.decode(codes)                      # DAC decoder, all 8 at once

Generation fits (weights 1.7 GiB + static cache 1.9 GiB).  The DAC decode does not: its decoder
upsamples 86 frames/s by 8 x 8 x 4 x 2 to 44.1 kHz, and at the 192-channel stage one activation of
8 clips x 30 s is 192 x 1.32M/2 samples x 8 x 2 bytes = 1.89 GiB; a residual unit keeps three of
those (with the 384-channel stage's 0.95 GiB output still held by the caller).  The second one is
refused by the slot's cap (5.40 GiB; 4.5 GiB allocated, 4.7 GiB reserved) -- and the card could not
give it either: with the co-tenants' 16.3 GiB, this process's context and its 4.7 GiB, 1.1 GiB is
free on the device.  The cap is not stale: it is the slot this tenant is sold, and the rest of the card is in
use by other customers.

An expert says first: the batch of eight 30-second clips decoded at once is too much for a 5.4 GiB
slot -- decode the codes one clip (or a few) at a time, or chunk the DAC decode along time
(activation memory is linear in batch x audio length: one clip at that stage is 0.24 GiB).
Generation may stay batched.  Wrong advice: raising the fraction (the device has no room: the other
slots hold it, and taking it would push another customer into OOM), stopping the other processes
(paying customers), expandable_segments / empty_cache (the static cache's segments were already given
back at an earlier refusal; 0.18 GiB is cached, the rest is in use: this is not fragmentation),
inference_mode (already on), gradient checkpointing (no training), a bigger GPU (the platform's slot
is the unit of sale).
"""
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# the platform's wrapper (tenant_slot.py), run before the tenant's code
torch.cuda.set_per_process_memory_fraction(float(os.environ.get("TENANT_GPU_FRACTION", "0.24")))

BF16 = torch.bfloat16
SAMPLE_RATE = 44100
FRAME_RATE = 86            # DAC 44 kHz: 512 samples per code frame
MAX_FRAMES = 2584          # max_length: ~30 s


def _params(module, prefix, sizes, dtype=BF16):
    for i, n in enumerate(sizes):
        setattr(module, "%s_%d" % (prefix, i), torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda")))


class T5Encoder(torch.nn.Module):            # flan-t5-large encoder: 341M
    def __init__(self):
        torch.nn.Module.__init__(self)
        _params(self, "embed_tokens", [32_899_072])
        for i in range(24):
            layer = torch.nn.Module()
            _params(layer, "w", [4_194_304, 8_650_752])            # attention q,k,v,o; gated MLP wi_0/wi_1/wo
            setattr(self, "block_%d" % i, layer)


class ParlerDecoder(torch.nn.Module):        # 24 layers, hidden 1024, 9 codebooks: ~540M with cross-attn
    def __init__(self):
        torch.nn.Module.__init__(self)
        _params(self, "embed", [9 * 1088 * 1024, 32_899_072])    # codebook embeddings, prompt embeddings
        self.layers = torch.nn.Module()
        for i in range(24):
            layer = torch.nn.Module()
            _params(layer, "w", [4_194_304, 4_194_304, 8_388_608])  # self-attn, cross-attn, MLP
            setattr(self.layers, str(i), layer)
        _params(self, "lm_heads", [9 * 1088 * 1024])


class WNConvTranspose1d(torch.nn.Module):
    """DAC's weight-normed transposed convolution: upsamples time by `stride`."""

    def __init__(self, cin, cout, stride):
        torch.nn.Module.__init__(self)
        self.cin, self.cout, self.stride = cin, cout, stride
        _params(self, "weight", [cin * cout * 2 * stride])

    def forward(self, x, batch, samples):
        return torch.empty(batch * self.cout * samples, dtype=BF16, device="cuda")


class WNConv1d(torch.nn.Module):
    def __init__(self, cin, cout, k):
        torch.nn.Module.__init__(self)
        self.cout = cout
        _params(self, "weight", [cin * cout * k])

    def forward(self, x, batch, samples):
        return torch.empty(batch * self.cout * samples, dtype=BF16, device="cuda")


class ResidualUnit(torch.nn.Module):
    def __init__(self, dim, dilation):
        torch.nn.Module.__init__(self)
        self.conv7 = WNConv1d(dim, dim, 7)
        self.conv1 = WNConv1d(dim, dim, 1)

    def forward(self, x, batch, samples):
        y = self.conv7(x, batch, samples)       # Snake1d -> dilated conv (snake is fused into it here)
        y = self.conv1(y, batch, samples)       # Snake1d -> 1x1 conv
        return y                                 # x + y: written into y


class DecoderBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        torch.nn.Module.__init__(self)
        self.cout, self.stride = cout, stride
        self.up = WNConvTranspose1d(cin, cout, stride)
        self.res1 = ResidualUnit(cout, 1)
        self.res2 = ResidualUnit(cout, 3)
        self.res3 = ResidualUnit(cout, 9)

    def forward(self, x, batch, samples):
        x = self.up(x, batch, samples)
        x = self.res1(x, batch, samples)
        x = self.res2(x, batch, samples)
        x = self.res3(x, batch, samples)
        return x


class DACDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv_in = WNConv1d(1024, 1536, 7)
        self.block_0 = DecoderBlock(1536, 768, 8)
        self.block_1 = DecoderBlock(768, 384, 8)
        self.block_2 = DecoderBlock(384, 192, 4)
        self.block_3 = DecoderBlock(192, 96, 2)
        self.conv_out = WNConv1d(96, 1, 7)

    def forward(self, z, batch, frames):
        x = self.conv_in(z, batch, frames)
        samples = frames
        for blk in (self.block_0, self.block_1, self.block_2, self.block_3):
            samples *= blk.stride
            x = blk(x, batch, samples)
        return self.conv_out(x, batch, samples)


class DAC(torch.nn.Module):                  # descript-audio-codec 44 kHz, 76M
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.quantizer = torch.nn.Module()
        _params(self.quantizer, "codebooks", [9 * 1024 * 8, 9 * 8 * 1024 * 2])
        _params(self, "encoder_w", [22_000_000])              # the encoder half (unused when decoding)
        self.decoder = DACDecoder()

    def decode(self, codes, batch, frames):
        z = torch.empty(batch * 1024 * frames, dtype=BF16, device="cuda")   # quantizer.from_codes
        return self.decoder(z, batch, frames)


class ParlerTTSForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.text_encoder = T5Encoder()
        self.decoder = ParlerDecoder()
        self.audio_encoder = DAC()

    def generate(self, batch, max_length):
        # static cache: 24 layers x (K, V) of batch x max_length x 1024 in bf16, made once per call
        cache = [torch.empty(batch * max_length * 1024, dtype=BF16, device="cuda") for _ in range(48)]
        enc = torch.empty(batch * 96 * 1024, dtype=BF16, device="cuda")          # prompt + description
        logits = torch.empty(batch * 9 * 1088 * 4, dtype=torch.uint8, device="cuda")
        codes = torch.empty(batch * 9 * max_length, dtype=torch.float32, device="cuda")   # int64 -> 8 bytes
        del cache, enc, logits
        return codes


def render(model, sentences, batch_size=8):
    out = []
    for start in range(0, len(sentences), batch_size):
        batch = sentences[start:start + batch_size]
        codes = model.generate(len(batch), max_length=MAX_FRAMES)
        audio = model.audio_encoder.decode(codes, len(batch), MAX_FRAMES)
        out.append(audio)
        del codes
    return out


def main():
    sentences = ["chapter 12, sentence %d" % i for i in range(64)]
    try:
        model = ParlerTTSForConditionalGeneration().eval()
        with torch.inference_mode():
            render(model, sentences, batch_size=8)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
