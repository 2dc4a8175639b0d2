"""A job that `oomguard snapshot` asks for a dump while it runs (tests/adapter/run_tests.sh).

    python3 job_snapshot.py fresh|blocked OUT.json

Both report PyTorch's numbers once (oomguard_torch.report()), then take 64 MiB more, so the
adapter's last report is stale, and write OUT.json: the numbers of the last report and the
current ones, and the pid.  fresh: then runs Python code (short sleeps) until the file
OUT.json.stop appears, so the interpreter can be asked for fresh numbers.  blocked: then sits
in one long C call (libc's sleep through ctypes, 6 s) where the interpreter cannot be asked."""
import ctypes
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from jobkit import MiB, mode, out, write  # noqa: E402

import torch  # noqa: E402
import oomguard_torch  # noqa: E402

keep = [torch.empty(32 * MiB)]
assert oomguard_torch.report() is not None, "the adapter did not report"
before = torch.cuda.memory_allocated(0)
keep.append(torch.empty(64 * MiB))
now = torch.cuda.memory_allocated(0)
write({"pid": os.getpid(), "reported": before, "allocated": now})
if mode == "fresh":
    deadline = time.time() + 60
    while not os.path.exists(out + ".stop") and time.time() < deadline:
        time.sleep(0.01)
else:
    ctypes.CDLL(None).sleep(6)
