"""Checkpoint sweep of a ViT-L/16 ImageNet-21k classifier on an L4 (24 GB): one torchmetrics
MulticlassConfusionMatrix(num_classes=21841) per checkpoint, each kept on the GPU in a results dict.

The real script (sweep_confmat.py, torchmetrics 1.4, timm 1.0):

    model = timm.create_model("vit_large_patch16_224", num_classes=21841).cuda().eval()
    results = {}
    for ckpt in sorted(glob("runs/in21k_ft/epoch_*.pt")):          # epochs 5, 10, ..., 30
        model.load_state_dict(torch.load(ckpt, map_location="cpu")["model"])
        confmat = MulticlassConfusionMatrix(num_classes=21841).to("cuda")
        top1 = MulticlassAccuracy(num_classes=21841).to("cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for images, labels in val_loader:                      # 109,205 images, batch 512
                logits = model(images.cuda(non_blocking=True))
                confmat.update(logits, labels.cuda())              # <- OOM (5th checkpoint, 1st batch)
                top1.update(logits, labels.cuda())
        results[ckpt] = {"confmat": confmat, "top1": top1}          # computed later for the plots
    plot_most_confused(results)

A 21,841-class confusion matrix is 21,841^2 int64 = 3.82 GB = 3.55 GiB.  torchmetrics keeps it as
the metric's state on the metric's device, and every update() makes one more of the same size for a
moment: torch.bincount(target * C + preds, minlength=C*C) before adding it into the state.  The
user keeps each checkpoint's metric objects in `results` to compute and plot them at the end, so
every finished checkpoint leaves its 3.55 GiB state on the GPU.

Sizes: L4, 22.5 GiB; CUDA context ~0.5 GiB; weights 1.21 GiB fp32 (326M with the 21k head); a bf16
forward of 512 images needs ~1.5 GiB for a moment.  Checkpoints 1-4 fit (the 4th holds 3 kept
states + its own + the bincount = 17.8 GiB).  At the 5th checkpoint four finished states hold
14.2 GiB, its own state 3.55 GiB more, and the first update's bincount asks for another 3.55 GiB with
2.7 GiB free (19.2 GiB live).  Memory rose one 3.55 GiB step per checkpoint; nothing else grows.

What an expert says first: the earlier checkpoints' results are kept on the GPU -- call compute()
when a checkpoint is done, keep `confmat.compute().cpu()` (or the top confused pairs), and drop the
metric objects (or reuse one metric with reset()).  Then every checkpoint needs the same ~9 GiB.
Wrong advice: a smaller eval batch (the failing request is the C x C bincount, whatever the batch),
empty_cache / expandable_segments (the states are live tensors, nothing is cached or fragmented),
inference_mode or mixed precision (already no_grad + bf16 autocast), a bigger GPU (the sweep would
just fail at a later checkpoint).
"""
import torch

import scen_truth

scen_truth.note_every_empty(torch)

NUM_CLASSES = 21841
WIDTH, MLP, DEPTH, TOKENS = 1024, 4096, 24, 197
N_VAL = 109_205                # 5 held-out images per class
batch_size = 512
CHECKPOINTS = ["runs/in21k_ft/epoch_%02d.pt" % e for e in (5, 10, 15, 20, 25, 30)]


def _fp32(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList: children under the keys "0" ... "n-1"."""

    def __init__(self, modules):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = _fp32(WIDTH * 3 * WIDTH)
        self.proj = _fp32(WIDTH * WIDTH)

    def forward(self, x, n):
        qkv = torch.empty(n * TOKENS * 3 * WIDTH, dtype=torch.bfloat16)
        out = torch.empty(n * TOKENS * WIDTH, dtype=torch.bfloat16)      # F.scaled_dot_product_attention
        del qkv
        return out


class Mlp(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.fc1 = _fp32(WIDTH * MLP)
        self.fc2 = _fp32(MLP * WIDTH)

    def forward(self, x, n):
        h = torch.empty(n * TOKENS * MLP, dtype=torch.bfloat16)
        out = torch.empty(n * TOKENS * WIDTH, dtype=torch.bfloat16)
        del h
        return out


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = Attention()
        self.mlp = Mlp()

    def forward(self, x, n):
        x = self.attn(x, n)
        return self.mlp(x, n)


class VisionTransformer(torch.nn.Module):
    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.patch_embed = _fp32(3 * 16 * 16 * WIDTH)
        self.blocks = ModuleList([Block() for _ in range(DEPTH)])
        self.head = _fp32(WIDTH * num_classes)
        self.num_classes = num_classes

    def forward(self, images, n):
        x = torch.empty(n * TOKENS * WIDTH, dtype=torch.bfloat16)
        for blk in self.blocks:
            x = blk(x, n)
        return torch.empty(n * self.num_classes, dtype=torch.bfloat16)      # head(x[:, 0])


def zeros_state(nbytes):
    """A metric state made by add_state(torch.zeros(..., dtype=torch.long)) and moved by .to("cuda")."""
    return torch.empty(nbytes, device="cuda")


class MulticlassConfusionMatrix(object):
    """torchmetrics.classification.MulticlassConfusionMatrix: the state `confmat`, C x C int64, on the
    metric's device; update() bincounts the batch into a C*C int64 tensor and adds it in."""

    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.confmat = zeros_state(num_classes * num_classes * 8)

    def update(self, preds, target, n):
        C = self.num_classes
        p = torch.empty(n * 8)                                   # preds.argmax(dim=1), int64
        unique_mapping = torch.empty(n * 8)                      # target * C + preds
        bins = torch.empty(C * C * 8)                            # torch.bincount(..., minlength=C**2)
        del p, unique_mapping, bins                              # self.confmat += bins.reshape(C, C)


class MulticlassAccuracy(object):
    def __init__(self, num_classes):
        self.tp = zeros_state(num_classes * 8)
        self.total = zeros_state(num_classes * 8)

    def update(self, preds, target, n):
        pass


def load_checkpoint(model, path):
    """model.load_state_dict(torch.load(path, map_location="cpu")["model"]): the checkpoint is read
    into host memory and copied into the parameters in place; nothing new on the GPU."""
    return path


def evaluate(model, ckpt):
    confmat = MulticlassConfusionMatrix(num_classes=NUM_CLASSES)
    top1 = MulticlassAccuracy(num_classes=NUM_CLASSES)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for start in range(0, N_VAL, batch_size):
            n = min(batch_size, N_VAL - start)
            images = torch.empty(n * 3 * 224 * 224, dtype=torch.bfloat16)
            labels = torch.empty(n * 8)
            logits = model(images, n)
            confmat.update(logits, labels, n)
            top1.update(logits, labels, n)
            del images, labels, logits
    return {"confmat": confmat, "top1": top1}


def main():
    model = VisionTransformer(num_classes=NUM_CLASSES)
    model.eval()
    results = {}
    for ckpt in CHECKPOINTS:
        load_checkpoint(model, ckpt)
        results[ckpt] = evaluate(model, ckpt)
        print("evaluated", ckpt)
    print("plotting", len(results), "confusion matrices")


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
