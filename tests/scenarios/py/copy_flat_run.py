"""train.py -- fine-tuning (fp32, AdamW) that keeps a copy of the weights and the optimizer's first
moments every 100 steps, made on the GPU; run with plain `LD_PRELOAD=liboomguard.so`:

    for step, batch in enumerate(loader, 1):
        loss = model(batch).loss; loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0:
            # `dict`: a snapshot "to roll back if the loss spikes"
            snapshot = {k: v.clone() for k, v in model.state_dict().items()}
            opt_snapshot = {i: s["exp_avg"].clone() for i, s in enumerate(optimizer.state.values())}
            # `list`: kept "to compare later", in names that say nothing of a checkpoint
            weights_before = [p.detach().clone() for p in model.parameters()]
            moments_before = [s["exp_avg"].clone() for s in optimizer.state.values()]

Weights 5.25 GiB, AdamW moments 10.5 GiB, a step's activations and gradients come and go from the cache;
a hundred steps run flat, then the copy is made beside the weights and fails part way.  With `list` no
named object holds it yet (the comprehension's list): only its blocks' sizes say it copies the weights.
A one-off copy, not a leak, not a checkpoint being loaded: an expert keeps it in host memory
(v.detach().cpu()) or on disk; not a restart, not map_location, not a second load, not a smaller batch.

Argument: `dict` (the default) or `list`, the form of the copy.
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
AS_LIST = sys.argv[1:] == ["list"]
scen_truth.note_every_empty(torch)

# Test scaffolding: the comprehension's partial dict is freed as the error leaves it, so the truth is
# marked at the failure itself, by a stand-in for Tensor.clone compiled as part of torch's own file (as
# scen_truth's wrappers are: the failing Python line stays the program's).
_CLONE = """
def clone_of(t):
    try:
        return empty_like(t)
    except OutOfMemoryError:
        if not marked:
            marked.append(1)
            mark()
        raise
"""
_marked = []
_ns = {"empty_like": torch.empty_like, "OutOfMemoryError": torch.OutOfMemoryError, "marked": _marked,
       "mark": scen_truth.torch_oom_mark}
exec(compile(_CLONE, torch.__file__, "exec"), _ns)
clone_of = _ns["clone_of"]


class Net(torch.nn.Module):
    def __init__(self, n=28):
        torch.nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(192 * MiB, device="cuda")))

    def forward(self, x):
        h = x
        for _ in range(8):
            a = torch.empty(128 * MiB, device="cuda")    # saved for backward
            a._saved = h
            h = a
        return h


def main():
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(1, 1000):
        x = torch.empty(8 * MiB, device="cuda")
        h = model(x)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(model.parameters())
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, x, h
        if step % 100 == 0:
            # v.clone() of each entry (the stand-in has no clone: the same allocation)
            if AS_LIST:
                weights_before = [clone_of(p) for p in model.parameters()]
                moments_before = [clone_of(s["exp_avg"]) for s in opt.state.values()]
            else:
                snapshot = {k: clone_of(v) for k, v in model.state_dict().items()}
                opt_snapshot = {i: clone_of(s["exp_avg"]) for i, s in enumerate(opt.state.values())}
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    if not _marked:
        scen_truth.torch_oom_mark()
    raise
sys.exit(0)
