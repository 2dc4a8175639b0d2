"""infer_floors.py -- a digital-twin company segments laser scans of a client's office building (NavVis VLX,
one scan per floor) with Point Transformer V3 (PTv3-m1-base, 46M parameters) that they trained in Pointcept on
ScanNet v2 (20 classes).  For inference they did not use Pointcept's SemSegTester (which cuts each scene into
grid-sampled fragments and runs them under torch.no_grad()); they wrote a short script for their own pipeline,
on the RTX A5000 (24 GB) of their processing workstation:

    model = build_model(cfg.model).cuda()
    model.load_state_dict(torch.load("model_best.pth", map_location="cpu")["state_dict"])
    model.eval()
    for name in floors:
        input_dict = load_scan(name)                     # GridSample(0.02), NormalizeColor, ToTensor
        for key in input_dict.keys():
            input_dict[key] = input_dict[key].cuda(non_blocking=True)
        with torch.autocast("cuda"):
            output_dict = model(input_dict)
        pred = output_dict["seg_logits"].argmax(-1).cpu().numpy()

model.eval() switches dropout/drop-path and BatchNorm to inference behaviour; it does not turn autograd off.
The weights require grad, so every block of the forward records its graph and keeps the tensors its backward
would need (the LayerNorm inputs, the fp16 casts fed to each Linear, the gathered qkv of the serialized
attention, the MLP's hidden activations, the spconv inputs ...): about 16-18 KB per point, held until
seg_logits is dropped, where no_grad would need a few hundred bytes per point at a time.  The first three
floors (0.41M, 0.66M, 0.87M points after the 2 cm grid) pass, holding 6.2, 10.4 and 14.6 GiB at their ends;
the fourth, the fully open-plan 2nd floor (1.49M points), needs about 25 GiB and fails in a decoder block's
attention (the gather of qkv into serialization order) with 22.4 GiB allocated.  Under torch.no_grad() the
whole run peaks at 4.3 GiB.

An expert: this is inference with autograd on: wrap the loop in torch.inference_mode() (or torch.no_grad()),
which is what Pointcept's tester does; the largest floor then needs a fifth of the card.  Splitting a floor into
fragments (Pointcept's test-time cropping) is the next step for much larger buildings, not the fix here.
Wrong first advice: a smaller batch (one floor per forward already), gradient checkpointing (nothing trains),
mixed precision (autocast is on), expandable_segments / empty_cache (the memory is the live graph; the 1 GiB
cached is not what is missing), an 8-bit optimizer / ZeRO / LoRA (no optimizer), quantizing a 46M-parameter
model, a bigger GPU (it would only move the failure to the next larger building), killing other processes.
"""
import sys

import torch
from torch import nn

import scen_truth

