"""A stand-in for TensorFlow, for oomguard's adapter tests (there is no tensorflow on the test
machine): tf.__version__, tf.errors.ResourceExhaustedError, tf.config.{list_physical_devices,
set_logical_device_configuration, LogicalDeviceConfiguration, experimental.get_memory_info,
experimental.set_memory_growth}, tf.zeros/ones(shape, dtype) and tf.float32, under TensorFlow's
names and signatures; device memory from a BFC arena in miniature (tensorflow/_bfc.py), made
for every GPU when the eager context is initialised (tensorflow/python/eager/context.py)."""
import os as _os

# the stand-ins' shared CUDA runtime and chunk list (tests/adapter/fake_common) load as tensorflow._fake_cuda
__path__.append(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _os.pardir, _os.pardir, "fake_common"))

# TensorFlow's BFC allocator is in libtensorflow_framework.so.2 and allocates with the driver API
# (StreamExecutor: cuMemAlloc_v2 in the primary context), as the stand-in does: with FAKE_TF_FRAMEWORK (the
# test runners name the one tests/adapter/adapter.mk builds) the stand-in's calls come from a library of that
# name too, so the ledger attributes its memory as in production; without it, from ctypes (libffi)
from tensorflow import _fake_cuda as _fc  # noqa: E402

_fc.use_driver_api()

if _os.environ.get("FAKE_TF_FRAMEWORK"):
    _fc.route_through(_os.environ["FAKE_TF_FRAMEWORK"], "tf_")

__version__ = _os.environ.get("FAKE_TF_VERSION", "2.17.0+fake")

from tensorflow import errors  # noqa: E402,F401
from tensorflow import config  # noqa: E402,F401
from tensorflow import _bfc  # noqa: E402

float32, float16, int32 = "float", "half", "int32"
_SIZES = {"float": 4, "half": 2, "int32": 4}


class Tensor(object):
    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        n = 1
        for s in self.shape:
            n *= int(s)
        self.nbytes = n * _SIZES[dtype]
        self._arena = _bfc.arena(0)
        self._block = None
        self._block = self._arena.allocate(self.nbytes, self.shape, dtype)

    def __del__(self):
        try:
            if self._block is not None:
                self._arena.release(self._block)
                self._block = None
        except Exception:
            pass


def zeros(shape, dtype=float32):
    return Tensor((shape,) if isinstance(shape, int) else shape, dtype)


def ones(shape, dtype=float32):
    return zeros(shape, dtype)
