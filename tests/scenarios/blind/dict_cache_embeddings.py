"""train.py -- a retrieval fine-tune that memoizes the frozen encoder's outputs in a dict, on the GPU:

    cache = {}
    for step, batch in enumerate(loader):
        for i, doc in zip(batch.ids, batch.docs):
            if i not in cache:
                with torch.no_grad():
                    cache[i] = encoder(doc)            # 24 MiB per document, never evicted
        loss = head(torch.stack([cache[i] for i in batch.ids])).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Each step adds 8 new documents (192 MiB); after ~90 steps the card is full and the step's
activations fail.  An expert: the unbounded dict is the leak; bound it (LRU) or keep it on the CPU;
not a smaller batch, not empty_cache.
"""
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
cache = {}
try:
    weights = alloc_n(12, 256 * MiB)      # encoder + head, optimizer: 3 GiB
    for step in range(1000):
        for j in range(8):
            with torch.no_grad():
                cache[step * 8 + j] = empty(24 * MiB, device="cuda")
        acts = alloc_n(8, 256 * MiB)     # 2 GiB of activations
        del acts
        time.sleep(0.003)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
