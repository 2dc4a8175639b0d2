"""train_nougat.py -- fine-tuning Nougat-base (Swin-B encoder on 896 x 672 page images, 10-layer mBART decoder,
350 M parameters) to turn scanned chemistry papers into Markdown/LaTeX, on a cloud A10G (24 GB).  Run with plain
`LD_PRELOAD=liboomguard.so python train.py`.

    model = VisionEncoderDecoderModel.from_pretrained("facebook/nougat-base")   # fp32 master weights, eager attn
    model.config.decoder.max_length = 4096                                      # Nougat's own limit
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    loader = DataLoader(pages, batch_size=2, collate_fn=pad_to_longest)         # dynamic padding
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(pixel_values=batch["pixel_values"], labels=batch["labels"])
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()

Most pages have 600-1,500 target tokens, and a step (batch 2) peaks at ~14.7 GiB: fp32 weights and AdamW state
3.5 GiB (the gradients 1.2 GiB more while they live), the Swin encoder's activations, the decoder's eager
attention, and the logits over the 50k vocabulary in float32 for the loss.  Forty steps run fine.  Then a page
of a supplementary table (every cell a LaTeX token run) has a 4,096-token target, and pad_to_longest pads the
other page to 4,096 too.  The decoder's self-attention is quadratic in the length: per layer the softmax output
alone is 2 x 16 heads x 4096^2 x 4 B (softmax runs in float32 under autocast) = 2 GiB, plus its dropout mask
and the bf16 copy the value product saves -- ~4.4 GiB per layer, ~44 GiB for the ten layers, ~52 GiB for the
step, on a card with 22.5 GiB.  It fails in the decoder's fourth layer, asking for 1 GiB with 0.5 GiB free.
Even alone (batch 1) that page needs ~27 GiB.

What an expert says first: the eager attention is the problem at 4,096 tokens -- use SDPA / flash attention
(memory linear in the length), or checkpoint the decoder layers (gradient checkpointing); or cap / filter the
target length (Nougat-style: drop or split pages over ~1.5k tokens).  Wrong: a smaller batch (batch 1 still
needs ~27 GiB), mixed precision (bf16 autocast is on), expandable_segments / empty_cache (the need is more
than twice the card, not a layout problem), inference_mode (it trains), stopping other processes (there are none);
an 8-bit optimizer saves ~2 GiB, far too little.
"""
import random
import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.autograd._graph import derive

import scen_truth

BF16, FP32 = 2, 4
ENC_TOKENS = 588            # Swin-B output tokens for a 896 x 672 page
VOCAB = 50000
D, FFN, HEADS = 1024, 4096, 16


def _op(x, nbytes, dtype=torch.bfloat16):
    """One op autograd records: its output, saving its input for the backward (the stand-in computes nothing)."""
    out = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    out._saved = x
    return derive(out, x)


class SwinEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(88 * 1000 * 1000 * FP32, device="cuda"))

    def forward(self, pixel_values, batch):
        x = pixel_values
        # stage 1..4 of Swin-B at 896 x 672: 224 x 168 tokens x 128 channels down to 28 x 21 x 1024
        for tokens, ch, blocks in ((224 * 168, 128, 2), (112 * 84, 256, 2), (56 * 42, 512, 18), (28 * 21, 1024, 2)):
            for _ in range(blocks):
                x = _op(x, batch * tokens * ch * BF16 * 6)      # LN, qkv, window attention, proj, MLP (4x)
                x = _op(x, batch * tokens * ch * BF16 * 4)
        return _op(x, batch * ENC_TOKENS * D * BF16)


class MBartDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty((4 * D * D + 4 * D * D + 2 * D * FFN) * FP32, device="cuda"))

    def forward(self, x, enc, batch, T):
        h = _op(x, batch * T * D * BF16)                                  # self_attn_layer_norm
        qkv = _op(h, 3 * batch * T * D * BF16)                            # q, k, v projections
        scores = torch.empty(batch * HEADS * T * T, dtype=torch.bfloat16, device="cuda")   # q @ k^T (bf16)
        probs = _op(qkv, batch * HEADS * T * T * FP32, torch.float32)     # softmax: float32 under autocast,
        del scores                                                        # saves its output, not its input
        mask = _op(probs, batch * HEADS * T * T, torch.uint8)             # attention dropout mask
        dropped = _op(mask, batch * HEADS * T * T * BF16)                 # dropout output, cast for @ v
        ctx = _op(dropped, batch * T * D * BF16)                          # @ v, out_proj
        h = _op(ctx, batch * T * D * BF16)                                # encoder_attn_layer_norm
        cross = _op(h, batch * HEADS * T * ENC_TOKENS * (FP32 + 1 + BF16))  # cross-attention probs, mask, copy
        h = _op(cross, batch * T * D * BF16 * 3)
        h = _op(h, batch * T * FFN * BF16 * 3)                            # fc1, GELU, dropout
        return _op(h, batch * T * D * BF16 * 2)                           # fc2, residual


class NougatModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = SwinEncoder()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * D * FP32, device="cuda"))   # tied with lm_head
        self.embed_positions = nn.Parameter(torch.empty(4098 * D * FP32, device="cuda"))
        self.layers = [MBartDecoderLayer() for _ in range(10)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)

    def forward(self, pixel_values, labels, batch, T):
        enc = self.encoder(pixel_values, batch)
        x = _op(enc, batch * T * D * BF16)         # token + position embeddings (the chain keeps enc: cross-attn)
        x._labels = labels
        for layer in self.layers:
            x = layer(x, enc, batch, T)
        return _op(x, batch * T * VOCAB * BF16)                           # lm_head: logits, bf16


def main():
    rng = random.Random(2026)
    model = NougatModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    scen_truth.note_every_empty(torch)
    batch_size = 2
    for step in range(2000):
        # pad_to_longest: the batch is as long as its longest target; step 40 holds a supplementary-table page
        T = 4096 if step == 40 else max(rng.randint(600, 1500), rng.randint(600, 1500))
        pixel_values = torch.empty(batch_size * 3 * 896 * 672 * FP32, device="cuda")
        labels = torch.empty(batch_size * T * 8, device="cuda")          # int64 token ids
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(pixel_values, labels, batch_size, T)
                logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)  # the loss in float32
                loss = F.nll_loss(logp, labels)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark()
            raise
        del logits, logp, loss, pixel_values, labels
        if step % 10 == 0:
            print("step %d  T=%d  peak %.1f GiB" % (step, T, torch.cuda.max_memory_allocated() / 2 ** 30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
