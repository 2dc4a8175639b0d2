"""finetune_whisper.py -- full fine-tuning of Whisper large-v3 (1.55B parameters, fp32 master weights,
bf16 autocast, batch 8 of 30 s clips) for a call-centre ASR model, on one H100 80GB of the training
node pool, in the team's standard training image:

    FROM registry.internal/ml/base-train:2026.11        # the platform team's image
    # ... its Dockerfile has, since a right-sizing exercise for the L4 inference nodes:
    #     ENV LD_PRELOAD=/opt/oomguard/liboomguard.so OOMGUARD_LIMIT=20GiB
    model = WhisperForConditionalGeneration.from_pretrained("openai/whisper-large-v3").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The same script ran last month on the same node pool at about 35 GiB (weights 5.8 GiB, activations
10.7 GiB, gradients 5.8 GiB, AdamW's moments 11.6 GiB).  Since the base image was rebuilt it dies in
the first backward: "GPU 0 has a total capacity of 20.00 GiB", while nvidia-smi on the node shows an
80 GB card with nobody else on it.  The image's environment carries OOMGUARD_LIMIT=20GiB, left from
rehearsing inference services for 24 GB L4 cards; the library makes the H100 behave like a 20 GiB
card and refuses the allocation.

An expert: the limit refused it, not the card -- remove OOMGUARD_LIMIT from the training image (or
set it to the card's size) and the job fits with 45 GiB to spare.  Not a smaller batch, gradient
checkpointing, mixed precision (already on), an 8-bit optimizer or a bigger GPU: nothing about the
job needs changing; not a cache or fragmentation problem, nobody else holds the card.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

ENC_LAYERS = DEC_LAYERS = 32
LAYER_PARAMS = 90 * MiB             # fp32 bytes of one transformer block (attention + MLP)
EMBED_PARAMS = 254 * MiB            # 51,866 x 1,280 token embedding (tied output projection)
ENC_ACT = 300 * MiB                 # saved activations per encoder block: 8 x 1500 frames, bf16
DEC_ACT = 42 * MiB                  # per decoder block: 8 x 448 tokens


class Block(torch.nn.Module):
    def __init__(self, act_bytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(LAYER_PARAMS, device="cuda"))
        self.act_bytes = act_bytes

    def forward(self, x):
        h = torch.empty(self.act_bytes, device="cuda")       # what autograd saves for backward
        h._saved = x
        return h


class Whisper(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(EMBED_PARAMS, device="cuda"))
        self.encoder = [Block(ENC_ACT) for _ in range(ENC_LAYERS)]
        self.decoder = [Block(DEC_ACT) for _ in range(DEC_LAYERS)]
        for i, b in enumerate(self.encoder):
            setattr(self, "enc%d" % i, b)
        for i, b in enumerate(self.decoder):
            setattr(self, "dec%d" % i, b)

    def forward(self, input_features, labels):
        h = input_features
        for b in self.encoder:
            h = b(h)
        for b in self.decoder:
            h = b(h)
        loss = torch.empty(512, device="cuda")
        loss._saved = h
        return loss


def from_pretrained(name):
    return Whisper()


def main():
    model = from_pretrained("openai/whisper-large-v3").cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch_size = 8
    for step in range(20000):
        input_features = torch.empty(batch_size * 128 * 3000 * 2, device="cuda")     # log-mel, bf16
        labels = torch.empty(batch_size * 448 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_features, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_features, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
