"""finetune_w2v2.py -- wav2vec2-large (317M parameters, fp32) fine-tuned with CTC on a 40 GB A100 for a
call-centre language, batch_size 14 utterances padded to the longest of each batch, random order,
utterances of 1 to 18 s (most batches short, some with a long call segment).  AdamW.  The first two
batches are short; the third, whose longest utterance is 17.9 s, fails in its 23rd encoder layer:

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 686 MiB. GPU 0 has a total capacity
    of 40 GiB of which 262 MiB is free. Of the allocated memory 35.8 GiB is allocated by PyTorch, and
    3.4 GiB is reserved by PyTorch but unallocated.

What happened: AdamW's moments (48 MiB per layer each) were made at the first optimizer step, after a
short batch, into the cached blocks that batch's attention had left (each a bit under two moments
large), so some 90 of the caching allocator's segments are each pinned by one moment and keep a free
remainder of ~40 MiB that no request of a long batch fits into; the retry can only give back
segments that are entirely free.  The long batch needs ~39.7 GiB in all: it fits the card when the
free memory is contiguous.

An expert: expandable_segments:True in PYTORCH_CUDA_ALLOC_CONF (or max_split_size_mb) -- the
classic fragmentation fix; grouping utterances of similar length (fewer distinct sizes) also helps.
Not empty_cache (the pinned segments are not free: nothing would be returned), not a bigger card,
model parallelism or quantization, not inference_mode.
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 14
FPS = 50                     # wav2vec2 frames per second


class EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(48 * MiB, device="cuda"))     # attention + feed-forward (fused)

    def forward(self, x, t):
        h = torch.empty(batch_size * t * 1024 * 4, device="cuda")
        h._saved = x
        scores = torch.empty(batch_size * 16 * t * t * 4, device="cuda")
        scores._saved = h
        probs = torch.empty(batch_size * 16 * t * t * 4, device="cuda")
        probs._saved = scores
        out = torch.empty(batch_size * t * 1024 * 4, device="cuda")
        out._saved = probs
        return out


class Wav2Vec2ForCTC(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.feature_extractor = nn.Parameter(torch.empty(17 * MiB, device="cuda"))
        self.pos_conv = nn.Parameter(torch.empty(20 * MiB, device="cuda"))
        self.layers = nn.Module()
        for i in range(24):
            setattr(self.layers, "l%d" % i, EncoderLayer())
        self.lm_head = nn.Parameter(torch.empty(1 * MiB, device="cuda"))

    def forward(self, wav, t):
        x = torch.empty(batch_size * t * 512 * 4, device="cuda")      # conv feature encoder output
        x._saved = wav
        for i in range(24):
            x = getattr(self.layers, "l%d" % i)(x, t)
        logits = torch.empty(batch_size * t * 64 * 4, device="cuda")
        logits._saved = x
        return logits


def batches(rng):
    while True:
        yield max(rng.uniform(1.0, 18.0) for _ in range(batch_size)) if rng.random() < 0.3 else \
            max(rng.uniform(1.0, 6.5) for _ in range(batch_size))


def main():
    model = Wav2Vec2ForCTC()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    rng = random.Random(SEED)
    for step, seconds in enumerate(batches(rng)):
        t = int(seconds * FPS)
        wav = torch.empty(batch_size * int(seconds * 16000) * 4, device="cuda")
        logits = model(wav, t)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, wav


SEED = 17
try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
