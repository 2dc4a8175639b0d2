"""A failure measured while a function holds a tensor in a local variable: the roles scan reads the
frame's locals, and must not keep the tensor alive once the function lets it go.  Python 3.12 and older copy
a frame's locals into a dict that stays on the frame; a scan that leaves it there keeps the
tensor (here 256 MiB) allocated until the function returns.

  python3 job_locals.py drop OUT.json   the function deletes its local after the failure
  python3 job_locals.py own OUT.json    the function also holds its own locals() dict: it must stay whole
  python3 job_locals.py pass OUT.json   the failed pass's frames are freed when the except block ends, with the
                                        collector off: the scan leaves no cycle through them (the stack it
                                        reads holds the scan's own frame), which would keep the pass's
                                        tensors until a collection, into the program's next step

OUT.json: allocated bytes before the local, with it, and after `del`; and whether the program's
own locals() dict still has the variable."""
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobkit  # noqa: E402
from jobkit import MiB  # noqa: E402

import torch  # noqa: E402

HUGE = 64 << 30          # more than the simulated device has: fails at once


def step(out):
    base = torch.cuda.memory_allocated()
    batch = torch.empty(256 * MiB, device="cuda")
    mine = locals() if jobkit.mode == "own" else None
    held = torch.cuda.memory_allocated()
    try:
        torch.empty(HUGE, device="cuda")
    except torch.OutOfMemoryError:
        pass
    del batch
    gc.collect()
    out.update(base=base, held=held, after=torch.cuda.memory_allocated(),
               own_kept=None if mine is None else "batch" in mine)


def failing_pass():
    act = torch.empty(256 * MiB, device="cuda")      # an activation of the pass  # noqa: F841
    torch.empty(HUGE, device="cuda")


def after_failure(out):
    gc.collect()
    gc.disable()
    base = torch.cuda.memory_allocated()
    try:
        failing_pass()
    except torch.OutOfMemoryError:
        pass
    out.update(base=base, after=torch.cuda.memory_allocated())
    gc.enable()


def main():
    out = {}
    if jobkit.mode == "pass":
        after_failure(out)
    else:
        step(out)
    jobkit.write(out)


main()
