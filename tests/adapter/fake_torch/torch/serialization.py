"""torch.save / torch.load, as far as the programs use them: a checkpoint is a JSON file of {name: bytes}.
load() restores each entry as PyTorch does, through the registry of (priority, tagger, deserializer)
that torch.serialization.register_package fills and default_restore_location walks in priority order:
onto the GPU it was saved from (the current one here) unless map_location says otherwise; with
map_location="cpu" a host placeholder."""
import json

import torch


class _HostTensor(object):
    is_cuda = False

    def __init__(self, nbytes):
        self.nbytes = nbytes


class _HostStorage(object):
    """A storage as read from the file, in host memory, before it is restored to its location."""

    def __init__(self, nbytes):
        self._nbytes = nbytes

    def nbytes(self):
        return self._nbytes


_package_registry = []


def register_package(priority, tagger, deserializer):
    """As PyTorch's: the entry joins the registry, which is kept sorted (by priority, then the functions)."""
    _package_registry.append((priority, tagger, deserializer))
    _package_registry.sort()


def _cpu_tag(obj):
    return "cpu" if isinstance(obj, _HostStorage) else None


def _cpu_deserialize(obj, location):
    return obj if location == "cpu" else None


def _cuda_tag(obj):
    return "cuda:%d" % obj._owner.device if isinstance(obj, torch.UntypedStorage) else None


def _cuda_deserialize(obj, location):
    if not location.startswith("cuda"):
        return None
    device = int(location.split(":")[1]) if ":" in location else torch.cuda.current_device()
    return torch.empty(obj.nbytes(), device=device).untyped_storage()


register_package(10, _cpu_tag, _cpu_deserialize)
register_package(20, _cuda_tag, _cuda_deserialize)


def default_restore_location(storage, location):
    for _, _, fn in _package_registry:
        result = fn(storage, location)
        if result is not None:
            return result
    raise RuntimeError("don't know how to restore data location of %s (tagged with %s)"
                       % (type(storage).__name__, location))


def _restore_location(map_location):
    """PyTorch's _get_restore_location: None restores where saved; a string or device names the location; a
    dict maps saved locations; a callable decides, None from it falling back to where saved."""
    if map_location is None:
        return default_restore_location
    if isinstance(map_location, dict):
        return lambda s, loc: default_restore_location(s, map_location.get(loc, loc))
    if callable(map_location):
        return lambda s, loc: map_location(s, loc) or default_restore_location(s, loc)
    return lambda s, loc: default_restore_location(s, str(map_location))


def save(obj, f):
    with open(f, "w") as fh:
        json.dump(dict((k, int(v.nbytes)) for k, v in obj.items()), fh)


def load(f, map_location=None, weights_only=None):
    with open(f) as fh:
        sizes = json.load(fh)
    restore = _restore_location(map_location)
    saved_on = "cuda:%d" % getattr(torch.cuda._current, "device", 0)   # the current GPU, making no context
    out = {}
    for k, n in sizes.items():
        st = restore(_HostStorage(n), saved_on)
        out[k] = st._owner if isinstance(st, torch.UntypedStorage) else _HostTensor(n)
    return out
