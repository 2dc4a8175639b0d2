"""jax._src.xla_bridge, as far as the adapter uses it: the backends, made at the first use of a
device (jax.devices(), an array), as JAX's are.  Making them takes each device's allocator, which
preallocates its arena unless XLA_PYTHON_CLIENT_PREALLOCATE=false, as XLA's GPU client does;
backends_are_initialized() tells whether that happened without doing it."""
import threading

_backends = {}
_backend_lock = threading.Lock()


def backends():
    with _backend_lock:
        if not _backends:
            from jax._src import bfc
            _backends["cuda"] = [bfc.allocator(i) for i in range(bfc.device_count())]
        return dict(_backends)


def backends_are_initialized():
    with _backend_lock:
        return len(_backends) != 0
