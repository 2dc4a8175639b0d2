"""finetune_esm2_loc.py -- full fine-tuning of ESM-2 650M (facebook/esm2_t33_650M_UR50D, 651M params,
fp32 master weights 2.4 GiB) for 10-class subcellular localization (DeepLoc), bf16 autocast, on one
24 GB RTX A5000.  Sequences are cropped at 1024 residues, so I already went down to
per_device_train_batch_size=1 and use gradient_accumulation_steps=8 to get an effective batch of 8.
I wanted the accumulated loss for my progress bar, so I wrote the loop like this:

    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        total_loss = total_loss + out.loss / accum_steps      # keep the running loss
        if (step + 1) % accum_steps == 0:
            total_loss.backward()                              # one backward for the 8 micro-batches
            optimizer.step(); optimizer.zero_grad(); total_loss = 0.0

"CUDA out of memory" at the 6th micro-batch of the very first accumulation window, in the forward
pass.  With accum_steps=2 it trained.  I thought accumulation costs the memory of one micro-batch.

What an expert sees: summing the micro-batch losses into one tensor and calling backward once keeps
the autograd graph -- every saved activation, ~3.9 GiB per 1024-residue sequence with ESM's eager
attention -- of every micro-batch alive until the end of the window, so the memory is that of the
effective batch (8 sequences), not of one.  Call backward on each micro-batch's loss
(`(out.loss / accum_steps).backward()`) and keep the float for logging (`running += loss.item()`).
A smaller micro-batch is impossible (it is 1) and would change nothing with this loop anyway; no
cache, fragmentation or other-process problem; not inference.
"""
import sys

import torch
from torch import nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# -- stand-in scaffolding: the stand-in torch computes nothing and has no tensor arithmetic; `a + b`
# and `a / n` make a new scalar in the graph of their inputs, as PyTorch's do (compiled as torch's own
# code, as PyTorch's operators are not the program's frames)
_OPS = """
def _arith(a, b):
    out = empty(512, device=a.device)
    out._saved = a
    if isinstance(b, Tensor):
        out._other = b
        return _derive(out, a, b)
    return _derive(out, a)

def _radd(a, b):
    return _arith(a, b)

Tensor.__add__ = _arith
Tensor.__radd__ = _radd
Tensor.__truediv__ = _arith
Tensor.__mul__ = _arith
"""
exec(compile(_OPS, torch.__file__, "exec"), vars(torch))

HIDDEN, HEADS, FFN, LAYERS, VOCAB = 1280, 20, 5120, 33, 33
MAX_LEN = 1024


class EsmLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        # 4*h*h attention + 2*h*ffn MLP + norms/biases: ~19.7M params, fp32
        self.attention = nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN * 4, device="cuda"))
        self.mlp = nn.Parameter(torch.empty(2 * HIDDEN * FFN * 4 + 12 * HIDDEN * 4, device="cuda"))

    def forward(self, h, seq_len):
        b = h.nbytes // (seq_len * HIDDEN * 4)
        ln = torch.empty(b * seq_len * HIDDEN * 4, device="cuda")            # LayerNorm out (fp32)
        ln._saved = h
        qkv = torch.empty(b * seq_len * 3 * HIDDEN * 2, device="cuda")       # bf16 under autocast
        qkv._saved = ln
        probs = torch.empty(b * HEADS * seq_len * seq_len * 4, device="cuda")    # eager softmax, fp32
        probs._saved = qkv
        ctx = torch.empty(b * seq_len * HIDDEN * 2, device="cuda")
        ctx._saved = probs
        ln2 = torch.empty(b * seq_len * HIDDEN * 4, device="cuda")
        ln2._saved = ctx
        up = torch.empty(b * seq_len * FFN * 2, device="cuda")
        up._saved = ln2
        act = torch.empty(b * seq_len * FFN * 2, device="cuda")              # GELU
        act._saved = up
        out = torch.empty(b * seq_len * HIDDEN * 4, device="cuda")           # residual stream, fp32
        out._saved = act
        return out


class EsmForSequenceClassification(nn.Module):
    def __init__(self, num_labels=10):
        nn.Module.__init__(self)
        self.embeddings = nn.Parameter(torch.empty(VOCAB * HIDDEN * 4 + MAX_LEN * HIDDEN * 4, device="cuda"))
        self.layers = []
        for i in range(LAYERS):
            layer = EsmLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.classifier = nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN * num_labels) * 4, device="cuda"))
        self.num_labels = num_labels

    def forward(self, input_ids, labels):
        b, seq_len = 1, MAX_LEN
        h = torch.empty(b * seq_len * HIDDEN * 4, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h, seq_len)
        logits = torch.empty(b * self.num_labels * 4, device="cuda")
        logits._saved = h
        logits = F.cross_entropy(logits, labels)
        return Output(logits)


class Output(object):
    def __init__(self, loss):
        self.loss = loss


def batches():
    while True:
        yield {"input_ids": torch.empty(MAX_LEN * 8, device="cuda"), "labels": torch.empty(8, device="cuda")}


def main():
    model = EsmForSequenceClassification(num_labels=10)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    accum_steps = 8
    per_device_train_batch_size = 1
    total_loss = 0.0
    for step, batch in enumerate(batches()):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        total_loss = total_loss + out.loss / accum_steps
        if (step + 1) % accum_steps == 0:
            scen_truth.backward(total_loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
        if step >= 400:
            break
    return per_device_train_batch_size


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
