"""train_conformer.py -- a Conformer-L CTC model (118M parameters, fp32) trained on LibriSpeech 960 h on
one T4 (15 GiB), batch_size 32 utterances.  To "save the feature extraction after epoch 1" the
author computes 80-bin log-mel filterbanks on the GPU and memoises them per utterance id:

    class GpuFbank:
        def __init__(self):
            self.feats_cache = {}                # tuple(utt_ids) -> padded (B, frames, 80) fp32 on cuda
        def __call__(self, utt_ids, wavs):       # the bucketing sampler's batches repeat every epoch
            key = tuple(utt_ids)
            if key not in self.feats_cache:
                self.feats_cache[key] = pad([fbank(w.cuda()) for w in wavs])   # stays on the GPU
            return self.feats_cache[key]

Each step adds one padded batch of features (~15 MiB); the whole corpus would be ~150 GB.  Training runs
fine for a few hundred steps while the dict grows, then runs out of memory at an ordinary step, long
before epoch 1 ends: the card is full to its last megabytes and the request that fails is a small one
(the loss); the allocator holds under 1 GiB of cached pieces from the varying batch lengths.  The weights, gradients and AdamW state (1.8 GiB) and a
step's activations (~6 GiB) are the same at every step; only the cache grows.

An expert: the dict is the leak -- keep the cached features in host memory (or on disk: precompute
them), or bound the cache; move one batch's features to the GPU per step.  Not a smaller batch,
checkpointing or mixed precision (the step itself fits), not an 8-bit optimizer, not
expandable_segments or empty_cache (the cached features are live tensors).
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 32
MAX_SECONDS = 16.5


class ConformerBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.ffn1 = nn.Parameter(torch.empty(8 * MiB, device="cuda"))
        self.mhsa = nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.conv = nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.ffn2 = nn.Parameter(torch.empty(8 * MiB, device="cuda"))

    def forward(self, x, frames):
        t = frames // 4                                             # after 4x subsampling
        ffn = torch.empty(batch_size * t * 512 * 4 * 5, device="cuda")        # feed-forward modules
        ffn._saved = x
        attn = torch.empty(batch_size * 8 * t * t * 4, device="cuda")           # attention probs
        attn._saved = ffn
        conv = torch.empty(batch_size * t * 512 * 4 * 5, device="cuda")       # conv module
        conv._saved = attn
        out = torch.empty(batch_size * t * 512 * 4, device="cuda")
        out._saved = conv
        return out


class ConformerCTC(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.subsample = nn.Parameter(torch.empty(20 * MiB, device="cuda"))
        self.blocks = nn.Module()
        for i in range(17):
            setattr(self.blocks, "b%d" % i, ConformerBlock())
        self.ctc_head = nn.Parameter(torch.empty(2 * MiB, device="cuda"))

    def forward(self, feats, frames):
        x = torch.empty(batch_size * (frames // 4) * 512 * 4, device="cuda")
        x._saved = feats
        for i in range(17):
            x = getattr(self.blocks, "b%d" % i)(x, frames)
        logits = torch.empty(batch_size * (frames // 4) * 1024 * 4, device="cuda")
        logits._saved = x
        return logits


class GpuFbank(object):
    """torchaudio.compliance.kaldi.fbank on the GPU, the padded batch memoised per batch of utterance ids
    (the bucketing sampler's batches are the same every epoch)."""

    def __init__(self):
        self.feats_cache = {}

    def __call__(self, utt_ids, seconds):
        frames = int(max(seconds) * 100)
        key = tuple(utt_ids)
        feats = self.feats_cache.get(key)
        if feats is None:
            wavs = torch.empty(batch_size * int(max(seconds) * 16000) * 4, device="cuda")   # [w.cuda() ...]
            feats = torch.empty(batch_size * frames * 80 * 4, device="cuda")            # (B, frames, 80) fp32
            del wavs
            self.feats_cache[key] = feats
        return feats, frames


def librispeech_batches(rng):
    utt = 0
    while True:
        ids, secs = [], []
        for _ in range(batch_size):
            ids.append("%04d-%06d" % (utt // 100, utt))
            secs.append(rng.uniform(2.0, MAX_SECONDS))
            utt += 1
        yield ids, secs


def main():
    model = ConformerCTC()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    featurizer = GpuFbank()
    rng = random.Random(960)
    for step, (utt_ids, seconds) in enumerate(librispeech_batches(rng)):
        feats, frames = featurizer(utt_ids, seconds)
        logits = model(feats, frames)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, feats


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
