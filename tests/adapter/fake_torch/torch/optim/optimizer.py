"""torch.optim.optimizer: Optimizer and the global step hooks.

register_optimizer_step_post_hook(hook) exists from PyTorch 2.0 (FAKE_TORCH_VERSION below 2.0
leaves it out, as older versions had none); hook(optimizer, args, kwargs) runs after every
optimizer's step(), with the arguments step() was given."""
import collections

import torch

_global_optimizer_post_hooks = collections.OrderedDict()
_next_id = [0]


class RemovableHandle(object):
    """torch.utils.hooks.RemovableHandle, as far as needed here."""

    def __init__(self, hooks, key):
        self._hooks, self.id = hooks, key

    def remove(self):
        self._hooks.pop(self.id, None)


def register_optimizer_step_post_hook(hook):
    _next_id[0] += 1
    _global_optimizer_post_hooks[_next_id[0]] = hook
    return RemovableHandle(_global_optimizer_post_hooks, _next_id[0])


def _before(major, minor):
    parts = (torch.__version__.split("+")[0].split(".") + ["0"])[:2]
    try:
        return tuple(int(x) for x in parts) < (major, minor)
    except ValueError:
        return False


if _before(2, 0):
    del register_optimizer_step_post_hook


class Optimizer(object):
    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.state = {}
        group = dict(defaults)
        group["params"] = list(params)
        self.param_groups = [group]

    def zero_grad(self, set_to_none=True):
        """As PyTorch's: every parameter's gradient dropped (set_to_none, the default since 2.0: its
        memory goes back to the cache) or zeroed in place (kept)."""
        if set_to_none:
            for g in self.param_groups:
                for p in g["params"]:
                    if getattr(p, "grad", None) is not None:
                        p.grad = None

    def state_dict(self):
        """As PyTorch's: {"state": {index: that parameter's state}, "param_groups": [...]}, the
        parameters named by their position; the state's tensors are the optimizer's own, not copies."""
        params = [p for g in self.param_groups for p in g["params"]]
        index = dict((id(p), i) for i, p in enumerate(params))
        state = dict((index[id(p)], s) for p, s in self.state.items() if id(p) in index)
        groups = []
        for g in self.param_groups:
            packed = dict((k, v) for k, v in g.items() if k != "params")
            packed["params"] = [index[id(p)] for p in g["params"]]
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def _update(self):
        pass

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self._update()
        args = (closure,) if closure is not None else ()
        # PyTorch iterates its dict of global hooks itself: a hook must not remove itself here
        for hook in _global_optimizer_post_hooks.values():
            hook(self, args, {})
        return loss
