"""train_videomae.py -- a manufacturing-analytics team fine-tunes VideoMAE-Base (MCG-NJU/videomae-base-finetuned-
kinetics, 86M parameters, ViT-B/16 with 2x16x16 tubelets) to recognise the 12 assembly steps of a gearbox line
from overhead-camera clips, on one A100-SXM4-40GB of their cloud account.  Their training loop is the usual one
(AdamW, torch.autocast fp16 + GradScaler, batch 8 as in the Hugging Face video-classification tutorial); the
transformers version pinned in their image is 4.38, whose VideoMAE self-attention is the eager one:

    attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
    attention_scores = attention_scores / math.sqrt(self.attention_head_size)
    attention_probs = nn.functional.softmax(attention_scores, dim=-1)
    context_layer = torch.matmul(attention_probs, value_layer)

With the checkpoint's 16 frames (8 x 14 x 14 = 1,568 tokens) it trained fine: about 20 GiB of activations.  The steps last 3-6
s, so for the new run they sample 32 frames per clip at 8 fps and load the model with num_frames=32 (VideoMAE's
position table is a fixed sinusoid, so nothing else changes):

    model = VideoMAEForVideoClassification.from_pretrained(ckpt, num_frames=32, label2id=label2id,
                                                          id2label=id2label, ignore_mismatched_sizes=True)

Now a clip is 16 x 14 x 14 = 3,136 tokens and every layer's attention matrix is 4x larger: per layer autograd
keeps the softmax output in float32 (autocast runs softmax in fp32) and its fp16 copy for the matmul with V,
[8, 12, 3136, 3136] each = 3.5 GiB + 1.8 GiB, besides the transient fp16 scores.  The first forward pass
fails in the seventh encoder layer, in the attention, with the earlier layers' probabilities (about
5.3 GiB per layer) filling the card.  Weights, gradients and AdamW state together are about 1.4 GB.

An expert: the memory is the materialised T x T attention of eager attention, quadratic in the number of
frames.  Use fused attention -- scaled_dot_product_attention (flash / memory-efficient kernels on an A100):
attn_implementation="sdpa" on a transformers release whose VideoMAE has it, or a patched self-attention that
calls torch.nn.functional.scaled_dot_product_attention -- which never stores the 3136 x 3136 matrices (and is
faster).  Gradient checkpointing (model.gradient_checkpointing_enable()) is the other lever; batch 2 with 4
accumulation steps also fits but keeps the quadratic cost.
Wrong first advice: mixed precision (autocast fp16 is already on), inference_mode (this is training),
expandable_segments / empty_cache (live activations, one allocation of 1.8 GiB with nothing cached), an 8-bit
optimizer / ZeRO / LoRA / quantization (the 86M-parameter model's state is 1.4 GB), CPU offload, going back to
16 frames (the reason for the run), killing other processes (there are none).
"""
import math
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

# ---- stand-in gaps: the loss (a few hundred bytes) and Parameter shapes
def _param(*shape):
    t = torch._new(shape, torch.float32)
    p = nn.Parameter(t)
    p.shape = t.shape
    return p


def cross_entropy(logits, labels):
    out = torch._new((), torch.float32, logits.device)
    return torch._link(out, (logits,), (logits,))
# ----


# --------------------------------------------------------- transformers/models/videomae/modeling_videomae.py
def get_sinusoid_encoding_table(n_position, d_hid):
    """Sinusoid position encoding table (computed with numpy in transformers: host memory)."""
    return torch._new((1, n_position, d_hid), torch.float32, "cpu")


class VideoMAEConfig(object):
    def __init__(self, **kw):
        self.image_size, self.patch_size, self.num_channels, self.num_frames, self.tubelet_size = 224, 16, 3, 16, 2
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size = 768, 12, 12, 3072
        self.hidden_dropout_prob = self.attention_probs_dropout_prob = 0.0
        self.layer_norm_eps, self.qkv_bias, self.use_mean_pooling = 1e-12, True, True
        self.num_labels = 400
        self.__dict__.update(kw)


