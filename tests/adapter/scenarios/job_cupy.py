"""Jobs with the stand-in cupy (tests/adapter/fake_cupy) for tests/adapter/run_tests.sh.

    python3 job_cupy.py MODE [OUT.json]

OUT.json gets what the pool knew at the failure and the lines of this file the test looks for.
Modes:
  limit     get_default_memory_pool().set_limit(size=256 MiB), then 48 MiB arrays until the pool
            refuses one itself (no driver failure), caught; CUPY_GPU_MEMORY_LIMIT works too
  uncaught  the same, not caught (exit status 1)
  driver    no limit: 256 MiB arrays until cudaMalloc fails; CuPy frees its free blocks,
            retries, and raises OutOfMemoryError (caught)
"""
import os
import sys

import cupy

from jobkit import MiB, here, mode, write as write_out

keep = []
lines = {}


def write(request, limit):
    pool = cupy.get_default_memory_pool()
    ad = sys.modules.get("oomguard_cupy")
    write_out({"expected": {"device": 0, "request": request, "limit": limit, "used": pool.used_bytes(),
                            "total": pool.total_bytes()},
               "lines": lines, "file": os.path.abspath(__file__), "version": cupy.__version__,
               "attached": ad.is_attached() if ad else None})


pool = cupy.get_default_memory_pool()
if mode in ("limit", "uncaught"):
    if not os.environ.get("CUPY_GPU_MEMORY_LIMIT"):
        pool.set_limit(size=256 * MiB)
    try:
        while True:
            lines["failing"] = here() + 1
            keep.append(cupy.empty((48 * MiB // 4,), cupy.float32))
    except cupy.cuda.memory.OutOfMemoryError as e:
        if mode == "uncaught":
            raise
        print("OOM:", str(e))
        write(48 * MiB, pool.get_limit())
        sys.exit(0)

if mode == "driver":
    try:
        while True:
            lines["failing"] = here() + 1
            keep.append(cupy.zeros((256 * MiB // 4,), cupy.float32))
    except cupy.cuda.memory.OutOfMemoryError as e:
        print("OOM:", str(e))
        write(256 * MiB, 0)
        sys.exit(0)

print("unknown mode", mode)
sys.exit(2)
