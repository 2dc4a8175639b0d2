"""The stand-in's device memory: a small caching allocator in the manner of PyTorch's
CUDACachingAllocator, on top of the CUDA runtime reached through ctypes (on the simulated GPU in
the tests, so every segment really goes through liboomguard's hooks).

What it copies from PyTorch, because oomguard's diagnosis depends on it:
  * sizes are rounded up to 512 bytes;
  * requests up to 1 MiB come from the small pool, packed into 2 MiB segments; requests between
    1 and 10 MiB get a 20 MiB segment; larger ones a segment rounded up to 2 MiB;
  * a free block is split when the rest is >= 512 bytes (small pool) or > 1 MiB (large pool),
    and merged with free neighbours when freed;
  * best fit among the cached blocks of the same pool;
  * when cudaMalloc fails: count a retry, give every entirely free segment back, try once more;
    if that fails too: count an OOM, call the out-of-memory observers (device, segment size,
    device total, device free), then raise torch.OutOfMemoryError.

Environment knobs for the tests:
  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync  no caching here; cudaMallocAsync per tensor
  FAKE_TORCH_BROKEN=stats|snapshot|attach|all       that API raises RuntimeError
"""
import _thread
import collections
import ctypes
import itertools
import os
import sys

from torch._fake_cuda import Chunk, best_fit, cuda_free, cuda_malloc, device_count, mem_get_info, round_up, runtime, total_memory

KiB = 1024
MiB = 1024 * KiB
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB
# the failing allocator's allocated bytes at its latest out-of-memory, read before its observers run (tests' truth)
allocated_at_oom = None

cudaSuccess = 0
cudaMemPoolAttrReservedMemCurrent = 0x5
cudaMemPoolAttrUsedMemCurrent = 0x7



def _on_engine_thread():
    eng = sys.modules.get("torch.autograd._engine")
    return eng is not None and eng.on_engine_thread()


def _call_from_cxx(device, fn, args):
    """fn(*args) as PyTorch's C++ calls a Python callback on its autograd engine threads, which run
    no Python: fn's frame is the only one of its thread (sys._getframe(1) raises ValueError
    there).  A raw thread runs it through C-level iterators alone (cudaSetDevice, as an engine
    thread has its device current; fn; the release of the lock this thread waits on); a
    callback that raises or hangs leaves this thread after 30 s."""
    done = _thread.allocate_lock()
    done.acquire()
    calls = itertools.chain(itertools.starmap(runtime().cudaSetDevice, [(device,)]), itertools.starmap(fn, [args]),
                            itertools.starmap(done.release, [()]))
    _thread.start_new_thread(collections.deque, (calls, 0))
    done.acquire(timeout=30)

def broken(what):
    b = os.environ.get("FAKE_TORCH_BROKEN", "")
    return b == "all" or what in b.split(",")


def alloc_conf():
    return os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""


def backend_name():
    for part in alloc_conf().split(","):
        k, _, v = part.partition(":")
        if k.strip() == "backend":
            return v.strip()
    return "native"


class OutOfMemoryError(RuntimeError):
    pass


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


def _fmt(n):
    return "%.2f MiB" % (n / float(MiB))


def _python_frames():
    """The allocation's Python traceback, innermost first, as PyTorch's snapshot gives it
    ({"filename", "line", "name"}), recorded per allocation while the history is on."""
    out = []
    f = sys._getframe(2)
    while f is not None:
        out.append({"filename": f.f_code.co_filename, "line": f.f_lineno, "name": f.f_code.co_name})
        f = f.f_back
    return out


class Block(Chunk):
    """A block of a segment (Chunk: address order, used or free); `requested` and the allocation's
    Python frames while used."""
    __slots__ = ("requested", "segment", "frames")

    def __init__(self, addr, size, segment=None):
        Chunk.__init__(self, addr, size)
        self.segment = segment
        self.requested = 0
        self.frames = []

    def _new(self, addr, size):
        return Block(addr, size, self.segment)


class Segment(object):
    def __init__(self, device, addr, size, small, pool_id):
        self.device, self.addr, self.size, self.small, self.pool_id = device, addr, size, small, pool_id
        self.head = Block(addr, size, self)

    def blocks(self):
        return self.head.walk()


def round_size(n):
    return round_up(n, MIN_BLOCK)


