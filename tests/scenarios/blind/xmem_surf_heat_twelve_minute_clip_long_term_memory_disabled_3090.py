"""eval.py -- XMem (Cheng & Schwing, ECCV 2022) semi-supervised video object segmentation, run by a sports-
analytics start-up on surf-contest footage.  Each heat is filmed from the beach by one 1080p camera at 30 fps
for 12 minutes; an annotator draws the first-frame masks of the three surfers in the water, XMem propagates
them over the whole heat, and the masks feed a wave-count / ride-score model.  The machine is a workstation
with an RTX 3090 (24 GB).

They had first benchmarked XMem on DAVIS with long-term memory switched off (faster, and DAVIS clips are
short) and kept that command for the heats:

    python eval.py --model saves/XMem.pth --dataset G --generic_path /data/heats \
        --output /data/masks --size 480 --disable_long_term

so in eval.py
    config['enable_long_term'] = not config['disable_long_term']          # False
    torch.autograd.set_grad_enabled(False)
    processor = InferenceCore(network, config=config)
    for ti, data in enumerate(loader):
        with torch.cuda.amp.autocast(enabled=not args.benchmark):
            rgb = data['rgb'].cuda()[0]
            prob = processor.step(rgb, msk, labels, end=(ti==vid_length-1))

and in the MemoryManager every memory frame (mem_every=5) is concatenated onto the working memory
(KeyValueMemoryStore.add: self.k = torch.cat([self.k, key], -1); self.v[gi] = torch.cat([self.v[gi], value], -1))
and, with long-term memory off, never compressed or evicted.  Every frame reads the whole working memory:
get_similarity builds [N_mem x HW] affinity matrices (a_sq, two_ab, their sum, the shrinkage-scaled copy), where
N_mem = memory frames x 1620 positions (480x864 padded input at stride 16: 30x54).  On DAVIS (70-frame clips)
this is nothing; on a 12-minute heat (21,600 frames, 4,320 memory frames) both the memory bank (5.2 MB per
memory frame: keys 64 ch and values 512 ch x 3 surfers, fp16) and the per-frame affinity temporaries (about
26 MB per memory frame, fp16) grow linearly with the frames seen.  The job dies two minutes into the first
heat (frame ~3,600 of 21,600, 720 memory frames), in get_similarity, asking for one more [1, N_mem, 1620]
matrix (3.5 GiB), with the card held by the memory bank (3.5 GiB) and this frame's earlier temporaries.

An expert: memory grows with every memory frame because the working memory is unbounded; this is exactly
what XMem's long-term memory is for.  Drop --disable_long_term (the default config keeps the working memory
between min_mid_term_frames=5 and max_mid_term_frames=10 and consolidates into at most
max_long_term_elements=10000 prototypes), so the memory -- and each frame's affinity -- stays bounded for any
video length; if the accuracy on this footage matters, raise max_mid_term_frames / max_long_term_elements
within what the card holds.  Stop-gaps: a larger mem_every, a smaller --size, or cutting the heat into chunks
re-seeded from the last mask (all lose accuracy or only delay the failure).
Wrong first advice: a smaller batch (batch 1, one frame at a time), gradient checkpointing or inference_mode
(inference, grad already off), mixed precision (autocast already on; halving still grows without bound),
quantizing a small model, expandable_segments / empty_cache (the memory is live; a different allocator only
moves the failing frame a few seconds later), a bigger GPU (an 80 GB card fails near minute 7 of a 12-minute
heat), killing other processes (there are none).
"""
import argparse
import math
import sys
import warnings

import torch

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

# ---- stand-in gaps: torch.autograd.set_grad_enabled (called as a function, as eval.py does)
def _set_grad_enabled(mode):
    torch._grad.enabled = bool(mode)


if not hasattr(torch.autograd, "set_grad_enabled"):
    torch.autograd.set_grad_enabled = _set_grad_enabled
# ----


