"""torch.nn.Module as PyTorch lays it out: parameters in _parameters, buffers in _buffers,
submodules in _modules (the role code reads these dicts, as it does PyTorch's); calling a module
runs _call_impl, which runs forward (the phase table matches these frames).  The stand-in computes
nothing: a forward pass's output records every parameter it depends on -- this module's, its
submodules' that ran, those read as attributes, its inputs' (torch/autograd/_graph.py) -- for
backward()."""
import collections

import torch
from torch.autograd import _graph
from torch.nn.parameter import Parameter


class Module(object):
    training = True

    def __init__(self):
        object.__setattr__(self, "_parameters", collections.OrderedDict())
        object.__setattr__(self, "_buffers", collections.OrderedDict())
        object.__setattr__(self, "_modules", collections.OrderedDict())

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        for d in ("_parameters", "_buffers", "_modules"):
            dd = self.__dict__.get(d)
            if dd is not None and name in dd:
                if d == "_parameters" and dd[name] is not None:
                    _graph.note_parameter(dd[name])
                return dd[name]
        raise AttributeError(name)

    def register_buffer(self, name, tensor, persistent=True):
        self._buffers[name] = tensor

    def modules(self):
        out, todo = [], [self]
        while todo:
            m = todo.pop(0)
            if all(m is not x for x in out):
                out.append(m)
                todo.extend(m._modules.values())
        return out

    def named_parameters(self):
        seen = []
        for m in self.modules():
            for k, p in m._parameters.items():
                if p is not None and all(p is not q for q in seen):
                    seen.append(p)
                    yield k, p

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def buffers(self):
        return [b for m in self.modules() for b in m._buffers.values() if b is not None]

    def __call__(self, *args, **kwargs):
        return self._call_impl(*args, **kwargs)

    def _call_impl(self, *args, **kwargs):
        _graph.begin_forward()
        out = None
        try:
            out = self.forward(*args, **kwargs)
        finally:
            _graph.end_forward(self, args, kwargs, out)
        return out

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def _apply(self, fn):
        for m in self.modules():
            for k, p in list(m._parameters.items()):
                if p is not None:
                    fn(p)
        return self

    def to(self, *args, **kwargs):
        return self._apply(lambda t: t)

    def cuda(self, device=None):
        return self._apply(lambda t: t)

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        """As PyTorch's: the gradients are dropped (set_to_none, the default since 2.0) or zeroed in
        place (kept: same memory)."""
        if set_to_none:
            for p in self.parameters():
                p.grad = None

    def state_dict(self):
        return collections.OrderedDict(self.named_parameters())

    def load_state_dict(self, state_dict, strict=True):
        """Copies each tensor of state_dict into the parameter of that name: the stand-in makes a
        new tensor on the parameter's device first when the given one is not there (what a copy
        from a checkpoint loaded on the CPU costs)."""
        for name, p in self.named_parameters():
            t = state_dict.get(name)
            if t is not None and not getattr(t, "is_cuda", False):
                torch.empty_like(p)
        return None
