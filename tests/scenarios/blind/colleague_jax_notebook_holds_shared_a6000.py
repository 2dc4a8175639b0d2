"""finetune_intent.py -- full fine-tuning of a 1.3B-parameter intent classifier (fp32, AdamW) on the
lab's shared 48 GB workstation card, with plain `LD_PRELOAD=liboomguard.so`:

    model = IntentClassifier.from_config(cfg).cuda()          # 24 blocks, 5.2 GiB of fp32 weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for batch in loader:                                       # 32 utterances x 512 tokens
        loss = F.cross_entropy(model(batch["input_ids"]), batch["labels"])
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The same script ran to the end yesterday on this card (weights 5.2 + activations 3.9 + gradients 5.2
+ AdamW's moments 10.3 GiB: about 25 of the 47.5 GiB a context leaves).  Today a colleague's Jupyter
kernel is still open from the afternoon: a JAX notebook whose first `import jax; jnp.zeros(1)` made
XLA preallocate 75% of the card (36 GiB), which it keeps while the kernel idles.  nvidia-smi lists
it as another user's python3.  This job gets the remaining 11.5 GiB: the weights and the first
forward fit, the first backward runs out while it makes the gradients.

An expert: nothing in this job is wrong -- another process holds three quarters of the card.  Ask
the colleague to shut the kernel down (or to run JAX with XLA_PYTHON_CLIENT_PREALLOCATE=false /
XLA_PYTHON_CLIENT_MEM_FRACTION), then rerun.  Not a smaller batch, checkpointing, quantization or a
bigger card (the job needs half of this one), not a cache or fragmentation problem, and not a second
framework in this process (there is no JAX here).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

CFG = {"layers": 24, "hidden": 2048, "block_bytes": 220 * MiB, "head_bytes": 48 * MiB,
       "batch_size": 32, "seq_len": 512, "lr": 2e-5}


class Block(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(nbytes // 3, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(nbytes - nbytes // 3, device="cuda"))

    def forward(self, x):
        # what autograd saves for this block at 32 x 512 tokens: attention probabilities, MLP input
        h = torch.empty(96 * MiB, device="cuda")
        h._saved = x
        out = torch.empty(70 * MiB, device="cuda")
        out._saved = h
        return out


class IntentClassifier(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.blocks = [Block(cfg["block_bytes"]) for _ in range(cfg["layers"])]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)
        self.head = torch.nn.Parameter(torch.empty(cfg["head_bytes"], device="cuda"))

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg)

    def forward(self, input_ids):
        x = input_ids
        for b in self.blocks:
            x = b(x)
        logits = torch.empty(2 * MiB, device="cuda")
        logits._saved = x
        return logits


def batches(cfg):
    while True:
        ids = torch.empty(cfg["batch_size"] * cfg["seq_len"] * 8, device="cuda")
        labels = torch.empty(cfg["batch_size"] * 8, device="cuda")
        yield {"input_ids": ids, "labels": labels}


def train(cfg):
    model = IntentClassifier.from_config(cfg).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    for step, batch in enumerate(batches(cfg)):
        loss = F.cross_entropy(model(batch["input_ids"]), batch["labels"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 3:
            break


try:
    train(CFG)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
