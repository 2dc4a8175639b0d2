"""pretrain.py -- pre-training a 1.1B-parameter TinyLlama-style LM (22 layers, hidden 2048; fp32 master
weights, bf16 autocast, AdamW, micro-batch 4 x 2048) with PyTorch Lightning on a 24 GiB card.  After
two loss spikes in an earlier run, the team added a callback that keeps a "last good" copy of the
model and optimizer every 50 steps ("it is only a copy on the GPU"), to roll back to without
reading a checkpoint from disk:

    class SpikeGuard(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx % 50 == 49 and outputs["loss"] < self.threshold:
                weights = [p.detach().clone() for p in pl_module.parameters()]          # on the GPU
                optim_state = copy.deepcopy(trainer.optimizers[0].state_dict())          # on the GPU
                self.good = {"model": weights, "optim": optim_state}

The run is flat for 50 steps: weights 4.1 GiB, AdamW state 8.2 GiB, and each step's gradients
(4.1 GiB) and activations (~6 GiB) come and go through PyTorch's warm cache (~10 GiB cached between
steps, ~1 GiB never touched).  The first snapshot clones the weights (4.1 GiB) out of the cached
blocks, then deep-copies the optimizer state (8.2 GiB): the cache and the free memory run out part
way and it fails.  A one-off copy, not a leak; no other process; the training itself fits.  An
expert: keep the snapshot in CPU memory (v.detach().to("cpu", non_blocking=True), pinned) or write it
to disk (torch.save / a checkpoint callback) and reload on a spike; not a smaller batch, not
empty_cache (the cache is reused by the clone already), not a restart.
"""
import copy
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
TOKENS = 4 * 2048


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for n, mib in (("q_proj", 16), ("k_proj", 2), ("v_proj", 2), ("o_proj", 16),
                       ("gate_proj", 44), ("up_proj", 44), ("down_proj", 44)):
            setattr(self, n, torch.nn.Parameter(torch.empty(mib * MiB, device="cuda")))

    def forward(self, h):
        a = torch.empty(TOKENS * 2048 * 8, device="cuda")       # attention block, bf16, saved for backward
        a._saved = h
        m = torch.empty(TOKENS * 2048 * 9, device="cuda")       # MLP block
        m._saved = a
        return m


class TinyLlama(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(22)]
        for i, l in enumerate(self.layers):
            setattr(self, "layers_%d" % i, l)
        self.lm_head = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))

    def forward(self, input_ids):
        h = input_ids
        for l in self.layers:
            h = l(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


class SpikeGuard(object):
    """The Lightning callback: a "last good" snapshot of model and optimizer every 50 batches."""
    threshold = 4.0

    def __init__(self):
        self.good = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % 50 == 49 and outputs["loss"] < self.threshold:
            weights = [p.detach().clone() for p in pl_module.parameters()]
            optim_state = copy.deepcopy(trainer.optimizers[0].state_dict())
            self.good = {"model": weights, "optim": optim_state}


class Trainer(object):
    """pl.Trainer.fit as far as it matters: training_step, backward, optimizer step, zero_grad
    (set_to_none), then the callbacks' on_train_batch_end."""

    def __init__(self, callbacks):
        self.callbacks = callbacks
        self.optimizers = []

    def fit(self, module, n_batches):
        self.optimizers = [torch.optim.AdamW(module.parameters(), lr=4e-4)]
        for batch_idx in range(n_batches):
            batch = torch.empty(TOKENS * 8, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = module(batch)
            scen_truth.backward(loss)
            self.optimizers[0].step()
            self.optimizers[0].zero_grad(set_to_none=True)
            module.zero_grad(set_to_none=True)
            del loss
            for cb in self.callbacks:
                cb.on_train_batch_end(self, module, {"loss": 2.9}, batch, batch_idx)
            del batch
            time.sleep(0.001)


try:
    model = TinyLlama().cuda()
    Trainer(callbacks=[SpikeGuard()]).fit(model, 100000)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
