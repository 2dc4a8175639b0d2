"""tokenize_catalog.py -- a music-tech startup trains a MusicGen-style text-to-music LM on its licensed
production-music catalog (41,377 tracks at 44.1 kHz: full mixes, alternates and the 60/30/15 s cut-downs
that libraries ship).  Step one is turning every track into codec tokens with Descript's DAC 44 kHz model
(dac_44khz: 76M parameters, 0.29 GB in float32; encoder 64 channels at full rate, strides 2/4/8/8, 9
codebooks of 1024 at 86 Hz).  The job runs on an AWS g5.2xlarge (one NVIDIA A10G, 24 GB: 23,028 MiB), one
track at a time, as the engineer wrote it from the "programmatic usage" section of the DAC README:

    model = dac.DAC.load(dac.utils.download(model_type="44khz")).to("cuda").eval()

    def tokenize(path):
        with torch.inference_mode():
            signal = AudioSignal(path).to_mono()         # catalog masters: 44.1 kHz stereo WAV
            signal.to(model.device)
            x = model.preprocess(signal.audio_data, signal.sample_rate)
            z, codes, latents, _, _ = model.encode(x)     # [1, 9, frames]
            return codes.cpu()

    for row in manifest[start:]:
        np.save(out / f"{row.track_id}.npy", tokenize(row.path).numpy())

(The README's snippet says "Encode audio signal as one long file (may run out of GPU memory on long files)"
and, right below it, "Alternatively, use the `compress` and `decompress` functions to compress long
files"; the engineer kept the first lines.)  Pop, trailer and corporate tracks are 0:15-4:35 and the first
18,000 tracks went through over two nights; the log shows a 4:35 track peaking at about 12 GiB allocated,
and nobody read it as a slope.  After a spot interruption the job resumes at track 18,204 and, 27 tracks
later, reaches the ambient library: "Nightfall Drone Suite (Full Length)", 23:41 (62.7M samples).  It dies
in the encoder's first residual unit: the first conv's output, 64 channels x 62.7M samples x 4 bytes =
14.9 GiB, is live, and its Snake activation asks for a second 14.9 GiB with 5.05 GiB free and 1.24 GiB
cached (the rest of segments that earlier, shorter tracks left and that now hold the 0.23 GiB input).
Nothing else is on the card: the codec is 0.29 GB.

An expert: the encoder's activations are linear in the length of the file, about 256 bytes per input
sample per live activation, and nn.Sequential keeps four of them live at the peak (the block's input, the
residual unit's input, the Snake output, the conv output), so whole-file encoding on this card tops out
near 8 minutes whatever else is done; this track needs ~60 GiB.  Encode long files in windows:
`model.compress(signal, win_duration=...)` (DAC's own chunked path, under no_grad, which stitches the codes;
memory is fixed by the window, ~1.3 GiB for 30 s), or cut the audio into 30-60 s segments before encoding
(the LM trains on 30 s crops anyway), so the catalog's longest file (a 74-minute live album side further
down the manifest) costs what a 3-minute one does.
Wrong first advice: a smaller batch (one mono track, batch 1), inference_mode / no_grad (already on: no
graph is kept), gradient checkpointing, an 8-bit optimizer, LoRA or ZeRO (nothing trains),
expandable_segments / max_split_size_mb / empty_cache (one request of 14.9 GiB with 5.05 GiB free and 1.24
GiB cached: no hole to close, and two more tensors that size follow), quantizing or offloading the
76M-parameter codec (0.29 GB), fp16/autocast (7.5 GiB tensors, four live: 30 GiB, still does not fit on
24 GB, and the catalog's tokens would no longer come from one fp32 codec), flash attention (the codec has
no attention), a bigger GPU (an 80 GB A100 tops out near 30 minutes; the 74-minute file needs ~190 GiB:
memory grows with the file, the card does not).
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as part of torch's files so that the failing Python line stays the program's
# own: torch.nn.Sequential, torch.nn.ConvTranspose1d (parameters only: the tokenizer never decodes),
# torch.nn.utils.weight_norm, torch.nn.functional.pad, and the kernel TorchScript fuses dac's scripted
# snake() into (x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2): one output the size of x).
_NN_GAPS = """
class Sequential(Module):
    def __init__(self, *mods):
        Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ConvTranspose1d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(in_channels * out_channels * kernel_size * 4, device=device))
        self.bias = Parameter(torch.empty(out_channels * 4, device=device))


def weight_norm(module, name="weight", dim=0):
    return module
