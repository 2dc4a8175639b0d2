"""torch.cuda, as far as the adapter uses it; lazy initialisation works like PyTorch's:
_lazy_call() queues a callable until the first CUDA use (or runs it at once after it); the queued
callables run after the C side is initialised (_cuda_init_done) but before is_initialized()
turns true, and one that raises turns that first CUDA use into DeferredCudaCallError.

Contexts as in PyTorch 2.x on CUDA 12+: initialisation (torch._C._cuda_init) asks for the device
count and makes no context; a device's primary context is made by its first use -- set_device(n)
with n not the runtime's current device (c10::cuda::SetDevice calls cudaSetDevice, which makes the
context since CUDA 12), a tensor on it, mem_get_info -- so a process that only ever uses cuda:N has
no context on device 0.  current_device() and get_device_properties() make none."""
import ctypes
import threading
import traceback

from torch import _alloc
from torch._alloc import OutOfMemoryError  # noqa: F401  (torch.cuda.OutOfMemoryError)
from torch.cuda import memory  # noqa: F401
from torch.cuda.memory import memory_stats, get_allocator_backend, empty_cache  # noqa: F401

_initialized = False
_cuda_init_done = False        # torch._C._cuda_init() ran: the C++ allocator exists
_tls = threading.local()
_lock = threading.RLock()
_queued_calls = []
_allocators = {}
_observers = []
_current = threading.local()


class DeferredCudaCallError(Exception):
    pass


def is_available():
    return _alloc.device_count() > 0


def device_count():
    return _alloc.device_count()


def is_initialized():
    return _initialized


def _lazy_call(callable, **kwargs):
    with _lock:
        if _initialized:
            callable()
        else:
            _queued_calls.append((callable, traceback.format_stack()))


def _lazy_init():
    global _initialized, _cuda_init_done
    if _initialized or getattr(_tls, "is_initializing", False):
        return
    with _lock:
        if _initialized:
            return
        if _alloc.device_count() <= 0:
            raise RuntimeError("fake torch: no CUDA device")
        # torch._C._cuda_init(): the device count (above) and the allocator's state; no context: the
        # first use of a device makes its primary context (set_device, a tensor, mem_get_info)
        _cuda_init_done = True
        _tls.is_initializing = True
        try:
            for fn, tb in _queued_calls:
                try:
                    fn()
                except Exception as e:
                    raise DeferredCudaCallError("CUDA call failed lazily at initialization with error: %s\n\n"
                                                "CUDA call was originally invoked at:\n\n%s" % (e, "".join(tb))) from e
        finally:
            del _tls.is_initializing
        del _queued_calls[:]
        _initialized = True


def init():
    _lazy_init()


def current_device():
    """The thread's current device (0 until set_device): reading it makes no context, as
    cudaGetDevice makes none."""
    _lazy_init()
    return getattr(_current, "device", 0)


def _device_index(device):
    """An int, "cuda", "cuda:N" or an object with .index (torch.device), as PyTorch's
    _get_device_index takes them; "cuda" alone is the current device."""
    if isinstance(device, str):
        return int(device.split(":")[1]) if ":" in device else current_device()
    if hasattr(device, "index"):
        return current_device() if device.index is None else int(device.index)
    return int(device)


def set_device(device):
    """As torch.cuda.set_device -> c10::cuda::SetDevice: CUDA initialised lazily, then cudaSetDevice
    only when the runtime's current device (cudaGetDevice, which makes no context) is another one,
    so set_device(0) in a fresh process makes no context and set_device(n) makes device n's only.
    A negative index does nothing, as in PyTorch."""
    d = _device_index(device)
    if d < 0:
        return
    _lazy_init()
    _current.device = d
    rt = _alloc.runtime()
    cur = ctypes.c_int(-1)
    if rt.cudaGetDevice(ctypes.byref(cur)) != 0:
        rt.cudaGetLastError()
        cur.value = -1
    if cur.value != d:
        rt.cudaSetDevice(d)


def _allocator(device):
    with _lock:
        a = _allocators.get(device)
        if a is None:
            cls = _alloc.AsyncDeviceAllocator if _alloc.backend_name() == "cudaMallocAsync" else _alloc.DeviceAllocator
            a = _allocators[device] = cls(device, _observers)
        return a


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def max_memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None):
    a = _allocator(memory._device_index(device))
    if hasattr(a, "reset_peak_memory_stats"):
        a.reset_peak_memory_stats()


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def mem_get_info(device=None):
    """(free, total) bytes of the device, as cudaMemGetInfo says."""
    d = current_device() if device is None else int(device)
    return _alloc.mem_get_info(d)


class _DeviceProperties(object):
    def __init__(self, name, total_memory):
        self.name = name
        self.total_memory = total_memory


def get_device_properties(device=None):
    """As PyTorch's (cudaGetDeviceProperties): no context is made on the device."""
    _lazy_init()
    d = current_device() if device is None else _device_index(device)
    return _DeviceProperties("fake", _alloc.total_memory(d))


def set_per_process_memory_fraction(fraction, device=None):
    """As PyTorch's: the caching allocator may reserve at most fraction x the device's total;
    beyond that it fails requests itself, without asking the driver."""
    _lazy_init()
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError("Invalid fraction value: %s. Allowed range: 0~1" % fraction)
    d = current_device() if device is None else int(device)
    a = _allocator(d)
    if hasattr(a, "fraction"):
        a.fraction = fraction
