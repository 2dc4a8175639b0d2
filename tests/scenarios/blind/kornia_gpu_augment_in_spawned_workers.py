"""train_cls.py -- fine-tuning a ViT-B/16 classifier (86M parameters, fp32, AdamW, batch 64 at 224 px)
on a 24 GiB card.  To speed up augmentation the author moved it onto the GPU inside the Dataset
(Kornia), hit "Cannot re-initialize CUDA in forked subprocess", and fixed that by switching the
DataLoader to spawn:

    class Shelves(Dataset):
        def __getitem__(self, i):
            x = torch.from_numpy(load(i)).cuda()                      # in the worker process
            return self.aug(x)                                        # kornia: RandomResizedCrop, ColorJitter, ...
    loader = DataLoader(Shelves(...), batch_size=64, num_workers=8, prefetch_factor=2,
                        persistent_workers=True, multiprocessing_context="spawn")
    for images, labels in loader:
        loss = criterion(model(images), labels.cuda()); loss.backward(); optimizer.step(); ...

Every worker is a process of its own on the GPU: a CUDA context (~0.5 GiB), its own PyTorch cache
from the augmentation (~1 GiB) and the batches it has prefetched -- ~1.5 GiB each, 12 GiB for the
eight.  The training process itself needs ~13 GiB (weights, gradients and AdamW 1.3 GiB, ~11 GiB of
activations): its first forward fits, the gradients of its first backward do not.  Alone, or with
CPU augmentation, it fits.  The other processes on the card are this job's own DataLoader workers.
An expert: augment on the GPU in the main process, on the whole batch after it arrives (or augment
on the CPU in the workers), so that no worker touches CUDA; fewer workers helps in proportion.  Not
a smaller batch, not checkpointing, and killing the workers by hand is no fix.
"""
import multiprocessing
import os
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
NUM_WORKERS = 8


def worker_loop(worker_id, ready, stop):
    """torch.utils.data's _worker_loop with the Dataset's __getitem__ on the GPU: each sample is
    decoded, moved to the GPU and augmented there; two batches are prefetched."""
    scratch = [torch.empty(128 * MiB, device="cuda") for _ in range(8)]        # kornia intermediates
    del scratch                                                                 # back to this worker's cache
    prefetched = [torch.empty(64 * 3 * 224 * 224 * 4, device="cuda") for _ in range(2)]
    ready.put(worker_id)
    stop.wait()


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(9 * MiB, device="cuda"))
        self.proj = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(228 * MiB, device="cuda")      # attention (64 x 12 x 197 x 197), saved
        a._saved = h
        m = torch.empty(712 * MiB, device="cuda")      # QKV, MLP, norms, GELU inputs, saved
        m._saved = a
        return m


class VisionTransformer(torch.nn.Module):
    def __init__(self, depth=12):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))
        self.head = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        self.blocks = [Block() for _ in range(depth)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, x):
        h = x
        for b in self.blocks:
            h = b(h)
        logits = torch.empty(64 * 1000 * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


class DataLoader(object):
    """The DataLoader's iterator with persistent spawned workers: the workers start (and prefetch)
    when iteration begins."""

    def __init__(self, num_workers):
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop = ctx.Queue(), ctx.Event()
        self.workers = [ctx.Process(target=worker_loop, args=(i, self.ready, self.stop), daemon=True)
                        for i in range(num_workers)]

    def __iter__(self):
        for w in self.workers:
            w.start()
        for _ in self.workers:
            self.ready.get()
        while True:
            yield torch.empty(64 * 3 * 224 * 224 * 4, device="cuda")        # a batch from a worker (IPC)

    def shutdown(self):
        self.stop.set()
        for w in self.workers:
            w.join(5)


def main():
    scen_truth.note_every_empty(torch)
    model = VisionTransformer().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loader = DataLoader(NUM_WORKERS)
    try:
        for step, images in enumerate(loader):
            loss = model(images)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, images
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    finally:
        loader.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
