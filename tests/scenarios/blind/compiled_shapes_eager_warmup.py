"""serve.py -- a chat model served with torch.compile(model, mode="reduce-overhead") and no fixed set
of batch sizes: the scheduler sends whatever batch it has (1..64 sequences), so every new batch size
is a new shape, run eagerly once to warm up and then captured as a CUDA graph with its own private
memory pool:

    model = load(..., torch_dtype=torch.bfloat16).cuda()        # 8 GiB
    kv = PagedKVCache(num_blocks=...)                            # 6 GiB, allocated up front
    compiled = torch.compile(model, mode="reduce-overhead")
    while True:
        batch = scheduler.next_batch()                           # len(batch) varies 1..64
        with torch.inference_mode():
            compiled(batch)                                      # new size: eager warm-up, capture

Each captured size keeps (64 + 6 x batch size) MiB in its graph's private pool for the life of the
process (empty_cache cannot free a live graph's pool).  After 35 distinct sizes the pools hold
9.1 GiB; the eager warm-up of the next new size needs 0.55 GiB of ordinary memory and fails, with
the card's memory all in weights, KV cache and idle graph pools.  An expert: capture a fixed set of
sizes and pad batches to them (1, 2, 4, 8, 16, 32, 64), i.e. fewer graph shapes, or cap the batch;
not a leak hunt, no other process, empty_cache is useless here.
"""
import random
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def load_model():
    weights = []
    for _ in range(32):
        weights.append(torch.empty(256 * MiB, device="cuda"))      # 8 GiB bf16
    return weights


def allocate_kv_cache():
    blocks = []
    for _ in range(16):
        blocks.append(torch.empty(384 * MiB, device="cuda"))        # 6 GiB
    return blocks


def forward(bs):
    """The model run eagerly (the warm-up of a new shape): its activations come and go."""
    acts = []
    for _ in range(12):
        acts.append(torch.empty((16 + bs) * MiB, device="cuda"))
    return acts[-1]


def capture(bs):
    """torch.cuda.graph capture of this shape: the graph's memory lives in its own private pool."""
    scen_truth._last.update(n=(64 + 6 * bs) * MiB, reserved=torch.cuda.memory_reserved())
    return torch.empty((64 + 6 * bs) * MiB, device="cuda", pool_id=(1, bs))


def serve(steps):
    rng = random.Random(4)
    graphs = {}
    with torch.inference_mode():
        for step in range(steps):
            bs = rng.randint(1, 64)
            if bs not in graphs:
                out = forward(bs)                                    # warm-up run, eager
                del out
                graphs[bs] = capture(bs)
            time.sleep(0.001)                                        # replay: no new memory


try:
    weights = load_model()
    kv = allocate_kv_cache()
    serve(5000)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