"""
_F_GAPS = """
def pad(input, pad, mode="constant", value=0.0):
    left, right = pad
    bytes_per_sample = input.element_size() * input.shape[0] * input.shape[1]
    out = torch.empty(input.nbytes + (left + right) * bytes_per_sample, device=input.device)
    out.shape = (input.shape[0], input.shape[1], input.shape[2] + left + right)
    return derive(out, input)


def _fused_snake(x, alpha):
    out = torch.empty(x.nbytes, device=x.device)
    out.shape = x.shape
    return derive(out, x)
"""
if not hasattr(torch.nn, "Sequential"):
    import torch.nn.modules.module as _mm
    _ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
    exec(compile(_NN_GAPS, _mm.__file__, "exec"), _ns)
    torch.nn.Sequential = _ns["Sequential"]
    torch.nn.ConvTranspose1d = _ns["ConvTranspose1d"]
    if not hasattr(torch.nn, "utils"):
        class _Utils(object):
            pass
        torch.nn.utils = _Utils()
    torch.nn.utils.weight_norm = _ns["weight_norm"]
if not hasattr(torch.nn.functional, "pad"):
    from torch.autograd._graph import derive as _derive
    _ns = {"torch": torch, "derive": _derive}
    exec(compile(_F_GAPS, torch.nn.functional.__file__, "exec"), _ns)
    torch.nn.functional.pad = _ns["pad"]
    torch.nn.functional._fused_snake = _ns["_fused_snake"]
if not hasattr(torch.Tensor, "element_size"):
    torch.Tensor.element_size = lambda self: 4
# The stand-in's tensors are sized in bytes; a conv's output gets its shape from the input's here, and (as in
# PyTorch) saves nothing for backward when autograd is off: the stand-in's conv always keeps its input.
_orig_conv_forward = torch.nn.Conv1d._conv_forward


def _conv_forward_shaped(self, input, weight, bias):
    out = _orig_conv_forward(self, input, weight, bias)
    if not torch.is_grad_enabled():
        out._saved = None
    b, _, t = input.shape
    out.shape = (b, self.out_channels, t // max(int(self.stride), 1))
    return out


torch.nn.Conv1d._conv_forward = _conv_forward_shaped
# ----

nn = torch.nn
F = torch.nn.functional
DEVICE = "cuda"


# ---------------------------------------------------------------- dac/nn/layers.py
def WNConv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1):
    return nn.utils.weight_norm(nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                          device=DEVICE))


def WNConvTranspose1d(in_channels, out_channels, kernel_size, stride=1, padding=0):
    return nn.utils.weight_norm(nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride,
                                                   padding=padding, device=DEVICE))


def snake(x, alpha):
    # @torch.jit.script in dac: x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
    return F._fused_snake(x, alpha)


class Snake1d(nn.Module):
    def __init__(self, channels):
        nn.Module.__init__(self)
        self.alpha = nn.Parameter(torch.empty(channels * 4, device=DEVICE))

    def forward(self, x):
        return snake(x, self.alpha)


# ---------------------------------------------------------------- dac/model/dac.py
class ResidualUnit(nn.Module):
    def __init__(self, dim=16, dilation=1):
        nn.Module.__init__(self)
        pad = ((7 - 1) * dilation) // 2
        self.block = nn.Sequential(
            Snake1d(dim),
            WNConv1d(dim, dim, kernel_size=7, dilation=dilation, padding=pad),
            Snake1d(dim),
            WNConv1d(dim, dim, kernel_size=1),
        )

    def forward(self, x):
        y = self.block(x)
        pad = (x.shape[-1] - y.shape[-1]) // 2
        if pad > 0:
            x = x[..., pad:-pad]
        out = torch.empty(x.nbytes, device=x.device)   # x + y
        out.shape = x.shape
        return out


class EncoderBlock(nn.Module):
    def __init__(self, dim=16, stride=1):
        nn.Module.__init__(self)
        self.block = nn.Sequential(
            ResidualUnit(dim // 2, dilation=1),
            ResidualUnit(dim // 2, dilation=3),
            ResidualUnit(dim // 2, dilation=9),
            Snake1d(dim // 2),
            WNConv1d(dim // 2, dim, kernel_size=2 * stride, stride=stride, padding=math.ceil(stride / 2)),
        )

    def forward(self, x):
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, d_model=64, strides=(2, 4, 8, 8), d_latent=64):
        nn.Module.__init__(self)
        block = [WNConv1d(1, d_model, kernel_size=7, padding=3)]
        for stride in strides:
            d_model *= 2
            block += [EncoderBlock(d_model, stride=stride)]
        block += [Snake1d(d_model), WNConv1d(d_model, d_latent, kernel_size=3, padding=1)]
        self.block = nn.Sequential(*block)
        self.enc_dim = d_model

    def forward(self, x):
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, input_dim=16, output_dim=8, stride=1):
        nn.Module.__init__(self)
        self.block = nn.Sequential(
            Snake1d(input_dim),
            WNConvTranspose1d(input_dim, output_dim, 2 * stride, stride=stride),
            ResidualUnit(output_dim, dilation=1),
            ResidualUnit(output_dim, dilation=3),
            ResidualUnit(output_dim, dilation=9),
        )


class Decoder(nn.Module):
    def __init__(self, input_channel, channels, rates, d_out=1):
        nn.Module.__init__(self)
        layers = [WNConv1d(input_channel, channels, kernel_size=7, padding=3)]
        for i, stride in enumerate(rates):
            layers += [DecoderBlock(channels // 2 ** i, channels // 2 ** (i + 1), stride)]
        output_dim = channels // 2 ** len(rates)
        layers += [Snake1d(output_dim), WNConv1d(output_dim, d_out, kernel_size=7, padding=3)]
        self.model = nn.Sequential(*layers)


class VectorQuantize(nn.Module):
    def __init__(self, input_dim, codebook_size, codebook_dim):
        nn.Module.__init__(self)
        self.in_proj = WNConv1d(input_dim, codebook_dim, kernel_size=1)
        self.out_proj = WNConv1d(codebook_dim, input_dim, kernel_size=1)
        self.codebook = nn.Parameter(torch.empty(codebook_size * codebook_dim * 4, device=DEVICE))

    def forward(self, z):
        z_e = self.in_proj(z)                          # [B, 8, frames]
        b, _, t = z.shape
        indices = torch.empty(b * t * 8, device=z.device)   # int64 codes: argmax over the codebook
        del z_e
        z_q = torch.empty(8 * b * t * 4, device=z.device)
        z_q.shape = (b, 8, t)
        z_q = self.out_proj(z_q)                       # [B, 1024, frames]
        return z_q, indices


class ResidualVectorQuantize(nn.Module):
    def __init__(self, input_dim=512, n_codebooks=9, codebook_size=1024, codebook_dim=8):
        nn.Module.__init__(self)
        self.n_codebooks = n_codebooks
        for i in range(n_codebooks):
            setattr(self, "q%d" % i, VectorQuantize(input_dim, codebook_size, codebook_dim))

    def forward(self, z, n_quantizers=None):
        z_q = torch.empty(z.nbytes, device=z.device)
        z_q.shape = z.shape
        residual = z
        codebook_indices = []
        for i in range(self.n_codebooks):
            z_q_i, indices_i = getattr(self, "q%d" % i)(residual)
            residual = torch.empty(z.nbytes, device=z.device)      # residual - z_q_i
            residual.shape = z.shape
            codebook_indices.append(indices_i)
        b, _, t = z.shape
        codes = torch.empty(b * self.n_codebooks * t * 8, device=z.device)   # torch.stack(codebook_indices, 1)
        codes.shape = (b, self.n_codebooks, t)
        del codebook_indices
        return z_q, codes, None, 0.0, 0.0


class DAC(nn.Module):
    def __init__(self, encoder_dim=64, encoder_rates=(2, 4, 8, 8), latent_dim=None, decoder_dim=1536,
                 decoder_rates=(8, 8, 4, 2), n_codebooks=9, codebook_size=1024, codebook_dim=8,
                 sample_rate=44100):
        nn.Module.__init__(self)
        if latent_dim is None:
            latent_dim = encoder_dim * (2 ** len(encoder_rates))
        self.sample_rate = sample_rate
        self.device = DEVICE
        self.hop_length = 1
        for r in encoder_rates:
            self.hop_length *= r
        self.encoder = Encoder(encoder_dim, encoder_rates, latent_dim)
        self.quantizer = ResidualVectorQuantize(latent_dim, n_codebooks, codebook_size, codebook_dim)
        self.decoder = Decoder(latent_dim, decoder_dim, decoder_rates)

    def preprocess(self, audio_data, sample_rate):
        if sample_rate is None:
            sample_rate = self.sample_rate
        assert sample_rate == self.sample_rate
        length = audio_data.shape[-1]
        right_pad = math.ceil(length / self.hop_length) * self.hop_length - length
        audio_data = nn.functional.pad(audio_data, (0, right_pad))
        return audio_data

    def encode(self, audio_data, n_quantizers=None):
        z = self.encoder(audio_data)
        z, codes, latents, commitment_loss, codebook_loss = self.quantizer(z, n_quantizers)
        return z, codes, latents, commitment_loss, codebook_loss

    @classmethod
    def load(cls, path):
        # dac.DAC.load: torch.load(path, map_location="cpu"), the metadata's kwargs, load_state_dict
        return cls()


# ---------------------------------------------------------------- audiotools.AudioSignal (host side)
class AudioSignal(object):
    def __init__(self, path, duration_s, sample_rate=44100):
        self.path = path
        self.sample_rate = sample_rate
        self.num_samples = int(round(duration_s * sample_rate))
        self.num_channels = 2
        self.audio_data = None          # numpy on the host until .to(device)

    def to_mono(self):
        self.num_channels = 1
        return self

    def to(self, device):
        t = torch.empty(self.num_samples, dtype=torch.float32, device=device)   # [1, 1, samples] float32
        t.shape = (1, self.num_channels, self.num_samples)
        self.audio_data = t
        return self


# ---------------------------------------------------------------- the job
# resume point after the spot interruption: catalog rows 18,204 on (id, title, duration m:ss)
MANIFEST = [
    ("PMC-018204", "Bright Horizons (Main)", "2:41"), ("PMC-018205", "Bright Horizons (60s)", "1:00"),
    ("PMC-018206", "Bright Horizons (30s)", "0:30"), ("PMC-018207", "Bright Horizons (Underscore)", "2:38"),
    ("PMC-018208", "Neon Commute (Main)", "3:12"), ("PMC-018209", "Neon Commute (Alt Mix No Drums)", "3:12"),
    ("PMC-018210", "Neon Commute (15s)", "0:15"), ("PMC-018211", "Glasshouse (Main)", "4:05"),
    ("PMC-018212", "Glasshouse (Stripped)", "4:02"), ("PMC-018213", "Runway Pulse (Extended)", "4:16"),
    ("PMC-018214", "Runway Pulse (Main)", "3:30"), ("PMC-018215", "Runway Pulse (30s)", "0:30"),
    ("PMC-018216", "Kite Festival (Main)", "2:07"), ("PMC-018217", "Kite Festival (60s)", "1:00"),
    ("PMC-018218", "Iron Choir (Trailer Main)", "2:55"), ("PMC-018219", "Iron Choir (Trailer Build)", "1:48"),
    ("PMC-018220", "Iron Choir (Hits and Stingers)", "1:12"), ("PMC-018221", "Low Tide (Main)", "4:26"),
    ("PMC-018222", "Low Tide (Piano Only)", "4:24"), ("PMC-018223", "Satellite Lullaby (Main)", "3:58"),
    ("PMC-018224", "Satellite Lullaby (30s)", "0:30"), ("PMC-018225", "Dust and Chrome (Main)", "3:44"),
    ("PMC-018226", "Dust and Chrome (Alt No Vox)", "3:44"), ("PMC-018227", "Harbour Lights (Main)", "4:35"),
    ("PMC-018228", "Harbour Lights (60s)", "1:00"), ("PMC-018229", "Nightfall (Main)", "3:20"),
    ("PMC-018230", "Nightfall (Underscore)", "3:20"),
    ("PMC-018231", "Nightfall Drone Suite (Full Length)", "23:41"),
    ("PMC-018232", "Nightfall (30s)", "0:30"),
]
TOTAL_TRACKS = 41377


def seconds(mmss):
    m, s = mmss.split(":")
    return int(m) * 60 + int(s)


def main():
    print("loading dac 44khz: weights_44khz_8kbps_0.0.1.pth")
    model = DAC.load("/home/ubuntu/.cache/descript/dac/weights_44khz_8kbps_0.0.1.pth").to(DEVICE)
    model.eval()
    n_params = sum(p.nbytes for p in model.parameters()) / 4
    print("DAC: %.1fM parameters, hop %d, %d codebooks, %.1f Hz frames" % (
        n_params / 1e6, model.hop_length, model.quantizer.n_codebooks, model.sample_rate / model.hop_length))

    def tokenize(path, duration_s):
        with torch.inference_mode():
            signal = AudioSignal(path, duration_s).to_mono()
            signal.to(model.device)
            x = model.preprocess(signal.audio_data, signal.sample_rate)
            z, codes, latents, _, _ = model.encode(x)
            return codes  # .cpu()

    for i, (track_id, title, dur) in enumerate(MANIFEST):
        row = 18204 + i
        torch.cuda.reset_peak_memory_stats()
        codes = tokenize("/mnt/catalog/masters/%s.wav" % track_id, seconds(dur))
        # np.save(out / f"{track_id}.npy", codes.cpu().numpy())
        print("[%d/%d] %s %-40s %5s -> codes %s  (peak allocated %.2f GiB)" % (
            row, TOTAL_TRACKS, track_id, title, dur, "x".join(str(s) for s in codes.shape),
            torch.cuda.max_memory_allocated() / 2.0 ** 30))
        del codes


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
