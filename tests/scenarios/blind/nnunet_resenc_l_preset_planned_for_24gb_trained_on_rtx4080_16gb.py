"""nnUNetv2_train 512 3d_fullres 0 -p nnUNetResEncUNetLPlans -- a hospital radiology group trains nnU-Net v2 on
their renal-mass CT dataset (Dataset512_RenalMassCT: kidney, tumor, cyst) on the workstation they have, an RTX
4080 (16 GB).  They read "nnU-Net Revisited" (2024), which recommends the residual-encoder presets, and
planned with the L preset:

    nnUNetv2_plan_and_preprocess -d 512 -pl nnUNetPlannerResEncL
    nnUNetv2_train 512 3d_fullres 0 -p nnUNetResEncUNetLPlans

The ResEnc presets differ in the GPU memory they are planned for: M for about 9-11 GB, L for 24 GB, XL for 40
GB.  nnUNetPlannerResEncL sized the 3d_fullres patch for a 24 GB card: [192, 224, 224] voxels, batch 2, a
6-stage ResidualEncoderUNet (102M parameters, features 32..320, 1/3/4/6/6/6 residual blocks) with deep
supervision, trained as always in nnU-Net with torch.autocast fp16 and a GradScaler.  One training step peaks
at about 21 GiB -- fine on the 24 GB card the plan assumes, not on a 16 GB one.  The first iteration's forward
pass fails in the decoder, at the last transposed convolution up to full resolution ([2, 32, 192, 224, 224]
fp16, 1.15 GiB), with 14.7 GiB allocated, nearly all of it activations of that pass.

An expert: the plan does not match the card.  Plan for this GPU: use the M preset (nnUNetPlannerResEncM), or
re-plan L for 16 GB (nnUNetv2_plan_experiment -d 512 -pl nnUNetPlannerResEncL -gpu_memory_target 15
-overwrite_plans_name nnUNetResEncUNetPlans_15G), which shrinks the patch (e.g. toward [128, 160, 160], under 8
GiB here) and keeps batch 2; or train where there are 24 GB.
Wrong first advice: mixed precision (nnU-Net already trains under autocast fp16), batch 1 (nnU-Net keeps at
least 2 for its instance-norm training; the planner would rather shrink the patch), expandable_segments /
empty_cache (nothing fragmented: 0.1 GiB cached), inference_mode (training), gradient checkpointing (not an
nnU-Net option; rewriting the network to save 5 GB is not the first move), an 8-bit optimizer / ZeRO / LoRA
(SGD state and weights are under 1 GB), CPU offload, killing other processes (there are none).
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


# ---- stand-in gaps: parameters with shapes; the cuDNN convolutions, instance norm and LeakyReLU of
# dynamic_network_architectures (builtins in PyTorch), sized as PyTorch's outputs are
def _param(*shape):
    t = torch._new(shape, torch.float32)
    p = nn.Parameter(t)
    p.shape = t.shape
    return p


def conv3d(input, weight, bias=None, stride=1, padding=1):
    """F.conv3d under autocast: a float16 output; keeps its (float16) input and weight."""
    x = torch._cast(input)
    n, c, d, h, w = input.shape
    s = stride if isinstance(stride, (tuple, list)) else (stride,) * 3
    out = torch._new((n, weight.shape[0], d // s[0], h // s[1], w // s[2]), torch._amp() or input.dtype)
    return torch._link(out, (x, weight, bias), (x, weight))


def conv_transpose3d(input, weight, bias=None, stride=2):
    x = torch._cast(input)
    n, c, d, h, w = input.shape
    s = stride if isinstance(stride, (tuple, list)) else (stride,) * 3
    out = torch._new((n, weight.shape[1], d * s[0], h * s[1], w * s[2]), torch._amp() or input.dtype)
    return torch._link(out, (x, weight, bias), (x, weight))


def instance_norm(input, weight=None, bias=None, eps=1e-5):
    out = torch._new(input.shape, input.dtype)
    return torch._link(out, (input, weight, bias), (input,))


def leaky_relu_(input, negative_slope=0.01):
    """In place: the output is the input's memory, kept for backward."""
    if input.__dict__.get("_params"):
        input._self_saved = True
    return input
# ----


# ------------------------------------------------------------------ dynamic_network_architectures (ResEnc)
class ConvDropoutNormReLU(nn.Module):
    def __init__(self, in_ch, out_ch, stride=1, nonlin=True):
        nn.Module.__init__(self)
        self.conv_w = _param(out_ch, in_ch, 3, 3, 3)
        self.conv_b = _param(out_ch)
        self.norm_w, self.norm_b = _param(out_ch), _param(out_ch)
        self.stride, self.nonlin = stride, nonlin

    def forward(self, x):
        x = conv3d(x, self.conv_w, self.conv_b, self.stride)
        x = instance_norm(x, self.norm_w, self.norm_b)
        return leaky_relu_(x) if self.nonlin else x


