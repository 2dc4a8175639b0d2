"""A stand-in for PyTorch, for oomguard's adapter tests (there is no torch on the test machine).

It has just what adapters/python/oomguard_torch.py touches -- torch.__version__,
torch.OutOfMemoryError, torch.cuda.{memory_stats, memory._snapshot, get_allocator_backend,
is_initialized, _lazy_call, _lazy_init, ...} and torch._C._cuda_attach_out_of_memory_observer --
and a caching allocator (torch/_alloc.py) that allocates for real through the CUDA runtime, so the
tests exercise liboomguard's hooks.  torch.empty(nbytes) returns a Tensor holding nbytes of device
memory until it is deleted.

FAKE_TORCH_BROKEN=import makes `import torch` raise; FAKE_TORCH_VERSION sets __version__.
"""
import os as _os

from torch._alloc import OutOfMemoryError, broken as _broken

if _broken("import"):
    raise RuntimeError("fake torch: broken on purpose (FAKE_TORCH_BROKEN=import)")

__version__ = _os.environ.get("FAKE_TORCH_VERSION", "2.5.1+fake")

from torch import _C  # noqa: E402
from torch import cuda  # noqa: E402


class Tensor(object):
    """nbytes of device memory; freed (back to the cache) when the object goes away."""

    def __init__(self, device, block, nbytes):
        self.device = device
        self._block = block
        self.nbytes = nbytes

    def data_ptr(self):
        b = self._block
        return b[0] if isinstance(b, tuple) else b.addr

    def __del__(self):
        try:
            if self._block is not None:
                cuda._allocator(self.device).free(self._block)
                self._block = None
        except Exception:
            pass


def empty(nbytes, device=None, pool_id=(0, 0)):
    """A tensor of nbytes bytes on `device` (default: the current device)."""
    cuda._lazy_init()
    d = cuda.current_device() if device is None else int(device)
    block = cuda._allocator(d).malloc(int(nbytes), tuple(pool_id))
    return Tensor(d, block, int(nbytes))
