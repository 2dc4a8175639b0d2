"""Jobs for tests/adapter/run_tests.sh, run on the simulated GPU with the stand-in torch.

    python3 job.py MODE [OUT.json]

Each job that ends in an out-of-memory error writes to OUT.json what the stand-in's allocator knew
at that moment (the numbers the dump's memory.framework must show) and the adapter's state.
Modes:
  frag          fill the device with 20 MiB segments holding an 8 MiB tensor each plus 12 MiB of
                holes, plus one CUDA-graph-like private pool segment, then ask for 14 MiB
                (OUT.json also names the lines: "most" allocated most, "failing" failed)
  fraction      set_per_process_memory_fraction(0.5), then 100 MiB tensors until the allocator
                refuses one itself (no driver failure); fraction-uncaught: the error is not caught
  toobig        a few tensors, then a request larger than the device
  multidev      like toobig, on device 1
  async         backend:cudaMallocAsync (set by the caller); dies of an uncaught OOM
  oom-caught    toobig, catches the error and exits 3
  oom-uncaught  toobig, does not catch it (exit status 1, Python's traceback)
  oom-goes-on   a request of 3 GiB that fails, caught; then the program allocates 1.6 GiB (more than
                half of it, at once) and ends normally: a failure the program saw, not a recovery
  import-torch  just `import torch` (uncaught if it fails)
  manual-before / manual-after / manual-afterinit
                `import oomguard_torch` (from $ADAPTER_DIR) before torch, after torch, after CUDA
                initialisation; then frag
  idempotent    import oomguard_torch twice, activate() and install() again, then toobig
  state         import torch, use CUDA, write the adapter's state
  state-before  import torch, write the adapter's state before any CUDA use
  train-before-step  AdamW over 120 MiB of parameters, autocast entered and left again, no
                optimizer step yet; then a request the device cannot hold now (not larger than it)
  train-after-step   the same after one AdamW step, failing inside torch.autocast("cuda", bfloat16)
  struct-old / struct-new  oomguard_framework_oom() called directly with autocast = 1 in the
                struct, struct_size that of the struct before autocast was added / the full size
                (freed_bytes_total set, marked measured in struct-new only)
  struct-noflag the full size, freed_bytes_total set without OOMGUARD_FW_FREED_KNOWN
  deepcopy      copy.deepcopy of a dict of 100 MiB tensors that does not fit twice: the failing
                request is made inside the standard library's copy.py (OUT.json: "failing", the
                line of the deepcopy call)
"""
import os
import sys

sys.path.append(os.path.dirname(os.path.abspath(__file__)))   # for jobkit under runpy.run_path too
from jobkit import MiB, here, mode, out, write as write_out  # noqa: E402


def manual_import():
    sys.path.insert(0, os.environ["ADAPTER_DIR"])
    import oomguard_torch  # noqa: F401


if mode == "manual-before":
    manual_import()

if mode == "import-torch":
    import torch  # noqa: F401
    print("imported torch", torch.__version__)
    sys.exit(0)

import torch  # noqa: E402

if mode == "manual-after":
    manual_import()
if mode == "manual-afterinit":
    torch.cuda.init()
    manual_import()
if mode == "idempotent":
    manual_import()
    manual_import()
    import oomguard_torch
    oomguard_torch.activate()
    oomguard_torch.install()


def adapter_state():
    ad = sys.modules.get("oomguard_torch")
    return {
        "adapter_loaded": ad is not None,
        "attached": ad.is_attached() if ad is not None else None,
        "observers": len(torch.cuda._observers),
        "queued_calls": len(torch.cuda._queued_calls),
        # the finder that waits for `import torch` (oomguard_core.after_import)
        "import_hooks": sum(1 for f in sys.meta_path
                            if type(f).__name__ == "_OomguardImportHook" and getattr(f, "name", None) == "torch"),
        "profile_or_trace": sys.getprofile() is not None or sys.gettrace() is not None,
        "excepthook_replaced": sys.excepthook is not sys.__excepthook__,
        "torch_loader": type(torch.__loader__).__name__,
        "torch_spec_loader": type(torch.__spec__.loader).__name__,
        # PyTorch's global optimizer step hooks (the adapter's: training)
        "step_hooks": len(getattr(sys.modules.get("torch.optim.optimizer"), "_global_optimizer_post_hooks", ())),
    }