# ---- stand-in gaps: the tensor operations this program calls (torch.cat, the arithmetic operators, matmul,
# softmax, ...: C functions in PyTorch, with no Python frame of their own).  The stand-in's tensors have a byte
# size and no shape; these give them one and make each result the size PyTorch's would be (nothing is
# computed).  Compiled as part of torch's file so that the failing line of the program stays the program's own.
_TORCH_GAPS = r'''
import builtins as _bi
import math

_ITEM = {"uint8": 1, "int8": 1, "bool": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
         "int32": 4, "int64": 8}
_RANK = {"bool": 0, "uint8": 1, "int8": 1, "int32": 2, "int64": 3, "float16": 4, "bfloat16": 4, "float32": 5,
         "float64": 6}
int64, int32, long = "int64", "int32", "int64"



def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


class _HostTensor(object):
    """A tensor in host memory (a DataLoader's batch, a numpy array made a tensor): no device memory."""
    is_cuda = False

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        self.nbytes = _numel(shape) * _ITEM[dtype]

    def cuda(self, device=None, non_blocking=False):
        return _new(self.shape, self.dtype, "cuda" if device is None else device)

    def to(self, device=None, dtype=None, non_blocking=False):
        return _new(self.shape, dtype or self.dtype, device)

    def __getitem__(self, i):
        return _HostTensor(self.shape[1:], self.dtype)


_plain_empty = empty


def _empty(n, dtype=None, device=None):
    """torch.empty, noting the request for the test's truth mark as scen_truth.note_every_empty does (with
    the allocator's reservation read from its segment list: the same number, cheaper)."""
    import sys as _sys
    last = _sys.modules["scen_truth"]._last
    d = cuda.current_device() if device in (None, "cuda") else int(str(device).split(":")[-1])
    last.update(n=int(n) * _ITEMSIZE[dtype or "uint8"], allocated_at_failure=None,
                reserved=cuda._allocator(d)._reserved() if cuda.is_initialized() else 0)
    _alloc.allocated_at_oom = None
    try:
        return _plain_empty(n, dtype=dtype, device=device)
    except OutOfMemoryError:
        at = _alloc.allocated_at_oom
        last["allocated_at_failure"] = at if at is not None else cuda.memory_allocated()
        raise


def _new(shape, dtype=None, device=None):
    dtype = dtype or get_default_dtype()
    device = "cuda" if device is None else device
    if device == "cpu":
        return _HostTensor(shape, dtype)
    n = _numel(shape)
    if dtype in _ITEMSIZE:
        t = _empty(n, dtype=dtype, device=device)
    else:
        t = _empty(n * _ITEM[dtype], device=device)
        t._dtype = dtype
    t.shape = tuple(int(s) for s in shape)
    _SEQ[0] += 1
    t._seq = _SEQ[0]
    return t


_SEQ = [0]


def _amp():
    return "float16" if is_autocast_enabled() else None


def _promote(*xs):
    best = None
    for x in xs:
        if isinstance(x, Tensor):
            if best is None or _RANK[x.dtype] > _RANK[best]:
                best = x.dtype
    return best


def _bshape(*shapes):
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        d = 1
        for s in shapes:
            j = i - (n - len(s))
            if j >= 0 and s[j] != 1:
                d = s[j]
        out.append(d)
    return tuple(out)


def _reach(x):
    """What a node that does not save x still reaches through x's node: x itself when x's own node keeps it
    (softmax, sigmoid), else what x's node keeps."""
    if x.__dict__.get("_self_saved"):
        return (x,)
    s = x.__dict__.get("_saved")
    return tuple(s) if isinstance(s, (tuple, list)) else ()


def _link(out, inputs, saved=(), self_saved=False):
    """out in the graph of its inputs (autograd on): its node keeps what PyTorch's backward of that op saves
    (the `saved` inputs, or out itself: self_saved) and reaches the nodes of the other inputs."""
    if is_grad_enabled():
        ts = [x for x in inputs if isinstance(x, Tensor)]
        _derive(out, *ts)
        if out._params:
            keep = [x for x in saved if isinstance(x, Tensor)]
            for x in ts:
                if all(x is not k for k in keep):
                    keep.extend(_reach(x))
            out._saved = tuple(keep)
            if self_saved:
                out._self_saved = True
    return out


def _view(t, shape):
    """A view: shares t's storage (keeps t alive); its node reaches what t's node reaches."""
    v = t.view()
    v.shape = tuple(int(s) for s in shape)
    if v.__dict__.get("_params"):
        v._saved = _reach(t)
    return v


def _dev(*xs):
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return None


def _ew(a, b, saved, dtype=None):
    ts = [x for x in (a, b) if isinstance(x, Tensor)]
    out = _new(_bshape(*[x.shape for x in ts]), dtype or _promote(*ts), _dev(*ts))
    return _link(out, ts, saved)


Tensor.shape = ()
Tensor.__add__ = Tensor.__radd__ = lambda a, b: _ew(a, b, ())
Tensor.__sub__ = Tensor.__rsub__ = lambda a, b: _ew(a, b, ())
def _both(a, b):
    """mul/div keep their operands only when both are tensors (by a Python number: nothing)."""
    return (a, b) if isinstance(a, Tensor) and isinstance(b, Tensor) else ()


Tensor.__mul__ = Tensor.__rmul__ = lambda a, b: _ew(a, b, _both(a, b))
Tensor.__truediv__ = lambda a, b: _ew(a, b, _both(a, b))
Tensor.__neg__ = lambda a: _ew(a, None, ())


def _matmul(a, b):
    if len(a.shape) == 1 and len(b.shape) == 1:
        shape = ()
    else:
        batch = _bshape(a.shape[:-2], b.shape[:-2])
        shape = batch + (a.shape[-2], b.shape[-1])
    out = _new(shape, _amp() or _promote(a, b), a.device)
    return _link(out, (a, b), (a, b))


Tensor.__matmul__ = _matmul
matmul = _matmul
bmm = _matmul


def _pow(self, e):
    return _link(_new(self.shape, self.dtype, self.device), (self,), (self,))


Tensor.pow = _pow


def _inplace(self, *a, **k):
    return self


Tensor.exp_ = Tensor.zero_ = Tensor.clamp_ = Tensor.div_ = Tensor.mul_ = Tensor.add_ = _inplace
Tensor.__itruediv__ = Tensor.__imul__ = Tensor.__iadd__ = lambda self, other: self


def _scatter_(self, dim, index, src):
    return self


Tensor.scatter_ = _scatter_


def _reduce_shape(shape, dim, keepdim):
    dims = [d % len(shape) for d in ((dim,) if isinstance(dim, int) else dim)]
    out = []
    for i, s in enumerate(shape):
        if i in dims:
            if keepdim:
                out.append(1)
        else:
            out.append(s)
    return tuple(out)


def _sum(self, dim=None, keepdim=False, dtype=None):
    shape = () if dim is None else _reduce_shape(self.shape, dim, keepdim)
    return _link(_new(shape, dtype or self.dtype, self.device), (self,), ())


Tensor.sum = Tensor.mean = _sum


def sum(input, dim=None, keepdim=False, dtype=None):
    return _sum(input, dim, keepdim, dtype)


def _getitem(self, idx):
    """t[i]: a view without the first dimension; t[a:b]: a view of those rows; t[[i, j]]: a copy of the rows."""
    if isinstance(idx, int):
        return _view(self, self.shape[1:])
    if isinstance(idx, slice):
        n = len(range(*idx.indices(self.shape[0])))
        return _view(self, (n,) + self.shape[1:])
    if isinstance(idx, (list, tuple)):
        return _link(_new((len(idx),) + self.shape[1:], self.dtype, self.device), (self,), ())
    if isinstance(idx, Tensor):
        # t[index]: a gather (index_select), a copy; its backward keeps only the index
        return _link(_new((idx.shape[0],) + self.shape[1:], self.dtype, self.device), (self,), (idx,))
    raise TypeError("stand-in indexing: %r" % (idx,))


Tensor.__getitem__ = _getitem


def _flatten(self, start_dim=0, end_dim=-1):
    s = list(self.shape)
    e = end_dim % len(s)
    return _view(self, s[:start_dim] + [_numel(s[start_dim:e + 1])] + s[e + 1:])


def _transpose(self, a, b):
    s = list(self.shape)
    s[a], s[b] = s[b], s[a]
    return _view(self, s)


def _unsqueeze(self, d):
    s = list(self.shape)
    s.insert(d % (len(s) + 1), 1)
    return _view(self, s)


def _reshape(self, *shape):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    shape = list(shape)
    if -1 in shape:
        i = shape.index(-1)
        rest = _numel([s for s in shape if s != -1])
        shape[i] = _numel(self.shape) // rest
    return _view(self, shape)


def _permute(self, *dims):
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    return _view(self, [self.shape[d] for d in dims])


def _contiguous(self):
    """A copy (the permuted/transposed views in the program are not contiguous)."""
    return _link(_new(self.shape, self.dtype, self.device), (self,), ())


def _to(self, *args, **kw):
    dt = kw.get("dtype")
    for a in args:
        if a in _ITEM:
            dt = a
    if dt is None or dt == self.dtype:
        return self
    return _link(_new(self.shape, dt, self.device), (self,), ())


Tensor.flatten = _flatten
Tensor.transpose = _transpose
Tensor.unsqueeze = _unsqueeze
Tensor.reshape = _reshape
Tensor.permute = _permute
Tensor.contiguous = _contiguous
Tensor.to = _to
Tensor.float = lambda self: _to(self, "float32")
Tensor.half = lambda self: _to(self, "float16")
Tensor.size = lambda self, d=None: self.shape if d is None else self.shape[d]
Tensor.dim = lambda self: len(self.shape)
Tensor.numel = lambda self: _numel(self.shape)


def _topk(self, k, dim=-1):
    s = list(self.shape)
    s[dim] = k
    return _new(s, self.dtype, self.device), _new(s, "int64", self.device)


Tensor.topk = _topk
topk = _topk


def cat(tensors, dim=0):
    tensors = list(tensors)
    s = list(tensors[0].shape)
    d = dim % len(s)
    s[d] = _bi.sum(t.shape[d] for t in tensors)
    out = _new(s, _promote(*tensors), tensors[0].device)
    return _link(out, tensors, ())


def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    return _new(shape, dtype, device)


ones = zeros


def zeros_like(t, dtype=None):
    return _new(t.shape, dtype or t.dtype, t.device)


def softmax(x, dim=-1, dtype=None):
    """torch.softmax: under autocast in float32 (autocast runs softmax in float32); keeps its output."""
    dt = dtype or ("float32" if is_autocast_enabled() else x.dtype)
    return _link(_new(x.shape, dt, x.device), (x,), (), self_saved=True)


def _cast(x):
    """autocast's copy of a float32 input in float16 (cached for weights, as autocast caches them)."""
    if not is_autocast_enabled() or x.dtype != "float32":
        return x
    if isinstance(x, nn.Parameter):
        c = x.__dict__.get("_amp_copy")
        if c is None:
            c = x._amp_copy = _view(x, x.shape)
        return c
    return _link(_new(x.shape, "float16", x.device), (x,), ())


def _f_linear(input, weight, bias=None):
    x, w = _cast(input), _cast(weight)
    out = _new(input.shape[:-1] + (weight.shape[0],), _amp() or input.dtype, input.device)
    return _link(out, (x, weight, bias), (x, w))


def _f_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """autocast runs layer_norm in float32; keeps its input (and the per-row mean/rstd)."""
    out = _new(input.shape, "float32" if is_autocast_enabled() else input.dtype, input.device)
    return _link(out, (input, weight, bias), (input,))


def _f_gelu(input, approximate="none"):
    return _link(_new(input.shape, input.dtype, input.device), (input,), (input,))


def _f_dropout(input, p=0.5, training=True, inplace=False):
    """at::dropout gives the input back when p == 0 or not training."""
    if p == 0 or not training:
        return input
    out = _new(input.shape, input.dtype, input.device)
    mask = _new(input.shape, "bool", input.device)
    return _link(out, (input,), (mask,))


_plain_interpolate = nn.functional.interpolate


def _f_interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    """F.interpolate of an [N, C, H, W] tensor by scale_factor (the stand-in's, with the shape)."""
    out = _plain_interpolate(input, scale_factor=scale_factor, mode=mode)
    out.shape = tuple(input.shape[:2]) + tuple(int(d * scale_factor) for d in input.shape[2:])
    out._dtype = input.dtype
    return out


nn.functional.interpolate = _f_interpolate
nn.functional.softmax = softmax
nn.functional.linear = _f_linear
nn.functional.layer_norm = _f_layer_norm
nn.functional.gelu = _f_gelu
nn.functional.dropout = _f_dropout


def _graph_nodes(root):
    """The outputs whose nodes the graph of root holds, newest first (the order backward visits them)."""
    todo, seen, nodes = [root], set(), []
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        nodes.append(t)
        for x in (s if isinstance(s, (tuple, list)) else (s,)):
            if isinstance(x, Tensor) and x is not t:
                todo.append(x)
    nodes.sort(key=lambda t: -t.__dict__.get("_seq", 0))
    return nodes


def _free_saved(root):
    """What autograd does after backward without retain_graph: the tensors each node saved are freed."""
    for t in _graph_nodes(root):
        t._saved = None
        t.__dict__.pop("_self_saved", None)


_plain_backward = Tensor.backward


def _engine_backward(nodes, box, done):
    """The engine thread's part: node by node, newest first, the gradient of the node's output (freed when
    the next one is made), then the node's saved tensors released."""
    autograd._engine._tls.engine = True
    try:
        grad = None
        while nodes:
            t = nodes.pop(0)
            if t.shape and t.device is not None:
                grad = _new(t.shape, t.dtype, t.device)     # made while the one it comes from is alive
            t._saved = None
            t.__dict__.pop("_self_saved", None)
            del t
        del grad
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Backward as far as memory goes: the parameters' gradients (the stand-in's engine), then, on an engine
    thread as PyTorch's, the gradients of the activations node by node while each node's saved tensors are
    freed once it has run (retain_graph off)."""
    import _thread
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    nodes = _graph_nodes(self)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_engine_backward, (nodes, box, done))
    del nodes
    done.acquire()
    if "error" in box:
        raise box["error"]


Tensor.backward = _backward
'''
if not hasattr(torch, "cat"):
    exec(compile(_TORCH_GAPS, torch.__file__, "exec"), torch.__dict__)