class BasicBlockD(nn.Module):
    def __init__(self, in_ch, out_ch, stride=1):
        nn.Module.__init__(self)
        self.conv1 = ConvDropoutNormReLU(in_ch, out_ch, stride)
        self.conv2 = ConvDropoutNormReLU(out_ch, out_ch, 1, nonlin=False)
        if stride != 1 or in_ch != out_ch:
            # avg-pool then 1x1x1 conv + norm on the skip path
            self.skip_w, self.skip_norm_w = _param(out_ch, in_ch, 1, 1, 1), _param(out_ch)
        else:
            self.skip_w = None
        self.stride = stride

    def forward(self, x):
        residual = x
        out = self.conv2(self.conv1(x))
        if self.skip_w is not None:
            n, c, d, h, w = x.shape
            s = self.stride
            pooled = torch._link(torch._new((n, c, d // s, h // s, w // s), x.dtype), (x,), ())
            residual = instance_norm(conv3d(pooled, self.skip_w, None, 1), self.skip_norm_w)
        out = out + residual
        return leaky_relu_(out)


class ResidualEncoder(nn.Module):
    def __init__(self, input_channels, n_stages, features_per_stage, strides, n_blocks_per_stage):
        nn.Module.__init__(self)
        self.stem = ConvDropoutNormReLU(input_channels, features_per_stage[0])
        self.stages = []
        in_ch = features_per_stage[0]
        for s in range(n_stages):
            blocks = [BasicBlockD(in_ch, features_per_stage[s], strides[s])]
            blocks += [BasicBlockD(features_per_stage[s], features_per_stage[s]) for _ in range(n_blocks_per_stage[s] - 1)]
            self.stages.append(blocks)
            for i, b in enumerate(blocks):
                setattr(self, "stage%d_%d" % (s, i), b)
            in_ch = features_per_stage[s]

    def forward(self, x):
        x = self.stem(x)
        ret = []
        for blocks in self.stages:
            for b in blocks:
                x = b(x)
            ret.append(x)
        return ret


class UNetDecoder(nn.Module):
    def __init__(self, features_per_stage, num_classes, deep_supervision=True):
        nn.Module.__init__(self)
        n = len(features_per_stage)
        self.transpconvs, self.convs, self.seg_layers = [], [], []
        for s in range(1, n):
            below, skip = features_per_stage[-s], features_per_stage[-(s + 1)]
            tp = _param(below, skip, 2, 2, 2)
            self.transpconvs.append(tp)
            self.convs.append(ConvDropoutNormReLU(2 * skip, skip))
            self.seg_layers.append(_param(num_classes, skip, 1, 1, 1))
            setattr(self, "transp%d" % s, tp)
            setattr(self, "conv%d" % s, self.convs[-1])
            setattr(self, "seg%d" % s, self.seg_layers[-1])
        self.deep_supervision = deep_supervision

    def forward(self, skips):
        lres_input = skips[-1]
        seg_outputs = []
        for s in range(len(self.transpconvs)):
            x = conv_transpose3d(lres_input, self.transpconvs[s], None, 2)
            x = torch.cat((x, skips[-(s + 2)]), 1)
            x = self.convs[s](x)
            if self.deep_supervision or s == len(self.transpconvs) - 1:
                seg_outputs.append(conv3d(x, self.seg_layers[s], None, 1))
            lres_input = x
        seg_outputs = seg_outputs[::-1]
        return seg_outputs if self.deep_supervision else seg_outputs[0]


class ResidualEncoderUNet(nn.Module):
    def __init__(self, input_channels, n_stages, features_per_stage, strides, n_blocks_per_stage, num_classes,
                 deep_supervision=True):
        nn.Module.__init__(self)
        self.encoder = ResidualEncoder(input_channels, n_stages, features_per_stage, strides, n_blocks_per_stage)
        self.decoder = UNetDecoder(features_per_stage, num_classes, deep_supervision)

    def forward(self, x):
        skips = self.encoder(x)
        return self.decoder(skips)


# --------------------------------------------------------------------------- nnunetv2 loss (DC_and_CE_loss)
def dc_and_ce_loss(output, target):
    """softmax (float32 under autocast) for the soft Dice, cross-entropy; each keeps its inputs."""
    probs = torch.softmax(output, dim=1)
    ce = torch._link(torch._new((), torch.float32), (output,), (output, target))
    dc = torch._link(torch._new((), torch.float32), (probs,), (target,))
    return ce + dc


class DeepSupervisionWrapper(object):
    def __init__(self, loss, weight_factors):
        self.loss, self.weight_factors = loss, weight_factors

    def __call__(self, outputs, targets):
        total = None
        for i, (o, t) in enumerate(zip(outputs, targets)):
            if self.weight_factors[i] == 0:
                continue
            l = self.loss(o, t) * self.weight_factors[i]
            total = l if total is None else total + l
        return total


if not hasattr(torch, "softmax"):
    torch.softmax = torch.nn.functional.softmax


# ---------------------------------------------------------------- nnUNetResEncUNetLPlans.json, 3d_fullres
PLANS = {
    "plans_name": "nnUNetResEncUNetLPlans",
    "gpu_memory_target_in_gb": 24,
    "configurations": {"3d_fullres": {
        "data_identifier": "nnUNetPlans_3d_fullres", "batch_size": 2, "patch_size": [192, 224, 224],
        "spacing": [1.0, 0.78125, 0.78125],
        "architecture": {"network_class_name":
                         "dynamic_network_architectures.architectures.unet.ResidualEncoderUNet",
                         "arch_kwargs": {"n_stages": 6, "features_per_stage": [32, 64, 128, 256, 320, 320],
                                         "strides": [1, 2, 2, 2, 2, 2], "n_blocks_per_stage": [1, 3, 4, 6, 6, 6],
                                         "n_conv_per_stage_decoder": [1, 1, 1, 1, 1]}}}},
}


# ------------------------------------------------------------------------- nnunetv2 nnUNetTrainer (train)
class nnUNetTrainer(object):
    def __init__(self, plans, configuration, fold, dataset_json):
        self.configuration_manager = plans["configurations"][configuration]
        self.batch_size = self.configuration_manager["batch_size"]
        self.patch_size = self.configuration_manager["patch_size"]
        self.num_classes = len(dataset_json["labels"])
        self.device = "cuda"
        self.num_epochs, self.num_iterations_per_epoch = 1000, 250

    def initialize(self):
        kw = self.configuration_manager["architecture"]["arch_kwargs"]
        self.network = ResidualEncoderUNet(1, kw["n_stages"], kw["features_per_stage"], kw["strides"],
                                           kw["n_blocks_per_stage"], self.num_classes,
                                           deep_supervision=True).to(self.device)
        self.optimizer = torch.optim.SGD(self.network.parameters(), 1e-2, weight_decay=3e-5, momentum=0.99,
                                         nesterov=True)
        self.grad_scaler = torch.cuda.amp.GradScaler()
        self.loss = DeepSupervisionWrapper(dc_and_ce_loss, [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.0])

    def get_batch(self):
        """nnUNetDataLoader3D + batchgenerators augmentation in the background workers: host memory."""
        b, (d, h, w) = self.batch_size, self.patch_size
        data = torch._new((b, 1, d, h, w), torch.float32, "cpu")
        target = [torch._new((b, 1, d >> s, h >> s, w >> s), torch.float32, "cpu") for s in range(5)]
        return {"data": data, "target": target}

    def train_step(self, batch):
        data = batch['data']
        target = batch['target']

        data = data.to(self.device, non_blocking=True)
        if isinstance(target, list):
            target = [i.to(self.device, non_blocking=True) for i in target]
        else:
            target = target.to(self.device, non_blocking=True)

        self.optimizer.zero_grad(set_to_none=True)
        # Autocast can be annoying
        # If the device_type is 'cpu' then it's slow as heck and needs to be disabled.
        # If the device_type is 'mps' then it will complain that mps is not implemented, even if enabled=False
        # is set. Whyyyyyyy. (this is why we don't make use of enabled=False)
        # So autocast will only be active if we have a cuda device.
        with torch.autocast(self.device, enabled=True):
            output = self.network(data)
            # del data
            l = self.loss(output, target)

        if self.grad_scaler is not None:
            self.grad_scaler.scale(l).backward()
            self.grad_scaler.unscale_(self.optimizer)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            l.backward()
            self.optimizer.step()
        return {'loss': 0.0}

    def run_training(self):
        for epoch in range(self.num_epochs):
            self.network.train()
            for batch_id in range(self.num_iterations_per_epoch):
                self.train_step(self.get_batch())
            print("Epoch %d" % epoch)


def main():
    # nnUNetv2_train 512 3d_fullres 0 -p nnUNetResEncUNetLPlans
    dataset_json = {"labels": {"background": 0, "kidney": 1, "tumor": 2, "cyst": 3}}
    trainer = nnUNetTrainer(PLANS, "3d_fullres", 0, dataset_json)
    trainer.initialize()
    print("2024-06-03 09:12:41: Using optimizer SGD; plans %s (planned for %d GB of VRAM), patch size %s, batch %d"
          % (PLANS["plans_name"], PLANS["gpu_memory_target_in_gb"], trainer.patch_size, trainer.batch_size))
    trainer.run_training()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
