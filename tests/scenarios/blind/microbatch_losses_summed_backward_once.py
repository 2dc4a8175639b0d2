"""pretrain_gpt.py -- continued pre-training of a 350M-parameter GPT (fp32 weights, 1.5 GiB) on one
24 GiB card.  The micro-batch (2 x 1,024 tokens) is what fits, so the script reaches its effective batch of
16 sequences with 8 micro-batches per optimizer step -- but it adds the micro-batch losses up and calls
backward once, "so the average is exact":

    for step, batches in enumerate(chunks(loader, accum_steps)):
        total_loss = 0.0
        for micro in batches:
            out = model(micro["input_ids"], labels=micro["labels"])
            total_loss = total_loss + out.loss / accum_steps
        total_loss.backward()
        optimizer.step(); optimizer.zero_grad()

Each micro-batch's loss keeps its whole autograd graph alive (24 layers x 176 MiB of saved activations
plus the logits and their log-softmax, about 5 GiB) until the single backward; the graphs of the first
four micro-batches fill 20 GiB and the fifth runs out in the middle of its forward, on the very first
optimizer step.  One micro-batch's graph is all the card ever needed to hold.

An expert: call backward on every micro-batch's loss (loss / accum_steps).backward() -- the gradients
accumulate in .grad, the result is the same -- and the peak drops to one micro-batch's graph.  Not a
smaller micro-batch (the job already accumulates; it would only postpone the failure by a micro-batch or
two), not inference, not the cache or fragmentation, not sharding or an 8-bit optimizer (the optimizer
state does not even exist yet).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


# -- stand-in scaffolding: the fake torch computes nothing and has no arithmetic; a scalar result of
# `a + b` or `a / n` is a new 512-byte tensor in the autograd graph of its tensor operands, which it
# keeps alive for backward, as PyTorch's AddBackward / DivBackward nodes keep their inputs' graphs.
def _binary(a, b):
    out = torch.empty(512, device="cuda")
    ts = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    out._saved = ts[0]
    out._other = ts[1] if len(ts) > 1 else None
    return torch._derive(out, *ts)


torch.Tensor.__add__ = _binary
torch.Tensor.__radd__ = _binary
torch.Tensor.__truediv__ = _binary
# -- end of scaffolding


class GPTBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(56 * MiB, device="cuda"))      # 14M fp32 params

    def forward(self, x):
        h = torch.empty(176 * MiB, device="cuda")     # attention and MLP activations saved for backward
        h._saved = x
        return h


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class GPT(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(50257 * 1024 * 4, device="cuda"))
        self.blocks = [GPTBlock() for _ in range(n_layers)]
        for i, b in enumerate(self.blocks):
            setattr(self, "h%d" % i, b)

    def forward(self, input_ids, labels=None):
        x = torch.empty(2 * 1024 * 1024 * 4, device="cuda")          # token embeddings
        x._saved = input_ids
        for block in self.blocks:
            x = block(x)
        logits = torch.empty(2 * 1024 * 50257 * 4, device="cuda")   # fp32 logits, 393 MiB
        logits._saved = x
        loss = F.cross_entropy(logits, labels)
        return CausalLMOutput(loss, logits)


def chunks(loader, n):
    batch = []
    for micro in loader:
        batch.append(micro)
        if len(batch) == n:
            yield batch
            batch = []


def loader():
    for _ in range(1000):
        yield {"input_ids": torch.empty(2 * 1024 * 8, device="cuda"),
               "labels": torch.empty(2 * 1024 * 8, device="cuda")}


def main():
    model = GPT()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    accum_steps = 8
    for step, batches in enumerate(chunks(loader(), accum_steps)):
        total_loss = 0.0
        for micro in batches:
            out = model(micro["input_ids"], labels=micro["labels"])
            total_loss = total_loss + out.loss / accum_steps
        scen_truth.backward(total_loss)          # total_loss.backward()
        optimizer.step()
        optimizer.zero_grad()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
