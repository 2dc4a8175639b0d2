"""finetune_atac.py -- a genomics lab fine-tunes its own DNA language model (a 24-layer, 1024-wide,
16-head BERT-style encoder over BPE-tokenized DNA, ~305M parameters, pretrained in-house) to predict
chromatin accessibility (ATAC-seq signal) of candidate enhancer regions, on one L4 (24 GB, 22.5 GiB
usable).  The encoder uses ALiBi instead of position embeddings, so it can take regions of any length:
200 bp to 16 kb, 40 to 3,200 tokens.  The collator pads each batch to its longest region (to a multiple
of 8 for the tensor cores) and packs batches to a budget of 8,192 tokens; training runs under bf16
autocast with AdamW.  Attention is F.scaled_dot_product_attention with the ALiBi bias as a float
attn_mask, and because building the bias for every forward showed up in the profiler, the postdoc
memoized it on the encoder:

    class AlibiEncoder(nn.Module):
        def __init__(self, cfg):
            ...
            self._alibi = {}

        def alibi(self, seq_len):
            bias = self._alibi.get(seq_len)
            if bias is None:
                bias = build_alibi(self.slopes, seq_len)       # (heads, L, L), bf16
                self._alibi[seq_len] = bias
            return bias

Every new padded length adds a (16, L, L) bf16 tensor that is never dropped: 1 MiB for L = 184, 314 MiB
for L = 3,208.  The dict keeps every length ever seen.  The short, common lengths all come in the first
minutes; the long, rare ones keep arriving (a batch's L is its longest region), so the usage climbs fast,
then creeps: 1.3 GiB of biases after 100 steps, 6.2 GiB after 1,000, 9.9 GiB (216 lengths) after 3,777.
Weights and AdamW state are 3.4 GiB, a step's activations ~7 GiB.  The job dies 40 minutes in, in the
backward of step 3,777, whose longest region (1,952 tokens) is a length it had not met before: the dict
has just grown by 116 MiB, and allocating a layer's gradient finds 40 MiB free and 1.1 GiB cached in
pieces smaller than the request.

An expert: the memory that grows is not the activations, not a leaked graph: it is the bias cache, a
dict on the module that holds one (heads, L, L) tensor per distinct sequence length, unbounded.  Build
the bias once for the maximum length and slice it (bias[:, :L, :L]), or keep a bounded cache (a few
lengths), or pad batches to a handful of bucket lengths; flash-attention's alibi_slopes removes the
materialized bias altogether.  Wrong first advice: a smaller batch or gradient checkpointing (the
activations are bounded by the token budget and were fine for 3,700 steps), expandable_segments or
empty_cache (the tensors are live, held by the dict; the 1.1 GiB of cached pieces would buy a few
hundred steps while the dict keeps growing ~1 GiB per 1,000), a bigger GPU (the same failure later),
shorter sequences (the model is for long regions; the growth stays).  The cause is growth, not fragmentation:
allocated memory right after each optimizer step rises from 5.6 GiB at step 200 to 13.2 GiB.
"""
import math
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
HIDDEN, HEADS, LAYERS, FFN, VOCAB = 1024, 16, 24, 4096, 4096
TOKENS_PER_BATCH = 8192


class EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        # qkv + out projection, FFN in + out, norms: 12.6M parameters, fp32 (one flat tensor here: the
        # stand-in's sizes, not the layout)
        self.weight = nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN + 4 * HIDDEN + 2 * HIDDEN * FFN + FFN + 3 * HIDDEN,
                                               dtype=torch.float32, device="cuda"))

    def forward(self, h, bias, n_tokens):
        # F.scaled_dot_product_attention(q, k, v, attn_mask=bias): the memory-efficient kernel reads the
        # bf16 (heads, L, L) mask in place.  What autograd keeps of the layer: q, k, v, the attention output and its log-sum-exp, two layer
        # norms, the FFN input and its GELU, and the layer's output
        out = torch.empty(n_tokens * (10 * HIDDEN + 2 * FFN + HEADS), dtype=torch.bfloat16, device="cuda")
        out._saved = h
        return out


def build_alibi(slopes, seq_len):
    """(heads, L, L): -slope_h * |i - j|, made in bf16 (the dtype SDPA wants under autocast)."""
    return torch.empty(HEADS * seq_len * seq_len, dtype=torch.bfloat16, device="cuda")


class AlibiEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.tok_emb = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, EncoderLayer())
        self.slopes = [2 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)]
        self._alibi = {}

    def alibi(self, seq_len):
        bias = self._alibi.get(seq_len)
        if bias is None:
            bias = build_alibi(self.slopes, seq_len)
            self._alibi[seq_len] = bias
        return bias

    def forward(self, input_ids, seq_len):
        n_tokens = input_ids
        bias = self.alibi(seq_len)
        h = torch.empty(n_tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            h = getattr(self, "layer_%d" % i)(h, bias, n_tokens)
        return h


class AccessibilityModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = AlibiEncoder()
        self.head = nn.Parameter(torch.empty(HIDDEN * 2, dtype=torch.float32, device="cuda"))

    def forward(self, input_ids, seq_len, batch_size):
        h = self.encoder(input_ids, seq_len)
        pred = torch.empty(batch_size * 4, dtype=torch.float32, device="cuda")   # pooled -> log signal
        pred._saved = h
        return pred


def region_batches(rng):
    """Peaks from ENCODE ATAC-seq, log-normal lengths (median ~700 bp, a long tail of broad regions up to
    16 kb); ~5.2 bp per token; a batch is filled up to the token budget and padded to its longest."""
    while True:
        lens = []
        longest = 0
        while True:
            bp = min(16000, max(200, int(rng.lognormvariate(math.log(700), 0.95))))
            n = bp // 5 + 2
            cand = max(longest, n)
            if cand * (len(lens) + 1) > TOKENS_PER_BATCH and lens:
                break
            lens.append(n)
            longest = cand
        seq_len = (longest + 7) // 8 * 8
        yield len(lens), seq_len


def _mse_loss(input, target, reduction="mean"):
    """torch.nn.functional.mse_loss, which the stand-in torch lacks: a scalar in the input's graph."""
    from torch.autograd._graph import derive
    loss = torch.empty(512, dtype=torch.float32, device=input.device)
    loss._saved = input
    return derive(loss, input)


F = torch.nn.functional
F.mse_loss = _mse_loss

model = AccessibilityModel().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
rng = random.Random(20260412)
batches = region_batches(rng)

try:
    for step in range(1, 40001):
        batch_size, seq_len = next(batches)
        target = None             # the log ATAC signal of each region (host side in this sketch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(batch_size * seq_len, seq_len, batch_size)
            loss = F.mse_loss(pred, target)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del pred, loss
        if step % 200 == 0:
            print("step %5d  L=%4d  bsz=%3d  allocated %.2f GiB  reserved %.2f GiB" % (
                step, seq_len, batch_size, torch.cuda.memory_allocated() / GiB,
                torch.cuda.memory_reserved() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    print("OOM at step", step, "seq_len", seq_len, "batch", batch_size, file=sys.stderr)
    raise
sys.exit(0)
