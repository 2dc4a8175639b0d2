"""pretrain.py -- pretraining a 2.1B-parameter decoder (32 layers, d_model 2304) from scratch on one A100
40 GB: fp32 master weights with bf16 autocast, AdamW, activation checkpointing on every block,
micro-batch 4 x 2048.  torch.save of weights + optimizer blocked training for ~90 s per checkpoint, so I
wrote a "fast" asynchronous checkpoint: clone everything on the GPU (device-to-device is quick), hand the
clones to a background thread that moves them to the CPU and writes them, and carry on training:

    def async_checkpoint(model, optimizer, step):
        snapshot = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                    "optim": copy.deepcopy(optimizer.state_dict()),
                    "step": step}
        threading.Thread(target=_write, args=(snapshot, f"ckpt/step{step}.pt"), daemon=True).start()

    for step, batch in enumerate(loader, 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % 200 == 0:
            async_checkpoint(model, optimizer, step)

Training was rock steady at ~35 GB for 200 steps (about 20 minutes), then the first checkpoint died
with CUDA out of memory inside the deepcopy of the optimizer state.

What an expert sees: a GPU copy of the whole training state made after a long steady run.  Weights are
8.0 GiB in fp32 and AdamW's two moments 16.0 GiB; after zero_grad the gradients are gone, but the
snapshot needs 8 + 16 = 24 GiB more on a card where the live state already takes 24 GiB.  (The failing
request is small and the cache holds ~0.9 GiB in pieces, but that is the tail of a 24 GiB copy.)  The
copy must not be staged on the GPU: copy into (pinned) CPU memory -- `v.to("cpu", non_blocking=True)`
into preallocated pinned buffers, then write from the thread -- or use torch.distributed.checkpoint's
async_save, which stages in host memory.  Batch size, checkpointing, autocast, sequence length change
nothing (activations are freed at that point); not the cache (the allocator gives its cache back before
failing), not fragmentation or other processes.
"""
import copy
import sys
import threading

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in has none)."""

    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class DecoderBlock(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.qkv = nn.Parameter(torch.empty(3 * d * d * 4, device="cuda"))
        self.proj = nn.Parameter(torch.empty(d * d * 4, device="cuda"))
        self.fc1 = nn.Parameter(torch.empty(4 * d * d * 4, device="cuda"))
        self.fc2 = nn.Parameter(torch.empty(4 * d * d * 4, device="cuda"))
        self.ln = nn.Parameter(torch.empty(4 * d * 4, device="cuda"))
        self.d = d

    def forward(self, x, rows):
        # checkpointed: only the block's input is kept (bf16); the rest is recomputed in backward
        out = torch.empty(rows * self.d * 2, device="cuda")
        out._saved = x
        return out


class Output(object):
    def __init__(self, loss):
        self.loss = loss


class DecoderLM(nn.Module):
    def __init__(self, layers=32, d=2304, vocab=50304):
        nn.Module.__init__(self)
        self.embed = nn.Parameter(torch.empty(vocab * d * 4, device="cuda"))
        self.blocks = ModuleList([DecoderBlock(d) for _ in range(layers)])
        self.gradient_checkpointing = True
        self.d, self.vocab = d, vocab

    def forward(self, batch, micro_batch_size=4, seq_len=2048):
        rows = micro_batch_size * seq_len
        h = torch.empty(rows * self.d * 2, device="cuda")
        for blk in self.blocks:
            h = blk(h, rows)
        logits = torch.empty(rows * self.vocab * 2, device="cuda")          # bf16 logits, tied head
        logits._saved = h
        logp = torch.empty(rows * self.vocab * 4, device="cuda")            # fp32 log_softmax for the loss
        logp._saved = logits
        loss = torch.empty(512, device="cuda")
        loss._saved = logp
        return Output(loss)


def _write(snapshot, path):
    moved = {"model": {k: v for k, v in snapshot["model"].items()}, "step": snapshot["step"]}   # .cpu() here
    torch.save(moved["model"], path)


def async_checkpoint(model, optimizer, step):
    snapshot = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optim": copy.deepcopy(optimizer.state_dict()),
                "step": step}
    threading.Thread(target=_write, args=(snapshot, "ckpt/step%d.pt" % step), daemon=True).start()


def main():
    micro_batch_size, seq_len, save_every = 4, 2048, 200
    model = DecoderLM()
    # truth mark at the failure itself (test scaffolding): leaving the deepcopy frees part of its copies
    # before an except block could mark
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(1, 100001):
        batch = torch.empty(micro_batch_size * seq_len * 8, device="cuda")          # token ids, int64
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(batch, micro_batch_size, seq_len)
        loss = out.loss
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, out, batch
        if step % save_every == 0:
            async_checkpoint(model, optimizer, step)


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
