"""train_vit.py -- fine-tuning a ViT-L-sized image classifier (fp32 weights, 2 GiB) with AdamW on one 24
GiB card, batch 64 at 384 px.  The script keeps "the best model so far" for early stopping, the way the
transfer-learning tutorial does, plus the optimizer state so it can roll back:

    if val_acc > best_acc:
        best_acc = val_acc
        best_model_wts = {k: v.clone() for k, v in model.state_dict().items()}
        best_optim_state = copy.deepcopy(optimizer.state_dict())

Epoch 1 peaks at about 20.5 GiB (weights 2, gradients 2, AdamW moments 4, 12 GiB of activations at the
end of the forward pass).  After epoch 1's validation the snapshot takes 6 GiB more -- a clone of every
weight and of both AdamW moments, all on the GPU, kept for the rest of the run.  The snapshot itself
fits (the cached activations make room), but the first forward pass of epoch 2 needs its 12 GiB of
activations again and runs out near the last block.

An expert: keep the snapshot on the CPU (v.detach().to("cpu", non_blocking=True) into pinned
buffers) or write it to disk with torch.save -- a rollback copy never has to live on the GPU.  Not a
smaller batch or checkpointing first (epoch 1 fits with room to spare at this batch), not the
allocator's cache (every cached byte is reused), not an 8-bit optimizer or sharding.
"""
import collections
import copy
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class ViTBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))       # 16M fp32 params

    def forward(self, x):
        # attention and MLP activations saved for backward: three tensors of 128 MiB
        h = x
        for _ in range(3):
            nxt = torch.empty(128 * MiB, device="cuda")
            nxt._saved = h
            h = nxt
        return h


class ViT(torch.nn.Module):
    def __init__(self, depth=32):
        torch.nn.Module.__init__(self)
        self.blocks = [ViTBlock() for _ in range(depth)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def state_dict(self):
        # stand-in scaffolding: PyTorch names each entry by its dotted path and hands out detached
        # tensors (the stand-in's Module.state_dict keeps only the last name, "weight")
        return collections.OrderedDict(("blocks.%d.weight" % i, b.weight.detach()) for i, b in enumerate(self.blocks))

    def forward(self, images):
        x = images
        for blk in self.blocks:
            x = blk(x)
        return x


def train_one_epoch(model, optimizer, steps):
    model.train()
    for _ in range(steps):
        images = torch.empty(64 * 3 * 384 * 384 * 4, device="cuda")
        logits = model(images)
        loss = F.cross_entropy(logits, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, images


def validate(model):
    model.eval()
    with torch.no_grad():
        for _ in range(2):
            images = torch.empty(64 * 3 * 384 * 384 * 4, device="cuda")
            out = model.blocks[0](images)
            del out, images
    return 0.8


def main():
    model = ViT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    best_acc = 0.0
    best_model_wts = best_optim_state = None
    for epoch in range(10):
        print("epoch", epoch, flush=True)
        train_one_epoch(model, optimizer, steps=3)
        val_acc = validate(model) + 0.01 * epoch
        if val_acc > best_acc:
            best_acc = val_acc
            best_model_wts = {k: v.clone() for k, v in model.state_dict().items()}
            best_optim_state = copy.deepcopy(optimizer.state_dict())
    return best_model_wts, best_optim_state


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
