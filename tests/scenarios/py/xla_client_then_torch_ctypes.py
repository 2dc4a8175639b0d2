"""train.py -- a PyTorch trainer whose data pipeline calls a jitted JAX function once: XLA's client
(xla_extension.so) starts and preallocates 75% of the 24 GiB card; then PyTorch, reaching cudaMalloc
through ctypes (the stand-in), fails in its next forward pass:

    batch = jax_augment(batch)          # XLA's client: 18 GiB arena
    loss = model(torch.from_dlpack(batch)).loss      # PyTorch: refused

The process saw JAX's library first; the failing call is PyTorch's (its adapter reported).  An expert:
JAX's arena holds the card: XLA_PYTHON_CLIENT_PREALLOCATE=false or a small
XLA_PYTHON_CLIENT_MEM_FRACTION; nothing about a smaller batch or other processes.
"""
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
empty = scen_truth.torch_empty
scen_truth.note_every_empty(torch)

xla = ctypes.CDLL(os.environ["SCEN_XLA"])
if xla.xla_client_init(0) != 0:
    raise SystemExit("the XLA client did not start")


def alloc_n(n, nbytes):
    """n tensors of nbytes in a list local to this frame: the failure's traceback keeps the partial list
    alive, as a forward pass's tensors are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(empty(nbytes, device="cuda"))
    return got


params = [torch.nn.Parameter(t) for t in alloc_n(4, 256 * MiB)]
try:
    acts = alloc_n(16, 512 * MiB)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
