"""oomguard's PyTorch adapter: hands PyTorch's own allocator numbers to liboomguard when a CUDA
allocation fails, so the dump can tell live tensors from cached-but-free memory.

Enable it with one line, before or after `import torch`:

    import oomguard_torch

`oomguard run` and the plain LD_PRELOAD=liboomguard.so do it for you (they put this directory
on PYTHONPATH; the sitecustomize.py next to this file imports the module).  Without liboomguard preloaded this module does nothing.

What it does:
  * waits until torch is imported (a sys.meta_path finder that notices `import torch`
    finishing; at once if torch is already imported), then until PyTorch initialises CUDA
    (torch.cuda._lazy_call), and only then registers an out-of-memory observer with
    torch._C._cuda_attach_out_of_memory_observer -- nothing runs per allocation;
  * when PyTorch's caching allocator gives up on a request it calls the observer (allocator
    lock released, tensors still alive); the observer reads torch.cuda.memory_stats(device) and
    torch.cuda.memory._snapshot(), and calls oomguard_framework_report() in the preloaded shim,
    which rewrites that failure's dump with these numbers (memory.framework);
  * the observer is called for every request PyTorch fails, also one its own allocator refused
    without asking the driver (set_per_process_memory_fraction): it calls
    oomguard_framework_oom() with the request, the cap and the Python stack of the failing
    thread, so such a refusal gets a full dump of its own;
  * with the numbers go the settings in force: autograd and autocast (mixed precision) on the
    failing thread, and whether the job trains (a global optimizer step hook, PyTorch 2.0+, that
    only sets a flag and notes the time), so the remedies leave out what is already done;
  * with OOMGUARD_PYTHON_STACKS=1 it turns on PyTorch's bounded allocation history at CUDA
    initialisation, and the dump lists the lines holding the most live memory (python_sites);
  * with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PyTorch has no observer: the adapter
    then reports what memory_stats() has from sys.excepthook, if the program dies of an
    uncaught out-of-memory error; the shim's own pool accounting covers that backend anyway.
    The same fallback serves torch < 2.2 with several visible devices, where registering the
    observer was not safe on every device.

See docs/pytorch-adapter.md.

It never raises into the program: every failure is swallowed (one line on stderr with
OOMGUARD_VERBOSE=1).  Python 3.9+, standard library only.
"""
import collections
import dis
import os
import re
import sys
import types
import threading
import time

import oomguard_core
import oomguard_phase
import oomguard_roles

__all__ = ["install", "activate", "report", "is_attached"]

_SMALL_BUFFER = 2 * 1024 * 1024        # PyTorch's small-pool segment size (kSmallBuffer)
_lock = threading.RLock()
_state = {
    "installed": False,   # install() ran against the torch module
    "queued": False,      # waiting for CUDA initialisation
    "attached": None,     # None, "observer" or "excepthook"
    "prev_excepthook": None,
    "step_hook": None,    # the handle of the optimizer step hook (training)
    # the step hook was registered as torch's import finished, before the program could make an optimizer: a
    # device no step was seen on made none (a measured zero); registered later (this module imported after
    # torch), steps before it were missed and a device without any stays unknown
    "steps_from_start": False,
    "load_hook": False,   # _on_restore is in torch.serialization's registry
}
_in_observer = threading.local()


# ---------------------------------------------------------------------------- small helpers

WHO = "pytorch"
_u64 = oomguard_core.u64


def _say(msg):
    oomguard_core.say(WHO, msg)


def _err(where, exc):
    oomguard_core.err(WHO, where, exc)


_last_snapshot = None


def _torch():
    return sys.modules.get("torch")


def _version_tuple(v):
    out = []
    for part in str(v).split("+")[0].split(".")[:2]:
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        out.append(int(digits) if digits else 0)
    while len(out) < 2:
        out.append(0)
    return tuple(out)


# ---------------------------------------------------------------------------- reading PyTorch

def _allocator_backend(torch):
    try:
        get = getattr(torch.cuda, "get_allocator_backend", None)
        if get is None:
            get = getattr(getattr(torch.cuda, "memory", None), "get_allocator_backend", None)
        return str(get()) if get is not None else ""
    except Exception:
        return ""


def _allocator_settings(torch):
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    backend = _allocator_backend(torch)
    if backend and "backend" not in conf:
        conf = "%s%sbackend:%s" % (conf, "," if conf else "", backend)
    return conf


def _write_atomic(d, path, write, binary):
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=".oomguard-snapshot.", dir=d)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _save_snapshot(snap):
    """Writes the allocator snapshot where the shim writes its dumps (OOMGUARD_DIR, else the
    working directory), atomically, twice: as JSON (the path returned, or None; the dump names
    it and `oomguard report --format memory-viz` turns it into a pickle), and as the pickle
    PyTorch's memory_viz page opens directly (the same path + ".pickle", as
    torch.cuda.memory._dump_snapshot writes it)."""
    try:
        import json
        import pickle
        import socket
        d = os.environ.get("OOMGUARD_DIR") or os.getcwd()
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or os.environ.get("OMPI_COMM_WORLD_RANK")
        name = "oomguard-%s-%d%s.torch-snapshot" % (  # not *.json: dump globs must not see it
            # the host name as the shim puts it in a file name: only [A-Za-z0-9._-], at most 64
            "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in socket.gethostname())[:64]
            or "unknown", os.getpid(), ("-rank%s" % rank) if rank and rank.isdigit() else "")
        path = os.path.abspath(os.path.join(d, name))
        _write_atomic(d, path, lambda f: json.dump(
            snap, f, default=lambda o: list(o) if isinstance(o, (tuple, set)) else str(o)), False)
    except Exception as e:
        _err("saving the allocator snapshot", e)
        return None
    try:
        _write_atomic(d, path + ".pickle", lambda f: pickle.dump(snap, f, protocol=2), True)
    except Exception as e:
        _err("saving the allocator snapshot as a pickle", e)
    return path


def _user_frame(frames, torch_dir):
    """The innermost frame of a block's allocation traceback outside torch itself: the line of
    the program that asked for the memory."""
    first = None
    for fr in frames or ():
        if not isinstance(fr, dict):
            continue
        fn = str(fr.get("filename", ""))
        if not fn or fn.startswith("??") or fn.endswith((".cpp", ".h", ".cc", ".cu")):
            continue                      # C++ frames (stacks="all")
        if first is None:
            first = fr
        if torch_dir and os.path.abspath(fn).startswith(torch_dir):
            continue
        return fr
    return first


