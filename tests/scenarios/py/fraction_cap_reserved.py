"""serve.py -- an inference service on a shared 24 GiB card, capped by its launcher:

    torch.cuda.set_per_process_memory_fraction(0.5)     # 12 GiB for this process
    warmup = [model(torch.randn(big_batch)) for _ in range(10)]; del warmup   # 10 x 1 GiB, now cached
    outs = [model(x) for x in requests]                  # 10 x 600 MiB: each reuses a cached 1 GiB block
    y = model.generate(long_request)                     # 2.5 GiB more: refused

PyTorch's fraction bounds what its caching allocator RESERVES: 10 GiB reserved (6 GiB in tensors, the
rest the tails of split cached blocks) + a 2.5 GiB segment > 12 GiB, so PyTorch refuses it itself,
though allocated + request (8.5 GiB) is under the cap and the card has 14 GiB free.  An expert: the cap
refused it (raise the fraction, or keep it and return the cache: empty_cache / expandable_segments);
not other processes (there are none), not a bigger GPU.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
empty = scen_truth.torch_empty

torch.cuda.set_per_process_memory_fraction(0.5)
try:
    warmup = [empty(1024 * MiB, device="cuda") for _ in range(10)]
    del warmup
    outs = [empty(600 * MiB, device="cuda") for _ in range(10)]
    y = empty(2560 * MiB, device="cuda")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
