"""pretrain_gpt.py (Megatron-LM) under `torchrun --nproc_per_node 2` on two 48 GiB RTX A6000s (a wrapper
binds each worker to its own GPU): a 2.7B GPT with tensor parallelism 2, bf16, the distributed
optimizer.  The launch script exports NCCL settings copied from a "fast all-reduce" tuning guide
written for InfiniBand clusters:

    export NCCL_BUFFSIZE=67108864          # 64 MiB per buffer (default 4 MiB)
    export NCCL_MIN_NCHANNELS=32           # at least 32 channels per communicator
    torchrun --nproc_per_node 2 pretrain_gpt.py --tensor-model-parallel-size 2 ...

Megatron creates its process groups at start-up (world, tensor-parallel, model-parallel,
tensor-and-data-parallel; NCCL communicators initialised eagerly), and every communicator now
allocates 32 channels x 128 MiB of buffers on the GPU: 16 GiB per rank before the model exists.
The model state (weights, main grads, optimizer shards: ~21 GiB per rank) is built; the first
forward fails on both ranks at layer 26 of 32.  Without the two variables NCCL needs < 1 GiB and a
step peaks at ~38 GiB.  An expert: drop NCCL_BUFFSIZE / NCCL_MIN_NCHANNELS (their defaults are
right for two GPUs on PCIe); the model, the batch and the parallel layout are fine.
"""
import ctypes
import os
import subprocess
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30


def launcher(nproc=2):
    """torchrun: one worker per rank; the job fails when its workers have failed."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env))
    rcs = [p.wait() for p in procs]
    return 1 if any(rcs) else 0


_nccl = None


def new_nccl_group(ranks):
    """dist.new_group(ranks) with eager NCCL init: each communicator allocates its channels'
    buffers (send and receive, NCCL_BUFFSIZE each) on the rank's GPU."""
    global _nccl
    if _nccl is None:
        _nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
        _nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    buffsize = int(os.environ.get("NCCL_BUFFSIZE", 4 * MiB))
    channels = max(int(os.environ.get("NCCL_MIN_NCHANNELS", 2)), 2)
    if _nccl.nccl_comm_init_rank(len(ranks), int(os.environ["RANK"]), 2 * buffsize, channels) != 0:
        raise RuntimeError("NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)")


class ParallelTransformerLayer(torch.nn.Module):
    """One layer's tensor-parallel shard: bf16 weights, fp32 main params and grads, Adam shards."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(76 * MiB, device="cuda"))       # bf16 shard
        self.main_grad = torch.empty(152 * MiB, device="cuda")                       # fp32 grad buffer
        self.main_param = torch.empty(152 * MiB, device="cuda")                      # fp32 main params
        self.adam = torch.empty(304 * MiB, device="cuda")                            # exp_avg + exp_avg_sq

    def forward(self, h):
        a = torch.empty(400 * MiB, device="cuda")       # saved activations, micro-batch 4 x 2048
        a._saved = h
        return a


class GPTModel(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.layers = []
        for i in range(n_layers):
            layer = ParallelTransformerLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    def forward(self, tokens):
        h = tokens
        for layer in self.layers:
            h = layer(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    torch.cuda.set_device(0)                               # the worker's only visible GPU
    world = list(range(int(os.environ["WORLD_SIZE"])))
    for name in ("world", "tensor_model_parallel", "model_parallel", "tensor_and_data_parallel"):
        new_nccl_group(world)
    model = GPTModel()
    for it in range(500000):
        tokens = torch.empty(4 * 2048 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens)
        scen_truth.backward(loss)
        del loss, tokens


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
