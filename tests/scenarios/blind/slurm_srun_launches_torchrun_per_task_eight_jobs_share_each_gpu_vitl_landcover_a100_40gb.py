"""finetune_landcover.py -- a remote-sensing group fine-tunes a ViT-L/16 (SatMAE-style pretraining, 13
Sentinel-2 bands, 304M parameters) for 19-class land-cover classification.  The script is a plain torchrun
DDP loop (bf16 autocast, batch 64 per GPU, AdamW) that trains fine on the group's own 8-GPU server.  Moved to
the university cluster (DGX A100 nodes, 8x A100 40GB), it was wrapped in the cluster's sbatch template:

    #SBATCH --nodes=1
    #SBATCH --ntasks-per-node=8          # from the template: "one task per GPU"
    #SBATCH --gpus-per-node=8
    #SBATCH --cpus-per-task=12
    srun torchrun --standalone --nproc_per_node=8 finetune_landcover.py --batch-size 64

srun runs its command once per task: eight torchrun launchers, each starting eight workers.  --standalone
gives every launcher its own rendezvous on a free port, so nothing collides: eight independent 8-rank jobs
train the same model on the same node, and every GPU holds LOCAL_RANK k of all eight of them (each worker
does set_device(LOCAL_RANK) correctly).  The log shows every line eight times; W&B shows eight runs.

On GPU 0 the eight processes each load the model, wrap it in DDP and make their NCCL communicator (about
2.9 GiB each with the CUDA context), then start their first forward passes at the same moment.  This worker
(LOCAL_RANK 0 of the launcher Slurm started as task 5) finds 31.7 GiB of the card held by seven other
python processes -- two of them already part way into their own forwards -- and fails in the 9th of 24
transformer blocks.  Alone, the job peaks at about 17 GiB per GPU.

An expert: the seven other processes on this GPU are copies of the same job, launched twice over (srun x
torchrun): launch one launcher per node (--ntasks-per-node=1, and let torchrun start the 8 workers) or drop
torchrun and let srun start the 8 ranks (with RANK/LOCAL_RANK from SLURM_PROCID/SLURM_LOCALID).  Wrong first
advice: a smaller batch, gradient checkpointing, mixed precision (already bf16), FSDP/ZeRO, a bigger GPU
(each would only squeeze eight copies of one job onto the card), set_device (each process already uses its
own LOCAL_RANK's GPU: the problem is how many processes have that LOCAL_RANK), expandable_segments /
empty_cache, restarting (the same sbatch does the same again).
"""
import ctypes
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20
F32, BF16 = 4, 2


# ---- torch.distributed as far as this script uses it (the simulator's torch has none): NCCL's
# communicator is made by the first collective (DDP's broadcast of the weights), with libnccl.so.2's own
# cudaMalloc on the rank's device.
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


def _init_process_group(backend="nccl"):
    pass


def _broadcast(tensor, src=0):
    if not _comm:
        if _nccl_library().nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
                                               8 * MiB, 16) != 0:
            raise RuntimeError("NCCL error: unhandled cuda error")
        _comm.append(True)


dist = types.SimpleNamespace(init_process_group=_init_process_group, broadcast=_broadcast,
                             get_rank=lambda: int(os.environ["RANK"]),
                             get_world_size=lambda: int(os.environ["WORLD_SIZE"]))


class DDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, device_ids=None, **kw):
        for p in module.parameters():
            dist.broadcast(p, 0)
        torch.nn.parallel.DistributedDataParallel.__init__(self, module, device_ids=device_ids, **kw)


# ---- the model: a ViT-L/16 with a 13-band patch embedding (timm layout, sizes only)
class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty((1024 * 3072 + 3072 + 1024 * 1024 + 1024) * F32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty((1024 * 4096 * 2 + 4096 + 1024) * F32, device="cuda"))
        self.norms = torch.nn.Parameter(torch.empty(4 * 1024 * F32, device="cuda"))

    def forward(self, x, tokens):
        # what autograd keeps for backward under bf16 autocast: norms in fp32, matmul outputs in bf16
        saved = [torch.empty(tokens * 1024 * F32, device="cuda"),       # norm1
                 torch.empty(tokens * 3072 * BF16, device="cuda"),      # qkv
                 torch.empty(tokens * 1024 * BF16, device="cuda"),      # attention output (SDPA)
                 torch.empty(tokens * 1024 * BF16, device="cuda"),      # proj
                 torch.empty(tokens * 1024 * F32, device="cuda"),       # residual
                 torch.empty(tokens * 1024 * F32, device="cuda"),       # norm2
                 torch.empty(tokens * 4096 * BF16, device="cuda"),      # fc1
                 torch.empty(tokens * 4096 * BF16, device="cuda"),      # gelu
                 torch.empty(tokens * 1024 * BF16, device="cuda")]      # fc2
        out = torch.empty(tokens * 1024 * F32, device="cuda")
        out._saved = x
        out._kept = saved
        return out


class VisionTransformer(torch.nn.Module):
    def __init__(self, in_chans=13, num_classes=19):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty((in_chans * 16 * 16 * 1024 + 1024) * F32, device="cuda"))
        self.pos_embed = torch.nn.Parameter(torch.empty(197 * 1024 * F32, device="cuda"))
        for i in range(24):
            setattr(self, "blocks_%d" % i, Block())
        self.norm = torch.nn.Parameter(torch.empty(2 * 1024 * F32, device="cuda"))
        self.head = torch.nn.Parameter(torch.empty((1024 * num_classes + num_classes) * F32, device="cuda"))

    def forward(self, images, batch):
        tokens = batch * 197
        x = torch.empty(tokens * 1024 * F32, device="cuda")
        x._saved = images
        for i in range(24):
            x = getattr(self, "blocks_%d" % i)(x, tokens)
        logits = torch.empty(batch * 19 * F32, device="cuda")
        logits._saved = x
        return logits


# ---- finetune_landcover.py
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
print("[rank %d/%d] cuda:%d, job %s" % (rank, world, local_rank, os.environ.get("TORCHELASTIC_RUN_ID")))
batch_size = 64

try:
    model = VisionTransformer(in_chans=13, num_classes=19)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    free, total = torch.cuda.mem_get_info()
    print("[rank %d/%d] model ready: %.1f GiB allocated, %.1f of %.1f GiB free on the card"
          % (rank, world, torch.cuda.memory_allocated() / GiB, free / GiB, total / GiB))
    for step in range(2):
        images = torch.empty(batch_size * 13 * 224 * 224 * F32, device="cuda")
        labels = torch.empty(batch_size * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images, batch=batch_size)
            loss = torch.nn.functional.cross_entropy(logits, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
