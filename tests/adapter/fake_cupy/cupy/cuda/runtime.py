"""cupy.cuda.runtime, as far as the stand-in uses it: the CUDA runtime through ctypes (the simulated
GPU in the tests, so every allocation goes through liboomguard's hooks)."""
import threading

from cupy import _fake_cuda as _cuda

_tls = threading.local()


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        self.status = status
        super().__init__("cudaErrorMemoryAllocation: out of memory" if status == 2 else "CUDA error %d" % status)


def getDevice():
    return getattr(_tls, "device", 0)


def setDevice(device):
    _tls.device = int(device)
    _cuda.runtime().cudaSetDevice(int(device))


def getDeviceCount():
    return _cuda.device_count()


def memGetInfo():
    return _cuda.mem_get_info(getDevice())


def malloc(size):
    st, ptr = _cuda.malloc(getDevice(), size)
    if ptr is None:
        raise CUDARuntimeError(st)
    return ptr


def free(ptr):
    _cuda.cuda_free(getDevice(), ptr)
