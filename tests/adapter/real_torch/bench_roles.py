"""The cost of splitting allocated bytes by role (adapters/python/oomguard_roles.py) on a large
heap, with the real torch (CPU tensors stand in for the failing device):

    python3 bench_roles.py [OBJECTS [TENSORS [nested]]]   default 1000000 Python objects, 100000 tensors

The tensors: a fifth parameters (in modules of 10), their gradients, AdamW's two state tensors
each after a real step, and the rest in a global list (with `nested`: in a global dict of objects
each keeping a list of 8 of them, a cache of past_key_values by key); the objects: a dataset of
small user objects in a global list.  Prints the scan's time with no budget and whether the default budget
(OOMGUARD_ROLES_BUDGET_MS, 200 ms) finishes it; docs/pytorch-adapter.md quotes the figures."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "adapters", "python"))
import torch  # noqa: E402

import oomguard_roles  # noqa: E402

OBJECTS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000000
TENSORS = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
NESTED = len(sys.argv) > 3 and sys.argv[3] == "nested"


class Item(object):
    def __init__(self, i):
        self.i = i


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(16)) for _ in range(10)])


nparams = TENSORS // 5
blocks = torch.nn.ModuleList([Block() for _ in range(nparams // 10)])
for p in blocks.parameters():
    p.grad = torch.zeros(16)
opt = torch.optim.AdamW(blocks.parameters(), foreach=False) if "foreach" in torch.optim.AdamW.__init__.__code__.co_varnames \
    else torch.optim.AdamW(blocks.parameters())
opt.step()
cache = [torch.zeros(16) for _ in range(TENSORS - 4 * nparams)]
if NESTED:
    entries = {}
    for i in range(0, len(cache), 8):
        e = Item(i)
        e.key_cache = cache[i:i + 8]
        entries["key-%d" % i] = e
    cache = entries
dataset = [Item(i) for i in range(OBJECTS)]


def cpu(t):
    return t.device.type == "cpu"


def run(budget):
    """(wall ms, CPU ms of this thread, the result): on a shared machine the CPU time is the cost."""
    t0, c0 = time.perf_counter(), time.thread_time()
    r = oomguard_roles.measure(torch, 0, None, on_device=cpu, round_to=1, budget=budget)
    return (time.perf_counter() - t0) * 1000.0, (time.thread_time() - c0) * 1000.0, r


run(60.0)                                   # warm: type caches, imports
ms, cpu_ms, r = run(60.0)
tensors = sum(v[1] for v in r["roles"].values())
print("objects in gc: %d, tensors counted: %d, containers/classes read in part: %d" % (r["objects"], tensors,
                                                                                       r["sampled"]))
print("roles scan, no budget: %.1f ms wall, %.1f ms CPU" % (ms, cpu_ms))
ms2, cpu2, r2 = run(oomguard_roles.budget_s())
print("with the default budget (%g ms): %.1f ms wall, %.1f ms CPU, complete %s" % (
    oomguard_roles.budget_s() * 1000, ms2, cpu2, r2["complete"]))
for k in oomguard_roles.ROLES:
    print("  %-16s %-20s budgeted: %s" % (k, r["roles"][k], r2["roles"][k]))
print("  " + r2["why"])
