"""tensorflow.python.eager.context, as far as the adapter uses it: the eager context, made and
initialised at the first use of a device (a tensor, get_memory_info()), as TensorFlow's is.
Initialising it makes every GPU's arena (tensorflow/_bfc.py); context_safe() and the context's
_initialized tell whether that happened without doing it."""
import threading

_context = None
_context_lock = threading.Lock()


class Context(object):
    def __init__(self):
        self._initialize_lock = threading.Lock()
        self._initialized = False

    def ensure_initialized(self):
        with self._initialize_lock:
            if self._initialized:
                return
            self._initialized = True
        from tensorflow import _bfc
        for i in range(_bfc.device_count()):
            _bfc.arena(i)


def context():
    global _context
    with _context_lock:
        if _context is None:
            _context = Context()
    return _context


def context_safe():
    """The context, or None when none was made."""
    return _context


def ensure_initialized():
    context().ensure_initialized()
