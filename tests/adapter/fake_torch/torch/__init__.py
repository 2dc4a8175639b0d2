"""A stand-in for PyTorch, for oomguard's adapter tests (there is no torch on the test machine).

It has just what adapters/python/oomguard_torch.py touches -- torch.__version__,
torch.OutOfMemoryError, torch.cuda.{memory_stats, memory._snapshot, get_allocator_backend,
is_initialized, _lazy_call, _lazy_init, ...}, torch._C._cuda_attach_out_of_memory_observer, the
autograd and autocast modes (torch.no_grad, torch.autocast, torch.is_autocast_enabled, ...) and
torch.optim (the global optimizer step hook, SGD, AdamW: tests/adapter/fake_torch/torch/optim) --
and a caching allocator (torch/_alloc.py) that allocates for real through the CUDA runtime, so the
tests exercise liboomguard's hooks.  torch.empty(nbytes) returns a Tensor holding nbytes of device
memory until it is deleted.

FAKE_TORCH_BROKEN=import makes `import torch` raise; FAKE_TORCH_VERSION sets __version__;
FAKE_TORCH_LIBC10=PATH routes its runtime calls through that libc10_cuda.so (see below).
"""
import os as _os
import weakref

# the stand-ins' shared CUDA runtime and chunk list (tests/adapter/fake_common) load as torch._fake_cuda
__path__.append(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _os.pardir, _os.pardir, "fake_common"))

# PyTorch's caching allocator calls the CUDA runtime from libc10_cuda.so: with FAKE_TORCH_LIBC10 (the test
# runners name the one tests/adapter/adapter.mk builds) the stand-in's does too, so the ledger attributes
# its blocks as in a real PyTorch process; without it, the calls come from ctypes (libffi)
from torch import _fake_cuda as _fc  # noqa: E402

if _os.environ.get("FAKE_TORCH_LIBC10"):
    _fc.route_through(_os.environ["FAKE_TORCH_LIBC10"])

from torch._alloc import OutOfMemoryError, broken as _broken  # noqa: E402

if _broken("import"):
    raise RuntimeError("fake torch: broken on purpose (FAKE_TORCH_BROKEN=import)")

__version__ = _os.environ.get("FAKE_TORCH_VERSION", "2.5.1+fake")

from torch import _C  # noqa: E402
from torch import cuda  # noqa: E402


class UntypedStorage(object):
    """Tensor.untyped_storage(): the memory a tensor and its views share."""

    def __init__(self, owner):
        self._owner = owner

    def data_ptr(self):
        b = self._owner._block
        return b[0] if isinstance(b, tuple) else b.addr

    def nbytes(self):
        return self._owner.nbytes


