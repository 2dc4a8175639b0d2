"""tf.config.experimental, as far as the adapter and the test jobs use it."""
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
