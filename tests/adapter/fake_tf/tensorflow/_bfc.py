"""The stand-in's GPU memory: TensorFlow's GPU_N_bfc allocator in miniature, on the CUDA driver API
through ctypes as TensorFlow's StreamExecutor calls it (cuMemAlloc_v2 in the primary context:
tensorflow/__init__.py's use_driver_api(); the simulated GPU in the tests).  Without memory growth the first use takes the
whole limit at once (TensorFlow maps nearly all free memory; here: the logical device's
memory_limit, else 90% of the free memory); with TF_FORCE_GPU_ALLOW_GROWTH=true or
tf.config.experimental.set_memory_growth it takes regions on demand up to the same limit.  A
request the arena cannot serve raises ResourceExhaustedError without a failing driver call."""
import os
import threading

from tensorflow._fake_cuda import cuda_malloc, device_count, mem_get_info, round_up  # noqa: F401
from tensorflow.errors import ResourceExhaustedError

MiB = 1 << 20
ROUND = 256
_lock = threading.RLock()
growth = {}        # device -> bool (set_memory_growth)
limits = {}        # device -> bytes (set_logical_device_configuration)


class Arena(object):
    def __init__(self, device):
        self.device = device
        free = mem_get_info(device)[0]
        self.limit = limits.get(device) or int(free * 0.9) // ROUND * ROUND
        env = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").strip().lower() == "true"
        self.growth = env or growth.get(device, False)
        self.free = []             # [addr, size] free chunks
        self.pool = self.in_use = self.peak = 0
        if not self.growth:
            self._region(self.limit)

    def _region(self, size):
        addr = cuda_malloc(self.device, size)
        if addr is None:
            return False
        self.free.append([addr, size])
        self.pool += size
        return True

    def allocate(self, nbytes, shape, dtype):
        with _lock:
            size = round_up(nbytes, ROUND)
            fit = [c for c in self.free if c[1] >= size]
            if not fit and self.growth and self.pool + size <= self.limit:
                self._region(max(size, min(self.limit - self.pool, 2 * size)))
                fit = [c for c in self.free if c[1] >= size]
            if not fit:
                raise ResourceExhaustedError(
                    None, None, "OOM when allocating tensor with shape[%s] and type %s on "
                    "/job:localhost/replica:0/task:0/device:GPU:%d by allocator GPU_%d_bfc [Op:Fill]"
                    % (",".join(str(s) for s in shape), dtype, self.device, self.device))
            c = min(fit, key=lambda x: x[1])
            addr = c[0]
            c[0] += size
            c[1] -= size
            if c[1] == 0:
                self.free.remove(c)
            self.in_use += size
            self.peak = max(self.peak, self.in_use)
            return (addr, size)

    def release(self, block):
        with _lock:
            self.free.append([block[0], block[1]])
            self.in_use -= block[1]


_arenas = {}


def arena(device):
    from tensorflow.python.eager import context
    context.ensure_initialized()     # the first use of a device initialises the runtime
    with _lock:
        a = _arenas.get(device)
        if a is None:
            a = _arenas[device] = Arena(device)
        return a
