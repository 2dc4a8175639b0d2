"""sku_learner.py -- the continual-training service behind a grocery chain's shelf-audit app: a
ConvNeXt-Base (with its 5,000-way head 91.7M params, 350 MiB of fp32 weights; AdamW, fp16 autocast
+ GradScaler, batch 96 at 224 px) that recognises ~5,000 SKUs from shelf crops, on one L4 (24 GB,
22.5 GiB usable), in a long-lived process (systemd, restarted only on deploys).  Every night at
02:00 it trains one pass on the day's newly labelled crops and publishes the weights.  To stop it
from forgetting products that were not photographed that day, the team added Elastic Weight
Consolidation, following the well-known single-task tutorial and extending it to "all previous nights":

    class EWC:
        def __init__(self, model, loader):
            self._means = {n: p.detach().clone() for n, p in model.named_parameters()}
            self._precision_matrices = self._diag_fisher(model, loader)   # mean of grad**2
        def penalty(self, model):
            return sum((self._precision_matrices[n] * (p - self._means[n]) ** 2).sum()
                       for n, p in model.named_parameters())

    consolidated = []                                  # one EWC per past night
    while True:
        wait_until_2am()
        for images, labels in todays_loader():
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(images), labels)
            for ewc in consolidated:
                loss = loss + lam * ewc.penalty(model)
            scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
            optimizer.zero_grad(set_to_none=True)
        consolidated.append(EWC(model, fisher_loader()))
        publish(model)

Each night adds a Fisher diagonal and an anchor copy of the weights (2 x 350 MiB, fp32) that stay
on the GPU for good, and each training step's penalty keeps one (p - anchor) per past night in the
autograd graph until backward (another 350 MiB per night).  The first night peaks at 10.7 GiB
(~9.7 GiB of activations); the peak climbs ~0.95 GiB per night; on the 12th night the training step runs out
while it builds the penalty.

An expert: memory grows by one model-sized set of tensors per night, held by the list of EWC terms
(a Python object in the service), not by the batch.  Keep one consolidated term instead of one per
night (online EWC: F <- gamma*F + F_new, anchor <- the latest weights), which is constant memory
(and a cheaper penalty); or bound the list to the last few nights.  Wrong first advice: a smaller
batch, gradient checkpointing or (more) mixed precision (each buys a few nights, then the same
failure), expandable_segments or empty_cache (the tensors are live), a bigger GPU, restarting the
process (it would lose the consolidated terms, i.e. the point of EWC, unless they are saved).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH = 96
NUM_SKUS = 5000

# ---- ConvNeXt-Base (timm), memory as what autograd keeps per block at 224 px in fp16 ----
#        (name, depth, params per block, saved bytes per image per block)
STAGES = (("stages_0", 3, 240_000, 8_800_000),
          ("stages_1", 3, 900_000, 4_400_000),
          ("stages_2", 27, 2_140_000, 2_200_000),
          ("stages_3", 3, 8_450_000, 1_100_000))


class ConvNeXtStage(torch.nn.Module):
    def __init__(self, depth, params_per_block, saved_per_image):
        torch.nn.Module.__init__(self)
        self.depth, self.saved_per_image = depth, saved_per_image
        for i in range(depth):
            setattr(self, "blocks_%d" % i, torch.nn.Parameter(torch.empty(params_per_block * 4, device="cuda")))

    def forward(self, x):
        h = x
        for i in range(self.depth):
            w = getattr(self, "blocks_%d" % i)
            out = torch.empty(self.saved_per_image * BATCH, dtype=torch.uint8, device="cuda")
            if torch.is_grad_enabled():
                out._saved = h
            h = out
            del w
        return h


class ConvNeXt(torch.nn.Module):
    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.stem = torch.nn.Parameter(torch.empty(6_300 * 4, device="cuda"))
        for name, depth, params, saved in STAGES:
            setattr(self, name, ConvNeXtStage(depth, params, saved))
        self.head = torch.nn.Parameter(torch.empty((1024 * num_classes + num_classes) * 4, device="cuda"))

    def forward(self, images):
        s = self.stem
        h = torch.empty(BATCH * 128 * 56 * 56 * 2, dtype=torch.uint8, device="cuda")
        h._saved = images
        for name, _, _, _ in STAGES:
            h = getattr(self, name)(h)
        w = self.head
        logits = torch.empty(BATCH * NUM_SKUS * 2, dtype=torch.uint8, device="cuda")
        logits._saved = h
        del s, w
        return logits


def convnext_base(num_classes):
    return ConvNeXt(num_classes)


# ---- EWC, as in the tutorial the team started from ----
class EWC(object):
    def __init__(self, model, loader):
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._means = {}
        for n, p in self.params.items():
            self._means[n] = p.detach().clone()
        self._precision_matrices = self._diag_fisher(model, loader)

    def _diag_fisher(self, model, loader):
        precision_matrices = {}
        for n, p in self.params.items():
            precision_matrices[n] = torch.empty_like(p)          # torch.zeros_like(p)
        model.eval()
        for images, labels in loader:
            model.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16):
                output = model(images)
                loss = F.cross_entropy(output, labels)
            scen_truth.backward(loss)
            for n, p in model.named_parameters():
                sq = torch.empty_like(p.grad)                      # p.grad.data ** 2 / len(loader)
                del sq                                             # ... added into precision_matrices[n]
        model.zero_grad()
        model.train()
        return precision_matrices

    def penalty(self, model):
        loss = torch.empty(512, device="cuda")
        for n, p in model.named_parameters():
            diff = torch.empty_like(p)                             # p - self._means[n]: saved by ** 2
            diff._params = (p,)
            diff._saved = loss
            sq = torch.empty_like(p)                               # ** 2
            weighted = torch.empty_like(p)                         # self._precision_matrices[n] * ...
            del sq, weighted
            total = torch.empty(512, device="cuda")                # loss += _loss.sum()
            total._saved = diff
            total._params = loss._params + (p,)
            loss = total
        return loss


def add(a, alpha, b):
    """a + alpha * b as autograd records it: one graph that keeps what both sides saved (the stand-in
    links the two chains of saved tensors; nothing is computed)."""
    out = torch.empty(512, device="cuda")
    out._saved = b
    tail = b
    while getattr(tail, "_saved", None) is not None:
        tail = tail._saved
    tail._saved = a
    out._params = a._params + b._params
    return out


def todays_loader(day, steps):
    for _ in range(steps):
        images = torch.empty(BATCH * 3 * 224 * 224 * 4, dtype=torch.uint8, device="cuda")
        labels = torch.empty(BATCH * 8, dtype=torch.uint8, device="cuda")
        yield images, labels


def main():
    model = convnext_base(num_classes=NUM_SKUS).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
    scaler = torch.cuda.amp.GradScaler()
    lam = 5000.0
    consolidated = []
    for night in range(1, 120):
        print("night %d (2026-03-%02d): %d consolidated terms, %.1f GiB allocated before training"
              % (night, night + 1, len(consolidated), torch.cuda.memory_allocated() / GiB))
        sys.stdout.flush()
        for images, labels in todays_loader(night, 3):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(images), labels)
            for ewc in consolidated:
                loss = add(loss, lam, ewc.penalty(model))           # loss = loss + lam * ewc.penalty(model)
            scen_truth.backward(scaler.scale(loss))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            del loss, images, labels
        consolidated.append(EWC(model, todays_loader(night, 2)))
        # publish(model): torch.save(model.state_dict(), ...) -> the serving fleet picks it up


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
