"""A stand-in for CuPy, for oomguard's adapter tests (there is no cupy on the test machine).

It has what adapters/python/oomguard_cupy.py touches and a test job needs, under CuPy's own names
and signatures: cupy.__version__, cupy.get_default_memory_pool() (MemoryPool.used_bytes(),
total_bytes(), free_bytes(), n_free_blocks(), set_limit(), get_limit(), free_all_blocks()),
cupy.cuda.Device, cupy.cuda.runtime.getDevice()/memGetInfo(), cupy.cuda.memory.OutOfMemoryError
and cupy.empty/zeros(shape, dtype) returning arrays with .nbytes.  The pool (cupy/cuda/memory.py)
allocates for real through the CUDA runtime.
"""
import os as _os

# the stand-ins' shared CUDA runtime and chunk list (tests/adapter/fake_common) load as cupy._fake_cuda
__path__.append(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _os.pardir, _os.pardir, "fake_common"))

# CuPy's memory pool is its compiled cupy/cuda/memory module: with FAKE_CUPY_MEMORY (the test runners name
# the one tests/adapter/adapter.mk builds) the stand-in's runtime calls come from a library of that name
# too, so the ledger attributes its memory as in production; without it, from ctypes (libffi)
from cupy import _fake_cuda as _fc  # noqa: E402

if _os.environ.get("FAKE_CUPY_MEMORY"):
    _fc.route_through(_os.environ["FAKE_CUPY_MEMORY"], "cupy_")

__version__ = _os.environ.get("FAKE_CUPY_VERSION", "13.3.0+fake")

from cupy import cuda  # noqa: E402
from cupy.cuda.memory import OutOfMemoryError  # noqa: E402,F401

_SIZES = {"float32": 4, "float16": 2, "float64": 8, "int8": 1, "uint8": 1, "int32": 4, "int64": 8}
float32, float16, float64, int8, int32 = "float32", "float16", "float64", "int8", "int32"

_default_pool = cuda.MemoryPool()


def get_default_memory_pool():
    return _default_pool


class ndarray(object):
    def __init__(self, shape, dtype="float32"):
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype = getattr(dtype, "name", dtype)
        n = 1
        for s in self.shape:
            n *= int(s)
        self.nbytes = n * _SIZES[self.dtype]
        self.data = _default_pool.malloc(self.nbytes)


def empty(shape, dtype="float32"):
    return ndarray(shape, dtype)


def zeros(shape, dtype="float32"):
    return ndarray(shape, dtype)
