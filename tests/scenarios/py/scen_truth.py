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
           "injected_failures", "contexts", "ipc_mapped_bytes", "ipc_mappings", "graph_reserved_bytes",
           "peak_rounding_bytes", "alloc_threads")
# every field of sim/simgpu.h's simgpu_truth_t, in order: the simulator writes the whole struct, so a
# shorter one here is a heap overflow (it once corrupted Python's heap and crashed its exit GC)


def _header_fields():
    """The field names of simgpu_truth_t as sim/simgpu.h declares them, in order."""
    import re
    src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "sim", "simgpu.h")).read()
    body = src[src.index("typedef struct simgpu_truth {"):src.index("} simgpu_truth_t;")]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return tuple(n.strip() for decl in re.findall(r"unsigned long long ([^;]+);", body) for n in decl.split(","))


if _header_fields() != _FIELDS:
    raise SystemExit("scen_truth.py: _FIELDS differ from sim/simgpu.h's simgpu_truth_t: %r" % (_header_fields(),))


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


_last = {}


def request_bytes(torch, n, dtype=None):
    """The bytes torch.empty(n, dtype=dtype) asks for: n elements of dtype (stand-in torch: bytes
    without one), the size the truth mark compares with the failing request."""
    return int(n) * torch._ITEMSIZE[dtype or "uint8"]


def torch_empty(nbytes, device=None):
    """torch.empty(nbytes) (stand-in torch: bytes), remembering the request and what the allocator
    reserved just before it, for torch_oom_mark."""
    import torch
    _last["n"] = nbytes
    _last["reserved"] = torch.cuda.memory_reserved()
    return torch.empty(nbytes) if device is None else torch.empty(nbytes, device=device)


_NOTED = """
def noted(n, *args, **kw):
    dtype = kw.get("dtype", args[0] if args else None)
    _last.update(n=request_bytes(torch, n, dtype), reserved=torch.cuda.memory_reserved(), allocated_at_failure=None)
    alloc = getattr(torch, "_alloc", None)
    if alloc is not None:
        alloc.allocated_at_oom = None
    try:
        return plain(n, *args, **kw)
    except torch.OutOfMemoryError:
        # as the allocator had it when it failed, before its observers ran (the stand-in keeps that number); a
        # torch without it: read now
        at = getattr(alloc, "allocated_at_oom", None)
        _last["allocated_at_failure"] = at if at is not None else torch.cuda.memory_allocated()
        raise
"""


def note_every_empty(torch):
    """Makes every torch.empty (the program's and torch's own: gradients, optimizer state) note its
    request in bytes (elements times the dtype's size) and the allocator's reservation before it, as
    torch_empty does, for torch_oom_mark.
    The wrapper is compiled as part of torch's own file: the dump's failing Python line stays the
    program's (the innermost frame outside the framework), not this test scaffolding."""
    ns = {"_last": _last, "torch": torch, "plain": torch.empty, "request_bytes": request_bytes}
    exec(compile(_NOTED, torch.__file__, "exec"), ns)
    torch.empty = ns["noted"]


def backward(loss):
    """loss.backward(), then what PyTorch does to the graph afterwards (retain_graph=False): the
    saved activations are freed; output tensors stay as long as they are referenced."""
    loss.backward()
    t = loss
    while t is not None:
        nxt = getattr(t, "_saved", None)
        t._saved = None
        t = nxt


def torch_oom_mark(device=0):
    """The truth at a torch.OutOfMemoryError raised by the last torch_empty: the simulator's books
    plus what the allocator says it holds and released between its attempts.  The allocated bytes are
    those when the allocator failed, before its out-of-memory observers ran (note_every_empty notes
    them): unwinding to this handler drops what the frames in between kept on their stacks (a
    comprehension's dict being built), and an observer's own Python work may let the cyclic collector
    free a tensor nothing reached any more."""
    import torch
    st = torch.cuda.memory_stats()
    allocated = _last.get("allocated_at_failure")
    if allocated is None:
        allocated = st["allocated_bytes.all.current"]
    mark("fail", device, torch_segment_size(_last["n"]), allocated=allocated,
         reserved=st["reserved_bytes.all.current"], released=_last["reserved"] - st["reserved_bytes.all.current"],
         fw=1)
