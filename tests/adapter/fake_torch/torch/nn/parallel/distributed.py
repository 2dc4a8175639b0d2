"""torch.nn.parallel.DistributedDataParallel as far as memory goes: PyTorch's reducer allocates, when DDP is
built, flat buckets (at most bucket_cap_mb each) that hold a copy of every gradient of the parameters that
require grad, for the all-reduce.  With gradient_as_bucket_view=True the gradients are views into those
buckets; without it (the default) gradients and buckets are two copies.  In PyTorch the buckets are C++ memory
of the Reducer (torch._C._distributed_c10d.Reducer), which no Python attribute names: here they sit in a
private list of an object of torch's own that the role scan does not walk, so they count, as in PyTorch, as
memory no role claims.  The attribute names are PyTorch's (module, gradient_as_bucket_view, bucket_bytes_cap,
reducer).  No communication happens."""
import torch
from torch.nn.modules.module import Module


class Reducer(object):
    def __init__(self, params, bucket_bytes_cap):
        self._buckets = []
        total = sum(p.nbytes for p in params)
        device = params[0].device if params else None
        while total > 0:
            n = min(total, bucket_bytes_cap)
            self._buckets.append(torch.empty(n, device=device))
            total -= n


class DistributedDataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, bucket_cap_mb=25,
                 gradient_as_bucket_view=False, **kwargs):
        Module.__init__(self)
        self.module = module
        self.device_ids = device_ids
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self.bucket_bytes_cap = int(bucket_cap_mb * 1024 * 1024)
        self.reducer = Reducer([p for p in module.parameters() if p.requires_grad], self.bucket_bytes_cap)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
