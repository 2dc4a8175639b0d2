"""Jobs with the stand-in jax (tests/adapter/fake_jax) for tests/adapter/run_tests.sh.

    python3 job_jax.py MODE [OUT.json]

OUT.json gets what XLA's allocator knew at the failure (Device.memory_stats(), the request) and
the lines of this file the test looks for.  Modes:
  prealloc   default preallocation (75% of the device in one arena): 64 MiB arrays until the
             arena is nearly full, then 256 MiB: RESOURCE_EXHAUSTED from inside the arena, with
             most of the device's memory outside it still free (caught)
  uncaught   the same, not caught (exit status 1, Python's traceback)
  frag       the arena filled with 16 MiB arrays, every second one deleted, then 24 MiB: half the
             arena is free, in 16 MiB pieces (caught)
  platform   XLA_PYTHON_CLIENT_ALLOCATOR=platform (set by the caller): arrays until cuMemAlloc_v2
             fails; XLA turns that into RESOURCE_EXHAUSTED (caught)
"""
import os
import sys

import jax
import jax.numpy as jnp

from jobkit import MiB, here, mode, write as write_out

keep = []
lines = {}


def write(request):
    st = jax.devices()[0].memory_stats()
    ad = sys.modules.get("oomguard_jax")
    write_out({"expected": {"device": 0, "request": request, "stats": st,
                            "live_bytes": sum(a.nbytes for a in keep)}, "lines": lines,
               "file": os.path.abspath(__file__), "version": jax.__version__,
               "attached": ad.is_attached() if ad else None})


def fill(size):
    while True:
        st = jax.devices()[0].memory_stats()
        if st.get("largest_free_block_bytes", size) < size:
            return
        keep.append(jnp.zeros((size // 4,), jnp.float32)); lines["most"] = here()  # noqa: E702


if mode in ("prealloc", "uncaught"):
    fill(64 * MiB)
    try:
        lines["failing"] = here() + 1
        x = jnp.ones((256 * MiB // 4,), jnp.float32)
    except jax.errors.JaxRuntimeError as e:
        if mode == "uncaught":
            raise
        print("OOM:", str(e).splitlines()[0])
        write(256 * MiB)
        sys.exit(0)
    sys.exit(2)

if mode == "frag":
    fill(16 * MiB)
    del keep[::2]
    try:
        lines["failing"] = here() + 1
        x = jnp.empty((24 * MiB // 4,), jnp.float32)
    except jax.errors.JaxRuntimeError as e:
        print("OOM:", str(e).splitlines()[0])
        write(24 * MiB)
        sys.exit(0)
    sys.exit(2)

if mode == "platform":
    try:
        while True:
            lines["failing"] = here() + 1
            keep.append(jnp.zeros((128 * MiB // 4,), jnp.float32))
    except jax.errors.JaxRuntimeError as e:
        print("OOM:", str(e).splitlines()[0])
        write(128 * MiB)
        sys.exit(0)

print("unknown mode", mode)
sys.exit(2)