def allocation_size(size):
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class DeviceAllocator(object):
    """One device's cache (PyTorch keeps one per device as well)."""

    def __init__(self, device, observers):
        self.device = device
        self.observers = observers
        self.segments = []
        self.num_alloc_retries = 0
        self.num_ooms = 0
        self.allocated_total = 0         # allocated_bytes.all.allocated / .freed: cumulative block bytes
        self.freed_total = 0
        self.allocated_now = 0           # allocated_bytes.all.current, kept as blocks come and go ...
        self.allocated_peak = 0          # ... and its high-water mark (.peak; reset_peak_memory_stats)
        self.reserved_peak = 0           # reserved_bytes.all.peak
        self.fraction = None             # set_per_process_memory_fraction
        self.history = None              # _record_memory_history: max trace entries, or None
        self.trace = []

    def _reserved(self):
        return sum(s.size for s in self.segments)

    def _allowed(self, total):
        return int(self.fraction * total) if self.fraction is not None else None

    def _fits_fraction(self, seg_size):
        """PyTorch refuses, without calling cudaMalloc, a segment that would take the reserved
        bytes past fraction x total (set_per_process_memory_fraction)."""
        if self.fraction is None:
            return True
        return self._reserved() + seg_size <= self._allowed(mem_get_info(self.device)[1])

    # -- driver side
    def _cuda_malloc(self, size):
        return cuda_malloc(self.device, size)

    def _release_free_segments(self):
        """What PyTorch's release_cached_blocks does (empty_cache, and the retry after a failed cudaMalloc): the
        default pool's unsplit free segments go back to the driver.  A private pool (a CUDA graph's) stays while
        its graph lives, free segments and all; the stand-in has no graph to destroy, so its pools live on."""
        keep = []
        for s in self.segments:
            if not s.head.used and s.head.next is None and s.pool_id == (0, 0):
                cuda_free(self.device, s.addr)
            else:
                keep.append(s)
        self.segments = keep

    # -- the cache
    def _best_fit(self, size, small, pool_id):
        return best_fit((b for s in self.segments if s.small == small and s.pool_id == pool_id for b in s.blocks()),
                        size)

    def malloc(self, nbytes, pool_id=(0, 0)):
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small, pool_id)
        if block is None:
            seg_size = allocation_size(size)
            addr = self._cuda_malloc(seg_size) if self._fits_fraction(seg_size) else None
            if addr is None:
                self.num_alloc_retries += 1
                self._release_free_segments()
                addr = self._cuda_malloc(seg_size) if self._fits_fraction(seg_size) else None
            if addr is None:
                self.num_ooms += 1
                # the books at the failure, before any observer runs (an observer's own Python work may let the
                # cyclic collector free a tensor before the error is raised): what a test's truth compares with
                global allocated_at_oom
                allocated_at_oom = self.allocated_now
                free, total = mem_get_info(self.device)
                allowed = self._allowed(total)
                for obs in list(self.observers):
                    # PyTorch hands the observer the allowed maximum when a fraction is set
                    args = (self.device, seg_size, allowed if allowed is not None else total, free)
                    if _on_engine_thread():
                        _call_from_cxx(self.device, obs, args)
                    else:
                        obs(*args)
                st = self.stats()
                raise OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s is "
                    "free. %sOf the allocated memory %s is allocated by PyTorch, and %s is reserved by PyTorch but "
                    "unallocated." % (_fmt(size), self.device, _fmt(total), _fmt(free),
                                      "%s allowed; " % _fmt(allowed) if allowed is not None else "",
                                      _fmt(st["allocated"]), _fmt(st["reserved"] - st["allocated"])))
            seg = Segment(self.device, addr, seg_size, small, pool_id)
            self.segments.append(seg)
            self.reserved_peak = max(self.reserved_peak, self._reserved())  # only a new segment raises it
            block = seg.head
        rest = block.size - size
        if (small and rest >= MIN_BLOCK) or (not small and rest > SMALL_SIZE):
            block.split(size)
        block.used = True
        block.requested = nbytes
        self.allocated_total += block.size
        self.allocated_now += block.size
        self.allocated_peak = max(self.allocated_peak, self.allocated_now)
        if self.history is not None:
            block.frames = _python_frames()
            self.trace.append({"action": "alloc", "addr": block.addr, "size": block.size, "frames": block.frames})
            if len(self.trace) > self.history:
                del self.trace[:len(self.trace) - self.history]
        return block

    def free(self, block):
        self.freed_total += block.size       # a tensor back to the cache (not the driver): freed
        self.allocated_now -= block.size
        block.requested = 0
        block.frames = []
        if self.history is not None:
            self.trace.append({"action": "free_completed", "addr": block.addr, "size": block.size, "frames": []})
            if len(self.trace) > self.history:
                del self.trace[:len(self.trace) - self.history]
        block.release()

    def empty_cache(self):
        self._release_free_segments()

    def reset_peak_memory_stats(self):
        self.allocated_peak = self.stats()["allocated"]
        self.reserved_peak = self._reserved()

    # -- what PyTorch reports
    def stats(self, small=None):
        """Totals; largest_free is the largest free block of the default pool (of its small or
        large part when `small` says which: where a request of that kind is served)."""
        allocated = reserved = inactive_split = requested = largest = private = 0
        nseg = 0
        for s in self.segments:
            nseg += 1
            reserved += s.size
            if s.pool_id != (0, 0):
                private += s.size
            split = s.head.next is not None
            for b in s.blocks():
                if b.used:
                    allocated += b.size
                    requested += b.requested
                else:
                    if split:
                        inactive_split += b.size
                    if s.pool_id == (0, 0) and (small is None or s.small == small) and b.size > largest:
                        largest = b.size
        return {"allocated": allocated, "reserved": reserved, "inactive_split": inactive_split,
                "requested": requested, "largest_free": largest, "private": private, "segments": nseg}

    def memory_stats(self):
        st = self.stats()
        d = {}
        for pool in ("all", "large_pool", "small_pool"):
            # per-pool breakdowns are not needed by the adapter; "all" is exact
            if pool != "all":
                continue
            d["allocated_bytes.%s.current" % pool] = st["allocated"]
            d["reserved_bytes.%s.current" % pool] = st["reserved"]
            d["active_bytes.%s.current" % pool] = st["allocated"]
            d["inactive_split_bytes.%s.current" % pool] = st["inactive_split"]
            d["requested_bytes.%s.current" % pool] = st["requested"]
            d["segment.%s.current" % pool] = st["segments"]
        d["allocated_bytes.all.allocated"] = self.allocated_total
        d["allocated_bytes.all.freed"] = self.freed_total
        d["allocated_bytes.all.peak"] = self.allocated_peak
        d["reserved_bytes.all.peak"] = self.reserved_peak
        d["num_alloc_retries"] = self.num_alloc_retries
        d["num_ooms"] = self.num_ooms
        return d

    def snapshot_segments(self):
        out = []
        for s in self.segments:
            blocks = []
            alloc = 0
            req = 0
            for b in s.blocks():
                blocks.append({"address": b.addr, "size": b.size, "requested_size": b.requested,
                               "state": "active_allocated" if b.used else "inactive",
                               "frames": list(b.frames) if b.used else []})
                if b.used:
                    alloc += b.size
                    req += b.requested
            out.append({"device": s.device, "address": s.addr, "total_size": s.size, "allocated_size": alloc,
                        "active_size": alloc, "requested_size": req, "stream": 0,
                        "segment_type": "small" if s.small else "large", "segment_pool_id": s.pool_id,
                        "is_expandable": False, "frames": [], "blocks": blocks})
        return out


