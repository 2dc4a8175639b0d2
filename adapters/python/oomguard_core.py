"""What oomguard's Python adapters share (oomguard_torch, oomguard_jax, oomguard_cupy).

  * the preloaded shim's functions, found with ctypes.CDLL(None): oomguard_framework_report,
    oomguard_framework_oom and oomguard_framework_set_query (include/oomguard.h); without the
    shim none is found and every adapter stays a no-op;
  * send(): one call that fills oomguard_framework_stats_t and hands it over;
  * python_stack(): the Python lines of the calling thread, innermost first, without the
    adapters' own frames -- taken only on a failure path, never per allocation;
  * after_import(name, fn): runs fn once module `name` has been imported (at once if it is);
  * hook_exception(cls, on_init): makes a framework's out-of-memory exception class report
    itself when it is created, i.e. on the failing thread at the failure, caught or not;
  * activation(who, module, install): an adapter's activate(); ExceptionAdapter: activate,
    install and is_attached of an adapter that learns of failures from exception classes;
  * the query the shim may call at a failing driver allocation (only if that thread already
    holds the GIL; see include/oomguard.h): it hands over the Python stack, nothing else;
    asked by the interpreter for `oomguard snapshot`, it runs the adapters' refreshers
    (on_refresh; refresher(): the guard and hand-over JAX, CuPy and TensorFlow share).

Never raises into the program; one line on stderr per problem with OOMGUARD_VERBOSE=1.
Python 3.9+, standard library only.
"""
import os
import sys
import threading

_lock = threading.RLock()
_fns = {}
_struct = None
FW_FREED_KNOWN = 2       # include/oomguard.h OOMGUARD_FW_FREED_KNOWN: freed_bytes_total was measured
FW_REQUEST_KNOWN = 4     # OOMGUARD_FW_REQUEST_KNOWN: requested_bytes was given (0 is a request of 0 bytes)
FW_PEAK_KNOWN = 8        # OOMGUARD_FW_PEAK_KNOWN: peak_bytes was read (0 is a peak of 0 bytes)
FW_RESERVED_BY_LEDGER = 16  # OOMGUARD_FW_RESERVED_BY_LEDGER: reserved_bytes is a floor; the shim's ledger counts it
_ADAPTER_FILES = ("oomguard_core.py", "oomguard_torch.py", "oomguard_jax.py", "oomguard_cupy.py", "oomguard_tf.py",
                  "oomguard_roles.py", "oomguard_phase.py", "sitecustomize.py")
_HERE = os.path.dirname(os.path.abspath(__file__))

# liboomguard's constructor sets this to "0" in a Python process; "1" tells a dump the adapter loaded
# (without the shim it is absent and stays so)
if os.environ.get("_OOMGUARD_PY_ADAPTER") == "0":
    os.environ["_OOMGUARD_PY_ADAPTER"] = "1"


def truthy(name, default="0"):
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def falsy(name):
    return os.environ.get(name, "").strip().lower() in ("0", "false", "no", "off")


def say(who, msg):
    """One line on stderr, only with OOMGUARD_VERBOSE=1; never raises."""
    if not truthy("OOMGUARD_VERBOSE"):
        return
    try:
        sys.stderr.write("oomguard: %s adapter: %s\n" % (who, msg))
        sys.stderr.flush()
    except Exception:
        pass


def err(who, where, exc):
    s = str(exc)
    say(who, "%s failed: %s: %s" % (where, type(exc).__name__, s.splitlines()[0] if s else ""))


