"""transcribe.py -- batch transcription of a podcast archive with Whisper large-v3 (1.55B parameters)
on a laptop's 8 GiB GPU.  The checkpoint's safetensors are fp16 (3.1 GB), but the pipeline is built
without a dtype, so transformers materialises every weight in float32 (5.7 GiB):

    asr = pipeline("automatic-speech-recognition", model="openai/whisper-large-v3",
                   device="cuda:0", chunk_length_s=30, batch_size=4)        # no torch_dtype
    for episode in episodes:
        text = asr(episode)["text"]                # generate() runs under torch.no_grad()

The load goes through (5.7 GiB of weights, 1.8 GiB left).  The first batch of four 30 s chunks then
runs the encoder and starts decoding: every decoder layer builds its cross-attention keys and
values over the 1500 encoder frames (fp32: 58 MiB per layer), and the allocation fails in layer 28
of 32, right after the load.  In fp16 the weights are 2.9 GiB and every activation half the size:
the same batch fits with 3.5 GiB to spare.  An expert: pipeline(..., torch_dtype=torch.float16); a
smaller batch would also get through but keeps the wasted 2.9 GiB.  Only 0.16 GiB is cached unused
(remainders of the allocator's 20 MiB segments that hold the 6 MiB matrices), nothing grows, no
other process is on the card, and autograd is already off.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def linear(n_in, n_out):
    # from_pretrained without torch_dtype: the parameter is created in the default dtype, float32
    return torch.nn.Parameter(torch.empty(n_in * n_out * 4, device="cuda"))


class EncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q, self.k, self.v, self.o = (linear(1280, 1280) for _ in range(4))
        self.fc1, self.fc2 = linear(1280, 5120), linear(5120, 1280)

    def forward(self, h):
        # under no_grad nothing is saved: the layer's temporaries come and go
        mlp = torch.empty(4 * 1500 * 5120 * 4, device="cuda")
        out = torch.empty(4 * 1500 * 1280 * 4, device="cuda")
        del mlp
        return out


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q, self.k, self.v, self.o = (linear(1280, 1280) for _ in range(4))
        self.xq, self.xk, self.xv, self.xo = (linear(1280, 1280) for _ in range(4))
        self.fc1, self.fc2 = linear(1280, 5120), linear(5120, 1280)

    def forward(self, tok, enc, cache):
        # first decoding step: this layer's cross-attention keys and values over the encoder output
        cross_k = torch.empty(4 * 1500 * 1280 * 4, device="cuda")
        cross_v = torch.empty(4 * 1500 * 1280 * 4, device="cuda")
        cache.append((cross_k, cross_v))
        return tok


class WhisperForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv = linear(128 * 3, 1280 * 2)
        self.embed_positions = linear(1500, 1280)
        self.embed_tokens = linear(51866, 1280)
        for i in range(32):
            setattr(self, "enc%d" % i, EncoderLayer())
        for i in range(32):
            setattr(self, "dec%d" % i, DecoderLayer())

    def encode(self, features):
        h = torch.empty(4 * 1500 * 1280 * 4, device="cuda")
        for i in range(32):
            h = getattr(self, "enc%d" % i)(h)
        return h

    def generate(self, features, max_new_tokens=444):
        with torch.no_grad():
            enc = self.encode(features)
            cache = []
            tok = torch.empty(4 * 1, device="cuda")
            for i in range(32):
                tok = getattr(self, "dec%d" % i)(tok, enc, cache)
            return tok


def main():
    model = WhisperForConditionalGeneration().eval()           # the pipeline's model, on cuda:0
    for episode in range(40):
        for chunk_batch in range(12):
            features = torch.empty(4 * 128 * 3000 * 4, device="cuda")   # log-mel, 4 x 30 s
            model.generate(features)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
