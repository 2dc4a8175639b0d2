"""train_sfno.py (excerpt) -- a weather-ML group trains a Spherical Fourier Neural Operator (makani-style SFNO,
0.25 deg ERA5, 73 channels, 721 x 1440) on one 8 x H100 80GB node under Slurm:
`srun --ntasks-per-node=8 --gpus-per-task=1 python train_sfno.py` (each task sees its own GPU as cuda:0;
this process is task 0).  DDP, AdamW, bf16 autocast.  A postdoc rewrote the epoch-end validation so that
rank 0 can draw the ACC and RMSE maps per lead time, and kept it simple:

    @torch.no_grad()
    def validate(model, ics):
        preds = []
        for ic in ics:                                  # this rank's share of the validation dates
            x, fields = ic.cuda(), []
            for step in range(LEAD_STEPS):              # 40 x 6 h = 10 days, autoregressive
                x = model(x)
                fields.append(x.cpu())                  # on the host, nothing kept on the GPU
            preds.append({"init_time": ..., "forecast": torch.stack(fields)})
        gathered = [None] * world_size
        dist.all_gather_object(gathered, preds)         # rank 0 needs them all for the maps
        ...

It ran in the debug configuration (4 lead steps, a few dates).  In the real one each rank holds one
initial condition's 40-step forecast on the host: 40 x 73 x 721 x 1440 fp32 = 11.3 GiB.  all_gather_object
pickles it and -- with the NCCL backend -- copies the pickle to the current GPU (11.3 GiB, which still
fits beside the model, the AdamW state, DDP's buckets and the cached training activations), then allocates
the receive buffer for all eight ranks on every GPU: max size x world size = 90.4 GiB in one request, more
than the card holds.  "Tried to allocate 90.44 GiB" while the job keeps nothing of its own on the GPU for
validation.

An expert: the GPU is only the transport of a collective of Python objects, and the objects are huge.
Do not gather the fields: compute the metric's state on every rank (squared errors and the ACC
numerator / denominators per channel and lead time, latitude-weighted: a few KB) and all_reduce it;
or, if rank 0 really needs the fields, gather through a gloo (CPU) group or write each rank's forecast to
the shared file system and read it on rank 0.  Chunking the gather field by field avoids the OOM but still
ships 90 GB to every rank's host.  Wrong first advice: empty_cache or expandable_segments, a smaller batch,
mixed precision, gradient checkpointing, freeing the optimizer, an 8-bit optimizer, ZeRO (none of it
touches a 90 GiB request), a bigger GPU, set_device (each task is on its own GPU).
"""
import io
import linecache
import os
import pickle
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
bf16, f32 = torch.bfloat16, torch.float32