def stats_struct():
    """ctypes mirror of oomguard_framework_stats_t (include/oomguard.h)."""
    global _struct
    if _struct is None:
        import ctypes

        class FrameworkStats(ctypes.Structure):
            _fields_ = [
                ("struct_size", ctypes.c_uint64),
                ("device", ctypes.c_int64),
                ("allocated_bytes", ctypes.c_uint64),
                ("reserved_bytes", ctypes.c_uint64),
                ("active_bytes", ctypes.c_uint64),
                ("inactive_split_bytes", ctypes.c_uint64),
                ("largest_free_block_bytes", ctypes.c_uint64),
                ("private_pool_bytes", ctypes.c_uint64),
                ("num_alloc_retries", ctypes.c_uint64),
                ("num_ooms", ctypes.c_uint64),
                ("allocator_settings", ctypes.c_char_p),
                ("source", ctypes.c_char_p),
                ("snapshot_path", ctypes.c_char_p),
                ("framework", ctypes.c_char_p),
                ("api", ctypes.c_char_p),
                ("requested_bytes", ctypes.c_uint64),
                ("cap_bytes", ctypes.c_uint64),
                ("cap_source", ctypes.c_char_p),
                ("peak_bytes", ctypes.c_uint64),
                ("grad_enabled", ctypes.c_int32),
                ("training", ctypes.c_int32),
                ("python_stack", ctypes.c_char_p),
                ("python_sites", ctypes.c_char_p),
                ("unmeasured_why", ctypes.c_char_p),
                ("flags", ctypes.c_uint64),
                ("autocast", ctypes.c_int32),      # appended later: the shim reads it only when struct_size covers it
                ("freed_bytes_total", ctypes.c_uint64),  # read only with FW_FREED_KNOWN in flags (0 is an answer)
                ("roles", ctypes.c_char_p),         # oomguard_roles.encode()
                ("phase", ctypes.c_char_p),         # oomguard_phase.detect(): phase, frame, source
                ("phase_frame", ctypes.c_char_p),
                ("phase_source", ctypes.c_char_p),
                ("other_frameworks", ctypes.c_char_p),  # holdings_of_others(): the process's other frameworks
            ]
        _struct = FrameworkStats
    return _struct


def shim_fn(name):
    """A function of the preloaded shim, or None (no shim: the adapters are off)."""
    with _lock:
        if name in _fns:
            return _fns[name]
        fn = None
        try:
            import ctypes
            try:
                fn = getattr(ctypes.CDLL(None), name)
            except AttributeError:
                fn = None
            if fn is not None and name in ("oomguard_framework_report", "oomguard_framework_oom"):
                fn.argtypes = [ctypes.POINTER(stats_struct())]
                fn.restype = ctypes.c_int
        except Exception as e:
            err("python", "looking up " + name, e)
            fn = None
        _fns[name] = fn
        return fn


def shim_present():
    return shim_fn("oomguard_framework_report") is not None


def u64(v):
    try:
        v = int(v)
    except Exception:
        return 0
    if v < 0:
        return 0
    return min(v, (1 << 64) - 2)       # older shims read 2**64-1 as "unknown"


def _b(s, maxlen=4000):
    s = "" if s is None else str(s)
    return s[:maxlen].encode("utf-8", "replace")


def _clean(s):
    return str(s).replace("\t", " ").replace("\n", " ")


def _ours(filename):
    try:
        return os.path.dirname(os.path.abspath(filename)) == _HERE and os.path.basename(filename) in _ADAPTER_FILES
    except Exception:
        return False


def python_stack(frame=None, limit=24):
    """[(file, line, function)] of the calling thread, innermost first, without the adapters' own
    frames.  Walks frame objects only: no source is read, no module imported."""
    out = []
    try:
        f = frame if frame is not None else sys._getframe(1)
        while f is not None and len(out) < limit:
            code = f.f_code
            if not _ours(code.co_filename):
                out.append((code.co_filename, f.f_lineno or 0, code.co_name))
            f = f.f_back
    except Exception:
        pass
    return out


def encode_stack(frames):
    return "".join("%s\t%d\t%s\n" % (_clean(f), int(l), _clean(n)) for f, l, n in frames)


def encode_sites(sites):
    """sites: [(file, line, function, bytes, blocks)]"""
    return "".join("%s\t%d\t%s\t%d\t%d\n" % (_clean(f), int(l), _clean(n), int(b), int(k)) for f, l, n, b, k in sites)


