"""tf.config.experimental, as far as the adapter and the test jobs use it.  As in TensorFlow
2.4 (FAKE_TF_VERSION), it has get_memory_usage() and no get_memory_info() before 2.5."""
import tensorflow as _tf
from tensorflow import _bfc


def _index(device):
    # "GPU:0", "/device:GPU:0", "/physical_device:GPU:0"
    return int(str(device).rsplit(":", 1)[1])


def get_memory_info(device):
    a = _bfc.arena(_index(device))
    return {"current": a.in_use, "peak": a.peak}


def set_memory_growth(device, enable):
    if device._index in _bfc._arenas:
        raise RuntimeError("Physical devices cannot be modified after being initialized")
    _bfc.growth[device._index] = bool(enable)


def get_memory_growth(device):
    return _bfc.growth.get(device._index, False)


def get_memory_usage(device):
    """TensorFlow 2.4's: the current bytes alone."""
    a = _bfc.arena(_index(device))
    return a.in_use


if tuple(int(x) for x in _tf.__version__.split("+")[0].split(".")[:2]) < (2, 5):
    del get_memory_info
else:
    del get_memory_usage
