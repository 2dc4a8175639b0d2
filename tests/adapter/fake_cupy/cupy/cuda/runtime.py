"""cupy.cuda.runtime, as far as the stand-in uses it: the CUDA runtime through ctypes (the simulated
GPU in the tests, so every allocation goes through liboomguard's hooks)."""
import ctypes
import threading

_rt = None
_lock = threading.Lock()
_tls = threading.local()


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__("cudaErrorMemoryAllocation: out of memory" if status == 2 else "CUDA error %d" % status)


def _lib():
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


def getDevice():
    return getattr(_tls, "device", 0)


def setDevice(device):
    _tls.device = int(device)
    _lib().cudaSetDevice(int(device))


def getDeviceCount():
    n = ctypes.c_int(0)
    if _lib().cudaGetDeviceCount(ctypes.byref(n)) != 0:
        _lib().cudaGetLastError()
        return 0
    return n.value


def memGetInfo():
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib().cudaSetDevice(getDevice())
    if _lib().cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        _lib().cudaGetLastError()
        return 0, 0
    return free.value, total.value


def malloc(size):
    p = ctypes.c_void_p(0)
    _lib().cudaSetDevice(getDevice())
    st = _lib().cudaMalloc(ctypes.byref(p), size)
    if st != 0:
        _lib().cudaGetLastError()
        raise CUDARuntimeError(st)
    return p.value


def free(ptr):
    _lib().cudaSetDevice(getDevice())
    _lib().cudaFree(ptr)
