"""cupy.cuda, as far as the adapter and the test jobs use it."""
from cupy.cuda import runtime  # noqa: F401
from cupy.cuda import memory  # noqa: F401
from cupy.cuda.memory import MemoryPool, OutOfMemoryError  # noqa: F401


class Device(object):
    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else int(device)

    def use(self):
        runtime.setDevice(self.id)

    def __enter__(self):
        self._prev = runtime.getDevice()
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):
        runtime.setDevice(self._prev)
        return False

    @property
    def mem_info(self):
        return runtime.memGetInfo()
