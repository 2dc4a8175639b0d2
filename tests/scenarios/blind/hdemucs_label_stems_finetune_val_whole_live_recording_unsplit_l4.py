"""finetune_hdemucs.py -- a record label fine-tunes torchaudio's Hybrid Demucs (hdemucs_high, the
HDEMUCS_HIGH_MUSDB_PLUS weights) on its own multitrack archive (vocals / drums / bass / other, 44.1 kHz
stereo), on one NVIDIA L4 (22.5 GiB usable).  Training is on random 8-second segments, batch 8, AdamW,
float32; it peaks at 11 GiB.  After each epoch the script scores whole tracks of the validation split,
as the MUSDB evaluation does:

    for epoch in range(epochs):
        model.train()
        for mix, stems in train_loader:                    # (8, 2, 352800), (8, 4, 2, 352800)
            loss = F.l1_loss(model(mix.cuda()), stems.cuda()); opt.zero_grad(); loss.backward(); opt.step()
        model.eval()
        with torch.no_grad():
            for name, mix, stems in val_tracks:            # whole tracks, one at a time
                est = model(mix[None].cuda())              # torchaudio's tutorial uses separate_sources(
                sdr[name] = museval_sdr(est, stems)        #   segment=10, overlap=0.1) here; this does not

The label's validation split holds studio tracks of 3-7 minutes and, new this season, full-length live
recordings from its concert series.  At the end of epoch 1 the first seven tracks go through (the 7:12
one peaks at 15 GiB); the eighth, a 17:41 live jam, fails early in its pass, in the frequency branch's
first encoder layer (the 1x1 rewrite to 96 channels over 512 bins x 45,695 frames: one 8.4 GiB tensor).
The whole track is one input, so every skip connection of the U-Net (both branches) and every layer's
temporaries are sized by its 46.8 million samples: the pass would peak at ~36 GiB, under no_grad, batch 1.

An expert: the evaluation pass sees an input that training never does: a whole 17-minute recording.  The
phase decides: in training a smaller batch or checkpointing would cut activations, here there is one
track, no graph and nothing saved for backward.  Separate the track in overlapping chunks (torchaudio's
separate_sources / demucs' apply_model(split=True, overlap=0.25)) and overlap-add the estimates, or cap
the evaluated length; memory then no longer depends on the track.  Wrong first advice: a smaller batch
or gradient checkpointing (batch 1, no_grad), inference_mode (autograd is off already), freeing the
training state (0.5 GiB of AdamW state and gradients against a ~14 GiB shortfall), empty_cache or
expandable_segments (the pass needs more than the card, whatever the cache holds), a bigger card (the
next live set is longer).
"""
import sys

import torch
from torch import nn

import scen_truth
from torch.autograd._graph import derive      # the stand-in's record of what an operation's output depends on

scen_truth.note_every_empty(torch)

SR = 44100
SEGMENT_S = 8
BATCH_SIZE = 8
STEPS_PER_EPOCH = 250
VAL_TRACKS = [("studio_%02d" % i, s) for i, s in enumerate((3 * 60 + 41, 4 * 60 + 5, 2 * 60 + 58, 5 * 60 + 30,
                                                             3 * 60 + 17, 6 * 60 + 2, 7 * 60 + 12))]
VAL_TRACKS.append(("live_2024_lisbon_jam", 17 * 60 + 41))


def new(*shape):
    """A float32 tensor of that shape on the GPU (the stand-in tensor is its bytes; its shape is noted)."""
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=torch.float32, device="cuda")
    t.shape = tuple(int(s) for s in shape)
    return t


def op(*shape, saved=()):
    """An operation's output, keeping what autograd saves for backward (nothing under no_grad)."""
    t = new(*shape)
    if torch.is_grad_enabled():
        t._saved = tuple(saved)
        derive(t, *saved)
    return t


