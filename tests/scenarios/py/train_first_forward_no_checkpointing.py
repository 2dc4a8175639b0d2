"""finetune.py -- the first step of fine-tuning a 1.2B-parameter model (bf16 weights, 2.3 GiB) at long
context on a 24 GiB card, micro-batch 1 (from the config), activation checkpointing not enabled:

    args = TrainingArguments(per_device_train_batch_size=1, gradient_accumulation_steps=8, ...)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.bfloat16).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:                                  # 1 x 16384 tokens
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

Each of the 16 layers keeps 1.5 GiB of activations for backward at 16k tokens: the whole forward would
need 24 GiB, and the first forward fails in layer 14.  No optimizer step has run (AdamW exists), nothing
is cached, nothing grows.  An expert: enable gradient checkpointing (only each layer's input stays);
the batch is already 1, so a smaller batch is no answer, and bucketing by length has no batches that fit
to even out.
"""
import sys
import types

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 16
args = types.SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=8, learning_rate=1e-5)
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(72 * MiB, dtype=torch.bfloat16, device="cuda"))

    def forward(self, h):
        for nbytes in (128, 256, 384, 384, 256, 128):          # attention and MLP tensors saved for backward
            a = torch.empty(nbytes * MiB, device="cuda")
            a._saved = h
            h = a
        return h


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, Layer())

    def forward(self, input_ids):
        h = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    model = Model()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    for step in range(100):
        input_ids = torch.empty(16384 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
