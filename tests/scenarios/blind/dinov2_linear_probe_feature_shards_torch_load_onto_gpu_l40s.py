"""train_probe.py -- stage 2 of a two-stage research pipeline on one L40S (45 GiB, cc 8.9).

Stage 1 (extract_feats.py, run last week on the same box) pushed 6.4M product photos through a frozen
DINOv2 ViT-g/14 and saved the CLS features, 1536-d float32, in 8 shards of 800k rows:

    feats = torch.cat(batches)                      # CUDA tensors, straight out of the model
    torch.save({"feats": feats, "labels": labels}, f"feats_{i:02d}.pt")

Stage 2 (this program) trains a linear probe (1536 -> 3,200 fine-grained categories) on them:

    shards = [torch.load(f"feats_{i:02d}.pt") for i in range(8)]    # no map_location
    X = torch.cat([s["feats"] for s in shards])                      # fails here
    y = torch.cat([s["labels"] for s in shards])
    for xb, yb in loader(X, y, batch_size=4096): ...

torch.load restores each tensor onto the device it was saved from: every shard lands on the GPU
(8 x 4.6 GiB = 36.6 GiB of the 45 GiB card), and torch.cat then asks for a second 36.6 GiB for the
concatenated copy.  The probe itself is 20 MB; its batches are 25 MB.

User: "CUDA OOM, tried to allocate 36.62 GiB -- a linear layer OOMs on a 48 GB card?"
An expert, first: the feature bank should never be on the GPU -- torch.load(..., map_location="cpu"),
keep X in (pinned) host memory and move one 4096-row batch to the GPU per step.  Wrong advice: a
smaller batch (the batch is 25 MB), empty_cache or expandable_segments (nothing is cached, the
request is one 36 GiB block), gradient checkpointing, or a bigger GPU.  (Halving the bank to fp16
would squeeze it in, but only until the catalogue grows again.)
"""
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N_SHARDS, ROWS, DIM, CLASSES = 8, 800000, 1536, 3200


class _Saved(object):
    """What stage 1 had in hand when it called torch.save: CUDA tensors (only their sizes matter here)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def stage1_outputs(d):
    """The shards stage 1 left on disk (written here so the program is self-contained)."""
    paths = []
    for i in range(N_SHARDS):
        p = os.path.join(d, "feats_%02d.pt" % i)
        torch.save({"feats": _Saved(ROWS * DIM * 4), "labels": _Saved(ROWS * 8)}, p)
        paths.append(p)
    return paths


def cat(tensors):
    """torch.cat: a new tensor the size of all of them, on their device."""
    return torch.empty(sum(t.nbytes for t in tensors))


class LinearProbe(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.bn = torch.nn.Parameter(torch.empty(2 * DIM * 4, device="cuda"))
        self.fc = torch.nn.Parameter(torch.empty((DIM + 1) * CLASSES * 4, device="cuda"))


def main():
    d = tempfile.mkdtemp(prefix="dinov2_feats_")
    paths = stage1_outputs(d)
    probe = LinearProbe()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    opt = torch.optim.AdamW(probe.parameters(), lr=1e-3, weight_decay=0.0)
    shards = [torch.load(p) for p in paths]                      # restored onto cuda:0, as saved
    print("loaded %d shards, %.1f GiB allocated" % (len(shards), torch.cuda.memory_allocated() / GiB))
    X = cat([s["feats"] for s in shards])                        # OOM: a second copy of the bank
    y = cat([s["labels"] for s in shards])
    del shards
    for step in range(ROWS * N_SHARDS // 4096):
        xb = torch.empty(4096 * DIM * 4, device="cuda")
        logits = torch.empty(4096 * CLASSES * 4, device="cuda")
        del xb, logits
        opt.step()
    print("trained on", X.nbytes, y.nbytes)


main()
sys.exit(0)