def _cache_view(torch, device, alloc_size):
    """(largest free block, private pool bytes, python sites, blocks) from the allocator snapshot;
    (None, None, None, None) if unreadable.  blocks: the live blocks of `device` for the roles,
    ({address: size} of the default pools, {address: size} of private pools, {address: line}).

    The largest free block is looked for where the failed request could have been served: the
    default pool (private pools such as CUDA graphs' are not usable by it), and the small or the
    large pool depending on the size PyTorch tried to reserve (small segments are 2 MiB).
    The sites: live blocks grouped by the program's line that allocated them, when the
    allocation history is on (OOMGUARD_PYTHON_STACKS=1 turns it on); else None."""
    try:
        snap = torch.cuda.memory._snapshot()
    except Exception as e:
        _err("torch.cuda.memory._snapshot()", e)
        return None, None, None, None
    global _last_snapshot
    _last_snapshot = snap
    try:
        segments = snap.get("segments", []) if isinstance(snap, dict) else snap
        want_small = None
        if alloc_size:
            want_small = int(alloc_size) <= _SMALL_BUFFER
        largest = 0
        private = 0
        sites = {}
        live, live_private, made_at = {}, {}, {}
        try:
            torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        except Exception:
            torch_dir = None
        for seg in segments or ():
            if not isinstance(seg, dict):
                continue
            d = seg.get("device")
            if d is not None and device is not None and int(d) != int(device):
                continue
            pool_id = seg.get("segment_pool_id")
            is_private = False
            if pool_id is not None:
                try:
                    is_private = tuple(int(x) for x in pool_id) != (0, 0)
                except Exception:
                    is_private = False
            into = live_private if is_private else live
            # PyTorch 2.1 and later give each block its "address" and "frames"; before, blocks lie in
            # order from the segment's "address" and the stack is in the block's last "history" entry
            at = seg.get("address")
            at = int(at) if at is not None else None
            for b in seg.get("blocks", ()) or ():
                if not isinstance(b, dict):
                    continue
                addr = b.get("address")
                addr = int(addr) if addr is not None else at
                if at is not None:
                    at += _u64(b.get("size", 0))
                if b.get("state") == "active_allocated":
                    if addr is not None:
                        into[addr] = _u64(b.get("size", 0))
                    frames = b.get("frames")
                    if not frames and b.get("history"):
                        last = b["history"][-1]
                        frames = last.get("frames") if isinstance(last, dict) else None
                    fr = _user_frame(frames, torch_dir) if frames else None
                    if fr is not None:
                        key = (str(fr.get("filename")), int(fr.get("line") or 0), str(fr.get("name", "")))
                        v = sites.setdefault(key, [0, 0])
                        v[0] += _u64(b.get("size", 0))
                        v[1] += 1
                        if addr is not None:
                            made_at[addr] = key
            if is_private:
                private += _u64(seg.get("total_size", 0))
                continue
            seg_type = seg.get("segment_type")
            if want_small is not None and seg_type in ("small", "large") and (seg_type == "small") != want_small:
                continue
            for b in seg.get("blocks", ()) or ():
                if isinstance(b, dict) and b.get("state") == "inactive":
                    size = _u64(b.get("size", 0))
                    if size > largest:
                        largest = size
        ranked = sorted(((k[0], k[1], k[2], v[0], v[1]) for k, v in sites.items()),
                        key=lambda x: (-x[3], x[0], x[1]))[:16]
        return largest, private, (ranked or None), (live, live_private, made_at)
    except Exception as e:
        _err("reading the allocator snapshot", e)
        return None, None, None, None


def _grad_mode(torch):
    """1 autograd records at the failure, -1 it does not (no_grad / inference_mode), 0 unknown."""
    try:
        inf = getattr(torch, "is_inference_mode_enabled", None)
        if inf is not None and inf():
            return -1
        return 1 if torch.is_grad_enabled() else -1
    except Exception:
        return 0


def _autocast_mode(torch):
    """1 CUDA autocast (mixed precision) is on in this thread, -1 it is off, 0 unknown.
    is_autocast_enabled takes the device type since PyTorch 2.4; before, it took none and
    answered for CUDA."""
    try:
        fn = getattr(torch, "is_autocast_enabled", None)
        if fn is None:
            return 0
        try:
            on = fn("cuda")
        except TypeError:
            on = fn()
        return 1 if on else -1
    except Exception:
        return 0


# training: set once any optimizer's step() has run (PyTorch's global step hook, 2.0+); it is
# never cleared, and nothing here can tell that a job does not train (that stays unknown)
_step_seen = False
_last_step_t = None     # time.monotonic() at the end of the latest optimizer step
# what the framework had allocated right after each of an optimizer's latest steps: memory kept across
# iterations rises there step after step, a flat job stays flat (the driver sees neither once the
# cache is warm).  {id(optimizer): [device, steps made, deque of allocated bytes, time of the latest, the run's
# series, its stride]}, at most _STEP_OPTIMIZERS optimizers (the least recently stepped goes).  The run's series
# spans every step made: the allocated bytes after every stride-th step, at most _STEP_SERIES of them (when full,
# every other one goes and the stride doubles), so an iteration of many optimizer steps (a PPO epoch over its
# mini-batches, a GAN's two optimizers) still shows what each iteration kept
_STEP_SERIES = 32
_STEP_OPTIMIZERS = 8
_step_series = {}
# the steps every optimizer made on each device (an optimizer dropped from _step_series too): a series that holds
# all of them spans the device's whole run, however short; another optimizer's earlier steps (a new one per round
# or client) say it does not
_device_steps = {}


def _allocated_now(torch):
    """(device, allocated bytes) of the current device, or None: never initialises CUDA.  The C
    call's nested dict, not memory_stats()' flattened copy: this runs after every optimizer step."""
    cuda = torch.cuda
    if not cuda.is_initialized():
        return None
    dev = cuda.current_device()
    stats = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
    if stats is not None:
        return dev, int(stats(dev)["allocated_bytes"]["all"]["current"])
    return dev, int(cuda.memory_allocated(dev))


def _on_optimizer_step(optimizer, args, kwargs):
    """torch.optim.optimizer.register_optimizer_step_post_hook callback: runs after every
    optimizer step, so it only sets a flag, notes the time (one clock read) and what is allocated."""
    global _step_seen, _last_step_t
    _step_seen = True
    _last_step_t = time.monotonic()
    try:
        torch = sys.modules.get("torch")
        now = _allocated_now(torch) if torch is not None else None
        if now is None:
            return
        s = _step_series.get(id(optimizer))
        if s is None or s[0] != now[0]:
            if s is None and len(_step_series) >= _STEP_OPTIMIZERS:
                del _step_series[min(_step_series, key=lambda k: _step_series[k][3])]
            s = _step_series[id(optimizer)] = [now[0], 0, collections.deque(maxlen=_STEP_SERIES), 0.0, [], 1]
        _device_steps[now[0]] = _device_steps.get(now[0], 0) + 1
        s[1] += 1
        s[2].append(now[1])
        s[3] = _last_step_t
        if s[1] % s[5] == 0:
            s[4].append(now[1])
            if len(s[4]) > _STEP_SERIES:
                s[4] = s[4][1::2]
                s[5] *= 2
    except Exception:
        pass