def send(kind, who, device, **kw):
    """Hands the numbers to the shim: kind "report" (a driver failure's numbers) or "oom" (the
    framework failed a request).  Keyword names are oomguard_framework_stats_t's fields; strings
    are encoded here; python_stack/python_sites take lists (see encode_*).  Returns the shim's
    result, or None.  Never raises."""
    try:
        import ctypes
        fn = shim_fn("oomguard_framework_oom" if kind == "oom" else "oomguard_framework_report")
        if fn is None:
            return None
        s = stats_struct()()
        s.struct_size = ctypes.sizeof(s)
        s.device = int(device)
        keep = []
        others = kw.pop("other_frameworks", None) if "other_frameworks" in kw else holdings_of_others(who, device)
        if others:
            b = _b(others)
            keep.append(b)
            s.other_frameworks = b
        for k, v in kw.items():
            if v is None:
                continue
            if k == "python_stack":
                v = encode_stack(v)
            elif k == "python_sites":
                v = encode_sites(v)
            ftype = dict(s._fields_)[k]
            if ftype is ctypes.c_char_p:
                b = _b(v, 16000 if k == "roles" else 4000)
                keep.append(b)
                setattr(s, k, b)
            elif ftype is ctypes.c_int32:
                setattr(s, k, int(v))
            else:
                setattr(s, k, u64(v))
        if kw.get("freed_bytes_total") is not None:
            s.flags |= FW_FREED_KNOWN        # None (not measured) stays unknown, never a 0 freed
        # a request or a peak passed as None (not known) stays unknown in the dump, never a 0 B one
        if kw.get("requested_bytes") is not None:
            s.flags |= FW_REQUEST_KNOWN
        if kw.get("peak_bytes") is not None:
            s.flags |= FW_PEAK_KNOWN
        r = fn(ctypes.byref(s))
        if kind == "oom":
            _ooms[who] = _ooms.get(who, 0) + 1
        say(who, "%s for device %d handed over (allocated %d, reserved %d, request %d, cap %d)" %
            (kind, device, s.allocated_bytes, s.reserved_bytes, s.requested_bytes, s.cap_bytes))
        return r
    except Exception as e:
        err(who, "handing over the numbers", e)
        return None


# ---------------------------------------------------------------------------- the other frameworks

_holdings = {}                               # who -> fn(device): (reserved, in_use or None, limit or None) or None


def on_holdings(who, fn):
    """An adapter's way to say what its framework holds on a device when another framework of the
    process fails (JAX's arena next to PyTorch).  fn(device) must not initialise the framework,
    allocate device memory or wait; it returns (reserved_bytes, in_use_bytes, limit_bytes), None
    where a number is not known, or None when the framework holds nothing there or is not up."""
    _holdings[who] = fn


def holdings_of_others(who, device):
    """"framework\treserved\tin_use\tlimit\n" for every adapter but `who` whose framework holds memory
    on `device` ('-': not known), or None.  Never raises."""
    lines = []
    for name, fn in sorted(_holdings.items()):
        if name == who:
            continue
        try:
            got = fn(int(device))
            if not got or not got[0]:
                continue
            lines.append("%s\t%s\n" % (name, "\t".join("-" if v is None else "%d" % u64(v) for v in got[:3])))
        except Exception as e:
            err(name, "reading what it holds", e)
    return "".join(lines) or None


def settings_from_env(prefixes, names=()):
    """"NAME=value,..." of the settings in force (for allocator_settings)."""
    out = []
    for k in sorted(os.environ):
        if k in names or any(k.startswith(p) for p in prefixes):
            out.append("%s=%s" % (k, os.environ[k]))
    return ",".join(out)


# ---------------------------------------------------------------------------- waiting for an import

class _LoaderWrapper(object):
    """Runs the module's own loader, then the callbacks.  Anything else is the original loader's."""

    def __init__(self, loader, hook):
        self._oomguard_loader = loader
        self._oomguard_hook = hook

    def create_module(self, spec):
        return self._oomguard_loader.create_module(spec)

    def exec_module(self, module):
        loader = self._oomguard_loader
        try:
            loader.exec_module(module)
        finally:
            try:
                spec = getattr(module, "__spec__", None)
                if spec is not None and spec.loader is self:
                    spec.loader = loader
                if getattr(module, "__loader__", None) is self:
                    module.__loader__ = loader
            except Exception:
                pass
        self._oomguard_hook._loaded()

    def __getattr__(self, name):
        if name.startswith("_oomguard_"):
            raise AttributeError(name)
        return getattr(self._oomguard_loader, name)


