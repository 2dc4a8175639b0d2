"""The stand-in's GPU memory: XLA's BFC allocator in miniature, on the CUDA driver API reached through
ctypes as XLA's StreamExecutor calls it (cuMemAlloc_v2 in the primary context: jax/__init__.py's
use_driver_api(); the simulated GPU in the tests, so every region goes through liboomguard's hooks).

What it copies from XLA's GPU client, because oomguard's diagnosis depends on it:
  * XLA_PYTHON_CLIENT_PREALLOCATE (default true): at the first use the client takes
    XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of the device's total memory in one region,
    and every array is carved out of it; the arena never grows;
  * XLA_PYTHON_CLIENT_PREALLOCATE=false: regions are taken on demand (doubling, from 2 MiB), but
    never beyond the same fraction (bytes_limit);
  * XLA_PYTHON_CLIENT_ALLOCATOR=platform: cuMemAlloc_v2/cuMemFree_v2 per array, no arena, no limit;
  * sizes rounded up to 256 bytes; best fit among free chunks, split, merged on free;
  * a request the arena cannot serve raises JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory
    while trying to allocate N bytes.") -- with no failing driver call when the limit refused it;
  * Device.memory_stats(): bytes_in_use, peak_bytes_in_use, largest_alloc_size, bytes_limit,
    bytes_reserved, peak_bytes_reserved, largest_free_block_bytes, pool_bytes, peak_pool_bytes,
    num_allocs.
"""
import os
import threading

from jax._fake_cuda import Chunk, best_fit, cuda_free, cuda_malloc, device_count, mem_get_info, round_up  # noqa: F401
from jax.errors import JaxRuntimeError

MiB = 1 << 20
ROUND = 256

_lock = threading.RLock()


def _env_bool(name, default):
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


def _human(n):
    """XLA's human-readable size (tsl's HumanReadableNumBytes): 512B, 1.50KiB, 256.00MiB, 2.25GiB."""
    if n < 1024:
        return "%dB" % n
    v, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        v /= 1024.0
        if v < 1024.0:
            break
    return "%.2f%s" % (v, unit)


def _oom(n, device=0):
    """Older jaxlibs say the request in bytes; jax 0.5 and later (0.11 was read on an H200) say it in XLA's units,
    name the allocator and the program: "Out of memory while trying to allocate 256.00MiB with allocator GPU_0_bfc
    on device 0. [executable_name='jit_broadcast_in_dim'] ..."."""
    from jax import __version__ as version
    try:
        newer = tuple(int(x) for x in version.split("+")[0].split(".")[:2]) >= (0, 5)
    except ValueError:
        newer = False
    if newer:
        return JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate %s with allocator GPU_%d_bfc "
                               "on device %d. [executable_name='jit_broadcast_in_dim'] "
                               "[tf-allocator-allocation-error='']" % (_human(n), device, device))
    return JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate %d bytes." % n)


class BFCAllocator(object):
    def __init__(self, device):
        self.device = device
        total = mem_get_info(device)[1]
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
        self.bytes_limit = int(total * fraction) // ROUND * ROUND
        self.preallocate = _env_bool("XLA_PYTHON_CLIENT_PREALLOCATE", True)
        self.regions = []                 # (addr, size, head chunk)
        self.pool_bytes = self.peak_pool_bytes = 0
        self.in_use = self.peak_in_use = self.largest_alloc = self.num_allocs = 0
        self.next_region = 2 * MiB
        if self.preallocate:
            if not self._add_region(self.bytes_limit):
                raise JaxRuntimeError("INTERNAL: failed to preallocate %d bytes of GPU memory" % self.bytes_limit)

    def _add_region(self, size):
        addr = cuda_malloc(self.device, size)
        if addr is None:
            return False
        head = Chunk(addr, size)
        self.regions.append((addr, size, head))
        self.pool_bytes += size
        self.peak_pool_bytes = max(self.peak_pool_bytes, self.pool_bytes)
        return True

    def _chunks(self):
        for _, _, head in self.regions:
            for c in head.walk():
                yield c

    def _best_fit(self, size):
        return best_fit(self._chunks(), size)

    def allocate(self, nbytes):
        with _lock:
            size = round_up(nbytes, ROUND)
            c = self._best_fit(size)
            if c is None and not self.preallocate:
                # grow, never past bytes_limit: XLA refuses beyond it without asking the driver
                grow = max(size, self.next_region)
                grow = min(grow, self.bytes_limit - self.pool_bytes)
                if grow >= size and (self._add_region(grow) or (grow > size and self._add_region(size))):
                    self.next_region = max(self.next_region * 2, 2 * MiB)
                    c = self._best_fit(size)
            if c is None:
                raise _oom(size, self.device)
            if c.size - size >= ROUND:
                c.split(size)
            c.used = True
            self.in_use += c.size
            self.num_allocs += 1
            self.peak_in_use = max(self.peak_in_use, self.in_use)
            self.largest_alloc = max(self.largest_alloc, c.size)
            return c

    def free(self, c):
        with _lock:
            self.in_use -= c.size
            c.release()

    def stats(self):
        with _lock:
            largest = max([c.size for c in self._chunks() if not c.used] or [0])
            return {"num_allocs": self.num_allocs, "bytes_in_use": self.in_use,
                    "peak_bytes_in_use": self.peak_in_use, "largest_alloc_size": self.largest_alloc,
                    "bytes_limit": self.bytes_limit, "bytes_reserved": 0, "peak_bytes_reserved": 0,
                    "bytes_reservable_limit": self.bytes_limit, "largest_free_block_bytes": largest,
                    "pool_bytes": self.pool_bytes, "peak_pool_bytes": self.peak_pool_bytes}


class PlatformAllocator(object):
    """XLA_PYTHON_CLIENT_ALLOCATOR=platform: the driver's memory, no arena, no limit."""

    def __init__(self, device):
        self.device = device
        self.in_use = self.peak_in_use = self.num_allocs = 0

    def allocate(self, nbytes):
        addr = cuda_malloc(self.device, max(1, int(nbytes)))
        if addr is None:
            raise _oom(int(nbytes), self.device)
        self.in_use += int(nbytes)
        self.num_allocs += 1
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return (addr, int(nbytes))

    def free(self, block):
        cuda_free(self.device, block[0])
        self.in_use -= block[1]

    def stats(self):
        return {"num_allocs": self.num_allocs, "bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak_in_use}


_allocators = {}


def allocator(device):
    with _lock:
        a = _allocators.get(device)
        if a is None:
            kind = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").strip().lower()
            a = _allocators[device] = (PlatformAllocator if kind == "platform" else BFCAllocator)(device)
        return a
