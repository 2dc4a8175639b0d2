"""app.py -- an animation studio's internal "storyboard to animatic" tool: a Gradio app with two tabs, text-to-
video from a panel's description and image-to-video from the drawn panel, both CogVideoX-5B (diffusers 0.30),
on one cloud A100-SXM4-40GB.  The developer followed each model card's snippet and loaded both pipelines at
start-up, so that either tab answers without a load:

    pipe_t2v = CogVideoXPipeline.from_pretrained("THUDM/CogVideoX-5b", torch_dtype=torch.bfloat16).to("cuda")
    pipe_t2v.vae.enable_tiling()
    pipe_i2v = CogVideoXImageToVideoPipeline.from_pretrained("THUDM/CogVideoX-5b-I2V",
                                                             torch_dtype=torch.bfloat16).to("cuda")
    pipe_i2v.vae.enable_tiling()

Each from_pretrained loads a whole repository: the T5-XXL text encoder (4.76B parameters, 8.9 GiB in bf16),
the CogVideoX transformer (5.6B, 10.4 GiB) and the 3D VAE (0.2B, 0.4 GiB) -- 19.7 GiB per pipeline.  The I2V
repository ships the same T5 encoder and the same VAE as the T2V one, so the second pipeline puts 9.3 GiB of
identical weights on the card a second time.  The app never serves a request: after the T2V pipeline (19.7
GiB), the I2V text encoder and VAE (9.3 GiB), the .to("cuda") of the I2V transformer fails near its last
blocks, asking for one 72 MiB weight with 62 MiB free and 39 GiB allocated -- all of it weights.

An expert: two copies of T5-XXL and of the VAE.  Build the second pipeline from the first one's components
(from_pretrained takes them as keyword arguments; CogVideoX's own demo Space builds its I2V pipeline so): CogVideoXImageToVideoPipeline.from_pretrained("THUDM/CogVideoX-5b-I2V",
text_encoder=pipe_t2v.text_encoder, tokenizer=pipe_t2v.tokenizer, vae=pipe_t2v.vae, torch_dtype=torch.bfloat16)
-- only the I2V transformer is new: 30.1 GiB for both, with room for generation (the transformer's peak at
49 x 480 x 720 with classifier-free guidance is about 2.3 GiB, then the tiled VAE decode).  Alternatives that
also work: enable_model_cpu_offload() on both pipelines (a few seconds per request of a ~3-minute
generation), or keep one transformer on the GPU at a time.
Wrong first advice: quantizing the transformers (int8 via torchao: changes the output to keep a duplicate),
a bigger GPU (an 80 GB card hides the duplicate), a smaller batch (one video per request; the app never got
to one), inference_mode (loading; the pipelines run under no_grad anyway), mixed precision (already bf16),
expandable_segments / empty_cache (the 0.4 GiB cached is rounding slivers of 771 weight tensors; nothing to
release), flash attention (SDPA already), killing other processes (there are none).
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
GB = 1e9


# ---- stand-in gaps: parameters with shapes (a layer's weights as one tensor each: the sizes are the real ones)
def _param(*shape, dtype=None):
    t = torch._new(shape, dtype or torch.get_default_dtype())
    p = nn.Parameter(t, requires_grad=False)
    p.shape = t.shape
    return p


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False):
    """F.scaled_dot_product_attention (flash / memory-efficient kernel): the output only, no T x T matrix."""
    return torch._new(query.shape, query.dtype)


class _OnHost(object):
    """A model from_pretrained has read into host memory (safetensors -> CPU tensors); .to("cuda") copies its
    parameters to the GPU one by one (here: builds it there)."""

    def __init__(self, ctor):
        self.ctor = ctor

    def to(self, device):
        return self.ctor()


# ----


# ------------------------------------------------------------------------------ transformers T5EncoderModel
class T5EncoderModel(nn.Module):
    """google/t5-v1_1-xxl encoder (CogVideoX's text encoder): 24 blocks, d_model 4096, d_ff 10240, 64 heads."""

    def __init__(self):
        nn.Module.__init__(self)
        self.shared = _param(32128, 4096, dtype=torch.bfloat16)
        self.blocks = []
        for i in range(24):
            blk = nn.Module()
            blk.attn = _param(4 * 4096 * 4096, dtype=torch.bfloat16)
            blk.ff = _param(3 * 4096 * 10240 + 2 * 4096, dtype=torch.bfloat16)
            self.blocks.append(blk)
            setattr(self, "block_%d" % i, blk)

    def forward(self, input_ids):
        b, n = input_ids.shape
        h = torch._new((b, n, 4096), torch.bfloat16)
        for blk in self.blocks:
            ff = torch._new((b, n, 10240), torch.bfloat16)
            h = torch._new((b, n, 4096), torch.bfloat16)
            del ff
        return (h,)


# ------------------------------------------------------------- diffusers CogVideoXTransformer3DModel (5B)
class CogVideoXBlock(nn.Module):
    def __init__(self, dim=3072, ff_inner_dim=12288, time_embed_dim=512):
        nn.Module.__init__(self)
        self.norm1 = _param(time_embed_dim * 6 * dim + 6 * dim, dtype=torch.bfloat16)     # CogVideoXLayerNormZero
        self.to_q = _param(dim, dim, dtype=torch.bfloat16)
        self.to_k = _param(dim, dim, dtype=torch.bfloat16)
        self.to_v = _param(dim, dim, dtype=torch.bfloat16)
        self.to_out = _param(dim, dim, dtype=torch.bfloat16)
        self.norm2 = _param(time_embed_dim * 6 * dim + 6 * dim, dtype=torch.bfloat16)
        self.ff_proj = _param(ff_inner_dim, dim, dtype=torch.bfloat16)
        self.ff_out = _param(dim, ff_inner_dim, dtype=torch.bfloat16)
        self.heads = 48

    def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None):
        text_seq_length = encoder_hidden_states.size(1)

        # norm & modulate
        norm_hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)

        # attention: CogVideoXAttnProcessor2_0
        query = F.linear(norm_hidden_states, self.to_q)
        key = F.linear(norm_hidden_states, self.to_k)
        value = F.linear(norm_hidden_states, self.to_v)
        b, n, d = query.shape
        hidden = scaled_dot_product_attention(query.reshape(b, n, self.heads, d // self.heads),
                                              key.reshape(b, n, self.heads, d // self.heads),
                                              value.reshape(b, n, self.heads, d // self.heads))
        del query, key, value
        attn_output = F.linear(hidden.reshape(b, n, d), self.to_out)
        del hidden
        # hidden_states = hidden_states + gate_msa * attn_hidden_states (the video tokens of attn_output)
        hidden_states = hidden_states + torch._new(hidden_states.shape, hidden_states.dtype)
        del attn_output

        # feed-forward (GELU tanh)
        norm_hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        ff_hidden = F.gelu(F.linear(norm_hidden_states, self.ff_proj), approximate="tanh")
        ff_output = F.linear(ff_hidden, self.ff_out)
        del ff_hidden
        hidden_states = hidden_states + torch._new(hidden_states.shape, hidden_states.dtype)
        encoder_hidden_states = encoder_hidden_states + torch._new(encoder_hidden_states.shape,
                                                                   encoder_hidden_states.dtype)
        del ff_output
        return hidden_states, encoder_hidden_states


class CogVideoXTransformer3DModel(nn.Module):
    def __init__(self, in_channels=16, num_layers=42, dim=3072):
        nn.Module.__init__(self)
        self.patch_embed = _param(dim * in_channels * 4 + 4096 * dim, dtype=torch.bfloat16)
        self.time_embedding = _param(512 * dim + dim * dim, dtype=torch.bfloat16)
        self.transformer_blocks = [CogVideoXBlock(dim) for _ in range(num_layers)]
        for i, blk in enumerate(self.transformer_blocks):
            setattr(self, "block_%d" % i, blk)
        self.norm_final = _param(2 * dim, dtype=torch.bfloat16)
        self.proj_out = _param(dim * 64 + 6 * dim * 512, dtype=torch.bfloat16)
        self.dim = dim

    def forward(self, hidden_states, encoder_hidden_states, timestep, image_rotary_emb=None, return_dict=False):
        batch_size, num_frames, channels, height, width = hidden_states.shape
        # 2. Patch embedding: 2x2 patches of each latent frame, after the 226 text tokens
        video_tokens = num_frames * (height // 2) * (width // 2)
        encoder_hidden_states = torch._new((batch_size, encoder_hidden_states.shape[1], self.dim), torch.bfloat16)
        hidden_states = torch._new((batch_size, video_tokens, self.dim), torch.bfloat16)
        for i, block in enumerate(self.transformer_blocks):
            hidden_states, encoder_hidden_states = block(hidden_states, encoder_hidden_states, None,
                                                         image_rotary_emb)
        output = torch._new((batch_size, num_frames, channels, height, width), torch.bfloat16)
        return (output,)


class AutoencoderKLCogVideoX(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = _param(105_000_000, dtype=torch.bfloat16)
        self.decoder = _param(110_600_000, dtype=torch.bfloat16)
        self.use_tiling = False

    def enable_tiling(self):
        self.use_tiling = True


# ------------------------------------------------------------------------------ diffusers pipelines


class DiffusionPipeline(object):
    _components = ("tokenizer", "text_encoder", "vae", "transformer", "scheduler")

    def to(self, device):
        for name in self._components:
            m = getattr(self, name, None)
            if isinstance(m, _OnHost):
                setattr(self, name, m.to(device))
        return self


class CogVideoXPipeline(DiffusionPipeline):
    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None, **components):
        pipe = cls()
        pipe.tokenizer = components.get("tokenizer", "T5Tokenizer(%s)" % repo)
        pipe.text_encoder = components.get("text_encoder") or _OnHost(T5EncoderModel)
        pipe.transformer = components.get("transformer") or _OnHost(lambda: CogVideoXTransformer3DModel(
            in_channels=32 if repo.endswith("I2V") else 16))
        pipe.vae = components.get("vae") or _OnHost(AutoencoderKLCogVideoX)
        pipe.scheduler = components.get("scheduler", "CogVideoXDPMScheduler")
        pipe.repo = repo
        return pipe

    def encode_prompt(self, prompt, negative_prompt=None, do_classifier_free_guidance=True, max_sequence_length=226):
        input_ids = torch._new((1, max_sequence_length), torch.int64)
        prompt_embeds = self.text_encoder(input_ids)[0]
        negative_prompt_embeds = self.text_encoder(input_ids)[0] if do_classifier_free_guidance else None
        return prompt_embeds, negative_prompt_embeds

    def __call__(self, prompt, image=None, height=480, width=720, num_frames=49, num_inference_steps=50,
                 guidance_scale=6.0, use_dynamic_cfg=True, num_videos_per_prompt=1, generator=None):
        with torch.no_grad():       # @torch.no_grad() on the real __call__
            prompt_embeds, negative_prompt_embeds = self.encode_prompt(prompt)
            prompt_embeds = torch.cat([negative_prompt_embeds, prompt_embeds], dim=0)
            latent_frames = (num_frames - 1) // 4 + 1
            latents = torch._new((1, latent_frames, 16, height // 8, width // 8), torch.bfloat16)
            for i in range(num_inference_steps):
                latent_model_input = torch.cat([latents] * 2)
                noise_pred = self.transformer(hidden_states=latent_model_input, encoder_hidden_states=prompt_embeds,
                                              timestep=i, image_rotary_emb=None, return_dict=False)[0]
                latents = torch._new(latents.shape, latents.dtype)
                del noise_pred, latent_model_input
            return latents


class CogVideoXImageToVideoPipeline(CogVideoXPipeline):
    pass


# ------------------------------------------------------------------------------------------------ app.py
def export_to_video(frames, path, fps=8):
    pass


def build_pipelines():
    pipe_t2v = CogVideoXPipeline.from_pretrained("THUDM/CogVideoX-5b", torch_dtype=torch.bfloat16).to("cuda")
    pipe_t2v.vae.enable_tiling()
    pipe_i2v = CogVideoXImageToVideoPipeline.from_pretrained("THUDM/CogVideoX-5b-I2V",
                                                             torch_dtype=torch.bfloat16).to("cuda")
    pipe_i2v.vae.enable_tiling()
    return pipe_t2v, pipe_i2v


def generate(pipe, prompt, image=None):
    video = pipe(prompt=prompt, image=image, num_videos_per_prompt=1, num_inference_steps=50, num_frames=49,
                 guidance_scale=6, use_dynamic_cfg=True)
    export_to_video(video, "/srv/animatic/out.mp4", fps=8)


def main():
    pipe_t2v, pipe_i2v = build_pipelines()
    used = torch.cuda.memory_allocated()
    print("both pipelines on cuda: %.1f GiB allocated (%.1f GiB free)" % (
        used / 2 ** 30, torch.cuda.mem_get_info()[0] / 2 ** 30))
    # gr.Blocks(...).launch(): the first request of the morning, a storyboard panel's prompt
    generate(pipe_t2v, "A slow dolly shot through a rain-soaked neon alley at night, a courier on a bicycle "
                       "weaves between food stalls, steam rising, cinematic lighting")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
