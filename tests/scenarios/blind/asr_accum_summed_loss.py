"""finetune_asr.py -- fine-tuning a 770M-parameter speech encoder-decoder (fp32, AdamW) for a new
language with an effective batch of 128 clips as 16 micro-batches of 8, on a 24 GiB card.  The
accumulation was written by summing the losses and calling backward once per step:

    for step, micro_batches in enumerate(chunked(loader, 16)):
        total = 0
        for mb in micro_batches:
            out = model(input_features=mb["features"], labels=mb["labels"])
            total = total + out.loss / 16          # every micro-batch's graph stays alive
        total.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Each micro-batch's forward saves ~1.4 GiB of activations (30 s of audio: 1500 encoder frames x 24
layers) that stay alive until the single backward; the 15th micro-batch of the very first step
does not fit.  Nothing leaks across steps; the build-up is inside one step.  An expert: call
backward per micro-batch ((out.loss / 16).backward() inside the loop, one optimizer step after the
16th), so only one micro-batch's activations are alive at a time; a smaller micro-batch or a
bigger card only moves the failure.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
ACCUM = 16


class Block(torch.nn.Module):
    def __init__(self, mib):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(30 * MiB, device="cuda")          # attention + MLP inputs saved for backward
        a._saved = h
        return a


class SpeechSeq2Seq(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = [Block(60) for _ in range(24)]
        self.decoder = [Block(60) for _ in range(24)]
        for i, b in enumerate(self.encoder + self.decoder):
            setattr(self, "block%d" % i, b)

    def forward(self, features):
        h = features
        for b in self.encoder + self.decoder:
            h = b(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def chunked(n_steps):
    for step in range(n_steps):
        yield [torch.empty(8 * 80 * 3000 * 4, device="cuda") for _ in range(ACCUM)]  # log-mel, 8 clips


def main():
    model = SpeechSeq2Seq().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step, micro_batches in enumerate(chunked(1000)):
        total = None
        for mb in micro_batches:
            loss = model(mb)
            total = loss if total is None else _add(total, loss)      # total + out.loss / 16
        scen_truth.backward(total)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _add(a, b):
    """a + b (the stand-in computes nothing): the sum keeps both operands' graphs."""
    s = torch.empty(512, device="cuda")
    s._saved, s._params, s._prev = b, a._params, a
    return s


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
