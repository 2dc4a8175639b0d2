"""train_ecapa.py -- a PhD student trains an ECAPA-TDNN speaker-verification model (C=1024, 14.7M
parameters, 192-dim embeddings, AAM-softmax over VoxCeleb2's 5,994 speakers) in her own PyTorch loop on
one RTX 3090 (24 GB, 23.5 GiB usable): batches of 256 two-second crops, fp32, Adam; a step peaks at about
10 GiB.  Every 500 steps she scores the VoxCeleb1-O (cleaned) trial list, 37,611 trials over 4,708 test
utterances of 4 to 20 s, with full-length utterances.  Each utterance occurs in about 16 trials, so its
embedding is memoized:

    def evaluate(model, trials, wav_root):
        model.eval()
        cache = {}
        def embed(path):
            if path not in cache:
                wav, _ = soundfile.read(os.path.join(wav_root, path))
                feats = fbank(torch.from_numpy(wav).float().cuda())
                cache[path] = F.normalize(model(feats.unsqueeze(0)), dim=-1)
            return cache[path]
        scores = [(embed(a) * embed(b)).sum().item() for _, a, b in trials]
        ...

model.eval() switches batch norm to its running statistics; it does not turn autograd off, and the
function has no torch.no_grad().  Each cached embedding is the output of a forward pass with autograd on
through parameters that require grad, so it keeps that pass's whole graph: every activation ECAPA
saved for backward, about 195 KB per 10 ms frame, 160 MB for an 8-second utterance, for 768 bytes of
embedding.  The training steps leave 0.2 GiB allocated (and 11 GiB cached, which the evaluation reuses);
the first evaluation (at step 500) fails after 154 distinct utterances, 138 trials into the 37,611, in
the forward pass of the next one.

An expert: this is an evaluation pass that records autograd graphs: put evaluate() under
torch.inference_mode() (or torch.no_grad()), or at least cache emb.detach(); the memo then holds 4,708 x
768 bytes = 3.6 MB and is exactly right to keep.  Wrong first advice: bounding or clearing the cache (the
cache is small and needed; bounded, it would still hold graphs and recompute embeddings), a smaller
training batch, gradient checkpointing or mixed precision (this is not the training step, and no
backward will come), empty_cache or expandable_segments (the graphs are live), freeing the optimizer
state (0.1 GiB), a bigger GPU.
"""
import os
import random
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ops the stand-in lacks, written as PyTorch's (C++ there: no frame of the program's), under a torch file name
_TORCH_OPS = '''
def _normalize(input, p=2.0, dim=1, eps=1e-12):
    out = empty(input.nbytes, device=input.device)
    out._saved = input
    return _derive(out, input)


class _HostTensor(object):
    is_cuda = False

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def float(self):
        return self

    def cuda(self, device=None, non_blocking=False):
        return empty(self.nbytes, device="cuda")


def from_numpy(a):
    return _HostTensor(a.nbytes)
'''
exec(compile(_TORCH_OPS, os.path.join(os.path.dirname(torch.__file__), "functional.py"), "exec"), torch.__dict__)
F.normalize = torch._normalize

GiB = float(1 << 30)
FRAME_BYTES_1024CH = 1024 * 4


class ndarray(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes


class soundfile(object):
    @staticmethod
    def read(path):
        seconds = durations[path.split("/wav/", 1)[1]]
        return ndarray(int(seconds * 16000) * 8), 16000      # float64 samples


def fbank(wav):
    """torchaudio.compliance.kaldi.fbank: 80 mel bins every 10 ms, mean-normalized."""
    frames = wav.nbytes // 8 // 160
    f = torch.empty(frames * 80 * 4, device="cuda")
    f._frames = frames
    return f


class _Layer(torch.nn.Module):
    """A conv / BN / ReLU group of ECAPA: what it saves for backward is `width` x 1024 channels per frame."""

    def __init__(self, n_params, width):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_params * 4, device="cuda"))
        self.width = width

    def forward(self, x, batch, frames):
        out = torch.empty(int(batch * frames * FRAME_BYTES_1024CH * self.width), device="cuda")
        out._saved = x
        out._frames = frames
        return out


class ECAPA_TDNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv1 = _Layer(80 * 1024 * 5, 1)
        for b in range(3):
            for k in range(12):
                setattr(self, "block%d_%d" % (b, k), _Layer(1_080_000 // 3, 1))
        self.mfa = _Layer(3072 * 1536, 3)
        self.asp = _Layer(4608 * 128 + 128 * 1536, 4.5 + 0.125 + 3)
        self.fc = _Layer(3072 * 192, 0)

    def forward(self, feats, batch=1):
        frames = feats._frames
        x = self.conv1(feats, batch, frames)
        for b in range(3):
            for k in range(12):
                x = getattr(self, "block%d_%d" % (b, k))(x, batch, frames)
        x = self.mfa(x, batch, frames)
        x = self.asp(x, batch, frames)
        emb = torch.empty(batch * 192 * 4, device="cuda")
        emb._saved = x
        return emb


class AAMSoftmax(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(192 * 5994 * 4, device="cuda"))

    def forward(self, emb, labels):
        logits = torch.empty(256 * 5994 * 4, device="cuda")
        logits._saved = emb
        return F.cross_entropy(logits, labels)


def voxceleb1_o_cleaned():
    rng = random.Random(1801)
    utts = ["id%05d/%s/%05d.wav" % (10270 + rng.randrange(40), "".join(rng.choice("abcdefghijkXYZ_-") for _ in range(11)),
                                    rng.randrange(1, 30)) for _ in range(4708)]
    for u in utts:
        durations[u] = min(20.0, max(4.0, rng.lognormvariate(2.0, 0.38)))
    trials = []
    for i, a in enumerate(utts):
        for _ in range(8):
            trials.append((rng.randrange(2), a, utts[rng.randrange(len(utts))]))
    return trials[:37611]


durations = {}


def evaluate(model, trials, wav_root):
    model.eval()
    cache = {}

    def embed(path):
        if path not in cache:
            wav, _ = soundfile.read(os.path.join(wav_root, path))
            feats = fbank(torch.from_numpy(wav).float().cuda())
            cache[path] = F.normalize(model(feats), dim=-1)
        return cache[path]

    scores, labels = [], []
    for label, a, b in trials:
        ea, eb = embed(a), embed(b)
        scores.append(0.0)           # (ea * eb).sum().item()
        labels.append(label)
    model.train()
    return 0.0


class _Crop(object):
    _frames = 200


try:
    model = ECAPA_TDNN().cuda()
    head = AAMSoftmax().cuda()
    optimizer = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=2e-3, weight_decay=2e-5)
    trials = voxceleb1_o_cleaned()
    eval_every = 500
    batch_size = 256
    for step in range(1, 100_000):
        feats = torch.empty(batch_size * 200 * 80 * 4, device="cuda")
        feats._frames = 200
        labels = torch.empty(batch_size * 8, device="cuda")
        loss = head(model(feats, batch=batch_size), labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, feats, labels
        if step % eval_every == 0:
            print("step %d: scoring VoxCeleb1-O (%d trials), allocated %.2f GiB, reserved %.2f GiB" % (
                step, len(trials), torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
            eer = evaluate(model, trials, "/data/voxceleb1/test/wav")
            print("step %d: EER %.2f%%" % (step, eer))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
