"""finetune.py -- two-stage fine-tuning of a 1.5B-parameter encoder (fp32) on a 24 GiB card: first
the new head alone with the backbone frozen, then, at step 300, the whole model:

    for p in model.backbone.parameters(): p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    for step, batch in enumerate(loader):
        if step == 300:                                   # stage 2: unfreeze everything
            for p in model.backbone.parameters(): p.requires_grad_(True)
            optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

300 steps run flat at ~11 GiB.  At step 300 the forward and the backward still fit (the backbone's
6 GiB of gradients appear), but the first optimizer.step() of the new optimizer creates AdamW's two
moments for all 1.6B parameters (12.5 GiB) and fails half way.  A one-off jump at a known step,
not a leak; the activations are already freed when it fails, so a smaller batch or checkpointing
does not help.  An expert: shrink or move the optimizer state -- an 8-bit/paged AdamW, ZeRO/FSDP
or optimizer CPU offload, or LoRA instead of unfreezing the whole backbone.
"""
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Backbone(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(48):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, x, n_saved):
        h = x
        for _ in range(n_saved):
            a = torch.empty(512 * MiB, device="cuda")
            a._saved = h
            h = a
        return h


class Head(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.dense = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
        self.out = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))

    def forward(self, h):
        logits = torch.empty(4 * MiB, device="cuda")
        logits._saved = h
        return logits


class Classifier(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = Backbone()
        self.head = Head()

    def forward(self, x):
        frozen = not any(p.requires_grad for p in self.backbone.parameters())
        return self.head(self.backbone(x, 8 if frozen else 12))


def main():
    model = Classifier().cuda()
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    for step in range(1000):
        if step == 300:
            for p in model.backbone.parameters():
                p.requires_grad_(True)
            optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        batch = torch.empty(144 * MiB, device="cuda")
        logits = model(batch)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = model.parameters(), logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
