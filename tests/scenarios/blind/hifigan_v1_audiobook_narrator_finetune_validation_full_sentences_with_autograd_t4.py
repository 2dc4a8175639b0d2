"""train.py -- a small audiobook studio fine-tunes the universal HiFi-GAN V1 vocoder (13.9M-parameter
generator, MPD + MSD discriminators: 85M parameters in all) on one narrator's 22.05 kHz recordings, on a
Kaggle T4 (16 GB).  The script is jik876/hifi-gan's train.py, reorganized: the validation block became a
function, and its `with torch.no_grad():` did not come along -- generator.eval() did:

    def run_validation(generator, validation_loader, steps):
        generator.eval()
        torch.cuda.empty_cache()
        val_err_tot = 0
        for j, batch in enumerate(validation_loader):
            x, y, _, y_mel = batch
            y_g_hat = generator(x.to(device))
            y_mel = y_mel.to(device)
            y_g_hat_mel = mel_spectrogram(y_g_hat.squeeze(1), h.n_fft, h.num_mels, h.sampling_rate, ...)
            val_err_tot += F.l1_loss(y_mel, y_g_hat_mel).item()
        ...
        generator.train()

Training runs on 8192-sample segments (batch 12) and peaks under 5 GiB; validation_interval is 100 for the
fine-tune.  Validation synthesizes each held-out sentence whole -- the narrator's sentences run from 4 to
22 seconds -- and, with autograd on, the generator keeps every activation of its four upsampling stages and
their 36 residual convolutions for a backward pass that never comes: about 5.2 MB per mel frame, 0.45 GB
per second of audio.  And the previous sentence's graph is still alive (y_g_hat and y_g_hat_mel are rebound
only when the next forward returns).  The first validation, at step 100, fails on its second sentence
(21.3 s), in the generator's second upsampling stage, while the first one's graph (12.4 s) still holds
5.4 GiB; with the training state (1.3 GiB of weights, gradients and AdamW moments) and the last training
step's discriminator feature maps, the T4's 14.7 GiB are gone.

An expert: this is an evaluation pass, and autograd is on: wrap it in torch.no_grad() (or
torch.inference_mode()) -- the generator then needs ~0.2 GB for the longest sentence.  Wrong first
advice: a smaller batch (the validation batch is 1; training fits), gradient checkpointing or mixed
precision (fp16 HiFi-GAN is fragile, and neither removes the needless graph), empty_cache (the script
already calls it; the graph is live), expandable_segments, a bigger GPU.  Chunked synthesis would also
work, but only after autograd is off.
"""
import itertools
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ------------------------------------------------------------------------------------------------
# Stand-ins for what the stand-in torch lacks, mirroring the real API's shape (sizes in bytes; a
# tensor carries its shape as an attribute): torch.stft, pad, matmul, the few Tensor methods used, and
# the DataLoaders.  Each op makes the tensor PyTorch would and, with autograd on, keeps its inputs for
# backward as PyTorch's graph does.
# ------------------------------------------------------------------------------------------------


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _op(shape, *inputs, **kw):
    t = torch.empty(_numel(shape) * kw.get("itemsize", 4))
    t.shape = tuple(shape)
    if torch.is_grad_enabled():
        t._saved = tuple(i for i in inputs if isinstance(i, torch.Tensor))
        torch._derive(t, *inputs)
    return t


class HostTensor(object):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def to(self, device, non_blocking=False):
        t = torch.empty(_numel(self.shape) * 4)
        t.shape = self.shape
        return t


def _squeeze(self, dim):
    v = self.view()
    v.shape = tuple(d for i, d in enumerate(self.shape) if i != dim)
    return v


def _unsqueeze(self, dim):
    v = self.view()
    v.shape = self.shape[:dim] + (1,) + self.shape[dim:]
    return v


def _item(self):
    return 0.25


torch.Tensor.squeeze = _squeeze
torch.Tensor.unsqueeze = _unsqueeze
torch.Tensor.item = _item
torch.Tensor.__mul__ = lambda self, other: _op(self.shape, self)


