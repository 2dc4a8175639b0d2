"""torch.cuda, as far as the adapter uses it; lazy initialisation works like PyTorch's:
_lazy_call() queues a callable until the first CUDA use (or runs it at once after it); the queued
callables run after the C side is initialised (_cuda_init_done) but before is_initialized()
turns true, and one that raises turns that first CUDA use into DeferredCudaCallError."""
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
        _alloc.runtime().cudaFree(None)          # creates the context, like torch._C._cuda_init()
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
    _lazy_init()
    return getattr(_current, "device", 0)


def set_device(device):
    _lazy_init()
    _current.device = int(device)
    _alloc.runtime().cudaSetDevice(int(device))


def _allocator(device):
    with _lock:
        a = _allocators.get(device)
        if a is None:
            cls = _alloc.AsyncDeviceAllocator if _alloc.backend_name() == "cudaMallocAsync" else _alloc.DeviceAllocator
            a = _allocators[device] = cls(device, _observers)
        return a


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


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
    d = current_device() if device is None else int(device)
    return _DeviceProperties("fake", _alloc.mem_get_info(d)[1])


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
