"""finetune_asr.py under `torchrun --nproc_per_node 2` (a node with two 24 GiB A10G; a wrapper binds
each worker to its own GPU, CUDA_VISIBLE_DEVICES=$LOCAL_RANK) -- CTC fine-tuning of a 600M-parameter
speech encoder (w2v-BERT 2.0; fp32 master weights, AdamW, bf16 autocast) with
DistributedDataParallel.  The config ramps the per-GPU batch: 8 utterances of 20 s for the first 40
steps, then 16 (`batch_size_schedule: [[0, 8], [40, 16]]`, added to reach the paper's global batch):

    dist.init_process_group("nccl")
    model = DDP(Wav2Vec2BertForCTC.from_pretrained(ckpt).cuda(), device_ids=[0])   # bucket_cap_mb=25
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for step, batch in enumerate(loader):            # the batch size follows the schedule
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Per rank: weights 2.2 GiB, DDP's gradient buckets 2.2 GiB (a flat copy of every gradient, made when
DDP is built), the gradients 2.2 GiB, AdamW's moments 4.5 GiB, NCCL 0.5 GiB, and 1.1 GiB of saved
activations per utterance.  At 8 utterances a step peaks at ~19 GiB; the first step at 16 fails in
the forward on both ranks, ~4 GiB short.  An expert: keep 8 utterances per GPU and reach the new
global batch by accumulating 2 micro-batches (or checkpoint the encoder's activations);
gradient_as_bucket_view=True gives back the bucket copy (2.2 GiB) but does not close the gap alone.
Each rank has its own GPU, nothing else is on it, DDP is already in use.
"""
import ctypes
import os
import subprocess
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
SCHEDULE = [(0, 8), (40, 16)]


def launcher(nproc=2):
    """torchrun: one worker per rank, the rank in the environment; the job fails when its workers
    have failed (both ranks hit the same step)."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env))
    rcs = [p.wait() for p in procs]
    return 1 if any(rcs) else 0


class ConformerLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.ffn1 = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))
        self.attn = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
        self.conv = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))
        self.ffn2 = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))

    def forward(self, h, batch_size):
        a = torch.empty(batch_size * 46 * MiB, device="cuda")    # bf16 activations saved for backward
        a._saved = h
        return a


class Wav2Vec2BertForCTC(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        self.feature_projection = torch.nn.Parameter(torch.empty(88 * MiB, device="cuda"))
        self.layers = []
        for i in range(n_layers):
            layer = ConformerLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, features, batch_size):
        h = features
        for layer in self.layers:
            h = layer(h, batch_size)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


class DistributedDataParallel(torch.nn.Module):
    """The reducer's buckets: flat 25 MiB buffers holding a copy of every gradient for the
    all-reduce, allocated when DDP is built (gradient_as_bucket_view=False, the default)."""

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


def batch_size_at(step):
    return [b for s, b in SCHEDULE if step >= s][-1]


def main():
    torch.cuda.set_device(0)                          # the worker's only visible GPU
    pg = init_process_group("nccl")
    model = DistributedDataParallel(Wav2Vec2BertForCTC.from_pretrained("ckpt/w2v-bert-2.0").cuda(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.module.parameters(), lr=5e-5)
    for step in range(100000):
        bs = batch_size_at(step)
        features = torch.empty(bs * 2 * MiB, device="cuda")   # 20 s of log-mel frames per utterance
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(features, bs)
        scen_truth.backward(loss)
        optimizer.step()
        model.module.zero_grad(set_to_none=True)
        del loss, features


def worker():
    scen_truth.note_every_empty(torch)
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(worker() if "RANK" in os.environ else launcher())