def _pad(x, pad, mode="constant"):
    return _op(x.shape[:-1] + (x.shape[-1] + pad[0] + pad[1],), x)


def _stft(y, n_fft, hop_length=None, win_length=None, window=None, center=True, pad_mode="reflect",
          normalized=False, onesided=True, return_complex=False):
    frames = (y.shape[-1] - n_fft) // hop_length + 1
    return _op(y.shape[:-1] + (n_fft // 2 + 1, frames, 2), y)


def _matmul(a, b):
    return _op(b.shape[:-2] + (a.shape[0], b.shape[-1]), a, b)


def _unary(x, *args, **kwargs):
    return _op(x.shape, x)


def _l1_loss(a, b):
    return _op((1,), a, b)


F.pad = _pad
F.l1_loss = _l1_loss
torch.stft = _stft
torch.matmul = _matmul
torch.sqrt = torch.log = torch.clamp = torch.tanh = _unary


def _leaky_relu(x, slope=0.1):
    return _op(x.shape, x)


F.leaky_relu = _leaky_relu


class _Conv(torch.nn.Module):
    """A Conv1d / ConvTranspose1d with weight_norm: its weight, and an output of `cout` channels at
    `up` times the input's length."""

    def __init__(self, cin, cout, k, up=1):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(cin * cout * k * 4))
        self.cout, self.up = cout, up

    def forward(self, x):
        return _op(x.shape[:-2] + (self.cout, x.shape[-1] * self.up), x)


class ResBlock1(torch.nn.Module):
    def __init__(self, channels, kernel_size, dilation=(1, 3, 5)):
        torch.nn.Module.__init__(self)
        for i in range(3):
            setattr(self, "convs1_%d" % i, _Conv(channels, channels, kernel_size))
            setattr(self, "convs2_%d" % i, _Conv(channels, channels, kernel_size))

    def forward(self, x):
        for i in range(3):
            xt = F.leaky_relu(x, 0.1)
            xt = getattr(self, "convs1_%d" % i)(xt)
            xt = F.leaky_relu(xt, 0.1)
            xt = getattr(self, "convs2_%d" % i)(xt)
            x = _op(x.shape, xt, x)                  # xt + x
        return x


class _Stage(torch.nn.Module):
    """ups[i] and its three ResBlock1s (kernels 3, 7, 11), summed and averaged, as Generator.forward does."""

    def __init__(self, cin, cout, rate, kernel):
        torch.nn.Module.__init__(self)
        self.up = _Conv(cin, cout, kernel, up=rate)
        self.res3 = ResBlock1(cout, 3)
        self.res7 = ResBlock1(cout, 7)
        self.res11 = ResBlock1(cout, 11)

    def forward(self, x):
        x = F.leaky_relu(x, 0.1)
        x = self.up(x)
        xs = self.res3(x)
        xs = _op(x.shape, xs, self.res7(x))
        xs = _op(x.shape, xs, self.res11(x))
        return _op(x.shape, xs)                      # xs / num_kernels


class Generator(torch.nn.Module):
    def __init__(self, h):
        torch.nn.Module.__init__(self)
        self.conv_pre = _Conv(80, 512, 7)
        self.stage0 = _Stage(512, 256, 8, 16)
        self.stage1 = _Stage(256, 128, 8, 16)
        self.stage2 = _Stage(128, 64, 2, 4)
        self.stage3 = _Stage(64, 32, 2, 4)
        self.conv_post = _Conv(32, 1, 7)

    def forward(self, x):
        x = self.conv_pre(x)
        x = self.stage0(x)
        x = self.stage1(x)
        x = self.stage2(x)
        x = self.stage3(x)
        x = F.leaky_relu(x)
        x = self.conv_post(x)
        return torch.tanh(x)


class _Discriminator(torch.nn.Module):
    """MultiPeriodDiscriminator / MultiScaleDiscriminator: their weights, and the feature maps of their
    conv stacks for a batch of real and generated segments."""

    def __init__(self, mparams, fmap_bytes_per_sample):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(int(mparams * 1e6) * 4))
        self.per_sample = fmap_bytes_per_sample

    def forward(self, y, y_hat):
        b = y.shape[0]
        fmaps = [_op((b, self.per_sample // 64), y, y_hat) for _ in range(16)]   # float32: bytes / 4
        return fmaps[-1], fmaps[-2], fmaps[:8], fmaps[8:]


def MultiPeriodDiscriminator():
    return _Discriminator(41.1, 30 * MiB)


def MultiScaleDiscriminator():
    return _Discriminator(29.6, 40 * MiB)


def _sum_loss(*parts):
    flat = []
    for p in parts:
        flat.extend(p if isinstance(p, (list, tuple)) else [p])
    return _op((1,), *flat)


discriminator_loss = generator_loss = feature_loss = _sum_loss


_plain_backward = torch.Tensor.backward


def _backward(self, *args, **kwargs):
    """PyTorch frees what the graph saved once backward has run through it (retain_graph=False)."""
    _plain_backward(self, *args, **kwargs)
    todo = [self]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, torch.Tensor):
            s = x.__dict__.pop("_saved", None)
            if s is not None:
                todo.append(s)


torch.Tensor.backward = _backward


class MelDataset(object):
    """meldataset.MelDataset: training segments of 8192 samples, or (split=False) whole sentences."""

    def __init__(self, durations, segment_size, split, hop_size=256, sr=22050):
        self.durations, self.segment_size, self.split, self.hop, self.sr = durations, segment_size, split, hop_size, sr

    def __len__(self):
        return len(self.durations)

    def item(self, i, batch):
        n = self.segment_size if self.split else int(self.durations[i] * self.sr) // self.hop * self.hop
        frames = n // self.hop
        return (HostTensor((batch, 80, frames)), HostTensor((batch, n)), "wav_%04d" % i, HostTensor((batch, 80, frames)))


class DataLoader(object):
    def __init__(self, dataset, batch_size=1, steps=None):
        self.dataset, self.batch_size, self.steps = dataset, batch_size, steps

    def __iter__(self):
        for i in range(self.steps or len(self.dataset)):
            yield self.dataset.item(i % len(self.dataset), self.batch_size)


# ------------------------------------------------------------------------------------------------
# meldataset.py (the repository's) and train.py
# ------------------------------------------------------------------------------------------------
mel_basis = {}
hann_window = {}


def dynamic_range_compression_torch(x, C=1, clip_val=1e-5):
    return torch.log(torch.clamp(x, min=clip_val) * C)


def spectral_normalize_torch(magnitudes):
    output = dynamic_range_compression_torch(magnitudes)
    return output


def mel_spectrogram(y, n_fft, num_mels, sampling_rate, hop_size, win_size, fmin, fmax, center=False):
    global mel_basis, hann_window
    key = str(fmax) + "_" + str(y.device)
    if key not in mel_basis:
        mel = torch.empty(num_mels * (n_fft // 2 + 1) * 4)      # librosa mel filterbank, .to(y.device)
        mel.shape = (num_mels, n_fft // 2 + 1)
        mel_basis[key] = mel
        hann_window[str(y.device)] = torch.empty(win_size * 4)

    y = F.pad(y.unsqueeze(1), (int((n_fft - hop_size) / 2), int((n_fft - hop_size) / 2)), mode="reflect")
    y = y.squeeze(1)

    spec = torch.stft(y, n_fft, hop_length=hop_size, win_length=win_size, window=hann_window[str(y.device)],
                      center=center, pad_mode="reflect", normalized=False, onesided=True)
    spec = torch.sqrt(spec)                                        # sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = _op(spec.shape[:-1], spec)
    spec = torch.matmul(mel_basis[key], spec)
    spec = spectral_normalize_torch(spec)
    return spec


class AttrDict(dict):
    __getattr__ = dict.__getitem__


h = AttrDict(batch_size=12, learning_rate=0.0002, adam_b1=0.8, adam_b2=0.99, segment_size=8192, num_mels=80,
             n_fft=1024, hop_size=256, win_size=1024, sampling_rate=22050, fmin=0, fmax=8000,
             fmax_for_loss=None)
device = "cuda:0"

# the narrator's held-out chapter, in file-list order (seconds)
VAL_SENTENCES = [12.4, 21.3, 5.8, 3.9, 8.6, 14.9, 9.7, 7.1, 10.2, 19.8, 4.4, 13.0]


def run_validation(generator, validation_loader, steps):
    generator.eval()
    torch.cuda.empty_cache()
    val_err_tot = 0
    for j, batch in enumerate(validation_loader):
        x, y, _, y_mel = batch
        y_g_hat = generator(x.to(device))
        y_mel = y_mel.to(device)
        y_g_hat_mel = mel_spectrogram(y_g_hat.squeeze(1), h.n_fft, h.num_mels, h.sampling_rate, h.hop_size,
                                      h.win_size, h.fmin, h.fmax_for_loss)
        val_err_tot += F.l1_loss(y_mel, y_g_hat_mel).item()
        print("  val %d: %.1f s  allocated %.2f GiB" % (j, VAL_SENTENCES[j],
                                                        torch.cuda.memory_allocated() / 2 ** 30))
    val_err = val_err_tot / (j + 1)
    print("step %d validation mel error %.3f" % (steps, val_err))
    generator.train()


def train():
    generator = Generator(h)
    mpd = MultiPeriodDiscriminator()
    msd = MultiScaleDiscriminator()
    optim_g = torch.optim.AdamW(generator.parameters(), h.learning_rate, betas=[h.adam_b1, h.adam_b2])
    optim_d = torch.optim.AdamW(itertools.chain(msd.parameters(), mpd.parameters()), h.learning_rate,
                                betas=[h.adam_b1, h.adam_b2])

    train_loader = DataLoader(MelDataset([9.0] * 4000, h.segment_size, split=True), batch_size=h.batch_size,
                              steps=5000)
    validation_loader = DataLoader(MelDataset(VAL_SENTENCES, h.segment_size, split=False), batch_size=1)
    validation_interval = 100

    steps = 0
    generator.train()
    mpd.train()
    msd.train()
    for i, batch in enumerate(train_loader):
        x, y, _, y_mel = batch
        x = x.to(device)
        y = y.to(device)
        y_mel = y_mel.to(device)
        y = y.unsqueeze(1)

        y_g_hat = generator(x)
        y_g_hat_mel = mel_spectrogram(y_g_hat.squeeze(1), h.n_fft, h.num_mels, h.sampling_rate, h.hop_size,
                                      h.win_size, h.fmin, h.fmax_for_loss)

        optim_d.zero_grad()
        y_df_hat_r, y_df_hat_g, _, _ = mpd(y, y_g_hat.detach())
        loss_disc_f = discriminator_loss(y_df_hat_r, y_df_hat_g)
        y_ds_hat_r, y_ds_hat_g, _, _ = msd(y, y_g_hat.detach())
        loss_disc_s = discriminator_loss(y_ds_hat_r, y_ds_hat_g)
        loss_disc_all = _sum_loss(loss_disc_s, loss_disc_f)
        loss_disc_all.backward()
        optim_d.step()

        optim_g.zero_grad()
        loss_mel = F.l1_loss(y_mel, y_g_hat_mel)
        y_df_hat_r, y_df_hat_g, fmap_f_r, fmap_f_g = mpd(y, y_g_hat)
        y_ds_hat_r, y_ds_hat_g, fmap_s_r, fmap_s_g = msd(y, y_g_hat)
        loss_fm_f = feature_loss(fmap_f_r, fmap_f_g)
        loss_fm_s = feature_loss(fmap_s_r, fmap_s_g)
        loss_gen_f = generator_loss(y_df_hat_g)
        loss_gen_s = generator_loss(y_ds_hat_g)
        loss_gen_all = _sum_loss(loss_gen_s, loss_gen_f, loss_fm_s, loss_fm_f, loss_mel)
        loss_gen_all.backward()
        optim_g.step()

        steps += 1
        if steps % 25 == 0:
            print("Steps : %d, peak %.2f GiB" % (steps, torch.cuda.max_memory_allocated() / 2 ** 30))
        if steps % validation_interval == 0:
            run_validation(generator, validation_loader, steps)


try:
    train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
