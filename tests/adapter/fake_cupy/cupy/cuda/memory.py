"""cupy.cuda.memory, as far as the adapter and the test jobs use it: MemoryPool (one
SingleDeviceMemoryPool per device, like CuPy's) and OutOfMemoryError(size, total, limit=0).

What it copies from CuPy's pool, because oomguard's diagnosis depends on it:
  * sizes rounded up to 512 bytes; a free chunk of the same or larger size is reused (best fit)
    and split; freed chunks go back to the pool and merge with free neighbours;
  * set_limit(size=..., fraction=...) (or CUPY_GPU_MEMORY_LIMIT: bytes or "50%"): total_bytes()
    may not pass it; a request that would is refused by the pool itself, after freeing its free
    blocks, with OutOfMemoryError(size, total, limit) -- no failing driver call;
  * when cudaMalloc fails: free_all_blocks(), retry once, then OutOfMemoryError(size, total).
"""
import os
import threading

from cupy._fake_cuda import Chunk, best_fit, round_up
from cupy.cuda import runtime

_ROUND = 512


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        if limit == 0:
            msg = ("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes).".format(size, total))
        else:
            msg = ("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, limit set to: {:,} bytes)."
                   .format(size, total, limit))
        super().__init__(msg)


class MemoryPointer(object):
    def __init__(self, pool, chunk, device):
        self._pool, self._chunk, self.device_id = pool, chunk, device
        self.ptr = chunk.addr
        self.size = chunk.size

    def __del__(self):
        try:
            if self._chunk is not None:
                self._pool._free(self._chunk, self.device_id)
                self._chunk = None
        except Exception:
            pass


def _env_limit():
    v = os.environ.get("CUPY_GPU_MEMORY_LIMIT", "").strip()
    if not v:
        return 0
    if v.endswith("%"):
        return int(float(v[:-1]) / 100.0 * runtime.memGetInfo()[1])
    return int(v)


class _SingleDeviceMemoryPool(object):
    def __init__(self, device):
        self.device = device
        self.segments = []       # head chunks of cudaMalloc'ed regions
        self.limit = None
        self.limit_fraction = None

    def _chunks(self):
        for h in self.segments:
            for c in h.walk():
                yield c

    def total(self):
        return sum(c.size for c in self._chunks())

    def used(self):
        return sum(c.size for c in self._chunks() if c.used)

    def get_limit(self):
        return self.limit if self.limit is not None else _env_limit()

    def free_all_blocks(self):
        keep = []
        for h in self.segments:
            if not h.used and h.next is None:
                runtime.free(h.addr)
            else:
                keep.append(h)
        self.segments = keep

    def malloc(self, size):
        size = round_up(size, _ROUND)
        best = best_fit(self._chunks(), size)
        if best is None:
            limit = self.get_limit()
            if limit and self.total() + size > limit:
                self.free_all_blocks()
                if self.total() + size > limit:
                    raise OutOfMemoryError(size, self.total(), limit)
            try:
                ptr = runtime.malloc(size)
            except runtime.CUDARuntimeError:
                self.free_all_blocks()
                try:
                    ptr = runtime.malloc(size)
                except runtime.CUDARuntimeError:
                    raise OutOfMemoryError(size, self.total()) from None
            best = Chunk(ptr, size)
            self.segments.append(best)
        if best.size - size >= _ROUND:
            best.split(size)
        best.used = True
        return best

    def free(self, c):
        c.release()


class MemoryPool(object):
    """CuPy's device memory pool: per-device pools, the current device's answers."""

    def __init__(self, allocator=None):
        self._pools = {}
        # Not reentrant, and held while OutOfMemoryError is raised, as CuPy's pool holds its
        # total-bytes lock there: an adapter that asked the pool from the exception would hang.
        self._lock = threading.Lock()

    def _pool(self):
        d = runtime.getDevice()
        p = self._pools.get(d)
        if p is None:
            p = self._pools[d] = _SingleDeviceMemoryPool(d)
        return p

    def malloc(self, size):
        with self._lock:
            pool = self._pool()
            return MemoryPointer(self, pool.malloc(size), pool.device)

    def _free(self, chunk, device):
        with self._lock:
            self._pools[device].free(chunk)

    def free_all_blocks(self, stream=None):
        with self._lock:
            self._pool().free_all_blocks()

    def n_free_blocks(self):
        with self._lock:
            return sum(1 for c in self._pool()._chunks() if not c.used)

    def used_bytes(self):
        with self._lock:
            return self._pool().used()

    def free_bytes(self):
        with self._lock:
            p = self._pool()
            return p.total() - p.used()

    def total_bytes(self):
        with self._lock:
            return self._pool().total()

    def set_limit(self, size=None, fraction=None):
        if size is None and fraction is None:
            size = 0
        elif fraction is not None:
            if size is not None:
                raise ValueError("size and fraction cannot be specified at the same time")
            size = int(runtime.memGetInfo()[1] * fraction)
        with self._lock:
            p = self._pool()
            p.limit = int(size)
            p.limit_fraction = fraction

    def get_limit(self):
        with self._lock:
            return self._pool().get_limit()