# ----

scen_truth.note_every_empty(torch)

F = nn.functional


# ---- stand-in gaps: parameters with shapes, and the kernels of spconv / flash-attn / torch_scatter this
# model calls (CUDA extensions: no Python frame inside them; their tensors come from PyTorch's allocator)
def _param(*shape):
    t = torch._new(shape, torch.float32)
    p = nn.Parameter(t)
    p.shape = t.shape
    return p


def _fp16(x):
    return torch._cast(x)


def subm_conv3d_forward(features, weight, indice_pairs):
    """spconv.pytorch SubMConv3d (implicit GEMM): output [N, C_out], keeps its input and the pairs."""
    x = _fp16(features)
    out = torch._new((features.shape[0], weight.shape[0]), torch._amp() or features.dtype)
    return torch._link(out, (x, weight), (x, weight, indice_pairs))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None):
    """flash_attn 2: output [N, H, D] and the log-sum-exp it keeps for backward; no N x N matrix."""
    n, _, h, d = qkv.shape
    out = torch._new((n, h, d), qkv.dtype)
    lse = torch._new((h, n), torch.float32)
    return torch._link(out, (qkv,), (qkv, lse))


def segment_csr(src, indptr, reduce="max"):
    """torch_scatter.segment_csr: one row per segment (the pooled points)."""
    out = torch._new((indptr.shape[0] - 1,) + src.shape[1:], src.dtype)
    return torch._link(out, (src,), (src, indptr))