class _OomguardImportHook(object):
    """A sys.meta_path finder that answers nothing itself: on `import NAME` it lets the other
    finders find the module, wraps the loader so the callbacks run when the module has finished
    loading, and removes itself then.  A failed import leaves it in place for a retry."""

    def __init__(self, name):
        self.name = name
        self.callbacks = []
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(fullname, path, target)
                except TypeError:
                    spec = find(fullname, path)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module") \
                    or isinstance(spec.loader, _LoaderWrapper):
                return None
            spec.loader = _LoaderWrapper(spec.loader, self)
            return spec
        except Exception as e:
            err("python", "import hook", e)
            return None
        finally:
            self._busy.on = False

    def invalidate_caches(self):
        pass

    def _loaded(self):
        try:
            while self in sys.meta_path:
                sys.meta_path.remove(self)
        except Exception:
            pass
        for cb in list(self.callbacks):
            try:
                cb()
            except Exception as e:
                err("python", "after import %s" % self.name, e)


def after_import(name, fn):
    """fn() once module `name` is imported: now if it is, else right after its import."""
    with _lock:
        if name not in sys.modules:
            for f in sys.meta_path:
                if isinstance(f, _OomguardImportHook) and f.name == name:
                    f.callbacks.append(fn)
                    return
            h = _OomguardImportHook(name)
            h.callbacks.append(fn)
            sys.meta_path.insert(0, h)
            return
    fn()           # outside _lock: fn takes its adapter's lock, and shim_fn() takes _lock under it


def activation(who, module, install):
    """An adapter's activate(): install() once `module` is imported (at once if it is), and the
    shim's query registered.  Idempotent; nothing without the shim; never raises."""
    state = {"activated": False}
    lock = threading.RLock()

    def activate():
        try:
            with lock:
                if state["activated"]:
                    return
                state["activated"] = True
                if not shim_present():
                    return
                register_query()
                after_import(module, install)
        except Exception as e:
            err(who, "activate", e)

    activate.__doc__ = activation.__doc__
    return activate


# ---------------------------------------------------------------------------- framework exceptions

def hook_exception(cls, who, on_init):
    """Wraps cls.__init__ so that on_init(exc, args, kwargs) runs when such an exception is
    created (args: what __init__ got): on the
    failing thread, at the failure, whether the program catches it or not.  Returns True when
    hooked.  on_init must not raise (its exceptions are swallowed)."""
    try:
        if getattr(cls, "_oomguard_hooked", False):
            return True
        orig = cls.__init__

        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                if not getattr(_busy, "on", False):
                    _busy.on = True
                    try:
                        on_init(self, args, kwargs)
                    finally:
                        _busy.on = False
            except Exception as e:
                err(who, "reporting %s" % type(self).__name__, e)

        __init__.__wrapped__ = orig
        __init__.__doc__ = getattr(orig, "__doc__", None)
        cls.__init__ = __init__
        cls._oomguard_hooked = True
        return True
    except Exception as e:
        err(who, "hooking %s" % getattr(cls, "__name__", cls), e)
        return False


_busy = threading.local()


class ExceptionAdapter(object):
    """What the adapters that learn of a failure from the framework's exception (jax, cupy,
    tensorflow) share: install() wraps __init__ of the classes that classes(module) returns
    (hook_exception, with on_init) once `module` is imported, and registers the refresher
    refresher(who, module, *refresh) when refresh = (ready, read) is given; activate() arranges
    it.  Both are idempotent and never raise; is_attached() is None or "exception"."""

    def __init__(self, who, module, classes, on_init, missing, refresh=None):
        self.who, self.module, self.classes, self.on_init, self.missing = who, module, classes, on_init, missing
        self.refresh = refresh
        self.attached = None
        self._lock = threading.RLock()
        self.activate = activation(who, module, self.install)

    def install(self):
        """Attaches to the imported module (idempotent).  Returns True when attached."""
        try:
            with self._lock:
                if self.attached:
                    return True
                mod = sys.modules.get(self.module)
                if mod is None or not shim_present():
                    return False
                hooked = [c for c in self.classes(mod) if hook_exception(c, self.who, self.on_init)]
                if not hooked:
                    say(self.who, "no %s to attach to" % self.missing)
                    return False
                self.attached = "exception"
                if self.refresh is not None:
                    on_refresh(refresher(self.who, self.module, *self.refresh))
                say(self.who, "attached to %s (%s %s)" % (", ".join(c.__name__ for c in hooked), self.module,
                                                         getattr(mod, "__version__", "?")))
                return True
        except Exception as e:
            err(self.who, "install", e)
            return False

    def is_attached(self):
        return self.attached