def _steps_of(device):
    """(steps made, [allocated after each of the latest ones, oldest first], stride, [allocated after every
    stride-th step of the run], the steps every optimizer made on `device`) of the optimizer on `device` that stepped
    most (ties: the latest); the last None when steps before the hook may have been missed; (0, [], 1, [], 0) when
    every step was watched and none was made on `device`; None when that is not known."""
    whole = _state["steps_from_start"] and _state["step_hook"] is not None
    best = None
    for s in list(_step_series.values()):
        if s[0] == device and (best is None or (s[1], s[3]) > (best[1], best[3])):
            best = s
    if best is not None:
        return (best[1], list(best[2]), best[5], list(best[4]), _device_steps.get(device, 0) if whole else None)
    if whole and device not in _device_steps:
        return (0, [], 1, [], 0)
    return None


def _watch_optimizers(torch):
    """Registers _on_optimizer_step once.  A torch without the global hook (< 2.0) leaves
    training unknown."""
    if _state.get("step_hook") is not None:
        return
    try:
        # torch/optim/__init__.py deletes its submodules' names; `import torch` has loaded this one
        mod = sys.modules.get("torch.optim.optimizer") or getattr(getattr(torch, "optim", None), "optimizer", None)
        register = getattr(mod, "register_optimizer_step_post_hook", None)
        if register is None:
            _say("no torch.optim.optimizer.register_optimizer_step_post_hook: training stays unknown")
            return
        _state["step_hook"] = register(_on_optimizer_step)
        _state["steps_from_start"] = not _TORCH_BEFORE_ADAPTER
    except Exception as e:
        _err("registering the optimizer step hook", e)


# torch.load restores every storage through torch.serialization's registry of (priority, tagger, deserializer)
# entries (register_package), which default_restore_location walks in priority order until one restores it.  The
# adapter's entry comes first: a storage bound for a GPU it restores with the other entries, in the registry's order
# (the same calls PyTorch would make, their exceptions left to the program), and notes what came back (its address
# and size) and the program's line that called torch.load.  At a failure the roles scan can then say which bytes a
# Python object holds are a checkpoint or a file's tensors restored onto the GPU (map_location not the CPU).  At most
# _RESTORED storages are remembered (the oldest go first) and _RESTORE_SITES lines; a storage freed since and
# whose address and size a later tensor took again would be read as restored: a bound, not a proof
_RESTORED = 65536
_RESTORE_SITES = 16
_restored = collections.OrderedDict()       # data pointer -> (bytes, index in _restore_sites)
_restore_sites = []                          # (file, line, function) of the program's torch.load calls
# loads in several threads note in turn; a signal handler's own torch.load re-enters in the same thread
_restore_lock = threading.RLock()


def _restore_tag(obj):
    """The adapter's registry entry tags nothing: torch.save asks the other entries."""
    return None


def _on_restore(obj, location):
    """The adapter's deserializer (see _restored): None for a location that is not a GPU."""
    if not isinstance(location, str) or not location.startswith("cuda"):
        return None
    registry = getattr(sys.modules.get("torch.serialization"), "_package_registry", None)
    if not isinstance(registry, list):
        return None
    for entry in list(registry):
        fn = entry[2] if isinstance(entry, tuple) and len(entry) == 3 else None
        if fn is None or fn is _on_restore:
            continue
        res = fn(obj, location)
        if res is not None:
            _note_restored(res)
            return res
    return None


def _note_restored(storage):
    try:
        ptr, n = int(storage.data_ptr()), int(storage.nbytes())
        if not ptr:
            return
        f = oomguard_phase.site(sys._getframe(2), limit=64)
        at = (f.f_code.co_filename, f.f_lineno or 0, f.f_code.co_name) if f is not None else ("-", 0, "-")
        f = None
        with _restore_lock:
            if at in _restore_sites:
                i = _restore_sites.index(at)
            elif len(_restore_sites) < _RESTORE_SITES:
                _restore_sites.append(at)
                i = len(_restore_sites) - 1
            else:
                i = -1
            _restored.pop(ptr, None)
            _restored[ptr] = (n, i)
            while len(_restored) > _RESTORED:
                _restored.popitem(last=False)
    except Exception:
        pass


def restored_storage(ptr, nbytes):
    """(file, line, function) of the torch.load call that restored the storage at ptr of nbytes onto a GPU,
    ("-", 0, "-") when that line is not known, None when torch.load did not (as far as the adapter saw)."""
    got = _restored.get(ptr)
    if got is None or got[0] != nbytes:
        return None
    return _restore_sites[got[1]] if 0 <= got[1] < len(_restore_sites) else ("-", 0, "-")


def _watch_loads(torch):
    """Puts _on_restore first in torch.serialization's registry, once (a priority below every entry's).  Without
    the registry (an older or a different torch) what torch.load restored stays unknown."""
    if _state.get("load_hook"):
        return
    try:
        ser = sys.modules.get("torch.serialization") or getattr(torch, "serialization", None)
        register = getattr(ser, "register_package", None)
        registry = getattr(ser, "_package_registry", None)
        if register is None or not isinstance(registry, list) or \
                not all(isinstance(e, tuple) and len(e) == 3 and type(e[0]) is int for e in registry):
            _say("no torch.serialization registry: what torch.load restored onto the GPU stays unknown")
            return
        register(min([e[0] for e in registry] + [0]) - 1, _restore_tag, _on_restore)
        _state["load_hook"] = True
    except Exception as e:
        _err("registering the checkpoint restore hook", e)


def _device_total(torch, device):
    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:
        pass
    try:
        return int(torch.cuda.mem_get_info(device)[1])
    except Exception:
        return 0


def _cap(torch, device, allowed):
    """(cap bytes, the setting) when set_per_process_memory_fraction caps the allocator: PyTorch
    hands its observer the allowed maximum instead of the device's total then."""
    try:
        total = _device_total(torch, device)
        allowed = int(allowed or 0)
        if total and 0 < allowed < total:
            return allowed, "torch.cuda.set_per_process_memory_fraction(%.3g)" % (allowed / float(total))
    except Exception:
        pass
    return 0, None


def _torch_dir(torch):
    try:
        return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    except Exception:
        return None


def measure_roles(torch, device, allocated, blocks=None, on_device=None, budget=None, frame_roots=True):
    """The failing device's allocated bytes by role (oomguard_roles.measure) on PyTorch's objects:
    the storages' sizes are the allocator's blocks when the snapshot was read (blocks, from
    _cache_view), else their bytes rounded up to PyTorch's 512.  None when not measured."""
    try:
        sizes = private = made_at = None
        if blocks is not None:
            sizes, private, made_at = blocks
        r = oomguard_roles.measure(torch, device, allocated, on_device=on_device, sizes=sizes, round_to=512,
                                   private=private, sites=made_at, budget=budget, frame_roots=frame_roots,
                                   restored=restored_storage if _state.get("load_hook") else None)
        if r is not None and "error" in r:
            _say("roles not measured: %s" % r["error"])
            return None
        if r is not None:
            _say("roles measured in %.1f ms over %d objects%s" % (r["elapsed_ms"], r["objects"],
                                                                  "" if r["complete"] else " (stopped at the budget)"))
        return r
    except Exception as e:
        _err("measuring the roles", e)
        return None


