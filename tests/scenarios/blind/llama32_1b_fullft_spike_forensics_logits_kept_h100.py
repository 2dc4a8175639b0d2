"""sft_1b.py -- full fine-tuning of Llama-3.2-1B (bf16 weights, AdamW, gradient checkpointing) on one
H100 80GB, micro batch 4 x 2048 tokens.  Last week's run had loss spikes, so I added a "forensics"
buffer: the last 64 steps' batch, logits and loss, to dump to disk when the loss jumps:

    recent_steps = []                                  # for post-mortem of loss spikes
    for step, batch in enumerate(loader):
        out = model(**batch)                           # HF computes the loss inside (float32 upcast)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        recent_steps.append({"step": step, "input_ids": batch["input_ids"],
                             "logits": out.logits.detach(), "loss": out.loss.detach()})
        if len(recent_steps) > 64:
            recent_steps.pop(0)
        if spiked(out.loss): dump(recent_steps)

The user: "Before the buffer the run peaked at 20 GiB for days.  Now it dies with CUDA OOM around step 30,
in loss.backward().  I detach everything I keep, so no graph is kept; where does the memory go?"

Detached is not freed: each entry keeps that step's bf16 logits on the GPU, 4 x 2048 x 128256 x 2 bytes
= 1.96 GiB a step.  After ~30 steps the buffer holds ~60 GiB and the next step's backward (the
gradients, 2.3 GiB, beside that step's saved float32 logits) does not fit.  Memory after each optimizer
step rises by the same 1.96 GiB every step.

An expert: stop keeping per-step logits on the GPU: keep what the post-mortem needs (input ids, the
per-token loss, .cpu() copies) or a much shorter window -- the buffer is the leak.  Not a smaller
batch, gradient checkpointing (on already), mixed precision, an 8-bit optimizer or ZeRO: the job fits
in 20 GiB; not empty_cache or allocator settings: the buffer's logits are live tensors.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
BF16 = torch.bfloat16

HIDDEN, VOCAB, LAYERS = 2048, 128256, 16
LAYER_BYTES = 116 * MiB            # one Llama-3.2-1B decoder layer (attention + MLP), bf16
EMBED_BYTES = VOCAB * HIDDEN * 2   # 501 MiB, tied with the LM head


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss = loss
        self.logits = logits


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(LAYER_BYTES // 2, dtype=BF16, device="cuda"))

    def forward(self, hidden, tokens):
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")      # checkpointed: only the input stays
        out._saved = hidden
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_BYTES // 2, dtype=BF16, device="cuda"))
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16, device="cuda"))
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, attention_mask=None, labels=None):
        tokens = input_ids.nbytes // 8
        emb = self.embed_tokens
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens)
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")   # lm_head (tied to embed_tokens)
        logits._saved = hidden
        loss = None
        if labels is not None:
            upcast = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")   # logits.float()
            upcast._saved = logits
            loss = F.cross_entropy(upcast, labels)
        return CausalLMOutput(loss, logits)


recent_steps = []                  # for post-mortem of loss spikes


def spiked(loss):
    return False


def dump(entries):
    pass


def main():
    micro_batch_size = 4
    seq_len = 2048
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=BF16).cuda()
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.1)
    for step in range(20000):
        tokens = micro_batch_size * seq_len
        batch = {"input_ids": torch.empty(tokens * 8, device="cuda"),          # int64 token ids
                 "attention_mask": torch.empty(tokens * 8, device="cuda"),
                 "labels": torch.empty(tokens * 8, device="cuda")}
        out = model(**batch)
        scen_truth.backward(out.loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        recent_steps.append({"step": step, "input_ids": batch["input_ids"],
                             "logits": out.logits.detach(), "loss": out.loss.detach()})
        if len(recent_steps) > 64:
            recent_steps.pop(0)
        if spiked(out.loss):
            dump(recent_steps)
        del out, batch


scen_truth.note_every_empty(torch)
torch.cuda.init()
# truth mark at the failure itself (test scaffolding)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
