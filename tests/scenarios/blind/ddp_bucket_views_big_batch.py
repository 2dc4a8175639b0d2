"""train_lm.py, one of 16 ranks (Slurm, 2 nodes x 8 A10G 24 GiB, one GPU per task) -- continued
pre-training of a 770M-parameter LM (fp32 master weights, AdamW, bf16 autocast) with
DistributedDataParallel; the global batch was doubled from 256 to 512 sequences, so each rank now
runs 32 x 1024 tokens:

    torch.cuda.set_device(0)                         # the task's only GPU
    dist.init_process_group("nccl")
    model = DDP(GPT.from_pretrained(ckpt).cuda(), device_ids=[0])    # bucket_cap_mb=25, no
                                                                     # gradient_as_bucket_view
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for batch in loader:                             # 32 sequences per rank
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Per rank: weights 2.9 GiB, DDP's gradient buckets 2.9 GiB (a flat copy of every gradient,
allocated when DDP is built), the gradients themselves 2.9 GiB, AdamW's moments 5.8 GiB, NCCL's
buffers 0.5 GiB, and 12.4 GiB of activations per step at 32 sequences.  The first step fits (no
moments yet); the second step's forward fails on every rank, ~1.8 GiB short (PyTorch also holds
~0.8 GiB in holes where AdamW's moments were cut out of cached activation blocks: a symptom, not
the cause).  At the old 16 sequences it ran at ~21 GiB.  An expert: the step does not fit a 24 GiB rank: halve the per-rank batch and accumulate 2
micro-batches (same global batch), or gradient_as_bucket_view=True (the buckets become the
gradients: -2.9 GiB), or activation checkpointing, or ZeRO/FSDP sharding; DDP is already used,
the ranks each have their own GPU, nothing else is on it.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
PER_RANK_BATCH = 32


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(30 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(80 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(256 * MiB, device="cuda")        # bf16 attention activations, saved
        a._saved = h
        m = torch.empty(240 * MiB, device="cuda")        # bf16 MLP activations, saved
        m._saved = a
        return m


class GPT(torch.nn.Module):
    def __init__(self, n_layer=24):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(320 * MiB, device="cuda"))
        self.blocks = [Block() for _ in range(n_layer)]
        for i, b in enumerate(self.blocks):
            setattr(self, "h%d" % i, b)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, idx):
        h = idx
        for b in self.blocks:
            h = b(h)
        logits = torch.empty(PER_RANK_BATCH * 1024 * 50304 * 2 // 4, device="cuda")   # chunked CE
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


class DistributedDataParallel(torch.nn.Module):
    """The reducer's buckets: flat buffers of 25 MiB holding a copy of every
    gradient for the all-reduce, allocated when DDP is built."""

    def __init__(self, module, device_ids=None, bucket_cap_mb=25):
        torch.nn.Module.__init__(self)
        self.module = module
        total = sum(p.nbytes for p in module.parameters())
        self.buckets = []
        while total > 0:
            n = min(total, bucket_cap_mb * MiB)
            self.buckets.append(torch.empty(n, device="cuda"))
            total -= n

    def forward(self, *args):
        return self.module(*args)


def init_process_group(backend):
    nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
    nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    if nccl.nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), 32 * MiB, 16) != 0:
        raise RuntimeError("NCCL error: unhandled cuda error")
    return nccl


def main():
    torch.cuda.set_device(0)
    pg = init_process_group("nccl")
    model = DistributedDataParallel(GPT.from_pretrained("ckpt/gpt-770m").cuda(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.module.parameters(), lr=3e-4)
    for step in range(100000):
        idx = torch.empty(PER_RANK_BATCH * 1024 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx)
        scen_truth.backward(loss)
        optimizer.step()
        model.module.zero_grad(set_to_none=True)
        del loss, idx


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
