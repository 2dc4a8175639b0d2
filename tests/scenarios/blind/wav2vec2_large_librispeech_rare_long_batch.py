"""finetune_ctc.py -- fine-tuning wav2vec2-large (317M parameters, fp32) for CTC on LibriSpeech 960h on one
A100 40GB, with a plain `LD_PRELOAD=liboomguard.so`.  The user's own loop, batches of 16 random utterances padded
to the longest one in the batch (no length filter, no length-aware sampler):

    model = Wav2Vec2ForCTC.from_pretrained("facebook/wav2vec2-large-lv60", ...).cuda()
    model.freeze_feature_encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    loader = DataLoader(ds, batch_size=16, shuffle=True, collate_fn=pad_to_longest)
    for input_values, labels in loader:
        loss = model(input_values.cuda(), labels=labels.cuda()).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

It ran for three hours (the loop below replays the last 150 steps): most utterances are 2-17 s, so the longest
of a batch is ~16 s (800 frames at 50 frames/s) and the 24 transformer layers keep ~16 x 800 x 64 KiB = 0.8 GiB
each for backward (19 GiB in all) beside 1.2 GiB of weights, 1.2 GiB of gradients and 2.4 GiB of AdamW moments:
it fits the 40 GB card with room to spare.  Then the shuffle puts a 34.9-second utterance (a rare long
recording; LibriSpeech has a few up to 35 s) into a batch: padded to 1745 frames, every layer keeps 1.7 GiB
(41 GiB for the 24 layers, ~46 GiB for the whole step) and the forward pass runs out in layer 19 of 24,
asking for 109 MiB.  About 5 GiB of the cache sit in blocks split around the AdamW moments (made at the
first step out of freed activation segments), but even all of it would not carry the pass through.
Memory did not creep up: every step before left the same baseline; this batch alone is twice as long as
any before it.

An expert: the longest batch, not the typical one, decides the memory.  Cap the audio length (drop or crop
utterances over ~20 s, as the fairseq recipe's max_sample_size does) or size batches by their total audio
(dynamic batching by seconds/tokens per batch, which with length bucketing also removes the padding);
gradient checkpointing would also absorb it at +30% time.  Not a leak, not fragmentation or the cache, not
inference; a permanently smaller batch works but slows all three hours for one batch in thousands.
"""
import random
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
KiB = 1 << 10
scen_truth.note_every_empty(torch)

batch_size = 16
SAMPLE_RATE = 16000
FRAMES_PER_SECOND = 50
HIDDEN = 1024


class Wav2Vec2EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN * 4, device="cuda"))       # q, k, v, out
        self.feed_forward = nn.Parameter(torch.empty(2 * HIDDEN * 4 * HIDDEN * 4, device="cuda"))
        self.layer_norms = nn.Parameter(torch.empty(4 * HIDDEN * 4, device="cuda"))

    def forward(self, hidden_states):
        b, t = hidden_states._bt
        x = hidden_states
        # attention (SDPA, fused: no T x T scores kept), layer norms, residuals: 8 tensors of B x T x 1024 fp32
        for _ in range(6):
            y = torch.empty(b * t * HIDDEN * 4, device="cuda")
            y._saved = x
            x = y
        # feed-forward: the 4096-wide intermediate and its GELU
        for _ in range(2):
            y = torch.empty(b * t * 4 * HIDDEN * 4, device="cuda")
            y._saved = x
            x = y
        for _ in range(2):
            y = torch.empty(b * t * HIDDEN * 4, device="cuda")
            y._saved = x
            x = y
        x._bt = (b, t)
        return x


class Wav2Vec2ForCTC(nn.Module):
    def __init__(self, num_layers=24, vocab=32):
        nn.Module.__init__(self)
        self.feature_projection = nn.Parameter(torch.empty(512 * HIDDEN * 4, device="cuda"))
        self.pos_conv_embed = nn.Parameter(torch.empty(HIDDEN * HIDDEN // 16 * 128 * 4, device="cuda"))
        self.layers = []
        for i in range(num_layers):
            layer = Wav2Vec2EncoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * vocab * 4, device="cuda"))

    def forward(self, input_values, labels):
        b, t = input_values._bt
        # frozen CNN feature encoder (no grad: its activations are not kept), then the projection
        with torch.no_grad():
            feats = torch.empty(b * t * 512 * 4, device="cuda")
        h = torch.empty(b * t * HIDDEN * 4, device="cuda")
        h._saved = feats
        h._bt = (b, t)
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(b * t * 32 * 4, device="cuda")
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        return loss


def librispeech_lengths(rng, steps, long_step):
    """Seconds of each utterance of each batch: mostly 2-17 s; one 34.9-s recording at long_step."""
    for step in range(steps):
        secs = [rng.uniform(2.0, 16.4) for _ in range(batch_size)]
        if step == long_step:
            secs[rng.randrange(batch_size)] = 34.9
        yield secs


def pad_to_longest(secs):
    longest = max(secs)
    input_values = torch.empty(batch_size * int(longest * SAMPLE_RATE) * 4, device="cuda")
    input_values._bt = (batch_size, int(longest * FRAMES_PER_SECOND))
    labels = torch.empty(batch_size * 400 * 8, device="cuda")
    return input_values, labels


def main():
    rng = random.Random(960)
    model = Wav2Vec2ForCTC()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for step, secs in enumerate(librispeech_lengths(rng, 150, long_step=137)):
        input_values, labels = pad_to_longest(secs)
        loss = model(input_values, labels=labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_values, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
