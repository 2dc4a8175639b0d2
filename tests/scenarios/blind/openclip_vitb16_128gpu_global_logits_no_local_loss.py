"""OpenCLIP-style contrastive pre-training of ViT-B/16 on an image-text set, A100 40GB nodes, launched as

    torchrun --nnodes 16 --nproc-per-node 8 -m open_clip_train.main --model ViT-B-16 \\
        --batch-size 320 --precision amp_bf16 --gather-with-grad --lr 5e-4 --epochs 32 ...

The same command ran for weeks on 4 nodes (32 GPUs, global batch 10,240) at ~27 GB a GPU.  We got 16
nodes and only changed --nnodes, to get a global batch of 40,960 (CLIP likes big batches).  Now every
rank dies with CUDA OOM in the loss at the first step.  (This is rank 0; the other 127 fail the same.)

The loss (the ClipLoss of our fork):

    all_image_features, all_text_features = gather_features(image_features, text_features)  # with grad
    logits_per_image = logit_scale * all_image_features @ all_text_features.T    # 40,960 x 40,960
    logits_per_text = logits_per_image.T
    labels = torch.arange(logits_per_image.shape[0], device=device)
    loss = (F.nll_loss(F.log_softmax(logits_per_image, -1, dtype=torch.float32), labels) +
            F.nll_loss(F.log_softmax(logits_per_text, -1, dtype=torch.float32), labels)) / 2

What happens: without --local-loss every rank computes the FULL global similarity matrix, whose size grows
with the square of the number of GPUs: 40,960^2 = 1.68e9 entries, 3.4 GB in bf16 (twice: the product and
the scaled product are both kept for backward) and 6.7 GB per direction for the fp32 log-probabilities,
20 GB in all on top of the towers' ~25 GB of activations (batch 320) -- on a 40 GB card.  It fails at
the second log_softmax.  At 32 GPUs the same matrix was 16x smaller (1.3 GB).

An expert: --local-loss (with --gather-with-grad, which is on): each rank computes only its own 320 rows
against the gathered features (320 x 40,960), the same gradients, 1/128 of the matrix.  The general form:
shard/chunk the oversized loss computation.  Also possible but weaker: a smaller per-GPU batch (shrinks
the global batch the run wants), a fused/chunked cross-entropy.  Not mixed precision (amp_bf16 is on),
not ZeRO/FSDP (the model is 150M parameters), not inference mode, not the cache or fragmentation, not
a bigger GPU.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd._graph import derive

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

EMBED = 512


class Tower(nn.Module):
    """a transformer tower: its weights, and per sample the activations its blocks save for backward"""

    def __init__(self, params, layers, tokens, width):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(params * 4, device="cuda"))
        self.layers, self.tokens, self.width = layers, tokens, width

    def forward(self, x, batch):
        h = x
        for _ in range(self.layers):
            a = torch.empty(batch * self.tokens * self.width * 17, dtype=torch.bfloat16, device="cuda")
            a._saved = h
            h = a
        out = torch.empty(batch * EMBED, dtype=torch.bfloat16, device="cuda")
        out._saved = h
        return out


class CLIP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.visual = Tower(86000000, 12, 197, 768)
        self.transformer = Tower(63000000, 12, 77, 512)
        self.logit_scale = nn.Parameter(torch.empty(4, device="cuda"))

    def forward(self, images, texts, batch):
        return self.visual(images, batch), self.transformer(texts, batch), self.logit_scale


def gather_features(image_features, text_features, world_size, batch):
    """torch.distributed.nn.all_gather (gather_with_grad): every rank's features, concatenated"""
    all_image = torch.empty(world_size * batch * EMBED, dtype=torch.bfloat16, device="cuda")
    all_text = torch.empty(world_size * batch * EMBED, dtype=torch.bfloat16, device="cuda")
    all_image._saved, all_text._saved = image_features, text_features
    return derive(all_image, image_features), derive(all_text, text_features)


def matmul(a, b, rows, cols):
    """a @ b.T under autocast: a bf16 rows x cols product, kept for backward"""
    out = torch.empty(rows * cols, dtype=torch.bfloat16, device="cuda")
    out._saved = a
    out._saved_b = b
    return derive(out, a, b)


def scale(logit_scale, logits):
    out = torch.empty(logits.nbytes // 2, dtype=torch.bfloat16, device="cuda")
    out._saved = logits
    return derive(out, logits, logit_scale)


def mean(a, b):
    """(a + b) / 2"""
    out = torch.empty(512, device="cuda")
    out._saved = a
    out._saved_b = b
    return derive(out, a, b)


class ClipLoss(object):
    def __init__(self, local_loss=False, gather_with_grad=True, rank=0, world_size=1):
        self.local_loss, self.gather_with_grad = local_loss, gather_with_grad
        self.rank, self.world_size = rank, world_size

    def __call__(self, image_features, text_features, logit_scale, batch):
        all_image_features, all_text_features = gather_features(image_features, text_features, self.world_size, batch)
        n = self.world_size * batch
        logits_per_image = scale(logit_scale, matmul(all_image_features, all_text_features, n, n))
        logits_per_text = logits_per_image.view(n, n)          # .T: a view
        labels = torch.empty(n * 8, device="cuda")
        loss_img = F.nll_loss(F.log_softmax(logits_per_image, -1, dtype=torch.float32), labels)
        loss_txt = F.nll_loss(F.log_softmax(logits_per_text, -1, dtype=torch.float32), labels)
        return mean(loss_img, loss_txt)


def train_one_epoch(model, loss_fn, optimizer, batch_size, steps):
    for step in range(steps):
        images = torch.empty(batch_size * 3 * 224 * 224 * 2, device="cuda")
        texts = torch.empty(batch_size * 77 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            image_features, text_features, logit_scale = model(images, texts, batch_size)
            total_loss = loss_fn(image_features, text_features, logit_scale, batch_size)
        scen_truth.backward(total_loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del images, texts, image_features, text_features, total_loss


def main():
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    # test scaffolding: the truth mark at the failing allocation itself
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    batch_size = 320                                           # --batch-size: per GPU
    model = CLIP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    loss_fn = ClipLoss(local_loss=False, gather_with_grad=True, rank=rank, world_size=world_size)
    train_one_epoch(model, loss_fn, optimizer, batch_size, steps=2)


try:
    main()
except torch.OutOfMemoryError:
    raise                            # marked by the observer above
sys.exit(0)