def report(device=None, alloc_size=None, use_snapshot=True, failed=False, allowed=None, frame=None, modes=True,
           exc=None, unwound=None):
    """Reads PyTorch's numbers for `device` and hands them to the shim.  Returns the shim's
    result (0), or None when nothing was reported (no shim, no torch, stats unreadable).
    Never raises.  Called by the out-of-memory observer (failed=True: PyTorch failed a request
    of alloc_size; allowed: the observer's third argument); callable by hand too.
    modes=False: the grad and autocast modes of this thread are not the failure's any more (the
    exception has left the `with` blocks that set them): reported as unknown."""
    try:
        torch = _torch()
        if torch is None or not oomguard_core.shim_present():
            return None
        stack = oomguard_core.python_stack(frame) if (failed or frame is not None) else None
        if device is None:
            device = torch.cuda.current_device()
        device = int(device)
        try:
            stats = torch.cuda.memory_stats(device)
        except Exception as e:
            _err("torch.cuda.memory_stats()", e)
            return None
        if not isinstance(stats, dict):
            return None
        allocated = stats.get("allocated_bytes.all.current")
        reserved = stats.get("reserved_bytes.all.current")
        if allocated is None or reserved is None:
            # without these two the numbers would claim an empty cache: report nothing
            _say("memory_stats() has no allocated/reserved bytes: nothing reported")
            return None
        largest, private, sites, blocks = (None, None, None, None)
        snapshot_path = None
        if use_snapshot:
            largest, private, sites, blocks = _cache_view(torch, device, alloc_size)
            if _last_snapshot is not None:
                snapshot_path = _save_snapshot(_last_snapshot)
        cap, cap_source = _cap(torch, device, allowed) if failed else (0, None)
        grad = _grad_mode(torch) if modes else 0
        roles = phase = None
        if failed or frame is not None:
            stmt = oomguard_phase.statement(frame, _torch_dir(torch)) if frame is not None else None
            measured = measure_roles(torch, device, allocated, blocks, frame_roots=unwound or True)
            if measured is not None and stmt:
                measured["statement"] = stmt
                measured["statement_model_device"] = _model_device_elsewhere(frame, stmt, torch, device)
            if measured is not None and frame is not None:
                # losses of several passes summed with their graphs alive (backward once on the sum)
                measured["accumulating"] = oomguard_phase.accumulation(frame, _torch_dir(torch))
            if measured is not None and _last_step_t is not None:
                # how long before the failure the latest optimizer step ended: growth after it is
                # one iteration building up, not memory kept across iterations
                measured["last_step_age"] = max(0.0, time.monotonic() - _last_step_t)
            if measured is not None:
                measured["steps"] = _steps_of(device)
            phase = oomguard_phase.encode(*oomguard_phase.detect(frame, grad, exc=exc, package_dir=_torch_dir(torch),
                                                                 stmt=stmt))
            if measured is not None:
                # which of this process's children are a DataLoader's workers (its other children hold memory of
                # their own work: a dask-cuda worker, a pool)
                measured["child_processes"] = oomguard_roles.child_processes()
            if measured is not None and frame is not None:
                # what the failing operation is (a loss over the vocabulary, an image decode): one table
                measured["operation"] = oomguard_phase.operation(frame)
            if measured is not None and phase[0] == "generation" and frame is not None:
                measured["num_beams"] = _num_beams(frame)
                measured["generation_input"] = _generation_input(frame, torch)
            # what the program's own code says (its batch, autocast around its work, its settings) is read on the
            # failing thread's stack; an autograd engine thread has no frame of the program, so the thread that
            # called backward() (the one that told the phase) is read instead
            code = oomguard_phase.backward_caller() if phase[2] == oomguard_phase.BACKWARD_CALLER else None
            code = code if code is not None else frame
            if measured is not None and frame is not None:
                measured["checkpointing"] = _checkpointing(frame, phase[0], grad, _torch_dir(torch))
                measured["failing_layer"] = _failing_layer(frame)
            if measured is not None and code is not None:
                measured["batch_size"] = (_batch_size(code, _torch_dir(torch), phase=phase[0],
                                                      module_type=getattr(getattr(torch, "nn", None), "Module", None)) or
                                          _input_batch(code, torch))
                measured["autocast_in_code"] = oomguard_phase.autocast_in_code(code)
                measured["backward_in_code"] = oomguard_phase.backward_in_code(code)
                measured["backward_on_stack"] = oomguard_phase.backward_on_stack(code)
                measured["input_requires_grad"] = _input_requires_grad(frame, torch)
                if measured["autocast_in_code"] and oomguard_phase.scaler_without_autocast(code):
                    # a GradScaler named, autocast nowhere in the program: not mixed precision entered
                    measured["autocast_in_code"], measured["scaler_without_autocast"] = None, True
                # settings of the program's own code that decide what the pass keeps (padding="max_length")
                measured["code_settings"] = oomguard_phase.code_settings(code)
            roles = oomguard_roles.encode(measured)
        phase = phase or (None, None, None)
        r = oomguard_core.send(
            "oom" if failed else "report", "pytorch", device,
            allocated_bytes=allocated, reserved_bytes=reserved,
            active_bytes=stats.get("active_bytes.all.current", 0),
            inactive_split_bytes=stats.get("inactive_split_bytes.all.current", 0),
            # 0 with a non-empty cache reads as "not measured" to the shim
            largest_free_block_bytes=largest or 0, private_pool_bytes=private or 0,
            num_alloc_retries=stats.get("num_alloc_retries", 0), num_ooms=stats.get("num_ooms", 0),
            allocator_settings=_allocator_settings(torch),
            source="torch %s" % (getattr(torch, "__version__", "?"),),
            snapshot_path=snapshot_path, framework="pytorch", api="torch.cuda.caching_allocator",
            requested_bytes=alloc_size, cap_bytes=cap, cap_source=cap_source,   # None: not given, unknown
            peak_bytes=stats.get("allocated_bytes.all.peak"),
            grad_enabled=grad, training=1 if _step_seen else 0,
            autocast=_autocast_mode(torch) if modes else 0, python_stack=stack, python_sites=sites,
            # all the caching allocator ever freed: a loop frees its temporaries every iteration,
            # one forward pass building up frees (almost) nothing; None (older torch) is unknown
            freed_bytes_total=stats.get("allocated_bytes.all.freed"),
            roles=roles, phase=phase[0], phase_frame=phase[1], phase_source=phase[2])
        _say("reported device %d: allocated %d, reserved %d, largest free block %s" %
             (device, allocated, reserved, largest))
        return r
    except Exception as e:
        _err("report", e)
        return None


def _num_beams(frame, limit=32):
    """The beam width of the generation running at the failure: an int local `num_beams` (a generate() or
    beam-search frame's argument or variable), or `generation_config.num_beams`, in the innermost frame that
    has one; None when no frame says.  Reads names only: nothing is called."""
    f, n = frame, 0
    while f is not None and n < limit:
        code = f.f_code
        try:
            if "num_beams" in code.co_varnames or "generation_config" in code.co_varnames:
                loc = f.f_locals
                v = loc.get("num_beams")
                if v is None:
                    v = getattr(loc.get("generation_config"), "num_beams", None)
                if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
                    return v
        except Exception:
            return None
        f, n = f.f_back, n + 1
    return None


