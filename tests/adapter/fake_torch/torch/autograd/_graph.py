"""The stand-in's autograd graph, as far as memory goes: which leaves (parameters, and other tensors
that require grad) each output of a forward pass depends on, so that backward() gives a gradient to
every one of them, as PyTorch's autograd does.  A tensor's `_params` holds those leaves (a program
may still set it itself: what it sets is kept, merged without duplicates).

The stand-in computes nothing, so "took part" is read from what the program calls, with autograd on
(torch.no_grad / inference_mode record nothing, and a frozen parameter -- requires_grad False -- is
no leaf, as in PyTorch):
  * a module called (Module.__call__) uses its own parameters, whatever its submodules called during
    its forward used, parameters its forward read as attributes of a module (self.weight, or
    another module's, as a tied head does), and what its tensor arguments depended on; its output
    tensors (a tensor, or those in a tuple, list, dict or output object) depend on all of it, and so
    does the forward of the module that called it;
  * a function of torch on tensors (torch.nn.functional, Tensor.view, Tensor.clone) makes an output
    that depends on what its inputs depended on; Tensor.detach and torch.empty_like make none."""
import threading

import torch

_tls = threading.local()


def _stack():
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def merge(*groups):
    """The tensors of the groups in order, each once (by identity: tensors are not hashable by value)."""
    out, seen = [], set()
    for g in groups:
        for t in g or ():
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return tuple(out)


def leaves(t):
    """The leaves tensor t depends on: its graph's, or t itself when it is a leaf that requires grad."""
    p = getattr(t, "_params", ())
    if p:
        return tuple(p)
    return (t,) if getattr(t, "requires_grad", False) else ()


def _is_leaf(t):
    return getattr(t, "requires_grad", False) and not getattr(t, "_params", ())


def tensors_in(obj):
    """The tensors of an output: the tensor itself, or those in a tuple, list or dict, or among the
    attributes of an output object (a ModelOutput's loss and logits), one level deep."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        items = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).values()
    else:
        return []
    return [t for t in items if isinstance(t, torch.Tensor)]


def _inputs(args, kwargs):
    ts = []
    for a in list(args) + list(kwargs.values()):
        ts.extend(tensors_in(a))
    return merge(*(leaves(t) for t in ts))


def derive(out, *inputs):
    """out, made by an operation on `inputs`: it depends on what they depend on (autograd on)."""
    if torch.is_grad_enabled() and not _is_leaf(out):
        ls = merge(*(leaves(t) for t in inputs if isinstance(t, torch.Tensor)))
        if ls:
            out._params = merge(out._params, ls)
    return out


def begin_forward():
    _stack().append([])


def note_parameter(p):
    """A parameter read as a module's attribute: used by the forward running (if any)."""
    s = getattr(_tls, "stack", None)
    if s and getattr(p, "requires_grad", False) and torch.is_grad_enabled():
        s[-1].append(p)


def end_forward(module, args, kwargs, out):
    """After module.forward (out None when it raised): its outputs depend on everything it used; so
    does its caller's forward."""
    used = _stack().pop()
    if not torch.is_grad_enabled():
        return
    own = [p for p in module._parameters.values() if p is not None and p.requires_grad]
    ls = merge(own, used, _inputs(args, kwargs))
    if not ls:
        return
    s = _stack()
    if s:
        s[-1].extend(ls)
    for t in tensors_in(out):
        if not _is_leaf(t):
            t._params = merge(t._params, ls)