def write(extra):
    if not out:
        return
    d = {"state": adapter_state(), "version": torch.__version__}
    d.update(extra)
    write_out(d)


def expected(device):
    a = torch.cuda._allocator(device)
    st = a.stats(small=False)                  # every failing request here is a large-pool one
    try:
        ms = torch.cuda.memory_stats(device)
    except RuntimeError:                       # FAKE_TORCH_BROKEN=stats
        return {"device": device}
    return {"device": device, "allocated": st["allocated"], "reserved": st["reserved"],
            "active": ms.get("active_bytes.all.current", 0),
            "inactive_split": st.get("inactive_split", 0), "largest_free": st.get("largest_free", 0),
            "private": st.get("private", 0), "num_ooms": ms.get("num_ooms", 0),
            "num_alloc_retries": ms.get("num_alloc_retries", 0), "freed": ms.get("allocated_bytes.all.freed")}


keep = []

if mode == "state-before":
    write({})
    sys.exit(0)

lines = {}

if mode in ("frag", "manual-before", "manual-after", "manual-afterinit"):
    # a CUDA-graph-like private pool: a 20 MiB segment with a 17 MiB hole that the default pool
    # cannot use (a largest-free-block that counted it would hide the fragmentation)
    keep.append(torch.empty(3 * MiB, pool_id=(1, 1))); lines["small"] = here()  # noqa: E702
    free, total = torch._alloc.mem_get_info(0)
    for i in range(free // (20 * MiB)):
        keep.append(torch.empty(8 * MiB)); lines["most"] = here()  # noqa: E702  new 20 MiB segment: [8 | 12]
        keep.append(torch.empty(8 * MiB))      # fills the 12 MiB hole: [8 | 8 | 4 free]
    del keep[2::2]                             # free every second one: [8 | 12 MiB free] each
    try:
        lines["failing"] = here() + 1
        torch.empty(14 * MiB)                  # > every hole, no room for a new segment
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).split(".")[0])
        write({"expected": expected(0), "lines": lines, "file": os.path.abspath(__file__)})
        sys.exit(0)
    print("no OOM?")
    sys.exit(2)

if mode in ("fraction", "fraction-uncaught"):
    # set_per_process_memory_fraction(0.5): the allocator refuses, without asking the driver,
    # a segment that would take its reservation past half of the device
    torch.cuda.set_per_process_memory_fraction(0.5)
    free, total = torch.cuda.mem_get_info(0)
    try:
        while True:
            lines["failing"] = here() + 1
            keep.append(torch.empty(100 * MiB))
    except torch.OutOfMemoryError as e:
        if mode == "fraction-uncaught":
            raise
        print("OOM:", str(e).split(".")[0])
        exp = expected(0)
        exp.update({"request": 100 * MiB, "cap": int(0.5 * total), "driver_free": torch.cuda.mem_get_info(0)[0]})
        write({"expected": exp, "lines": lines, "file": os.path.abspath(__file__)})
        sys.exit(0)

if mode in ("toobig", "idempotent", "multidev", "oom-caught", "oom-uncaught", "state"):
    dev = 1 if mode == "multidev" else 0
    if dev:
        torch.cuda.set_device(dev)
    for i in range(4):
        keep.append(torch.empty(30 * MiB, device=dev))
    keep.append(torch.empty(512 * 1024, device=dev))
    del keep[1]
    if mode == "state":
        write({})
        sys.exit(0)
    if mode == "oom-uncaught":
        torch.empty(64 << 30, device=dev)
    try:
        torch.empty(64 << 30, device=dev)
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).split(".")[0])
        write({"expected": expected(dev)})
        sys.exit(3 if mode == "oom-caught" else 0)
    sys.exit(2)

if mode == "oom-goes-on":
    keep.append(torch.empty(120 * MiB, device=0))
    try:
        torch.empty(3 << 30, device=0)
        sys.exit(2)
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).split(".")[0])
    smaller = torch.empty(1600 * MiB, device=0)
    sys.exit(0)