def attr_class(obj, *path):
    """[the class at obj.path...], or [] when there is none (for ExceptionAdapter's classes)."""
    for name in path:
        obj = getattr(obj, name, None)
    return [obj] if isinstance(obj, type) else []


# ---------------------------------------------------------------------------- the shim's query

_query = {"fn": None, "buf": None}
QUERY_REFRESH = 4                            # include/oomguard.h: OOMGUARD_QUERY_REFRESH
_refreshers = []                             # fn(device) -> None when nothing was reported


_ooms = {}                                   # who -> the framework's failures reported ("oom")


def on_refresh(fn):
    """An adapter's way to report fresh numbers when the shim asks (`oomguard snapshot`)."""
    if fn not in _refreshers:
        _refreshers.append(fn)


def refresher(who, module, ready, read):
    """A refresher for on_refresh: reports read(mod, device) -- the keyword arguments of send(),
    the numbers the adapter gives at a failure -- as a plain report (never a failure), with the
    failures the adapter saw so far as num_ooms.  It asks nothing of the framework until
    ready(mod) says that its backend is up, so the refresher is never the framework's first
    CUDA call; ready and read must not initialise anything, allocate device memory, or wait
    without a bound.  Returns the shim's result, or None when nothing was reported; never
    raises."""
    def refresh(device):
        try:
            mod = sys.modules.get(module)
            if mod is None or not shim_present() or not ready(mod):
                return None
            kw = read(mod, int(device))
            if not kw:
                return None
            kw.setdefault("num_ooms", _ooms.get(who, 0))
            return send("report", who, kw.pop("device", device), **kw)
        except Exception as e:
            err(who, "refreshing the numbers", e)
            return None

    refresh.__name__ = "refresh_" + module
    return refresh


def _refresh(device):
    """The shim's ask for fresh numbers, run by the interpreter as a pending call (main thread,
    between two bytecodes): each adapter reports its framework's numbers for `device`."""
    reported = False
    for fn in list(_refreshers):
        try:
            reported = fn(device) is not None or reported
        except Exception as e:
            err("python", "refreshing the numbers", e)
    return 0 if reported else -1


def _query_body(ctx, device, out):
    """Called by the shim at a failing driver allocation, only on a thread that already holds
    the GIL, with the garbage collector paused: hands over the Python stack, touches nothing
    else (no framework call, no lock, no import).  With QUERY_REFRESH in out.flags it is the
    interpreter's pending call instead, asking for the framework's numbers (_refresh)."""
    try:
        if out[0].flags & QUERY_REFRESH:
            return _refresh(device)
        frames = python_stack(sys._getframe(1))
        b = encode_stack(frames).encode("utf-8", "replace")
        _query["buf"] = b                    # stays alive until the next query
        out[0].python_stack = b
        return 0
    except Exception:
        return -1


def register_query():
    """Registers _query_body with the shim (once per process)."""
    with _lock:
        if _query["fn"] is not None:
            return True
        set_query = shim_fn("oomguard_framework_set_query")
        if set_query is None:
            return False
        try:
            import ctypes
            proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(stats_struct()))
            cb = proto(_query_body)
            set_query.argtypes = [proto, ctypes.c_void_p, ctypes.c_uint]
            set_query.restype = ctypes.c_int
            set_query(cb, None, 1)               # OOMGUARD_QUERY_NEEDS_GIL
            _query["fn"] = cb                    # the C pointer lives as long as this object
            import atexit
            # before the interpreter frees the callback: the shim must not call it afterwards
            atexit.register(set_query, ctypes.cast(None, proto), None, 0)
            return True
        except Exception as e:
            err("python", "registering the query", e)
            return False
