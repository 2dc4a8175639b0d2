"""oomguard's TensorFlow adapter: when TensorFlow raises ResourceExhaustedError ("OOM when
allocating tensor ... by allocator GPU_N_bfc"), usually inside the arena its BFC allocator took
at start-up, hands liboomguard what TensorFlow knows -- tf.config.experimental.get_memory_info()
(current and peak bytes), the request (from the tensor's shape and type), the memory limit of
the logical device and the settings in force (TF_FORCE_GPU_ALLOW_GROWTH, TF_GPU_ALLOCATOR) -- so
the shim writes a full dump although no driver call failed.

Loaded at start-up by sitecustomize.py (plain LD_PRELOAD or `oomguard run`), or by hand:

    import oomguard_tf

Like the JAX adapter it waits for `import tensorflow` and wraps ResourceExhaustedError.__init__
(TensorFlow creates it in Python, after the failed op returned: no allocator lock is held).
TensorFlow publishes neither its arena's size nor its largest free block.  The adapter hands in
a floor (the limit when the arena was taken at start-up without memory growth, else the bytes in
use) flagged OOMGUARD_FW_RESERVED_BY_LEDGER: the shim's ledger, which saw every chunk the BFC
allocator took from the driver, counts the arena; the fragmented part of it stays unmeasured.
Never raises into the program.  `oomguard
snapshot` gets the same numbers afresh, once TensorFlow's eager context is initialised.
See docs/python-adapters.md.
"""
import os
import re
import sys

import oomguard_core as _core

__all__ = ["activate", "install", "report", "is_attached"]

WHO = "tensorflow"
API = "tensorflow.bfc_allocator"
_SIZES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
          "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8, "bool": 1, "complex64": 8}
_SHAPE = re.compile(r"shape\s*\[([0-9, ]*)\]\s*and\s+type\s+(\w+)")
_DEVICE = re.compile(r"device:GPU:(\d+)")


def _tf():
    return sys.modules.get("tensorflow")


def _request(msg):
    m = _SHAPE.search(msg)
    if not m or m.group(2) not in _SIZES:
        return None                      # the message does not say: unknown, not a request of 0 bytes
    n = 1
    for part in m.group(1).split(","):
        if part.strip():
            n *= int(part)
    return n * _SIZES[m.group(2)]


def _growth(tf, gpu):
    if os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "").strip().lower() == "true":
        return True
    try:
        return bool(tf.config.experimental.get_memory_growth(gpu))
    except Exception:
        return None


def _memory_info(tf, device):
    """{"current", "peak"} of GPU:device: get_memory_info() (TensorFlow 2.5+), else the current
    bytes alone from get_memory_usage() (2.4, peak unknown: None), else None."""
    exp = tf.config.experimental
    name = "GPU:%d" % device
    get = getattr(exp, "get_memory_info", None)
    if get is not None:
        info = get(name)
        return {"current": int(info.get("current", 0)), "peak": int(info.get("peak", 0))}
    usage = getattr(exp, "get_memory_usage", None)
    return {"current": int(usage(name)), "peak": None} if usage is not None else None


def _numbers(tf, device):
    """send()'s keywords for GPU:device: what a failure and a refresh report; None when this
    TensorFlow tells no memory numbers."""
    info = _memory_info(tf, device)
    if info is None:
        return None
    current = info["current"]
    cap, cap_source, gpu = 0, None, None
    try:
        gpu = tf.config.list_physical_devices("GPU")[device]
        logical = tf.config.get_logical_device_configuration(gpu)
        if logical and getattr(logical[0], "memory_limit", None):
            cap = int(logical[0].memory_limit) << 20
            cap_source = "tf.config.set_logical_device_configuration(memory_limit=%d)" % logical[0].memory_limit
    except Exception:
        pass
    growth = _growth(tf, gpu) if gpu is not None else None
    # a floor: without memory growth TensorFlow took its whole limit at start-up; the arena itself is
    # counted by the shim's ledger (flags)
    reserved = cap if (cap and growth is False) else current
    return dict(allocated_bytes=current, reserved_bytes=max(reserved, current), active_bytes=current,
                flags=_core.FW_RESERVED_BY_LEDGER,
                allocator_settings=_core.settings_from_env(("TF_GPU_", "TF_FORCE_GPU_"), ("XLA_FLAGS",)),
                source="tensorflow %s" % (getattr(tf, "__version__", "?"),), framework="tensorflow", api=API,
                cap_bytes=cap, cap_source=cap_source, peak_bytes=info["peak"])


def report(exc=None, message=None, stack=None):
    """Hands the shim TensorFlow's numbers for a ResourceExhaustedError.  Never raises."""
    try:
        tf = _tf()
        if tf is None or not _core.shim_present():
            return None
        msg = message if message is not None else (str(exc) if exc is not None else "")
        m = _DEVICE.search(msg)
        device = int(m.group(1)) if m else 0
        kw = _numbers(tf, device)
        if kw is None:
            _core.say(WHO, "neither get_memory_info() nor get_memory_usage(): nothing reported")
            return None
        return _core.send("oom", WHO, device, num_ooms=1, requested_bytes=_request(msg),
                          python_stack=stack if stack is not None else _core.python_stack(), **kw)
    except Exception as e:
        _core.err(WHO, "report", e)
        return None


def _runtime_up(tf):
    """Has TensorFlow initialised its runtime (the eager context, which creates the GPU devices
    and their allocators)?  Read without initialising it: get_memory_info() itself would."""
    ctx = getattr(sys.modules.get("tensorflow.python.eager.context"), "context_safe", None)
    ctx = ctx() if callable(ctx) else None
    return bool(getattr(ctx, "_initialized", False))


def _holdings(device):
    """What TensorFlow holds on GPU:device when another framework of the process fails: its BFC
    arena (the whole limit without memory growth), bytes in use, its limit; None before its
    runtime is up (asking then would start it) or when it holds nothing there."""
    tf = _tf()
    if tf is None or not _runtime_up(tf):
        return None
    kw = _numbers(tf, device)
    if not kw or not kw["reserved_bytes"]:
        return None
    return kw["reserved_bytes"], kw["allocated_bytes"], kw["cap_bytes"] or None


def _on_error(exc, args, kwargs):
    # ResourceExhaustedError(node_def, op, message, *args)
    msg = args[2] if len(args) > 2 else kwargs.get("message", "")
    report(exc, message=str(msg), stack=_core.python_stack())


_adapter = _core.ExceptionAdapter(
    WHO, "tensorflow", lambda tf: _core.attr_class(tf, "errors", "ResourceExhaustedError"), _on_error,
    "tf.errors.ResourceExhaustedError", refresh=(_runtime_up, _numbers))
install, activate, is_attached = _adapter.install, _adapter.activate, _adapter.is_attached

_core.on_holdings(WHO, _holdings)
activate()