if mode == "deepcopy":
    import copy
    free, total = torch.cuda.mem_get_info(0)
    src = {"weights": [torch.empty(100 * MiB) for _ in range(int(free * 0.6) // (100 * MiB))]}
    try:
        lines["failing"] = here() + 1
        dup = copy.deepcopy(src)
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).split(".")[0])
        write({"lines": lines, "file": os.path.abspath(__file__)})
        sys.exit(0)
    sys.exit(2)

if mode in ("train-before-step", "train-after-step"):
    params = [torch.empty(30 * MiB) for _ in range(4)]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    if mode == "train-after-step":
        optimizer.step()                       # makes AdamW's state: 240 MiB
        optimizer.zero_grad()
    else:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass                               # on and off again before the failure
    free, total = torch.cuda.mem_get_info(0)
    big = free + 64 * MiB                      # more than is free, less than the device
    try:
        if mode == "train-after-step":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                torch.empty(big)
        else:
            torch.empty(big)
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).split(".")[0])
        write({"expected": expected(0), "request": big, "total": total})
        sys.exit(0)
    sys.exit(2)

if mode in ("struct-old", "struct-new", "struct-noflag", "struct-norequest", "struct-zero-request"):
    # an adapter built before autocast was added passes a shorter struct: the shim must not read
    # past it (here the field is set, so reading it would show)
    import ctypes
    sys.path.insert(0, os.environ["ADAPTER_DIR"])
    import oomguard_core
    keep.append(torch.empty(30 * MiB))
    S = oomguard_core.stats_struct()
    s = S()
    s.struct_size = S.autocast.offset if mode == "struct-old" else ctypes.sizeof(S)
    s.device = 0
    s.allocated_bytes = s.reserved_bytes = 32 * MiB
    s.framework = b"pytorch"
    s.api = b"torch.cuda.caching_allocator"
    s.requested_bytes = 64 << 30
    s.grad_enabled, s.training, s.autocast = -1, 1, 1
    # freed_bytes_total is read only when covered and marked measured: set but unmarked it is unknown
    s.freed_bytes_total = 12345 * MiB
    if mode == "struct-new":
        s.flags = oomguard_core.FW_FREED_KNOWN
    if mode == "struct-noflag":
        s.struct_size = ctypes.sizeof(S)
    # the request: 0 without FW_REQUEST_KNOWN is "not given" (unknown); with it, a request of 0 bytes
    if mode in ("struct-norequest", "struct-zero-request"):
        s.struct_size = ctypes.sizeof(S)
        s.requested_bytes = 0
        s.flags = oomguard_core.FW_REQUEST_KNOWN if mode == "struct-zero-request" else 0
    fn = ctypes.CDLL(None).oomguard_framework_oom
    fn.argtypes = [ctypes.POINTER(S)]
    r = fn(ctypes.byref(s))
    write({"rc": r, "struct_size": s.struct_size, "full_size": ctypes.sizeof(S)})
    sys.exit(0 if r == 0 else 2)

if mode == "async":
    def own_hook(etype, value, tb):
        # what memory_stats says while the error propagates (the adapter's hook runs just before)
        exp = {"device": 0, "allocated": torch.cuda.memory_allocated(0), "reserved": torch.cuda.memory_reserved(0)}
        write({"expected": exp})
        sys.__excepthook__(etype, value, tb)
    sys.excepthook = own_hook                  # before CUDA initialisation: the adapter chains to it
    for i in range(12):
        keep.append(torch.empty(10 * MiB))     # 3 per 32 MiB pool chunk
    del keep[::2]                              # holes in every chunk: the pool keeps them reserved

    def sweep():
        endpoints = {"theta_0": torch.empty(10 * MiB), "theta_1": torch.empty(10 * MiB)}   # a local of the stack
        torch.empty(64 << 30)                  # uncaught: the stack unwinds, the traceback keeps its locals
        return endpoints
    sweep()

print("unknown mode", mode)
sys.exit(2)
