"""Ground-truth marks for the Python scenarios (the Python side of kit/truth.h): the simulator's
books for every device, appended to $SCEN_TRUTH/truth-PID.jsonl.  Test code only."""
import ctypes
import json
import os
import time

_FIELDS = ("total_bytes", "free_bytes", "context_bytes", "alloc_requested_bytes", "alloc_charged_bytes",
           "alloc_blocks", "managed_requested_bytes", "vmm_physical_bytes", "vmm_handles",
           "pool_reserved_bytes", "pool_used_bytes", "pool_blocks", "other_process_bytes", "used_bytes",
           "peak_used_bytes", "host_pinned_bytes", "host_pinned_blocks", "failed_allocs",
           "injected_failures", "contexts")


class _Truth(ctypes.Structure):
    _fields_ = [(f, ctypes.c_ulonglong) for f in _FIELDS]


def mark(kind, device, requested, **extra):
    d = os.environ.get("SCEN_TRUTH")
    if not d:
        return
    lib = ctypes.CDLL("libcuda.so.1")          # already loaded by the runtime: the same instance
    lib.simgpu_truth.argtypes = [ctypes.c_int, ctypes.POINTER(_Truth)]
    truth = []
    for dev in range(lib.simgpu_device_count()):
        t = _Truth()
        if lib.simgpu_truth(dev, ctypes.byref(t)) == 0:
            row = {f: getattr(t, f) for f in _FIELDS}
            row["device"] = dev
            truth.append(row)
    rec = {"kind": kind, "lib": "python", "pid": os.getpid(), "device": device, "requested": requested,
           "t": time.time(), "extra": extra, "truth": truth}
    with open(os.path.join(d, "truth-%d.jsonl" % os.getpid()), "a") as f:
        f.write(json.dumps(rec) + "\n")


def torch_segment_size(nbytes):
    """The cudaMalloc the stand-in torch makes for a tensor of nbytes (a cache miss)."""
    from torch import _alloc
    return _alloc.allocation_size(_alloc.round_size(nbytes))