# the names generate() gives its model input: Hugging Face's own (its argument `inputs`, its local `inputs_tensor`
# named by `model_input_name`) and the keyword inputs of its models, text first
_GENERATION_INPUTS = ("input_ids", "inputs_embeds", "pixel_values", "pixel_values_videos", "input_features",
                      "input_values", "inputs")
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08        # inspect's code flags, without importing inspect into the host


def _model_device_elsewhere(frame, stmt, torch, device, limit=64):
    """(GPU, name) of the models the failing statement reads by name, when it is another than the failing DEVICE: a
    torch.nn.Module a local (or global) of the statement's frame holds under one of the statement's names, whose first
    parameter is on a GPU; None when the statement names no such model, one on the failing device, models on several
    GPUs, or none on a GPU.  The statement then makes its tensor on a GPU its model is not on (device="cuda", the
    current device, for a model on cuda:1).  Reads names, modules' parameter dicts and tensors' devices: nothing of
    the program is called."""
    try:
        f, n = frame, 0
        while f is not None and n < limit and not (f.f_code.co_filename == stmt[0] and f.f_code.co_name == stmt[2]):
            f, n = f.f_back, n + 1
        module = getattr(getattr(torch, "nn", None), "Module", None)
        if f is None or not isinstance(module, type):
            return None
        loc = dict(oomguard_roles._frame_locals(f))
        gpus, named = set(), None
        for name in list(stmt[4])[:8]:
            v = loc[name] if name in loc else f.f_globals.get(name)
            if not issubclass(type(v), module):     # by the type: isinstance would read v.__class__
                continue
            first, todo, seen = None, [v], 0
            while todo and first is None and seen < 4096:   # the modules' own dicts, breadth first
                m = todo.pop(0)
                seen += 1
                d = getattr(m, "__dict__", None) or {}
                first = next((p for p in (d.get("_parameters") or {}).values() if p is not None), None)
                todo.extend(c for c in (d.get("_modules") or {}).values() if c is not None)
            if first is not None and first.is_cuda:
                gpus.add(int(first.get_device()))
                named = named or name
        if len(gpus) == 1 and int(device) not in gpus:
            return gpus.pop(), named
    except Exception:
        return None
    return None


def _outermost_method(frame, name, min_args=1, limit=64):
    """The outermost frame on the stack running a method called NAME (of at least MIN_ARGS arguments, self
    included) of a module (its `self` has parameters: the model the program called, not a layer inside it), and
    that frame's locals; (None, None) when there is none.  Reads frames and locals: nothing is called."""
    f, n, outer = frame, 0, None
    while f is not None and n < limit:
        code = f.f_code
        if code.co_name == name and code.co_argcount >= min_args and code.co_varnames[0] == "self":
            outer = f
        f, n = f.f_back, n + 1
    if outer is None:
        return None, None
    loc = dict(oomguard_roles._frame_locals(outer))
    return (outer, loc) if hasattr(loc.get("self"), "parameters") else (None, None)


def _generation_input(frame, torch, limit=64):
    """The input of the generate() call running at the failure: (name, shape) of the tensor the outermost frame
    named `generate` of a module (its `self` has parameters) was given, as Hugging Face's generate() names it:
    its local `inputs_tensor` (named by its local `model_input_name`), else its first tensor argument, else a
    tensor among its keyword arguments (**kwargs) under one of _GENERATION_INPUTS.  Batch first (generate's own
    convention): the leading dimension is how many inputs the call decodes at once.  None when no such frame
    holds a tensor of two dimensions or more.  Reads the frame's locals and the tensor's shape: nothing is
    called."""
    try:
        outer, loc = _outermost_method(frame, "generate", 1, limit)
        if outer is None:
            return None
        code = outer.f_code
        found = []
        t = loc.get("inputs_tensor")
        if isinstance(t, torch.Tensor):
            name = loc.get("model_input_name")
            found.append((name if isinstance(name, str) else "inputs_tensor", t))
        nargs = code.co_argcount + code.co_kwonlyargcount
        for name in code.co_varnames[1:nargs]:
            if isinstance(loc.get(name), torch.Tensor):
                found.append((name, loc[name]))
        if code.co_flags & _CO_VARKEYWORDS:
            kw = loc.get(code.co_varnames[nargs + (1 if code.co_flags & _CO_VARARGS else 0)])
            if isinstance(kw, dict):
                found.extend((k, kw[k]) for k in _GENERATION_INPUTS if isinstance(kw.get(k), torch.Tensor))
        for name, t in found:
            shape = tuple(int(d) for d in t.shape)
            if len(shape) >= 2:
                return name, shape[:6]
    except Exception:
        return None
    return None


def _failing_layer(frame, limit=64, least=4, spread=1.1):
    """Where in a stack of like layers the failing pass is: (name, index, count, alike) for the outermost module on the
    stack that is one of a run of LEAST or more modules of one class (a Swin's stages, not the blocks within one:
    the activations measured are all the pass made, before the stage too): the children of an nn.ModuleList or
    nn.Sequential (kept under the keys 0..n-1, as PyTorch stores them), named by the attribute a module on the stack
    holds the container under (a Sequential running its own children: by its class), or a module's children named
    one stem and the numbers of a range (setattr(self, "layer_%d" % i, ...): by the stem); None when the pass is in
    no such run (its head, its loss, an embedding before the layers) or no stack.  A Sequential of unlike modules
    (Linear, GELU, Linear) is no run of layers.  ALIKE: whether the run's first layer, the failing one and its last
    hold as many bytes of parameters (within SPREAD of each other: a T5's first block adds its small position bias),
    as the layers of a transformer do and a U-Net's encoder blocks or a Swin's stages (channels growing with depth)
    do not; None when a layer's parameters could not be read in full.  Reads the modules' `_modules` and
    `_parameters` dicts and the parameters' sizes: nothing of the program is called."""
    def like(kids):
        return len(kids) >= least and all(type(k) is type(kids[0]) for k in kids)

    def weight(module, budget=4096):
        """the bytes of a module's parameters, its submodules' included; None when not read in full"""
        total, todo, seen = 0, [module], 0
        while todo and seen < budget:
            d = getattr(todo.pop(), "__dict__", None) or {}
            seen += 1
            for p in (d.get("_parameters") or {}).values():
                n = oomguard_roles._nbytes(p) if p is not None else 0
                if n is None:
                    return None
                total += n
            todo.extend(c for c in (d.get("_modules") or {}).values() if c is not None)
        return None if todo else total

    def alike(kids, i):
        sizes = [weight(kids[j]) for j in (0, i, len(kids) - 1)]
        if any(w is None for w in sizes):
            return None
        return max(sizes) <= spread * min(sizes)

    def runs(mods, own):
        """(name, kids) of the runs among a module's children; OWN names the module's own numbered children"""
        if not isinstance(mods, dict):
            return
        keys = list(mods)
        if keys and keys == [str(i) for i in range(len(keys))]:
            if like(list(mods.values())):
                yield own, list(mods.values())
            return
        stems = {}
        for k in keys:
            m = _NUMBERED.match(k) if isinstance(k, str) else None
            if m:
                stems.setdefault(m.group(1), []).append((int(m.group(2)), mods[k]))
        for stem, numbered in stems.items():
            numbered.sort(key=lambda e: e[0])
            first = numbered[0][0]
            kids = [k for _, k in numbered]
            if first in (0, 1) and [n for n, _ in numbered] == list(range(first, first + len(kids))) and like(kids):
                yield stem.rstrip("_.") or stem, kids

    def find(kids, inner):
        for i, k in enumerate(kids):
            if any(k is m for m in inner):
                return i
        return None

    f, n, inner, where = frame, 0, [], None
    try:
        while f is not None and n < limit:
            code = f.f_code
            obj = (dict(oomguard_roles._frame_locals(f)).get("self")
                   if code.co_name == "forward" and "self" in code.co_varnames else None)
            mods = getattr(obj, "__dict__", {}).get("_modules") if obj is not None else None
            if isinstance(mods, dict):
                found = [(name, kids) for name, kids in runs(mods, type(obj).__name__)]
                for name, child in mods.items():
                    found += list(runs(getattr(child, "__dict__", {}).get("_modules"), str(name)))
                for name, kids in found:
                    i = find(kids, inner)
                    if i is not None:
                        where = (str(name), i, len(kids), alike(kids, i))
                        break
                inner.append(obj)
            f, n = f.f_back, n + 1
    except Exception:
        return None
    return where


