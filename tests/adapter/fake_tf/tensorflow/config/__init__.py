"""tf.config, as far as the adapter and the test jobs use it."""
from tensorflow import _bfc
from tensorflow.config import experimental  # noqa: F401


class PhysicalDevice(object):
    def __init__(self, index):
        self.name = "/physical_device:GPU:%d" % index
        self.device_type = "GPU"
        self._index = index

    def __repr__(self):
        return "PhysicalDevice(name='%s', device_type='GPU')" % self.name


class LogicalDeviceConfiguration(object):
    def __init__(self, memory_limit=None, experimental_priority=None, experimental_device_ordinal=None):
        self.memory_limit = memory_limit          # MB, as in TensorFlow


def list_physical_devices(device_type=None):
    if device_type not in (None, "GPU"):
        return []
    return [PhysicalDevice(i) for i in range(_bfc.device_count())]


_logical = {}


def set_logical_device_configuration(device, logical_devices):
    if device._index in _bfc._arenas:
        raise RuntimeError("Virtual devices cannot be modified after being initialized")
    _logical[device._index] = list(logical_devices)
    lim = logical_devices[0].memory_limit if logical_devices else None
    if lim:
        _bfc.limits[device._index] = int(lim) * (1 << 20)


def get_logical_device_configuration(device):
    return _logical.get(device._index)
