"""oomguard's CuPy adapter: when CuPy's memory pool raises OutOfMemoryError -- its own limit
(MemoryPool.set_limit, CUPY_GPU_MEMORY_LIMIT) refused the request, or cudaMalloc failed even
after the pool freed its free blocks -- hands liboomguard the pool's numbers
(used_bytes/total_bytes/free_bytes/n_free_blocks, the limit) so the shim writes a full dump, with
the request and the cap, even when no driver call failed.

Loaded at start-up by sitecustomize.py (plain LD_PRELOAD or `oomguard run`), or by hand:

    import oomguard_cupy

No hard dependency: it waits for `import cupy`, then wraps OutOfMemoryError.__init__, so it
learns of the failure on the failing thread whether the program catches it or not.  Nothing runs
per allocation.

CuPy raises the error while it holds its pool's lock.  Asking the pool from there could wait on
a lock that another thread holds while it waits for this one, so the failing thread only records
what the error itself says (size, total, limit) and its Python stack, and a short-lived helper
thread, which holds nothing, reads the pool once the lock is free and hands everything over.
The helper is not a daemon: a program that dies of the error still gets its dump.
`oomguard snapshot` gets the pool's numbers afresh the same way (a helper thread, waited for a
bounded time), on a device whose pool the adapter read before.
See docs/python-adapters.md.
"""
import os
import sys
import threading

import oomguard_core as _core

__all__ = ["activate", "install", "report", "is_attached"]

WHO = "cupy"
API = "cupy.cuda.MemoryPool"
_helpers = []       # the report threads of the latest errors (flush() waits for them)
_devices = set()    # the devices whose pool was read (CuPy has used them)
_REFRESH_WAIT_S = 0.25


def _cupy():
    return sys.modules.get("cupy")


def _cap_source(limit):
    env = os.environ.get("CUPY_GPU_MEMORY_LIMIT", "").strip()
    if env:
        return "CUPY_GPU_MEMORY_LIMIT=%s" % env
    return "cupy.get_default_memory_pool().set_limit(size=%d)" % limit


def _numbers(cupy, device, limit=None):
    """send()'s keywords for the default pool of `device`: what a failure and a refresh report.
    Asks the pool, so it must not run while this thread holds the pool's lock (see above)."""
    pool = cupy.get_default_memory_pool()
    prev = cupy.cuda.runtime.getDevice()
    try:
        if prev != device:
            cupy.cuda.runtime.setDevice(device)     # the pool answers for the current device
        used = pool.used_bytes()
        reserved = pool.total_bytes()
        free = pool.free_bytes()
        nfree = pool.n_free_blocks()
        if limit is None:
            limit = pool.get_limit()
    finally:
        if prev != device:
            cupy.cuda.runtime.setDevice(prev)
    _devices.add(device)
    # CuPy has no public "largest free block"; with one free block it is that block
    largest = free if nfree == 1 else 0
    return dict(allocated_bytes=used, reserved_bytes=max(reserved, used), active_bytes=used,
                largest_free_block_bytes=largest, allocator_settings=_core.settings_from_env(("CUPY_",)),
                source="cupy %s" % (getattr(cupy, "__version__", "?"),), framework="cupy", api=API,
                cap_bytes=limit or 0, cap_source=_cap_source(limit) if limit else None)


def report(device=None, request=None, total=None, limit=None, stack=None):
    """Reads the default pool (the current device's) and hands it to the shim as a failure of
    `request` bytes (None: not known).  Must not run while the pool's lock is held by this thread (see above).
    Returns the shim's result or None.  Never raises."""
    try:
        cupy = _cupy()
        if cupy is None or not _core.shim_present():
            return None
        if device is None:
            device = cupy.cuda.runtime.getDevice()
        kw = _numbers(cupy, device, limit)
        return _core.send("oom", WHO, device, num_ooms=1, requested_bytes=request, python_stack=stack, **kw)
    except Exception as e:
        _core.err(WHO, "report", e)
        return None


def _used(cupy):
    """CuPy tells no "CUDA initialised", and every question to its pool begins with a CUDA call
    (the current device): the pool is asked afresh only on a device it was read on before."""
    return bool(_devices)


def _read(cupy, device):
    """The refresh (`oomguard snapshot`), on the interpreter's main thread, which may be inside
    the pool with its lock held: a helper thread reads the pool, waited for at most
    _REFRESH_WAIT_S, else nothing is reported (the snapshot says its numbers are old)."""
    if device not in _devices:
        return None
    return _read_bounded(cupy, device)


def _holdings(device):
    """What CuPy's default pool holds on `device` when another framework of the process fails
    (a RAPIDS step's freed blocks kept cached next to PyTorch): reserved, in use, its limit; None
    when the pool holds nothing there.  Only a device the pool was read on, or the thread's
    current one (asking another could create a context there); read by a helper thread, bounded,
    as a refresh is."""
    cupy = _cupy()
    if cupy is None:
        return None
    if device not in _devices and cupy.cuda.runtime.getDevice() != device:
        return None
    kw = _read_bounded(cupy, device)
    if not kw or not kw["reserved_bytes"]:
        return None
    return kw["reserved_bytes"], kw["allocated_bytes"], kw["cap_bytes"] or None


def _read_bounded(cupy, device):
    """_numbers(device) read by a helper thread (this thread may hold the pool's lock), waited for
    at most _REFRESH_WAIT_S; None when it did not answer in time."""
    got = {}

    def read():
        try:
            cupy.cuda.runtime.setDevice(device)
            got["kw"] = _numbers(cupy, device)
        except Exception as e:
            _core.err(WHO, "reading the pool", e)

    t = threading.Thread(target=read, name="oomguard-cupy-refresh")
    t.daemon = True
    t.start()
    t.join(_REFRESH_WAIT_S)
    return got.get("kw")


def _helper(device, **kw):
    try:
        # this thread's CUDA device is the failing one, so the shim can measure the device too
        _cupy().cuda.runtime.setDevice(device)
    except Exception:
        pass
    report(device, **kw)


def _on_oom(exc, args, kwargs):
    names = ("size", "total", "limit")
    vals = dict(zip(names, args))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    cupy = _cupy()
    try:
        device = cupy.cuda.runtime.getDevice() if cupy is not None else 0
    except Exception:
        device = 0
    stack = _core.python_stack()
    t = threading.Thread(target=_helper, name="oomguard-cupy-report",
                         kwargs={"device": device, "request": None if vals.get("size") is None else int(vals["size"]),
                                 "limit": int(vals.get("limit") or 0) or None, "stack": stack})
    t.daemon = False
    _helpers.append(t)
    del _helpers[:-8]
    t.start()


def flush(timeout=5.0):
    """Waits until the reports of earlier errors are handed over (for tests and programs that
    want the dump before they go on)."""
    for t in list(_helpers):
        t.join(timeout)


_adapter = _core.ExceptionAdapter(
    WHO, "cupy", lambda cupy: _core.attr_class(cupy, "cuda", "memory", "OutOfMemoryError"), _on_oom,
    "cupy.cuda.memory.OutOfMemoryError", refresh=(_used, _read))
install, activate, is_attached = _adapter.install, _adapter.activate, _adapter.is_attached
_core.on_holdings(WHO, _holdings)

activate()
