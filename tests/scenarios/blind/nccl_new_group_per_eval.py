"""train.py (rank 0 of 8, one GPU per rank) -- the evaluation helper builds a fresh process group
every time it runs and never destroys it:

    def evaluate(model):
        group = dist.new_group(ranks=list(range(world)))   # a new NCCL communicator each call
        ...
        dist.all_reduce(metric, group=group)

Each new communicator allocates its channel buffers on the GPU (16 channels x 32 MiB = 512 MiB
here); training itself is flat at 19 GiB of PyTorch memory.  After 8 evaluations NCCL cannot get
its buffers.  An expert: create the group once and reuse it (or destroy_process_group it); a lower
NCCL_BUFFSIZE/NCCL_MAX_NCHANNELS only postpones it; nothing to do with batch size.
"""
import ctypes
import os
import sys
import time
import torch
import scen_truth

MiB = 1 << 20


def alloc_n(n, nbytes):
    """n tensors of nbytes; a list local to this frame, so a failure's traceback keeps the partial
    list alive in the except block, as the tensors of a real forward pass are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(scen_truth.torch_empty(nbytes, device="cuda"))
    return got
empty = scen_truth.torch_empty
nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
state = alloc_n(28, 512 * MiB)           # weights, grads, moments: 14 GiB
if nccl.nccl_comm_init_rank(8, 0, 32 * MiB, 16) != 0:                   # the default group (DDP)
    sys.exit(2)
for step in range(2000):
    acts = alloc_n(20, 256 * MiB)         # 5 GiB per step, cached
    del acts
    time.sleep(0.001)
    if step % 100 == 99:
        if nccl.nccl_comm_init_rank(8, 0, 32 * MiB, 16) != 0:            # dist.new_group in evaluate()
            sys.stderr.write("NCCL error: unhandled cuda error (out of memory)\n")
            sys.exit(1)
sys.exit(0)
