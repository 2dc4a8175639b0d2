"""train_asr.py -- CTC fine-tuning of wav2vec2-large (317M parameters, fp32, AdamW) on a call centre's
in-house recordings, one 24 GB card, batch_size = 4.  The manifest should hold VAD segments of 2-12
s, and the collator pads each batch to its longest clip (processor.pad(..., padding=True)).  But the
segmentation script crashed on one call and the manifest kept that whole recording: 58 minutes
(55.7M samples at 16 kHz).  No max-duration filter runs before training:

    train_ds = load_manifest("calls/train.jsonl")        # no filter(lambda x: x["duration"] < 20)
    for batch in DataLoader(train_ds, batch_size=4, shuffle=True, collate_fn=collator):
        loss = model(batch["input_values"], labels=batch["labels"]).loss

Training runs for a while; the batch that holds the long call is padded to 58 minutes and the
feature encoder's first convolution (512 channels at 3.2 kHz, fp32) asks for 85 GiB at once.  Even
alone in its batch the call would need 21 GiB for that one layer, more than is free.

An expert: cap the input length -- drop or re-segment recordings longer than ~20-30 s (a
max_duration filter in the data pipeline); that one clip is the problem.  The collator already pads
dynamically; a smaller batch, bf16, gradient checkpointing, flash attention (the failure is in the
convolutional feature encoder, before any attention) and the optimizer-state remedies do not make
a 58-minute clip fit; not inference mode, not the cache or fragmentation.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
SR = 16000
CONV_STRIDES = (5, 2, 2, 2, 2, 2, 2)
HIDDEN, LAYERS, HEADS = 1024, 24, 16


def param(nbytes):
    return nn.Parameter(torch.empty(nbytes, device="cuda"))


class Wav2Vec2ConvLayer(nn.Module):
    def __init__(self, kernel):
        nn.Module.__init__(self)
        self.conv = param(512 * 512 * kernel * 4)
        self.layer_norm = param(512 * 2 * 4)

    def forward(self, x, batch, frames):
        conv_out = torch.empty(batch * frames * 512 * 4, device="cuda")       # 512 channels, fp32
        conv_out._saved = x
        normed = torch.empty(conv_out.nbytes, device="cuda")
        normed._saved = conv_out
        act = torch.empty(conv_out.nbytes, device="cuda")
        act._saved = normed
        return act


class Wav2Vec2FeatureEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv_layers = [Wav2Vec2ConvLayer(k) for k in (10, 3, 3, 3, 3, 2, 2)]
        for i, l in enumerate(self.conv_layers):
            setattr(self, "conv_%d" % i, l)

    def forward(self, input_values, batch, samples):
        hidden = input_values
        frames = samples
        for layer, stride in zip(self.conv_layers, CONV_STRIDES):
            frames //= stride
            hidden = layer(hidden, batch, frames)
        return hidden, frames


class Wav2Vec2EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = param(4 * HIDDEN * HIDDEN * 4)
        self.feed_forward = param(8 * HIDDEN * HIDDEN * 4)

    def forward(self, h, batch, frames):
        qkv = torch.empty(3 * batch * frames * HIDDEN * 4, device="cuda")
        qkv._saved = h
        scores = torch.empty(batch * HEADS * frames * frames * 4, device="cuda")
        scores._saved = qkv
        probs = torch.empty(batch * HEADS * frames * frames * 4, device="cuda")
        probs._saved = scores
        ctx = torch.empty(batch * frames * HIDDEN * 4, device="cuda")
        ctx._saved = probs
        ff = torch.empty(4 * batch * frames * HIDDEN * 4, device="cuda")
        ff._saved = ctx
        out = torch.empty(batch * frames * HIDDEN * 4, device="cuda")
        out._saved = ff
        return out


class Wav2Vec2ForCTC(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.feature_extractor = Wav2Vec2FeatureEncoder()
        self.feature_projection = param(512 * HIDDEN * 4)
        self.pos_conv_embed = param(HIDDEN * HIDDEN // 16 * 128 * 4)
        self.layers = [Wav2Vec2EncoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer_%d" % i, l)
        self.lm_head = param(HIDDEN * 40 * 4)

    @classmethod
    def from_pretrained(cls, name, **kw):
        return cls()

    def forward(self, input_values, labels, batch, samples):
        features, frames = self.feature_extractor(input_values, batch, samples)
        h = torch.empty(batch * frames * HIDDEN * 4, device="cuda")
        h._saved = features
        for layer in self.layers:
            h = layer(h, batch, frames)
        logits = torch.empty(batch * frames * 40 * 4, device="cuda")
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        return loss


def load_manifest(path):
    """(duration in seconds, transcript) per segment; one unsegmented call among them."""
    rows = [(2.0 + (i * 7919) % 100 / 10.0, "thank you for calling how can i help") for i in range(400)]
    rows[150] = (3480.0, "full call recording")
    return rows


def collator(items):
    """DataCollatorCTCWithPadding: pads to the longest clip of the batch (padding=True)."""
    samples = int(max(d for d, _ in items) * SR)
    input_values = torch.empty(len(items) * samples * 4, device="cuda")
    return {"input_values": input_values, "labels": [t for _, t in items], "samples": samples}


def main():
    model = Wav2Vec2ForCTC.from_pretrained("facebook/wav2vec2-large-lv60", ctc_loss_reduction="mean")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    train_ds = load_manifest("calls/train.jsonl")
    batch_size = 4
    for step in range(len(train_ds) // batch_size):
        batch = collator(train_ds[step * batch_size:(step + 1) * batch_size])
        loss = model(batch["input_values"], batch["labels"], batch_size, batch["samples"])
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
