"""eval_fvd.py -- a video-generation group reproduces Latte's UCF-101 FVD (Latte-XL/2, class-conditional, 16
frames at 256x256, the released ucf101.pt: 674M parameters) before training their own variant, on one
A100-SXM4-80GB.  The script writes both halves of FVD-2048 in one process: the reference statistics from 2,048
real UCF-101 clips, then 2,048 generated videos, then the Frechet distance.  The I3D features come from the
reference implementation everybody compares against, the Kinetics-400 I3D on TF-Hub, wrapped as in google-
research's frechet_video_distance.py (ported to TF 2):

    import tensorflow as tf, tensorflow_hub as hub
    i3d = hub.load("https://tfhub.dev/deepmind/i3d-kinetics-400/1").signatures["default"]
    real_feats = np.concatenate([i3d_embed(clips) for clips in real_loader])   # 128 batches of 16 clips
    model = get_models(args).to(device); model.load_state_dict(find_model(args.ckpt)); model.eval()
    vae = AutoencoderKL.from_pretrained("stabilityai/sd-vae-ft-ema").to(device)
    for class_labels in batches:                          # 8 videos per batch
        samples = diffusion.p_sample_loop(model.forward_with_cfg, z.shape, z, ...)
        samples = rearrange(samples, 'b f c h w -> (b f) c h w')
        samples = vae.decode(samples / 0.18215).sample    # 128 frames at once, as Latte's sample.py does

The reference half runs first and touches the GPU first: TensorFlow, with no memory-growth setting, maps
nearly all the free memory of the card into its BFC arena when its runtime starts (here 90% of what is free,
71.5 GiB), and keeps it for the life of the process although I3D on 16 clips needs under 2 GB of it.  PyTorch
then loads Latte and the VAE in half precision (use_fp16 in their sample config: 1.3 + 0.2 GiB) into the 8
GiB left, denoises the first batch (small: 4,096 tokens per video, under 1 GiB), and fails in the VAE decoder
of that first batch (128 frames at once, as Latte's sample.py decodes them), at the upsampler to 256x256,
asking for 4 GiB with 2.4 GiB free on an 80 GB card of which PyTorch holds under 6 GiB.  Run alone, the same
decode peaks around 11 GiB and fits easily.

An expert: the memory is TensorFlow's, in this same process -- nvidia-smi shows one python process with 77.6
GiB, torch.cuda.memory_allocated says 4.4.  Stop TF from taking the card: tf.config.experimental.
set_memory_growth(gpu, True) (or TF_FORCE_GPU_ALLOW_GROWTH=true) before the first TF op, or cap it with
tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=4096)]); better still,
compute the I3D statistics in their own process (or after generation, with the PyTorch models freed).
Decoding the frames in chunks is a good habit but not the cause.
Wrong first advice: a smaller sampling batch or VAE slicing/tiling (they dodge a 72 GiB squatter by shrinking
PyTorch's share of what is left), inference_mode (sampling already runs under no_grad), mixed precision (the
models already run in fp16) or quantizing Latte, empty_cache / expandable_segments (PyTorch caches about 1 GiB:
a 4 GiB request does not come out of 2.4 GiB free and 1.1 GiB cached however they are arranged), looking for
other processes (the memory is this process's), a bigger GPU.
"""
import sys

import tensorflow as tf
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

MiB = 1 << 20


def _param(*shape, dtype=None):
    t = torch._new(shape, dtype or torch.get_default_dtype())
    p = nn.Parameter(t, requires_grad=False)
    p.shape = t.shape
    return p


