"""oomguard's JAX adapter: when XLA raises RESOURCE_EXHAUSTED (its BFC allocator could not serve
a request, usually inside the arena it preallocated), hands liboomguard the framework's numbers
-- jax.Device.memory_stats() -- and the settings in force, so the shim writes a full dump even
though no driver call failed, and can tell the arena's cap, its live arrays and its free but
unusable pieces apart.

Loaded at start-up by sitecustomize.py (plain LD_PRELOAD or `oomguard run`), or by hand:

    import oomguard_jax

No hard dependency: it waits for `import jax`, then wraps the __init__ of JAX's runtime error
class (jax.errors.JaxRuntimeError / jaxlib's XlaRuntimeError), so it learns of the failure on
the failing thread, at the failure, whether the program catches the error or not.  Nothing runs
per allocation.  Without liboomguard preloaded it does nothing.  Never raises into the program.
`oomguard snapshot` gets the same memory_stats() afresh, once JAX's backends are up.
See docs/python-adapters.md.
"""
import os
import re
import sys

import oomguard_core as _core
import oomguard_phase
import oomguard_roles

__all__ = ["activate", "install", "report", "is_attached"]

WHO = "jax"
API = "xla.bfc_allocator"
# the request in XLA's RESOURCE_EXHAUSTED texts, in bytes: "... while trying to allocate N bytes" (older jaxlibs),
# "... allocating N bytes", the BFC allocator's "(rounded to N)", PJRT's "request for 256.00MiB (NB)"
_REQ = (re.compile(r"allocat(?:e|ing)\s+([0-9][0-9,]*)\s*bytes"), re.compile(r"rounded to ([0-9][0-9,]*)\)"),
        re.compile(r"\(([0-9][0-9,]*)B\)"))
# or in XLA's units alone (jax 0.5+, read on jax 0.11: "Out of memory while trying to allocate 256.00MiB with
# allocator GPU_0_bfc"): the size at the two decimals printed, within 0.5% of the request
_REQ_UNITS = re.compile(r"allocat(?:e|ing)\s+([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB|PiB|EiB)\b")
_UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5, "EiB": 6}


def request_of(text):
    """The request's bytes in an out-of-memory text of XLA's, or None when it says none."""
    for pat in _REQ:
        m = pat.search(text)
        if m:
            return int(m.group(1).replace(",", ""))
    m = _REQ_UNITS.search(text)
    if m:
        return int(round(float(m.group(1)) * 1024 ** _UNITS[m.group(2)]))
    return None


def _jax():
    return sys.modules.get("jax")


def _error_classes(jax):
    out = []
    for owner, name in ((getattr(jax, "errors", None), "JaxRuntimeError"),
                        (getattr(jax, "errors", None), "XlaRuntimeError")):
        cls = getattr(owner, name, None) if owner is not None else None
        if isinstance(cls, type) and cls not in out:
            out.append(cls)
    try:
        from jax._src.lib import xla_extension  # the real jaxlib's home of XlaRuntimeError
        cls = getattr(xla_extension, "XlaRuntimeError", None)
        if isinstance(cls, type) and cls not in out:
            out.append(cls)
    except Exception:
        pass
    return out


def _settings():
    s = _core.settings_from_env(("XLA_PYTHON_CLIENT_",), ("TF_FORCE_GPU_ALLOW_GROWTH", "XLA_FLAGS"))
    if "XLA_PYTHON_CLIENT_PREALLOCATE" not in s:
        s += "%sXLA_PYTHON_CLIENT_PREALLOCATE=true (default)" % ("," if s else "")
    return s


def _cap_source(stats):
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower() == "platform":
        return None
    # (PREALLOCATE only decides whether the arena is taken at once or grown up to the same cap;
    # it is in allocator_settings)
    frac = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    return "XLA_PYTHON_CLIENT_MEM_FRACTION=%s" % frac if frac else "XLA_PYTHON_CLIENT_MEM_FRACTION=0.75 (default)"


def _ordinal(dev):
    for attr in ("local_hardware_id", "id"):
        v = getattr(dev, attr, None)
        if isinstance(v, int) and v >= 0:
            return v
    return 0


def _gpu_devices(jax):
    try:
        devs = jax.local_devices()
    except Exception:
        try:
            devs = jax.devices()
        except Exception:
            return []
    return [d for d in devs if str(getattr(d, "platform", "")).lower() in ("gpu", "cuda", "rocm")]


def _pick(devs, request):
    """The device the request failed on: XLA's message does not say, so the one it cannot fit on
    (its arena's largest free block is smaller than the request), else the first."""
    best = None
    for d in devs:
        try:
            st = d.memory_stats() or {}
        except Exception:
            continue
        if best is None:
            best = (d, st)
        free = st.get("largest_free_block_bytes")
        if free is None:
            free = st.get("bytes_limit", 0) - st.get("bytes_in_use", 0)
        if request and free < request:
            return d, st
    return best if best else (None, None)