def batch_norm(x, weight, bias):
    out = torch._new(x.shape, x.dtype)
    return torch._link(out, (x, weight, bias), (x,))      # keeps its input (and the batch statistics)


def cross_entropy(logits, target, ignore_index=-1):
    out = torch._new((), torch.float32)
    lsm = torch._new(logits.shape, torch.float32)     # log_softmax in float32 under autocast
    return torch._link(out, (logits,), (lsm, target))
# ----


# ---------------------------------------------------------------------- pointcept/models/utils/structure.py
class Point(dict):
    """Pointcept's Point: a dict of the batch's tensors (coord, grid_coord, feat, offset, serialized codes and
    orders, the spconv SparseConvTensor with its indice pairs)."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k)

    def __setattr__(self, k, v):
        self[k] = v

    def serialization(self, order=("z", "z-trans", "hilbert", "hilbert-trans"), depth=None, shuffle_orders=False):
        n = self.feat.shape[0]
        self.serialized_code = torch._new((len(order), n), torch.int64)
        self.serialized_order = torch._new((len(order), n), torch.int64)
        self.serialized_inverse = torch._new((len(order), n), torch.int64)

    def sparsify(self, pad=96):
        """spconv.SparseConvTensor(features=self.feat, indices=cat([batch, grid_coord]), ...): its indice_dict
        fills as the SubMConv3d layers of this resolution first run."""
        self.sparse_indices = torch._new((self.feat.shape[0], 4), torch.int32)
        self.indice_dict = {}

    def indice_pairs(self, key, kernel_volume):
        p = self.indice_dict.get(key)
        if p is None:
            p = self.indice_dict[key] = torch._new((2, kernel_volume, self.feat.shape[0]), torch.int32)
        return p


# ------------------------------------------------------------ pointcept/models/point_transformer_v3/*.py
class SerializedAttention(nn.Module):
    def __init__(self, channels, num_heads, patch_size=1024, order_index=0):
        nn.Module.__init__(self)
        self.channels, self.num_heads, self.patch_size, self.order_index = channels, num_heads, patch_size, order_index
        self.qkv_w, self.qkv_b = _param(channels * 3, channels), _param(channels * 3)
        self.proj_w, self.proj_b = _param(channels, channels), _param(channels)

    def get_padding_and_inverse(self, point):
        n = point.feat.shape[0]
        n_pad = (n + self.patch_size - 1) // self.patch_size * self.patch_size + self.patch_size * 4
        pad = torch._new((n_pad,), torch.int64)
        unpad = torch._new((n,), torch.int64)
        cu_seqlens = torch._new((n_pad // self.patch_size + 1,), torch.int32)
        return pad, unpad, cu_seqlens

    def forward(self, point):
        H = self.num_heads
        K = self.patch_size
        C = self.channels
        pad, unpad, cu_seqlens = self.get_padding_and_inverse(point)
        order = point.serialized_order[self.order_index][pad]
        inverse = unpad[point.serialized_inverse[self.order_index]]

        # padding and reshape feat and batch for serialized point patch
        qkv = F.linear(point.feat, self.qkv_w, self.qkv_b)[order]
        feat = flash_attn_varlen_qkvpacked_func(
            qkv.reshape(-1, 3, H, C // H), cu_seqlens, max_seqlen=K, dropout_p=0.0, softmax_scale=None)
        feat = feat.reshape(-1, C)
        feat = feat[inverse]

        # ffn
        feat = F.linear(feat, self.proj_w, self.proj_b)
        point.feat = feat
        return point


class Block(nn.Module):
    def __init__(self, channels, num_heads, patch_size=1024, mlp_ratio=4.0, order_index=0, indice_key=None):
        nn.Module.__init__(self)
        self.channels, self.indice_key = channels, indice_key
        self.cpe_conv = _param(channels, 3, 3, 3, channels)
        self.cpe_lin_w, self.cpe_lin_b = _param(channels, channels), _param(channels)
        self.cpe_norm_w, self.cpe_norm_b = _param(channels), _param(channels)
        self.norm1_w, self.norm1_b = _param(channels), _param(channels)
        self.attn = SerializedAttention(channels, num_heads, patch_size, order_index)
        self.norm2_w, self.norm2_b = _param(channels), _param(channels)
        hidden = int(channels * mlp_ratio)
        self.fc1_w, self.fc1_b = _param(hidden, channels), _param(hidden)
        self.fc2_w, self.fc2_b = _param(channels, hidden), _param(channels)

    def forward(self, point):
        C = self.channels
        shortcut = point.feat
        feat = subm_conv3d_forward(point.feat, self.cpe_conv, point.indice_pairs(self.indice_key, 27))
        feat = F.linear(feat, self.cpe_lin_w, self.cpe_lin_b)
        feat = F.layer_norm(feat, (C,), self.cpe_norm_w, self.cpe_norm_b)
        point.feat = shortcut + feat
        shortcut = point.feat
        point.feat = F.layer_norm(point.feat, (C,), self.norm1_w, self.norm1_b)
        point = self.attn(point)
        point.feat = shortcut + point.feat          # drop_path (per-sample scaling)
        shortcut = point.feat
        feat = F.layer_norm(point.feat, (C,), self.norm2_w, self.norm2_b)
        feat = F.linear(F.gelu(F.linear(feat, self.fc1_w, self.fc1_b)), self.fc2_w, self.fc2_b)
        point.feat = shortcut + feat
        return point




class SerializedPooling(nn.Module):
    def __init__(self, in_channels, out_channels, stride=2):
        nn.Module.__init__(self)
        self.proj_w, self.proj_b = _param(out_channels, in_channels), _param(out_channels)
        self.bn_w, self.bn_b = _param(out_channels), _param(out_channels)

    def forward(self, point):
        n = point.feat.shape[0]
        m = max(int(n * point.pool_keep), 1)     # how many 2x-grid cells the batch's scans occupy
        code = torch._new((4, n), torch.int64)          # point.serialized_code >> (pooling_depth * 3)
        cluster = torch._new((n,), torch.int64)
        indptr = torch._new((m + 1,), torch.int64)
        head_indices = torch._new((m,), torch.int64)
        feat = segment_csr(F.linear(point.feat, self.proj_w, self.proj_b)[torch._new((n,), torch.int64)], indptr)
        feat = F.gelu(batch_norm(feat, self.bn_w, self.bn_b))
        pooled = Point(feat=feat, pooling_inverse=cluster, pooling_parent=point, pool_keep=point.pool_keep)
        pooled.serialization()
        pooled.sparsify()
        del code, head_indices
        return pooled


class SerializedUnpooling(nn.Module):
    def __init__(self, in_channels, skip_channels, out_channels):
        nn.Module.__init__(self)
        self.proj_w, self.proj_b = _param(out_channels, in_channels), _param(out_channels)
        self.proj_skip_w, self.proj_skip_b = _param(out_channels, skip_channels), _param(out_channels)
        self.bn_w, self.bn_b = _param(out_channels), _param(out_channels)
        self.bn2_w, self.bn2_b = _param(out_channels), _param(out_channels)

    def forward(self, point):
        parent = point.pooling_parent
        inverse = point.pooling_inverse
        feat = F.gelu(batch_norm(F.linear(point.feat, self.proj_w, self.proj_b), self.bn_w, self.bn_b))
        skip = F.gelu(batch_norm(F.linear(parent.feat, self.proj_skip_w, self.proj_skip_b), self.bn2_w, self.bn2_b))
        parent.feat = skip + feat[inverse]
        return parent


class PointTransformerV3(nn.Module):
    def __init__(self, in_channels=6, enc_depths=(2, 2, 2, 6, 2), enc_channels=(32, 64, 128, 256, 512),
                 enc_num_head=(2, 4, 8, 16, 32), enc_patch_size=(1024,) * 5, dec_depths=(2, 2, 2, 2),
                 dec_channels=(64, 64, 128, 256), dec_num_head=(4, 4, 8, 16), dec_patch_size=(1024,) * 4,
                 mlp_ratio=4):
        nn.Module.__init__(self)
        self.stem_conv = _param(enc_channels[0], 5, 5, 5, in_channels)
        self.stem_bn_w, self.stem_bn_b = _param(enc_channels[0]), _param(enc_channels[0])
        self.enc = []
        for s in range(len(enc_depths)):
            stage = []
            if s > 0:
                stage.append(SerializedPooling(enc_channels[s - 1], enc_channels[s]))
            for i in range(enc_depths[s]):
                stage.append(Block(enc_channels[s], enc_num_head[s], enc_patch_size[s], mlp_ratio, order_index=i % 4,
                                   indice_key="stage%d" % s))
            self.enc.append(stage)
            for j, m in enumerate(stage):
                setattr(self, "enc%d_%d" % (s, j), m)
        self.dec = []
        dec_in = list(dec_channels[1:]) + [enc_channels[-1]]
        for s in reversed(range(len(dec_depths))):
            stage = [SerializedUnpooling(dec_in[s], enc_channels[s], dec_channels[s])]
            for i in range(dec_depths[s]):
                stage.append(Block(dec_channels[s], dec_num_head[s], dec_patch_size[s], mlp_ratio, order_index=i % 4,
                                   indice_key="stage%d" % s))
            self.dec.append(stage)
            for j, m in enumerate(stage):
                setattr(self, "dec%d_%d" % (s, j), m)
        self.enc_channels = enc_channels

    def forward(self, data_dict):
        point = Point(data_dict)
        point.serialization(order=("z", "z-trans", "hilbert", "hilbert-trans"), shuffle_orders=True)
        point.sparsify()
        # embedding: SubMConv3d(6, 32, kernel 5) + BatchNorm + GELU
        point.feat = F.gelu(batch_norm(subm_conv3d_forward(point.feat, self.stem_conv,
                                                           point.indice_pairs("stem", 125)),
                                       self.stem_bn_w, self.stem_bn_b))
        for stage in self.enc:
            for m in stage:
                point = m(point)
        for stage in self.dec:
            for m in stage:
                point = m(point)
        return point


class DefaultSegmentorV2(nn.Module):
    def __init__(self, num_classes=20, backbone_out_channels=64):
        nn.Module.__init__(self)
        self.backbone = PointTransformerV3()
        self.seg_head_w, self.seg_head_b = _param(num_classes, backbone_out_channels), _param(num_classes)

    def forward(self, input_dict):
        point = self.backbone(input_dict)
        seg_logits = F.linear(point.feat, self.seg_head_w, self.seg_head_b)
        if "segment" in input_dict.keys() and self.training:
            loss = cross_entropy(seg_logits, input_dict["segment"], ignore_index=-1)
            return dict(loss=loss)
        return dict(seg_logits=seg_logits)


# ------------------------------------------------------------------------------------------- infer_floors.py
CLASSES = ["wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf", "picture",
           "counter", "desk", "curtain", "refridgerator", "shower curtain", "toilet", "sink", "bathtub",
           "otherfurniture"]

# the NavVis VLX scans of the client's office building, one per floor, after GridSample(grid_size=0.02)
FLOORS = [("B1_parking_ramp_and_storage", 412_733, 0.22), ("GF_lobby_and_cafeteria", 655_208, 0.25),
          ("1F_open_plan_east", 873_514, 0.27), ("2F_open_plan_full", 1_486_215, 0.27),
          ("3F_meeting_rooms", 702_377, 0.26)]


def load_scan(name, n_points, pool_keep):
    """read the .las export, GridSample(0.02) and NormalizeColor on the CPU (numpy), then ToTensor/Collect:
    coord, grid_coord, feat (xyz + rgb), offset -- host memory."""
    return {"coord": torch._new((n_points, 3), torch.float32, "cpu"),
            "grid_coord": torch._new((n_points, 3), torch.int32, "cpu"),
            "feat": torch._new((n_points, 6), torch.float32, "cpu"),
            "offset": torch._new((1,), torch.int64, "cpu"),
            # the share of points left by each 2x grid pooling (surfaces: about a quarter; depends on the scan)
            "pool_keep": pool_keep}


def main():
    model = DefaultSegmentorV2(num_classes=20, backbone_out_channels=64).cuda()
    # checkpoint = torch.load("exp/scannet/semseg-pt-v3m1-0-base/model/model_best.pth", map_location="cpu")
    # model.load_state_dict(checkpoint["state_dict"]) -- weights copied in place
    model.eval()
    print("PTv3 (ScanNet, 20 classes): %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4e6))
    for name, n_points, pool_keep in FLOORS:
        input_dict = load_scan(name, n_points, pool_keep)
        for key in input_dict.keys():
            if isinstance(input_dict[key], torch._HostTensor):
                input_dict[key] = input_dict[key].cuda(non_blocking=True)
        with torch.autocast("cuda", enabled=True):
            output_dict = model(input_dict)
        seg_logits = output_dict["seg_logits"]
        # pred = seg_logits.argmax(-1).cpu().numpy() -> back to the full-resolution cloud by the grid inverse
        print("%s: %d points segmented, allocated %.1f GiB" % (name, n_points,
                                                              torch.cuda.memory_allocated() / 2 ** 30))
        del output_dict, seg_logits, input_dict


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
