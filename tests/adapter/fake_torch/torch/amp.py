"""torch.amp as far as memory goes: autocast, and GradScaler, the loss scaler of float16 training (the stand-in
computes nothing: scaling a loss gives it back, a step is the optimizer's)."""
from torch import autocast  # noqa: F401


class GradScaler(object):
    """torch.amp.GradScaler(device="cuda", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000, enabled=True)."""

    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        self._device = device
        self._scale = float(init_scale)
        self._enabled = bool(enabled)

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer):
        pass

    def step(self, optimizer, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        if new_scale is not None:
            self._scale = float(new_scale)

    def get_scale(self):
        return self._scale if self._enabled else 1.0

    def is_enabled(self):
        return self._enabled
