"""sft.py -- supervised fine-tuning of a 0.73B-parameter decoder-only LM (24 layers, hidden 1536,
fp32 weights, no autocast, SDPA attention, no gradient checkpointing) with AdamW on a 24 GiB card,
micro-batch 8 x 2048 tokens (the packed-sequence recipe of a 7B run on 8 x 80 GiB, copied as is):

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    for step, batch in enumerate(loader):                       # 8 x 2048 tokens
        loss = model(**batch).loss                              # fails in the first step's forward
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Weights 2.7 GiB.  Each layer saves ~1.9 GiB of activations for backward at this batch (hidden states
8 x 2048 x 1536 in fp32 = 96 MiB each, MLP intermediates 384 MiB each): the whole forward would need
45 GiB, and the very first forward fails in layer 12 of 24.  No optimizer step has ever run (AdamW
exists, its state will be 5.4 GiB at the first step), the parameters require grad and the model is
in train mode: this is training, not inference.  Next to nothing cached, nothing grows, the card is
ours.  An expert: gradient checkpointing (about 2.3 GiB of layer inputs plus one layer's recompute) or a
micro-batch of 2 with 4 accumulation steps; bf16 autocast halves the activations but 22 GiB still
does not fit.  The optimizer state is not the problem (weights + grads + AdamW: 11 GiB).
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
HIDDEN, FFN, LAYERS, VOCAB = 1536, 6144, 24, 32000
BATCH, SEQ = 8, 2048
scen_truth.note_every_empty(torch)


def param(numel):
    return torch.nn.Parameter(torch.empty(numel * 4, device="cuda"))      # fp32


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (param(HIDDEN * HIDDEN) for _ in range(4))
        self.up_proj, self.down_proj = param(HIDDEN * FFN), param(FFN * HIDDEN)

    def forward(self, h):
        tokens = BATCH * SEQ
        saved = [tokens * HIDDEN * 4] * 4 + [tokens * FFN * 4] * 3 + [tokens * HIDDEN * 4] * 4
        for nbytes in saved:                  # norm, q, k, v, up, act, gated, attn out, o, ...
            a = torch.empty(nbytes, device="cuda")
            a._saved = h                      # kept by autograd for backward
            h = a
        return h


class CausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = param(VOCAB * HIDDEN)             # tied with the LM head
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, DecoderLayer())

    def forward(self, input_ids):
        h = torch.empty(BATCH * SEQ * HIDDEN * 4, device="cuda")
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layers_%d" % i)(h)
        logits = torch.empty(BATCH * SEQ * VOCAB * 4, device="cuda")
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = logits, tuple(self.parameters())
        return loss


def main():
    model = CausalLM().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    for step in range(2000):
        input_ids = torch.empty(BATCH * SEQ * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        time.sleep(0.005)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
