"""train_summarizer.py -- a support-tooling team fine-tunes flan-t5-large (783M parameters, fp32 3.0 GiB) to
summarise support-ticket threads, with DDP on an AWS g6.12xlarge (4x L4, 24 GB each), launched as
`torchrun --nproc-per-node 4 train_summarizer.py`.  bf16 autocast, AdamW, DDP with
gradient_as_bucket_view=True, per-GPU batch 4, threads truncated to 768 tokens and padded per batch.
The config had been tuned until the longest batches peaked at ~21.2 GiB of the 22.1 GiB an L4 leaves a
process beside its own context, and it ran like that for weeks.  Last week someone added a GPU-memory
panel to the W&B logging, on every rank so that each rank reports, every 50 steps:

    def log_gpu_memory(step):
        stats = {"rank%d/allocated_gib" % rank: torch.cuda.memory_allocated() / 2**30}
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            stats["gpu%d/used_gib" % i] = (total - free) / 2**30
        wandb.log(stats, step=step)

torch.cuda.mem_get_info(i) on a GPU the process has not used makes a CUDA context there: from the first
log on, each of the four ranks holds a context on every GPU, and each L4 carries three foreign contexts
(3 x 400 MiB) besides its own rank's.  Nothing else changed.  At step 137, rank 2 draws a batch of
768-token threads; its forward (the encoder done, the decoder under way) fails ~0.25 GiB short, with
1.2 GiB of the card held by its three sibling ranks; torchrun then tears the job down.

An expert: the memory on GPU 2 that this rank does not hold belongs to the other ranks of the same job
-- contexts their logger made there.  Each rank must touch only its own GPU: query the others through
NVML (pynvml / nvidia-ml-py: nvmlDeviceGetMemoryInfo makes no context), or log only
torch.cuda.mem_get_info() of the current device and gather the numbers, or do the all-GPU query from
rank 0 alone with NVML.  The ranks already set_device() before touching CUDA and run one per GPU.
Wrong first advice: a smaller batch or checkpointing (the job fitted for weeks; it is 1.2 GiB of
contexts), expandable_segments / empty_cache (nothing is cached), "stop the other processes" or a restart
(they are this job's ranks, and the logger makes the contexts again), one rank per GPU (it is), a
bigger GPU.
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
WORLD_SIZE = 4


# -- torchrun --nproc-per-node 4: the same program once per rank, the job torn down when one fails --------
def torchrun():
    rdzv = tempfile.mkdtemp(prefix="rdzv-")
    procs = []
    for r in range(WORLD_SIZE):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD_SIZE),
                   LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="ticket-sum-ft", STANDIN_RDZV_DIR=rdzv)
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                failed = (r, p.returncode)
        time.sleep(0.05)
    if failed is not None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        print("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train_summarizer.py FAILED\n"
              "  rank: %d (local_rank: %d)  exitcode: %d" % (failed[0], failed[0], failed[1]), file=sys.stderr)
        return 1
    return 0


if "LOCAL_RANK" not in os.environ:
    sys.exit(torchrun())

import torch  # noqa: E402

import scen_truth  # noqa: E402

scen_truth.note_every_empty(torch)

# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
_rt = torch._alloc.runtime()
_mem_get_info = torch.cuda.mem_get_info


def _mem_get_info_restoring(device=None):
    """torch.cuda.mem_get_info(i): cudaMemGetInfo under `with torch.cuda.device(i)` (the device's context is
    made if it has none), the previous device current again afterwards."""
    import ctypes
    cur = ctypes.c_int(0)
    _rt.cudaGetDevice(ctypes.byref(cur))
    try:
        return _mem_get_info(device)
    finally:
        _rt.cudaSetDevice(cur.value)


torch.cuda.mem_get_info = _mem_get_info_restoring


class _ProcessGroup(object):
    """dist.init_process_group("nccl") / all_reduce as far as timing goes: every rank waits for all."""

    def __init__(self, rank, world, path):
        self.rank, self.world, self.path, self.n = rank, world, path, 0

    def all_reduce(self):
        self.n += 1
        open(os.path.join(self.path, "%d.%d" % (self.n, self.rank)), "w").close()
        while not all(os.path.exists(os.path.join(self.path, "%d.%d" % (self.n, r))) for r in range(self.world)):
            time.sleep(0.0005)


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """gradient_as_bucket_view=True: each parameter's .grad is a view into the reducer's buckets, made for
    every backward (also after zero_grad(set_to_none=True)): no gradient memory besides the buckets."""

    def __init__(self, module, process_group, **kw):
        torch.nn.parallel.DistributedDataParallel.__init__(self, module, **kw)
        self._pg = process_group

    def forward(self, *args, **kwargs):
        if self.gradient_as_bucket_view:
            buckets = self.reducer._buckets
            filled, b = 0, 0
            for p in self.module.parameters():
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = buckets[b].view()
                    filled += p.nbytes
                    while b + 1 < len(buckets) and filled >= self.bucket_bytes_cap * (b + 1):
                        b += 1
        return self.module(*args, **kwargs)


_autograd_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """loss.backward() under DDP: saved tensors freed as backward passes them, buckets all-reduced."""
    todo = [self._saved]
    self._saved = None
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor) and t.__dict__.get("_saved") is not None:
            todo.append(t._saved)
            t._saved = None
    _autograd_backward(self, gradient, retain_graph, create_graph, inputs)
    process_group.all_reduce()


torch.Tensor.backward = _backward


# -- flan-t5-large (T5 v1.1: gated-GELU, untied head), eager attention with fp32 softmax -------------------
D_MODEL, D_FF, HEADS, LAYERS, VOCAB = 1024, 2816, 16, 24, 32128
PER_GPU_BATCH = 4
MAX_SOURCE_LEN, MAX_TARGET_LEN = 768, 128


def _weight(n_in, n_out):
    return torch.nn.Parameter(torch.empty(n_in * n_out * 4, device="cuda"))


class T5Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name in ("q", "k", "v", "o"):
            setattr(self, name, _weight(D_MODEL, D_MODEL))


class T5Block(torch.nn.Module):
    def __init__(self, cross_attention):
        torch.nn.Module.__init__(self)
        self.SelfAttention = T5Attention()
        if cross_attention:
            self.EncDecAttention = T5Attention()
        self.DenseReluDense = torch.nn.Module()
        self.DenseReluDense.wi_0 = _weight(D_MODEL, D_FF)
        self.DenseReluDense.wi_1 = _weight(D_MODEL, D_FF)
        self.DenseReluDense.wo = _weight(D_FF, D_MODEL)

    def forward(self, h, batch, q_len, kv_len):
        """Kept for backward (bf16 unless said): the attention scores and fp32 softmax, the projections
        and the gated FFN."""
        a = torch.empty(batch * HEADS * q_len * kv_len * 6, device="cuda")      # scores bf16 + softmax fp32
        a._saved = h
        b = torch.empty(batch * q_len * 40 * 1024, device="cuda")              # q, k, v, o, norms, FFN
        b._saved = a
        return b


class T5ForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(VOCAB * D_MODEL * 4, device="cuda"))
        self.encoder = torch.nn.Module()
        self.decoder = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.encoder, "block_%d" % i, T5Block(False))
            setattr(self.decoder, "block_%d" % i, T5Block(True))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * D_MODEL * 4, device="cuda"))

    def forward(self, input_ids, labels, src_len):
        batch = PER_GPU_BATCH
        h = torch.empty(batch * src_len * D_MODEL * 4, device="cuda")
        h._params = (self.shared,)
        for i in range(LAYERS):
            h = getattr(self.encoder, "block_%d" % i)(h, batch, src_len, src_len)
        enc = h
        h = torch.empty(batch * MAX_TARGET_LEN * D_MODEL * 4, device="cuda")
        h._saved = enc
        for i in range(LAYERS):
            h = getattr(self.decoder, "block_%d" % i)(h, batch, MAX_TARGET_LEN, src_len)
        logits = torch.empty(batch * MAX_TARGET_LEN * VOCAB * 4, device="cuda")
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        return loss


def log_gpu_memory(step):
    stats = {"rank%d/allocated_gib" % rank: torch.cuda.memory_allocated() / 2**30}
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        stats["gpu%d/used_gib" % i] = (total - free) / 2**30
    if rank == 0:
        print("step %d " % step + " ".join("%s=%.1f" % kv for kv in sorted(stats.items())), flush=True)


def ticket_batches(n):
    """The rank's shard of the ticket threads, padded per batch (DistributedSampler, seed 17)."""
    rng = random.Random(1000 * 17 + rank)
    for step in range(n):
        src_len = 768 if (rank == 2 and step == 137) else rng.randrange(192, 640, 16)
        yield torch.empty(PER_GPU_BATCH * src_len * 8, device="cuda"), \
            torch.empty(PER_GPU_BATCH * MAX_TARGET_LEN * 8, device="cuda"), src_len


rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
process_group = _ProcessGroup(rank, int(os.environ["WORLD_SIZE"]), os.environ["STANDIN_RDZV_DIR"])


def main():
    model = T5ForConditionalGeneration().cuda()
    ddp_model = DistributedDataParallel(model, process_group, device_ids=[local_rank],
                                        gradient_as_bucket_view=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    ddp_model.train()
    for step, (input_ids, labels, src_len) in enumerate(ticket_batches(6000)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp_model(input_ids, labels, src_len)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        if step % 50 == 0:
            log_gpu_memory(step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