def backward(loss):
    """loss.backward() as PyTorch runs it: gradients made, then every tensor the graph saved is freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        s = t.__dict__.pop("_saved", None)
        if isinstance(s, (tuple, list)):
            todo.extend(x for x in s if isinstance(x, torch.Tensor))


def param(n):
    return nn.Parameter(torch.empty(int(n), dtype=torch.float32, device="cuda"))


# ---------------------------------------------------------------- torchaudio.models.HDemucs, as far as memory goes
class _HEncLayer(nn.Module):
    """conv (stride 4) + GELU, a DConv residual branch, 1x1 rewrite to 2C + GLU."""

    def __init__(self, chin, chout, freq):
        nn.Module.__init__(self)
        self.freq, self.chout = freq, chout
        self.conv = param(chin * chout * 8)
        self.dconv = param(chout * (chout // 4) * 3 * 2 * 2)
        self.rewrite = param(chout * 2 * chout)

    def _shape(self, x, ch):
        if self.freq:
            B, _, bins, frames = x.shape
            return (B, ch, max(bins // 4, 1), frames)
        B, _, T = x.shape
        return (B, ch, T // 4)

    def forward(self, x):
        y = op(*self._shape(x, self.chout), saved=(x,))          # conv
        y = op(*y.shape, saved=(y,))                             # GELU
        d = op(*y.shape[:1] + (self.chout // 4,) + y.shape[2:], saved=(y,))
        d = op(*d.shape, saved=(d,))                             # DConv: dilated conv, GroupNorm, GELU ...
        y = op(*y.shape, saved=(y, d))                           # ... 1x1 back to C, LayerScale, residual
        z = op(*y.shape[:1] + (2 * self.chout,) + y.shape[2:], saved=(y,))   # rewrite
        return op(*y.shape, saved=(z,))                          # GLU


class _HDecLayer(nn.Module):
    """x + skip, 1x1 rewrite to 2C, GroupNorm, GLU, transposed conv (stride 4)."""

    def __init__(self, chin, chout, freq):
        nn.Module.__init__(self)
        self.freq, self.chin, self.chout = freq, chin, chout
        self.rewrite = param(chin * 2 * chin * 9)
        self.conv_tr = param(chin * chout * 8)

    def forward(self, x, skip):
        x = op(*x.shape, saved=(x, skip))                        # x + skip
        z = op(*x.shape[:1] + (2 * self.chin,) + x.shape[2:], saved=(x,))   # rewrite
        z = op(*z.shape, saved=(z,))                             # norm1
        y = op(*x.shape, saved=(z,))                             # GLU
        del z
        if self.freq:
            B, _, bins, frames = y.shape
            return op(B, self.chout, bins * 4, frames, saved=(y,))
        B, _, T = y.shape
        return op(B, self.chout, T * 4, saved=(y,))


class HDemucs(nn.Module):
    def __init__(self, sources=4, channels=48, depth=4, nfft=4096):
        nn.Module.__init__(self)
        self.sources, self.nfft = sources, nfft
        chans = [channels * 2 ** i for i in range(depth)]
        self.encoder, self.tencoder, self.decoder, self.tdecoder = [], [], [], []
        for i, c in enumerate(chans):
            chin = 4 if i == 0 else chans[i - 1]
            for name, lst, mod in (("encoder", self.encoder, _HEncLayer(chin, c, True)),
                                   ("tencoder", self.tencoder, _HEncLayer(2 if i == 0 else chin, c, False))):
                setattr(self, "%s%d" % (name, i), mod)
                lst.append(mod)
        for i, c in reversed(list(enumerate(chans))):
            chout = sources * 4 if i == 0 else chans[i - 1]
            for name, lst, mod in (("decoder", self.decoder, _HDecLayer(c, chout, True)),
                                   ("tdecoder", self.tdecoder, _HDecLayer(c, sources * 2 if i == 0 else chout, False))):
                setattr(self, "%s%d" % (name, i), mod)
                lst.append(mod)
        self.bottleneck = param(32_000_000)                      # the shared layers 5-6 and their BiLSTM/attention

    def forward(self, mix):
        B, _, N = mix.shape
        frames = N // (self.nfft // 4)
        z = op(B, 4, self.nfft // 2, frames, saved=(mix,))       # STFT, complex as channels
        x = op(*z.shape, saved=(z,))                             # normalized
        xt = op(B, 2, N, saved=(mix,))                           # normalized waveform
        saved, saved_t = [], []
        for enc, tenc in zip(self.encoder, self.tencoder):
            xt = tenc(xt)
            saved_t.append(xt)
            x = enc(x)
            saved.append(x)
        x = op(*x.shape, saved=(x, xt))                          # layers 5-6 on the merged branches
        for dec, tdec in zip(self.decoder, self.tdecoder):
            x = dec(x, saved.pop(-1))
            xt = tdec(xt, saved_t.pop(-1))
        spec = op(B, self.sources, 2, N, saved=(x,))             # masks -> iSTFT
        return op(B, self.sources, 2, N, saved=(spec, xt))


# ---------------------------------------------------------------- the job
def train_one_epoch(model, opt, epoch):
    model.train()
    for step in range(STEPS_PER_EPOCH):
        mix = new(BATCH_SIZE, 2, SEGMENT_S * SR)                 # mix.cuda()
        stems = new(BATCH_SIZE, 4, 2, SEGMENT_S * SR)
        est = model(mix)
        loss = op(1, saved=(est, stems))                         # F.l1_loss
        opt.zero_grad()
        backward(loss)
        opt.step()
        del mix, stems, est, loss
    print("epoch %d: %d steps, peak %.1f GiB" % (epoch, STEPS_PER_EPOCH, torch.cuda.max_memory_allocated() / 2 ** 30))


def validate(model, epoch):
    model.eval()
    sdr = {}
    with torch.no_grad():
        for name, seconds in VAL_TRACKS:
            torch.cuda.reset_peak_memory_stats()
            mix = new(1, 2, seconds * SR)                        # mix[None].cuda(): the whole track
            est = model(mix)
            sdr[name] = 0.0                                      # museval SDR per source, on the CPU
            print("  val %-22s %2d:%02d  peak %.1f GiB" % (name, seconds // 60, seconds % 60,
                                                           torch.cuda.max_memory_allocated() / 2 ** 30))
            sys.stdout.flush()
            del mix, est
    return sdr


def main():
    model = HDemucs().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.0)
    print("parameters: %.1fM" % (sum(p.nbytes for p in model.parameters()) / 4e6))
    for epoch in range(1, 101):
        train_one_epoch(model, opt, epoch)
        validate(model, epoch)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
