"""torch.cuda.memory, as far as the adapter uses it."""
from torch import _alloc


def _device_index(device):
    from torch import cuda
    if device is None:
        return cuda.current_device()
    if hasattr(device, "index"):
        return device.index or 0
    return int(device)


def memory_stats(device=None):
    from torch import cuda
    if _alloc.broken("stats"):
        raise RuntimeError("fake torch: memory_stats broken on purpose")
    if not cuda.is_initialized():
        return {}
    return dict(sorted(cuda._allocator(_device_index(device)).memory_stats().items()))


def _snapshot(device=None):
    from torch import cuda
    if _alloc.broken("snapshot"):
        raise RuntimeError("fake torch: _snapshot broken on purpose")
    if _alloc.backend_name() == "cudaMallocAsync":
        raise RuntimeError("fake torch: snapshot is not supported with backend:cudaMallocAsync")
    segments = []
    for d in sorted(cuda._allocators):
        segments.extend(cuda._allocators[d].snapshot_segments())
    return {"segments": segments, "device_traces": [[] for _ in cuda._allocators]}


def get_allocator_backend():
    return _alloc.backend_name()


def empty_cache():
    from torch import cuda
    if not cuda.is_initialized():
        return
    for a in list(cuda._allocators.values()):
        a.empty_cache()