class AsyncDeviceAllocator(object):
    """backend:cudaMallocAsync: every tensor is one cudaMallocAsync from the device's default pool;
    the caching is the driver pool's.  Reports like PyTorch's CudaMallocAsyncAllocator: only
    allocated and reserved bytes (from the pool's attributes) and the OOM count."""

    def __init__(self, device, observers):
        self.device = device
        self.live = 0
        self.num_ooms = 0

    def _pool(self):
        rt = runtime()
        pool = ctypes.c_void_p(0)
        if rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), self.device) != cudaSuccess:
            rt.cudaGetLastError()
            return None
        return pool

    def malloc(self, nbytes, pool_id=(0, 0)):
        rt = runtime()
        rt.cudaSetDevice(self.device)
        p = ctypes.c_void_p(0)
        if rt.cudaMallocAsync(ctypes.byref(p), nbytes, None) != cudaSuccess:
            rt.cudaGetLastError()
            pool = self._pool()
            if pool is not None:
                rt.cudaMemPoolTrimTo(pool, 0)
            if rt.cudaMallocAsync(ctypes.byref(p), nbytes, None) != cudaSuccess:
                rt.cudaGetLastError()
                self.num_ooms += 1
                free, total = mem_get_info(self.device)
                raise OutOfMemoryError("CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s "
                                       "of which %s is free." % (_fmt(nbytes), self.device, _fmt(total), _fmt(free)))
        self.live += nbytes
        return (p.value, nbytes)

    def free(self, block):
        addr, n = block
        runtime().cudaSetDevice(self.device)
        runtime().cudaFreeAsync(addr, None)
        self.live -= n

    def empty_cache(self):
        pool = self._pool()
        if pool is not None:
            runtime().cudaMemPoolTrimTo(pool, 0)

    def _attr(self, attr):
        pool = self._pool()
        v = ctypes.c_uint64(0)
        if pool is None or runtime().cudaMemPoolGetAttribute(pool, attr, ctypes.byref(v)) != cudaSuccess:
            runtime().cudaGetLastError()
            return 0
        return v.value

    def memory_stats(self):
        return {"allocated_bytes.all.current": self._attr(cudaMemPoolAttrUsedMemCurrent),
                "reserved_bytes.all.current": self._attr(cudaMemPoolAttrReservedMemCurrent),
                "num_ooms": self.num_ooms}

    def stats(self, small=None):
        return {"allocated": self._attr(cudaMemPoolAttrUsedMemCurrent),
                "reserved": self._attr(cudaMemPoolAttrReservedMemCurrent)}