class Tensor(object):
    """nbytes of device memory; freed (back to the cache) when the object goes away.  A view
    (Tensor.view, nn.Parameter(t)) shares its base's storage and keeps the base alive.  .grad,
    .requires_grad and .backward() as far as the role and phase tests need them
    (torch/autograd: backward runs on an engine thread of its own, as PyTorch's does)."""
    is_cuda = True
    grad = None
    _dtype = None           # set by empty(); views and parameters read their base's
    requires_grad = False
    _base = None
    _params = ()            # the leaves (parameters) its graph depends on (torch/autograd/_graph.py)

    def __init__(self, device, block, nbytes):
        self.device = device
        self._block = block
        self.nbytes = nbytes

    def _root(self):
        t = self
        while t._base is not None:
            t = t._base
        return t

    @property
    def dtype(self):
        """The dtype it was made with: empty()'s argument, else the default dtype then (float32)."""
        return self._root()._dtype or "float32"

    @property
    def grad_fn(self):
        """A forward pass's output (it depends on parameters: _params) has a node of the graph, as in
        PyTorch; other tensors none.  One node per tensor, as PyTorch's grad_fn is one object."""
        if not self._params:
            return None
        node = self.__dict__.get("_node")
        if node is None:
            node = self._node = _Node(self)
        return node

    def data_ptr(self):
        b = self._root()._block
        return b[0] if isinstance(b, tuple) else b.addr

    def untyped_storage(self):
        return UntypedStorage(self._root())

    def get_device(self):
        return self.device

    def view(self, *shape):
        v = Tensor.__new__(Tensor)
        v.device, v._block, v.nbytes, v._base = self.device, None, self.nbytes, self
        return _derive(v, self)

    def detach(self):
        return _no_graph(self.view())

    def clone(self, memory_format=None):
        """Tensor.clone(): a new tensor of the same size and dtype on the same device (the stand-in
        copies no data), in the graph of the original (view too; detach leaves it)."""
        return _derive(empty_like(self), self)

    def __deepcopy__(self, memo):
        """copy.deepcopy(t), as PyTorch's: a clone on the same device (a Parameter stays a
        Parameter, with its requires_grad)."""
        if id(self) in memo:
            return memo[id(self)]
        new = self.clone()
        if type(self) is not Tensor:
            new = type(self)(new, self.requires_grad)
        memo[id(self)] = new
        return new

    def requires_grad_(self, flag=True):
        self.requires_grad = bool(flag)
        return self

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from torch import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def __del__(self):
        try:
            if self._block is not None:
                cuda._allocator(self.device).free(self._block)
                self._block = None
        except Exception:
            pass


class _Node(object):
    """A node of the stand-in's graph: what it saved for backward is the output's `_saved` (the programs
    set it; scen_truth.backward sets it to None as PyTorch frees the saved tensors after backward).  As
    in PyTorch, reading a saved tensor after that raises RuntimeError.  Its next functions are the nodes
    of the saved tensors that have one (the stand-in's inputs of an operation are what it saves): the
    outputs of one pass, or a chain of steps each made from the last, share nodes as PyTorch's do.  The
    node holds its output weakly (the output holds the node): no cycle keeps a tensor's memory."""

    def __init__(self, out):
        self._ref = weakref.ref(out)

    @property
    def _out(self):
        out = self._ref()
        if out is None:
            raise RuntimeError("the stand-in's node outlived its output")
        return out

    @property
    def next_functions(self):
        out = self._ref()
        v = getattr(out, "_saved", None) if out is not None else None
        saved = v if isinstance(v, (tuple, list)) else (v,)
        return tuple((t.grad_fn, 0) for t in saved if isinstance(t, Tensor) and t.grad_fn is not None)

    @property
    def _saved_self(self):
        v = getattr(self._out, "_saved", self)
        if v is self:
            raise AttributeError("_saved_self")
        if v is None:
            raise RuntimeError("Trying to backward through the graph a second time (or directly access saved "
                               "tensors after they have already been freed)")
        return v


uint8, int8, float16, bfloat16, float32 = "uint8", "int8", "float16", "bfloat16", "float32"
float64 = double = "float64"
_ITEMSIZE = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_default_dtype = [float32]


def get_default_dtype():
    return _default_dtype[0]


def set_default_dtype(d):
    _default_dtype[0] = d


def empty(nbytes, dtype=None, device=None, pool_id=(0, 0)):
    """A tensor of nbytes elements of dtype (default: bytes) on `device` (default: the current
    device; an int or "cuda[:N]" as in PyTorch).  torch.empty(n, dtype=torch.uint8, device=0)
    means the same here and in PyTorch; pool_id is the stand-in's own (a CUDA-graph pool).
    Without a dtype the tensor's size is n bytes and its dtype PyTorch's default (get_default_dtype():
    float32, as torch.empty(n) makes): the programs size memory in bytes, their weights are float32
    unless they say otherwise."""
    cuda._lazy_init()
    if isinstance(device, str):
        device = int(device.split(":")[1]) if ":" in device else None
    d = cuda.current_device() if device is None else int(device)
    n = int(nbytes) * _ITEMSIZE[dtype or "uint8"]
    block = cuda._allocator(d).malloc(n, tuple(pool_id))
    t = Tensor(d, block, n)
    t._dtype = dtype or _default_dtype[0]
    return t