# --- what the stand-in torch lacks, as PyTorch 2.5 has it ----------------------------------------------
# Tensor.backward: afterwards autograd frees what the graph saved (the stand-in's graph is _saved).
_BACKWARD = '''
def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    from torch import autograd
    autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
    if not (retain_graph or create_graph):
        todo = [self]
        while todo:
            x = todo.pop()
            saved = getattr(x, "_saved", None)
            if saved is None:
                continue
            x._saved = None
            todo.extend(s for s in (saved if isinstance(saved, (tuple, list)) else (saved,)) if isinstance(s, Tensor))
'''
_ns = {"Tensor": torch.Tensor}
exec(compile(_BACKWARD, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["backward"]

# torch.no_grad() as a decorator (PyTorch's is a _DecoratorContextManager).
if "__call__" not in vars(torch.no_grad):
    def _no_grad_call(self, func):
        def decorate_context(*args, **kwargs):
            with torch.no_grad():
                return func(*args, **kwargs)
        return decorate_context
    torch.no_grad.__call__ = _no_grad_call


class _CPUTensor(object):
    """A tensor in host memory (the stand-in's tensors are device memory; these hold no bytes here)."""
    is_cuda = False
    device = "cpu"

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def __reduce__(self):
        return (_CPUTensor, (self.nbytes,))


torch.Tensor.cpu = lambda self: _CPUTensor(self.nbytes)
torch.stack = lambda tensors, dim=0: _CPUTensor(sum(t.nbytes for t in tensors))
torch.long, torch.int64 = "int64", "int64"

# torch.distributed (c10d) as far as this job uses it, compiled as torch/distributed/distributed_c10d.py.
# The process runs alone (task 0 of 8): a collective gives it the other ranks' values as they would be --
# every rank validates one initial condition, so every rank's object is the same size.
_C10D_FILE = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
_C10D = '''
_state = {"rank": None, "world_size": None, "backend": None}


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, **kwargs):
    _state.update(rank=rank, world_size=world_size, backend=backend)


def is_initialized():
    return _state["backend"] is not None


def get_rank(group=None):
    return _state["rank"]


def get_world_size(group=None):
    return _state["world_size"]


def get_backend(group=None):
    return _state["backend"]


def barrier(group=None, async_op=False, device_ids=None):
    return None


def all_reduce(tensor, op=None, group=None, async_op=False):
    return None


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return None


def _get_pg_default_device(group=None):
    if get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _SizedBytes(object):
    """The pickle of an object: its bytes (the stand-in's host tensors are counted, not copied)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def _pickled_nbytes(obj):
    f = io.BytesIO()
    pickle.Pickler(f).dump(obj)
    extra = 0
    todo = [obj]
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
        elif hasattr(o, "nbytes") and not isinstance(o, torch.Tensor):
            extra += o.nbytes
    return len(f.getvalue()) + extra


def _object_to_tensor(obj, device, group):
    byte_size = _pickled_nbytes(obj)
    byte_tensor = torch.empty(byte_size, dtype=torch.uint8, device=device.index)   # ByteTensor(...).to(device)
    local_size = torch.empty(8, dtype=torch.uint8, device=device.index)          # LongTensor([numel]).to(device)
    local_size.value = byte_size
    return byte_tensor, local_size


def all_gather_object(object_list, obj, group=None):
    current_device = _get_pg_default_device(group)
    input_tensor, local_size = _object_to_tensor(obj, current_device, group)
    group_size = get_world_size(group=group)
    object_sizes_tensor = torch.empty(group_size * 8, dtype=torch.uint8, device=current_device.index)
    object_size_list = [local_size.value for i in range(group_size)]
    all_gather(object_size_list, local_size, group=group)
    max_object_size = int(max(object_size_list))
    coalesced_output_tensor = torch.empty(max_object_size * group_size, dtype=torch.uint8,
                                          device=current_device.index)
    all_gather([coalesced_output_tensor], input_tensor, group=group)
    for i in range(group_size):
        object_list[i] = obj
'''
_dist = types.ModuleType("torch.distributed")
_dist.__file__ = _C10D_FILE
_dist.__dict__.update({"torch": torch, "io": io, "pickle": pickle})
linecache.cache[_C10D_FILE] = (len(_C10D), None, _C10D.splitlines(True), _C10D_FILE)
exec(compile(_C10D, _C10D_FILE, "exec"), _dist.__dict__)
sys.modules["torch.distributed"] = torch.distributed = _dist
torch.device = lambda kind, index=None: types.SimpleNamespace(type=kind, index=index)

# --- the model (makani-style SFNO; ~410M parameters) --------------------------------------------------
C, H, W = 73, 721, 1440
FIELD = C * H * W                       # one state, elements
LEAD_STEPS = 40                         # 10 days at 6 h
N_VAL_ICS = 8                           # one initial condition per rank


class SFNOBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(32_500_000, dtype=f32, device="cuda"))

    def forward(self, x):
        """Spectral convolution at the internal 240 x 480 grid, embed 768, then the MLP; in bf16 autocast."""
        n = 240 * 480 * 768
        spec = torch.empty(n * 2, dtype=bf16, device="cuda")              # SHT coefficients, complex
        mixed = torch.empty(n * 2, dtype=bf16, device="cuda")
        mlp = torch.empty(n * 2, dtype=bf16, device="cuda")                # hidden 2 x embed
        out = torch.empty(n, dtype=bf16, device="cuda")
        if torch.is_grad_enabled():
            out._saved = (x, spec, mixed, mlp)
        return out


class SFNO(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = torch.nn.Parameter(torch.empty(C * 768 * 2 + 768 * 768, dtype=f32, device="cuda"))
        for i in range(12):
            setattr(self, "block_%d" % i, SFNOBlock())
        self.decoder = torch.nn.Parameter(torch.empty(768 * 768 + 768 * C, dtype=f32, device="cuda"))

    def forward(self, x):
        h = torch.empty(240 * 480 * 768, dtype=bf16, device="cuda")
        if torch.is_grad_enabled():
            h._saved = (x,)
        for i in range(12):
            h = getattr(self, "block_%d" % i)(h)
        out = torch.empty(FIELD, dtype=f32, device="cuda")
        if torch.is_grad_enabled():
            out._saved = (h,)
        return out


def era5_batches(n):
    for _ in range(n):
        yield torch.empty(FIELD, dtype=f32, device="cuda"), torch.empty(FIELD, dtype=f32, device="cuda")


def latitude_weighted_mse(pred, target):
    loss = torch.empty(4, dtype=f32, device="cuda")
    loss._saved = (pred,)
    return torch._derive(loss, pred)


# --- the training script -----------------------------------------------------------------------------
import torch.distributed as dist  # noqa: E402


def train_one_epoch(model, optimizer, steps):
    model.train()
    for x, y in era5_batches(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(x)
            pred = model(pred)                     # 2-step autoregressive rollout in the loss
            loss = latitude_weighted_mse(pred, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def validate(model, ics):
    model.eval()
    preds = []
    for init_time, x in ics:
        fields = []
        for step in range(LEAD_STEPS):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                x = model(x)
            fields.append(x.cpu())
        preds.append({"init_time": init_time, "forecast": torch.stack(fields)})
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, preds)
    if dist.get_rank() == 0:
        return gathered
    return None


def main():
    rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(0)                       # --gpus-per-task=1: this task's GPU is cuda:0
    model = torch.nn.parallel.DistributedDataParallel(SFNO().cuda(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.0)
    print("rank %d/%d: model + DDP buckets %.1f GiB" % (rank, world_size, torch.cuda.memory_allocated() / GiB))
    for epoch in range(1):
        train_one_epoch(model, optimizer, steps=3)
        print("epoch %d trained: allocated %.1f GiB, reserved %.1f GiB"
              % (epoch, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
        my_ics = [("2018-%02d-01T00" % (1 + rank + k * world_size), torch.empty(FIELD, dtype=f32, device="cuda"))
                  for k in range(N_VAL_ICS // world_size)]
        validate(model, my_ics)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
