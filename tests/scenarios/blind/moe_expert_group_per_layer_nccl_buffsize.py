"""train_moe.py -- a Mixture-of-Experts model (32 MoE layers, 8 experts each) trained with expert
parallelism over the 4 H100 80GB of one node, launched with `torchrun --nproc-per-node=4`:

    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))  # eager: communicators
    model = MoETransformer(cfg).cuda()                                            # are made at new_group

    class MoELayer(nn.Module):
        def __init__(self, cfg):
            self.experts = ...                                 # this rank's 2 of the 8 experts
            self.ep_group = dist.new_group(list(range(world))) # one group (and NCCL communicator) per layer

The launch script also exports NCCL_BUFFSIZE=33554432 (32 MiB, 8x the default) and
NCCL_MIN_NCHANNELS=16, copied from an all-to-all tuning post.  Every MoE layer creates its own
process group for the same 4 ranks, and with eager initialisation each gets its own NCCL communicator
with its own buffers: 16 channels x 2 peers x (32 MiB + LL/LL128 buffers) ~ 1.15 GiB per layer, 37 GiB
per GPU for 32 layers, next to 1.6 GiB of weights per layer.  Building the 28th layer, NCCL's
cudaMalloc for its new communicator fails on every rank (ncclUnhandledCudaError): 32 GiB of each GPU
are NCCL's by then.

An expert: NCCL holds a third of each GPU in communicator buffers: create the expert-parallel group
once and share it between the layers (one communicator instead of 32), and drop NCCL_BUFFSIZE back to
its 4 MiB default; the model itself fits.  Not a smaller batch (no batch has run), not gradient
checkpointing or the allocator's settings, not other processes.
"""
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

rank = int(os.environ.get("RANK", "0"))
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))


class DistBackendError(RuntimeError):
    pass


class ProcessGroupNCCL(object):
    """torch.distributed's NCCL process group: with init_process_group(device_id=...) (PyTorch 2.3+)
    new_group creates its communicator at once (ncclCommInitRankConfig), which allocates NCCL's
    per-channel buffers on this rank's GPU."""
    _nccl = None

    def __init__(self, ranks):
        self.ranks = list(ranks)
        if ProcessGroupNCCL._nccl is None:
            ProcessGroupNCCL._nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
        buffsize = int(os.environ.get("NCCL_BUFFSIZE", str(4 * MiB)))
        nchannels = int(os.environ.get("NCCL_MIN_NCHANNELS", "2"))
        peers = 2                                                   # ring: send to next, receive from previous
        per_channel = peers * (buffsize + 4608 * 1024 + 256 * 1024)  # SIMPLE + LL128 + LL buffers
        per_channel = -(-per_channel // (2 * MiB)) * (2 * MiB)       # NCCL 2.19+ rounds its cuMem buffers to the granularity
        rc = self._nccl.nccl_comm_init_rank(len(self.ranks), self.ranks.index(rank),
                                            ctypes.c_size_t(per_channel), nchannels)
        if rc != 0:
            raise DistBackendError("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
                                   "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5\n"
                                   "ncclUnhandledCudaError: Call to CUDA function failed.\n"
                                   "Last error:\nCuda failure 'out of memory'")


class dist(object):
    """torch.distributed, as far as this script uses it."""
    WORLD = None

    @staticmethod
    def init_process_group(backend, device_id=None):
        dist.WORLD = ProcessGroupNCCL(range(world))

    @staticmethod
    def new_group(ranks):
        return ProcessGroupNCCL(ranks)


def select_device(i):
    """torch.cuda.set_device(i): PyTorch selects the device before anything creates a context (the
    stand-in's lazy initialisation would otherwise make its context on device 0 first)."""
    torch._fake_cuda.runtime().cudaSetDevice(i)
    torch.cuda.set_device(i)


class Expert(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w1 = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))      # bf16 4096 x 32768
        self.w2 = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
        self.w3 = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))


class MoELayer(torch.nn.Module):
    def __init__(self, num_experts=8):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
        self.router = torch.nn.Parameter(torch.empty(64 * 1024, device="cuda"))
        for e in range(num_experts // world):                    # this rank's experts
            setattr(self, "expert%d" % e, Expert())
        self.ep_group = dist.new_group(list(range(world)))


class MoETransformer(torch.nn.Module):
    def __init__(self, layers=32):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(1 * GiB, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(layers):
            setattr(self.layers, str(i), MoELayer())
        self.head = torch.nn.Parameter(torch.empty(1 * GiB, device="cuda"))


def main():
    select_device(local_rank)
    dist.init_process_group("nccl", device_id=local_rank)
    model = MoETransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return model, optimizer


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
except DistBackendError as e:
    print("[rank%d]: torch.distributed.DistBackendError: %s" % (rank, e), file=sys.stderr)
    sys.exit(1)
sys.exit(0)
