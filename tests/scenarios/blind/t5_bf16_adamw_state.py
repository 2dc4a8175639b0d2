"""train_t5.py -- full fine-tuning of a 3B-parameter encoder-decoder in pure bf16 (weights, grads
and optimizer state all bf16; activation checkpointing on) with torch.optim.AdamW, on a 24 GiB
card:

    model = T5ForConditionalGeneration.from_pretrained("t5-3b", torch_dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in loader:
        loss = model(**batch).loss; loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Weights 6 GiB (bf16 already) + grads 6 GiB; the checkpointed forward and the backward fit (their
~1 GiB of activations are freed, back in the cache).  The first optimizer.step() creates exp_avg and
exp_avg_sq for every parameter, 12 GiB more, with autograd off, and fails near its end.  This is
training: the optimizer state is what does not fit.  An expert: an 8-bit (or paged) AdamW
(bitsandbytes) or Adafactor, LoRA instead of a full fine-tune, or ZeRO/FSDP sharding or
offloading the optimizer state; quantizing the weights (inference-only), a smaller batch or
more checkpointing do nothing for it, and the weights are already bf16.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

# test scaffolding: the state tensors AdamW makes stay referenced until the truth mark, as they
# would be in the failing step's frame with PyTorch (the job dies right after)
_noted_empty = torch.empty
_made = []


def _keep(nbytes, *args, **kw):
    t = _noted_empty(nbytes, *args, **kw)
    _made.append(t)
    return t


class T5Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(96 * MiB, device="cuda"))
        self.ff = torch.nn.Parameter(torch.empty(160 * MiB, device="cuda"))

    def forward(self, h):
        inner = torch.empty(96 * MiB, device="cuda")        # recomputed in backward (checkpointing)
        del inner
        out = torch.empty(32 * MiB, device="cuda")
        out._saved = h
        return out


class T5ForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = [T5Block() for _ in range(24)]              # encoder 12 + decoder 12 (wide)
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def forward(self, input_ids):
        h = input_ids
        for b in self.blocks:
            h = b(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    model = T5ForConditionalGeneration.from_pretrained("t5-3b", torch_dtype=torch.bfloat16).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(10000):
        input_ids = torch.empty(8 * 1024 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        del loss
        torch.empty = _keep
        optimizer.step()
        torch.empty = _noted_empty
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