# ---- stand-in gap: tensorflow_hub.load of the Kinetics-400 I3D (TF-Hub deepmind/i3d-kinetics-400/1), its
# variables in TensorFlow's arena; the signature's forward makes the tensors of an Inception-3D pass
class _I3DSignature(object):
    def __init__(self):
        self.variables = [tf.zeros((12_700_000 // 4,)) for _ in range(4)]    # 12.7M float32 weights

    def __call__(self, videos):
        n, f, h, w, c = videos.shape
        acts = [tf.zeros((n, f // 2, h // 2, w // 2, 64)), tf.zeros((n, f // 2, h // 4, w // 4, 192)),
                tf.zeros((n, f // 4, h // 8, w // 8, 480)), tf.zeros((n, f // 8, h // 16, w // 16, 832))]
        logits = tf.zeros((n, 400))
        del acts
        return {"default": logits}


class _Hub(object):
    def load(self, handle):
        m = type("Loaded", (), {})()
        m.signatures = {"default": _I3DSignature()}
        return m


hub = _Hub()
# ----


# ------------------------------------------------------------------------- frechet_video_distance.py (TF 2)
def preprocess(videos, target_resolution=(224, 224)):
    """Resizes [N, T, H, W, 3] uint8 videos to 224x224 and scales them to [-1, 1], as the reference code does."""
    n, t = videos.shape[:2]
    return tf.zeros((n, t) + tuple(target_resolution) + (3,))


def i3d_embed(i3d, videos):
    x = preprocess(videos)
    return i3d(x)["default"]


# --------------------------------------------------------------------------------------- Latte (models/latte.py)
class TransformerBlock(nn.Module):
    """A Latte block (spatial or temporal attention, MLP, adaLN-Zero modulation), hidden 1152, 16 heads."""

    def __init__(self, hidden=1152, mlp_ratio=4.0):
        nn.Module.__init__(self)
        self.qkv = _param(3 * hidden, hidden)
        self.proj = _param(hidden, hidden)
        self.fc1 = _param(int(hidden * mlp_ratio), hidden)
        self.fc2 = _param(hidden, int(hidden * mlp_ratio))
        self.adaLN_modulation = _param(6 * hidden, hidden)
        self.hidden = hidden

    def forward(self, x, c, temporal=False):
        b, n, d = x.shape
        qkv = torch._new((b, n, 3 * d), x.dtype)
        attn_out = torch._new((b, n, d), x.dtype)       # F.scaled_dot_product_attention over 256 (or 16) tokens
        del qkv
        h = torch._new((b, n, int(d * 4)), x.dtype)
        x = torch._new((b, n, d), x.dtype)
        del h, attn_out
        return x


class Latte(nn.Module):
    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 num_frames=16, num_classes=101):
        nn.Module.__init__(self)
        self.x_embedder = _param(hidden_size, in_channels, patch_size, patch_size)
        self.t_embedder = _param(hidden_size * 256 + hidden_size * hidden_size)
        self.y_embedder = _param((num_classes + 1) * hidden_size)
        self.blocks = [TransformerBlock(hidden_size) for _ in range(depth)]
        for i, blk in enumerate(self.blocks):
            setattr(self, "block%d" % i, blk)
        self.final_layer = _param(patch_size * patch_size * 2 * in_channels * hidden_size + 2 * hidden_size ** 2)
        self.num_frames, self.hidden = num_frames, hidden_size
        self.tokens_per_frame = (input_size // patch_size) ** 2

    def forward(self, x, t, y):
        b, f = x.shape[:2]
        h = torch._new((b * f, self.tokens_per_frame, self.hidden), x.dtype)
        for i, blk in enumerate(self.blocks):
            h = blk(h, None, temporal=(i % 2 == 1))
        return torch._new((b, f, 8, 32, 32), x.dtype)     # learned sigma: 2 x 4 channels

    def forward_with_cfg(self, x, t, y, cfg_scale):
        half = x[: x.shape[0] // 2]
        combined = torch.cat([half, half], dim=0)
        model_out = self.forward(combined, t, y)
        eps = torch._new(x.shape, x.dtype)
        return eps


class DiagonalGaussianDiffusion(object):
    def __init__(self, num_sampling_steps):
        self.num_timesteps = num_sampling_steps

    def p_sample_loop(self, model_fn, shape, noise, model_kwargs=None, progress=False, device=None):
        img = noise
        for i in reversed(range(self.num_timesteps)):
            t = torch._new((shape[0],), torch.int64)
            out = model_fn(img, t, **model_kwargs)
            img = torch._new(shape, noise.dtype)
            del out
        return img


# ------------------------------------------------------------------------- diffusers AutoencoderKL (sd-vae-ft-ema)
def _conv(x, out_ch, scale=1):
    """A 3x3 convolution (with the GroupNorm/SiLU before it) of the decoder: its output."""
    n, c, h, w = x.shape
    return torch._new((n, out_ch, h * scale, w * scale), x.dtype)


class UpDecoderBlock2D(nn.Module):
    def __init__(self, in_ch, out_ch, add_upsample):
        nn.Module.__init__(self)
        self.resnets = _param(3 * (9 * in_ch * out_ch + 9 * out_ch * out_ch))
        self.upsampler = _param(9 * out_ch * out_ch) if add_upsample else None
        self.out_ch, self.add_upsample = out_ch, add_upsample

    def forward(self, hidden_states):
        for _ in range(3):
            residual = hidden_states
            h = _conv(hidden_states, self.out_ch)     # norm1 -> silu -> conv1
            h = _conv(h, self.out_ch)                 # norm2 -> silu -> conv2
            hidden_states = h if residual.shape == h.shape else _conv(residual, self.out_ch)
            del residual, h
        if self.add_upsample:
            hidden_states = nn.functional.interpolate(hidden_states, scale_factor=2.0, mode="nearest")
            hidden_states = _conv(hidden_states, self.out_ch)
        return hidden_states


class Decoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv_in = _param(512 * 4 * 9)
        self.mid_block = _param(2 * 2 * 9 * 512 * 512 + 4 * 512 * 512)
        self.up_blocks = [UpDecoderBlock2D(512, 512, True), UpDecoderBlock2D(512, 512, True),
                          UpDecoderBlock2D(512, 256, True), UpDecoderBlock2D(256, 128, False)]
        for i, blk in enumerate(self.up_blocks):
            setattr(self, "up%d" % i, blk)

    def forward(self, z):
        sample = _conv(z, 512)
        sample = _conv(sample, 512)          # mid block (resnets + attention at 32x32)
        for up_block in self.up_blocks:
            sample = up_block(sample)
        return _conv(sample, 3)


class DecoderOutput(object):
    def __init__(self, sample):
        self.sample = sample


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = _param(34_163_592)
        self.decoder = Decoder()
        self.quant = _param(2 * 8 * 8 + 4 * 4)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def decode(self, z):
        return DecoderOutput(self.decoder(z))


def rearrange_to_frames(x):
    """einops.rearrange(x, 'b f c h w -> (b f) c h w'): a view."""
    b, f, c, h, w = x.shape
    return x.reshape(b * f, c, h, w)


# ------------------------------------------------------------------------------------------------- the job
def main():
    num_fvd_videos, batch_size, num_frames = 2048, 8, 16
    print("TensorFlow %s, GPUs: %s" % (tf.__version__, tf.config.list_physical_devices("GPU")))

    # 1. reference statistics: 2,048 real UCF-101 clips (16 frames, every 3rd frame) through the TF-Hub I3D
    i3d = hub.load("https://tfhub.dev/deepmind/i3d-kinetics-400/1").signatures["default"]
    real_feats = []
    for start in range(0, num_fvd_videos, 16):
        clips = tf.zeros((16, num_frames, 240, 320, 3), tf.float32)     # decoded with decord, uint8 -> float
        real_feats.append(i3d_embed(i3d, clips))
        del clips
    print("real I3D features: %d clips" % (len(real_feats) * 16))

    # 2. generated videos: Latte-XL/2 on UCF-101, 16x256x256, DDPM 250 steps, cfg 7.0
    device = "cuda"
    torch.set_default_dtype(torch.float16)        # use_fp16: True (sample config): model and VAE in half
    model = Latte(input_size=32, num_frames=num_frames, num_classes=101).to(device)
    # model.load_state_dict(find_model("pretrained/ucf101.pt")) -- read on the CPU, copied in place
    model.eval()
    vae = AutoencoderKL.from_pretrained("stabilityai/sd-vae-ft-ema").to(device)
    torch.set_default_dtype(torch.float32)
    print("Latte-XL/2: %.1fM parameters; VAE %.1fM (fp16)" % (sum(p.nbytes for p in model.parameters()) / 2e6,
                                                               sum(p.nbytes for p in vae.parameters()) / 2e6))
    diffusion = DiagonalGaussianDiffusion(num_sampling_steps=250)

    fake_feats = []
    with torch.no_grad():
        for b in range(num_fvd_videos // batch_size):
            z = torch.zeros((2 * batch_size, num_frames, 4, 32, 32), dtype=torch.float16, device=device)
            y = torch.zeros((2 * batch_size,), dtype=torch.int64, device=device)
            model_kwargs = dict(y=y, cfg_scale=7.0)
            samples = diffusion.p_sample_loop(model.forward_with_cfg, z.shape, z, model_kwargs=model_kwargs)
            samples = samples[:batch_size]
            samples = rearrange_to_frames(samples)
            samples = vae.decode(samples / 0.18215).sample
            # rearrange back, to uint8 on the CPU, then I3D in TensorFlow
            fake_feats.append(i3d_embed(i3d, tf.zeros((batch_size, num_frames, 256, 256, 3), tf.float32)))
            del samples, z, y
            print("generated %d/%d" % ((b + 1) * batch_size, num_fvd_videos))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