# a child's name that numbers it within its kind: layer_3, block12, h.0 is not (a ModuleList's own key)
_NUMBERED = re.compile(r"^(.*?[^0-9])([0-9]+)$")


def _checkpointing(frame, phase, grad, torch_dir, limit=64):
    """Whether activation (gradient) checkpointing is in force for the layer that failed: True when a frame of
    torch.utils.checkpoint is on the stack (the failing layer runs under checkpoint()), or a module on the
    stack carries Hugging Face's flag `gradient_checkpointing` set True; False when a forward pass with
    autograd on fails inside a layer (a module whose forward runs inside another module's forward) with no
    checkpoint() frame and no such flag set True: every activation of the running layer is kept for backward;
    None otherwise (the model's own head or loss outside its layers, a backward pass, whose recomputation
    runs on the engine's threads, autograd off, no stack).  Reads attributes stored on the objects and their
    classes: no property or method is called."""
    f, n, flag, modules = frame, 0, None, 0
    ckpt = os.path.join("torch", "utils", "checkpoint.py")
    try:
        while f is not None and n < limit:
            if f.f_code.co_filename.endswith(ckpt):
                return True
            obj = (dict(oomguard_roles._frame_locals(f)).get("self")
                   if f.f_code.co_name == "forward" and "self" in f.f_code.co_varnames else None)
            if obj is not None and f.f_code.co_name == "forward" and hasattr(obj, "parameters"):
                modules += 1
                d = getattr(obj, "__dict__", None)
                v = d.get("gradient_checkpointing") if isinstance(d, dict) else None
                if v is None:
                    v = getattr(type(obj), "gradient_checkpointing", None)
                if v is True:
                    flag = True
            f, n = f.f_back, n + 1
    except Exception:
        return None
    if flag:
        return True
    if phase == "forward" and grad == 1 and modules >= 2:
        return False
    return None


# the names a program gives the batch one pass runs (its micro-batch): BATCH, batch_size, micro_batch_size,
# per_device_train_batch_size, train_micro_batch_size_per_gpu, PER_RANK_BATCH, ...; not a global, total,
# effective, maximum or count of batches.  Which pass's batch: a training pass's is not one named for
# evaluation (eval_batch_size, val_batch, test_bs); an evaluation's or a generation's is not one named for
# training (train_batch), so an evaluation's own batch is read where the program names both
# (MMDetection's and MMCV's configs name it data.samples_per_gpu, imgs_per_gpu before them)
_BATCH_NAME = re.compile(r"^(?:[a-z0-9]+_)*?(?:(?:micro_)?batch(?:_size)?(?:_per_(?:gpu|device|rank))?|"
                         r"(?:samples|imgs)_per_(?:gpu|device))$")
# the sections of a config where frameworks put the loader's batch: MMCV's cfg.data.samples_per_gpu, MMEngine's
# cfg.train_dataloader.batch_size; read one level further down than other objects
_BATCH_SECTIONS = frozenset(("data", "dataloader", "train_dataloader", "loader", "train_loader"))
_NOT_BATCH = re.compile(r"global|total|effective|max|min|num|accum")
_EVAL_BATCH = re.compile(r"eval|val|test|infer|pred")
_TRAIN_BATCH = re.compile(r"train")
_EVALUATING = frozenset(("evaluation", "generation"))


_CONFIG_NAMES = frozenset(("cfg", "config", "conf", "args", "hparams", "opt", "opts", "training_args", "params",
                           "settings", "hp"))


def _batch_value(name, v, evaluating=False):
    if not isinstance(name, str) or isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return None
    low = name.lower()
    if low == "batch" and not name.isupper():
        return None     # `batch` alone is the data or a loop's index (`for batch in range(n)`); BATCH a constant
    if not _BATCH_NAME.match(low) or _NOT_BATCH.search(low):
        return None
    return None if (_TRAIN_BATCH if evaluating else _EVAL_BATCH).search(low) else v


def _members(v):
    """A dict, or an object's attributes as one (not a module's, a class's or torch's own objects); None else."""
    inner = v if isinstance(v, dict) else getattr(v, "__dict__", None)
    if (not isinstance(inner, dict) or isinstance(v, (types.ModuleType, type)) or
            str(getattr(type(v), "__module__", "") or "").startswith("torch")):
        return None
    return inner


def _batch_in(ns, evaluating=False, skip=()):
    """An int named as a batch size in a namespace (a frame's locals or its module's globals), or in a dict or
    an object's attributes one level down (cfg["micro_batch_size"], args.per_device_train_batch_size), or in a
    config's loader section there (_BATCH_SECTIONS: cfg.data.samples_per_gpu).  No name in SKIP counts."""
    for k, v in list(ns.items())[:512]:
        b = _batch_value(k, v, evaluating) if k not in skip else None
        if b is not None:
            return b
    sections = []
    for k, v in list(ns.items())[:512]:
        if k in skip:
            continue
        try:
            inner = _members(v)
            if inner is None:
                continue
            for k2, v2 in list(inner.items())[:256]:
                b = _batch_value(k2, v2, evaluating)
                if b is not None:
                    return b
                if isinstance(k2, str) and k2 in _BATCH_SECTIONS and len(sections) < 16:
                    sections.append(v2)
        except Exception:
            continue
    for v in sections:
        try:
            for k3, v3 in list((_members(v) or {}).items())[:256]:
                b = _batch_value(k3, v3, evaluating)
                if b is not None:
                    return b
        except Exception:
            continue
    return None


