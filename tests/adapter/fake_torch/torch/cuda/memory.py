"""torch.cuda.memory, as far as the adapter uses it.

FAKE_TORCH_SNAPSHOT=1.13 gives _snapshot() in the layout of PyTorch before 2.1: blocks carry no
"address", "requested_size" or "frames"; a block's address is its segment's plus the sizes of the
blocks before it, and its allocation stack is in "history" (entries with "addr", "real_size",
"frames"), as 1.13 to 2.0 report them."""
import os
import sys

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
    traces = [list(getattr(cuda._allocators[d], "trace", [])) for d in sorted(cuda._allocators)]
    if os.environ.get("FAKE_TORCH_SNAPSHOT") == "1.13":
        for seg in segments:
            for b in seg["blocks"]:
                addr, req, frames = b.pop("address"), b.pop("requested_size"), b.pop("frames")
                if frames:
                    b["history"] = [{"addr": addr, "real_size": req, "frames": frames}]
    return {"segments": segments, "device_traces": traces}


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
    """As PyTorch's: enabled None turns it off; "state"/"all" record the Python traceback of each
    allocation (kept with the live block) and a ring of max_entries alloc/free events."""
    from torch import cuda
    if _alloc.broken("history"):
        raise RuntimeError("fake torch: _record_memory_history broken on purpose")
    if enabled not in (None, "state", "all"):
        raise ValueError("enabled must be None, 'state' or 'all'")
    cuda._lazy_init()
    d = cuda.current_device() if device is None else _device_index(device)
    a = cuda._allocator(d)
    a.history = None if enabled is None else int(max_entries if enabled == "all" else 0)
    if enabled is None:
        a.trace = []


def get_allocator_backend():
    return _alloc.backend_name()


def empty_cache():
    from torch import cuda
    if not cuda.is_initialized():
        return
    for a in list(cuda._allocators.values()):
        a.empty_cache()
