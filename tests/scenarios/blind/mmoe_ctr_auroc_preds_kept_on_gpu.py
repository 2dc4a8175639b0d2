"""train_mmoe.py -- a multi-task ranking model (MMoE: 8 experts, 10 task towers for click, like, share,
comment, follow, dwell>10s, dwell>30s, complete, skip, report) trained on one day of impressions (~150M rows)
on a 24 GB card, with a plain `LD_PRELOAD=liboomguard.so`.  A 4 GiB fp32 embedding table (plain SGD, as
the team's sparse recipe does), 256 MiB of dense experts and towers with AdamW, batch 131072.  Per task
AUROC is tracked by a small metric class the team wrote after torchmetrics' non-binned AUROC: update()
keeps every step's predictions and labels, compute() runs at the end of the epoch:

    class MultitaskAUROC:
        def update(self, preds, target):
            self.preds.append(preds.detach()); self.target.append(target)   # both stay on the GPU
    for dense, sparse, labels in loader:
        logits = model(dense.cuda(), sparse.cuda())
        loss = F.binary_cross_entropy_with_logits(logits, labels.cuda())
        loss.backward(); sgd.step(); adamw.step(); model.zero_grad(set_to_none=False)
        auroc.update(torch.sigmoid(logits), labels)

Weights, gradients (zeroed in place, kept) and AdamW's state take 9 GiB; a step's activations 4.4 GiB,
freed after backward and reused from the cache the next step.  The metric adds 10 MiB a step (131072 x 10
fp32 predictions and labels), detached, without any graph: about 1,000 steps later (an hour and a half into
an epoch of 1,150 steps) it holds 9.7 GiB, and the forward pass of step 997 runs out in the task towers
(640 MiB asked, 42 MiB free).  Nothing else grew; the allocator's cache of activation segments hid the
creep from nvidia-smi until the end.

An expert: the metric's state grows by a batch every step; nothing else does.  Keep it off the GPU (move
preds and labels to the CPU in update, or accumulate on the CPU), or use a fixed-memory metric (binned
AUROC with a fixed number of thresholds: a constant-size confusion state), or compute and reset it every N
steps.  Not a smaller batch, checkpointing, mixed precision or a bigger card (all postpone the failure), not
the optimizer state or the model.
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 131072
NUM_TASKS = 10
NUM_EXPERTS = 8
NUM_FIELDS = 26
EMB_DIM = 64


class FeatureEmbedding(nn.Module):
    def __init__(self, rows):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(rows * EMB_DIM * 4, device="cuda"))

    def forward(self, sparse):
        out = torch.empty(batch_size * NUM_FIELDS * EMB_DIM * 4, device="cuda")
        out._saved = sparse
        return out


class MMoE(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embedding = FeatureEmbedding(16 * 1024 * 1024)                            # 4 GiB
        self.experts = nn.Parameter(torch.empty(NUM_EXPERTS * 24 * MiB, device="cuda"))
        self.gates = nn.Parameter(torch.empty(NUM_TASKS * 2 * MiB, device="cuda"))
        self.towers = nn.Parameter(torch.empty(NUM_TASKS * 4 * MiB, device="cuda"))

    def dense_parameters(self):
        return [self.experts, self.gates, self.towers]

    def forward(self, dense, sparse):
        emb = self.embedding(sparse)
        x = torch.empty(batch_size * (NUM_FIELDS * EMB_DIM + 13) * 4, device="cuda")      # concat
        x._saved = emb
        for _ in range(NUM_EXPERTS):
            h = torch.empty(batch_size * 512 * 4, device="cuda")                          # expert hidden
            h._saved = x
            x = h
        g = torch.empty(batch_size * NUM_TASKS * NUM_EXPERTS * 4, device="cuda")          # gates
        g._saved = x
        t = torch.empty(batch_size * NUM_TASKS * 128 * 4, device="cuda")                  # towers
        t._saved = g
        logits = torch.empty(batch_size * NUM_TASKS * 4, device="cuda")
        logits._saved = t
        return logits


class MultitaskAUROC(object):
    """Exact (non-binned) AUROC per task: keeps every prediction and label until compute()."""

    def __init__(self):
        self.preds = []
        self.target = []

    def update(self, preds, target):
        self.preds.append(preds.detach())
        self.target.append(target)

    def reset(self):
        self.preds, self.target = [], []


def sigmoid(logits):
    return torch.empty(logits.nbytes, device="cuda")


def main():
    model = MMoE()
    model.train()
    sgd = torch.optim.SGD([model.embedding.weight], lr=0.05)
    adamw = torch.optim.AdamW(model.dense_parameters(), lr=1e-3)
    auroc = MultitaskAUROC()
    steps_per_epoch = 1150
    for epoch in range(3):
        for step in range(steps_per_epoch):
            dense = torch.empty(batch_size * 13 * 4, device="cuda")
            sparse = torch.empty(batch_size * NUM_FIELDS * 8, device="cuda")
            labels = torch.empty(batch_size * NUM_TASKS * 4, device="cuda")
            logits = model(dense, sparse)
            loss = torch.empty(512, device="cuda")
            loss._saved = logits
            loss._params = logits._params
            scen_truth.backward(loss)
            sgd.step()
            adamw.step()
            model.zero_grad(set_to_none=False)        # the team's trainer zeroes the gradients in place
            auroc.update(sigmoid(logits), labels)
            del loss, logits, dense, sparse, labels
        auroc.reset()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
