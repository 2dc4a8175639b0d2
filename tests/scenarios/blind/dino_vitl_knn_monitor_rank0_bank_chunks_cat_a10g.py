"""DINO self-supervised pretraining of a ViT-L/16 on an in-house set of 2.5M product photos, DDP over 8 A10G
cards (24 GiB; an AWS ParallelCluster g5.48xlarge node, Slurm, one GPU per task: `srun --ntasks=8
--gpus-per-task=1 python main_dino.py`, PyTorch 2.3.1).  Every few epochs a kNN monitor measures the
teacher's features the way the DINO repository's eval_knn does -- every rank extracts the features of its
shard, they are all-gathered, and rank 0 builds the feature bank:

    class KNNMonitor:
        def build_bank(self, teacher, loader):
            self.bank_chunks, self.label_chunks = [], []
            for images, labels in loader:                                   # 256 per rank
                feats = F.normalize(teacher.backbone(images), dim=1)        # 256 x 1024 fp32
                gathered = all_gather(feats)                                # 8 x 256 x 1024 -> 8 MiB
                if rank == 0:
                    self.bank_chunks.append(gathered)                       # kept on the GPU
                    self.label_chunks.append(all_gather(labels))
            if rank == 0:
                self.bank = torch.cat(self.bank_chunks, dim=0)              # 2.5M x 1024 fp32
                self.bank_labels = torch.cat(self.label_chunks)

Rank 0 holds the training state (student and teacher 1.2 GiB each, DDP's gradient buckets, gradients,
AdamW's moments: 7.3 GiB in all) and the freed activations of the last training step stay cached.  The 1221
gathered chunks, 9.5 GiB, kept in the monitor's list, fill that cache and a bit more; then torch.cat asks
for the whole bank again, 9.5 GiB more, while the chunks are still alive -- and fails.  The other seven
ranks never keep anything (they only contribute to the all-gather) and sit in the next barrier.

An expert: a 2.5M-row feature bank has no business living in GPU memory next to training -- keep it in host
memory (move each gathered chunk to the CPU, or preallocate a CPU/pinned bank and copy into it) and run the
similarity search batch by batch, or keep it sharded (each rank its own 1/8 and its own top-k, then merge
the k candidates), or in fp16.  List-then-cat is what doubles it.  Not a smaller batch (256 images are
nothing), not checkpointing, 8-bit optimizers or inference_mode (no_grad is on), not fragmentation.
"""
import ctypes
import os
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

rank = int(os.environ.get("SLURM_PROCID", "0"))
world = int(os.environ.get("SLURM_NTASKS", "1"))
local_rank = int(os.environ.get("SLURM_LOCALID", "0"))

# torch.cat and all_gather_into_tensor as PyTorch runs them (the stand-in torch has neither): the frames are
# torch's own files, the memory a new tensor of the result's size
_TORCH_OPS = '''
def cat(tensors, dim=0):
    return empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
'''
_C10D = '''
def all_gather_into_tensor_(tensor, world_size):
    out = empty(tensor.nbytes * world_size, device=tensor.device)
    return out
'''
_ns = {"empty": torch.empty}
exec(compile(_TORCH_OPS, torch.__file__, "exec"), _ns)
torch.cat = _ns["cat"]
exec(compile(_C10D, os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py"), "exec"), _ns)
_all_gather_into_tensor = _ns["all_gather_into_tensor_"]


def nccl_library():
    """libnccl.so.2 as torch.distributed loads it (the scenario kit's stand-in)."""
    for d in (os.environ.get("SCEN_KIT_LIB", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib")):
        p = os.path.join(d, "libnccl.so.2")
        if d and os.path.exists(p):
            return ctypes.CDLL(p)
    raise SystemExit("libnccl.so.2 stand-in not found")


def init_process_group():
    """dist.init_process_group("nccl") + the first collective: NCCL's communicator and its channel buffers."""
    nccl = nccl_library()
    nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    if nccl.nccl_comm_init_rank(world, rank, 4 * MiB, 16) != 0:
        raise RuntimeError("NCCL error: unhandled cuda error")


def all_gather(t):
    return _all_gather_into_tensor(t, world)


class ViTL16(torch.nn.Module):
    """24 blocks of 12.6M parameters (50 MiB fp32 each), patch embedding, norm."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(3 * 16 * 16 * 1024 * 4, device="cuda"))
        for i in range(24):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(50 * MiB, device="cuda")))
        self.norm = torch.nn.Parameter(torch.empty(2 * 1024 * 4, device="cuda"))

    def forward(self, images, batch, crops_tokens):
        acts = []
        if torch.is_grad_enabled():
            for i in range(24):
                acts.append(torch.empty(400 * MiB, device="cuda"))      # fp16 activations of the multi-crop batch
        else:
            tmp = torch.empty(batch * 197 * 1024 * 2 * 4, device="cuda")  # one block's transient
            del tmp
        out = torch.empty(batch * 1024 * 4, device="cuda")
        out._saved = acts
        return out


class DINOHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.mlp = torch.nn.Parameter(torch.empty((1024 * 2048 + 2048 * 2048 + 2048 * 256) * 4, device="cuda"))
        self.last_layer = torch.nn.Parameter(torch.empty(256 * 65536 * 4, device="cuda"))

    def forward(self, x):
        return torch.empty(x.nbytes // 1024 * 65536, device="cuda")


class MultiCropWrapper(torch.nn.Module):
    def __init__(self, backbone, head):
        torch.nn.Module.__init__(self)
        self.backbone = backbone
        self.head = head

    def forward(self, images, batch):
        feats = self.backbone(images, batch, 197)
        out = self.head(feats)
        out._saved = feats
        return out


class KNNMonitor(object):
    def __init__(self, k=20):
        self.k = k
        self.bank = None
        self.bank_chunks, self.label_chunks = [], []

    def build_bank(self, teacher, n_images, batch):
        teacher.eval()
        self.bank_chunks, self.label_chunks = [], []
        steps = n_images // (batch * world)
        with torch.no_grad():
            for step in range(steps):
                images = torch.empty(batch * 3 * 224 * 224 * 4, device="cuda")
                labels = torch.empty(batch * 8, device="cuda")
                feats = teacher.backbone(images, batch, 197)                  # 256 x 1024 fp32, normalized
                gathered = all_gather(feats)
                if rank == 0:
                    self.bank_chunks.append(gathered)
                    self.label_chunks.append(all_gather(labels))
            if rank == 0:
                self.bank = torch.cat(self.bank_chunks, dim=0)
                self.bank_labels = torch.cat(self.label_chunks)
        teacher.train()


torch.cuda.set_device(local_rank)
init_process_group()
student = MultiCropWrapper(ViTL16(), DINOHead())
teacher = MultiCropWrapper(ViTL16(), DINOHead())
for p in teacher.parameters():
    p.requires_grad_(False)
student = torch.nn.parallel.DistributedDataParallel(student, device_ids=[local_rank])
optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.04)
knn = KNNMonitor(k=20)

try:
    for epoch in range(2):
        for it in range(2):                                   # a few iterations of the epoch
            images = torch.empty(64 * 3 * 224 * 224 * 4, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                s_out = student(images, 64)
                with torch.no_grad():
                    t_out = teacher(images, 64)
                loss = F.cross_entropy(s_out, t_out)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del loss, s_out, t_out
        if epoch % 2 == 1:
            knn.build_bank(teacher, 2500000, 256)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
