"""prewarm_prompts.py -- the deploy step of a call-center IVR text-to-speech service: before the pod takes
traffic, it synthesizes every prompt of the IVR flows (412 prompts, 2-8 s each) through the service's
own cached function, so that callers hear cached audio.  In-house VITS (33M parameters, fp32,
22.05 kHz, HiFi-GAN V1 decoder) on one A10G (22.5 GiB):

    # tts_service.py
    model = SynthesizerTrn(**hps.model).cuda().eval()       # eval() -- but no torch.no_grad / inference_mode
    @functools.lru_cache(maxsize=2048)
    def synthesize(text, voice="agent_f1"):
        wav = model.infer(tokenize(text), sid=VOICES[voice], noise_scale=0.667)[0]
        return wav[0, 0]                                     # the handler calls .cpu().numpy() when it answers

    # prewarm_prompts.py
    for prompt in flows.all_prompts():
        synthesize(prompt)

The model's parameters still require grad (eval() only changes dropout/batch-norm), so every
inference records an autograd graph, and the cached waveform is its output: it keeps its grad_fn,
and with it every activation the HiFi-GAN decoder saved for a backward pass that will never run --
38 tensors per upsampling stage (each MRF resblock's leaky-ReLU and conv inputs), ~0.35 GB per second
of audio, about 1.7 GB for a 5-second prompt, where the waveform itself is 0.4 MB.  The cache is
bounded by count (2048), not bytes; after ten prompts it holds 21 GB of graphs and the eleventh
synthesis fails in the decoder, asking for a few MiB.  (About 1 GiB is reserved but unallocated: the
tails of the 20 MiB segments the allocator cuts the mid-size saved tensors from -- a by-product, not
the cause.)  The pod crash-loops at every deploy.

An expert says first: run inference without autograd -- `@torch.inference_mode()` on synthesize (or
model.requires_grad_(False)) -- and cache the waveform detached on the host (`wav.cpu()`): what
the cache holds is the graphs, not the audio.  Wrong advice: a smaller batch (one prompt at a time
already), empty_cache / expandable_segments (the memory is referenced), gradient checkpointing
(there is no backward), quantization or a bigger GPU (33M parameters; the leak would fill any card),
restarting the process (it is the restart that crash-loops).
"""
import functools
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SR = 22050
HOP = 256
F32 = torch.float32


def _param(module, name, n):
    setattr(module, name, torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda")))


class TextEncoder(torch.nn.Module):                     # enc_p: 6 transformer layers, hidden 192
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(6):
            _param(self, "layer_%d" % i, 620_000)

    def forward(self, ids, frames):
        h = torch.empty(192 * 2 * frames, dtype=F32, device="cuda")          # m_p, logs_p expanded
        h._saved = (torch.empty(192 * 4 * len(ids), dtype=F32, device="cuda"),)
        return h


class Flow(torch.nn.Module):                            # 4 residual coupling layers (reverse)
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(4):
            _param(self, "coupling_%d" % i, 1_100_000)

    def forward(self, z_p, frames):
        z = torch.empty(192 * frames, dtype=F32, device="cuda")
        z._saved = (z_p,) + tuple(torch.empty(192 * frames * 2, dtype=F32, device="cuda") for _ in range(8))
        return z


class UpsampleConv(torch.nn.Module):                    # ConvTranspose1d(c_in, c_out, 2*r, stride=r)
    def __init__(self, cin, cout, rate):
        torch.nn.Module.__init__(self)
        self.cout, self.rate = cout, rate
        _param(self, "weight", cin * cout * 2 * rate)

    def forward(self, x, samples):
        y = torch.empty(self.cout * samples, dtype=F32, device="cuda")
        y._saved = (x,)
        return y


class ResBlock1(torch.nn.Module):                       # HiFi-GAN MRF resblock: 3 dilations x (conv, conv)
    def __init__(self, ch, k):
        torch.nn.Module.__init__(self)
        self.ch = ch
        _param(self, "convs1", 3 * ch * ch * k)
        _param(self, "convs2", 3 * ch * ch * k)

    def forward(self, x, samples):
        # each of the 6 convs saves its leaky-ReLU'd input; each leaky ReLU saves its input -> 11 + output
        saved = tuple(torch.empty(self.ch * samples, dtype=F32, device="cuda") for _ in range(11))
        y = torch.empty(self.ch * samples, dtype=F32, device="cuda")
        y._saved = (x,) + saved
        return y


class Generator(torch.nn.Module):                       # dec: HiFi-GAN V1, upsample 8, 8, 2, 2
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv_pre = UpsampleConv(192, 512, 1)
        chans = [(512, 256, 8), (256, 128, 8), (128, 64, 2), (64, 32, 2)]
        self.ups = torch.nn.Module()
        self.resblocks = torch.nn.Module()
        for i, (cin, cout, r) in enumerate(chans):
            setattr(self.ups, str(i), UpsampleConv(cin, cout, r))
            for j, k in enumerate((3, 7, 11)):
                setattr(self.resblocks, str(3 * i + j), ResBlock1(cout, k))

    def forward(self, z, frames):
        x = self.conv_pre(z, frames)
        samples = frames
        for i in range(4):
            up = getattr(self.ups, str(i))
            samples *= up.rate
            x = up(x, samples)
            xs = [getattr(self.resblocks, str(3 * i + j))(x, samples) for j in range(3)]
            x = torch.empty(up.cout * samples, dtype=F32, device="cuda")    # (r1 + r2 + r3) / 3
            x._saved = tuple(xs)
        wav = torch.empty(samples, dtype=F32, device="cuda")                  # conv_post + tanh
        wav._saved = (x,)
        return wav


class SynthesizerTrn(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.enc_p = TextEncoder()
        self.flow = Flow()
        self.dec = Generator()
        self.enc_q = torch.nn.Module()                  # posterior encoder: training only, loaded with the rest
        _param(self.enc_q, "wn", 7_000_000)
        self.dp = torch.nn.Module()                     # stochastic duration predictor
        _param(self.dp, "flows", 1_200_000)
        _param(self, "emb_g", 4 * 256)

    def forward(self, ids, seconds):
        frames = int(seconds * SR / HOP)
        h = self.enc_p(ids, frames)
        z = self.flow(h, frames)
        wav = self.dec(z, frames)
        return wav

    def infer(self, ids, seconds):
        return self(ids, seconds)


model = SynthesizerTrn().cuda().eval()


@functools.lru_cache(maxsize=2048)
def synthesize(text, voice="agent_f1"):
    seconds = 2.0 + (len(text) % 61) / 10.0            # the prompt's duration follows its text: 2-8 s
    wav = model.infer(text.split(), seconds)
    return wav.view(-1)                                 # wav[0, 0]: a view, keeps the output (and its graph)


PROMPTS = ["flow %d prompt %d: %s" % (f, p, "please hold while we connect you " * (1 + (7 * p + f) % 5))
           for f in range(12) for p in range(35)][:412]


def main():
    try:
        for i, prompt in enumerate(PROMPTS):
            synthesize(prompt)
            sys.stderr.write("prewarm: %d/%d cached\n" % (i + 1, len(PROMPTS)))
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
