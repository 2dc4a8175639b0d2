"""What the stand-in frameworks (fake_torch, fake_jax, fake_cupy, fake_tf) share: the CUDA runtime
reached through ctypes -- the simulated GPU in the tests, so every region goes through
liboomguard's hooks -- and the chunk list their allocators carve regions into (best fit, split,
merged with free neighbours when released), as the real allocators do.

PyTorch's and CuPy's allocators call the runtime (cudaMalloc); real XLA (jaxlib) and TensorFlow
call the driver API through StreamExecutor (cuMemAlloc_v2 in the device's primary context):
the stand-in JAX and TensorFlow say so with use_driver_api(), and malloc(), cuda_free() and
mem_get_info() then go to the driver as theirs do.

Test code only.  Each stand-in package appends this directory to its own __path__ and imports
this file as <package>._fake_cuda: it is found wherever the stand-in is on sys.path, and nothing
else can import it (it is on no sys.path entry, and the real frameworks know nothing of it)."""
import ctypes
import threading

_rt = None
_lock = threading.Lock()
_P = ctypes.POINTER
_ARGTYPES = (
    ("cudaMalloc", [_P(ctypes.c_void_p), ctypes.c_size_t]),
    ("cudaFree", [ctypes.c_void_p]),
    ("cudaSetDevice", [ctypes.c_int]),
    ("cudaGetDevice", [_P(ctypes.c_int)]),
    ("cudaGetDeviceCount", [_P(ctypes.c_int)]),
    ("cudaMemGetInfo", [_P(ctypes.c_size_t), _P(ctypes.c_size_t)]),
    ("cudaMallocAsync", [_P(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]),
    ("cudaFreeAsync", [ctypes.c_void_p, ctypes.c_void_p]),
    ("cudaDeviceGetDefaultMemPool", [_P(ctypes.c_void_p), ctypes.c_int]),
    ("cudaMemPoolGetAttribute", [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
    ("cudaMemPoolTrimTo", [ctypes.c_void_p, ctypes.c_size_t]),
    ("cudaGetDeviceProperties", [ctypes.c_void_p, ctypes.c_int]),
)
# the driver API, for the stand-ins whose real counterparts allocate with it (use_driver_api())
_DRIVER_ARGTYPES = (
    ("cuInit", [ctypes.c_uint]),
    ("cuDeviceGet", [_P(ctypes.c_int), ctypes.c_int]),
    ("cuDevicePrimaryCtxRetain", [_P(ctypes.c_void_p), ctypes.c_int]),
    ("cuCtxSetCurrent", [ctypes.c_void_p]),
    ("cuMemAlloc_v2", [_P(ctypes.c_uint64), ctypes.c_size_t]),
    ("cuMemFree_v2", [ctypes.c_uint64]),
    ("cuMemGetInfo_v2", [_P(ctypes.c_size_t), _P(ctypes.c_size_t)]),
)
# struct cudaDeviceProp of CUDA 12/13 (cuda_runtime_api.h): 1008 bytes, totalGlobalMem (size_t) at 288
_PROP_SIZE, _PROP_TOTAL = 1008, 288


_via = None
_prefix = "c10_"
_drv = None
_driver_api = False
_contexts = {}      # device -> its primary context (retained once, as XLA's and TensorFlow's clients do)


def use_driver_api():
    """This package allocates as real XLA (jaxlib) and TensorFlow do, through StreamExecutor: cuMemAlloc_v2,
    cuMemFree_v2 and cuMemGetInfo_v2 in the device's primary context, made current on the calling thread
    (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent), never cudaMalloc.  Through
    route_through()'s library when one is set (its driver forwarders, tests/adapter/lib/c10_cuda.c)."""
    global _driver_api
    _driver_api = True


def route_through(path, prefix="c10_"):
    """Makes this package's runtime calls go through the library at `path` (before the first of them),
    whose <prefix><name> forwarders (tests/adapter/lib/c10_cuda.c) call the runtime: the stand-in torch's
    libc10_cuda.so (c10_), as PyTorch's caching allocator calls it from libc10_cuda.so; the stand-in
    JAX's jaxlib/xla_extension.so (xla_), CuPy's cupy/cuda/memory.so (cupy_), TensorFlow's
    libtensorflow_framework.so.2 (tf_).  The ledger then names that library as the caller of every
    block, as in production, not libffi."""
    global _via, _prefix
    _via, _prefix = path, prefix


class _Routed(object):
    """The runtime's functions as the forwarders of a library reach them (<prefix><name>); a function
    it does not forward is the runtime's own."""

    def __init__(self, lib, rt, prefix):
        self._lib, self._rt, self._prefix = lib, rt, prefix

    def __getattr__(self, name):
        fn = getattr(self._lib, self._prefix + name, None)
        if fn is None:
            fn = getattr(self._rt, name)
        else:
            fn.argtypes = getattr(self._rt, name).argtypes
        setattr(self, name, fn)
        return fn


def runtime():
    """libcudart.so.13 through ctypes, loaded once (through route_through()'s library when one is set)."""
    global _rt
    with _lock:
        if _rt is None:
            rt = ctypes.CDLL("libcudart.so.13")
            for name, argtypes in _ARGTYPES:
                getattr(rt, name).argtypes = argtypes
            _rt = _Routed(ctypes.CDLL(_via), rt, _prefix) if _via else rt
        return _rt


def driver():
    """libcuda.so.1 through ctypes, loaded once (through route_through()'s library when one is set)."""
    global _drv
    with _lock:
        if _drv is None:
            d = ctypes.CDLL("libcuda.so.1")
            for name, argtypes in _DRIVER_ARGTYPES:
                getattr(d, name).argtypes = argtypes
            _drv = _Routed(ctypes.CDLL(_via), d, _prefix) if _via else d
        return _drv


def _bind(device):
    """The device's primary context made current on this thread; False when the driver refuses."""
    drv = driver()
    with _lock:
        ctx = _contexts.get(device)
        if ctx is None:
            dev, c = ctypes.c_int(0), ctypes.c_void_p(0)
            if drv.cuInit(0) != 0 or drv.cuDeviceGet(ctypes.byref(dev), device) != 0 or \
                    drv.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev.value) != 0:
                return False
            ctx = _contexts[device] = c.value
    return drv.cuCtxSetCurrent(ctx) == 0


def device_count():
    n = ctypes.c_int(0)
    if runtime().cudaGetDeviceCount(ctypes.byref(n)) != 0:
        runtime().cudaGetLastError()
        return 0
    return n.value


def mem_get_info(device):
    """(free, total) bytes of `device`, (0, 0) when the runtime (the driver: use_driver_api()) cannot say."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    if _driver_api:
        if not _bind(device) or driver().cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) != 0:
            return 0, 0
        return free.value, total.value
    rt = runtime()
    rt.cudaSetDevice(device)
    if rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        rt.cudaGetLastError()
        return 0, 0
    return free.value, total.value


def total_memory(device):
    """The device's total bytes as cudaGetDeviceProperties says (0 when it cannot): a query, no
    context is made (mem_get_info makes the device's)."""
    buf = ctypes.create_string_buffer(_PROP_SIZE + 64)
    if runtime().cudaGetDeviceProperties(buf, device) != 0:
        runtime().cudaGetLastError()
        return 0
    return ctypes.c_size_t.from_buffer(buf, _PROP_TOTAL).value


def malloc(device, size):
    """(status, address) of cudaMalloc on `device` (cuMemAlloc_v2 in its primary context: use_driver_api());
    address None on a failure, whose error is cleared as the real allocators do before they retry or raise."""
    if _driver_api:
        if not _bind(device):
            return 201, None                 # CUDA_ERROR_INVALID_CONTEXT
        p = ctypes.c_uint64(0)
        st = driver().cuMemAlloc_v2(ctypes.byref(p), size)
        return (st, None) if st != 0 else (0, p.value)
    rt = runtime()
    rt.cudaSetDevice(device)
    p = ctypes.c_void_p(0)
    st = rt.cudaMalloc(ctypes.byref(p), size)
    if st != 0:
        rt.cudaGetLastError()
        return st, None
    return 0, p.value


def cuda_malloc(device, size):
    """The address, or None when cudaMalloc (cuMemAlloc_v2: use_driver_api()) failed."""
    return malloc(device, size)[1]


def cuda_free(device, addr):
    if _driver_api:
        if _bind(device):
            driver().cuMemFree_v2(addr)
        return
    runtime().cudaSetDevice(device)
    runtime().cudaFree(addr)


def round_up(n, unit):
    """n rounded up to a multiple of unit, at least unit."""
    return max(unit, (int(n) + unit - 1) // unit * unit)


class Chunk(object):
    """A piece of a region, in the region's address order (prev/next); used or free."""
    __slots__ = ("addr", "size", "used", "prev", "next")

    def __init__(self, addr, size):
        self.addr, self.size, self.used = addr, size, False
        self.prev = self.next = None

    def walk(self):
        """This chunk and the ones after it (from a region's head: the whole region)."""
        c = self
        while c is not None:
            yield c
            c = c.next

    def _new(self, addr, size):
        return type(self)(addr, size)

    def split(self, size):
        """Keeps the first `size` bytes; the rest becomes a free chunk right after this one."""
        r = self._new(self.addr + size, self.size - size)
        r.prev, r.next = self, self.next
        if self.next is not None:
            self.next.prev = r
        self.next = r
        self.size = size

    def _absorb_next(self):
        n = self.next
        self.size += n.size
        self.next = n.next
        if n.next is not None:
            n.next.prev = self

    def release(self):
        """Marks the chunk free and merges it with free neighbours."""
        self.used = False
        if self.next is not None and not self.next.used:
            self._absorb_next()
        if self.prev is not None and not self.prev.used:
            self.prev._absorb_next()


def best_fit(chunks, size):
    """The smallest free chunk of at least `size` bytes among `chunks`, or None."""
    best = None
    for c in chunks:
        if not c.used and c.size >= size and (best is None or c.size < best.size):
            best = c
    return best
