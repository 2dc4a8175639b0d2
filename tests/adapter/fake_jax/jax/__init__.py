"""A stand-in for JAX, for oomguard's adapter tests (there is no jax on the test machine).

It has what adapters/python/oomguard_jax.py touches and a test job needs, under JAX's own names
and signatures: jax.__version__, jax.devices(), jax.local_devices(), jax.device_put(),
Device.{id, platform, device_kind, local_hardware_id, memory_stats()}, jax.numpy.{zeros, ones,
empty} returning arrays with .nbytes/.delete()/.block_until_ready(), jax.errors.JaxRuntimeError
and jax._src.xla_bridge.backends_are_initialized() (the backends are made at the first use).
Device memory comes from a BFC allocator in miniature (jax/_src/bfc.py) that allocates for real
through the CUDA runtime, honouring XLA_PYTHON_CLIENT_PREALLOCATE / _MEM_FRACTION / _ALLOCATOR.
"""
import os as _os

# the stand-ins' shared CUDA runtime and chunk list (tests/adapter/fake_common) load as jax._fake_cuda
__path__.append(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _os.pardir, _os.pardir, "fake_common"))

# JAX's XLA client allocates from jaxlib/xla_extension.so, with the driver API (StreamExecutor: cuMemAlloc_v2
# in the primary context), as the stand-in does: with FAKE_JAX_XLA_EXTENSION (the test runners name the one
# tests/adapter/adapter.mk builds) the stand-in's calls come from a library of that name too, so the ledger
# attributes its memory as in production; without it, from ctypes (libffi)
from jax import _fake_cuda as _fc  # noqa: E402

_fc.use_driver_api()

if _os.environ.get("FAKE_JAX_XLA_EXTENSION"):
    _fc.route_through(_os.environ["FAKE_JAX_XLA_EXTENSION"], "xla_")

__version__ = _os.environ.get("FAKE_JAX_VERSION", "0.4.35+fake")

from jax import errors  # noqa: E402
from jax._src import bfc as _bfc  # noqa: E402
from jax._src import xla_bridge as _xla_bridge  # noqa: E402


class Device(object):
    platform = "gpu"
    device_kind = "Fake GPU"

    def __init__(self, ordinal):
        self.id = ordinal
        self.local_hardware_id = ordinal
        self.process_index = 0

    def memory_stats(self):
        return dict(_bfc.allocator(self.local_hardware_id).stats())

    def __repr__(self):
        return "CudaDevice(id=%d)" % self.id


_devices = None


def devices(backend=None):
    global _devices
    _xla_bridge.backends()
    if _devices is None:
        _devices = [Device(i) for i in range(_bfc.device_count())]
    return list(_devices)


def local_devices(process_index=None, backend=None):
    return devices(backend)


import weakref as _weakref  # noqa: E402

_live = _weakref.WeakSet()


def live_arrays(platform=None):
    """jax.live_arrays(): the arrays not deleted yet."""
    return [a for a in list(_live) if not a.is_deleted()]


class Array(object):
    """A device buffer of nbytes; its memory goes back to the allocator when it is deleted."""

    def __init__(self, shape, dtype, device):
        from jax import numpy as jnp
        self.shape = tuple(shape)
        self.dtype = jnp.dtype(dtype)
        n = 1
        for s in self.shape:
            n *= int(s)
        self.nbytes = n * self.dtype.itemsize
        self._device = device
        self._alloc = _bfc.allocator(device.local_hardware_id)
        self._buf = None
        self._buf = self._alloc.allocate(self.nbytes)
        _live.add(self)

    def devices(self):
        return {self._device}

    def delete(self):
        if self._buf is not None:
            self._alloc.free(self._buf)
            self._buf = None

    def is_deleted(self):
        return self._buf is None

    def block_until_ready(self):
        return self

    def __del__(self):
        try:
            self.delete()
        except Exception:
            pass


def device_put(x, device=None):
    if isinstance(x, Array) and (device is None or device in x.devices()):
        return x
    d = device if device is not None else devices()[0]
    return Array(getattr(x, "shape", ()), getattr(x, "dtype", "float32"), d)


from jax import numpy  # noqa: E402,F401
