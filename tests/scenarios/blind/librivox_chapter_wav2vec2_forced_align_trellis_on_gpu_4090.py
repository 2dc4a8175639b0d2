"""align_chapters.py -- a small studio builds a single-narrator TTS dataset (for a VITS / XTTS fine-tune)
from public-domain LibriVox recordings: each chapter's MP3 plus its Project Gutenberg text is force-aligned
with wav2vec2 and cut into sentence clips.  The aligner is torchaudio's "Forced Alignment with Wav2Vec2"
tutorial, kept almost verbatim (get_trellis / backtrack / merge_repeats in Python), with
WAV2VEC2_ASR_LARGE_LV60K_960H (315M parameters, 1.2 GB in float32) on the workstation's RTX 4090 (24 GB):

    bundle = torchaudio.pipelines.WAV2VEC2_ASR_LARGE_LV60K_960H
    model = bundle.get_model().to(device)
    labels = bundle.get_labels()
    with torch.inference_mode():
        # the whole chapter at once ran out of memory in the transformer, so: 30 s windows
        emissions = [model(waveform[:, s:s + 30 * sr].to(device))[0] for s in range(0, n, 30 * sr)]
        emission = torch.log_softmax(torch.cat(emissions, dim=1), dim=-1)[0]
    tokens = [dictionary[c] for c in transcript]            # "CHAPTER|ONE|..." with '|' between words

    def get_trellis(emission, tokens, blank_id=0):
        num_frame = emission.size(0)
        num_tokens = len(tokens)
        trellis = torch.zeros((num_frame, num_tokens), device=emission.device)   # (*)
        trellis[1:, 0] = torch.cumsum(emission[1:, blank_id], 0)
        ...
        for t in range(num_frame - 1):
            trellis[t + 1, 1:] = torch.maximum(trellis[t, 1:] + emission[t, blank_id],
                                               trellis[t, :-1] + emission[t, tokens[1:]])

(*) the tutorial builds the trellis on the CPU (torch.zeros without a device, after emission.cpu());
the Python loop over every frame took most of an hour per chapter there, so the team kept the emission on
the GPU and added device=emission.device.  Chapters so far were 10-25 minutes: a 25-minute chapter is
about 75,000 frames x 23,000 characters, a 6.9 GB trellis, and went through.  Tonight's batch has a
58 min 03 s chapter (55,728,000 samples at 16 kHz: 174,033 frames of 20 ms over its 30 s windows) whose
text is 9,412 words, 53,611 tokens with the '|' separators.  The emission (174,033 x 29 floats, 20 MB) is
computed window by window without trouble (as was the 20-minute chapter before it, a 4.4 GB trellis);
then get_trellis asks for one float32 matrix of 174,033 x 53,611 = 37.3 GB (34.8 GiB) on a card with
24 GB of which the model holds 1.2 GB.

An expert: the trellis is frames x characters, so it grows with the square of the chapter's length, and
nothing else here matters (the model, the emission and the windows are small).  Do not align an hour as
one problem: split the chapter first (silence / VAD or the chapter's paragraph breaks, with the text
matched to each piece, or a coarse first pass that finds anchor words) and align pieces of a few minutes,
each a trellis of tens of MB; torchaudio.functional.forced_align on pieces does the same in C++/CUDA.
Wrong first advice: a smaller batch (there is one chapter, one trellis), mixed precision (a float16
trellis is still 17 GiB and, worse, accumulated log-probabilities over 170,000 frames reach magnitudes of
1e4-1e5 and overflow float16's 65,504 to -inf, wrecking the alignment), gradient checkpointing or
inference_mode (nothing trains; the emission already runs under inference_mode and the trellis is
plain zeros), expandable_segments / empty_cache (one request is 1.4 times the card: nothing is
fragmented or cached away), quantizing or offloading the 315M-parameter model, a bigger GPU (an 80 GB card
takes this chapter and fails at the next 90-minute one: the matrix is quadratic in duration).
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.zeros and torch.cat (C functions in PyTorch, no Python frame of their own).
# Compiled as part of torch's file so that the failing line of the program stays the program's own.
_GAPS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)


def cat(tensors, dim=0):
    dtype = tensors[0].dtype
    n = sum(t.nbytes for t in tensors) // torch._ITEMSIZE[dtype]
    return torch.empty(n, dtype=dtype, device=tensors[0].device)


def log_softmax(input, dim=-1):
    return torch.empty(input.nbytes // torch._ITEMSIZE[input.dtype], dtype=input.dtype, device=input.device)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
for _name in ("zeros", "cat", "log_softmax"):
    if not hasattr(torch, _name):
        setattr(torch, _name, _ns[_name])
# ----

SR = 16000
DEVICE = "cuda"


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=DEVICE), requires_grad=False)


class ConvLayerBlock(torch.nn.Module):
    def __init__(self, cin, cout, k, stride):
        torch.nn.Module.__init__(self)
        self.conv = _param(cin * cout * k)
        self.layer_norm = _param(2 * cout)
        self.stride = stride


class EncoderLayer(torch.nn.Module):
    def __init__(self, d=1024, ff=4096):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * d * d + 4 * d)
        self.layer_norm = _param(2 * d)
        self.feed_forward = _param(2 * d * ff + d + ff)
        self.final_layer_norm = _param(2 * d)


class Wav2Vec2Model(torch.nn.Module):
    """torchaudio.models.Wav2Vec2Model as wav2vec2_large_lv60k builds it: 7 conv layers (512 channels), a
    1024-wide transformer of 24 layers, and the CTC head (aux) over 29 labels."""
    CONV = [(1, 512, 10, 5)] + [(512, 512, 3, 2)] * 4 + [(512, 512, 2, 2)] * 2

    def __init__(self, num_labels=29, d=1024, layers=24):
        torch.nn.Module.__init__(self)
        for i, (cin, cout, k, s) in enumerate(self.CONV):
            setattr(self, "conv%d" % i, ConvLayerBlock(cin, cout, k, s))
        self.feature_projection = _param(512 * d + d + 2 * 512)
        self.pos_conv_embed = _param(d * (d // 16) * 128 + d)
        for i in range(layers):
            setattr(self, "layer%d" % i, EncoderLayer(d))
        self.aux = _param(d * num_labels + num_labels)
        self.d = d
        self.layers = layers
        self.num_labels = num_labels

    def forward(self, waveform, num_samples):
        # the feature extractor: each conv's output in float32 (512 x frames), the previous one freed
        x = waveform
        frames = num_samples
        for cin, cout, k, s in self.CONV:
            frames = (frames - k) // s + 1
            y = torch.empty(cout * frames, dtype=torch.float32, device=DEVICE)
            x = y
        t = frames
        hidden = torch.empty(t * self.d, dtype=torch.float32, device=DEVICE)
        del x, y
        for i in range(self.layers):
            scores = torch.empty(16 * t * t, dtype=torch.float32, device=DEVICE)    # 16 heads, t x t
            ff = torch.empty(t * 4096, dtype=torch.float32, device=DEVICE)
            del scores, ff
        logits = torch.empty(t * self.num_labels, dtype=torch.float32, device=DEVICE)
        del hidden
        return logits, t


class Bundle(object):
    """torchaudio.pipelines.Wav2Vec2ASRBundle (WAV2VEC2_ASR_LARGE_LV60K_960H)."""
    _sample_rate = SR

    @property
    def sample_rate(self):
        return self._sample_rate

    def get_model(self):
        return Wav2Vec2Model()

    def get_labels(self):
        return ("-", "|", "E", "T", "A", "O", "N", "I", "H", "S", "R", "D", "L", "U", "M", "W", "C", "F", "G",
                "Y", "P", "B", "V", "K", "'", "X", "J", "Q", "Z")


class pipelines(object):
    WAV2VEC2_ASR_LARGE_LV60K_960H = Bundle()


CHAPTERS = [
    # (file, duration in s, words, tokens with '|' separators) -- the batch of tonight
    ("middlemarch_book8_ch80_ch81.mp3", 19 * 60 + 41, 3301, 18732),
    ("middlemarch_book8_finale.mp3", 58 * 60 + 3, 9412, 53611),
]


def load_chapter(path, seconds):
    """torchaudio.load(path) + resample to 16 kHz: the waveform stays in host memory."""
    return int(seconds * SR)


def get_trellis(emission, num_frame, tokens, blank_id=0):
    num_tokens = len(tokens)
    trellis = torch.zeros((num_frame, num_tokens), device=DEVICE)
    # trellis[1:, 0] = torch.cumsum(emission[1:, blank_id], 0)
    # trellis[0, 1:] = -float("inf")
    # trellis[-num_tokens + 1:, 0] = float("inf")
    # for t in range(num_frame - 1):
    #     trellis[t + 1, 1:] = torch.maximum(trellis[t, 1:] + emission[t, blank_id],
    #                                        trellis[t, :-1] + emission[t, tokens[1:]])
    return trellis


def align(model, labels, path, seconds, num_tokens):
    num_samples = load_chapter(path, seconds)
    window = 30 * SR
    with torch.inference_mode():
        emissions, num_frame = [], 0
        for start in range(0, num_samples, window):
            n = min(window, num_samples - start)
            if n < 400:
                break
            chunk = torch.empty(n, dtype=torch.float32, device=DEVICE)          # waveform[:, s:s+w].to(device)
            logits, t = model(chunk, n)
            emissions.append(logits)
            num_frame += t
            del chunk
        emission = torch.log_softmax(torch.cat(emissions, dim=1), dim=-1)
        del emissions
    dictionary = {c: i for i, c in enumerate(labels)}
    tokens = [dictionary["E"]] * num_tokens     # [dictionary[c] for c in transcript]
    print("%s: %.1f min, %d frames, %d tokens: trellis %.1f GB" % (
        path, seconds / 60.0, num_frame, num_tokens, num_frame * num_tokens * 4 / 1e9))
    sys.stdout.flush()
    trellis = get_trellis(emission, num_frame, tokens)
    # path = backtrack(trellis, emission, tokens); segments = merge_repeats(path, transcript); ... clips
    del trellis, emission
    return num_frame


def main():
    bundle = pipelines.WAV2VEC2_ASR_LARGE_LV60K_960H
    model = bundle.get_model().to(DEVICE)
    model.eval()
    labels = bundle.get_labels()
    n = sum(p.nbytes for p in model.parameters()) // 4
    print("WAV2VEC2_ASR_LARGE_LV60K_960H: %.1fM parameters" % (n / 1e6))
    for path, seconds, words, num_tokens in CHAPTERS:
        align(model, labels, path, seconds, num_tokens)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