_GLOBAL_READS = frozenset(("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"))
_reads_of = {}          # (code object, depth) -> the global names it reads (bounded: _READS_KEPT entries)
_READS_KEPT = 256


def _global_reads(code, depth=3):
    """The global names CODE reads (LOAD_GLOBAL, LOAD_NAME: not the ones it only stores, as a script's module
    code stores its constants), from its bytecode and, DEPTH levels down, that of the functions, lambdas and
    comprehensions defined in it; cached per code object and depth."""
    got = _reads_of.get((code, depth))
    if got is None:
        names = set(i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_READS)
        for c in code.co_consts if depth > 0 else ():
            if isinstance(c, types.CodeType):
                names |= _global_reads(c, depth - 1)
        got = frozenset(names)
        if len(_reads_of) >= _READS_KEPT:
            _reads_of.clear()
        _reads_of[(code, depth)] = got
    return got


def _module_reads(ns, limit=1024):
    """The global names the functions of the module whose namespace is NS read (its functions and the methods of
    its classes; not its module-level code, which defines the constants)."""
    names = set()
    for v in list(ns.values())[:limit]:
        fns = (v,) if isinstance(v, types.FunctionType) else \
            tuple(vars(v).values()) if isinstance(v, type) and getattr(v, "__module__", None) == ns.get("__name__") \
            else ()
        for f in fns[:256]:
            f = getattr(f, "__func__", f)          # a staticmethod's or classmethod's function
            if isinstance(f, types.FunctionType) and f.__globals__ is ns:
                names |= _global_reads(f.__code__)
    return names


_CO_GENERATOR = 0x20       # inspect.CO_GENERATOR, without importing inspect into the host


def _generator_reads(ns, names, limit=64):
    """The global names read by the generator functions of the module whose namespace is NS that a running frame
    reads by one of NAMES: a loop's batches come from the generator it iterates (`for batch in packed_batches(n)`),
    whose frame is suspended, not running, while the pass runs, so the batch size it reads is the running loop's."""
    got = set()
    for name in list(names)[:limit]:
        f = ns.get(name)
        if isinstance(f, types.FunctionType) and f.__globals__ is ns and f.__code__.co_flags & _CO_GENERATOR:
            got |= _global_reads(f.__code__)
    return got


def _batch_size(frame, torch_dir, limit=64, phase=None, module_type=None):
    """The batch the failing pass runs, as the program names it: an int named as a batch size (see _BATCH_NAME)
    among the locals of the program's innermost frame that has one, or its module's globals, or one level
    down in a dict or an object there (a config: a local is read when its name is a config's, _CONFIG_NAMES);
    in an evaluation or a generation (PHASE) a name for training's batch is not that pass's, in another phase a
    name for evaluation's is not; None when no name says.  A module's global read only by functions of the module
    that are not running, and by none that is, is theirs: a script's BATCH_SIZE = 8 read by its training loop is not
    the batch of a validation pass whose code never reads it (a constant no function reads is the program's
    word, and counts); what a generator a running frame calls reads is that frame's (see _generator_reads).  The
    locals of a module's own code (a frame whose `self` is a MODULE_TYPE) are read last, where nothing else names
    the batch: a module deep in a model names its own batch (a window attention's batch_size is the inputs times
    their windows).  Reads names and bytecode only: nothing is called.  Frames of
    torch and of this adapter are skipped."""
    evaluating = phase in _EVALUATING
    f, n, mine = frame, 0, []
    own = os.path.dirname(os.path.abspath(__file__))
    try:
        while f is not None and n < limit:
            path = os.path.abspath(f.f_code.co_filename)
            if not (torch_dir and path.startswith(torch_dir)) and not path.startswith(own + os.sep):
                mine.append(f)
            f, n = f.f_back, n + 1
        read = {}       # a module's globals -> the names its running frames read (a module's own code: only its
        for f in mine:  # statements, not the functions it defines, which run or not on their own)
            deep = 0 if f.f_code.co_name == "<module>" else 3
            names = _global_reads(f.f_code, deep)
            read.setdefault(id(f.f_globals), set()).update(names, _generator_reads(f.f_globals, names))
        seen = set()
        later = []
        for f in mine:
            # a frame's locals are read (without leaving them on the frame) only where one of its variable
            # names is a batch's or a config's
            names = f.f_code.co_varnames
            b = None
            if any(_batch_value(v, 1, evaluating) or v in _CONFIG_NAMES for v in names):
                loc = dict(oomguard_roles._frame_locals(f))
                if names[:1] == ("self",) and module_type is not None and issubclass(type(loc.get("self")), module_type):
                    later.append(_batch_in(loc, evaluating))
                else:
                    b = _batch_in(loc, evaluating)
                loc = None
            if b is None and id(f.f_globals) not in seen:
                seen.add(id(f.f_globals))
                b = _batch_in(f.f_globals, evaluating, _module_reads(f.f_globals) - read[id(f.f_globals)])
            if b is not None:
                return b
        return next((b for b in later if b is not None), None)
    except Exception:
        return None
    return None


def _outer_inputs(frame, torch, limit=64):
    """The tensor arguments of the outermost module's forward on the stack (the model the program called), in the
    order of its parameters; () when none.  Reads the frame's argument values: nothing is called."""
    outer, loc = _outermost_method(frame, "forward", 2, limit)
    if outer is None:
        return ()
    code = outer.f_code
    return tuple(loc[name] for name in code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]
                 if isinstance(loc.get(name), torch.Tensor))


def _input_batch(frame, torch, limit=64):
    """A batch of one read from the input itself, where no name says the batch: the first tensor argument of the
    outermost module's forward on the stack (the model the program called) with two or more dimensions and a
    leading one of 1 (a single track, image, document or graph).  1 or None: a larger leading dimension may be a
    sequence's length (a time-major layout), so only a batch of one is read this way.  Reads the frame's argument
    values and their shapes: nothing is called."""
    try:
        for v in _outer_inputs(frame, torch, limit)[:1]:
            shape = tuple(v.shape)
            return 1 if len(shape) >= 2 and shape[0] == 1 else None
    except Exception:
        return None
    return None


def _input_requires_grad(frame, torch, limit=64):
    """True when a tensor argument of the outermost module's forward on the stack requires grad and is no parameter:
    the program asks for the gradient of the model's input (a saliency map, integrated gradients, an adversarial
    example, an inverted image), so the pass needs autograd whatever mode the model is in; None otherwise.  Reads
    the tensors' flags: nothing is called."""
    try:
        param = getattr(getattr(torch, "nn", None), "Parameter", ())
        for v in _outer_inputs(frame, torch, limit):
            if getattr(v, "requires_grad", False) is True and not isinstance(v, param):
                return True
    except Exception:
        return None
    return None