def empty_like(t, dtype=None, device=None):
    """A new tensor of t's size (and dtype) on t's device."""
    e = empty(t.nbytes, device=t.device if device is None else device)
    e._dtype = dtype or t.dtype
    return e


# autograd modes, as far as the adapter asks (torch.is_grad_enabled, torch.no_grad, ...)
import threading as _threading  # noqa: E402

_grad = _threading.local()


def is_grad_enabled():
    return getattr(_grad, "enabled", True)


def is_inference_mode_enabled():
    return getattr(_grad, "inference", False)


class no_grad(object):
    def __enter__(self):
        self._prev = is_grad_enabled()
        _grad.enabled = False

    def __exit__(self, *exc):
        _grad.enabled = self._prev
        return False


class inference_mode(object):
    def __enter__(self):
        self._prev = (is_grad_enabled(), is_inference_mode_enabled())
        _grad.enabled, _grad.inference = False, True

    def __exit__(self, *exc):
        _grad.enabled, _grad.inference = self._prev
        return False


# autocast (mixed precision), thread-local as in PyTorch: torch.autocast and torch.is_autocast_enabled
_amp = _threading.local()


def _before_2_4():
    parts = (__version__.split("+")[0].split(".") + ["0"])[:2]
    try:
        return tuple(int(x) for x in parts) < (2, 4)
    except ValueError:
        return False


def _autocast_state():
    st = getattr(_amp, "on", None)
    if st is None:
        st = _amp.on = {}
    return st


def is_autocast_enabled(device_type=None):
    """is_autocast_enabled(device_type) since PyTorch 2.4; without an argument (and before 2.4,
    where it took none): CUDA's autocast."""
    if device_type is not None and _before_2_4():
        raise TypeError("is_autocast_enabled() takes 0 positional arguments but 1 was given")
    return bool(_autocast_state().get(device_type or "cuda", False))


class autocast(object):
    """torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None): a context manager
    (or decorator) that turns autocast on for device_type in this thread; the stand-in computes
    nothing, so only the state changes."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        self.device = device_type
        self.fast_dtype = dtype if dtype is not None else (float16 if device_type == "cuda" else bfloat16)
        self._enabled = bool(enabled)

    def __enter__(self):
        st = _autocast_state()
        self._prev = st.get(self.device, False)
        st[self.device] = self._enabled
        return self

    def __exit__(self, *exc):
        _autocast_state()[self.device] = self._prev
        return False

    def __call__(self, func):
        def decorate_autocast(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return decorate_autocast


from torch import optim  # noqa: E402  (PyTorch imports torch.optim with torch)
from torch import nn  # noqa: E402
from torch import autograd  # noqa: E402
from torch.serialization import load, save  # noqa: E402,F401


def _tensor_deepcopy(self, memo):
    """copy.deepcopy(t) as PyTorch's Tensor.__deepcopy__: new storage of the same size on the same
    device (a clone), requires_grad and .grad copied too.  (Defined down here, after empty_like,
    so that the lines of empty() that dumps quote stay where they are.)"""
    if id(self) in memo:
        return memo[id(self)]
    new = empty_like(self)
    new.requires_grad = self.requires_grad
    if self.grad is not None:
        new.grad = self.grad.__deepcopy__(memo)
    memo[id(self)] = new
    return new


Tensor.__deepcopy__ = _tensor_deepcopy


def _derive(out, *inputs):
    """out, made from inputs by an operation autograd records: in their graph (torch/autograd/_graph.py)."""
    from torch.autograd import _graph
    return _graph.derive(out, *inputs)


def _no_graph(t):
    """t without a graph, as Tensor.detach() returns it."""
    t._params = ()
    return t

# torch.amp and torch.cuda.amp (GradScaler, the CUDA-only autocast), imported last: they build on autocast above
from torch import amp  # noqa: E402,F401
import torch.cuda.amp  # noqa: E402,F401