def _param(*shape):
    t = torch._new(shape, torch.float32)
    p = torch.nn.Parameter(t)
    p.shape = t.shape
    return p


# ------------------------------------------------------------------------------------------- model/network.py
class KeyEncoder(torch.nn.Module):
    """ResNet-50 trunk up to layer3 (stride 16)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv1 = _param(64 * 3 * 7 * 7)
        self.layer1 = _param(215_808)
        self.layer2 = _param(1_219_584)
        self.layer3 = _param(7_098_368)

    def forward(self, f):
        h, w = f.shape[-2:]
        f4 = torch._new((1, 256, h // 4, w // 4), torch._amp())
        f8 = torch._new((1, 512, h // 8, w // 8), torch._amp())
        f16 = torch._new((1, 1024, h // 16, w // 16), torch._amp())
        return f16, f8, f4


class KeyProjection(torch.nn.Module):
    def __init__(self, indim=1024, keydim=64):
        torch.nn.Module.__init__(self)
        self.key_proj = _param(keydim, indim, 3, 3)
        self.d_proj = _param(1, indim, 3, 3)
        self.e_proj = _param(keydim, indim, 3, 3)

    def forward(self, x, need_s, need_e):
        b, c, h, w = x.shape
        key = torch._new((b, 64, h, w), torch._amp())
        shrinkage = torch._new((b, 1, h, w), torch._amp()) if need_s else None
        selection = torch._new((b, 64, h, w), torch._amp()) if need_e else None
        return key, shrinkage, selection


class ValueEncoder(torch.nn.Module):
    """ResNet-18 trunk on image + mask + other masks, fused with f16, and the hidden-state GRU (deep update)."""

    def __init__(self, value_dim=512, hidden_dim=64):
        torch.nn.Module.__init__(self)
        self.trunk = _param(2_782_784)
        self.fuser = _param(5_767_168)
        self.hidden_reinforce = _param(1_327_296)

    def forward(self, image, f16, h, masks, others, is_deep_update=True):
        num_objects = masks.shape[1]
        _, _, H, W = f16.shape
        g = torch._new((1, num_objects, 256, H, W), torch._amp())     # the ResNet-18 trunk on image + masks
        g = torch._new((1, num_objects, 512, H, W), torch._amp())     # fused with f16 (FeatureFusionBlock)
        if is_deep_update:
            h = torch._new((1, num_objects, 64, H, W), torch._amp())
        return g, h


class Decoder(torch.nn.Module):
    def __init__(self, val_dim=512, hidden_dim=64):
        torch.nn.Module.__init__(self)
        self.fuser = _param(5_637_120)
        self.hidden_update = _param(663_744)
        self.up_16_8 = _param(2_360_320)
        self.up_8_4 = _param(1_180_160)
        self.pred = _param(2_305)

    def forward(self, f16, f8, f4, hidden_state, memory_readout, h_out=True):
        batch_size, num_objects = memory_readout.shape[:2]
        _, _, H, W = f16.shape
        g16 = torch._new((batch_size, num_objects, 512, H, W), torch._amp())
        g8 = torch._new((batch_size, num_objects, 256, H * 2, W * 2), torch._amp())
        g4 = torch._new((batch_size, num_objects, 256, H * 4, W * 4), torch._amp())
        logits = torch._new((batch_size, num_objects, H * 4, W * 4), torch._amp())
        del g16, g8, g4
        if h_out:
            hidden_state = torch._new((batch_size, num_objects, 64, H, W), torch._amp())
        return hidden_state, logits


class XMem(torch.nn.Module):
    def __init__(self, config, model_path=None):
        torch.nn.Module.__init__(self)
        self.key_encoder = KeyEncoder()
        self.key_proj = KeyProjection(1024, keydim=64)
        self.value_encoder = ValueEncoder(512, 64)
        self.decoder = Decoder(512, 64)

    def encode_key(self, frame, need_sk=True, need_ek=True):
        f16, f8, f4 = self.key_encoder(frame)
        key, shrinkage, selection = self.key_proj(f16, need_sk, need_ek)
        return key, shrinkage, selection, f16, f8, f4

    def encode_value(self, frame, image_feat_f16, h16, masks, is_deep_update=True):
        others = masks
        g16, h16 = self.value_encoder(frame, image_feat_f16, h16, masks, others, is_deep_update)
        return g16, h16

    def segment(self, multi_scale_features, memory_readout, hidden_state, selector=None, h_out=True,
                strip_bg=True):
        hidden_state, logits = self.decoder(*multi_scale_features, hidden_state, memory_readout, h_out=h_out)
        prob = torch._new((1, logits.shape[1] + 1) + logits.shape[2:], torch.float32)   # aggregate() with bg
        logits = torch._new(prob.shape, torch.float32)
        return hidden_state, logits, prob


# ---------------------------------------------------------------------------------- model/memory_util.py
def get_similarity(mk, ms, qk, qe):
    # used for training/inference and memory reading/memory potentiation
    # mk: B x CK x [N]    - Memory keys
    # ms: B x  1 x [N]    - Memory shrinkage
    # qk: B x CK x [HW/P] - Query keys
    # qe: B x CK x [HW/P] - Query selection
    # Dimensions in [] are flattened
    CK = mk.shape[1]
    mk = mk.flatten(start_dim=2)
    ms = ms.flatten(start_dim=1).unsqueeze(2) if ms is not None else None
    qk = qk.flatten(start_dim=2)
    qe = qe.flatten(start_dim=2) if qe is not None else None

    if qe is not None:
        # See appendix for derivation
        # or you can just trust me ヽ(ー_ー )ノ
        mk = mk.transpose(1, 2)
        a_sq = (mk.pow(2) @ qe)
        two_ab = 2 * (mk @ (qk * qe))
        b_sq = (qe * qk.pow(2)).sum(1, keepdim=True)
        similarity = (-a_sq+two_ab-b_sq)
    else:
        # similar to STCN if we don't have the selection term
        a_sq = mk.pow(2).sum(1).unsqueeze(2)
        two_ab = 2 * (mk.transpose(1, 2) @ qk)
        similarity = (-a_sq+two_ab)

    if ms is not None:
        similarity = similarity * ms / math.sqrt(CK)   # B*N*HW
    else:
        similarity = similarity / math.sqrt(CK)   # B*N*HW

    return similarity


def do_softmax(similarity, top_k=None, inplace=False, return_usage=False):
    # normalize similarity with top-k softmax
    # similarity: B x N x [HW/P]
    # use inplace with care
    if top_k is not None:
        values, indices = torch.topk(similarity, k=top_k, dim=1)

        x_exp = values.exp_()
        x_exp /= torch.sum(x_exp, dim=1, keepdim=True)
        if inplace:
            similarity.zero_().scatter_(1, indices, x_exp)  # B*N*HW
            affinity = similarity
        else:
            affinity = torch.zeros_like(similarity).scatter_(1, indices, x_exp)  # B*N*HW
    else:
        affinity = similarity
    return affinity


# ------------------------------------------------------------------------------ inference/kv_memory_store.py
class KeyValueMemoryStore:
    """Works for key/value pairs type storage, e.g., working and long-term memory."""

    def __init__(self, count_usage: bool):
        self.count_usage = count_usage
        self.k = None
        self.v = []
        self.obj_groups = []
        self.all_objects = []
        self.s = self.e = None

    def add(self, key, value, shrinkage, selection, objects=None):
        new_count = None
        # add the key
        if self.k is None:
            self.k = key
            self.s = shrinkage
            self.e = selection
        else:
            self.k = torch.cat([self.k, key], -1)
            if shrinkage is not None:
                self.s = torch.cat([self.s, shrinkage], -1)
            if selection is not None:
                self.e = torch.cat([self.e, selection], -1)

        # add the value
        if objects is not None:
            # When objects is given, v is a tensor; used in working memory
            assert isinstance(value, torch.Tensor)
            # First consume objects that are already in the memory bank
            # cannot use set here because we need to preserve order
            # shift by one as background is not part of value
            remaining_objects = [obj-1 for obj in objects]
            for gi, group in enumerate(self.obj_groups):
                for obj in group:
                    # should properly raise an error if there are overlaps in obj_groups
                    remaining_objects.remove(obj)
                self.v[gi] = torch.cat([self.v[gi], value[group]], -1)

            # If there are remaining objects, add them as a new group
            if len(remaining_objects) > 0:
                new_group = list(remaining_objects)
                self.v.append(value)
                self.obj_groups.append(new_group)
                self.all_objects.extend(new_group)

    @property
    def size(self):
        return 0 if self.k is None else self.k.shape[-1]

    @property
    def key(self):
        return self.k

    @property
    def shrinkage(self):
        return self.s

    @property
    def value(self):
        return self.v

    @property
    def num_groups(self):
        return len(self.v)


# ------------------------------------------------------------------------------- inference/memory_manager.py
class MemoryManager:
    """Manages all three memory stores and the transition between working/long-term memory."""

    def __init__(self, config):
        self.hidden_dim = config['hidden_dim']
        self.top_k = config['top_k']
        self.enable_long_term = config['enable_long_term']
        self.enable_long_term_usage = config['enable_long_term_count_usage']
        if self.enable_long_term:
            self.max_mt_frames = config['max_mid_term_frames']
            self.min_mt_frames = config['min_mid_term_frames']
            self.num_prototypes = config['num_prototypes']
            self.max_long_elements = config['max_long_term_elements']
        self.CK = self.CV = None
        self.H = self.W = None
        self.hidden = None
        self.work_mem = KeyValueMemoryStore(count_usage=self.enable_long_term)
        self.reset_config = True

    def _readout(self, affinity, v):
        # this function is for a single object group
        return v @ affinity

    def match_memory(self, query_key, selection):
        # query_key: B x C^k x H x W
        # selection:  B x C^k x H x W
        num_groups = self.work_mem.num_groups
        h, w = query_key.shape[-2:]

        query_key = query_key.flatten(start_dim=2)
        selection = selection.flatten(start_dim=2) if selection is not None else None

        """
        Memory readout using keys
        """
        # No long-term memory
        similarity = get_similarity(self.work_mem.key, self.work_mem.shrinkage, query_key, selection)
        affinity = do_softmax(similarity, inplace=True, top_k=self.top_k, return_usage=False)
        all_memory_value = self.work_mem.value

        # Shared affinity within each group
        all_readout_mem = torch.cat([self._readout(affinity, gv) for gv in all_memory_value], 0)
        return all_readout_mem.reshape(all_readout_mem.shape[0], self.CV, h, w)

    def add_memory(self, key, shrinkage, value, objects, selection=None):
        # key: 1*C*H*W
        # value: 1*num_objects*C*H*W
        # objects contain a list of object indices
        if self.H is None or self.reset_config:
            self.reset_config = False
            self.H, self.W = key.shape[-2:]
            self.HW = self.H*self.W
            if self.enable_long_term:
                # convert from num. frames to num. nodes
                self.min_work_elements = self.min_mt_frames*self.HW
                self.max_work_elements = self.max_mt_frames*self.HW

        # key:   1*C*N
        # value: num_objects*C*N
        key = key.flatten(start_dim=2)
        shrinkage = shrinkage.flatten(start_dim=2)
        value = value[0].flatten(start_dim=2)

        self.CK = key.shape[1]
        self.CV = value.shape[1]

        if selection is not None:
            if not self.enable_long_term:
                warnings.warn('the selection factor is only needed in long-term mode', UserWarning)
            selection = selection.flatten(start_dim=2)

        self.work_mem.add(key, value, shrinkage, selection, objects)

        # long-term memory cleanup
        if self.enable_long_term:
            # Do memory compressed if needed
            if self.work_mem.size >= self.max_work_elements:
                self.compress_features()

    def compress_features(self):
        raise NotImplementedError("long-term memory is off in this run")

    def create_hidden_state(self, n, sample_key):
        # n is the TOTAL number of objects
        h, w = sample_key.shape[-2:]
        if self.hidden is None:
            self.hidden = torch.zeros((1, n, self.hidden_dim, h, w), dtype=torch.float16)

    def set_hidden(self, hidden):
        self.hidden = hidden

    def get_hidden(self):
        return self.hidden


# --------------------------------------------------------------------------------- inference/inference_core.py
def pad_divide_by(in_img, d):
    h, w = in_img.shape[-2:]
    new_h = h + (d - h % d) % d
    new_w = w + (d - w % d) % d
    out = torch._new(in_img.shape[:-2] + (new_h, new_w), in_img.dtype)
    return out, (0, new_w - w, 0, new_h - h)


class InferenceCore:
    def __init__(self, network, config):
        self.config = config
        self.network = network
        self.mem_every = config['mem_every']
        self.deep_update_every = config['deep_update_every']
        self.enable_long_term = config['enable_long_term']
        # if deep_update_every < 0, synchronize deep update with memory frame
        self.deep_update_sync = (self.deep_update_every < 0)
        self.clear_memory()
        self.all_labels = None

    def clear_memory(self):
        self.curr_ti = -1
        self.last_mem_ti = 0
        if not self.deep_update_sync:
            self.last_deep_update_ti = -self.deep_update_every
        self.memory = MemoryManager(config=self.config)

    def set_all_labels(self, all_labels):
        self.all_labels = all_labels

    def step(self, image, mask=None, valid_labels=None, end=False):
        # image: 3*H*W
        # mask: num_objects*H*W or None
        self.curr_ti += 1
        image, self.pad = pad_divide_by(image, 16)
        image = image.unsqueeze(0)  # add the batch dimension

        is_mem_frame = ((self.curr_ti-self.last_mem_ti >= self.mem_every) or (mask is not None)) and (not end)
        need_segment = (self.curr_ti > 0) and ((valid_labels is None) or (len(self.all_labels) != len(valid_labels)))
        is_deep_update = (
            (self.deep_update_sync and is_mem_frame) or  # synchronized
            (not self.deep_update_sync and self.curr_ti-self.last_deep_update_ti >= self.deep_update_every)  # no-sync
        ) and (not end)
        is_normal_update = (not self.deep_update_sync or not is_deep_update) and (not end)

        key, shrinkage, selection, f16, f8, f4 = self.network.encode_key(
            image, need_ek=(self.enable_long_term or need_segment), need_sk=is_mem_frame)
        multi_scale_features = (f16, f8, f4)

        # segment the current frame is needed
        if need_segment:
            memory_readout = self.memory.match_memory(key, selection).unsqueeze(0)
            hidden, _, pred_prob_with_bg = self.network.segment(multi_scale_features, memory_readout,
                                                                self.memory.get_hidden(), h_out=is_normal_update,
                                                                strip_bg=False)
            # remove batch dim
            pred_prob_with_bg = pred_prob_with_bg[0]
            pred_prob_no_bg = pred_prob_with_bg[1:]
            if is_normal_update:
                self.memory.set_hidden(hidden)
        else:
            pred_prob_no_bg = pred_prob_with_bg = None

        # use the input mask if any
        if mask is not None:
            mask, _ = pad_divide_by(mask, 16)
            pred_prob_with_bg = torch._new((1, mask.shape[0] + 1) + mask.shape[1:], torch.float32)
            self.memory.create_hidden_state(len(self.all_labels), key)

        # save as memory if needed
        if is_mem_frame:
            value, hidden = self.network.encode_value(image, f16, self.memory.get_hidden(),
                                                      pred_prob_with_bg, is_deep_update=is_deep_update)
            self.memory.add_memory(key, shrinkage, value, self.all_labels,
                                   selection=selection if self.enable_long_term else None)
            self.last_mem_ti = self.curr_ti

            if is_deep_update:
                self.memory.set_hidden(hidden)
                self.last_deep_update_ti = self.curr_ti

        return pred_prob_with_bg


# ---------------------------------------------------------------------------------------------- data loading
class LongVideoReader:
    """inference/data/video_reader.VideoReader over the heat's JPEG frames (ffmpeg -r 30), resized so that the
    shorter side is --size (480x854), as a DataLoader with batch_size=1 hands them out."""

    def __init__(self, vid_name, n_frames, size, first_mask_objects):
        self.vid_name = vid_name
        self.n = n_frames
        self.h, self.w = size, int(round(size * 16 / 9))
        self.objects = first_mask_objects

    def __len__(self):
        return self.n

    def __iter__(self):
        for ti in range(self.n):
            data = {"info": {"frame": "%05d.jpg" % ti, "shape": (1080, 1920)},
                    "rgb": torch.zeros((1, 3, self.h, self.w), dtype=torch.float32, device="cpu")}
            if ti == 0:
                data["mask"] = torch.zeros((1, self.objects, self.h, self.w), dtype=torch.float32, device="cpu")
            yield data


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--model', default='saves/XMem.pth')
    parser.add_argument('--dataset', default='G')
    parser.add_argument('--generic_path', default='/data/heats')
    parser.add_argument('--output', default='/data/masks')
    parser.add_argument('--top_k', type=int, default=30)
    parser.add_argument('--mem_every', type=int, default=5)
    parser.add_argument('--deep_update_every', type=int, default=-1)
    parser.add_argument('--disable_long_term', action='store_true', default=True)
    parser.add_argument('--max_mid_term_frames', type=int, default=10)
    parser.add_argument('--min_mid_term_frames', type=int, default=5)
    parser.add_argument('--max_long_term_elements', type=int, default=10000)
    parser.add_argument('--num_prototypes', type=int, default=128)
    parser.add_argument('--size', type=int, default=480)
    parser.add_argument('--benchmark', action='store_true')
    args = parser.parse_args()
    config = vars(args)
    config['enable_long_term'] = not config['disable_long_term']
    config['hidden_dim'] = 64
    config['enable_long_term_count_usage'] = False

    torch.autograd.set_grad_enabled(False)

    network = XMem(config, args.model).cuda().eval()
    # network.load_weights(torch.load(args.model)) -- the weights are read on the CPU, copied in place
    print("XMem loaded: %.1fM parameters" % (sum(p.nbytes for p in network.parameters()) / 4 / 1e6))

    heats = [("2024_qf_heat3_cam1", 12 * 60 * 30, 3), ("2024_qf_heat4_cam1", 12 * 60 * 30, 4)]
    for vid_name, n_frames, n_surfers in heats:
        vid_reader = LongVideoReader(vid_name, n_frames, args.size, n_surfers)
        vid_length = len(vid_reader)
        processor = InferenceCore(network, config=config)
        labels = list(range(1, n_surfers + 1))
        processor.set_all_labels(labels)
        print("%s: %d frames (%.0f min at 30 fps), %d objects, long-term memory %s" % (
            vid_name, vid_length, vid_length / 30 / 60, n_surfers, config['enable_long_term']))
        for ti, data in enumerate(vid_reader):
            with torch.cuda.amp.autocast(enabled=not args.benchmark):
                rgb = data['rgb'].cuda()[0]
                msk = data.get('mask')
                if msk is not None:
                    msk = msk.cuda()[0]
                prob = processor.step(rgb, msk, labels if msk is not None else None, end=(ti == vid_length-1))
                # out_mask = torch.max(prob, dim=0).indices -> .cpu().numpy() -> PNG
                del rgb, msk, prob
            if ti % 900 == 0:
                print("  frame %d (%.0f s), working memory %d memory frames" % (
                    ti, ti / 30.0, processor.memory.work_mem.size // max(processor.memory.HW or 1, 1)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
