"""The stand-in's GPU memory: XLA's BFC allocator in miniature, on the CUDA runtime reached through
ctypes (the simulated GPU in the tests, so every region goes through liboomguard's hooks).

What it copies from XLA's GPU client, because oomguard's diagnosis depends on it:
  * XLA_PYTHON_CLIENT_PREALLOCATE (default true): at the first use the client takes
    XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of the device's total memory in one region,
    and every array is carved out of it; the arena never grows;
  * XLA_PYTHON_CLIENT_PREALLOCATE=false: regions are taken on demand (doubling, from 2 MiB), but
    never beyond the same fraction (bytes_limit);
  * XLA_PYTHON_CLIENT_ALLOCATOR=platform: cudaMalloc/cudaFree per array, no arena, no limit;
  * sizes rounded up to 256 bytes; best fit among free chunks, split, merged on free;
  * a request the arena cannot serve raises JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory
    while trying to allocate N bytes.") -- with no failing driver call when the limit refused it;
  * Device.memory_stats(): bytes_in_use, peak_bytes_in_use, largest_alloc_size, bytes_limit,
    bytes_reserved, peak_bytes_reserved, largest_free_block_bytes, pool_bytes, peak_pool_bytes,
    num_allocs.
"""
import ctypes
import os
import threading

from jax.errors import JaxRuntimeError

MiB = 1 << 20
ROUND = 256

_rt = None
_lock = threading.RLock()


def runtime():
    global _rt
    with _lock:
        if _rt is None:
            rt = ctypes.CDLL("libcudart.so.13")
            rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            rt.cudaFree.argtypes = [ctypes.c_void_p]
            rt.cudaSetDevice.argtypes = [ctypes.c_int]
            rt.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
            rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
            _rt = rt
        return _rt


def device_count():
    n = ctypes.c_int(0)
    if runtime().cudaGetDeviceCount(ctypes.byref(n)) != 0:
        runtime().cudaGetLastError()
        return 0
    return n.value


def mem_get_info(device):
    rt = runtime()
    rt.cudaSetDevice(device)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    if rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        rt.cudaGetLastError()
        return 0, 0
    return free.value, total.value


def _cuda_malloc(device, size):
    rt = runtime()
    rt.cudaSetDevice(device)
    p = ctypes.c_void_p(0)
    if rt.cudaMalloc(ctypes.byref(p), size) != 0:
        rt.cudaGetLastError()
        return None
    return p.value


def _env_bool(name, default):
    v = os.environ.get(name)
    if v is None:
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


def _oom(n):
    return JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate %d bytes." % n)


class Chunk(object):
    __slots__ = ("addr", "size", "used", "prev", "next")

    def __init__(self, addr, size):
        self.addr, self.size, self.used = addr, size, False
        self.prev = self.next = None


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
        addr = _cuda_malloc(self.device, size)
        if addr is None:
            return False
        head = Chunk(addr, size)
        self.regions.append((addr, size, head))
        self.pool_bytes += size
        self.peak_pool_bytes = max(self.peak_pool_bytes, self.pool_bytes)
        return True

    def _chunks(self):
        for _, _, head in self.regions:
            c = head
            while c is not None:
                yield c
                c = c.next

    def _best_fit(self, size):
        best = None
        for c in self._chunks():
            if not c.used and c.size >= size and (best is None or c.size < best.size):
                best = c
        return best

    def allocate(self, nbytes):
        with _lock:
            size = max(ROUND, (int(nbytes) + ROUND - 1) // ROUND * ROUND)
            c = self._best_fit(size)
            if c is None and not self.preallocate:
                # grow, never past bytes_limit: XLA refuses beyond it without asking the driver
                grow = max(size, self.next_region)
                grow = min(grow, self.bytes_limit - self.pool_bytes)
                if grow >= size and (self._add_region(grow) or (grow > size and self._add_region(size))):
                    self.next_region = max(self.next_region * 2, 2 * MiB)
                    c = self._best_fit(size)
            if c is None:
                raise _oom(size)
            if c.size - size >= ROUND:
                r = Chunk(c.addr + size, c.size - size)
                r.prev, r.next = c, c.next
                if c.next is not None:
                    c.next.prev = r
                c.next = r
                c.size = size
            c.used = True
            self.in_use += c.size
            self.num_allocs += 1
            self.peak_in_use = max(self.peak_in_use, self.in_use)
            self.largest_alloc = max(self.largest_alloc, c.size)
            return c

    def free(self, c):
        with _lock:
            c.used = False
            self.in_use -= c.size
            n = c.next
            if n is not None and not n.used:
                c.size += n.size
                c.next = n.next
                if n.next is not None:
                    n.next.prev = c
            p = c.prev
            if p is not None and not p.used:
                p.size += c.size
                p.next = c.next
                if c.next is not None:
                    c.next.prev = p

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
        addr = _cuda_malloc(self.device, max(1, int(nbytes)))
        if addr is None:
            raise _oom(int(nbytes))
        self.in_use += int(nbytes)
        self.num_allocs += 1
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return (addr, int(nbytes))

    def free(self, block):
        runtime().cudaSetDevice(self.device)
        runtime().cudaFree(block[0])
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
