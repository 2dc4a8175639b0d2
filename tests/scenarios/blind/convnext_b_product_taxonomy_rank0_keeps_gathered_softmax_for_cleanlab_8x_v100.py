"""train_taxonomy.py -- a marketplace's catalog team trains a ConvNeXt-B classifier that maps seller photos to
11,000 leaf categories of the product taxonomy: 1.2M images, torchrun DDP on one p3dn node (8x V100 32GB),
fp16 autocast with GradScaler (V100: no bf16), batch 128 per GPU, PyTorch 2.1.

Seller labels are noisy, so after training the team wants to run cleanlab / dataset cartography (per-example
confidence and variability across epochs) to find mislabeled listings.  Rather than a separate inference pass
they record the training dynamics as they go: every step each rank's softmax is all-gathered and rank 0
keeps it, with the sample indices, to be saved at the end of the epoch:

    dynamics = defaultdict(list)                 # epoch -> [(indices, probs)], written out after each epoch
    ...
    probs = logits.detach().float().softmax(-1)
    dist.all_gather(all_probs, probs); dist.all_gather(all_idx, idx)
    if rank == 0:
        dynamics[epoch].append((torch.cat(all_idx), torch.cat(all_probs)))

Each step adds 8 x 128 x 11,000 fp32 = 43 MiB on rank 0's GPU, and nothing is released until the epoch ends
(1,171 steps, 49 GiB).  The dry run on a 20k-image subset (20 steps per epoch) was fine.  On the full set
rank 0 alone runs out 306 steps into the first epoch (13 GiB of kept probabilities), making that step's
gradients in the backward pass -- the other seven ranks, which keep nothing, then hang in the all-reduce
until the NCCL watchdog kills the job.

An expert: the memory is a Python container on rank 0 that grows by one gathered probability matrix per
step; move each step's result off the GPU (.cpu(), or straight into a numpy memmap on disk), and keep only
what the analysis needs (the given label's probability and the margin are two numbers per example, not
11,000).  Wrong first advice: a smaller batch, gradient checkpointing, mixed precision (already fp16),
FSDP/ZeRO, a bigger card (the list grows without bound: any card runs out a few hundred steps later),
expandable_segments / empty_cache (the tensors are live, referenced by the dict), inference_mode.
"""
import collections
import ctypes
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20
F32, F16, I64 = 4, 2, 8


# ---- what the simulator's torch lacks: Tensor.float / Tensor.softmax / torch.cat (new tensors of the sizes
# PyTorch's would have), and torch.distributed (NCCL's communicator is made by the first collective, with
# libnccl.so.2's own cudaMalloc on the rank's device)
def _tensor_float(self):
    out = torch.empty(self.nbytes * F32 // torch._ITEMSIZE.get(self.dtype, F32), device=self.device)
    return torch.autograd._graph.derive(out, self)


def _tensor_softmax(self, dim=-1):
    return torch.autograd._graph.derive(torch.empty_like(self), self)


def _cat(tensors, dim=0):
    out = torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    out._dtype = tensors[0].dtype
    return out


torch.Tensor.float = _tensor_float
torch.Tensor.softmax = _tensor_softmax
torch.cat = _cat


def _nccl_library():
    for p in (os.environ.get("SCEN_NCCL", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib",
                           "libnccl.so.2")):
        if p and os.path.exists(p):
            lib = ctypes.CDLL(p)
            lib.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
            return lib
    raise SystemExit("libnccl.so.2 stand-in not found")


_comm = []


def _collective():
    if not _comm:
        if _nccl_library().nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
                                               4 * MiB, 16) != 0:
            raise RuntimeError("NCCL error: unhandled cuda error")
        _comm.append(True)


def _broadcast(tensor, src=0):
    _collective()


def _all_gather(tensor_list, tensor):
    _collective()          # fills the preallocated outputs in place


dist = types.SimpleNamespace(init_process_group=lambda backend="nccl": None, broadcast=_broadcast,
                             all_gather=_all_gather, get_rank=lambda: int(os.environ["RANK"]),
                             get_world_size=lambda: int(os.environ["WORLD_SIZE"]))


class DDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, **kw):
        for p in module.parameters():
            dist.broadcast(p, 0)
        torch.nn.parallel.DistributedDataParallel.__init__(self, module, device_ids=device_ids, **kw)


# ---- the model: ConvNeXt-B (timm layout, sizes only) with an 11,000-way head
class ConvNeXtBlock(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weights = torch.nn.Parameter(torch.empty((dim * 49 + 2 * dim * 4 * dim + 8 * dim) * F32, device="cuda"))

    def forward(self, x, batch, hw):
        c = batch * self.dim * hw * hw
        # what autograd keeps under fp16 autocast: dwconv out, norm out (fp32), pwconv1, gelu, pwconv2
        kept = [torch.empty(c * F16, device="cuda"), torch.empty(c * F32, device="cuda"),
                torch.empty(4 * c * F16, device="cuda"), torch.empty(4 * c * F16, device="cuda"),
                torch.empty(c * F16, device="cuda")]
        out = torch.empty(c * F32, device="cuda")
        out._saved = x
        out._kept = kept
        return out


class ConvNeXt(torch.nn.Module):
    depths, dims, sizes = (3, 3, 27, 3), (128, 256, 512, 1024), (56, 28, 14, 7)

    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.num_classes = num_classes
        self.stem = torch.nn.Parameter(torch.empty((3 * 16 * 128 + 3 * 128) * F32, device="cuda"))
        for s, (depth, dim) in enumerate(zip(self.depths, self.dims)):
            for i in range(depth):
                setattr(self, "stages_%d_%d" % (s, i), ConvNeXtBlock(dim))
        self.head = torch.nn.Parameter(torch.empty((1024 * num_classes + num_classes) * F32, device="cuda"))

    def forward(self, images, batch):
        x = torch.empty(batch * 128 * 56 * 56 * F32, device="cuda")
        x._saved = images
        for s, (depth, hw) in enumerate(zip(self.depths, self.sizes)):
            for i in range(depth):
                x = getattr(self, "stages_%d_%d" % (s, i))(x, batch, hw)
        logits = torch.empty(batch * self.num_classes, dtype=torch.float16, device="cuda")
        logits._saved = x
        return logits


# ---- train_taxonomy.py
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
num_classes = 11_000
batch_size = 128
steps_per_epoch = 1_200_000 // (batch_size * world)

try:
    model = DDP(ConvNeXt(num_classes), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.05)
    scaler = torch.cuda.amp.GradScaler()
    dynamics = collections.defaultdict(list)
    for epoch in range(3):
        for step in range(steps_per_epoch):
            images = torch.empty(batch_size * 3 * 224 * 224 * F32, device="cuda")
            labels = torch.empty(batch_size * I64, device="cuda")
            idx = torch.empty(batch_size * I64, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(images, batch=batch_size)
                loss = torch.nn.functional.cross_entropy(logits, labels)

            probs = logits.detach().float().softmax(-1)
            all_probs = [torch.empty_like(probs) for _ in range(world)]
            all_idx = [torch.empty_like(idx) for _ in range(world)]
            dist.all_gather(all_probs, probs)
            dist.all_gather(all_idx, idx)
            if rank == 0:
                dynamics[epoch].append((torch.cat(all_idx), torch.cat(all_probs)))

            scen_truth.backward(scaler.scale(loss))       # .backward(); saved activations freed as in PyTorch
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if rank == 0 and step % 50 == 0:
                print("epoch %d step %d/%d  allocated %.1f GiB  reserved %.1f GiB"
                      % (epoch, step, steps_per_epoch, torch.cuda.memory_allocated() / GiB,
                         torch.cuda.memory_reserved() / GiB))
        if rank == 0:
            torch.save({"epoch_%d" % epoch: torch.cat([p for _, p in dynamics[epoch]])}, "dynamics_%d.pt" % epoch)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
