"""train_mt5_legal.py -- full fine-tuning of google/mt5-large (1.23B parameters) for German->French
translation of Swiss court rulings, on the university cluster's V100 16GB nodes (the only partition
with free hours).  fp32 throughout: the user read that mT5 overflows in fp16, and a V100 has no bf16.
The loop is the Hugging Face example's, rewritten by hand:

    model = MT5ForConditionalGeneration.from_pretrained("google/mt5-large").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, batch in enumerate(loader):                 # batch 4 x 256 tokens
        loss = model(**batch).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad()

Weights 4.6 GiB (the 250k-token vocabulary alone is two 0.95 GiB matrices: the input embedding and
the untied lm_head), gradients 4.6 GiB, activations of batch 4 x 256 (with 1 GiB of fp32 logits)
about 5.9 GiB at the forward's peak, freed by backward.  Forward and backward of step 0 go through;
AdamW's first step then makes exp_avg and exp_avg_sq for every parameter, 9.2 GiB more, and the card
has 6.4 GiB left (the freed activations' cache is reused for the first moments): the optimizer dies
two thirds of the way through its state, at step 0, before the first loss is logged.

What the user says: "batch 4 is already tiny, and it fails even at batch 1?"  (It does: the
activations are gone when it fails.)  What an expert says first: the optimizer state is the
problem, not the batch: use Adafactor, the optimizer mT5 was trained with (factored second
moments, no first moment: a few MiB of state instead of 9.2 GiB) -- NEW remedy id
`adafactor_optimizer`; an 8-bit AdamW (bitsandbytes, 2.3 GiB of state) is an acceptable second,
and so is training LoRA adapters instead of all 1.23B weights.  Wrong advice: a smaller batch,
gradient checkpointing or shorter sequences (activations are not what is left on the card), mixed
precision (AMP keeps fp32 weights and fp32 moments: the step needs the same 9.2 GiB), the
allocator's settings or empty_cache (nothing useful is cached), a leak (step 0).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20

D_MODEL, D_FF, VOCAB = 1024, 2816, 250112
LAYERS = 24                                   # encoder and decoder each
SELF_ATTN = 4 * D_MODEL * D_MODEL * 4         # q, k, v, o
CROSS_ATTN = 4 * D_MODEL * D_MODEL * 4
FFN = 3 * D_MODEL * D_FF * 4                  # gated-GELU: wi_0, wi_1, wo
BATCH, SRC_LEN, TGT_LEN = 4, 256, 256


class Linear(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(nbytes, device="cuda"))


class T5Block(nn.Module):
    def __init__(self, cross):
        nn.Module.__init__(self)
        self.self_attn = Linear(SELF_ATTN)
        if cross:
            self.cross_attn = Linear(CROSS_ATTN)
        self.ffn = Linear(FFN)
        self.act_bytes = BATCH * SRC_LEN * (D_MODEL * 10 + D_FF * 3) * 4 + BATCH * 16 * SRC_LEN * SRC_LEN * 4 * 2

    def forward(self, h):
        for sub in self._modules.values():
            sub.weight                                      # the matmuls read their weights
        out = torch.empty(self.act_bytes, device="cuda")     # what autograd saves for backward
        out._saved = h
        return out


class MT5ForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.shared = Linear(VOCAB * D_MODEL * 4)
        self.encoder = nn.Module()
        self.decoder = nn.Module()
        for i in range(LAYERS):
            setattr(self.encoder, "block_%d" % i, T5Block(False))
            setattr(self.decoder, "block_%d" % i, T5Block(True))
        self.lm_head = Linear(VOCAB * D_MODEL * 4)

    def forward(self, input_ids, labels):
        h = torch.empty(BATCH * SRC_LEN * D_MODEL * 4, device="cuda")
        h._saved = input_ids
        self.shared.weight
        for i in range(LAYERS):
            h = getattr(self.encoder, "block_%d" % i)(h)
        for i in range(LAYERS):
            h = getattr(self.decoder, "block_%d" % i)(h)
        logits = torch.empty(BATCH * TGT_LEN * VOCAB * 4, device="cuda")
        logits._saved = h
        self.lm_head.weight
        loss = torch.empty(4, device="cuda")
        loss._saved = logits
        return torch._derive(loss, logits, h)


def main():
    model = MT5ForConditionalGeneration().cuda()
    model.train()
    print("weights: %.2f GiB" % (torch.cuda.memory_allocated() / (1 << 30)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(20000):
        input_ids = torch.empty(BATCH * SRC_LEN * 8, dtype=None, device="cuda")
        labels = torch.empty(BATCH * TGT_LEN * 8, device="cuda")
        loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print("step %d" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