def _observer(device, alloc, device_total, device_free):
    """torch._C._cuda_attach_out_of_memory_observer callback."""
    if getattr(_in_observer, "busy", False):
        return
    _in_observer.busy = True
    try:
        try:
            frame = sys._getframe(1)
        except ValueError:      # called from C++ on a thread that runs no Python (PyTorch's autograd engine)
            frame = None
        report(device, alloc, failed=True, allowed=device_total, frame=frame)
    except Exception:
        pass
    finally:
        _in_observer.busy = False


# ---------------------------------------------------------------------------- the excepthook fallback

def _is_oom(torch, exc):
    kinds = []
    for owner in (torch, getattr(torch, "cuda", None)):
        k = getattr(owner, "OutOfMemoryError", None)
        if isinstance(k, type):
            kinds.append(k)
    seen = 0
    while exc is not None and seen < 16:
        if kinds and isinstance(exc, tuple(kinds)):
            return True
        if type(exc).__name__ == "OutOfMemoryError":
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _excepthook(etype, value, tb):
    try:
        torch = _torch()
        if torch is not None and _is_oom(torch, value):
            frame, frames, t = None, [], tb
            while t is not None:               # the innermost frame: where the error was raised
                frame, t = t.tb_frame, t.tb_next
                frames.append(frame)           # outermost first: the unwound stack, its locals alive
            # "report": the failure is the driver's, already dumped (an observer-less backend)
            report(None, None, use_snapshot=False, frame=frame, modes=False, exc=value, unwound=frames)
            del frames[:]
    except Exception:
        pass
    prev = _state.get("prev_excepthook") or sys.__excepthook__
    return prev(etype, value, tb)


def _install_excepthook(why):
    if sys.excepthook is _excepthook:
        return
    _state["prev_excepthook"] = sys.excepthook
    sys.excepthook = _excepthook
    _state["attached"] = "excepthook"
    _say("%s: reporting from sys.excepthook on an uncaught out-of-memory error" % why)


# ---------------------------------------------------------------------------- attaching

def _attach():
    """Runs once CUDA is initialised (queued with torch.cuda._lazy_call).  Must never raise:
    PyTorch turns an exception here into DeferredCudaCallError at the program's first CUDA use."""
    try:
        with _lock:
            if _state["attached"]:
                return
            torch = _torch()
            if torch is None:
                return
            backend = _allocator_backend(torch)
            if backend == "cudaMallocAsync":
                _install_excepthook("backend:cudaMallocAsync has no out-of-memory observer")
                return
            attach = getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None)
            if attach is None:
                _install_excepthook("this torch has no _cuda_attach_out_of_memory_observer")
                return
            try:
                ndev = int(torch.cuda.device_count())
            except Exception:
                ndev = 1
            if _version_tuple(getattr(torch, "__version__", "0")) < (2, 2) and ndev > 1:
                # Before 2.2 the observer was registered on the current device only (2.0), or
                # moved into the first device's allocator and left empty for the others (2.1):
                # an out-of-memory error on another device could then turn into a C++
                # bad_function_call.  Do not risk it.
                _install_excepthook("torch %s with %d devices" % (torch.__version__, ndev))
                return
            attach(_observer)
            _state["attached"] = "observer"
            _record_history(torch)
            _say("out-of-memory observer attached (torch %s)" % (getattr(torch, "__version__", "?"),))
    except Exception as e:
        _err("attaching", e)


_HISTORY_ENTRIES = 10000


def _record_history(torch):
    """OOMGUARD_PYTHON_STACKS=1: PyTorch keeps the Python traceback of every live block (and a
    ring of the last _HISTORY_ENTRIES allocation events), so the dump can name the lines that
    hold the memory.  This costs per allocation (docs/python-adapters.md gives the figure)."""
    if not oomguard_core.truthy("OOMGUARD_PYTHON_STACKS"):
        return
    try:
        rec = torch.cuda.memory._record_memory_history
    except Exception as e:
        _err("finding torch.cuda.memory._record_memory_history", e)
        return
    try:
        rec(enabled="all", context="alloc", stacks="python", max_entries=_HISTORY_ENTRIES)
    except TypeError:                    # torch 2.0 spelled it differently
        try:
            rec(True, record_context=True, trace_alloc_max_entries=_HISTORY_ENTRIES)
        except Exception as e:
            _err("torch.cuda.memory._record_memory_history", e)
            return
    except Exception as e:
        _err("torch.cuda.memory._record_memory_history", e)
        return
    _state["history"] = True
    _say("allocation history on (OOMGUARD_PYTHON_STACKS=1, %d entries)" % _HISTORY_ENTRIES)


def _refresh(device):
    """The shim asks for fresh numbers (`oomguard snapshot`), through the interpreter's pending
    call: reported like report(), without the allocator snapshot (a snapshot must not hold the
    program up); never the first CUDA call of the process."""
    torch = _torch()
    is_init = getattr(getattr(torch, "cuda", None), "is_initialized", None)
    if torch is None or is_init is None or not is_init():
        return None
    return report(device=device, use_snapshot=False, modes=False)


def _holdings(device):
    """What PyTorch's caching allocator holds on `device` when another framework of the process
    fails: reserved and allocated bytes; None before CUDA is initialised (never the first call)."""
    torch = _torch()
    is_init = getattr(getattr(torch, "cuda", None), "is_initialized", None)
    if torch is None or is_init is None or not is_init():
        return None
    stats = torch.cuda.memory_stats(device)
    reserved = stats.get("reserved_bytes.all.current") if isinstance(stats, dict) else None
    return (reserved, stats.get("allocated_bytes.all.current"), None) if reserved else None


def install():
    """Attaches to the imported torch module (idempotent).  Deferred to CUDA initialisation; a
    no-op without the shim or without torch.  Returns True when attached or queued."""
    try:
        with _lock:
            if _state["installed"]:
                return True
            if not oomguard_core.shim_present():
                return False
            torch = _torch()
            if torch is None or not hasattr(torch, "cuda"):
                return False
            _state["installed"] = True
            oomguard_core.on_refresh(_refresh)
            oomguard_core.on_holdings(WHO, _holdings)
            _watch_optimizers(torch)
            _watch_loads(torch)
            cuda = torch.cuda
            is_init = getattr(cuda, "is_initialized", None)
            if is_init is not None and is_init():
                _attach()
                return True
            lazy_call = getattr(cuda, "_lazy_call", None)
            if lazy_call is None:
                _install_excepthook("no torch.cuda._lazy_call")
                return True
            lazy_call(_attach)
            _state["queued"] = True
            _say("waiting for CUDA initialisation")
            return True
    except Exception as e:
        _err("install", e)
        return False


def is_attached():
    """None, "observer" or "excepthook"."""
    return _state["attached"]


# torch was imported before this module (the adapter imported by hand, late): optimizers may have stepped already
_TORCH_BEFORE_ADAPTER = "torch" in sys.modules

# install() once torch is imported (oomguard_core.after_import: a sys.meta_path finder that notices
# `import torch` finishing), at once if it already is; nothing without the shim
activate = oomguard_core.activation(WHO, "torch", install)
activate()
