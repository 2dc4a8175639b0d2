"""torch.cuda.amp: the older CUDA-only names of torch.amp's GradScaler and autocast."""
import torch.amp as _amp
from torch import autocast as _autocast


class GradScaler(_amp.GradScaler):
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True):
        _amp.GradScaler.__init__(self, "cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled)


class autocast(_autocast):
    def __init__(self, enabled=True, dtype=None, cache_enabled=True):
        _autocast.__init__(self, "cuda", dtype=dtype, enabled=enabled)