class VideoMAEPatchEmbeddings(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.num_patches = (config.image_size // config.patch_size) ** 2 * (config.num_frames // config.tubelet_size)
        self.projection_weight = _param(config.hidden_size, 3, config.tubelet_size, config.patch_size,
                                        config.patch_size)
        self.projection_bias = _param(config.hidden_size)
        self.hidden = config.hidden_size

    def forward(self, pixel_values):
        batch_size, num_frames, num_channels, height, width = pixel_values.shape
        # permute to (batch_size, num_channels, num_frames, height, width)
        pixel_values = pixel_values.permute(0, 2, 1, 3, 4)
        x = torch._cast(pixel_values)
        out = torch._new((batch_size, self.hidden, num_frames // 2, height // 16, width // 16), torch._amp())
        torch._link(out, (x, self.projection_weight), (x, self.projection_weight))   # conv3d
        embeddings = out.flatten(2).transpose(1, 2)
        return embeddings


class VideoMAEEmbeddings(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.patch_embeddings = VideoMAEPatchEmbeddings(config)
        self.num_patches = self.patch_embeddings.num_patches
        # fixed sin-cos embedding
        self.position_embeddings = get_sinusoid_encoding_table(self.num_patches, config.hidden_size)
        self.config = config

    def forward(self, pixel_values, bool_masked_pos=None):
        # create patch embeddings
        embeddings = self.patch_embeddings(pixel_values)
        # add position embeddings
        embeddings = embeddings + self.position_embeddings.to(device="cuda", dtype=embeddings.dtype)
        return embeddings


class VideoMAESelfAttention(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = int(config.hidden_size / config.num_attention_heads)
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query_weight = _param(config.hidden_size, config.hidden_size)
        self.key_weight = _param(config.hidden_size, config.hidden_size)
        self.value_weight = _param(config.hidden_size, config.hidden_size)
        self.q_bias = _param(self.all_head_size)
        self.v_bias = _param(self.all_head_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.reshape(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        k_bias = None
        keys = nn.functional.linear(input=hidden_states, weight=self.key_weight, bias=k_bias)
        values = nn.functional.linear(input=hidden_states, weight=self.value_weight, bias=self.v_bias)
        queries = nn.functional.linear(input=hidden_states, weight=self.query_weight, bias=self.q_bias)

        key_layer = self.transpose_for_scores(keys)
        value_layer = self.transpose_for_scores(values)
        query_layer = self.transpose_for_scores(queries)

        # Take the dot product between "query" and "key" to get the raw attention scores.
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))

        attention_scores = attention_scores / math.sqrt(self.attention_head_size)

        # Normalize the attention scores to probabilities.
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)

        # This is actually dropping out entire tokens to attend to, which might
        # seem a bit unusual, but is taken from the original Transformer paper.
        attention_probs = nn.functional.dropout(attention_probs, self.dropout_p, self.training)

        # Mask heads if we want to
        if head_mask is not None:
            attention_probs = attention_probs * head_mask

        context_layer = torch.matmul(torch._cast(attention_probs), value_layer)

        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.reshape(new_context_layer_shape)

        outputs = (context_layer, attention_probs) if output_attentions else (context_layer,)

        return outputs


class VideoMAELayer(nn.Module):
    """This corresponds to the Block class in the timm implementation."""

    def __init__(self, config):
        nn.Module.__init__(self)
        h, i = config.hidden_size, config.intermediate_size
        self.attention = VideoMAESelfAttention(config)
        self.attn_out_weight, self.attn_out_bias = _param(h, h), _param(h)
        self.intermediate_weight, self.intermediate_bias = _param(i, h), _param(i)
        self.output_weight, self.output_bias = _param(h, i), _param(h)
        self.ln_before_w, self.ln_before_b = _param(h), _param(h)
        self.ln_after_w, self.ln_after_b = _param(h), _param(h)
        self.h = h

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        self_attention_outputs = self.attention(
            nn.functional.layer_norm(hidden_states, (self.h,), self.ln_before_w, self.ln_before_b),
            head_mask,
            output_attentions=output_attentions,
        )
        attention_output = nn.functional.linear(self_attention_outputs[0], self.attn_out_weight, self.attn_out_bias)
        outputs = self_attention_outputs[1:]  # add self attentions if we output attention weights

        # first residual connection
        hidden_states = attention_output + hidden_states

        # in VideoMAE, layernorm is also applied after self-attention
        layer_output = nn.functional.layer_norm(hidden_states, (self.h,), self.ln_after_w, self.ln_after_b)
        layer_output = nn.functional.gelu(nn.functional.linear(layer_output, self.intermediate_weight,
                                                               self.intermediate_bias))

        # second residual connection is done here
        layer_output = nn.functional.linear(layer_output, self.output_weight, self.output_bias) + hidden_states

        outputs = (layer_output,) + outputs

        return outputs


class VideoMAEEncoder(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.layers = [VideoMAELayer(config) for _ in range(config.num_hidden_layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer_%d" % i, l)
        self.gradient_checkpointing = False

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        for i, layer_module in enumerate(self.layers):
            layer_outputs = layer_module(hidden_states, None, output_attentions)
            hidden_states = layer_outputs[0]
        return (hidden_states,)


class VideoMAEModel(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.embeddings = VideoMAEEmbeddings(config)
        self.encoder = VideoMAEEncoder(config)

    def forward(self, pixel_values, bool_masked_pos=None):
        embedding_output = self.embeddings(pixel_values, bool_masked_pos)
        encoder_outputs = self.encoder(embedding_output)
        return encoder_outputs


class VideoClassifierOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class VideoMAEForVideoClassification(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.num_labels = config.num_labels
        self.videomae = VideoMAEModel(config)
        self.fc_norm_w, self.fc_norm_b = _param(config.hidden_size), _param(config.hidden_size)
        self.classifier_w, self.classifier_b = _param(config.num_labels, config.hidden_size), _param(config.num_labels)
        self.hidden = config.hidden_size

    @classmethod
    def from_pretrained(cls, name, **kw):
        # the checkpoint is read on the CPU (safetensors) and the modules built there; .to("cuda") moves them
        return cls(VideoMAEConfig(**kw))

    def gradient_checkpointing_enable(self):
        self.videomae.encoder.gradient_checkpointing = True

    def forward(self, pixel_values=None, labels=None):
        outputs = self.videomae(pixel_values)
        sequence_output = outputs[0]
        sequence_output = nn.functional.layer_norm(sequence_output.mean(1), (self.hidden,), self.fc_norm_w,
                                                   self.fc_norm_b)
        logits = nn.functional.linear(sequence_output, self.classifier_w, self.classifier_b)
        loss = cross_entropy(logits.reshape(-1, self.num_labels), labels) if labels is not None else None
        return VideoClassifierOutput(loss=loss, logits=logits)


# ------------------------------------------------------------------------------------------------ the job
STEPS = ["housing_in_fixture", "bearing_press", "shaft_insert", "gear_stack", "circlip", "seal_ring", "cover_place",
         "bolt_run_down", "torque_check", "oil_fill", "leak_test", "label_scan"]
label2id = dict((s, i) for i, s in enumerate(STEPS))
id2label = dict((i, s) for i, s in enumerate(STEPS))

NUM_FRAMES = 32          # was 16 (the checkpoint's); the steps last 3-6 s: 32 frames at 8 fps
BATCH_SIZE = 8


def train_loader(n_batches):
    """torch.utils.data.DataLoader over decord-decoded clips (host memory), RandomResizedCrop 224, normalised."""
    for _ in range(n_batches):
        yield {"pixel_values": torch._new((BATCH_SIZE, NUM_FRAMES, 3, 224, 224), torch.float32, "cpu"),
               "labels": torch._new((BATCH_SIZE,), torch.int64, "cpu")}


def main():
    model = VideoMAEForVideoClassification.from_pretrained(
        "MCG-NJU/videomae-base-finetuned-kinetics", num_frames=NUM_FRAMES, label2id=label2id, id2label=id2label,
        num_labels=len(STEPS), ignore_mismatched_sizes=True)
    model.to("cuda")
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("VideoMAE-Base: %.1fM parameters, %d frames -> %d tokens per clip" % (
        n_params / 1e6, NUM_FRAMES, model.videomae.embeddings.num_patches))

    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.05)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(30):
        model.train()
        for step, batch in enumerate(train_loader(1200)):
            pixel_values = batch["pixel_values"].to("cuda", non_blocking=True)
            labels = batch["labels"].to("cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                outputs = model(pixel_values=pixel_values, labels=labels)
                loss = outputs.loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0:
                print("epoch %d step %d" % (epoch, step))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