def _array_bytes_on(dev):
    """storage(a) for oomguard_roles.measure_arrays: (buffer key, bytes) of array a's part on dev
    (its shard there for a sharded array), or None."""
    def storage(a):
        try:
            if a.is_deleted():
                return None
        except Exception:
            pass
        shards = getattr(a, "addressable_shards", None)
        if shards is not None:
            for sh in shards:
                if sh.device == dev:
                    data = sh.data
                    try:
                        key = data.unsafe_buffer_pointer()
                    except Exception:
                        key = ("array", id(data))
                    return key, int(data.nbytes)
            return None
        devs = a.devices()
        if dev in devs and len(devs) == 1:
            return ("array", id(a)), int(a.nbytes)
        return None
    return storage


def _roles(jax, dev, allocated):
    """memory.framework.roles for JAX: the live arrays on dev (jax.live_arrays()) and who holds
    them; what they are for (parameters, optimizer state) stays unknown.  None if not told."""
    try:
        live = getattr(jax, "live_arrays", None)
        arr_type = getattr(jax, "Array", None)
        if live is None or not isinstance(arr_type, type):
            return None
        r = oomguard_roles.measure_arrays(jax, arr_type, live(), allocated, _array_bytes_on(dev))
        if r is not None and "error" in r:
            _core.say(WHO, "roles not measured: %s" % r["error"])
            return None
        return oomguard_roles.encode(r)
    except Exception as e:
        _core.err(WHO, "measuring the roles", e)
        return None


def _numbers(jax, dev, st):
    """send()'s keywords for device dev's memory_stats() st: what a failure and a refresh report."""
    in_use = st.get("bytes_in_use", 0)
    limit = st.get("bytes_limit", 0)
    # what XLA holds from the driver: its pool (the preallocated arena), else what it reserved
    reserved = st.get("pool_bytes") or st.get("bytes_reserved") or in_use
    cap_source = _cap_source(st) if limit else None
    return dict(device=_ordinal(dev), allocated_bytes=in_use, reserved_bytes=max(reserved, in_use), active_bytes=in_use,
                largest_free_block_bytes=st.get("largest_free_block_bytes", 0), allocator_settings=_settings(),
                source="jax %s" % (getattr(jax, "__version__", "?"),), framework="jax", api=API,
                cap_bytes=limit if cap_source else 0, cap_source=cap_source, peak_bytes=st.get("peak_bytes_in_use"))


def report(exc=None, request=None, stack=None):
    """Hands the shim JAX's numbers for a RESOURCE_EXHAUSTED failure (exc, or by hand).  Returns
    the shim's result or None.  Never raises."""
    try:
        jax = _jax()
        if jax is None or not _core.shim_present():
            return None
        if request is None and exc is not None:
            request = request_of(str(exc))   # not in the message: unknown
        dev, st = _pick(_gpu_devices(jax), request or 0)
        if dev is None or not isinstance(st, dict):
            _core.say(WHO, "no GPU device with memory_stats(): nothing reported")
            return None
        kw = _numbers(jax, dev, st)
        roles = _roles(jax, dev, kw["allocated_bytes"])
        try:
            pkg = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
        except Exception:
            pkg = None
        phase = oomguard_phase.encode(*oomguard_phase.detect(sys._getframe(1), 0, exc=exc, package_dir=pkg))
        return _core.send(
            "oom", WHO, kw.pop("device"), num_ooms=1, requested_bytes=request,
            python_stack=stack if stack is not None else _core.python_stack(),
            roles=roles, phase=phase[0], phase_frame=phase[1], phase_source=phase[2], **kw)
    except Exception as e:
        _core.err(WHO, "report", e)
        return None


def _backends_up(jax):
    """Has JAX initialised its backends (the XLA clients, which take the arena)?  Read from
    jax._src.xla_bridge without calling anything that would initialise them; False when this
    JAX does not tell."""
    xb = sys.modules.get("jax._src.xla_bridge")
    up = getattr(xb, "backends_are_initialized", None)
    if callable(up):
        return bool(up())
    return bool(getattr(xb, "_backends", None))


def _read(jax, device):
    """The refresh (`oomguard snapshot`): memory_stats() of the device the shim asks for, as a
    failure reports them; no roles (a scan of the heap, which a snapshot must not wait for)."""
    for dev in _gpu_devices(jax):
        if _ordinal(dev) == device:
            st = dev.memory_stats()
            return _numbers(jax, dev, st) if isinstance(st, dict) else None
    return None


def _holdings(device):
    """What XLA holds on `device` when another framework of the process fails: its pool (the
    preallocated arena) or what it reserved, bytes in use and its limit; None before its backends
    are up (asking then would take the arena)."""
    jax = _jax()
    if jax is None or not _backends_up(jax):
        return None
    kw = _read(jax, device)
    if not kw:
        return None
    return kw["reserved_bytes"], kw["allocated_bytes"], kw["cap_bytes"] or None


def _on_error(exc, args, kwargs):
    # XLA's runtime errors carry their status as text; only RESOURCE_EXHAUSTED is ours
    msg = str(args[0]) if args else str(exc)
    if "RESOURCE_EXHAUSTED" not in msg:
        return
    report(exc, stack=_core.python_stack())


_adapter = _core.ExceptionAdapter(WHO, "jax", _error_classes, _on_error, "JaxRuntimeError/XlaRuntimeError class",
                                  refresh=(_backends_up, _read))
install, activate, is_attached = _adapter.install, _adapter.activate, _adapter.is_attached
_core.on_holdings(WHO, _holdings)

activate()
